//! Two-phase commit, the guide's recipe with both of its fixes.
//!
//! A transaction is `<root>/txns/<id>` holding the participants, the payload and a deadline.
//! Each participant registers with its own node `members/<p>` (persistent, bound to its lease),
//! so its failure is seen (the guide's second fix), and votes by creating `votes/<p>` holding
//! `commit` or `abort` (create-only: a vote never changes). The outcome is written once, as
//! `decision` (create-only, so it never changes either): commit only if every participant
//! voted commit; abort at the first abort, when a registered participant vanishes before it
//! voted, or at the deadline. Only the coordinator (the instance that created the
//! transaction) watches the members and the votes and publishes the decision, so
//! notifications stay O(n) (the guide's first fix); anyone reading the decision after the
//! deadline may write the abort itself, so a dead coordinator cannot block the transaction.

use crate::zk::{Failure, Session};
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::recipes::topic::{Source, event_kinds};
use crate::time::{from_millis, timestamp};
use crate::zk::watch::Mode;

/// A vote.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Vote {
    Commit,
    Abort,
}

impl Vote {
    pub fn parse(data: &[u8]) -> Option<Vote> {
        match data {
            b"commit" => Some(Vote::Commit),
            b"abort" => Some(Vote::Abort),
            _ => None,
        }
    }

    pub fn as_bytes(self) -> &'static [u8] {
        match self {
            Vote::Commit => b"commit",
            Vote::Abort => b"abort",
        }
    }
}

/// The outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Commit,
    Abort,
}

/// The decision, as written once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Decision {
    pub outcome: Outcome,
    /// Why, in words.
    #[schema(example = "every participant voted commit")]
    pub reason: String,
    /// When it was decided, ms since the epoch.
    pub at_ms: i64,
}

/// What the coordinator knows.
#[derive(Debug, Default)]
pub struct Tally<'a> {
    /// Every participant of the transaction.
    pub participants: &'a [String],
    /// Participants registered now.
    pub registered: BTreeSet<String>,
    /// Participants seen registered at some point.
    pub ever_registered: BTreeSet<String>,
    pub votes: BTreeMap<String, Vote>,
    /// Whether the deadline has passed.
    pub past_deadline: bool,
}

/// The recipe's decision, if the tally settles it: `None` means "keep waiting".
pub fn decide(tally: &Tally<'_>) -> Option<(Outcome, String)> {
    if let Some((p, _)) = tally.votes.iter().find(|(_, v)| **v == Vote::Abort) {
        return Some((Outcome::Abort, format!("`{p}` voted abort")));
    }
    if let Some(p) = tally
        .ever_registered
        .iter()
        .find(|p| !tally.registered.contains(*p) && !tally.votes.contains_key(*p))
    {
        return Some((Outcome::Abort, format!("`{p}` was lost before it voted")));
    }
    if tally
        .participants
        .iter()
        .all(|p| tally.votes.get(p) == Some(&Vote::Commit))
    {
        return Some((Outcome::Commit, "every participant voted commit".into()));
    }
    if tally.past_deadline {
        return Some((
            Outcome::Abort,
            "the deadline passed before every participant voted".into(),
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally<'a>(participants: &'a [String], registered: &[&str], ever: &[&str], votes: &[(&str, Vote)]) -> Tally<'a> {
        Tally {
            participants,
            registered: registered.iter().map(|s| s.to_string()).collect(),
            ever_registered: ever.iter().map(|s| s.to_string()).collect(),
            votes: votes.iter().map(|(p, v)| (p.to_string(), *v)).collect(),
            past_deadline: false,
        }
    }

    #[test]
    fn the_recipes_outcomes() {
        let ps = vec!["a".to_string(), "b".to_string()];
        let all = tally(
            &ps,
            &["a", "b"],
            &["a", "b"],
            &[("a", Vote::Commit), ("b", Vote::Commit)],
        );
        assert_eq!(decide(&all).map(|d| d.0), Some(Outcome::Commit));
        let one_abort = tally(&ps, &["a", "b"], &["a", "b"], &[("a", Vote::Abort)]);
        assert_eq!(decide(&one_abort).map(|d| d.0), Some(Outcome::Abort));
        let waiting = tally(&ps, &["a", "b"], &["a", "b"], &[("a", Vote::Commit)]);
        assert_eq!(decide(&waiting), None);
        let lost = tally(&ps, &["a"], &["a", "b"], &[("a", Vote::Commit)]);
        assert_eq!(decide(&lost).map(|d| d.0), Some(Outcome::Abort));
        // Lost after voting commit is no loss: the vote stands.
        let voted_then_gone = tally(&ps, &["a"], &["a", "b"], &[("a", Vote::Commit), ("b", Vote::Commit)]);
        assert_eq!(decide(&voted_then_gone).map(|d| d.0), Some(Outcome::Commit));
        let late = Tally {
            past_deadline: true,
            ..tally(&ps, &["a"], &["a"], &[])
        };
        assert_eq!(decide(&late).map(|d| d.0), Some(Outcome::Abort));
    }

    #[test]
    fn transaction_events_put_the_decision_first() {
        let topic = TxnTopic {
            id: "t".into(),
            dir: "/zkgate/txns/t".into(),
        };
        let missing = TxnState::of("t", None);
        let created = TxnState {
            exists: true,
            participants: vec!["a".into()],
            ..missing.clone()
        };
        assert_eq!(topic.change(&missing, &created), Some(TxnEvent::Txn));
        let voted = TxnState {
            votes: [("a".to_string(), Vote::Commit)].into(),
            ..created.clone()
        };
        assert_eq!(topic.change(&created, &voted), Some(TxnEvent::Vote));
        let decided = TxnState {
            decision: Some(Decision {
                outcome: Outcome::Commit,
                reason: "every participant voted commit".into(),
                at_ms: 1,
            }),
            ..voted.clone()
        };
        assert_eq!(topic.change(&voted, &decided), Some(TxnEvent::Decision));
        assert_eq!(topic.change(&decided, &decided.clone()), None);
    }
}

/// What a transaction znode holds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Spec {
    pub participants: Vec<String>,
    pub payload: Option<serde_json::Value>,
    pub deadline_ms: i64,
    pub created_at_ms: i64,
}

/// A transaction as read from ZooKeeper.
#[derive(Clone, Debug)]
pub struct Record {
    pub spec: Spec,
    pub registered: BTreeSet<String>,
    pub votes: BTreeMap<String, Vote>,
    pub decision: Option<Decision>,
}

/// A transaction: what `GET /v1/txns/{id}` answers (when it exists) and the `txn` topic
/// carries.
#[derive(Serialize, ToSchema, Clone, Debug, PartialEq, Default)]
pub struct TxnState {
    #[schema(example = "order-42")]
    pub id: String,
    /// Whether the transaction exists (the topic of one not created yet, or gone, says no).
    pub exists: bool,
    /// Who must vote.
    pub participants: Vec<String>,
    /// What is being decided.
    pub payload: Option<serde_json::Value>,
    /// When it aborts if not decided before.
    #[schema(example = "2026-11-22T10:00:30.000Z")]
    #[schema(format = DateTime)]
    pub deadline_at: Option<String>,
    /// Participants registered now.
    pub registered: BTreeSet<String>,
    /// The votes cast.
    pub votes: BTreeMap<String, Vote>,
    /// The decision, once made: it never changes.
    pub decision: Option<Decision>,
}

impl TxnState {
    /// The state of transaction `id`, as read (`None`: it does not exist).
    pub fn of(id: &str, record: Option<Record>) -> TxnState {
        let Some(record) = record else {
            return TxnState {
                id: id.to_string(),
                ..TxnState::default()
            };
        };
        TxnState {
            id: id.to_string(),
            exists: true,
            participants: record.spec.participants,
            payload: record.spec.payload,
            deadline_at: Some(timestamp(from_millis(record.spec.deadline_ms))),
            registered: record.registered,
            votes: record.votes,
            decision: record.decision,
        }
    }
}

event_kinds! {
    /// The events of a transaction topic.
    TxnEvent {
        /// A participant voted.
        Vote => "vote",
        /// The decision was written (it never changes).
        Decision => "decision",
        /// Otherwise changed (created, or participants registered).
        Txn => "txn",
    }
}

/// A transaction as a topic (and as `GET` reads it): its votes and its decision.
pub struct TxnTopic {
    pub id: String,
    pub dir: String,
}

impl Source for TxnTopic {
    type State = TxnState;
    type Event = TxnEvent;

    fn watches(&self, _: Option<&TxnState>) -> Vec<(Mode, String)> {
        vec![
            (Mode::Children, format!("{}/votes", self.dir)),
            (Mode::Exists, format!("{}/decision", self.dir)),
        ]
    }

    async fn read(&self, session: &Session) -> Result<TxnState, Failure> {
        Ok(TxnState::of(&self.id, read(session, &self.dir).await?))
    }

    fn change(&self, before: &TxnState, after: &TxnState) -> Option<TxnEvent> {
        if before.decision != after.decision && after.decision.is_some() {
            Some(TxnEvent::Decision)
        } else if before.votes != after.votes {
            Some(TxnEvent::Vote)
        } else {
            (before != after).then_some(TxnEvent::Txn)
        }
    }
}

/// Why a vote was not recorded.
#[derive(Debug)]
pub enum VoteError {
    /// This participant already voted otherwise.
    AlreadyVoted(Vote),
    ZooKeeper(Failure),
}

/// `<dir>/members/<participant>`: a registered participant's node in the transaction at `dir`.
pub fn member_path(dir: &str, participant: &str) -> String {
    format!("{dir}/members/{participant}")
}

pub use io::{await_decision, coordinate, create, decide_now, read, record_vote};

mod io {
    use std::collections::BTreeSet;

    use zookeeper_client::{Client, CreateMode, Error as ZkError};

    use super::{Decision, Outcome, Record, Spec, Tally, Vote, VoteError, decide};
    use tokio::time::Instant;

    use crate::recipes::guards::Guards;
    use crate::time::now_ms;
    use crate::zk::retry_on_loss;
    use crate::zk::session::ZkSession;
    use crate::zk::watch::ExistsWatches;
    use crate::zk::{Failed, Failure, Multi, Session};

    /// Creates the transaction znode with its `members` and `votes` children in one multi.
    ///
    /// # Notable errors
    /// * [Failure::Taken] if a transaction with that id exists (with another spec).
    pub async fn create(session: &Session, dir: &str, spec: &Spec, guards: &Guards) -> Result<(), Failure> {
        let client = session.client();
        let data = serde_json::to_vec(spec).unwrap_or_default();
        let options = CreateMode::Persistent.with_acls(crate::zk::acls());
        loop {
            // Tags: `false` for the guards' checks, `true` for the transaction's znodes.
            let mut multi = Multi::new(client);
            guards.add_to(&mut multi, false)?;
            multi.create(true, dir, &data, &options)?;
            multi.create(true, &format!("{dir}/members"), &[], &options)?;
            multi.create(true, &format!("{dir}/votes"), &[], &options)?;
            match multi.commit().await {
                Ok(_) => return Ok(()),
                Err(Failed::Refused { tag: false, .. }) => return Err(Failure::Unguarded),
                Err(Failed::Refused {
                    error: ZkError::NoNode, ..
                }) => {
                    crate::zk::session::ensure_path(client, &dir[..dir.rfind('/').unwrap_or(0)]).await?;
                }
                Err(failed) if failed.is_loss() => {
                    // Applied or not: a transaction znode with our exact spec is ours.
                    match retry_on_loss(|| client.get_data(dir)).await {
                        Ok((existing, _)) if existing == data => return Ok(()),
                        Ok(_) => return Err(Failure::Taken),
                        Err(ZkError::NoNode) => continue,
                        Err(err) => return Err(err.into()),
                    }
                }
                Err(failed) => return Err(failed.into()),
            }
        }
    }

    /// Reads a transaction; `None` if there is none with that id.
    pub async fn read(session: &Session, dir: &str) -> Result<Option<Record>, Failure> {
        let client = session.client();
        let Some((data, _)) = crate::zk::data(client, dir).await? else {
            return Ok(None);
        };
        let spec: Spec = serde_json::from_slice(&data)
            .map_err(|_| Failure::Unexpected(ZkError::UnexpectedError(format!("{dir} is not a zkgate transaction"))))?;
        let registered: BTreeSet<String> = retry_on_loss(|| client.list_children(&format!("{dir}/members")))
            .await?
            .into_iter()
            .collect();
        let votes = read_votes(client, dir).await?;
        let decision = crate::zk::data(client, &format!("{dir}/decision"))
            .await?
            .and_then(|(data, _)| serde_json::from_slice(&data).ok());
        Ok(Some(Record {
            spec,
            registered,
            votes,
            decision,
        }))
    }

    async fn read_votes(client: &Client, dir: &str) -> Result<std::collections::BTreeMap<String, Vote>, ZkError> {
        let votes_dir = format!("{dir}/votes");
        let names = retry_on_loss(|| client.list_children(&votes_dir)).await?;
        let read = crate::zk::read_each(client, &votes_dir, names).await?;
        Ok(read
            .into_iter()
            .filter_map(|(name, data, _)| Vote::parse(&data).map(|v| (name, v)))
            .collect())
    }

    /// Creates `path` holding `data`, once: `None` if this call created it, else the data there.
    /// After `NodeExists` or a lost reply the node is read (what is there may be ours), and
    /// made again if it is gone.
    /// Creates `path` with `data` unless it exists, in one multi-op with the checks of the
    /// writer's `guards` ([Failure::Unguarded] when those are refused): `None` if created,
    /// else what is there.
    async fn create_once(
        client: &Client,
        path: &str,
        data: &[u8],
        guards: &Guards,
    ) -> Result<Option<Vec<u8>>, Failure> {
        let options = CreateMode::Persistent.with_acls(crate::zk::acls());
        loop {
            // Tags: `false` for the guards' checks, `true` for the node.
            let mut multi = Multi::new(client);
            guards.add_to(&mut multi, false)?;
            multi.create(true, path, data, &options)?;
            match multi.commit().await {
                Ok(_) => return Ok(None),
                Err(Failed::Refused { tag: false, .. }) => return Err(Failure::Unguarded),
                Err(failed)
                    if failed.is_loss()
                        || matches!(
                            failed,
                            Failed::Refused {
                                error: ZkError::NodeExists,
                                ..
                            }
                        ) =>
                {
                    if let Some((existing, _)) = crate::zk::data(client, path).await? {
                        return Ok(Some(existing));
                    }
                }
                Err(failed) => return Err(failed.into()),
            }
        }
    }

    /// Records `vote` for `participant` (create-only): the same vote again is fine.
    pub async fn record_vote(
        session: &Session,
        dir: &str,
        (participant, vote): (&str, Vote),
        guards: &Guards,
    ) -> Result<(), VoteError> {
        let path = format!("{dir}/votes/{participant}");
        let created = create_once(session.client(), &path, vote.as_bytes(), guards).await;
        let Some(data) = created.map_err(VoteError::ZooKeeper)? else {
            return Ok(());
        };
        match Vote::parse(&data) {
            Some(existing) if existing == vote => Ok(()),
            Some(existing) => Err(VoteError::AlreadyVoted(existing)),
            None => Err(VoteError::ZooKeeper(Failure::Unexpected(ZkError::UnexpectedError(
                "unreadable vote".into(),
            )))),
        }
    }

    /// Writes the decision once; returns the decision in force (ours, or one written before).
    async fn write_decision(client: &Client, dir: &str, outcome: Outcome, reason: String) -> Result<Decision, Failure> {
        let decision = Decision {
            outcome,
            reason,
            at_ms: now_ms(),
        };
        let data = serde_json::to_vec(&decision).unwrap_or_default();
        match create_once(client, &format!("{dir}/decision"), &data, &Guards::none()).await? {
            None => Ok(decision),
            Some(existing) => serde_json::from_slice(&existing)
                .map_err(|_| Failure::Unexpected(ZkError::UnexpectedError("unreadable decision".into()))),
        }
    }

    /// Decides now if the transaction's state (as read now) settles it, writing the decision.
    pub async fn decide_now(
        session: &Session,
        dir: &str,
        ever_registered: &BTreeSet<String>,
    ) -> Result<Option<Decision>, Failure> {
        let client = session.client();
        let Some(record) = read(session, dir).await? else {
            return Ok(None);
        };
        if record.decision.is_some() {
            return Ok(record.decision);
        }
        let mut ever = ever_registered.clone();
        ever.extend(record.registered.iter().cloned());
        let tally = Tally {
            participants: &record.spec.participants,
            registered: record.registered.clone(),
            ever_registered: ever,
            votes: record.votes.clone(),
            past_deadline: now_ms() >= record.spec.deadline_ms,
        };
        match decide(&tally) {
            Some((outcome, reason)) => Ok(Some(write_decision(client, dir, outcome, reason).await?)),
            None => Ok(None),
        }
    }

    /// Waits until the transaction at `dir` is decided, or `until`. Past its deadline
    /// (`deadline_ms`) the waiter writes the abort itself if nobody has, so a lost coordinator
    /// cannot leave a transaction undecided. The decision is awaited on the instance's one
    /// shared watch of it.
    pub async fn await_decision(
        session: &Session,
        watches: &ExistsWatches,
        dir: &str,
        deadline_ms: i64,
        until: Instant,
    ) -> Result<(), Failure> {
        // The deadline comes from ZooKeeper, whatever wrote it: checked arithmetic only.
        let deadline = crate::time::instant_after(crate::time::until_ms(deadline_ms));
        let mut decided = watches.subscribe(&format!("{dir}/decision"));
        let appeared = async {
            decided.wait_for(|known| matches!(known, Some(Some(_)))).await;
        };
        tokio::select! {
            _ = appeared => {}
            _ = tokio::time::sleep_until(until) => {}
            _ = tokio::time::sleep_until(deadline), if deadline < until => {
                decide_now(session, dir, &BTreeSet::new()).await?;
            }
        }
        Ok(())
    }

    /// The coordinator: watches the members and the votes (two watches, on this instance only)
    /// and writes the decision as soon as the tally settles it, or at the deadline.
    pub async fn coordinate(zk: ZkSession, dir: String, deadline_ms: i64) {
        let mut ever_registered = BTreeSet::new();
        loop {
            let Some(session) = zk.next_session(None).await else {
                return; // the instance is shutting down
            };
            let client = session.client();
            let members = retry_on_loss(|| client.get_and_watch_children(&format!("{dir}/members"))).await;
            let votes = retry_on_loss(|| client.get_and_watch_children(&format!("{dir}/votes"))).await;
            let (Ok((registered, _, members_changed)), Ok((_, _, votes_changed))) = (members, votes) else {
                tracing::warn!(%dir, "transaction coordinator cannot read its transaction; giving up");
                return;
            };
            ever_registered.extend(registered);
            match decide_now(&session, &dir, &ever_registered).await {
                Ok(Some(decision)) => {
                    tracing::info!(%dir, outcome = ?decision.outcome, reason = ?decision.reason, "transaction decided");
                    return;
                }
                Ok(None) => {}
                Err(err) => tracing::warn!(%dir, error = %err, "transaction coordinator could not decide yet"),
            }
            let until = crate::time::until_ms(deadline_ms);
            tokio::select! {
                _ = members_changed.changed() => {}
                _ = votes_changed.changed() => {}
                _ = tokio::time::sleep(until) => {}
            }
        }
    }
}
