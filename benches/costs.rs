//! What clients cost zkgate, and that its bounds hold, on the release binary in its own process
//! (so that its resident memory can be read from `/proc` apart from the clients'):
//!
//! - memory per subscription, each on a topic of its own and all on one topic;
//! - memory per kv long poll in flight;
//! - memory while sockets subscribed to a large value never read and the value keeps changing;
//! - `/metrics` and memory after a churn of unique lock names (a lock per order);
//! - ZooKeeper's node count after a churn of unique lock names, transactions and keyed puts
//!   (half, a quarter and a quarter of `ZKGATE_BENCH_RETENTION`), and how long until it is back
//!   to what it held before plus what is live;
//! - 1,000 long polls of one client over 1,000 HTTP/1.1 connections against one HTTP/2
//!   connection: zkgate's memory while they wait, and its CPU to take them and answer them.
//!
//! Run: `cargo bench --bench costs` (`ZKGATE_BENCH_SUBSCRIPTIONS`, default 6400;
//! `ZKGATE_BENCH_LONG_POLLS`, default 3000; `ZKGATE_BENCH_CHURN`, default 100000 names;
//! `ZKGATE_BENCH_PROTOCOL_POLLS`, default 1000; `ZKGATE_BENCH_RETENTION`, default 100000 names;
//! `ZKGATE_BENCH_PARTS`, a comma-separated choice of
//! `subscriptions,long-polls,silent,churn,retention,protocols`, default all). The tests check
//! the same properties at a few thousand names (`tests/it/abuse.rs`, `tests/it/retention.rs`).

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;
use zkgate::zk::server::{ServerOptions, ZooKeeperServer};

// The comparison bench's child processes and `/proc` readers.
#[allow(dead_code)]
#[path = "compare/process.rs"]
mod process;

/// Most subscriptions one socket may hold (zkgate's per-socket limit).
const PER_SOCKET: usize = 64;

#[path = "compare/runtime.rs"]
mod runtime;

use process::setting;

fn main() {
    runtime::block_on(run());
}

async fn run() {
    let server = process::zookeeper_without_fsync().await;
    let connect = server.connect_string();
    let subscriptions = setting("ZKGATE_BENCH_SUBSCRIPTIONS", 6400);
    let long_polls = setting("ZKGATE_BENCH_LONG_POLLS", 3000);
    let churn = setting("ZKGATE_BENCH_CHURN", 100_000);

    let parts = std::env::var("ZKGATE_BENCH_PARTS").unwrap_or_default();
    let part = |name: &str| parts.is_empty() || parts.split(',').any(|p| p.trim() == name);
    println!("| what | figure |");
    println!("|---|---|");
    if part("protocols") {
        let polls = setting("ZKGATE_BENCH_PROTOCOL_POLLS", 1000);
        for h2 in [false, true] {
            let gate = Gate::start(&connect, &["--max-long-polls-per-principal", &polls.to_string()]).await;
            let cost = long_polls_over(&gate, polls, h2).await;
            let over = if h2 {
                "one HTTP/2 connection".to_string()
            } else {
                format!("{polls} HTTP/1.1 connections")
            };
            println!(
                "| {polls} kv long polls of one client over {over}, answered by one write | {:.1} KiB a poll while waiting; zkgate CPU {:.0} ms to take and answer them all ({:.0} µs a poll) |",
                cost.bytes_per_poll / 1024.0,
                cost.cpu.as_secs_f64() * 1e3,
                cost.cpu.as_secs_f64() * 1e6 / polls as f64
            );
        }
    }
    if part("subscriptions") {
        for shared in [false, true] {
            let gate = Gate::start(&connect, &[]).await;
            let bytes = per_subscription(&gate, subscriptions, shared).await;
            let topics = if shared { "one topic" } else { "a topic each" };
            println!(
                "| memory per subscription ({subscriptions}, {topics}) | {:.1} KiB |",
                bytes / 1024.0
            );
        }
    }
    if part("long-polls") {
        let gate = Gate::start(&connect, &["--max-long-polls-per-principal", &long_polls.to_string()]).await;
        let bytes = per_long_poll(&gate, long_polls).await;
        println!("| memory per kv long poll ({long_polls}) | {:.1} KiB |", bytes / 1024.0);
    }
    if part("silent") {
        let gate = Gate::start(&connect, &[]).await;
        let silent = silent_sockets(&gate).await;
        println!(
            "| RSS: 4 silent sockets on a 240 KB value, 40 writes | {:.0} MiB before, {:.0} MiB after; at most {:.1} MiB queued |",
            mib(silent.before),
            mib(silent.after),
            mib(silent.most_queued)
        );
    }
    if part("churn") {
        let gate = Gate::start(&connect, &[]).await;
        let churned = unique_names(&gate, churn).await;
        println!(
            "| {churn} unique lock names in {:.1} s | RSS {:.0} MiB before, {:.0} MiB after; `/metrics` {:.0} KiB before, {:.0} KiB after |",
            churned.took.as_secs_f64(),
            mib(churned.before),
            mib(churned.after),
            churned.metrics_before / 1024.0,
            churned.metrics_after / 1024.0
        );
    }
    if part("retention") {
        let names = setting("ZKGATE_BENCH_RETENTION", 100_000);
        let r = retention(names).await;
        println!(
            "| retention: {} lock names, {} transactions, {} keyed puts in {:.1} s | znodes {} before, {} right after, back to {} {:.1} s later |",
            names / 2,
            names / 4,
            names / 4,
            r.took.as_secs_f64(),
            r.before,
            r.peak,
            r.after,
            r.settled.as_secs_f64()
        );
    }
}

/// What a churn left in ZooKeeper (see [retention]).
struct Retention {
    took: Duration,
    before: u64,
    peak: u64,
    after: u64,
    settled: Duration,
}

/// On a ZooKeeper of its own (containers checked every 200 ms), with a janitor every 200 ms
/// that forgets idempotency keys and decided transactions after a second: `names / 2` unique
/// lock names taken and released, `names / 4` transactions created and decided (an abort at
/// their 1 ms deadline), `names / 4` keyed puts taken at most once, 16 at a time, beside what
/// stays live (a held lock, an open transaction, a queue with a keyed item). ZooKeeper's node
/// count before, right after, and once it stopped falling (read every 200 ms, until it has
/// not changed for 10 s).
async fn retention(names: usize) -> Retention {
    use futures::StreamExt;
    let options = ServerOptions {
        force_sync: false,
        container_check_interval: Duration::from_millis(200),
        ..ServerOptions::default()
    };
    let server = ZooKeeperServer::start_standalone(&options)
        .await
        .expect("start ZooKeeper");
    let port = server.client_port();
    let quick = [
        "--idempotency-window",
        "1s",
        "--txn-retention",
        "1s",
        "--janitor-interval",
        "200ms",
        "--janitor-rate",
        "1000000",
        "--quota-znodes",
        "0",
        "--quota-znodes-per-principal",
        "0",
    ];
    let gate = Gate::start(&server.connect_string(), &quick).await;
    let http = reqwest::Client::new();
    let base = format!("http://{}", gate.addr);
    // A request that must succeed; `key`: its `Idempotency-Key`.
    let call = |method: reqwest::Method, path: String, body: serde_json::Value, key: Option<String>| {
        let (http, base) = (http.clone(), base.clone());
        async move {
            let mut request = http.request(method, format!("{base}{path}")).json(&body);
            if let Some(key) = key {
                request = request.header("Idempotency-Key", key);
            }
            let answer = request.send().await.expect("request");
            assert!(answer.status().is_success(), "{path}: {}", answer.status());
            answer.json::<serde_json::Value>().await.unwrap_or_default()
        }
    };
    let post = reqwest::Method::POST;
    let lease = call(
        post.clone(),
        "/v1/leases".into(),
        serde_json::json!({"ttl": "1h"}),
        None,
    )
    .await;
    let lease = lease["id"].as_str().expect("lease id").to_string();
    // What stays live; the kinds' directories are made by it, before the count.
    let held = serde_json::json!({ "lease": lease });
    call(post.clone(), "/v1/locks/held/acquire?wait=0".into(), held.clone(), None).await;
    let open = serde_json::json!({"id": "open", "participants": ["p"], "deadline": "1h"});
    call(post.clone(), "/v1/txns".into(), open, None).await;
    let kept = Some("kept".to_string());
    call(
        post.clone(),
        "/v1/queues/keep/items".into(),
        serde_json::json!("kept"),
        kept,
    )
    .await;
    let before = process::zookeeper_figure(port, "zk_znode_count");

    let started = std::time::Instant::now();
    let work = (0..names).map(|i| {
        let (call, post, held) = (&call, post.clone(), held.clone());
        async move {
            match i % 4 {
                0 | 1 => {
                    let got = call(post, format!("/v1/locks/order-{i}/acquire?wait=5s"), held, None).await;
                    let handle = got["handle"].as_str().expect("handle");
                    let path = format!("/v1/locks/order-{i}/handles/{handle}");
                    call(reqwest::Method::DELETE, path, serde_json::Value::Null, None).await;
                }
                2 => {
                    let txn = serde_json::json!({"id": format!("t-{i}"), "participants": ["p"], "deadline": "1ms"});
                    call(post, "/v1/txns".into(), txn, None).await;
                }
                _ => {
                    let queue = format!("/v1/queues/churn-{}/items", i % 64);
                    call(post.clone(), queue, serde_json::json!(i), Some(format!("k-{i}"))).await;
                    let take = format!("/v1/queues/churn-{}/take?wait=5s&mode=at-most-once", i % 64);
                    call(post, take, serde_json::Value::Null, None).await;
                }
            }
        }
    });
    futures::stream::iter(work)
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
    let took = started.elapsed();
    let peak = process::zookeeper_figure(port, "zk_znode_count");
    let (mut after, mut last_change) = (peak, std::time::Instant::now());
    while last_change.elapsed() < Duration::from_secs(10) && started.elapsed() < took + Duration::from_secs(600) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = process::zookeeper_figure(port, "zk_znode_count");
        if now != after {
            (after, last_change) = (now, std::time::Instant::now());
        }
    }
    Retention {
        took,
        before,
        peak,
        after,
        settled: last_change.duration_since(started) - took,
    }
}

/// What a client's long polls cost zkgate.
struct PollCost {
    bytes_per_poll: f64,
    cpu: Duration,
}

/// `count` kv long polls of one client, over a connection each (HTTP/1.1) or all over one
/// (`h2`: HTTP/2 with prior knowledge), then one write that answers them all: zkgate's memory
/// per poll while they wait, and its CPU from the first request to the last answer.
async fn long_polls_over(gate: &Gate, count: usize, h2: bool) -> PollCost {
    let builder = reqwest::Client::builder().pool_max_idle_per_host(count);
    let http = if h2 {
        builder.http2_prior_knowledge()
    } else {
        builder.http1_only()
    }
    .build()
    .expect("client");
    let base = format!("http://{}", gate.addr);
    let put = |v: u32| {
        http.put(format!("{base}/v1/kv/polled"))
            .json(&serde_json::json!({ "v": v }))
            .send()
    };
    let etag = put(1).await.expect("PUT").headers()["etag"]
        .to_str()
        .expect("ETag")
        .to_string();
    let before = gate.settled_rss().await;
    let cpu_before = gate.child.cpu_time();
    let polls: Vec<_> = (0..count)
        .map(|_| {
            let request = http
                .get(format!("{base}/v1/kv/polled?wait=60s"))
                .header("if-none-match", &etag)
                .send();
            tokio::spawn(request)
        })
        .collect();
    let waiting = gate.settled_rss().await;
    for poll in &polls {
        assert!(!poll.is_finished(), "a long poll was answered early");
    }
    assert!(put(2).await.expect("PUT").status().is_success());
    for poll in polls {
        let answer = poll.await.expect("poll").expect("answer");
        assert_eq!(answer.status(), reqwest::StatusCode::OK);
        assert_eq!(answer.version() == reqwest::Version::HTTP_2, h2);
    }
    // The CPU of the waits themselves (two settling seconds of an idle server) is nothing.
    let cpu = gate.child.cpu_time() - cpu_before;
    PollCost {
        bytes_per_poll: (waiting - before) / count as f64,
        cpu,
    }
}

fn mib(bytes: f64) -> f64 {
    bytes / (1024.0 * 1024.0)
}

/// zkgate's memory per subscription: `count` subscriptions over sockets of 64, each on a lock
/// of its own (`shared`: all on one), after they settle.
async fn per_subscription(gate: &Gate, count: usize, shared: bool) -> f64 {
    let before = gate.settled_rss().await;
    let mut sockets = Vec::new();
    for first in (0..count).step_by(PER_SOCKET) {
        let (mut socket, _) = tokio_tungstenite::connect_async(format!("ws://{}/v1/ws", gate.addr))
            .await
            .expect("connect");
        let last = (first + PER_SOCKET).min(count);
        for i in first..last {
            let name = if shared { "shared".to_string() } else { format!("s-{i}") };
            let subscribe = format!(r#"{{"op":"subscribe","id":"{i}","topic":{{"lock":"{name}"}}}}"#);
            socket.send(Message::Text(subscribe.into())).await.expect("subscribe");
        }
        // Every subscription's first state.
        let mut states = 0;
        while states < last - first {
            match socket.next().await {
                Some(Ok(Message::Text(text))) if text.contains(r#""type":"state""#) => states += 1,
                Some(Ok(_)) => {}
                other => panic!("no first state: {other:?}"),
            }
        }
        sockets.push(socket);
    }
    let after = gate.settled_rss().await;
    drop(sockets);
    (after - before) / count as f64
}

/// zkgate's memory per kv long poll: `count` requests waiting for a value to change.
async fn per_long_poll(gate: &Gate, count: usize) -> f64 {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .expect("client");
    let base = format!("http://{}", gate.addr);
    let put = http
        .put(format!("{base}/v1/kv/watched"))
        .json(&serde_json::json!({"v": 1}))
        .send()
        .await
        .expect("PUT");
    let etag = put.headers()["etag"].to_str().expect("ETag").to_string();
    let before = gate.settled_rss().await;
    let polls: Vec<_> = (0..count)
        .map(|_| {
            let request = http
                .get(format!("{base}/v1/kv/watched?wait=60s"))
                .header("if-none-match", &etag)
                .send();
            tokio::spawn(request)
        })
        .collect();
    let after = gate.settled_rss().await;
    for poll in &polls {
        assert!(!poll.is_finished(), "a long poll was answered early");
    }
    for poll in polls {
        poll.abort();
    }
    (after - before) / count as f64
}

struct Silent {
    before: f64,
    after: f64,
    most_queued: f64,
}

/// Four sockets subscribe to a 240 KB value and never read again; the value is written 40
/// times.
async fn silent_sockets(gate: &Gate) -> Silent {
    let http = reqwest::Client::new();
    let base = format!("http://{}", gate.addr);
    let put = |i: usize| {
        // Text with quotes and newlines, so that the events' JSON is larger than the value.
        let value = format!("{i:04}{}", "\"\n".repeat(120 * 1024));
        http.put(format!("{base}/v1/kv/big"))
            .header("content-type", "text/plain")
            .body(value)
            .send()
    };
    assert!(put(0).await.expect("PUT").status().is_success());
    let before = gate.settled_rss().await;
    let mut silent = Vec::new();
    for _ in 0..4 {
        let (mut socket, _) = tokio_tungstenite::connect_async(format!("ws://{}/v1/ws", gate.addr))
            .await
            .expect("connect");
        let subscribe = r#"{"op":"subscribe","id":"s","topic":{"znode":{"path":"kv/big"}}}"#;
        socket.send(Message::Text(subscribe.into())).await.expect("subscribe");
        silent.push(socket);
    }
    let mut most_queued = 0.0f64;
    for i in 1..=40 {
        assert!(put(i).await.expect("PUT").status().is_success());
        most_queued = most_queued.max(gate.gauge("zkgate_ws_queued_bytes").await);
    }
    let after = gate.settled_rss().await;
    drop(silent);
    Silent {
        before,
        after,
        most_queued,
    }
}

struct Churn {
    took: Duration,
    before: f64,
    after: f64,
    metrics_before: f64,
    metrics_after: f64,
}

/// `count` unique lock names, each acquired and released once with one lease, 64 at a time.
async fn unique_names(gate: &Gate, count: usize) -> Churn {
    let http = reqwest::Client::new();
    let base = format!("http://{}", gate.addr);
    let lease: serde_json::Value = http
        .post(format!("{base}/v1/leases"))
        .json(&serde_json::json!({"ttl": "10m"}))
        .send()
        .await
        .expect("lease")
        .json()
        .await
        .expect("JSON");
    let lease = lease["id"].as_str().expect("lease id").to_string();
    let metrics_before = gate.metrics().await.len() as f64;
    let before = gate.settled_rss().await;
    let names: Vec<usize> = (0..count).collect();
    let started = std::time::Instant::now();
    for batch in names.chunks(64) {
        let cycles: Vec<_> = batch
            .iter()
            .map(|&i| {
                let (http, base, lease) = (http.clone(), base.clone(), lease.clone());
                tokio::spawn(async move {
                    let acquired: serde_json::Value = http
                        .post(format!("{base}/v1/locks/order-{i}/acquire?wait=5s"))
                        .json(&serde_json::json!({"lease": lease}))
                        .send()
                        .await
                        .expect("acquire")
                        .json()
                        .await
                        .expect("JSON");
                    let handle = acquired["handle"].as_str().expect("handle");
                    let released = http
                        .delete(format!("{base}/v1/locks/order-{i}/handles/{handle}"))
                        .send()
                        .await
                        .expect("release");
                    assert!(released.status().is_success(), "release: {}", released.status());
                })
            })
            .collect();
        for cycle in cycles {
            cycle.await.expect("cycle");
        }
    }
    let took = started.elapsed();
    let after = gate.settled_rss().await;
    let metrics_after = gate.metrics().await.len() as f64;
    Churn {
        took,
        before,
        after,
        metrics_before,
        metrics_after,
    }
}

/// zkgate as a child process.
struct Gate {
    child: process::Child,
    addr: std::net::SocketAddr,
}

impl Gate {
    async fn start(connect: &str, flags: &[&str]) -> Gate {
        let flags = [&["--write-rate", "0"], flags].concat();
        let (child, addr) = process::zkgate(connect, &flags).await;
        Gate { child, addr }
    }

    /// zkgate's resident memory after two quiet seconds (the allocator returns a burst's
    /// memory to its arenas).
    async fn settled_rss(&self) -> f64 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        self.child.rss_bytes() as f64
    }

    async fn metrics(&self) -> String {
        reqwest::get(format!("http://{}/metrics", self.addr))
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text")
    }

    async fn gauge(&self, name: &str) -> f64 {
        self.metrics()
            .await
            .lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
            .unwrap_or_else(|| panic!("{name} in /metrics"))
    }
}
