//! A transaction as `POST /v1/kv-txn` takes and answers it: the request's compares and
//! branches checked (each key valid and granted, each test one of its kind) into a [Txn], and
//! what it did, step by step.

use base64::Engine;
use serde::{Deserialize, Serialize};

use super::{Check, Compare, Step, StepResult, Txn, commit, key_name};
use crate::auth::{Access, Caller};
use crate::kind::Kind;
use crate::problem::{ApiError, Place};
use crate::recipes::Recipes;
use crate::recipes::guards::{Guard, MAX_GUARDS};
use crate::recipes::idempotency::Key;
use crate::recipes::kv::Entry;

/// Most compares, and most operations in each branch, of one transaction.
pub const MAX_OPERATIONS: usize = 64;

/// A transaction's request.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TxnRequest {
    /// Checks of keys and of holds; all must hold for `then` to run, else `else` runs.
    #[serde(default)]
    pub compare: Vec<CompareBody>,
    #[serde(default)]
    pub then: Vec<StepBody>,
    #[serde(default, rename = "else")]
    pub otherwise: Vec<StepBody>,
}

/// One compare: `key` and exactly one of the tests of a key (`exists`, `absent`, `value`,
/// `text`, `base64`, `etag`, `version`); or, without `key`, `held` or `leads`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompareBody {
    #[schema(example = "app/config")]
    pub key: Option<String>,
    /// The handle holds the lock (or the read/write lock) at the commit: the transaction's
    /// branch chosen by it, as `ZKGATE-Guard` guards a write, but without refusing.
    pub held: Option<HeldBody>,
    /// The campaign's handle leads the election at the commit.
    pub leads: Option<LeadsBody>,
    /// `true`: the key exists.
    pub exists: Option<bool>,
    /// `true`: the key does not exist.
    pub absent: Option<bool>,
    /// The key holds this JSON value (as a put of it stores it).
    pub value: Option<serde_json::Value>,
    /// The key holds this text.
    pub text: Option<String>,
    /// The key holds these bytes (base64).
    pub base64: Option<String>,
    /// The key is at this ETag (as `If-Match` takes it).
    #[schema(example = "\"4294967311\"")]
    pub etag: Option<String>,
    /// The key's data version is in this range.
    pub version: Option<VersionRange>,
}

/// A hold compared: `handle` at exactly one of `lock`, `rwlock`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HeldBody {
    #[schema(example = "orders")]
    pub lock: Option<String>,
    /// A read/write lock: the handle's read or write hold.
    pub rwlock: Option<String>,
    /// The handle the acquire answered.
    #[schema(example = "0b9d4c3e-2f1a4b5c8d7e6f5a4b3c2d1e0f1a2b3c")]
    pub handle: String,
}

/// A leadership compared: the campaign `handle` at `election`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LeadsBody {
    #[schema(example = "scheduler")]
    pub election: String,
    /// The handle the campaign answered.
    #[schema(example = "0b9d4c3e-2f1a4b5c8d7e6f5a4b3c2d1e0f1a2b3c")]
    pub handle: String,
}

/// A range of a key's data version (each write adds one; a new key is at 0): at least one of
/// its bounds (both inclusive), the lower not above the upper.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VersionRange {
    pub at_least: Option<i32>,
    pub at_most: Option<i32>,
}

/// One operation: exactly one of `put`, `delete`, `get` (each names a key); a put has exactly
/// one of `value`, `text`, `base64`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StepBody {
    #[schema(example = "app/config")]
    pub put: Option<String>,
    pub delete: Option<String>,
    pub get: Option<String>,
    /// The value a put stores, as JSON.
    pub value: Option<serde_json::Value>,
    pub text: Option<String>,
    pub base64: Option<String>,
    /// A put's lease (yours): the key is bound to it, as `PUT /v1/kv/{key}?lease=` binds it,
    /// without `rebind` (a put over a key bound to another lease, or over a plain key, refuses
    /// the transaction).
    pub lease: Option<String>,
}

/// What a transaction did.
#[derive(Serialize, utoipa::ToSchema)]
pub struct TxnAnswer {
    /// Whether every compare held (`then` ran); `false`: `else` ran.
    pub succeeded: bool,
    /// The first compare that failed, when one did.
    pub failed_compare: Option<FailedCompare>,
    /// Each operation's result, in the order of the branch that ran.
    pub results: Vec<StepAnswer>,
    /// A transaction with this `Idempotency-Key` had applied before: this is its answer (its
    /// gets as they read then).
    pub repeated: bool,
}

/// The compare that failed: its index, and its key or (for `held`, `leads`) its guard.
#[derive(Serialize, utoipa::ToSchema)]
pub struct FailedCompare {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// `lock/orders`, `election/scheduler`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guard: Option<String>,
}

/// One operation's result: its kind names its key.
#[derive(Serialize, utoipa::ToSchema)]
pub struct StepAnswer {
    pub put: Option<String>,
    pub delete: Option<String>,
    pub get: Option<String>,
    /// A put's new ETag, or a get's (absent: the key does not exist).
    pub etag: Option<String>,
    /// A put: whether it created the key. A delete: whether there was a key.
    pub created: Option<bool>,
    /// A put's lease, when it is bound to one.
    pub lease: Option<String>,
    pub deleted: Option<bool>,
    /// A get's value, when JSON; else `text` when UTF-8; else `base64`.
    pub value: Option<serde_json::Value>,
    pub text: Option<String>,
    pub base64: Option<String>,
}

/// `POST /v1/kv-txn`: the transaction `body` asks for, checked and granted key by key, then
/// committed ([commit]) and answered as it ran.
pub async fn apply(
    recipes: &Recipes,
    (caller, guards): (&Caller, &[Guard]),
    body: TxnRequest,
    key: Option<&Key>,
) -> Result<TxnAnswer, ApiError> {
    let txn = parse(recipes, caller, body)?;
    let outcome = commit(recipes, (caller, guards), &txn, key).await?;
    let branch = txn.branch(outcome.failed_compare);
    let key = |path: &str| key_of(recipes, path);
    Ok(TxnAnswer {
        succeeded: outcome.failed_compare.is_none(),
        repeated: outcome.repeated,
        failed_compare: outcome.failed_compare.map(|index| match &txn.compare[index] {
            Check::Key { path, .. } => FailedCompare {
                index,
                key: Some(key(path)),
                guard: None,
            },
            Check::Holds(guard) => FailedCompare {
                index,
                key: None,
                guard: Some(guard.target()),
            },
        }),
        results: branch
            .iter()
            .zip(outcome.results)
            .map(|(step, result)| answer(key(step.path()), result))
            .collect(),
    })
}

/// The transaction `body` asks for, every key checked and granted.
fn parse(recipes: &Recipes, caller: &Caller, body: TxnRequest) -> Result<Txn, ApiError> {
    for (field, count) in [
        ("compare", body.compare.len()),
        ("then", body.then.len()),
        ("else", body.otherwise.len()),
    ] {
        if count > MAX_OPERATIONS {
            let detail = format!("at most {MAX_OPERATIONS} entries ({count} given)");
            return Err(ApiError::invalid(Place::Body, field, detail));
        }
    }
    let path = |key: &str, field: &str, access: Access| -> Result<String, ApiError> {
        crate::recipes::kv::key_problem(key)
            .map_err(|e| ApiError::invalid(Place::Body, field, format!("key `{key}`: {e}")))?;
        caller.require(Kind::Kv.auth(), key, access)?;
        Ok(Kind::Kv.path(&recipes.root, key))
    };
    let mut compare = Vec::with_capacity(body.compare.len());
    for check in body.compare {
        compare.push(check_of(check, &path)?);
    }
    // Each compare of a hold is resolved (from ZooKeeper, for a handle driven elsewhere) before
    // every attempt: as many as a write may carry guards.
    let holds = compare.iter().filter(|check| matches!(check, Check::Holds(_))).count();
    if holds > MAX_GUARDS {
        let detail = format!("at most {MAX_GUARDS} compares of `held` or `leads` ({holds} given)");
        return Err(ApiError::invalid(Place::Body, "compare", detail));
    }
    let mut branches = [Vec::new(), Vec::new()];
    for (steps, field, branch) in [(body.then, "then", 0), (body.otherwise, "else", 1)] {
        for step in steps {
            branches[branch].push(step_of(recipes, step, field, &path)?);
        }
    }
    let [then, otherwise] = branches;
    let txn = Txn {
        compare,
        then,
        otherwise,
    };
    if let Some(twice) = txn.written_twice() {
        let detail = format!("`{}` is written twice in one branch", key_of(recipes, twice));
        return Err(ApiError::invalid(Place::Body, "then", detail));
    }
    Ok(txn)
}

/// The compare `check` asks for: of a key (checked by `path`), or of a guard.
fn check_of(
    check: CompareBody,
    path: &impl Fn(&str, &str, Access) -> Result<String, ApiError>,
) -> Result<Check, ApiError> {
    let invalid = |detail: String| ApiError::invalid(Place::Body, "compare", detail);
    let guard = |kind: Kind, name: &str, handle: &str| Guard::new(kind, name, handle).map_err(invalid);
    match (&check.key, check.held.as_ref(), check.leads.as_ref()) {
        (Some(key), None, None) => Ok(Check::Key {
            path: path(key, "compare", Access::Read)?,
            compare: compare_of(key, &check)?,
        }),
        (None, Some(held), None) => match (&held.lock, &held.rwlock) {
            (Some(name), None) => Ok(Check::Holds(guard(Kind::Lock, name, &held.handle)?)),
            (None, Some(name)) => Ok(Check::Holds(guard(Kind::RwLock, name, &held.handle)?)),
            _ => Err(invalid("`held` names exactly one of `lock`, `rwlock`".into())),
        },
        (None, None, Some(leads)) => Ok(Check::Holds(guard(Kind::Election, &leads.election, &leads.handle)?)),
        _ => Err(invalid(
            "each compare has exactly one of `key` (with one test of it), `held`, `leads`".into(),
        )),
    }
}

/// The compare `check` asks of `key`: exactly one test.
fn compare_of(key: &str, check: &CompareBody) -> Result<Compare, ApiError> {
    let invalid = |detail: &str| ApiError::invalid(Place::Body, "compare", format!("`{key}`: {detail}"));
    let mut tests = Vec::new();
    if check.exists == Some(true) {
        tests.push(Compare::Exists);
    }
    if check.absent == Some(true) {
        tests.push(Compare::Absent);
    }
    if let Some(bytes) =
        value_bytes(check.value.as_ref(), check.text.as_deref(), check.base64.as_deref()).map_err(|e| invalid(&e))?
    {
        tests.push(Compare::Value(bytes));
    }
    if let Some(etag) = &check.etag {
        let mzxid = etag
            .trim_matches('"')
            .parse()
            .map_err(|_| invalid("`etag` is not an ETag zkgate issued"))?;
        tests.push(Compare::Etag(mzxid));
    }
    if let Some(range) = &check.version {
        match (range.at_least, range.at_most) {
            // A range without bounds would hold for every key (present or not): a mistake.
            (None, None) => return Err(invalid("`version` needs `at_least`, `at_most` or both")),
            (Some(low), Some(high)) if low > high => {
                let detail = format!("`version`: `at_least` ({low}) is above `at_most` ({high})");
                return Err(invalid(&detail));
            }
            _ => {}
        }
        tests.push(Compare::Version {
            at_least: range.at_least,
            at_most: range.at_most,
        });
    }
    match <[Compare; 1]>::try_from(tests) {
        Ok([test]) => Ok(test),
        Err(_) => Err(invalid(
            "give exactly one of `exists`, `absent`, `value`, `text`, `base64`, `etag`, `version`",
        )),
    }
}

/// The bytes a `value` (stored as its JSON text), `text` or `base64` stands for: `None` if none
/// is given, an error if more than one is.
fn value_bytes(
    value: Option<&serde_json::Value>,
    text: Option<&str>,
    base64: Option<&str>,
) -> Result<Option<Vec<u8>>, String> {
    match (value, text, base64) {
        (None, None, None) => Ok(None),
        (Some(value), None, None) => Ok(Some(serde_json::to_vec(value).unwrap_or_default())),
        (None, Some(text), None) => Ok(Some(text.as_bytes().to_vec())),
        (None, None, Some(encoded)) => base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map(Some)
            .map_err(|e| format!("`base64` is not base64: {e}")),
        _ => Err("give one of `value`, `text`, `base64`".into()),
    }
}

/// The operation `step` of branch `field` asks for, its key checked by `path`.
fn step_of(
    recipes: &Recipes,
    step: StepBody,
    field: &str,
    path: &impl Fn(&str, &str, Access) -> Result<String, ApiError>,
) -> Result<Step, ApiError> {
    let invalid = |detail: String| ApiError::invalid(Place::Body, field, detail);
    let data = value_bytes(step.value.as_ref(), step.text.as_deref(), step.base64.as_deref()).map_err(invalid)?;
    match (step.put, step.delete, step.get, data) {
        (Some(key), None, None, Some(data)) => {
            recipes.check_stored_size("value", data.len())?;
            Ok(Step::Put {
                path: path(&key, field, Access::Write)?,
                data,
                lease: step.lease,
            })
        }
        (None, Some(key), None, None) if step.lease.is_none() => Ok(Step::Delete {
            path: path(&key, field, Access::Write)?,
        }),
        (None, None, Some(key), None) if step.lease.is_none() => Ok(Step::Get {
            path: path(&key, field, Access::Read)?,
        }),
        _ => Err(invalid(
            "each operation is one of `put` (with one of `value`, `text`, `base64`, and maybe `lease`), `delete`, `get`".into(),
        )),
    }
}

/// The key of the znode at `path`.
fn key_of(recipes: &Recipes, path: &str) -> String {
    key_name(&recipes.root, path).to_string()
}

/// A step's answer.
fn answer(key: String, result: StepResult) -> StepAnswer {
    let mut answer = StepAnswer {
        put: None,
        delete: None,
        get: None,
        etag: None,
        created: None,
        lease: None,
        deleted: None,
        value: None,
        text: None,
        base64: None,
    };
    match result {
        StepResult::Put { stat, created, lease } => {
            answer.put = Some(key);
            answer.lease = lease;
            answer.etag = stat.map(|stat| format!("\"{}\"", stat.mzxid));
            answer.created = Some(created);
        }
        StepResult::Delete { deleted } => {
            answer.delete = Some(key);
            answer.deleted = Some(deleted);
        }
        StepResult::Get(entry) => {
            answer.get = Some(key);
            if let Some(Entry { data, stat, .. }) = entry {
                answer.etag = Some(format!("\"{}\"", stat.mzxid));
                match serde_json::from_slice(&data) {
                    Ok(value) => answer.value = Some(value),
                    Err(_) => match String::from_utf8(data) {
                        Ok(text) => answer.text = Some(text),
                        Err(bytes) => {
                            answer.base64 = Some(base64::engine::general_purpose::STANDARD.encode(bytes.into_bytes()))
                        }
                    },
                }
            }
        }
    }
    answer
}
