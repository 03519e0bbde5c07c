//! zkgate's connections to ZooKeeper run without Nagle's algorithm (zookeeper-client leaves it
//! on; see `zkgate::zk::nodelay`), on every session and again after a reconnection; and its
//! multi-ops answer by the tag of each operation (`zkgate::zk::multi`), and requests' writes that
//! meet on a session share one (`zkgate::zk::batch`).

use crate::common;

use std::time::Duration;

use common::proxy::Proxy;
use common::{Gate, within, zk_client, zookeeper};
use zkgate::zk::batch::{ALONE_IN_FLIGHT, Writes};
use zkgate::zk::nodelay::nodelay_towards;
use zkgate::zk::session::Connection;
use zkgate::zk::{Failed, Multi, ZkError};
use zookeeper_client::CreateMode;

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

/// A write of `path`, through `writes`: what it answered, and the listing of `then_list`.
async fn batched_create(
    client: &zookeeper_client::Client,
    writes: &std::sync::Arc<Writes>,
    path: String,
    then_list: Option<&str>,
) -> (Result<(), Failed<Op>>, Option<Vec<String>>) {
    let persistent = CreateMode::Persistent.with_acls(zkgate::zk::acls());
    let mut multi = Multi::new(client);
    multi.create(Op::Item, &path, b"x", &persistent).unwrap();
    let (committed, listed) = multi.commit_batched(writes, then_list).await;
    (committed.map(|_| ()), listed.map(|listed| listed.expect("listed")))
}

/// `meeting` written at once, behind as many writes as go alone (`join_all` polls each once
/// before any answer can come), so that they queue and go in batches; their answers.
async fn meet(
    client: &zookeeper_client::Client,
    writes: &std::sync::Arc<Writes>,
    meeting: &[(&str, Option<&'static str>)],
) -> Vec<(Result<(), Failed<Op>>, Option<Vec<String>>)> {
    static FILLERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let alone = (0..ALONE_IN_FLIGHT).map(|_| {
        let n = FILLERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        (format!("/alone-{n}"), None)
    });
    let all: Vec<(String, Option<&str>)> = alone
        .chain(meeting.iter().map(|(path, list)| (path.to_string(), *list)))
        .collect();
    let answers = futures::future::join_all(
        all.into_iter()
            .map(|(path, list)| batched_create(client, writes, path, list)),
    )
    .await;
    answers.into_iter().skip(ALONE_IN_FLIGHT).collect()
}

#[tokio::test]
async fn writes_that_meet_share_one_multi_op_and_a_refusal_stays_with_its_own_write() {
    let zk = zookeeper().await;
    let client = zk_client(&zk.connect_string()).await;
    let writes = std::sync::Arc::new(Writes::default());
    let persistent = CreateMode::Persistent.with_acls(zkgate::zk::acls());
    let parents = (0..10).map(|i| format!("/q{i}"));
    for path in ["/p1", "/p2", "/p2/taken", "/p3"]
        .map(String::from)
        .into_iter()
        .chain(parents)
    {
        client.create(&path, b"", &persistent).await.expect("create");
    }
    let czxid = |path: &'static str| {
        let client = client.clone();
        async move { client.check_stat(path).await.unwrap().expect("created").czxid }
    };

    // Ten writes that meet the ones in flight: one multi-op for all ten, one czxid.
    let (sent, made) = writes.counts();
    let paths = [
        "/q0/n", "/q1/n", "/q2/n", "/q3/n", "/q4/n", "/q5/n", "/q6/n", "/q7/n", "/q8/n", "/q9/n",
    ];
    let meeting: Vec<_> = paths.iter().map(|path| (*path, None)).collect();
    let answers = meet(&client, &writes, &meeting).await;
    assert!(answers.iter().all(|(answer, _)| answer.is_ok()), "{answers:?}");
    let counts = writes.counts();
    assert_eq!(
        (counts.0 - sent, counts.1 - made),
        (ALONE_IN_FLIGHT as u64 + 1, ALONE_IN_FLIGHT as u64 + 10),
        "the ten in one multi-op"
    );
    let mut czxids = Vec::new();
    for path in paths {
        czxids.push(czxid(path).await);
    }
    assert!(czxids.iter().all(|&z| z == czxids[0]), "{czxids:?}");

    // One of a batch refused: only that write hears it; the writes before and after it in the
    // batch apply, and one asking for a listing gets it, its own node in it.
    let answers = meet(
        &client,
        &writes,
        &[("/p1/x", None), ("/p2/taken", None), ("/p3/x", Some("/p3"))],
    )
    .await;
    assert!(
        answers[0].0.is_ok(),
        "the write before the refused one applies: {answers:?}"
    );
    assert_eq!(
        answers[1].0,
        Err(Failed::Refused {
            tag: Op::Item,
            error: ZkError::NodeExists
        })
    );
    assert!(
        answers[2].0.is_ok(),
        "the write after the refused one applies: {answers:?}"
    );
    assert_eq!(answers[2].1, Some(vec!["x".to_string()]), "listed after its write");

    // Two writes that create under one parent never share a multi-op (they would share a
    // czxid, a contender's fencing token): the second goes in the next one.
    let answers = meet(&client, &writes, &[("/p1/a", None), ("/p1/b", None)]).await;
    assert!(answers.iter().all(|(answer, _)| answer.is_ok()), "{answers:?}");
    let (a, b) = (czxid("/p1/a").await, czxid("/p1/b").await);
    assert!(b > a, "two creates under /p1 in one multi-op: czxid {a} and {b}");
}
