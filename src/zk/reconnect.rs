//! Reconnecting: how a session that cannot reach ZooKeeper tries again.
//!
//! While ZooKeeper is away an instance waits without spending CPU (docs/RELIABILITY.md,
//! "Through a ZooKeeper outage"): each session's backoff doubles up to [MAX_BACKOFF], and of the
//! sessions of a process that cannot reach the same servers one probes while the others wait
//! for it ([Probe]); when it connects, ZooKeeper is back and they all try at once. An outage is
//! said once per session (then every [SAY_AGAIN]), not on every try.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use zookeeper_client::Client;

use super::security::ConnectError;

/// The longest wait between two attempts to connect a session.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// How often a session that still cannot connect says so again.
const SAY_AGAIN: Duration = Duration::from_secs(30);

/// After how long without a try a [Probe]'s prober is taken to be gone (its supervisor
/// stopped), and another session takes its turn; also how often the others look.
const PROBER_GONE: Duration = Duration::from_secs(6);

/// The sessions of this process to the same servers, while they cannot connect: one of them,
/// the *prober*, tries every backoff, and the others wait until a session connects ([Probe::
/// back]), which is when ZooKeeper is back and they try at once. While ZooKeeper is away an
/// instance then tries about once every [MAX_BACKOFF], not once per session (each try is most
/// of what an idle instance spends then: `tests/it/outage/` measured 0.6 to 0.8% of a CPU
/// with every session trying, 0.5 to 0.7% with one, in a debug build), and it comes back soon
/// after the prober's
/// first try that works, not up to a whole backoff later for some of its sessions.
#[derive(Default)]
struct Probe {
    /// The prober's supervisor and when it last tried.
    prober: std::sync::Mutex<Option<(u64, tokio::time::Instant)>>,
    back: tokio::sync::Notify,
}

impl Probe {
    /// The probe of the servers `hosts`, shared by every session of the process to them.
    fn of(hosts: &str) -> Arc<Probe> {
        static PROBES: std::sync::LazyLock<std::sync::Mutex<std::collections::HashMap<String, Arc<Probe>>>> =
            std::sync::LazyLock::new(Default::default);
        let mut probes = PROBES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        probes.entry(hosts.to_string()).or_default().clone()
    }

    /// Whether supervisor `id` tries now: it is the prober, or becomes it (there is none, or
    /// the last one has not tried for [PROBER_GONE]).
    fn turn(&self, id: u64) -> bool {
        let mut prober = self.prober.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = tokio::time::Instant::now();
        match *prober {
            Some((other, at)) if other != id && now - at < PROBER_GONE => false,
            _ => {
                *prober = Some((id, now));
                true
            }
        }
    }

    /// Supervisor `id` connected: ZooKeeper is back, for every session waiting on it.
    fn connected(&self, id: u64) {
        let mut prober = self.prober.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if prober.is_some_and(|(p, _)| p == id) {
            *prober = None;
        }
        drop(prober);
        self.back.notify_waiters();
    }
}

/// Calls `connect` until it answers a client, for the session of lane `lane` to `hosts`. The
/// backoff doubles up to [MAX_BACKOFF], each wait drawn between half of it and all of it; of
/// the sessions of the process that cannot connect, one tries and the others wait for it
/// ([Probe]).
pub(super) async fn until_connected<F, Fut>(lane: usize, hosts: &str, mut connect: F) -> Client
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Client, ConnectError>>,
{
    static SUPERVISORS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let id = SUPERVISORS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let probe = Probe::of(hosts);
    let mut backoff = Duration::from_millis(100);
    // Said once, then every [SAY_AGAIN] while it lasts: an outage is one event, not a line
    // per session per try.
    let mut said: Option<tokio::time::Instant> = None;
    let mut tries = 0u64;
    // The first try is every session's own; then the prober's, or after ZooKeeper is back.
    let mut try_now = true;
    loop {
        // Registered before the try, so that a session connecting during it counts.
        let back = probe.back.notified();
        let trying = try_now || probe.turn(id);
        if trying {
            tries += 1;
            match connect().await {
                Ok(client) => {
                    probe.connected(id);
                    if tries > 1 {
                        tracing::info!(lane, tries, "ZooKeeper reached again");
                    }
                    return client;
                }
                Err(err) if said.is_none_or(|at| at.elapsed() >= SAY_AGAIN) => {
                    said = Some(tokio::time::Instant::now());
                    tracing::warn!(lane, hosts = %hosts, error = %err, tries, "cannot reach ZooKeeper; retrying");
                }
                Err(err) => tracing::debug!(lane, error = %err, tries, "cannot reach ZooKeeper yet"),
            }
        }
        let wait = match trying {
            true => backoff.mul_f64(rand::random_range(0.5..=1.0)),
            false => PROBER_GONE,
        };
        try_now = tokio::select! {
            _ = tokio::time::sleep(wait) => false,
            _ = back => true,
        };
        if trying {
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
}
