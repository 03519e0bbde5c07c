//! zkgate's connections to ZooKeeper run without Nagle's algorithm (zookeeper-client leaves it
//! on; see `zkgate::zk::nodelay`), on every session and again after a reconnection.

mod common;

use std::time::Duration;

use common::proxy::Proxy;
use common::{Gate, within, zookeeper};
use zkgate::zk::nodelay::nodelay_towards;
use zkgate::zk::session::Connection;

#[tokio::test]
async fn every_zookeeper_connection_runs_without_nagle_also_after_a_reconnection() {
    let zk = zookeeper().await;
    let proxy = Proxy::start(&zk.connect_string()).await;
    let gate = Gate::start(&proxy.connect_string()).await;
    let lanes = gate.running.state.lanes.all().to_vec();
    let towards_proxy = [proxy.addr.port()];

    let (sockets, all_off) = nodelay_towards(&towards_proxy);
    assert_eq!(sockets, lanes.len(), "one connection per session");
    assert!(all_off, "Nagle's algorithm is on for a ZooKeeper connection");

    // Cut every connection; each session reconnects (a new socket) within its timeout.
    let connects: Vec<u64> = lanes.iter().map(|lane| lane.status().connects).collect();
    proxy.partition();
    for lane in &lanes {
        let mut status = lane.subscribe();
        within(
            Duration::from_secs(20),
            "the session to lose its connection",
            status.wait_for(|s| s.connection != Connection::Connected),
        )
        .await
        .expect("supervisor alive");
    }
    proxy.heal();
    for (lane, before) in lanes.iter().zip(connects) {
        let mut status = lane.subscribe();
        within(
            Duration::from_secs(20),
            "the session to reconnect",
            status.wait_for(|s| s.connects > before && s.connection == Connection::Connected),
        )
        .await
        .expect("supervisor alive");
    }
    let (sockets, all_off) = nodelay_towards(&towards_proxy);
    assert!(
        sockets >= lanes.len(),
        "{sockets} connections for {} sessions",
        lanes.len()
    );
    assert!(all_off, "Nagle's algorithm is on for a new ZooKeeper connection");
    // And the instance serves on them.
    let lease = gate.lease("30s").await;
    assert_eq!(
        gate.acquire("after", &lease, "wait=0").await.status,
        reqwest::StatusCode::OK
    );
}
