//! Leader election: the guide's protocol on the node names of Curator's `LeaderLatch`.
//!
//! Each candidate creates `<root>/elections/<name>/_c_<guid>-latch-<seq>` (ephemeral,
//! sequential) and watches the next lower candidate, never the lowest (that would wake every
//! candidate at each change: the herd effect). The lowest candidate leads; the decision is the
//! exclusive lock's ([super::lock::next_step]).
//!
//! Being the lowest does not tell anyone that the leader knows it leads, so the new leader
//! writes the guide's acknowledgement node, `<root>/elections/<name>/leader` (ephemeral, so it
//! dies with the leader's session), naming its candidate, its term and its value. Observers
//! read "who leads since when" from it; a leader steps down by deleting it before its
//! candidate node, so the next leader does not find a stale one. (A Curator `LeaderLatch`
//! leader writes none: its leadership shows as not acknowledged.) The child name `leader`
//! has no sequence suffix, so it is never counted as a candidate, by zkgate or by Curator
//! (which sorts it after every candidate).
//!
//! The term is the leader's candidate czxid: the lowest candidate leads, so a later leader's
//! node was created after every earlier leader's, and terms strictly increase.

use serde::{Deserialize, Serialize};
use zookeeper_client::{Client, CreateMode, Error as ZkError};

use crate::zk::retry_on_loss;

/// The infix of Curator's `LeaderLatch` candidate names.
pub const INFIX: &str = "-latch-";

/// The acknowledgement node's name under the election.
pub const ACK_NODE: &str = "leader";

/// What the acknowledgement node holds.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Acknowledgement {
    /// The leader's candidate node name.
    pub candidate: String,
    /// The leader's term (its candidate czxid).
    pub term: i64,
    /// The leader's zkgate lease.
    pub lease: String,
    /// The value the leader proclaims.
    pub value: Option<serde_json::Value>,
}

impl Acknowledgement {
    pub fn parse(data: &[u8]) -> Option<Acknowledgement> {
        serde_json::from_slice(data).ok()
    }
}

/// Writes the acknowledgement of a new leader. An existing one is either this leader's own
/// (a create whose reply was lost: done) or a previous leader's that is being removed: wait
/// for it to go (a data watch) and create again.
pub async fn acknowledge(client: &Client, dir: &str, ack: &Acknowledgement) -> Result<(), ZkError> {
    let path = format!("{dir}/{ACK_NODE}");
    let data = serde_json::to_vec(ack).unwrap_or_default();
    let options = CreateMode::Ephemeral.with_acls(crate::zk::acls());
    loop {
        match client.create(&path, &data, &options).await {
            Ok(_) => return Ok(()),
            Err(err) if err == ZkError::NodeExists || crate::zk::is_loss(&err) => {
                match retry_on_loss(|| client.get_and_watch_data(&path)).await {
                    Ok((existing, _, watcher)) => {
                        if Acknowledgement::parse(&existing).is_some_and(|a| a.candidate == ack.candidate) {
                            return Ok(());
                        }
                        watcher.changed().await;
                    }
                    Err(ZkError::NoNode) => {}
                    Err(err) => return Err(err),
                }
            }
            Err(err) => return Err(err),
        }
    }
}

/// Deletes the acknowledgement if it names `candidate` (checked against its version, so that a
/// successor's is never removed).
pub async fn retract(client: &Client, dir: &str, candidate: &str) {
    let path = format!("{dir}/{ACK_NODE}");
    if let Ok((data, stat)) = retry_on_loss(|| client.get_data(&path)).await
        && Acknowledgement::parse(&data).is_some_and(|a| a.candidate == candidate)
    {
        let _ = retry_on_loss(|| client.delete(&path, Some(stat.version))).await;
    }
}

/// Replaces the leader's value in the acknowledgement, if `candidate` is the one it names.
/// Returns the new acknowledgement, or `None` if `candidate` is not the acknowledged leader.
pub async fn proclaim(
    client: &Client,
    dir: &str,
    candidate: &str,
    value: serde_json::Value,
) -> Result<Option<Acknowledgement>, ZkError> {
    let path = format!("{dir}/{ACK_NODE}");
    loop {
        let (data, stat) = match retry_on_loss(|| client.get_data(&path)).await {
            Ok(read) => read,
            Err(ZkError::NoNode) => return Ok(None),
            Err(err) => return Err(err),
        };
        let Some(mut ack) = Acknowledgement::parse(&data).filter(|a| a.candidate == candidate) else {
            return Ok(None);
        };
        ack.value = Some(value.clone());
        let bytes = serde_json::to_vec(&ack).unwrap_or_default();
        match retry_on_loss(|| client.set_data(&path, &bytes, Some(stat.version))).await {
            Ok(_) => return Ok(Some(ack)),
            // Changed under us (by a retried write of ours, or the leader changed): read again.
            Err(ZkError::BadVersion) => continue,
            Err(ZkError::NoNode) => return Ok(None),
            Err(err) => return Err(err),
        }
    }
}

/// An election as observers see it: who leads (candidate, term, value, whether acknowledged)
/// and how many candidates there are. Read from the candidates and the acknowledgement.
pub async fn observed(client: &Client, dir: &str) -> Result<serde_json::Value, ZkError> {
    let candidates = super::contender::read_contenders(client, dir)
        .await?
        .unwrap_or_default();
    let ack = match retry_on_loss(|| client.get_data(&format!("{dir}/{ACK_NODE}"))).await {
        Ok((data, stat)) => Acknowledgement::parse(&data).map(|a| (a, stat.ctime)),
        Err(ZkError::NoNode) => None,
        Err(err) => return Err(err),
    };
    let leader = candidates.first().map(|first| {
        let acknowledged = ack.as_ref().filter(|(a, _)| a.candidate == first.name);
        serde_json::json!({
            "node": first.name,
            "term": first.czxid,
            "acknowledged": acknowledged.is_some(),
            "value": acknowledged.and_then(|(a, _)| a.value.clone()),
            "since_ms": acknowledged.map(|(_, ctime)| *ctime),
        })
    });
    Ok(serde_json::json!({ "leader": leader, "candidates": candidates.len() }))
}

/// The leadership of one election, as an event topic.
pub struct Leadership {
    pub dir: String,
}

impl crate::events::Source for Leadership {
    fn watches(&self, _: &serde_json::Value) -> Vec<(crate::zk::watch::Mode, String)> {
        // The candidates, and the acknowledgement node whose data is the leader's value.
        vec![
            (crate::zk::watch::Mode::Children, self.dir.clone()),
            (crate::zk::watch::Mode::Exists, format!("{}/{}", self.dir, ACK_NODE)),
        ]
    }

    fn read(
        &self,
        zk: crate::zk::session::ZkSession,
    ) -> futures::future::BoxFuture<'static, Option<serde_json::Value>> {
        let dir = self.dir.clone();
        Box::pin(async move {
            let client = zk.connected().await.ok()?.client;
            observed(&client, &dir).await.ok()
        })
    }

    fn change(&self, before: &serde_json::Value, after: &serde_json::Value) -> Option<&'static str> {
        let term = |state: &serde_json::Value| state["leader"]["term"].as_i64();
        if term(before) != term(after) {
            return Some(if after["leader"].is_null() {
                "no_leader"
            } else {
                "leader"
            });
        }
        if before["leader"]["acknowledged"] != after["leader"]["acknowledged"]
            || before["leader"]["value"] != after["leader"]["value"]
        {
            return Some("leader_updated");
        }
        if before["candidates"] != after["candidates"] {
            return Some("candidates");
        }
        None
    }
}
