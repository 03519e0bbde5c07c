//! Interoperability: a lock held over HTTP excludes Apache Curator's `InterProcessMutex` and
//! kazoo's `Lock` on the same znode path, and the other way round. The peers are real: Curator
//! from Debian's `libcurator-recipes-java` (run by `java` from source), kazoo from Debian's
//! `python3-kazoo`, both driven through a line protocol (see `tests/interop/`).

use crate::common;

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::process::Process;
use common::{Gate, wait_children, within, zookeeper};
use reqwest::{Method, StatusCode};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use common::java::INTEROP;

/// A peer process speaking the line protocol.
struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl Peer {
    async fn curator(connect: &str, lock_path: &str) -> Peer {
        Peer::curator_kind(connect, lock_path, "mutex").await
    }

    /// A Curator peer on a `mutex`, or on the `read` or `write` side of a read/write lock.
    async fn curator_kind(connect: &str, lock_path: &str, kind: &str) -> Peer {
        Peer::java("CuratorLock", &[connect, lock_path, kind]).await
    }

    /// A Curator `LeaderLatch` peer with participant id `id`.
    async fn curator_latch(connect: &str, path: &str, id: &str) -> Peer {
        Peer::java("CuratorLatch", &[connect, path, id]).await
    }

    /// A Curator `InterProcessSemaphoreV2` peer with `permits` leases.
    async fn curator_semaphore(connect: &str, path: &str, permits: u32) -> Peer {
        Peer::java("CuratorSemaphore", &[connect, path, &permits.to_string()]).await
    }

    /// A Curator `DistributedAtomicLong` peer on the counter at `path`.
    async fn curator_counter(connect: &str, path: &str) -> Peer {
        Peer::java("CuratorCounter", &[connect, path]).await
    }

    /// A Curator `ServiceDiscovery<Map>` peer on base path `base`.
    async fn curator_discovery(connect: &str, base: &str) -> Peer {
        Peer::java("CuratorDiscovery", &[connect, base]).await
    }

    /// A producer on Curator's `DistributedDelayQueue` at `path`.
    async fn curator_delay_queue(connect: &str, path: &str) -> Peer {
        Peer::java("CuratorDelayQueue", &[connect, path]).await
    }

    /// Runs `tests/interop/<class>.java` (Java's source launcher: no compile step) on the
    /// Curator class path.
    async fn java(class: &str, args: &[&str]) -> Peer {
        Peer::spawn(Peer::java_command(class, args)).await
    }

    /// A Curator `InterProcessMutex` peer that authenticates with `digest` (`user:password`)
    /// and creates its znodes for that digest only, as next to `zkgate --zookeeper-auth`.
    async fn curator_with_digest(connect: &str, lock_path: &str, digest: &str) -> Peer {
        let mut command = Peer::java_command("CuratorLock", &[connect, lock_path, "mutex"]);
        command.env("ZKGATE_PEER_DIGEST", digest);
        Peer::spawn(command).await
    }

    /// A kazoo `Lock` peer that authenticates with `digest`, like [Peer::curator_with_digest].
    async fn kazoo_with_digest(connect: &str, lock_path: &str, digest: &str) -> Peer {
        let mut command = Peer::kazoo_command(connect, lock_path);
        command.env("ZKGATE_PEER_DIGEST", digest);
        Peer::spawn(command).await
    }

    fn java_command(class: &str, args: &[&str]) -> Command {
        common::java::command(class, args)
    }

    async fn kazoo(connect: &str, lock_path: &str) -> Peer {
        Peer::spawn(Peer::kazoo_command(connect, lock_path)).await
    }

    fn kazoo_command(connect: &str, lock_path: &str) -> Command {
        let mut command = Command::new("/usr/bin/python3");
        command.args(["-B", &format!("{INTEROP}/kazoo_lock.py"), connect, lock_path]);
        command
    }

    async fn spawn(mut command: Command) -> Peer {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start the peer (is the test command's install step done?)");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut peer = Peer { child, stdin, stdout };
        assert_eq!(peer.reply().await, "READY");
        peer
    }

    async fn reply(&mut self) -> String {
        within(Duration::from_secs(60), "the peer's answer", self.stdout.next_line())
            .await
            .expect("read the peer")
            .expect("the peer exited")
    }

    async fn send(&mut self, command: &str) -> String {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .expect("write the peer");
        self.stdin.flush().await.expect("flush");
        self.reply().await
    }

    async fn quit(mut self) {
        let _ = self.stdin.write_all(b"quit\n").await;
        let _ = within(Duration::from_secs(30), "the peer to exit", self.child.wait()).await;
    }
}

/// The same exchange with either peer (`curator` or `kazoo`): each side excludes the other,
/// and a release on one side wakes a waiter on the other.
async fn excludes_both_ways(peer_kind: &str) {
    let zk = zookeeper().await;
    let connect = zk.connect_string();
    let gate = Arc::new(Gate::start(&connect).await);
    let path = "/zkgate/locks/shared";
    let mut peer = match peer_kind {
        "curator" => Peer::curator(&connect, path).await,
        _ => Peer::kazoo(&connect, path).await,
    };

    // HTTP holds: the peer cannot get it.
    let lease = gate.lease("60s").await;
    let held = gate.acquire("shared", &lease, "wait=0").await;
    assert_eq!(held.status, StatusCode::OK, "{held:?}");
    assert_eq!(peer.send("acquire 300").await, "TIMEOUT");
    gate.release("shared", &held.str("handle")).await;

    // The peer holds: HTTP cannot get it, and sees who holds it.
    assert_eq!(peer.send("acquire 10000").await, "ACQUIRED");
    gate.acquire("shared", &lease, "wait=0")
        .await
        .assert_problem(StatusCode::CONFLICT, None);
    let state = gate.get("/v1/locks/shared").await;
    assert_eq!(state.body["holder"]["client"], peer_kind, "{state:?}");

    // An HTTP waiter is woken by the peer's release.
    let waiter = {
        let (gate, lease) = (gate.clone(), lease.clone());
        tokio::spawn(async move { gate.acquire("shared", &lease, "wait=30s").await })
    };
    wait_children(&connect, path, 2).await;
    assert_eq!(peer.send("release").await, "RELEASED");
    let granted = within(Duration::from_secs(30), "the HTTP waiter's grant", waiter)
        .await
        .expect("waiter");
    assert_eq!(granted.status, StatusCode::OK, "{granted:?}");

    // And a peer waiter is woken by the HTTP release.
    assert_eq!(peer.send("acquire 300").await, "TIMEOUT");
    gate.release("shared", &granted.str("handle")).await;
    assert_eq!(peer.send("acquire 10000").await, "ACQUIRED");
    assert_eq!(peer.send("release").await, "RELEASED");
    peer.quit().await;
}

#[tokio::test]
async fn http_and_curator_interprocess_mutex_exclude_each_other() {
    excludes_both_ways("curator").await;
}

#[tokio::test]
async fn http_and_kazoo_lock_exclude_each_other() {
    excludes_both_ways("kazoo").await;
}

#[tokio::test]
async fn http_readers_and_a_curator_read_write_lock_writer_exclude_each_other() {
    let zk = zookeeper().await;
    let connect = zk.connect_string();
    let gate = Arc::new(Gate::start(&connect).await);
    let path = "/zkgate/rwlocks/catalog";
    let mut writer = Peer::curator_kind(&connect, path, "write").await;
    let mut reader = Peer::curator_kind(&connect, path, "read").await;
    let lease = gate.lease("60s").await;

    // Curator writes: HTTP cannot read.
    assert_eq!(writer.send("acquire 10000").await, "ACQUIRED");
    gate.post(
        "/v1/rwlocks/catalog/read?wait=0",
        Some(serde_json::json!({"lease": lease})),
    )
    .await
    .assert_problem(StatusCode::CONFLICT, None);
    let state = gate.get("/v1/rwlocks/catalog").await;
    assert_eq!(state.body["holders"][0]["mode"], "write", "{state:?}");
    assert_eq!(state.body["holders"][0]["client"], "curator", "{state:?}");
    assert_eq!(writer.send("release").await, "RELEASED");

    // HTTP reads: a Curator reader shares, the Curator writer waits until the HTTP reader goes.
    let read = gate
        .post(
            "/v1/rwlocks/catalog/read?wait=5s",
            Some(serde_json::json!({"lease": lease})),
        )
        .await;
    assert_eq!(read.status, StatusCode::OK, "{read:?}");
    assert_eq!(reader.send("acquire 5000").await, "ACQUIRED");
    assert_eq!(writer.send("acquire 300").await, "TIMEOUT");
    assert_eq!(reader.send("release").await, "RELEASED");
    assert_eq!(writer.send("acquire 300").await, "TIMEOUT");
    gate.delete(&format!("/v1/rwlocks/catalog/handles/{}", read.str("handle")))
        .await;
    assert_eq!(writer.send("acquire 10000").await, "ACQUIRED");

    // And an HTTP writer waits for the Curator writer's release.
    let waiter = {
        let gate = gate.clone();
        tokio::spawn(async move { gate.post("/v1/rwlocks/catalog/write?wait=30s", None).await })
    };
    wait_children(&connect, path, 2).await;
    assert_eq!(writer.send("release").await, "RELEASED");
    let granted = within(Duration::from_secs(30), "the HTTP writer's grant", waiter)
        .await
        .expect("waiter");
    assert_eq!(granted.status, StatusCode::OK, "{granted:?}");
    writer.quit().await;
    reader.quit().await;
}

#[tokio::test]
async fn http_candidates_and_a_curator_leader_latch_see_one_leader_between_them() {
    let zk = zookeeper().await;
    let connect = zk.connect_string();
    let gate = Arc::new(Gate::start(&connect).await);
    let path = "/zkgate/elections/scheduler";
    let mut latch = Peer::curator_latch(&connect, path, "curator-1").await;

    // HTTP leads first; the latch joins and does not lead.
    let first = gate
        .post(
            "/v1/elections/scheduler/campaign?wait=5s",
            Some(serde_json::json!({"value": "http-1"})),
        )
        .await;
    assert_eq!(first.status, StatusCode::OK, "{first:?}");
    assert_eq!(latch.send("start").await, "STARTED");
    assert_eq!(latch.send("await 300").await, "NOT_LEADER");
    let state = gate.get("/v1/elections/scheduler").await;
    assert_eq!(state.body["leader"]["client"], "zkgate", "{state:?}");
    assert_eq!(state.body["leader"]["value"], "http-1", "{state:?}");
    assert_eq!(state.body["candidates"].as_array().map(Vec::len), Some(2), "{state:?}");

    // HTTP resigns: the latch leads, and HTTP sees it (not acknowledged: Curator writes none).
    assert_eq!(
        gate.delete(&format!("/v1/elections/scheduler/candidates/{}", first.str("handle")))
            .await
            .status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(latch.send("await 10000").await, "LEADER");
    let state = gate.get("/v1/elections/scheduler").await;
    assert_eq!(state.body["leader"]["client"], "curator", "{state:?}");
    assert_eq!(state.body["leader"]["acknowledged"], false, "{state:?}");

    // A new HTTP candidate queues behind the latch and leads when it closes.
    let second = {
        let gate = gate.clone();
        tokio::spawn(async move { gate.post("/v1/elections/scheduler/campaign?wait=30s", None).await })
    };
    wait_children(&connect, path, 2).await;
    assert_eq!(latch.send("close").await, "CLOSED");
    let leading = within(Duration::from_secs(30), "the HTTP candidate to lead", second)
        .await
        .expect("campaign");
    assert_eq!(leading.status, StatusCode::OK, "{leading:?}");
    assert!(leading.i64("term") > first.i64("term"), "terms increase");
    latch.quit().await;
}

#[tokio::test]
async fn http_and_a_curator_semaphore_share_the_same_permits() {
    let zk = zookeeper().await;
    let connect = zk.connect_string();
    let gate = Gate::start(&connect).await;
    let mut curator = Peer::curator_semaphore(&connect, "/zkgate/semaphores/exports", 2).await;

    let first = gate.post("/v1/semaphores/exports/acquire?permits=2&wait=0", None).await;
    assert_eq!(first.status, StatusCode::OK, "{first:?}");
    assert_eq!(curator.send("acquire 5000").await, "ACQUIRED");
    // Both permits are taken, one by each side.
    gate.post("/v1/semaphores/exports/acquire?permits=2&wait=0", None)
        .await
        .assert_problem(StatusCode::CONFLICT, None);
    let state = gate.get("/v1/semaphores/exports").await;
    let clients: Vec<_> = state.body["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .map(|h| h["client"].clone())
        .collect();
    assert_eq!(
        clients,
        vec![serde_json::json!("zkgate"), serde_json::json!("curator")],
        "{state:?}"
    );

    assert_eq!(curator.send("release").await, "RELEASED");
    let second = gate
        .post("/v1/semaphores/exports/acquire?permits=2&wait=5s", None)
        .await;
    assert_eq!(second.status, StatusCode::OK, "{second:?}");
    assert_eq!(curator.send("acquire 300").await, "TIMEOUT");
    gate.delete(&format!("/v1/semaphores/exports/permits/{}", first.str("handle")))
        .await;
    assert_eq!(curator.send("acquire 5000").await, "ACQUIRED");
    curator.quit().await;
}

/// With `zkgate serve --zookeeper-auth`, a Curator or kazoo peer that authenticates with the
/// same digest shares zkgate's locks as before; one without it is refused (NoAuth) instead of
/// contending. (zkgate runs as a process: the ACL setting is process-wide.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_with_zkgates_digest_share_its_locks_and_others_are_refused() {
    const DIGEST: &str = "zkgate:s3cret";
    let zk = zookeeper().await;
    let connect = zk.connect_string();
    let mut gate = Process::start_with(&connect, &["--zookeeper-auth", DIGEST]).await;
    gate.wait_ready().await;
    let path = "/zkgate/locks/shared";
    let acquire = "/v1/locks/shared/acquire?wait=0";
    let lease = gate.lease("60s").await;
    let body = serde_json::json!({ "lease": lease });
    let (status, held) = gate.call(Method::POST, acquire, Some(body.clone())).await;
    assert_eq!(status, StatusCode::OK, "{held}");

    let (mut curator, mut kazoo, mut stranger) = tokio::join!(
        Peer::curator_with_digest(&connect, path, DIGEST),
        Peer::kazoo_with_digest(&connect, path, DIGEST),
        Peer::curator(&connect, path),
    );
    let refused = stranger.send("acquire 300").await;
    assert!(refused.starts_with("ERROR") && refused.contains("NoAuth"), "{refused}");
    assert_eq!(curator.send("acquire 300").await, "TIMEOUT");

    let handle = held["handle"].as_str().expect("handle");
    let (released, _) = gate
        .call(Method::DELETE, &format!("/v1/locks/shared/handles/{handle}"), None)
        .await;
    assert_eq!(released, StatusCode::NO_CONTENT);
    assert_eq!(curator.send("acquire 10000").await, "ACQUIRED");
    let (status, _) = gate.call(Method::POST, acquire, Some(body.clone())).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(curator.send("release").await, "RELEASED");

    assert_eq!(kazoo.send("acquire 10000").await, "ACQUIRED");
    let (status, _) = gate.call(Method::POST, acquire, Some(body)).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(kazoo.send("release").await, "RELEASED");
    for peer in [curator, kazoo, stranger] {
        peer.quit().await;
    }
}

/// A counter is one counter for HTTP clients and Curator's `DistributedAtomicLong`: each reads
/// what the other wrote, and their adds racing on the same znode all land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_and_a_curator_atomic_long_share_one_counter_and_lose_no_add() {
    let zk = zookeeper().await;
    let connect = zk.connect_string();
    let gate = Arc::new(Gate::start(&connect).await);
    let mut curator = Peer::curator_counter(&connect, "/zkgate/counters/orders").await;

    // Curator creates it (its own way: container parents); HTTP reads and adds.
    assert_eq!(curator.send("add 40").await, "VALUE 40");
    assert_eq!(gate.get("/v1/counters/orders").await.body["value"], 40);
    let added = gate
        .post("/v1/counters/orders/add", Some(serde_json::json!({"delta": 2})))
        .await;
    assert_eq!(added.i64("value"), 42, "{added:?}");
    assert_eq!(curator.send("get").await, "VALUE 42");
    let set = gate
        .http
        .put(format!("{}/v1/counters/orders", gate.url))
        .json(&serde_json::json!({"value": -7}))
        .send()
        .await
        .expect("PUT");
    assert_eq!(set.status(), StatusCode::OK);
    assert_eq!(curator.send("get").await, "VALUE -7");
    assert_eq!(curator.send("add 7").await, "VALUE 0");

    // Both sides add at once: 4 HTTP clients × 50, and Curator 200 one after another.
    let http: Vec<_> = (0..4)
        .map(|_| {
            let gate = gate.clone();
            tokio::spawn(async move {
                for _ in 0..50 {
                    let reply = gate.post("/v1/counters/orders/add", None).await;
                    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
                }
            })
        })
        .collect();
    let curators = curator.send("adds 200").await;
    assert!(curators.starts_with("VALUE "), "{curators}");
    for task in http {
        within(Duration::from_secs(120), "the HTTP adds", task)
            .await
            .expect("adds");
    }
    assert_eq!(gate.get("/v1/counters/orders").await.body["value"], 400);
    assert_eq!(curator.send("get").await, "VALUE 400");
    curator.quit().await;
}

/// A lock set over HTTP and Curator's `InterProcessMultiLock` use the same znodes: each
/// excludes the other, a refused side holds nothing afterwards, and a release on one side lets
/// the other in.
#[tokio::test]
async fn http_lock_sets_and_a_curator_multi_lock_exclude_each_other() {
    let zk = zookeeper().await;
    let connect = zk.connect_string();
    let gate = Gate::start(&connect).await;
    let mut curator = Peer::curator_kind(&connect, "/zkgate/locks/m-a,/zkgate/locks/m-b", "multi").await;
    let set = |locks: &[&str]| serde_json::json!({"locks": locks, "ttl": "30s"});

    // Curator holds a and b: a set over b and c is refused (naming b), and so is a single a.
    assert_eq!(curator.send("acquire 10000").await, "ACQUIRED");
    let refused = gate.post("/v1/lock-sets?wait=0", Some(set(&["m-c", "m-b"]))).await;
    refused.assert_problem(StatusCode::CONFLICT, None);
    assert_eq!(refused.body["lock"], "m-b", "{refused:?}");
    let lease = gate.lease("60s").await;
    gate.acquire("m-a", &lease, "wait=0")
        .await
        .assert_problem(StatusCode::CONFLICT, None);

    // Curator releases: the set is granted, and Curator's multi-lock times out on b, giving a
    // back (Curator releases what it took when one lock fails).
    assert_eq!(curator.send("release").await, "RELEASED");
    let granted = gate.post("/v1/lock-sets?wait=5s", Some(set(&["m-c", "m-b"]))).await;
    assert_eq!(granted.status, StatusCode::OK, "{granted:?}");
    assert_eq!(curator.send("acquire 300").await, "TIMEOUT");
    let single = gate.acquire("m-a", &lease, "wait=5s").await;
    assert_eq!(single.status, StatusCode::OK, "Curator gave `m-a` back: {single:?}");
    gate.release("m-a", &single.str("handle")).await;

    // The set goes as one: Curator gets both.
    let released = gate.delete(&format!("/v1/lock-sets/{}", granted.str("set"))).await;
    assert_eq!(released.status, StatusCode::NO_CONTENT);
    assert_eq!(curator.send("acquire 10000").await, "ACQUIRED");
    assert_eq!(curator.send("release").await, "RELEASED");
    curator.quit().await;
}

/// Service discovery: an instance registered over HTTP is one Curator's `ServiceDiscovery`
/// lists (address, port, payload, URI), and one Curator registers is one HTTP lists, picks and
/// follows; each goes when its side ends it.
#[tokio::test]
async fn http_and_curator_discovery_see_each_others_instances() {
    let zk = zookeeper().await;
    let connect = zk.connect_string();
    let gate = Gate::start(&connect).await;
    let mut curator = Peer::curator_discovery(&connect, "/zkgate/services").await;
    let mut stream =
        common::sse::Sse::open(&gate.http, &format!("{}/v1/services/billing/events", gate.url), None).await;
    let mut seen = vec![stream.next().await];

    // HTTP registers: Curator sees it as Curator would have written it.
    let lease = gate.lease("30s").await;
    let body = serde_json::json!({"address": "10.0.0.5", "port": 8080, "payload": {"zone": "eu-1"}, "uri_spec": "{scheme}://{address}:{port}", "lease": lease});
    let registered = gate
        .call(Method::PUT, "/v1/services/billing/instances/http-1", Some(body))
        .await;
    assert_eq!(registered.status, StatusCode::CREATED, "{registered:?}");
    assert_eq!(
        curator.send("list billing").await,
        "INSTANCES http-1@10.0.0.5:8080,zone=eu-1,uri=http://10.0.0.5:8080"
    );

    // Curator registers: HTTP lists it, follows it, and picks it in turn.
    assert_eq!(
        curator.send("register billing jvm-1 10.0.0.9 9090 us-2").await,
        "REGISTERED"
    );
    let event = stream
        .until("service:billing", &mut seen, |e| {
            e["type"] == "registered" && e["state"]["instances"].as_array().is_some_and(|i| i.len() == 2)
        })
        .await;
    let jvm = event["state"]["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["id"] == "jvm-1")
        .cloned()
        .expect("Curator's instance");
    assert_eq!(
        (jvm["address"].clone(), jvm["port"].clone()),
        (serde_json::json!("10.0.0.9"), serde_json::json!(9090))
    );
    assert_eq!(jvm["payload"]["zone"], "us-2", "{jvm}");
    assert_eq!(jvm["uri"], "http://10.0.0.9:9090");
    assert_eq!(jvm["lease"], serde_json::Value::Null, "not zkgate's");
    let mut picked = std::collections::BTreeSet::new();
    for _ in 0..2 {
        picked.insert(
            gate.get("/v1/services/billing/pick?strategy=round-robin")
                .await
                .str("id"),
        );
    }
    assert_eq!(picked.into_iter().collect::<Vec<_>>(), ["http-1", "jvm-1"]);

    // The HTTP side's lease ends: Curator sees one; Curator unregisters: HTTP sees none.
    assert_eq!(
        gate.delete(&format!("/v1/leases/{lease}")).await.status,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        curator.send("list billing").await,
        "INSTANCES jvm-1@10.0.0.9:9090,zone=us-2,uri=http://10.0.0.9:9090"
    );
    assert_eq!(curator.send("unregister").await, "UNREGISTERED");
    stream
        .until("service:billing", &mut seen, |e| {
            e["state"]["instances"] == serde_json::json!([])
        })
        .await;
    curator.quit().await;
}

/// Delayed items: a JVM service schedules work with Curator's `DistributedDelayQueue` (on the
/// queue's `items`, where its names are the ones zkgate writes), and HTTP workers take each
/// item no earlier than its time, the earliest due first.
#[tokio::test]
async fn items_a_curator_delay_queue_schedules_are_taken_over_http_no_earlier_than_their_time() {
    let zk = zookeeper().await;
    let connect = zk.connect_string();
    let gate = Gate::start(&connect).await;
    let mut curator = Peer::curator_delay_queue(&connect, "/zkgate/queues/jobs/items").await;
    let due = |reply: String| -> i64 {
        reply
            .strip_prefix("PUT ")
            .and_then(|ms| ms.parse().ok())
            .unwrap_or_else(|| panic!("{reply}"))
    };
    let later = due(curator.send("put later 1500").await);
    let sooner = due(curator.send("put sooner 300").await);
    for (expected, at) in [("sooner", sooner), ("later", later)] {
        let taken = gate.post("/v1/queues/jobs/take?wait=20s&mode=at-most-once", None).await;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis() as i64;
        assert_eq!(taken.status, StatusCode::OK, "{taken:?}");
        // Curator's serializer wrote raw UTF-8: zkgate shows it as text.
        assert_eq!(taken.body["text"], expected, "{taken:?}");
        assert!(now >= at, "`{expected}` taken {} ms before its time", at - now);
    }
    curator.quit().await;
}

/// Lock-delay, seen by Curator: a lock whose HTTP holder's lease expired stays held for the
/// lease's `lock_delay` (its contender node stays), so an `InterProcessMutex` waiter is not
/// granted before the TTL and the delay have passed, and is within a bound after them.
#[tokio::test]
async fn a_curator_waiter_waits_out_the_lock_delay_of_an_expired_http_holder() {
    let zk = zookeeper().await;
    let connect = zk.connect_string();
    let gate = Gate::start(&connect).await;
    let mut peer = Peer::curator(&connect, "/zkgate/locks/delayed").await;
    let started = std::time::Instant::now();
    let made = gate
        .post(
            "/v1/leases",
            Some(serde_json::json!({ "ttl": "1s", "lock_delay": "3s" })),
        )
        .await;
    assert_eq!(made.status, StatusCode::CREATED, "{made:?}");
    let held = gate.acquire("delayed", &made.str("id"), "wait=0").await;
    assert_eq!(held.status, StatusCode::OK, "{held:?}");
    // The holder says nothing more: its lease expires after 1 s, the lock is held 3 s more.
    assert_eq!(peer.send("acquire 30000").await, "ACQUIRED");
    let at = started.elapsed();
    assert!(
        at >= Duration::from_secs(4),
        "Curator was granted {at:?} after: within the delay"
    );
    assert!(
        at <= Duration::from_secs(9),
        "Curator was granted {at:?} after: past the bound"
    );
    assert_eq!(peer.send("release").await, "RELEASED");
    peer.quit().await;
}
