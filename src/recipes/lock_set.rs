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
use zookeeper_client::Error as ZkError;

use crate::zk::retry_on_loss;

/// The order a set's locks are taken in: sorted bytewise. `None` if a name appears twice.
pub fn canonical_order<S: AsRef<str>>(names: &[S]) -> Option<Vec<&str>> {
    let mut order: Vec<&str> = names.iter().map(AsRef::as_ref).collect();
    order.sort_unstable();
    let before = order.len();
    order.dedup();
    (order.len() == before).then_some(order)
}

/// The directory of set records under the root.
pub const LOCK_SETS: &str = "lock-sets";

/// `<root>/lock-sets/<id>`: the record of set `id`.
pub fn record_path(root: &str, id: &str) -> String {
    format!("{root}/{LOCK_SETS}/{id}")
}

/// A granted set's record, `<root>/lock-sets/<id>`: a lease-bound node of its lease (see
/// [super::bound]; not shown among the lease's holdings, whose locks are), so that any
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
    match retry_on_loss(|| client.get_data(&record_path(root, id))).await {
        Ok((data, _)) => Ok(SetRecord::parse(&data)),
        Err(ZkError::NoNode) => Ok(None),
        Err(err) => Err(err.into()),
    }
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
