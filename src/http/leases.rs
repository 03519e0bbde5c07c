//! `/v1/leases`: create, list, read, keep alive and delete leases; and the lease a resource
//! request names (or makes).

use crate::http::json::Json;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::consistency::Consistency;
use super::error::{ApiError, Problem, Problems, p};
use super::extract::{ApiJson, ApiPath};
use super::idempotency::Idempotent;
use crate::AppState;
use crate::auth::Caller;
use crate::recipes::leases::{self, CreateLease, EndReason, LeaseSummary, LeaseView};

/// The lease routes.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_lease, list_leases))
        .routes(routes!(get_lease, delete_lease))
        .routes(routes!(keepalive))
}

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
    let most = state.config.max_lock_delay;
    let (lease, replayed) = leases::create(&state, &caller, body.unwrap_or_default(), most, key.as_ref()).await?;
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
    paging
        .page(state.leases.list(&caller), LeaseSummary::order)
        .map(|l| LeaseSummary::of(&l))
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
