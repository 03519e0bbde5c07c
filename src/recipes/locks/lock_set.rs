//! Several exclusive locks taken as one, all or none (Curator's `InterProcessMultiLock`), on the
//! same znodes as single locks: a lock of a set and the same lock taken alone exclude each
//! other, over HTTP, in Curator and in kazoo.
//!
//! A set's locks are taken one after another, each waiting its turn in that lock's queue as a
//! single acquire does, in one **canonical order**: their names sorted bytewise. Two requests
//! asking for overlapping sets in different orders therefore ask for the shared locks in the
//! same order, and the wait-for graph between sets cannot have a cycle (the classic
//! resource-ordering argument: a set waits only for a lock greater than every lock it holds,
//! so following waits always goes up the order and never comes back). A deadlock would need
//! a holder that waits for a lower lock than one it holds, which no set does. (Curator's
//! `InterProcessMultiLock` takes its locks in the order given; a Curator client asking for a
//! set in another order can still wait on a zkgate set until one of their timeouts.)
//!
//! If any lock is not granted within the request's one wait, every lock taken for the set is
//! released before the answer, so a refused set holds nothing. A granted set is recorded in
//! ZooKeeper ([SetRecord]), so that any instance serves it.

use crate::zk::{Failure, Session};
use serde::{Deserialize, Serialize};

/// The order a set's locks are taken in: sorted bytewise. `None` if a name appears twice.
pub fn canonical_order<S: AsRef<str>>(names: &[S]) -> Option<Vec<&str>> {
    let mut order: Vec<&str> = names.iter().map(AsRef::as_ref).collect();
    order.sort_unstable();
    let before = order.len();
    order.dedup();
    (order.len() == before).then_some(order)
}

/// How one request takes a set's locks: acquiring one lock as a single acquire does (waiting
/// its turn), recording the granted set, and giving back what it took. The all-or-none rule
/// is [acquire]'s, whoever drives it.
pub trait Taker {
    /// One lock as taken.
    type Taken;
    type Error;
    /// Takes the lock `name`, waiting its turn.
    fn take(&mut self, name: &str) -> impl Future<Output = Result<Self::Taken, Self::Error>> + Send;
    /// Records the granted set, `taken` in the order taken; answers its id.
    fn record(&mut self, taken: &[Self::Taken]) -> impl Future<Output = Result<String, Self::Error>> + Send;
    /// Gives back what this request took for a refused set, the last taken first.
    fn give_back(&mut self, taken: Vec<Self::Taken>) -> impl Future<Output = ()> + Send;
}

/// Why a set was refused: the error, and the lock it was refused at (`None`: every lock was
/// granted but the set could not be recorded).
pub struct Refused<E> {
    pub error: E,
    pub at: Option<String>,
}

/// Takes the locks of `order` (in [canonical_order]) one after another, all or none: if one
/// is refused, or the granted set cannot be recorded, what was taken is given back before
/// the refusal is answered, so a refused set holds nothing. Answers the set's id and its
/// locks as taken.
pub async fn acquire<T: Taker>(taker: &mut T, order: &[&str]) -> Result<(String, Vec<T::Taken>), Refused<T::Error>> {
    let mut taken = Vec::with_capacity(order.len());
    let refused = async |taker: &mut T, taken: Vec<T::Taken>, error, at: Option<&str>| {
        taker.give_back(taken).await;
        crate::metrics::get().lock_sets.with_label_values(&["refused"]).inc();
        Refused {
            error,
            at: at.map(str::to_string),
        }
    };
    for name in order {
        match taker.take(name).await {
            Ok(lock) => taken.push(lock),
            Err(error) => return Err(refused(taker, taken, error, Some(name)).await),
        }
    }
    match taker.record(&taken).await {
        Ok(id) => {
            crate::metrics::get().lock_sets.with_label_values(&["granted"]).inc();
            Ok((id, taken))
        }
        Err(error) => Err(refused(taker, taken, error, None).await),
    }
}

/// The directory of set records under the root.
pub const LOCK_SETS: &str = "lock-sets";

/// `<root>/lock-sets/<id>`: the record of set `id`.
pub fn record_path(root: &str, id: &str) -> String {
    format!("{root}/{LOCK_SETS}/{id}")
}

/// A granted set's record, `<root>/lock-sets/<id>`: a node holding of its lease (see
/// [crate::recipes::engine::node]; not shown among the lease's holdings, whose locks are), so that any
/// instance reads or releases the set, and it goes when the lease ends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetRecord {
    pub lease: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    /// Its locks, in the order they were taken.
    pub locks: Vec<SetLock>,
    /// When it was granted, ms since the Unix epoch.
    pub created_ms: i64,
}

/// One lock of a set: its name and the lease's handle there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetLock {
    pub lock: String,
    pub handle: String,
}

impl SetRecord {
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn parse(data: &[u8]) -> Option<SetRecord> {
        serde_json::from_slice(data).ok()
    }
}

/// The record of set `id`, if there is one.
pub async fn read(session: &Session, root: &str, id: &str) -> Result<Option<SetRecord>, Failure> {
    let client = session.client();
    Ok(crate::zk::data(client, &record_path(root, id))
        .await?
        .and_then(|(data, _)| SetRecord::parse(&data)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_set_is_taken_in_name_order_and_names_are_not_repeated() {
        assert_eq!(canonical_order(&["b", "a", "c"]), Some(vec!["a", "b", "c"]));
        assert_eq!(canonical_order(&["a", "b", "a"]), None);
        assert_eq!(canonical_order::<&str>(&[]), Some(vec![]));
    }

    proptest! {
        /// However two clients list overlapping sets, they take the locks they share in the
        /// same order: the order of one restricted to the shared locks is the other's.
        #[test]
        fn overlapping_sets_take_shared_locks_in_one_order(
            a in proptest::collection::hash_set("[a-e]{1,2}", 1..8),
            b in proptest::collection::hash_set("[a-e]{1,2}", 1..8),
        ) {
            let (a, b): (Vec<String>, Vec<String>) = (a.into_iter().collect(), b.into_iter().collect());
            let (first, second) = (canonical_order(&a).unwrap(), canonical_order(&b).unwrap());
            let shared_first: Vec<&str> = first.iter().copied().filter(|n| second.contains(n)).collect();
            let shared_second: Vec<&str> = second.iter().copied().filter(|n| first.contains(n)).collect();
            prop_assert_eq!(shared_first, shared_second);
        }
    }
}
