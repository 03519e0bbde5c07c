//! `/v1/groups`: group membership: join with data (lease-bound), leave, list the live members,
//! and a blocking read that returns when membership changes.

use crate::http::json::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::AppState;
use crate::auth::Caller;
use crate::http::consistency::Consistency;
use crate::http::error::{ApiError, Problems, p};
use crate::http::extract::{ApiJson, ApiPath, ApiQuery};
use crate::http::guards::{GuardHeader, Guarded};
use crate::http::{Followed, Resource, check_name};
use crate::kind::Kind;
use crate::recipes::groups::{self, GroupQuery, GroupSummary, JoinBody, Joined, group::GroupState};

/// The group kind's module.
pub const RESOURCE: Resource = Resource {
    kind: Kind::Group,
    about: Some("Group membership: lease-bound members with data, and a blocking read of changes."),
    routes,
    topic: Some(Followed {
        summary: "Follows a group: its members, as Server-Sent Events.",
        param: "group",
    }),
    listed: None,
};

fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_groups))
        .routes(routes!(members))
        .routes(routes!(join, leave))
}

/// Joins a group as `member`, with data, for as long as the lease lives.
///
/// Joining again with the same lease answers 200 with the existing membership; a member id
/// that someone else holds answers 409.
#[utoipa::path(put, path = "/v1/groups/{group}/members/{member}", tag = "groups", extensions(("x-zkgate-served-by" = json!({"any": "body"}))),
    params(("group" = String, Path, description = "Group name"), ("member" = String, Path, description = "Member id, unique in the group"), GuardHeader),
    request_body(content = Option<JoinBody>, description = "Optional.", example = json!({"data": {"address": "10.0.0.7:8080"}})),
    responses(
        (status = 201, description = "Joined", body = Joined),
        (status = 200, description = "Already a member with this lease", body = Joined),
        Problems<(p::InvalidField, p::MalformedBody, p::ValueTooLarge, p::NotFound, p::MemberTaken, p::LeaseEnded, p::QuotaExceeded, p::ZookeeperUnavailable)>,
    ))]
pub async fn join(
    State(state): State<AppState>,
    caller: Caller,
    Guarded(guards): Guarded,
    ApiPath((group, member)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<Option<JoinBody>>,
) -> Result<Response, ApiError> {
    let (joined, made) = groups::join(&state, (&caller, &guards), (&group, &member), body).await?;
    let status = if made { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(joined)).into_response())
}

/// Leaves a group (a member joined through zkgate, through any instance).
#[utoipa::path(operation_id = "leave_group", delete, path = "/v1/groups/{group}/members/{member}", tag = "groups",
    params(("group" = String, Path, description = "Group name"), ("member" = String, Path, description = "Member id"), GuardHeader),
    responses(
        (status = 204, description = "Left the group"),
        Problems<(p::InvalidField, p::NotFound)>,
    ))]
pub async fn leave(
    State(state): State<AppState>,
    caller: Caller,
    Guarded(guards): Guarded,
    ApiPath((group, member)): ApiPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    groups::leave(&state, (&caller, &guards), (&group, &member)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Lists a group's live members. With `wait`, blocks until membership differs from `index`
/// (from a previous answer; without it, until the next change) or the wait ends, then answers
/// with the current members.
#[utoipa::path(get, path = "/v1/groups/{group}", tag = "groups",
    params(("group" = String, Path, description = "Group name"), GroupQuery),
    responses(
        (status = 200, description = "The live members (none for a group nobody joined)", body = GroupState),
        Problems<(p::InvalidField, p::ZookeeperUnavailable)>,
    ))]
pub async fn members(
    State(state): State<AppState>,
    ApiPath(group): ApiPath<String>,
    ApiQuery(query): ApiQuery<GroupQuery>,
    consistency: Consistency,
) -> Result<Json<GroupState>, ApiError> {
    check_name(&group)?;
    let wait = query.wait.map(|w| (w.0, query.index));
    Ok(Json(groups::members(&state, &group, wait, consistency).await?))
}

/// Lists the groups that exist in ZooKeeper, with their number of members.
#[utoipa::path(get, path = "/v1/groups", tag = "groups", params(crate::http::paging::PageQuery), responses(
    (status = 200, description = "A page of the groups, in order (`Link` gives the next page while more follow)", body = Vec<GroupSummary>, headers(("Link" = String, description = "While more entries follow: the next page, `<url>; rel=\"next\"`"))),
    Problems<(p::ZookeeperUnavailable,)>,
))]
pub async fn list_groups(
    State(state): State<AppState>,
    caller: Caller,
    consistency: Consistency,
    paging: crate::http::paging::Paging,
) -> Result<crate::http::paging::Page<GroupSummary>, ApiError> {
    let names = state.readable(&caller, Kind::Group, consistency).await?;
    Ok(paging
        .page(names, |(group, _)| group.clone())
        .map(|(group, members)| GroupSummary { group, members }))
}
