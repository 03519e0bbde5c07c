//! Counters, stored as Curator's `DistributedAtomicLong` stores them, so that a JVM service
//! using Curator and HTTP clients share one counter: the value is the data of the counter's own
//! znode (`<root>/counters/<name>`, persistent), eight bytes, big-endian, two's complement. A
//! counter that does not exist, or whose znode holds no data, is 0 (as Curator reads it); data
//! shorter than eight bytes is not a counter (Curator fails on it too), and bytes past the
//! eighth are ignored (Curator reads the first eight). Why this file is long (some 615 lines):
//! the protocol, its one write (a multi-op with the key's record and the writer's guards as
//! optional parts) and the operations the API asks of it stay together, with their unit tests.
//!
//! An add is optimistic, as Curator's is: read the value and the znode's data version, then
//! write the new value on that version (or create the znode if there is none). When another
//! writer got there first the write fails (`BadVersion`, `NodeExists`, `NoNode`) and the add
//! reads again; no update is lost because a write only lands on the version it was computed
//! from. Each failure means another add succeeded, so the loop always makes progress.
//!
//! A lost reply is the hard case: the write may have happened. A conditional write that is
//! retried on the same version cannot land twice, but whether *this* add landed cannot be
//! told from the counter afterwards (another add of the same delta from the same value writes
//! the same bytes). So a lost reply of a write is answered as [CounterError::OutcomeUnknown],
//! never guessed: reporting success for an add that did not happen would lose an update, and
//! retrying one that did would count it twice.
//!
//! Unless the add carries an idempotency key: then the write and the key's record (holding what
//! the add did, [crate::recipes::idempotency]) are one multi-op, so the record is there exactly when the
//! add landed. After a lost reply the add simply goes again: if the first landed, the record's
//! create is refused (`NodeExists`, before the write is looked at: it comes first in the
//! multi-op) and the add is answered from the record as it was the first time; if it did not,
//! the second one lands. A client that retries a request with its key gets the same answer the
//! same way, through any instance.

use crate::auth::Caller;
use crate::kind::Kind;
use crate::problem::{ApiError, Problem};
use crate::recipes::guards::{Guard, Guards, retry_guarded};
use crate::recipes::idempotency::{KeyError, Keyed, Record};
use crate::zk::{Failed, Failure, Multi, Session};
use serde::Serialize;
use utoipa::ToSchema;
use zookeeper_client::{Client, CreateMode, Error as ZkError, Stat};

use crate::recipes::condition::{Condition, Recheck};
use crate::recipes::topic::{Source, event_kinds};
use crate::time::{from_millis, timestamp};
use crate::zk::retry_on_loss;
use crate::zk::watch::Mode;

mod topic;
mod views;
pub use topic::{CounterEvent, CounterState, CounterTopic, etag};
pub use views::{AddBody, AddResult, SetBody, add_to};
/// The size of a counter's value in its znode.
pub const VALUE_BYTES: usize = 8;

/// A counter's value as stored.
pub fn encode(value: i64) -> [u8; VALUE_BYTES] {
    value.to_be_bytes()
}

/// A counter's value from its znode's data: `None` if the data is not a counter.
pub fn decode(data: &[u8]) -> Option<i64> {
    if data.is_empty() {
        return Some(0);
    }
    let bytes: [u8; VALUE_BYTES] = data.get(..VALUE_BYTES)?.try_into().ok()?;
    Some(i64::from_be_bytes(bytes))
}

/// A counter as read: its value and its znode's stat (`None`: there is no znode, the value is
/// 0).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Read {
    pub value: i64,
    pub stat: Option<Stat>,
}

/// Why a counter could not be read or changed.
#[derive(Debug)]
pub enum CounterError {
    /// The znode holds data that is not a counter (this many bytes).
    NotACounter(usize),
    /// The add would leave the counter outside its bounds (or outside a 64-bit integer); the
    /// value it has.
    OutOfBounds(i64),
    /// A condition on the version did not hold; the version there is (its mzxid), if any.
    Precondition(Option<i64>),
    /// A delete of a counter that does not exist.
    Missing,
    /// The connection was lost after the write was sent: it may or may not have happened.
    OutcomeUnknown,
    /// The idempotency key's record: another request used the key, or the record passes a
    /// quota.
    Key(KeyError),
    ZooKeeper(Failure),
}

impl From<Failure> for CounterError {
    fn from(err: Failure) -> CounterError {
        CounterError::ZooKeeper(err)
    }
}

impl From<KeyError> for CounterError {
    fn from(err: KeyError) -> CounterError {
        match err {
            KeyError::ZooKeeper(err) => CounterError::ZooKeeper(err),
            err => CounterError::Key(err),
        }
    }
}

impl From<ZkError> for CounterError {
    fn from(err: ZkError) -> CounterError {
        CounterError::ZooKeeper(err.into())
    }
}

/// Reads the counter at `path`.
pub async fn read(client: &Client, path: &str) -> Result<Read, CounterError> {
    let Some((data, stat)) = crate::zk::data(client, path).await? else {
        return Ok(Read { value: 0, stat: None });
    };
    let value = decode(&data).ok_or(CounterError::NotACounter(data.len()))?;
    Ok(Read {
        value,
        stat: Some(stat),
    })
}

/// The bounds an add must keep the counter within (both inclusive).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bounds {
    pub min: Option<i64>,
    pub max: Option<i64>,
}

/// The value `delta` leads to from `value`, if it stays within `bounds` and 64 bits.
pub fn next_value(value: i64, delta: i64, bounds: Bounds) -> Option<i64> {
    let next = value.checked_add(delta)?;
    let within = bounds.min.is_none_or(|min| next >= min) && bounds.max.is_none_or(|max| next <= max);
    within.then_some(next)
}

/// What an add did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Added {
    pub previous: i64,
    pub value: i64,
    /// The zxid of the write (the counter's mzxid right after it: its version).
    pub mzxid: i64,
    /// How many times another writer got there first.
    pub conflicts: u32,
    /// An add with this idempotency key had landed before: this is its answer.
    pub repeated: bool,
}

/// What a key's record holds of an add (its delta and bounds are the request's, which the
/// record's fingerprint covers).
#[derive(Serialize, serde::Deserialize)]
struct AddAnswer {
    previous: i64,
    value: i64,
}

/// Adds `delta` to the counter at `path` (creating it, and its parents, at `0 + delta`), if the
/// result stays within `bounds`; with `key` at most once for the key, whatever replies are
/// lost (see the module's notes).
pub async fn add(
    session: &Session,
    path: &str,
    delta: i64,
    bounds: Bounds,
    (key, guards): (Option<Keyed<'_>>, &Guards),
) -> Result<Added, CounterError> {
    let client = session.client();
    let mut conflicts = 0;
    let mut recheck = Recheck::default();
    // Whether a keyed write of this call lost its reply: a key found then is this call's own
    // add, not a client's earlier one (`repeated` says the latter).
    let mut sent = false;
    let own = |added: Added, sent: bool| Added {
        repeated: !sent,
        ..added
    };
    loop {
        let current = read(client, path).await?;
        let Some(value) = next_value(current.value, delta, bounds) else {
            // An add that landed before (its reply lost) is answered as it was, not refused
            // for where the counter is now.
            if let Some(keyed) = key
                && let Some(added) = landed_before(client, keyed).await?
            {
                return Ok(own(added, sent));
            }
            recheck
                .confirm(session, CounterError::OutOfBounds(current.value))
                .await?;
            continue;
        };
        let version = current.stat.as_ref().map(|s| s.version);
        let written = match key {
            None => write(client, path, (value, version), guards, None).await,
            Some(keyed) => {
                let answer = AddAnswer {
                    previous: current.value,
                    value,
                };
                let record = keyed.record(client, &answer).await?;
                match write(client, path, (value, version), guards, Some((keyed, &record))).await {
                    Err(Conflict::KeyThere) => match landed_before(client, keyed).await? {
                        Some(added) => return Ok(own(added, sent)),
                        // Gone meanwhile (the janitor, past the window): a new add.
                        None => continue,
                    },
                    Err(Conflict::Sent) => {
                        sent = true;
                        continue;
                    }
                    written => written,
                }
            }
        };
        match written {
            Ok(stat) => {
                return Ok(Added {
                    previous: current.value,
                    value,
                    mzxid: stat.mzxid,
                    conflicts,
                    repeated: false,
                });
            }
            Err(Conflict::Lost) => conflicts += 1,
            Err(Conflict::Sent | Conflict::KeyThere) => {}
            Err(Conflict::Failed(err)) => return Err(err),
        }
    }
}

/// The add that `keyed`'s record holds, if it is there.
async fn landed_before(client: &Client, keyed: Keyed<'_>) -> Result<Option<Added>, CounterError> {
    let Some(replay) = keyed.recorded::<AddAnswer>(client).await? else {
        return Ok(None);
    };
    Ok(Some(Added {
        previous: replay.answer.previous,
        value: replay.answer.value,
        // Created in the add's own multi-op: its zxid is the add's.
        mzxid: replay.stat.czxid,
        conflicts: 0,
        repeated: true,
    }))
}

/// What an operation of a write's multi-op is for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Part {
    Guard,
    Key,
    Counter,
}

/// Writes `value` on data version `version`, or creates the znode when `version` is `None`, in
/// one multi-op: after the checks of the writer's `guards` and, for a keyed add, the key's
/// record (first, so that a record already there is what a refusal names).
async fn write(
    client: &Client,
    path: &str,
    (value, version): (i64, Option<i32>),
    guards: &Guards,
    keyed: Option<(Keyed<'_>, &Record<'_>)>,
) -> Result<Stat, Conflict> {
    let failed = |e: ZkError| Conflict::Failed(e.into());
    let plain = CreateMode::Persistent.with_acls(crate::zk::acls());
    let data = encode(value);
    let mut multi = Multi::new(client);
    guards.add_to(&mut multi, Part::Guard).map_err(failed)?;
    if let Some((_, record)) = keyed {
        record.add_to(&mut multi, Part::Key).map_err(failed)?;
    }
    match version {
        Some(version) => multi.set(Part::Counter, path, &data, Some(version)).map_err(failed)?,
        None => multi.create(Part::Counter, path, &data, &plain).map_err(failed)?,
    }
    match multi.commit().await {
        Ok(done) => {
            if let Some((keyed, _)) = keyed {
                keyed.committed(client, &done, &Part::Key);
            }
            match done.stat(&Part::Counter) {
                Some(stat) => Ok(*stat),
                // Servers before 3.5 leave a created node's stat out of the reply.
                None => retry_on_loss(|| client.check_stat(path))
                    .await
                    .map_err(failed)?
                    .ok_or(Conflict::Lost),
            }
        }
        Err(Failed::Refused { tag: Part::Guard, .. }) => {
            Err(Conflict::Failed(CounterError::ZooKeeper(Failure::Unguarded)))
        }
        Err(Failed::Refused {
            tag: Part::Key,
            error: ZkError::NodeExists,
        }) => Err(Conflict::KeyThere),
        // The principal's directories are not there (any more).
        Err(Failed::Refused {
            tag: Part::Key,
            error: ZkError::NoNode,
        }) => {
            if let Some((keyed, _)) = keyed {
                keyed.repair(client).await.map_err(failed)?;
            }
            Err(Conflict::Lost)
        }
        Err(Failed::Refused {
            tag: Part::Counter,
            error: ZkError::NoNode,
        }) if version.is_none() => {
            let parent = &path[..path.rfind('/').unwrap_or(0)];
            crate::zk::session::ensure_path(client, parent).await.map_err(failed)?;
            Err(Conflict::Lost)
        }
        Err(Failed::Refused {
            tag: Part::Counter,
            error: ZkError::BadVersion | ZkError::NodeExists | ZkError::NoNode,
        }) => Err(Conflict::Lost),
        // A lost reply: a keyed add goes again, and the key tells whether this one landed;
        // any other write cannot tell.
        Err(failed) if failed.is_loss() && keyed.is_some() => Err(Conflict::Sent),
        Err(failed) if failed.is_loss() => Err(Conflict::Failed(CounterError::OutcomeUnknown)),
        Err(failed) => Err(Conflict::Failed(CounterError::ZooKeeper(failed.into()))),
    }
}

/// Sets the counter at `path` to `value` if `condition` holds (a version is the znode's mzxid,
/// as for kv: the data version starts again at 0 when a counter is deleted and created again,
/// which would let a stale version match); the new stat, and whether the counter was created.
pub async fn set(
    session: &Session,
    path: &str,
    (value, condition): (i64, Condition),
    guards: &Guards,
) -> Result<(Stat, bool), CounterError> {
    let client = session.client();
    let mut recheck = Recheck::default();
    loop {
        let current = match retry_on_loss(|| client.check_stat(path)).await? {
            None if matches!(condition, Condition::Version(_) | Condition::Exists) => {
                Err(CounterError::Precondition(None))
            }
            Some(stat) if condition == Condition::Absent => Err(CounterError::Precondition(Some(stat.mzxid))),
            Some(stat) if matches!(condition, Condition::Version(v) if v != stat.mzxid) => {
                Err(CounterError::Precondition(Some(stat.mzxid)))
            }
            current => Ok(current),
        };
        let current = match current {
            Ok(current) => current,
            Err(refusal) => {
                recheck.confirm(session, refusal).await?;
                continue;
            }
        };
        match write(client, path, (value, current.as_ref().map(|s| s.version)), guards, None).await {
            Ok(stat) => return Ok((stat, current.is_none())),
            // Changed meanwhile: an unconditional set goes again, a conditional one decides
            // again (and fails). (`Sent` is a keyed write's.)
            Err(Conflict::Lost | Conflict::Sent | Conflict::KeyThere) => continue,
            Err(Conflict::Failed(err)) => return Err(err),
        }
    }
}

/// Deletes the counter at `path` if `condition` holds (`Condition::Absent` is not a delete's).
pub async fn delete(session: &Session, path: &str, condition: Condition, guards: &Guards) -> Result<(), CounterError> {
    let client = session.client();
    let mut sent = false;
    let mut recheck = Recheck::default();
    loop {
        let Some(stat) = retry_on_loss(|| client.check_stat(path)).await? else {
            // After a lost reply, a missing counter is our own deletion.
            if sent {
                return Ok(());
            }
            recheck.confirm(session, CounterError::Missing).await?;
            continue;
        };
        if let Condition::Version(v) = condition
            && stat.mzxid != v
        {
            recheck
                .confirm(session, CounterError::Precondition(Some(stat.mzxid)))
                .await?;
            continue;
        }
        let mut multi = Multi::new(client);
        guards.add_to(&mut multi, Part::Guard)?;
        multi.delete(Part::Counter, path, Some(stat.version))?;
        match multi.commit().await {
            Ok(_) => return Ok(()),
            Err(Failed::Refused { tag: Part::Guard, .. }) => return Err(CounterError::ZooKeeper(Failure::Unguarded)),
            Err(Failed::Refused {
                error: ZkError::NoNode | ZkError::BadVersion,
                ..
            }) => {}
            Err(failed) if failed.is_loss() => sent = true,
            Err(failed) => return Err(failed.error().into()),
        }
    }
}

/// Why a write did not land.
enum Conflict {
    /// Another writer got there first: read again.
    Lost,
    /// A keyed write whose reply was lost: read again (the key tells whether it landed).
    Sent,
    /// A keyed write's key is there: an add with it landed before.
    KeyThere,
    Failed(CounterError),
}

/// Sets counter `name` to `value` if `condition` holds: its stat, and whether it was created.
pub async fn set_to(
    recipes: &crate::recipes::Recipes,
    (caller, guards): (&Caller, &[Guard]),
    name: &str,
    (value, condition): (i64, Condition),
) -> Result<(Stat, bool), ApiError> {
    let guards = &Guards::resolve(recipes, caller, guards).await?;
    let session = recipes.zk().connected().await?;
    let path = Kind::Counter.path(&recipes.root, name);
    let set = retry_guarded!(
        guards,
        recipes,
        Err(CounterError::ZooKeeper(Failure::Unguarded)),
        set(&session, &path, (value, condition), guards).await
    );
    let set = set.map_err(|e| counter_error(name, e))?;
    let m = crate::metrics::get();
    m.counter_writes.with_label_values(&[m.counter(name), "set"]).inc();
    Ok(set)
}

/// Deletes counter `name` if `condition` holds (it reads as 0 afterwards).
pub async fn remove(
    recipes: &crate::recipes::Recipes,
    (caller, guards): (&Caller, &[Guard]),
    name: &str,
    condition: Condition,
) -> Result<(), ApiError> {
    let guards = &Guards::resolve(recipes, caller, guards).await?;
    let session = recipes.zk().connected().await?;
    let path = Kind::Counter.path(&recipes.root, name);
    let deleted = retry_guarded!(
        guards,
        recipes,
        Err(CounterError::ZooKeeper(Failure::Unguarded)),
        delete(&session, &path, condition, guards).await
    );
    deleted.map_err(|e| counter_error(name, e))?;
    let m = crate::metrics::get();
    m.counter_writes.with_label_values(&[m.counter(name), "delete"]).inc();
    Ok(())
}

/// What a counter's refusal answers.
fn counter_error(name: &str, err: CounterError) -> ApiError {
    match err {
        CounterError::OutOfBounds(value) => ApiError::new(
            Problem::OutOfBounds,
            format!("counter `{name}` is at {value}: the add would take it past its bounds"),
        )
        .with("value", value),
        CounterError::NotACounter(size) => ApiError::new(
            Problem::NotACounter,
            format!("counter `{name}`'s znode holds {size} bytes that are not an 8-byte big-endian number"),
        )
        .with("size_bytes", size),
        CounterError::Precondition(current) => {
            crate::recipes::kv::precondition_failed(&format!("counter `{name}`"), current)
        }
        CounterError::Missing => ApiError::not_found("counter", format!("no counter `{name}`")),
        CounterError::OutcomeUnknown => ApiError::new(
            Problem::OutcomeUnknown,
            format!(
                "the connection to ZooKeeper was lost after the write to counter `{name}` was sent: \
                 it may or may not have happened; read the counter before trying again (an add with \
                 an `Idempotency-Key` is retried instead)"
            ),
        ),
        CounterError::Key(err) => err.into(),
        CounterError::ZooKeeper(err) => err.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn values_are_stored_as_curator_stores_them() {
        assert_eq!(encode(1), [0, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(encode(-1), [0xff; 8]);
        assert_eq!(decode(&[]), Some(0), "no data is 0");
        assert_eq!(
            decode(&[0, 0, 0, 1]),
            None,
            "four bytes are a SharedCount, not a counter"
        );
        assert_eq!(
            decode(&[0, 0, 0, 0, 0, 0, 1, 0, 9]),
            Some(256),
            "bytes past the eighth are ignored"
        );
    }

    proptest! {
        #[test]
        fn encoding_round_trips(value: i64) {
            prop_assert_eq!(decode(&encode(value)), Some(value));
        }

        #[test]
        fn an_add_stays_within_its_bounds(value: i64, delta: i64, min: Option<i64>, max: Option<i64>) {
            let bounds = Bounds { min, max };
            match next_value(value, delta, bounds) {
                Some(next) => {
                    prop_assert_eq!(i128::from(next), i128::from(value) + i128::from(delta));
                    prop_assert!(min.is_none_or(|m| next >= m) && max.is_none_or(|m| next <= m));
                }
                None => {
                    let exact = i128::from(value) + i128::from(delta);
                    let outside = exact < i128::from(i64::MIN) || exact > i128::from(i64::MAX)
                        || min.is_some_and(|m| exact < i128::from(m)) || max.is_some_and(|m| exact > i128::from(m));
                    prop_assert!(outside);
                }
            }
        }
    }

    #[test]
    fn a_counter_is_created_changed_and_deleted() {
        let topic = CounterTopic {
            name: "c".into(),
            path: "/zkgate/counters/c".into(),
        };
        let stat = |mzxid| crate::recipes::test_stat(mzxid, 8, 0);
        let missing = CounterState::of("c", Some(0), None);
        let one = CounterState::of("c", Some(1), Some(&stat(5)));
        let again = CounterState::of("c", Some(1), Some(&stat(6)));
        assert_eq!(topic.change(&missing, &one), Some(CounterEvent::Created));
        assert_eq!(
            topic.change(&one, &again),
            Some(CounterEvent::Changed),
            "same value, new version"
        );
        assert_eq!(topic.change(&one, &one), None);
        assert_eq!(topic.change(&again, &missing), Some(CounterEvent::Deleted));
    }

    #[test]
    fn problems_name_the_counter_and_what_is_there() {
        let rendered = |err| counter_error("tickets", err).status();
        assert_eq!(rendered(CounterError::OutOfBounds(3)), axum::http::StatusCode::CONFLICT);
        assert_eq!(rendered(CounterError::NotACounter(4)), axum::http::StatusCode::CONFLICT);
        assert_eq!(rendered(CounterError::Missing), axum::http::StatusCode::NOT_FOUND);
        assert_eq!(
            rendered(CounterError::Precondition(None)),
            axum::http::StatusCode::PRECONDITION_FAILED
        );
        assert_eq!(
            rendered(CounterError::OutcomeUnknown),
            axum::http::StatusCode::SERVICE_UNAVAILABLE
        );
    }
}
