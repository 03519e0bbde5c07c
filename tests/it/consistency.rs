//! `?consistency=` on every read: refused when it names no mode, and the default's ZooKeeper
//! `sync`s shared by concurrent reads (a fraction of one per read), none in the sequential
//! mode. (That the default is linearizable across instances and the sequential mode is not is
//! tests/it/linearizability.rs, on an ensemble.)

use crate::common;

use std::sync::Arc;

use common::{Gate, zookeeper};
use reqwest::{Method, StatusCode};

/// Every `GET` the spec gives the parameter: `?consistency=bogus` is a 400 naming it, and
/// both modes are accepted.
#[tokio::test]
async fn every_read_takes_a_consistency_and_refuses_one_it_does_not_know() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let spec = serde_json::to_value(zkgate::openapi()).expect("spec");
    let mut reads = 0;
    for (path, item) in spec["paths"].as_object().expect("paths") {
        let Some(parameters) = item["get"]["parameters"].as_array() else {
            continue;
        };
        if !parameters.iter().any(|p| p["name"] == "consistency") {
            continue;
        }
        reads += 1;
        // Every path parameter a valid name that exists nowhere (a token, a number).
        let concrete: String = path
            .split('/')
            .map(|segment| {
                if segment == "{token}" {
                    "42"
                } else if segment.starts_with('{') {
                    "nothing-here"
                } else {
                    segment
                }
            })
            .collect::<Vec<_>>()
            .join("/");
        let refused = gate.get(&format!("{concrete}?consistency=bogus")).await;
        refused.assert_problem(StatusCode::BAD_REQUEST, Some("consistency"));
        assert!(
            refused.body["detail"]
                .as_str()
                .unwrap_or_default()
                .contains("sequential"),
            "{path}: {refused:?}"
        );
        for mode in ["linearizable", "sequential"] {
            let answered = gate.get(&format!("{concrete}?consistency={mode}")).await;
            assert!(
                answered.status != StatusCode::BAD_REQUEST && !answered.status.is_server_error(),
                "{path} with {mode}: {answered:?}"
            );
        }
    }
    assert!(reads >= 25, "only {reads} reads document the parameter");
    // Not on writes: there it is an unknown parameter like any other.
    let lease = gate.lease("10s").await;
    gate.post(
        "/v1/locks/x/acquire?consistency=sequential",
        Some(serde_json::json!({"lease": lease})),
    )
    .await
    .assert_problem(StatusCode::BAD_REQUEST, Some("consistency"));
}

/// Two hundred reads at once cost far fewer `sync`s than reads (one in flight and one
/// gathering at a time), and the sequential mode costs none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reads_share_their_syncs_and_sequential_reads_send_none() {
    let zk = zookeeper().await;
    let gate = Arc::new(Gate::start(&zk.connect_string()).await);
    let put = gate
        .call(Method::PUT, "/v1/kv/shared", Some(serde_json::json!(1)))
        .await;
    assert_eq!(put.status, StatusCode::CREATED, "{put:?}");
    let syncs = || gate.running.state.zk().current().expect("session").syncs_sent();

    let reads = |query: &'static str| {
        let gate = gate.clone();
        async move {
            let all: Vec<_> = (0..200)
                .map(|_| {
                    let gate = gate.clone();
                    tokio::spawn(async move { gate.get(&format!("/v1/kv/shared{query}")).await.status })
                })
                .collect();
            for read in all {
                assert_eq!(read.await.expect("read"), StatusCode::OK);
            }
        }
    };
    let before = syncs();
    reads("?consistency=sequential").await;
    assert_eq!(syncs(), before, "sequential reads sent a sync");

    let before = syncs();
    reads("").await;
    let sent = syncs() - before;
    println!("200 concurrent linearizable reads: {sent} syncs");
    assert!(sent >= 1, "linearizable reads sent no sync");
    assert!(sent < 100, "{sent} syncs for 200 concurrent reads: not shared");
}

/// A linearizable read's barrier is a transaction on an ensemble, whose leader a `sync` does not
/// hold back (`src/zk/sync.rs`), and a `sync` on a standalone server, which applies everything
/// in order and where a transaction would cost a log write for nothing.
#[tokio::test]
async fn the_barrier_is_a_transaction_on_an_ensemble_and_a_sync_on_one_server() {
    let transactions = |gate: &Gate| {
        gate.running
            .state
            .zk()
            .current()
            .expect("session")
            .barriers_are_transactions()
    };
    let zk = zookeeper().await;
    let alone = Gate::start(&zk.connect_string()).await;
    let read = alone.get("/v1/kv/none").await;
    assert_eq!(read.status, StatusCode::NOT_FOUND, "{read:?}");
    assert_eq!(transactions(&alone), Some(false), "a standalone server");
    let ensemble = common::Ensemble::start(3).await;
    let gate = Gate::start(&ensemble.servers[0].connect_string()).await;
    let read = gate.get("/v1/kv/none").await;
    assert_eq!(read.status, StatusCode::NOT_FOUND, "{read:?}");
    assert_eq!(transactions(&gate), Some(true), "a server of an ensemble");
}
