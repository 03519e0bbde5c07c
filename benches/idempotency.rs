//! The idempotency store under sustained keyed writes at the maximum rate: zkgate (release
//! binary, its own process, default limits: `--write-rate` 1000 a second, `--idempotency-keys`
//! 10,000) takes kv transactions and counter adds, each with a fresh `Idempotency-Key` as the
//! README recommends, from 16 clients paced together at the write rate, for 10 minutes. Every
//! 30 s it prints the store's size (the principal's records and their charges), ZooKeeper's
//! znode count and data size, and the writes answered so far. The store must level off at the
//! bound, not grow with time; the run fails if it passes the bound by more than what an
//! eviction's few hundred milliseconds of writes add.
//!
//! Run: `cargo bench --bench idempotency` (`ZKGATE_BENCH_SECONDS`, default 600;
//! `ZKGATE_BENCH_QUICK=1`: 20 s with `--idempotency-keys 500`, to keep the bench from rotting).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[allow(dead_code)]
#[path = "compare/process.rs"]
mod process;

#[path = "compare/runtime.rs"]
mod runtime;

/// Clients sending at once.
const CLIENTS: usize = 16;

/// The write rate zkgate allows a caller (its default `--write-rate`).
const RATE: u64 = 1000;

use process::setting;

fn main() {
    runtime::block_on(run());
}

/// What the clients got back.
#[derive(Default)]
struct Answered {
    ok: AtomicU64,
    /// `429`s: more than the write rate (the pacing keeps these few).
    limited: AtomicU64,
    /// Anything else (none expected: the run fails on one).
    other: AtomicU64,
}

async fn run() {
    let quick = std::env::var_os("ZKGATE_BENCH_QUICK").is_some();
    let seconds = if quick {
        20
    } else {
        setting("ZKGATE_BENCH_SECONDS", 600)
    };
    let keys: u64 = if quick { 500 } else { 10_000 };
    let report_every = Duration::from_secs(if quick { 5 } else { 30 });
    let server = process::zookeeper_without_fsync().await;
    let zk_port = server.client_port();
    let connect = server.connect_string();
    let limit = keys.to_string();
    let (_gate, addr) = process::zkgate(&connect, &["--idempotency-keys", &limit]).await;
    let url = format!("http://{addr}");
    let http = reqwest::Client::new();
    let zk = zookeeper_client::Client::connect(&connect)
        .await
        .expect("ZooKeeper client");

    let answered = Arc::new(Answered::default());
    let started = Instant::now();
    let until = started + Duration::from_secs(seconds);
    // Each client paced at its share of the rate: RATE a second in all.
    let mut clients = Vec::new();
    for client in 0..CLIENTS as u64 {
        let (http, url, answered) = (http.clone(), url.clone(), answered.clone());
        clients.push(tokio::spawn(async move {
            let every = Duration::from_micros(1_000_000 * CLIENTS as u64 / RATE);
            let mut pace = tokio::time::interval(every);
            pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut n = client;
            while Instant::now() < until {
                pace.tick().await;
                write(&http, &url, n, &answered).await;
                n += CLIENTS as u64;
            }
        }));
    }

    println!("# idempotency store under keyed writes at {RATE}/s for {seconds} s (--idempotency-keys {keys})");
    println!("| time | writes answered | 429 | records | charges | ZooKeeper znodes | ZooKeeper data (MB) |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let mut most = 0u64;
    let mut next = started + report_every;
    loop {
        tokio::time::sleep_until(next.into()).await;
        let records = children(&zk, "/zkgate/idempotency/anyone").await;
        let charges = (zk.list_children("/zkgate/usage/anyone").await.unwrap_or_default())
            .iter()
            .filter(|c| c.starts_with("ik-"))
            .count() as u64;
        most = most.max(records);
        println!(
            "| {:.0} s | {} | {} | {records} | {charges} | {} | {:.1} |",
            started.elapsed().as_secs_f64(),
            answered.ok.load(Ordering::Relaxed),
            answered.limited.load(Ordering::Relaxed),
            process::zookeeper_figure(zk_port, "zk_znode_count"),
            process::zookeeper_figure(zk_port, "zk_approximate_data_size") as f64 / 1e6,
        );
        next += report_every;
        if Instant::now() >= until {
            break;
        }
    }
    for client in clients {
        let _ = client.await;
    }
    let ok = answered.ok.load(Ordering::Relaxed);
    let other = answered.other.load(Ordering::Relaxed);
    println!(
        "{ok} keyed writes in {:.0} s ({:.0} a second); the store held at most {most} records (bound {keys})",
        started.elapsed().as_secs_f64(),
        ok as f64 / started.elapsed().as_secs_f64()
    );
    assert_eq!(other, 0, "answers other than 200 and 429");
    // An eviction runs beside the writes: what lands meanwhile (well under a second's worth)
    // may pass the bound for a moment.
    assert!(most <= keys + RATE, "the store grew past its bound: {most} records");
}

/// The number of children of `path` (0 if it is not there).
async fn children(zk: &zookeeper_client::Client, path: &str) -> u64 {
    zk.check_stat(path)
        .await
        .ok()
        .flatten()
        .map_or(0, |stat| stat.num_children as u64)
}

/// Write `n`: a kv transaction (even) or a counter add (odd), with a key of its own.
async fn write(http: &reqwest::Client, url: &str, n: u64, answered: &Answered) {
    let request = if n.is_multiple_of(2) {
        let body = serde_json::json!({"then": [{"put": format!("bench/{}", n % 64), "text": n.to_string()}]});
        http.post(format!("{url}/v1/kv-txn")).json(&body)
    } else {
        http.post(format!("{url}/v1/counters/bench-{}/add", n % 64))
    };
    let status = request
        .header("Idempotency-Key", format!("write-{n}"))
        .send()
        .await
        .map(|r| r.status());
    let counter = match status {
        Ok(s) if s.is_success() => &answered.ok,
        Ok(s) if s == reqwest::StatusCode::TOO_MANY_REQUESTS => &answered.limited,
        _ => &answered.other,
    };
    counter.fetch_add(1, Ordering::Relaxed);
}
