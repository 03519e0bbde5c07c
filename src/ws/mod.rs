//! WebSocket endpoints.
//!
//! `GET /v1/ws` is the general socket. The client sends JSON messages, each with an `op` and
//! an `id` of its choosing; everything the server sends back about it carries that `id`:
//!
//! - `{"op":"subscribe","id":"s1","topic":{"election":"scheduler"}}` subscribes to a topic
//!   (see [crate::events::topics]); the first event is the topic's current `state`, then each change, with the
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

mod conn;
pub mod outbox;

use std::time::Duration;

use axum::extract::State;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::response::Response;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::AppState;
use crate::auth::Caller;
use crate::events::{Event, Subscription};
use crate::http::check_name;
use crate::http::error::{ApiError, Problem, Problems, p};
use crate::http::extract::ApiPath;
use crate::kind::Kind;
use crate::limits::ClientAddr;
use crate::metrics::Counted;

pub use conn::{IDLE_CLOSE_CODE, MAX_CALLS, MAX_LEASES, MAX_SUBSCRIPTIONS, SOCKET_LEASE_TTL};

/// The socket routes, with their spec.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(observe_election))
        .routes(routes!(socket))
}

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
        Problems<(p::InvalidField, p::NotAWebsocket, p::ZookeeperUnavailable)>,
    ))]
pub async fn observe_election(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    address: Option<axum::Extension<ClientAddr>>,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    check_name(&name)?;
    let upgrade = upgrade.map_err(not_a_websocket)?;
    state.zk().current()?;
    let permits = crate::events::topics::stream_permits(&state, &caller, address.map(|a| a.0))?;
    let kind = Kind::Election;
    let feed = crate::events::topics::feed_of(&state, kind, &name)
        .ok_or_else(|| ApiError::new(Problem::Internal, "no election topic"))?;
    Ok(
        lean(upgrade, state.config.ws_max_message).on_upgrade(move |socket| async move {
            let _permits = permits;
            let subscription = state.events.subscribe(&kind.topic_name(&name), feed, None).await;
            stream(socket, subscription, state).await;
        }),
    )
}

/// Sends the subscription's first state and then its events until either side goes. Like the
/// general socket, it pings every `--ws-ping-interval` and closes (code 4000) a socket that
/// sends nothing, not even a pong, for `--ws-idle-timeout`, or whose messages cannot be
/// written for that long.
async fn stream(mut socket: WebSocket, mut subscription: Subscription, state: AppState) {
    let _counted = (
        Counted::new(&crate::metrics::get().sockets),
        Counted::new(&crate::metrics::get().subscriptions),
    );
    let (ping_interval, idle_timeout) = (state.config.ws_ping_interval, state.config.ws_idle_timeout);
    let mut last_heard = tokio::time::Instant::now();
    let mut ping = tokio::time::interval_at(last_heard + ping_interval, ping_interval);
    loop {
        tokio::select! {
            event = subscription.next() => {
                let Some(event) = event else { return };
                if !deliver(&mut socket, &event, idle_timeout).await {
                    return;
                }
            }
            _ = state.shutdown.cancelled() => return going_away(&mut socket).await,
            incoming = socket.recv() => {
                last_heard = tokio::time::Instant::now();
                match incoming {
                    // This socket only listens; pings are answered by the library.
                    Some(Ok(Message::Close(_))) => return finish(&mut socket).await,
                    Some(Err(error)) => return read_failed(&mut socket, error, state.config.ws_max_message).await,
                    None => return,
                    Some(Ok(_)) => {}
                }
            }
            _ = ping.tick() => {
                if last_heard.elapsed() >= idle_timeout {
                    return close_idle(&mut socket).await;
                }
                let pinged = tokio::time::timeout(idle_timeout, socket.send(Message::Ping(Default::default()))).await;
                if !matches!(pinged, Ok(Ok(()))) {
                    return;
                }
            }
        }
    }
}

/// Sends one event, giving up (and so closing the socket) if it cannot be written within
/// `limit`: a client that stopped reading must not hold a task forever.
async fn deliver(socket: &mut WebSocket, event: &Event, limit: Duration) -> bool {
    conn::deliver(socket, serde_json::to_string(event).unwrap_or_default(), limit).await
}

/// Sends a close frame (bounded: a client that does not read gets no longer).
pub(crate) async fn close(socket: &mut WebSocket, code: u16, reason: impl Into<Utf8Bytes>) {
    let close = CloseFrame {
        code,
        reason: reason.into(),
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), socket.send(Message::Close(Some(close)))).await;
}

/// Closes a socket because the instance shuts down (1001, going away).
pub(crate) async fn going_away(socket: &mut WebSocket) {
    close(socket, 1001, "zkgate is shutting down").await
}

/// Closes a socket nothing came from for `--ws-idle-timeout`.
pub(crate) async fn close_idle(socket: &mut WebSocket) {
    close(socket, IDLE_CLOSE_CODE, "idle timeout").await
}

/// Ends a socket whose read failed, saying why where the client is to blame (RFC 6455, 7.4.1):
/// a message over `--ws-max-message` is closed with 1009 (message too big), a text message that
/// is not UTF-8 with 1007 (invalid frame payload data); any other failure (the connection
/// broke, a protocol error) just ends it.
pub(crate) async fn read_failed(socket: &mut WebSocket, error: axum::Error, limit: usize) {
    // axum wraps tungstenite's error without exposing its type (axum pins its own tungstenite
    // version); its text is the public contract left: "Space limit exceeded: Message too long",
    // "UTF-8 encoding error: ...".
    let error = error.to_string();
    if error.contains("Space limit exceeded") {
        close(socket, 1009, format!("message too big: at most {limit} bytes")).await;
    } else if error.contains("UTF-8") {
        close(socket, 1007, "a text message that is not UTF-8").await;
    }
}

/// Completes the closing handshake the client began (bounded: the client may be gone).
pub(crate) async fn finish(socket: &mut WebSocket) {
    use futures::SinkExt;
    let _ = tokio::time::timeout(Duration::from_secs(1), socket.close()).await;
}

/// The read buffer of a socket. tungstenite's default (128 KiB, allocated up front) would be
/// most of an idle socket's memory; clients send small messages, and a larger one still
/// arrives (the buffer grows for it).
const READ_BUFFER_BYTES: usize = 4 * 1024;

/// Sockets are flushed after each message anyway: no write buffer to fill first.
const WRITE_BUFFER_BYTES: usize = 0;

/// Sizes an upgrade's buffers for many mostly idle sockets, and bounds what a client may send:
/// a message (or frame) over `max_message` bytes closes the socket with 1009 (message too big)
/// before it is buffered, so a 60 MB frame costs zkgate no more than the limit.
pub(crate) fn lean(upgrade: WebSocketUpgrade, max_message: usize) -> WebSocketUpgrade {
    upgrade
        // A browser that sends its token as the `zkgate.bearer.…` subprotocol also offers
        // `zkgate`, which is the one answered (never the one with the token).
        .protocols([crate::http::auth::SUBPROTOCOL])
        .read_buffer_size(READ_BUFFER_BYTES)
        .write_buffer_size(WRITE_BUFFER_BYTES)
        .max_message_size(max_message)
        .max_frame_size(max_message)
}

/// The general WebSocket: subscriptions to topics, socket-bound leases, API calls.
///
/// Upgrade with `Connection: Upgrade` and `Upgrade: websocket`, then send JSON text messages:
///
/// - `{"op":"subscribe","id":"s1","topic":{"lock":"orders"}}`: a resource of a kind (listed
///   below) or a lease (`{"lease":"<id>"}`) by name, or
///   `{"znode":{"path":"kv/app","watch":"data|children|recursive"}}` (relative to the root).
///   Events: `{"op":"event","id":"s1","topic":...,"seq":N,"type":...,"zxid":...,"state":{...}}`,
///   the first of type `state`; `resync` (with a `reason`) replaces the client's view when
///   events may have been missed.
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
        Problems<(p::NotAWebsocket,)>,
    ))]
pub async fn socket(
    State(state): State<AppState>,
    caller: Caller,
    address: Option<axum::Extension<ClientAddr>>,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let upgrade = upgrade.map_err(not_a_websocket)?;
    let address = address.map(|a| a.0);
    let permits = crate::events::topics::stream_permits(&state, &caller, address)?;
    // The socket outlives the handshake's request: it acts as the caller of the handshake.
    Ok(
        lean(upgrade, state.config.ws_max_message).on_upgrade(move |socket| async move {
            let _permits = permits;
            conn::serve(state, caller, socket, address).await
        }),
    )
}

/// A plain request to a socket endpoint: a problem document like every other error, not the
/// library's plain text.
fn not_a_websocket(rejection: WebSocketUpgradeRejection) -> ApiError {
    ApiError::new(
        Problem::NotAWebsocket,
        format!(
            "this endpoint speaks WebSocket: send `Connection: Upgrade` and `Upgrade: websocket` ({})",
            rejection.body_text()
        ),
    )
}
