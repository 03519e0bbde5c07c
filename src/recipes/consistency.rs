//! What a read promises: linearizable (the default) or sequential. Every read of ZooKeeper
//! that an edge serves (`?consistency=` of a `GET`, see `http::consistency`) asks
//! [Recipes::reader] for the session to read with:
//!
//! - `linearizable`: the read reflects every write acknowledged before it began, by any
//!   instance: a barrier on the primary session first (on an ensemble a transaction that changes
//!   nothing, since ZooKeeper's `sync` does nothing on the leader; on a standalone server a
//!   `sync`), shared with the reads that may share it ([crate::zk::sync]). A read of a lease or of a handle (which the owning instance answers
//!   from what it knows) first confirms with a `sync` on the lease's own session that the
//!   session, and with it everything the lease holds, was alive after the read began
//!   ([Recipes::confirm]).
//! - `sequential`: the server's state as it is, which may lag a write acknowledged elsewhere by
//!   a few milliseconds (ZooKeeper's own guarantee: every read sees a prefix of the writes in
//!   their order, and never goes back in time on one session). No extra round trip.
//!
//! Where no `sync` is needed, and why:
//! - writes, and reads of a write's result on the session that wrote it: ZooKeeper's writes
//!   are linearizable and a session sees its own writes (compare-and-set is a versioned write,
//!   decided by the leader);
//! - the recipes' own decisions (a contender's children after its create, a queue claim's
//!   multi-op): they read on the session that wrote, and are correct under sequential
//!   consistency by construction (a watch fires for anything the read missed);
//! - topics after their first read: a watch event and the read after it come in the order the
//!   server applied them.

use crate::problem::ApiError;
use crate::zk::Session;

use crate::recipes::Recipes;
use crate::recipes::engine::lease::Lease;

/// What a read promises.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Consistency {
    /// Reflects every write acknowledged (by any instance) before the read began. One barrier (on an
    /// ensemble a transaction that changes nothing) per read, shared by concurrent reads.
    #[default]
    Linearizable,
    /// The state of this instance's ZooKeeper server: may miss a write acknowledged elsewhere a
    /// moment ago; never older than what an earlier read through this instance returned.
    Sequential,
}

impl Recipes {
    /// The session to read with at `consistency`: the primary one, synced first when the read
    /// must be linearizable.
    pub async fn reader(&self, consistency: Consistency) -> Result<Session, ApiError> {
        let session = self.zk().current()?;
        if consistency == Consistency::Linearizable {
            session.sync().await?;
        }
        Ok(session)
    }

    /// The primary session after a `sync`: for a write that acts on what another instance may
    /// have just written (a release of a handle acquired through it), which must see it.
    pub async fn synced(&self) -> Result<Session, ApiError> {
        self.reader(Consistency::Linearizable).await
    }

    /// Before answering a read of `lease` (or of what it holds) from what this instance knows:
    /// at `linearizable`, that it still keeps the lease as ZooKeeper has it after the read began
    /// (a `sync` and a read of its record), so that a lease another instance took over or ended
    /// (and whose locks may have been granted since) is not shown as alive here.
    pub async fn confirm(&self, lease: &std::sync::Arc<Lease>, consistency: Consistency) -> Result<(), ApiError> {
        if consistency == Consistency::Linearizable {
            self.leases.confirm(lease).await?;
        }
        Ok(())
    }
}
