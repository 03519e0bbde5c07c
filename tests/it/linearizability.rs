//! Reads are linearizable across instances: many clients write, compare-and-set and read kv
//! keys, take and release locks and read their holders, through two zkgate instances on
//! different servers of a 3-server ensemble; every operation's call, return and result is
//! recorded and the history is checked against a register (and a lock holder) per key
//! (`common::linearizability`, Wing & Gong's search as Porcupine does it).
//!
//! In the default mode the history is linearizable without faults, across a kill of the
//! ZooKeeper leader and across a pause of the follower that serves one instance. In the
//! `sequential` mode the same workload is caught reading stale values (a test asserts the
//! checker finds it), and the checker's own tests show it refuses what it must.

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::linearizability::{Call, Op, check};
use common::{Ensemble, Gate, test_config, within};
use reqwest::StatusCode;
use serde_json::json;

// ---------------------------------------------------------------------------------------
// The checker, on histories written by hand.

fn call(op: Op, start: u64, end: u64) -> Call {
    Call {
        op,
        start,
        end: Some(end),
        by: "t".into(),
    }
}

#[test]
fn the_checker_accepts_a_read_concurrent_with_a_write_seeing_either_value() {
    for seen in [Some(1), Some(2)] {
        let history = [
            call(Op::Write(1), 0, 10),
            call(Op::Write(2), 20, 40),
            call(Op::Read(seen), 25, 35),
            call(Op::Read(Some(2)), 50, 60),
        ];
        assert!(check(&history, None).is_ok(), "{seen:?}");
    }
}

#[test]
fn the_checker_refuses_a_read_older_than_a_write_acknowledged_before_it_began() {
    let history = [
        call(Op::Write(1), 0, 10),
        call(Op::Write(2), 20, 30),
        call(Op::Read(Some(1)), 40, 50),
    ];
    let violation = check(&history, None).expect_err("a stale read");
    assert_eq!(violation.stuck.op, Op::Read(Some(1)), "{violation}");
    // And a read that never saw a write made before it began.
    assert!(check(&[call(Op::Write(1), 0, 10), call(Op::Read(None), 20, 30)], None).is_err());
}

#[test]
fn the_checker_follows_compare_and_set_and_unknown_outcomes() {
    // A CAS from 1 applied, another from 1 refused after it: fine.
    let ok = [
        call(Op::Write(1), 0, 10),
        call(
            Op::Cas {
                from: 1,
                to: 2,
                applied: Some(true),
            },
            20,
            30,
        ),
        call(
            Op::Cas {
                from: 1,
                to: 3,
                applied: Some(false),
            },
            40,
            50,
        ),
        call(Op::Read(Some(2)), 60, 70),
    ];
    assert!(check(&ok, None).is_ok());
    // Two CAS from the same value both applied, one after the other: impossible.
    let lost_update = [
        call(Op::Write(1), 0, 10),
        call(
            Op::Cas {
                from: 1,
                to: 2,
                applied: Some(true),
            },
            20,
            30,
        ),
        call(
            Op::Cas {
                from: 1,
                to: 3,
                applied: Some(true),
            },
            40,
            50,
        ),
    ];
    assert!(check(&lost_update, None).is_err());
    // A write whose answer never came may have happened (a later read sees it) or not.
    for seen in [Some(1), Some(2)] {
        let unknown = [
            call(Op::Write(1), 0, 10),
            Call {
                op: Op::Write(2),
                start: 20,
                end: None,
                by: "t".into(),
            },
            call(Op::Read(seen), 40, 50),
        ];
        assert!(check(&unknown, None).is_ok(), "{seen:?}");
    }
}

#[test]
fn the_checker_refuses_two_holders_and_a_holder_read_behind_a_release() {
    let two_holders = [call(Op::Acquire(1), 0, 10), call(Op::Acquire(2), 20, 30)];
    assert!(check(&two_holders, None).is_err());
    let handed_over = [
        call(Op::Acquire(1), 0, 10),
        call(Op::Release(1), 20, 30),
        call(Op::Acquire(2), 15, 35),
        call(Op::Holder(Some(2)), 40, 50),
    ];
    assert!(check(&handed_over, None).is_ok());
    let behind = [
        call(Op::Acquire(1), 0, 10),
        call(Op::Release(1), 20, 30),
        call(Op::Acquire(2), 15, 35),
        call(Op::Holder(Some(1)), 40, 50),
    ];
    assert!(check(&behind, None).is_err());
}

// ---------------------------------------------------------------------------------------
// The workload.

/// Keys and locks per run: few, so that clients contend.
const KEYS: u64 = 3;
const LOCKS: u64 = 2;
const CLIENTS: u64 = 6;

struct Recorder {
    origin: Instant,
    calls: Mutex<BTreeMap<String, Vec<Call>>>,
    /// Lock histories with an operation whose outcome is unknown (a lost lease, a 503): a
    /// holder that may or may not hold cannot be checked, and is counted instead.
    tainted: Mutex<Vec<String>>,
    /// Which client holds each lease.
    leases: Mutex<HashMap<String, u64>>,
    next_value: AtomicU64,
    /// How many reads of keys have been answered (a run goes on until it has enough).
    reads: tokio::sync::watch::Sender<usize>,
}

impl Recorder {
    fn new() -> Recorder {
        Recorder {
            origin: Instant::now(),
            calls: Mutex::default(),
            tainted: Mutex::default(),
            leases: Mutex::default(),
            next_value: AtomicU64::new(1),
            reads: tokio::sync::watch::Sender::new(0),
        }
    }

    fn now(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    fn record(&self, key: &str, op: Op, start: u64, end: Option<u64>, by: &str) {
        if matches!(op, Op::Read(_)) && end.is_some() {
            self.reads.send_modify(|reads| *reads += 1);
        }
        self.calls
            .lock()
            .unwrap()
            .entry(key.to_string())
            .or_default()
            .push(Call {
                op,
                start,
                end,
                by: by.to_string(),
            });
    }

    fn taint(&self, lock: &str) {
        self.tainted.lock().unwrap().push(lock.to_string());
    }
}

/// A read's `?consistency=`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Default,
    Sequential,
}

impl Mode {
    fn query(self) -> &'static str {
        match self {
            Mode::Default => "",
            Mode::Sequential => "?consistency=sequential",
        }
    }
}

/// xorshift: enough randomness for a workload, no dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

struct Client {
    id: u64,
    gates: [Arc<Gate>; 2],
    mode: Mode,
    recorder: Arc<Recorder>,
    rng: Rng,
    /// Per key: the last value read and its ETag, for a compare-and-set.
    last_read: HashMap<u64, (u64, String)>,
    lease: Option<String>,
}

impl Client {
    fn by(&self, gate: usize) -> String {
        format!("c{}@{}", self.id, ["A", "B"][gate])
    }

    /// The client's own instance, and the other one.
    fn home(&self) -> usize {
        (self.id % 2) as usize
    }

    async fn put(&mut self, gate: usize, key: u64, if_match: Option<(u64, String)>) {
        let value = self.recorder.next_value.fetch_add(1, Ordering::SeqCst);
        let path = format!("lin/k{key}");
        let mut request = self.gates[gate]
            .http
            .put(format!("{}/v1/kv/{path}", self.gates[gate].url))
            .header("content-type", "text/plain")
            .timeout(Duration::from_secs(30))
            .body(value.to_string());
        if let Some((_, tag)) = &if_match {
            request = request.header("if-match", tag);
        }
        let start = self.recorder.now();
        let status = request.send().await.map(|r| r.status()).ok();
        let end = self.recorder.now();
        let by = self.by(gate);
        let op = |applied| match &if_match {
            Some((from, _)) => Op::Cas {
                from: *from,
                to: value,
                applied,
            },
            None => Op::Write(value),
        };
        match status {
            Some(s) if s.is_success() => self.recorder.record(&path, op(Some(true)), start, Some(end), &by),
            Some(StatusCode::PRECONDITION_FAILED) => {
                self.recorder.record(&path, op(Some(false)), start, Some(end), &by)
            }
            // Unknown: it may have been applied.
            _ => self.recorder.record(&path, op(None), start, None, &by),
        }
    }

    async fn get(&mut self, gate: usize, key: u64) {
        let path = format!("lin/k{key}");
        let request = self.gates[gate]
            .http
            .get(format!("{}/v1/kv/{path}{}", self.gates[gate].url, self.mode.query()))
            .timeout(Duration::from_secs(30));
        let start = self.recorder.now();
        let Ok(response) = request.send().await else { return };
        let status = response.status();
        let tag = response
            .headers()
            .get("etag")
            .and_then(|t| t.to_str().ok())
            .map(str::to_string);
        let Ok(body) = response.text().await else { return };
        let end = self.recorder.now();
        let by = self.by(gate);
        match status {
            StatusCode::OK => {
                let value: u64 = body.trim().parse().expect("a value this test wrote");
                self.recorder
                    .record(&path, Op::Read(Some(value)), start, Some(end), &by);
                if let Some(tag) = tag {
                    self.last_read.insert(key, (value, tag));
                }
            }
            StatusCode::NOT_FOUND => self.recorder.record(&path, Op::Read(None), start, Some(end), &by),
            // A read that failed says nothing.
            _ => {}
        }
    }

    async fn holder(&mut self, gate: usize, lock: u64) {
        let name = format!("lin-l{lock}");
        let start = self.recorder.now();
        let reply = self.gates[gate]
            .get(&format!("/v1/locks/{name}{}", self.mode.query()))
            .await;
        let end = self.recorder.now();
        if reply.status != StatusCode::OK {
            return;
        }
        let holder = reply.body["holder"]["lease"].as_str().map(|lease| {
            self.recorder
                .leases
                .lock()
                .unwrap()
                .get(lease)
                .copied()
                .unwrap_or(u64::MAX)
        });
        let by = self.by(gate);
        self.recorder.record(&name, Op::Holder(holder), start, Some(end), &by);
    }

    async fn lease(&mut self) -> Option<String> {
        if self.lease.is_none() {
            let home = self.home();
            let created = self.gates[home].post("/v1/leases", Some(json!({"ttl": "60s"}))).await;
            if created.status != StatusCode::CREATED {
                return None;
            }
            let id = created.str("id");
            self.recorder.leases.lock().unwrap().insert(id.clone(), self.id);
            self.lease = Some(id);
        }
        self.lease.clone()
    }

    /// Takes the lock through the client's instance, reads the holder through the other,
    /// releases through either, reads the holder again through the other.
    async fn lock_cycle(&mut self, lock: u64) {
        let Some(lease) = self.lease().await else { return };
        let name = format!("lin-l{lock}");
        let (home, other) = (self.home(), 1 - self.home());
        let start = self.recorder.now();
        let granted = self.gates[home]
            .post(
                &format!("/v1/locks/{name}/acquire?wait=20s"),
                Some(json!({"lease": lease})),
            )
            .await;
        let end = self.recorder.now();
        if granted.status != StatusCode::OK {
            self.recorder.taint(&name);
            if matches!(granted.status, StatusCode::GONE | StatusCode::NOT_FOUND) {
                self.lease = None;
            }
            return;
        }
        let by = self.by(home);
        self.recorder.record(&name, Op::Acquire(self.id), start, Some(end), &by);
        self.holder(other, lock).await;
        let handle = granted.str("handle");
        let through = self.rng.below(2) as usize;
        let start = self.recorder.now();
        let released = self.gates[through]
            .delete(&format!("/v1/locks/{name}/handles/{handle}"))
            .await;
        let end = self.recorder.now();
        let by = self.by(through);
        if released.status == StatusCode::NO_CONTENT {
            self.recorder.record(&name, Op::Release(self.id), start, Some(end), &by);
        } else {
            self.recorder.taint(&name);
            self.lease = None;
        }
        self.holder(other, lock).await;
    }

    async fn run(mut self, stop: Arc<AtomicBool>) {
        while !stop.load(Ordering::SeqCst) {
            let (home, other) = (self.home(), 1 - self.home());
            let key = self.rng.below(KEYS);
            match self.rng.below(10) {
                // Write through one instance, read at once through the other: the read a
                // load balancer makes of a value its client has just written.
                0..=2 => {
                    self.put(home, key, None).await;
                    self.get(other, key).await;
                }
                3..=4 => {
                    let through = self.rng.below(2) as usize;
                    self.get(through, key).await;
                }
                5..=6 => {
                    self.get(home, key).await;
                    if let Some(read) = self.last_read.get(&key).cloned() {
                        let through = self.rng.below(2) as usize;
                        self.put(through, key, Some(read)).await;
                        self.get(other, key).await;
                    }
                }
                _ => {
                    let lock = self.rng.below(LOCKS);
                    self.lock_cycle(lock).await;
                }
            }
        }
        if let Some(lease) = &self.lease {
            self.gates[self.home()].delete(&format!("/v1/leases/{lease}")).await;
        }
    }
}

/// What the checker found in a run.
struct Verdict {
    operations: usize,
    reads: usize,
    checked_locks: usize,
    violations: Vec<String>,
}

/// Checks every key's and every untainted lock's history.
fn verdict(recorder: &Recorder) -> Verdict {
    let calls = recorder.calls.lock().unwrap();
    let tainted = recorder.tainted.lock().unwrap();
    let mut verdict = Verdict {
        operations: 0,
        reads: 0,
        checked_locks: 0,
        violations: Vec::new(),
    };
    for (key, history) in calls.iter() {
        let lock = key.starts_with("lin-l");
        if lock && tainted.contains(key) {
            continue;
        }
        verdict.checked_locks += usize::from(lock);
        verdict.operations += history.len();
        verdict.reads += history
            .iter()
            .filter(|c| matches!(c.op, Op::Read(_) | Op::Holder(_)))
            .count();
        if let Err(violation) = check(history, None) {
            verdict.violations.push(format!("{key}: {violation}"));
        }
    }
    verdict
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    None,
    KillLeader,
    PauseFollower,
}

/// Runs the workload in `mode` through two instances (`a` on the server of that index only, `b`
/// likewise) until `reads` reads of keys have been answered, with the fault once a third of
/// them have: a count, not a length, so that a slow machine runs longer instead of checking
/// less. The deadline is generous and says how far the run got.
async fn run(
    ensemble: &mut Ensemble,
    (a, b): (usize, usize),
    mode: Mode,
    fault: Fault,
    reads: usize,
) -> Option<Verdict> {
    let gates = [
        Arc::new(Gate::start_with(test_config(&ensemble.servers[a].connect_string())).await),
        Arc::new(Gate::start_with(test_config(&ensemble.servers[b].connect_string())).await),
    ];
    // A clean slate for this run's keys and locks.
    for key in 0..KEYS {
        gates[0].delete(&format!("/v1/kv/lin/k{key}")).await;
    }
    let recorder = Arc::new(Recorder::new());
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|id| {
            let client = Client {
                id,
                gates: gates.clone(),
                mode,
                recorder: recorder.clone(),
                rng: Rng(0x9e37_79b9_7f4a_7c15 ^ (id + 1).wrapping_mul(0x2545_f491_4f6c_dd1d)),
                last_read: HashMap::new(),
                lease: None,
            };
            tokio::spawn(client.run(stop.clone()))
        })
        .collect();
    let read = |count: usize| {
        let mut answered = recorder.reads.subscribe();
        async move {
            let reached = tokio::time::timeout(RUN_DEADLINE, answered.wait_for(|n| *n >= count))
                .await
                .is_ok();
            let got = *answered.borrow();
            assert!(reached, "{got} of {count} reads answered in {RUN_DEADLINE:?}");
        }
    };
    read(reads / 3).await;
    match fault {
        Fault::None => {}
        Fault::KillLeader => {
            // On a busy machine the leader may have moved since the instances were placed (an
            // election after missed ticks): the fault this run is for needs them both behind
            // followers, so the run ends without a verdict and the caller starts again.
            let Some(leader) = ensemble.leader().await.filter(|leader| *leader != a && *leader != b) else {
                stop.store(true, Ordering::SeqCst);
                for client in clients {
                    within(Duration::from_secs(60), "the clients to stop", client)
                        .await
                        .expect("client");
                }
                return None;
            };
            ensemble.servers[leader].kill();
            tokio::time::sleep(Duration::from_secs(1)).await; // the fault's length
            ensemble.servers[leader].restart(&ensemble.options).expect("restart");
            ensemble.servers[leader]
                .wait_serving(Duration::from_secs(60))
                .await
                .expect("the old leader serves again");
        }
        Fault::PauseFollower => {
            ensemble.servers[b].pause(true);
            tokio::time::sleep(Duration::from_millis(1500)).await; // the fault's length
            ensemble.servers[b].pause(false);
        }
    }
    read(reads).await;
    stop.store(true, Ordering::SeqCst);
    for client in clients {
        within(Duration::from_secs(60), "the clients to stop", client)
            .await
            .expect("client");
    }
    Some(verdict(&recorder))
}

/// How long a run may take to read what it needs (a quiet machine takes a few seconds).
const RUN_DEADLINE: Duration = Duration::from_secs(240);

/// The ensemble, its leader and its two followers.
async fn ensemble() -> (Ensemble, usize, [usize; 2]) {
    let ensemble = Ensemble::start(3).await;
    let leader = ensemble.leader().await.expect("a leader");
    let followers = [(leader + 1) % 3, (leader + 2) % 3];
    (ensemble, leader, followers)
}

fn report(what: &str, verdict: &Verdict) {
    println!(
        "{what}: {} operations ({} reads), {} lock histories checked, {} violations",
        verdict.operations,
        verdict.reads,
        verdict.checked_locks,
        verdict.violations.len()
    );
}

/// Runs the workload until `reads` reads of keys have been answered (see [run]) and checks
/// that its histories are linearizable.
async fn assert_linearizable(
    what: &str,
    ensemble: &mut Ensemble,
    placement: (usize, usize),
    fault: Fault,
    reads: usize,
) -> Verdict {
    let verdict = run(ensemble, placement, Mode::Default, fault, reads)
        .await
        .expect("a run without a leader's kill ends with a verdict");
    report(what, &verdict);
    assert!(verdict.violations.is_empty(), "{what}: {:#?}", verdict.violations);
    verdict
}

/// One instance behind the leader, one behind a follower; each client writes through its own
/// and reads through the other. Both ways can go stale without a barrier: a follower applies a
/// write after the leader has acknowledged it, and the leader applies a write after it told
/// the followers, one of which may acknowledge it first (and ZooKeeper's `sync` does nothing on
/// the leader: this test caught that, see `src/zk/sync.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reads_through_another_instance_are_linearizable_by_default() {
    let (mut ensemble, leader, [follower, _]) = ensemble().await;
    let placement = (leader, follower);
    let verdict = assert_linearizable("default, no fault", &mut ensemble, placement, Fault::None, 500).await;
    assert!(verdict.checked_locks > 0, "no lock history could be checked");
}

/// The same workload with `?consistency=sequential`: the checker finds reads that missed a
/// write acknowledged before they began. Runs again (500 reads each) until it does, so
/// that a quiet machine does not make the test flaky; one run usually suffices.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_checker_catches_stale_reads_in_the_sequential_mode() {
    let (mut ensemble, leader, [follower, _]) = ensemble().await;
    let mut found = Vec::new();
    for round in 1..=8 {
        let verdict = run(&mut ensemble, (leader, follower), Mode::Sequential, Fault::None, 500)
            .await
            .expect("a run without a fault ends with a verdict");
        report(&format!("sequential, round {round}"), &verdict);
        if !verdict.violations.is_empty() {
            found = verdict.violations;
            break;
        }
    }
    assert!(!found.is_empty(), "no stale read in eight sequential runs");
    println!("caught: {}", found[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reads_stay_linearizable_while_the_zookeeper_leader_is_killed() {
    for attempt in 1..=3 {
        let (mut ensemble, _, [one, two]) = ensemble().await;
        let Some(verdict) = run(&mut ensemble, (one, two), Mode::Default, Fault::KillLeader, 300).await else {
            println!("attempt {attempt}: the leader moved to an instance's server before the fault; a new ensemble");
            continue;
        };
        report("default, leader killed", &verdict);
        assert!(verdict.violations.is_empty(), "{:#?}", verdict.violations);
        return;
    }
    panic!("in three ensembles the leader moved to an instance's server before it could be killed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reads_stay_linearizable_while_a_follower_is_paused() {
    let (mut ensemble, _, [one, two]) = ensemble().await;
    assert_linearizable(
        "default, follower paused",
        &mut ensemble,
        (one, two),
        Fault::PauseFollower,
        300,
    )
    .await;
}
