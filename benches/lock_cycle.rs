//! Lock cycle latency: the raw ZooKeeper floor against zkgate over HTTP, in one run.
//!
//! - floor: what a native client must do for an uncontended lock cycle with
//!   `zookeeper-client`: create an ephemeral sequential contender, list the lock's children,
//!   delete the contender (three round trips, one after the other).
//! - zkgate: `POST /v1/locks/{name}/acquire?wait=0` with an existing lease, then
//!   `DELETE /v1/locks/{name}/handles/{handle}`, over one kept-alive HTTP connection.
//!
//! Run: `cargo bench --bench lock_cycle` (set `ZKGATE_BENCH_CYCLES` to change the count).
//! It starts its own ZooKeeper (standalone, `forceSync=no` so that disk flushes do not hide
//! zkgate's own cost), or uses `ZKGATE_BENCH_ZOOKEEPER=host:port` if set.

use std::time::{Duration, Instant};

use zkgate::config::ServeConfig;
use zkgate::zk::server::{ServerOptions, ZooKeeperServer};
use zookeeper_client::{Acls, Client, CreateMode};

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run());
}

async fn run() {
    let cycles: usize = std::env::var("ZKGATE_BENCH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    let (_server, connect) = match std::env::var("ZKGATE_BENCH_ZOOKEEPER") {
        Ok(connect) => (None, connect),
        Err(_) => {
            let options = ServerOptions {
                force_sync: false,
                ..ServerOptions::default()
            };
            let server = ZooKeeperServer::start_standalone(&options)
                .await
                .expect("start ZooKeeper");
            let connect = server.connect_string();
            (Some(server), connect)
        }
    };
    let warmup = (cycles / 10).max(50);

    let floor = floor_cycles(&connect, warmup, cycles).await;
    let gate = gate_cycles(&connect, warmup, cycles).await;
    let floor_again = floor_cycles(&connect, warmup, cycles).await;

    println!("| workload | cycles | mean | p50 | p99 |");
    println!("|---|---|---|---|---|");
    for (name, samples) in [
        ("raw ZooKeeper floor (create + getChildren + delete)", &floor),
        ("zkgate HTTP acquire + release (kept-alive)", &gate),
        ("raw ZooKeeper floor, measured again after zkgate", &floor_again),
    ] {
        let s = Summary::of(samples);
        println!(
            "| {name} | {} | {:.1} µs | {:.1} µs | {:.1} µs |",
            samples.len(),
            s.mean,
            s.p50,
            s.p99
        );
    }
    let best_floor = Summary::of(&floor).p50.min(Summary::of(&floor_again).p50);
    println!();
    println!("zkgate / floor (p50): {:.2}x", Summary::of(&gate).p50 / best_floor);
    println!(
        "zkgate / floor (mean): {:.2}x",
        Summary::of(&gate).mean / Summary::of(&floor).mean.min(Summary::of(&floor_again).mean)
    );
}

async fn floor_cycles(connect: &str, warmup: usize, cycles: usize) -> Vec<Duration> {
    let client = Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(connect)
        .await
        .expect("connect");
    let dir = "/bench-floor";
    let _ = client
        .create(dir, &[], &CreateMode::Persistent.with_acls(Acls::anyone_all()))
        .await;
    let prefix = format!("{dir}/_c_{}-lock-", uuid::Uuid::new_v4());
    let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
    let mut samples = Vec::with_capacity(cycles);
    for i in 0..warmup + cycles {
        let start = Instant::now();
        let (_, sequence) = client.create(&prefix, b"", &options).await.expect("create");
        let children = client.list_children(dir).await.expect("list");
        assert!(!children.is_empty());
        client
            .delete(&format!("{prefix}{sequence}"), None)
            .await
            .expect("delete");
        if i >= warmup {
            samples.push(start.elapsed());
        }
    }
    samples
}

async fn gate_cycles(connect: &str, warmup: usize, cycles: usize) -> Vec<Duration> {
    let running = zkgate::start(ServeConfig::with_zookeeper(connect))
        .await
        .expect("start zkgate");
    running
        .state
        .zk
        .wait_connected(Duration::from_secs(20))
        .await
        .expect("zkgate connected");
    let url = running.url();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(1)
        .build()
        .expect("http");
    let lease: serde_json::Value = http
        .post(format!("{url}/v1/leases"))
        .json(&serde_json::json!({"ttl": "10m"}))
        .send()
        .await
        .expect("lease")
        .json()
        .await
        .expect("lease json");
    let body = serde_json::json!({ "lease": lease["id"] });
    let mut samples = Vec::with_capacity(cycles);
    for i in 0..warmup + cycles {
        let start = Instant::now();
        let grant: serde_json::Value = http
            .post(format!("{url}/v1/locks/bench/acquire?wait=0"))
            .json(&body)
            .send()
            .await
            .expect("acquire")
            .json()
            .await
            .expect("grant json");
        let handle = grant["handle"].as_str().expect("granted (uncontended)");
        let released = http
            .delete(format!("{url}/v1/locks/bench/handles/{handle}"))
            .send()
            .await
            .expect("release");
        assert_eq!(released.status(), 204);
        if i >= warmup {
            samples.push(start.elapsed());
        }
    }
    running.stop().await.expect("stop");
    samples
}

struct Summary {
    mean: f64,
    p50: f64,
    p99: f64,
}

impl Summary {
    fn of(samples: &[Duration]) -> Summary {
        let mut micros: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e6).collect();
        micros.sort_by(f64::total_cmp);
        let at = |q: f64| micros[((micros.len() - 1) as f64 * q).round() as usize];
        Summary {
            mean: micros.iter().sum::<f64>() / micros.len() as f64,
            p50: at(0.5),
            p99: at(0.99),
        }
    }
}
