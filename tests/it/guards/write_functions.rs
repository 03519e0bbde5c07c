//! Each write function refuses checks resolved before the release in its own transaction.

use super::*;
use crate::common;
use common::{Gate, zookeeper};
use serde_json::json;

/// The guard is checked by ZooKeeper when each write applies, not only before it: guards
/// resolved while the lock was held, then the lock released, and each guarded write sent with
/// them (as a write in flight when its holder loses the lock would be) is refused by its own
/// transaction's check, and writes nothing. Every write function that takes guards is here,
/// called as its operation calls it.
#[tokio::test]
async fn guards_resolved_before_the_release_are_refused_by_each_writes_own_transaction() {
    use zkgate::auth::Caller;
    use zkgate::recipes::condition::Condition;
    use zkgate::recipes::guards::{Guards, parse};
    use zkgate::recipes::kv::{self, Binds, Key, WriteError};
    use zkgate::recipes::usage::Payer;
    use zkgate::recipes::{counters, queues, txns};
    use zkgate::zk::Failure;

    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let recipes = &gate.running.state;
    // What the writes need first: a transaction with a registered participant, and a leader.
    let lease = gate.lease("60s").await;
    let made = gate
        .post(
            "/v1/txns",
            Some(json!({ "id": "t", "participants": ["p"], "deadline": "60s" })),
        )
        .await;
    assert_eq!(made.status, StatusCode::CREATED, "{made:?}");
    let joined = gate
        .call(
            Method::PUT,
            "/v1/txns/t/participants/p",
            Some(json!({ "lease": lease })),
        )
        .await;
    assert!(joined.status.is_success(), "{joined:?}");
    let led = gate
        .post("/v1/elections/e/campaign?wait=5s", Some(json!({ "lease": lease })))
        .await;
    assert_eq!(led.status, StatusCode::OK, "{led:?}");

    let held = gate.acquire("orders", &lease, "wait=5s").await;
    assert_eq!(held.status, StatusCode::OK, "{held:?}");
    let asked = parse(&lock_guard("orders", &held.str("handle"))).expect("a guard");
    let guards = Guards::resolve(recipes, &Caller::Anyone, &asked)
        .await
        .expect("the guard holds while the lock is held");
    gate.release("orders", &held.str("handle")).await;

    let session = recipes.zk().connected().await.expect("a session");
    let payer = Payer {
        quotas: &recipes.quotas,
        principal: None,
    };
    let key = Key::written_by(&recipes.kv_keys, "orders/state", &Caller::Anyone).guarded_by(&guards);
    let plain = Binds::Plain { rebind: false };
    let written = kv::write(&session, &key, b"\"late\"", Condition::Any, payer, plain).await;
    assert!(
        matches!(written, Err(WriteError::ZooKeeper(Failure::Unguarded))),
        "kv put: {written:?}"
    );
    let put = kv(&gate.url, Method::PUT, "orders/state", Some(json!(1)), None).await;
    assert_eq!(put.status, StatusCode::CREATED, "{put:?}");
    let deleted = kv::delete(&session, &key, Condition::Any, &recipes.quotas).await;
    assert!(
        matches!(deleted, Err(WriteError::ZooKeeper(Failure::Unguarded))),
        "kv delete: {deleted:?}"
    );

    let counter = zkgate::kind::Kind::Counter.path(&recipes.root, "c");
    let added = counters::add(&session, &counter, 1, Default::default(), (None, &guards)).await;
    assert!(
        matches!(added, Err(counters::CounterError::ZooKeeper(Failure::Unguarded))),
        "counter add: {added:?}"
    );
    let set = counters::set(&session, &counter, (5, Condition::Any), &guards).await;
    assert!(
        matches!(set, Err(counters::CounterError::ZooKeeper(Failure::Unguarded))),
        "counter set: {set:?}"
    );
    let set = counters::set(&session, &counter, (5, Condition::Any), &Guards::none()).await;
    assert!(set.is_ok(), "{set:?}");
    let removed = counters::delete(&session, &counter, Condition::Any, &guards).await;
    assert!(
        matches!(removed, Err(counters::CounterError::ZooKeeper(Failure::Unguarded))),
        "counter delete: {removed:?}"
    );

    let paths = recipes.queues.paths("q");
    let envelope = queues::Envelope {
        content_type: "text/plain".into(),
        body: b"job".to_vec(),
        put_at_ms: 0,
        deliveries: 0,
        charge: None,
    };
    let placement = queues::Placement {
        priority: None,
        due_ms: None,
    };
    let stored = queues::put(&session, &paths, placement, &envelope, (None, &guards), 100, payer).await;
    assert!(
        matches!(
            stored,
            Err(zkgate::recipes::idempotency::KeyError::ZooKeeper(Failure::Unguarded))
        ),
        "queue put: {:?}",
        stored.is_ok()
    );
    // A take's claim of an item put without a guard.
    let stored = queues::put(
        &session,
        &paths,
        placement,
        &envelope,
        (None, &Guards::none()),
        100,
        payer,
    )
    .await;
    let Ok(queues::Put::Stored(item)) = stored else {
        panic!("the put without a guard is stored")
    };
    let picks = [queues::Pick {
        item,
        claim_data: b"claim".to_vec(),
    }];
    let limits = (5, 1024 * 1024);
    let checked = guards.checked();
    let taken = queues::take_items(
        session.client(),
        &recipes.quotas,
        &paths,
        &picks,
        false,
        limits,
        &checked,
    )
    .await;
    assert!(
        matches!(taken, Err(Failure::Unguarded)),
        "queue take: {:?}",
        taken.err()
    );

    let dir = zkgate::kind::Kind::Txn.path(&recipes.root, "t");
    let vote = txns::txn::record_vote(&session, &dir, ("p", txns::txn::Vote::Commit), &guards).await;
    assert!(
        matches!(vote, Err(txns::txn::VoteError::ZooKeeper(Failure::Unguarded))),
        "vote: {vote:?}"
    );

    let election = zkgate::kind::Kind::Election.path(&recipes.root, "e");
    let candidate = led.str("node");
    let proclaimed = zkgate::recipes::elections::election::proclaim(
        &session,
        &election,
        &candidate,
        json!("late"),
        (payer, &guards),
    )
    .await;
    assert!(
        matches!(proclaimed, Err(Failure::Unguarded)),
        "proclaim: {proclaimed:?}"
    );

    use zkgate::recipes::kv::txn::{self, Step, Txn};
    let path = zkgate::kind::Kind::Kv.path(&recipes.root, "orders/txn");
    let written = Txn {
        compare: Vec::new(),
        then: vec![Step::Put {
            path: path.clone(),
            data: b"1".to_vec(),
            lease: None,
        }],
        otherwise: Vec::new(),
    };
    let (_, bound) = unbound_txn(recipes);
    let committed = txn::run(&session, &written, 1024, payer, bound, (None, &guards, &[])).await;
    assert!(
        matches!(committed, Err(txn::TxnError::ZooKeeper(Failure::Unguarded))),
        "kv transaction: {:?}",
        committed.err()
    );
    let read = kv(&gate.url, Method::GET, "orders/txn", None, None).await;
    assert_eq!(read.status, StatusCode::NOT_FOUND, "{read:?}");

    // A node holding's node, made by its lease's task.
    let kept = recipes.leases.get(&Caller::Anyone, &lease).expect("the lease");
    let member = recipes.groups.node("g", "m");
    let data = b"{}".to_vec();
    let joined = recipes
        .groups
        .hold(&kept, ("g", "m"), member, (data, None), &guards)
        .await;
    let refused = format!("{:?}", joined.as_ref().err());
    assert!(refused.contains("Unguarded"), "group join: {refused}");
    let group = gate.get("/v1/groups/g").await;
    assert!(
        group.body["members"].as_array().is_none_or(|m| m.is_empty()),
        "{group:?}"
    );

    // A persistent barrier raised, and lowered.
    let barrier = zkgate::kind::Kind::Barrier.path(&recipes.root, "b");
    let raised = zkgate::recipes::barriers::barrier::raise(&session, &barrier, &guards).await;
    assert!(matches!(raised, Err(Failure::Unguarded)), "barrier raise: {raised:?}");
    let up = gate.call(Method::PUT, "/v1/barriers/b", Some(json!({}))).await;
    assert!(up.status.is_success(), "{up:?}");
    let lowered = zkgate::recipes::barriers::barrier::lower(&session, &barrier, &guards).await;
    assert!(matches!(lowered, Err(Failure::Unguarded)), "barrier lower: {lowered:?}");
    let still = gate.get("/v1/barriers/b").await;
    assert_eq!(still.body["up"], true, "{still:?}");

    // Nothing of those was written.
    let read = kv(&gate.url, Method::GET, "orders/state", None, None).await;
    assert_eq!(read.body, json!(1), "{read:?}");
    let counter = gate.get("/v1/counters/c").await;
    assert_eq!(counter.body["value"], 5, "{counter:?}");
    let queue = gate.get("/v1/queues/q").await;
    assert_eq!(
        queue.body["depth"], 1,
        "the one item put without a guard, not taken: {queue:?}"
    );
    assert_eq!(queue.body["in_flight"], 0, "{queue:?}");
    let txn = gate.get("/v1/txns/t").await;
    assert!(txn.body["votes"].as_object().is_none_or(|v| v.is_empty()), "{txn:?}");
    let election = gate.get("/v1/elections/e").await;
    assert!(election.body["leader"]["value"].is_null(), "{election:?}");
}
