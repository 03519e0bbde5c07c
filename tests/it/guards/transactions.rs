//! A transaction's compares of a hold (`held`, `leads`), and their pin at the commit.

use super::*;
use crate::common;
use common::{Gate, zookeeper};
use serde_json::{Value, json};

/// A transaction that writes `state` to `orders/state` if `compare` holds, else reads it.
fn write_if(compare: Value, state: &str) -> Value {
    json!({
        "compare": [{"key": "orders/state", "exists": true}, compare],
        "then": [{"put": "orders/state", "text": state}],
        "else": [{"get": "orders/state"}],
    })
}

/// A transaction chooses its branch by a hold (`held`) or a leadership (`leads`), through
/// either instance: the holder's branch writes; a waiter's, a released handle's and a resigned
/// candidate's read; once the waiter is granted, its branch writes.
#[tokio::test]
async fn a_transaction_chooses_its_branch_by_a_hold_or_a_leadership() {
    let zk = zookeeper().await;
    let (a, b) = (
        Gate::start(&zk.connect_string()).await,
        Gate::start(&zk.connect_string()).await,
    );
    let put = kv(&a.url, Method::PUT, "orders/state", Some(json!("new")), None).await;
    assert_eq!(put.status, StatusCode::CREATED, "{put:?}");
    let (first, second) = (a.lease("60s").await, a.lease("60s").await);
    let holder = a.acquire("orders", &first, "wait=5s").await.str("handle");
    let waiter = a.acquire("orders", &second, "wait=0&keep_queued=true").await;
    assert_eq!(waiter.status, StatusCode::ACCEPTED, "{waiter:?}");
    let waiter = waiter.str("handle");
    let held = |handle: &str| json!({"held": {"lock": "orders", "handle": handle}});

    // The holder, through A (from memory) and through B (from ZooKeeper).
    for (gate, state) in [(&a, "paid"), (&b, "packed")] {
        let done = txn(&gate.url, write_if(held(&holder), state)).await;
        assert_eq!(done.status, StatusCode::OK, "{done:?}");
        assert_eq!(done.body["succeeded"], true, "{done:?}");
        assert_eq!(done.body["results"][0]["put"], "orders/state", "{done:?}");
    }
    // The waiter does not hold: the other branch, saying which compare failed.
    for gate in [&a, &b] {
        let done = txn(&gate.url, write_if(held(&waiter), "early")).await;
        assert_eq!(done.body["succeeded"], false, "{done:?}");
        assert_eq!(
            done.body["failed_compare"],
            json!({"index": 1, "guard": "lock/orders"}),
            "{done:?}"
        );
        assert_eq!(done.body["results"][0]["text"], "packed", "{done:?}");
    }
    // Released: the old holder's branch no longer writes, and the waiter's does once granted.
    a.release("orders", &holder).await;
    let granted = a.get(&format!("/v1/locks/orders/handles/{waiter}?wait=10s")).await;
    assert_eq!(granted.body["state"], "held", "{granted:?}");
    let late = txn(&b.url, write_if(held(&holder), "late")).await;
    assert_eq!(late.body["succeeded"], false, "{late:?}");
    for (gate, state) in [(&b, "shipped"), (&a, "delivered")] {
        let done = txn(&gate.url, write_if(held(&waiter), state)).await;
        assert_eq!(done.body["succeeded"], true, "{done:?}");
    }
    let read = kv(&a.url, Method::GET, "orders/state", None, None).await;
    assert_eq!(read.body, json!("delivered"), "{read:?}");

    // A leader's branch, until it resigns.
    let led = a
        .post("/v1/elections/jobs/campaign?wait=5s", Some(json!({ "lease": first })))
        .await;
    let candidate = led.str("handle");
    let leads = json!({"leads": {"election": "jobs", "handle": candidate}});
    let done = txn(&b.url, write_if(leads.clone(), "led")).await;
    assert_eq!(done.body["succeeded"], true, "{done:?}");
    let resigned = a.delete(&format!("/v1/elections/jobs/candidates/{candidate}")).await;
    assert_eq!(resigned.status, StatusCode::NO_CONTENT, "{resigned:?}");
    let done = txn(&b.url, write_if(leads, "resigned")).await;
    assert_eq!(done.body["succeeded"], false, "{done:?}");
    assert_eq!(done.body["failed_compare"]["guard"], "election/jobs", "{done:?}");

    // A compare says what it compares, once.
    for (compare, says) in [
        (
            json!({"held": {"lock": "orders", "rwlock": "orders", "handle": waiter}}),
            "exactly one of",
        ),
        (
            json!({"key": "orders/state", "exists": true, "held": {"lock": "orders", "handle": waiter}}),
            "exactly one of",
        ),
        (json!({"held": {"lock": "orders", "handle": "nope"}}), "is not a handle"),
        (json!({"leads": {"election": "", "handle": waiter}}), "name"),
    ] {
        let refused = txn(&a.url, write_if(compare, "bad")).await;
        refused.assert_problem(StatusCode::BAD_REQUEST, Some("compare"));
        assert!(refused.str("detail").contains(says), "{says}: {refused:?}");
    }
    let read = kv(&a.url, Method::GET, "orders/state", None, None).await;
    assert_eq!(read.body, json!("led"), "{read:?}");

    // As many compares of holds as a write may carry guards (each is resolved before each
    // attempt): one more is refused before anything is read.
    let compares = |n: usize| vec![json!({"held": {"lock": "orders", "handle": waiter}}); n];
    let most = txn(
        &a.url,
        json!({"compare": compares(8), "then": [{"get": "orders/state"}]}),
    )
    .await;
    assert_eq!(most.status, StatusCode::OK, "{most:?}");
    let refused = txn(
        &a.url,
        json!({"compare": compares(9), "then": [{"get": "orders/state"}]}),
    )
    .await;
    refused.assert_problem(StatusCode::BAD_REQUEST, Some("compare"));
    assert!(refused.str("detail").contains("at most 8"), "{refused:?}");
}

/// A compare of a hold stands at the commit, not only when it was resolved: a transaction run
/// with a holder's standing resolved before its release, or a waiter's resolved before its
/// grant, is refused by its own multi-op (and run again by its operation, which resolves
/// anew). Fails without [zkgate::recipes::guards::Standing::pin].
#[tokio::test]
async fn a_compare_of_a_hold_is_pinned_to_the_commit() {
    use zkgate::auth::Caller;
    use zkgate::recipes::guards::{Guard, Guards, standing};
    use zkgate::recipes::kv::txn::{self, Check, Step, Txn, TxnError};

    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let recipes = &gate.running.state;
    let (first, second) = (gate.lease("60s").await, gate.lease("60s").await);
    let holder = gate.acquire("orders", &first, "wait=5s").await.str("handle");
    let waiter = gate
        .acquire("orders", &second, "wait=0&keep_queued=true")
        .await
        .str("handle");
    let guard = |handle: &str| Guard::new(zkgate::kind::Kind::Lock, "orders", handle).expect("a guard");
    let (holds, waits) = (guard(&holder), guard(&waiter));
    let held_then = standing(recipes, &Caller::Anyone, &holds, false)
        .await
        .expect("resolved");
    let waited_then = standing(recipes, &Caller::Anyone, &waits, true)
        .await
        .expect("resolved");
    assert!(held_then.holds() && !waited_then.holds());

    gate.release("orders", &holder).await;
    let granted = gate.get(&format!("/v1/locks/orders/handles/{waiter}?wait=10s")).await;
    assert_eq!(granted.body["state"], "held", "{granted:?}");

    let session = recipes.zk().connected().await.expect("a session");
    let (payer, bound) = unbound_txn(recipes);
    let path = zkgate::kind::Kind::Kv.path(&recipes.root, "orders/state");
    for (guard, stale) in [(holds, held_then), (waits, waited_then)] {
        let written = Txn {
            compare: vec![Check::Holds(guard.clone())],
            then: vec![Step::Put {
                path: path.clone(),
                data: b"\"then\"".to_vec(),
                lease: None,
            }],
            otherwise: vec![Step::Put {
                path: path.clone(),
                data: b"\"else\"".to_vec(),
                lease: None,
            }],
        };
        let run = txn::run(
            &session,
            &written,
            1024,
            payer,
            bound,
            (None, &Guards::none(), &[(0, stale)]),
        )
        .await;
        assert!(
            matches!(run, Err(TxnError::HeldChanged)),
            "{guard}: {:?}",
            run.map(|outcome| outcome.failed_compare)
        );
    }
    let read = kv(&gate.url, Method::GET, "orders/state", None, None).await;
    assert_eq!(
        read.status,
        StatusCode::NOT_FOUND,
        "neither stale branch wrote: {read:?}"
    );
}
