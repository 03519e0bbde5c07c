//! What a linearizable read costs, and what it buys, on a 3-server ensemble (fsync on) with two
//! zkgate instances (release binary, each its own process) behind different followers, as a
//! load balancer in front of several instances spreads one client's requests:
//!
//! - stale reads: a writer PUTs 1, 2, 3 ... through A, waiting for each answer; three readers
//!   GET the key through B and compare with the highest value acknowledged when their GET
//!   began. And grants answered through A, each followed at once by a holder read through B.
//!   In both modes.
//! - cost: one client's read latency (p50, p99) and 32 clients' reads per second, through one
//!   instance and through two, in both modes; the barriers each instance sent per read.
//!
//! Run: `cargo bench --bench consistency` (`ZKGATE_BENCH_SECONDS`, default 10, per
//! measurement; `ZKGATE_BENCH_GRANTS`, default 2000).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use zkgate::zk::server::{ServerOptions, ZooKeeperServer};

#[allow(dead_code)]
#[path = "compare/process.rs"]
mod process;
#[path = "compare/runtime.rs"]
mod runtime;
#[allow(dead_code)]
#[path = "compare/stats.rs"]
mod stats;

use process::setting;

fn main() {
    runtime::block_on(run());
}

const MODES: [(&str, &str); 2] = [("linearizable (default)", ""), ("sequential", "consistency=sequential")];

async fn run() {
    let seconds = Duration::from_secs(setting("ZKGATE_BENCH_SECONDS", 10));
    let grants = setting("ZKGATE_BENCH_GRANTS", 2000);
    let options = ServerOptions::default();
    let servers = ZooKeeperServer::start_ensemble(&options, 3)
        .await
        .expect("the ensemble");
    let mut followers = Vec::new();
    for server in &servers {
        if mode_of(server.client_port()).await.as_deref() == Some("follower") {
            followers.push(server.connect_string());
        }
    }
    assert_eq!(followers.len(), 2, "two followers");
    let a = Gate::start(&followers[0]).await;
    let b = Gate::start(&followers[1]).await;
    println!("3-server ensemble (fsync on), A and B behind different followers; {seconds:?} per measurement");
    println!();
    println!("| mode | stale kv reads through B | grants through A not seen through B |");
    println!("|---|---|---|");
    for (mode, query) in MODES {
        let (stale, reads) = stale_reads(&a, &b, query, seconds).await;
        let missed = missed_grants(&a, &b, query, grants).await;
        println!(
            "| {mode} | {stale} of {reads} ({:.3}%) | {missed} of {grants} |",
            100.0 * stale as f64 / reads.max(1) as f64
        );
    }
    println!();
    println!(
        "| mode | one client, one instance | 32 clients, one instance | 32 clients, two instances | barriers per read |"
    );
    println!("|---|---|---|---|---|");
    let put = a
        .http
        .put(format!("{}/v1/kv/bench", a.base))
        .body("1")
        .send()
        .await
        .expect("put");
    assert!(put.status().is_success());
    for (mode, query) in MODES {
        let latency = serial_latency(&a, query, seconds).await;
        let before = a.syncs().await + b.syncs().await;
        let (one, reads_one) = read_rate(&[&a], query, seconds).await;
        let (two, reads_two) = read_rate(&[&a, &b], query, seconds).await;
        let syncs = a.syncs().await + b.syncs().await - before;
        println!(
            "| {mode} | {} | {one:.0}/s | {two:.0}/s | {:.2} |",
            latency.show(),
            syncs as f64 / (reads_one + reads_two).max(1) as f64
        );
    }
}

/// A zkgate process.
struct Gate {
    _child: process::Child,
    base: String,
    http: reqwest::Client,
}

impl Gate {
    async fn start(connect: &str) -> Gate {
        let flags = ["--write-rate", "0", "--cluster-secret", "the bench deployment's secret"];
        let (child, addr) = process::zkgate(connect, &flags).await;
        let base = format!("http://{addr}");
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(256)
            .tcp_nodelay(true)
            .build()
            .expect("http client");
        Gate {
            _child: child,
            base,
            http,
        }
    }

    /// `zkgate_zookeeper_syncs_total` from `/metrics`.
    async fn syncs(&self) -> u64 {
        let text = self
            .http
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text");
        text.lines()
            .find_map(|line| line.strip_prefix("zkgate_zookeeper_syncs_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0) as u64
    }

    async fn get_value(&self, key: &str, query: &str) -> Option<u64> {
        get_value(&self.http, &self.base, key, query).await
    }
}

/// A kv value written by this bench (a number), through the zkgate at `base`.
async fn get_value(http: &reqwest::Client, base: &str, key: &str, query: &str) -> Option<u64> {
    let response = http.get(format!("{base}/v1/kv/{key}?{query}")).send().await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    response.text().await.ok()?.trim().parse().ok()
}

/// The experiment: stale reads of a key written through A, read through B.
async fn stale_reads(a: &Gate, b: &Gate, query: &str, length: Duration) -> (u64, u64) {
    let key = format!("stale-{}", query.len());
    let acknowledged = Arc::new(AtomicU64::new(0));
    let stale = Arc::new(AtomicU64::new(0));
    let reads = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + length;
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (http, base, key, query) = (b.http.clone(), b.base.clone(), key.clone(), query.to_string());
            let (acknowledged, stale, reads) = (acknowledged.clone(), stale.clone(), reads.clone());
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    let known = acknowledged.load(Ordering::SeqCst);
                    let Some(value) = get_value(&http, &base, &key, &query).await else {
                        continue;
                    };
                    reads.fetch_add(1, Ordering::Relaxed);
                    if value < known {
                        stale.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let mut next = 1;
    while Instant::now() < deadline {
        let put = a
            .http
            .put(format!("{}/v1/kv/{key}", a.base))
            .body(next.to_string())
            .send()
            .await;
        if put.is_ok_and(|r| r.status().is_success()) {
            acknowledged.store(next, Ordering::SeqCst);
            next += 1;
        }
    }
    for reader in readers {
        reader.await.expect("reader");
    }
    (stale.load(Ordering::Relaxed), reads.load(Ordering::Relaxed))
}

/// Grants answered through A, each followed at once by `GET /v1/locks/{name}` through B: how
/// often B shows no holder.
async fn missed_grants(a: &Gate, b: &Gate, query: &str, grants: u64) -> u64 {
    let lease: serde_json::Value = a
        .http
        .post(format!("{}/v1/leases", a.base))
        .json(&json!({"ttl": "60s"}))
        .send()
        .await
        .expect("lease")
        .json()
        .await
        .expect("lease body");
    let lease = lease["id"].as_str().expect("lease id").to_string();
    let mut missed = 0;
    for i in 0..grants {
        let name = format!("grant-{}-{i}", query.len());
        let granted: serde_json::Value = a
            .http
            .post(format!("{}/v1/locks/{name}/acquire?wait=0", a.base))
            .json(&json!({"lease": lease}))
            .send()
            .await
            .expect("acquire")
            .json()
            .await
            .expect("grant");
        let seen: serde_json::Value = b
            .http
            .get(format!("{}/v1/locks/{name}?{query}", b.base))
            .send()
            .await
            .expect("holder read")
            .json()
            .await
            .expect("lock state");
        if seen["holder"].is_null() {
            missed += 1;
        }
        let handle = granted["handle"].as_str().expect("handle");
        a.http
            .delete(format!("{}/v1/locks/{name}/handles/{handle}", a.base))
            .send()
            .await
            .expect("release");
    }
    a.http
        .delete(format!("{}/v1/leases/{lease}", a.base))
        .send()
        .await
        .expect("lease deleted");
    missed
}

/// One client reading a key through A, one read after another.
async fn serial_latency(a: &Gate, query: &str, length: Duration) -> stats::Figure {
    let deadline = Instant::now() + length;
    let mut samples = Vec::new();
    while Instant::now() < deadline {
        let started = Instant::now();
        a.get_value("bench", query).await.expect("read");
        samples.push(started.elapsed());
    }
    stats::Figure::Latency(stats::Latency::of(&samples))
}

/// 32 clients reading a key, spread over `gates`: reads per second, and how many.
async fn read_rate(gates: &[&Gate], query: &str, length: Duration) -> (f64, u64) {
    let targets: Vec<(reqwest::Client, String)> = gates.iter().map(|g| (g.http.clone(), g.base.clone())).collect();
    let done = Arc::new(AtomicUsize::new(0));
    let counted = done.clone();
    let query = query.to_string();
    let rate = stats::rate(32, length, move |i, deadline| {
        let (http, base) = targets[i % targets.len()].clone();
        let (query, done) = (query.clone(), counted.clone());
        async move {
            let mut n = 0;
            while Instant::now() < deadline {
                let response = http.get(format!("{base}/v1/kv/bench?{query}")).send().await;
                if response.is_ok_and(|r| r.status().is_success()) {
                    n += 1;
                }
            }
            done.fetch_add(n, Ordering::Relaxed);
            n
        }
    })
    .await;
    (rate, done.load(Ordering::Relaxed) as u64)
}

/// A server's mode (`leader`, `follower`, `standalone`) by the `srvr` command.
async fn mode_of(port: u16) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    stream.write_all(b"srvr").await.ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).await.ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix("Mode: "))
        .map(|mode| mode.trim().to_string())
}
