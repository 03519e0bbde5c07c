//! Leader election: the guide's protocol on the node names of Curator's `LeaderLatch`.
//!
//! Each candidate creates `<root>/elections/<name>/_c_<guid>-latch-<seq>` (sequential, and
//! persistent: it lives as long as its lease, see [crate::recipes::engine::lease]) and watches the next lower candidate, never the lowest (that would wake every
//! candidate at each change: the herd effect). The lowest candidate leads; the decision is the
//! exclusive lock's ([crate::recipes::locks::exclusive::next_step]).
//!
//! Being the lowest does not tell anyone that the leader knows it leads, so the new leader
//! writes the guide's acknowledgement node, `<root>/elections/<name>/leader` (persistent like
//! the candidates, and written under the leader's lease), naming its candidate, its term and
//! its value. Observers
//! read "who leads since when" from it; a leader steps down by deleting it before its
//! candidate node, so the next leader does not find a stale one. (A Curator `LeaderLatch`
//! leader writes none: its leadership shows as not acknowledged.) The child name `leader`
//! has no sequence suffix, so it is never counted as a candidate, by zkgate or by Curator
//! (which sorts it after every candidate).
//!
//! The term is the leader's candidate czxid: the lowest candidate leads, so a later leader's
//! node was created after every earlier leader's, and terms strictly increase.

use crate::recipes::guards::Guards;
use crate::recipes::usage::Charged;
use crate::zk::{Failed, Multi};
use crate::zk::{Failure, Session};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use zookeeper_client::{Client, CreateMode, Error as ZkError};

use crate::kind::Kind;
use crate::recipes::engine::contender::{Contender, Contenders, Driver, Next, Role, Step};
use crate::recipes::engine::handle::{Exit, Guarded, Node, NotCreated, write_held};
use crate::recipes::engine::view::{ContenderView, LISTED, read_queue};
use crate::recipes::topic::{Source, event_kinds};
use crate::recipes::usage::{self, ChargeError, Payer};
use crate::time::{from_millis, timestamp};
use crate::zk::retry_on_loss;
use crate::zk::watch::Mode;

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
    /// When it began leading (ms since the Unix epoch), where the node's own creation time does
    /// not say: an acknowledgement that overwrote a predecessor's (see [acknowledge]). Absent
    /// from one made new, and from those older versions wrote: their `ctime` says it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<i64>,
}

impl Acknowledgement {
    pub fn parse(data: &[u8]) -> Option<Acknowledgement> {
        serde_json::from_slice(data).ok()
    }
}

/// Writes the acknowledgement of the new leader `handle` (persistent, like its candidate: it
/// outlives the instance that wrote it, and goes when the leader steps down), guarded by its
/// lease. An existing one is either this leader's own (a create whose reply was lost, or a run
/// before an interruption: done) or a former leader's left behind: every earlier candidate is
/// gone once this one leads, so it is stale, and overwritten (conditional on its version, with
/// when this one began leading, since the node's `ctime` is the predecessor's).
pub async fn acknowledge(handle: &Contender, client: &Client, dir: &str, ack: &Acknowledgement) -> Result<(), Exit> {
    let path = format!("{dir}/{ACK_NODE}");
    let data = serde_json::to_vec(ack).unwrap_or_default();
    let options = CreateMode::Persistent.with_acls(crate::zk::acls());
    loop {
        match write_held(handle, client, |multi| {
            multi.create(Guarded::Own(()), &path, &data, &options)
        })
        .await
        {
            Ok(_) => return Ok(()),
            Err(NotCreated::Refused {
                error: ZkError::NodeExists,
                ..
            }) => {}
            Err(NotCreated::Request(err)) if crate::zk::is_loss(&err) => {}
            Err(not_created) => return Err(not_created.exit()),
        }
        match retry_on_loss(|| client.get_data(&path)).await {
            Ok((existing, stat)) => {
                if Acknowledgement::parse(&existing).is_some_and(|a| a.candidate == ack.candidate) {
                    return Ok(());
                }
                // A predecessor's, not yet retracted: overwritten, not deleted and made again. Its
                // version then only grows, so the predecessor's retract (a delete at the version
                // it read) cannot remove this one: a node made again starts at version 0 anew,
                // which a retract that read the predecessor's at 0 would have deleted (ABA).
                let overwriting = Acknowledgement {
                    since_ms: Some(crate::time::now_ms()),
                    ..ack.clone()
                };
                let data = serde_json::to_vec(&overwriting).unwrap_or_default();
                let replaced = write_held(handle, client, |multi| {
                    multi.set(Guarded::Own(()), &path, &data, Some(stat.version))
                })
                .await;
                match replaced {
                    Ok(_) => return Ok(()),
                    Err(NotCreated::Refused {
                        error: ZkError::NoNode | ZkError::BadVersion,
                        ..
                    }) => {}
                    Err(NotCreated::Request(err)) if crate::zk::is_loss(&err) => {}
                    Err(not_created) => return Err(not_created.exit()),
                }
            }
            Err(ZkError::NoNode) => {}
            Err(err) => return Err(Exit::from_error(err)),
        }
    }
}

/// An election's candidate: it leads with the lowest sequence number (waiting as an exclusive
/// lock's contender does), and leads only once it wrote its acknowledgement.
pub struct Candidate;

/// The role of an election's candidates.
pub const CANDIDATE: Role = Role {
    label: "candidate",
    kind: Kind::Election,
    infix: INFIX,
    driver: &Candidate,
    mode: None,
};

impl Driver for Candidate {
    fn next_step<'a>(&self, children: &'a [String], me: &str) -> Next<'a> {
        crate::recipes::locks::exclusive::next_step(children, me)
    }

    fn on_grant<'a>(&'a self, handle: &'a Contender, client: &'a Client, node: &'a Node) -> Step<'a, Result<(), Exit>> {
        Box::pin(async move {
            let ack = Acknowledgement {
                candidate: node.name.clone(),
                term: node.czxid,
                lease: handle.lease.id.clone(),
                value: handle.protocol.value.clone(),
                since_ms: None,
            };
            acknowledge(handle, client, handle.protocol.dir(), &ack).await
        })
    }

    /// A leader steps down by removing its acknowledgement first, so that its successor never
    /// finds a stale one. Done for any candidate: one may be cancelled after it wrote the
    /// acknowledgement but before it reported leading.
    fn on_exit<'a>(&'a self, client: &'a Client, dir: &'a str, name: &'a str) -> Step<'a, ()> {
        Box::pin(retract(client, dir, name))
    }

    fn count_grant(&self, labels: [&str; 2]) {
        crate::metrics::get()
            .leader_changes
            .with_label_values(&[labels[1]])
            .inc();
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
///
/// The value is charged to `payer` in the same multi-op ([usage]): one charge per election,
/// moved to whoever proclaims, so an election holds at most one charged value at a time.
/// `QuotaExceeded` if the value would pass a quota (nothing is written then).
pub async fn proclaim(
    session: &Session,
    dir: &str,
    candidate: &str,
    value: serde_json::Value,
    (payer, guards): (Payer<'_>, &Guards),
) -> Result<Option<Acknowledgement>, Failure> {
    let client = session.client();
    let path = format!("{dir}/{ACK_NODE}");
    let id = usage::path_id("el", &path);
    loop {
        let Some((data, stat)) = crate::zk::data(client, &path).await? else {
            return Ok(None);
        };
        let Some(mut ack) = Acknowledgement::parse(&data).filter(|a| a.candidate == candidate) else {
            return Ok(None);
        };
        ack.value = Some(value.clone());
        let bytes = serde_json::to_vec(&ack).unwrap_or_default();
        let mine = match payer
            .quotas
            .charge_as(client, payer.principal, bytes.len(), id.clone())
            .await
        {
            Ok(charge) => charge,
            Err(ChargeError::Exceeded(_)) => return Err(Failure::QuotaFull),
            Err(ChargeError::ZooKeeper(err)) => return Err(err),
        };
        let charges = payer.quotas.charges_of(client, &id).await?;
        let mut multi = Multi::new(client);
        guards.add_to(&mut multi, None)?;
        multi.set(Some(Charged::Value), &path, &bytes, Some(stat.version))?;
        payer
            .quotas
            .add_recharge(&mut multi, Some(Charged::Charge), &mine, bytes.len(), &charges)?;
        match multi.commit().await {
            Ok(_) => return Ok(Some(ack)),
            // (A tag of `None`: the guards' checks.)
            Err(Failed::Refused { tag: None, .. }) => return Err(Failure::Unguarded),
            Err(Failed::Refused {
                error: ZkError::QuotaExceeded,
                ..
            }) => return Err(Failure::QuotaFull),
            Err(Failed::Refused {
                tag: Some(Charged::Value),
                error: ZkError::NoNode,
            }) => return Ok(None),
            // Changed under us (by a retried write of ours, the leader changed, or a charge
            // moved meanwhile): read again.
            Err(Failed::Refused {
                error: ZkError::BadVersion | ZkError::NoNode | ZkError::NodeExists,
                ..
            }) => continue,
            Err(failed) if failed.is_loss() => continue,
            Err(failed) => return Err(failed.into()),
        }
    }
}

/// The current leader.
#[derive(Serialize, ToSchema, Clone, Debug, PartialEq)]
pub struct LeaderView {
    /// The leader's candidate node.
    #[schema(example = "_c_3f1e2d4c-5b6a-4798-8a9b-0c1d2e3f4a5b-latch-0000000007")]
    pub node: String,
    /// The term: the leader's candidate czxid, strictly increasing with every new leader.
    #[schema(example = 4294967321_i64)]
    pub term: i64,
    /// The value it proclaims.
    #[schema(example = json!({"address": "10.0.0.8:8080"}))]
    pub value: Option<serde_json::Value>,
    /// The leader's zkgate lease, for zkgate's candidates.
    #[schema(example = "3c9e1f07-6f1c2a9e0b7d4e3f8a5b6c7d8e9f0a1b")]
    pub lease: Option<String>,
    /// When it took over (its acknowledgement's creation), if acknowledged.
    #[schema(example = "2026-11-22T10:00:00.000Z")]
    #[schema(format = DateTime)]
    pub since: Option<String>,
    /// Whether the leader has written the acknowledgement node: it knows it leads. (A Curator
    /// `LeaderLatch` leader never does.)
    pub acknowledged: bool,
    /// `zkgate`, `curator` or `other`.
    #[schema(value_type = String, example = "zkgate")]
    pub client: &'static str,
}

/// An election: what `GET /v1/elections/{name}` answers and the `election` topic carries.
#[derive(Serialize, ToSchema, Clone, Debug, PartialEq)]
pub struct ElectionState {
    #[schema(example = "scheduler")]
    pub name: String,
    /// `null` when nobody campaigns: "no leader" is a state of its own.
    pub leader: Option<LeaderView>,
    /// The first candidates in order, the leader first (at most 51).
    pub candidates: Vec<ContenderView>,
    /// How many candidates there are, all of them.
    pub candidate_count: usize,
}

event_kinds! {
    /// The events of an election topic.
    ElectionEvent {
        /// A new leader, with its term.
        Leader => "leader",
        /// Nobody leads.
        NoLeader => "no_leader",
        /// The leader acknowledged its leadership, or proclaimed another value.
        LeaderUpdated => "leader_updated",
        /// Only the candidates changed.
        Candidates => "candidates",
    }
}

/// An election as a topic (and as `GET` reads it): its leader (candidate, term, value,
/// whether acknowledged) and its candidates, from the candidates and the acknowledgement.
pub struct Leadership {
    pub name: String,
    pub dir: String,
    /// This instance's candidates, which know their value before they acknowledge.
    pub local: Contenders,
}

impl Source for Leadership {
    type State = ElectionState;
    type Event = ElectionEvent;

    /// The candidates, and the acknowledgement node whose data is the leader's value.
    fn watches(&self, _: Option<&ElectionState>) -> Vec<(Mode, String)> {
        vec![
            (Mode::Children, self.dir.clone()),
            (Mode::Exists, format!("{}/{ACK_NODE}", self.dir)),
        ]
    }

    async fn read(&self, session: &Session) -> Result<ElectionState, Failure> {
        let client = session.client();
        let queue = read_queue(client, &self.dir, |_, i| i <= LISTED).await?;
        let ack = crate::zk::data(client, &format!("{}/{ACK_NODE}", self.dir))
            .await?
            .and_then(|(data, stat)| {
                Acknowledgement::parse(&data).map(|a| {
                    let since = a.since_ms.unwrap_or(stat.ctime);
                    (a, since)
                })
            });
        let local = self.local.local(&self.name);
        let candidates: Vec<ContenderView> = queue
            .records
            .iter()
            .map(|r| ContenderView::of(r, None, &local))
            .collect();
        let leader = candidates.first().map(|first| {
            let acknowledged = ack.as_ref().filter(|(a, _)| a.candidate == first.node);
            LeaderView {
                node: first.node.clone(),
                term: first.fencing_token,
                value: match acknowledged {
                    Some((a, _)) => a.value.clone(),
                    None => local.get(&first.node).and_then(|c| c.protocol.value.clone()),
                },
                lease: first.lease.clone(),
                since: acknowledged.map(|(_, ctime)| timestamp(from_millis(*ctime))),
                acknowledged: acknowledged.is_some(),
                client: first.client,
            }
        });
        Ok(ElectionState {
            name: self.name.clone(),
            leader,
            candidates,
            candidate_count: queue.names.len(),
        })
    }

    fn change(&self, before: &ElectionState, after: &ElectionState) -> Option<ElectionEvent> {
        let term = |s: &ElectionState| s.leader.as_ref().map(|l| l.term);
        if term(before) != term(after) {
            return Some(if after.leader.is_none() {
                ElectionEvent::NoLeader
            } else {
                ElectionEvent::Leader
            });
        }
        let said = |s: &ElectionState| s.leader.as_ref().map(|l| (l.acknowledged, l.value.clone()));
        if said(before) != said(after) {
            return Some(ElectionEvent::LeaderUpdated);
        }
        (before.candidate_count != after.candidate_count).then_some(ElectionEvent::Candidates)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn state(leader: Option<(i64, bool, serde_json::Value)>, candidates: usize) -> ElectionState {
        ElectionState {
            name: "scheduler".into(),
            leader: leader.map(|(term, acknowledged, value)| LeaderView {
                node: format!("_c_x-latch-{term:010}"),
                term,
                value: Some(value),
                lease: None,
                since: None,
                acknowledged,
                client: "zkgate",
            }),
            candidates: Vec::new(),
            candidate_count: candidates,
        }
    }

    #[test]
    fn election_events_follow_the_term_then_the_leaders_word_then_the_candidates() {
        let topic = Leadership {
            name: "scheduler".into(),
            dir: "/zkgate/elections/scheduler".into(),
            local: Contenders::new("/zkgate", crate::kind::Kind::Election),
        };
        let none = state(None, 0);
        let first = state(Some((7, false, json!("a"))), 1);
        assert_eq!(topic.change(&none, &first), Some(ElectionEvent::Leader));
        assert_eq!(topic.change(&first, &none), Some(ElectionEvent::NoLeader));
        let acknowledged = state(Some((7, true, json!("a"))), 1);
        assert_eq!(topic.change(&first, &acknowledged), Some(ElectionEvent::LeaderUpdated));
        let proclaimed = state(Some((7, true, json!("b"))), 1);
        assert_eq!(
            topic.change(&acknowledged, &proclaimed),
            Some(ElectionEvent::LeaderUpdated)
        );
        assert_eq!(
            topic.change(&proclaimed, &state(Some((7, true, json!("b"))), 3)),
            Some(ElectionEvent::Candidates)
        );
        assert_eq!(
            topic.change(&proclaimed, &state(Some((9, true, json!("b"))), 1)),
            Some(ElectionEvent::Leader)
        );
        assert_eq!(topic.change(&proclaimed, &proclaimed.clone()), None);
    }
}
