//! Through a ZooKeeper outage (issue 53): an instance whose ZooKeeper is away waits for it
//! without spending a CPU, and comes back.
//!
//! The instance runs as a process of its own, so that its CPU time can be read from `/proc`.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::common::process::Process;
use crate::common::sse::Sse;
use crate::common::{self, Ensemble, until_answered, within};

mod work;

/// How long ZooKeeper stays away while the CPU is measured (the figure).
const OUTAGE: Duration = Duration::from_secs(30);

/// At most 1% of one CPU while idle (the bound).
const IDLE_SHARE: f64 = 0.01;

/// The CPU time (user and system) a process has used so far, from `/proc/<pid>/stat`.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/<pid>/stat");
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let after_name = &stat[stat.rfind(')').expect("a stat line") + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Fields 14 and 15 of the line (utime, stime), in clock ticks: the 12th and 13th after the
    // name (field 3 is the first).
    let ticks: u64 = fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    // SAFETY: sysconf reads a constant of the system.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_millis(ticks * 1000 / per_second)
}

/// How many leases run out while ZooKeeper is away: each one's end waits for ZooKeeper.
const RUNNING_OUT: usize = 500;

/// Event streams of 64 topics each (the most one stream takes), followed through the outage.
const TOPIC_STREAMS: usize = 4;

/// How soon after ZooKeeper answers again the instance serves and vouches for its leases (the
/// README's bound; measured 0.8 to 2.4 s by hand, docs/RELIABILITY.md).
const BACK_WITHIN: Duration = Duration::from_secs(10);

/// What the instance holds and follows through the outage.
struct Busy {
    /// The lease that holds lock `orders` throughout (its TTL, 120 s, outlasts the outage).
    lease: String,
    /// The stream of the lock `orders`.
    orders: Sse,
    /// The other streams, kept open.
    _streams: Vec<Sse>,
}

/// Gives the instance what waits on ZooKeeper when it is away: a lease holding a lock (its
/// keeper, its handle), a kv key, event streams of the lock, the key's prefix, the lease and a
/// queue (watches, a queue's mirror), [TOPIC_STREAMS] streams of 64 topics, and [RUNNING_OUT]
/// leases whose TTL runs out in the outage.
async fn busy_with_everything(gate: &Process) -> Busy {
    use futures::StreamExt;
    futures::stream::iter(0..RUNNING_OUT)
        .for_each_concurrent(16, |_| async {
            gate.lease("5s").await;
        })
        .await;
    let lease = gate.lease("120s").await;
    let (status, held) = gate.acquire("orders", &lease, "").await;
    assert_eq!(status, StatusCode::OK, "{held}");
    let (status, put) = gate
        .call(Method::PUT, "/v1/kv/config/mode", Some(json!("active")))
        .await;
    assert!(status.is_success(), "{status} {put}");
    let orders = follow(gate, "/v1/locks/orders/events").await;
    let mut streams = Vec::new();
    for path in [
        "/v1/queues/jobs/events".to_string(),
        format!("/v1/events?topic=znode:recursive:kv/config&topic=lease:{lease}"),
    ] {
        streams.push(follow(gate, &path).await);
    }
    // Many topics, each of which reads its state again once ZooKeeper is back.
    for stream in 0..TOPIC_STREAMS {
        let topics: Vec<String> = (0..64).map(|n| format!("topic=lock:idle-{stream}-{n}")).collect();
        let mut opened = follow(gate, &format!("/v1/events?{}", topics.join("&"))).await;
        for _ in 1..64 {
            opened.next().await; // each other topic's first state
        }
        streams.push(opened);
    }
    Busy {
        lease,
        orders,
        _streams: streams,
    }
}

/// The event stream at `path`, once its (first) topic's state came: its watch is set.
async fn follow(gate: &Process, path: &str) -> Sse {
    let mut stream = Sse::open(&common::http_client(), &format!("{}{path}", gate.url), None).await;
    stream.next().await;
    stream
}

/// Reads `stream` (read after the outage: its events wait in the connection) until an event
/// passes `test`, and returns it.
async fn event_until(stream: &mut Sse, what: &str, mut test: impl FnMut(&Value) -> bool) -> Value {
    within(Duration::from_secs(30), what, async {
        loop {
            let event = stream.next().await;
            if test(&event) {
                return event;
            }
        }
    })
    .await
}

/// Measures the instance's CPU over [OUTAGE] from the moment it has seen ZooKeeper go.
async fn idle_share_while_away(gate: &Process) -> f64 {
    gate.wait_log(Duration::from_secs(30), "ZooKeeper gone", |line| {
        line.contains("ZooKeeper connection lost")
    })
    .await;
    let pid = gate.child.id().expect("the instance runs");
    let before = cpu_time(pid);
    // Not a synchronisation: the window over which the CPU is measured.
    tokio::time::sleep(OUTAGE).await;
    let used = cpu_time(pid) - before;
    let share = used.as_secs_f64() / OUTAGE.as_secs_f64();
    println!(
        "CPU while ZooKeeper was away: {} ms in {} s ({:.2}% of a CPU)",
        used.as_millis(),
        OUTAGE.as_secs(),
        share * 100.0
    );
    assert!(
        share <= IDLE_SHARE,
        "the instance used {:.2}% of a CPU while its ZooKeeper was away (at most {:.0}%)",
        share * 100.0,
        IDLE_SHARE * 100.0
    );
    share
}

/// Waits until the instance is ready again, and for the `resync` of the lock `orders` after
/// the outage: its lease still holds it. Returns the lock's state in it.
async fn back_with_the_lock(gate: &Process, busy: &mut Busy) -> Value {
    until_answered(Duration::from_secs(60), "the instance to be ready again", async || {
        gate.call(Method::GET, "/readyz", None).await.0 == StatusCode::OK
    })
    .await;
    let resync = event_until(&mut busy.orders, "the lock's resync after the outage", |event| {
        event["type"] == "resync"
    })
    .await;
    assert_eq!(
        resync["state"]["holder"]["lease"],
        json!(busy.lease),
        "the lease kept its lock: {resync}"
    );
    resync["state"].clone()
}

/// A standalone ZooKeeper stopped for 30 s: the instance, holding locks and followed by event
/// streams, uses at most 1% of a CPU meanwhile. Once ZooKeeper is back it serves within the
/// README's bound, and the leases follow the documented rule: a TTL runs through an outage. The
/// lease whose TTL (5 s) ran out meanwhile ends when ZooKeeper is back, with a reason its holder
/// reads, and its waiter is granted with a higher token; the lease whose TTL (120 s) did not run
/// out keeps its lock, and its holder's keepalive says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_whose_zookeeper_is_stopped_sits_idle() {
    let mut zookeeper = common::zookeeper_own().await;
    let gate = Process::start(&zookeeper.connect_string()).await;
    let mut busy = busy_with_everything(&gate).await;
    // A holder whose TTL runs out in the outage, and a waiter whose does not.
    let short = gate.lease("5s").await;
    let waiter = gate.lease("120s").await;
    let (status, first) = gate.acquire("handover", &short, "").await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let (status, queued) = gate.acquire("handover", &waiter, "wait=0&keep_queued=true").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{queued}");
    let mut handover = follow(&gate, &format!("/v1/events?topic=lease:{short}&topic=lock:handover")).await;

    zookeeper.kill();
    idle_share_while_away(&gate).await;

    zookeeper.restart(&common::test_server_options()).expect("restart");
    zookeeper
        .wait_serving(Duration::from_secs(60))
        .await
        .expect("serves again");
    let back = std::time::Instant::now();
    let keepalive = format!("/v1/leases/{}/keepalive", busy.lease);
    until_answered(BACK_WITHIN, "the instance to vouch for its lease again", async || {
        gate.call(Method::POST, &keepalive, None).await.0 == StatusCode::OK
    })
    .await;
    println!(
        "the lease was kept alive again {} ms after ZooKeeper answered",
        back.elapsed().as_millis()
    );
    back_with_the_lock(&gate, &mut busy).await;

    // The lease that ran out ended, and says why, to its stream and its reader; its lock went
    // to the waiter (the two topics' events in either order).
    let (lease_topic, mut ended, mut granted) = (format!("lease:{short}"), false, None);
    event_until(
        &mut handover,
        "the run-out lease's end and its waiter's grant",
        |event| {
            ended |= event["topic"] == json!(lease_topic) && event["state"]["ended"] == json!(true);
            if event["topic"] == "lock:handover" && event["state"]["holder"]["lease"] == json!(waiter) {
                granted = Some(event["state"].clone());
            }
            ended && granted.is_some()
        },
    )
    .await;
    let granted = granted.expect("the waiter's grant");
    let (status, gone) = gate.call(Method::GET, &format!("/v1/leases/{short}"), None).await;
    assert_eq!(status, StatusCode::GONE, "{gone}");
    assert_eq!(gone["reason"], "expired", "{gone}");
    assert!(
        granted["holder"]["fencing_token"].as_i64() > first["fencing_token"].as_i64(),
        "the next holder's token is higher: {granted} after {first}"
    );
}

/// An ensemble that lost its quorum (two of three servers stopped) for 30 s: the one left
/// takes connections and closes them, and the instance's clients go round its servers; it
/// still uses at most 1% of a CPU. Requests that need ZooKeeper to finish answer 503 during
/// the outage rather than hang for it: a long poll whose wait ended (its contender cannot leave
/// the queue yet), and a release (done once ZooKeeper is back). Once the quorum is back the
/// instance serves, the release is done and the waiter has left the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_whose_ensemble_lost_its_quorum_sits_idle() {
    let mut ensemble = Ensemble::start(3).await;
    let gate = Process::start(&ensemble.connect_string()).await;
    let mut busy = busy_with_everything(&gate).await;
    // A lock to release during the outage, and a waiter whose wait ends during it.
    let releasing = gate.lease("120s").await;
    let (status, held) = gate.acquire("released", &releasing, "").await;
    assert_eq!(status, StatusCode::OK, "{held}");
    let mut released = follow(&gate, "/v1/locks/released/events").await;
    let waiting = gate.lease("120s").await;

    // The waiter's wait (20 s) ends in the outage's window; its answer must come before the
    // outage does, which the bound on both together says.
    let waiter = gate.acquire("orders", &waiting, "wait=20s");
    let outage = async {
        for server in ensemble.servers.iter_mut().take(2) {
            server.kill();
        }
        idle_share_while_away(&gate).await
    };
    let ((status, body), _) = within(
        OUTAGE + Duration::from_secs(30),
        "the waiter's answer during the outage",
        async { tokio::join!(waiter, outage) },
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let handle = held["handle"].as_str().expect("a handle");
    let (status, body) = within(
        Duration::from_secs(20),
        "a release's answer during the outage",
        gate.call(Method::DELETE, &format!("/v1/locks/released/handles/{handle}"), None),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");

    for server in ensemble.servers.iter_mut().take(2) {
        server.restart(&ensemble.options).expect("restart");
    }
    let orders = back_with_the_lock(&gate, &mut busy).await;
    event_until(&mut released, "the release to be done", |event| {
        event["state"]["holder"].is_null()
    })
    .await;
    if orders["waiter_count"] != json!(0) {
        event_until(
            &mut busy.orders,
            "the waiter that gave up to leave the queue",
            |event| event["state"]["waiter_count"] == json!(0),
        )
        .await;
    }
}
