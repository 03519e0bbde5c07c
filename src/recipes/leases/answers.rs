//! What a request learns of the lease it acts with: the lease it names (kept here, or visited)
//! or one made for it, and why a lease it used is no longer usable, as the problem it answers.

use std::sync::Arc;
use std::time::Duration;

use super::{Leases, NewLease};
use crate::auth::Caller;
use crate::problem::{ApiError, Place, Problem};
use crate::recipes::engine::lease::{Lease, LeaseError};
use crate::recipes::engine::node::HoldError;

impl Leases {
    /// The lease a request that makes a holding names (kept here, or visited: every instance
    /// serves such a request, see [Leases::serve]), or a new one (with `ttl`) when it names
    /// none, whose record is written with the first thing it holds; the flag says whether it
    /// was made for this request (and should go if the request comes to nothing).
    pub async fn for_request(
        &self,
        caller: &Caller,
        lease: Option<String>,
        ttl: Option<Duration>,
    ) -> Result<(Arc<Lease>, bool), ApiError> {
        match (lease, ttl) {
            (Some(_), Some(_)) => Err(ApiError::invalid(
                Place::Body,
                "ttl",
                "only applies when no `lease` is given",
            )),
            (Some(id), None) => Ok((self.serve(caller, &id).await?, false)),
            (None, ttl) => {
                if ttl.is_some_and(|t| t.is_zero()) {
                    return Err(ApiError::invalid(Place::Body, "ttl", "must be above zero"));
                }
                let new = NewLease {
                    ttl,
                    lock_delay: Duration::ZERO,
                    key: None,
                    with_first_holding: true,
                };
                Ok((self.create(caller, new).await?, true))
            }
        }
    }

    /// The error for a request whose lease ended (or left this instance) while it was served.
    pub fn gone(&self, lease: &Lease) -> ApiError {
        self.unusable(lease)
            .unwrap_or_else(|| ApiError::new(Problem::LockNotAcquired, "the request was released while it waited"))
    }

    /// What a node's `hold` for `lease` came to: the node, or `None` if another lease or client
    /// has one there; 410 if the lease ended meanwhile.
    pub fn held<T>(&self, lease: &Lease, hold: Result<T, HoldError>) -> Result<Option<T>, ApiError> {
        match hold {
            Ok(node) => Ok(Some(node)),
            Err(HoldError::Taken) => Ok(None),
            Err(HoldError::LeaseEnded) => Err(self.gone(lease)),
            Err(HoldError::ZooKeeper(err)) => Err(err.into()),
        }
    }

    /// Why `lease`, used by a request here, is no longer usable here, if it is not: moved to
    /// another instance (dropped here: this instance no longer knows it, which is not "unknown"),
    /// or ended.
    pub fn unusable(&self, lease: &Lease) -> Option<ApiError> {
        if let Some(reason) = lease.end_reason().filter(|_| lease.is_visiting()) {
            let id = lease.id.clone();
            return Some(LeaseError::Ended { id, reason }.into());
        }
        if lease.dropped().is_cancelled() {
            return Some(moved(&lease.id));
        }
        if lease.is_visiting() {
            return None;
        }
        self.peek(&lease.id).err().map(ApiError::from)
    }
}

/// The error for a request whose lease another instance took over while it was served.
pub fn moved(id: &str) -> ApiError {
    ApiError::new(
        Problem::InstanceUnavailable,
        format!("lease `{id}` moved to another instance while this request was served; try again"),
    )
}
