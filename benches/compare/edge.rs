//! What zkgate's HTTP edge costs: a bare axum server beside zkgate, each server's CPU per
//! request (its `/proc` times) over the same keep-alive requests from one client, in one run.
//!
//! The bare server is built into this bench and run as a process of its own (this binary
//! again, with [BARE] set): the same axum, tokio and allocator as zkgate (the bench's global
//! allocator is zkgate's), zkgate's default number of worker threads, one route that answers
//! `ok`. So the difference between it and zkgate's `GET /healthz`, which touches neither
//! ZooKeeper nor a recipe, is zkgate's edge: its layers, its connection wrapper, its metrics.

use std::time::Duration;

use super::process::{Child, ThreadTimes};

/// Set (to the address to listen on) in the environment of the bare server's process.
pub const BARE: &str = "ZKGATE_BENCH_BARE_AXUM";

/// Serves as the bare server, if this process was started as one (then never returns).
pub fn serve_bare_if_asked() {
    let Ok(listen) = std::env::var(BARE) else { return };
    let workers = zkgate::config::ServeConfig::with_zookeeper("unused").worker_threads();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let app = axum::Router::new().route("/healthz", axum::routing::get(async || "ok"));
        let listener = tokio::net::TcpListener::bind(&listen).await.expect("bind");
        axum::serve(listener, app).await.expect("serve");
    });
    std::process::exit(0);
}

/// The bare server, running.
pub struct Bare {
    pub child: Child,
    pub base: String,
}

impl Bare {
    pub async fn start() -> Bare {
        let port = zkgate::zk::server::free_port().expect("port");
        let exe = std::env::current_exe().expect("this bench's binary");
        let child = Child::spawn_with_env(
            exe.to_str().expect("UTF-8"),
            &[],
            &[(BARE, &format!("127.0.0.1:{port}"))],
        );
        let base = format!("http://127.0.0.1:{port}");
        super::process::wait_http_ok(&super::http_client(), &format!("{base}/healthz")).await;
        Bare { child, base }
    }
}

/// A server's CPU per request (µs) over `count` `requests`, one after the other on one
/// keep-alive connection, measured from the time its threads were on a CPU
/// ([ThreadTimes]: nanoseconds, where the process's user and system times count ticks).
pub async fn cpu_per_request(pid: &str, count: usize, mut request: impl AsyncFnMut()) -> f64 {
    let before = ThreadTimes::of(pid);
    for _ in 0..count {
        request().await;
    }
    let spent: Duration = before.since(pid);
    spent.as_secs_f64() * 1e6 / count as f64
}
