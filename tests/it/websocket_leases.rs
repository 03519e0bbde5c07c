//! Sockets that hold leases and act: a lease bound to a socket keeps a lock, a leadership
//! and a group membership while the socket lives, and lets them go when it closes; API calls
//! over the socket answer as over HTTP.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::ws::Ws;
use common::{Gate, within, zookeeper};
use reqwest::StatusCode;
use serde_json::json;

#[tokio::test]
async fn closing_the_socket_releases_its_lock_leadership_and_membership() {
    let zk = zookeeper().await;
    let gate = Arc::new(Gate::start(&zk.connect_string()).await);
    let mut ws = Ws::connect(gate.running.addr, "/v1/ws").await;

    ws.send(json!({"op": "lease", "id": "L", "ttl": "1s"}));
    let bound = ws.next_for("L").await;
    assert_eq!(bound["op"], "lease", "{bound}");
    assert_eq!(bound["lease"]["ttl_ms"], 1000);
    let lease = bound["lease"]["id"].as_str().expect("lease id").to_string();

    let held = ws
        .call(
            "a",
            "POST",
            "/v1/locks/jobs/acquire?wait=0",
            Some(json!({"lease": lease})),
        )
        .await;
    assert_eq!(held["status"], 200, "{held}");
    let token = held["body"]["fencing_token"].as_i64().expect("fencing token");
    let led = ws
        .call(
            "c",
            "POST",
            "/v1/elections/jobs/campaign?wait=5s",
            Some(json!({"lease": lease, "value": "socket"})),
        )
        .await;
    assert_eq!(led["status"], 200, "{led}");
    let joined = ws
        .call(
            "j",
            "PUT",
            "/v1/groups/workers/members/socket",
            Some(json!({"lease": lease})),
        )
        .await;
    assert_eq!(joined["status"], 201, "{joined}");

    // While the socket lives its lease outlives its 1 s TTL many times over: a rival that
    // waits 3 s for the lock does not get it.
    let rival = gate.lease("30s").await;
    let refused = gate.acquire("jobs", &rival, "wait=3s").await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{refused:?}");
    assert_eq!(gate.get(&format!("/v1/leases/{lease}")).await.status, StatusCode::OK);

    // The rival waits again; the socket closes; the lease expires one TTL later and the lock,
    // the leadership and the membership go with it.
    let waiting = {
        let gate = gate.clone();
        let rival = rival.clone();
        tokio::spawn(async move { gate.acquire("jobs", &rival, "wait=20s").await })
    };
    ws.close().await;
    let granted = within(Duration::from_secs(20), "the rival's grant", waiting)
        .await
        .expect("acquire");
    assert_eq!(granted.status, StatusCode::OK, "{granted:?}");
    assert!(granted.i64("fencing_token") > token);
    let ended = gate.get(&format!("/v1/leases/{lease}")).await;
    ended.assert_problem(StatusCode::GONE, None);
    assert_eq!(ended.body["reason"], "expired");
    let election = gate.get("/v1/elections/jobs").await;
    assert_eq!(election.body["leader"], serde_json::Value::Null, "{election:?}");
    let members = gate.get("/v1/groups/workers").await;
    assert_eq!(members.body["members"], json!([]), "{members:?}");
}

#[tokio::test]
async fn calls_over_the_socket_answer_as_over_http_and_bad_ones_get_errors() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let mut ws = Ws::connect(gate.running.addr, "/v1/ws").await;

    // The same problem documents as over HTTP.
    let bad = ws.call("b", "POST", "/v1/locks/a%2Fb/acquire?wait=0", None).await;
    assert_eq!(bad["status"], 400, "{bad}");
    assert_eq!(
        (bad["body"]["type"].as_str(), bad["body"]["field"].as_str()),
        (Some("urn:zkgate:problem:invalid-field"), Some("name")),
        "{bad}"
    );
    let missing = ws.call("m", "GET", "/v1/nowhere", None).await;
    assert_eq!(missing["status"], 404, "{missing}");

    // A long poll does not hold the socket up: a later call answers first.
    let lease = gate.lease("30s").await;
    gate.acquire("busy", &lease, "wait=0").await;
    ws.send(json!({"op": "call", "id": "slow", "method": "POST", "path": "/v1/locks/busy/acquire?wait=3s"}));
    let quick = ws.call("quick", "GET", "/v1/locks/busy", None).await;
    assert_eq!(quick["status"], 200, "{quick}");
    assert_eq!(quick["body"]["waiters"].as_array().map(Vec::len), Some(1), "{quick}");
    let slow = ws.next_for("slow").await;
    assert_eq!(slow["status"], 409, "{slow}");

    // Bad calls and leases are refused on the socket, which stays up.
    for (message, problem) in [
        (
            json!({"op": "call", "id": "x", "method": "GET", "path": "/healthz"}),
            "invalid-call",
        ),
        (
            json!({"op": "call", "id": "x", "method": "GE T", "path": "/v1/leases"}),
            "invalid-call",
        ),
        (json!({"op": "lease", "id": "x", "attach": "nope"}), "unknown-lease"),
        (json!({"op": "lease", "id": "x", "ttl": "soon"}), "malformed-message"),
    ] {
        ws.send(message.clone());
        let error = ws.next().await;
        assert_eq!(
            (error["op"].as_str(), error["type"].as_str()),
            (Some("error"), Some(format!("urn:zkgate:problem:{problem}").as_str())),
            "{message} -> {error}"
        );
    }
    let alive = ws.call("after", "GET", "/v1/leases", None).await;
    assert_eq!(alive["status"], 200);
}
