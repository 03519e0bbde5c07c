//! A kept-alive connection survives every refusal. zkgate answers many requests before it
//! reads their bodies (a bad query, no token, a write over the rate, ZooKeeper away...); a
//! client that keeps its connection (Python's `requests.Session`, Go's `http.Client`, Node's
//! agents) then sends its next request on the same socket. So every such answer either reads
//! (drains) the body and keeps the connection, or says `Connection: close` and closes it: never
//! a connection closed without a word, which the client only learns of as a broken pipe on its
//! next request, exactly when it was told to retry.
//!
//! The client here is a socket and a few lines of HTTP/1.1, so that what is on the wire is
//! what the test says: each refusal is sent with its body in the same write as its head, and
//! with the body after the head (once the answer came, or after a short while if none did),
//! then a second request on the same connection.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use zkgate::zk::server::free_port;

use crate::common::{self, ADMIN, Gate, auth_config, grant};

/// How the body of a request goes out.
#[derive(Clone, Copy, Debug)]
enum Body {
    /// In the same write as the head.
    WithHead,
    /// After the head: once the answer has come (a server that answers before reading), or
    /// after [AFTER] if it has not (a server that reads first).
    AfterHead,
}

/// How long the client waits for an early answer before it sends the body anyway: a span of
/// the scenario (a body that is slow to follow its head), not a wait for an event.
const AFTER: Duration = Duration::from_millis(300);

/// An answer as read off the wire.
#[derive(Debug)]
struct Answer {
    status: u16,
    /// The `Connection` header, lowercased (`close`), if any.
    connection: Option<String>,
    body: String,
}

/// One client connection that is kept alive between requests, the way a pooled client keeps
/// one: it opens a new one only when the server said `Connection: close`.
struct Client {
    address: SocketAddr,
    stream: Option<TcpStream>,
    /// Bytes read past the last answer.
    buffered: Vec<u8>,
    /// Connections opened after the first (each because the server said so).
    reopened: usize,
}

impl Client {
    fn new(address: SocketAddr) -> Client {
        Client {
            address,
            stream: None,
            buffered: Vec::new(),
            reopened: 0,
        }
    }

    /// Sends a request (`head` without its final blank line) and reads its answer. Any
    /// connection error is the test's failure, named by `what`.
    async fn send(&mut self, what: &str, head: &str, body: &[u8], how: Body) -> Answer {
        if self.stream.is_none() {
            let stream = TcpStream::connect(self.address).await.expect("connect");
            stream.set_nodelay(true).expect("nodelay");
            self.stream = Some(stream);
        }
        let request_head = format!(
            "{head}\r\nHost: {}\r\nContent-Length: {}\r\n\r\n",
            self.address,
            body.len()
        );
        let stream = self.stream.as_mut().expect("connected");
        let answer = match how {
            Body::WithHead => {
                let mut bytes = request_head.into_bytes();
                bytes.extend_from_slice(body);
                stream
                    .write_all(&bytes)
                    .await
                    .unwrap_or_else(|e| panic!("{what}: sending the request failed: {e}"));
                self.read_answer(what).await
            }
            Body::AfterHead => {
                stream
                    .write_all(request_head.as_bytes())
                    .await
                    .unwrap_or_else(|e| panic!("{what}: sending the head failed: {e}"));
                match tokio::time::timeout(AFTER, self.read_answer(what)).await {
                    Ok(early) => {
                        // Answered before its body: a client that streams its body still sends
                        // it (unless told the connection closes).
                        if early.connection.as_deref() != Some("close") && !body.is_empty() {
                            let stream = self.stream.as_mut().expect("connected");
                            stream
                                .write_all(body)
                                .await
                                .unwrap_or_else(|e| panic!("{what}: sending the body after the answer failed: {e}"));
                        }
                        early
                    }
                    Err(_) => {
                        let stream = self.stream.as_mut().expect("connected");
                        stream
                            .write_all(body)
                            .await
                            .unwrap_or_else(|e| panic!("{what}: sending the body failed: {e}"));
                        self.read_answer(what).await
                    }
                }
            }
        };
        if answer.connection.as_deref() == Some("close") {
            // Said so: the client opens a new connection for its next request.
            self.stream = None;
            self.buffered.clear();
            self.reopened += 1;
        }
        answer
    }

    /// Reads one answer (its head, then a body of `Content-Length` bytes or chunks).
    async fn read_answer(&mut self, what: &str) -> Answer {
        let head_end = loop {
            if let Some(at) = self.buffered.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            self.fill(what).await;
        };
        let head = String::from_utf8_lossy(&self.buffered[..head_end]).to_string();
        self.buffered.drain(..head_end);
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{what}: no status in {head:?}"));
        let header = |name: &str| {
            head.lines().skip(1).find_map(|line| {
                let (key, value) = line.split_once(':')?;
                key.trim()
                    .eq_ignore_ascii_case(name)
                    .then(|| value.trim().to_ascii_lowercase())
            })
        };
        let body = if let Some(length) = header("content-length") {
            let length: usize = length.parse().expect("content-length");
            while self.buffered.len() < length {
                self.fill(what).await;
            }
            self.buffered.drain(..length).collect::<Vec<u8>>()
        } else if header("transfer-encoding").as_deref() == Some("chunked") {
            self.read_chunks(what).await
        } else {
            Vec::new()
        };
        Answer {
            status,
            connection: header("connection"),
            body: String::from_utf8_lossy(&body).to_string(),
        }
    }

    async fn read_chunks(&mut self, what: &str) -> Vec<u8> {
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(at) = self.buffered.windows(2).position(|w| w == b"\r\n") {
                    break at;
                }
                self.fill(what).await;
            };
            let size_line = String::from_utf8_lossy(&self.buffered[..line_end]).to_string();
            let size = usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
                .unwrap_or_else(|_| panic!("{what}: a chunk size: {size_line:?}"));
            while self.buffered.len() < line_end + 2 + size + 2 {
                self.fill(what).await;
            }
            body.extend_from_slice(&self.buffered[line_end + 2..line_end + 2 + size]);
            self.buffered.drain(..line_end + 2 + size + 2);
            if size == 0 {
                return body;
            }
        }
    }

    async fn fill(&mut self, what: &str) {
        let stream = self.stream.as_mut().expect("connected");
        let mut chunk = [0u8; 16 * 1024];
        let read = stream
            .read(&mut chunk)
            .await
            .unwrap_or_else(|e| panic!("{what}: reading the answer failed: {e}"));
        assert!(read > 0, "{what}: the server closed the connection without saying so");
        self.buffered.extend_from_slice(&chunk[..read]);
    }
}

/// A refusal to provoke: the request, and the status it gets.
#[derive(Clone)]
struct Refusal {
    what: &'static str,
    head: String,
    body: Vec<u8>,
    status: u16,
    /// A request sent first on the connection (the write that takes the rate's token), and
    /// the statuses it may get.
    first: Option<(String, Vec<u8>, &'static [u16])>,
}

impl Refusal {
    fn new(what: &'static str, head: impl Into<String>, content_type: &str, body: Vec<u8>, status: u16) -> Refusal {
        Refusal {
            what,
            head: format!("{}\r\nContent-Type: {content_type}", head.into()),
            body,
            status,
            first: None,
        }
    }

    fn json(what: &'static str, head: impl Into<String>, body: serde_json::Value, status: u16) -> Refusal {
        Refusal::new(what, head, "application/json", body.to_string().into_bytes(), status)
    }
}

/// The valid request that follows each refusal.
const THEN: &str = "GET /healthz HTTP/1.1";

/// Sends `refusal` and then a valid request on one kept-alive connection, for each way of
/// sending the body; the valid request must be answered, on the same connection if `keeps`,
/// else on a new one after the refusal said `Connection: close` (a body too large to drain).
/// Each way runs in a task of its own, so that every failure is reported, not just the first.
async fn survives(address: SocketAddr, refusal: &Refusal, keeps: bool, failures: &mut Vec<String>) {
    for how in [Body::WithHead, Body::AfterHead] {
        let refusal = refusal.clone();
        let tried = tokio::spawn(async move {
            let what = format!("{} ({how:?})", refusal.what);
            let mut client = Client::new(address);
            if let Some((head, body, statuses)) = &refusal.first {
                let answer = client.send(&what, head, body, Body::WithHead).await;
                assert!(
                    statuses.contains(&answer.status),
                    "{what}: the request before: {answer:?}"
                );
            }
            let refused = client.send(&what, &refusal.head, &refusal.body, how).await;
            assert_eq!(refused.status, refusal.status, "{what}: {refused:?}");
            assert!(
                refused.body.contains("\"status\""),
                "{what}: a problem document: {refused:?}"
            );
            if keeps {
                assert_eq!(
                    client.reopened, 0,
                    "{what}: a body this small is drained, the connection kept: {refused:?}"
                );
            } else {
                assert_eq!(refused.connection.as_deref(), Some("close"), "{what}: {refused:?}");
            }
            let next = client
                .send(&format!("{what}, then {THEN}"), THEN, b"", Body::WithHead)
                .await;
            assert_eq!(next.status, 200, "{what}, then {THEN}: {next:?}");
        })
        .await;
        if let Err(failed) = tried {
            let panic = failed.into_panic();
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failures.push(message);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_alive_connection_survives_every_early_refusal() {
    let zookeeper = common::zookeeper().await;
    let connect = zookeeper.connect_string();
    let mut failures = Vec::new();

    // An open instance: refusals of the request itself.
    let open = Gate::start(&connect).await;
    let acquire = json!({ "lease": open.lease("1m").await });
    let limit = zkgate::listen::BODY_LIMIT_BYTES;
    for refusal in [
        Refusal::json(
            "a bad query parameter (400)",
            "POST /v1/locks/k/acquire?wait=banana HTTP/1.1",
            acquire.clone(),
            400,
        ),
        Refusal::json("no such route (404)", "POST /v1/nowhere HTTP/1.1", acquire.clone(), 404),
        Refusal::json(
            "a method the route does not take (405)",
            "PATCH /v1/locks/k/acquire HTTP/1.1",
            acquire.clone(),
            405,
        ),
        // No 415: a JSON body is read whatever its `Content-Type` (so that `curl -d` works),
        // and refused once read if it is not JSON.
        Refusal::new(
            "a body that is not JSON (400)",
            "POST /v1/leases HTTP/1.1",
            "text/plain",
            b"ttl=1m".to_vec(),
            400,
        ),
        // At the limit, refused for its query: drained all the same.
        Refusal::new(
            "a body at the limit (400)",
            "POST /v1/locks/k/acquire?wait=banana HTTP/1.1",
            "application/json",
            vec![b' '; limit],
            400,
        ),
    ] {
        survives(open.running.addr, &refusal, true, &mut failures).await;
    }
    // A body too large to drain: said so, closed, and the next request on a new connection.
    // (Just over the limit, it is read to its end before it is refused, and the connection
    // kept: twice the limit is not.)
    let too_large = Refusal::new(
        "a body over the limit (413)",
        "POST /v1/leases HTTP/1.1",
        "application/json",
        vec![b' '; 2 * limit],
        413,
    );
    survives(open.running.addr, &too_large, false, &mut failures).await;

    // Writes over the rate (429): the connection's first write takes the one token a second,
    // the refusal follows it at once.
    let mut config = common::test_config(&connect);
    config.write_rate = 1;
    let rated = Gate::start_with(config).await;
    let lease = br#"{"ttl": "1m"}"#.to_vec();
    let mut over_rate = Refusal::new(
        "a write over the rate (429)",
        "POST /v1/leases HTTP/1.1",
        "application/json",
        lease.clone(),
        429,
    );
    // (201, or 429 when the token of the run before has not come back yet.)
    over_rate.first = Some((over_rate.head.clone(), lease, &[201, 429]));
    survives(rated.running.addr, &over_rate, true, &mut failures).await;

    // Bearer tokens: none (401), and one without a grant on the name (403).
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, [admin, reader]) = auth_config(&dir, [("admin", ADMIN.to_string()), ("reader", grant("mine/", "read"))]);
    let mut config = common::test_config(&connect);
    config.auth_config = Some(path);
    let guarded = Gate::start_with(config).await;
    let admin_lease = guarded
        .call_as(
            Some(&admin),
            reqwest::Method::POST,
            "/v1/leases",
            Some(json!({"ttl": "1m"})),
        )
        .await;
    let acquire = json!({ "lease": admin_lease.str("id") });
    let head = "POST /v1/locks/k/acquire HTTP/1.1";
    let no_token = Refusal::json("no token (401)", head, acquire.clone(), 401);
    survives(guarded.running.addr, &no_token, true, &mut failures).await;
    let ungranted = Refusal::json(
        "a token without the grant (403)",
        format!("{head}\r\nAuthorization: Bearer {reader}"),
        acquire,
        403,
    );
    survives(guarded.running.addr, &ungranted, true, &mut failures).await;

    // ZooKeeper away (503): an instance whose ZooKeeper is nowhere.
    let nowhere = format!("127.0.0.1:{}", free_port().expect("port"));
    let away = zkgate::start(common::test_config(&nowhere)).await.expect("start");
    let unavailable = Refusal::json(
        "ZooKeeper away (503)",
        "POST /v1/leases HTTP/1.1",
        json!({"ttl": "1m"}),
        503,
    );
    survives(away.addr, &unavailable, true, &mut failures).await;

    assert!(
        failures.is_empty(),
        "{} of 20 failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
