//! What a transaction's idempotency key's record ([crate::recipes::idempotency]) holds: the
//! answer but for the commit's zxid, which is the record's own `czxid` (every operation of a
//! multi-op has the same zxid: each put's new `mzxid`), so that a retry through a lost reply
//! applies once and answers as the first (docs/PRIMITIVES.md, part 2).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use zookeeper_client::Stat;

use super::{Entry, Outcome, Step, StepResult};
use crate::recipes::idempotency::Replay;

/// What a transaction answered, as its key's record keeps it.
#[derive(Serialize, Deserialize)]
pub(super) struct Answered {
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

/// What `branch` will answer once committed, from what was `read` (the versions its puts will
/// have are known before the commit; their `mzxid` is the commit's).
pub(super) fn answer_of(
    branch: &[Step],
    reads: &HashMap<String, Option<Entry>>,
    failed_compare: Option<usize>,
) -> Answered {
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
    Answered {
        failed_compare,
        results,
    }
}

/// The outcome a record `replay`s.
pub(super) fn replayed(replay: Replay<Answered>) -> Outcome {
    let stat = replay.stat;
    let at = |version: i32, mzxid: Option<i64>| Stat {
        mzxid: mzxid.unwrap_or(stat.czxid),
        version,
        ..stat
    };
    let results = (replay.answer.results.into_iter())
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
    Outcome {
        failed_compare: replay.answer.failed_compare,
        results,
        repeated: true,
    }
}
