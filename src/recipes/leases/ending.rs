//! How a lease kept here ends: its TTL timer (reset by each keepalive), the end written into
//! its record (conditional on the version kept), its holdings released, and its tombstone
//! removed a while later.

use super::*;
use crate::zk::session::Session;

impl Registry {
    /// Ends a lease kept here: the end is written into its record, conditional on the version
    /// kept (so a keeper that lost it cannot end it), then its holdings release what they hold
    /// and the tombstone goes a while later. A lease whose record was never written just ends.
    ///
    /// Ends of one lease here are one at a time ([Lease::ending]): a second finds it ended and
    /// answers so (`410` with the first's reason, or a delete's `204` after a delete). Before,
    /// a delete that met the lease's own expiry lost the conditional write to the timer and
    /// answered `404 unknown lease` (issue 53, seen under a CPU quota).
    pub(super) async fn end(self: &Arc<Self>, lease: &Arc<Lease>, reason: EndReason) -> Result<(), LeaseError> {
        let _ending = lease.ending().await;
        if let Some(ended_as) = lease.end_reason() {
            return Err(ended(&lease.id, ended_as));
        }
        if let Some(version) = lease.version() {
            let session = lease.session().await?;
            let at = lease.created_at;
            let written = self.record(
                lease.ttl,
                lease.requested_ttl,
                lease.principal.clone(),
                at,
                lease.lock_delay,
            );
            match record::mark_ended(session.client(), &lease.path, &written, version, reason).await {
                // More holding records than holdings here: some are driven by other instances
                // (visitors), maybe gone ones. They end with the lease, here: adopted before
                // it ends, then released with the rest.
                Ok(record_names) if usize::try_from(record_names).unwrap_or(0) > lease.attached() => {
                    self.adopt_driven_elsewhere(lease, session.client()).await;
                }
                Ok(_) => {}
                // Changed by another instance (taken over, and maybe ended there): no longer
                // kept here, and answered as its record says now.
                Err(crate::zk::ZkError::BadVersion | crate::zk::ZkError::NoNode) => {
                    self.drop_here(&lease.id);
                    return Err(self.changed_meanwhile(&session, &lease.id).await);
                }
                Err(_) => return Err(unavailable()),
            }
        }
        self.finish(lease, reason);
        Ok(())
    }

    /// Why a conditional write to lease `id`'s record (a take-over, an end) found it changed:
    /// as the record is now (read after a sync: this session's server may lag the write that
    /// changed it).
    pub(super) async fn changed_meanwhile(&self, session: &Session, id: &str) -> LeaseError {
        if session.sync().await.is_err() {
            return unavailable();
        }
        match record::read(session.client(), &record::path(&self.root, id)).await {
            Ok(Some(now)) => match now.record.ended {
                Some(reason) => ended(id, reason),
                None => elsewhere(id, now.record.keeper),
            },
            Ok(None) => LeaseError::Unknown(id.to_string()),
            Err(_) => unavailable(),
        }
    }

    /// Attaches to `lease` (ending) the holdings its record holding records that are not attached
    /// here: driven by visitors, whose copies end too when they see the record, and by
    /// instances gone, which nobody else would end. Both releasing one is harmless: each
    /// deletes what is still there.
    async fn adopt_driven_elsewhere(self: &Arc<Self>, lease: &Arc<Lease>, client: &crate::zk::Client) {
        let Some(adopter) = self.adopter.get() else {
            return;
        };
        let here = lease.attached_records();
        let Ok(record_names) = record::holdings(client, &lease.path).await else {
            // The reaper finishes the end of a tombstone with holding records left.
            return;
        };
        let elsewhere: Vec<(String, HoldingRecord)> = record_names
            .into_iter()
            .filter(|(name, _)| !here.contains(name))
            .collect();
        if !elsewhere.is_empty() {
            tracing::debug!(lease = %lease.id, holdings = elsewhere.len(), "ending holdings driven elsewhere");
            adopter(lease, elsewhere);
        }
    }

    /// Ends a lease whose end is written: its holdings release what they hold, and its
    /// tombstone goes a while later.
    pub(super) fn finish(self: &Arc<Self>, lease: &Arc<Lease>, reason: EndReason) {
        if self.forget(&lease.id, Some(reason)).is_none() {
            // Ended (or dropped) meanwhile by another path.
            return;
        }
        lease.end(reason);
        tracing::info!(lease = %lease.id, ?reason, "lease ended");
        crate::metrics::get()
            .leases_ended
            .with_label_values(&[reason.label()])
            .inc();
        if lease.version().is_some() {
            tokio::spawn(remove_tombstone(Arc::downgrade(self), lease.clone()));
        }
    }

    /// Starts the task that ends the lease when its deadline passes with no keepalive.
    pub(super) fn start_timer(self: &Arc<Self>, lease: &Arc<Lease>) {
        tokio::spawn(expire_when_silent(Arc::downgrade(self), lease.clone()));
    }
}

/// Sleeps until the lease's deadline, re-reading it after each keepalive; ends it if it passed.
/// An end that cannot be written (ZooKeeper away) is written once a session is back: the lease
/// lives on meanwhile, which its contract allows (a TTL is a lower bound), and what it holds
/// stays in ZooKeeper until the end is written, so nobody else is granted it before
/// (docs/RELIABILITY.md, "Through a ZooKeeper outage"). It waits for the session rather than
/// retry each second: a thousand leases whose TTL ran out during an outage would otherwise
/// wake a thousand times a second for nothing.
async fn expire_when_silent(registry: Weak<Registry>, lease: Arc<Lease>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(lease.deadline()) => {}
            _ = lease.ended().cancelled() => return,
            _ = lease.dropped().cancelled() => return,
        }
        if lease.deadline() > Instant::now() {
            continue;
        }
        let Some(registry) = registry.upgrade() else {
            return;
        };
        match registry.end(&lease, EndReason::Expired).await {
            Err(LeaseError::Unavailable(_)) => {
                drop(registry);
                match lease.zk.current() {
                    // ZooKeeper answered with an error on a connected session: a moment.
                    Ok(_) => tokio::time::sleep(HEARTBEAT).await,
                    Err(_) => {
                        lease.zk.next_session(None).await;
                    }
                }
            }
            _ => return,
        }
    }
}

/// Removes an ended lease's tombstone once [TOMBSTONE] has passed and its holdings are gone
/// (the reaper removes those this misses: see [reaper]).
async fn remove_tombstone(registry: Weak<Registry>, lease: Arc<Lease>) {
    lease.holdings_finished(TOMBSTONE).await;
    tokio::time::sleep(TOMBSTONE).await;
    if registry.upgrade().is_none() {
        return;
    }
    if let Ok(session) = lease.session().await {
        let _ = record::remove_tombstone(session.client(), &lease.path).await;
    }
}
