//! Quotas: what zkgate stores in ZooKeeper is bounded as a whole and per principal by
//! ZooKeeper's own hard quotas, whichever instance a write goes through. A write past one
//! answers 507 `quota-exceeded` naming the flag, stores nothing, and deleting gives the room
//! back.

use crate::common;

use common::{Gate, Reply, auth_config, grant, test_config, within, zookeeper};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use std::time::Duration;
use zkgate::config::ServeConfig;
use zkgate::zk::server::{ServerOptions, ZooKeeperServer};

/// Two instances on one ZooKeeper, with principals `app` and `other` (each may write
/// everything), the same quotas on both.
struct Two {
    _zk: common::TestZooKeeper,
    _dir: tempfile::TempDir,
    a: Gate,
    b: Gate,
    app: String,
    other: String,
}

async fn two_instances(quotas: impl Fn(&mut ServeConfig)) -> Two {
    let zk = zookeeper().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let (path, [app, other]) = auth_config(&dir, [("app", grant("", "write")), ("other", grant("", "write"))]);
    let mut config = test_config(&zk.connect_string());
    config.auth_config = Some(path);
    quotas(&mut config);
    let a = Gate::start_with(config.clone()).await;
    let b = Gate::start_with(config).await;
    Two {
        _zk: zk,
        _dir: dir,
        a,
        b,
        app,
        other,
    }
}

fn assert_quota(reply: &Reply, quota: &str) {
    reply.assert_problem(StatusCode::INSUFFICIENT_STORAGE, None);
    assert!(reply.str("type").ends_with(":quota-exceeded"), "{:?}", reply.body);
    assert_eq!(reply.str("quota"), quota, "{:?}", reply.body);
}

async fn put(gate: &Gate, token: &str, key: &str, value: &Value) -> Reply {
    gate.call_as(Some(token), Method::PUT, &format!("/v1/kv/{key}"), Some(value.clone()))
        .await
}

#[tokio::test]
async fn a_principals_bytes_are_bounded_across_instances_and_deletes_give_them_back() {
    let two = two_instances(|c| {
        c.quota_bytes_per_principal = 100 * 1024;
        c.quota_znodes_per_principal = 0;
    })
    .await;
    let (a, b) = (&two.a, &two.b);
    // About 30 KiB each: three fit in 100 KiB, four do not.
    let value = json!("x".repeat(30_000));
    for (i, gate) in [(1, a), (2, b), (3, a)] {
        let reply = put(gate, &two.app, &format!("k{i}"), &value).await;
        assert_eq!(reply.status, StatusCode::CREATED, "k{i}: {:?}", reply.body);
    }
    // The fourth, through either instance: refused whole, naming the quota.
    for gate in [a, b] {
        let reply = put(gate, &two.app, "k4", &value).await;
        assert_quota(&reply, "--quota-bytes-per-principal");
        assert!(reply.str("detail").contains("`app`"), "{:?}", reply.body);
    }
    assert_eq!(
        a.call_as(Some(&two.app), Method::GET, "/v1/kv/k4", None).await.status,
        StatusCode::NOT_FOUND
    );
    for key in ["k1", "k2", "k3"] {
        let read = b
            .call_as(Some(&two.app), Method::GET, &format!("/v1/kv/{key}"), None)
            .await;
        assert_eq!((read.status, &read.body), (StatusCode::OK, &value), "{key}");
    }
    // Another principal has its own quota.
    let reply = put(b, &two.other, "o1", &value).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{:?}", reply.body);
    // Rewriting a key does not charge it twice.
    let reply = put(a, &two.app, "k2", &value).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    // A key is charged to whoever wrote it last: `other` taking over k3 frees `app`'s room.
    let reply = put(a, &two.other, "k3", &value).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    let reply = put(b, &two.app, "k4", &value).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{:?}", reply.body);
    // So does a delete, through the other instance.
    assert_quota(&put(a, &two.app, "k5", &value).await, "--quota-bytes-per-principal");
    let deleted = b.call_as(Some(&two.app), Method::DELETE, "/v1/kv/k1", None).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    let reply = put(a, &two.app, "k5", &value).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{:?}", reply.body);
}

#[tokio::test]
async fn a_principals_values_are_bounded_in_number_and_queue_items_count_until_taken() {
    let two = two_instances(|c| {
        c.quota_bytes_per_principal = 0;
        c.quota_znodes_per_principal = 3;
    })
    .await;
    let (a, b) = (&two.a, &two.b);
    let reply = put(a, &two.app, "one", &json!(1)).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{:?}", reply.body);
    for gate in [a, b] {
        let reply = gate
            .call_as(
                Some(&two.app),
                Method::POST,
                "/v1/queues/jobs/items",
                Some(json!({"n": 1})),
            )
            .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{:?}", reply.body);
    }
    // Three values stored: a fourth of either kind is refused.
    let refused = a
        .call_as(
            Some(&two.app),
            Method::POST,
            "/v1/queues/jobs/items",
            Some(json!({"n": 2})),
        )
        .await;
    assert_quota(&refused, "--quota-znodes-per-principal");
    assert_quota(
        &put(b, &two.app, "two", &json!(2)).await,
        "--quota-znodes-per-principal",
    );
    let state = a.call_as(Some(&two.app), Method::GET, "/v1/queues/jobs", None).await;
    assert_eq!(state.i64("depth"), 2, "{:?}", state.body);
    // An item taken (by another principal, on the other instance) is no longer charged.
    let taken = b
        .call_as(
            Some(&two.other),
            Method::POST,
            "/v1/queues/jobs/take?mode=at-most-once&wait=0",
            None,
        )
        .await;
    assert_eq!(taken.status, StatusCode::OK, "{:?}", taken.body);
    let reply = put(b, &two.app, "two", &json!(2)).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{:?}", reply.body);
    // An item claimed and acknowledged, too.
    let claimed = a
        .call_as(Some(&two.other), Method::POST, "/v1/queues/jobs/take?wait=0", None)
        .await;
    assert_eq!(claimed.status, StatusCode::OK, "{:?}", claimed.body);
    let ack = format!("/v1/queues/jobs/claims/{}/ack", claimed.str("claim"));
    let acked = a.call_as(Some(&two.other), Method::POST, &ack, None).await;
    assert!(acked.status.is_success(), "{:?}", acked.body);
    let reply = put(a, &two.app, "three", &json!(3)).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{:?}", reply.body);
}

/// A writer that never stops, against a ZooKeeper with a small heap: without zkgate's quota
/// on its tree, 400 items of 200 KiB (80 MB, and as much again in ZooKeeper's log of recent
/// transactions) would exhaust a 160 MB heap. With it, the writer gets 507 and ZooKeeper keeps
/// serving.
#[tokio::test]
async fn a_writer_that_never_stops_gets_507_and_zookeeper_keeps_serving() {
    let options = ServerOptions {
        heap_mb: 160,
        ..common::test_server_options()
    };
    let zk = ZooKeeperServer::start_standalone(&options).await.expect("ZooKeeper");
    let mut config = test_config(&zk.connect_string());
    config.quota_bytes = 24 * 1024 * 1024;
    config.quota_bytes_per_principal = 0;
    let gate = Gate::start_with(config).await;
    let item = vec![7u8; 200 * 1024];
    let mut stored = 0;
    let refused = loop {
        let response = gate
            .http
            .post(format!("{}/v1/queues/flood/items", gate.url))
            .header("content-type", "application/octet-stream")
            .body(item.clone())
            .send()
            .await
            .expect("put");
        let reply = Reply::read(response).await;
        if reply.status != StatusCode::CREATED {
            break reply;
        }
        stored += 1;
        assert!(stored < 400, "400 items of 200 KiB stored: nothing bounds the tree");
    };
    assert_quota(&refused, "--quota-bytes");
    // About 24 MiB went in, and not much less.
    assert!((100..=125).contains(&stored), "{stored} items stored");
    // For the record (the closing note's figure): ZooKeeper's heap after a full collection.
    if let Some(pid) = zk.pid() {
        let pid = pid.to_string();
        let _ = std::process::Command::new("jcmd").args([&pid, "GC.run"]).output();
        let heap = std::process::Command::new("jcmd").args([&pid, "GC.heap_info"]).output();
        if let Ok(heap) = heap {
            eprintln!(
                "ZooKeeper's heap after {stored} items:\n{}",
                String::from_utf8_lossy(&heap.stdout)
            );
        }
    }
    // ZooKeeper still serves: the instance is ready, a take gives room back, and a put fits.
    // Ready again, that is: the full collection just asked for stops ZooKeeper for a while (for
    // seconds beside two CPU hogs, past the heartbeat's bound), and the instance says it cannot
    // keep leases until its heartbeat is answered again.
    within(Duration::from_secs(60), "the instance to be ready", async {
        while gate.get("/readyz").await.status != StatusCode::OK {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let taken = gate.post("/v1/queues/flood/take?mode=at-most-once&wait=0", None).await;
    assert_eq!(taken.status, StatusCode::OK, "{:?}", taken.body);
    let response = gate
        .http
        .post(format!("{}/v1/queues/flood/items", gate.url))
        .header("content-type", "application/octet-stream")
        .body(item)
        .send()
        .await
        .expect("put");
    assert_eq!(response.status(), StatusCode::CREATED);
    let lock = gate.post("/v1/locks/after-the-flood/acquire?wait=0", None).await;
    assert_eq!(lock.status, StatusCode::OK, "{:?}", lock.body);
}

#[tokio::test]
async fn members_data_and_proclaimed_values_count_against_their_principal() {
    let two = two_instances(|c| {
        c.quota_bytes_per_principal = 100 * 1024;
        c.quota_znodes_per_principal = 0;
    })
    .await;
    let (a, b, app) = (&two.a, &two.b, Some(two.app.as_str()));
    let big = json!("m".repeat(60_000));
    let (m1, m2) = ("/v1/groups/workers/members/m1", "/v1/groups/workers/members/m2");
    let joined = a
        .call_as(app, Method::PUT, m1, Some(json!({"data": big, "ttl": "30s"})))
        .await;
    assert_eq!(joined.status, StatusCode::CREATED, "{:?}", joined.body);
    // A second 60 KB member passes 100 KiB, on either instance, and is not created.
    let refused = b
        .call_as(app, Method::PUT, m2, Some(json!({"data": big, "ttl": "30s"})))
        .await;
    assert_quota(&refused, "--quota-bytes-per-principal");
    let members = a.call_as(app, Method::GET, "/v1/groups/workers", None).await;
    assert_eq!(
        members.body["members"].as_array().map(Vec::len),
        Some(1),
        "{:?}",
        members.body
    );
    // The leader's proclaimed value too.
    let campaign = b
        .call_as(
            app,
            Method::POST,
            "/v1/elections/primary/campaign?wait=5s",
            Some(json!({"ttl": "30s"})),
        )
        .await;
    assert_eq!(campaign.status, StatusCode::OK, "{:?}", campaign.body);
    let handle = campaign.str("handle");
    let proclaim = json!({"handle": handle, "value": big});
    let refused = b
        .call_as(app, Method::PUT, "/v1/elections/primary/leader", Some(proclaim.clone()))
        .await;
    assert_quota(&refused, "--quota-bytes-per-principal");
    // Leaving the group gives its room back; then the value is proclaimed, and holds it.
    let left = a.call_as(app, Method::DELETE, m1, None).await;
    assert!(left.status.is_success(), "{:?}", left.body);
    let proclaimed = b
        .call_as(app, Method::PUT, "/v1/elections/primary/leader", Some(proclaim))
        .await;
    assert_eq!(proclaimed.status, StatusCode::OK, "{:?}", proclaimed.body);
    let refused = a
        .call_as(app, Method::PUT, m2, Some(json!({"data": big, "ttl": "30s"})))
        .await;
    assert_quota(&refused, "--quota-bytes-per-principal");
    // The other principal is not held back by any of it.
    let joined = a
        .call_as(
            Some(&two.other),
            Method::PUT,
            m2,
            Some(json!({"data": big, "ttl": "30s"})),
        )
        .await;
    assert_eq!(joined.status, StatusCode::CREATED, "{:?}", joined.body);
}

/// Servers that do not enforce quotas: zkgate says so in `/readyz` and checks each
/// principal's usage itself before the write.
#[tokio::test]
async fn without_enforcement_zkgate_says_so_and_checks_the_quota_itself() {
    let options = ServerOptions {
        // zoo.cfg's unknown keys become `zookeeper.*` properties, after the command line's.
        extra_config: vec!["enforceQuota=false".into()],
        ..common::test_server_options()
    };
    let zk = ZooKeeperServer::start_standalone(&options).await.expect("ZooKeeper");
    let mut config = test_config(&zk.connect_string());
    config.quota_znodes_per_principal = 2;
    let gate = Gate::start_with(config).await;
    let enforcement = gate.running.state.quotas.probed().await;
    assert_eq!(enforcement, zkgate::recipes::usage::Enforcement::NotEnforced);
    let ready = gate.get("/readyz").await;
    assert_eq!(ready.body["zookeeper"]["quotas"], "not_enforced", "{:?}", ready.body);
    for key in ["a", "b"] {
        let reply = gate.call(Method::PUT, &format!("/v1/kv/{key}"), Some(json!(1))).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{:?}", reply.body);
    }
    assert_quota(
        &gate.call(Method::PUT, "/v1/kv/c", Some(json!(1))).await,
        "--quota-znodes-per-principal",
    );
    // Where they are enforced, `/readyz` says that.
    let zk = zookeeper().await;
    let gate = Gate::start_with(test_config(&zk.connect_string())).await;
    gate.running.state.quotas.probed().await;
    assert_eq!(gate.get("/readyz").await.body["zookeeper"]["quotas"], "enforced");
}

/// A transaction's puts are charged as single puts are, and its deletes give the room back: it
/// is no way around the quota.
#[tokio::test]
async fn a_transactions_puts_count_against_their_principal() {
    let two = two_instances(|c| {
        c.quota_bytes_per_principal = 100 * 1024;
        c.quota_znodes_per_principal = 0;
    })
    .await;
    let big = "x".repeat(60 * 1024);
    let txn = |keys: &[&str]| json!({"then": keys.iter().map(|k| json!({"put": k, "text": big})).collect::<Vec<_>>()});
    let first = post_txn(&two.a, &two.app, txn(&["t/one"])).await;
    assert_eq!(first.status, StatusCode::OK, "{:?}", first.body);
    // Two more values of 60 KiB pass 100 KiB: refused whole, through the other instance too.
    let over = post_txn(&two.b, &two.app, txn(&["t/two", "t/three"])).await;
    assert_quota(&over, "--quota-bytes-per-principal");
    let stored = two.a.call_as(Some(&two.app), Method::GET, "/v1/kv/t/two", None).await;
    assert_eq!(stored.status, StatusCode::NOT_FOUND, "nothing of it stored");
    // Deleting the first in a transaction gives its room back to the next request (not to a put
    // of the same transaction: ZooKeeper checks a multi-op's quotas against the tree before it).
    let deleted = post_txn(&two.a, &two.app, json!({"then": [{"delete": "t/one"}]})).await;
    assert_eq!(deleted.body["results"][0]["deleted"], true, "{:?}", deleted.body);
    let freed = post_txn(&two.b, &two.app, txn(&["t/two"])).await;
    assert_eq!(freed.status, StatusCode::OK, "{:?}", freed.body);
}

async fn post_txn(gate: &Gate, token: &str, body: Value) -> Reply {
    gate.call_as(Some(token), Method::POST, "/v1/kv-txn", Some(body)).await
}
