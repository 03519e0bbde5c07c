//! What a recipe's caller learns when ZooKeeper failed a request. A recipe's entry points (the
//! functions that take a [Session](super::Session)) return these, and the edges answer them;
//! zookeeper-client's own errors never leave `zk/` and `recipes/` that way (`tests/it/layers.rs`
//! keeps `http/`, `ws/` and `runner/` from naming them). Inside a recipe the client's errors stay
//! as they are: `NodeExists` or `BadVersion` are steps of its protocol, not failures.

use zookeeper_client::Error as ZkError;

/// A ZooKeeper request that failed for a reason the recipe could not handle itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// No answer came: the connection was lost under the request, the session expired or
    /// closed, no server could be reached, or ZooKeeper throttled zkgate. A read may be tried
    /// again; a write's outcome is unknown unless its recipe says otherwise.
    #[error("ZooKeeper did not answer: {0}")]
    Unanswered(ZkError),
    /// ZooKeeper refuses zkgate's session access to the znode: its ACL (set by a peer, or by
    /// an instance with another digest) leaves zkgate's identity out.
    #[error("ZooKeeper refuses zkgate's session access to this znode")]
    Denied,
    /// A node the request creates exists already: the name is taken (by another lease, another
    /// transaction...). The recipes that can meet it say what it means for them.
    #[error("ZooKeeper refused the create: the node exists")]
    Taken,
    /// A write past a ZooKeeper quota on zkgate's znodes.
    #[error("ZooKeeper refused the write: a quota on zkgate's znodes is full")]
    QuotaFull,
    /// ZooKeeper refused a check the write carried for its writer's guards (`ZKGATE-Guard`,
    /// `recipes::guards`): nothing was written.
    #[error("ZooKeeper refused the write: its guards did not hold")]
    Unguarded,
    /// Anything else: a bug in zkgate or a znode that another tool shaped unexpectedly.
    #[error("unexpected ZooKeeper error: {0}")]
    Unexpected(ZkError),
}

impl From<ZkError> for Failure {
    fn from(err: ZkError) -> Failure {
        match err {
            err if super::is_loss(&err) => Failure::Unanswered(err),
            ZkError::Timeout
            | ZkError::NoHosts
            | ZkError::SessionExpired
            | ZkError::ClientClosed
            | ZkError::Throttled => Failure::Unanswered(err),
            ZkError::NoAuth => Failure::Denied,
            ZkError::QuotaExceeded => Failure::QuotaFull,
            ZkError::NodeExists => Failure::Taken,
            err => Failure::Unexpected(err),
        }
    }
}

/// What each failure answers: unreachable is a 503 with `Retry-After`, never a 500.
impl From<Failure> for crate::problem::ApiError {
    fn from(err: Failure) -> crate::problem::ApiError {
        use crate::problem::{ApiError, Problem};
        match err {
            Failure::Unanswered(_) => ApiError::unavailable(err.to_string()),
            // Not the client's doing, and not a bug in zkgate: say exactly that.
            Failure::Denied => ApiError::new(
                Problem::ZookeeperRefused,
                "ZooKeeper refuses zkgate's session access to this znode: its ACL leaves zkgate's identity out (see --zookeeper-auth)",
            ),
            // A write past a ZooKeeper quota that the operation did not name more precisely.
            Failure::QuotaFull => ApiError::new(
                Problem::QuotaExceeded,
                "ZooKeeper refused the write: a quota on zkgate's znodes is full; delete something first",
            )
            .with("quota", "zookeeper"),
            // An operation explains a refused guard before this (which guard, why).
            Failure::Unguarded => ApiError::new(Problem::GuardLost, err.to_string()),
            // Where a taken name is the client's doing, its operation says so before this.
            Failure::Taken | Failure::Unexpected(_) => ApiError::new(Problem::Internal, err.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_an_edge_answers_differently_is_sorted_apart() {
        assert!(matches!(Failure::from(ZkError::ConnectionLoss), Failure::Unanswered(_)));
        assert!(matches!(Failure::from(ZkError::SessionExpired), Failure::Unanswered(_)));
        assert!(matches!(Failure::from(ZkError::Throttled), Failure::Unanswered(_)));
        assert!(matches!(Failure::from(ZkError::NoAuth), Failure::Denied));
        assert!(matches!(Failure::from(ZkError::QuotaExceeded), Failure::QuotaFull));
        assert!(matches!(Failure::from(ZkError::NodeExists), Failure::Taken));
        assert!(matches!(
            Failure::from(ZkError::NoNode),
            Failure::Unexpected(ZkError::NoNode)
        ));
    }
}
