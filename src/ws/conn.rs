//! The general socket's connection: its loop (reads, queued messages, pings, the idle
//! timeout), its subscriptions, the leases it keeps alive, and the API calls it runs.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ws::{Message, WebSocket};
use axum::http::{HeaderName, HeaderValue, Method};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tower::ServiceExt;

use super::outbox::{Outbox, Refused, outbox};
use super::{close_idle, finish, going_away};
use crate::AppState;
use crate::auth::Caller;
use crate::events::Position;
use crate::events::topics::{self as topic, TopicError};
use crate::events::{Event, Subscription};
use crate::http::error::Problem;
use crate::limits::{ClientAddr, Permit};
use crate::metrics::Counted;
use crate::recipes::leases::{Lease, LeaseError};
use crate::time::HumanDuration;

/// Most subscriptions one socket may hold.
pub const MAX_SUBSCRIPTIONS: usize = topic::MAX_TOPICS;

/// Most API calls one socket may have in flight.
pub const MAX_CALLS: usize = 32;

/// Most leases one socket may keep alive.
pub const MAX_LEASES: usize = 16;

/// The TTL of a socket-bound lease when the client does not ask for one: how long what it
/// holds outlives the socket.
pub const SOCKET_LEASE_TTL: Duration = Duration::from_secs(5);

/// The close code of a socket closed for silence or for not reading.
pub const IDLE_CLOSE_CODE: u16 = 4000;

/// Largest reply body relayed for a call.
const MAX_REPLY_BYTES: usize = 4 * 1024 * 1024;

/// What a client may send on `/v1/ws`.
#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum Request {
    Subscribe {
        id: String,
        topic: Value,
        /// The `position` of the last event taken on an earlier subscription to the topic:
        /// resume after it.
        #[serde(default)]
        since: Option<String>,
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

/// One general socket's state.
struct Conn {
    state: AppState,
    /// The caller of the handshake: every subscription and call of the socket is its.
    caller: Caller,
    /// Messages for the client: events of the subscriptions and replies of calls.
    outbox: Outbox,
    subscriptions: HashMap<String, JoinHandle<()>>,
    calls: JoinSet<()>,
    /// Leases this socket keeps alive.
    leases: Vec<Arc<Lease>>,
    /// The API, for calls; made on the first one.
    api: Option<Router>,
    /// Where the client connects from (for the per-address limits of its calls).
    address: Option<ClientAddr>,
}

/// Serves one general socket as `caller` until it closes. Its calls are the caller's; one
/// handed to another instance goes with the caller asserted there, never a token.
pub async fn serve(state: AppState, caller: Caller, mut socket: WebSocket, address: Option<ClientAddr>) {
    let _counted = Counted::new(&crate::metrics::get().sockets);
    let (idle_timeout, ping_interval) = (state.config.ws_idle_timeout, state.config.ws_ping_interval);
    let (outbox, mut queued) = outbox(state.config.ws_send_buffer, &state.ws_budget);
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
                let request = matches!(incoming, Some(Ok(Message::Text(_))));
                if !conn.received(&mut socket, incoming, idle_timeout).await {
                    break;
                }
                // A request may have bound a lease that needs keepalives sooner than the next beat.
                if request {
                    next_beat = next_beat.min(Instant::now() + conn.beat(ping_interval));
                }
            }
            Some(message) = queued.recv() => {
                // The message holds its bytes in the budgets until it is written.
                if !deliver(&mut socket, message.text, idle_timeout).await {
                    break;
                }
            }
            _ = tokio::time::sleep_until(next_beat) => {
                if last_heard.elapsed() >= idle_timeout {
                    close_idle(&mut socket).await;
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
pub(super) async fn deliver(socket: &mut WebSocket, message: String, limit: Duration) -> bool {
    matches!(
        tokio::time::timeout(limit, socket.send(Message::Text(message.into()))).await,
        Ok(Ok(()))
    )
}

impl Conn {
    /// Answers what the client sent; false when the socket is done.
    async fn received(
        &mut self,
        socket: &mut WebSocket,
        incoming: Option<Result<Message, axum::Error>>,
        idle_timeout: Duration,
    ) -> bool {
        match incoming {
            Some(Ok(Message::Text(text))) => match self.handle(&text).await {
                Err(message) => deliver(socket, message, idle_timeout).await,
                Ok(()) => true,
            },
            Some(Ok(Message::Close(_))) => {
                // The library queued the close reply: send it, so that the client sees a clean
                // close rather than a dropped connection.
                finish(socket).await;
                false
            }
            Some(Err(error)) => {
                super::read_failed(socket, error, self.state.config.ws_max_message).await;
                false
            }
            // Every request is JSON in a text message; a binary one would otherwise go
            // unanswered, and its sender wait for a reply that never comes.
            Some(Ok(Message::Binary(bytes))) => {
                let detail = format!(
                    "a binary message ({} bytes) is not read: send each request as JSON in a text message",
                    bytes.len()
                );
                deliver(
                    socket,
                    error_message(None, Problem::MalformedMessage, &detail),
                    idle_timeout,
                )
                .await
            }
            None => false,
            // Pings and pongs: the library answers pings.
            Some(Ok(_)) => true,
        }
    }
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
            serde_json::from_str(text).map_err(|e| error_message(None, Problem::MalformedMessage, &e.to_string()))?;
        match request {
            Request::Unsubscribe { id } => match self.subscriptions.remove(&id) {
                Some(task) => {
                    task.abort();
                    Ok(())
                }
                None => Err(error_message(
                    Some(&id),
                    Problem::UnknownSubscription,
                    "no subscription with this id",
                )),
            },
            Request::Subscribe { id, topic, since } => self.subscribe(id, topic, since).await,
            Request::Lease { id, ttl, attach } => self.lease(id, ttl.map(|t| t.0), attach).await,
            Request::Call {
                id,
                method,
                path,
                body,
                headers,
            } => self.call(id, &method, &path, body, headers),
        }
    }

    async fn subscribe(&mut self, id: String, topic: Value, since: Option<String>) -> Result<(), String> {
        let since = since
            .map(|since| since.parse::<Position>())
            .transpose()
            .map_err(|detail| error_message(Some(&id), Problem::MalformedMessage, &format!("since: {detail}")))?;
        let fail = |problem, detail: &str| error_message(Some(&id), problem, detail);
        self.subscriptions.retain(|_, task| !task.is_finished());
        if self.subscriptions.contains_key(&id) {
            return Err(fail(
                Problem::DuplicateSubscription,
                "a subscription with this id exists",
            ));
        }
        if self.subscriptions.len() >= MAX_SUBSCRIPTIONS {
            return Err(fail(
                Problem::TooManySubscriptions,
                &format!("at most {MAX_SUBSCRIPTIONS} per socket"),
            ));
        }
        let (name, feed) = topic::resolve(&self.state, &self.caller, &topic).map_err(|err| match err {
            TopicError::Unknown(detail) => fail(Problem::MalformedMessage, &detail),
            TopicError::Invalid(detail) => fail(Problem::InvalidTopic, &detail),
            TopicError::Forbidden(detail) => fail(Problem::Forbidden, &detail),
        })?;
        let permit = topic::subscription_permit(&self.state, &self.caller)
            .map_err(|err| fail(Problem::TooMany, err.detail()))?;
        let subscription = self.state.events.subscribe(&name, feed, since).await;
        tracing::debug!(id = ?id, topic = ?name, "socket subscribed");
        let task = tokio::spawn(forward(id.clone(), subscription, self.outbox.clone(), permit));
        self.subscriptions.insert(id, task);
        Ok(())
    }

    /// Binds a lease to the socket: a new one, or one attached by id, which this instance then
    /// keeps (a socket-bound lease is timed by the socket's instance: another's is taken over).
    async fn lease(&mut self, id: String, ttl: Option<Duration>, attach: Option<String>) -> Result<(), String> {
        let fail = |problem, detail: &str| error_message(Some(&id), problem, detail);
        self.leases.retain(|lease| !lease.ended().is_cancelled());
        if self.leases.len() >= MAX_LEASES {
            return Err(fail(
                Problem::TooManyLeases,
                &format!("at most {MAX_LEASES} per socket"),
            ));
        }
        if ttl.is_some_and(|t| t.is_zero()) {
            return Err(fail(Problem::InvalidLease, "ttl must be above zero"));
        }
        let lease = match attach {
            Some(existing) => self.state.leases.take_over(&self.caller, &existing, None, true).await,
            None => {
                let new = crate::recipes::leases::NewLease {
                    lock_delay: std::time::Duration::ZERO,
                    ttl: Some(ttl.unwrap_or(SOCKET_LEASE_TTL)),
                    key: None,
                    with_first_holding: false,
                };
                self.state.leases.create(&self.caller, new).await
            }
        }
        .map_err(|err| {
            let problem = match err {
                LeaseError::Unknown(_) | LeaseError::Elsewhere { .. } => Problem::UnknownLease,
                LeaseError::NotYours(_) | LeaseError::ReadOnly => Problem::Forbidden,
                // A socket's lease takes no key.
                LeaseError::Key(_) => Problem::InvalidLease,
                LeaseError::TooMany(_) => Problem::TooMany,
                LeaseError::Ended { .. } => Problem::LeaseEnded,
                LeaseError::Unavailable(_) | LeaseError::NotFresh => Problem::ZookeeperUnavailable,
            };
            fail(problem, &err.to_string())
        })?;
        if !self.leases.iter().any(|l| l.id == lease.id) {
            self.leases.push(lease.clone());
        }
        let view = crate::recipes::leases::LeaseView::of(&lease);
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
        let fail = |problem, detail: &str| error_message(Some(&id), problem, detail);
        while self.calls.try_join_next().is_some() {}
        if self.calls.len() >= MAX_CALLS {
            return Err(fail(
                Problem::TooManyCalls,
                &format!("at most {MAX_CALLS} calls in flight per socket"),
            ));
        }
        let invalid = |detail: String| fail(Problem::InvalidCall, &detail);
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
        let mut request = request.body(body).map_err(|e| invalid(e.to_string()))?;
        // The call is the socket's caller's, from the socket's address: the API's guards read
        // them here (authorisation, the write rate).
        request.extensions_mut().insert(self.caller.clone());
        if let Some(address) = self.address {
            request.extensions_mut().insert(address);
        }
        let api = self.api.get_or_insert_with(|| crate::http::api(&self.state)).clone();
        let outbox = self.outbox.clone();
        self.calls.spawn(async move {
            let Ok(response) = api.oneshot(request).await;
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

/// Forwards a subscription's events, tagged with its id, into the socket's outbox (bounded in
/// bytes, see [super::outbox]).
///
/// When the outbox is full (the client reads more slowly than events come), the event is
/// dropped for this socket, and so is every one until there is room again; then the socket
/// gets a `resync` with the topic's state as it is then (reason `fell_behind`), and events
/// after it. So a slow socket costs a bounded queue, never holds the topic or the other
/// sockets back, and is told what it missed instead of seeing a silent gap.
async fn forward(id: String, mut subscription: Subscription, outbox: Outbox, permit: Permit) {
    // Dropped when the task ends or is aborted (unsubscribe, socket closed).
    let _counted = (Counted::new(&crate::metrics::get().subscriptions), permit);
    loop {
        let Some(event) = subscription.next().await else { return };
        let message = tagged(&id, &event);
        let size = message.len();
        match outbox.try_send(message) {
            Ok(()) => {}
            Err(Refused::Closed) => return,
            Err(Refused::Full) => {
                // Skip events until there is room (for a message the size of the one dropped),
                // then tell the client what it missed: the state now.
                if outbox.room_for(size).await.is_err()
                    || outbox.send(tagged(&id, &subscription.resync())).await.is_err()
                {
                    return;
                }
            }
        }
    }
}

/// An event as the general socket sends it: with `op` and the subscription's id.
///
/// The event is written straight after `op` and `id` (its fields never include either), so
/// that its state, however large, is serialized once into the message rather than copied into
/// a JSON tree for each socket first.
fn tagged(id: &str, event: &Event) -> String {
    let body = serde_json::to_string(event).unwrap_or_else(|_| "{}".into());
    let id = Value::String(id.to_string());
    let fields = body.strip_prefix('{').unwrap_or(&body);
    let separator = if fields.starts_with('}') { "" } else { "," };
    format!(r#"{{"op":"event","id":{id}{separator}{fields}"#)
}

/// The socket's `error` message for `problem`.
fn error_message(id: Option<&str>, problem: Problem, detail: &str) -> String {
    json!({ "op": "error", "id": id, "type": problem.type_uri(), "detail": detail }).to_string()
}
