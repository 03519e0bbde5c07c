//! Transactions over keys (docs/PRIMITIVES.md, part 2): compares, then one branch of writes and
//! reads, applied as one ZooKeeper `multi`, all or none.
//!
//! ZooKeeper's `multi` checks versions, not values, so a transaction is optimistic: read every
//! key it names, evaluate the compares on what was read (that picks the branch), then commit
//! one multi-op that first *pins* what was read (a `check` at the read data version for a key
//! that existed; a `create` and `delete` of the key for one that did not, which fails if it
//! appeared) and then makes the branch's writes. If a pin fails, a key changed between the read
//! and the commit: read again and decide again. So whichever branch commits, the compares held
//! (or failed) at its commit's zxid, and every value answered was current then.
//!
//! What the compares say of what was read, and the multi-op a branch becomes, are pure
//! ([Txn::first_failed], [plan]); [run] reads, commits and reads again.
//!
//! Keys bound to a lease ([super::kv::bound]) keep their rule inside a transaction: the owner
//! record of every key a branch writes is read with the keys, a plain put over a bound key (or
//! a put bound to a lease over a plain key, or another lease's) refuses the whole transaction,
//! and the multi-op pins each of those owner records as read (the create and delete of an
//! absent one's path, a `check` of a present one's version), so a binding made or changed
//! between the read and the commit sends the transaction round again. A put bound to a lease
//! writes the binding's owner record and holding record in the multi-op, guarded by the lease,
//! and this instance takes the binding up after the commit; a delete of a bound key deletes its
//! binding with it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use zookeeper_client::{CreateMode, Error as ZkError, Stat};

use super::condition::Recheck;
use super::engine::lease::{Guard, GuardError, Lease};
use super::engine::node::owner_record_path;
use super::engine::record::{self, HoldingRecord, Shape};
use super::kv::Entry;
use super::kv::bound::{Binding, BoundKeys};
use super::usage::{self, ChargeError, Exceeded, Payer, Quotas};
use crate::kind::Kind;
use crate::zk::{Done, Failed, Failure, Multi, Session};

/// What a compare asks of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compare {
    Exists,
    Absent,
    /// The key holds these bytes.
    Value(Vec<u8>),
    /// The key is at this ETag (its mzxid, as the kv routes' `If-Match`).
    Etag(i64),
    /// The key exists with a data version in this range (both ends inclusive; etcd's `VERSION`).
    Version {
        at_least: Option<i32>,
        at_most: Option<i32>,
    },
}

impl Compare {
    /// Whether the compare holds of the key as read (`None`: absent).
    pub fn holds(&self, read: Option<&Entry>) -> bool {
        match (self, read) {
            (Compare::Absent, read) => read.is_none(),
            (_, None) => false,
            (Compare::Exists, Some(_)) => true,
            (Compare::Value(value), Some(entry)) => entry.data == *value,
            (Compare::Etag(mzxid), Some(entry)) => entry.stat.mzxid == *mzxid,
            (Compare::Version { at_least, at_most }, Some(entry)) => {
                let version = entry.stat.version;
                at_least.is_none_or(|low| version >= low) && at_most.is_none_or(|high| version <= high)
            }
        }
    }
}

/// A compare of the key at `path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub path: String,
    pub compare: Compare,
}

/// One operation of a branch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Writes the key; with `lease` (an id the caller may use), binds it to that lease, by the
    /// rule of single writes ([super::kv::Binds]) but without `rebind`.
    Put {
        path: String,
        data: Vec<u8>,
        lease: Option<String>,
    },
    /// Deletes the key if it exists (a key that does not is no failure, as in etcd).
    Delete {
        path: String,
    },
    Get {
        path: String,
    },
}

impl Step {
    pub fn path(&self) -> &str {
        match self {
            Step::Put { path, .. } | Step::Delete { path } | Step::Get { path } => path,
        }
    }

    /// The bytes it stores.
    fn bytes(&self) -> usize {
        match self {
            Step::Put { data, .. } => data.len(),
            Step::Delete { .. } | Step::Get { .. } => 0,
        }
    }

    fn writes(&self) -> bool {
        !matches!(self, Step::Get { .. })
    }
}

/// A transaction: if every compare holds, `then`; otherwise `otherwise`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Txn {
    pub compare: Vec<Check>,
    pub then: Vec<Step>,
    pub otherwise: Vec<Step>,
}

impl Txn {
    /// Every key the transaction reads before it commits: the compared ones and those its
    /// branches name (a write must know whether it creates or replaces).
    pub fn keys(&self) -> Vec<&str> {
        let mut seen = HashSet::new();
        let compared = self.compare.iter().map(|check| check.path.as_str());
        let named = self.then.iter().chain(&self.otherwise).map(Step::path);
        compared.chain(named).filter(|path| seen.insert(*path)).collect()
    }

    /// The first key a branch writes twice, if any: refused, as etcd refuses it, since the
    /// order of two writes of one key in one step would be the transaction's own guess.
    pub fn written_twice(&self) -> Option<&str> {
        [&self.then, &self.otherwise].into_iter().find_map(|branch| {
            let mut written = HashSet::new();
            branch
                .iter()
                .filter(|step| step.writes())
                .map(Step::path)
                .find(|path| !written.insert(*path))
        })
    }

    /// The index of the first compare that fails on `reads` (`None`: all hold, `then` runs).
    pub fn first_failed(&self, reads: &HashMap<String, Option<Entry>>) -> Option<usize> {
        self.compare
            .iter()
            .position(|check| !check.compare.holds(reads.get(&check.path).and_then(Option::as_ref)))
    }
}

/// One operation of the multi-op a branch becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Planned {
    /// The key existed at this data version when read, and must still.
    Pinned {
        path: String,
        version: i32,
    },
    /// The key did not exist when read, and must not: a create and a delete of it, and of its
    /// missing `parents` around them (highest first), so that nothing stays.
    PinnedAbsent {
        path: String,
        parents: Vec<String>,
    },
    /// A missing parent of a new key.
    Parent {
        path: String,
    },
    Create {
        path: String,
        data: Vec<u8>,
    },
    Set {
        path: String,
        data: Vec<u8>,
        version: i32,
    },
    Delete {
        path: String,
        version: i32,
    },
    /// The charges of the key at `path` moved to its writer, or refunded (added by [run]).
    Charge {
        path: String,
    },
    /// The key at `path` was read bound to no lease, and must still be: the create and delete
    /// of its owner record's path.
    Unbound {
        path: String,
    },
    /// The key at `path` was read bound to the put's own lease, its owner record at `version`,
    /// and must still be.
    BoundTo {
        path: String,
        version: i32,
    },
    /// The put of the key at `path` binds it to lease `lease` (its owner record and holding
    /// record, written by [run], which knows the lease).
    Bind {
        path: String,
        lease: String,
    },
    /// The delete of the key at `path` deletes its binding: the owner record at `version`, and
    /// the holding record `record` of its lease if it was there when read.
    Unbind {
        path: String,
        version: i32,
        record: Option<String>,
    },
    /// The guard of lease `lease`, for the bindings the branch makes (added by [run]).
    Guard {
        lease: String,
    },
    /// The idempotency key's znode, created first (added by [run]).
    Key,
}

/// The binding of a key a branch writes, as read: its owner record's content and version, and
/// whether its lease's holding record was there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadBinding {
    pub binding: Binding,
    pub version: i32,
    pub record: Option<String>,
}

/// Why a transaction was refused by the rule for bound keys ([super::kv::Binds]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindingRefusal {
    /// A put bound to no lease, or to another one, of the key at `path`, bound to `lease`.
    Bound { path: String, lease: String },
    /// A put bound to a lease of the key at `path`, which exists bound to none.
    NotBound { path: String },
}

/// The first put of `branch` that the rule for bound keys refuses, given what was read.
pub fn refused(
    branch: &[Step],
    reads: &HashMap<String, Option<Entry>>,
    bindings: &HashMap<String, Option<ReadBinding>>,
) -> Option<BindingRefusal> {
    branch.iter().find_map(|step| {
        let Step::Put { path, lease, .. } = step else {
            return None;
        };
        let bound = bindings.get(path).cloned().flatten();
        let exists = matches!(reads.get(path), Some(Some(_)));
        match (lease, bound) {
            (None, Some(read)) => Some(BindingRefusal::Bound {
                path: path.clone(),
                lease: read.binding.lease,
            }),
            (Some(lease), Some(read)) if read.binding.lease != *lease => Some(BindingRefusal::Bound {
                path: path.clone(),
                lease: read.binding.lease,
            }),
            (Some(_), None) if exists => Some(BindingRefusal::NotBound { path: path.clone() }),
            _ => None,
        }
    })
}

/// The multi-op of `branch`, given what was `read` of every key ([Txn::keys]) and the `missing`
/// parents of keys that were absent (highest first; found after a commit failed for want of
/// one). Every key read is pinned first, so that the compares and the gets stand at the commit;
/// a pin of an absent key removes the parents it made, and a put makes them again.
pub fn plan(
    branch: &[Step],
    reads: &HashMap<String, Option<Entry>>,
    missing: &HashMap<String, Vec<String>>,
    bindings: &HashMap<String, Option<ReadBinding>>,
) -> Vec<Planned> {
    let mut planned: Vec<Planned> = reads
        .iter()
        .map(|(path, read)| match read {
            Some(entry) => Planned::Pinned {
                path: path.clone(),
                version: entry.stat.version,
            },
            None => Planned::PinnedAbsent {
                path: path.clone(),
                parents: missing.get(path).cloned().unwrap_or_default(),
            },
        })
        .collect();
    // Pins in key order: the same transaction always sends the same multi-op.
    planned.sort_by(|a, b| pinned_path(a).cmp(pinned_path(b)));
    let mut parents_made = HashSet::new();
    for step in branch {
        let read = reads.get(step.path()).and_then(Option::as_ref);
        if step.writes() {
            planned.extend(binding_of(step, read.is_some(), bindings));
        }
        match (step, read) {
            (Step::Put { path, data, .. }, Some(entry)) => planned.push(Planned::Set {
                path: path.clone(),
                data: data.clone(),
                version: entry.stat.version,
            }),
            (Step::Put { path, data, .. }, None) => {
                let parents = missing.get(path).into_iter().flatten();
                for parent in parents.filter(|parent| parents_made.insert(parent.as_str())) {
                    planned.push(Planned::Parent { path: parent.clone() });
                }
                planned.push(Planned::Create {
                    path: path.clone(),
                    data: data.clone(),
                });
            }
            (Step::Delete { path }, Some(entry)) => planned.push(Planned::Delete {
                path: path.clone(),
                version: entry.stat.version,
            }),
            // Nothing to delete (its pin keeps it so), nothing to read beyond the pin.
            (Step::Delete { .. }, None) | (Step::Get { .. }, _) => {}
        }
    }
    planned
}

/// What a write `step` (of a key that `exists`) does to the key's binding, as read: keeps it as
/// read (a put of the same lease; a plain write of an unbound key), makes it (a put bound to a
/// lease of a new key), or removes it (a delete). [refused] has refused the rest.
fn binding_of(step: &Step, exists: bool, bindings: &HashMap<String, Option<ReadBinding>>) -> Option<Planned> {
    let path = step.path().to_string();
    let bound = bindings.get(&path).cloned().flatten();
    Some(match (step, bound) {
        (Step::Delete { .. }, None) | (Step::Put { lease: None, .. }, None) => Planned::Unbound { path },
        (Step::Delete { .. }, Some(read)) if exists => Planned::Unbind {
            path,
            version: read.version,
            record: read.record,
        },
        (Step::Put { lease: Some(lease), .. }, None) => Planned::Bind {
            path,
            lease: lease.clone(),
        },
        (Step::Put { .. } | Step::Delete { .. }, Some(read)) => Planned::BoundTo {
            path,
            version: read.version,
        },
        (Step::Get { .. }, _) => return None,
    })
}

fn pinned_path(planned: &Planned) -> &str {
    match planned {
        Planned::Pinned { path, .. } | Planned::PinnedAbsent { path, .. } => path,
        _ => "",
    }
}

/// What a step of the branch that ran answered.
#[derive(Debug, Clone, PartialEq)]
pub enum StepResult {
    /// The key's stat after the put (`None` in the rare case where the server's reply left it
    /// out and the key changed again before it was read), and whether the put created it.
    Put {
        stat: Option<Stat>,
        created: bool,
        lease: Option<String>,
    },
    /// Whether there was a key to delete.
    Delete { deleted: bool },
    /// The key as it was at the commit (after this branch's earlier writes), `None`: absent.
    Get(Option<Entry>),
}

/// What a transaction did.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The index of the first compare that failed (`None`: all held, `then` ran).
    pub failed_compare: Option<usize>,
    /// Each step's result, in the order of the branch that ran.
    pub results: Vec<StepResult>,
    /// A transaction with this idempotency key had applied before: this is its answer.
    pub repeated: bool,
}

/// Why a transaction applied nothing.
#[derive(Debug)]
pub enum TxnError {
    /// A put the rule for bound keys refuses.
    Binding(BindingRefusal),
    /// A lease its puts name ended (or left this instance) first.
    LeaseEnded(String),
    /// Its idempotency key was used by another transaction.
    KeyReused,
    /// What an idempotent transaction answers (its gets' values) passes this many bytes, the
    /// most its key's record holds.
    AnswerTooLarge(usize),
    /// The keys it reads kept changing between its read and its commit, [ATTEMPTS] times.
    Contended,
    /// A delete of this key, which has keys below it.
    NotEmpty(String),
    /// The connection was lost after the commit was sent: it may or may not have applied.
    OutcomeUnknown,
    /// The puts would pass this quota.
    Quota(Exceeded),
    ZooKeeper(Failure),
}

impl From<Failure> for TxnError {
    fn from(err: Failure) -> TxnError {
        TxnError::ZooKeeper(err)
    }
}

impl From<ZkError> for TxnError {
    fn from(err: ZkError) -> TxnError {
        TxnError::ZooKeeper(err.into())
    }
}

/// How many times a transaction reads and commits again when a key it read changed before its
/// commit. Each such failure means another write landed, so contention, not a livelock.
pub const ATTEMPTS: usize = 16;

impl From<ChargeError> for TxnError {
    fn from(err: ChargeError) -> TxnError {
        match err {
            ChargeError::Exceeded(exceeded) => TxnError::Quota(exceeded),
            ChargeError::ZooKeeper(err) => TxnError::ZooKeeper(err),
        }
    }
}

/// The most an idempotency key's record holds: what the transaction answers, its gets' values
/// included (a znode holds at most 1 MiB).
pub const MAX_RECORD_BYTES: usize = 512 * 1024;

/// The parent of the transactions' idempotency keys, `<root>/kv-txn-keys`.
pub fn keys_base(root: &str) -> String {
    format!("{root}/kv-txn-keys")
}

/// The znode of idempotency key `key` (a validated name).
pub fn key_path(root: &str, key: &str) -> String {
    format!("{}/{key}", keys_base(root))
}

/// What an idempotency key's znode holds: which transaction used it, and what it answered, but
/// for the zxid of its commit, which is the znode's own `czxid` (every operation of a multi-op
/// has the same zxid: each put's new `mzxid`).
#[derive(Serialize, Deserialize)]
struct KeyRecord {
    /// A digest of the transaction (a retry must repeat the request).
    request: String,
    failed_compare: Option<usize>,
    results: Vec<RecordedResult>,
}

/// A step's result as its key's record keeps it.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum RecordedResult {
    /// A put: the key's data version after it.
    Put {
        version: i32,
        created: bool,
        lease: Option<String>,
    },
    Delete {
        deleted: bool,
    },
    /// A get: the key's bytes and version, and its `mzxid` unless this transaction wrote it
    /// (`None`: the commit's zxid); `None` if it was absent.
    Get(Option<(Vec<u8>, i32, Option<i64>)>),
}

/// The digest of `txn`, to tell a retry from another transaction that reuses its key.
fn digest(txn: &Txn) -> String {
    use sha2::Digest;
    crate::ids::hex(&sha2::Sha256::digest(format!("{txn:?}").as_bytes()))
}

/// The record of what `branch` will answer once committed, from what was `read` (the versions
/// its puts will have are known before the commit; their `mzxid` is the commit's).
fn record_of(
    txn: &Txn,
    branch: &[Step],
    reads: &HashMap<String, Option<Entry>>,
    failed_compare: Option<usize>,
) -> Result<Vec<u8>, TxnError> {
    let read = |path: &str| reads.get(path).cloned().flatten();
    let mut written: HashMap<&str, Option<(Vec<u8>, i32)>> = HashMap::new();
    let mut results = Vec::with_capacity(branch.len());
    for step in branch {
        results.push(match step {
            Step::Put { path, data, lease } => {
                let version = read(path).map_or(0, |entry| entry.stat.version + 1);
                written.insert(path, Some((data.clone(), version)));
                RecordedResult::Put {
                    version,
                    created: read(path).is_none(),
                    lease: lease.clone(),
                }
            }
            Step::Delete { path } => {
                written.insert(path, None);
                RecordedResult::Delete {
                    deleted: read(path).is_some(),
                }
            }
            Step::Get { path } => RecordedResult::Get(match written.get(path.as_str()) {
                Some(own) => own.clone().map(|(data, version)| (data, version, None)),
                None => read(path).map(|entry| (entry.data, entry.stat.version, Some(entry.stat.mzxid))),
            }),
        });
    }
    let record = KeyRecord {
        request: digest(txn),
        failed_compare,
        results,
    };
    let bytes = serde_json::to_vec(&record).unwrap_or_default();
    if bytes.len() > MAX_RECORD_BYTES {
        return Err(TxnError::AnswerTooLarge(bytes.len()));
    }
    Ok(bytes)
}

/// The answer of the transaction recorded at `key`, if it is there; [TxnError::KeyReused] if
/// another transaction used the key.
async fn answered_before(client: &zookeeper_client::Client, key: &str, txn: &Txn) -> Result<Option<Outcome>, TxnError> {
    let Some((data, stat)) = crate::zk::data(client, key).await? else {
        return Ok(None);
    };
    let record: KeyRecord = serde_json::from_slice(&data).map_err(|_| TxnError::KeyReused)?;
    if record.request != digest(txn) {
        return Err(TxnError::KeyReused);
    }
    let at = |version: i32, mzxid: Option<i64>| Stat {
        mzxid: mzxid.unwrap_or(stat.czxid),
        version,
        ..stat
    };
    let results = (record.results.into_iter())
        .map(|result| match result {
            RecordedResult::Put {
                version,
                created,
                lease,
            } => StepResult::Put {
                stat: Some(at(version, None)),
                created,
                lease,
            },
            RecordedResult::Delete { deleted } => StepResult::Delete { deleted },
            RecordedResult::Get(got) => StepResult::Get(got.map(|(data, version, mzxid)| Entry {
                data,
                stat: at(version, mzxid),
                lease: None,
            })),
        })
        .collect();
    Ok(Some(Outcome {
        failed_compare: record.failed_compare,
        results,
        repeated: true,
    }))
}

/// What the bindings of a transaction's keys need: the bindings this instance drives (and
/// zkgate's root, theirs), the leases its puts name (resolved by the caller, each one it may
/// use), and the quotas a binding's end refunds.
pub struct Bindings<'a> {
    pub keys: &'a BoundKeys,
    pub leases: &'a HashMap<String, Arc<Lease>>,
    pub quotas: &'a Quotas,
}

/// A binding a branch makes: its lease, its handle and the records written for it.
struct NewBinding {
    lease: Arc<Lease>,
    name: String,
    handle: String,
    record_name: String,
    owner: Vec<u8>,
    holding: Vec<u8>,
}

/// Runs `txn`: reads its keys (values of at most `max_value_bytes`) and the bindings of those it
/// writes, evaluates its compares, and commits the branch they pick pinned to what was read;
/// again if a pin fails. Each put's value is charged to `payer` and each delete refunds, in the
/// same multi-op, as a kv write's. With `key` (an idempotency key's znode, [key_path]) at most
/// once for the key, whatever replies are lost.
pub async fn run(
    session: &Session,
    txn: &Txn,
    max_value_bytes: usize,
    payer: Payer<'_>,
    bound: Bindings<'_>,
    key: Option<&str>,
) -> Result<Outcome, TxnError> {
    if let Some(key) = key
        && let Some(before) = answered_before(session.client(), key, txn).await?
    {
        return Ok(before);
    }
    let mut running = Running {
        session,
        txn,
        max_value_bytes,
        payer,
        bound,
        key,
        keys: txn.keys().into_iter().map(String::from).collect(),
        charge_ids: (written_keys(txn).iter())
            .map(|path| usage::path_id("kv", path))
            .collect(),
        missing: HashMap::new(),
        lost_here: false,
    };
    let mut recheck = Recheck::default();
    for _ in 0..ATTEMPTS {
        let read = running.read().await?;
        let failed_compare = txn.first_failed(&read.reads);
        if let Some(refusal) = refused(txn.branch(failed_compare), &read.reads, &read.bindings) {
            recheck.confirm(session, TxnError::Binding(refusal)).await?;
            continue;
        }
        if let Some(outcome) = running.attempt(&read, failed_compare).await? {
            return Ok(outcome);
        }
    }
    Err(TxnError::Contended)
}

/// A transaction being run: what its attempts share.
struct Running<'a> {
    session: &'a Session,
    txn: &'a Txn,
    max_value_bytes: usize,
    payer: Payer<'a>,
    bound: Bindings<'a>,
    key: Option<&'a str>,
    /// Every key it reads ([Txn::keys]).
    keys: Vec<String>,
    /// The charge ids of the keys it writes.
    charge_ids: Vec<String>,
    /// The missing parents of absent keys, once a commit failed for want of one.
    missing: HashMap<String, Vec<String>>,
    /// Whether a commit of this call lost its reply: its key found then is this call's own.
    lost_here: bool,
}

/// What an attempt read: the keys, the bindings of those written, and their charges.
struct Read {
    reads: HashMap<String, Option<Entry>>,
    bindings: HashMap<String, Option<ReadBinding>>,
    charges: HashMap<String, Vec<(usage::Charge, i32)>>,
}

impl Txn {
    /// The branch that runs when the compare `failed_compare` failed (`None`: all held).
    pub fn branch(&self, failed_compare: Option<usize>) -> &[Step] {
        match failed_compare {
            None => &self.then,
            Some(_) => &self.otherwise,
        }
    }
}

impl Running<'_> {
    /// Reads the keys, the bindings of those written and their charges: requests sent
    /// together, one round trip.
    async fn read(&self) -> Result<Read, TxnError> {
        let client = self.session.client();
        let (read, bindings, charges) = tokio::join!(
            crate::zk::get_each_of_size(client, &self.keys, self.max_value_bytes),
            read_bindings(client, self.txn, self.bound.keys.root()),
            self.payer.quotas.charges_of_each(client, &self.charge_ids),
        );
        let entries = read?.into_iter().map(|read| {
            read.map(|(data, stat)| Entry {
                data,
                stat,
                lease: None,
            })
        });
        Ok(Read {
            reads: self.keys.iter().cloned().zip(entries).collect(),
            bindings: bindings?,
            charges: self.charge_ids.iter().cloned().zip(charges?).collect(),
        })
    }

    /// Commits the branch that `read` picks, pinned to it: its outcome, or `None` to go again.
    async fn attempt(&mut self, read: &Read, failed_compare: Option<usize>) -> Result<Option<Outcome>, TxnError> {
        let (client, root) = (self.session.client(), self.bound.keys.root());
        let branch = self.txn.branch(failed_compare);
        let planned = plan(branch, &read.reads, &self.missing, &read.bindings);
        let made = new_bindings(&planned, &self.bound)?;
        // The bindings a delete removes, whose tasks here end after the commit.
        let unbound: Vec<(String, Binding)> = (planned.iter())
            .filter_map(|step| match step {
                Planned::Unbind { path, .. } => {
                    let read = read.bindings.get(path).cloned().flatten()?;
                    Some((key_name(root, path).to_string(), read.binding))
                }
                _ => None,
            })
            .collect();
        let options = CreateMode::Persistent.with_acls(crate::zk::acls());
        let mut multi = Multi::new(client);
        if let Some(key) = self.key {
            // First: a retry whose first attempt applied is refused here, before any pin.
            let record = record_of(self.txn, branch, &read.reads, failed_compare)?;
            multi.create(Planned::Key, key, &record, &options)?;
        }
        let guards = guard_leases(&mut multi, &made)?;
        for planned in planned {
            add(&mut multi, planned, &options, (root, &made))?;
        }
        charge(&mut multi, branch, &self.payer, client, &read.charges).await?;
        let committed = multi.commit().await;
        settle_guards(client, guards, &committed).await?;
        let failed = match committed {
            Ok(done) => {
                take_up(&made, &self.bound);
                for (name, binding) in &unbound {
                    super::kv::settled(self.bound.keys, name, binding).await;
                }
                return Ok(Some(self.answer(read, failed_compare, &done).await?));
            }
            Err(failed) => failed,
        };
        self.after_refused(read, branch, failed).await
    }

    /// The outcome of the branch committed as `done`.
    async fn answer(
        &self,
        read: &Read,
        failed_compare: Option<usize>,
        done: &Done<Planned>,
    ) -> Result<Outcome, TxnError> {
        let branch = self.txn.branch(failed_compare);
        // Servers may leave a created node's stat out of a multi-op's reply: read those.
        let unstated: Vec<String> = (branch.iter())
            .filter(|step| matches!(step, Step::Put { .. }) && put_stat(done, step.path()).is_none())
            .map(|step| step.path().to_string())
            .collect();
        let stats = crate::zk::stat_each(self.session.client(), &unstated).await?;
        let fresh = unstated
            .into_iter()
            .zip(stats)
            .filter_map(|(path, stat)| Some((path, stat?)));
        Ok(Outcome {
            failed_compare,
            results: results(branch, &read.reads, done, &fresh.collect()),
            repeated: false,
        })
    }

    /// After the commit of `branch`, as read, `failed`: the outcome (a key that says it applied
    /// before), `None` to go again, or why it applies nothing.
    async fn after_refused(
        &mut self,
        read: &Read,
        branch: &[Step],
        failed: Failed<Planned>,
    ) -> Result<Option<Outcome>, TxnError> {
        let client = self.session.client();
        match failed {
            // The key is there: this transaction applied before (its reply lost), or another
            // used the key.
            Failed::Refused {
                tag: Planned::Key,
                error: ZkError::NodeExists,
            } => {
                let key = self.key.unwrap_or_default();
                let before = answered_before(client, key, self.txn).await?;
                let repeated = !self.lost_here;
                Ok(before.map(|before| Outcome { repeated, ..before }))
            }
            // Its parent is missing: made, then again.
            Failed::Refused {
                tag: Planned::Key,
                error: ZkError::NoNode,
            } => {
                let base = keys_base(self.bound.keys.root());
                crate::zk::session::ensure_path(client, &base).await?;
                Ok(None)
            }
            // Applied or not: with a key, the next attempt tells.
            failed if failed.is_loss() && self.key.is_some() => {
                self.lost_here = true;
                Ok(None)
            }
            // An absent key's parent is missing (or went): find the missing ones, then again.
            Failed::Refused {
                tag: Planned::PinnedAbsent { .. } | Planned::Parent { .. } | Planned::Create { .. },
                error: ZkError::NoNode,
            } => {
                let absent = self
                    .keys
                    .iter()
                    .filter(|path| matches!(read.reads.get(*path), Some(None)));
                for path in absent {
                    let missing = super::kv::missing_parents(client, path).await?;
                    self.missing.insert(path.clone(), missing);
                }
                Ok(None)
            }
            Failed::Refused {
                tag: Planned::Delete { path, .. },
                error: ZkError::NotEmpty,
            } => Err(TxnError::NotEmpty(path)),
            // A lease's guard (said by [settle_guards]), a key or a binding changed since it
            // was read (its pin, or a write on its version, refused): again.
            Failed::Refused {
                tag: Planned::Guard { .. },
                ..
            }
            | Failed::Refused {
                error: ZkError::BadVersion | ZkError::NodeExists | ZkError::NoNode,
                ..
            } => Ok(None),
            Failed::Refused {
                error: ZkError::QuotaExceeded,
                ..
            } => {
                let bytes = branch.iter().map(Step::bytes).sum();
                Err(TxnError::Quota(self.payer.exceeded(self.session, bytes).await))
            }
            failed if failed.is_loss() => Err(TxnError::OutcomeUnknown),
            failed => Err(TxnError::ZooKeeper(failed.into())),
        }
    }
}

/// The guards of the leases `made` binds keys to, one a lease, added to `multi`.
fn guard_leases(
    multi: &mut Multi<'_, Planned>,
    made: &HashMap<String, NewBinding>,
) -> Result<Vec<(String, Arc<Lease>, Guard)>, ZkError> {
    let mut guards: Vec<(String, Arc<Lease>, Guard)> = Vec::new();
    for new in made.values() {
        let id = &new.lease.id;
        if !guards.iter().any(|(guarded, _, _)| guarded == id) {
            let guard = new.lease.guard(multi, Planned::Guard { lease: id.clone() })?;
            guards.push((id.clone(), new.lease.clone(), guard));
        }
    }
    Ok(guards)
}

/// Tells each lease whose guard was in the multi-op how it went (`committed`): a guard refused
/// because a visited lease changed keeper is fine (again); one whose lease ended ends the
/// transaction.
async fn settle_guards(
    client: &zookeeper_client::Client,
    guards: Vec<(String, Arc<Lease>, Guard)>,
    committed: &Result<Done<Planned>, Failed<Planned>>,
) -> Result<(), TxnError> {
    let refused = match committed {
        Err(Failed::Refused {
            tag: Planned::Guard { lease },
            error,
        }) => Some((lease.clone(), error.clone())),
        _ => None,
    };
    for (id, lease, guard) in guards {
        let error = refused.as_ref().filter(|(refused, _)| *refused == id);
        match lease.guarded(guard, error.map(|(_, error)| error.clone())) {
            Ok(_) => {}
            // A visitor guards with the version it read: the lease may only have changed
            // keeper since.
            Err(GuardError::LeaseMoved) if lease.is_visiting() && lease.refresh(client).await? => {}
            Err(GuardError::LeaseMoved) => return Err(TxnError::LeaseEnded(id)),
            Err(GuardError::ZooKeeper(err)) => return Err(err.into()),
        }
    }
    Ok(())
}

/// The bindings of the keys `txn` writes, as they are now: each owner record (one multi-read),
/// and for a bound key whether its lease's holding record is there.
async fn read_bindings(
    client: &zookeeper_client::Client,
    txn: &Txn,
    root: &str,
) -> Result<HashMap<String, Option<ReadBinding>>, ZkError> {
    let written = written_keys(txn);
    let owners: Vec<String> = written.iter().map(|path| owner_record_path(root, path)).collect();
    let found = crate::zk::get_each_of_size(client, &owners, OWNER_RECORD_BYTES).await?;
    let parsed: Vec<Option<(Binding, i32)>> = (found.into_iter())
        .map(|found| found.and_then(|(data, stat)| Some((serde_json::from_slice(&data).ok()?, stat.version))))
        .collect();
    // Whether each bound key's holding record is there: one multi-read for them all.
    let records: Vec<String> = (written.iter().zip(&parsed))
        .filter_map(|(path, parsed)| Some(parsed.as_ref()?.0.holding_record(root, key_name(root, path))))
        .collect();
    let mut there = crate::zk::stat_each(client, &records).await?.into_iter().zip(records);
    let mut bindings = HashMap::new();
    for (path, parsed) in written.into_iter().zip(parsed) {
        let read = parsed.map(|(binding, version)| {
            let record = there.next().and_then(|(stat, record)| stat.map(|_| record));
            ReadBinding {
                binding,
                version,
                record,
            }
        });
        bindings.insert(path, read);
    }
    Ok(bindings)
}

/// The keys a branch of `txn` writes, each once.
fn written_keys(txn: &Txn) -> Vec<String> {
    let mut seen = HashSet::new();
    (txn.then.iter().chain(&txn.otherwise))
        .filter(|step| step.writes() && seen.insert(step.path()))
        .map(|step| step.path().to_string())
        .collect()
}

/// The most an owner record's data takes (a lease id, a principal, a handle).
const OWNER_RECORD_BYTES: usize = 1024;

/// The key name (`a/b`) of the kv znode at `path`.
fn key_name<'p>(root: &str, path: &'p str) -> &'p str {
    let base = Kind::Kv.base(root);
    path.strip_prefix(base.as_str())
        .and_then(|rest| rest.strip_prefix('/'))
        .unwrap_or(path)
}

/// The bindings `planned` makes, by key path: a new handle for each, its records' content.
fn new_bindings(planned: &[Planned], bound: &Bindings<'_>) -> Result<HashMap<String, NewBinding>, TxnError> {
    let root = bound.keys.root();
    let mut made = HashMap::new();
    for step in planned {
        let Planned::Bind { path, lease } = step else {
            continue;
        };
        let lease = bound
            .leases
            .get(lease)
            .ok_or_else(|| TxnError::LeaseEnded(lease.clone()))?
            .clone();
        let name = key_name(root, path).to_string();
        let handle = crate::ids::owned_id(&lease.here);
        let record_name = record::record_name(Kind::Kv, &name, Some(&handle));
        let holding = HoldingRecord {
            kind: Kind::Kv.name().to_string(),
            name: name.clone(),
            handle: handle.clone(),
            shape: Shape::Node {
                path: path.clone(),
                charge: None,
                owner_record: true,
                hidden: false,
            },
            driver: Some(lease.here.to_string()),
        };
        let owner = Binding {
            lease: lease.id.clone(),
            principal: lease.owner.clone(),
            handle: handle.clone(),
        };
        let new = NewBinding {
            owner: serde_json::to_vec(&owner).unwrap_or_default(),
            holding: holding.to_bytes(),
            lease,
            name,
            handle,
            record_name,
        };
        made.insert(path.clone(), new);
    }
    Ok(made)
}

/// Takes up on this instance the bindings a committed branch made (their tasks find them
/// through their owner records and hold until their lease ends).
fn take_up(made: &HashMap<String, NewBinding>, bound: &Bindings<'_>) {
    for (path, new) in made {
        let shape = Shape::Node {
            path: path.clone(),
            charge: None,
            owner_record: true,
            hidden: false,
        };
        let taken = bound.keys.adopt_binding(
            &new.lease,
            bound.quotas,
            (&new.name, &new.handle),
            &new.record_name,
            &shape,
        );
        if taken.is_err() {
            // Its lease ended meanwhile: its end (or the reaper's) finds the holding record.
            tracing::debug!(key = %new.name, lease = %new.lease.id, "a transaction's binding was not taken up");
        }
    }
}

/// Adds to `multi` what moves each put key's charges to `payer` and refunds each deleted key's
/// (conditional on the versions read: a write racing on the key fails the multi-op, and the
/// transaction goes again). The charges of every key are read at once, and the quota checked
/// once for all the branch's bytes.
async fn charge(
    multi: &mut Multi<'_, Planned>,
    branch: &[Step],
    payer: &Payer<'_>,
    client: &zookeeper_client::Client,
    existing: &HashMap<String, Vec<(usage::Charge, i32)>>,
) -> Result<(), TxnError> {
    let written: Vec<&Step> = branch.iter().filter(|step| step.writes()).collect();
    let ids: Vec<String> = written.iter().map(|step| usage::path_id("kv", step.path())).collect();
    let Some(first) = ids.first() else {
        return Ok(());
    };
    let bytes = written.iter().map(|step| step.bytes()).sum();
    let mine = payer
        .quotas
        .charge_as(client, payer.principal, bytes, first.clone())
        .await?;
    for (step, id) in written.into_iter().zip(ids) {
        let charges = existing.get(&id).map_or(&[][..], Vec::as_slice);
        let tag = Planned::Charge {
            path: step.path().to_string(),
        };
        match step {
            Step::Put { data, .. } => {
                let mine = usage::Charge { id, ..mine.clone() };
                payer.quotas.add_recharge(multi, tag, &mine, data.len(), charges)?;
            }
            Step::Delete { .. } | Step::Get { .. } => payer.quotas.add_refunds(multi, tag, charges)?,
        }
    }
    Ok(())
}

/// Adds `planned` to `multi`, tagged with itself (`root` and `made`: the bindings it makes).
fn add(
    multi: &mut Multi<'_, Planned>,
    planned: Planned,
    options: &zookeeper_client::CreateOptions<'_>,
    (root, made): (&str, &HashMap<String, NewBinding>),
) -> Result<(), ZkError> {
    match &planned {
        Planned::Unbound { path } => {
            let owner = owner_record_path(root, path);
            multi.create(planned.clone(), &owner, &[], options)?;
            multi.delete(planned.clone(), &owner, None)
        }
        Planned::BoundTo { path, version } => multi.check(planned.clone(), &owner_record_path(root, path), *version),
        Planned::Bind { path, .. } => {
            let Some(new) = made.get(path) else {
                return Ok(());
            };
            multi.create(planned.clone(), &owner_record_path(root, path), &new.owner, options)?;
            let record = new.lease.record_path(&new.record_name);
            multi.create(planned.clone(), &record, &new.holding, options)
        }
        Planned::Unbind { path, version, record } => {
            multi.delete(planned.clone(), &owner_record_path(root, path), Some(*version))?;
            match record {
                Some(record) => multi.delete(planned.clone(), record, None),
                None => Ok(()),
            }
        }
        Planned::Guard { .. } | Planned::Key => Ok(()),
        Planned::Pinned { path, version } => multi.check(planned.clone(), path, *version),
        Planned::PinnedAbsent { path, parents } => {
            for made in parents.iter().chain([path]) {
                multi.create(planned.clone(), made, &[], options)?;
            }
            for made in [path].into_iter().chain(parents.iter().rev()) {
                multi.delete(planned.clone(), made, None)?;
            }
            Ok(())
        }
        Planned::Parent { path } => multi.create(planned.clone(), path, &[], options),
        Planned::Create { path, data } => multi.create(planned.clone(), path, data, options),
        Planned::Set { path, data, version } => multi.set(planned.clone(), path, data, Some(*version)),
        Planned::Delete { path, version } => multi.delete(planned.clone(), path, Some(*version)),
        Planned::Charge { .. } => Ok(()),
    }
}

/// The stat the commit `done` answered for the put of `path`.
fn put_stat(done: &Done<Planned>, path: &str) -> Option<Stat> {
    let wrote =
        |tag: &Planned| matches!(tag, Planned::Set { path: p, .. } | Planned::Create { path: p, .. } if p == path);
    done.stat_where(wrote).copied()
}

/// Each step's result, from what was `read`, what the commit `done` answered and the stats of
/// puts it did not answer, read `fresh` after it.
fn results(
    branch: &[Step],
    reads: &HashMap<String, Option<Entry>>,
    done: &Done<Planned>,
    fresh: &HashMap<String, Stat>,
) -> Vec<StepResult> {
    let read = |path: &str| reads.get(path).cloned().flatten();
    let mut written: HashMap<&str, Option<Entry>> = HashMap::new();
    let mut results = Vec::with_capacity(branch.len());
    for step in branch {
        let result = match step {
            Step::Put { path, data, lease } => {
                let stat = put_stat(done, path).or_else(|| fresh.get(path).copied());
                written.insert(
                    path,
                    stat.map(|stat| Entry {
                        data: data.clone(),
                        stat,
                        lease: lease.clone(),
                    }),
                );
                StepResult::Put {
                    stat,
                    created: read(path).is_none(),
                    lease: lease.clone(),
                }
            }
            Step::Delete { path } => {
                written.insert(path, None);
                StepResult::Delete {
                    deleted: read(path).is_some(),
                }
            }
            Step::Get { path } => StepResult::Get(written.get(path.as_str()).cloned().unwrap_or_else(|| read(path))),
        };
        results.push(result);
    }
    results
}

#[cfg(test)]
mod tests {
    use super::*;
    use zookeeper_client::Stat;

    fn entry(data: &str, mzxid: i64, version: i32) -> Entry {
        let stat = crate::recipes::test_stat(mzxid, data.len() as i32, 0);
        Entry {
            data: data.as_bytes().to_vec(),
            stat: Stat { version, ..stat },
            lease: None,
        }
    }

    fn reads(entries: &[(&str, Option<Entry>)]) -> HashMap<String, Option<Entry>> {
        entries
            .iter()
            .map(|(path, read)| (path.to_string(), read.clone()))
            .collect()
    }

    #[test]
    fn compares_hold_as_etcd_s_do() {
        let there = entry("blue", 42, 3);
        assert!(Compare::Exists.holds(Some(&there)));
        assert!(!Compare::Exists.holds(None));
        assert!(Compare::Absent.holds(None));
        assert!(!Compare::Absent.holds(Some(&there)));
        assert!(Compare::Value(b"blue".to_vec()).holds(Some(&there)));
        assert!(!Compare::Value(b"green".to_vec()).holds(Some(&there)));
        // A value compare of an absent key fails, even against empty bytes.
        assert!(!Compare::Value(Vec::new()).holds(None));
        assert!(Compare::Etag(42).holds(Some(&there)));
        assert!(!Compare::Etag(41).holds(Some(&there)));
        let range = |at_least, at_most| Compare::Version { at_least, at_most };
        assert!(range(Some(3), Some(3)).holds(Some(&there)));
        assert!(range(Some(1), None).holds(Some(&there)));
        assert!(!range(Some(4), None).holds(Some(&there)));
        assert!(!range(None, Some(2)).holds(Some(&there)));
        assert!(!range(None, None).holds(None));
    }

    #[test]
    fn the_first_failed_compare_picks_the_branch() {
        let txn = Txn {
            compare: vec![
                Check {
                    path: "/k/a".into(),
                    compare: Compare::Exists,
                },
                Check {
                    path: "/k/b".into(),
                    compare: Compare::Absent,
                },
            ],
            ..Txn::default()
        };
        let both = reads(&[("/k/a", Some(entry("1", 5, 0))), ("/k/b", None)]);
        assert_eq!(txn.first_failed(&both), None);
        let b_there = reads(&[("/k/a", Some(entry("1", 5, 0))), ("/k/b", Some(entry("2", 6, 0)))]);
        assert_eq!(txn.first_failed(&b_there), Some(1));
        let neither = reads(&[("/k/a", None), ("/k/b", Some(entry("2", 6, 0)))]);
        assert_eq!(txn.first_failed(&neither), Some(0));
    }

    #[test]
    fn keys_are_read_once_and_a_key_written_twice_is_named() {
        let txn = Txn {
            compare: vec![Check {
                path: "/k/a".into(),
                compare: Compare::Exists,
            }],
            then: vec![
                Step::Get { path: "/k/a".into() },
                Step::Put {
                    path: "/k/b".into(),
                    data: b"x".to_vec(),
                    lease: None,
                },
                Step::Delete { path: "/k/b".into() },
            ],
            otherwise: vec![Step::Get { path: "/k/c".into() }],
        };
        assert_eq!(txn.keys(), ["/k/a", "/k/b", "/k/c"]);
        assert_eq!(txn.written_twice(), Some("/k/b"));
        let once = Txn {
            then: vec![Step::Get { path: "/k/a".into() }, Step::Delete { path: "/k/a".into() }],
            ..txn
        };
        assert_eq!(once.written_twice(), None);
    }

    fn bound_to(lease: &str, version: i32) -> Option<ReadBinding> {
        Some(ReadBinding {
            binding: Binding {
                lease: lease.into(),
                principal: None,
                handle: "h".into(),
            },
            version,
            record: Some(format!("/zkgate/leases/{lease}/kv-1")),
        })
    }

    #[test]
    fn a_branch_pins_every_key_read_and_every_binding_then_writes() {
        let read = reads(&[
            ("/k/a", Some(entry("1", 5, 2))),
            ("/k/b", None),
            ("/k/d", Some(entry("4", 8, 0))),
        ]);
        let missing = HashMap::from([("/k/b".to_string(), vec!["/k".to_string()])]);
        let bindings = HashMap::from([
            ("/k/a".to_string(), None),
            ("/k/b".to_string(), None),
            ("/k/d".to_string(), bound_to("L", 3)),
        ]);
        let branch = [
            Step::Put {
                path: "/k/a".into(),
                data: b"2".to_vec(),
                lease: None,
            },
            Step::Put {
                path: "/k/b".into(),
                data: b"new".to_vec(),
                lease: Some("L".into()),
            },
            Step::Delete { path: "/k/d".into() },
            Step::Get { path: "/k/a".into() },
        ];
        assert_eq!(refused(&branch, &read, &bindings), None);
        assert_eq!(
            plan(&branch, &read, &missing, &bindings),
            vec![
                Planned::Pinned {
                    path: "/k/a".into(),
                    version: 2
                },
                Planned::PinnedAbsent {
                    path: "/k/b".into(),
                    parents: vec!["/k".into()]
                },
                Planned::Pinned {
                    path: "/k/d".into(),
                    version: 0
                },
                // A plain put: the key must still be bound to no lease.
                Planned::Unbound { path: "/k/a".into() },
                Planned::Set {
                    path: "/k/a".into(),
                    data: b"2".to_vec(),
                    version: 2
                },
                Planned::Bind {
                    path: "/k/b".into(),
                    lease: "L".into()
                },
                Planned::Parent { path: "/k".into() },
                Planned::Create {
                    path: "/k/b".into(),
                    data: b"new".to_vec()
                },
                // A delete of a bound key deletes its binding.
                Planned::Unbind {
                    path: "/k/d".into(),
                    version: 3,
                    record: Some("/zkgate/leases/L/kv-1".into())
                },
                Planned::Delete {
                    path: "/k/d".into(),
                    version: 0
                },
            ]
        );
    }

    #[test]
    fn the_rule_for_bound_keys_refuses_a_put_that_would_change_a_binding() {
        let read = reads(&[
            ("/k/bound", Some(entry("x", 5, 0))),
            ("/k/plain", Some(entry("y", 6, 0))),
        ]);
        let bindings = HashMap::from([
            ("/k/bound".to_string(), bound_to("L", 0)),
            ("/k/plain".to_string(), None),
        ]);
        let put = |path: &str, lease: Option<&str>| Step::Put {
            path: path.into(),
            data: b"z".to_vec(),
            lease: lease.map(String::from),
        };
        let bound = |path: &str| {
            Some(BindingRefusal::Bound {
                path: path.into(),
                lease: "L".into(),
            })
        };
        assert_eq!(refused(&[put("/k/bound", None)], &read, &bindings), bound("/k/bound"));
        assert_eq!(
            refused(&[put("/k/bound", Some("M"))], &read, &bindings),
            bound("/k/bound")
        );
        assert_eq!(refused(&[put("/k/bound", Some("L"))], &read, &bindings), None);
        assert_eq!(
            refused(&[put("/k/plain", Some("L"))], &read, &bindings),
            Some(BindingRefusal::NotBound {
                path: "/k/plain".into()
            })
        );
        assert_eq!(refused(&[put("/k/plain", None)], &read, &bindings), None);
        // A delete of a bound key is no refusal: it deletes the binding too.
        assert_eq!(
            refused(
                &[Step::Delete {
                    path: "/k/bound".into()
                }],
                &read,
                &bindings
            ),
            None
        );
    }

    #[test]
    fn deleting_an_absent_key_writes_nothing_but_its_pin() {
        let read = reads(&[("/k/gone", None)]);
        let bindings = HashMap::from([("/k/gone".to_string(), None)]);
        let planned = plan(
            &[Step::Delete { path: "/k/gone".into() }],
            &read,
            &HashMap::new(),
            &bindings,
        );
        assert_eq!(
            planned,
            vec![
                Planned::PinnedAbsent {
                    path: "/k/gone".into(),
                    parents: vec![]
                },
                Planned::Unbound { path: "/k/gone".into() }
            ]
        );
    }
}
