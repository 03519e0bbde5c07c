//! The lock family over HTTP: exclusive locks, read/write locks, semaphores and lock sets, one
//! file each. Here what the contended kinds (these, and elections) share: the acquire's parameters and answer (200 granted, 202 still queued), a handle's view,
//! revocation's body, and the handle and fencing routes each lock kind declares with a macro.
//! The protocol (the acquire, a handle's reads and release) is [crate::recipes::locks::contention]'s.

pub mod exclusive;
pub mod lock_sets;
pub mod rwlocks;
pub mod semaphores;

use std::sync::Arc;

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use crate::AppState;
use crate::auth::Caller;
use crate::http::error::{ApiError, Place};
use crate::recipes::consistency::Consistency;
use crate::recipes::leases::LeaseView;
use crate::recipes::locks::contention::{
    self as recipe, Contender, Contenders, Granted, Lease, Phase, Recorded, Revocation, Role, Seen,
};
use crate::time::{HumanDuration, timestamp};

/// Query of an acquire.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AcquireParams {
    /// How long to wait for the lock: `0` tries once, `10s` waits up to ten seconds. Capped by
    /// the server's maximum wait, which is also the default.
    #[param(value_type = Option<String>, example = "10s")]
    pub wait: Option<HumanDuration>,
    /// When the wait ends without the lock: `false` (default) leaves the queue; `true` stays
    /// queued and answers 202 with the position, to be waited on again with the same lease.
    pub keep_queued: Option<bool>,
}

/// Body of an acquire (optional).
#[derive(Deserialize, utoipa::ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct AcquireBody {
    /// The lease to hold the lock with. Without it a new lease is created and returned.
    pub lease: Option<String>,
    /// TTL of the lease created when `lease` is not given.
    pub ttl: Option<HumanDuration>,
}

/// Answer of an acquire: granted (200) or still queued (202).
#[derive(Serialize, utoipa::ToSchema)]
pub struct Acquisition {
    #[schema(example = "orders")]
    pub lock: String,
    /// `read` or `write` for a read/write lock.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<&'static str>,
    /// `true` when the lock is held.
    pub acquired: bool,
    /// Release with `DELETE .../handles/{handle}`.
    #[schema(example = "0b9d4c3e2f1a4b5c8d7e6f5a4b3c2d1e")]
    pub handle: String,
    /// Present once granted: strictly increases with every grant of this lock. Send it with
    /// every write to the protected resource, which must reject tokens lower than the highest
    /// it has seen.
    #[schema(example = 4294967302_i64)]
    pub fencing_token: Option<i64>,
    /// Contenders ahead (0 when held).
    pub position: usize,
    /// The contender's znode name.
    #[schema(example = "_c_6c1f1a9e-8d2b-4d43-9b7a-0e1c2d3e4f50-lock-0000000007")]
    pub node: Option<String>,
    /// When the lock was granted.
    #[schema(format = DateTime)]
    pub held_since: Option<String>,
    /// The lease holding it; keep it alive with `POST /v1/leases/{id}/keepalive`.
    pub lease: LeaseView,
}

/// A handle: one lease's place at one lock.
#[derive(Serialize, utoipa::ToSchema)]
pub struct HandleView {
    pub lock: String,
    /// `read` or `write`, for a read/write lock.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<&'static str>,
    pub handle: String,
    pub lease: String,
    /// `pending`, `waiting`, `held`, `lost`, `released` or `failed`.
    #[schema(example = "held")]
    pub state: &'static str,
    /// Contenders ahead while waiting.
    pub position: Option<usize>,
    /// Present while held (and after a loss, to tell which grant was lost).
    pub fencing_token: Option<i64>,
    pub node: Option<String>,
    #[schema(format = DateTime)]
    pub held_since: Option<String>,
    /// Why it was lost or failed.
    pub reason: Option<String>,
    /// Someone asked the holder to give the lock up: release it when ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revocation: Option<Revocation>,
}

/// 200 when granted, 202 when still queued.
pub fn status<P: crate::recipes::locks::contention::Protocol>(granted: &Granted<P>) -> StatusCode {
    if granted.granted {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    }
}

/// An acquire of a lock: 200 with the grant, or 202 still queued.
pub async fn acquire(
    state: &AppState,
    caller: &Caller,
    registry: &Contenders,
    name: &str,
    role: Role,
    params: AcquireParams,
    body: Option<AcquireBody>,
) -> Result<Response, ApiError> {
    let body = body.unwrap_or_default();
    let request = recipe::Request {
        caller,
        name,
        wait: params.wait.map(|w| w.0),
        keep_queued: params.keep_queued == Some(true),
        lease: body.lease,
        ttl: body.ttl.map(|t| t.0),
    };
    let open = async |lease: Arc<Lease>| recipe::open_contender(state, registry, &lease, name, role, None);
    let outcome = recipe::contend(state, registry, request, open).await?;
    Ok((status(&outcome), Json(acquisition(&outcome.handle, &outcome.lease))).into_response())
}

fn acquisition(contender: &Contender, lease: &Lease) -> Acquisition {
    let current = contender.state();
    let (acquired, position, held_since) = match current.phase {
        Phase::Held { since } => (true, 0, Some(timestamp(since))),
        Phase::Waiting { position } => (false, position, None),
        _ => (false, 0, None),
    };
    Acquisition {
        lock: contender.name.clone(),
        mode: contender.protocol.role.mode(),
        acquired,
        handle: contender.id.clone(),
        fencing_token: current.fencing_token(),
        position,
        node: current.node.map(|n| n.name),
        held_since,
        lease: LeaseView::of(lease),
    }
}

/// A handle as this instance's memory or ZooKeeper shows it.
impl HandleView {
    /// A contender kept here. A waiter's position is read afresh ([recipe::fresh_position]).
    pub async fn here(state: &AppState, contender: &Contender) -> HandleView {
        let current = contender.state();
        let (position, reason) = match &current.phase {
            Phase::Waiting { position } => (
                Some(recipe::fresh_position(state, contender).await.unwrap_or(*position)),
                None,
            ),
            Phase::Lost { reason } => (None, Some(reason.clone())),
            Phase::Failed { error } => (None, Some(error.to_string())),
            _ => (None, None),
        };
        HandleView {
            lock: contender.name.clone(),
            handle: contender.id.clone(),
            lease: contender.lease.id.clone(),
            mode: contender.protocol.role.mode(),
            state: current.phase.name(),
            position,
            fencing_token: current.fencing_token(),
            node: current.node.map(|n| n.name),
            held_since: held_since(&current.phase),
            reason,
            revocation: current.revocation,
        }
    }

    /// A lock of a set whose handle is gone (released, or lost).
    pub fn gone(name: &str, handle: &str, lease: &str) -> HandleView {
        HandleView {
            lock: name.to_string(),
            handle: handle.to_string(),
            lease: lease.to_string(),
            mode: None,
            state: "lost",
            position: None,
            fencing_token: None,
            node: None,
            held_since: None,
            reason: Some("its znode is gone".into()),
            revocation: None,
        }
    }

    /// A holding as ZooKeeper has it (when it was granted is known only to its keeper).
    pub fn there(recorded: &Recorded) -> HandleView {
        HandleView {
            lock: recorded.name.clone(),
            handle: recorded.handle.clone(),
            lease: recorded.owner().map(|o| o.lease).unwrap_or_default(),
            mode: recorded.role.mode(),
            state: if recorded.holds() { "held" } else { "waiting" },
            position: recorded.position,
            fencing_token: recorded.holds().then_some(recorded.node.czxid),
            node: Some(recorded.node.name.clone()),
            held_since: None,
            reason: None,
            revocation: recorded.revocation(),
        }
    }

    /// A handle as [recipe::read_handle] saw it.
    pub async fn of(state: &AppState, seen: Seen) -> HandleView {
        match seen {
            Seen::Here(contender) => HandleView::here(state, &contender).await,
            Seen::There(recorded) => HandleView::there(&recorded),
        }
    }
}

/// `GET .../handles/{handle}` of a contender kind: where the handle stands, after waiting (up
/// to `query.wait`) for news, read at `consistency`.
pub async fn get_handle(
    state: &AppState,
    handles: &Contenders,
    caller: &Caller,
    at: (&str, &str),
    query: HandleQuery,
    consistency: Consistency,
) -> Result<HandleView, ApiError> {
    let wait = query.wait.map(|w| w.0);
    Ok(
        match recipe::read_handle(state, handles, caller, at, wait, consistency).await? {
            Seen::Here(contender) => HandleView::here(state, &contender).await,
            Seen::There(recorded) => HandleView::there(&recorded),
        },
    )
}

/// When a phase began holding.
pub fn held_since(phase: &Phase) -> Option<String> {
    match phase {
        Phase::Held { since } => Some(timestamp(*since)),
        _ => None,
    }
}

/// Query of a handle read.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct HandleQuery {
    /// Wait (up to this long, capped by the server's maximum) for something the holder must
    /// act on: a revocation request, a loss, or (for a waiter) the grant.
    #[param(value_type = Option<String>, example = "30s")]
    pub wait: Option<HumanDuration>,
}

/// Answer of a fencing check: the token is a current holder's (the leader's term).
#[derive(Serialize, utoipa::ToSchema)]
pub struct FencingCheck {
    #[schema(example = "orders")]
    pub name: String,
    #[schema(example = 4294967310i64)]
    pub token: i64,
}

/// `GET /v1/<kind>/{name}/fencing/{token}` ([recipe::check_fencing]): 200 if `token` is a
/// current holder's.
pub async fn check_fencing(
    state: &AppState,
    what: &str,
    dir: String,
    (name, token): (&str, &str),
    consistency: Consistency,
    holding: impl Fn(&[String]) -> usize,
) -> Result<Json<FencingCheck>, ApiError> {
    let token: i64 = token.parse().ok().filter(|t: &i64| *t > 0).ok_or_else(|| {
        ApiError::invalid(
            Place::Path,
            "token",
            format!(
                "`{}` is not a fencing token (a positive integer, as acquire answered it)",
                token.escape_debug()
            ),
        )
    })?;
    recipe::check_fencing(state, what, dir, name, token, consistency, holding).await?;
    let name = name.to_string();
    Ok(Json(FencingCheck { name, token }))
}

/// Body of a revocation request.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RevokeBody {
    /// Who asks (recorded).
    #[schema(example = "ops@example.com", max_length = 500)]
    pub by: String,
    /// Why (recorded, shown to the holder).
    #[schema(example = "deploy in progress", max_length = 500)]
    pub reason: String,
    /// After this long (at most 24h) zkgate deletes the holder's node itself (the holder
    /// loses the lock). Without it, the holder releases when it is ready.
    pub grace: Option<HumanDuration>,
    /// Revoke only this contender node (default: every current holder).
    pub node: Option<String>,
}

/// The revocations made.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Revoked {
    pub revocations: Vec<Revocation>,
}

/// Asks the holders of `name` (or the one `node`) to give the lock up: 202 with the
/// revocations made; `role_of` tells a node's role from its name (reader or writer).
pub async fn revoke(
    state: &AppState,
    caller: &Caller,
    registry: &Contenders,
    name: &str,
    role_of: fn(&str) -> Role,
    body: RevokeBody,
) -> Result<Response, ApiError> {
    let ask = recipe::Ask {
        by: body.by,
        reason: body.reason,
        grace: body.grace.map(|g| g.0),
        node: body.node,
    };
    let revocations = recipe::revoke(state, caller, registry, name, role_of, ask).await?;
    Ok((StatusCode::ACCEPTED, Json(Revoked { revocations })).into_response())
}

/// A handle's `DELETE` (204), by its id ([recipe::release_by_id]).
pub async fn release_by_id<P: crate::recipes::locks::contention::Protocol>(
    state: &AppState,
    handles: &crate::recipes::locks::contention::Handles<P>,
    caller: &Caller,
    name: &str,
    handle: &str,
) -> Result<StatusCode, ApiError> {
    recipe::release_by_id(state, handles, caller, name, handle).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A lock kind's handle routes, the same for exclusive and read/write locks: `GET` and
/// `DELETE .../handles/{handle}` (read a handle, release it) and `POST .../revoke` (ask the
/// holders to give it up), on the kind's registry `state.$registry`, a node's role told by
/// `$role`.
macro_rules! lock_handle_handlers {
    (
        $registry:ident, $role:expr, tag = $tag:tt,
        get = ($get_id:tt, $handle_path:tt),
        release = ($release_id:tt, $(#[doc = $release_doc:tt])*),
        revoke = ($revoke_id:tt, $revoke_path:tt, $(#[doc = $revoke_doc:tt])*)
    ) => {
        /// Reads a handle: waiting (with position), held (with fencing token) or lost (with reason).
        #[utoipa::path(operation_id = $get_id, get, path = $handle_path, tag = $tag,
            params(("name" = String, Path, description = "Lock name"), ("handle" = String, Path, description = "Handle from the acquire"), $crate::http::locks::HandleQuery),
            responses(
                (status = 200, description = "The handle", body = $crate::http::locks::HandleView),
                $crate::http::error::Problems<($crate::http::error::p::InvalidField, $crate::http::error::p::NotFound, $crate::http::error::p::LockLost)>,
            ))]
        pub async fn get_handle(
            axum::extract::State(state): axum::extract::State<$crate::AppState>,
            caller: $crate::auth::Caller,
            $crate::http::extract::ApiPath((name, handle)): $crate::http::extract::ApiPath<(String, String)>,
            $crate::http::extract::ApiQuery(query): $crate::http::extract::ApiQuery<$crate::http::locks::HandleQuery>,
            consistency: $crate::http::consistency::Consistency,
        ) -> Result<axum::Json<$crate::http::locks::HandleView>, $crate::http::error::ApiError> {
            $crate::http::locks::get_handle(&state, &state.$registry, &caller, (&name, &handle), query, consistency).await.map(axum::Json)
        }

        $(#[doc = $release_doc])*
        #[utoipa::path(operation_id = $release_id, delete, path = $handle_path, tag = $tag,
            params(("name" = String, Path, description = "Lock name"), ("handle" = String, Path, description = "Handle from the acquire")),
            responses(
                (status = 204, description = "Released"),
                $crate::http::error::Problems<($crate::http::error::p::InvalidField, $crate::http::error::p::NotFound, $crate::http::error::p::LockLost)>,
            ))]
        pub async fn release(
            axum::extract::State(state): axum::extract::State<$crate::AppState>,
            caller: $crate::auth::Caller,
            $crate::http::extract::ApiPath((name, handle)): $crate::http::extract::ApiPath<(String, String)>,
        ) -> Result<axum::http::StatusCode, $crate::http::error::ApiError> {
            $crate::http::locks::release_by_id(&state, &state.$registry, &caller, &name, &handle).await
        }

        $(#[doc = $revoke_doc])*
        #[utoipa::path(operation_id = $revoke_id, post, path = $revoke_path, tag = $tag,
            params(("name" = String, Path, description = "Lock name")),
            request_body(content = $crate::http::locks::RevokeBody, example = json!({"by": "ops@example.com", "reason": "deploy in progress", "grace": "30s"})),
            responses(
                (status = 202, description = "Asked; the holders decide (or the grace decides)", body = $crate::http::locks::Revoked),
                $crate::http::error::Problems<($crate::http::error::p::InvalidField, $crate::http::error::p::MalformedBody, $crate::http::error::p::NotFound, $crate::http::error::p::NothingToRevoke, $crate::http::error::p::ZookeeperUnavailable)>,
            ))]
        pub async fn revoke(
            axum::extract::State(state): axum::extract::State<$crate::AppState>,
            caller: $crate::auth::Caller,
            $crate::http::extract::ApiPath(name): $crate::http::extract::ApiPath<String>,
            $crate::http::extract::ApiJson(body): $crate::http::extract::ApiJson<$crate::http::locks::RevokeBody>,
        ) -> Result<axum::response::Response, $crate::http::error::ApiError> {
            $crate::http::locks::revoke(&state, &caller, &state.$registry, &name, $role, body).await
        }
    };
}

pub(crate) use lock_handle_handlers;

/// Declares a kind's `GET /v1/<kind>/{name}/fencing/{token}` ([check_fencing]): `handles` picks
/// the kind's handles from the state (for the directory), `holding` says how many of its
/// contenders in queue order hold.
macro_rules! fencing_handler {
    ($(#[doc = $doc:tt])* $handler:ident, $path:tt, $tag:tt, $what:tt, |$state:ident| $handles:expr, $holding:expr) => {
        $(#[doc = $doc])*
        #[utoipa::path(get, path = $path, tag = $tag,
            params(("name" = String, Path, description = "Its name"), ("token" = i64, Path, description = "The fencing token to check, as the acquire (or campaign) answered it")),
            responses(
                (status = 200, description = "The token is current", body = $crate::http::locks::FencingCheck),
                $crate::http::error::Problems<($crate::http::error::p::InvalidField, $crate::http::error::p::NotHeld, $crate::http::error::p::StaleFencingToken, $crate::http::error::p::ZookeeperUnavailable)>,
            ))]
        pub async fn $handler(
            axum::extract::State($state): axum::extract::State<$crate::AppState>,
            $crate::http::extract::ApiPath((name, token)): $crate::http::extract::ApiPath<(String, String)>,
            consistency: $crate::http::consistency::Consistency,
        ) -> Result<axum::Json<$crate::http::locks::FencingCheck>, $crate::http::error::ApiError> {
            let dir = $handles.dir(&name);
            $crate::http::locks::check_fencing(&$state, $what, dir, (&name, &token), consistency, $holding).await
        }
    };
}

pub(crate) use fencing_handler;
