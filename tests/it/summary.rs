//! A kind's summary topic (`summary:locks`), followed over a real event stream: the count of
//! every resource and the busiest first, kept current from one recursive watch however many
//! resources there are, the queue's depth, claims and dead letters, and who may follow it.

use crate::common;

use common::sse::Sse;
use common::{Gate, auth_config, grant, make_contended, test_config, watch_count, zk_client, zookeeper, zookeeper_own};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// The rows of a summary state as `(name, value)`.
fn top(state: &Value) -> Vec<(String, u64)> {
    state["top"]
        .as_array()
        .expect("top")
        .iter()
        .map(|r| {
            (
                r["name"].as_str().expect("name").to_string(),
                r["value"].as_u64().expect("value"),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_summary_counts_every_lock_and_ranks_the_busiest_with_one_watch() {
    let zk = zookeeper_own().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let base = format!("{}/locks", gate.running.state.config.root);
    // 2,000 locks, as clients elsewhere hold them: most with one holder, a few contended.
    let peer = zk_client(&zk.connect_string()).await;
    let locks: Vec<(String, usize)> = (0..2000)
        .map(|i| (format!("lock-{i:04}"), if i % 500 == 7 { 1 + i / 500 } else { 1 }))
        .collect();
    make_contended(&peer, &base, &locks).await;
    let watches_before = watch_count(zk.client_port()).await;

    let mut stream = Sse::open(&gate.http, &format!("{}/v1/events?topic=summary:locks", gate.url), None).await;
    let state = stream.next().await;
    assert_eq!(
        (state["topic"].as_str(), state["type"].as_str()),
        (Some("summary:locks"), Some("state"))
    );
    let summary = &state["state"];
    assert_eq!(
        (summary["kind"].as_str(), summary["measure"].as_str()),
        (Some("locks"), Some("waiters"))
    );
    assert_eq!(summary["count"], 2000, "every lock counted");
    assert_eq!(summary["busy"], 3, "three locks have waiters");
    assert_eq!(summary["total"], 1 + 2 + 3);
    assert_eq!(
        top(summary)[..3],
        [
            ("lock-1507".into(), 3),
            ("lock-1007".into(), 2),
            ("lock-0507".into(), 1)
        ],
        "the busiest first"
    );
    assert_eq!(
        top(summary).len(),
        zkgate::events::SUMMARY_TOP,
        "at most the top few rows"
    );
    assert_eq!(summary["top"][0]["held"], 1);
    // Following 2,000 locks costs one (recursive) watch, not one per lock.
    let watches = watch_count(zk.client_port()).await;
    assert!(
        watches <= watches_before + 2,
        "the summary holds {} watches (from {watches_before})",
        watches - watches_before
    );

    // Through the API: a new lock with a holder and four waiters tops the list, live.
    let leases: Vec<String> = futures::future::join_all((0..5).map(|_| gate.lease("30s"))).await;
    let held = gate.acquire("hot", &leases[0], "wait=0").await;
    for lease in &leases[1..] {
        let queued = gate.acquire("hot", lease, "wait=0&keep_queued=true").await;
        assert_eq!(queued.status, StatusCode::ACCEPTED, "{queued:?}");
    }
    let mut seen = vec![state.clone()];
    let hot = stream
        .until("summary:locks", &mut seen, |e| {
            top(&e["state"]).first() == Some(&("hot".into(), 4))
        })
        .await;
    assert_eq!(hot["type"], "changed");
    assert_eq!(hot["state"]["count"], 2001);
    let row = &hot["state"]["top"][0];
    assert!(row["busy_since"].as_i64().is_some(), "{row}");
    assert_eq!(
        row["history"].as_array().and_then(|h| h.last()).map(|p| p[1].clone()),
        Some(json!(4))
    );

    // The holder lets go: one waiter fewer, and `hot` ties with `lock-1507`, which has been
    // busy longer and so comes first. The history shows both values.
    gate.release("hot", &held.str("handle")).await;
    let after = stream
        .until("summary:locks", &mut seen, |e| {
            top(&e["state"])[..2] == [("lock-1507".into(), 3), ("hot".into(), 3)]
        })
        .await;
    let values: Vec<u64> = after["state"]["top"][1]["history"]
        .as_array()
        .expect("history")
        .iter()
        .map(|p| p[1].as_u64().expect("a value"))
        .collect();
    assert_eq!(values.last(), Some(&3));
    assert!(values.contains(&4), "{values:?}");
    // The peer goes away with its contenders: only `hot` is busy, nobody holds the others.
    drop(peer);
    let gone = stream
        .until("summary:locks", &mut seen, |e| e["state"]["busy"] == 1)
        .await;
    assert_eq!(gone["state"]["total"], 3);
    assert_eq!(gone["state"]["top"][1]["held"], 0, "{}", gone["state"]["top"][1]);
}

#[tokio::test]
async fn a_queue_summary_says_depth_claims_and_dead_letters() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    for n in 0..3 {
        let put = gate.post("/v1/queues/jobs/items", Some(json!({ "n": n }))).await;
        assert_eq!(put.status, StatusCode::CREATED, "{put:?}");
    }
    let put = gate.post("/v1/queues/quiet/items", Some(json!({}))).await;
    assert_eq!(put.status, StatusCode::CREATED, "{put:?}");
    let mut stream = Sse::open(
        &gate.http,
        &format!("{}/v1/events?topic=summary:queues", gate.url),
        None,
    )
    .await;
    let state = stream.next().await;
    assert_eq!(state["state"]["measure"], "depth");
    assert_eq!(top(&state["state"]), [("jobs".into(), 3), ("quiet".into(), 1)]);

    let taken = gate.post("/v1/queues/jobs/take?wait=0&ack_deadline=60s", None).await;
    assert_eq!(taken.status, StatusCode::OK, "{taken:?}");
    let mut seen = vec![state];
    let claimed = stream
        .until("summary:queues", &mut seen, |e| e["state"]["top"][0]["in_flight"] == 1)
        .await;
    let row = &claimed["state"]["top"][0];
    assert_eq!((row["name"].as_str(), row["value"].as_u64()), (Some("jobs"), Some(2)));
    assert_eq!(row["dead_letters"], 0);
    assert_eq!(claimed["state"]["total"], 3);
}

#[tokio::test]
async fn a_summary_needs_read_access_to_every_name_of_its_kind() {
    let zk = zookeeper().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, [team, ops]) = auth_config(
        &dir,
        [("team", grant("team-", "write")), ("ops", "admin = true".to_string())],
    );
    let mut config = test_config(&zk.connect_string());
    config.auth_config = Some(path);
    let gate = Gate::start_with(config).await;
    let url = format!("{}/v1/events?topic=summary:locks", gate.url);
    let refused = gate.http.get(&url).bearer_auth(&team).send().await.expect("GET");
    let refused = common::Reply::read(refused).await;
    refused.assert_problem(StatusCode::FORBIDDEN, None);
    assert!(refused.str("detail").contains("every name of locks"), "{refused:?}");
    let unknown = gate
        .http
        .get(format!("{}/v1/events?topic=summary:kv", gate.url))
        .bearer_auth(&ops)
        .send()
        .await
        .expect("GET");
    let unknown = common::Reply::read(unknown).await;
    assert_eq!(unknown.status, StatusCode::BAD_REQUEST, "{unknown:?}");
    let allowed = gate.http.get(&url).bearer_auth(&ops).send().await.expect("GET");
    assert_eq!(allowed.status(), StatusCode::OK);
}
