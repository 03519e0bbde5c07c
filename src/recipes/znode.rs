//! Plain znodes under zkgate's root as topics, for clients that follow the raw tree: a znode's
//! data (`created`, `changed`, `deleted`) or its children. (Everything below a znode, with one
//! persistent recursive watch, is [crate::zk::recursive].)

use crate::zk::{Failure, Session};
use serde::Serialize;
use utoipa::ToSchema;
use zookeeper_client::Error as ZkError;

use crate::recipes::engine::lease::EndReason;
use crate::recipes::topic::{Source, event_kinds};
use crate::zk::retry_on_loss;
use crate::zk::watch::Mode;
use zookeeper_client::Client;

/// The znode at `relative` (segments already validated, `""` for the root itself) under
/// zkgate's `root`.
pub fn under_root(root: &str, relative: &str) -> String {
    if relative.is_empty() {
        root.to_string()
    } else {
        format!("{root}/{relative}")
    }
}

/// A znode's data as a topic's state: `{"exists": false}`, or its data (`data` for UTF-8,
/// `data_base64` for other bytes), version and `mzxid`.
#[derive(Serialize, ToSchema, Clone, Debug, PartialEq, Default)]
pub struct ZnodeDataState {
    pub exists: bool,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub data: Option<Data>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mzxid: Option<i64>,
    /// A kv key's lease, while it is bound to one (it ends with the lease).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    /// A kv key deleted by the end of the lease it was bound to: that lease, and why it ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_ended: Option<LeaseEnded>,
    /// A kv key whose last write was guarded (`ZKGATE-Guard`): the holdings it was written
    /// under, each guard with the holder's fencing token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guarded_by: Option<Vec<crate::recipes::guards::GuardedBy>>,
}

/// The end of the lease a deleted kv key was bound to.
#[derive(Serialize, ToSchema, Clone, Debug, PartialEq)]
pub struct LeaseEnded {
    pub lease: String,
    pub reason: EndReason,
}

/// A znode's data: text when it is UTF-8, base64 otherwise.
#[derive(Serialize, ToSchema, Clone, Debug, PartialEq)]
pub enum Data {
    #[serde(rename = "data")]
    Text(String),
    #[serde(rename = "data_base64")]
    Base64(String),
}

impl Data {
    pub fn of(bytes: &[u8]) -> Data {
        match std::str::from_utf8(bytes) {
            Ok(text) => Data::Text(text.to_string()),
            Err(_) => {
                use base64::Engine;
                Data::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
            }
        }
    }
}

/// A znode's children as a topic's state.
#[derive(Serialize, ToSchema, Clone, Debug, PartialEq, Default)]
pub struct ZnodeChildrenState {
    pub exists: bool,
    /// Sorted.
    pub children: Vec<String>,
}

event_kinds! {
    /// The events of a znode topic.
    ZnodeEvent {
        Created => "created",
        Deleted => "deleted",
        /// Its data changed.
        Changed => "changed",
        /// Its children changed.
        Children => "children",
        /// A kv key bound to a lease, deleted by the lease's end (expiry or `DELETE`).
        LeaseEnded => "lease-ended",
    }
}

/// A znode's existence and data.
pub struct ZnodeData {
    pub path: String,
    /// For a kv key: what its binding to a lease is read with.
    pub key: Option<KeyBinding>,
}

/// What a kv key's topic knows of its binding: zkgate's root (where its owner record is), and
/// the lease it was last seen bound to, whose record (kept as a tombstone for a while after its
/// end, [crate::recipes::engine::record]) says, once the key is gone, whether the lease's end
/// took it.
pub struct KeyBinding {
    root: String,
    last: std::sync::Mutex<Option<String>>,
}

impl KeyBinding {
    pub fn new(root: &str) -> KeyBinding {
        KeyBinding {
            root: root.to_string(),
            last: Default::default(),
        }
    }

    /// The lease the key at `path` is bound to (it `exists`), or the ended lease that took it.
    async fn read(
        &self,
        client: &Client,
        path: &str,
        exists: bool,
    ) -> Result<(Option<String>, Option<LeaseEnded>), ZkError> {
        use crate::locked::Locked;
        if exists {
            let lease = crate::recipes::kv::bound::binding(client, &self.root, path)
                .await?
                .map(|(binding, _)| binding.lease);
            *self.last.locked() = lease.clone();
            return Ok((lease, None));
        }
        let Some(lease) = self.last.locked().clone() else {
            return Ok((None, None));
        };
        let found =
            crate::recipes::engine::record::read(client, &crate::recipes::engine::record::path(&self.root, &lease))
                .await?;
        let ended = found.and_then(|found| found.record.ended);
        Ok((None, ended.map(|reason| LeaseEnded { lease, reason })))
    }
}

impl Source for ZnodeData {
    type State = ZnodeDataState;
    type Event = ZnodeEvent;

    fn watches(&self, _: Option<&ZnodeDataState>) -> Vec<(Mode, String)> {
        vec![(Mode::Exists, self.path.clone())]
    }

    async fn read(&self, session: &Session) -> Result<ZnodeDataState, Failure> {
        let client = session.client();
        let mut state =
            crate::zk::data(client, &self.path)
                .await?
                .map_or_else(ZnodeDataState::default, |(data, stat)| ZnodeDataState {
                    exists: true,
                    data: Some(Data::of(&data)),
                    version: Some(stat.version),
                    mzxid: Some(stat.mzxid),
                    ..Default::default()
                });
        if let Some(key) = &self.key {
            (state.lease, state.lease_ended) = key.read(client, &self.path, state.exists).await?;
            state.guarded_by =
                crate::recipes::kv::writer::guarded_by(client, &key.root, &self.path, state.mzxid).await?;
        }
        Ok(state)
    }

    fn change(&self, before: &ZnodeDataState, after: &ZnodeDataState) -> Option<ZnodeEvent> {
        match existence(before.exists, after.exists) {
            Some(ZnodeEvent::Deleted) if after.lease_ended.is_some() => Some(ZnodeEvent::LeaseEnded),
            Some(event) => Some(event),
            None => (before.mzxid != after.mzxid || before.lease != after.lease).then_some(ZnodeEvent::Changed),
        }
    }
}

/// A znode's children.
pub struct ZnodeChildren {
    pub path: String,
}

impl Source for ZnodeChildren {
    type State = ZnodeChildrenState;
    type Event = ZnodeEvent;

    fn watches(&self, _: Option<&ZnodeChildrenState>) -> Vec<(Mode, String)> {
        vec![(Mode::Children, self.path.clone())]
    }

    async fn read(&self, session: &Session) -> Result<ZnodeChildrenState, Failure> {
        let client = session.client();
        match retry_on_loss(|| client.list_children(&self.path)).await {
            Ok(mut children) => {
                children.sort();
                Ok(ZnodeChildrenState { exists: true, children })
            }
            Err(ZkError::NoNode) => Ok(ZnodeChildrenState::default()),
            Err(err) => Err(err.into()),
        }
    }

    fn change(&self, before: &ZnodeChildrenState, after: &ZnodeChildrenState) -> Option<ZnodeEvent> {
        existence(before.exists, after.exists)
            .or_else(|| (before.children != after.children).then_some(ZnodeEvent::Children))
    }
}

fn existence(before: bool, after: bool) -> Option<ZnodeEvent> {
    match (before, after) {
        (false, true) => Some(ZnodeEvent::Created),
        (true, false) => Some(ZnodeEvent::Deleted),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_events() {
        let topic = ZnodeData {
            path: "/zkgate/kv/a".into(),
            key: None,
        };
        let gone = ZnodeDataState::default();
        let at = |mzxid| ZnodeDataState {
            exists: true,
            data: Some(Data::of(b"x")),
            version: Some(0),
            mzxid: Some(mzxid),
            ..Default::default()
        };
        assert_eq!(topic.change(&gone, &at(5)), Some(ZnodeEvent::Created));
        assert_eq!(topic.change(&at(5), &at(6)), Some(ZnodeEvent::Changed));
        assert_eq!(topic.change(&at(6), &gone), Some(ZnodeEvent::Deleted));
        assert_eq!(topic.change(&at(6), &at(6)), None);
        // A bound key: its binding changing is a change; its lease's end taking it, `lease-ended`.
        let bound = ZnodeDataState {
            lease: Some("L".into()),
            ..at(6)
        };
        assert_eq!(topic.change(&at(6), &bound), Some(ZnodeEvent::Changed));
        let taken = ZnodeDataState {
            lease_ended: Some(LeaseEnded {
                lease: "L".into(),
                reason: EndReason::Expired,
            }),
            ..ZnodeDataState::default()
        };
        assert_eq!(topic.change(&bound, &taken), Some(ZnodeEvent::LeaseEnded));
        assert_eq!(
            serde_json::to_value(&taken).expect("json"),
            serde_json::json!({"exists": false, "lease_ended": {"lease": "L", "reason": "expired"}})
        );
        assert_eq!(
            serde_json::to_value(at(6)).expect("json"),
            serde_json::json!({"exists": true, "data": "x", "version": 0, "mzxid": 6})
        );
        assert_eq!(
            serde_json::to_value(&gone).expect("json"),
            serde_json::json!({"exists": false})
        );
        assert_eq!(Data::of(&[0xff]), Data::Base64("/w==".into()));
    }

    #[test]
    fn children_events() {
        let topic = ZnodeChildren {
            path: "/zkgate/kv".into(),
        };
        let state = |exists, children: &[&str]| ZnodeChildrenState {
            exists,
            children: children.iter().map(|c| c.to_string()).collect(),
        };
        assert_eq!(
            topic.change(&state(false, &[]), &state(true, &[])),
            Some(ZnodeEvent::Created)
        );
        assert_eq!(
            topic.change(&state(true, &[]), &state(true, &["a"])),
            Some(ZnodeEvent::Children)
        );
        assert_eq!(
            topic.change(&state(true, &["a"]), &state(false, &[])),
            Some(ZnodeEvent::Deleted)
        );
        assert_eq!(topic.change(&state(true, &["a"]), &state(true, &["a"])), None);
    }
}
