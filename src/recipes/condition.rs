//! The condition of a conditional write (kv keys and counters: `If-Match`, `If-None-Match`).

/// What a conditional write or delete requires of the current value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    /// Whatever is there (or nothing).
    Any,
    /// The key must not exist (create only).
    Absent,
    /// The key must exist, whatever its version.
    Exists,
    /// The key must exist with this version (its mzxid).
    Version(i64),
}

/// A refusal decided from a read must still hold after a `sync`. The read is served by this
/// session's server, which may not yet have applied a write that another client saw
/// acknowledged through another server before this request began: refusing a compare-and-set
/// (or a delete of a key "missing") from that stale view would answer against a value that is
/// no longer current, which is not linearizable (the ensemble's follower-pause test caught a
/// CAS refused this way). So the first refusal syncs and the caller reads again; a refusal
/// after the sync stands. Only refusals pay the `sync`: a write that goes ahead is decided by
/// ZooKeeper's own version check.
#[derive(Default)]
pub struct Recheck {
    synced: bool,
}

impl Recheck {
    /// `Ok(())` when the caller should read again (this was the first refusal: the session is
    /// synced now), else `Err(refusal)`.
    pub async fn confirm<E: From<crate::zk::Failure>>(
        &mut self,
        session: &crate::zk::Session,
        refusal: E,
    ) -> Result<(), E> {
        if self.synced {
            return Err(refusal);
        }
        session.sync().await?;
        self.synced = true;
        Ok(())
    }
}
