//! Writes guarded by a lock (`ZKGATE-Guard`, issue 55): a guarded write lands only while its
//! handle holds what the guard names, checked in the write's own ZooKeeper transaction; a stale
//! guard is refused (409 `guard-lost`, saying why and the holder now) and writes nothing,
//! through either instance, whichever instance drives the handle.

use crate::common;

mod events;
mod frozen;
mod increments;
mod refusals;
mod transactions;
mod write_functions;

use std::time::Duration;

use common::Reply;
use reqwest::{Method, StatusCode};
use serde_json::Value;

/// `method` of kv key `key` (a JSON `value` for a put) on the instance at `url`, with `guard`
/// as `ZKGATE-Guard`.
pub(super) async fn kv(url: &str, method: Method, key: &str, value: Option<Value>, guard: Option<&str>) -> Reply {
    let mut request = common::http_client().request(method, format!("{url}/v1/kv/{key}"));
    if let Some(guard) = guard {
        request = request.header("ZKGATE-Guard", guard);
    }
    if let Some(value) = value {
        request = request.json(&value);
    }
    let response = request
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .expect("kv request");
    Reply::read(response).await
}

/// The guard of lock `lock`'s handle `handle`.
pub(super) fn lock_guard(lock: &str, handle: &str) -> String {
    format!("lock/{lock}; handle={handle}")
}

/// Asserts a 409 `guard-lost` for `guard_target` with `reason`.
pub(super) fn assert_lost(reply: &Reply, guard_target: &str, reason: &str) {
    reply.assert_problem(StatusCode::CONFLICT, None);
    assert_eq!(reply.body["type"], "urn:zkgate:problem:guard-lost", "{reply:?}");
    assert_eq!(reply.body["guard"], guard_target, "{reply:?}");
    assert_eq!(reply.body["reason"], reason, "{reply:?}");
}

/// `POST /v1/kv-txn` on the instance at `url` with `body`.
pub(super) async fn txn(url: &str, body: Value) -> Reply {
    let response = common::http_client()
        .post(format!("{url}/v1/kv-txn"))
        .json(&body)
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .expect("kv-txn request");
    Reply::read(response).await
}

/// What a transaction committed straight through `txn::run` by a test acts with: its charges
/// paid by no principal, and bindings that serve no lease (its branch binds no key).
pub(super) fn unbound_txn(
    recipes: &zkgate::recipes::Recipes,
) -> (
    zkgate::recipes::usage::Payer<'_>,
    zkgate::recipes::kv::txn::Bindings<'_>,
) {
    static NO_LEASES: std::sync::LazyLock<
        std::collections::HashMap<String, std::sync::Arc<zkgate::recipes::leases::Lease>>,
    > = std::sync::LazyLock::new(Default::default);
    let payer = zkgate::recipes::usage::Payer {
        quotas: &recipes.quotas,
        principal: None,
    };
    let bound = zkgate::recipes::kv::txn::Bindings {
        keys: &recipes.kv_keys,
        leases: &NO_LEASES,
        quotas: &recipes.quotas,
        caller: &zkgate::auth::Caller::Anyone,
    };
    (payer, bound)
}
