//! `/v1/lock-sets`: several exclusive locks acquired as one, all or none, in one request (a long
//! poll, as for one lock), read, and released together. See [crate::recipes::locks::lock_set] for
//! the order they are taken in and why sets cannot deadlock.
//!
//! A set's locks are ordinary locks (the same znodes and handles as `POST
//! /v1/locks/{name}/acquire`): each has its own fencing token, and each handle can be read on
//! its lock. A set is not a kind of its own: its routes authorise each lock by name here. Its
//! acquire is served by the keeper of the lease it names, like a lock's; a granted set is
//! recorded in ZooKeeper, so that any instance reads or releases it.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{HandleView, held_since};
use crate::AppState;
use crate::auth::{Access, Caller};
use crate::http::consistency::Consistency;
use crate::http::error::{ApiError, Place, Problems, p};
use crate::http::extract::{ApiJson, ApiPath, ApiQuery};
use crate::kind::Kind;
use crate::recipes::leases::LeaseView;
use crate::recipes::locks::lock_set::canonical_order;
use crate::recipes::locks::{self, contention::Contender};
use crate::time::HumanDuration;

/// Most locks in one set.
pub const MAX_LOCKS: usize = 64;

/// The routes (under the locks' tag).
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(acquire_set))
        .routes(routes!(get_set, release_set))
}

/// Query of a set's acquire.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SetParams {
    /// How long to wait for the whole set (one wait for all its locks, not one each): `0`
    /// tries once. Capped by the server's maximum wait, which is also the default.
    #[param(value_type = Option<String>, example = "10s")]
    pub wait: Option<HumanDuration>,
}

/// Body of a set's acquire.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LockSetBody {
    /// The locks, by name (1 to 64, each once; any order: they are taken sorted).
    #[schema(example = json!(["account-17", "account-42"]), min_items = 1, max_items = 64)]
    pub locks: Vec<String>,
    /// The lease to hold them with. Without it a new lease is created and returned.
    pub lease: Option<String>,
    /// TTL of the lease created when `lease` is not given.
    pub ttl: Option<HumanDuration>,
}

/// One lock of a set.
#[derive(Serialize, utoipa::ToSchema)]
pub struct SetLock {
    #[schema(example = "account-17")]
    pub lock: String,
    /// The lock's handle (`/v1/locks/{lock}/handles/{handle}`).
    pub handle: String,
    /// This lock's fencing token: send it with writes to what this lock protects.
    #[schema(example = 4294967302_i64)]
    pub fencing_token: Option<i64>,
    pub node: Option<String>,
    #[schema(format = DateTime)]
    pub held_since: Option<String>,
}

/// A set that was granted: every lock held.
#[derive(Serialize, utoipa::ToSchema)]
pub struct LockSetView {
    /// Release every lock with `DELETE /v1/lock-sets/{set}`.
    #[schema(example = "5f0c1a2b-0b9d4c3e2f1a4b5c8d7e6f5a4b3c2d1e")]
    pub set: String,
    /// Its locks, in the order they were taken (sorted by name).
    pub locks: Vec<SetLock>,
    /// The lease holding them; keep it alive with `POST /v1/leases/{id}/keepalive`.
    pub lease: LeaseView,
}

/// A set as it stands.
#[derive(Serialize, utoipa::ToSchema)]
pub struct LockSetState {
    pub set: String,
    pub lease: String,
    /// `held` while every lock is; `lost` once one was lost (its lease expired, its node was
    /// deleted...): the set no longer protects anything and should be released.
    #[schema(example = "held")]
    pub state: &'static str,
    pub locks: Vec<HandleView>,
}

fn set_lock(handle: &Contender) -> SetLock {
    let current = handle.state();
    SetLock {
        lock: handle.name.clone(),
        handle: handle.id.clone(),
        fencing_token: current.fencing_token(),
        node: current.node.map(|n| n.name),
        held_since: held_since(&current.phase),
    }
}

/// Acquires several locks all or none, waiting up to `wait` for the whole set.
///
/// The locks are taken one after another in name order, whatever order the request lists them
/// in, so two clients asking for overlapping sets never wait for each other in a cycle. If one
/// is not granted within the wait, every lock taken for the set is released before the answer
/// (409 `lock-not-acquired` naming the `lock` that was not granted): a refused set holds
/// nothing. Locks the lease already held join the set (and stay held if the set is refused).
#[utoipa::path(post, path = "/v1/lock-sets", tag = "locks", extensions(("x-zkgate-served-by" = json!({"any": "body"}))),
    params(SetParams),
    request_body(content = LockSetBody, example = json!({"locks": ["account-42", "account-17"], "ttl": "30s"})),
    responses(
        (status = 200, description = "Every lock granted", body = LockSetView),
        Problems<(p::InvalidField, p::MalformedBody, p::NotFound, p::LockNotAcquired, p::LeaseEnded, p::LockLost, p::TooMany, p::ZookeeperUnavailable)>,
    ))]
pub async fn acquire_set(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(params): ApiQuery<SetParams>,
    ApiJson(body): ApiJson<LockSetBody>,
) -> Result<Json<LockSetView>, ApiError> {
    let order = locks_in_order(&caller, &body.locks)?;
    let wait = state.wait(params.wait.map(|w| w.0));
    let ttl = body.ttl.map(|t| t.0);
    let (id, taken, lease) = locks::acquire_set(&state, &caller, &order, wait, body.lease, ttl).await?;
    Ok(Json(LockSetView {
        set: id,
        locks: taken.iter().map(|handle| set_lock(handle)).collect(),
        lease: LeaseView::of(&lease),
    }))
}

/// The locks a set names, each valid, named once and allowed to `caller`, in the order every
/// set takes them (so that two sets never wait on each other).
fn locks_in_order<'a>(caller: &Caller, locks: &'a [String]) -> Result<Vec<&'a str>, ApiError> {
    if locks.is_empty() || locks.len() > MAX_LOCKS {
        let detail = format!("must name 1 to {MAX_LOCKS} locks");
        return Err(ApiError::invalid(Place::Body, "locks", detail));
    }
    for name in locks {
        crate::recipes::validate_name(name)
            .map_err(|e| ApiError::invalid(Place::Body, "locks", format!("`{name}` {e}")))?;
    }
    let Some(order) = canonical_order(locks) else {
        return Err(ApiError::invalid(Place::Body, "locks", "must name each lock once"));
    };
    // The route names no lock, so the guard could not authorise them: each one here.
    for name in &order {
        caller.require(Kind::Lock.auth(), name, Access::Write)?;
    }
    Ok(order)
}

/// Reads a set: each lock's handle, and whether all are still held.
#[utoipa::path(get, path = "/v1/lock-sets/{set}", tag = "locks",
    params(("set" = String, Path, description = "The set's id, from its acquire")),
    responses(
        (status = 200, description = "The lock set", body = LockSetState),
        Problems<(p::InvalidField, p::NotFound)>,
    ))]
pub async fn get_set(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    consistency: Consistency,
) -> Result<Json<LockSetState>, ApiError> {
    let (set, seen) = locks::read_set(&state, &caller, &id, consistency).await?;
    let mut locks: Vec<HandleView> = Vec::with_capacity(set.locks.len());
    for (member, seen) in set.locks.iter().zip(seen) {
        locks.push(match seen {
            Some(seen) => HandleView::of(&state, seen).await,
            None => HandleView::gone(&member.lock, &member.handle, &set.lease),
        });
    }
    let all_held = locks.iter().all(|l| l.state == "held");
    Ok(Json(LockSetState {
        set: id,
        lease: set.lease,
        state: if all_held { "held" } else { "lost" },
        locks,
    }))
}

/// Releases every lock of a set; their znodes are deleted before this answers. If one had been
/// lost before (410 `lock-lost`, naming it), the others are released all the same.
#[utoipa::path(delete, path = "/v1/lock-sets/{set}", tag = "locks",
    params(("set" = String, Path, description = "The set's id, from its acquire")),
    responses(
        (status = 204, description = "Released"),
        Problems<(p::InvalidField, p::NotFound, p::LockLost)>,
    ))]
pub async fn release_set(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    locks::release_set(&state, &caller, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}
