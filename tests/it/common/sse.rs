//! A Server-Sent Events client for tests, over a real HTTP connection: it reads the stream's
//! chunks as they come and parses them into messages (RFC: the WHATWG `text/event-stream`
//! format: `field: value` lines, a blank line ends a message, `:` starts a comment).

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;

use super::within;

/// One message of the stream.
#[derive(Debug, Default, Clone)]
pub struct Message {
    pub id: Option<String>,
    pub data: Option<String>,
    pub retry: Option<u64>,
    /// A comment line (a heartbeat).
    pub comment: bool,
}

pub struct Sse {
    response: reqwest::Response,
    buffer: String,
    /// The `id` of the last event read (what `EventSource` would send back).
    pub last_id: Option<String>,
    /// Heartbeat comments seen so far.
    pub comments: usize,
}

impl Sse {
    /// Opens `GET <url>` as an event stream (with `Last-Event-ID` when given); it must answer
    /// 200 `text/event-stream`.
    pub async fn open(http: &reqwest::Client, url: &str, last_event_id: Option<&str>) -> Sse {
        match Sse::try_open(http, url, last_event_id, None).await {
            Ok(sse) => sse,
            Err((status, body)) => panic!("GET {url}: {status} {body}"),
        }
    }

    /// Opens the stream, or answers the refusal's status and body.
    pub async fn try_open(
        http: &reqwest::Client,
        url: &str,
        last_event_id: Option<&str>,
        token: Option<&str>,
    ) -> Result<Sse, (StatusCode, String)> {
        let mut request = http.get(url).header("accept", "text/event-stream");
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = within(Duration::from_secs(20), "the stream's headers", request.send())
            .await
            .expect("GET");
        if response.status() != StatusCode::OK {
            let status = response.status();
            return Err((status, response.text().await.unwrap_or_default()));
        }
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        assert_eq!(content_type, "text/event-stream", "an event stream's content type");
        Ok(Sse {
            response,
            buffer: String::new(),
            last_id: None,
            comments: 0,
        })
    }

    /// The next message, whatever it is; `None` when the server ended the stream.
    pub async fn message(&mut self) -> Option<Message> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut message = Message::default();
                for line in block.lines() {
                    if line.starts_with(':') {
                        message.comment = true;
                        continue;
                    }
                    let (field, value) = line.split_once(':').unwrap_or((line, ""));
                    let value = value.strip_prefix(' ').unwrap_or(value).to_string();
                    match field {
                        "id" => message.id = Some(value),
                        "data" => {
                            message.data = Some(match message.data.take() {
                                Some(before) => format!("{before}\n{value}"),
                                None => value,
                            })
                        }
                        "retry" => message.retry = value.parse().ok(),
                        _ => {}
                    }
                }
                if message.comment {
                    self.comments += 1;
                }
                if let Some(id) = &message.id {
                    self.last_id = Some(id.clone());
                }
                return Some(message);
            }
            let chunk = self.response.chunk().await.ok()??;
            self.buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    /// The next event's data as JSON (comments and `retry` skipped), within 20 s.
    pub async fn next(&mut self) -> Value {
        within(Duration::from_secs(20), "the next event", async {
            loop {
                let message = self.message().await.expect("the stream ended");
                if let Some(data) = message.data {
                    return serde_json::from_str(&data).expect("an event's data is JSON");
                }
            }
        })
        .await
    }

    /// Reads until an event of `topic` for which `test` holds; every event of the topic read
    /// on the way is pushed into `seen` (for gap checks).
    pub async fn until(&mut self, topic: &str, seen: &mut Vec<Value>, mut test: impl FnMut(&Value) -> bool) -> Value {
        loop {
            let event = self.next().await;
            if event["topic"] == topic {
                seen.push(event.clone());
                if test(&event) {
                    return event;
                }
            }
        }
    }

    /// Waits for a heartbeat comment.
    pub async fn heartbeat(&mut self) {
        within(Duration::from_secs(20), "a heartbeat", async {
            loop {
                if self.message().await.expect("the stream ended").comment {
                    return;
                }
            }
        })
        .await
    }
}
