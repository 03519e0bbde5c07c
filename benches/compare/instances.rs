//! Instances that stop and die under load: three zkgate instances on the 3-server ensemble,
//! 32 clients each with a lease kept alive every second and acquiring then releasing a lock of
//! its own in a loop, every request to the next instance up (a round-robin load balancer that
//! retries a request no instance answered, as a client library would). Then a rolling restart
//! (SIGTERM, start again, next) or a `kill -9` of one instance (started again at once), and
//! what the clients saw: the cycles per second before and during, the leases that ended
//! (`404`/`410`: the client made a new one), the requests sent again, and the longest time
//! between two answered keepalives of one client.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::gate::Zkgate;

const CLIENTS: usize = 32;
const TTL: &str = "10s";
const KEEPALIVE_EVERY: Duration = Duration::from_secs(1);
/// How often the cycles done are sampled, and the window a rate is taken over.
const SAMPLE: Duration = Duration::from_millis(100);
const WINDOW: usize = 5;

/// What goes wrong in a run.
#[derive(Clone, Copy)]
pub enum Disruption {
    /// SIGTERM to each instance in turn, started again before the next.
    RollingRestart,
    /// `kill -9` of one instance, started again at once.
    Kill9,
}

impl Disruption {
    fn describe(self) -> &'static str {
        match self {
            Disruption::RollingRestart => "rolling restart of 3 instances (SIGTERM, start again, next)",
            Disruption::Kill9 => "kill -9 of one of 3 instances (started again at once)",
        }
    }
}

/// The instances up, taken in turn.
#[derive(Clone)]
struct Pool {
    urls: Arc<Mutex<Vec<String>>>,
    next: Arc<AtomicUsize>,
}

impl Pool {
    fn next(&self) -> String {
        let urls = self.urls.lock().unwrap();
        urls[self.next.fetch_add(1, Ordering::Relaxed) % urls.len()].clone()
    }
}

#[derive(Default)]
struct Tally {
    cycles: AtomicU64,
    requests: AtomicU64,
    /// Requests that reached no instance or were answered 5xx, and were sent again.
    again: AtomicU64,
    /// Leases found ended (`404`/`410`).
    lost: AtomicU64,
    /// The longest time between two answered keepalives of one client, in µs.
    longest_gap_us: AtomicU64,
}

struct Clients {
    http: reqwest::Client,
    pool: Pool,
    tally: Tally,
    stop: AtomicBool,
}

impl Clients {
    /// Sends the request to the next instance until one answers below 500 (or the run stops).
    async fn send(&self, method: reqwest::Method, path: &str, body: Option<&Value>) -> Option<(u16, Value)> {
        while !self.stop.load(Ordering::Relaxed) {
            self.tally.requests.fetch_add(1, Ordering::Relaxed);
            let mut request = self
                .http
                .request(method.clone(), format!("{}{path}", self.pool.next()))
                .timeout(Duration::from_secs(5));
            if let Some(body) = body {
                request = request.json(body);
            }
            match request.send().await {
                Ok(reply) if reply.status().as_u16() < 500 => {
                    let status = reply.status().as_u16();
                    let bytes = reply.bytes().await.unwrap_or_default();
                    return Some((status, serde_json::from_slice(&bytes).unwrap_or(Value::Null)));
                }
                _ => {
                    self.tally.again.fetch_add(1, Ordering::Relaxed);
                    // Backing off a little, as a client would: not a synchronisation.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
        None
    }

    async fn new_lease(&self) -> Option<String> {
        let (status, body) = self
            .send(reqwest::Method::POST, "/v1/leases", Some(&json!({ "ttl": TTL })))
            .await?;
        assert_eq!(status, 201, "{body}");
        Some(body["id"].as_str().expect("lease id").to_string())
    }

    /// Keeps `lease` alive every second; a lease found ended is counted and made again.
    async fn keep(self: Arc<Self>, lease: Arc<Mutex<String>>) {
        let mut answered = Instant::now();
        while !self.stop.load(Ordering::Relaxed) {
            tokio::time::sleep(KEEPALIVE_EVERY).await;
            let id = lease.lock().unwrap().clone();
            let Some((status, _)) = self
                .send(reqwest::Method::POST, &format!("/v1/leases/{id}/keepalive"), None)
                .await
            else {
                return;
            };
            match status {
                200 => {
                    let gap = answered.elapsed().as_micros() as u64;
                    self.tally.longest_gap_us.fetch_max(gap, Ordering::Relaxed);
                    answered = Instant::now();
                }
                404 | 410 => {
                    self.tally.lost.fetch_add(1, Ordering::Relaxed);
                    let Some(fresh) = self.new_lease().await else { return };
                    *lease.lock().unwrap() = fresh;
                    answered = Instant::now();
                }
                other => panic!("keepalive answered {other}"),
            }
        }
    }

    /// Acquires (`wait=0`) and releases lock `roll-<i>` in a loop.
    async fn cycle(self: Arc<Self>, i: usize, lease: Arc<Mutex<String>>) {
        let lock = format!("/v1/locks/roll-{i}");
        while !self.stop.load(Ordering::Relaxed) {
            let id = lease.lock().unwrap().clone();
            let body = json!({ "lease": id });
            let Some((status, held)) = self
                .send(reqwest::Method::POST, &format!("{lock}/acquire?wait=0"), Some(&body))
                .await
            else {
                return;
            };
            if status != 200 {
                // The lease ended (the keepalive makes a new one) or the lock is still held by
                // an ended lease of this client's: try again shortly.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            let handle = held["handle"].as_str().expect("handle");
            let Some((released, _)) = self
                .send(reqwest::Method::DELETE, &format!("{lock}/handles/{handle}"), None)
                .await
            else {
                return;
            };
            if released == 204 {
                self.tally.cycles.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Three instances on the ensemble at `connect` (each started with `flags`), the clients, then
/// the disruption: one line of a Markdown table.
pub async fn under(connect: &str, flags: &[&str], disruption: Disruption, steady: Duration) -> String {
    let mut gates = Vec::new();
    for _ in 0..3 {
        gates.push(Zkgate::start_with(connect, flags).await);
    }
    let clients = Arc::new(Clients {
        http: super::http_client(),
        pool: Pool {
            urls: Arc::new(Mutex::new(gates.iter().map(|g| g.base.clone()).collect())),
            next: Arc::default(),
        },
        tally: Tally::default(),
        stop: AtomicBool::new(false),
    });
    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        let lease = Arc::new(Mutex::new(clients.new_lease().await.expect("a lease")));
        tasks.push(tokio::spawn(clients.clone().keep(lease.clone())));
        tasks.push(tokio::spawn(clients.clone().cycle(i, lease)));
    }
    let samples = Arc::new(Mutex::new(Vec::new()));
    let sampler = {
        let (clients, samples) = (clients.clone(), samples.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SAMPLE);
            while !clients.stop.load(Ordering::Relaxed) {
                tick.tick().await;
                samples
                    .lock()
                    .unwrap()
                    .push(clients.tally.cycles.load(Ordering::Relaxed));
            }
        })
    };

    // Steady: the rate before, and the share of requests one instance passed to another.
    let handed = async |gates: &[Zkgate]| {
        let mut sum = 0.0;
        for gate in gates {
            sum += gate.metric("zkgate_handoffs_total").await?;
        }
        Some(sum)
    };
    tokio::time::sleep(Duration::from_secs(1)).await; // warm-up, not a synchronisation
    let (handed_before, requests_before) = (handed(&gates).await, clients.tally.requests.load(Ordering::Relaxed));
    tokio::time::sleep(steady).await; // the steady phase's length
    let share_handed = handed(&gates).await.zip(handed_before).map(|(after, before)| {
        let requests = clients.tally.requests.load(Ordering::Relaxed) - requests_before;
        (after - before) / requests as f64
    });
    let again_before = clients.tally.again.load(Ordering::Relaxed);
    let from = samples.lock().unwrap().len();
    let started = Instant::now();
    match disruption {
        Disruption::RollingRestart => {
            for (i, gate) in gates.iter_mut().enumerate() {
                gate.child.stop(libc::SIGTERM);
                let fresh = Zkgate::start_with(connect, flags).await;
                clients.pool.urls.lock().unwrap()[i] = fresh.base.clone();
                *gate = fresh;
            }
        }
        Disruption::Kill9 => {
            gates[0].child.stop(libc::SIGKILL);
            let fresh = Zkgate::start_with(connect, flags).await;
            clients.pool.urls.lock().unwrap()[0] = fresh.base.clone();
            gates[0] = fresh;
        }
    }
    let took = started.elapsed();
    // After: three times the steady phase (past a default session timeout in a full run), so
    // that a lease that ended with its instance is noticed, and the rate settles.
    tokio::time::sleep(3 * steady).await; // the phase's length, not a synchronisation
    clients.stop.store(true, Ordering::Relaxed);
    sampler.await.expect("sampler");
    for task in tasks {
        task.await.expect("client");
    }

    let samples = samples.lock().unwrap().clone();
    let per_second = |window: &[u64]| {
        (window[window.len() - 1] - window[0]) as f64 / (SAMPLE.as_secs_f64() * (window.len() - 1) as f64)
    };
    let before = per_second(&samples[..from]);
    let during: Vec<f64> = samples[from.saturating_sub(1)..]
        .windows(WINDOW + 1)
        .map(per_second)
        .collect();
    let lowest = during.iter().copied().fold(f64::INFINITY, f64::min);
    let below_half = samples[from.saturating_sub(1)..]
        .windows(2)
        .filter(|pair| per_second(pair) < before / 2.0)
        .count() as f64
        * SAMPLE.as_secs_f64();
    let tally = &clients.tally;
    format!(
        "| {} | {before:.0}/s | {:.0}/s ({:.0}%) | {below_half:.1} s | {} of {CLIENTS} | {} | {:.0} ms | {} | {:.1} s |",
        disruption.describe(),
        lowest,
        100.0 * lowest / before,
        tally.lost.load(Ordering::Relaxed),
        tally.again.load(Ordering::Relaxed) - again_before,
        tally.longest_gap_us.load(Ordering::Relaxed) as f64 / 1000.0,
        share_handed.map_or("–".to_string(), |share| format!("{:.1}%", 100.0 * share)),
        took.as_secs_f64(),
    )
}

/// The header of [under]'s table.
pub const HEADER: &str = "| 32 clients, lease kept alive every 1 s (TTL 10 s), lock cycles through any instance | cycles before | lowest over 500 ms (of before) | time below half | leases ended | requests sent again | longest between two answered keepalives | requests passed between instances (steady) | disruption took |\n|---|---|---|---|---|---|---|---|---|";
