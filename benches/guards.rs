//! What a guard costs a write (`ZKGATE-Guard`, README "Guarded writes"): one client's kv puts
//! to one key, unguarded and guarded by a lock the client holds, in one run, on the release
//! binary in its own process (so that its CPU is its own) and a standalone ZooKeeper.
//!
//! Three kinds of put, in interleaved rounds (so that a drift of the machine falls on each
//! alike):
//! - unguarded;
//! - guarded, the lock's handle driven by the instance the put goes to (as `zkgate lock --`
//!   gives it to its command): the guard is resolved from memory, and its checks travel in the
//!   put's own multi-op;
//! - guarded, the handle held through another instance: that instance's memory does not know
//!   it, so the guard is resolved from ZooKeeper first (a `sync`, the lock's children, the
//!   holder's node and its lease's record).
//!
//! For each: the latency (p50, p99), zkgate's and ZooKeeper's CPU per put, and the requests ZooKeeper received
//! per put (`mntr`'s `zk_packets_received`, which counts pipelined requests one by one: a
//! request sent beside another costs no round trip of its own).
//!
//! Run: `cargo bench --bench guards` (`ZKGATE_BENCH_PUTS`, default 2000 per kind in rounds of
//! 200; `ZKGATE_BENCH_QUICK=1`: 100, to keep it from rotting).

use std::time::{Duration, Instant};

use serde_json::json;

#[allow(dead_code)]
#[path = "compare/process.rs"]
mod process;
#[path = "compare/runtime.rs"]
mod runtime;
#[allow(dead_code)]
#[path = "compare/stats.rs"]
mod stats;

fn main() {
    runtime::block_on(run());
}

/// One kind of put: its name, and the guard it sends (`None`: unguarded) to which instance.
struct Kind {
    name: &'static str,
    guard: Option<String>,
    url: String,
    latencies: Vec<Duration>,
    cpu: Duration,
    zk_cpu: Duration,
    packets: u64,
}

/// A zkgate process on `connect`, and its URL.
async fn instance(connect: &str) -> (process::Child, String) {
    let (child, addr) = process::zkgate(connect, &["--write-rate", "1000000"]).await;
    (child, format!("http://{addr}"))
}

async fn run() {
    let quick = std::env::var_os("ZKGATE_BENCH_QUICK").is_some();
    let puts: usize = match quick {
        true => 100,
        false => std::env::var("ZKGATE_BENCH_PUTS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2000),
    };
    let round = 200.min(puts);
    let server = process::zookeeper_without_fsync().await;
    let zk_port = server.client_port();
    let zk_pid = server.pid().expect("ZooKeeper's pid").to_string();
    let connect = server.connect_string();
    let http = reqwest::Client::new();
    let (gate, url) = instance(&connect).await;
    let (_other, other_url) = instance(&connect).await;

    // The client's lock, through the instance it writes to: held for the whole run.
    let lease: serde_json::Value = http
        .post(format!("{url}/v1/leases"))
        .json(&json!({"ttl": "600s"}))
        .send()
        .await
        .expect("lease")
        .json()
        .await
        .expect("lease JSON");
    let lease = lease["id"].as_str().expect("a lease id").to_string();
    let acquire = |url: String, lock: &'static str| {
        let (http, lease) = (http.clone(), lease.clone());
        async move {
            let held: serde_json::Value = http
                .post(format!("{url}/v1/locks/{lock}/acquire?wait=5s"))
                .json(&json!({"lease": lease}))
                .send()
                .await
                .expect("acquire")
                .json()
                .await
                .expect("acquire JSON");
            let handle = held["handle"].as_str().expect("granted").to_string();
            format!("lock/{lock}; handle={handle}")
        }
    };
    let here = acquire(url.clone(), "orders").await;
    let elsewhere = acquire(other_url.clone(), "orders-elsewhere").await;
    let mut kinds = [
        ("unguarded", None),
        ("guarded, handle driven by this instance", Some(here)),
        ("guarded, handle held through another instance", Some(elsewhere)),
    ]
    .map(|(name, guard)| Kind {
        name,
        guard,
        url: url.clone(),
        latencies: Vec::with_capacity(puts),
        cpu: Duration::ZERO,
        zk_cpu: Duration::ZERO,
        packets: 0,
    });

    // Warm up every path (connections, the topic of nothing, ZooKeeper's JIT).
    for kind in &mut kinds {
        for n in 0..round {
            put(&http, kind, n).await;
        }
        kind.latencies.clear();
    }
    for r in 0..puts / round {
        for at in 0..kinds.len() {
            // Each round in another order.
            let kind = &mut kinds[(at + r) % 3];
            let (cpu, zk_cpu) = (gate.cpu_time(), process::cpu_time_of(&zk_pid));
            let packets = process::zookeeper_figure(zk_port, "zk_packets_received");
            for n in 0..round {
                let took = put(&http, kind, n).await;
                kind.latencies.push(took);
            }
            kind.cpu += gate.cpu_time() - cpu;
            kind.zk_cpu += process::cpu_time_of(&zk_pid) - zk_cpu;
            kind.packets += process::zookeeper_figure(zk_port, "zk_packets_received") - packets;
        }
    }

    println!("# a kv put, guarded and not: {puts} each, one client, in rounds of {round}");
    println!(
        "| put | p50 | p99 | zkgate CPU per put | ZooKeeper CPU per put | ZooKeeper requests per put | vs unguarded: p50, zkgate CPU |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let base = Figures::of(&kinds[0]);
    for kind in &kinds {
        let figures = Figures::of(kind);
        println!(
            "| {} | {:.0} µs | {:.0} µs | {:.0} µs | {:.0} µs | {:.2} | {:.2}x, {:.2}x |",
            kind.name,
            figures.latency.p50,
            figures.latency.p99,
            figures.cpu,
            figures.zk_cpu,
            figures.packets,
            figures.latency.p50 / base.latency.p50,
            figures.cpu / base.cpu,
        );
    }
}

/// One kind's figures, per put (CPU in µs).
struct Figures {
    latency: stats::Latency,
    cpu: f64,
    zk_cpu: f64,
    packets: f64,
}

impl Figures {
    fn of(kind: &Kind) -> Figures {
        let n = kind.latencies.len() as f64;
        Figures {
            latency: stats::Latency::of(&kind.latencies),
            cpu: kind.cpu.as_secs_f64() * 1e6 / n,
            zk_cpu: kind.zk_cpu.as_secs_f64() * 1e6 / n,
            packets: kind.packets as f64 / n,
        }
    }
}

/// One put of `kind` (the `n`th of its round), answered 2xx: how long it took.
async fn put(http: &reqwest::Client, kind: &Kind, n: usize) -> Duration {
    let mut request = http
        .put(format!("{}/v1/kv/orders/state", kind.url))
        .json(&json!({"n": n}));
    if let Some(guard) = &kind.guard {
        request = request.header("ZKGATE-Guard", guard);
    }
    let started = Instant::now();
    let response = request.send().await.expect("put");
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    let took = started.elapsed();
    assert!(status.is_success(), "{}: {status} {body}", kind.name);
    took
}
