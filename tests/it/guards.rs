//! Writes guarded by a lock (`ZKGATE-Guard`, issue 55): a guarded write lands only while its
//! handle holds what the guard names, checked in the write's own ZooKeeper transaction; a stale
//! guard is refused (409 `guard-lost`, saying why and the holder now) and writes nothing,
//! through either instance, whichever instance drives the handle.

use crate::common;

use std::time::Duration;

use common::sse::Sse;
use common::{Gate, Reply, zookeeper};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// `method` of kv key `key` (a JSON `value` for a put) on the instance at `url`, with `guard`
/// as `ZKGATE-Guard`.
async fn kv(url: &str, method: Method, key: &str, value: Option<Value>, guard: Option<&str>) -> Reply {
    let mut request = common::http_client().request(method, format!("{url}/v1/kv/{key}"));
    if let Some(guard) = guard {
        request = request.header("ZKGATE-Guard", guard);
    }
    if let Some(value) = value {
        request = request.json(&value);
    }
    let response = request
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .expect("kv request");
    Reply::read(response).await
}

/// The guard of lock `lock`'s handle `handle`.
fn lock_guard(lock: &str, handle: &str) -> String {
    format!("lock/{lock}; handle={handle}")
}

/// Asserts a 409 `guard-lost` for `guard_target` with `reason`.
fn assert_lost(reply: &Reply, guard_target: &str, reason: &str) {
    reply.assert_problem(StatusCode::CONFLICT, None);
    assert_eq!(reply.body["type"], "urn:zkgate:problem:guard-lost", "{reply:?}");
    assert_eq!(reply.body["guard"], guard_target, "{reply:?}");
    assert_eq!(reply.body["reason"], reason, "{reply:?}");
}

#[tokio::test]
async fn a_guarded_write_lands_while_the_lock_is_held_and_not_once_it_is_released() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let lease = gate.lease("60s").await;
    let held = gate.acquire("orders", &lease, "wait=5s").await;
    assert_eq!(held.status, StatusCode::OK, "{held:?}");
    let guard = lock_guard("orders", &held.str("handle"));

    let put = kv(
        &gate.url,
        Method::PUT,
        "orders/state",
        Some(json!("paid")),
        Some(&guard),
    )
    .await;
    assert_eq!(put.status, StatusCode::CREATED, "{put:?}");

    gate.release("orders", &held.str("handle")).await;
    let late = kv(
        &gate.url,
        Method::PUT,
        "orders/state",
        Some(json!("late")),
        Some(&guard),
    )
    .await;
    assert_lost(&late, "lock/orders", "released");
    assert!(late.body["current_token"].is_null(), "nobody holds now: {late:?}");
    let gone = kv(&gate.url, Method::DELETE, "orders/state", None, Some(&guard)).await;
    assert_lost(&gone, "lock/orders", "released");
    let read = kv(&gate.url, Method::GET, "orders/state", None, None).await;
    assert_eq!(read.body, json!("paid"), "the refused writes changed nothing: {read:?}");

    // A handle that waits does not hold.
    let holder = gate.acquire("orders", &lease, "wait=5s").await;
    let other = gate.lease("60s").await;
    let waiting = gate.acquire("orders", &other, "wait=0&keep_queued=true").await;
    assert_eq!(waiting.status, StatusCode::ACCEPTED, "{waiting:?}");
    let queued = lock_guard("orders", &waiting.str("handle"));
    let early = kv(
        &gate.url,
        Method::PUT,
        "orders/state",
        Some(json!("early")),
        Some(&queued),
    )
    .await;
    assert_lost(&early, "lock/orders", "not-held");
    assert_eq!(early.body["current_token"], holder.i64("fencing_token"), "{early:?}");
    // And the holder's guarded delete lands.
    let holder_guard = lock_guard("orders", &holder.str("handle"));
    let deleted = kv(&gate.url, Method::DELETE, "orders/state", None, Some(&holder_guard)).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{deleted:?}");

    // Taken back by a revocation whose grace ran out: refused as revoked, saying by whom.
    let revoked = gate
        .post(
            "/v1/locks/orders/revoke",
            Some(json!({"by": "ops", "reason": "stuck", "grace": "100ms"})),
        )
        .await;
    assert_eq!(revoked.status, StatusCode::ACCEPTED, "{revoked:?}");
    let granted = gate
        .get(&format!("/v1/locks/orders/handles/{}?wait=10s", waiting.str("handle")))
        .await;
    assert_eq!(
        granted.body["state"], "held",
        "the waiter is granted after the grace: {granted:?}"
    );
    let late = kv(
        &gate.url,
        Method::PUT,
        "orders/state",
        Some(json!("late")),
        Some(&holder_guard),
    )
    .await;
    assert_lost(&late, "lock/orders", "revoked");
    assert!(late.str("detail").contains("`ops` (stuck)"), "{late:?}");
    assert_eq!(late.body["current_token"], granted.body["fencing_token"], "{late:?}");
}

#[tokio::test]
async fn a_stale_guard_is_refused_after_its_lease_expires_and_another_takes_the_lock_through_the_other_instance() {
    let zk = zookeeper().await;
    let (a, b) = (
        Gate::start(&zk.connect_string()).await,
        Gate::start(&zk.connect_string()).await,
    );
    // The first holder, through A, stops sending keepalives.
    let first_lease = a.lease("1s").await;
    let first = a.acquire("orders", &first_lease, "wait=5s").await;
    assert_eq!(first.status, StatusCode::OK, "{first:?}");
    let stale = lock_guard("orders", &first.str("handle"));
    let put = kv(&a.url, Method::PUT, "orders/state", Some(json!("first")), Some(&stale)).await;
    assert_eq!(put.status, StatusCode::CREATED, "{put:?}");

    // The second takes the lock through B once the first's lease has expired.
    let second_lease = b.lease("60s").await;
    let second = b.acquire("orders", &second_lease, "wait=30s").await;
    assert_eq!(second.status, StatusCode::OK, "{second:?}");
    let token = second.i64("fencing_token");
    let fresh = lock_guard("orders", &second.str("handle"));

    // The first writes with its old guard, through either instance: refused, naming the holder.
    // A drove the handle and knows its lease ended; B finds no node.
    for (gate, reason) in [(&a, "lease-ended"), (&b, "released")] {
        let late = kv(
            &gate.url,
            Method::PUT,
            "orders/state",
            Some(json!("stale")),
            Some(&stale),
        )
        .await;
        assert_lost(&late, "lock/orders", reason);
        assert_eq!(late.body["current_token"], token, "{late:?}");
    }
    // The second's guard holds through A too, which does not drive its handle.
    let put = kv(&a.url, Method::PUT, "orders/state", Some(json!("second")), Some(&fresh)).await;
    assert_eq!(put.status, StatusCode::OK, "{put:?}");
    let read = kv(&b.url, Method::GET, "orders/state", None, None).await;
    assert_eq!(read.body, json!("second"), "{read:?}");
    // Both instances run in this test's process, with one registry: the two refusals.
    let refused = common::metric(&a.url, "zkgate_guard_refusals_total{kind=\"lock\"}").await;
    assert_eq!(refused, 2.0, "the refusals are counted");
}

#[tokio::test]
async fn during_a_lock_delay_the_guard_of_the_ended_lease_is_refused() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let mut events = Sse::open(&gate.http, &format!("{}/v1/locks/delayed/events", gate.url), None).await;
    let mut seen = vec![events.next().await];
    let made = gate
        .post("/v1/leases", Some(json!({ "ttl": "1s", "lock_delay": "60s" })))
        .await;
    assert_eq!(made.status, StatusCode::CREATED, "{made:?}");
    let held = gate.acquire("delayed", &made.str("id"), "wait=5s").await;
    assert_eq!(held.status, StatusCode::OK, "{held:?}");
    let guard = lock_guard("delayed", &held.str("handle"));
    // No keepalive: the lease expires, and its node is kept through the delay.
    events
        .until("lock:delayed", &mut seen, |e| e["type"] == "held-by-ended-lease")
        .await;
    let late = kv(&gate.url, Method::PUT, "delayed/state", Some(json!(1)), Some(&guard)).await;
    assert_lost(&late, "lock/delayed", "lease-ended");
    let read = kv(&gate.url, Method::GET, "delayed/state", None, None).await;
    assert_eq!(read.status, StatusCode::NOT_FOUND, "nothing was written: {read:?}");
}

#[tokio::test]
async fn a_leaders_guarded_write_lands_until_it_resigns() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let lease = gate.lease("60s").await;
    let led = gate
        .post("/v1/elections/jobs/campaign?wait=5s", Some(json!({ "lease": lease })))
        .await;
    assert_eq!(led.status, StatusCode::OK, "{led:?}");
    let handle = led.str("handle");
    let guard = format!("election/jobs; handle={handle}");
    let put = kv(
        &gate.url,
        Method::PUT,
        "jobs/config",
        Some(json!({"v": 1})),
        Some(&guard),
    )
    .await;
    assert_eq!(put.status, StatusCode::CREATED, "{put:?}");
    let resigned = gate.delete(&format!("/v1/elections/jobs/candidates/{handle}")).await;
    assert_eq!(resigned.status, StatusCode::NO_CONTENT, "{resigned:?}");
    let late = kv(
        &gate.url,
        Method::PUT,
        "jobs/config",
        Some(json!({"v": 2})),
        Some(&guard),
    )
    .await;
    assert_lost(&late, "election/jobs", "released");
}

#[tokio::test]
async fn a_bad_guard_is_refused_naming_the_header_and_writes_nothing() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let lease = gate.lease("60s").await;
    let held = gate.acquire("orders", &lease, "wait=5s").await;
    let handle = held.str("handle");
    for guard in [
        "lock/orders".to_string(),
        format!("queue/jobs; handle={handle}"),
        "lock/orders; handle=not-a-handle".to_string(),
        vec![lock_guard("orders", &handle); 9].join(", "),
    ] {
        let put = kv(&gate.url, Method::PUT, "orders/state", Some(json!(1)), Some(&guard)).await;
        put.assert_problem(StatusCode::BAD_REQUEST, Some("ZKGATE-Guard"));
    }
    // A guard with a handle that never existed at that lock.
    let unknown = lock_guard("elsewhere", &handle);
    let put = kv(&gate.url, Method::PUT, "orders/state", Some(json!(1)), Some(&unknown)).await;
    assert_lost(&put, "lock/elsewhere", "released");
    let read = kv(&gate.url, Method::GET, "orders/state", None, None).await;
    assert_eq!(read.status, StatusCode::NOT_FOUND, "nothing was written: {read:?}");
}

/// The classic failure, on real processes: the holder's instance freezes (SIGSTOP) past its
/// lease's TTL; the other instance takes the lease over and ends it, and a rival takes the
/// lock there and writes. The frozen instance resumes still believing its handle holds, and
/// the first holder's guarded write through it is refused by ZooKeeper's check of the write's
/// own transaction: the value is the rival's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_frozen_past_its_ttl_cannot_write_over_the_next_holder() {
    let zk = zookeeper().await;
    let frozen = common::process::Process::start(&zk.connect_string()).await;
    let other = std::sync::Arc::new(Gate::start(&zk.connect_string()).await);
    let lease = frozen.lease("2s").await;
    let (status, held) = frozen.acquire("orders", &lease, "wait=5s").await;
    assert_eq!(status, StatusCode::OK, "{held}");
    let stale = lock_guard("orders", held["handle"].as_str().expect("handle"));
    let put = kv(
        &frozen.url,
        Method::PUT,
        "orders/state",
        Some(json!("first")),
        Some(&stale),
    )
    .await;
    assert_eq!(put.status, StatusCode::CREATED, "{put:?}");

    let rival = other.lease("60s").await;
    let waiting = {
        let (other, rival) = (other.clone(), rival.clone());
        tokio::spawn(async move { other.acquire("orders", &rival, "wait=30s").await })
    };
    common::wait_children(&zk.connect_string(), "/zkgate/locks/orders", 2).await;
    frozen.pause(true);
    let granted = common::within(Duration::from_secs(30), "the rival's grant", waiting)
        .await
        .expect("task");
    assert_eq!(granted.status, StatusCode::OK, "{granted:?}");
    let fresh = lock_guard("orders", &granted.str("handle"));
    let put = kv(
        &other.url,
        Method::PUT,
        "orders/state",
        Some(json!("rival")),
        Some(&fresh),
    )
    .await;
    assert_eq!(put.status, StatusCode::OK, "{put:?}");

    frozen.pause(false);
    // Its session expired while it was frozen: it answers 503 until it has a new one.
    frozen.wait_session(2).await;
    let late = kv(
        &frozen.url,
        Method::PUT,
        "orders/state",
        Some(json!("stale")),
        Some(&stale),
    )
    .await;
    late.assert_problem(StatusCode::CONFLICT, None);
    assert_eq!(late.body["type"], "urn:zkgate:problem:guard-lost", "{late:?}");
    assert_eq!(late.body["current_token"], granted.i64("fencing_token"), "{late:?}");
    let read = kv(&other.url, Method::GET, "orders/state", None, None).await;
    assert_eq!(read.body, json!("rival"), "{read:?}");
}

/// The same with leadership, on real processes: a leader frozen (SIGSTOP) past its lease's TTL
/// is succeeded by a rival campaigning through the other instance, who writes; resumed, the
/// old leader's guarded write is refused with the new leader's term, and the value is the
/// rival's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_frozen_past_its_ttl_cannot_write_over_its_successor() {
    let zk = zookeeper().await;
    let frozen = common::process::Process::start(&zk.connect_string()).await;
    let other = std::sync::Arc::new(Gate::start(&zk.connect_string()).await);
    let lease = frozen.lease("2s").await;
    let (status, led) = frozen
        .call(
            Method::POST,
            "/v1/elections/jobs/campaign?wait=5s",
            Some(json!({ "lease": lease })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{led}");
    let stale = format!("election/jobs; handle={}", led["handle"].as_str().expect("handle"));
    let put = kv(
        &frozen.url,
        Method::PUT,
        "jobs/state",
        Some(json!("first")),
        Some(&stale),
    )
    .await;
    assert_eq!(put.status, StatusCode::CREATED, "{put:?}");

    let rival = other.lease("60s").await;
    let campaign = {
        let (other, rival) = (other.clone(), rival.clone());
        tokio::spawn(async move {
            other
                .post("/v1/elections/jobs/campaign?wait=30s", Some(json!({ "lease": rival })))
                .await
        })
    };
    common::wait_children(&zk.connect_string(), "/zkgate/elections/jobs", 2).await;
    frozen.pause(true);
    let leads = common::within(Duration::from_secs(30), "the rival's leadership", campaign)
        .await
        .expect("task");
    assert_eq!(leads.status, StatusCode::OK, "{leads:?}");
    assert_eq!(leads.body["leader"], true, "{leads:?}");
    let fresh = format!("election/jobs; handle={}", leads.str("handle"));
    let put = kv(
        &other.url,
        Method::PUT,
        "jobs/state",
        Some(json!("rival")),
        Some(&fresh),
    )
    .await;
    assert_eq!(put.status, StatusCode::OK, "{put:?}");

    frozen.pause(false);
    frozen.wait_session(2).await;
    let late = kv(
        &frozen.url,
        Method::PUT,
        "jobs/state",
        Some(json!("stale")),
        Some(&stale),
    )
    .await;
    late.assert_problem(StatusCode::CONFLICT, None);
    assert_eq!(late.body["type"], "urn:zkgate:problem:guard-lost", "{late:?}");
    assert_eq!(late.body["guard"], "election/jobs", "{late:?}");
    assert_eq!(late.body["current_token"], leads.body["term"], "{late:?}");
    let read = kv(&other.url, Method::GET, "jobs/state", None, None).await;
    assert_eq!(read.body, json!("rival"), "{read:?}");
}

/// The same with a lock-delay, on real processes: a holder whose lease has a lock-delay is
/// frozen past its TTL; the other instance ends the lease and keeps its node through the delay
/// (nobody else is granted yet). Resumed, the holder's guarded write is refused: its lease
/// ended, though its node is still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_frozen_into_its_lock_delay_cannot_write() {
    let zk = zookeeper().await;
    let frozen = common::process::Process::start(&zk.connect_string()).await;
    let other = Gate::start(&zk.connect_string()).await;
    let (status, made) = frozen
        .call(
            Method::POST,
            "/v1/leases",
            Some(json!({ "ttl": "2s", "lock_delay": "60s" })),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let lease = made["id"].as_str().expect("lease id");
    let (status, held) = frozen.acquire("delayed", lease, "wait=5s").await;
    assert_eq!(status, StatusCode::OK, "{held}");
    let stale = lock_guard("delayed", held["handle"].as_str().expect("handle"));
    let put = kv(
        &frozen.url,
        Method::PUT,
        "delayed/state",
        Some(json!("first")),
        Some(&stale),
    )
    .await;
    assert_eq!(put.status, StatusCode::CREATED, "{put:?}");

    let mut events = Sse::open(&other.http, &format!("{}/v1/locks/delayed/events", other.url), None).await;
    let mut seen = vec![events.next().await];
    frozen.pause(true);
    events
        .until("lock:delayed", &mut seen, |e| e["type"] == "held-by-ended-lease")
        .await;
    frozen.pause(false);
    frozen.wait_session(2).await;
    let late = kv(
        &frozen.url,
        Method::PUT,
        "delayed/state",
        Some(json!("stale")),
        Some(&stale),
    )
    .await;
    assert_lost(&late, "lock/delayed", "lease-ended");
    let read = kv(&other.url, Method::GET, "delayed/state", None, None).await;
    assert_eq!(read.body, json!("first"), "{read:?}");
    let state = other.get("/v1/locks/delayed").await;
    assert_eq!(
        state.body["holder"]["fencing_token"], held["fencing_token"],
        "the node is still kept through the delay: {state:?}"
    );
    assert!(
        state.body["holder"]["held_by_ended_lease_until"].is_string(),
        "{state:?}"
    );
}

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
    assert!(matches!(written, Err(WriteError::GuardRefused)), "kv put: {written:?}");
    let put = kv(&gate.url, Method::PUT, "orders/state", Some(json!(1)), None).await;
    assert_eq!(put.status, StatusCode::CREATED, "{put:?}");
    let deleted = kv::delete(&session, &key, Condition::Any, &recipes.quotas).await;
    assert!(
        matches!(deleted, Err(WriteError::GuardRefused)),
        "kv delete: {deleted:?}"
    );

    let counter = zkgate::kind::Kind::Counter.path(&recipes.root, "c");
    let added = counters::add(&session, &counter, 1, Default::default(), (None, &guards)).await;
    assert!(
        matches!(added, Err(counters::CounterError::GuardRefused)),
        "counter add: {added:?}"
    );
    let set = counters::set(&session, &counter, (5, Condition::Any), &guards).await;
    assert!(
        matches!(set, Err(counters::CounterError::GuardRefused)),
        "counter set: {set:?}"
    );
    let set = counters::set(&session, &counter, (5, Condition::Any), &Guards::none()).await;
    assert!(set.is_ok(), "{set:?}");
    let removed = counters::delete(&session, &counter, Condition::Any, &guards).await;
    assert!(
        matches!(removed, Err(counters::CounterError::GuardRefused)),
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
        matches!(stored, Ok(queues::Put::GuardRefused)),
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

    use zkgate::recipes::kv::txn::{self, Bindings, Step, Txn};
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
    let leases = std::collections::HashMap::new();
    let bound = Bindings {
        keys: &recipes.kv_keys,
        leases: &leases,
        quotas: &recipes.quotas,
        caller: &Caller::Anyone,
    };
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

/// A WebSocket `call` carries the guard as a header, and is refused as over HTTP.
#[tokio::test]
async fn a_socket_call_carries_the_guard() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let lease = gate.lease("60s").await;
    let held = gate.acquire("orders", &lease, "wait=5s").await;
    let guard = lock_guard("orders", &held.str("handle"));
    let mut ws = common::ws::Ws::connect(gate.running.addr, "/v1/ws").await;
    let call = |id: &str, value: i64| {
        json!({
            "op": "call", "id": id, "method": "PUT", "path": "/v1/kv/orders/state",
            "headers": { "ZKGATE-Guard": guard }, "body": value,
        })
    };
    ws.send(call("held", 1));
    let written = ws.next_for("held").await;
    assert_eq!(written["status"], 201, "{written}");
    gate.release("orders", &held.str("handle")).await;
    ws.send(call("released", 2));
    let refused = ws.next_for("released").await;
    assert_eq!(refused["status"], 409, "{refused}");
    assert_eq!(refused["body"]["type"], "urn:zkgate:problem:guard-lost", "{refused}");
    let read = kv(&gate.url, Method::GET, "orders/state", None, None).await;
    assert_eq!(read.body, json!(1), "{read:?}");
}

/// The instances a client of [increment] talks to: the one it prefers first, then the others
/// when one refuses the connection (as `zkgate lock --url A --url B` does).
struct Instances {
    urls: Vec<String>,
    prefer: std::sync::atomic::AtomicUsize,
    /// Requests sent again through another instance, of every client.
    failovers: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Instances {
    /// `method path` with `headers` and a JSON `body`, through the preferred instance, or the
    /// next one (preferred from then on) whenever the request fails in transport (a killed
    /// instance): only requests that are safe to send again go through here.
    async fn send(&self, method: Method, path: &str, headers: &[(&str, &str)], body: Option<Value>) -> Reply {
        let http = common::http_client();
        use std::sync::atomic::Ordering::Relaxed;
        for _ in 0..20 {
            let at = self.prefer.load(Relaxed);
            let url = &self.urls[at];
            let mut request = http.request(method.clone(), format!("{url}{path}"));
            for (name, value) in headers {
                request = request.header(*name, *value);
            }
            if let Some(body) = &body {
                request = request.json(body);
            }
            match request.timeout(Duration::from_secs(90)).send().await {
                Ok(response) => return Reply::read(response).await,
                Err(_) => {
                    self.prefer.store((at + 1) % self.urls.len(), Relaxed);
                    self.failovers.fetch_add(1, Relaxed);
                }
            }
        }
        panic!("{method} {path}: no instance answered")
    }
}

/// One increment of kv key `key` under lock `lock`: a lease of its own (`ttl`), the lock, a
/// read, the write of the value + 1 (guarded unless `guarded` is false), the lease's end. Each
/// step is one a client may send again through another instance when its own is killed: the
/// lease is created with an `Idempotency-Key`, an acquire with a lease returns the same handle,
/// a put of the same value is the same put. Whether the write answered 2xx; `None` if the lease
/// ended before the lock was granted (the increment is tried again).
async fn increment(at: &Instances, (lock, key): (&str, &str), guarded: bool, ttl: &str) -> Option<bool> {
    let idempotency = uuid::Uuid::new_v4().to_string();
    let made = at
        .send(
            Method::POST,
            "/v1/leases",
            &[("Idempotency-Key", &idempotency)],
            Some(json!({ "ttl": ttl })),
        )
        .await;
    assert!(made.status.is_success(), "{made:?}");
    let lease = made.str("id");
    let path = format!("/v1/locks/{lock}/acquire?wait=60s");
    let held = at.send(Method::POST, &path, &[], Some(json!({ "lease": lease }))).await;
    if held.status == StatusCode::GONE {
        return None;
    }
    assert_eq!(held.status, StatusCode::OK, "{held:?}");
    let read = at.send(Method::GET, &format!("/v1/kv/{key}"), &[], None).await;
    let value = read.body.as_i64().expect("a number");
    let guard = lock_guard(lock, &held.str("handle"));
    let headers: &[(&str, &str)] = if guarded { &[("ZKGATE-Guard", &guard)] } else { &[] };
    let written = at
        .send(Method::PUT, &format!("/v1/kv/{key}"), headers, Some(json!(value + 1)))
        .await;
    if guarded && !written.status.is_success() {
        assert_eq!(written.body["type"], "urn:zkgate:problem:guard-lost", "{written:?}");
    }
    let ended = at.send(Method::DELETE, &format!("/v1/leases/{lease}"), &[], None).await;
    assert!(
        ended.status.is_success() || ended.status == StatusCode::GONE,
        "{ended:?}"
    );
    Some(written.status.is_success())
}

/// A holder that lost the lock without knowing (its lease expired between its read and its
/// write, as after a long pause) writes what it read plus one: with the guard that write is
/// refused; without, it lands over the increments made meanwhile, and they are lost.
async fn a_paused_holder(url: &str, (lock, key): (&str, &str), guarded: bool) -> bool {
    let http = common::http_client();
    let acquired = http
        .post(format!("{url}/v1/locks/{lock}/acquire?wait=30s"))
        .json(&json!({ "ttl": "1s" }))
        .send()
        .await
        .expect("acquire");
    let held = Reply::read(acquired).await;
    assert_eq!(held.status, StatusCode::OK, "{held:?}");
    let read = http.get(format!("{url}/v1/kv/{key}")).send().await.expect("read");
    let etag = read.headers()["etag"].to_str().expect("etag").to_string();
    let value: i64 = read.json().await.expect("a number");
    // No keepalive: the lease expires, the lock passes on, and the others write. Waits for
    // their write (a long poll on the key's version), not for time.
    let changed = http
        .get(format!("{url}/v1/kv/{key}?wait=60s"))
        .header("If-None-Match", &etag)
        .send()
        .await
        .expect("long poll");
    assert_eq!(changed.status(), StatusCode::OK, "the others wrote");
    let guard = lock_guard(lock, &held.str("handle"));
    let guard = guarded.then_some(guard.as_str());
    let written = kv(url, Method::PUT, key, Some(json!(value + 1)), guard).await;
    if guarded {
        assert_eq!(written.body["type"], "urn:zkgate:problem:guard-lost", "{written:?}");
    }
    written.status.is_success()
}

/// Sixteen clients increment one key, each under one lock, through two zkgate processes; one
/// holder's lease expires between its read and its write (it pauses), and one process is
/// killed -9 midway, its clients going on through the other. Guarded, the key ends at exactly
/// the number of writes answered 2xx (every increment but the paused one's); unguarded, the
/// paused holder's write lands over others' and increments are lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guarded_increments_through_two_instances_are_never_lost_and_unguarded_ones_are() {
    use common::process::Process;
    const CLIENTS: usize = 16;
    const EACH: usize = 4;
    let zk = zookeeper().await;
    let mut lost_unguarded = 0;
    for guarded in [true, false] {
        let (lock, key) = if guarded { ("g", "counts/g") } else { ("u", "counts/u") };
        let mut killed = Process::start(&zk.connect_string()).await;
        let kept = Process::start(&zk.connect_string()).await;
        let urls = vec![killed.url.clone(), kept.url.clone()];
        let put = kv(&kept.url, Method::PUT, key, Some(json!(0)), None).await;
        assert_eq!(put.status, StatusCode::CREATED, "{put:?}");
        let paused = {
            let url = kept.url.clone();
            tokio::spawn(async move { a_paused_holder(&url, (lock, key), guarded).await })
        };
        // The paused holder takes the lock first: the others queue behind it.
        common::until_answered(Duration::from_secs(20), "the paused holder's grant", async || {
            let (_, state) = kept.call(Method::GET, &format!("/v1/locks/{lock}"), None).await;
            state["holder"].is_object()
        })
        .await;
        let mut clients = tokio::task::JoinSet::new();
        let failovers = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for client in 0..CLIENTS {
            let at = Instances {
                urls: urls.clone(),
                prefer: (client % 2).into(),
                failovers: failovers.clone(),
            };
            clients.spawn(async move {
                let mut landed = 0;
                let mut done = 0;
                while done < EACH {
                    if let Some(written) = increment(&at, (lock, key), guarded, "10s").await {
                        landed += usize::from(written);
                        done += 1;
                    }
                }
                landed
            });
        }
        // Midway, one instance is killed: its clients go on through the other.
        common::until_answered(Duration::from_secs(60), "a quarter of the increments", async || {
            let value = kv(&kept.url, Method::GET, key, None, None).await.body.as_i64();
            value.is_some_and(|value| value >= (CLIENTS * EACH / 4) as i64)
        })
        .await;
        killed.kill().await;
        let mut landed = usize::from(paused.await.expect("the paused holder"));
        while let Some(done) = clients.join_next().await {
            landed += done.expect("a client");
        }
        let value = kv(&kept.url, Method::GET, key, None, None)
            .await
            .body
            .as_i64()
            .expect("a number");
        let failovers = failovers.load(std::sync::atomic::Ordering::Relaxed);
        println!(
            "guarded {guarded}: {landed} writes answered 2xx, the key ends at {value}; {failovers} requests failed over"
        );
        assert!(
            failovers > 0,
            "the clients of the killed instance went on through the other"
        );
        if guarded {
            assert_eq!(value, landed as i64, "every write that landed counts, once");
            assert_eq!(landed, CLIENTS * EACH, "only the paused holder's write was refused");
        } else {
            lost_unguarded = landed as i64 - value;
        }
    }
    assert!(
        lost_unguarded > 0,
        "without the guard the paused holder's write lands over the others' increments"
    );
}

/// `POST /v1/kv-txn` on the instance at `url` with `body`.
async fn txn(url: &str, body: Value) -> Reply {
    let response = common::http_client()
        .post(format!("{url}/v1/kv-txn"))
        .json(&body)
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .expect("kv-txn request");
    Reply::read(response).await
}

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
}

/// A compare of a hold stands at the commit, not only when it was resolved: a transaction run
/// with a holder's standing resolved before its release, or a waiter's resolved before its
/// grant, is refused by its own multi-op (and run again by its operation, which resolves
/// anew). Fails without [zkgate::recipes::guards::Standing::pin].
#[tokio::test]
async fn a_compare_of_a_hold_is_pinned_to_the_commit() {
    use zkgate::auth::Caller;
    use zkgate::recipes::guards::{Guard, Guards, standing};
    use zkgate::recipes::kv::txn::{self, Bindings, Check, Step, Txn, TxnError};
    use zkgate::recipes::usage::Payer;

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
    let payer = Payer {
        quotas: &recipes.quotas,
        principal: None,
    };
    let leases = std::collections::HashMap::new();
    let bound = Bindings {
        keys: &recipes.kv_keys,
        leases: &leases,
        quotas: &recipes.quotas,
        caller: &Caller::Anyone,
    };
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

/// A key's event stream says which holder wrote it: a guarded put's event names the guard and
/// the holder's fencing token, through either instance (a put through one, the stream from the
/// other); the next holder's put names the next token; a write without a guard names none; a
/// delete takes the writer record with the key, so a key made again without a guard names none.
#[tokio::test]
async fn a_guarded_keys_events_say_which_holder_wrote_it() {
    let zk = zookeeper().await;
    let (a, b) = (
        Gate::start(&zk.connect_string()).await,
        Gate::start(&zk.connect_string()).await,
    );
    let topic = "znode:data:kv/orders/state";
    let mut events = Sse::open(&b.http, &format!("{}/v1/events?topic={topic}", b.url), None).await;
    let first = events.next().await;
    assert_eq!(first["state"]["exists"], false, "{first:?}");
    let mut seen = Vec::new();
    let lease = a.lease("60s").await;
    let held = a.acquire("orders", &lease, "wait=5s").await;
    let guard = lock_guard("orders", &held.str("handle"));
    let event = put_seen(&a.url, (&mut events, &mut seen), json!("paid"), Some(&guard)).await;
    let by = json!([{"guard": "lock/orders", "fencing_token": held.i64("fencing_token")}]);
    assert_eq!(event["state"]["guarded_by"], by, "{event:?}");
    a.release("orders", &held.str("handle")).await;

    let next = a.acquire("orders", &lease, "wait=5s").await;
    assert_ne!(next.i64("fencing_token"), held.i64("fencing_token"));
    let next_guard = lock_guard("orders", &next.str("handle"));
    let event = put_seen(&a.url, (&mut events, &mut seen), json!("packed"), Some(&next_guard)).await;
    let by = json!([{"guard": "lock/orders", "fencing_token": next.i64("fencing_token")}]);
    assert_eq!(event["state"]["guarded_by"], by, "{event:?}");

    let event = put_seen(&a.url, (&mut events, &mut seen), json!("anyone"), None).await;
    assert!(event["state"].get("guarded_by").is_none(), "{event:?}");

    // A guarded transaction's put names its holder too.
    let done = txn(&b.url, json!({"then": [{"put": "orders/state", "text": "by-txn"}]})).await;
    assert_eq!(done.status, StatusCode::OK, "{done:?}");
    let guarded = common::http_client()
        .post(format!("{}/v1/kv-txn", b.url))
        .header("ZKGATE-Guard", &next_guard)
        .json(&json!({"then": [{"put": "orders/state", "text": "shipped"}]}))
        .send()
        .await
        .expect("kv-txn");
    assert_eq!(guarded.status(), StatusCode::OK);
    let event = events
        .until(topic, &mut seen, |event| event["state"]["data"] == "shipped")
        .await;
    assert_eq!(event["state"]["guarded_by"], by, "{event:?}");

    // Deleted with its writer record: made again without a guard, it names no holder.
    let deleted = kv(&a.url, Method::DELETE, "orders/state", None, None).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{deleted:?}");
    let records = common::zk_client(&zk.connect_string())
        .await
        .list_children("/zkgate/writers")
        .await
        .expect("the writer records");
    assert!(records.is_empty(), "the delete took the key's record: {records:?}");
    let event = put_seen(&a.url, (&mut events, &mut seen), json!("again"), None).await;
    assert!(event["state"].get("guarded_by").is_none(), "{event:?}");
}

/// Puts `value` at `orders/state` through `url` (guarded by `guard`) and waits for its event on
/// `events` (`seen`: the events read on the way).
async fn put_seen(url: &str, (events, seen): (&mut Sse, &mut Vec<Value>), value: Value, guard: Option<&str>) -> Value {
    let put = kv(url, Method::PUT, "orders/state", Some(value.clone()), guard).await;
    assert!(put.status.is_success(), "{put:?}");
    let text = value.to_string();
    events
        .until("znode:data:kv/orders/state", seen, |event| {
            event["state"]["data"] == text.as_str()
        })
        .await
}
