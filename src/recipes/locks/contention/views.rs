//! The lock family's words as the API says them: an acquire's query and body and its answer, a
//! handle as its holder reads it, a fencing check's answer, a revocation's body and answer.

use serde::{Deserialize, Serialize};

use super::{Contender, Contention, Granted, Phase, Recorded, Revocation, Seen, fresh_position};
use crate::recipes::Recipes;
use crate::recipes::leases::LeaseView;
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

impl Acquisition {
    /// What an acquire came to: granted, or still queued.
    pub fn of(granted: &Granted<Contention>) -> Acquisition {
        let contender = &granted.handle;
        let current = contender.state();
        let (position, held_since) = match current.phase {
            Phase::Held { since } => (0, Some(timestamp(since))),
            Phase::Waiting { position } => (position, None),
            _ => (0, None),
        };
        Acquisition {
            lock: contender.name.clone(),
            mode: contender.protocol.role.mode(),
            acquired: granted.granted,
            handle: contender.id.clone(),
            fencing_token: current.fencing_token(),
            position,
            node: current.node.map(|n| n.name),
            held_since,
            lease: LeaseView::of(&granted.lease),
        }
    }
}

/// A handle as this instance's memory or ZooKeeper shows it.
impl HandleView {
    /// A contender kept here. A waiter's position is read afresh ([fresh_position]).
    pub async fn here(recipes: &Recipes, contender: &Contender) -> HandleView {
        let current = contender.state();
        let (position, reason) = match &current.phase {
            Phase::Waiting { position } => (
                Some(fresh_position(recipes, contender).await.unwrap_or(*position)),
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

    /// A handle as [super::read_handle] saw it.
    pub async fn of(recipes: &Recipes, seen: Seen<Contention>) -> HandleView {
        match seen {
            Seen::Here(contender) => HandleView::here(recipes, &contender).await,
            Seen::There(recorded) => HandleView::there(&recorded),
        }
    }
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
