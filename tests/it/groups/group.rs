//! Group membership over HTTP: members with data, a member whose lease ends disappears, and a
//! blocked reader returns with the change.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{Gate, within, zookeeper, zookeeper_own};
use reqwest::{Method, StatusCode};
use serde_json::json;

/// The ids of the members in a group's state, in its order.
fn member_ids(state: &serde_json::Value) -> Vec<String> {
    let members = state["members"].as_array().expect("members");
    members
        .iter()
        .map(|m| m["id"].as_str().expect("id").to_string())
        .collect()
}

#[tokio::test]
async fn members_join_with_data_and_leave_when_their_lease_ends_waking_a_blocked_reader() {
    let zk = zookeeper().await;
    let gate = Arc::new(Gate::start(&zk.connect_string()).await);
    let empty = gate.get("/v1/groups/workers").await;
    assert_eq!(
        (empty.status, empty.body["members"].clone()),
        (StatusCode::OK, json!([]))
    );

    let steady = gate.lease("60s").await;
    let joined = gate
        .call(
            Method::PUT,
            "/v1/groups/workers/members/w1",
            Some(json!({"lease": steady, "data": {"port": 1}})),
        )
        .await;
    assert_eq!(joined.status, StatusCode::CREATED, "{joined:?}");
    let again = gate
        .call(
            Method::PUT,
            "/v1/groups/workers/members/w1",
            Some(json!({"lease": steady})),
        )
        .await;
    assert_eq!(
        again.status,
        StatusCode::OK,
        "joining again with the same lease: {again:?}"
    );
    let other = gate
        .call(Method::PUT, "/v1/groups/workers/members/w1", Some(json!({"data": 0})))
        .await;
    other.assert_problem(StatusCode::CONFLICT, None);
    assert_eq!(other.body["type"], "urn:zkgate:problem:member-taken");

    // A second member with a short lease that nobody keeps alive.
    let brief = gate
        .call(
            Method::PUT,
            "/v1/groups/workers/members/w2",
            Some(json!({"ttl": "1s", "data": {"port": 2}})),
        )
        .await;
    assert_eq!(brief.status, StatusCode::CREATED, "{brief:?}");
    let listed = gate.get("/v1/groups/workers").await;
    let members: Vec<_> = listed.body["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| (m["id"].clone(), m["data"].clone()))
        .collect();
    assert_eq!(
        members,
        vec![(json!("w1"), json!({"port": 1})), (json!("w2"), json!({"port": 2}))]
    );

    // A reader blocked on the current index returns when w2's lease expires and it leaves.
    let index = listed.body["index"].as_i64().expect("index");
    let changed = within(
        Duration::from_secs(20),
        "the blocked read",
        gate.get(&format!("/v1/groups/workers?index={index}&wait=15s")),
    )
    .await;
    assert_eq!(changed.status, StatusCode::OK);
    assert_ne!(changed.body["index"], listed.body["index"], "{changed:?}");
    assert_eq!(member_ids(&changed.body), ["w1"]);

    // Leaving explicitly; a read with an old index returns at once.
    assert_eq!(
        gate.delete("/v1/groups/workers/members/w1").await.status,
        StatusCode::NO_CONTENT
    );
    let after = gate.get(&format!("/v1/groups/workers?index={index}&wait=15s")).await;
    assert_eq!(after.body["members"], json!([]));
    gate.delete("/v1/groups/workers/members/w1")
        .await
        .assert_problem(StatusCode::NOT_FOUND, None);
    let lease = gate.get(&format!("/v1/leases/{steady}")).await;
    assert_eq!(
        lease.body["holdings"],
        json!([]),
        "the lease no longer holds the membership"
    );
}

#[tokio::test]
async fn a_blocked_read_with_the_current_index_times_out_with_the_same_members() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    assert_eq!(
        gate.call(Method::PUT, "/v1/groups/g/members/m", None).await.status,
        StatusCode::CREATED
    );
    let first = gate.get("/v1/groups/g").await;
    let index = first.body["index"].as_i64().expect("index");
    let same = gate.get(&format!("/v1/groups/g?index={index}&wait=300ms")).await;
    assert_eq!(same.body, first.body);
}

#[tokio::test]
async fn a_blocked_read_without_an_index_returns_at_the_next_change() {
    let zk = zookeeper_own().await;
    let gate = Arc::new(Gate::start(&zk.connect_string()).await);
    assert_eq!(
        gate.call(Method::PUT, "/v1/groups/g/members/m", None).await.status,
        StatusCode::CREATED
    );
    let watches = common::watch_count(zk.client_port()).await;
    let reader = tokio::spawn({
        let gate = gate.clone();
        async move { gate.get("/v1/groups/g?wait=25s").await }
    });
    // The reader waits once zkgate watches the group's members (a children watch, which
    // `wchp` does not list: ZooKeeper's count of watches says it).
    within(Duration::from_secs(10), "the reader to wait", async {
        while common::watch_count(zk.client_port()).await == watches {
            assert!(!reader.is_finished(), "the reader answered before any change");
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(
        gate.call(Method::PUT, "/v1/groups/g/members/n", None).await.status,
        StatusCode::CREATED
    );
    let changed = within(Duration::from_secs(10), "the next change", reader)
        .await
        .expect("the reader");
    assert_eq!(member_ids(&changed.body), ["m", "n"], "{changed:?}");
}
