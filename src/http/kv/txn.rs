//! `POST /v1/kv-txn`: compares, then one branch of puts, deletes and gets over keys, applied
//! whole or not at all ([crate::recipes::kv::txn]; docs/PRIMITIVES.md, part 2). A path no key
//! can have: keys are under `/v1/kv/`.

use crate::http::json::Json;
use axum::extract::State;
use axum::response::IntoResponse;

use crate::AppState;
use crate::auth::Caller;
use crate::http::error::{ApiError, Problems, p};
use crate::http::extract::ApiJson;
use crate::http::guards::{GuardHeader, Guarded};
use crate::http::idempotency::Idempotent;
use crate::recipes::kv::txn::{self, TxnAnswer, TxnRequest};

/// Applies compares, then `then` if all hold or `else` otherwise, as one step: nothing of the
/// branch applies unless all of it does, and the compares (and every value read) held at the
/// moment it applied. With an `Idempotency-Key` it is safe to retry: it applies once for the
/// key, and a retry is answered as it was (`repeated: true`); without one, a commit whose reply
/// ZooKeeper lost is answered 503 `outcome-unknown`. A branch that only reads stores nothing
/// for the key (its retry reads again).
#[utoipa::path(post, path = "/v1/kv-txn", tag = "kv",
    params(GuardHeader, ("Idempotency-Key" = Option<String>, Header, description = crate::http::idempotency::ABOUT)),
    request_body(content = TxnRequest, examples(
        ("writes" = (summary = "Two keys written together, if the config is absent (else it is read)",
            value = json!({"compare": [{"key": "app/config", "absent": true}],
                "then": [{"put": "app/config", "value": {"v": 2}}, {"put": "app/version", "text": "2"}], "else": [{"get": "app/config"}]}))),
        ("reads" = (summary = "Two keys read at one moment", value = json!({"then": [{"get": "app/config"}, {"get": "app/version"}]}))),
        ("held" = (summary = "A key written if the handle still holds the lock (else read)",
            value = json!({"compare": [{"held": {"lock": "orders", "handle": "0b9d4c3e-2f1a4b5c8d7e6f5a4b3c2d1e0f1a2b3c"}}],
                "then": [{"put": "orders/state", "text": "shipped"}], "else": [{"get": "orders/state"}]}))))),
    responses(
        (status = 200, description = "The branch that ran, and its results", body = TxnAnswer),
        Problems<(p::InvalidField, p::MalformedBody, p::Forbidden, p::NotFound, p::KeyNotEmpty, p::KeyBound, p::KeyNotBound, p::LeaseEnded, p::BodyTooLarge, p::ValueTooLarge, p::TooMany, p::QuotaExceeded, p::OutcomeUnknown, p::InstanceUnavailable, p::ZookeeperUnavailable)>,
    ))]
pub async fn transaction(
    State(state): State<AppState>,
    caller: Caller,
    Guarded(guards): Guarded,
    Idempotent {
        key,
        inner: ApiJson(body),
    }: Idempotent<ApiJson<TxnRequest>>,
) -> Result<axum::response::Response, ApiError> {
    let answer = txn::apply(&state, (&caller, &guards), body, key.as_ref()).await?;
    let repeated = answer.repeated;
    Ok(crate::http::idempotency::replayed(
        Json(answer).into_response(),
        repeated,
    ))
}
