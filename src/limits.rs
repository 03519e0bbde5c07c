//! Limits that hold under abuse: how much one principal (or, for sockets and requests, one
//! client address) may hold or ask at once. Every refusal is a 429 problem document with
//! `Retry-After` naming the limit; nothing queues without bound and nobody else is slowed.
//!
//! - the rate of writes (every request but `GET`/`HEAD`: they cost ZooKeeper writes and
//!   watches), per principal (per client address when auth is off): a token bucket;
//! - open WebSockets per principal and per client address, subscriptions per principal;
//! - long polls in flight per principal and on the whole instance (each holds a connection
//!   and a task for up to `--max-wait`);
//! - live leases per principal, queued contenders per principal and per lock ([crate::recipes::leases]
//!   and the acquire handlers ask here);
//! - request bodies (413) and waits (capped) are bounded where they are read; queue depth
//!   where items are put.
//!
//! With auth off every caller is the same principal, so the per-principal limits are limits
//! of the whole instance; the per-address ones still tell clients apart.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::Method;
use tokio::time::Instant;

use crate::auth::Caller;
use crate::locked::{Locked, count_down};

pub use crate::listen::ClientAddr;

/// The limits, from the command line.
#[derive(Clone, Copy, Debug)]
pub struct LimitSettings {
    /// Writes per second per principal (per address with auth off); 0 turns it off.
    pub write_rate: u32,
    pub leases_per_principal: usize,
    pub waiters_per_principal: usize,
    pub waiters_per_lock: usize,
    pub sockets_per_principal: usize,
    pub sockets_per_address: usize,
    pub subscriptions_per_principal: usize,
    /// Requests to endpoints that may wait, in flight per principal and in all.
    pub long_polls_per_principal: usize,
    pub long_polls: usize,
}

/// Counters and buckets shared by the whole instance.
pub struct Limits {
    pub settings: LimitSettings,
    buckets: Mutex<HashMap<String, Bucket>>,
    held: Arc<Mutex<HashMap<String, usize>>>,
    /// Sent whenever a count in `held` changes, for [Limits::wait_held].
    changed: Arc<tokio::sync::watch::Sender<()>>,
}

/// A token bucket: `rate` tokens a second, up to one second's worth in reserve.
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Most buckets kept; beyond, the full ones (idle clients) are forgotten.
const MAX_BUCKETS: usize = 100_000;

impl Limits {
    pub fn new(settings: LimitSettings) -> Limits {
        Limits {
            settings,
            buckets: Mutex::default(),
            held: Arc::default(),
            changed: Arc::new(tokio::sync::watch::Sender::new(())),
        }
    }

    /// Takes one token from `key`'s bucket, or says how long until there is one.
    fn take(&self, key: &str) -> Result<(), Duration> {
        let rate = f64::from(self.settings.write_rate);
        let now = Instant::now();
        let mut buckets = self.buckets.locked();
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(key) {
            buckets.retain(|_, b| b.tokens + now.duration_since(b.at).as_secs_f64() * rate < rate);
        }
        let bucket = buckets
            .entry(key.to_string())
            .or_insert(Bucket { tokens: rate, at: now });
        bucket.tokens = (bucket.tokens + now.duration_since(bucket.at).as_secs_f64() * rate).min(rate);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - bucket.tokens) / rate))
        }
    }

    /// Holds one of at most `max` of `key` (a socket, a subscription) until the permit drops.
    pub fn hold(&self, key: String, max: usize, what: &str) -> Result<Permit, Refusal> {
        let mut held = self.held.locked();
        let count = held.entry(key.clone()).or_default();
        if *count >= max {
            return Err(refusal(
                format!("at most {max} {what}; close one first"),
                Duration::from_secs(1),
            ));
        }
        *count += 1;
        self.changed.send_replace(());
        Ok(Permit {
            key,
            held: self.held.clone(),
            changed: self.changed.clone(),
        })
    }

    /// How many of `key` are held now.
    pub fn held(&self, key: &str) -> usize {
        let held = self.held.locked();
        held.get(key).copied().unwrap_or(0)
    }

    /// Waits until `test` accepts the count of `key` held (a drain, or a test waiting for
    /// the permits of clients that went away to come back).
    pub async fn wait_held(&self, key: &str, test: impl Fn(usize) -> bool) {
        // Subscribed before looking, so that a change after the look is not missed.
        let mut changes = self.changed.subscribe();
        while !test(self.held(key)) {
            if changes.changed().await.is_err() {
                return;
            }
        }
    }
}

/// The key under which the instance's long polls are counted in all.
pub const LONG_POLLS: &str = "long polls";

impl Limits {
    /// A long poll of `caller` counted against the per-principal and the instance's limits
    /// until the permits drop.
    pub fn long_poll(&self, caller: &Caller, address: Option<ClientAddr>) -> Result<[Permit; 2], Refusal> {
        let settings = self.settings;
        let key = client_key(caller, address);
        let own = self.hold(
            format!("long polls of {key}"),
            settings.long_polls_per_principal,
            &format!("long polls in flight for {key} (--max-long-polls-per-principal)"),
        )?;
        let all = self.hold(
            LONG_POLLS.to_string(),
            settings.long_polls,
            "long polls in flight on this instance (--max-long-polls)",
        )?;
        Ok([own, all])
    }
}

/// One socket or subscription counted against its limit; released when dropped.
pub struct Permit {
    key: String,
    held: Arc<Mutex<HashMap<String, usize>>>,
    changed: Arc<tokio::sync::watch::Sender<()>>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        count_down(&mut self.held.locked(), &self.key);
        self.changed.send_replace(());
    }
}

/// Which kind of limit refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// The rate of writes.
    Rate,
    /// How many of something may be held at once (sockets, subscriptions, waiters, leases).
    Held,
}

/// What a limit says when it refuses: HTTP 429 with `Retry-After`.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub limit: Limit,
    pub detail: String,
    /// When trying again may succeed.
    pub retry_after: Duration,
}

/// The refusal of a limit on what is held.
pub fn refusal(detail: String, retry_after: Duration) -> Refusal {
    Refusal {
        limit: Limit::Held,
        detail,
        retry_after,
    }
}

/// The key of `caller` for per-principal limits: its principal, or with auth off `address`
/// (when known).
pub fn client_key(caller: &Caller, address: Option<ClientAddr>) -> String {
    match caller.name() {
        Some(name) => format!("principal:{name}"),
        None => match address {
            Some(ClientAddr(ip)) => format!("address:{ip}"),
            None => "anyone".to_string(),
        },
    }
}

impl Limits {
    /// A write (any method but `GET`/`HEAD`) takes a token from the caller's bucket; 429 with
    /// the time until the next token when there is none.
    pub fn check_rate(&self, caller: &Caller, method: &Method, address: Option<ClientAddr>) -> Result<(), Refusal> {
        let write = !matches!(*method, Method::GET | Method::HEAD);
        if !write || self.settings.write_rate == 0 {
            return Ok(());
        }
        let key = client_key(caller, address);
        self.take(&key).map_err(|wait| Refusal {
            limit: Limit::Rate,
            detail: format!(
                "more than {} writes a second from {key}; slow down",
                self.settings.write_rate
            ),
            retry_after: wait,
        })
    }
}

impl From<Refusal> for crate::problem::ApiError {
    fn from(refusal: Refusal) -> crate::problem::ApiError {
        use crate::problem::{ApiError, Problem};
        let problem = match refusal.limit {
            Limit::Rate => Problem::RateLimited,
            Limit::Held => Problem::TooMany,
        };
        let seconds = refusal.retry_after.as_secs_f64().ceil() as u64;
        ApiError::new(problem, refusal.detail).retry_after(seconds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(write_rate: u32) -> LimitSettings {
        LimitSettings {
            write_rate,
            leases_per_principal: 1,
            waiters_per_principal: 1,
            waiters_per_lock: 1,
            sockets_per_principal: 1,
            sockets_per_address: 1,
            subscriptions_per_principal: 1,
            long_polls_per_principal: 1,
            long_polls: 1,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_bucket_allows_its_rate_and_says_when_to_come_back() {
        let limits = Limits::new(settings(10));
        for _ in 0..10 {
            assert!(limits.take("a").is_ok());
        }
        let wait = limits.take("a").expect_err("the eleventh write within a second");
        assert!(wait <= Duration::from_millis(100), "{wait:?}");
        assert!(limits.take("b").is_ok(), "another client has its own bucket");
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(limits.take("a").is_ok());
    }

    #[test]
    fn permits_count_until_dropped() {
        let limits = Limits::new(settings(0));
        let first = limits.hold("k".into(), 1, "sockets").expect("first");
        assert!(limits.hold("k".into(), 1, "sockets").is_err());
        drop(first);
        assert!(limits.hold("k".into(), 1, "sockets").is_ok());
    }
}
