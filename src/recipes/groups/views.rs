//! The group family's operations as the API takes and answers them: a join and a leave, a
//! registration and its end, with their bodies and answers.

use serde::{Deserialize, Serialize};

use super::service::{CuratorInstance, Registrar, Strategy, UriSpecJson};
use crate::auth::Caller;
use crate::problem::{ApiError, Place, Problem};
use crate::recipes::guards::Guard;
use crate::recipes::leases::{Lease, LeaseView};
use crate::recipes::nodes::{self, NodeHolding};
use crate::recipes::{Recipes, check_name, validate_name};
use crate::time::{HumanDuration, timestamp};

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

/// Checks a group's name and a member's id.
fn check_member(group: &str, member: &str) -> Result<(), ApiError> {
    check_name(group)?;
    validate_name(member).map_err(|e| ApiError::invalid(Place::Path, "member", e))
}

impl Joined {
    fn of(member: &NodeHolding) -> Joined {
        Joined {
            group: member.name.clone(),
            member: member.id.clone(),
            joined_at: timestamp(member.created_at),
            lease: LeaseView::of(&member.lease),
        }
    }
}

fn member_taken(group: &str, member: &str) -> ApiError {
    ApiError::new(
        Problem::MemberTaken,
        format!("`{member}` is already a member of `{group}`"),
    )
}

/// Longest address accepted (a DNS name is at most 253 bytes).
pub const MAX_ADDRESS: usize = 253;

/// Body of a registration.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InstanceBody {
    /// Where the instance listens: a host name or an IP address.
    #[schema(example = "10.0.0.5", min_length = 1, max_length = 253)]
    pub address: String,
    #[schema(example = 8080, minimum = 0, maximum = 65535)]
    pub port: Option<u16>,
    #[schema(minimum = 0, maximum = 65535)]
    pub ssl_port: Option<u16>,
    /// Anything the instance publishes (JSON): a zone, a weight, a version...
    #[schema(example = json!({"zone": "eu-1"}))]
    pub payload: Option<serde_json::Value>,
    /// A URI template with `{scheme}`, `{address}`, `{port}`, `{ssl-port}`, `{name}`, `{id}`.
    #[schema(example = "{scheme}://{address}:{port}")]
    pub uri_spec: Option<String>,
    /// The lease the instance lives with. Without it a new lease is created and returned.
    pub lease: Option<String>,
    /// TTL of the lease created when `lease` is not given.
    pub ttl: Option<HumanDuration>,
}

/// An instance as it was registered.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Registered {
    #[schema(example = "billing")]
    pub service: String,
    #[schema(example = "billing-1")]
    pub id: String,
    #[schema(format = DateTime)]
    pub registered_at: String,
    /// The lease the registration lasts with.
    pub lease: LeaseView,
}

/// Query of a pick.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PickQuery {
    /// `random` (default) or `round-robin`.
    #[param(value_type = Option<Strategy>, example = "round-robin")]
    pub strategy: Option<Strategy>,
}

/// Checks a service's name and an instance's id.
pub fn check_instance(service: &str, id: &str) -> Result<(), ApiError> {
    check_name(service)?;
    validate_name(id).map_err(|e| ApiError::invalid(Place::Path, "id", e))
}

fn taken(service: &str, id: &str) -> ApiError {
    ApiError::new(
        Problem::MemberTaken,
        format!("instance `{id}` of `{service}` is registered by another lease or client"),
    )
}

impl Registered {
    fn of(node: &NodeHolding) -> Registered {
        Registered {
            service: node.name.clone(),
            id: node.id.clone(),
            registered_at: timestamp(node.created_at),
            lease: LeaseView::of(&node.lease),
        }
    }
}
/// Joins group `group` as `member` with the data of `body` for as long as its lease lives
/// (`true`: joined now; `false`: a member with this lease already).
pub async fn join(
    recipes: &Recipes,
    (caller, guards): (&Caller, &[Guard]),
    (group, member): (&str, &str),
    body: Option<JoinBody>,
) -> Result<(Joined, bool), ApiError> {
    check_member(group, member)?;
    let body = body.unwrap_or_default();
    let data = serde_json::to_vec(&body.data.unwrap_or(serde_json::Value::Null)).unwrap_or_default();
    recipes.check_stored_size("member's data", data.len())?;
    // The member's data is charged to the caller, on the member's session.
    let (lease, ttl) = (body.lease, body.ttl.map(|t| t.0));
    let (node, made) = nodes::join(
        recipes,
        (caller, guards),
        &recipes.groups,
        (group, member),
        (lease, ttl),
        |_| Ok(data),
        || member_taken(group, member),
    )
    .await?;
    Ok((Joined::of(&node), made))
}

/// `member` leaves group `group` (a member joined through zkgate, through any instance).
pub async fn leave(
    recipes: &Recipes,
    (caller, guards): (&Caller, &[Guard]),
    (group, member): (&str, &str),
) -> Result<(), ApiError> {
    check_member(group, member)?;
    let gone = || {
        ApiError::not_found(
            "member",
            format!("no member `{member}` of `{group}` joined through zkgate"),
        )
    };
    let path = recipes.groups.node(group, member);
    nodes::unbind(recipes, (caller, guards), &recipes.groups, (group, member), &path, gone).await
}

/// Registers instance `id` of `service` as `body` describes it, for as long as its lease lives
/// (`true`: registered now; `false`: registered with this lease already).
pub async fn register(
    recipes: &Recipes,
    (caller, guards): (&Caller, &[Guard]),
    (service, id): (&str, &str),
    body: InstanceBody,
) -> Result<(Registered, bool), ApiError> {
    check_instance(service, id)?;
    if body.address.is_empty()
        || body.address.chars().count() > MAX_ADDRESS
        || body.address.chars().any(char::is_control)
    {
        let detail = format!("must be 1 to {MAX_ADDRESS} characters, none of them control characters");
        return Err(ApiError::invalid(Place::Body, "address", detail));
    }
    let uri_spec = match &body.uri_spec {
        Some(template) => Some(UriSpecJson::parse(template).ok_or_else(|| {
            ApiError::invalid(Place::Body, "uri_spec", "must close every `{` it opens, around a name")
        })?),
        None => None,
    };
    let make = |lease: &Lease| {
        let instance = CuratorInstance {
            name: service.to_string(),
            id: id.to_string(),
            address: Some(body.address),
            port: body.port,
            ssl_port: body.ssl_port,
            payload: body.payload.unwrap_or(serde_json::Value::Null),
            registration_time_utc: crate::time::now_ms(),
            service_type: "DYNAMIC".into(),
            uri_spec,
            enabled: None,
            zkgate: Some(Registrar {
                lease: lease.id.clone(),
                principal: lease.principal.clone(),
            }),
        };
        let data = serde_json::to_vec(&instance).map_err(|e| ApiError::new(Problem::Internal, e.to_string()))?;
        recipes.check_stored_size("instance", data.len())?;
        Ok(data)
    };
    // Its data is charged to the caller, on the instance's session (as a group member's).
    let (lease, ttl) = (body.lease, body.ttl.map(|t| t.0));
    let at = (service, id);
    let id_taken = || taken(service, id);
    let (node, made) = nodes::join(
        recipes,
        (caller, guards),
        &recipes.services,
        at,
        (lease, ttl),
        make,
        id_taken,
    )
    .await?;
    if !made {
        return Ok((Registered::of(&node), false));
    }
    let m = crate::metrics::get();
    m.service_registrations
        .with_label_values(&[m.name(crate::metrics::SERVICE, service)])
        .inc();
    Ok((Registered::of(&node), true))
}

/// Unregisters instance `id` of `service` (registered through zkgate, through any instance: its
/// node records its lease).
pub async fn unregister(
    recipes: &Recipes,
    (caller, guards): (&Caller, &[Guard]),
    (service, id): (&str, &str),
) -> Result<(), ApiError> {
    check_instance(service, id)?;
    let gone = || {
        ApiError::not_found(
            "instance",
            format!("no instance `{id}` of `{service}` registered through zkgate"),
        )
    };
    let path = recipes.services.node(service, id);
    nodes::unbind(recipes, (caller, guards), &recipes.services, (service, id), &path, gone).await
}
