//! WebSocket endpoints.
//!
//! `GET /v1/ws` is the general socket. The client sends JSON messages, each with an `op` and
//! an `id` of its choosing; everything the server sends back about it carries that `id`:
//!
//! - `{"op":"subscribe","id":"s1","topic":{"election":"scheduler"}}` subscribes to a topic
//!   (see [Topic]); the first event is the topic's current `state`, then each change, with the
//!   topic's sequence number and, where there is one, the ZooKeeper zxid. After zkgate's
//!   ZooKeeper connection or session came back, or when this socket fell behind, a `resync`
//!   event (with a `reason`) carries the state instead of leaving a silent gap.
//!   `{"op":"unsubscribe","id":"s1"}` ends it.
//! - `{"op":"lease","id":"l1","ttl":"5s"}` creates a lease bound to the socket (or binds an
//!   existing one with `"attach":"<lease id>"`): the socket keeps it alive while the client
//!   answers pings; when the socket closes or goes quiet, the lease expires one TTL later
//!   and everything held with it is released.
//! - `{"op":"call","id":"c1","method":"POST","path":"/v1/locks/orders/acquire?wait=30s",
//!   "body":{"lease":"<lease id>"}}` runs any API request over the socket, with the same
//!   validation and errors as over HTTP; the answer is `{"op":"reply","id":"c1","status":200,
//!   "body":{...}}`, when it comes (long polls do not hold the socket up).
//!
//! A malformed message, an unknown topic, or too many subscriptions, calls or leases get an
//! `error` message (a problem `type` and `detail`); the socket stays open. The server pings
//! every `--ws-ping-interval`; a socket that sends nothing (not even a pong) for
//! `--ws-idle-timeout`, or whose messages cannot be written for that long, is closed with
//! code 4000.
//!
//! `GET /v1/elections/{name}/observe` is the simplest use: a socket that receives the
//! election's state as its first message and then one message per change (new leader with its
//! term, no leader, the leader's value acknowledged or changed, candidates joining or
//! leaving), each with the topic's sequence number.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::http::{HeaderName, HeaderValue, Method};
use axum::response::Response;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tower::ServiceExt;

use crate::AppState;
use crate::auth::{Access, Caller};
use crate::duration::HumanDuration;
use crate::events::{Event, Feed, Publisher, Subscription, sources};
use crate::http::error::ApiError;
use crate::http::extract::ApiPath;
use crate::lease::{Lease, LeaseError, Leases};
use crate::limits::{ClientAddr, Permit};
use crate::recipes::election::Leadership;
use crate::recipes::lock::LockTopic;
use crate::recipes::rwlock::RwLockTopic;
use crate::zk::names::validate_name;

/// Streams an election's leadership over a WebSocket.
///
/// Upgrade with `Connection: Upgrade` and `Upgrade: websocket`. The first message is the
/// election's state (`{"topic":"election:NAME","seq":1,"type":"state","state":{...}}`), then
/// one message per change: `leader` (a new leader, with its `term`), `no_leader`,
/// `leader_updated`, `candidates`, or `resync` (with a `reason`) when changes may have been
/// missed. The socket only listens.
#[utoipa::path(get, path = "/v1/elections/{name}/observe", tag = "websocket",
    params(("name" = String, Path, description = "Election name")),
    responses(
        (status = 101, description = "Switching to the WebSocket protocol; events follow as text messages"),
        (status = 400, description = "Bad name, or not a WebSocket upgrade", body = crate::http::error::Problem, content_type = "application/problem+json"),
        (status = 503, description = "ZooKeeper unreachable", body = crate::http::error::Problem, content_type = "application/problem+json"),
    ))]
pub async fn observe_election(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    address: Option<axum::Extension<ClientAddr>>,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    validate_name(&name).map_err(|e| ApiError::invalid(crate::http::error::Place::Path, "name", e))?;
    let upgrade = upgrade.map_err(not_a_websocket)?;
    state.zk().current()?;
    let permits = socket_permits(&state, &caller, address.map(|a| a.0))?;
    let topic = format!("election:{name}");
    let source = Leadership {
        dir: format!("{}/elections/{name}", state.config.root),
    };
    Ok(lean(upgrade).on_upgrade(move |socket| async move {
        let _permits = permits;
        let subscription = state.events.subscribe(&topic, source).await;
        stream(socket, subscription, state.shutdown.clone()).await;
    }))
}

/// Counts a socket or a subscription in its gauge while it lives.
struct Counted(&'static prometheus::IntGauge);

impl Counted {
    fn new(gauge: &'static prometheus::IntGauge) -> Counted {
        gauge.inc();
        Counted(gauge)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Sends the subscription's first state and then its events until either side goes.
async fn stream(mut socket: WebSocket, mut subscription: Subscription, shutdown: tokio_util::sync::CancellationToken) {
    let _counted = (
        Counted::new(&crate::metrics::get().sockets),
        Counted::new(&crate::metrics::get().subscriptions),
    );
    if send(&mut socket, &subscription.first).await.is_err() {
        return;
    }
    loop {
        tokio::select! {
            event = subscription.next() => {
                let Some(event) = event else { return };
                if send(&mut socket, &event).await.is_err() {
                    return;
                }
            }
            _ = shutdown.cancelled() => return going_away(&mut socket).await,
            incoming = socket.recv() => match incoming {
                // This socket only listens; pings are answered by the library.
                Some(Ok(Message::Close(_))) => return finish(&mut socket).await,
                Some(Err(_)) | None => return,
                Some(Ok(_)) => {}
            },
        }
    }
}

/// Closes a socket because the instance shuts down (code 1001, "going away").
async fn going_away(socket: &mut WebSocket) {
    let close = CloseFrame {
        code: 1001,
        reason: "zkgate is shutting down".into(),
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), socket.send(Message::Close(Some(close)))).await;
}

/// Completes the closing handshake the client began (bounded: the client may be gone).
async fn finish(socket: &mut WebSocket) {
    use futures::SinkExt;
    let _ = tokio::time::timeout(Duration::from_secs(1), socket.close()).await;
}

async fn send(socket: &mut WebSocket, event: &Event) -> Result<(), axum::Error> {
    let text = serde_json::to_string(event).unwrap_or_default();
    socket.send(Message::Text(text.into())).await
}

/// Most subscriptions one socket may hold.
pub const MAX_SUBSCRIPTIONS: usize = 64;

/// Most API calls one socket may have in flight.
pub const MAX_CALLS: usize = 32;

/// Most leases one socket may keep alive.
pub const MAX_LEASES: usize = 16;

/// The TTL of a socket-bound lease when the client does not ask for one: how long what it
/// holds outlives the socket.
pub const SOCKET_LEASE_TTL: Duration = Duration::from_secs(5);

/// The close code of a socket closed for silence or for not reading.
pub const IDLE_CLOSE_CODE: u16 = 4000;

/// The read buffer of a socket. tungstenite's default (128 KiB, allocated up front) would
/// make an idle socket cost ~150 KiB; clients send small messages, and a larger one still
/// arrives (the buffer grows for it).
const READ_BUFFER_BYTES: usize = 4 * 1024;

/// Sockets are flushed after each message anyway: no write buffer to fill first.
const WRITE_BUFFER_BYTES: usize = 0;

/// Sizes an upgrade's buffers for many mostly idle sockets.
fn lean(upgrade: WebSocketUpgrade) -> WebSocketUpgrade {
    upgrade
        // A browser that sends its token as the `zkgate.bearer.…` subprotocol also offers
        // `zkgate`, which is the one answered (never the one with the token).
        .protocols([crate::http::auth::SUBPROTOCOL])
        .read_buffer_size(READ_BUFFER_BYTES)
        .write_buffer_size(WRITE_BUFFER_BYTES)
}

/// Largest reply body relayed for a call.
const MAX_REPLY_BYTES: usize = 4 * 1024 * 1024;

/// What a client may send on `/v1/ws`.
#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum Request {
    Subscribe {
        id: String,
        topic: Topic,
    },
    Unsubscribe {
        id: String,
    },
    Lease {
        id: String,
        #[serde(default)]
        ttl: Option<HumanDuration>,
        #[serde(default)]
        attach: Option<String>,
    },
    Call {
        id: String,
        method: String,
        path: String,
        #[serde(default)]
        body: Option<Value>,
        #[serde(default)]
        headers: HashMap<String, String>,
    },
}

/// A topic to subscribe to: `{"<kind>": "<name>"}`, or `{"znode": {"path": ..., "watch": ...}}`.
#[derive(Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum Topic {
    /// An election's leadership: `leader` (with its term), `no_leader`, `leader_updated`,
    /// `candidates`.
    Election(String),
    /// An exclusive lock: `granted`, `released`, `lost`, `waiters`, `revocation`.
    Lock(String),
    /// A read/write lock: `granted`, `released`, `waiters`.
    Rwlock(String),
    /// A barrier: `raised`, `lowered`.
    Barrier(String),
    /// A double barrier: `participants`, `entered` (all are in), `left` (all are out).
    DoubleBarrier(String),
    /// A queue: `available`, `depth`, `dead_lettered`.
    Queue(String),
    /// A group: `joined`, `left`, `members`.
    Group(String),
    /// A two-phase commit transaction: `vote`, `decision`.
    Txn(String),
    /// A lease of this instance: `expiring` (a third of its TTL left), `ended` (deleted) or
    /// `lost` (expired, or its ZooKeeper session did).
    Lease(String),
    /// A znode under zkgate's root.
    Znode(ZnodeTopic),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ZnodeTopic {
    /// Relative to zkgate's root (`kv/app/flags`); empty for the root itself.
    path: String,
    #[serde(default)]
    watch: ZnodeWatch,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum ZnodeWatch {
    /// Its data: `created`, `changed`, `deleted`.
    #[default]
    Data,
    /// Its children: `children` (and `created`, `deleted` of the node itself).
    Children,
    /// Everything below it: `created`, `changed`, `deleted` with the node's `path`.
    Recursive,
}

/// Most segments of a znode topic's path.
const MAX_ZNODE_DEPTH: usize = 32;

impl Topic {
    /// The topic's name on the bus and what feeds it.
    fn resolve(self, state: &AppState, caller: &Caller) -> Result<(String, Feed), TopicError> {
        let root = state.config.root.as_str();
        let named = |kind: &str, name: &str| -> Result<String, TopicError> {
            validate_name(name).map_err(|e| format!("{kind} name {e}"))?;
            let plural = match kind {
                "double_barrier" => "double-barriers".to_string(),
                kind => format!("{kind}s"),
            };
            if kind != "lease" && !caller.may(&plural, name, Access::Read) {
                return Err(TopicError::Forbidden(format!("no read access to {plural} `{name}`")));
            }
            Ok(format!("{kind}:{name}"))
        };
        Ok(match self {
            Topic::Election(name) => (
                named("election", &name)?,
                Leadership {
                    dir: format!("{root}/elections/{name}"),
                }
                .into(),
            ),
            Topic::Lock(name) => (
                named("lock", &name)?,
                LockTopic {
                    dir: format!("{root}/locks/{name}"),
                    leases: state.leases.clone(),
                }
                .into(),
            ),
            Topic::Rwlock(name) => (
                named("rwlock", &name)?,
                RwLockTopic {
                    dir: format!("{root}/rwlocks/{name}"),
                }
                .into(),
            ),
            Topic::Barrier(name) => (
                named("barrier", &name)?,
                sources::Barrier {
                    parent: format!("{root}/barriers"),
                    name,
                }
                .into(),
            ),
            Topic::DoubleBarrier(name) => (
                named("double_barrier", &name)?,
                sources::DoubleBarrier {
                    dir: format!("{root}/double-barriers/{name}"),
                }
                .into(),
            ),
            Topic::Queue(name) => (
                named("queue", &name)?,
                sources::Queue {
                    dir: format!("{root}/queues/{name}"),
                }
                .into(),
            ),
            Topic::Group(name) => (
                named("group", &name)?,
                sources::Group {
                    dir: format!("{root}/groups/{name}"),
                }
                .into(),
            ),
            Topic::Txn(id) => (
                named("txn", &id)?,
                sources::Txn {
                    dir: format!("{root}/txns/{id}"),
                }
                .into(),
            ),
            Topic::Lease(id) => {
                let name = named("lease", &id)?;
                let lease = state.leases.get(caller, &id).map_err(|e| match e {
                    LeaseError::NotYours(_) => TopicError::Forbidden(e.to_string()),
                    e => TopicError::Invalid(e.to_string()),
                })?;
                (name, lease_feed(state.leases.clone(), lease))
            }
            Topic::Znode(ZnodeTopic { path, watch }) => {
                if path.starts_with('/') {
                    return Err(TopicError::from(format!(
                        "znode path `{path}` must be relative to zkgate's root ({root}), without a leading `/`"
                    )));
                }
                let relative = path.as_str();
                let segments: Vec<&str> = if relative.is_empty() {
                    Vec::new()
                } else {
                    relative.split('/').collect()
                };
                if segments.len() > MAX_ZNODE_DEPTH {
                    return Err(format!("znode path must have at most {MAX_ZNODE_DEPTH} segments").into());
                }
                for segment in &segments {
                    validate_name(segment).map_err(|e| format!("znode path segment `{segment}` {e}"))?;
                }
                if !may_read_znode(caller, &segments) {
                    return Err(TopicError::Forbidden(format!(
                        "no read access to the znode `{relative}`"
                    )));
                }
                let absolute = if relative.is_empty() {
                    root.to_string()
                } else {
                    format!("{root}/{relative}")
                };
                match watch {
                    ZnodeWatch::Data => (
                        format!("znode:data:{relative}"),
                        sources::ZnodeData { path: absolute }.into(),
                    ),
                    ZnodeWatch::Children => (
                        format!("znode:children:{relative}"),
                        sources::ZnodeChildren { path: absolute }.into(),
                    ),
                    ZnodeWatch::Recursive => (
                        format!("znode:recursive:{relative}"),
                        sources::recursive(absolute, root.to_string()),
                    ),
                }
            }
        })
    }
}

/// Why a topic cannot be subscribed to.
enum TopicError {
    Invalid(String),
    Forbidden(String),
}

impl From<String> for TopicError {
    fn from(detail: String) -> TopicError {
        TopicError::Invalid(detail)
    }
}

/// A znode under the root is readable by whoever may read the resource it belongs to
/// (`locks/orders/...` → lock `orders`, `kv/app/flags` → key `app/flags`); a kind's directory
/// (which lists every name) needs a grant on every name of that kind; the rest (the root
/// itself, `leases/`, the audit log) needs an admin.
fn may_read_znode(caller: &Caller, segments: &[&str]) -> bool {
    match segments {
        [kind, rest @ ..] if crate::kind::Kind::from_segment(kind).is_some() => {
            let name = match (*kind, rest) {
                ("kv", rest) => rest.join("/"),
                (_, [name, ..]) => name.to_string(),
                (_, []) => String::new(),
            };
            caller.may(kind, &name, Access::Read)
        }
        _ => caller.is_admin(),
    }
}

/// A lease's topic: its state (TTL, time left) now, `expiring` once a third of its TTL is
/// left without a keepalive, and how it ended. Timers, not polling: the task sleeps until the
/// time to warn, and wakes at once when the lease ends.
fn lease_feed(leases: Leases, lease: Arc<Lease>) -> Feed {
    Feed::Stream(Box::new(move |publisher| {
        Box::pin(follow_lease(publisher, leases, lease))
    }))
}

async fn follow_lease(publisher: Publisher, leases: Leases, lease: Arc<Lease>) {
    let live = |lease: &Lease| json!({ "ended": false, "ttl_ms": lease.ttl.as_millis() as u64, "remaining_ms": lease.remaining().as_millis() as u64 });
    publisher.publish("state", live(&lease), None);
    let warn_before = lease.ttl / 3;
    let mut warned = false;
    loop {
        let remaining = lease.remaining();
        let wake = if remaining > warn_before {
            warned = false;
            remaining - warn_before
        } else {
            if !warned {
                publisher.publish("expiring", live(&lease), None);
                warned = true;
            }
            // A keepalive moves the deadline: look again when it would have passed.
            remaining.max(Duration::from_millis(50))
        };
        tokio::select! {
            _ = tokio::time::sleep(wake) => {}
            _ = lease.ended().cancelled() => break,
            _ = publisher.idle() => return,
        }
    }
    let reason = match leases.peek(&lease.id) {
        Err(LeaseError::Ended { reason, .. }) => reason,
        _ => crate::lease::EndReason::Deleted,
    };
    let kind = if reason == crate::lease::EndReason::Deleted {
        "ended"
    } else {
        "lost"
    };
    publisher.publish(kind, json!({ "ended": true, "reason": reason }), None);
    publisher.idle().await;
}

/// The general WebSocket: subscriptions to topics, socket-bound leases, API calls.
///
/// Upgrade with `Connection: Upgrade` and `Upgrade: websocket`, then send JSON text messages:
///
/// - `{"op":"subscribe","id":"s1","topic":{"lock":"orders"}}`: topics `lock`, `rwlock`,
///   `election`, `barrier`, `double_barrier`, `queue`, `group`, `txn`, `lease` (each with a
///   name), and `{"znode":{"path":"kv/app","watch":"data|children|recursive"}}` (relative to
///   the root). Events: `{"op":"event","id":"s1","topic":...,"seq":N,"type":...,"zxid":...,
///   "state":{...}}`, the first of type `state`; `resync` (with a `reason`) replaces the
///   client's view when events may have been missed.
/// - `{"op":"unsubscribe","id":"s1"}`.
/// - `{"op":"lease","id":"l1","ttl":"5s"}` (or `"attach":"<lease id>"`): a lease kept alive
///   while the socket is; answered by `{"op":"lease","id":"l1","lease":{...}}`.
/// - `{"op":"call","id":"c1","method":"POST","path":"/v1/...","body":{...}}`: any API request;
///   answered by `{"op":"reply","id":"c1","status":200,"body":{...}}`.
///
/// Errors: `{"op":"error","id":...,"type":"urn:zkgate:problem:...","detail":...}`; the socket
/// stays open. Silent sockets are closed with code 4000.
#[utoipa::path(get, path = "/v1/ws", tag = "websocket",
    responses(
        (status = 101, description = "Switching to the WebSocket protocol"),
        (status = 400, description = "Not a WebSocket upgrade", body = crate::http::error::Problem, content_type = "application/problem+json"),
    ))]
pub async fn socket(
    State(state): State<AppState>,
    caller: Caller,
    address: Option<axum::Extension<ClientAddr>>,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let upgrade = upgrade.map_err(not_a_websocket)?;
    let address = address.map(|a| a.0);
    let permits = socket_permits(&state, &caller, address)?;
    // The socket outlives the handshake's request: it acts as the caller of the handshake.
    Ok(lean(upgrade).on_upgrade(move |socket| async move {
        let _permits = permits;
        serve_socket(state, caller, socket, address).await
    }))
}

/// The socket counted against its principal's and its address's limits (429 beyond them).
fn socket_permits(state: &AppState, caller: &Caller, address: Option<ClientAddr>) -> Result<Vec<Permit>, ApiError> {
    let settings = state.limits.settings;
    let mut permits = vec![state.limits.hold(
        format!("sockets of {}", crate::limits::client_key(caller, None)),
        settings.sockets_per_principal,
        "WebSockets per principal",
    )?];
    if let Some(ClientAddr(ip)) = address {
        permits.push(state.limits.hold(
            format!("sockets of {ip}"),
            settings.sockets_per_address,
            "WebSockets per address",
        )?);
    }
    Ok(permits)
}

/// A plain request to a socket endpoint: a problem document like every other error, not the
/// library's plain text.
fn not_a_websocket(rejection: WebSocketUpgradeRejection) -> ApiError {
    ApiError::new_status(
        axum::http::StatusCode::BAD_REQUEST,
        "not-a-websocket",
        "Not a WebSocket upgrade",
        format!(
            "this endpoint speaks WebSocket: send `Connection: Upgrade` and `Upgrade: websocket` ({})",
            rejection.body_text()
        ),
    )
}

/// One general socket's state.
struct Conn {
    state: AppState,
    /// The caller of the handshake: every subscription and call of the socket is its.
    caller: Caller,
    /// Messages for the client: events of the subscriptions and replies of calls.
    outbox: mpsc::Sender<String>,
    subscriptions: HashMap<String, JoinHandle<()>>,
    calls: JoinSet<()>,
    /// Leases this socket keeps alive.
    leases: Vec<Arc<Lease>>,
    /// The API, for calls; made on the first one.
    api: Option<Router>,
    /// Where the client connects from (for the per-address limits of its calls).
    address: Option<ClientAddr>,
}

async fn serve_socket(state: AppState, caller: Caller, mut socket: WebSocket, address: Option<ClientAddr>) {
    let _counted = Counted::new(&crate::metrics::get().sockets);
    let (idle_timeout, ping_interval) = (state.config.ws_idle_timeout, state.config.ws_ping_interval);
    let (outbox, mut queued) = mpsc::channel::<String>(state.config.ws_send_queue.max(1));
    let mut conn = Conn {
        state,
        caller,
        outbox,
        subscriptions: HashMap::new(),
        calls: JoinSet::new(),
        leases: Vec::new(),
        api: None,
        address,
    };
    let mut last_heard = Instant::now();
    let mut next_beat = Instant::now() + conn.beat(ping_interval);
    let shutdown = conn.state.shutdown.clone();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => {
                going_away(&mut socket).await;
                break;
            }
            incoming = socket.recv() => {
                last_heard = Instant::now();
                match incoming {
                    Some(Ok(Message::Text(text))) => {
                        if let Err(message) = conn.handle(&text).await
                            && !deliver(&mut socket, message, idle_timeout).await
                        {
                            break;
                        }
                        // A new lease may need keepalives sooner than the next beat.
                        next_beat = next_beat.min(Instant::now() + conn.beat(ping_interval));
                    }
                    Some(Ok(Message::Close(_))) => {
                        // The library queued the close reply: send it, so that the client
                        // sees a clean close rather than a dropped connection.
                        finish(&mut socket).await;
                        break;
                    }
                    Some(Err(_)) | None => break,
                    Some(Ok(_)) => {}
                }
            }
            Some(message) = queued.recv() => {
                if !deliver(&mut socket, message, idle_timeout).await {
                    break;
                }
            }
            _ = tokio::time::sleep_until(next_beat) => {
                if last_heard.elapsed() >= idle_timeout {
                    let close = CloseFrame { code: IDLE_CLOSE_CODE, reason: "idle timeout".into() };
                    let _ = tokio::time::timeout(Duration::from_secs(1), socket.send(Message::Close(Some(close)))).await;
                    break;
                }
                conn.keep_leases_alive(last_heard.elapsed());
                let ping = tokio::time::timeout(idle_timeout, socket.send(Message::Ping(Default::default()))).await;
                if !matches!(ping, Ok(Ok(()))) {
                    break;
                }
                next_beat = Instant::now() + conn.beat(ping_interval);
            }
        }
    }
    for (_, task) in conn.subscriptions.drain() {
        task.abort();
    }
    // Dropping the calls cancels them, as a closed HTTP connection does. The leases are no
    // longer kept alive: they expire one TTL from their last keepalive.
    conn.calls.abort_all();
}

/// Sends one message, giving up (and so closing the socket) if it cannot be written within
/// the idle timeout: a client that stopped reading must not hold a task forever.
async fn deliver(socket: &mut WebSocket, message: String, limit: Duration) -> bool {
    matches!(
        tokio::time::timeout(limit, socket.send(Message::Text(message.into()))).await,
        Ok(Ok(()))
    )
}

impl Conn {
    /// Time to the next heartbeat: the ping interval, or a third of the shortest bound lease's
    /// TTL if that is sooner.
    fn beat(&self, ping_interval: Duration) -> Duration {
        self.leases
            .iter()
            .map(|l| l.ttl / 3)
            .fold(ping_interval, Duration::min)
            .max(Duration::from_millis(100))
    }

    /// Keeps the bound leases alive if the client was heard from within their TTL; forgets
    /// the ones that ended.
    fn keep_leases_alive(&mut self, silent_for: Duration) {
        self.leases.retain(|lease| !lease.ended().is_cancelled());
        for lease in &self.leases {
            if silent_for < lease.ttl {
                let _ = self.state.leases.keepalive(&self.caller, &lease.id);
            }
        }
    }

    /// Handles one client message; an `Err` is the error message to send back.
    async fn handle(&mut self, text: &str) -> Result<(), String> {
        let request: Request =
            serde_json::from_str(text).map_err(|e| error_message(None, "malformed-message", &e.to_string()))?;
        match request {
            Request::Unsubscribe { id } => match self.subscriptions.remove(&id) {
                Some(task) => {
                    task.abort();
                    Ok(())
                }
                None => Err(error_message(
                    Some(&id),
                    "unknown-subscription",
                    "no subscription with this id",
                )),
            },
            Request::Subscribe { id, topic } => self.subscribe(id, topic).await,
            Request::Lease { id, ttl, attach } => self.lease(id, ttl.map(|t| t.0), attach),
            Request::Call {
                id,
                method,
                path,
                body,
                headers,
            } => self.call(id, &method, &path, body, headers),
        }
    }

    async fn subscribe(&mut self, id: String, topic: Topic) -> Result<(), String> {
        self.subscriptions.retain(|_, task| !task.is_finished());
        if self.subscriptions.contains_key(&id) {
            return Err(error_message(
                Some(&id),
                "duplicate-subscription",
                "a subscription with this id exists",
            ));
        }
        if self.subscriptions.len() >= MAX_SUBSCRIPTIONS {
            return Err(error_message(
                Some(&id),
                "too-many-subscriptions",
                &format!("at most {MAX_SUBSCRIPTIONS} per socket"),
            ));
        }
        let (name, feed) = topic.resolve(&self.state, &self.caller).map_err(|err| match err {
            TopicError::Invalid(detail) => error_message(Some(&id), "invalid-topic", &detail),
            TopicError::Forbidden(detail) => error_message(Some(&id), "forbidden", &detail),
        })?;
        let permit = self
            .state
            .limits
            .hold(
                format!("subscriptions of {}", crate::limits::client_key(&self.caller, None)),
                self.state.limits.settings.subscriptions_per_principal,
                "subscriptions per principal",
            )
            .map_err(|_| {
                error_message(
                    Some(&id),
                    "too-many",
                    &format!(
                        "at most {} subscriptions per principal",
                        self.state.limits.settings.subscriptions_per_principal
                    ),
                )
            })?;
        let subscription = self.state.events.subscribe(&name, feed).await;
        tracing::debug!(%id, topic = %name, "socket subscribed");
        let task = tokio::spawn(forward(id.clone(), subscription, self.outbox.clone(), permit));
        self.subscriptions.insert(id, task);
        Ok(())
    }

    fn lease(&mut self, id: String, ttl: Option<Duration>, attach: Option<String>) -> Result<(), String> {
        self.leases.retain(|lease| !lease.ended().is_cancelled());
        if self.leases.len() >= MAX_LEASES {
            return Err(error_message(
                Some(&id),
                "too-many-leases",
                &format!("at most {MAX_LEASES} per socket"),
            ));
        }
        if ttl.is_some_and(|t| t.is_zero()) {
            return Err(error_message(Some(&id), "invalid-lease", "ttl must be above zero"));
        }
        let lease = match attach {
            Some(existing) => self.state.leases.keepalive(&self.caller, &existing),
            None => self
                .state
                .leases
                .create(&self.caller, Some(ttl.unwrap_or(SOCKET_LEASE_TTL)), None),
        }
        .map_err(|err| {
            let kind = match err {
                LeaseError::Unknown(_) | LeaseError::Elsewhere { .. } => "unknown-lease",
                LeaseError::NotYours(_) => "forbidden",
                LeaseError::TooMany(_) => "too-many",
                LeaseError::Ended { .. } => "lease-ended",
                LeaseError::Unavailable(_) => "zookeeper-unavailable",
            };
            error_message(Some(&id), kind, &err.to_string())
        })?;
        if !self.leases.iter().any(|l| l.id == lease.id) {
            self.leases.push(lease.clone());
        }
        let view = crate::http::leases::LeaseView::of(&lease);
        let reply = json!({ "op": "lease", "id": id, "lease": view }).to_string();
        // Replies wait for room in the queue (they are never dropped like events).
        let outbox = self.outbox.clone();
        self.calls.spawn(async move {
            let _ = outbox.send(reply).await;
        });
        Ok(())
    }

    fn call(
        &mut self,
        id: String,
        method: &str,
        path: &str,
        body: Option<Value>,
        headers: HashMap<String, String>,
    ) -> Result<(), String> {
        while self.calls.try_join_next().is_some() {}
        if self.calls.len() >= MAX_CALLS {
            return Err(error_message(
                Some(&id),
                "too-many-calls",
                &format!("at most {MAX_CALLS} calls in flight per socket"),
            ));
        }
        let invalid = |detail: String| error_message(Some(&id), "invalid-call", &detail);
        if !path.starts_with("/v1/") {
            return Err(invalid(format!("path `{path}` must start with `/v1/`")));
        }
        let method = Method::from_bytes(method.to_ascii_uppercase().as_bytes())
            .map_err(|_| invalid(format!("method `{method}` is not an HTTP method")))?;
        let mut request = axum::http::Request::builder().method(method.clone()).uri(path);
        for (name, value) in &headers {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| invalid(format!("header name `{name}` is invalid")))?;
            let value =
                HeaderValue::from_str(value).map_err(|_| invalid(format!("header `{name}` has an invalid value")))?;
            request = request.header(name, value);
        }
        let body = match body {
            Some(body) => {
                request = request.header(axum::http::header::CONTENT_TYPE, "application/json");
                axum::body::Body::from(body.to_string())
            }
            None => axum::body::Body::empty(),
        };
        if let Err(refused) = self.state.limits.check_rate(&self.caller, &method, self.address) {
            return Err(error_message(Some(&id), "rate-limited", &refused.detail));
        }
        let mut request = request.body(body).map_err(|e| invalid(e.to_string()))?;
        // The call is the socket's caller's: the API's authorisation layer reads it here.
        request.extensions_mut().insert(self.caller.clone());
        let api = self
            .api
            .get_or_insert_with(|| crate::http::api(self.state.clone()))
            .clone();
        let outbox = self.outbox.clone();
        self.calls.spawn(async move {
            let response = match api.oneshot(request).await {
                Ok(response) => response,
                Err(never) => match never {},
            };
            let status = response.status().as_u16();
            let bytes = axum::body::to_bytes(response.into_body(), MAX_REPLY_BYTES)
                .await
                .unwrap_or_default();
            let body = if bytes.is_empty() {
                Value::Null
            } else {
                serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
            };
            let reply = json!({ "op": "reply", "id": id, "status": status, "body": body });
            let _ = outbox.send(reply.to_string()).await;
        });
        Ok(())
    }
}

/// Forwards a subscription's events, tagged with its id, into the socket's bounded queue.
///
/// When the queue is full (the client reads more slowly than events come), the event is
/// dropped for this socket, and so is every one until there is room again; then the socket
/// gets a `resync` with the topic's state as it is then (reason `fell_behind`), and events
/// after it. So a slow socket costs a bounded queue, never holds the topic or the other
/// sockets back, and is told what it missed instead of seeing a silent gap.
async fn forward(id: String, mut subscription: Subscription, outbox: mpsc::Sender<String>, permit: Permit) {
    // Dropped when the task ends or is aborted (unsubscribe, socket closed).
    let _counted = (Counted::new(&crate::metrics::get().subscriptions), permit);
    let mut next = Some(subscription.first.clone());
    loop {
        let event = match next.take() {
            Some(event) => event,
            None => match subscription.next().await {
                Some(event) => event,
                None => return,
            },
        };
        match outbox.try_send(tagged(&id, &event)) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Closed(_)) => return,
            Err(mpsc::error::TrySendError::Full(_)) => {
                let Ok(permit) = outbox.reserve().await else {
                    return;
                };
                permit.send(tagged(&id, &subscription.resync()));
            }
        }
    }
}

/// An event as the general socket sends it: with `op` and the subscription's id.
fn tagged(id: &str, event: &Event) -> String {
    let mut message = serde_json::to_value(event).unwrap_or_default();
    message["op"] = Value::String("event".into());
    message["id"] = Value::String(id.to_string());
    message.to_string()
}

fn error_message(id: Option<&str>, kind: &str, detail: &str) -> String {
    json!({ "op": "error", "id": id, "type": format!("urn:zkgate:problem:{kind}"), "detail": detail }).to_string()
}
