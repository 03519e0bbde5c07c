//! A transaction's idempotency key: its znode, created first in the commit's multi-op, holds the
//! answer (but for the commit's zxid, which is the znode's own `czxid`), so that a retry through
//! a lost reply applies once and answers as the first (docs/PRIMITIVES.md, part 2).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use zookeeper_client::Stat;

use super::{Entry, Outcome, Step, StepResult, Txn, TxnError};

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
pub(super) fn record_of(
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
pub(super) async fn answered_before(
    client: &zookeeper_client::Client,
    key: &str,
    txn: &Txn,
) -> Result<Option<Outcome>, TxnError> {
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
