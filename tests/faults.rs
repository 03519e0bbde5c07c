//! The fault suite's lock scenarios: locks under contention on a 3-server ensemble while its
//! leader is killed and restarted, with clients spread over two zkgate instances; a holder
//! paused past its lease; and the checker shown to catch two holders when fencing is off.
//!
//! Each client's critical section is a read-modify-write of a [FencedRegister] with its
//! fencing token: mutual exclusion plus fencing means no increment is ever lost. The run's
//! length is `ZKGATE_FAULT_SECONDS` (default: a bounded run for CI); the figures are printed
//! for docs/RELIABILITY.md.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::checker::FencedRegister;
use common::{Ensemble, Gate, test_config, within, zookeeper};
use reqwest::StatusCode;
use serde_json::json;

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
                    tokio::time::sleep(Duration::from_millis(100)).await;
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
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        }
        let token = granted.i64("fencing_token");
        let read = register.read();
        tokio::task::yield_now().await;
        register.write(&name, token, read);
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_stay_exclusive_while_the_zookeeper_leader_is_killed_and_restarted() {
    locks_under(Fault::KillLeader).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_stay_exclusive_while_a_follower_is_paused() {
    locks_under(Fault::PauseFollower).await;
}

async fn locks_under(fault: Fault) {
    let mut ensemble = Ensemble::start(3).await;
    let connect = ensemble.connect_string();
    let gates = [
        Arc::new(Gate::start(&connect).await),
        Arc::new(Gate::start(&connect).await),
    ];
    let register = Arc::new(FencedRegister::new(true));
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(Counts::default());
    let clients: Vec<_> = (0..6)
        .map(|i| {
            tokio::spawn(client(
                format!("client-{i}"),
                gates[i % 2].clone(),
                register.clone(),
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
