//! A 3-server ZooKeeper ensemble on loopback: two zkgate instances keep a lock exclusive
//! between them, and keep serving when a follower dies.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{Ensemble, Gate, wait_children, within};
use reqwest::StatusCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_an_ensemble_share_a_lock_and_survive_a_follower_loss() {
    let mut ensemble = Ensemble::start(3).await;
    let connect = ensemble.connect_string();
    let one = Arc::new(Gate::start(&connect).await);
    let two = Arc::new(Gate::start(&connect).await);

    let lease_one = one.lease("60s").await;
    let lease_two = two.lease("60s").await;
    let held = one.acquire("shared", &lease_one, "wait=0").await;
    assert_eq!(held.status, StatusCode::OK, "{held:?}");
    two.acquire("shared", &lease_two, "wait=0")
        .await
        .assert_problem(StatusCode::CONFLICT, None);

    // The waiter on the other instance is woken by the release.
    let waiter = {
        let (two, lease_two) = (two.clone(), lease_two.clone());
        tokio::spawn(async move { two.acquire("shared", &lease_two, "wait=30s").await })
    };
    wait_children(&connect, "/zkgate/locks/shared", 2).await;
    one.release("shared", &held.str("handle")).await;
    let granted = within(Duration::from_secs(30), "the grant on the other instance", waiter)
        .await
        .expect("waiter");
    assert_eq!(granted.status, StatusCode::OK, "{granted:?}");
    assert!(granted.i64("fencing_token") > held.i64("fencing_token"));

    // A follower dies: its clients move to the other members on the same sessions, the
    // quorum of two serves on, and the held lock stays held.
    let leader = ensemble.leader().await.expect("the ensemble has a leader");
    let follower = (0..3).find(|&i| i != leader).expect("a follower");
    ensemble.servers[follower].kill();
    one.wait_generation(1).await;
    two.wait_generation(1).await;
    one.acquire("shared", &lease_one, "wait=0")
        .await
        .assert_problem(StatusCode::CONFLICT, None);
    two.release("shared", &granted.str("handle")).await;
    let again = one.acquire("shared", &lease_one, "wait=5s").await;
    assert_eq!(again.status, StatusCode::OK, "{again:?}");
    assert!(again.i64("fencing_token") > granted.i64("fencing_token"));
}
