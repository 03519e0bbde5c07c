//! What each lower layer's error answers over HTTP: ZooKeeper's failures, the limits'
//! refusals, authorisation, ownership, sessions and leases, each as its [Problem].

use super::*;
use crate::recipes::idempotency::KeyError;

impl From<Failure> for ApiError {
    fn from(err: Failure) -> ApiError {
        match err {
            Failure::Unanswered(_) => ApiError::unavailable(err.to_string()),
            // Not the client's doing, and not a bug in zkgate: say exactly that.
            Failure::Denied => ApiError::new(
                Problem::ZookeeperRefused,
                "ZooKeeper refuses zkgate's session access to this znode: its ACL leaves zkgate's identity out (see --zookeeper-auth)",
            ),
            // A write past a ZooKeeper quota that the handler did not name more precisely.
            Failure::QuotaFull => ApiError::new(
                Problem::QuotaExceeded,
                "ZooKeeper refused the write: a quota on zkgate's znodes is full; delete something first",
            )
            .with("quota", "zookeeper"),
            // Where a taken name is the client's doing, its handler says so before this.
            Failure::Taken | Failure::Unexpected(_) => ApiError::new(Problem::Internal, err.to_string()),
        }
    }
}

impl From<crate::limits::Refusal> for ApiError {
    fn from(refusal: crate::limits::Refusal) -> ApiError {
        let problem = match refusal.limit {
            crate::limits::Limit::Rate => Problem::RateLimited,
            crate::limits::Limit::Held => Problem::TooMany,
        };
        let seconds = refusal.retry_after.as_secs_f64().ceil() as u64;
        ApiError::new(problem, refusal.detail).retry_after(seconds)
    }
}

impl From<crate::auth::Forbidden> for ApiError {
    fn from(err: crate::auth::Forbidden) -> ApiError {
        ApiError::new(Problem::Forbidden, err.0)
    }
}

impl From<crate::recipes::engine::node::OwnerError> for ApiError {
    fn from(err: crate::recipes::engine::node::OwnerError) -> ApiError {
        match err {
            crate::recipes::engine::node::OwnerError::Forbidden(err) => err.into(),
            crate::recipes::engine::node::OwnerError::ZooKeeper(err) => err.into(),
        }
    }
}

impl From<Unavailable> for ApiError {
    fn from(err: Unavailable) -> ApiError {
        ApiError::unavailable(err.to_string())
    }
}

impl From<KeyError> for ApiError {
    fn from(err: KeyError) -> ApiError {
        match err {
            KeyError::Reused => ApiError::new(Problem::IdempotencyKeyReused, err.to_string()),
            KeyError::TooLarge(bytes) => ApiError::new(Problem::ValueTooLarge, err.to_string())
                .with("limit_bytes", crate::recipes::idempotency::MAX_RECORD_BYTES)
                .with("size_bytes", bytes),
            KeyError::Quota(exceeded) => ApiError::quota(exceeded),
            KeyError::ZooKeeper(failure) => failure.into(),
        }
    }
}

impl From<LeaseError> for ApiError {
    fn from(err: LeaseError) -> ApiError {
        let message = err.to_string();
        match err {
            LeaseError::Unknown(_) => ApiError::not_found("lease", message),
            // The hand-off guard serves a request where its lease is kept: this is a race with a
            // takeover, which a retry settles.
            LeaseError::Elsewhere { .. } => {
                ApiError::new(Problem::InstanceUnavailable, format!("{message}; try again"))
            }
            LeaseError::NotFresh => ApiError::unavailable(message),
            LeaseError::Ended { reason, .. } => ApiError::new(Problem::LeaseEnded, message).with("reason", reason),
            LeaseError::NotYours(_) | LeaseError::ReadOnly => ApiError::new(Problem::Forbidden, message),
            LeaseError::TooMany(_) => ApiError::new(Problem::TooMany, message),
            LeaseError::Unavailable(u) => ApiError::from(u),
            LeaseError::Key(err) => err.into(),
        }
    }
}
