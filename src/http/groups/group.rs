//! `/v1/groups`: group membership: join with data (lease-bound), leave, list the live members,
//! and a blocking read that returns when membership changes.

use crate::http::guards::{GuardHeader, Guarded};
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::AppState;
use crate::auth::Caller;
use crate::events::Feed;
use crate::http::consistency::Consistency;
use crate::http::error::{ApiError, Place, Problem, Problems, p};
use crate::http::extract::{ApiJson, ApiPath, ApiQuery};
use crate::http::{Followed, Resource, check_name, readable};
use crate::kind::Kind;
use crate::recipes::groups::{self, group::GroupState, group::GroupTopic};
use crate::recipes::leases::LeaseView;
use crate::recipes::nodes::{self, NodeHolding};
use crate::recipes::validate_name;
use crate::time::{HumanDuration, timestamp};

/// The group kind's module.
pub const RESOURCE: Resource = Resource {
    kind: Kind::Group,
    about: Some("Group membership: lease-bound members with data, and a blocking read of changes."),
    routes,
    topic: Some(Followed {
        feed: |state, name| Feed::of(source(state, name)),
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

/// Group `name` as its topic and `GET` read it.
fn source(state: &AppState, name: &str) -> GroupTopic {
    groups::group_topic(state, name)
}

/// Body of a join (optional).
#[derive(Deserialize, utoipa::ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct JoinBody {
    /// The lease to join with. Without it a new lease is created and returned.
    pub lease: Option<String>,
    /// TTL of the lease created when `lease` is not given.
    pub ttl: Option<HumanDuration>,
    /// The member's data (any JSON), shown to everyone who lists the group.
    #[schema(example = json!({"address": "10.0.0.7:8080"}))]
    pub data: Option<serde_json::Value>,
}

/// A member as it joined.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Joined {
    #[schema(example = "workers")]
    pub group: String,
    #[schema(example = "worker-7")]
    pub member: String,
    #[schema(format = DateTime)]
    pub joined_at: String,
    /// The lease the membership lasts with.
    pub lease: LeaseView,
}

/// Query of a group read.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct GroupQuery {
    /// Wait (up to this long, capped by the server's maximum) for membership to differ from
    /// `index`, or without it for the next change.
    #[param(value_type = Option<String>, example = "30s")]
    pub wait: Option<HumanDuration>,
    /// The `index` of a previous answer.
    pub index: Option<i64>,
}

/// A group in the list.
#[derive(Serialize, utoipa::ToSchema)]
pub struct GroupSummary {
    #[schema(example = "workers")]
    pub group: String,
    pub members: i32,
}

fn names(group: &str, member: Option<&str>) -> Result<(), ApiError> {
    check_name(group)?;
    if let Some(member) = member {
        validate_name(member).map_err(|e| ApiError::invalid(Place::Path, "member", e))?;
    }
    Ok(())
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
    names(&group, Some(&member))?;
    let body = body.unwrap_or_default();
    let data = serde_json::to_vec(&body.data.unwrap_or(serde_json::Value::Null)).unwrap_or_default();
    state.check_stored_size("member's data", data.len())?;
    // The member's data is charged to the caller, on the member's session.
    let (lease, ttl) = (body.lease, body.ttl.map(|t| t.0));
    let at = (group.as_str(), member.as_str());
    let member_taken = || taken(&group, &member);
    let (node, made) = nodes::join(
        &state,
        (&caller, &guards),
        &state.groups,
        at,
        (lease, ttl),
        |_| Ok(data),
        member_taken,
    )
    .await?;
    let status = if made { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(joined(&node))).into_response())
}

fn joined(member: &NodeHolding) -> Joined {
    Joined {
        group: member.name.clone(),
        member: member.id.clone(),
        joined_at: timestamp(member.created_at),
        lease: LeaseView::of(&member.lease),
    }
}

fn taken(group: &str, member: &str) -> ApiError {
    ApiError::new(
        Problem::MemberTaken,
        format!("`{member}` is already a member of `{group}`"),
    )
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
    names(&group, Some(&member))?;
    let gone = || {
        ApiError::not_found(
            "member",
            format!("no member `{member}` of `{group}` joined through zkgate"),
        )
    };
    let path = state.groups.node(&group, &member);
    nodes::unbind(
        &state,
        (&caller, &guards),
        &state.groups,
        (&group, &member),
        &path,
        gone,
    )
    .await?;
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
    names(&group, None)?;
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
    let names = readable(&state, &caller, Kind::Group, consistency).await?;
    Ok(paging
        .page(names, |(group, _)| group.clone())
        .map(|(group, members)| GroupSummary { group, members }))
}
