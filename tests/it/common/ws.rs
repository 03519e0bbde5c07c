//! A WebSocket client for tests: a task reads the socket all the time (so that the server's
//! pings are answered, as by any live client) and hands messages over in order.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

use super::within;

pub struct Ws {
    pending: std::collections::VecDeque<Value>,
    messages: mpsc::UnboundedReceiver<Value>,
    outgoing: mpsc::UnboundedSender<Message>,
    task: tokio::task::JoinHandle<()>,
}

impl Ws {
    /// Connects to `ws://<addr><path>`.
    pub async fn connect(addr: std::net::SocketAddr, path: &str) -> Ws {
        Ws::connect_with(addr, path, &[]).await.expect("WebSocket connect")
    }

    /// Connects with extra handshake headers; the server's refusal (e.g. a 401) is the error.
    pub async fn connect_with(
        addr: std::net::SocketAddr,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<Ws, tokio_tungstenite::tungstenite::Error> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let mut request = format!("ws://{addr}{path}").into_client_request()?;
        for (name, value) in headers {
            request.headers_mut().insert(
                reqwest::header::HeaderName::from_bytes(name.as_bytes()).expect("header name"),
                value.parse().expect("header value"),
            );
        }
        let (socket, _) = tokio_tungstenite::connect_async(request).await?;
        let (mut sink, mut stream) = socket.split();
        let (deliver, messages) = mpsc::unbounded_channel();
        let (outgoing, mut to_send) = mpsc::unbounded_channel::<Message>();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    incoming = stream.next() => match incoming {
                        Some(Ok(Message::Text(text))) => {
                            let value = serde_json::from_str(&text).expect("a JSON message");
                            if deliver.send(value).is_err() {
                                return;
                            }
                        }
                        Some(Ok(Message::Close(frame))) => {
                            let code = frame.map(|f| u16::from(f.code));
                            let _ = deliver.send(serde_json::json!({ "op": "closed", "code": code }));
                            return;
                        }
                        Some(Ok(_)) => {}
                        Some(Err(_)) | None => return,
                    },
                    message = to_send.recv() => match message {
                        Some(message) => {
                            if sink.send(message).await.is_err() {
                                return;
                            }
                        }
                        None => {
                            let _ = sink.close().await;
                            return;
                        }
                    },
                }
                // Pongs to the server's pings are queued by the library: let them out.
                let _ = sink.flush().await;
            }
        });
        Ok(Ws {
            pending: Default::default(),
            messages,
            outgoing,
            task,
        })
    }

    pub fn send(&self, message: Value) {
        self.outgoing
            .send(Message::Text(message.to_string().into()))
            .expect("socket open");
    }

    /// The next message not yet handed out, failing the test after 20 s.
    pub async fn next(&mut self) -> Value {
        match self.pending.pop_front() {
            Some(message) => message,
            None => self.receive().await,
        }
    }

    async fn receive(&mut self) -> Value {
        within(Duration::from_secs(20), "a socket message", self.messages.recv())
            .await
            .expect("the socket is open")
    }

    /// The next message about `id` (events, replies, errors); messages about other ids are
    /// kept for their own `next_for`.
    pub async fn next_for(&mut self, id: &str) -> Value {
        loop {
            if let Some(at) = self.pending.iter().position(|m| m["id"] == id) {
                return self.pending.remove(at).expect("pending message");
            }
            let message = self.receive().await;
            if message["id"] == id {
                return message;
            }
            self.pending.push_back(message);
        }
    }

    /// Sends a call and waits for its reply.
    pub async fn call(&mut self, id: &str, method: &str, path: &str, body: Option<Value>) -> Value {
        let mut call = serde_json::json!({ "op": "call", "id": id, "method": method, "path": path });
        if let Some(body) = body {
            call["body"] = body;
        }
        self.send(call);
        let reply = self.next_for(id).await;
        assert_eq!(reply["op"], "reply", "{reply}");
        reply
    }

    /// Closes the socket (a close frame, then the connection).
    pub async fn close(self) {
        drop(self.outgoing);
        let _ = within(Duration::from_secs(10), "the socket to close", self.task).await;
    }
}

/// Checks that `events` (of one subscription, in arrival order) have no silent gap: each
/// sequence number is the previous plus one, unless the event is a `resync`.
pub fn assert_no_silent_gap(events: &[Value]) {
    for pair in events.windows(2) {
        let (before, after) = (pair[0]["seq"].as_u64().unwrap(), pair[1]["seq"].as_u64().unwrap());
        if after != before + 1 {
            assert!(
                after > before && pair[1]["type"] == "resync",
                "a gap without a resync: {} then {}",
                pair[0],
                pair[1]
            );
        }
    }
}
