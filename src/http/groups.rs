//! `/v1/groups`: group membership: join with data (lease-bound), leave, list the live members,
//! and a blocking read that returns when membership changes.

use std::time::{Duration, UNIX_EPOCH};

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use zookeeper_client::{Client, Error as ZkError};

use super::contention::check_name;
use super::error::{ApiError, Place, Problem};
use super::extract::{ApiJson, ApiPath, ApiQuery};
use super::leases::LeaseView;
use super::timestamp;
use crate::AppState;
use crate::auth::Caller;
use crate::duration::HumanDuration;
use crate::recipes::ephemeral::{BindError, BoundNode};
use crate::zk::names::validate_name;
use crate::zk::retry_on_loss;

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
    pub joined_at: String,
    /// The lease the membership lasts with.
    pub lease: LeaseView,
}

/// A live member, as ZooKeeper has it.
#[derive(Serialize, utoipa::ToSchema)]
pub struct MemberView {
    #[schema(example = "worker-7")]
    pub id: String,
    /// Its data: JSON as given (`null` when none was), or the bytes as text for members
    /// created by other clients.
    pub data: serde_json::Value,
    pub joined_at: String,
}

/// A group's live members.
#[derive(Serialize, utoipa::ToSchema)]
pub struct GroupView {
    #[schema(example = "workers")]
    pub group: String,
    /// Changes whenever a member joins or leaves (the group znode's `pzxid`): pass it as
    /// `index` to wait for the next change.
    pub index: i64,
    /// Members sorted by id.
    pub members: Vec<MemberView>,
}

/// Query of a group read.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct GroupQuery {
    /// Wait (up to this long, capped by the server's maximum) for membership to differ from
    /// `index`. Needs `index`.
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
#[utoipa::path(put, path = "/v1/groups/{group}/members/{member}", tag = "groups",
    params(("group" = String, Path, description = "Group name"), ("member" = String, Path, description = "Member id, unique in the group")),
    request_body(content = Option<JoinBody>, description = "Optional.", example = json!({"data": {"address": "10.0.0.7:8080"}})),
    responses(
        (status = 201, description = "Joined", body = Joined),
        (status = 200, description = "Already a member with this lease", body = Joined),
        (status = 400, description = "Bad name or body", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such lease", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The member id is taken", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "The lease ended", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn join(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath((group, member)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<Option<JoinBody>>,
) -> Result<Response, ApiError> {
    names(&group, Some(&member))?;
    let body = body.unwrap_or_default();
    let data = serde_json::to_vec(&body.data.unwrap_or(serde_json::Value::Null)).unwrap_or_default();
    if let Some(existing) = state.groups.get(&group, &member) {
        if body.lease.as_deref() == Some(existing.lease.id.as_str()) {
            return Ok((StatusCode::OK, Json(joined(&existing))).into_response());
        }
        return Err(taken(&group, &member));
    }
    let lease = match (&body.lease, body.ttl) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                Place::Body,
                "ttl",
                "only applies when no `lease` is given",
            ));
        }
        (Some(id), None) => state.leases.get(&caller, id)?,
        (None, ttl) => {
            if ttl.is_some_and(|t| t.0.is_zero()) {
                return Err(ApiError::invalid(Place::Body, "ttl", "must be above zero"));
            }
            state.leases.create(&caller, ttl.map(|t| t.0), None)?
        }
    };
    let client = lease.session().await?;
    match state
        .groups
        .bind(&client, &state.groups.dir(&group), &group, &member, &data, &lease)
        .await
    {
        Ok(joined_member) => Ok((StatusCode::CREATED, Json(joined(&joined_member))).into_response()),
        Err(BindError::Taken) => Err(taken(&group, &member)),
        Err(BindError::LeaseEnded) => Err(state
            .leases
            .peek(&lease.id)
            .err()
            .map(ApiError::from)
            .unwrap_or_else(|| ApiError::gone("lease-ended", "Lease ended", "the lease ended while joining"))),
        Err(BindError::ZooKeeper(err)) => Err(err.into()),
    }
}

fn joined(member: &BoundNode) -> Joined {
    Joined {
        group: member.resource.clone(),
        member: member.id.clone(),
        joined_at: timestamp(member.created_at),
        lease: LeaseView::of(&member.lease),
    }
}

fn taken(group: &str, member: &str) -> ApiError {
    ApiError::conflict(
        "member-taken",
        "Member id taken",
        format!("`{member}` is already a member of `{group}`"),
    )
}

/// Leaves a group (a member joined through this instance).
#[utoipa::path(delete, path = "/v1/groups/{group}/members/{member}", tag = "groups",
    params(("group" = String, Path, description = "Group name"), ("member" = String, Path, description = "Member id")),
    responses(
        (status = 204, description = "Left the group"),
        (status = 400, description = "Bad name", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such member joined through this instance", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn leave(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath((group, member)): ApiPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    names(&group, Some(&member))?;
    let Some(joined) = state.groups.get(&group, &member) else {
        return Err(ApiError::not_found(
            "member",
            format!("no member `{member}` of `{group}` joined through this instance"),
        ));
    };
    joined.lease.check_owner(&caller)?;
    joined.remove().await;
    Ok(StatusCode::NO_CONTENT)
}

/// Lists a group's live members. With `index` (from a previous answer) and `wait`, blocks
/// until membership changes or the wait ends, then answers with the current members.
#[utoipa::path(get, path = "/v1/groups/{group}", tag = "groups",
    params(("group" = String, Path, description = "Group name"), GroupQuery),
    responses(
        (status = 200, description = "The live members (none for a group nobody joined)", body = GroupView),
        (status = 400, description = "Bad name or query", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn members(
    State(state): State<AppState>,
    ApiPath(group): ApiPath<String>,
    ApiQuery(query): ApiQuery<GroupQuery>,
) -> Result<Json<GroupView>, ApiError> {
    names(&group, None)?;
    if query.wait.is_some() && query.index.is_none() {
        return Err(ApiError::invalid(
            Place::Query,
            "wait",
            "needs `index` (from a previous answer) to wait for a change",
        ));
    }
    let client = state.zk().current()?.client;
    let dir = state.groups.dir(&group);
    if let (Some(index), Some(wait)) = (query.index, query.wait) {
        let wait = wait.0.min(state.config.max_wait);
        let _ = tokio::time::timeout(wait, wait_for_change(&client, &dir, index)).await;
    }
    read_group(&client, &dir, group).await.map(Json)
}

/// Returns once the group's membership index is not `index` (a children watch: no polling).
async fn wait_for_change(client: &Client, dir: &str, index: i64) -> Result<(), ZkError> {
    loop {
        match retry_on_loss(|| client.get_and_watch_children(dir)).await {
            Ok((_, stat, watcher)) => {
                if stat.pzxid != index {
                    return Ok(());
                }
                watcher.changed().await;
            }
            Err(ZkError::NoNode) => {
                let (stat, watcher) = retry_on_loss(|| client.check_and_watch_stat(dir)).await?;
                if stat.is_some() {
                    continue;
                }
                if index != 0 {
                    return Ok(());
                }
                watcher.changed().await;
            }
            Err(err) => return Err(err),
        }
    }
}

async fn read_group(client: &Client, dir: &str, group: String) -> Result<GroupView, ApiError> {
    let (mut ids, stat) = match retry_on_loss(|| client.get_children(dir)).await {
        Ok(read) => read,
        Err(ZkError::NoNode) => {
            return Ok(GroupView {
                group,
                index: 0,
                members: Vec::new(),
            });
        }
        Err(err) => return Err(err.into()),
    };
    ids.sort();
    let members = crate::zk::read_each(client, dir, ids)
        .await?
        .into_iter()
        .map(|(id, data, stat)| {
            let data = serde_json::from_slice(&data)
                .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&data).into()));
            let joined = UNIX_EPOCH + Duration::from_millis(stat.ctime.max(0) as u64);
            MemberView {
                id,
                data,
                joined_at: timestamp(joined),
            }
        })
        .collect();
    Ok(GroupView {
        group,
        index: stat.pzxid,
        members,
    })
}

/// Lists the groups that exist in ZooKeeper, with their number of members.
#[utoipa::path(get, path = "/v1/groups", tag = "groups", responses(
    (status = 200, body = Vec<GroupSummary>),
    (status = 503, description = "ZooKeeper unreachable", body = Problem, content_type = "application/problem+json"),
))]
pub async fn list_groups(State(state): State<AppState>, caller: Caller) -> Result<Json<Vec<GroupSummary>>, ApiError> {
    let client = state.zk().current()?.client;
    let names = super::contention::readable_names(
        &caller,
        state.groups.base(),
        crate::recipes::contender::read_names(&client, state.groups.base()).await?,
    );
    Ok(Json(
        names
            .into_iter()
            .map(|(group, members)| GroupSummary { group, members })
            .collect(),
    ))
}
