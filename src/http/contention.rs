//! What the lock-like resources share over HTTP (exclusive locks, read/write locks): the
//! long-poll acquire, the handle views, the release, and the contender views of a resource.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::error::{ApiError, Place};
use super::leases::LeaseView;
use super::{millis_since, timestamp};
use crate::AppState;
use crate::auth::Caller;
use crate::duration::HumanDuration;
use crate::lease::{EndReason, Lease};
use crate::recipes::contender::{Contender, ContenderRecord, Contenders, Next, Phase, Refused, Role, read_contenders};
use crate::recipes::revocation::{self, Revocation};
use crate::zk::names::validate_name;

/// How long an acquire waits for ZooKeeper to create the contender and answer the first
/// listing when the caller's own wait is shorter (a try-lock still needs that round trip).
const FIRST_DECISION_LIMIT: Duration = Duration::from_secs(10);

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
    pub held_since: Option<String>,
    /// The lease holding it; keep it alive with `POST /v1/leases/{id}/keepalive`.
    pub lease: LeaseView,
}

/// One contender, as ZooKeeper has it.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ContenderView {
    /// Znode name under the lock.
    pub node: String,
    /// ZooKeeper's sequence number: the queue order.
    pub sequence: u64,
    /// `read` or `write`, for a read/write lock.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<&'static str>,
    /// The znode's czxid: the fencing token of this contender once it holds the lock.
    pub fencing_token: i64,
    /// When the contender joined the queue.
    pub created_at: String,
    /// Milliseconds since it joined the queue (for a waiter: how long it has waited).
    pub age_ms: u64,
    /// For a holder, when it was granted, if this instance knows (its own contenders).
    pub held_since: Option<String>,
    /// For a holder, milliseconds held, if known.
    pub held_ms: Option<u64>,
    /// The zkgate lease of the contender, for zkgate's contenders.
    pub lease: Option<String>,
    /// Who created it: `zkgate`, `curator` or `kazoo` (by node name), or `other`.
    #[schema(example = "zkgate")]
    pub client: &'static str,
    /// Whether someone asked this holder to give the lock up.
    pub revocation_requested: bool,
    /// Who asked, why and when (for zkgate's holders; Curator's signal carries no record).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revocation: Option<Revocation>,
}

/// A resource in a list.
#[derive(Serialize, utoipa::ToSchema)]
pub struct LockSummary {
    #[schema(example = "orders")]
    pub name: String,
    /// Holders plus waiters.
    pub contenders: i32,
}

/// The `GET /v1/<recipe>` listing shared by every recipe kept as one directory per name: each
/// name under `base` with its number of children (contenders, members, items).
pub async fn list_summaries(state: &AppState, caller: &Caller, base: &str) -> Result<Json<Vec<LockSummary>>, ApiError> {
    let client = state.zk().current()?.client;
    let names = readable_names(
        caller,
        base,
        crate::recipes::contender::read_names(&client, base).await?,
    );
    Ok(Json(
        names
            .into_iter()
            .map(|(name, contenders)| LockSummary { name, contenders })
            .collect(),
    ))
}

/// The names under `base` (`<root>/<kind>`) that the caller may read.
pub fn readable_names<T>(caller: &Caller, base: &str, names: Vec<(String, T)>) -> Vec<(String, T)> {
    let kind = base.rsplit('/').next().unwrap_or_default();
    names
        .into_iter()
        .filter(|(name, _)| caller.may(kind, name, crate::auth::Access::Read))
        .collect()
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
    pub held_since: Option<String>,
    /// Why it was lost or failed.
    pub reason: Option<String>,
    /// Someone asked the holder to give the lock up: release it when ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revocation: Option<Revocation>,
}

/// `read` / `write` for the roles of a read/write lock.
pub fn mode_of(role: Role) -> Option<&'static str> {
    match role {
        Role::Exclusive => None,
        Role::Read => Some("read"),
        Role::Write => Some("write"),
        Role::Candidate => None,
    }
}

pub fn check_name(name: &str) -> Result<(), ApiError> {
    validate_name(name).map_err(|e| ApiError::invalid(Place::Path, "name", e))
}

/// One acquire (or campaign) request, after parsing.
pub struct Request<'a> {
    pub caller: &'a Caller,
    pub name: &'a str,
    pub role: Role,
    /// The wait asked for (`None`: the server's maximum).
    pub wait: Option<Duration>,
    /// Stay queued when the wait ends without a grant.
    pub keep_queued: bool,
    pub lease: Option<String>,
    pub ttl: Option<Duration>,
    /// The value a new contender publishes (an election candidate's).
    pub value: Option<serde_json::Value>,
}

/// What a request came to: granted, or (asked to stay) still queued.
pub struct Contention {
    pub contender: Arc<Contender>,
    pub lease: Arc<Lease>,
    pub granted: bool,
}

/// The acquire long poll for `request.role` at resource `request.name` of `registry`.
pub async fn contend(state: &AppState, registry: &Contenders, request: Request<'_>) -> Result<Contention, ApiError> {
    let name = request.name;
    check_name(name)?;
    let wait = state.config.wait(request.wait);
    let caller = request.caller;
    let (lease, own_lease) = lease_for(state, caller, request.lease, request.ttl)?;
    if let Err(refused) = check_waiter_limits(state, registry, &lease, name) {
        if own_lease {
            let _ = state.leases.end(caller, &lease.id, EndReason::Deleted).await;
        }
        return Err(refused);
    }
    let contender = match registry.contend(&lease, name, request.role, request.value) {
        Ok((contender, _new)) => contender,
        Err(Refused::LeaseEnded) => return Err(lease_gone(state, &lease)),
        Err(Refused::OtherRole(existing)) => return Err(other_role(name, &existing, request.role)),
    };
    let outcome = wait_for_grant(&contender, wait).await;
    if matches!(outcome, Phase::Waiting { .. }) {
        crate::metrics::get()
            .lock_timeouts
            .with_label_values(&[request.role.kind(), name])
            .inc();
    }
    match outcome {
        Phase::Held { .. } => Ok(Contention {
            contender,
            lease,
            granted: true,
        }),
        Phase::Waiting { .. } if request.keep_queued => Ok(Contention {
            contender,
            lease,
            granted: false,
        }),
        Phase::Waiting { position } => {
            give_up(state, registry, &contender, own_lease).await;
            Err(ApiError::not_acquired(format!(
                "`{name}` was not granted within {}; the request left the queue (it was at position {position})",
                humantime::format_duration(wait)
            ))
            .with("position", position)
            .with("queued", false))
        }
        Phase::Pending => {
            give_up(state, registry, &contender, own_lease).await;
            Err(ApiError::unavailable(
                "ZooKeeper did not answer in time; the request left the queue",
            ))
        }
        Phase::Lost { reason } => Err(match state.leases.peek(&lease.id) {
            Err(lease_err) => ApiError::from(lease_err),
            Ok(_) => ApiError::gone(
                "lock-lost",
                "Lock lost",
                format!("the contender for `{name}` was lost: {reason}"),
            ),
        }),
        Phase::Failed { error } => {
            give_up(state, registry, &contender, own_lease).await;
            Err(ApiError::from(error))
        }
        Phase::Released => Err(lease_gone(state, &lease)),
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
    let request = Request {
        caller,
        name,
        role,
        wait: params.wait.map(|w| w.0),
        keep_queued: params.keep_queued == Some(true),
        lease: body.lease,
        ttl: body.ttl.map(|t| t.0),
        value: None,
    };
    let outcome = contend(state, registry, request).await?;
    let status = if outcome.granted {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, Json(acquisition(&outcome.contender, &outcome.lease))).into_response())
}

/// Refuses (429) a new contender beyond the waiters allowed per lock or per principal on this
/// instance; a retry by a lease that already contends is never refused.
fn check_waiter_limits(state: &AppState, registry: &Contenders, lease: &Lease, name: &str) -> Result<(), ApiError> {
    if registry.contends(lease, name) {
        return Ok(());
    }
    let settings = state.limits.settings;
    let retry = Duration::from_secs(1);
    if registry.queued(|c| c.name == name) >= settings.waiters_per_lock {
        return Err(crate::limits::refusal(
            "too-many",
            format!(
                "at most {} contenders may wait for `{name}` on this instance",
                settings.waiters_per_lock
            ),
            retry,
        )
        .into());
    }
    let mine: usize = [&state.locks, &state.rwlocks, &state.elections]
        .iter()
        .map(|r| r.queued(|c| c.lease.owner == lease.owner))
        .sum();
    if mine >= settings.waiters_per_principal {
        return Err(crate::limits::refusal(
            "too-many",
            format!(
                "at most {} waiting contenders per principal on this instance",
                settings.waiters_per_principal
            ),
            retry,
        )
        .into());
    }
    Ok(())
}

/// The lease a request names, or a new one (with `ttl`) when it names none; the flag says
/// whether it was made for this request (and should go if the request comes to nothing).
pub fn lease_for(
    state: &AppState,
    caller: &Caller,
    lease: Option<String>,
    ttl: Option<Duration>,
) -> Result<(Arc<Lease>, bool), ApiError> {
    match (lease, ttl) {
        (Some(_), Some(_)) => Err(ApiError::invalid(
            Place::Body,
            "ttl",
            "only applies when no `lease` is given",
        )),
        (Some(id), None) => Ok((state.leases.get(caller, &id)?, false)),
        (None, ttl) => {
            if ttl.is_some_and(|t| t.is_zero()) {
                return Err(ApiError::invalid(Place::Body, "ttl", "must be above zero"));
            }
            Ok((state.leases.create(caller, ttl, None)?, true))
        }
    }
}

/// The error for a request whose lease ended while it was served.
pub fn lease_gone(state: &AppState, lease: &Lease) -> ApiError {
    state
        .leases
        .peek(&lease.id)
        .err()
        .map(ApiError::from)
        .unwrap_or_else(|| ApiError::not_acquired("the contender was released while it waited"))
}

/// A lease that reads asks to write (or the other way round): refused, because two readers
/// upgrading at once would wait for each other forever.
fn other_role(name: &str, existing: &Contender, asked: Role) -> ApiError {
    let (has, wants) = (mode_of(existing.role).unwrap_or("?"), mode_of(asked).unwrap_or("?"));
    ApiError::conflict(
        "mode-change-refused",
        "Lock mode change refused",
        format!(
            "this lease already has a {has} contender on `{name}` (handle `{}`); release it before asking to {wants}: \
             upgrading a read lock in place would deadlock two readers doing the same",
            existing.handle
        ),
    )
    .with("handle", &existing.handle)
    .with("mode", has)
}

/// Waits for the contender's first decision (bounded by [FIRST_DECISION_LIMIT] even for a
/// try-lock), then for a grant or a final phase until `wait` has passed since the start.
async fn wait_for_grant(contender: &Contender, wait: Duration) -> Phase {
    let deadline = Instant::now() + wait;
    let mut updates = contender.subscribe();
    let first = deadline.max(Instant::now() + FIRST_DECISION_LIMIT);
    let _ = tokio::time::timeout_at(first, updates.wait_for(|s| s.phase != Phase::Pending)).await;
    let granted_or_done = updates.wait_for(|s| matches!(s.phase, Phase::Held { .. }) || s.phase.is_final());
    let _ = tokio::time::timeout_at(deadline, granted_or_done).await;
    contender.state().phase
}

/// Leaves the queue; a lease made just for this request goes too.
async fn give_up(state: &AppState, registry: &Contenders, contender: &Arc<Contender>, own_lease: bool) {
    registry.release(contender).await;
    if own_lease {
        let _ = state
            .leases
            .end(&Caller::Anyone, &contender.lease.id, EndReason::Deleted)
            .await;
    }
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
        mode: mode_of(contender.role),
        acquired,
        handle: contender.handle.clone(),
        fencing_token: current.fencing_token(),
        position,
        node: current.node.map(|n| n.name),
        held_since,
        lease: LeaseView::of(lease),
    }
}

/// The view of a contender read from ZooKeeper; `held_since` when this instance knows it.
pub fn contender_view(
    record: ContenderRecord,
    mode: Option<&'static str>,
    registry_local: Option<&Contender>,
) -> ContenderView {
    let held_since = registry_local.and_then(|c| match c.state().phase {
        Phase::Held { since } => Some(since),
        _ => None,
    });
    let created = UNIX_EPOCH + Duration::from_millis(record.ctime.max(0) as u64);
    let lease = serde_json::from_slice::<serde_json::Value>(&record.data)
        .ok()
        .and_then(|v| v.get("lease").and_then(|l| l.as_str()).map(str::to_string));
    let client = if lease.is_some() {
        "zkgate"
    } else if record.name.starts_with("_c_") {
        "curator"
    } else if record.name.contains("__lock__") || record.name.contains("__rlock__") {
        "kazoo"
    } else {
        "other"
    };
    let revocation = revocation::record_in(&record.data);
    let revocation_requested = revocation.is_some() || record.data == revocation::CURATOR_REVOKE;
    ContenderView {
        revocation_requested,
        revocation,
        node: record.name,
        sequence: record.sequence,
        mode,
        fencing_token: record.czxid,
        created_at: timestamp(created),
        age_ms: millis_since(created),
        held_since: held_since.map(timestamp),
        held_ms: held_since.map(millis_since),
        lease,
        client,
    }
}

/// The contender with this handle at `name`, or 404.
pub fn find_handle(
    registry: &Contenders,
    caller: &Caller,
    name: &str,
    handle: &str,
) -> Result<Arc<Contender>, ApiError> {
    check_name(name)?;
    let contender = registry.by_handle(name, handle).ok_or_else(|| {
        ApiError::not_found(
            "handle",
            format!("no handle `{handle}` for lock `{name}` on this instance"),
        )
    })?;
    contender.lease.check_owner(caller)?;
    Ok(contender)
}

/// Where a handle stands. A waiter's position is read afresh: it watches only the node right
/// before it, so its own record of the queue ahead is as old as that node.
pub async fn handle_view(state: &AppState, registry: &Contenders, contender: &Contender) -> HandleView {
    let current = contender.state();
    let (position, held_since, reason) = match &current.phase {
        Phase::Waiting { position } => (
            Some(fresh_position(state, registry, contender).await.unwrap_or(*position)),
            None,
            None,
        ),
        Phase::Held { since } => (None, Some(timestamp(*since)), None),
        Phase::Lost { reason } => (None, None, Some(reason.clone())),
        Phase::Failed { error } => (None, None, Some(error.to_string())),
        Phase::Pending | Phase::Released => (None, None, None),
    };
    HandleView {
        lock: contender.name.clone(),
        mode: mode_of(contender.role),
        handle: contender.handle.clone(),
        lease: contender.lease.id.clone(),
        state: current.phase.name(),
        position,
        fencing_token: current.fencing_token(),
        node: current.node.map(|n| n.name),
        held_since,
        reason,
        revocation: current.revocation,
    }
}

/// Releases a handle; 410 if the lock had been lost before.
pub async fn release(registry: &Contenders, contender: &Arc<Contender>) -> Result<StatusCode, ApiError> {
    registry.release(contender).await;
    match contender.state().phase {
        Phase::Lost { reason } => Err(ApiError::gone(
            "lock-lost",
            "Lock lost",
            format!("lock `{}` had been lost before this release: {reason}", contender.name),
        )),
        _ => Ok(StatusCode::NO_CONTENT),
    }
}

async fn fresh_position(state: &AppState, registry: &Contenders, contender: &Contender) -> Option<usize> {
    let node = contender.state().node?;
    let client = state.zk().current().ok()?.client;
    let children = client.list_children(&registry.dir(&contender.name)).await.ok()?;
    match contender.role.next_step(&children, &node.name) {
        Next::Wait { position, .. } => Some(position),
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

/// Waits for what [HandleQuery::wait] describes.
pub async fn wait_for_news(state: &AppState, contender: &Contender, wait: Option<HumanDuration>) {
    let Some(wait) = wait else { return };
    let was_held = matches!(contender.state().phase, Phase::Held { .. });
    let mut updates = contender.subscribe();
    let news = updates.wait_for(|s| {
        s.revocation.is_some() || s.phase.is_final() || (!was_held && matches!(s.phase, Phase::Held { .. }))
    });
    let _ = tokio::time::timeout(wait.0.min(state.config.max_wait), news).await;
}

/// Body of a revocation request.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RevokeBody {
    /// Who asks (recorded).
    #[schema(example = "ops@example.com")]
    pub by: String,
    /// Why (recorded, shown to the holder).
    #[schema(example = "deploy in progress")]
    pub reason: String,
    /// After this long zkgate deletes the holder's node itself (the holder loses the lock).
    /// Without it, the holder releases when it is ready.
    pub grace: Option<HumanDuration>,
    /// Revoke only this contender node (default: every current holder).
    pub node: Option<String>,
}

/// The revocations made.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Revoked {
    pub revocations: Vec<Revocation>,
}

/// Longest `by` or `reason` accepted.
const MAX_TEXT: usize = 500;

/// Asks the holders of `name` (or the one `node`) to give the lock up; `role_of` tells a
/// node's role from its name (reader or writer), which decides who holds.
pub async fn revoke(
    state: &AppState,
    caller: &Caller,
    registry: &Contenders,
    kind: &str,
    name: &str,
    role_of: fn(&str) -> Role,
    body: RevokeBody,
) -> Result<Response, ApiError> {
    check_name(name)?;
    for (field, text) in [("by", &body.by), ("reason", &body.reason)] {
        if text.trim().is_empty() || text.len() > MAX_TEXT {
            return Err(ApiError::invalid(
                Place::Body,
                field,
                format!("must be 1 to {MAX_TEXT} bytes"),
            ));
        }
    }
    let client = state.zk().connected().await?.client;
    let dir = registry.dir(name);
    let records = read_contenders(&client, &dir).await?.unwrap_or_default();
    let children: Vec<String> = records.iter().map(|r| r.name.clone()).collect();
    let targets: Vec<&ContenderRecord> = match &body.node {
        Some(node) => match records.iter().find(|r| &r.name == node) {
            Some(record) => vec![record],
            None => {
                return Err(ApiError::not_found(
                    "node",
                    format!("`{node}` is not a contender of `{name}`"),
                ));
            }
        },
        None => records
            .iter()
            .filter(|r| role_of(&r.name).next_step(&children, &r.name) == Next::Hold)
            .collect(),
    };
    if targets.is_empty() {
        return Err(ApiError::conflict(
            "nothing-to-revoke",
            "Nothing to revoke",
            format!("`{name}` has no holder"),
        ));
    }
    // Only the holder's own principal, or an admin, may take it back (Curator's and kazoo's
    // holders have no principal: admins only).
    for target in &targets {
        let owner = serde_json::from_slice::<serde_json::Value>(&target.data)
            .ok()
            .and_then(|data| data.get("principal").and_then(|p| p.as_str()).map(str::to_string));
        caller.require_owner(owner.as_deref(), &format!("the holder `{}`", target.name))?;
    }
    let at_ms = std::time::SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as i64;
    let mut revocations = Vec::new();
    for target in targets {
        let record = Revocation {
            kind: kind.to_string(),
            lock: name.to_string(),
            node: target.name.clone(),
            by: body.by.clone(),
            reason: body.reason.clone(),
            at_ms,
            grace_ms: body.grace.map(|g| g.0.as_millis() as u64),
        };
        let path = format!("{dir}/{}", target.name);
        match revocation::signal(&client, &path, &record).await {
            Ok(_) => {}
            Err(zookeeper_client::Error::NoNode) => continue, // released meanwhile
            Err(err) => return Err(err.into()),
        }
        if let Some(grace) = body.grace {
            revocation::force_after(client.clone(), path, target.czxid, grace.0);
        }
        revocation::audit(&client, &format!("{}/revocations", state.config.root), &record).await?;
        tracing::info!(kind, lock = name, node = %record.node, by = %record.by, reason = %record.reason, "revocation requested");
        crate::metrics::get()
            .lock_revocations
            .with_label_values(&[kind, name])
            .inc();
        revocations.push(record);
    }
    Ok((StatusCode::ACCEPTED, Json(Revoked { revocations })).into_response())
}
