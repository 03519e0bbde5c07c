//! WebSocket endpoints.
//!
//! `GET /v1/ws` is the general socket: the client sends `{"op":"subscribe","id":"s1",
//! "topic":{"election":"scheduler"}}` (or `{"lock":"orders"}`) and `{"op":"unsubscribe",
//! "id":"s1"}`; every message it receives carries the subscription's `id`. Each subscription
//! starts with the topic's state, then its changes. A malformed message, an unknown topic or
//! too many subscriptions get an `error` message; the socket stays open.
//!
//! `GET /v1/elections/{name}/observe` is the simplest use: a socket that receives the
//! election's state as its first message and then one message per change (new leader with its
//! term, no leader, the leader's value acknowledged or changed, candidates joining or
//! leaving), each with the topic's sequence number. A socket that falls behind gets a
//! `resync` message with the current state instead of a silent gap.

use std::collections::HashMap;

use axum::extract::State;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::response::Response;
use serde::Deserialize;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::AppState;
use crate::events::{Event, Source, Subscription, sources};
use crate::http::error::ApiError;
use crate::http::extract::ApiPath;
use crate::recipes::election::Leadership;
use crate::recipes::lock::LockTopic;
use crate::zk::names::validate_name;

/// Upgrades to a socket that streams the election's leadership.
pub async fn observe_election(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    upgrade: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    validate_name(&name).map_err(|e| ApiError::invalid(crate::http::error::Place::Path, "name", e))?;
    state.zk.current()?;
    let topic = format!("election:{name}");
    let source = Leadership {
        dir: format!("{}/elections/{name}", state.config.root),
    };
    Ok(upgrade.on_upgrade(move |socket| async move {
        let subscription = state.events.subscribe(&topic, source).await;
        stream(socket, subscription).await;
    }))
}

/// Sends the subscription's first state and then its events until either side goes.
async fn stream(mut socket: WebSocket, mut subscription: Subscription) {
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
            incoming = socket.recv() => match incoming {
                // This socket only listens; pings are answered by the library.
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return,
                Some(Ok(_)) => {}
            },
        }
    }
}

async fn send(socket: &mut WebSocket, event: &Event) -> Result<(), axum::Error> {
    let text = serde_json::to_string(event).unwrap_or_default();
    socket.send(Message::Text(text.into())).await
}

/// Most subscriptions one socket may hold.
pub const MAX_SUBSCRIPTIONS: usize = 64;

/// Messages queued for one socket before its subscriptions are held back (and resync).
const SEND_QUEUE: usize = 256;

/// What a client may send on `/v1/ws`.
#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum Request {
    Subscribe { id: String, topic: Topic },
    Unsubscribe { id: String },
}

/// A topic to subscribe to.
#[derive(Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
enum Topic {
    /// An election's leadership.
    Election(String),
    /// An exclusive lock's holder and queue.
    Lock(String),
    /// A barrier: raised or lowered.
    Barrier(String),
    /// A queue's depth.
    Queue(String),
    /// A group's members.
    Group(String),
}

impl Topic {
    /// The topic's name on the bus and the source that feeds it.
    fn resolve(self, root: &str) -> Result<(String, Box<dyn Source>), String> {
        let (kind, name) = match &self {
            Topic::Election(name) => ("election", name.clone()),
            Topic::Lock(name) => ("lock", name.clone()),
            Topic::Barrier(name) => ("barrier", name.clone()),
            Topic::Queue(name) => ("queue", name.clone()),
            Topic::Group(name) => ("group", name.clone()),
        };
        validate_name(&name).map_err(|e| format!("{kind} name {e}"))?;
        let source: Box<dyn Source> = match self {
            Topic::Election(name) => Box::new(Leadership {
                dir: format!("{root}/elections/{name}"),
            }),
            Topic::Lock(name) => Box::new(LockTopic {
                dir: format!("{root}/locks/{name}"),
            }),
            Topic::Barrier(name) => Box::new(sources::Barrier {
                parent: format!("{root}/barriers"),
                name,
            }),
            Topic::Queue(name) => Box::new(sources::Queue {
                items: format!("{root}/queues/{name}/items"),
            }),
            Topic::Group(name) => Box::new(sources::Group {
                dir: format!("{root}/groups/{name}"),
            }),
        };
        Ok((format!("{kind}:{name}"), source))
    }
}

/// Upgrades to the general socket.
pub async fn socket(State(state): State<AppState>, upgrade: WebSocketUpgrade) -> Response {
    upgrade.on_upgrade(move |socket| serve_socket(state, socket))
}

async fn serve_socket(state: AppState, mut socket: WebSocket) {
    let (outbox, mut queued) = mpsc::channel::<String>(SEND_QUEUE);
    let mut subscriptions: HashMap<String, JoinHandle<()>> = HashMap::new();
    loop {
        tokio::select! {
            incoming = socket.recv() => match incoming {
                Some(Ok(Message::Text(text))) => {
                    if let Err(error) = handle(&state, &text, &outbox, &mut subscriptions).await
                        && socket.send(Message::Text(error.into())).await.is_err()
                    {
                        break;
                    }
                }
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                Some(Ok(_)) => {}
            },
            Some(message) = queued.recv() => {
                if socket.send(Message::Text(message.into())).await.is_err() {
                    break;
                }
            }
        }
    }
    for (_, task) in subscriptions {
        task.abort();
    }
}

/// Handles one client message; an `Err` is the error message to send back.
async fn handle(
    state: &AppState,
    text: &str,
    outbox: &mpsc::Sender<String>,
    subscriptions: &mut HashMap<String, JoinHandle<()>>,
) -> Result<(), String> {
    let request: Request =
        serde_json::from_str(text).map_err(|e| error_message(None, "malformed-message", &e.to_string()))?;
    match request {
        Request::Unsubscribe { id } => match subscriptions.remove(&id) {
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
        Request::Subscribe { id, topic } => {
            if subscriptions.contains_key(&id) {
                return Err(error_message(
                    Some(&id),
                    "duplicate-subscription",
                    "a subscription with this id exists",
                ));
            }
            if subscriptions.len() >= MAX_SUBSCRIPTIONS {
                return Err(error_message(
                    Some(&id),
                    "too-many-subscriptions",
                    &format!("at most {MAX_SUBSCRIPTIONS} per socket"),
                ));
            }
            let (name, source) = topic
                .resolve(&state.config.root)
                .map_err(|detail| error_message(Some(&id), "invalid-topic", &detail))?;
            let subscription = state.events.subscribe(&name, source).await;
            tracing::debug!(%id, topic = %name, "socket subscribed");
            subscriptions.insert(id.clone(), tokio::spawn(forward(id, subscription, outbox.clone())));
            Ok(())
        }
    }
}

/// Forwards a subscription's events, tagged with its id, into the socket's bounded queue. A
/// full queue holds the subscription back; if it falls behind the topic's backlog it sends a
/// `resync` with the current state.
async fn forward(id: String, mut subscription: Subscription, outbox: mpsc::Sender<String>) {
    let mut next = Some(subscription.first.clone());
    loop {
        let event = match next.take() {
            Some(event) => event,
            None => match subscription.next().await {
                Some(event) => event,
                None => return,
            },
        };
        let mut message = serde_json::to_value(&event).unwrap_or_default();
        message["id"] = serde_json::Value::String(id.clone());
        if outbox.send(message.to_string()).await.is_err() {
            return;
        }
    }
}

fn error_message(id: Option<&str>, kind: &str, detail: &str) -> String {
    serde_json::json!({ "op": "error", "id": id, "type": format!("urn:zkgate:problem:{kind}"), "detail": detail })
        .to_string()
}
