//! The lease family's words as the API answers them: what `POST /v1/leases` takes, a lease and
//! everything held on its behalf, a lease in a list; and the operation that makes one.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Created, HoldingView, Lease, NewLease};
use crate::auth::Caller;
use crate::kind::Kind;
use crate::problem::{ApiError, Place};
use crate::recipes::Recipes;
use crate::recipes::idempotency::Keyed;
use crate::time::{HumanDuration, millis_since, timestamp};

/// Body of `POST /v1/leases` (optional).
#[derive(Deserialize, utoipa::ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct CreateLease {
    /// Time to live without a keepalive; clamped to the server's bounds. Default: the server's.
    pub ttl: Option<HumanDuration>,
    /// How long the locks, read/write locks and semaphore permits it holds stay held after it
    /// *expires* (its holder was cut off, and its last writes may still be in flight), before
    /// they are released: Chubby's and Consul's lock-delay. A release, or the lease's `DELETE`,
    /// releases at once. At most the server's `--max-lock-delay` (60s by default). Default 0.
    #[schema(value_type = Option<String>, example = "15s")]
    pub lock_delay: Option<HumanDuration>,
}

/// A lease and everything held on its behalf.
#[derive(Serialize, utoipa::ToSchema)]
pub struct LeaseView {
    /// The lease id: pass it as `lease` to acquire more with this lease.
    #[schema(example = "3c9e1f07-6f1c2a9e0b7d4e3f8a5b6c7d8e9f0a1b")]
    pub id: String,
    /// The TTL granted, in milliseconds.
    #[schema(example = 30000)]
    pub ttl_ms: u64,
    /// The TTL asked for, when it was clamped to the server's bounds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requested_ttl_ms: Option<u64>,
    /// Time left before it expires unless kept alive, in milliseconds. Absent from an answer
    /// of an instance that does not keep the lease's TTL clock (an acquire served where it
    /// arrived): `GET /v1/leases/{id}` or a keepalive says it.
    #[schema(example = 29874)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remaining_ms: Option<u64>,
    #[schema(example = "2026-11-22T10:00:00.000Z")]
    #[schema(format = DateTime)]
    pub created_at: String,
    /// When it was last kept alive; absent where `remaining_ms` is.
    #[schema(format = DateTime)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_keepalive_at: Option<String>,
    /// Its lock-delay, when it asked for one (see `CreateLease`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock_delay_ms: Option<u64>,
    /// Locks (and later other resources) held or waited for with this lease.
    pub holdings: Vec<HoldingView>,
}

impl LeaseView {
    pub fn of(lease: &Lease) -> LeaseView {
        let kept = !lease.is_visiting();
        let requested = lease.requested_ttl.filter(|r| *r != lease.ttl);
        LeaseView {
            id: lease.id.clone(),
            ttl_ms: lease.ttl.as_millis() as u64,
            requested_ttl_ms: requested.map(|r| r.as_millis() as u64),
            remaining_ms: kept.then(|| lease.remaining().as_millis() as u64),
            created_at: timestamp(lease.created_at),
            last_keepalive_at: kept.then(|| timestamp(lease.last_keepalive())),
            lock_delay_ms: (!lease.lock_delay.is_zero()).then_some(lease.lock_delay.as_millis() as u64),
            holdings: lease.holdings(),
        }
    }
}

/// Summary of a lease in the list.
#[derive(Serialize, utoipa::ToSchema)]
pub struct LeaseSummary {
    #[schema(example = "3c9e1f07-6f1c2a9e0b7d4e3f8a5b6c7d8e9f0a1b")]
    pub id: String,
    #[schema(example = 30000)]
    pub ttl_ms: u64,
    #[schema(example = 21450)]
    pub remaining_ms: u64,
    /// Age of the lease in milliseconds.
    #[schema(example = 95120)]
    pub age_ms: u64,
    /// Number of holdings.
    #[schema(example = 2)]
    pub holdings: usize,
    /// The keys bound to it (`PUT /v1/kv/{key}?lease=`) through this instance, in order, at
    /// most 16 (its view lists them all).
    #[schema(example = json!(["workers/w1"]))]
    pub keys: Vec<String>,
}

/// Most bound keys a lease's summary names.
const SUMMARY_KEYS: usize = 16;

impl LeaseSummary {
    pub fn of(lease: &Lease) -> LeaseSummary {
        let holdings = lease.holdings();
        let mut keys: Vec<String> = holdings
            .iter()
            .filter(|h| h.kind == Kind::Kv.name())
            .map(|h| h.name.clone())
            .collect();
        keys.sort();
        keys.truncate(SUMMARY_KEYS);
        LeaseSummary {
            id: lease.id.clone(),
            ttl_ms: lease.ttl.as_millis() as u64,
            remaining_ms: lease.remaining().as_millis() as u64,
            age_ms: millis_since(lease.created_at),
            holdings: holdings.len(),
            keys,
        }
    }

    /// Where a lease sorts in the list, oldest first: by creation time (ns since the epoch,
    /// zero-padded so that the text sorts as the number), then id.
    pub fn order(lease: &Arc<Lease>) -> String {
        let nanos = lease
            .created_at
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("{nanos:024}|{}", lease.id)
    }
}

/// `POST /v1/leases`: a lease of `body.ttl` with its lock-delay (at most `max_lock_delay`),
/// made once for an idempotency `key`; `true` when an earlier request with the key made it
/// (the lease as it is now, wherever it is kept).
pub async fn create(
    recipes: &Recipes,
    caller: &Caller,
    body: CreateLease,
    max_lock_delay: Duration,
    key: Option<&crate::recipes::idempotency::Key>,
) -> Result<(Arc<Lease>, bool), ApiError> {
    let ttl = body.ttl.map(|t| t.0);
    if ttl.is_some_and(|t| t.is_zero()) {
        return Err(ApiError::invalid(Place::Body, "ttl", "must be above zero"));
    }
    let lock_delay = body.lock_delay.map_or(Duration::ZERO, |d| d.0);
    if lock_delay > max_lock_delay {
        let detail = format!("must be at most {} ms (`--max-lock-delay`)", max_lock_delay.as_millis());
        return Err(ApiError::invalid(Place::Body, "lock_delay", detail));
    }
    let keyed = key.map(|key| Keyed {
        keys: &recipes.idempotency,
        key,
    });
    let new = NewLease {
        ttl,
        lock_delay,
        key: keyed,
        with_first_holding: false,
    };
    Ok(match recipes.leases.create_keyed(caller, new).await? {
        Created::New(lease) => (lease, false),
        Created::Before(id) => (recipes.leases.serve(caller, &id).await?, true),
    })
}
