//! `/v1/leases`: create, list, read, keep alive and delete leases; and the lease a resource
//! request names (or makes).

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use std::time::Duration;

use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::consistency::Consistency;
use super::error::{ApiError, Place, Problem, Problems, p};
use super::extract::{ApiJson, ApiPath};
use super::idempotency::Idempotent;
use crate::AppState;
use crate::auth::Caller;
use crate::kind::Kind;
use crate::recipes::idempotency::Keyed;
use crate::recipes::leases::{Created, NewLease};
use crate::recipes::leases::{EndReason, HoldingView, Lease};
use crate::time::{HumanDuration, millis_since, timestamp};

/// The lease routes.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_lease, list_leases))
        .routes(routes!(get_lease, delete_lease))
        .routes(routes!(keepalive))
}

/// Body of `POST /v1/leases` (optional).
#[derive(Deserialize, utoipa::ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct CreateLease {
    /// Time to live without a keepalive; clamped to the server's bounds. Default: the server's.
    pub ttl: Option<HumanDuration>,
    /// How long the locks, read/write locks and semaphore permits it holds stay held after it
    /// *expires* (its holder was cut off, and its last writes may still be in flight), before
    /// they are released: Chubby's and Consul's lock-delay. A release, or the lease's `DELETE`,
    /// releases at once. At most the server's `--max-lock-delay` (60s by default). Default 0.
    #[schema(value_type = Option<String>, example = "15s")]
    pub lock_delay: Option<HumanDuration>,
}

/// A lease and everything held on its behalf.
#[derive(Serialize, utoipa::ToSchema)]
pub struct LeaseView {
    /// The lease id: pass it as `lease` to acquire more with this lease.
    #[schema(example = "3c9e1f07-6f1c2a9e0b7d4e3f8a5b6c7d8e9f0a1b")]
    pub id: String,
    /// The TTL granted, in milliseconds.
    #[schema(example = 30000)]
    pub ttl_ms: u64,
    /// The TTL asked for, when it was clamped to the server's bounds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requested_ttl_ms: Option<u64>,
    /// Time left before it expires unless kept alive, in milliseconds. Absent from an answer
    /// of an instance that does not keep the lease's TTL clock (an acquire served where it
    /// arrived): `GET /v1/leases/{id}` or a keepalive says it.
    #[schema(example = 29874)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remaining_ms: Option<u64>,
    #[schema(example = "2026-11-22T10:00:00.000Z")]
    #[schema(format = DateTime)]
    pub created_at: String,
    /// When it was last kept alive; absent where `remaining_ms` is.
    #[schema(format = DateTime)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_keepalive_at: Option<String>,
    /// Its lock-delay, when it asked for one (see `CreateLease`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock_delay_ms: Option<u64>,
    /// Locks (and later other resources) held or waited for with this lease.
    pub holdings: Vec<HoldingView>,
}

impl LeaseView {
    pub fn of(lease: &Lease) -> LeaseView {
        let kept = !lease.is_visiting();
        let requested = lease.requested_ttl.filter(|r| *r != lease.ttl);
        LeaseView {
            id: lease.id.clone(),
            ttl_ms: lease.ttl.as_millis() as u64,
            requested_ttl_ms: requested.map(|r| r.as_millis() as u64),
            remaining_ms: kept.then(|| lease.remaining().as_millis() as u64),
            created_at: timestamp(lease.created_at),
            last_keepalive_at: kept.then(|| timestamp(lease.last_keepalive())),
            lock_delay_ms: (!lease.lock_delay.is_zero()).then_some(lease.lock_delay.as_millis() as u64),
            holdings: lease.holdings(),
        }
    }
}

/// Summary of a lease in the list.
#[derive(Serialize, utoipa::ToSchema)]
pub struct LeaseSummary {
    #[schema(example = "3c9e1f07-6f1c2a9e0b7d4e3f8a5b6c7d8e9f0a1b")]
    pub id: String,
    #[schema(example = 30000)]
    pub ttl_ms: u64,
    #[schema(example = 21450)]
    pub remaining_ms: u64,
    /// Age of the lease in milliseconds.
    #[schema(example = 95120)]
    pub age_ms: u64,
    /// Number of holdings.
    #[schema(example = 2)]
    pub holdings: usize,
    /// The keys bound to it (`PUT /v1/kv/{key}?lease=`) through this instance, in order, at
    /// most 16 (its view lists them all).
    #[schema(example = json!(["workers/w1"]))]
    pub keys: Vec<String>,
}

/// Most bound keys a lease's summary names.
const SUMMARY_KEYS: usize = 16;

/// Creates a lease.
///
/// With an `Idempotency-Key` header, retrying the same request (through any instance) returns
/// the lease the first attempt created instead of a second one (410 if it has ended since).
#[utoipa::path(post, path = "/v1/leases", tag = "leases",
    request_body(content = Option<CreateLease>, description = "Optional; `{}` or no body takes the default TTL.",
        example = json!({"ttl": "30s"})),
    params(("Idempotency-Key" = Option<String>, Header, description = super::idempotency::ABOUT)),
    responses(
        (status = 201, description = "Created; `Location` names the lease", body = LeaseView,
            headers(("Location" = String, description = "The lease's path: `/v1/leases/{id}`"))),
        Problems<(p::InvalidField, p::MalformedBody, p::LeaseEnded, p::QuotaExceeded, p::ZookeeperUnavailable)>,
    ))]
pub async fn create_lease(
    State(state): State<AppState>,
    caller: Caller,
    Idempotent {
        key,
        inner: ApiJson(body),
    }: Idempotent<ApiJson<Option<CreateLease>>>,
) -> Result<Response, ApiError> {
    let body = body.unwrap_or_default();
    let ttl = body.ttl.map(|t| t.0);
    if ttl.is_some_and(|t| t.is_zero()) {
        return Err(ApiError::invalid(Place::Body, "ttl", "must be above zero"));
    }
    let lock_delay = body.lock_delay.map_or(Duration::ZERO, |d| d.0);
    let most = state.config.max_lock_delay;
    if lock_delay > most {
        let detail = format!("must be at most {} ms (`--max-lock-delay`)", most.as_millis());
        return Err(ApiError::invalid(Place::Body, "lock_delay", detail));
    }
    let keyed = key.as_ref().map(|key| Keyed {
        keys: &state.idempotency,
        key,
    });
    let new = NewLease {
        ttl,
        lock_delay,
        key: keyed,
        with_first_holding: false,
    };
    let (lease, replayed) = match state.leases.create_keyed(&caller, new).await? {
        Created::New(lease) => (lease, false),
        // Made by an earlier request with the key: the lease as it is now, wherever it is kept.
        Created::Before(id) => (state.leases.serve(&caller, &id).await?, true),
    };
    let location = HeaderValue::from_str(&format!("/v1/leases/{}", lease.id))
        .map_err(|e| ApiError::new(Problem::Internal, e.to_string()))?;
    let created = (
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(LeaseView::of(&lease)),
    );
    Ok(super::idempotency::replayed(created.into_response(), replayed))
}

/// Lists the live leases this instance keeps, oldest first.
#[utoipa::path(get, path = "/v1/leases", tag = "leases", params(super::paging::PageQuery), responses(
    (status = 200, description = "A page of the leases, in order (`Link` gives the next page while more follow)", body = Vec<LeaseSummary>, headers(("Link" = String, description = "While more entries follow: the next page, `<url>; rel=\"next\"`"))),
    Problems<(p::InvalidField,)>,
))]
pub async fn list_leases(
    State(state): State<AppState>,
    caller: Caller,
    paging: super::paging::Paging,
) -> super::paging::Page<LeaseSummary> {
    // Oldest first: by creation time (ns since the epoch, zero-padded so that the text sorts
    // as the number), then id.
    let created = |l: &std::sync::Arc<crate::recipes::leases::Lease>| {
        let nanos = l
            .created_at
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("{nanos:024}|{}", l.id)
    };
    paging.page(state.leases.list(&caller), created).map(|l| LeaseSummary {
        id: l.id.clone(),
        ttl_ms: l.ttl.as_millis() as u64,
        remaining_ms: l.remaining().as_millis() as u64,
        age_ms: millis_since(l.created_at),
        holdings: l.holdings().len(),
        keys: {
            let mut keys: Vec<String> = l
                .holdings()
                .into_iter()
                .filter(|h| h.kind == Kind::Kv.name())
                .map(|h| h.name)
                .collect();
            keys.sort();
            keys.truncate(SUMMARY_KEYS);
            keys
        },
    })
}

/// Reads a lease: remaining TTL and everything it holds.
#[utoipa::path(get, path = "/v1/leases/{id}", tag = "leases", extensions(("x-zkgate-served-by" = json!({"keeper": {"path": "id"}}))),
    params(("id" = String, Path, description = "Lease id")),
    responses(
        (status = 200, description = "The lease", body = LeaseView),
        Problems<(p::NotFound, p::LeaseEnded)>,
    ))]
pub async fn get_lease(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
    consistency: Consistency,
) -> Result<Json<LeaseView>, ApiError> {
    let lease = state.leases.find(&caller, &id).await?;
    state.confirm(&lease, consistency).await?;
    let mut view = LeaseView::of(&lease);
    // What other instances drive for it (acquires served where they arrived), from ZooKeeper.
    view.holdings.extend(state.driven_elsewhere(&lease).await?);
    Ok(Json(view))
}

/// Keeps a lease alive for another TTL; answers with its holdings, so a holder learns here if
/// it lost a lock.
#[utoipa::path(post, path = "/v1/leases/{id}/keepalive", tag = "leases", extensions(("x-zkgate-served-by" = json!({"keeper": {"path": "id"}}))),
    params(("id" = String, Path, description = "Lease id")),
    responses(
        (status = 200, description = "The lease", body = LeaseView),
        Problems<(p::NotFound, p::LeaseEnded)>,
    ))]
pub async fn keepalive(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<LeaseView>, ApiError> {
    let lease = state.leases.find(&caller, &id).await?;
    lease.renew();
    Ok(Json(LeaseView::of(&lease)))
}

/// Deletes a lease: everything it holds is released (its znodes deleted) before this answers,
/// so the next waiters are already on their way. Deleting it again answers the same (a retry
/// after a lost reply); a lease that expired or was lost answers `410` with the reason.
#[utoipa::path(delete, path = "/v1/leases/{id}", tag = "leases", extensions(("x-zkgate-served-by" = json!({"keeper": {"path": "id"}}))),
    params(("id" = String, Path, description = "Lease id")),
    responses(
        (status = 204, description = "Deleted; its locks are released"),
        Problems<(p::NotFound, p::LeaseEnded)>,
    ))]
pub async fn delete_lease(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    match state.leases.end(&caller, &id, EndReason::Deleted).await {
        // Deleted before: a retry after a lost reply gets the answer the first delete got.
        // (One that expired or was lost still says so, with `410` and the reason.)
        Ok(())
        | Err(crate::recipes::leases::LeaseError::Ended {
            reason: EndReason::Deleted,
            ..
        }) => Ok(StatusCode::NO_CONTENT),
        Err(err) => Err(err.into()),
    }
}
