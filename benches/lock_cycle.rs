//! Lock cycle latency: the raw ZooKeeper floor against zkgate over HTTP, in one run.
//!
//! - floor: what a native client must do for an uncontended lock cycle with
//!   `zookeeper-client`: create an ephemeral sequential contender, list the lock's children,
//!   delete the contender (three round trips, one after the other).
//! - zkgate: `POST /v1/locks/{name}/acquire?wait=0` with an existing lease, then
//!   `DELETE /v1/locks/{name}/handles/{handle}`, over one kept-alive HTTP connection.
//!
//! Run: `cargo bench --bench lock_cycle` (`ZKGATE_BENCH_CYCLES`, default 6000, sets the count).
//! It starts its own ZooKeeper (standalone, `forceSync=no` so that disk flushes do not hide
//! zkgate's own cost), or uses `ZKGATE_BENCH_ZOOKEEPER=host:port` if set.

use std::time::{Duration, Instant};

use zkgate::config::ServeConfig;
use zkgate::zk::server::{ServerOptions, ZooKeeperServer};

// The same floor as the comparison bench's (this bench keeps zkgate in-process).
#[allow(dead_code)]
#[path = "compare/floor.rs"]
mod floor;
// What the floor's contended workload counts with.
#[allow(dead_code)]
#[path = "compare/stats.rs"]
mod stats;

#[path = "compare/runtime.rs"]
mod runtime;

fn main() {
    runtime::block_on(run());
}

async fn run() {
    let cycles: usize = std::env::var("ZKGATE_BENCH_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6000);
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
    // Warm up both (the JVM's JIT and zkgate), then measure in alternating rounds so that
    // drift on a shared 2-core machine hits both sides alike.
    let floor_client = floor::Floor::connect(&connect).await;
    let gate = Gate::start(&connect).await;
    floor_client.serial(1000).await;
    gate.cycles(1000).await;
    // The machine's noise comes in bursts of seconds; many short rounds spread it evenly.
    let rounds = (cycles / 200).max(1);
    let (mut floor, mut http, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let f = floor_client.serial(cycles / rounds).await;
        let g = gate.cycles(cycles / rounds).await;
        ratios.push(Summary::of(&g).p50 / Summary::of(&f).p50);
        floor.extend(f);
        http.extend(g);
    }
    gate.stop().await;

    println!("| workload | cycles | mean | p50 | p99 |");
    println!("|---|---|---|---|---|");
    let (floor, http) = (Summary::of(&floor), Summary::of(&http));
    for (name, s) in [
        ("raw ZooKeeper floor: create + getChildren + delete", &floor),
        ("zkgate: HTTP acquire (wait=0) + release, kept-alive", &http),
    ] {
        println!(
            "| {name} | {} | {:.0} µs | {:.0} µs | {:.0} µs |",
            s.count, s.mean, s.p50, s.p99
        );
    }
    println!();
    ratios.sort_by(f64::total_cmp);
    println!(
        "zkgate / floor: p50 {:.2}x, mean {:.2}x; median of the {} rounds' p50 ratios {:.2}x",
        http.p50 / floor.p50,
        http.mean / floor.mean,
        ratios.len(),
        ratios[ratios.len() / 2]
    );
}

/// zkgate in-process, driven over one kept-alive HTTP connection with one lease.
struct Gate {
    running: zkgate::Running,
    http: reqwest::Client,
    body: serde_json::Value,
}

impl Gate {
    async fn start(connect: &str) -> Gate {
        let mut config = ServeConfig::with_zookeeper(connect);
        // One client address drives the whole load: measure zkgate, not its rate limit.
        config.write_rate = 0;
        let running = zkgate::start(config).await.expect("start zkgate");
        running
            .state
            .zk()
            .wait_connected(Duration::from_secs(20))
            .await
            .expect("zkgate connected");
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(1)
            .build()
            .expect("http");
        let lease: serde_json::Value = http
            .post(format!("{}/v1/leases", running.url()))
            .json(&serde_json::json!({"ttl": "1h"}))
            .send()
            .await
            .expect("lease")
            .json()
            .await
            .expect("lease json");
        Gate {
            running,
            http,
            body: serde_json::json!({ "lease": lease["id"] }),
        }
    }

    async fn cycles(&self, count: usize) -> Vec<Duration> {
        let url = self.running.url();
        let mut samples = Vec::with_capacity(count);
        for _ in 0..count {
            let start = Instant::now();
            let grant: serde_json::Value = self
                .http
                .post(format!("{url}/v1/locks/bench/acquire?wait=0"))
                .json(&self.body)
                .send()
                .await
                .expect("acquire")
                .json()
                .await
                .expect("grant json");
            let handle = grant["handle"].as_str().expect("granted (uncontended)");
            let released = self
                .http
                .delete(format!("{url}/v1/locks/bench/handles/{handle}"))
                .send()
                .await
                .expect("release");
            assert_eq!(released.status(), 204);
            samples.push(start.elapsed());
        }
        samples
    }

    async fn stop(self) {
        self.running.stop().await.expect("stop");
    }
}

struct Summary {
    count: usize,
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
            count: micros.len(),
            mean: micros.iter().sum::<f64>() / micros.len() as f64,
            p50: at(0.5),
            p99: at(0.99),
        }
    }
}
