//! `/healthz` (the process answers) and `/readyz` (its primary ZooKeeper session is connected).
//!
//! Both are public (probes carry no token), so they say only `ok` to anyone but an admin: the
//! ZooKeeper servers and session ids are for operators (an admin's token, or auth off).

use crate::http::json::Json;
use axum::extract::State;
use serde::Serialize;

use super::error::{ApiError, Problems, p};
use crate::AppState;
use crate::auth::Caller;
use crate::recipes::Connection;

/// Health of this instance.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Health {
    /// `ok` when the answering check passed.
    #[schema(example = "ok")]
    pub status: &'static str,
    /// The instance's ZooKeeper sessions: shown to an admin (or with auth off) only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zookeeper: Option<ZooKeeperStatus>,
}

/// The instance's ZooKeeper session.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ZooKeeperStatus {
    pub connection: Connection,
    /// The servers (connect string without the chroot).
    #[schema(example = "127.0.0.1:2181")]
    pub servers: String,
    /// The session id in hex, when there is a session.
    #[schema(example = "0x1000a2c3e4f0001")]
    pub session_id: Option<String>,
    /// Incremented every time a new session replaces an expired one.
    pub session_generation: u64,
    /// The instance's ZooKeeper sessions (`--zookeeper-sessions`; leases are spread over
    /// them). The fields above are the primary's.
    #[schema(example = 4)]
    pub sessions: usize,
    /// How many of them are connected now.
    #[schema(example = 4)]
    pub sessions_connected: usize,
    /// Whether the servers enforce zkgate's quotas (`enforced`); `not_enforced` when they
    /// were started without `zookeeper.enforceQuota=true` (zkgate then checks them itself).
    #[schema(value_type = String, example = "enforced")]
    pub quotas: crate::recipes::usage::Enforcement,
}

fn health(state: &AppState, caller: &Caller, status: &'static str) -> Health {
    let zookeeper = caller.is_admin().then(|| {
        let (connection, session_id, generation) =
            state.zk().peek(|zk| (zk.connection, zk.session_id(), zk.generation));
        let lanes = state.lanes.all();
        ZooKeeperStatus {
            connection,
            servers: state.zk().hosts().to_string(),
            session_id: session_id.map(|id| format!("{id:#x}")),
            session_generation: generation,
            sessions: lanes.len(),
            sessions_connected: lanes.iter().filter(|lane| lane.peek(|zk| zk.is_connected())).count(),
            quotas: state.quotas.enforcement(),
        }
    });
    Health { status, zookeeper }
}

/// Liveness: the process serves HTTP.
#[utoipa::path(get, path = "/healthz", tag = "health", responses((status = 200, description = "The health of this instance and its ZooKeeper sessions", body = Health)))]
pub async fn healthz(State(state): State<AppState>, caller: Caller) -> Json<Health> {
    Json(health(&state, &caller, "ok"))
}

/// Readiness: the ZooKeeper session is connected, so recipe calls can be served, and this
/// instance's registration is in place (so other instances can hand requests to it), its
/// heartbeat is answered (it can keep leases), and the leases of instances gone before it are
/// taken over.
#[utoipa::path(get, path = "/readyz", tag = "health", responses(
    (status = 200, description = "The health of this instance and its ZooKeeper sessions", body = Health),
    Problems<(p::ZookeeperUnavailable,)>,
))]
pub async fn readyz(State(state): State<AppState>, caller: Caller) -> Result<Json<Health>, ApiError> {
    state.zk().current()?;
    if !state.instances.registered() {
        return Err(ApiError::unavailable(
            "this instance is not registered in ZooKeeper yet (other instances could not hand requests to it)",
        ));
    }
    if !state.leases.is_fresh() {
        return Err(ApiError::unavailable(
            "this instance's heartbeat is not answered yet: it cannot keep leases",
        ));
    }
    if !*state.reaped.borrow() {
        return Err(ApiError::unavailable(
            "the leases of instances that are gone are being taken over (or ended, if they expired meanwhile)",
        ));
    }
    Ok(Json(health(&state, &caller, "ok")))
}

/// Prometheus metrics in the text exposition format: lock waits and holds, queue traffic and
/// depth, elections, leases, sockets, ZooKeeper requests and session.
#[utoipa::path(get, path = "/metrics", tag = "health", responses(
    (status = 200, description = "Prometheus text format 0.0.4", body = String, content_type = "text/plain; version=0.0.4",
        example = "# HELP zkgate_leases Live leases of this instance.\n# TYPE zkgate_leases gauge\nzkgate_leases 3\n"),
))]
pub async fn metrics(State(state): State<AppState>) -> impl axum::response::IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        crate::metrics::render(&readings(&state).await),
    )
}

/// The gauges read at each scrape: the primary session, the instance's leases and topics,
/// and the queues' counts from ZooKeeper (none when it cannot be read now).
async fn readings(state: &AppState) -> crate::metrics::Readings {
    let status = state.zk().status();
    let queues = match state.zk().current() {
        Ok(session) => crate::recipes::queues::topic::counts(&session, state.queues.base())
            .await
            .ok(),
        Err(_) => None,
    };
    crate::metrics::Readings {
        zookeeper_connected: status.is_connected(),
        session_generation: status.generation,
        connections: status.connects,
        leases: state.leases.count(),
        topics: state.events.topics(),
        ws_queued_bytes: state.ws_budget.queued(),
        queues,
    }
}
