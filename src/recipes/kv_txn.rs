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

use std::collections::{HashMap, HashSet};

use zookeeper_client::{CreateMode, Error as ZkError, Stat};

use super::kv::Entry;
use super::usage::{self, ChargeError, Exceeded, Payer};
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
    Put {
        path: String,
        data: Vec<u8>,
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
}

/// The multi-op of `branch`, given what was `read` of every key ([Txn::keys]) and the `missing`
/// parents of keys that were absent (highest first; found after a commit failed for want of
/// one). Every key read is pinned first, so that the compares and the gets stand at the commit;
/// a pin of an absent key removes the parents it made, and a put makes them again.
pub fn plan(
    branch: &[Step],
    reads: &HashMap<String, Option<Entry>>,
    missing: &HashMap<String, Vec<String>>,
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
        match (step, read) {
            (Step::Put { path, data }, Some(entry)) => planned.push(Planned::Set {
                path: path.clone(),
                data: data.clone(),
                version: entry.stat.version,
            }),
            (Step::Put { path, data }, None) => {
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
    Put { stat: Option<Stat>, created: bool },
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
}

/// Why a transaction applied nothing.
#[derive(Debug)]
pub enum TxnError {
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

/// Runs `txn`: reads its keys (values of at most `max_value_bytes`), evaluates its compares,
/// and commits the branch they pick pinned to what was read; again if a pin fails. Each put's
/// value is charged to `payer` and each delete refunds, in the same multi-op, as a kv write's.
pub async fn run(session: &Session, txn: &Txn, max_value_bytes: usize, payer: Payer<'_>) -> Result<Outcome, TxnError> {
    let client = session.client();
    let keys: Vec<String> = txn.keys().into_iter().map(String::from).collect();
    let options = CreateMode::Persistent.with_acls(crate::zk::acls());
    let mut missing: HashMap<String, Vec<String>> = HashMap::new();
    for _ in 0..ATTEMPTS {
        let read = crate::zk::get_each_of_size(client, &keys, max_value_bytes).await?;
        let entries = read
            .into_iter()
            .map(|read| read.map(|(data, stat)| Entry { data, stat }));
        let reads: HashMap<String, Option<Entry>> = keys.iter().cloned().zip(entries).collect();
        let failed_compare = txn.first_failed(&reads);
        let branch = if failed_compare.is_none() {
            &txn.then
        } else {
            &txn.otherwise
        };
        let mut multi = Multi::new(client);
        for planned in plan(branch, &reads, &missing) {
            add(&mut multi, planned, &options)?;
        }
        charge(&mut multi, branch, &payer, client).await?;
        match multi.commit().await {
            Ok(done) => {
                // Servers may leave a created node's stat out of a multi-op's reply: read those.
                let unstated: Vec<String> = (branch.iter())
                    .filter(|step| matches!(step, Step::Put { .. }) && put_stat(&done, step.path()).is_none())
                    .map(|step| step.path().to_string())
                    .collect();
                let stats = crate::zk::stat_each(client, &unstated).await?;
                let fresh = unstated
                    .into_iter()
                    .zip(stats)
                    .filter_map(|(path, stat)| Some((path, stat?)));
                let results = results(branch, &reads, &done, &fresh.collect());
                return Ok(Outcome {
                    failed_compare,
                    results,
                });
            }
            // An absent key's parent is missing (or went): find the missing ones, then again.
            Err(Failed::Refused {
                tag: Planned::PinnedAbsent { .. } | Planned::Parent { .. } | Planned::Create { .. },
                error: ZkError::NoNode,
            }) => {
                for path in keys.iter().filter(|path| matches!(reads.get(*path), Some(None))) {
                    missing.insert(path.clone(), super::kv::missing_parents(client, path).await?);
                }
            }
            Err(Failed::Refused {
                tag: Planned::Delete { path, .. },
                error: ZkError::NotEmpty,
            }) => return Err(TxnError::NotEmpty(path)),
            // A key changed since it was read (its pin, or a write on its version, refused).
            Err(Failed::Refused {
                error: ZkError::BadVersion | ZkError::NodeExists | ZkError::NoNode,
                ..
            }) => {}
            Err(Failed::Refused {
                error: ZkError::QuotaExceeded,
                ..
            }) => {
                let bytes = branch.iter().map(Step::bytes).sum();
                return Err(TxnError::Quota(payer.exceeded(session, bytes).await));
            }
            Err(failed) if failed.is_loss() => return Err(TxnError::OutcomeUnknown),
            Err(failed) => return Err(TxnError::ZooKeeper(failed.into())),
        }
    }
    Err(TxnError::Contended)
}

/// Adds to `multi` what moves each put key's charges to `payer` and refunds each deleted key's
/// (conditional on the versions read: a write racing on the key fails the multi-op, and the
/// transaction goes again).
async fn charge(
    multi: &mut Multi<'_, Planned>,
    branch: &[Step],
    payer: &Payer<'_>,
    client: &zookeeper_client::Client,
) -> Result<(), TxnError> {
    for step in branch {
        let tag = Planned::Charge {
            path: step.path().to_string(),
        };
        let id = usage::path_id("kv", step.path());
        match step {
            Step::Put { data, .. } => {
                let mine = payer.quotas.charge_as(client, payer.principal, data.len(), id).await?;
                let charges = payer.quotas.charges_of(client, &mine.id).await?;
                payer.quotas.add_recharge(multi, tag, &mine, data.len(), &charges)?;
            }
            Step::Delete { .. } => {
                let charges = payer.quotas.charges_of(client, &id).await?;
                payer.quotas.add_refunds(multi, tag, &charges)?;
            }
            Step::Get { .. } => {}
        }
    }
    Ok(())
}

/// Adds `planned` to `multi`, tagged with itself.
fn add(
    multi: &mut Multi<'_, Planned>,
    planned: Planned,
    options: &zookeeper_client::CreateOptions<'_>,
) -> Result<(), ZkError> {
    match &planned {
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
            Step::Put { path, data } => {
                let stat = put_stat(done, path).or_else(|| fresh.get(path).copied());
                written.insert(
                    path,
                    stat.map(|stat| Entry {
                        data: data.clone(),
                        stat,
                    }),
                );
                StepResult::Put {
                    stat,
                    created: read(path).is_none(),
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

    #[test]
    fn a_branch_pins_every_key_read_then_writes() {
        let read = reads(&[
            ("/k/a", Some(entry("1", 5, 2))),
            ("/k/b", None),
            ("/k/d", Some(entry("4", 8, 0))),
        ]);
        let missing = HashMap::from([("/k/b".to_string(), vec!["/k".to_string()])]);
        let branch = [
            Step::Put {
                path: "/k/a".into(),
                data: b"2".to_vec(),
            },
            Step::Put {
                path: "/k/b".into(),
                data: b"new".to_vec(),
            },
            Step::Delete { path: "/k/d".into() },
            Step::Get { path: "/k/a".into() },
        ];
        assert_eq!(
            plan(&branch, &read, &missing),
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
                Planned::Set {
                    path: "/k/a".into(),
                    data: b"2".to_vec(),
                    version: 2
                },
                Planned::Parent { path: "/k".into() },
                Planned::Create {
                    path: "/k/b".into(),
                    data: b"new".to_vec()
                },
                Planned::Delete {
                    path: "/k/d".into(),
                    version: 0
                },
            ]
        );
    }

    #[test]
    fn deleting_an_absent_key_writes_nothing_but_its_pin() {
        let read = reads(&[("/k/gone", None)]);
        let planned = plan(&[Step::Delete { path: "/k/gone".into() }], &read, &HashMap::new());
        assert_eq!(
            planned,
            vec![Planned::PinnedAbsent {
                path: "/k/gone".into(),
                parents: vec![]
            }]
        );
    }
}
