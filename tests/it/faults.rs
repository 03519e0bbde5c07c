//! The fault suite's lock scenarios: locks under contention on a 3-server ensemble while its
//! leader is killed and restarted, with clients spread over two zkgate instances; a holder
//! paused past its lease; and the checker shown to catch two holders when fencing is off.
//!
//! Each client's critical section is a read-modify-write of a [FencedRegister] with its
//! fencing token: mutual exclusion plus fencing means no increment is ever lost. The run's
//! length is `ZKGATE_FAULT_SECONDS` (default: a bounded run for CI); the figures are printed
//! for docs/RELIABILITY.md.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::checker::{FencedRegister, History, LockEvent, Terms};
use common::process::Process;
use common::proxy::Proxy;
use common::{Ensemble, Gate, test_config, within, zookeeper};
use reqwest::StatusCode;
use serde_json::json;
use tokio::sync::mpsc;

/// How long the faulty phase of a scenario lasts.
fn fault_seconds() -> u64 {
    std::env::var("ZKGATE_FAULT_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6)
}

#[derive(Default)]
struct Counts {
    cycles: AtomicUsize,
    timeouts: AtomicUsize,
    unavailable: AtomicUsize,
    lost: AtomicUsize,
}

/// One client: lease, acquire, read-modify-write the register with the token, release; again
/// until `stop`. Unavailable answers (503 while ZooKeeper elects a leader) are retried after a
/// short pause, as a client would; a lost lease is replaced.
async fn client(
    name: String,
    gate: Arc<Gate>,
    register: Arc<FencedRegister>,
    history: Arc<History>,
    stop: Arc<AtomicBool>,
    counts: Arc<Counts>,
) {
    let mut lease: Option<String> = None;
    while !stop.load(Ordering::SeqCst) {
        let id = match &lease {
            Some(id) => id.clone(),
            None => {
                let created = gate.post("/v1/leases", Some(json!({"ttl": "20s"}))).await;
                if created.status != StatusCode::CREATED {
                    counts.unavailable.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await; // a client's backoff after a 503
                    continue;
                }
                let id = created.str("id");
                lease = Some(id.clone());
                id
            }
        };
        let granted = gate.acquire("fenced", &id, "wait=3s").await;
        match granted.status {
            StatusCode::OK => {}
            StatusCode::CONFLICT => {
                counts.timeouts.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            StatusCode::GONE | StatusCode::NOT_FOUND => {
                counts.lost.fetch_add(1, Ordering::Relaxed);
                lease = None;
                continue;
            }
            _ => {
                counts.unavailable.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await; // a client's backoff after a 503
                continue;
            }
        }
        let token = granted.i64("fencing_token");
        history.record(&name, token, LockEvent::Granted);
        let read = register.read();
        tokio::task::yield_now().await;
        register.write(&name, token, read);
        // The critical section ends here, before the release is sent (whose answer may come
        // after the next holder's grant).
        history.record(&name, token, LockEvent::Released);
        let released = gate
            .delete(&format!("/v1/locks/fenced/handles/{}", granted.str("handle")))
            .await;
        if released.status != StatusCode::NO_CONTENT {
            // Lost while held (410) or ZooKeeper unreachable: the lease may be gone too.
            counts.lost.fetch_add(1, Ordering::Relaxed);
            lease = None;
        }
        counts.cycles.fetch_add(1, Ordering::Relaxed);
        // Keep the lease fresh between cycles.
        let _ = gate.post(&format!("/v1/leases/{id}/keepalive"), None).await;
    }
}

/// What happens to the ensemble in the middle of a lock run.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// `kill -9` of the quorum's leader, then a restart.
    KillLeader,
    /// SIGSTOP of a follower (it keeps its sockets but answers nothing), then SIGCONT.
    PauseFollower,
    /// The network between one zkgate instance and ZooKeeper becomes a black hole for 3 s
    /// (less than the 4 s session timeout), then heals.
    BlackHole,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_stay_exclusive_while_the_zookeeper_leader_is_killed_and_restarted() {
    locks_under(Fault::KillLeader).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_stay_exclusive_while_a_follower_is_paused() {
    locks_under(Fault::PauseFollower).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_stay_exclusive_while_an_instance_is_cut_off_by_a_black_hole() {
    locks_under(Fault::BlackHole).await;
}

async fn locks_under(fault: Fault) {
    let mut ensemble = Ensemble::start(3).await;
    let connect = ensemble.connect_string();
    let proxy = Proxy::start(&ensemble.servers[0].connect_string()).await;
    let first = match fault {
        Fault::BlackHole => proxy.connect_string(),
        _ => connect.clone(),
    };
    let gates = [
        Arc::new(Gate::start(&first).await),
        Arc::new(Gate::start(&connect).await),
    ];
    let register = Arc::new(FencedRegister::new(true));
    let history = Arc::new(History::default());
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(Counts::default());
    let clients: Vec<_> = (0..6)
        .map(|i| {
            tokio::spawn(client(
                format!("client-{i}"),
                gates[i % 2].clone(),
                register.clone(),
                history.clone(),
                stop.clone(),
                counts.clone(),
            ))
        })
        .collect();

    // Some cycles on a healthy ensemble first.
    within(Duration::from_secs(30), "the first cycles", async {
        while counts.cycles.load(Ordering::Relaxed) < 20 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let phase = Duration::from_secs(fault_seconds());
    let leader = ensemble.leader().await.expect("a leader");
    let healthy = counts.cycles.load(Ordering::Relaxed);
    match fault {
        Fault::KillLeader => {
            ensemble.servers[leader].kill();
            tokio::time::sleep(phase / 2).await; // the fault's length, not a synchronisation
            ensemble.servers[leader]
                .restart(&ensemble.options)
                .expect("restart the old leader");
            ensemble.servers[leader]
                .wait_serving(Duration::from_secs(60))
                .await
                .expect("the old leader serves again");
        }
        Fault::PauseFollower => {
            // Preferably the follower that serves one of the instances, so that its session
            // must move to another server.
            let mut follower = (leader + 1) % 3;
            let mut serving = Vec::new();
            for (g, gate) in gates.iter().enumerate() {
                let session = gate.session().id().0;
                for (i, server) in ensemble.servers.iter().enumerate() {
                    if i != leader && common::serves_session(server.client_port(), session).await {
                        follower = i;
                        serving.push(g);
                    }
                }
            }
            println!("pausing server {follower} (leader: {leader}), serving instances {serving:?}");
            ensemble.servers[follower].pause(true);
            tokio::time::sleep(phase / 2).await; // the fault's length
            ensemble.servers[follower].pause(false);
        }
        Fault::BlackHole => {
            proxy.black_hole(true);
            tokio::time::sleep(Duration::from_secs(3)).await; // the fault's length
            proxy.black_hole(false);
        }
    }
    let during = counts.cycles.load(Ordering::Relaxed) - healthy;
    tokio::time::sleep(phase / 2).await; // traffic after the recovery
    // And the service is whole again: cycles go on.
    let after = counts.cycles.load(Ordering::Relaxed);
    within(Duration::from_secs(30), "cycles after the restart", async {
        while counts.cycles.load(Ordering::Relaxed) < after + 10 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    for client in clients {
        within(Duration::from_secs(30), "the clients to stop", client)
            .await
            .expect("client");
    }
    let tally = register.check().unwrap_or_else(|violation| panic!("{violation}"));
    // As the clients saw it: one holder at a time, tokens increasing with every grant. (A
    // lost session would make two clients believe they hold at once, which fencing then
    // settles; these faults are shorter than the session timeout, so none is lost.)
    if counts.lost.load(Ordering::Relaxed) == 0 {
        let grants = history.check().unwrap_or_else(|violation| panic!("{violation}"));
        assert_eq!(grants, tally.accepted, "every grant wrote once");
    }
    println!(
        "{fault:?}: {} cycles ({} during the fault, phase {:?}), {} accepted writes, {} rejected, {} timeouts, {} unavailable, {} lost",
        counts.cycles.load(Ordering::Relaxed),
        during,
        phase,
        tally.accepted,
        tally.rejected,
        counts.timeouts.load(Ordering::Relaxed),
        counts.unavailable.load(Ordering::Relaxed),
        counts.lost.load(Ordering::Relaxed),
    );
    assert_eq!(tally.value as usize, tally.accepted);
}

/// A holder stops (a GC pause, a stopped VM) past its lease's TTL: the next contender is
/// granted; when the old holder wakes and writes with its token, fencing rejects it, and its
/// lease and handle say what happened.
async fn pause_a_holder(register: &FencedRegister) {
    let zk = zookeeper().await;
    let mut config = test_config(&zk.connect_string());
    config.lease_ttl_min = Duration::from_millis(500);
    let gate = Arc::new(Gate::start_with(config).await);
    let paused_lease = gate.lease("1s").await;
    let paused = gate.acquire("store", &paused_lease, "wait=0").await;
    assert_eq!(paused.status, StatusCode::OK);
    let stale_read = register.read();

    // It pauses: no keepalive. The next contender waits and is granted when the lease expires.
    let next_lease = gate.lease("30s").await;
    let next = within(
        Duration::from_secs(20),
        "the next holder",
        gate.acquire("store", &next_lease, "wait=15s"),
    )
    .await;
    assert_eq!(next.status, StatusCode::OK, "{next:?}");
    assert!(next.i64("fencing_token") > paused.i64("fencing_token"));
    let read = register.read();
    assert!(register.write("next", next.i64("fencing_token"), read));

    // The paused holder wakes and writes what it meant to write.
    register.write("paused", paused.i64("fencing_token"), stale_read);
    let lease = gate.get(&format!("/v1/leases/{paused_lease}")).await;
    lease.assert_problem(StatusCode::GONE, None);
    assert_eq!(lease.body["reason"], "expired");
}

#[tokio::test]
async fn a_holder_paused_past_its_lease_is_fenced_off_and_told() {
    let register = FencedRegister::new(true);
    pause_a_holder(&register).await;
    let tally = register.check().unwrap_or_else(|violation| panic!("{violation}"));
    assert_eq!((tally.accepted, tally.rejected, tally.value), (1, 1, 1));
}

/// The same run against storage that ignores fencing tokens: the paused holder's write is
/// accepted over the next holder's, and the checker reports the lost update. (So a passing
/// check above means something.)
#[tokio::test]
async fn the_checker_catches_two_holders_when_fencing_is_off() {
    let register = FencedRegister::new(false);
    pause_a_holder(&register).await;
    let violation = register.check().expect_err("a lost update");
    assert!(violation.contains("lost update"), "{violation}");
}

/// The TTL of the candidates' leases in the kill -9 scenario: short, so that the scenario is.
const CANDIDATE_TTL: Duration = Duration::from_secs(3);

/// A candidate that talks to one zkgate process only, and so dies with it: campaigns (staying
/// a candidate across waits), reports each time it is told it leads, then keeps its lease
/// alive through its process (noting when each keepalive was answered) until that dies.
async fn candidate(
    index: usize,
    url: String,
    terms: Arc<Terms>,
    leaders: mpsc::UnboundedSender<(usize, i64, Instant)>,
    acked: Arc<std::sync::Mutex<Vec<Option<Instant>>>>,
) {
    let http = common::http_client();
    let ttl = format!("{}s", CANDIDATE_TTL.as_secs());
    let Ok(created) = http
        .post(format!("{url}/v1/leases"))
        .json(&json!({"ttl": ttl}))
        .send()
        .await
    else {
        return;
    };
    let Ok(lease) = created.json::<serde_json::Value>().await else {
        return;
    };
    let lease = lease["id"].as_str().unwrap_or_default().to_string();
    let keepalive = || async {
        let answered = http.post(format!("{url}/v1/leases/{lease}/keepalive")).send().await;
        let ok = answered.is_ok_and(|r| r.status() == StatusCode::OK);
        if ok {
            acked.lock().unwrap()[index] = Some(Instant::now());
        }
        ok
    };
    loop {
        if !keepalive().await {
            return;
        }
        let Ok(reply) = http
            .post(format!("{url}/v1/elections/failover/campaign?wait=1s&keep_queued=true"))
            .json(&json!({"lease": lease, "value": format!("process-{index}")}))
            .send()
            .await
        else {
            return; // its process is gone
        };
        if reply.status() != StatusCode::OK {
            continue; // 202: still a candidate; campaign again with the same lease
        }
        let Ok(body) = reply.json::<serde_json::Value>().await else {
            return;
        };
        let term = body["term"].as_i64().expect("term");
        terms.record(term, &format!("process-{index}"));
        let _ = leaders.send((index, term, Instant::now()));
        // Lead until the process dies.
        while keepalive().await {
            tokio::time::sleep(Duration::from_millis(500)).await; // the keepalive period
        }
        return;
    }
}

/// Three zkgate processes on an ensemble, one candidate on each that talks to its process
/// only; the leader's process is killed with `kill -9`, twice, and its client with it. The
/// leader's lease outlives its instance (the survivors take it over), so the next candidate
/// leads only once that lease has expired: never less than its TTL after the last keepalive
/// it was answered (the contract's lower bound), and no later than the stated bound after it:
/// TTL + 3 s (what the dead keeper may have acknowledged without the others knowing) or the
/// session timeout and a reaper pass, whichever is later. Terms increase and no term has two
/// leaders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_dies_with_its_instance_is_followed_within_the_lease_bound() {
    let ensemble = Ensemble::start(3).await;
    let connect = ensemble.connect_string();
    let mut processes = Vec::new();
    for _ in 0..3 {
        processes.push(Process::start(&connect).await);
    }
    let terms = Arc::new(Terms::default());
    let acked = Arc::new(std::sync::Mutex::new(vec![None; 3]));
    let (leaders, mut elected) = mpsc::unbounded_channel();
    for (i, process) in processes.iter().enumerate() {
        let (terms, leaders, acked) = (terms.clone(), leaders.clone(), acked.clone());
        tokio::spawn(candidate(i, process.url.clone(), terms, leaders, acked));
    }
    let (mut leader, mut term, _) = within(Duration::from_secs(30), "a first leader", elected.recv())
        .await
        .expect("a leader");
    let mut failovers = Vec::new();
    let bound = CANDIDATE_TTL + zkgate::recipes::leases::FRESH + Duration::from_secs(5);
    for _ in 0..2 {
        processes[leader].kill().await;
        let last_ack = acked.lock().unwrap()[leader].expect("a keepalive was answered");
        let (next, next_term, at) = within(Duration::from_secs(30), "the next leader", elected.recv())
            .await
            .expect("a leader");
        assert_ne!(next, leader, "the dead process cannot lead");
        assert!(next_term > term, "terms increase: {term} then {next_term}");
        let after = at - last_ack;
        assert!(
            after >= CANDIDATE_TTL,
            "the lease ended {after:?} after its last keepalive"
        );
        assert!(after < bound, "the next leader took {after:?} (bound {bound:?})");
        failovers.push(after);
        (leader, term) = (next, next_term);
    }
    let seen = terms.check().unwrap_or_else(|violation| panic!("{violation}"));
    println!(
        "election failover after kill -9 of the leader and its client, from its last keepalive (TTL {CANDIDATE_TTL:?}, session timeout 2 s): {failovers:?}, {seen} terms"
    );
}

/// A waiter whose lease expires while it waits is never granted: its long poll ends with the
/// lease's end, its contender leaves the queue, and the lock passes over it.
#[tokio::test]
async fn a_waiter_whose_lease_expires_while_it_waits_is_never_granted() {
    let zk = zookeeper().await;
    let gate = Arc::new(Gate::start(&zk.connect_string()).await);
    let holder = gate.lease("30s").await;
    let held = gate.acquire("passing", &holder, "wait=0").await;
    assert_eq!(held.status, StatusCode::OK);

    let doomed = gate.lease("1s").await;
    let waiting = gate.acquire("passing", &doomed, "wait=20s").await;
    waiting.assert_problem(StatusCode::GONE, None);
    assert_eq!(waiting.body["reason"], "expired", "{waiting:?}");
    let state = gate.get("/v1/locks/passing").await;
    assert_eq!(
        state.body["waiters"],
        json!([]),
        "the expired waiter left the queue: {state:?}"
    );

    // The next contender, not the expired one, gets the lock after the holder.
    let next = gate.lease("30s").await;
    let queued = gate.acquire("passing", &next, "wait=0&keep_queued=true").await;
    assert_eq!(queued.status, StatusCode::ACCEPTED);
    gate.release("passing", &held.str("handle")).await;
    let granted = gate.acquire("passing", &next, "wait=10s").await;
    assert_eq!(granted.status, StatusCode::OK, "{granted:?}");
    let state = gate.get("/v1/locks/passing").await;
    assert_eq!(state.body["holder"]["lease"], json!(next), "{state:?}");
}

/// The whole ensemble goes down and comes back (two of three servers): meanwhile zkgate
/// answers 503 with `Retry-After`; afterwards it serves again, and every put it acknowledged
/// before is still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_ensemble_down_and_back_loses_nothing_acknowledged() {
    let mut ensemble = Ensemble::start(3).await;
    let gate = Gate::start(&ensemble.connect_string()).await;
    let mut acknowledged = Vec::new();
    for n in 0..20 {
        let put = gate.post("/v1/queues/durable/items", Some(json!({"n": n}))).await;
        assert_eq!(put.status, StatusCode::CREATED, "{put:?}");
        acknowledged.push(n);
    }

    for server in &mut ensemble.servers {
        server.kill();
    }
    // Unavailable, and saying so: 503 with Retry-After (after at most the session timeout,
    // for which zkgate waits for a reconnection).
    let refused = within(Duration::from_secs(30), "a 503 while ZooKeeper is down", async {
        loop {
            let reply = gate.post("/v1/queues/durable/items", Some(json!({"n": "lost"}))).await;
            if reply.status == StatusCode::SERVICE_UNAVAILABLE {
                return reply;
            }
            assert_ne!(
                reply.status,
                StatusCode::CREATED,
                "a put acknowledged with no ZooKeeper"
            );
        }
    })
    .await;
    refused.assert_problem(StatusCode::SERVICE_UNAVAILABLE, None);
    assert_eq!(gate.get("/readyz").await.status, StatusCode::SERVICE_UNAVAILABLE);

    // Two of three come back: a quorum.
    for server in ensemble.servers.iter_mut().take(2) {
        server.restart(&ensemble.options).expect("restart");
    }
    for server in ensemble.servers.iter_mut().take(2) {
        server
            .wait_serving(Duration::from_secs(60))
            .await
            .expect("serves again");
    }
    within(Duration::from_secs(60), "zkgate to be ready again", async {
        while gate.get("/readyz").await.status != StatusCode::OK {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let mut delivered = Vec::new();
    loop {
        let taken = gate
            .post("/v1/queues/durable/take?wait=0&mode=at-most-once", None)
            .await;
        if taken.status == StatusCode::NO_CONTENT {
            break;
        }
        assert_eq!(taken.status, StatusCode::OK, "{taken:?}");
        delivered.push(taken.body["body"]["n"].clone());
    }
    let acknowledged: Vec<_> = acknowledged.into_iter().map(|n| json!(n)).collect();
    assert_eq!(
        delivered, acknowledged,
        "every acknowledged put, in order, and nothing else"
    );
}

/// WebSocket subscribers across the kill of the ZooKeeper server that zkgate's session is
/// connected to: the session moves to another server, the subscribers get a `resync`
/// (reason `reconnected`) with the state, and events go on, numbered without a silent gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_resync_across_the_kill_of_zkgates_server() {
    let mut ensemble = Ensemble::start(3).await;
    let gate = Gate::start(&ensemble.connect_string()).await;
    let mut ws = common::ws::Ws::connect(gate.running.addr, "/v1/ws").await;
    ws.send(json!({"op": "subscribe", "id": "L", "topic": {"lock": "orders"}}));
    let mut events = vec![ws.next_for("L").await];
    let lease = gate.lease("60s").await;
    assert_eq!(gate.acquire("orders", &lease, "wait=0").await.status, StatusCode::OK);

    let session = gate.session().id().0;
    let mut serving = None;
    for (i, server) in ensemble.servers.iter().enumerate() {
        if common::serves_session(server.client_port(), session).await {
            serving = Some(i);
        }
    }
    let serving = serving.expect("a server holds zkgate's session");
    ensemble.servers[serving].kill();
    loop {
        let event = ws.next_for("L").await;
        events.push(event.clone());
        if event["type"] == "resync" {
            assert_eq!(event["reason"], "reconnected", "{event}");
            assert_eq!(
                event["state"]["holder"]["lease"],
                json!(lease),
                "the lock is still held: {event}"
            );
            break;
        }
    }
    let next = gate.lease("60s").await;
    let queued = gate.acquire("orders", &next, "wait=0&keep_queued=true").await;
    assert_eq!(queued.status, StatusCode::ACCEPTED);
    loop {
        let event = ws.next_for("L").await;
        events.push(event.clone());
        if event["type"] == "waiters" {
            break;
        }
    }
    common::ws::assert_no_silent_gap(&events);
}

#[derive(Default)]
struct QueueLedger {
    /// Ids whose put was acknowledged (201).
    put: std::collections::BTreeSet<u64>,
    /// Successful acks (204) per id.
    acked: std::collections::BTreeMap<u64, usize>,
    /// Ids whose ack was cut off by the kill: it may have happened (the item is gone) or not
    /// (it comes back and is acked again).
    in_doubt: std::collections::BTreeSet<u64>,
    deliveries: usize,
}

/// Puts ids `from..` on `url` until the process dies or `stop`.
async fn queue_producer(url: String, from: u64, ledger: Arc<std::sync::Mutex<QueueLedger>>, stop: Arc<AtomicBool>) {
    let http = common::http_client();
    for id in from.. {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        match http
            .post(format!("{url}/v1/queues/work/items"))
            .json(&json!({"id": id}))
            .send()
            .await
        {
            Ok(reply) if reply.status() == StatusCode::CREATED => {
                ledger.lock().unwrap().put.insert(id);
            }
            Ok(_) => {}
            Err(_) => return, // the process is gone
        }
    }
}

/// Takes (at least once), then acks, until the process dies or `stop` and the queue is empty.
async fn queue_consumer(url: String, ledger: Arc<std::sync::Mutex<QueueLedger>>, stop: Arc<AtomicBool>) {
    let http = common::http_client();
    loop {
        let Ok(reply) = http
            .post(format!("{url}/v1/queues/work/take?wait=1s&ack_deadline=5s"))
            .send()
            .await
        else {
            return;
        };
        if reply.status() == StatusCode::NO_CONTENT {
            // Done when asked to stop and nothing is left, claimed items included (those of
            // a dead process come back when its session expires).
            if stop.load(Ordering::SeqCst) {
                let Ok(state) = http.get(format!("{url}/v1/queues/work")).send().await else {
                    return;
                };
                let Ok(state) = state.json::<serde_json::Value>().await else {
                    return;
                };
                if state["depth"] == 0 && state["in_flight"] == 0 {
                    return;
                }
            }
            continue;
        }
        if reply.status() != StatusCode::OK {
            continue;
        }
        let Ok(item) = reply.json::<serde_json::Value>().await else {
            return;
        };
        let id = item["body"]["id"].as_u64().expect("id");
        ledger.lock().unwrap().deliveries += 1;
        let claim = item["claim"].as_str().unwrap_or_default();
        match http
            .post(format!("{url}/v1/queues/work/claims/{claim}/ack"))
            .send()
            .await
        {
            Ok(ack) if ack.status() == StatusCode::NO_CONTENT => {
                *ledger.lock().unwrap().acked.entry(id).or_default() += 1;
            }
            Ok(_) => {} // the claim was lost (the item comes back)
            Err(_) => {
                ledger.lock().unwrap().in_doubt.insert(id);
                return;
            }
        }
    }
}

/// Producers and consumers on two zkgate processes; one process is killed with `kill -9` in
/// the middle, with items claimed and acks in flight. Every acknowledged put is acknowledged
/// by a consumer exactly once (redeliveries happen, double acks never).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_acknowledged_put_is_acked_exactly_once_across_an_instance_kill() {
    let ensemble = Ensemble::start(3).await;
    let connect = ensemble.connect_string();
    let mut processes = [Process::start(&connect).await, Process::start(&connect).await];
    let ledger = Arc::new(std::sync::Mutex::new(QueueLedger::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for (i, process) in processes.iter().enumerate() {
        let url = process.url.clone();
        tasks.push(tokio::spawn(queue_producer(
            url.clone(),
            i as u64 * 1_000_000,
            ledger.clone(),
            stop.clone(),
        )));
        for _ in 0..2 {
            tasks.push(tokio::spawn(queue_consumer(url.clone(), ledger.clone(), stop.clone())));
        }
    }
    let acked = |ledger: &std::sync::Mutex<QueueLedger>| ledger.lock().unwrap().acked.len();
    within(Duration::from_secs(60), "traffic before the kill", async {
        while acked(&ledger) < 200 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    processes[0].kill().await;
    let at_kill = acked(&ledger);
    within(Duration::from_secs(60), "traffic after the kill", async {
        while acked(&ledger) < at_kill + 200 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    // The survivors drain the queue; items claimed by the dead process come back once its
    // session expires.
    for task in tasks {
        within(Duration::from_secs(60), "producers and consumers to finish", task)
            .await
            .expect("task");
    }
    let ledger = ledger.lock().unwrap();
    let missing: Vec<_> = ledger
        .put
        .iter()
        .filter(|id| !ledger.acked.contains_key(id) && !ledger.in_doubt.contains(id))
        .collect();
    assert!(missing.is_empty(), "acknowledged puts never acked: {missing:?}");
    let twice: Vec<_> = ledger.acked.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "acked more than once: {twice:?}");
    println!(
        "queue across a kill -9: {} puts acknowledged, {} acked exactly once, {} acks cut off by the kill, {} deliveries ({} redeliveries)",
        ledger.put.len(),
        ledger.acked.len(),
        ledger.in_doubt.len(),
        ledger.deliveries,
        ledger
            .deliveries
            .saturating_sub(ledger.acked.len() + ledger.in_doubt.len())
    );
}

/// Enters the double barrier as `participant` with `lease`, waiting (and entering again after
/// each 202) until it is let through or its lease ends; returns when it passed, if it did.
async fn enter_until_through(gate: Arc<Gate>, participant: &'static str, lease: String) -> Option<Instant> {
    loop {
        let reply = gate
            .post(
                "/v1/double-barriers/batch/enter?wait=10s",
                Some(json!({"participant": participant, "size": 3, "lease": lease})),
            )
            .await;
        match reply.status {
            StatusCode::OK => return Some(Instant::now()),
            StatusCode::ACCEPTED | StatusCode::SERVICE_UNAVAILABLE => continue,
            _ => return None, // its lease ended: it died
        }
    }
}

/// A double barrier of 3: one participant dies (its lease is deleted) while the others wait,
/// and the ZooKeeper leader is killed and restarted meanwhile. Nobody passes until three live
/// participants are in; then all three pass, and the dead one never does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nobody_passes_a_double_barrier_early_across_a_death_and_a_server_restart() {
    let mut ensemble = Ensemble::start(3).await;
    let gate = Arc::new(Gate::start(&ensemble.connect_string()).await);
    let leases: Vec<String> = {
        let mut leases = Vec::new();
        for _ in 0..4 {
            leases.push(gate.lease("60s").await);
        }
        leases
    };
    let dying = tokio::spawn(enter_until_through(gate.clone(), "a-dies", leases[0].clone()));
    let b = tokio::spawn(enter_until_through(gate.clone(), "b", leases[1].clone()));
    common::wait_children(&ensemble.connect_string(), "/zkgate/double-barriers/batch", 2).await;

    // "a" dies; the leader of the ensemble is killed and comes back.
    assert_eq!(
        gate.delete(&format!("/v1/leases/{}", leases[0])).await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        within(Duration::from_secs(20), "the dead participant's answer", dying)
            .await
            .expect("task"),
        None
    );
    let leader = ensemble.leader().await.expect("a leader");
    ensemble.servers[leader].kill();
    ensemble.servers[leader].restart(&ensemble.options).expect("restart");
    ensemble.servers[leader]
        .wait_serving(Duration::from_secs(60))
        .await
        .expect("serves again");

    // Two live participants are not three: "c" joins "b" and both wait.
    let c = tokio::spawn(enter_until_through(gate.clone(), "c", leases[2].clone()));
    common::wait_children(&ensemble.connect_string(), "/zkgate/double-barriers/batch", 2).await;
    assert!(!b.is_finished() && !c.is_finished(), "nobody passes with two of three");
    let third_in = Instant::now();
    let d = tokio::spawn(enter_until_through(gate.clone(), "d", leases[3].clone()));
    for (name, task) in [("b", b), ("c", c), ("d", d)] {
        let passed = within(Duration::from_secs(30), "the three to pass", task)
            .await
            .expect("task")
            .unwrap_or_else(|| panic!("{name} did not pass"));
        assert!(
            passed >= third_in,
            "{name} passed before the third live participant entered"
        );
    }
}

/// A lease of `process` with `ttl` that holds `lock`, acquired through it: the lease's id and
/// the grant.
async fn holding(process: &Process, lock: &str, ttl: &str) -> (String, serde_json::Value) {
    let lease = process.lease(ttl).await;
    let (status, held) = process
        .call(
            reqwest::Method::POST,
            &format!("/v1/locks/{lock}/acquire?wait=0"),
            Some(json!({"lease": lease})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{held}");
    (lease, held)
}

/// A release sent again through the lease's keeper after its first attempt, through another
/// instance, deleted the handle (its answer lost on the way): answered as the release it is
/// (`204`), not as a loss, although the keeper learns of the deletion only after the second
/// attempt began (here: it hears nothing from ZooKeeper meanwhile).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_sent_again_through_the_keeper_after_one_done_elsewhere_is_a_release() {
    let zk = zookeeper().await;
    let proxy = Proxy::start(&zk.connect_string()).await;
    let keeper = Arc::new(Gate::start(&proxy.connect_string()).await);
    let other = Gate::start(&zk.connect_string()).await;
    let lease = keeper.lease("30s").await;
    let granted = keeper.acquire("again", &lease, "wait=0").await;
    assert_eq!(granted.status, StatusCode::OK, "{granted:?}");
    let handle = granted.str("handle");
    let path = format!("/v1/locks/again/handles/{handle}");
    // Shorter than the keeper's session timeout (4 s): its session lives on.
    proxy.black_hole(true);
    let first = other.delete(&path).await;
    assert_eq!(first.status, StatusCode::NO_CONTENT, "{first:?}");
    let second = {
        let (keeper, path) = (keeper.clone(), path.clone());
        tokio::spawn(async move { keeper.delete(&path).await })
    };
    let kept = keeper
        .running
        .state
        .locks
        .get("again", &handle)
        .expect("the keeper's handle");
    within(Duration::from_secs(10), "the second release to begin", async {
        while !kept.is_leaving() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    proxy.black_hole(false);
    let second = within(Duration::from_secs(30), "the second release", second)
        .await
        .expect("release");
    assert_eq!(second.status, StatusCode::NO_CONTENT, "{second:?}");
    let state = other.get("/v1/locks/again").await;
    assert!(state.body["holder"].is_null(), "{state:?}");
}

/// The zkgate process of a lock holder freezes (SIGSTOP) past its ZooKeeper session timeout,
/// and the holder's client goes silent too. The other instance takes the frozen one's leases
/// over (its registration went with its session) and ends this one when its TTL has passed:
/// the waiter there is granted with a higher token. When the frozen process resumes, the
/// holder's write is fenced off, and the lease reads as expired through it: it never answers
/// for the lease as its keeper.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_instance_loses_its_silent_lease_to_the_other_and_is_fenced_off() {
    let zk = zookeeper().await;
    let frozen = Process::start(&zk.connect_string()).await;
    let other = Arc::new(Gate::start(&zk.connect_string()).await);
    let register = FencedRegister::new(true);
    let http = common::http_client();
    let (lease, held) = holding(&frozen, "frozen", "2s").await;
    let stale_token = held["fencing_token"].as_i64().expect("token");
    let stale_read = register.read();

    let rival = other.lease("60s").await;
    let waiting = {
        let (other, rival) = (other.clone(), rival.clone());
        tokio::spawn(async move { other.acquire("frozen", &rival, "wait=30s").await })
    };
    common::wait_children(&zk.connect_string(), "/zkgate/locks/frozen", 2).await;
    frozen.pause(true);
    let granted = within(Duration::from_secs(30), "the rival's grant", waiting)
        .await
        .expect("task");
    assert_eq!(granted.status, StatusCode::OK, "{granted:?}");
    assert!(granted.i64("fencing_token") > stale_token);
    let read = register.read();
    assert!(register.write("rival", granted.i64("fencing_token"), read));

    frozen.pause(false);
    assert!(
        !register.write("frozen", stale_token, stale_read),
        "the stale holder is fenced off"
    );
    let told = within(
        Duration::from_secs(30),
        "the frozen instance to learn of the end",
        async {
            loop {
                let reply = http
                    .get(format!("{}/v1/leases/{lease}", frozen.url))
                    .send()
                    .await
                    .expect("GET");
                // 503 while it cannot vouch for its leases (its heartbeat is behind): never a
                // 200 for a lease another instance ended.
                assert_ne!(
                    reply.status(),
                    StatusCode::OK,
                    "the frozen instance answered as the keeper"
                );
                if reply.status() == StatusCode::GONE {
                    return reply.json::<serde_json::Value>().await.expect("JSON");
                }
                tokio::task::yield_now().await;
            }
        },
    )
    .await;
    assert_eq!(told["reason"], "expired", "{told}");
    let tally = register.check().unwrap_or_else(|violation| panic!("{violation}"));
    assert_eq!((tally.accepted, tally.rejected), (1, 1));
}

/// The zkgate process of a lock holder freezes (SIGSTOP), but the holder keeps its lease alive
/// through the other instance: the first keepalives wait for the frozen keeper, then the other
/// takes the lease over and answers them. The lock stays held, with the same token, and the
/// waiter is not granted. When the frozen process resumes it learns of the takeover before it
/// vouches for any lease again, and stops keeping it (no second timer ends it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_instance_s_lease_kept_alive_through_the_other_holds_on() {
    let zk = zookeeper().await;
    let frozen = Process::start(&zk.connect_string()).await;
    let other = Arc::new(Gate::start(&zk.connect_string()).await);
    let (lease, held) = holding(&frozen, "kept", "3s").await;
    let rival = other.lease("60s").await;
    let mut waiting = {
        let (other, rival) = (other.clone(), rival.clone());
        tokio::spawn(async move { other.acquire("kept", &rival, "wait=30s").await })
    };
    common::wait_children(&zk.connect_string(), "/zkgate/locks/kept", 2).await;

    // The holder keeps alive through the other instance, every half second.
    let stop = Arc::new(AtomicBool::new(false));
    let longest = Arc::new(std::sync::Mutex::new(Duration::ZERO));
    let keeper = {
        let (other, lease, stop, longest) = (other.clone(), lease.clone(), stop.clone(), longest.clone());
        tokio::spawn(async move {
            let mut answered = Instant::now();
            while !stop.load(Ordering::SeqCst) {
                let kept = other.post(&format!("/v1/leases/{lease}/keepalive"), None).await;
                if kept.status == StatusCode::OK {
                    let gap = answered.elapsed();
                    let mut longest = longest.lock().unwrap();
                    *longest = (*longest).max(gap);
                    answered = Instant::now();
                }
                tokio::time::sleep(Duration::from_millis(500)).await; // the keepalive period
            }
        })
    };
    frozen.pause(true);
    // Longer than the lease's TTL and the takeover's margin together: were the lease to end,
    // the waiter would be granted meanwhile.
    let waited = tokio::time::timeout(Duration::from_secs(8), &mut waiting).await;
    assert!(
        waited.is_err(),
        "the waiter was granted while the lease was kept alive: {waited:?}"
    );
    assert!(
        other.running.state.leases.peek(&lease).is_ok(),
        "the other instance keeps it"
    );
    frozen.pause(false);
    // Its session expired meanwhile: back, it reads the record of every lease it kept before
    // it keeps leases again (it logs that), and drops this one, which the other keeps now.
    frozen.wait_session(2).await;
    let (status, list) = frozen.call(reqwest::Method::GET, "/v1/leases", None).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let listed = list.as_array().is_some_and(|l| l.iter().any(|l| l["id"] == lease));
    assert!(!listed, "the frozen instance still keeps the lease: {list}");
    let state = other.get("/v1/locks/kept").await;
    assert_eq!(
        state.body["holder"]["fencing_token"], held["fencing_token"],
        "{state:?}"
    );
    stop.store(true, Ordering::SeqCst);
    keeper.await.expect("keeper");
    let longest = *longest.lock().unwrap();
    println!(
        "keepalives through the other instance went unanswered for at most {longest:?} while the keeper was frozen"
    );
    assert!(
        longest < Duration::from_secs(3),
        "the lease could have expired: {longest:?}"
    );
    // Silent now: the lease ends, once, and the waiter is granted.
    let granted = within(Duration::from_secs(30), "the waiter's grant", waiting)
        .await
        .expect("task");
    assert_eq!(granted.status, StatusCode::OK, "{granted:?}");
    assert!(granted.i64("fencing_token") > held["fencing_token"].as_i64().expect("token"));
}

// ---------------------------------------------------------------------------------------
// Leases across instances: 300 clients hold locks, leaderships, memberships and service
// registrations through three zkgate instances, each request to the next instance (a
// round-robin load balancer), while an instance is killed or all three are restarted in turn.

/// The instances a client reaches: their URLs (which change as instances restart), taken in
/// turn.
#[derive(Clone)]
struct Pool {
    urls: Arc<std::sync::RwLock<Vec<String>>>,
    next: Arc<AtomicUsize>,
}

impl Pool {
    fn new(urls: Vec<String>) -> Pool {
        Pool {
            urls: Arc::new(std::sync::RwLock::new(urls)),
            next: Arc::default(),
        }
    }

    fn next(&self) -> String {
        let urls = self.urls.read().unwrap();
        urls[self.next.fetch_add(1, Ordering::Relaxed) % urls.len()].clone()
    }

    fn set(&self, index: usize, url: String) {
        self.urls.write().unwrap()[index] = url;
    }
}

/// What the clients of a scenario saw.
#[derive(Default)]
struct Seen {
    /// Leases that ended under their client (a keepalive answered 404 or 410).
    leases_lost: AtomicUsize,
    /// Requests that failed (no answer, or a 5xx) and were sent again to the next instance.
    failed: AtomicUsize,
    /// Of those, the ones answered with a 5xx (the others reached no instance).
    answered_5xx: AtomicUsize,
    /// The longest a keepalive took to be answered (sent again to the next instance while it
    /// failed), in ms.
    longest_gap_ms: std::sync::atomic::AtomicU64,
    lock_cycles: AtomicUsize,
    /// Answers a client did not expect: (the lease, what happened).
    surprises: std::sync::Mutex<Vec<(String, String)>>,
    /// What each lock client did last, and when (for a failure's message).
    doing: std::sync::Mutex<std::collections::BTreeMap<String, (Instant, String)>>,
}

impl Seen {
    fn surprise(&self, lease: &str, what: String) {
        eprintln!("{lease}: {what}");
        self.surprises.lock().unwrap().push((lease.to_string(), what));
    }

    fn doing(&self, client: &str, what: String) {
        self.doing
            .lock()
            .unwrap()
            .insert(client.to_string(), (Instant::now(), what));
    }
}

/// The TTL of the scenario's leases, and how often their clients keep them alive.
const SCENARIO_TTL: &str = "6s";
const KEEPALIVE_EVERY: Duration = Duration::from_secs(1);

/// One request, to the next instance; again (to the one after) while it fails. `None` once
/// `stop` is set.
async fn send(
    http: &reqwest::Client,
    pool: &Pool,
    seen: &Seen,
    stop: &AtomicBool,
    method: reqwest::Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> Option<(StatusCode, serde_json::Value)> {
    Some(send_again(http, pool, seen, stop, method, path, body).await?.0)
}

/// [send], and whether an earlier attempt may have been carried out (it reached an instance
/// whose answer was lost): a release sent again may then find the handle gone, which is the
/// answer to a release already done.
async fn send_again(
    http: &reqwest::Client,
    pool: &Pool,
    seen: &Seen,
    stop: &AtomicBool,
    method: reqwest::Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> Option<((StatusCode, serde_json::Value), bool)> {
    let mut maybe_done = false;
    loop {
        if stop.load(Ordering::SeqCst) {
            return None;
        }
        let mut request = http
            .request(method.clone(), format!("{}{path}", pool.next()))
            .timeout(Duration::from_secs(30));
        if let Some(body) = &body {
            request = request.json(body);
        }
        match request.send().await {
            Ok(answer) if !answer.status().is_server_error() => {
                let status = answer.status();
                let body = answer.json().await.unwrap_or(serde_json::Value::Null);
                return Some(((status, body), maybe_done));
            }
            answered => {
                match &answered {
                    Ok(_) => {
                        seen.answered_5xx.fetch_add(1, Ordering::Relaxed);
                    }
                    // Sent, and the connection went before the answer: it may have been done.
                    Err(error) if !error.is_connect() => maybe_done = true,
                    Err(_) => {}
                }
                seen.failed.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await; // a client's backoff before it retries
            }
        }
    }
}

/// A lease made through the pool and kept alive through it until `stop`.
async fn kept_lease(http: reqwest::Client, pool: Pool, seen: Arc<Seen>, stop: Arc<AtomicBool>) -> Option<String> {
    let body = json!({"ttl": SCENARIO_TTL});
    let (status, lease) = send(
        &http,
        &pool,
        &seen,
        &stop,
        reqwest::Method::POST,
        "/v1/leases",
        Some(body),
    )
    .await?;
    assert_eq!(status, StatusCode::CREATED, "{lease}");
    let id = lease["id"].as_str().expect("id").to_string();
    let keepalive = format!("/v1/leases/{id}/keepalive");
    let lease_id = id.clone();
    tokio::spawn(async move {
        let id = lease_id;
        loop {
            let sent = Instant::now();
            let Some((status, body)) = send(&http, &pool, &seen, &stop, reqwest::Method::POST, &keepalive, None).await
            else {
                return;
            };
            if status != StatusCode::OK {
                seen.surprise(&id, format!("keepalive: {status} {body}"));
                seen.leases_lost.fetch_add(1, Ordering::Relaxed);
                return;
            }
            seen.longest_gap_ms
                .fetch_max(sent.elapsed().as_millis() as u64, Ordering::Relaxed);
            tokio::time::sleep(KEEPALIVE_EVERY).await; // the keepalive period
        }
    });
    Some(id)
}

/// Everything the scenario's clients hold, to check at the end.
struct Scenario {
    pool: Pool,
    http: reqwest::Client,
    seen: Arc<Seen>,
    stop: Arc<AtomicBool>,
    stop_keeping: Arc<AtomicBool>,
    registers: Arc<Vec<FencedRegister>>,
    histories: Arc<Vec<History>>,
    /// Each election's leader's term before the fault.
    terms: Vec<i64>,
    /// Every candidate, which must survive: (path to read it, what is expected there).
    candidates: Vec<(String, String)>,
    /// Queue claims taken through the instances before the fault, to acknowledge after it.
    claims: Vec<String>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

const LOCKS: usize = 9;
const LOCK_CLIENTS: usize = 90;
const ELECTIONS: usize = 6;
const CANDIDATES: usize = 60;
const GROUPS: usize = 3;
const MEMBERS: usize = 75;
const SERVICES: usize = 3;
const REGISTRATIONS: usize = 75;
const CLAIMS: usize = 30;

/// Starts 300 clients through `pool`: lock clients cycling (acquire, fenced write, release),
/// candidates, members and service instances, each on a lease of its own kept alive through
/// the pool; returns once every holding is in place and each election has its leader.
async fn start_clients(pool: Pool) -> Scenario {
    let http = common::http_builder()
        .pool_max_idle_per_host(16)
        .build()
        .expect("client");
    let seen = Arc::new(Seen::default());
    let stop = Arc::new(AtomicBool::new(false));
    let registers: Arc<Vec<FencedRegister>> = Arc::new((0..LOCKS).map(|_| FencedRegister::new(true)).collect());
    let histories: Arc<Vec<History>> = Arc::new((0..LOCKS).map(|_| History::default()).collect());
    let mut tasks = Vec::new();
    let mut candidates = Vec::new();
    // Keepalives go on until the workers have stopped (a lease must not end under them).
    let stop_keeping = Arc::new(AtomicBool::new(false));
    let lease = || kept_lease(http.clone(), pool.clone(), seen.clone(), stop_keeping.clone());
    for i in 0..LOCK_CLIENTS {
        let lease = lease().await.expect("a lease");
        let (http, pool, seen, stop) = (http.clone(), pool.clone(), seen.clone(), stop.clone());
        let (registers, histories) = (registers.clone(), histories.clone());
        tasks.push(tokio::spawn(async move {
            let lock = i % LOCKS;
            let name = format!("client-{i}");
            let acquire = format!("/v1/locks/shared-{lock}/acquire?wait=5s&keep_queued=true");
            let body = json!({"lease": lease});
            loop {
                seen.doing(&name, format!("acquire with {lease}"));
                let Some((status, granted)) = send(
                    &http,
                    &pool,
                    &seen,
                    &stop,
                    reqwest::Method::POST,
                    &acquire,
                    Some(body.clone()),
                )
                .await
                else {
                    break;
                };
                seen.doing(&name, format!("acquire with {lease} answered {status} {granted}"));
                if status == StatusCode::ACCEPTED {
                    continue; // still queued: wait on
                }
                if status != StatusCode::OK {
                    seen.surprise(&lease, format!("acquire: {status} {granted}"));
                    return;
                }
                let token = granted["fencing_token"].as_i64().expect("token");
                histories[lock].record(&name, token, LockEvent::Granted);
                let read = registers[lock].read();
                tokio::time::sleep(Duration::from_millis(20)).await; // the critical section's work
                registers[lock].write(&name, token, read);
                histories[lock].record(&name, token, LockEvent::Released);
                let release = format!(
                    "/v1/locks/shared-{lock}/handles/{}",
                    granted["handle"].as_str().expect("handle")
                );
                seen.doing(&name, format!("release {release}"));
                let Some(((status, body), again)) =
                    send_again(&http, &pool, &seen, &stop, reqwest::Method::DELETE, &release, None).await
                else {
                    return;
                };
                seen.doing(&name, format!("release {release} answered {status}"));
                // Sent again after an answer was lost: the first may have released it.
                let done_before = again && status == StatusCode::NOT_FOUND;
                if status != StatusCode::NO_CONTENT && !done_before {
                    seen.surprise(&lease, format!("release: {status} {body}"));
                    return;
                }
                seen.lock_cycles.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for i in 0..CANDIDATES {
        let lease = lease().await.expect("a lease");
        let election = format!("leading-{}", i % ELECTIONS);
        let body = json!({"lease": lease, "value": i});
        let path = format!("/v1/elections/{election}/campaign?wait=0&keep_queued=true");
        let (status, joined) = send(&http, &pool, &seen, &stop, reqwest::Method::POST, &path, Some(body))
            .await
            .expect("campaign");
        assert!(matches!(status, StatusCode::OK | StatusCode::ACCEPTED), "{joined}");
        let handle = joined["handle"].as_str().expect("handle");
        candidates.push((
            format!("/v1/elections/{election}/candidates/{handle}"),
            "candidate".to_string(),
        ));
    }
    for i in 0..MEMBERS {
        let lease = lease().await.expect("a lease");
        let path = format!("/v1/groups/members-{}/members/m{i}", i % GROUPS);
        let (status, joined) = send(
            &http,
            &pool,
            &seen,
            &stop,
            reqwest::Method::PUT,
            &path,
            Some(json!({"lease": lease, "data": i})),
        )
        .await
        .expect("join");
        assert_eq!(status, StatusCode::CREATED, "{joined}");
    }
    for i in 0..REGISTRATIONS {
        let lease = lease().await.expect("a lease");
        let path = format!("/v1/services/service-{}/instances/s{i}", i % SERVICES);
        let body = json!({"lease": lease, "address": "10.0.0.1", "port": 8000 + i});
        let (status, registered) = send(&http, &pool, &seen, &stop, reqwest::Method::PUT, &path, Some(body))
            .await
            .expect("register");
        assert_eq!(status, StatusCode::CREATED, "{registered}");
    }
    let mut claims = Vec::new();
    for i in 0..CLAIMS {
        let put = json!({"n": i});
        let (status, body) = send(
            &http,
            &pool,
            &seen,
            &stop,
            reqwest::Method::POST,
            "/v1/queues/consumed/items",
            Some(put),
        )
        .await
        .expect("put");
        assert_eq!(status, StatusCode::CREATED, "{body}");
        let take = "/v1/queues/consumed/take?ack_deadline=60s";
        let (status, item) = send(&http, &pool, &seen, &stop, reqwest::Method::POST, take, None)
            .await
            .expect("take");
        assert_eq!(status, StatusCode::OK, "{item}");
        claims.push(item["claim"].as_str().expect("claim").to_string());
    }
    let mut terms = Vec::new();
    for e in 0..ELECTIONS {
        let (_, state) = send(
            &http,
            &pool,
            &seen,
            &stop,
            reqwest::Method::GET,
            &format!("/v1/elections/leading-{e}"),
            None,
        )
        .await
        .expect("election");
        terms.push(state["leader"]["term"].as_i64().expect("a leader"));
    }
    Scenario {
        pool,
        http,
        seen,
        stop,
        stop_keeping,
        registers,
        histories,
        terms,
        candidates,
        claims,
        tasks,
    }
}

impl Scenario {
    async fn get(&self, path: &str) -> (StatusCode, serde_json::Value) {
        let never = AtomicBool::new(false);
        send(
            &self.http,
            &self.pool,
            &self.seen,
            &never,
            reqwest::Method::GET,
            path,
            None,
        )
        .await
        .expect("a reply")
    }

    /// Stops the clients and checks what they hold: no lease lost, every lock's history one
    /// holder at a time in token order with no write lost, every leader the same as before,
    /// every candidate, member and service instance in place. Prints the figures.
    /// Fails, with what the instances logged about the leases concerned, if a client was
    /// surprised.
    fn explain_surprises(&self, what: &str, processes: &[&Process]) {
        let surprises = self.seen.surprises.lock().unwrap().clone();
        if surprises.is_empty() {
            return;
        }
        for process in processes {
            for line in process.log() {
                if surprises.iter().any(|(lease, _)| line.contains(lease.as_str())) {
                    eprintln!("{}: {line}", process.url);
                }
            }
        }
        keep_logs(processes);
        panic!("{what}: clients were surprised: {surprises:?}");
    }

    async fn check(mut self, what: &str, processes: &[&Process]) {
        let cycles_before = self.seen.lock_cycles.load(Ordering::Relaxed);
        let cycled = tokio::time::timeout(Duration::from_secs(30), async {
            while self.seen.lock_cycles.load(Ordering::Relaxed) < cycles_before + LOCKS
                && self.seen.surprises.lock().unwrap().is_empty()
            {
                tokio::task::yield_now().await;
            }
        })
        .await;
        self.explain_surprises(what, processes);
        if cycled.is_err() {
            for lock in 0..LOCKS {
                let (status, state) = self.get(&format!("/v1/locks/shared-{lock}")).await;
                eprintln!("shared-{lock}: {status} {state}");
            }
            for (client, (at, what)) in self.seen.doing.lock().unwrap().iter() {
                eprintln!("{client}, {:?} ago: {what}", at.elapsed());
            }
            keep_logs(processes);
            panic!(
                "{what}: {} lock cycles in the 30 s after the fault (at least {LOCKS} expected)",
                self.seen.lock_cycles.load(Ordering::Relaxed) - cycles_before
            );
        }
        for e in 0..ELECTIONS {
            let (_, state) = self.get(&format!("/v1/elections/leading-{e}")).await;
            assert_eq!(
                state["leader"]["term"].as_i64(),
                Some(self.terms[e]),
                "election {e}: {state}"
            );
        }
        for (path, _) in &self.candidates {
            let (status, candidate) = self.get(path).await;
            assert_eq!(status, StatusCode::OK, "{path}: {candidate}");
            assert!(
                matches!(candidate["state"].as_str(), Some("held" | "waiting" | "pending")),
                "{path}: {candidate}"
            );
        }
        let mut members = 0;
        for g in 0..GROUPS {
            let (_, group) = self.get(&format!("/v1/groups/members-{g}")).await;
            members += group["members"].as_array().map_or(0, Vec::len);
        }
        assert_eq!(members, MEMBERS, "every member is in");
        let mut instances = 0;
        for s in 0..SERVICES {
            let (_, service) = self.get(&format!("/v1/services/service-{s}")).await;
            instances += service["instances"].as_array().map_or(0, Vec::len);
        }
        assert_eq!(instances, REGISTRATIONS, "every service instance is registered");
        // Claims made through every instance, the one gone included: none was given back with
        // it, each is acknowledged through whichever instance answers.
        let (_, queue) = self.get("/v1/queues/consumed").await;
        assert_eq!(queue["in_flight"], CLAIMS, "{queue}");
        for claim in &self.claims {
            let never = AtomicBool::new(false);
            let ack = format!("/v1/queues/consumed/claims/{claim}/ack");
            let (status, body) = send(
                &self.http,
                &self.pool,
                &self.seen,
                &never,
                reqwest::Method::POST,
                &ack,
                None,
            )
            .await
            .expect("a reply");
            assert_eq!(status, StatusCode::NO_CONTENT, "{claim}: {body}");
        }
        let (_, queue) = self.get("/v1/queues/consumed").await;
        assert_eq!(
            (queue["depth"].as_u64(), queue["in_flight"].as_u64()),
            (Some(0), Some(0)),
            "{queue}"
        );
        self.stop.store(true, Ordering::SeqCst);
        for task in std::mem::take(&mut self.tasks) {
            within(Duration::from_secs(60), "the clients to stop", task)
                .await
                .expect("client");
        }
        self.stop_keeping.store(true, Ordering::SeqCst);
        self.explain_surprises(what, processes);
        let mut accepted = 0;
        for (register, history) in self.registers.iter().zip(self.histories.iter()) {
            let tally = register.check().unwrap_or_else(|violation| panic!("{violation}"));
            let grants = history.check().unwrap_or_else(|violation| panic!("{violation}"));
            assert_eq!(grants, tally.accepted, "every grant wrote once");
            accepted += tally.accepted;
        }
        let lost = self.seen.leases_lost.load(Ordering::Relaxed);
        println!(
            "{what}: 300 leases, {lost} lost; {accepted} fenced lock cycles, 0 overlaps; {CLAIMS} claims acknowledged after the fault; {} requests failed and were sent again ({} of them answered 5xx, the others reached no instance); longest wait for a keepalive's answer {} ms",
            self.seen.failed.load(Ordering::Relaxed),
            self.seen.answered_5xx.load(Ordering::Relaxed),
            self.seen.longest_gap_ms.load(Ordering::Relaxed),
        );
        assert_eq!(lost, 0, "no lease lost");
    }
}

/// `ZKGATE_TEST_LOG_DIR=<dir>`: every process's whole log there, to read at leisure.
fn keep_logs(processes: &[&Process]) {
    if let Some(dir) = std::env::var_os("ZKGATE_TEST_LOG_DIR") {
        for (i, process) in processes.iter().enumerate() {
            let path = std::path::Path::new(&dir).join(format!("zkgate-{i}.log"));
            let _ = std::fs::write(&path, process.log().join("\n"));
            eprintln!("{}: its log is in {}", process.url, path.display());
        }
    }
}

/// A 3-server ensemble (and its connect string), three zkgate processes on it, and the 300
/// clients of [start_clients] through all three.
async fn three_instances() -> (Ensemble, String, Vec<Process>, Scenario) {
    let ensemble = Ensemble::start(3).await;
    let connect = ensemble.connect_string();
    let mut processes = Vec::new();
    for _ in 0..3 {
        processes.push(Process::start(&connect).await);
    }
    let pool = Pool::new(processes.iter().map(|p| p.url.clone()).collect());
    let scenario = start_clients(pool).await;
    (ensemble, connect, processes, scenario)
}

/// `kill -9` of one of three instances while 300 clients hold locks, leaderships, memberships
/// and service registrations through all three and keep alive through any: the survivors
/// take its leases over, nothing is lost, every lock stays exclusive and grants in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_9_of_one_of_three_instances_loses_no_lease() {
    let (_ensemble, _, mut processes, scenario) = three_instances().await;
    let killed = Instant::now();
    processes[0].kill().await;
    // Long enough for its session to expire (2 s) and its leases to be taken over.
    tokio::time::sleep(Duration::from_secs(6)).await; // the scenario's length, not a synchronisation
    let what = format!("kill -9 of one of three instances ({:?} ago)", killed.elapsed());
    scenario.check(&what, &processes.iter().collect::<Vec<_>>()).await;
}

/// Each of three instances in turn gets SIGTERM, exits and is started again, while 300 clients
/// hold and keep alive through any: every lease lives on, handed over at each stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_three_instances_loses_no_lease() {
    let (_ensemble, connect, mut processes, scenario) = three_instances().await;
    let pool = scenario.pool.clone();
    // The stopped processes' logs are kept for a surprise's explanation.
    let mut stopped = Vec::new();
    for (i, process) in processes.iter_mut().enumerate() {
        process.terminate();
        let status = within(Duration::from_secs(30), "the instance to exit", process.child.wait())
            .await
            .expect("exit");
        assert!(status.success(), "{status:?}");
        stopped.push(std::mem::replace(process, Process::start(&connect).await));
        pool.set(i, process.url.clone());
        tokio::time::sleep(Duration::from_secs(2)).await; // traffic between restarts, not a synchronisation
    }
    scenario
        .check(
            "a rolling restart of three instances",
            &stopped.iter().chain(&processes).collect::<Vec<_>>(),
        )
        .await;
}

/// Every instance is killed; one comes back after twice the TTL. Before it is ready it ends
/// every lease whose time passed meanwhile (and grants their waiters), and keeps the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_instance_killed_and_one_back_ends_what_expired_before_it_serves() {
    let zk = zookeeper().await;
    let connect = zk.connect_string();
    let mut a = Process::start(&connect).await;
    let mut b = Process::start(&connect).await;
    let expiring = a.lease("4s").await;
    let (status, held) = a
        .call(
            reqwest::Method::POST,
            "/v1/locks/outage/acquire?wait=0",
            Some(json!({"lease": expiring})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{held}");
    let lasting = b.lease("60s").await;
    let (status, queued) = b
        .call(
            reqwest::Method::POST,
            "/v1/locks/outage/acquire?wait=0&keep_queued=true",
            Some(json!({"lease": lasting})),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{queued}");
    // And a queue claim whose deadline passes during the outage.
    let (status, put) = a
        .call(reqwest::Method::POST, "/v1/queues/outage/items", Some(json!({"n": 1})))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{put}");
    let (status, claimed) = a
        .call(reqwest::Method::POST, "/v1/queues/outage/take?ack_deadline=4s", None)
        .await;
    assert_eq!(status, StatusCode::OK, "{claimed}");
    a.kill().await;
    b.kill().await;
    // Twice the TTL with no instance: past its TTL and the takeover's margin (4 s + 3 s).
    tokio::time::sleep(Duration::from_secs(8)).await; // the outage, not a synchronisation
    let mut c = Process::start(&connect).await;
    // Ready ("serving") means the reaper's first pass is done: the expired lease has ended,
    // its lock passed to the waiter, whose lease lives on.
    let (status, state) = c.call(reqwest::Method::GET, "/v1/locks/outage", None).await;
    assert_eq!(status, StatusCode::OK, "{state}");
    assert_eq!(state["holder"]["lease"], json!(lasting), "{state}; {}", c.diagnose());
    assert!(state["holder"]["fencing_token"].as_i64() > held["fencing_token"].as_i64());
    let (status, gone) = c
        .call(reqwest::Method::GET, &format!("/v1/leases/{expiring}"), None)
        .await;
    assert_eq!(status, StatusCode::GONE, "{gone}");
    assert_eq!(gone["reason"], "expired", "{gone}");
    let (status, kept) = c
        .call(reqwest::Method::POST, &format!("/v1/leases/{lasting}/keepalive"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{kept}");
    let handle = queued["handle"].as_str().expect("handle");
    let (_, view) = c
        .call(
            reqwest::Method::GET,
            &format!("/v1/locks/outage/handles/{handle}?wait=5s"),
            None,
        )
        .await;
    assert_eq!(view["state"], "held", "{view}");
    // The claim was given back before it served: its item is there to take at once.
    let (status, again) = c
        .call(reqwest::Method::POST, "/v1/queues/outage/take?wait=0", None)
        .await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(
        (&again["item"], &again["deliveries"]),
        (&claimed["item"], &json!(2)),
        "{again}"
    );
}

/// An instance is cut off from ZooKeeper (a black hole) while its client keeps its lease
/// alive through the other: the other takes the lease over (the cut-off one cannot vouch for
/// it), the lock stays held; when the connection heals, the cut-off instance drops the lease
/// before it keeps leases again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_cut_off_from_zookeeper_hands_its_lease_to_the_other() {
    let zk = zookeeper().await;
    let proxy = Proxy::start(&zk.connect_string()).await;
    let cut = Process::start(&proxy.connect_string()).await;
    let other = Arc::new(Gate::start(&zk.connect_string()).await);
    let (lease, held) = holding(&cut, "cut", "4s").await;
    let pool = Pool::new(vec![cut.url.clone(), other.url.clone()]);
    let (seen, stop) = (Arc::new(Seen::default()), Arc::new(AtomicBool::new(false)));
    let keeper = {
        let (pool, seen, stop, lease) = (pool.clone(), seen.clone(), stop.clone(), lease.clone());
        tokio::spawn(async move {
            let http = common::http_client();
            let path = format!("/v1/leases/{lease}/keepalive");
            loop {
                let sent = Instant::now();
                let Some((status, _)) = send(&http, &pool, &seen, &stop, reqwest::Method::POST, &path, None).await
                else {
                    return;
                };
                if status != StatusCode::OK {
                    seen.leases_lost.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                seen.longest_gap_ms
                    .fetch_max(sent.elapsed().as_millis() as u64, Ordering::Relaxed);
                tokio::time::sleep(KEEPALIVE_EVERY).await; // the keepalive period
            }
        })
    };
    proxy.black_hole(true);
    // Past the session timeout (2 s) and a TTL: the lease must have moved to live on.
    tokio::time::sleep(Duration::from_secs(6)).await; // the fault's length, not a synchronisation
    assert!(
        other.running.state.leases.peek(&lease).is_ok(),
        "the other instance keeps the lease"
    );
    let state = other.get("/v1/locks/cut").await;
    assert_eq!(
        state.body["holder"]["fencing_token"], held["fencing_token"],
        "{state:?}"
    );
    proxy.black_hole(false);
    cut.wait_session(2).await;
    let (_, list) = cut.call(reqwest::Method::GET, "/v1/leases", None).await;
    let listed = list.as_array().is_some_and(|l| l.iter().any(|l| l["id"] == lease));
    assert!(!listed, "the cut-off instance still keeps the lease: {list}");
    stop.store(true, Ordering::SeqCst);
    keeper.await.expect("keeper");
    assert_eq!(seen.leases_lost.load(Ordering::Relaxed), 0, "the lease lived on");
    println!(
        "black hole: a keepalive took at most {} ms to be answered; {} requests sent again",
        seen.longest_gap_ms.load(Ordering::Relaxed),
        seen.failed.load(Ordering::Relaxed)
    );
}
