//! zkgate tried as an attacker would, on real sockets with a real ZooKeeper: every scenario of
//! the hardening issue, each asserting the bound that holds it (docs/SECURITY.md lists them).

use crate::common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{Gate, raw_request, test_config, within, zookeeper};
use reqwest::StatusCode;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// Connects to `addr` from the loopback address `from` (any of 127.0.0.0/8).
async fn connect_from(from: [u8; 4], addr: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((from, 0)))?;
    socket.connect(addr).await
}

/// Waits until the server closes `stream` (a read of 0 bytes or an error), and how long it took.
async fn closed_by_server(stream: &mut TcpStream, limit: Duration) -> Duration {
    let started = Instant::now();
    let mut buffer = [0u8; 1024];
    within(limit, "the server to close the connection", async {
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    started.elapsed()
}

/// A client that stalls in the middle of its request head, or sends nothing at all, or stays
/// idle on a kept-alive connection, is closed after the header timeout; one that keeps its
/// long poll waiting is not.
#[tokio::test]
async fn stalled_silent_and_idle_connections_are_closed_after_the_header_timeout() {
    let zk = zookeeper().await;
    let mut config = test_config(&zk.connect_string());
    config.header_timeout = Duration::from_secs(1);
    let gate = Gate::start_with(config).await;
    let addr = gate.running.addr;

    let mut partial = TcpStream::connect(addr).await.expect("connect");
    partial
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("write");
    let mut silent = TcpStream::connect(addr).await.expect("connect");
    // Stops inside HTTP/2's preface: neither protocol's own timeout has begun.
    let mut preface = TcpStream::connect(addr).await.expect("connect");
    preface.write_all(b"PRI * HTTP/2.0\r\n").await.expect("write");
    let mut idle = TcpStream::connect(addr).await.expect("connect");
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .expect("write");
    for stream in [&mut partial, &mut silent, &mut preface, &mut idle] {
        let took = closed_by_server(stream, Duration::from_secs(10)).await;
        assert!(took < Duration::from_secs(5), "closed after {took:?}");
    }
    // None of them is left open on zkgate's side either.
    within(
        Duration::from_secs(5),
        "no connection left",
        gate.running.wait_connections(|open| open == 0),
    )
    .await;

    // A long poll outlives the header timeout: the request is being served.
    let lease = gate.lease("30s").await;
    let holder = gate.acquire("slow", &lease, "wait=0").await;
    assert_eq!(holder.status, StatusCode::OK);
    let waiter = gate.post("/v1/locks/slow/acquire?wait=3s", None).await;
    waiter.assert_problem(StatusCode::CONFLICT, None);
}

/// One address that opens connections and sends nothing takes at most its share: past it
/// they are closed at once, and another client is still served.
#[tokio::test]
async fn one_address_cannot_take_every_connection() {
    let zk = zookeeper().await;
    let mut config = test_config(&zk.connect_string());
    config.max_connections = Some(200);
    config.max_connections_per_address = Some(40);
    let gate = Gate::start_with(config).await;
    let addr = gate.running.addr;

    let mut hoard = Vec::new();
    for _ in 0..40 {
        hoard.push(connect_from([127, 0, 0, 5], addr).await.expect("connect"));
    }
    // The server counts a connection when it accepts it: wait for all 40 to be counted.
    within(
        Duration::from_secs(10),
        "the hoard to be accepted",
        gate.running.wait_connections(|open| open >= 40),
    )
    .await;
    let mut one_more = connect_from([127, 0, 0, 5], addr).await.expect("TCP accepts");
    let took = closed_by_server(&mut one_more, Duration::from_secs(5)).await;
    assert!(
        took < Duration::from_secs(2),
        "the 41st connection is closed at once ({took:?})"
    );

    let other = common::http_builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 6]))
        .build()
        .expect("client");
    let health = other
        .get(format!("http://{addr}/healthz"))
        .send()
        .await
        .expect("served");
    assert_eq!(health.status(), StatusCode::OK);
    drop(hoard);
}

/// `/observe` pings its sockets and closes one that answers nothing (not even a pong), as
/// `/v1/ws` does.
#[tokio::test]
async fn a_silent_observer_is_closed_after_the_idle_timeout() {
    let zk = zookeeper().await;
    let mut config = test_config(&zk.connect_string());
    config.ws_ping_interval = Duration::from_millis(200);
    config.ws_idle_timeout = Duration::from_secs(1);
    let gate = Gate::start_with(config).await;
    let mut stream = TcpStream::connect(gate.running.addr).await.expect("connect");
    let handshake = "GET /v1/elections/e/observe HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\n\
                     Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
    stream.write_all(handshake.as_bytes()).await.expect("handshake");
    // Read (the upgrade, the state, the pings) but never answer.
    let mut seen = Vec::new();
    let took = within(Duration::from_secs(10), "the silent observer to be closed", async {
        let started = Instant::now();
        let mut buffer = [0u8; 4096];
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return started.elapsed(),
                Ok(n) => seen.extend_from_slice(&buffer[..n]),
            }
        }
    })
    .await;
    assert!(String::from_utf8_lossy(&seen).starts_with("HTTP/1.1 101"), "upgraded");
    assert!(took < Duration::from_secs(5), "closed after {took:?}");
    // The close frame's status: 4000 (0x0FA0), after the opcode 0x88 and the length.
    assert!(
        seen.windows(4).any(|w| w == [0x88, 0x0e, 0x0f, 0xa0]),
        "close code 4000"
    );
}

/// A page that rebinds its own name to zkgate's address makes the browser send its own name as
/// `Host` (and a matching `Origin`): writes and sockets are refused, reads are not.
#[tokio::test]
async fn a_rebinding_page_cannot_write_or_open_a_socket() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let addr = gate.running.addr;
    let port = addr.port();
    let evil = format!("evil.example:{port}");
    let origin = format!("http://evil.example:{port}");
    let headers = [("host", evil.as_str()), ("origin", origin.as_str())];
    let write = raw_request(addr, "POST", "/v1/locks/x/acquire?wait=0", &headers, b"").await;
    write.assert_problem(StatusCode::FORBIDDEN, None);
    let upgrade = [
        ("host", evil.as_str()),
        ("connection", "Upgrade, close"),
        ("upgrade", "websocket"),
        ("sec-websocket-version", "13"),
        ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
    ];
    raw_request(addr, "GET", "/v1/ws", &upgrade, b"")
        .await
        .assert_problem(StatusCode::FORBIDDEN, None);
    assert_eq!(
        raw_request(addr, "GET", "/v1/locks/x", &headers, b"").await.status,
        StatusCode::OK
    );
    // zkgate's own names still write.
    for host in [format!("localhost:{port}"), addr.to_string()] {
        let own = raw_request(addr, "POST", "/v1/leases", &[("host", host.as_str())], b"").await;
        assert_eq!(own.status, StatusCode::CREATED, "{host}: {own:?}");
    }
    assert!(
        gate.get("/v1/locks/x").await.body["holder"].is_null(),
        "nothing was taken"
    );
}

/// Durations past their bounds are refused (400) instead of panicking later, when they are
/// added to a clock or written as a timestamp.
#[tokio::test]
async fn durations_past_their_bounds_are_refused_not_panicked_on() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let item = gate.post("/v1/queues/q/items", Some(json!({"a": 1}))).await;
    assert_eq!(item.status, StatusCode::CREATED);
    gate.post("/v1/queues/q/take?wait=0&ack_deadline=99999999999h", None)
        .await
        .assert_problem(StatusCode::BAD_REQUEST, Some("ack_deadline"));
    gate.post("/v1/queues/q/take?wait=0&ack_deadline=13h", None)
        .await
        .assert_problem(StatusCode::BAD_REQUEST, Some("ack_deadline"));
    let txn = json!({"id": "t", "participants": ["a"], "deadline": "999999999999h"});
    gate.post("/v1/txns", Some(txn))
        .await
        .assert_problem(StatusCode::BAD_REQUEST, Some("deadline"));
    let revoke = json!({"by": "me", "reason": "r", "grace": "25h"});
    gate.post("/v1/locks/x/revoke", Some(revoke))
        .await
        .assert_problem(StatusCode::BAD_REQUEST, Some("grace"));
    // The item is still there to take.
    let taken = gate.post("/v1/queues/q/take?wait=0&ack_deadline=12h", None).await;
    assert_eq!(taken.status, StatusCode::OK, "{taken:?}");
    assert!(taken.body["ack_deadline_at"].as_str().is_some());
}

/// Opens a WebSocket to `path` by hand and returns the stream after the `101` head.
async fn raw_socket(addr: SocketAddr, path: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let handshake = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    );
    stream.write_all(handshake.as_bytes()).await.expect("handshake");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).await.expect("the upgrade");
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 101"), "{}", String::from_utf8_lossy(&head));
    stream
}

/// Sends the header of a masked text frame of `length` bytes and a 64 KiB sliver of it, and
/// returns what the server sent until it closed the socket.
async fn announce_frame(addr: SocketAddr, length: u64) -> Vec<u8> {
    let mut stream = raw_socket(addr, "/v1/ws").await;
    let mut frame = vec![0x81, 0x80 | 127];
    frame.extend_from_slice(&length.to_be_bytes());
    frame.extend_from_slice(&[1, 2, 3, 4]);
    frame.extend(std::iter::repeat_n(b'a', 64 * 1024));
    // The server may close while the sliver is still being written.
    let _ = stream.write_all(&frame).await;
    until_closed(&mut stream).await
}

/// What the server sends on `stream` until it closes it (bounded).
async fn until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let mut seen = Vec::new();
    within(Duration::from_secs(10), "the socket to be closed", async {
        let mut buffer = [0u8; 1024];
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buffer[..n]),
            }
        }
    })
    .await;
    seen
}

/// A frame larger than `--ws-max-message` is refused from its header: the socket is closed
/// with 1009 (message too big) while only a sliver of it was sent, whether it announces 60 MB
/// or just past the limit, and zkgate serves on.
#[tokio::test]
async fn frames_over_the_limit_are_refused_from_their_header() {
    let zk = zookeeper().await;
    let mut config = test_config(&zk.connect_string());
    config.ws_max_message = 256 * 1024;
    let gate = Gate::start_with(config).await;
    for length in [60_000_000, 256 * 1024 + 1] {
        let seen = announce_frame(gate.running.addr, length).await;
        // The close frame's status: 1009 (0x03F1), after the opcode 0x88 and the length.
        assert!(
            seen.windows(4).any(|w| w[0] == 0x88 && w[2..] == [0x03, 0xf1]),
            "{length} bytes: close code 1009, got {seen:?}"
        );
    }
    assert_eq!(gate.get("/healthz").await.status, StatusCode::OK);
}

/// A text message that is not UTF-8 closes the socket with 1007 (invalid frame payload data,
/// RFC 6455 7.4.1), not a dropped connection (on a82bd35 it was dropped without a close frame).
#[tokio::test]
async fn a_text_message_that_is_not_utf8_is_closed_with_1007() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let mut stream = raw_socket(gate.running.addr, "/v1/ws").await;
    // A masked (with a zero mask) text frame of two bytes that are not UTF-8.
    let frame = [0x81, 0x80 | 2, 0, 0, 0, 0, 0xff, 0xfe];
    stream.write_all(&frame).await.expect("frame");
    let seen = until_closed(&mut stream).await;
    // The close frame's status: 1007 (0x03EF), after the opcode 0x88 and the length.
    assert!(
        seen.windows(4).any(|w| w[0] == 0x88 && w[2..] == [0x03, 0xef]),
        "close code 1007, got {seen:?}"
    );
    assert_eq!(gate.get("/healthz").await.status, StatusCode::OK);
}

/// Writes the `i`th value of `size` bytes to the key `big`.
fn put_big(
    gate: &Gate,
    i: usize,
    size: usize,
) -> impl std::future::Future<Output = reqwest::Result<reqwest::Response>> {
    let value = format!("{i:04}-{}", "x".repeat(size));
    gate.http
        .put(format!("{}/v1/kv/big", gate.url))
        .header("Content-Type", "text/plain")
        .body(value)
        .send()
}

/// Clients that subscribe to a large value and never read cost zkgate their send buffer, not
/// what is written meanwhile: 80 MB of changes leave at most `--ws-send-buffer` queued per
/// socket, and the process's memory does not follow the writes.
#[tokio::test]
async fn clients_that_never_read_cost_their_send_buffer_not_the_writes() {
    let zk = zookeeper().await;
    let mut config = test_config(&zk.connect_string());
    config.ws_send_buffer = 256 * 1024;
    let gate = Gate::start_with(config).await;
    let put = |i: usize| put_big(&gate, i, 200 * 1024);
    assert!(put(0).await.expect("PUT").status().is_success());
    let mut silent = Vec::new();
    for _ in 0..4 {
        let mut stream = raw_socket(gate.running.addr, "/v1/ws").await;
        // A masked text frame with the subscription, and then never a read again.
        let subscribe = br#"{"op":"subscribe","id":"s","topic":{"znode":{"path":"kv/big"}}}"#;
        let mut frame = vec![0x81, 0x80 | subscribe.len() as u8, 0, 0, 0, 0];
        frame.extend_from_slice(subscribe);
        stream.write_all(&frame).await.expect("subscribe");
        silent.push(stream);
    }
    // Each subscription holds a permit from the moment zkgate takes it on.
    within(
        Duration::from_secs(10),
        "the subscriptions",
        gate.running
            .state
            .limits
            .wait_held("subscriptions of anyone", |n| n == 4),
    )
    .await;
    let before = common::resident_bytes();
    let mut most_queued = 0.0f64;
    for i in 1..=400 {
        assert!(put(i).await.expect("PUT").status().is_success());
        if i % 20 == 0 {
            most_queued = most_queued.max(common::metric(&gate.url, "zkgate_ws_queued_bytes").await);
        }
    }
    let grown = common::resident_bytes().saturating_sub(before);
    assert!(
        most_queued <= (4 * 256 * 1024) as f64,
        "at most the 4 send buffers queued, saw {most_queued} bytes"
    );
    // And the silent sockets did fill their buffers: the writes reached them.
    assert!(
        most_queued >= (200 * 1024) as f64,
        "the silent sockets' buffers filled, saw {most_queued} bytes"
    );
    assert!(
        grown < 40 * 1024 * 1024,
        "80 MB written to 4 silent sockets grew the process by {} MiB",
        grown / (1024 * 1024)
    );
    drop(silent);
}

/// An event stream whose client stops reading (its receive window full) is cut once zkgate's
/// writes have made no progress for `--write-timeout`: the connection, its subscription and
/// its place in the limits come back, however much is written meanwhile.
#[tokio::test]
async fn an_event_stream_nobody_reads_is_cut_after_the_write_timeout() {
    let zk = zookeeper().await;
    let mut config = test_config(&zk.connect_string());
    config.write_timeout = Duration::from_secs(1);
    let gate = Gate::start_with(config).await;
    let put = |i: usize| put_big(&gate, i, 64 * 1024);
    assert!(put(0).await.expect("PUT").status().is_success());
    let socket = TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("a small receive buffer");
    let mut stream = socket.connect(gate.running.addr).await.expect("connect");
    stream
        .write_all(b"GET /v1/events?topic=znode:data:kv/big HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .expect("request");
    let limits = &gate.running.state.limits;
    within(
        Duration::from_secs(10),
        "the stream's subscription",
        limits.wait_held("subscriptions of anyone", |n| n == 1),
    )
    .await;
    // Changes keep coming while the client reads nothing.
    let writes = async {
        for i in 1.. {
            assert!(put(i).await.expect("PUT").status().is_success());
        }
    };
    tokio::select! {
        _ = writes => unreachable!(),
        _ = within(
            Duration::from_secs(30),
            "the stream to be cut",
            limits.wait_held("subscriptions of anyone", |n| n == 0),
        ) => {}
    }
    // And its connection is closed: reading now drains what the kernel had buffered, then
    // ends. (The test's own HTTP client keeps other connections open, so zkgate's count of
    // open connections says nothing here.)
    closed_by_server(&mut stream, Duration::from_secs(20)).await;
}

/// Long polls are capped per principal (with auth off: per client address) and on the whole
/// instance: past either, 429 with `Retry-After` naming the limit, while other requests are
/// served; a long poll whose client goes away gives its place back.
#[tokio::test]
async fn long_polls_are_capped_per_principal_and_per_instance() {
    let zk = zookeeper().await;
    let mut config = test_config(&zk.connect_string());
    config.max_long_polls_per_principal = 3;
    config.max_long_polls = 5;
    let gate = Gate::start_with(config).await;
    let put = gate
        .http
        .put(format!("{}/v1/kv/watched", gate.url))
        .json(&json!({"v": 1}))
        .send()
        .await
        .expect("PUT");
    let etag = put.headers()["etag"].to_str().expect("ETag").to_string();
    let client_at = |last: u8| {
        common::http_builder()
            .local_address(std::net::IpAddr::from([127, 0, 0, last]))
            .build()
            .expect("client")
    };
    let url = gate.url.clone();
    let long_poll = |client: reqwest::Client| {
        let (url, etag) = (url.clone(), etag.clone());
        tokio::spawn(async move {
            client
                .get(format!("{url}/v1/kv/watched?wait=60s"))
                .header("if-none-match", etag)
                .send()
                .await
        })
    };
    // A probe is a request to a long-poll endpoint that answers at once while there is room.
    let probe = |client: reqwest::Client| {
        let url = url.clone();
        async move {
            let response = client.get(format!("{url}/v1/kv/absent")).send().await.expect("probe");
            common::Reply::read(response).await
        }
    };
    // Waits until a probe from `client` is refused, and returns the refusal.
    let refused = |client: reqwest::Client| async move {
        within(Duration::from_secs(10), "the long polls to fill the limit", async {
            loop {
                let reply = probe(client.clone()).await;
                if reply.status == StatusCode::TOO_MANY_REQUESTS {
                    return reply;
                }
                assert_eq!(reply.status, StatusCode::NOT_FOUND);
                tokio::task::yield_now().await;
            }
        })
        .await
    };

    let mine: Vec<_> = (0..3).map(|_| long_poll(client_at(7))).collect();
    let full = refused(client_at(7)).await;
    full.assert_problem(StatusCode::TOO_MANY_REQUESTS, None);
    assert!(full.retry_after.is_some(), "Retry-After");
    assert!(
        full.body["detail"]
            .as_str()
            .unwrap()
            .contains("--max-long-polls-per-principal"),
        "{full:?}"
    );
    // Another client still has room, until the instance's five are taken.
    assert_eq!(probe(client_at(8)).await.status, StatusCode::NOT_FOUND);
    let theirs: Vec<_> = (0..2).map(|_| long_poll(client_at(8))).collect();
    let full = refused(client_at(9)).await;
    assert!(
        full.body["detail"].as_str().unwrap().contains("--max-long-polls)"),
        "{full:?}"
    );
    // Other requests are not long polls: served.
    let lease = gate.post("/v1/leases", None).await;
    assert_eq!(lease.status, StatusCode::CREATED);

    // A client that goes away gives its places back.
    for task in mine {
        task.abort();
    }
    // The server sees each go when its connection closes: then only the other client's two
    // are in flight, and the first client is served again.
    within(
        Duration::from_secs(10),
        "the places to come back",
        gate.running
            .state
            .limits
            .wait_held(zkgate::limits::LONG_POLLS, |n| n == 2),
    )
    .await;
    assert_eq!(probe(client_at(7)).await.status, StatusCode::NOT_FOUND);
    // The long polls still waiting are answered when the value changes.
    let put = gate
        .http
        .put(format!("{}/v1/kv/watched", gate.url))
        .json(&json!({"v": 2}))
        .send()
        .await
        .expect("PUT");
    assert!(put.status().is_success());
    for task in theirs {
        let answer = within(Duration::from_secs(10), "the long poll", task).await;
        assert_eq!(answer.expect("task").expect("answer").status(), StatusCode::OK);
    }
}

/// Acquires and releases lock `name` with `lease`.
async fn lock_cycle(http: &reqwest::Client, url: &str, lease: &str, name: &str) {
    let acquired: serde_json::Value = http
        .post(format!("{url}/v1/locks/{name}/acquire?wait=10s"))
        .json(&json!({ "lease": lease }))
        .send()
        .await
        .expect("acquire")
        .json()
        .await
        .expect("JSON");
    let handle = acquired["handle"]
        .as_str()
        .unwrap_or_else(|| panic!("granted: {acquired}"));
    let released = http
        .delete(format!("{url}/v1/locks/{name}/handles/{handle}"))
        .send()
        .await
        .expect("release");
    assert!(released.status().is_success(), "release: {}", released.status());
}

/// Locks `first..last` named `order-<n>`, 64 at a time.
async fn churn(http: &reqwest::Client, url: &str, lease: &str, names: std::ops::Range<usize>) {
    use futures::StreamExt;
    futures::stream::iter(names)
        .map(|n| async move { lock_cycle(http, url, lease, &format!("order-{n}")).await })
        .buffer_unordered(64)
        .collect::<Vec<()>>()
        .await;
}

/// A lock per order: unique lock names through a running instance (its own process) leave
/// `/metrics` flat and under 400 KB, with at most its bound of names in series of their own,
/// and zkgate's memory flat once warm.
///
/// Both are measured as a slope between two sizes, so that a few thousand names tell what a
/// hundred thousand would (BENCHMARKS.md has those, from `cargo bench --bench costs`). From
/// [WARM] names (past what fills once: the allocator's pages, the names' places, the buffers
/// a `/metrics` scrape leaves) to [WARM] + [STEPS] × [STEP], the resident memory is read after
/// each step of [STEP] names. A leak grows every step and the whole run alike, so the slope is
/// the smaller of two readings of it: the median of the steps' growth, which ignores the few
/// steps where the allocator moves the level by a few MiB at once (a page of threads' heaps
/// taken or given back), and the growth from the first reading to the last, which ignores how
/// the steps are spread (on a slow run, what zkgate keeps for a while after a name's last use
/// grows for most steps and then goes in a few: beside two CPU hogs, steps of +4 to +220 KiB
/// and of -596 KiB made a median of 114 B a name over a run that ended where it began).
/// mimalloc is told to give freed pages back at once (`MIMALLOC_PURGE_DELAY=0`), so that the
/// readings follow what is live. Measured on the 2-CPU machine: a step grows by 0–8 KiB without
/// a leak (0 B a name quiet), by 16–24 KiB with a `String` of each name kept (65–98 B a name by
/// the median, 648 B first to last); the bound is [LEAK_PER_NAME].
#[tokio::test]
async fn unique_name_churn_leaves_metrics_and_memory_flat() {
    common::yield_the_cpu();
    // A server of its own: on the run's shared one, what other tests ask of it slows each
    // release, and what zkgate keeps until then reads as growth.
    let zk = common::zookeeper_own().await;
    let allocator = [("MIMALLOC_PURGE_DELAY", "0")];
    let gate = common::process::Process::start_with_env(&zk.connect_string(), &[], &allocator).await;
    let pid = gate.child.id().expect("running").to_string();
    let http = common::http_client();
    let (status, lease) = gate
        .call(reqwest::Method::POST, "/v1/leases", Some(json!({"ttl": "10m"})))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let lease = lease["id"].as_str().expect("lease id").to_string();
    let metrics = || async {
        let text = http.get(format!("{}/metrics", gate.url)).send().await.expect("metrics");
        text.text().await.expect("text")
    };

    // Steps of STEP names, each followed by a scrape (as Prometheus would) and a reading.
    churn(&http, &gate.url, &lease, 0..WARM).await;
    let warm = metrics().await;
    let mut resident = vec![common::resident_bytes_of(&pid)];
    let mut text = String::new();
    for step in 0..STEPS {
        let first = WARM + step * STEP;
        churn(&http, &gate.url, &lease, first..first + STEP).await;
        text = metrics().await;
        resident.push(common::resident_bytes_of(&pid));
    }
    let growth: Vec<i64> = resident.windows(2).map(|w| w[1] as i64 - w[0] as i64).collect();
    let mut sorted = growth.clone();
    sorted.sort_unstable();
    let median = sorted[sorted.len() / 2] / STEP as i64;
    let whole = (resident[STEPS] as i64 - resident[0] as i64) / (STEPS * STEP) as i64;
    let per_name = median.min(whole);
    eprintln!(
        "from {WARM} to {} names, RSS {} KiB to {} KiB: {median} B a name by the median of {STEPS} steps, {whole} B \
         from first to last; /metrics {} B, then {} B",
        WARM + STEPS * STEP,
        resident[0] / 1024,
        resident[STEPS] / 1024,
        warm.len(),
        text.len()
    );
    assert!(
        per_name <= LEAK_PER_NAME,
        "unique names grew zkgate by {median} bytes a name (median step) and {whole} (first to last reading); \
         the steps' growth in KiB, in order: {:?}",
        growth.iter().map(|g| g / 1024).collect::<Vec<_>>()
    );
    // Flat: the counts' digits may grow, no series may come (names whose places went idle
    // may leave theirs meanwhile: on a slow run the first ones pass their two minutes).
    assert!(
        text.len() < warm.len() + 2048,
        "/metrics went from {} to {} bytes over {} new names",
        warm.len(),
        text.len(),
        STEPS * STEP
    );
    assert!(text.len() < 400 * 1024, "/metrics is {} KB", text.len() / 1024);
    assert!(
        text.contains(r#"zkgate_lock_acquisitions_total{kind="lock",name="_other"}"#),
        "the names without a place are counted together"
    );
    let per_name_series = text
        .lines()
        .filter(|l| l.starts_with("zkgate_lock_acquisitions_total{") && l.contains("order-"))
        .count();
    assert!(
        per_name_series <= zkgate::metrics::NAMES_PER_KIND,
        "{per_name_series} names have series of their own"
    );
}

/// Names before the first reading of [unique_name_churn_leaves_metrics_and_memory_flat]: the
/// names' places fill within the first hundred, the allocator within a thousand or two.
const WARM: usize = 2_000;

/// Names a step, as many as 64 at a time.
const STEP: usize = 250;

/// Steps read after the warm-up.
const STEPS: usize = 24;

/// Most bytes of memory a unique name may leave behind (the smaller of the two slopes): a kept
/// `String` of each name reads 65–98 B by the median step and 648 B first to last.
const LEAK_PER_NAME: i64 = 48;

/// Items and values are stored raw and limited by their stored size: a text item of control
/// characters (six times larger escaped in JSON) takes its own size in ZooKeeper, and one over
/// `--max-value-bytes` is refused with 413 before anything is written, so that no write can
/// reach ZooKeeper's 1 MiB `jute.maxbuffer` (past which ZooKeeper drops the connection).
#[tokio::test]
async fn values_are_stored_raw_and_limited_by_their_stored_size() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let put_item = |body: Vec<u8>| {
        gate.http
            .post(format!("{}/v1/queues/raw/items", gate.url))
            .header("content-type", "text/plain")
            .body(body)
            .send()
    };
    let connections = common::metric(&gate.url, "zkgate_zookeeper_connections").await;
    let controls = "\u{1}".repeat(200 * 1024);
    let stored = put_item(controls.clone().into_bytes()).await.expect("put");
    assert_eq!(stored.status(), StatusCode::CREATED);
    let client = common::zk_client(&zk.connect_string()).await;
    let items = client.list_children("/zkgate/queues/raw/items").await.expect("items");
    let (data, _) = client
        .get_data(&format!("/zkgate/queues/raw/items/{}", items[0]))
        .await
        .expect("item");
    assert!(
        data.len() < controls.len() + 256,
        "{} bytes stored for a body of {}",
        data.len(),
        controls.len()
    );

    // 400 KB: over the 256 KiB limit (escaped, it was 2.4 MB: past jute.maxbuffer).
    let refused = common::Reply::read(put_item("\u{1}".repeat(400 * 1024).into_bytes()).await.expect("put")).await;
    refused.assert_problem(StatusCode::PAYLOAD_TOO_LARGE, None);
    assert_eq!(refused.body["type"], "urn:zkgate:problem:value-too-large");
    assert_eq!(refused.body["limit_bytes"], 256 * 1024);
    let put_value = |body: Vec<u8>| {
        gate.http
            .put(format!("{}/v1/kv/big", gate.url))
            .header("content-type", "application/octet-stream")
            .body(body)
            .send()
    };
    assert!(put_value(vec![7; 1000]).await.expect("put").status().is_success());
    let refused = common::Reply::read(put_value(vec![8; 300 * 1024]).await.expect("put")).await;
    assert_eq!(
        refused.body["type"], "urn:zkgate:problem:value-too-large",
        "{refused:?}"
    );
    assert_eq!(refused.body["size_bytes"], 300 * 1024);

    // Nothing else was stored or lost, and the connection to ZooKeeper stayed up.
    let items = client.list_children("/zkgate/queues/raw/items").await.expect("items");
    assert_eq!(items.len(), 1);
    let (value, _) = client.get_data("/zkgate/kv/big").await.expect("value");
    assert_eq!(value, vec![7; 1000]);
    assert_eq!(
        common::metric(&gate.url, "zkgate_zookeeper_connections").await,
        connections,
        "ZooKeeper never dropped zkgate's connection"
    );
    let taken = gate.post("/v1/queues/raw/take?wait=0&mode=at-most-once", None).await;
    assert_eq!(taken.status, StatusCode::OK);
    assert_eq!(taken.body["text"].as_str().map(str::len), Some(controls.len()));
}

/// What a client writes reaches the log escaped: a `reason` (or a field name) holding a
/// newline and a made-up log line stays inside its own line.
#[tokio::test]
async fn client_text_cannot_forge_a_log_line() {
    let zk = zookeeper().await;
    let gate = common::process::Process::start_with(&zk.connect_string(), &[]).await;
    let forged = "2026-01-01T00:00:00.000000Z  INFO zkgate: FORGED lease ended";
    let (status, _) = gate
        .call(
            reqwest::Method::POST,
            "/v1/locks/logged/acquire?wait=0",
            Some(json!({"ttl": "30s"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, reply) = gate
        .call(
            reqwest::Method::POST,
            "/v1/locks/logged/revoke",
            Some(json!({"by": format!("me\n{forged}"), "reason": format!("done\r\n{forged}")})),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    gate.wait_log(Duration::from_secs(10), "the revocation is logged", |line| {
        line.contains("revocation requested")
    })
    .await;
    let (status, _) = gate
        .call(
            reqwest::Method::POST,
            "/v1/txns",
            Some(json!({"id": "t", "participants": ["p"], format!("x\n{forged}"): 1})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let log = gate.log();
    let logged = log.iter().find(|l| l.contains("revocation requested")).expect("logged");
    assert!(
        logged.contains("FORGED"),
        "the reason is in the line, escaped: {logged}"
    );
    assert!(
        !log.iter()
            .any(|line| line.starts_with("2026-01-01") || line.trim_start().starts_with("INFO zkgate: FORGED")),
        "a forged line:\n{}",
        log.join("\n")
    );
}
