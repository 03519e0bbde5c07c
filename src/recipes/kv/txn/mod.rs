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
//! Keys bound to a lease ([crate::recipes::kv::bound]) keep their rule inside a transaction: the owner
//! record of every key a branch writes is read with the keys, a plain put over a bound key (or
//! a put bound to a lease over a plain key, or another lease's) refuses the whole transaction,
//! and the multi-op pins each of those owner records as read (the create and delete of an
//! absent one's path, a `check` of a present one's version), so a binding made or changed
//! between the read and the commit sends the transaction round again. A put bound to a lease
//! writes the binding's owner record and holding record in the multi-op, guarded by the lease,
//! and this instance takes the binding up after the commit; a delete of a bound key deletes its
//! binding with it.

use std::collections::{HashMap, HashSet};

use zookeeper_client::{Error as ZkError, Stat};

use crate::recipes::idempotency::KeyError;
use crate::recipes::kv::Entry;
use crate::recipes::kv::bound::Binding;
use crate::recipes::usage::{ChargeError, Exceeded};
use crate::zk::{Done, Failure};

mod commit;
mod key;
mod operation;
mod request;

pub use commit::{Bindings, key_name, run};
pub use operation::commit;
pub use request::{
    CompareBody, FailedCompare, HeldBody, LeadsBody, MAX_OPERATIONS, StepAnswer, StepBody, TxnAnswer, TxnRequest,
    VersionRange, apply,
};

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

/// One compare of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// A compare of the key at `path`.
    Key { path: String, compare: Compare },
    /// The guard's handle holds what it names (a lock, a read/write lock) or leads (an
    /// election): resolved by [commit] before each attempt ([crate::recipes::guards::Standing])
    /// and pinned in the multi-op, so that it held (or did not) at the commit, as a key's
    /// compare does.
    Holds(crate::recipes::guards::Guard),
}

/// One operation of a branch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Writes the key; with `lease` (an id the caller may use), binds it to that lease, by the
    /// rule of single writes ([crate::recipes::kv::Binds]) but without `rebind`.
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
        let compared = self.compare.iter().filter_map(|check| match check {
            Check::Key { path, .. } => Some(path.as_str()),
            Check::Holds(_) => None,
        });
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

    /// The index of the first compare that fails on `reads` and `held` (whether the guard of
    /// the compare at an index holds) (`None`: all hold, `then` runs).
    pub fn first_failed(&self, reads: &HashMap<String, Option<Entry>>, held: impl Fn(usize) -> bool) -> Option<usize> {
        self.compare.iter().enumerate().position(|(index, check)| match check {
            Check::Key { path, compare } => !compare.holds(reads.get(path).and_then(Option::as_ref)),
            Check::Holds(_) => !held(index),
        })
    }

    /// The compares of guards, by index.
    pub fn held(&self) -> impl Iterator<Item = (usize, &crate::recipes::guards::Guard)> {
        self.compare
            .iter()
            .enumerate()
            .filter_map(|(index, check)| match check {
                Check::Holds(guard) => Some((index, guard)),
                Check::Key { .. } => None,
            })
    }
}

/// One operation of the multi-op a branch becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Planned {
    /// A check of the writer's guards (`ZKGATE-Guard`): what it names must still hold.
    Holds,
    /// The pin of the compare at `index` of a guard (`held`, `leads`): it must still stand as
    /// resolved.
    Held {
        index: usize,
    },
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
    /// The idempotency key's record, created first (added by [run]).
    Key,
    /// A key's writer record, written by a guarded put or deleted with its key (added by [run]).
    Writer,
}

/// The binding of a key a branch writes, as read: its owner record's content and version, and
/// whether its lease's holding record was there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadBinding {
    pub binding: Binding,
    pub version: i32,
    pub record: Option<String>,
}

/// Why a transaction was refused by the rule for bound keys ([crate::recipes::kv::Binds]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindingRefusal {
    /// A put bound to no lease, or to another one, of the key at `path`, bound to `lease`.
    Bound { path: String, lease: String },
    /// A put bound to a lease of the key at `path`, which exists bound to none.
    NotBound { path: String },
    /// A delete of the key at `path`, bound to `lease` of principal `principal`, which the
    /// writer does not own.
    NotYours {
        path: String,
        lease: String,
        principal: String,
    },
}

/// The first step of `branch` that the rule for bound keys refuses, given what was read: a put
/// over a key bound otherwise, or a delete of a key bound to a lease of a principal whose
/// leases' holdings the writer may not touch (`owns` says whose it may: its own, or all for an
/// admin).
pub fn refused(
    branch: &[Step],
    reads: &HashMap<String, Option<Entry>>,
    bindings: &HashMap<String, Option<ReadBinding>>,
    owns: &dyn Fn(&str) -> bool,
) -> Option<BindingRefusal> {
    branch.iter().find_map(|step| {
        let (path, lease) = match step {
            Step::Put { path, lease, .. } => (path, lease),
            Step::Delete { path } => {
                let read = bindings.get(path).cloned().flatten()?;
                let principal = read.binding.principal.filter(|p| !owns(p))?;
                return Some(BindingRefusal::NotYours {
                    path: path.clone(),
                    lease: read.binding.lease,
                    principal,
                });
            }
            Step::Get { .. } => return None,
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
    /// Its idempotency key's record: the key was used by another request, what the
    /// transaction answers (its gets' values) is more than a record holds, or the record
    /// passes a quota.
    Key(KeyError),
    /// The keys it reads kept changing between its read and its commit, [ATTEMPTS] times.
    Contended,
    /// A compare of a guard no longer stands as resolved: resolve it again.
    HeldChanged,
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

impl From<KeyError> for TxnError {
    fn from(err: KeyError) -> TxnError {
        match err {
            KeyError::ZooKeeper(err) => TxnError::ZooKeeper(err),
            err => TxnError::Key(err),
        }
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

impl Txn {
    /// The branch that runs when the compare `failed_compare` failed (`None`: all held).
    pub fn branch(&self, failed_compare: Option<usize>) -> &[Step] {
        match failed_compare {
            None => &self.then,
            Some(_) => &self.otherwise,
        }
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
mod tests;
