//! zkgate's connections to ZooKeeper run without Nagle's algorithm (zookeeper-client leaves it
//! on; see `zkgate::zk::nodelay`), on every session and again after a reconnection; and its
//! multi-ops answer by the tag of each operation (`zkgate::zk::multi`).

use crate::common;

use std::time::Duration;

use common::proxy::Proxy;
use common::{Gate, within, zk_client, zookeeper};
use zkgate::zk::nodelay::nodelay_towards;
use zkgate::zk::session::Connection;
use zkgate::zk::{Failed, Multi, ZkError};
use zookeeper_client::CreateMode;

#[tokio::test]
async fn every_zookeeper_connection_runs_without_nagle_also_after_a_reconnection() {
    let zk = zookeeper().await;
    let proxy = Proxy::start(&zk.connect_string()).await;
    let gate = Gate::start(&proxy.connect_string()).await;
    // Every lane's session, and the keeper's apart.
    let lanes: Vec<_> = gate
        .running
        .state
        .lanes
        .all()
        .iter()
        .chain([&gate.running.state.lanes.keeper().session])
        .cloned()
        .collect();
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

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Item,
    Marker,
    Data,
}

#[tokio::test]
async fn a_multi_op_names_the_refused_operation_by_its_tag_and_answers_by_tag() {
    let zk = zookeeper().await;
    let client = zk_client(&zk.connect_string()).await;
    let persistent = CreateMode::Persistent.with_acls(zkgate::zk::acls());
    client.create("/m", b"0", &persistent).await.expect("create /m");

    // The second operation is refused: it comes back as its tag, and the first did not apply.
    let mut multi = Multi::new(&client);
    multi.create(Op::Item, "/m/a", b"a", &persistent).unwrap();
    multi.create(Op::Marker, "/m", b"", &persistent).unwrap();
    assert_eq!(multi.len(), 2);
    match multi.commit().await {
        Err(Failed::Refused { tag, error }) => {
            assert_eq!(tag, Op::Marker);
            assert_eq!(error, ZkError::NodeExists);
        }
        other => panic!("expected the marker refused, got {other:?}"),
    }
    assert!(
        multi.is_empty(),
        "a commit leaves the builder empty for the next attempt"
    );
    assert_eq!(client.check_stat("/m/a").await.unwrap(), None, "all or nothing");

    // Committed: each answer is found by its tag, whatever its place.
    let sequential = CreateMode::PersistentSequential.with_acls(zkgate::zk::acls());
    multi.set(Op::Data, "/m", b"1", Some(0)).unwrap();
    multi.create(Op::Item, "/m/item-", b"x", &sequential).unwrap();
    multi.check(Op::Marker, "/m", 1).unwrap();
    let done = multi.commit().await.expect("committed");
    let created = done.created(&Op::Item).expect("the item's path");
    assert!(
        created.starts_with("/m/item-") && created.len() > "/m/item-".len(),
        "{created}"
    );
    assert_eq!(done.stat(&Op::Data).map(|stat| stat.version), Some(1));
    assert_eq!(done.created(&Op::Data), None, "a set creates nothing");
    assert_eq!(client.get_data(created).await.unwrap().0, b"x");

    // A version check that fails is the check's refusal.
    multi.check(Op::Marker, "/m", 0).unwrap();
    multi.delete(Op::Item, created, None).unwrap();
    assert_eq!(
        multi.commit().await.map(|_| ()),
        Err(Failed::Refused {
            tag: Op::Marker,
            error: ZkError::BadVersion
        })
    );
    assert!(client.check_stat(created).await.unwrap().is_some());

    // Nothing added: nothing sent, done.
    assert!(multi.commit().await.is_ok());
}
