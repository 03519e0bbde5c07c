//! Group membership, the guide's recipe: each member a child of the group's znode
//! (`<root>/groups/<group>/<member>`), holding its data, persistent and bound to its lease
//! where the guide makes it ephemeral (see
//! [crate::recipes::engine::node]); the live members are the children.
//!
//! A reader that wants to know when membership changes passes the `index` it last saw (the
//! group znode's `pzxid`, which changes whenever a child is created or deleted) and waits on a
//! children watch: no polling.

use crate::zk::{Failure, Session};
use serde::Serialize;
use utoipa::ToSchema;
use zookeeper_client::Error as ZkError;

use crate::recipes::topic::{Source, event_kinds};
use crate::time::{from_millis, timestamp};
use crate::zk::retry_on_loss;
use crate::zk::watch::Mode;

/// A live member, as ZooKeeper has it.
#[derive(Serialize, ToSchema, Clone, Debug, PartialEq)]
pub struct MemberView {
    #[schema(example = "worker-7")]
    pub id: String,
    /// Its data: JSON as given (`null` when none was), or the bytes as text for members
    /// created by other clients.
    pub data: serde_json::Value,
    #[schema(example = "2026-11-22T10:00:00.000Z")]
    #[schema(format = DateTime)]
    pub joined_at: String,
}

/// A group's live members: what `GET /v1/groups/{group}` answers and the `group` topic carries.
#[derive(Serialize, ToSchema, Clone, Debug, PartialEq)]
pub struct GroupState {
    #[schema(example = "workers")]
    pub name: String,
    /// Changes whenever a member joins or leaves (the group znode's `pzxid`): pass it as
    /// `index` to wait for the next change.
    pub index: i64,
    /// Members sorted by id.
    pub members: Vec<MemberView>,
}

event_kinds! {
    /// The events of a group topic.
    GroupEvent {
        Joined => "joined",
        Left => "left",
        /// As many members as before, but not the same ones.
        Members => "members",
    }
}

/// A group as a topic (and as `GET` reads it).
pub struct GroupTopic {
    pub name: String,
    pub dir: String,
}

impl Source for GroupTopic {
    type State = GroupState;
    type Event = GroupEvent;

    fn watches(&self, _: Option<&GroupState>) -> Vec<(Mode, String)> {
        vec![(Mode::Children, self.dir.clone())]
    }

    /// The members and their data in two round trips; none (index 0) for a group nobody
    /// joined.
    async fn read(&self, session: &Session) -> Result<GroupState, Failure> {
        let client = session.client();
        let (mut ids, stat) = match retry_on_loss(|| client.get_children(&self.dir)).await {
            Ok(read) => read,
            Err(ZkError::NoNode) => {
                return Ok(GroupState {
                    name: self.name.clone(),
                    index: 0,
                    members: Vec::new(),
                });
            }
            Err(err) => return Err(err.into()),
        };
        ids.sort();
        let members = crate::zk::read_each(client, &self.dir, ids)
            .await?
            .into_iter()
            .map(|(id, data, stat)| MemberView {
                id,
                data: serde_json::from_slice(&data)
                    .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&data).into())),
                joined_at: timestamp(from_millis(stat.ctime)),
            })
            .collect();
        Ok(GroupState {
            name: self.name.clone(),
            index: stat.pzxid,
            members,
        })
    }

    fn change(&self, before: &GroupState, after: &GroupState) -> Option<GroupEvent> {
        match after.members.len().cmp(&before.members.len()) {
            std::cmp::Ordering::Greater => Some(GroupEvent::Joined),
            std::cmp::Ordering::Less => Some(GroupEvent::Left),
            std::cmp::Ordering::Equal => (before.members != after.members).then_some(GroupEvent::Members),
        }
    }
}

/// Returns once the group's membership index is not `index`, or without one, once it changes
/// from what this first sees (a children watch: no polling).
pub async fn wait_for_change(session: &Session, dir: &str, mut index: Option<i64>) -> Result<(), Failure> {
    let client = session.client();
    loop {
        match retry_on_loss(|| client.get_and_watch_children(dir)).await {
            Ok((_, stat, watcher)) => {
                if stat.pzxid != *index.get_or_insert(stat.pzxid) {
                    return Ok(());
                }
                watcher.changed().await;
            }
            Err(ZkError::NoNode) => {
                let (stat, watcher) = retry_on_loss(|| client.check_and_watch_stat(dir)).await?;
                if stat.is_some() {
                    continue;
                }
                // A group nobody joined has index 0.
                if *index.get_or_insert(0) != 0 {
                    return Ok(());
                }
                watcher.changed().await;
            }
            Err(err) => return Err(err.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_join_and_leave() {
        let topic = GroupTopic {
            name: "workers".into(),
            dir: "/zkgate/groups/workers".into(),
        };
        let state = |ids: &[&str]| GroupState {
            name: "workers".into(),
            index: 1,
            members: ids
                .iter()
                .map(|id| MemberView {
                    id: id.to_string(),
                    data: serde_json::Value::Null,
                    joined_at: String::new(),
                })
                .collect(),
        };
        assert_eq!(topic.change(&state(&[]), &state(&["a"])), Some(GroupEvent::Joined));
        assert_eq!(
            topic.change(&state(&["a", "b"]), &state(&["a"])),
            Some(GroupEvent::Left)
        );
        assert_eq!(topic.change(&state(&["a"]), &state(&["b"])), Some(GroupEvent::Members));
        assert_eq!(topic.change(&state(&["a"]), &state(&["a"])), None);
    }
}
