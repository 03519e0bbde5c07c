//! WebSocket fan-out: how long one leadership change takes to reach 1,000 and 5,000
//! subscribed sockets, and how much of zkgate's memory an idle subscribed socket costs.
//!
//! zkgate runs as its own process (the release binary, `serve --zookeeper ...`), so that its
//! resident memory can be read from `/proc` apart from the client's. Each socket is a
//! `/v1/ws` connection subscribed to `{"election": "bench"}`. A round is one change: a
//! candidate campaigns (a new leader) or resigns (no leader); the delivery time of a socket
//! is from just before the HTTP request that makes the change to the moment the socket has
//! read the event. Client and server share the machine's two cores.
//!
//! Run: `cargo bench --bench fanout` (`ZKGATE_BENCH_SOCKETS`, default `1000,5000`;
//! `ZKGATE_BENCH_ROUNDS`, default 10 changes per size).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

// The comparison bench's `/proc` readers.
#[allow(dead_code)]
#[path = "compare/process.rs"]
mod process;

#[path = "compare/runtime.rs"]
mod runtime;

fn main() {
    runtime::block_on(run());
}

async fn run() {
    let sizes: Vec<usize> = std::env::var("ZKGATE_BENCH_SOCKETS")
        .unwrap_or_else(|_| "1000,5000".into())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    let rounds: usize = std::env::var("ZKGATE_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let server = process::zookeeper_without_fsync().await;
    println!("| sockets | changes | p50 | p99 | max | zkgate RSS per idle socket |");
    println!("|---|---|---|---|---|---|");
    for size in sizes {
        let gate = Gate::start(&server.connect_string()).await;
        let report = measure(&gate, size, rounds).await;
        println!(
            "| {size} | {rounds} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} KiB |",
            report.p50.as_secs_f64() * 1e3,
            report.p99.as_secs_f64() * 1e3,
            report.max.as_secs_f64() * 1e3,
            report.bytes_per_socket / 1024.0
        );
    }
}

struct Report {
    p50: Duration,
    p99: Duration,
    max: Duration,
    bytes_per_socket: f64,
}

async fn measure(gate: &Gate, size: usize, rounds: usize) -> Report {
    let http = reqwest::Client::new();
    let base = format!("http://{}", gate.addr);
    // One change first, so that the election's znodes exist and the code paths are warm.
    let warm = campaign(&http, &base).await;
    resign(&http, &base, &warm).await;

    let before = gate.rss_bytes();
    let (events, mut received) = mpsc::unbounded_channel::<(&'static str, Instant)>();
    let url = Arc::new(format!("ws://{}/v1/ws", gate.addr));
    // Connect in batches (the listen backlog is finite); every socket has its first state.
    let mut readers = Vec::with_capacity(size);
    for batch in (0..size).collect::<Vec<_>>().chunks(200) {
        let connecting: Vec<_> = batch
            .iter()
            .map(|_| tokio::spawn(subscribe(url.clone(), events.clone())))
            .collect();
        for connected in connecting {
            readers.push(connected.await.expect("subscribe"));
        }
    }
    // Let zkgate settle (allocations of the burst returned to its arenas) before reading RSS.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let bytes_per_socket = (gate.rss_bytes().saturating_sub(before)) as f64 / size as f64;

    let mut latencies = Vec::with_capacity(size * rounds);
    let mut leader = None;
    for round in 0..rounds {
        let start = Instant::now();
        let expected = match leader.take() {
            None => {
                leader = Some(campaign(&http, &base).await);
                "leader"
            }
            Some(handle) => {
                resign(&http, &base, &handle).await;
                "no_leader"
            }
        };
        let mut seen = 0;
        while seen < size {
            let (kind, at) = tokio::time::timeout(Duration::from_secs(60), received.recv())
                .await
                .unwrap_or_else(|_| panic!("round {round}: only {seen} of {size} sockets got the change"))
                .expect("readers alive");
            if kind == expected {
                latencies.push(at - start);
                seen += 1;
            }
        }
    }
    if let Some(handle) = leader {
        resign(&http, &base, &handle).await;
    }
    for reader in readers {
        reader.abort();
    }
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];
    Report {
        p50: at(0.5),
        p99: at(0.99),
        max: at(1.0),
        bytes_per_socket,
    }
}

/// Opens a socket, subscribes, waits for the first state; then a task reports each
/// leadership change it reads.
async fn subscribe(
    url: Arc<String>,
    events: mpsc::UnboundedSender<(&'static str, Instant)>,
) -> tokio::task::JoinHandle<()> {
    let (mut socket, _) = tokio_tungstenite::connect_async(url.as_str()).await.expect("connect");
    let subscribe = r#"{"op":"subscribe","id":"e","topic":{"election":"bench"}}"#;
    socket.send(Message::Text(subscribe.into())).await.expect("subscribe");
    loop {
        match socket.next().await {
            Some(Ok(Message::Text(text))) if text.contains(r#""type":"state""#) => break,
            Some(Ok(_)) => {}
            other => panic!("no first state: {other:?}"),
        }
    }
    tokio::spawn(async move {
        while let Some(Ok(message)) = socket.next().await {
            let Message::Text(text) = message else { continue };
            let at = Instant::now();
            let kind = if text.contains(r#""type":"leader""#) {
                "leader"
            } else if text.contains(r#""type":"no_leader""#) {
                "no_leader"
            } else {
                continue;
            };
            if events.send((kind, at)).is_err() {
                return;
            }
        }
    })
}

async fn campaign(http: &reqwest::Client, base: &str) -> String {
    let reply: serde_json::Value = http
        .post(format!("{base}/v1/elections/bench/campaign?wait=5s"))
        .send()
        .await
        .expect("campaign")
        .json()
        .await
        .expect("JSON");
    reply["handle"].as_str().expect("leader handle").to_string()
}

async fn resign(http: &reqwest::Client, base: &str, handle: &str) {
    let status = http
        .delete(format!("{base}/v1/elections/bench/candidates/{handle}"))
        .send()
        .await
        .expect("resign")
        .status();
    assert!(status.is_success(), "resign: {status}");
}

/// zkgate as a child process.
struct Gate {
    child: process::Child,
    addr: std::net::SocketAddr,
}

impl Gate {
    async fn start(connect: &str) -> Gate {
        let (child, addr) = process::zkgate(connect, &[]).await;
        Gate { child, addr }
    }

    /// zkgate's resident memory.
    fn rss_bytes(&self) -> u64 {
        self.child.rss_bytes()
    }
}
