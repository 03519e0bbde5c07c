//! Double barriers over HTTP: nobody passes enter before the last participant arrives, nobody
//! passes leave before all have left, and a participant whose lease dies inside blocks no one.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{Gate, wait_children, within, zookeeper};
use reqwest::StatusCode;
use serde_json::json;

async fn step(gate: &Gate, action: &str, body: serde_json::Value) -> common::Reply {
    gate.post(&format!("/v1/double-barriers/batch/{action}?wait=30s"), Some(body))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_enter_together_and_leave_together() {
    let zk = zookeeper().await;
    let connect = zk.connect_string();
    let gate = Arc::new(Gate::start(&connect).await);
    let leases: Vec<String> = {
        let mut leases = Vec::new();
        for _ in 0..5 {
            leases.push(gate.lease("60s").await);
        }
        leases
    };

    // Four enter and wait; none passes until the fifth is in.
    let fifth_in = Arc::new(AtomicBool::new(false));
    let entering: Vec<_> = (0..4)
        .map(|i| {
            let (gate, lease, fifth_in) = (gate.clone(), leases[i].clone(), fifth_in.clone());
            tokio::spawn(async move {
                let reply = step(
                    &gate,
                    "enter",
                    json!({"participant": format!("p{i}"), "size": 5, "lease": lease}),
                )
                .await;
                (reply, fifth_in.load(Ordering::SeqCst))
            })
        })
        .collect();
    wait_children(&connect, "/zkgate/double-barriers/batch", 4).await;
    let state = gate.get("/v1/double-barriers/batch").await;
    assert_eq!(
        (state.body["ready"].as_bool(), state.body["size"].as_u64()),
        (Some(false), Some(5)),
        "{state:?}"
    );
    fifth_in.store(true, Ordering::SeqCst);
    let fifth = step(
        &gate,
        "enter",
        json!({"participant": "p4", "size": 5, "lease": leases[4]}),
    )
    .await;
    assert_eq!(fifth.status, StatusCode::OK, "{fifth:?}");
    for task in entering {
        let (reply, after_fifth) = within(Duration::from_secs(20), "entering", task).await.expect("enter");
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        assert!(after_fifth, "a participant entered before the fifth arrived");
    }

    // Four leave and wait; none passes until the fifth has left.
    let fifth_out = Arc::new(AtomicBool::new(false));
    let leaving: Vec<_> = (0..4)
        .map(|i| {
            let (gate, fifth_out) = (gate.clone(), fifth_out.clone());
            tokio::spawn(async move {
                let reply = step(&gate, "leave", json!({"participant": format!("p{i}")})).await;
                (reply, fifth_out.load(Ordering::SeqCst))
            })
        })
        .collect();
    // The lowest (p0) stays until the end; p1..p3 remove themselves at once.
    let client = common::zk_client(&connect).await;
    within(Duration::from_secs(20), "p1..p3 to leave", async {
        loop {
            let (children, watcher) = client
                .list_and_watch_children("/zkgate/double-barriers/batch")
                .await
                .expect("list");
            if !children.iter().any(|c| ["p1", "p2", "p3"].contains(&c.as_str())) {
                return;
            }
            watcher.changed().await;
        }
    })
    .await;
    fifth_out.store(true, Ordering::SeqCst);
    let last = step(&gate, "leave", json!({"participant": "p4"})).await;
    assert_eq!(last.status, StatusCode::OK, "{last:?}");
    for task in leaving {
        let (reply, after_fifth) = within(Duration::from_secs(20), "leaving", task).await.expect("leave");
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        assert!(after_fifth, "a participant left before the fifth did");
    }
    let state = gate.get("/v1/double-barriers/batch").await;
    assert_eq!(
        (state.body["ready"].as_bool(), state.body["participants"].clone()),
        (Some(false), json!([])),
        "{state:?}"
    );
}

#[tokio::test]
async fn a_participant_whose_lease_dies_inside_blocks_nobody() {
    let zk = zookeeper().await;
    let connect = zk.connect_string();
    let gate = Arc::new(Gate::start(&connect).await);
    let (a, b) = (gate.lease("60s").await, gate.lease("60s").await);
    let entering: Vec<_> = [("a", a.clone()), ("b", b.clone())]
        .into_iter()
        .map(|(id, lease)| {
            let gate = gate.clone();
            tokio::spawn(
                async move { step(&gate, "enter", json!({"participant": id, "size": 3, "lease": lease})).await },
            )
        })
        .collect();
    wait_children(&connect, "/zkgate/double-barriers/batch", 2).await;
    // The third enters with a one-second lease that nobody keeps alive.
    let doomed = step(&gate, "enter", json!({"participant": "c", "size": 3, "ttl": "1s"})).await;
    assert_eq!(doomed.status, StatusCode::OK, "{doomed:?}");
    for task in entering {
        assert_eq!(
            within(Duration::from_secs(20), "entering", task)
                .await
                .expect("enter")
                .status,
            StatusCode::OK
        );
    }
    // a and b leave; c never does, but its lease ends and its node goes with it.
    let (left_a, left_b) = tokio::join!(
        step(&gate, "leave", json!({"participant": "a"})),
        step(&gate, "leave", json!({"participant": "b"}))
    );
    assert_eq!(
        (left_a.status, left_b.status),
        (StatusCode::OK, StatusCode::OK),
        "{left_a:?} {left_b:?}"
    );
    let gone = gate
        .get(&format!(
            "/v1/leases/{}",
            doomed.body["lease"]["id"].as_str().expect("lease")
        ))
        .await;
    assert_eq!(gone.body["reason"], "expired");
}
