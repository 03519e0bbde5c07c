//! What a lease costs, on a ZooKeeper and a zkgate of their own: creating one, keeping it
//! alive (and whether that writes to ZooKeeper), and holding many idle (zkgate's memory,
//! ZooKeeper's znodes and heap).

use std::sync::Arc;
use std::time::Instant;

use zkgate::zk::server::{ServerOptions, ZooKeeperServer};

use super::gate::Zkgate;
use super::process;
use super::stats::Latency;

/// Rows of a Markdown table: `| what | figure |`.
pub async fn costs(options: &ServerOptions, count: usize, idle: usize) -> Vec<String> {
    let server = ZooKeeperServer::start_standalone(options).await.expect("ZooKeeper");
    let port = server.client_port();
    let gate = Arc::new(Zkgate::start(&server.connect_string()).await);
    let mut rows = Vec::new();

    // Creation, one after the other, after a warm-up.
    for _ in 0..100 {
        gate.lease("1h").await;
    }
    let (created, cpu) = timed(&gate, count, || async {
        gate.lease("1h").await;
    })
    .await;
    rows.push(format!(
        "| create a lease (`POST /v1/leases`) | p50 {:.0} µs, p99 {:.0} µs; zkgate CPU {cpu:.0} µs |",
        created.p50, created.p99,
    ));

    // Keepalives to the lease's keeper: ZooKeeper's transactions meanwhile are its heartbeats
    // (one a second), not the keepalives.
    let lease = gate.lease("1h").await;
    let (zxid, started) = (process::zookeeper_zxid(port), Instant::now());
    let (kept, cpu) = timed(&gate, count, || async {
        assert_eq!(gate.keepalive(&lease).await, 200);
    })
    .await;
    let (writes, took) = (process::zookeeper_zxid(port) - zxid, started.elapsed());
    rows.push(format!(
        "| keep a lease alive at its keeper | p50 {:.0} µs, p99 {:.0} µs; zkgate CPU {cpu:.0} µs; ZooKeeper transactions during {count} keepalives: {writes} in {:.1} s (heartbeats: 1 a second) |",
        kept.p50,
        kept.p99,
        took.as_secs_f64(),
    ));

    // Idle leases: what each adds, on a fresh zkgate heap.
    let znodes = || process::zookeeper_figure(port, "zk_znode_count");
    let heap = || server.pid().and_then(process::java_heap_used);
    let (rss, nodes, heap_before) = (gate.child.rss_bytes(), znodes(), heap());
    gate.hold_leases(idle).await;
    let per = |grown: u64| grown as f64 / idle as f64;
    rows.push(format!(
        "| {idle} idle leases, each | zkgate memory {:.0} B; ZooKeeper {:.1} znodes, heap {} |",
        per(gate.child.rss_bytes().saturating_sub(rss)),
        per(znodes().saturating_sub(nodes)),
        heap()
            .zip(heap_before)
            .map_or("– (no jcmd)".into(), |(after, before)| format!(
                "{:.0} B",
                per(after.saturating_sub(before))
            )),
    ));
    rows
}

/// `count` calls of `call` one after the other: their latencies, and zkgate's CPU per call (µs).
async fn timed<F, Fut>(gate: &Zkgate, count: usize, mut call: F) -> (Latency, f64)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let cpu = gate.child.cpu_time();
    let mut samples = Vec::with_capacity(count);
    for _ in 0..count {
        let start = Instant::now();
        call().await;
        samples.push(start.elapsed());
    }
    let cpu = gate.child.cpu_time().saturating_sub(cpu);
    (Latency::of(&samples), cpu.as_secs_f64() * 1e6 / count as f64)
}
