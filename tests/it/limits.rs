//! Limits under abuse: a burst beyond each limit gets clean 429s with `Retry-After` (never a
//! crash, a hang or a 5xx), exactly the allowed number gets through, and other principals,
//! locks and addresses are served meanwhile.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::proxy::Proxy;
use common::ws::Ws;
use common::{Gate, Reply, test_config, within, zookeeper};
use futures::future::join_all;
use reqwest::{Method, StatusCode};
use serde_json::json;
use zkgate::config::ServeConfig;

/// Two principals with the same rights on everything, for "the others are still served".
fn with_two_principals(config: &mut ServeConfig, dir: &tempfile::TempDir) -> (String, String) {
    let (a, a_hash) = zkgate::auth::new_token();
    let (b, b_hash) = zkgate::auth::new_token();
    let grants = "[[principals.grants]]\nkinds = [\"*\"]\nprefixes = [\"\"]\naccess = \"write\"\n";
    let text = format!(
        "[[principals]]\nname = \"a\"\ntokens = [\"{a_hash}\"]\n{grants}\n[[principals]]\nname = \"b\"\ntokens = [\"{b_hash}\"]\n{grants}"
    );
    let path = dir.path().join("auth.toml");
    std::fs::write(&path, text).expect("write auth config");
    config.auth_config = Some(path);
    (a, b)
}

/// Asserts the clean refusal of a limit: 429, a problem document of `kind`, `Retry-After`.
fn assert_refused(reply: &Reply, kind: &str) {
    reply.assert_problem(StatusCode::TOO_MANY_REQUESTS, None);
    assert_eq!(reply.body["type"], format!("urn:zkgate:problem:{kind}"), "{reply:?}");
    assert!(reply.retry_after.is_some_and(|s| s >= 1), "{reply:?}");
}

fn count(replies: &[Reply], status: StatusCode) -> usize {
    replies.iter().filter(|r| r.status == status).count()
}

#[tokio::test]
async fn a_burst_of_writes_beyond_the_rate_is_refused_and_others_are_served() {
    let zk = zookeeper().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = test_config(&zk.connect_string());
    config.write_rate = 5;
    let (a, b) = with_two_principals(&mut config, &dir);
    let gate = Gate::start_with(config).await;

    let (gate, a) = (&gate, &a);
    let burst = join_all((0..100).map(|i| async move {
        let path = format!("/v1/kv/burst-{i}");
        gate.call_as(Some(a), Method::PUT, &path, Some(json!({"i": i}))).await
    }))
    .await;
    let (written, refused) = (
        count(&burst, StatusCode::CREATED),
        count(&burst, StatusCode::TOO_MANY_REQUESTS),
    );
    assert_eq!(written + refused, 100, "only 201s and 429s: {burst:?}");
    // One second's worth at once, then the refill: however slow the machine, not all 100.
    assert!(written >= 5 && refused > 0, "{written} written, {refused} refused");
    for refused in burst.iter().filter(|r| r.status != StatusCode::CREATED) {
        assert_refused(refused, "rate-limited");
    }

    // Reads are not limited, and another principal writes at once.
    let read = gate.call_as(Some(a), Method::GET, "/v1/kv", None).await;
    assert_eq!(read.status, StatusCode::OK, "{read:?}");
    let other = gate
        .call_as(Some(&b), Method::PUT, "/v1/kv/other", Some(json!(1)))
        .await;
    assert_eq!(other.status, StatusCode::CREATED, "{other:?}");
    // Nothing refused was written.
    let keys = gate.call_as(Some(&b), Method::GET, "/v1/kv", None).await;
    let stored = keys.body["keys"].as_array().expect("keys").len();
    assert_eq!(stored, written + 1, "{keys:?}");
}

#[tokio::test]
async fn leases_per_principal_stop_at_the_limit_and_free_up_when_one_ends() {
    let zk = zookeeper().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = test_config(&zk.connect_string());
    config.max_leases_per_principal = 5;
    let (a, b) = with_two_principals(&mut config, &dir);
    let gate = Gate::start_with(config).await;

    let burst = join_all((0..20).map(|_| gate.call_as(Some(&a), Method::POST, "/v1/leases", None))).await;
    assert_eq!(count(&burst, StatusCode::CREATED), 5, "{burst:?}");
    for refused in burst.iter().filter(|r| r.status != StatusCode::CREATED) {
        assert_refused(refused, "too-many");
    }
    // An acquire that would need a new lease is refused the same way, and leaves nothing.
    let acquire = gate
        .call_as(Some(&a), Method::POST, "/v1/locks/l/acquire?wait=0", None)
        .await;
    assert_refused(&acquire, "too-many");
    let lock = gate.call_as(Some(&b), Method::GET, "/v1/locks/l", None).await;
    assert!(lock.body["holder"].is_null(), "{lock:?}");

    let other = gate.call_as(Some(&b), Method::POST, "/v1/leases", None).await;
    assert_eq!(
        other.status,
        StatusCode::CREATED,
        "another principal is served: {other:?}"
    );
    let one = burst
        .iter()
        .find(|r| r.status == StatusCode::CREATED)
        .expect("a lease")
        .str("id");
    let deleted = gate
        .call_as(Some(&a), Method::DELETE, &format!("/v1/leases/{one}"), None)
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    let again = gate.call_as(Some(&a), Method::POST, "/v1/leases", None).await;
    assert_eq!(again.status, StatusCode::CREATED, "{again:?}");
}

#[tokio::test]
async fn waiters_per_lock_and_per_principal_are_bounded() {
    let zk = zookeeper().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = test_config(&zk.connect_string());
    config.max_waiters_per_lock = 3;
    config.max_waiters_per_principal = 5;
    let (a, b) = with_two_principals(&mut config, &dir);
    let gate = Gate::start_with(config).await;

    let held = gate
        .call_as(Some(&b), Method::POST, "/v1/locks/hot/acquire?wait=0", None)
        .await;
    assert_eq!(held.status, StatusCode::OK, "{held:?}");
    // A burst of waiters: three queue, the rest are refused at once, not queued.
    let path = "/v1/locks/hot/acquire?wait=0&keep_queued=true";
    let burst = join_all((0..10).map(|_| gate.call_as(Some(&a), Method::POST, path, None))).await;
    assert_eq!(count(&burst, StatusCode::ACCEPTED), 3, "{burst:?}");
    for refused in burst.iter().filter(|r| r.status != StatusCode::ACCEPTED) {
        assert_refused(refused, "too-many");
    }
    let state = gate.call_as(Some(&b), Method::GET, "/v1/locks/hot", None).await;
    assert_eq!(state.body["waiters"].as_array().map(Vec::len), Some(3), "{state:?}");
    // A retry by a lease that already waits is never refused.
    let queued = burst.iter().find(|r| r.status == StatusCode::ACCEPTED).expect("queued");
    let lease = queued.body["lease"]["id"].as_str().expect("lease");
    let retry = gate
        .call_as(Some(&a), Method::POST, path, Some(json!({"lease": lease})))
        .await;
    assert_eq!(retry.status, StatusCode::ACCEPTED, "{retry:?}");

    // Per principal: `a` has 3 waiting; 2 more on other locks, then no more anywhere.
    for lock in ["x", "y"] {
        let holder = gate
            .call_as(
                Some(&b),
                Method::POST,
                &format!("/v1/locks/{lock}/acquire?wait=0"),
                None,
            )
            .await;
        assert_eq!(holder.status, StatusCode::OK);
        let waiting = gate
            .call_as(
                Some(&a),
                Method::POST,
                &format!("/v1/locks/{lock}/acquire?wait=0&keep_queued=true"),
                None,
            )
            .await;
        assert_eq!(waiting.status, StatusCode::ACCEPTED, "{waiting:?}");
    }
    let holder = gate
        .call_as(Some(&b), Method::POST, "/v1/locks/z/acquire?wait=0", None)
        .await;
    assert_eq!(holder.status, StatusCode::OK);
    let sixth = gate
        .call_as(
            Some(&a),
            Method::POST,
            "/v1/locks/z/acquire?wait=0&keep_queued=true",
            None,
        )
        .await;
    assert_refused(&sixth, "too-many");
    // Another principal is still served there.
    let b_campaigns = gate
        .call_as(
            Some(&b),
            Method::POST,
            "/v1/elections/z/campaign?wait=0",
            Some(json!({"value": "b"})),
        )
        .await;
    assert_eq!(b_campaigns.status, StatusCode::OK, "{b_campaigns:?}");
    // Once one of `a`'s waiters leaves, `a` may contend again.
    let gone = gate
        .call_as(Some(&a), Method::DELETE, &format!("/v1/leases/{lease}"), None)
        .await;
    assert_eq!(gone.status, StatusCode::NO_CONTENT);
    let free = gate
        .call_as(Some(&a), Method::POST, "/v1/locks/free/acquire?wait=0", None)
        .await;
    assert_eq!(free.status, StatusCode::OK, "{free:?}");
}

#[tokio::test]
async fn sockets_per_address_and_subscriptions_per_principal_are_bounded() {
    let zk = zookeeper().await;
    let mut config = test_config(&zk.connect_string());
    config.max_sockets_per_address = 3;
    config.max_subscriptions_per_principal = 4;
    let gate = Gate::start_with(config).await;
    let addr = gate.running.addr;

    let mut open = Vec::new();
    for _ in 0..3 {
        open.push(Ws::connect(addr, "/v1/ws").await);
    }
    match Ws::connect_with(addr, "/v1/ws", &[]).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status().as_u16(), 429);
            assert!(response.headers().contains_key("retry-after"));
        }
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("a fourth socket from one address was accepted"),
    }
    // HTTP is still served to that address.
    assert_eq!(gate.get("/v1/locks").await.status, StatusCode::OK);

    // Subscriptions: four over two sockets, the fifth refused; the socket stays usable.
    for (i, ws) in open.iter_mut().take(2).enumerate() {
        for j in 0..2 {
            let id = format!("s{i}{j}");
            ws.send(json!({"op": "subscribe", "id": id, "topic": {"lock": format!("l{i}{j}")}}));
            assert_eq!(ws.next_for(&id).await["type"], "state");
        }
    }
    let third = &mut open[2];
    third.send(json!({"op": "subscribe", "id": "s5", "topic": {"lock": "l5"}}));
    let refused = third.next_for("s5").await;
    assert_eq!(refused["type"], "urn:zkgate:problem:too-many", "{refused}");
    let reply = third.call("c1", "GET", "/v1/locks/l5", None).await;
    assert_eq!(reply["status"], 200, "{reply}");

    // Closing a socket frees its place and its subscriptions.
    let closed = open.remove(0);
    closed.close().await;
    let mut again = common::within(std::time::Duration::from_secs(10), "a socket accepted again", async {
        loop {
            if let Ok(ws) = Ws::connect_with(addr, "/v1/ws", &[]).await {
                return ws;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    again.send(json!({"op": "subscribe", "id": "s6", "topic": {"lock": "l6"}}));
    let accepted = common::within(
        std::time::Duration::from_secs(10),
        "a subscription accepted again",
        async {
            loop {
                let answer = again.next_for("s6").await;
                if answer["type"] == "state" {
                    return answer;
                }
                again.send(json!({"op": "subscribe", "id": "s6", "topic": {"lock": "l6"}}));
            }
        },
    )
    .await;
    assert_eq!(accepted["type"], "state");
}

/// Load: with its one turn (`--max-in-service 1`) held by a request that ZooKeeper does not
/// answer, the requests queued behind it are refused once they have waited the burst's
/// allowance (`--queue-delay-interval`), each with `503 overloaded` and `Retry-After`, never
/// left to time out; once the queue has stood that long, a new one is refused after the target
/// (5 ms). A lock acquire waiting for its turn behind a holder gave its turn back, and a
/// keepalive takes none: both are served while the queue stands. The queue empties when
/// ZooKeeper answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standing_queue_is_shed_with_retry_after_and_waiters_and_keepalives_take_no_turn() {
    let zk = zookeeper().await;
    let proxy = Proxy::start(&zk.connect_string()).await;
    let mut config = test_config(&proxy.connect_string());
    config.max_in_service = 1;
    config.queue_delay_target = Duration::from_millis(5);
    config.queue_delay_interval = Duration::from_secs(1);
    let gate = Arc::new(Gate::start_with(config).await);
    let admission = gate.running.state.admission.clone();
    let (holder, waiter) = (gate.lease("30s").await, gate.lease("30s").await);
    let held = gate.acquire("busy", &holder, "wait=0").await;
    assert_eq!(held.status, StatusCode::OK, "{held:?}");

    // A long poll: an acquire queued behind the holder. Once queued it waits by design, and
    // its turn goes back: a write is served meanwhile (were the turn still held, the write
    // would be refused after the burst's second).
    let waiting = {
        let (gate, waiter) = (gate.clone(), waiter.clone());
        tokio::spawn(async move { gate.acquire("busy", &waiter, "wait=30s").await })
    };
    within(Duration::from_secs(10), "the acquire to queue", async {
        loop {
            let lock = gate.get("/v1/locks/busy").await;
            if lock.body["waiters"].as_array().is_some_and(|w| !w.is_empty()) {
                return;
            }
        }
    })
    .await;
    let served = gate.call(Method::PUT, "/v1/kv/served", Some(json!(1))).await;
    assert_eq!(served.status, StatusCode::CREATED, "{served:?}");

    // ZooKeeper stops answering (shorter than the session timeout, 4 s): a write takes the
    // only turn and keeps it.
    proxy.black_hole(true);
    let stuck = {
        let gate = gate.clone();
        tokio::spawn(async move { gate.call(Method::PUT, "/v1/kv/stuck", Some(json!(2))).await })
    };
    within(Duration::from_secs(10), "the write to take the turn", async {
        while admission.in_service() < 1 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let queued = join_all((0..10).map(|i| {
        let gate = gate.clone();
        async move { gate.get(&format!("/v1/kv/queued-{i}?consistency=serializable")).await }
    }));
    let queued = within(Duration::from_secs(10), "the queued requests to be refused", queued).await;
    for reply in &queued {
        reply.assert_problem(StatusCode::SERVICE_UNAVAILABLE, None);
        assert_eq!(reply.body["type"], "urn:zkgate:problem:overloaded", "{reply:?}");
        assert!(reply.retry_after.is_some_and(|s| s >= 1), "{reply:?}");
        assert!(reply.str("detail").contains("1000 ms allowed"), "{reply:?}");
    }
    // The queue has stood for the interval: the target now.
    let late = gate.get("/v1/kv/late?consistency=serializable").await;
    assert_eq!(late.body["type"], "urn:zkgate:problem:overloaded", "{late:?}");
    assert!(late.str("detail").contains("5 ms allowed"), "{late:?}");
    let kept = gate.post(&format!("/v1/leases/{holder}/keepalive"), None).await;
    assert_eq!(kept.status, StatusCode::OK, "{kept:?}");

    proxy.black_hole(false);
    let stuck = within(Duration::from_secs(30), "the stuck write", stuck)
        .await
        .expect("task");
    assert_eq!(stuck.status, StatusCode::CREATED, "{stuck:?}");
    let after = gate.get("/v1/kv/stuck").await;
    assert_eq!(after.status, StatusCode::OK, "{after:?}");
    // The waiter is still queued behind the holder, and granted when it lets go.
    let released = gate
        .delete(&format!("/v1/locks/busy/handles/{}", held.str("handle")))
        .await;
    assert_eq!(released.status, StatusCode::NO_CONTENT, "{released:?}");
    let granted = within(Duration::from_secs(30), "the waiter's grant", waiting)
        .await
        .expect("task");
    assert_eq!(granted.status, StatusCode::OK, "{granted:?}");
}
