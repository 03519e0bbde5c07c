//! Lock sets (`/v1/lock-sets`) against a real ZooKeeper: all or none (a refused set holds
//! nothing when the answer comes), the same znodes as single locks (each excludes the other),
//! a set that waits its turn, release of the whole set, forwarding between instances, grants
//! checked per lock, and many clients taking random overlapping sets in random orders with no
//! deadlock and no two holders of a lock at once (checked by an unfenced register per lock).

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::checker::FencedRegister;
use common::{ADMIN, Gate, Reply, auth_config, grant, test_config, wait_children, within, zookeeper};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

async fn take_set(gate: &Gate, locks: &[&str], body: Value, wait: &str) -> Reply {
    let mut body = body;
    body["locks"] = json!(locks);
    gate.post(&format!("/v1/lock-sets?wait={wait}"), Some(body)).await
}

/// The fencing token of the holder of lock `name`, if held.
async fn holder_token(gate: &Gate, name: &str) -> Option<i64> {
    gate.get(&format!("/v1/locks/{name}")).await.body["holder"]["fencing_token"].as_i64()
}

#[tokio::test]
async fn a_set_is_all_or_none_and_excludes_single_lock_holders() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let other = gate.lease("60s").await;
    let single = gate.acquire("b", &other, "wait=0").await;
    assert_eq!(single.status, StatusCode::OK, "{single:?}");

    // `b` is held: the set [c, b, a] is refused, naming `b`, and holds nothing afterwards
    // (it took `a` before it came to `b`).
    let lease = gate.lease("60s").await;
    let refused = take_set(&gate, &["c", "b", "a"], json!({"lease": lease}), "0").await;
    refused.assert_problem(StatusCode::CONFLICT, None);
    assert_eq!(refused.body["type"], "urn:zkgate:problem:lock-not-acquired");
    assert_eq!(refused.body["lock"], "b", "{refused:?}");
    assert_eq!(holder_token(&gate, "a").await, None, "`a` was given back");
    assert_eq!(holder_token(&gate, "c").await, None, "`c` was never taken");
    let lease_view = gate.get(&format!("/v1/leases/{lease}")).await;
    assert_eq!(lease_view.body["holdings"], json!([]), "{lease_view:?}");

    // Released, the set is granted: every lock, in name order, each with its own token.
    gate.release("b", &single.str("handle")).await;
    let set = take_set(&gate, &["c", "b", "a"], json!({"lease": lease}), "5s").await;
    assert_eq!(set.status, StatusCode::OK, "{set:?}");
    let locks = set.body["locks"].as_array().expect("locks");
    let names: Vec<&str> = locks.iter().map(|l| l["lock"].as_str().unwrap()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    for lock in locks {
        let name = lock["lock"].as_str().unwrap();
        assert_eq!(
            holder_token(&gate, name).await,
            lock["fencing_token"].as_i64(),
            "{lock}"
        );
        // Each is an ordinary handle of its lock.
        let handle = gate
            .get(&format!(
                "/v1/locks/{name}/handles/{}",
                lock["handle"].as_str().unwrap()
            ))
            .await;
        assert_eq!(handle.body["state"], "held", "{handle:?}");
    }
    // A single acquire of one of them waits in vain.
    gate.acquire("b", &other, "wait=0")
        .await
        .assert_problem(StatusCode::CONFLICT, None);
    let id = set.str("set");
    let read = gate.get(&format!("/v1/lock-sets/{id}")).await;
    assert_eq!(read.body["state"], "held", "{read:?}");
    assert_eq!(read.body["locks"].as_array().map(Vec::len), Some(3));

    // Released as one: every lock is free before the answer.
    assert_eq!(
        gate.delete(&format!("/v1/lock-sets/{id}")).await.status,
        StatusCode::NO_CONTENT
    );
    for name in ["a", "b", "c"] {
        assert_eq!(holder_token(&gate, name).await, None, "{name}");
    }
    gate.delete(&format!("/v1/lock-sets/{id}"))
        .await
        .assert_problem(StatusCode::NOT_FOUND, None);
}

#[tokio::test]
async fn a_lock_the_lease_held_before_stays_held_when_its_set_is_refused() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let (mine, theirs) = (gate.lease("60s").await, gate.lease("60s").await);
    let kept = gate.acquire("x", &mine, "wait=0").await;
    assert_eq!(gate.acquire("y", &theirs, "wait=0").await.status, StatusCode::OK);
    take_set(&gate, &["x", "y"], json!({"lease": mine}), "0")
        .await
        .assert_problem(StatusCode::CONFLICT, None);
    assert_eq!(holder_token(&gate, "x").await, kept.body["fencing_token"].as_i64());
    // Without a lease, the set's own lease goes with a refused set.
    let refused = take_set(&gate, &["y", "z"], json!({"ttl": "30s"}), "0").await;
    refused.assert_problem(StatusCode::CONFLICT, None);
    let leases = gate.get("/v1/leases").await;
    assert_eq!(leases.body.as_array().map(Vec::len), Some(2), "{leases:?}");
}

#[tokio::test]
async fn a_set_waits_its_turn_and_is_granted_when_the_last_lock_frees() {
    let zk = zookeeper().await;
    let connect = zk.connect_string();
    let gate = Arc::new(Gate::start(&connect).await);
    let other = gate.lease("60s").await;
    let held = gate.acquire("q2", &other, "wait=0").await;
    let waiting = {
        let gate = gate.clone();
        tokio::spawn(async move { take_set(&gate, &["q2", "q1"], json!({"ttl": "30s"}), "30s").await })
    };
    // It holds q1 and waits in q2's queue.
    wait_children(&connect, "/zkgate/locks/q2", 2).await;
    assert!(holder_token(&gate, "q1").await.is_some());
    gate.release("q2", &held.str("handle")).await;
    let set = within(Duration::from_secs(30), "the set's grant", waiting)
        .await
        .expect("task");
    assert_eq!(set.status, StatusCode::OK, "{set:?}");
}

#[tokio::test]
async fn a_set_is_taken_where_it_is_asked_and_read_and_released_through_another() {
    let zk = zookeeper().await;
    let a = Gate::start(&zk.connect_string()).await;
    let b = Gate::start(&zk.connect_string()).await;
    let lease = a.lease("60s").await;
    let set = take_set(&b, &["f1", "f2"], json!({"lease": lease}), "5s").await;
    assert_eq!(set.status, StatusCode::OK, "{set:?}");
    assert!(
        set.str("set").starts_with(&*b.running.state.instance.id),
        "issued by the instance that served it"
    );
    assert_eq!(
        a.get(&format!("/v1/lock-sets/{}", set.str("set"))).await.body["state"],
        "held"
    );
    assert_eq!(
        a.delete(&format!("/v1/lock-sets/{}", set.str("set"))).await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(holder_token(&a, "f1").await, None);
}

#[tokio::test]
async fn every_lock_of_a_set_must_be_granted_to_the_caller() {
    let zk = zookeeper().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let (path, [admin, billing, intern]) = auth_config(
        &dir,
        [
            ("ops", ADMIN.into()),
            ("billing", grant("billing-", "write")),
            ("intern", grant("billing-", "write")),
        ],
    );
    let mut config = test_config(&zk.connect_string());
    config.auth_config = Some(path);
    let gate = Gate::start_with(config).await;
    let body = json!({"locks": ["billing-a", "orders"], "ttl": "30s"});
    let refused = gate
        .call_as(Some(&billing), Method::POST, "/v1/lock-sets?wait=0", Some(body.clone()))
        .await;
    refused.assert_problem(StatusCode::FORBIDDEN, None);
    let state = gate
        .call_as(Some(&admin), Method::GET, "/v1/locks/billing-a", None)
        .await;
    assert_eq!(state.body["holder"], Value::Null, "nothing taken: {state:?}");
    let granted = gate
        .call_as(
            Some(&billing),
            Method::POST,
            "/v1/lock-sets?wait=0",
            Some(json!({"locks": ["billing-a", "billing-b"], "ttl": "30s"})),
        )
        .await;
    assert_eq!(granted.status, StatusCode::OK, "{granted:?}");
    // Another principal cannot read or release it; an admin can.
    let set = format!("/v1/lock-sets/{}", granted.str("set"));
    for method in [Method::GET, Method::DELETE] {
        gate.call_as(Some(&intern), method, &set, None)
            .await
            .assert_problem(StatusCode::FORBIDDEN, None);
    }
    let released = gate.call_as(Some(&admin), Method::DELETE, &set, None).await;
    assert_eq!(released.status, StatusCode::NO_CONTENT, "{released:?}");
}

/// A small deterministic generator (no dependency for a test's dice).
struct Dice(u64);

impl Dice {
    fn next(&mut self, below: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % below as u64) as usize
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_overlapping_sets_in_random_orders_never_deadlock_or_overlap() {
    let zk = zookeeper().await;
    let gates = Arc::new([
        Gate::start(&zk.connect_string()).await,
        Gate::start(&zk.connect_string()).await,
    ]);
    const LOCKS: [&str; 5] = ["r0", "r1", "r2", "r3", "r4"];
    const CLIENTS: usize = 8;
    const CYCLES: usize = 8;
    // Unfenced: a second holder of a lock at once would lose an update and fail the check.
    let registers: Arc<Vec<FencedRegister>> = Arc::new(LOCKS.iter().map(|_| FencedRegister::new(false)).collect());
    let workers: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let (gates, registers) = (gates.clone(), registers.clone());
            tokio::spawn(async move {
                let mut dice = Dice(client as u64 + 1);
                let gate = &gates[client % 2];
                let lease = gate.lease("60s").await;
                let mut taken = vec![0usize; LOCKS.len()];
                for cycle in 0..CYCLES {
                    // Two or three locks, listed in a random order.
                    let mut picked: Vec<usize> = (0..LOCKS.len()).collect();
                    for i in (1..picked.len()).rev() {
                        picked.swap(i, dice.next(i + 1));
                    }
                    picked.truncate(2 + dice.next(2));
                    let names: Vec<&str> = picked.iter().map(|&i| LOCKS[i]).collect();
                    let set = take_set(gate, &names, json!({"lease": lease}), "30s").await;
                    assert_eq!(
                        set.status,
                        StatusCode::OK,
                        "client {client} cycle {cycle} {names:?}: {set:?}"
                    );
                    let token = set.body["locks"][0]["fencing_token"].as_i64().expect("token");
                    let reads: Vec<u64> = picked.iter().map(|&i| registers[i].read()).collect();
                    tokio::task::yield_now().await;
                    for (&i, read) in picked.iter().zip(reads) {
                        registers[i].write(&format!("client {client}"), token, read);
                        taken[i] += 1;
                    }
                    let released = gate.delete(&format!("/v1/lock-sets/{}", set.str("set"))).await;
                    assert_eq!(released.status, StatusCode::NO_CONTENT, "{released:?}");
                }
                taken
            })
        })
        .collect();
    let mut taken = vec![0usize; LOCKS.len()];
    for worker in workers {
        let counts = within(Duration::from_secs(240), "the clients' sets", worker)
            .await
            .expect("worker");
        for (total, count) in taken.iter_mut().zip(counts) {
            *total += count;
        }
    }
    for (i, register) in registers.iter().enumerate() {
        let tally = register.check().unwrap_or_else(|e| panic!("{}: {e}", LOCKS[i]));
        assert_eq!(tally.value as usize, taken[i], "{}", LOCKS[i]);
    }
    assert!(taken.iter().sum::<usize>() >= CLIENTS * CYCLES * 2);
}
