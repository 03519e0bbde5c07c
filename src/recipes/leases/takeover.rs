//! Taking a lease over from its keeper: when a request for it reaches this instance and its
//! keeper is gone or does not answer (see `http::handoff`), or when the reaper finds a lease
//! whose keeper is gone (see [super::reaper]).
//!
//! One write conditional on the record's version makes this instance the keeper
//! ([record::take_over]); of two instances trying at once, one wins and the other learns who.
//! The lease is then timed here from what the former keeper can at most have acknowledged: no
//! keepalive later than [FRESH] after its last heartbeat (see [super::keeping]), so the lease
//! may end no earlier than its TTL after that ([earliest_end]). If that has passed already the
//! lease ends at once (it expired while nobody could time it: after every instance was gone,
//! say); else the holdings' tasks are taken over from the holding records under its record and go
//! on from the znodes they find.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{FRESH, Leases, elsewhere, ended, unavailable};
use crate::auth::Caller;
use crate::recipes::engine::lease::{EndReason, Lease, LeaseError};
use crate::recipes::engine::record::{self, Found, TakeOver};

/// The earliest a lease may end (ms, ZooKeeper's clock) when its keeper was last seen at
/// `last_seen_ms`: [FRESH] (the last keepalive that keeper can have acknowledged) plus its TTL.
pub fn earliest_end(last_seen_ms: i64, ttl: Duration) -> i64 {
    last_seen_ms
        .saturating_add(FRESH.as_millis() as i64)
        .saturating_add(ttl.as_millis() as i64)
}

/// How long a lease taken over at `now_ms` has before it may end (zero: it may end now).
pub fn time_left(last_seen_ms: i64, ttl: Duration, now_ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(earliest_end(last_seen_ms, ttl).saturating_sub(now_ms)).unwrap_or(0))
}

impl Leases {
    /// Takes the lease `id` over from its keeper (gone, or not answering a request handed to
    /// it), for `caller`; with `keepalive`, the request is one, and renews the lease too.
    /// With `from`, only from that keeper (the one found failing): if the record names
    /// another by now (a live instance took it over meanwhile), that one keeps it.
    ///
    /// # Notable errors
    /// * [LeaseError::Elsewhere] when another instance took it first, or keeps it now instead
    ///   of `from` (hand the request there).
    /// * [LeaseError::Ended] when it ended (or, having expired while nobody kept it, ends now).
    /// * [LeaseError::Unknown], [LeaseError::NotYours] as for [Leases::find].
    /// * [LeaseError::NotFresh] while this instance cannot vouch for what it would keep.
    pub async fn take_over(
        &self,
        caller: &Caller,
        id: &str,
        from: Option<&str>,
        keepalive: bool,
    ) -> Result<Arc<Lease>, LeaseError> {
        if let Ok(lease) = self.get(caller, id) {
            if keepalive {
                lease.renew();
            }
            return Ok(lease);
        }
        if !self.is_fresh() {
            return Err(LeaseError::NotFresh);
        }
        let found = self.read_live_record(caller, id).await?;
        // Taken over by another instance since the caller found its keeper failing (the
        // reaper of a third, or a request there): taking it from that one, alive, would only
        // move the lease again and cut off the requests it serves.
        if from.is_some_and(|from| from != found.record.keeper && found.record.keeper != *self.inner.instance) {
            return Err(elsewhere(id, found.record.keeper));
        }
        let client = self.inner.lanes.primary().connected().await?.client().clone();
        let last_seen = self.last_seen(&client, &found.record.keeper).await?;
        let lease = self.keep_taken_over(id, &found, last_seen).await?;
        if lease.ended().is_cancelled() {
            return Err(ended(id, lease.end_reason().unwrap_or(EndReason::Expired)));
        }
        if keepalive {
            lease.renew();
        }
        Ok(lease)
    }

    /// When `keeper` was last seen (its keeper node's `mtime`); now if it never was (a
    /// conservative guess: it gives the lease its whole TTL).
    async fn last_seen(&self, client: &crate::zk::Client, keeper: &str) -> Result<i64, LeaseError> {
        let now = self.inner.keeping.server_now().ok_or(LeaseError::NotFresh)?;
        let seen = crate::recipes::engine::keepers::keepers(client, &self.inner.root)
            .await
            .map_err(|_| unavailable())?
            .into_iter()
            .find(|(name, _)| name == keeper)
            .map(|(_, mtime)| mtime);
        Ok(seen.unwrap_or(now).min(now))
    }

    /// The adoption lock of lease `id`: one of a few, so that two requests do not adopt one
    /// lease twice while adoptions of different leases go on side by side.
    fn stripe(&self, id: &str) -> usize {
        use std::hash::{BuildHasher, BuildHasherDefault};
        let hash = BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(id);
        hash as usize % self.inner.adopting.len()
    }

    /// Makes this instance the keeper of the lease found as `found`, whose keeper was last seen
    /// at `last_seen_ms`: times it from then, takes over what it holds, and ends it at once if
    /// it has expired, or if it had ended and its ender did not finish (a tombstone with
    /// holdings).
    pub(super) async fn keep_taken_over(
        &self,
        id: &str,
        found: &Found,
        last_seen_ms: i64,
    ) -> Result<Arc<Lease>, LeaseError> {
        let adopting = self.inner.adopting[self.stripe(id)].lock().await;
        // Taken over here meanwhile (the reaper, or another request): `found` is stale.
        if let Some(existing) = self.inner.table().live.get(id).cloned() {
            return Ok(existing);
        }
        let now = self.inner.keeping.server_now().ok_or(LeaseError::NotFresh)?;
        let (lane, session) = self.inner.lanes.pick()?;
        let client = session.client().clone();
        let version = match record::take_over(&client, &self.inner.root, id, found, &self.inner.instance).await {
            Ok(version) => version,
            Err(TakeOver::Changed) => return Err(self.inner.changed_meanwhile(&session, id).await),
            Err(TakeOver::Gone) => return Err(LeaseError::Unknown(id.to_string())),
            Err(TakeOver::ZooKeeper(_)) => return Err(unavailable()),
        };
        let ttl = Duration::from_millis(found.record.ttl_ms);
        let left = time_left(last_seen_ms, ttl, now);
        let kept = self.inner.kept(id, found, version, Instant::now() + left);
        let lease = Arc::new(Lease::new(kept, lane.clone()));
        // Its holdings are attached before the lease is in the table: a request that finds it
        // there (a keepalive answering with the holdings, a release looking for its handle)
        // must find them. Nobody else adopts it meanwhile (the stripe is held).
        let holdings = self.holdings_of(&lease, &client).await;
        let holdings = self
            .left_to_their_drivers(&client, id, &found.record.keeper, holdings)
            .await;
        tracing::info!(lease = %id, from = %found.record.keeper, holdings = holdings.len(), left = ?left, "lease taken over");
        crate::metrics::get().leases_taken_over.inc();
        if let Some(adopter) = self.inner.adopter.get() {
            adopter(&lease, holdings);
        }
        {
            let mut table = self.inner.table();
            table.live.insert(id.to_string(), lease.clone());
            *table.per_owner.entry(lease.principal.clone()).or_default() += 1;
        }
        drop(adopting);
        match found.record.ended {
            // Ended, and left with holdings by an ender that is gone: finish its end.
            Some(reason) => self.inner.finish(&lease, reason),
            // Its time passed while nobody kept it (every instance was gone): it ends now, and
            // its holdings are released before this returns (the reaper's first pass is done
            // before the instance is ready: it serves nothing of such a lease).
            None if left.is_zero() => {
                if self.inner.end(&lease, EndReason::Expired).await.is_ok() {
                    lease.holdings_finished(Duration::from_secs(10)).await;
                } else {
                    self.inner.start_timer(&lease);
                }
            }
            None => self.inner.start_timer(&lease),
        }
        Ok(lease)
    }

    /// The holdings this new keeper adopts of those recorded: all but those a live instance
    /// other than the former keeper drives (a visitor, see [super::visiting]), which go on
    /// there. While the registrations cannot be read, all: a holding driven twice only watches
    /// twice, where one driven by nobody would never be granted.
    async fn left_to_their_drivers(
        &self,
        client: &crate::zk::Client,
        lease_id: &str,
        former: &str,
        holdings: Vec<(String, record::HoldingRecord)>,
    ) -> Vec<(String, record::HoldingRecord)> {
        // Driven here already, by a visited copy of the lease: it goes on driving them.
        let visited_here = self.inner.visited(lease_id).is_some();
        let me = &*self.inner.instance;
        let elsewhere = |h: &record::HoldingRecord| {
            h.driver
                .as_deref()
                .is_some_and(|d| d != former && (d != me || visited_here))
        };
        if !holdings.iter().any(|(_, h)| elsewhere(h)) {
            return holdings;
        }
        let Ok(live) = crate::recipes::presence::live_instances(client, &self.inner.root).await else {
            return holdings;
        };
        let alive = |d: &str| d == me || live.contains(d);
        holdings
            .into_iter()
            .filter(|(_, h)| !(elsewhere(h) && h.driver.as_deref().is_some_and(alive)))
            .collect()
    }

    /// The holdings recorded under the record of `lease`, just taken over by a write on
    /// `client`. Read on that session first: having seen its own write, it has seen every
    /// holding record made before it (and the former keeper can make none after: each holding is
    /// written conditionally on the record's version). The keeper is this instance now, so
    /// nobody else will take them up: while that read fails, read again (after a `sync`, on a
    /// session that reconnected maybe to another server) for as long as the lease could live
    /// (its TTL). Only if that fails too is the lease kept with none; its holding records then stay
    /// until this instance is gone and another finishes its end.
    async fn holdings_of(&self, lease: &Lease, client: &crate::zk::Client) -> Vec<(String, record::HoldingRecord)> {
        if let Ok(holdings) = record::holdings(client, &lease.path).await {
            return holdings;
        }
        let until = Instant::now() + lease.ttl;
        loop {
            let read = match self.inner.lanes.primary().connected().await {
                Ok(session) if session.sync().await.is_ok() => {
                    record::holdings(session.client(), &lease.path).await.ok()
                }
                _ => None,
            };
            match read {
                Some(holdings) => return holdings,
                None if Instant::now() >= until => {
                    tracing::warn!(lease = %lease.id, "the holdings of a lease taken over could not be read");
                    return Vec::new();
                }
                None => tokio::time::sleep(Duration::from_millis(100)).await, // a retry's pace
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_over_lease_lives_its_ttl_after_the_last_keepalive_its_keeper_could_have_acknowledged() {
        let ttl = Duration::from_secs(10);
        let fresh = FRESH.as_millis() as i64;
        // Seen a moment ago: the whole TTL, and the margin.
        assert_eq!(time_left(1_000_000, ttl, 1_000_000), ttl + FRESH);
        // Seen 4 s ago: 4 s less.
        assert_eq!(
            time_left(1_000_000, ttl, 1_004_000),
            ttl + FRESH - Duration::from_secs(4)
        );
        // Seen a TTL and the margin ago, or longer: nothing left, it may end at once.
        assert_eq!(time_left(1_000_000, ttl, 1_000_000 + fresh + 10_000), Duration::ZERO);
        assert_eq!(time_left(1_000_000, ttl, 9_000_000), Duration::ZERO);
        // A clock that went back gives more, never less.
        assert!(time_left(1_000_000, ttl, 999_000) > ttl + FRESH);
    }

    proptest::proptest! {
        /// Whatever the times, the lease never ends before a keepalive acknowledged by its
        /// former keeper (at most FRESH after it was last seen) is a TTL old.
        #[test]
        fn never_before_the_ttl_of_any_acknowledged_keepalive(
            last_seen in 0i64..1_000_000_000,
            acked_after in 0i64..3_000,
            taken_after in 0i64..100_000,
            ttl_ms in 1u64..3_600_000,
        ) {
            let ttl = Duration::from_millis(ttl_ms);
            let acked = last_seen + acked_after.min(FRESH.as_millis() as i64);
            let taken = last_seen + taken_after;
            let ends = taken + time_left(last_seen, ttl, taken).as_millis() as i64;
            proptest::prop_assert!(ends >= acked + ttl_ms as i64);
        }
    }
}
