//! Exclusive locks over HTTP against a real ZooKeeper: mutual exclusion and fencing under
//! contention, queue order, try-lock and timed waits, leases that end, session expiry.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::proxy::Proxy;
use common::{Gate, expire_session, wait_children, within, zk_client, zookeeper};
use reqwest::StatusCode;
use serde_json::json;

/// Children of a lock's znode (empty if it does not exist).
async fn contenders(connect: &str, lock: &str) -> Vec<String> {
    let client = zk_client(connect).await;
    client
        .list_children(&format!("/zkgate/locks/{lock}"))
        .await
        .unwrap_or_default()
}

#[derive(Default)]
struct History {
    /// Who is inside the critical section now.
    inside: Option<usize>,
    /// Fencing tokens in the order the critical sections were entered.
    tokens: Vec<i64>,
    overlaps: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_clients_never_overlap_and_tokens_increase() {
    let zk = zookeeper().await;
    let gate = Arc::new(Gate::start(&zk.connect_string()).await);
    let history = Arc::new(Mutex::new(History::default()));
    const CLIENTS: usize = 20;
    const ROUNDS: usize = 26; // 520 grants in all
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        let (gate, history) = (gate.clone(), history.clone());
        tasks.push(tokio::spawn(async move {
            let lease = gate.lease("30s").await;
            for _ in 0..ROUNDS {
                let reply = gate.acquire("hot", &lease, "wait=30s").await;
                assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
                let token = reply.i64("fencing_token");
                {
                    let mut h = history.lock().unwrap();
                    if h.inside.is_some() {
                        h.overlaps += 1;
                    }
                    h.inside = Some(client);
                    h.tokens.push(token);
                }
                tokio::task::yield_now().await;
                {
                    let mut h = history.lock().unwrap();
                    if h.inside == Some(client) {
                        h.inside = None;
                    }
                }
                gate.release("hot", &reply.str("handle")).await;
            }
        }));
    }
    for task in tasks {
        within(Duration::from_secs(240), "all clients to finish", task)
            .await
            .expect("client task");
    }
    let h = std::mem::take(&mut *history.lock().unwrap());
    assert_eq!(h.tokens.len(), CLIENTS * ROUNDS);
    assert_eq!(h.overlaps, 0, "critical sections overlapped");
    for pair in h.tokens.windows(2) {
        assert!(
            pair[0] < pair[1],
            "fencing tokens must strictly increase in grant order: {pair:?}"
        );
    }
    assert!(
        contenders(&zk.connect_string(), "hot").await.is_empty(),
        "no contender left behind"
    );
}

#[tokio::test]
async fn waiters_are_granted_in_queue_order() {
    let zk = zookeeper().await;
    let gate = Arc::new(Gate::start(&zk.connect_string()).await);
    let holder = gate.lease("30s").await;
    let first = gate.acquire("fifo", &holder, "wait=5s").await;
    assert_eq!(first.status, StatusCode::OK);

    // Queue three waiters, one after the other, each told its place.
    let mut waiters = Vec::new();
    for expected_position in 1..=3 {
        let lease = gate.lease("30s").await;
        let queued = gate.acquire("fifo", &lease, "wait=0&keep_queued=true").await;
        assert_eq!(queued.status, StatusCode::ACCEPTED, "{queued:?}");
        assert_eq!(queued.body["position"], expected_position);
        assert_eq!(queued.body["acquired"], false);
        waiters.push((expected_position, lease, queued.str("handle")));
    }

    // All three wait again (same lease: same handle); each releases as soon as it is granted.
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (position, lease, handle) in waiters {
        let (gate, order) = (gate.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let reply = gate.acquire("fifo", &lease, "wait=20s").await;
            assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
            assert_eq!(reply.str("handle"), handle, "a retried acquire keeps its handle");
            order.lock().unwrap().push(position);
            gate.release("fifo", &handle).await;
        }));
    }
    // The queue is visible: holder plus three waiters in order.
    let state = gate.get("/v1/locks/fifo").await;
    assert_eq!(state.body["waiters"].as_array().map(Vec::len), Some(3), "{state:?}");
    gate.release("fifo", &first.str("handle")).await;
    for task in tasks {
        within(Duration::from_secs(30), "waiters to be granted", task)
            .await
            .expect("waiter");
    }
    assert_eq!(*order.lock().unwrap(), vec![1, 2, 3]);
}

#[tokio::test]
async fn try_lock_on_a_held_lock_fails_at_once_and_leaves_no_znode() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let held = gate.post("/v1/locks/busy/acquire?wait=0", None).await;
    assert_eq!(held.status, StatusCode::OK, "{held:?}");
    let tried = gate.post("/v1/locks/busy/acquire?wait=0", None).await;
    tried.assert_problem(StatusCode::CONFLICT, None);
    assert_eq!(tried.body["queued"], false);
    assert_eq!(tried.body["position"], 1);
    assert_eq!(
        contenders(&zk.connect_string(), "busy").await.len(),
        1,
        "only the holder's znode"
    );
    // The lease made for the failed try-lock went with it.
    assert_eq!(gate.get("/v1/leases").await.body.as_array().map(Vec::len), Some(1));
}

#[tokio::test]
async fn a_timed_out_wait_leaves_no_znode_unless_asked_to_stay_queued() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let holder = gate.lease("30s").await;
    assert_eq!(gate.acquire("slow", &holder, "wait=1s").await.status, StatusCode::OK);

    let quitter = gate.lease("30s").await;
    let gave_up = gate.acquire("slow", &quitter, "wait=200ms").await;
    gave_up.assert_problem(StatusCode::CONFLICT, None);
    assert_eq!(contenders(&zk.connect_string(), "slow").await.len(), 1);
    assert_eq!(
        gate.get(&format!("/v1/leases/{quitter}")).await.body["holdings"],
        json!([])
    );

    let patient = gate.lease("30s").await;
    let queued = gate.acquire("slow", &patient, "wait=200ms&keep_queued=true").await;
    assert_eq!(queued.status, StatusCode::ACCEPTED, "{queued:?}");
    assert_eq!(contenders(&zk.connect_string(), "slow").await.len(), 2);
    let handle = gate
        .get(&format!("/v1/locks/slow/handles/{}", queued.str("handle")))
        .await;
    assert_eq!(handle.body["state"], "waiting");
    assert_eq!(handle.body["position"], 1);
    assert!(
        handle.body["fencing_token"].is_null(),
        "no token before the grant: {handle:?}"
    );
    let lease_view = gate.get(&format!("/v1/leases/{patient}")).await;
    assert!(
        lease_view.body["holdings"][0]["fencing_token"].is_null(),
        "{lease_view:?}"
    );
}

#[tokio::test]
async fn an_expired_lease_releases_the_lock_and_the_next_waiter_gets_it() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let silent = gate
        .post("/v1/locks/job/acquire?wait=0", Some(json!({"ttl": "1s"})))
        .await;
    assert_eq!(silent.status, StatusCode::OK, "{silent:?}");
    let silent_lease = silent.body["lease"]["id"].as_str().expect("lease id").to_string();

    let next = gate.lease("30s").await;
    // Blocks until the silent holder's lease expires; woken by ZooKeeper's watch.
    let granted = gate.acquire("job", &next, "wait=20s").await;
    assert_eq!(granted.status, StatusCode::OK, "{granted:?}");
    assert!(granted.i64("fencing_token") > silent.i64("fencing_token"));

    let gone = gate.post(&format!("/v1/leases/{silent_lease}/keepalive"), None).await;
    gone.assert_problem(StatusCode::GONE, None);
    assert_eq!(gone.body["reason"], "expired");
}

#[tokio::test]
async fn keepalive_keeps_a_lease_past_its_ttl() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let lease = gate.lease("1s").await;
    let held = gate.acquire("kept", &lease, "wait=0").await;
    assert_eq!(held.status, StatusCode::OK);
    // A waiter that would be granted the moment the lease lapsed.
    let rival = gate.lease("30s").await;
    for _ in 0..6 {
        // Three TTLs in all, each keepalive well within the TTL.
        let kept = gate.post(&format!("/v1/leases/{lease}/keepalive"), None).await;
        assert_eq!(kept.status, StatusCode::OK, "{kept:?}");
        assert_eq!(kept.body["holdings"][0]["state"], "held");
        let waited = gate.acquire("kept", &rival, "wait=500ms").await;
        waited.assert_problem(StatusCode::CONFLICT, None);
    }
}

#[tokio::test]
async fn a_deleted_lease_releases_the_lock_at_once() {
    let zk = zookeeper().await;
    let gate = Arc::new(Gate::start(&zk.connect_string()).await);
    let holder = gate.lease("30s").await;
    assert_eq!(gate.acquire("report", &holder, "wait=0").await.status, StatusCode::OK);
    let next = gate.lease("30s").await;
    let waiter = {
        let (gate, next) = (gate.clone(), next.clone());
        tokio::spawn(async move { gate.acquire("report", &next, "wait=20s").await })
    };
    // Only delete once the waiter is queued, so the grant must come from the deletion.
    wait_children(&zk.connect_string(), "/zkgate/locks/report", 2).await;
    assert_eq!(
        gate.delete(&format!("/v1/leases/{holder}")).await.status,
        StatusCode::NO_CONTENT
    );
    let granted = within(Duration::from_secs(10), "the waiter's grant", waiter)
        .await
        .expect("waiter");
    assert_eq!(granted.status, StatusCode::OK, "{granted:?}");
    let gone = gate.get(&format!("/v1/leases/{holder}")).await;
    gone.assert_problem(StatusCode::GONE, None);
    assert_eq!(gone.body["reason"], "deleted");
}

/// The ZooKeeper session a lease's writes go through expires. Nothing the lease holds lives on
/// that session any more, so nothing is lost: the lease keeps its lock with the same fencing
/// token, its task goes on on the lane's next session (its watch too: a release afterwards
/// grants the queued rival at once), and the instance serves on as before.
#[tokio::test]
async fn a_session_expiry_loses_no_lease_and_the_holding_goes_on_on_the_next_session() {
    let zk = zookeeper().await;
    let connect = zk.connect_string();
    let proxy = Proxy::start(&connect).await;
    let doomed = Gate::start(&proxy.connect_string()).await;
    let other = Arc::new(Gate::start(&connect).await);

    let lease = doomed.lease("60s").await;
    let held = doomed.acquire("primary", &lease, "wait=0").await;
    assert_eq!(held.status, StatusCode::OK);
    let rival_lease = other.lease("60s").await;
    let rival = {
        let (other, rival_lease) = (other.clone(), rival_lease.clone());
        tokio::spawn(async move { other.acquire("primary", &rival_lease, "wait=40s").await })
    };
    wait_children(&connect, "/zkgate/locks/primary", 2).await;
    let lane = doomed.running.state.leases.peek(&lease).expect("lease").zk.lane();

    expire_session(&proxy, &connect, doomed.session_of(&lease)).await;
    doomed.wait_lane_generation(lane, 2).await;
    within(
        Duration::from_secs(20),
        "ready again",
        doomed.running.state.wait_ready(),
    )
    .await;

    let still = doomed.get(&format!("/v1/leases/{lease}")).await;
    assert_eq!(still.status, StatusCode::OK, "{still:?}");
    assert_eq!(still.body["holdings"][0]["state"], "held", "{still:?}");
    assert_eq!(still.body["holdings"][0]["fencing_token"], held.body["fencing_token"]);
    let state = other.get("/v1/locks/primary").await;
    assert_eq!(
        state.body["holder"]["fencing_token"], held.body["fencing_token"],
        "{state:?}"
    );
    assert_eq!(state.body["waiter_count"], 1, "{state:?}");
    assert!(!rival.is_finished(), "the rival was not granted");

    // The holding's task went on on the new session: a release now is one multi-op there,
    // and the rival's watch (on the other instance) grants it at once.
    doomed.release("primary", &held.str("handle")).await;
    let granted = within(Duration::from_secs(10), "the rival's grant", rival)
        .await
        .expect("rival");
    assert_eq!(granted.status, StatusCode::OK, "{granted:?}");
    assert!(granted.i64("fencing_token") > held.i64("fencing_token"));
    let ready = doomed.get("/readyz").await;
    assert_eq!(ready.status, StatusCode::OK, "{ready:?}");
    let sessions = doomed.running.state.lanes.all().len();
    assert!(sessions > 1, "the default opens several sessions");
    assert_eq!(ready.body["zookeeper"]["sessions_connected"], sessions, "{ready:?}");
}

#[tokio::test]
async fn a_lost_create_reply_is_recovered_by_the_guid_without_an_orphan() {
    lose_a_create_reply(false).await;
}

/// The same with the connection reset (a dying host) instead of closed: the client then
/// fails the create with an I/O error instead of `ConnectionLoss`, and the GUID rule must
/// run all the same (a "Broken pipe" once turned this into a 500).
#[tokio::test]
async fn a_create_reply_lost_to_a_connection_reset_is_recovered_the_same_way() {
    lose_a_create_reply(true).await;
}

async fn lose_a_create_reply(reset: bool) {
    let zk = zookeeper().await;
    let proxy = Proxy::start(&zk.connect_string()).await;
    if reset {
        proxy.reset_on_cut();
    }
    let gate = Gate::start(&proxy.connect_string()).await;
    let lease = gate.lease("60s").await;
    // Once without the fault (the lock znode now exists), once with it, each from scratch.
    for round in 0..2 {
        if round == 1 {
            proxy.lose_next_create_reply();
        }
        let granted = gate.acquire("flaky", &lease, "wait=20s").await;
        assert_eq!(granted.status, StatusCode::OK, "{granted:?}");
        let children = contenders(&zk.connect_string(), "flaky").await;
        assert_eq!(
            children,
            vec![granted.str("node")],
            "exactly the adopted contender, no orphan"
        );
        gate.release("flaky", &granted.str("handle")).await;
        assert!(contenders(&zk.connect_string(), "flaky").await.is_empty());
    }
    assert_eq!(proxy.create_replies_lost(), 1, "the fault was injected once");
}

/// A waiter keeps only the name of the node it watches while it waits, not its listing of the
/// queue: what a waiter costs does not grow with the queue ahead of it. (Each kept its listing
/// through the wait before: 51 KiB apiece with 1,000 waiting on one lock, quadratic in all;
/// here that would be about 100 KiB each for the waiters from the 200th to the 2,000th.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_costs_the_same_memory_however_long_the_queue_ahead_of_it() {
    let zk = zookeeper().await;
    let mut config = common::test_config(&zk.connect_string());
    config.max_waiters_per_lock = 10_000;
    config.max_waiters_per_principal = 10_000;
    config.max_leases_per_principal = 10_000;
    let gate = Arc::new(Gate::start_with(config).await);
    let leases: Vec<String> = futures::future::join_all((0..=2_000).map(|_| gate.lease("1h"))).await;
    let holder = gate.acquire("long-queue", &leases[0], "wait=0").await;
    assert_eq!(holder.status, StatusCode::OK, "{holder:?}");
    let queue = |leases: &[String]| {
        let gate = gate.clone();
        let leases = leases.to_vec();
        async move {
            for chunk in leases.chunks(32) {
                let replies = futures::future::join_all(
                    chunk
                        .iter()
                        .map(|lease| gate.acquire("long-queue", lease, "wait=0&keep_queued=true")),
                )
                .await;
                for reply in replies {
                    assert_eq!(reply.status, StatusCode::ACCEPTED, "{reply:?}");
                }
            }
        }
    };
    // The first 200 warm the allocator's pools up; the next 1,800 are measured.
    queue(&leases[1..201]).await;
    let before = common::resident_bytes();
    queue(&leases[201..]).await;
    let per_waiter = common::resident_bytes().saturating_sub(before) / 1_800;
    assert!(
        per_waiter < 32 * 1024,
        "each waiter from the 200th to the 2,000th grew this process by {per_waiter} bytes"
    );
    let state = gate.get("/v1/locks/long-queue").await;
    assert_eq!(state.body["waiter_count"], 2_000, "{state:?}");
}
