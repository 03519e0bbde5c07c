//! etcd's HTTP lock and election API (its JSON gRPC gateway, `/v3/lock/*`, `/v3/election/*`):
//! what a user would reach for instead of zkgate. A single-member etcd from Debian's
//! `etcd-server` package, its data in memory (`/dev/shm`) so that fsyncs cost about what
//! ZooKeeper's `forceSync=no` does.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

use super::process::{Child, wait_http_ok};

pub struct Etcd {
    child: Child,
    _data: tempfile::TempDir,
    base: String,
    http: reqwest::Client,
    refused: std::sync::atomic::AtomicUsize,
}

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

impl Etcd {
    /// `None` when etcd is not installed (`apt-get install etcd-server`).
    pub async fn start() -> Option<Etcd> {
        let program = ["/usr/bin/etcd", "/usr/local/bin/etcd"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())?;
        let shm = std::path::Path::new("/dev/shm");
        let data = if shm.is_dir() {
            tempfile::tempdir_in(shm)
        } else {
            tempfile::tempdir()
        }
        .expect("data dir");
        let (client, peer) = (
            zkgate::zk::server::free_port().expect("port"),
            zkgate::zk::server::free_port().expect("port"),
        );
        let client_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = Child::spawn(
            program,
            &[
                "--name",
                "bench",
                "--data-dir",
                data.path().to_str().expect("utf-8"),
                "--listen-client-urls",
                &client_url,
                "--advertise-client-urls",
                &client_url,
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
                "--initial-cluster",
                &format!("bench={peer_url}"),
                "--log-level",
                "error",
                "--logger",
                "zap",
            ],
        );
        let http = super::http_client();
        wait_http_ok(&http, &format!("{client_url}/health")).await;
        Some(Etcd {
            child,
            _data: data,
            base: client_url,
            http,
            refused: Default::default(),
        })
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        loop {
            let response = self
                .http
                .post(format!("{}{path}", self.base))
                .json(&body)
                .send()
                .await
                .expect("etcd answers");
            let status = response.status();
            let answer: Value = response.json().await.expect("JSON");
            // etcd sheds load when its applying falls 5,000 entries behind its log ("too many
            // requests"): a client tries again, as a user's would, and the wait counts.
            if status.is_server_error()
                && answer["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("too many requests"))
            {
                self.refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(1)).await;
                continue;
            }
            assert!(status.is_success(), "{path}: {status} {answer}");
            return answer;
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// How many requests etcd has refused as too many (each tried again).
    pub fn refused(&self) -> usize {
        self.refused.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub async fn lease(&self, ttl_seconds: u64) -> String {
        let body = self.post("/v3/lease/grant", json!({ "TTL": ttl_seconds })).await;
        body["ID"].as_str().expect("lease ID").to_string()
    }

    /// Lock (blocking until granted), then unlock.
    async fn cycle(&self, lock: &str, lease: &str) {
        let locked = self
            .post("/v3/lock/lock", json!({ "name": b64(lock), "lease": lease }))
            .await;
        let key = locked["key"].as_str().expect("lock key");
        self.post("/v3/lock/unlock", json!({ "key": key })).await;
    }

    /// Locks and unlocks `lock` with `lease`: when the lock was answered (granted).
    pub async fn acquired_at(&self, lock: &str, lease: &str) -> Instant {
        let locked = self
            .post("/v3/lock/lock", json!({ "name": b64(lock), "lease": lease }))
            .await;
        let granted = Instant::now();
        let key = locked["key"].as_str().expect("lock key");
        self.post("/v3/lock/unlock", json!({ "key": key })).await;
        granted
    }

    /// `count` transactions (`POST /v3/kv/txn`) of `ops` puts each (`0`: single puts through
    /// `/v3/kv/put` instead), one after the other, of the keys `bench/kv/k<i>`.
    pub async fn kv_writes(&self, ops: usize, count: usize) -> Vec<Duration> {
        let put = |i: usize| json!({ "key": b64(&format!("bench/kv/k{i}")), "value": b64("v") });
        let mut samples = Vec::with_capacity(count);
        for _ in 0..count {
            let start = Instant::now();
            match ops {
                0 => {
                    self.post("/v3/kv/put", put(0)).await;
                }
                ops => {
                    let success: Vec<Value> = (0..ops).map(|i| json!({ "requestPut": put(i) })).collect();
                    let answer = self.post("/v3/kv/txn", json!({ "success": success })).await;
                    assert_eq!(answer["succeeded"], true, "{answer}");
                }
            }
            samples.push(start.elapsed());
        }
        samples
    }

    pub async fn cycles(&self, count: usize) -> Vec<Duration> {
        let lease = self.lease(3600).await;
        let mut samples = Vec::with_capacity(count);
        for _ in 0..count {
            let start = Instant::now();
            self.cycle("uncontended", &lease).await;
            samples.push(start.elapsed());
        }
        samples
    }

    pub async fn contended(self: &Arc<Self>, clients: usize, locks: usize, duration: Duration) -> f64 {
        super::stats::rate(clients, duration, |i, deadline| {
            let etcd = self.clone();
            async move {
                let lease = etcd.lease(3600).await;
                let lock = format!("c{locks}-{}", i % locks);
                let mut granted = 0;
                while Instant::now() < deadline {
                    etcd.cycle(&lock, &lease).await;
                    if Instant::now() < deadline {
                        granted += 1;
                    }
                }
                granted
            }
        })
        .await
    }

    /// The leader's lease is revoked while a second candidate's campaign blocks: time until
    /// that campaign returns.
    pub async fn failover(self: &Arc<Self>, rounds: usize) -> Vec<Duration> {
        let mut samples = Vec::new();
        for round in 0..rounds {
            let name = format!("failover-{round}");
            let (a, b) = (self.lease(3600).await, self.lease(3600).await);
            self.post(
                "/v3/election/campaign",
                json!({ "name": b64(&name), "value": b64("a"), "lease": a }),
            )
            .await;
            let etcd = self.clone();
            let campaign = json!({ "name": b64(&name), "value": b64("b"), "lease": b });
            let waiting = tokio::spawn(async move {
                etcd.post("/v3/election/campaign", campaign).await;
                Instant::now()
            });
            // Until B's key exists (its campaign is queued), then revoke A's lease.
            let prefix = format!("{name}/");
            let end = format!("{name}0"); // the prefix's range end: '/' + 1 = '0'
            loop {
                let range = self
                    .post(
                        "/v3/kv/range",
                        json!({ "key": b64(&prefix), "range_end": b64(&end), "count_only": true }),
                    )
                    .await;
                if range["count"].as_str().and_then(|c| c.parse::<u64>().ok()) == Some(2) {
                    break;
                }
                tokio::task::yield_now().await;
            }
            let start = Instant::now();
            self.post("/v3/lease/revoke", json!({ "ID": a })).await;
            let led_at = waiting.await.expect("candidate");
            samples.push(led_at.saturating_duration_since(start));
        }
        samples
    }
}
