//! zkgate as its own process (the release binary), driven over kept-alive HTTP connections.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::process::{Child, wait_http_ok};

pub struct Zkgate {
    pub child: Child,
    pub base: String,
    pub http: reqwest::Client,
}

impl Zkgate {
    pub async fn start(connect: &str) -> Zkgate {
        Zkgate::start_with(connect, &[]).await
    }

    /// [Zkgate::start] with more arguments.
    pub async fn start_with(connect: &str, more: &[&str]) -> Zkgate {
        let port = zkgate::zk::server::free_port().expect("port");
        let base = format!("http://127.0.0.1:{port}");
        let listen = format!("127.0.0.1:{port}");
        let mut args = vec![
            "serve",
            "--zookeeper",
            connect,
            "--listen",
            &listen,
            // One client address drives all the load: measure zkgate, not its limits.
            "--write-rate",
            "0",
            "--max-waiters-per-lock",
            "100000",
            "--max-waiters-per-principal",
            "100000",
            "--max-leases-per-principal",
            "1000000",
            "--queue-max-depth",
            "1000000",
            // The put workload stores more items than one principal may by default.
            "--quota-bytes",
            "0",
            "--quota-znodes",
            "0",
            "--quota-bytes-per-principal",
            "0",
            "--quota-znodes-per-principal",
            "0",
        ];
        args.extend_from_slice(more);
        // `ZKGATE_BENCH_ZKGATE_ARGS="--worker-threads 1"`: variants of zkgate's own settings.
        let variant = std::env::var("ZKGATE_BENCH_ZKGATE_ARGS").unwrap_or_default();
        args.extend(variant.split_whitespace());
        // `ZKGATE_BENCH_BINARY=<path>`: another build of zkgate (an earlier commit's, to measure
        // a change before and after in one run of the same bench).
        let binary = std::env::var("ZKGATE_BENCH_BINARY").unwrap_or_else(|_| env!("CARGO_BIN_EXE_zkgate").into());
        let child = Child::spawn(&binary, &args);
        let http = super::http_client();
        wait_http_ok(&http, &format!("{base}/readyz")).await;
        Zkgate { child, base, http }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("zkgate answers");
        let status = response.status().as_u16();
        if status == 429 || status == 503 {
            // Every refusal says when to come back.
            assert!(
                response.headers().contains_key(reqwest::header::RETRY_AFTER),
                "{status} without Retry-After on {path}"
            );
        }
        let bytes = response.bytes().await.expect("body");
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    /// `POST /v1/leases/{lease}/keepalive`: zkgate's status.
    pub async fn keepalive(&self, lease: &str) -> u16 {
        let (status, _) = self
            .call(reqwest::Method::POST, &format!("/v1/leases/{lease}/keepalive"), None)
            .await;
        status
    }

    /// The value of the metric `name` (unlabelled) in `/metrics`, if zkgate has it.
    pub async fn metric(&self, name: &str) -> Option<f64> {
        let text = self.metrics_text().await?;
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }

    /// The series of `/metrics` that say where a request's time goes.
    pub async fn scrape(&self) -> super::scrape::Scrape {
        super::scrape::Scrape::parse(&self.metrics_text().await.expect("zkgate's /metrics"))
    }

    async fn metrics_text(&self) -> Option<String> {
        let response = self.http.get(format!("{}/metrics", self.base)).send().await.ok()?;
        response.text().await.ok()
    }

    pub async fn lease(&self, ttl: &str) -> String {
        let (status, body) = self
            .call(reqwest::Method::POST, "/v1/leases", Some(json!({ "ttl": ttl })))
            .await;
        assert_eq!(status, 201, "{body}");
        body["id"].as_str().expect("lease id").to_string()
    }

    /// Asks for `lock` for `lease`, waiting up to `wait`: zkgate's answer.
    async fn acquire_reply(&self, lock: &str, lease: &str, wait: &str) -> (u16, Value) {
        self.call(
            reqwest::Method::POST,
            &format!("/v1/locks/{lock}/acquire?wait={wait}"),
            Some(json!({ "lease": lease })),
        )
        .await
    }

    /// Acquires `lock` for `lease`, waiting up to `wait`: its handle, or `None` if not granted.
    async fn acquire(&self, lock: &str, lease: &str, wait: &str) -> Option<String> {
        let (status, body) = self.acquire_reply(lock, lease, wait).await;
        (status == 200).then(|| body["handle"].as_str().expect("handle").to_string())
    }

    async fn release(&self, lock: &str, handle: &str) {
        let (status, body) = self
            .call(
                reqwest::Method::DELETE,
                &format!("/v1/locks/{lock}/handles/{handle}"),
                None,
            )
            .await;
        assert_eq!(status, 204, "release of {lock} {handle}: {body}");
    }

    /// Acquire (waiting up to `wait`), then release; `None` if not granted.
    async fn cycle(&self, lock: &str, lease: &str, wait: &str) -> Option<()> {
        let handle = self.acquire(lock, lease, wait).await?;
        self.release(lock, &handle).await;
        Some(())
    }

    /// Acquires and releases `lock` for `lease`: when the grant was answered, or `None` if
    /// zkgate refused it (`429`, a limit reached; `503`, overloaded).
    pub async fn acquired_at(&self, lock: &str, lease: &str) -> Option<Instant> {
        let (status, body) = self.acquire_reply(lock, lease, "30s").await;
        let granted = Instant::now();
        if refused(status, &body) {
            return None;
        }
        assert_eq!(status, 200, "{body}");
        self.release(lock, body["handle"].as_str().expect("handle")).await;
        Some(granted)
    }

    /// Puts `items` items on `queue`, 32 at a time.
    pub async fn fill(self: &Arc<Self>, queue: &str, items: usize) {
        let (gate, path) = (self.clone(), format!("/v1/queues/{queue}/items"));
        super::stats::each_by_32(0..items, move |n| {
            let (gate, path) = (gate.clone(), path.clone());
            async move {
                let (status, _) = gate.call(reqwest::Method::POST, &path, Some(json!({ "n": n }))).await;
                assert_eq!(status, 201);
            }
        })
        .await;
    }

    /// Takes one item of `queue` (which must have one), then acknowledges it: when the take
    /// was answered, or `None` if zkgate refused it (`429`).
    pub async fn taken_at(&self, queue: &str) -> Option<Instant> {
        let path = format!("/v1/queues/{queue}/take?wait=30s&ack_deadline=60s");
        let (status, body) = self.call(reqwest::Method::POST, &path, None).await;
        let taken = Instant::now();
        if refused(status, &body) {
            return None;
        }
        assert_eq!(status, 200, "{body}");
        let claim = body["claim"].as_str().expect("claim");
        let ack = format!("/v1/queues/{queue}/claims/{claim}/ack");
        let (status, _) = self.call(reqwest::Method::POST, &ack, None).await;
        assert_eq!(status, 204);
        Some(taken)
    }

    /// Acquires `lock` for `lease`, which must be granted at once: its handle.
    pub async fn hold(&self, lock: &str, lease: &str) -> String {
        self.acquire(lock, lease, "0").await.expect("granted")
    }

    /// Uncontended cycles, one after the other, with one lease.
    pub async fn cycles(&self, count: usize) -> Vec<Duration> {
        let lease = self.lease("1h").await;
        self.cycles_with(&lease, count).await
    }

    /// Uncontended cycles, one after the other, with `lease` (which may be another instance's).
    pub async fn cycles_with(&self, lease: &str, count: usize) -> Vec<Duration> {
        let lease = lease.to_string();
        let mut samples = Vec::with_capacity(count);
        for _ in 0..count {
            let start = Instant::now();
            self.cycle("uncontended", &lease, "0").await.expect("granted");
            samples.push(start.elapsed());
        }
        samples
    }

    /// One uncontended cycle of lock `lock` with `lease` (an acquire and a release: two
    /// requests), for a measure of its own.
    pub async fn one_cycle(&self, lock: &str, lease: &str) {
        self.cycle(lock, lease, "0").await.expect("granted");
    }

    /// One `GET /healthz`.
    pub async fn health(&self) {
        let (status, _) = self.call(reqwest::Method::GET, "/healthz", None).await;
        assert_eq!(status, 200);
    }

    /// `GET /healthz` round trips: what HTTP alone costs (no ZooKeeper).
    pub async fn health_round_trips(&self, count: usize) -> Vec<Duration> {
        let mut samples = Vec::with_capacity(count);
        for _ in 0..count {
            let start = Instant::now();
            self.health().await;
            samples.push(start.elapsed());
        }
        samples
    }

    /// `clients` clients, each with its own lease, cycling on `locks` locks (client `i` on lock
    /// `i % locks`) for `duration`: grants per second.
    pub async fn contended(self: &Arc<Self>, clients: usize, locks: usize, duration: Duration) -> f64 {
        contended_across(std::slice::from_ref(self), clients, locks, duration).await
    }

    /// `producers` clients putting small JSON items for `duration`: items per second.
    pub async fn queue_put(self: &Arc<Self>, producers: usize, duration: Duration) -> f64 {
        super::stats::rate(producers, duration, |i, deadline| {
            let gate = self.clone();
            async move {
                let mut put = 0;
                while Instant::now() < deadline {
                    let path = "/v1/queues/bench-put/items";
                    let (status, body) = gate.call(reqwest::Method::POST, path, Some(json!({ "n": i }))).await;
                    assert_eq!(status, 201, "{body}");
                    put += 1;
                }
                put
            }
        })
        .await
    }

    /// `items` items put first, then taken at least once and acked by `consumers` clients,
    /// `batch` at a time (`max_items` and one batch ack; 1: one take and one ack per item):
    /// items per second of the take + ack phase.
    pub async fn queue_take_ack(self: &Arc<Self>, consumers: usize, items: usize, batch: usize) -> f64 {
        let queue = format!("bench-take-{batch}");
        self.fill(&queue, items).await;
        let taken = Arc::new(AtomicUsize::new(0));
        let start = Instant::now();
        let tasks: Vec<_> = (0..consumers)
            .map(|_| {
                let (gate, taken, queue) = (self.clone(), taken.clone(), queue.clone());
                tokio::spawn(async move {
                    loop {
                        if batch == 1 {
                            let path = format!("/v1/queues/{queue}/take?wait=0&ack_deadline=60s");
                            let (status, body) = gate.call(reqwest::Method::POST, &path, None).await;
                            if status == 204 {
                                return;
                            }
                            assert_eq!(status, 200, "{body}");
                            let claim = body["claim"].as_str().expect("claim");
                            let ack = format!("/v1/queues/{queue}/claims/{claim}/ack");
                            let (status, _) = gate.call(reqwest::Method::POST, &ack, None).await;
                            assert_eq!(status, 204);
                            taken.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        let path = format!("/v1/queues/{queue}/take?wait=0&ack_deadline=60s&max_items={batch}");
                        let (status, body) = gate.call(reqwest::Method::POST, &path, None).await;
                        if status == 204 {
                            return;
                        }
                        assert_eq!(status, 200, "{body}");
                        let claims: Vec<Value> = body["items"]
                            .as_array()
                            .expect("a batch")
                            .iter()
                            .map(|item| item["claim"].clone())
                            .collect();
                        let ack = format!("/v1/queues/{queue}/claims/ack");
                        let (status, answer) = gate
                            .call(reqwest::Method::POST, &ack, Some(json!({ "claims": claims })))
                            .await;
                        assert_eq!(status, 200, "{answer}");
                        let acked = answer["acked"].as_array().map_or(0, Vec::len);
                        assert_eq!(acked, claims.len(), "every claim acknowledged: {answer}");
                        taken.fetch_add(acked, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("consumer");
        }
        let elapsed = start.elapsed();
        assert_eq!(taken.load(Ordering::Relaxed), items, "every item taken once");
        items as f64 / elapsed.as_secs_f64()
    }

    /// The leader's lease is deleted while a second candidate waits: time until that
    /// candidate's campaign answers "leader".
    pub async fn failover(self: &Arc<Self>, rounds: usize) -> Vec<Duration> {
        let mut samples = Vec::new();
        for round in 0..rounds {
            let election = format!("/v1/elections/failover-{round}/campaign");
            let (a, b) = (self.lease("1h").await, self.lease("1h").await);
            let (status, _) = self
                .call(
                    reqwest::Method::POST,
                    &format!("{election}?wait=0"),
                    Some(json!({ "lease": a, "value": "a" })),
                )
                .await;
            assert_eq!(status, 200);
            // B joins the queue (202), then waits for leadership in a long poll.
            let queued = format!("{election}?wait=0&keep_queued=true");
            let (status, _) = self
                .call(
                    reqwest::Method::POST,
                    &queued,
                    Some(json!({ "lease": b, "value": "b" })),
                )
                .await;
            assert_eq!(status, 202);
            let gate = self.clone();
            let waiting = tokio::spawn(async move {
                let (status, _) = gate
                    .call(
                        reqwest::Method::POST,
                        &format!("{election}?wait=30s&keep_queued=true"),
                        Some(json!({ "lease": b, "value": "b" })),
                    )
                    .await;
                (status, Instant::now())
            });
            // Let the long poll reach zkgate before the leader goes (it resumes the queued
            // candidate, so arriving late would only shorten the measured time).
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            let start = Instant::now();
            let (status, _) = self
                .call(reqwest::Method::DELETE, &format!("/v1/leases/{a}"), None)
                .await;
            assert_eq!(status, 204);
            let (status, led_at) = waiting.await.expect("candidate");
            assert_eq!(status, 200);
            samples.push(led_at.saturating_duration_since(start));
        }
        samples
    }

    /// Extra resident memory per idle lease, over `count` leases.
    pub async fn idle_lease_bytes(self: &Arc<Self>, count: usize) -> f64 {
        let before = self.child.rss_bytes();
        self.hold_leases(count).await;
        (self.child.rss_bytes().saturating_sub(before)) as f64 / count as f64
    }

    /// Acquires the locks `held-<n>` for `n` in `from..to`, each with one of `leases` (round
    /// robin), 32 at a time, and keeps them.
    pub async fn hold_locks(self: &Arc<Self>, from: usize, to: usize, leases: &Arc<Vec<String>>) {
        let (gate, leases) = (self.clone(), leases.clone());
        super::stats::each_by_32(from..to, move |n| {
            let (gate, leases) = (gate.clone(), leases.clone());
            async move {
                let lease = &leases[n % leases.len()];
                let (status, body) = gate.acquire_reply(&format!("held-{n}"), lease, "0").await;
                assert_eq!(status, 200, "{body}");
            }
        })
        .await;
    }

    /// Puts the keys `<prefix>/k<n>` for `n` in `from..to`, 32 at a time.
    pub async fn put_keys(self: &Arc<Self>, prefix: &str, from: usize, to: usize) {
        let (gate, prefix) = (self.clone(), prefix.to_string());
        super::stats::each_by_32(from..to, move |n| {
            let url = format!("{}/v1/kv/{prefix}/k{n:07}", gate.base);
            let http = gate.http.clone();
            async move {
                let response = http.put(url).body("v").send().await.expect("put");
                assert_eq!(response.status().as_u16(), 201);
            }
        })
        .await;
    }

    /// `count` transactions (`POST /v1/kv-txn`) of `ops` puts each (`0`: single `PUT
    /// /v1/kv/{key}` instead), one after the other, of the keys `bench/kv/k<i>`.
    pub async fn kv_writes(&self, ops: usize, count: usize) -> Vec<Duration> {
        let mut samples = Vec::with_capacity(count);
        for _ in 0..count {
            let start = Instant::now();
            let response = match ops {
                0 => self.http.put(format!("{}/v1/kv/bench/kv/k0", self.base)).body("v"),
                ops => {
                    let then: Vec<serde_json::Value> = (0..ops)
                        .map(|i| serde_json::json!({ "put": format!("bench/kv/k{i}"), "text": "v" }))
                        .collect();
                    let body = serde_json::json!({ "then": then });
                    self.http.post(format!("{}/v1/kv-txn", self.base)).json(&body)
                }
            }
            .send()
            .await
            .expect("write");
            assert!(response.status().is_success(), "{}", response.status());
            response.bytes().await.expect("body");
            samples.push(start.elapsed());
        }
        samples
    }

    /// `count` reads of `path` (which must answer 200), one after the other.
    pub async fn reads(&self, path: &str, count: usize) -> Vec<Duration> {
        let mut samples = Vec::with_capacity(count);
        for _ in 0..count {
            let start = Instant::now();
            let response = self
                .http
                .get(format!("{}{path}", self.base))
                .send()
                .await
                .expect("read");
            assert_eq!(response.status().as_u16(), 200, "{path}");
            response.bytes().await.expect("body");
            samples.push(start.elapsed());
        }
        samples
    }

    /// Creates `count` leases (an hour's TTL) and leaves them idle.
    pub async fn hold_leases(self: &Arc<Self>, count: usize) {
        let gate = self.clone();
        super::stats::each_by_32(0..count, move |_| {
            let gate = gate.clone();
            async move {
                gate.lease("1h").await;
            }
        })
        .await;
    }

    /// Queues a waiter on `lock` for each of `leases` (`keep_queued`, each answered `202`): the
    /// first `in_order` one after the other (so that they are the head of the queue, in that
    /// order), the rest 32 at a time.
    pub async fn queue_waiters(self: &Arc<Self>, lock: &str, leases: &[String], in_order: usize) {
        let queue = |lease: String| {
            let (gate, path) = (
                self.clone(),
                format!("/v1/locks/{lock}/acquire?wait=0&keep_queued=true"),
            );
            async move {
                let (status, body) = gate
                    .call(reqwest::Method::POST, &path, Some(json!({ "lease": lease })))
                    .await;
                assert_eq!(status, 202, "{body}");
            }
        };
        for lease in &leases[..in_order] {
            queue(lease.clone()).await;
        }
        for chunk in leases[in_order..].chunks(32) {
            futures::future::join_all(chunk.iter().cloned().map(queue)).await;
        }
    }

    /// Hand-overs of `lock`, held by `holder` (lease, handle), to each of `next` (the head of its
    /// queue, in order): the next waiter long-polls, the holder releases, and the time from the
    /// release until the waiter's poll answers that it holds. The old holder then queues again
    /// at the tail, so that the queue keeps its length.
    pub async fn handovers(
        self: &Arc<Self>,
        lock: &str,
        mut holder: (String, String),
        next: &[String],
    ) -> Vec<Duration> {
        let mut samples = Vec::with_capacity(next.len());
        for lease in next {
            let (gate, path, body) = (
                self.clone(),
                format!("/v1/locks/{lock}/acquire?wait=30s&keep_queued=true"),
                json!({ "lease": lease }),
            );
            let poll = tokio::spawn(async move {
                let (status, body) = gate.call(reqwest::Method::POST, &path, Some(body)).await;
                (status, body, Instant::now())
            });
            // Let the long poll reach zkgate before the release (arriving late would only
            // shorten the time measured).
            tokio::time::sleep(Duration::from_millis(20)).await;
            let start = Instant::now();
            self.release(lock, &holder.1).await;
            let (status, body, granted) = poll.await.expect("poll");
            assert_eq!(status, 200, "{body}");
            samples.push(granted.saturating_duration_since(start));
            let requeue = format!("/v1/locks/{lock}/acquire?wait=0&keep_queued=true");
            let (status, answer) = self
                .call(reqwest::Method::POST, &requeue, Some(json!({ "lease": holder.0 })))
                .await;
            assert_eq!(status, 202, "{answer}");
            holder = (lease.clone(), body["handle"].as_str().expect("handle").to_string());
        }
        samples
    }

    /// Opens `count` WebSockets, each subscribed to `topic` (a JSON topic), and keeps them: each
    /// has had the topic's first `state` when this returns.
    pub async fn subscribers(&self, topic: &Value, count: usize) -> Vec<Subscriber> {
        use futures::{SinkExt, StreamExt};
        let url = format!("{}/v1/ws", self.base.replacen("http://", "ws://", 1));
        let mut sockets = Vec::with_capacity(count);
        for chunk in (0..count).collect::<Vec<_>>().chunks(32) {
            let opened = futures::future::join_all(chunk.iter().map(|_| async {
                let (mut socket, _) = tokio_tungstenite::connect_async(&url).await.expect("socket");
                let subscribe = json!({ "op": "subscribe", "id": "s", "topic": topic }).to_string();
                socket.send(subscribe.into()).await.expect("subscribe");
                let first = socket.next().await.expect("a message").expect("a frame");
                let first: Value = serde_json::from_str(first.to_text().expect("text")).expect("JSON");
                assert_eq!(first["type"], "state", "{first}");
                socket
            }))
            .await;
            sockets.extend(opened);
        }
        sockets
    }
}

pub type Subscriber = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// [Zkgate::contended] with the clients spread over `gates` (client `i` on gate `i % n`, with a
/// lease of that gate).
pub async fn contended_across(gates: &[Arc<Zkgate>], clients: usize, locks: usize, duration: Duration) -> f64 {
    let gates = gates.to_vec();
    super::stats::rate(clients, duration, |i, deadline| {
        let gate = gates[i % gates.len()].clone();
        async move {
            let lease = gate.lease("1h").await;
            let lock = format!("c{locks}-{}", i % locks);
            let mut granted = 0;
            while Instant::now() < deadline {
                if gate.cycle(&lock, &lease, "30s").await.is_some() && Instant::now() < deadline {
                    granted += 1;
                }
            }
            granted
        }
    })
    .await
}

/// What [round_robin] measured: cycles a second, and the requests the clients sent.
pub struct RoundRobin {
    pub rate: f64,
    pub requests: usize,
}

/// Contended cycles (acquire, release) behind a round-robin balancer over `gates`: each
/// client's requests go to the next instance in turn, whichever keeps its lease, as a plain
/// load balancer deals them, and every eighth cycle also keeps its lease alive. `clients`
/// clients on `locks` locks for `duration`.
pub async fn round_robin(gates: &[Arc<Zkgate>], clients: usize, locks: usize, duration: Duration) -> RoundRobin {
    let gates = gates.to_vec();
    let requests = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let sent = requests.clone();
    let rate = super::stats::rate(clients, duration, move |i, deadline| {
        let (gates, sent) = (gates.clone(), sent.clone());
        async move {
            let mut turn = i;
            let mut next = || {
                turn += 1;
                sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                gates[turn % gates.len()].clone()
            };
            let lease = next().lease("1h").await;
            let lock = format!("rr{locks}-{}", i % locks);
            let mut granted = 0;
            while Instant::now() < deadline {
                let Some(handle) = next().acquire(&lock, &lease, "30s").await else {
                    continue;
                };
                next().release(&lock, &handle).await;
                if Instant::now() < deadline {
                    granted += 1;
                }
                // Every eighth cycle (17 requests, not a multiple of three: a keepalive every
                // tenth cycle, 21 requests on, always reached the instance of the lease, its
                // keeper, and hid what round robin costs).
                if granted % 8 == 0 {
                    assert_eq!(next().keepalive(&lease).await, 200);
                }
            }
            granted
        }
    })
    .await;
    RoundRobin {
        rate,
        requests: requests.load(std::sync::atomic::Ordering::Relaxed),
    }
}

/// Whether zkgate refused a request for load: a limit reached (`429`) or a request shed after
/// waiting too long for its turn (`503 overloaded`); any other failure fails the bench.
fn refused(status: u16, body: &Value) -> bool {
    status == 429 || (status == 503 && body["type"] == "urn:zkgate:problem:overloaded")
}
