//! The ZooKeeper recipes, one file each: pure decision logic (children in, next step out) kept
//! free of I/O, and a thin async driver beside it.

pub mod barriers;
pub mod condition;
pub mod consistency;
pub mod counters;
pub mod elections;
/// The lease-bound engine every lease-bound recipe shares; only the recipes see it (an edge
/// asks a family for an operation, or for the word it hands on).
pub(in crate::recipes) mod engine;
pub mod groups;
pub mod guards;
pub mod holdings;
pub mod idempotency;
pub mod janitor;
pub mod kv;
pub mod leases;
pub mod locks;
pub mod nodes;
pub mod presence;
pub mod queues;
pub mod recorded;
pub mod roles;
pub mod summary;
pub mod topic;
mod topics;
pub mod txns;
pub mod usage;
pub mod znode;

use crate::zk::{Failure, Session};
use zookeeper_client::{Client, CreateMode, Error as ZkError};

use crate::zk::retry_on_loss;

/// What every recipe's operation acts with: the instance's sessions, the leases it keeps, each
/// kind's registry of what leases hold, and the bounds it serves under. Built once by the
/// composition root (`AppState` holds it and derefs to it, as this derefs to the registries:
/// `state.leases`, `state.locks`); an edge hands it to an operation whole.
pub struct Recipes {
    /// zkgate's root znode (`--root`).
    pub root: String,
    /// The longest a blocking operation waits (`--max-wait`).
    pub max_wait: std::time::Duration,
    /// The most bytes a stored value may take (`--max-value-bytes`).
    pub max_value_bytes: usize,
    /// The most items a queue holds (`--queue-max-depth`), and the most deliveries of one
    /// before it is dead-lettered (`--queue-max-deliveries`).
    pub queue_max_depth: usize,
    pub queue_max_deliveries: u32,
    /// All of the instance's sessions (the primary first); each lease lives on one.
    pub lanes: crate::zk::session::Lanes,
    pub leases: leases::Leases,
    /// What leases hold, kind by kind.
    pub registries: holdings::Registries,
    /// Each service's round-robin turn on this instance.
    pub service_picker: groups::service::Picker,
    pub queues: queues::service::Queues,
    /// The shared exists-watches that barrier, double-barrier and decision waiters wait on.
    pub barrier_watches: crate::zk::watch::ExistsWatches,
    pub limits: std::sync::Arc<crate::limits::Limits>,
    /// The quotas on what zkgate stores in ZooKeeper, in all and per principal.
    pub quotas: usage::Quotas,
    /// Every principal's idempotency keys (one store for every operation that takes one).
    pub idempotency: idempotency::Keys,
}

impl std::ops::Deref for Recipes {
    type Target = holdings::Registries;

    fn deref(&self) -> &holdings::Registries {
        &self.registries
    }
}

impl Recipes {
    /// The primary ZooKeeper session: reads, queues, event topics, the instance's registration.
    pub fn zk(&self) -> &crate::zk::session::ZkSession {
        self.lanes.primary()
    }

    /// 413 `value-too-large` if `what` (a "value", an "item"...) takes more than
    /// [Recipes::max_value_bytes] as stored (`size` bytes).
    pub fn check_stored_size(&self, what: &str, size: usize) -> Result<(), crate::problem::ApiError> {
        match size > self.max_value_bytes {
            true => Err(crate::problem::ApiError::value_too_large(
                what,
                size,
                self.max_value_bytes,
            )),
            false => Ok(()),
        }
    }

    /// A resource's state as its topic carries it (what its `GET` answers), read on the
    /// primary session at `consistency`.
    pub async fn read_state<S: topic::Source>(
        &self,
        source: S,
        consistency: consistency::Consistency,
    ) -> Result<S::State, crate::problem::ApiError> {
        let session = self.reader(consistency).await?;
        Ok(source.read(&session).await?)
    }

    /// Every resource of `kind` that exists in ZooKeeper and `caller` may read, with its number
    /// of children, read at `consistency`.
    pub async fn readable(
        &self,
        caller: &crate::auth::Caller,
        kind: crate::kind::Kind,
        consistency: consistency::Consistency,
    ) -> Result<Vec<(String, i32)>, crate::problem::ApiError> {
        let session = self.reader(consistency).await?;
        let names = read_names(&session, &kind.base(&self.root)).await?;
        Ok(names
            .into_iter()
            .filter(|(name, _)| caller.may(kind.auth(), name, crate::auth::Access::Read))
            .collect())
    }

    /// How long a blocking operation waits: what it asked for, capped at [Recipes::max_wait];
    /// that when it did not ask.
    pub fn wait(&self, asked: Option<std::time::Duration>) -> std::time::Duration {
        asked.unwrap_or(self.max_wait).min(self.max_wait)
    }
}

pub use crate::zk::names::{MAX_NAME_BYTES, validate_name};
/// How the sessions the recipes act on stand with ZooKeeper (what `/healthz` shows an admin).
pub use crate::zk::session::Connection;

/// A resource name from a request's path: 400 `invalid-field` naming `name` if it is not a
/// valid one (ZooKeeper's path rules, [crate::zk::names]); ZooKeeper is not touched.
pub fn check_name(name: &str) -> Result<(), crate::problem::ApiError> {
    crate::zk::names::validate_name(name)
        .map_err(|e| crate::problem::ApiError::invalid(crate::problem::Place::Path, "name", e))
}

/// Why the setting recorded in a resource's znode could not be agreed on.
#[derive(Debug)]
pub enum SettingError {
    /// The resource records another value.
    Mismatch(u64),
    ZooKeeper(Failure),
}

/// Makes sure the znode `dir` exists (created with `mode`) and records `key: value` in its JSON
/// data, or says what it records instead: the first request sets it and later ones must agree
/// (a semaphore's number of permits, a double barrier's size), so that clients cannot silently
/// use two different settings. A znode without a record (made by Curator, say) gets ours.
pub async fn agree_on_setting(
    client: &Client,
    dir: &str,
    key: &str,
    value: u64,
    mode: CreateMode,
) -> Result<(), SettingError> {
    let ours = serde_json::to_vec(&serde_json::json!({ key: value })).unwrap_or_default();
    loop {
        match retry_on_loss(|| client.get_data(dir)).await {
            Ok((data, stat)) => match recorded(&data, key) {
                Some(n) if n == value => return Ok(()),
                Some(n) => return Err(SettingError::Mismatch(n)),
                None => match retry_on_loss(|| client.set_data(dir, &ours, Some(stat.version))).await {
                    Ok(_) => return Ok(()),
                    Err(ZkError::BadVersion | ZkError::NoNode) => continue,
                    Err(err) => return Err(SettingError::ZooKeeper(err.into())),
                },
            },
            Err(ZkError::NoNode) => {
                let options = mode.with_acls(crate::zk::acls());
                match retry_on_loss(|| client.create(dir, &ours, &options)).await {
                    Ok(_) => return Ok(()),
                    Err(ZkError::NodeExists) => continue,
                    Err(ZkError::NoNode) => {
                        let parent = &dir[..dir.rfind('/').unwrap_or(0)];
                        crate::zk::session::ensure_path(client, parent)
                            .await
                            .map_err(|err| SettingError::ZooKeeper(err.into()))?;
                    }
                    Err(err) => return Err(SettingError::ZooKeeper(err.into())),
                }
            }
            Err(err) => return Err(SettingError::ZooKeeper(err.into())),
        }
    }
}

/// Creates the empty znode `path` (with `mode`) unless it is there already (a create whose
/// reply was lost finds it there when sent again).
pub async fn create_if_absent(client: &Client, path: &str, mode: CreateMode) -> Result<(), ZkError> {
    let options = mode.with_acls(crate::zk::acls());
    match retry_on_loss(|| client.create(path, &[], &options)).await {
        Ok(_) | Err(ZkError::NodeExists) => Ok(()),
        Err(err) => Err(err),
    }
}

/// The setting `key` that [agree_on_setting] recorded in a znode's data, if any.
pub fn recorded(data: &[u8], key: &str) -> Option<u64> {
    serde_json::from_slice::<serde_json::Value>(data)
        .ok()?
        .get(key)?
        .as_u64()
}

/// Every resource znode under `base` (`<root>/<kind>`) with its number of children (contenders,
/// members, items...), read in two round trips.
pub async fn read_names(session: &Session, base: &str) -> Result<Vec<(String, i32)>, Failure> {
    let client = session.client();
    let mut names = crate::zk::children(client, base).await?;
    names.sort();
    let read = crate::zk::read_each(client, base, names).await?;
    Ok(read
        .into_iter()
        .map(|(name, _, stat)| (name, stat.num_children))
        .collect())
}

/// The sequence number ZooKeeper appended to a sequential znode's name: the trailing run of
/// digits, 10 of them (or 19 once a parent's counter passes `i32::MAX`).
///
/// Contenders are ordered by this suffix alone, whatever their prefix: Curator names its nodes
/// `_c_<uuid>-lock-<seq>`, kazoo `<uuid>__lock__<seq>`, and both may sit under one lock znode.
/// Children without such a suffix are not contenders.
pub fn sequence_of(child: &str) -> Option<u64> {
    let digits = child.bytes().rev().take_while(u8::is_ascii_digit).count();
    if digits != 10 && digits != 19 {
        return None;
    }
    child[child.len() - digits..].parse().ok()
}

/// The contenders among `children`, lowest sequence number first.
pub fn in_sequence_order<S: AsRef<str>>(children: &[S]) -> Vec<(u64, &str)> {
    let mut contenders: Vec<(u64, &str)> = children
        .iter()
        .filter_map(|c| sequence_of(c.as_ref()).map(|seq| (seq, c.as_ref())))
        .collect();
    contenders.sort_unstable();
    contenders
}

/// A znode's stat, for tests: made at zxid 1, last changed at `mzxid`, holding `data_length`
/// bytes and `num_children` children.
#[cfg(test)]
pub(crate) fn test_stat(mzxid: i64, data_length: i32, num_children: i32) -> zookeeper_client::Stat {
    zookeeper_client::Stat {
        czxid: 1,
        mzxid,
        pzxid: 1,
        ctime: 0,
        mtime: 0,
        version: 0,
        cversion: 0,
        aversion: 0,
        ephemeral_owner: 0,
        data_length,
        num_children,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_suffixes() {
        assert_eq!(sequence_of("_c_0b3c-lock-0000000042"), Some(42));
        assert_eq!(sequence_of("a1b2__lock__0000000007"), Some(7));
        assert_eq!(sequence_of("x-0000000000000000012"), Some(12));
        assert_eq!(sequence_of("lock-42"), None);
        assert_eq!(sequence_of("00000000001"), None);
        assert_eq!(sequence_of("leases"), None);
    }

    #[test]
    fn orders_by_suffix_not_name() {
        let children = [
            "z__lock__0000000003",
            "_c_a-lock-0000000001",
            "b__lock__0000000002",
            "readme",
        ];
        let names: Vec<&str> = in_sequence_order(&children).into_iter().map(|(_, n)| n).collect();
        assert_eq!(
            names,
            ["_c_a-lock-0000000001", "b__lock__0000000002", "z__lock__0000000003"]
        );
    }
}
