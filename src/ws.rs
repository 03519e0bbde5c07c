//! WebSocket endpoints.
//!
//! `GET /v1/elections/{name}/observe` is the simplest use: a socket that receives the
//! election's state as its first message and then one message per change (new leader with its
//! term, no leader, the leader's value acknowledged or changed, candidates joining or
//! leaving), each with the topic's sequence number. A socket that falls behind gets a
//! `resync` message with the current state instead of a silent gap.

use axum::extract::State;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::response::Response;
use tokio::sync::broadcast::error::RecvError;

use crate::AppState;
use crate::events::{Event, Subscription};
use crate::http::error::ApiError;
use crate::http::extract::ApiPath;
use crate::recipes::election::Leadership;
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
            event = subscription.events.recv() => {
                let event = match event {
                    Ok(event) => event,
                    Err(RecvError::Lagged(_)) => subscription.resync(),
                    Err(RecvError::Closed) => return,
                };
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
