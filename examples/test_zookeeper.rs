//! The ZooKeeper server a test run shares: `scripts/test.sh` starts it before the tests and
//! hands its address to them (`ZKGATE_TEST_ZOOKEEPER`); each test takes a root of its own on
//! it (`tests/it/common`). Started with the tests' settings on a free loopback port, it prints
//! `host:port` on its first line, and runs until it is sent SIGTERM or SIGINT, or its parent
//! exits; the server goes with it.
//!
//! `cargo run --example test_zookeeper`, then
//! `ZKGATE_TEST_ZOOKEEPER=<the line> cargo nextest run`.

#[path = "../tests/it/common/options.rs"]
mod options;

use std::io::Write;

use tokio::signal::unix::{SignalKind, signal};
use zkgate::zk::server::{ServerOptions, ZooKeeperServer};

/// The tests' settings (the same ticks and containers), with room for every test's tree at
/// once (a run leaves what its tests wrote) and the JVM's full compiler (the server lives for
/// the run, not for one test).
fn shared_server_options() -> ServerOptions {
    ServerOptions {
        heap_mb: 1024,
        quick_start: false,
        ..options::test_server_options()
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    // SAFETY: prctl(2) on this process only: SIGTERM when the parent (the test script) exits,
    // so that a script killed without cleaning up does not leave the server running.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
    }
    let mut terminate = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let server = match ZooKeeperServer::start_standalone(&shared_server_options()).await {
        Ok(server) => server,
        Err(error) => {
            eprintln!("the shared ZooKeeper did not start: {error}");
            std::process::exit(1);
        }
    };
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{}", server.connect_string()).and_then(|()| out.flush());
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    drop(server); // stops the JVM
}
