//! Leader election over HTTP: one leader at a time while leaders resign (through any
//! instance) and lose their lease, and while their instance's ZooKeeper sessions expire (which
//! takes nothing from them); candidates take over in order with increasing terms; only the
//! leader may proclaim; "no leader" is visible.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::proxy::Proxy;
use common::{Gate, Reply, expire_sessions, within, zookeeper};
use reqwest::StatusCode;
use serde_json::json;

async fn campaign(gate: &Gate, lease: &str, query: &str) -> Reply {
    gate.post(
        &format!("/v1/elections/jobs/campaign?{query}"),
        Some(json!({ "lease": lease, "value": lease })),
    )
    .await
}

/// The election as seen from `gate`: asserts that the leader is `expected` (by lease) and
/// acknowledged, and returns its term.
async fn assert_leader(gate: &Gate, expected: &str) -> i64 {
    let state = gate.get("/v1/elections/jobs").await;
    let leader = &state.body["leader"];
    assert_eq!(leader["lease"], expected, "{state:?}");
    assert_eq!(leader["acknowledged"], true, "{state:?}");
    assert_eq!(leader["value"], expected, "the leader's value: {state:?}");
    assert_eq!(
        state.body["candidates"][0]["node"], leader["node"],
        "the leader is the first candidate"
    );
    leader["term"].as_i64().expect("term")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_at_a_time_through_resignation_lease_expiry_and_session_expiry() {
    let zk = zookeeper().await;
    let proxy = Proxy::start(&zk.connect_string()).await;
    let a = Arc::new(Gate::start(&proxy.connect_string()).await);
    let b = Arc::new(Gate::start(&zk.connect_string()).await);

    // c1..c3 campaign on instance A, c4 and c5 on B, in this order.
    let leases = [
        a.lease("60s").await,
        a.lease("2s").await,
        a.lease("60s").await,
        b.lease("60s").await,
        b.lease("60s").await,
    ];
    let gates = [a.clone(), a.clone(), a.clone(), b.clone(), b.clone()];
    let first = campaign(&a, &leases[0], "wait=5s").await;
    assert_eq!(first.status, StatusCode::OK, "{first:?}");
    for (i, lease) in leases.iter().enumerate().skip(1) {
        let joined = campaign(&gates[i], lease, "wait=0").await;
        assert_eq!(joined.status, StatusCode::ACCEPTED, "{joined:?}");
        assert_eq!(joined.body["position"], i);
    }
    let mut term = assert_leader(&b, &leases[0]).await;

    // Candidate 2 keeps its short lease alive until it leads, then goes silent.
    let c2_leads = Arc::new(AtomicBool::new(false));
    let keeper = {
        let (a, lease, c2_leads) = (a.clone(), leases[1].clone(), c2_leads.clone());
        tokio::spawn(async move {
            while !c2_leads.load(Ordering::SeqCst) {
                a.post(&format!("/v1/leases/{lease}/keepalive"), None).await;
                tokio::time::sleep(Duration::from_millis(300)).await; // the keepalive period, not a synchronisation
            }
        })
    };
    let waiters: Vec<_> = (1..5)
        .map(|i| {
            let (gate, lease) = (gates[i].clone(), leases[i].clone());
            tokio::spawn(async move { campaign(&gate, &lease, "wait=30s").await })
        })
        .collect();
    let mut waiters = waiters.into_iter();

    // 1. The leader resigns: candidate 2 leads.
    let resigned = a
        .delete(&format!("/v1/elections/jobs/candidates/{}", first.str("handle")))
        .await;
    assert_eq!(resigned.status, StatusCode::NO_CONTENT);
    let led = within(Duration::from_secs(30), "candidate 2 to lead", waiters.next().unwrap())
        .await
        .unwrap();
    assert_eq!(led.status, StatusCode::OK, "{led:?}");
    c2_leads.store(true, Ordering::SeqCst);
    keeper.await.expect("keeper");
    let next = assert_leader(&b, &leases[1]).await;
    assert!(next > term);
    term = next;

    // 2. Its lease expires: candidate 3 leads.
    let led = within(Duration::from_secs(30), "candidate 3 to lead", waiters.next().unwrap())
        .await
        .unwrap();
    assert_eq!(led.status, StatusCode::OK, "{led:?}");
    let gone = a.get(&format!("/v1/leases/{}", leases[1])).await;
    assert_eq!(gone.body["reason"], "expired", "{gone:?}");
    let next = assert_leader(&b, &leases[2]).await;
    assert!(next > term);
    term = next;

    // 3. Instance A's sessions expire: candidate 3 leads on, with the same term (its lease and
    // its candidate outlive the session). It resigns through B, which serves that from
    // ZooKeeper (A keeps its lease): candidate 4 leads.
    let c3 = led.str("handle");
    expire_sessions(&proxy, &zk.connect_string(), a.sessions().await).await;
    a.wait_generation(2).await;
    within(Duration::from_secs(20), "A ready again", a.running.state.wait_ready()).await;
    assert_eq!(assert_leader(&b, &leases[2]).await, term);
    let resigned = b.delete(&format!("/v1/elections/jobs/candidates/{c3}")).await;
    assert_eq!(resigned.status, StatusCode::NO_CONTENT, "{resigned:?}");
    let led = within(Duration::from_secs(30), "candidate 4 to lead", waiters.next().unwrap())
        .await
        .unwrap();
    assert_eq!(led.status, StatusCode::OK, "{led:?}");
    let next = assert_leader(&b, &leases[3]).await;
    assert!(next > term);
    let state = b.get("/v1/elections/jobs").await;
    assert_eq!(
        state.body["candidates"].as_array().map(Vec::len),
        Some(2),
        "candidates 4 and 5 remain: {state:?}"
    );

    // Only the leader may proclaim.
    let c5 = b.get(&format!("/v1/leases/{}", leases[4])).await;
    let c5_handle = c5.body["holdings"][0]["handle"]
        .as_str()
        .expect("c5 handle")
        .to_string();
    let refused = b
        .call(
            reqwest::Method::PUT,
            "/v1/elections/jobs/leader",
            Some(json!({"handle": c5_handle, "value": "usurper"})),
        )
        .await;
    refused.assert_problem(StatusCode::CONFLICT, None);
    assert_eq!(refused.body["type"], "urn:zkgate:problem:not-leader");
    let proclaimed = b
        .call(
            reqwest::Method::PUT,
            "/v1/elections/jobs/leader",
            Some(json!({"handle": led.str("handle"), "value": {"shard": 7}})),
        )
        .await;
    assert_eq!(proclaimed.status, StatusCode::OK, "{proclaimed:?}");
    let state = b.get("/v1/elections/jobs").await;
    assert_eq!(state.body["leader"]["value"], json!({"shard": 7}), "{state:?}");

    // Candidate 5 is still waiting, at position 1.
    let c5_view = b.get(&format!("/v1/elections/jobs/candidates/{c5_handle}")).await;
    assert_eq!(
        (c5_view.body["state"].as_str(), c5_view.body["position"].as_u64()),
        (Some("waiting"), Some(1))
    );
    drop(waiters);
}

#[tokio::test]
async fn no_leader_is_a_visible_state_and_a_lone_candidate_leads_at_once() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let empty = gate.get("/v1/elections/quiet").await;
    assert_eq!(empty.status, StatusCode::OK);
    assert!(empty.body["leader"].is_null(), "{empty:?}");
    assert_eq!(empty.body["candidates"], json!([]));

    let led = gate.post("/v1/elections/quiet/campaign?wait=0", None).await;
    assert_eq!(led.status, StatusCode::OK, "{led:?}");
    assert_eq!(led.body["leader"], true);
    assert_eq!(led.body["position"], 0);
    let lease = led.body["lease"]["id"].as_str().expect("lease").to_string();
    // The acknowledgement node says who leads.
    let client = common::zk_client(&zk.connect_string()).await;
    let (ack, _) = client
        .get_data("/zkgate/elections/quiet/leader")
        .await
        .expect("acknowledgement");
    let ack: serde_json::Value = serde_json::from_slice(&ack).expect("json");
    assert_eq!(ack["candidate"], led.body["node"]);
    assert_eq!(ack["term"], led.body["term"]);

    // Its lease goes: no leader again, and the acknowledgement goes with it.
    assert_eq!(
        gate.delete(&format!("/v1/leases/{lease}")).await.status,
        StatusCode::NO_CONTENT
    );
    let after = gate.get("/v1/elections/quiet").await;
    assert!(after.body["leader"].is_null(), "{after:?}");
    assert!(
        client
            .check_stat("/zkgate/elections/quiet/leader")
            .await
            .expect("stat")
            .is_none()
    );
}

#[tokio::test]
async fn a_leader_waiting_on_its_candidate_learns_at_once_that_it_lost_the_lead() {
    let zk = zookeeper().await;
    let gate = Arc::new(Gate::start(&zk.connect_string()).await);
    let led = gate.post("/v1/elections/watched/campaign?wait=5s", None).await;
    assert_eq!(led.status, StatusCode::OK, "{led:?}");
    let handle = led.str("handle");
    let node = led.str("node");

    // Nothing to report: the long poll runs its course and says it still leads.
    let quiet = gate
        .get(&format!("/v1/elections/watched/candidates/{handle}?wait=200ms"))
        .await;
    assert_eq!(quiet.body["state"], "held", "{quiet:?}");

    let news = {
        let gate = gate.clone();
        tokio::spawn(async move {
            gate.get(&format!("/v1/elections/watched/candidates/{handle}?wait=30s"))
                .await
        })
    };
    // Someone removes the leader's node behind zkgate's back.
    let client = common::zk_client(&zk.connect_string()).await;
    client
        .delete(&format!("/zkgate/elections/watched/{node}"), None)
        .await
        .expect("delete the candidate");
    let news = within(Duration::from_secs(10), "the leader's news", news)
        .await
        .expect("task");
    assert_eq!(news.body["state"], "lost", "{news:?}");
}

/// A candidate reads as a candidate: its election, whether it leads, its term and position;
/// an unknown one is a 404 that names the election, not a lock.
#[tokio::test]
async fn a_candidate_reads_as_a_candidate_of_its_election() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let (first, second) = (gate.lease("30s").await, gate.lease("30s").await);
    let leader = campaign(&gate, &first, "wait=5s").await;
    let waiting = campaign(&gate, &second, "wait=0").await;
    assert_eq!(waiting.status, StatusCode::ACCEPTED, "{waiting:?}");
    let read = |handle: String| {
        let gate = &gate;
        async move { gate.get(&format!("/v1/elections/jobs/candidates/{handle}")).await }
    };
    let leading = read(leader.str("handle")).await;
    assert_eq!(
        (
            leading.body["election"].as_str(),
            leading.body["leader"].as_bool(),
            leading.body["state"].as_str()
        ),
        (Some("jobs"), Some(true), Some("held")),
        "{leading:?}"
    );
    assert_eq!(leading.body["term"], leader.body["term"]);
    let queued = read(waiting.str("handle")).await;
    assert_eq!(
        (queued.body["leader"].as_bool(), queued.body["position"].as_u64()),
        (Some(false), Some(1)),
        "{queued:?}"
    );
    let unknown = read("nobody".into()).await;
    unknown.assert_problem(StatusCode::NOT_FOUND, None);
    assert!(
        unknown.body["detail"]
            .as_str()
            .is_some_and(|d| d.contains("election `jobs`")),
        "{unknown:?}"
    );
}

/// A former leader's acknowledgement left behind (its leader gone before it could retract it)
/// is overwritten by the next leader, not deleted and made again: the former leader's retract,
/// a delete at the version it read, then fails instead of removing the new leader's (a node
/// made again starts at version 0 again, which is the version the stale one was read at).
/// When the new leader began leading is still told, from the acknowledgement itself.
#[tokio::test]
async fn a_stale_acknowledgement_is_overwritten_so_its_former_leader_cannot_remove_the_new_one() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let client = common::zk_client(&zk.connect_string()).await;
    let dir = "/zkgate/elections/handover";
    let ack_path = format!("{dir}/leader");
    let acls = zookeeper_client::Acls::anyone_all();
    let persistent = zookeeper_client::CreateMode::Persistent.with_acls(acls);
    client.mkdir(dir, &persistent).await.expect("the election's znode");
    let stale = json!({"candidate": "_c_0f0e0d0c-latch-0000000000", "term": 1, "lease": "gone", "value": null});
    client
        .create(&ack_path, &serde_json::to_vec(&stale).unwrap(), &persistent)
        .await
        .expect("a stale acknowledgement");
    // What the former leader's retract read before it deletes.
    let (_, read) = client.get_data(&ack_path).await.expect("read");

    let led = gate.post("/v1/elections/handover/campaign?wait=5s", None).await;
    assert_eq!(led.status, StatusCode::OK, "{led:?}");
    let (data, now) = client.get_data(&ack_path).await.expect("the new acknowledgement");
    let ack: serde_json::Value = serde_json::from_slice(&data).expect("json");
    assert_eq!(ack["candidate"], led.body["node"], "{ack}");
    assert_eq!(now.czxid, read.czxid, "overwritten, not made again");

    // The former leader's retract, late: refused, and the new leader stays acknowledged.
    let late = client.delete(&ack_path, Some(read.version)).await;
    assert!(matches!(late, Err(zookeeper_client::Error::BadVersion)), "{late:?}");
    let state = gate.get("/v1/elections/handover").await;
    assert_eq!(state.body["leader"]["acknowledged"], true, "{state:?}");
    assert!(state.body["leader"]["since"].is_string(), "{state:?}");
    let proclaimed = gate
        .call(
            reqwest::Method::PUT,
            "/v1/elections/handover/leader",
            Some(json!({"handle": led.str("handle"), "value": 7})),
        )
        .await;
    assert_eq!(proclaimed.status, StatusCode::OK, "{proclaimed:?}");
}
