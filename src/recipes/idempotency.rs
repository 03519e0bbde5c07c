//! Idempotency keys: one store for every operation that takes an `Idempotency-Key` (a lease's
//! creation, a queue put, a counter add, a kv transaction, and whatever takes one later).
//!
//! **A record per key, written with the write.** A keyed write's multi-op first creates the
//! key's record `<root>/idempotency/<principal>/<id>` (`id`: a digest of the key, so that any
//! key makes a znode name), holding the request's fingerprint and what the write answers, and
//! the record's charge `<root>/usage/<principal>/ik-<id>`; then the write's own operations. So
//! the record is there exactly when the write landed. A retry (through any instance, after the
//! instance that answered first is gone, after a reply ZooKeeper lost) has its create refused
//! (`NodeExists`, before any of the write's own operations is looked at) and is answered from
//! the record; one with the same key and another fingerprint is refused
//! ([KeyError::Reused]), the same way for every operation. What an answer holds is the
//! operation's own (a lease's id, a counter's values, a transaction's results); the zxid of
//! the write is the record's `czxid`, since every operation of a multi-op has the same zxid.
//!
//! **Per principal.** Each principal's records are under a directory of its own: alice's key
//! `k` and bob's `k` are two records, and neither learns of the other's (with auth off every
//! caller is [ANYONE]).
//!
//! **Bounded, and paid for.** A record is at most [MAX_RECORD_BYTES], and its charge counts
//! against its principal's quota (`--quota-bytes-per-principal`, `--quota-znodes-per-principal`)
//! like a value it stored, so that a principal meets its own limit before the tree's. A key is
//! remembered for `--idempotency-window` (24 h; the janitor forgets older ones), or until its
//! principal has made `--idempotency-keys` (10,000) newer ones, whichever comes first: each
//! keyed write learns from its own multi-op how many records its principal has (it sets the
//! principal's directory's data, whose stat comes back with the child count), and one that
//! finds more than the limit has the oldest (by zxid) forgotten, down to nine tenths of it, by
//! a task of its instance (one at a time per principal). At the write-rate limit (`--write-rate`,
//! 1,000 a second) a key is so remembered for 9 to 10 s at least; at 10 writes a second, for
//! 15 minutes. The store then holds at most `--idempotency-keys` records per principal, plus
//! what is written while an eviction runs, and never more than the principal's quota.
//!
//! **A request that changes nothing stores nothing.** Only a write that lands writes a record: a
//! refused one (out of bounds, a full queue) leaves none, and a kv transaction whose branch only
//! reads stores none (its retry reads again, which is as safe as any read; but a retry of one
//! whose earlier attempt wrote is answered from that attempt's record). So a caller that may
//! only read leaves the tree as it was.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use zookeeper_client::{Client, CreateMode, Error as ZkError, Stat};

use crate::locked::Locked;
use crate::recipes::usage::{ANYONE, Charge, ChargeError, Exceeded, Quotas};
use crate::zk::{Done, Failure, Multi};

/// The largest record: what an operation answers, kept for its retries (a transaction's gets'
/// values are the largest part), so that the write with its record stays well within
/// ZooKeeper's 1 MiB packet.
pub const MAX_RECORD_BYTES: usize = 512 * 1024;

/// Most keys a principal's store may be set to hold (`--idempotency-keys`): the eviction lists
/// them in one reply, well within ZooKeeper's 1 MiB packet (about 36 bytes a name).
pub const MAX_KEYS_PER_PRINCIPAL: usize = 20_000;

/// The longest key accepted (bytes).
pub const MAX_KEY_BYTES: usize = 255;

/// How the store is bounded.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// How long a key is remembered at most (`--idempotency-window`).
    pub window: Duration,
    /// How many keys a principal's store holds before the oldest are forgotten
    /// (`--idempotency-keys`).
    pub per_principal: usize,
}

/// The store of this instance's root. Cheap to clone.
#[derive(Clone)]
pub struct Keys(Arc<Inner>);

struct Inner {
    /// `<root>/idempotency`.
    dir: String,
    quotas: Quotas,
    settings: Settings,
    /// Principals whose directory this process has made.
    prepared: Mutex<HashSet<String>>,
    /// Principals whose oldest keys a task of this process is forgetting now, and whether a
    /// write found the store past its bound meanwhile (the task then looks again before it ends).
    evicting: Mutex<HashMap<String, bool>>,
}

/// A request's idempotency key, as sent: whose, the key, and the request's fingerprint (a
/// digest of everything that makes it this request; the HTTP edge says what).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Key {
    principal: String,
    /// The record's znode name: a digest of the key.
    id: String,
    request: String,
}

impl Key {
    /// The key `key` of `principal` (`None`: auth is off) for the request whose fingerprint is
    /// `request`.
    pub fn new(principal: Option<&str>, key: &str, request: String) -> Key {
        Key {
            principal: principal.unwrap_or(ANYONE).to_string(),
            id: record_id(key),
            request,
        }
    }
}

/// The name of key `key`'s record: 32 hex digits of its SHA-256.
pub fn record_id(key: &str) -> String {
    use sha2::Digest;
    crate::ids::hex(&sha2::Sha256::digest(key.as_bytes())[..16])
}

/// A keyed request as a recipe gets it: its key, and the store.
#[derive(Clone, Copy)]
pub struct Keyed<'a> {
    pub keys: &'a Keys,
    pub key: &'a Key,
}

/// Why a keyed write was not made.
#[derive(Debug, Clone, thiserror::Error)]
pub enum KeyError {
    /// The key was used by another request (another operation, resource or body).
    #[error(
        "this `Idempotency-Key` was used by another request; a retry must repeat the request (its method, path, query, `Content-Type` and body)"
    )]
    Reused,
    /// What the write answers, kept for its retries, would take this many bytes (more than
    /// [MAX_RECORD_BYTES]).
    #[error(
        "with an `Idempotency-Key`, what the request answers is kept for its retries, and this one's is {0} bytes (at most {MAX_RECORD_BYTES})"
    )]
    TooLarge(usize),
    /// The record would pass this quota of its principal's (or the tree's).
    #[error("{}", .0.detail)]
    Quota(Exceeded),
    #[error(transparent)]
    ZooKeeper(Failure),
}

impl From<ZkError> for KeyError {
    fn from(err: ZkError) -> KeyError {
        KeyError::ZooKeeper(err.into())
    }
}

impl From<Failure> for KeyError {
    fn from(err: Failure) -> KeyError {
        KeyError::ZooKeeper(err)
    }
}

/// What a record holds.
#[derive(Serialize, Deserialize)]
struct Stored<A> {
    request: String,
    answer: A,
}

/// A write's record, ready to go into its multi-op ([Record::add_to]).
pub struct Record<'a> {
    keyed: Keyed<'a>,
    data: Vec<u8>,
    charge: Charge,
}

/// An answer given before, from its record.
#[derive(Debug)]
pub struct Replay<A> {
    pub answer: A,
    /// The record's stat: its `czxid` is the zxid of the write it went with.
    pub stat: Stat,
}

impl Keys {
    pub fn new(root: &str, quotas: Quotas, settings: Settings) -> Keys {
        Keys(Arc::new(Inner {
            dir: format!("{root}/idempotency"),
            quotas,
            settings,
            prepared: Mutex::default(),
            evicting: Mutex::default(),
        }))
    }

    /// `<root>/idempotency`: each principal's directory is under it.
    pub fn dir(&self) -> &str {
        &self.0.dir
    }

    pub fn settings(&self) -> Settings {
        self.0.settings
    }

    fn principal_dir(&self, principal: &str) -> String {
        format!("{}/{principal}", self.0.dir)
    }

    fn record_path(&self, principal: &str, id: &str) -> String {
        format!("{}/{id}", self.principal_dir(principal))
    }

    /// The charge of record `id` of `principal`.
    fn charge(principal: &str, id: &str) -> Charge {
        Charge {
            principal: principal.to_string(),
            id: format!("ik-{id}"),
        }
    }

    /// Makes the directory of `principal`'s records (once per process; again after
    /// [Keyed::repair]).
    async fn prepare(&self, client: &Client, principal: &str) -> Result<(), ZkError> {
        if self.0.prepared.locked().contains(principal) {
            return Ok(());
        }
        let dir = self.principal_dir(principal);
        crate::zk::retry_on_loss(|| crate::zk::session::ensure_path(client, &dir)).await?;
        self.0.prepared.locked().insert(principal.to_string());
        Ok(())
    }

    /// Forgets `principal`'s records `ids`, each with its charge in one multi-op (in batches of
    /// at most [FORGET_BATCH] records); those gone already are skipped. Answers how many it
    /// removed.
    pub async fn forget(&self, client: &Client, principal: &str, ids: &[String]) -> Result<u64, ZkError> {
        let mut forgotten = 0;
        for batch in ids.chunks(FORGET_BATCH) {
            let mut multi = Multi::new(client);
            for id in batch {
                self.add_forget(&mut multi, principal, id)?;
            }
            match multi.commit().await {
                Ok(_) => forgotten += batch.len() as u64,
                // One went meanwhile (another instance forgot it too): each on its own.
                Err(_) => {
                    for id in batch {
                        let mut multi = Multi::new(client);
                        self.add_forget(&mut multi, principal, id)?;
                        match multi.commit().await {
                            Ok(_) => forgotten += 1,
                            Err(failed) if failed.is_loss() => {}
                            Err(failed) => match failed.error() {
                                ZkError::NoNode => {}
                                err => return Err(err),
                            },
                        }
                    }
                }
            }
        }
        Ok(forgotten)
    }

    fn add_forget(&self, multi: &mut Multi<'_, ()>, principal: &str, id: &str) -> Result<(), ZkError> {
        multi.delete((), &self.record_path(principal, id), None)?;
        self.0.quotas.add_refund(multi, (), &Keys::charge(principal, id))
    }

    /// Every principal's records made before `oldest_kept` (ms since the epoch), by principal.
    pub async fn expired(&self, client: &Client, oldest_kept: i64) -> Result<Vec<(String, Vec<String>)>, ZkError> {
        let mut expired = Vec::new();
        for principal in crate::zk::children(client, &self.0.dir).await? {
            let old: Vec<String> = (self.records(client, &principal).await?.into_iter())
                .filter(|(_, stat)| stat.ctime < oldest_kept)
                .map(|(id, _)| id)
                .collect();
            if !old.is_empty() {
                expired.push((principal, old));
            }
        }
        Ok(expired)
    }

    /// `principal`'s records with their stats.
    async fn records(&self, client: &Client, principal: &str) -> Result<Vec<(String, Stat)>, ZkError> {
        let dir = self.principal_dir(principal);
        let ids = crate::zk::children(client, &dir).await?;
        let paths: Vec<String> = ids.iter().map(|id| format!("{dir}/{id}")).collect();
        let stats = crate::zk::stat_each(client, &paths).await?;
        Ok(ids
            .into_iter()
            .zip(stats)
            .filter_map(|(id, stat)| Some((id, stat?)))
            .collect())
    }

    /// Forgets `principal`'s oldest records (by zxid) down to nine tenths of the limit, unless a
    /// task of this process is at it already.
    fn evict(&self, client: &Client, principal: &str) {
        {
            let mut evicting = self.0.evicting.locked();
            if let Some(again) = evicting.get_mut(principal) {
                *again = true;
                return;
            }
            evicting.insert(principal.to_string(), false);
        }
        let (keys, client, principal) = (self.clone(), client.clone(), principal.to_string());
        tokio::spawn(async move {
            loop {
                if let Err(err) = keys.evict_oldest(&client, &principal).await {
                    tracing::warn!(error = %err, principal, "could not forget the oldest idempotency keys");
                }
                // A write that found the store past its bound while this ran left it to this
                // task: once more, or done (under the lock, so that no such write is missed).
                let mut evicting = keys.0.evicting.locked();
                match evicting.get_mut(&principal) {
                    Some(again) if *again => *again = false,
                    _ => {
                        evicting.remove(&principal);
                        return;
                    }
                }
            }
        });
    }

    /// Forgets `principal`'s oldest records down to nine tenths of the limit, and again while
    /// the writes that land meanwhile keep the store past the limit.
    async fn evict_oldest(&self, client: &Client, principal: &str) -> Result<(), ZkError> {
        let limit = self.0.settings.per_principal;
        let keep = limit * 9 / 10;
        loop {
            let mut records = self.records(client, principal).await?;
            if records.len() <= limit {
                return Ok(());
            }
            records.sort_by_key(|(_, stat)| stat.czxid);
            let over = records.len() - keep;
            let oldest: Vec<String> = records.into_iter().take(over).map(|(id, _)| id).collect();
            let forgotten = self.forget(client, principal, &oldest).await?;
            crate::metrics::get().idempotency_keys_evicted.inc_by(forgotten);
            if forgotten == 0 {
                // Nothing went (ZooKeeper not answering): the next keyed write tries again,
                // rather than this task in a loop.
                return Ok(());
            }
        }
    }
}

/// Most records forgotten in one multi-op (each with its charge: twice as many deletions).
pub const FORGET_BATCH: usize = 100;

impl<'a> Keyed<'a> {
    /// The record of a write that answers `answer`, checked against its principal's quota
    /// (where the servers do not enforce quotas) and its size bound.
    ///
    /// # Notable errors
    /// * [KeyError::TooLarge] past [MAX_RECORD_BYTES].
    /// * [KeyError::Quota] where zkgate checks the quotas itself and the record passes one.
    pub async fn record<A: Serialize>(&self, client: &Client, answer: &A) -> Result<Record<'a>, KeyError> {
        let stored = Stored {
            request: self.key.request.clone(),
            answer,
        };
        // An answer is plain data (no map with keys that are not text): it always serialises.
        let data = serde_json::to_vec(&stored).unwrap_or_default();
        if data.len() > MAX_RECORD_BYTES {
            return Err(KeyError::TooLarge(data.len()));
        }
        let key = self.key;
        self.keys.prepare(client, &key.principal).await?;
        let quotas = &self.keys.0.quotas;
        let id = Keys::charge(&key.principal, &key.id).id;
        let charge = match quotas.charge_as(client, Some(&key.principal), data.len(), id).await {
            Ok(charge) => charge,
            Err(ChargeError::Exceeded(exceeded)) => return Err(KeyError::Quota(exceeded)),
            Err(ChargeError::ZooKeeper(err)) => return Err(KeyError::ZooKeeper(err)),
        };
        Ok(Record {
            keyed: *self,
            data,
            charge,
        })
    }

    /// The answer recorded for this key, if there is a record; [KeyError::Reused] if another
    /// request made it.
    pub async fn recorded<A: DeserializeOwned>(&self, client: &Client) -> Result<Option<Replay<A>>, KeyError> {
        let path = self.keys.record_path(&self.key.principal, &self.key.id);
        let Some((data, stat)) = crate::zk::data(client, &path).await? else {
            return Ok(None);
        };
        let stored: Stored<A> = serde_json::from_slice(&data).map_err(|_| KeyError::Reused)?;
        if stored.request != self.key.request {
            return Err(KeyError::Reused);
        }
        Ok(Some(Replay {
            answer: stored.answer,
            stat,
        }))
    }

    /// [KeyError::Quota], naming the quota that a write with this key's record passed (after
    /// ZooKeeper refused it with `QuotaExceeded`).
    pub async fn exceeded(&self, client: &Client, bytes: usize) -> KeyError {
        let quotas = &self.keys.0.quotas;
        match quotas.check(client, &self.key.principal, bytes).await {
            Ok(Some(exceeded)) => KeyError::Quota(exceeded),
            _ => KeyError::Quota(Exceeded {
                quota: "--quota-bytes",
                detail: "ZooKeeper refused the write: a quota on zkgate's znodes is full; delete something first"
                    .into(),
            }),
        }
    }

    /// Makes the principal's directories again (after a multi-op refused the record's part
    /// with `NoNode`).
    pub async fn repair(&self, client: &Client) -> Result<(), ZkError> {
        let principal = &self.key.principal;
        self.keys.0.prepared.locked().remove(principal);
        self.keys.prepare(client, principal).await?;
        self.keys.0.quotas.repair(client, principal).await
    }

    /// After the multi-op with this key's record (tagged `tag`) committed as `done`: keeps the
    /// principal's store within its count (see the module's notes).
    pub fn committed<T: PartialEq>(&self, client: &Client, done: &Done<T>, tag: &T) {
        let count = done.set_stat(tag).map_or(0, |dir| dir.num_children as usize);
        if count > self.keys.0.settings.per_principal {
            self.keys.evict(client, &self.key.principal);
        }
    }
}

impl Record<'_> {
    /// Adds the record to `multi`, all its operations tagged `tag`, before the write's own (so
    /// that a retry is refused by the record's create before anything else is looked at): the
    /// record created, the principal's directory's data set (its stat, with the child count the
    /// record is in, comes back for [Keyed::committed]), the record's charge created.
    pub fn add_to<T: Clone>(&self, multi: &mut Multi<'_, T>, tag: T) -> Result<(), ZkError> {
        let (keys, key) = (self.keyed.keys, self.keyed.key);
        let options = CreateMode::Persistent.with_acls(crate::zk::acls());
        let path = keys.record_path(&key.principal, &key.id);
        multi.create(tag.clone(), &path, &self.data, &options)?;
        // After the create: its stat counts the new record.
        multi.set(tag.clone(), &keys.principal_dir(&key.principal), &[], None)?;
        keys.0.quotas.add_charge(multi, tag, &self.charge, self.data.len())
    }
}

impl From<KeyError> for crate::problem::ApiError {
    fn from(err: KeyError) -> crate::problem::ApiError {
        use crate::problem::{ApiError, Problem};
        match err {
            KeyError::Reused => ApiError::new(Problem::IdempotencyKeyReused, err.to_string()),
            KeyError::TooLarge(bytes) => ApiError::new(Problem::ValueTooLarge, err.to_string())
                .with("limit_bytes", MAX_RECORD_BYTES)
                .with("size_bytes", bytes),
            KeyError::Quota(exceeded) => exceeded.into(),
            KeyError::ZooKeeper(failure) => failure.into(),
        }
    }
}
