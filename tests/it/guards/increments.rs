//! Sixteen clients incrementing one key under one lock through two processes, one killed -9:
//! guarded, no update lost; unguarded, one is.

use super::*;
use crate::common;
use common::sse::Sse;
use common::{Reply, zookeeper};
use serde_json::{Value, json};
use std::time::Duration;

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
    let (value, etag) = read(&http, url, key).await;
    // No keepalive: the lease expires, the lock passes on, and the others write. Waits for
    // their write (a long poll on the key's version), not for time.
    changed_from(&http, url, key, &etag).await;
    let guard = lock_guard(lock, &held.str("handle"));
    let guard = guarded.then_some(guard.as_str());
    let written = kv(url, Method::PUT, key, Some(json!(value + 1)), guard).await;
    if guarded {
        assert_eq!(written.body["type"], "urn:zkgate:problem:guard-lost", "{written:?}");
    }
    written.status.is_success()
}

/// Kv key `key` at `url`: its value (a number) and its ETag.
async fn read(http: &reqwest::Client, url: &str, key: &str) -> (i64, String) {
    let read = http.get(format!("{url}/v1/kv/{key}")).send().await.expect("read");
    let etag = read.headers()["etag"].to_str().expect("etag").to_string();
    (read.json().await.expect("a number"), etag)
}

/// The value of kv key `key` at `url` once it is no longer at `etag` (a long poll).
async fn changed_from(http: &reqwest::Client, url: &str, key: &str, etag: &str) -> i64 {
    let changed = http
        .get(format!("{url}/v1/kv/{key}?wait=60s"))
        .header("If-None-Match", etag)
        .send()
        .await
        .expect("long poll");
    assert_eq!(changed.status(), StatusCode::OK, "the key changed within the wait");
    changed.json().await.expect("a number")
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
        let http = common::http_client();
        let mut events = Sse::open(&http, &format!("{}/v1/locks/{lock}/events", kept.url), None).await;
        let paused = {
            let url = kept.url.clone();
            tokio::spawn(async move { a_paused_holder(&url, (lock, key), guarded).await })
        };
        // The paused holder takes the lock first: the others queue behind it.
        let topic = format!("lock:{lock}");
        events
            .until(&topic, &mut Vec::new(), |e| e["state"]["holder"].is_object())
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
        let quarter = (CLIENTS * EACH / 4) as i64;
        common::within(Duration::from_secs(60), "a quarter of the increments", async {
            while changed_from(&http, &kept.url, key, &read(&http, &kept.url, key).await.1).await < quarter {}
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
