//! The queues as this instance serves them: the claims it times (made here, or adopted from an
//! instance gone) with their ack deadlines, and its waiting takers, woken one per item.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use zookeeper_client::Error as ZkError;

use super::mirror::{Mirror, Mirrors, Tried};
use super::{ClaimRecord, Expiry, HeldClaim, Pick, QueuePaths, Taken};
use crate::kind::Kind;
use crate::locked::Locked;
use crate::recipes::guards::Checked;
use crate::recipes::usage::{Charge, Quotas};
use crate::remembered::Remembered;
use crate::zk::session::ZkSession;
use crate::zk::{Failure, Session};

/// A claim as this instance knows it: one it made or adopted (and times), or one another
/// instance made, read from ZooKeeper to settle it here.
#[derive(Clone)]
pub struct Claim {
    /// The public claim id (also in the claim node's [ClaimRecord]).
    pub id: String,
    pub queue: String,
    /// The claimed item; empty until the take succeeds.
    pub item: String,
    pub deadline_ms: i64,
    /// The principal that took it (`None` with auth off): only it (or an admin) acks.
    pub principal: Option<String>,
    /// The item's version once claimed and the item's charge, when this instance made the
    /// claim: what acknowledging it without reading first needs.
    version: Option<i32>,
    charge: Option<Charge>,
    expire: CancellationToken,
}

impl Claim {
    /// A claim as its node records it (the item's version and charge unknown).
    fn recorded(queue: String, item: String, record: ClaimRecord) -> Claim {
        Claim {
            id: record.claim,
            queue,
            item,
            deadline_ms: record.deadline_ms,
            principal: record.principal,
            version: None,
            charge: None,
            expire: CancellationToken::new(),
        }
    }

    fn record(&self, instance: &str) -> ClaimRecord {
        ClaimRecord {
            claim: self.id.clone(),
            deadline_ms: self.deadline_ms,
            principal: self.principal.clone(),
            instance: instance.to_string(),
        }
    }
}

/// How long a taker waits for a queue's first listing (its mirror's), whatever its own wait.
const FIRST_LISTING: Duration = Duration::from_secs(10);

/// What a take asks for.
#[derive(Clone, Debug)]
pub struct TakeOptions {
    /// Claim for this long (at least once); `None`: remove (at most once).
    pub ack_deadline: Option<Duration>,
    pub max_deliveries: u32,
    /// Most items to take at once.
    pub max_items: usize,
    /// The most an item may hold (how many may be read together).
    pub max_bytes: usize,
    /// What the taker must still hold when its claims are made (`ZKGATE-Guard`).
    pub guards: Checked,
}

/// What a taker picked from a queue, on its way to [Queues::take_picked].
struct Picking {
    queue: String,
    principal: Option<String>,
    names: Vec<String>,
    options: TakeOptions,
}

#[derive(Clone)]
pub struct Queues {
    zk: ZkSession,
    /// This instance's id: the prefix of its claims, and who times them.
    instance: Arc<str>,
    base: Arc<str>,
    /// Each queue with takers here, as they see it (one watch per queue).
    mirrors: Mirrors,
    /// Items are charged to who put them and refunded when taken or acknowledged.
    quotas: Quotas,
    /// The claims this instance times: those it made, and those it adopted from instances gone.
    claims: Arc<Mutex<HashMap<String, Claim>>>,
    /// How this instance's claims were settled, remembered (bounded) so that a repeated ack or
    /// nack, a client's retry after a lost reply, is answered as the first one was.
    settled: Arc<Mutex<Remembered<String, Settled>>>,
}

/// How a claim was settled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settled {
    pub queue: String,
    /// Whether it was acknowledged (the item removed) or given back (delivered again).
    pub acked: bool,
    /// The principal that held it.
    pub principal: Option<String>,
}

impl Queues {
    /// A queue's mirror outlives its last taker by `linger`, at most `max_lingering` at once.
    pub fn new(
        zk: ZkSession,
        root: &str,
        instance: Arc<str>,
        quotas: Quotas,
        linger: Duration,
        max_lingering: usize,
    ) -> Queues {
        Queues {
            mirrors: Mirrors::new(zk.clone(), linger, max_lingering),
            zk,
            instance,
            base: Kind::Queue.base(root).into(),
            quotas,
            claims: Arc::default(),
            settled: Arc::default(),
        }
    }

    /// How many queues this instance keeps a mirror (and a watch) for.
    pub fn mirrors(&self) -> usize {
        self.mirrors.count()
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    pub fn quotas(&self) -> &Quotas {
        &self.quotas
    }

    pub fn paths(&self, queue: &str) -> QueuePaths {
        QueuePaths::new(format!("{}/{queue}", self.base))
    }

    /// Takes up to `options.max_items` items, waiting until `until` for at least one. With an
    /// ack deadline each is claimed (at least once) for `owner` (the principal that alone may
    /// ack it) and the claim given back if not acknowledged in time; without, removed (at most
    /// once). Empty when the wait ends with nothing to take.
    ///
    /// Takers pick from the queue's mirror (see [super::mirror]): each item is tried by one
    /// taker here, and a taker waits for the mirror to say an item came instead of listing.
    pub async fn take(
        &self,
        queue: &str,
        owner: Option<&str>,
        options: TakeOptions,
        until: Instant,
    ) -> Result<Vec<(Taken, Option<Claim>)>, Failure> {
        let paths = self.paths(queue);
        let mirror = self.mirrors.using(queue, &paths);
        loop {
            // Registered before looking, so that an item arriving in between still wakes us.
            let item = mirror.item_ready();
            tokio::pin!(item);
            item.as_mut().enable();
            let synced = mirror.synced();
            tokio::pin!(synced);
            synced.as_mut().enable();
            let session = self.zk.connected().await.map_err(|_| ZkError::ConnectionLoss)?;
            if !mirror.is_synced() {
                // The first listing is part of looking, whatever the wait.
                tokio::time::timeout(FIRST_LISTING, &mut synced)
                    .await
                    .map_err(|_| ZkError::ConnectionLoss)?;
                continue;
            }
            let mut picked = mirror.pick(options.max_items.max(1));
            if picked.names.is_empty() && Instant::now() >= until {
                // About to say there is nothing: as of now, not of an older mirror.
                if !mirror.caught_up().await {
                    return Err(ZkError::ConnectionLoss.into());
                }
                picked = mirror.pick(options.max_items.max(1));
                if picked.names.is_empty() {
                    return Ok(Vec::new());
                }
            }
            if picked.names.is_empty() {
                // A delayed item wakes this taker when it comes due, if before the wait ends:
                // one timer (new items wake it as before).
                let due = picked
                    .next_due_ms
                    .map(|ms| crate::time::instant_after(crate::time::until_ms(ms)));
                let wake = due.map_or(until, |due| due.min(until));
                crate::admission::park(); // nothing to take: waiting by design
                tokio::select! {
                    () = &mut item => {}
                    () = &mut synced => {}
                    () = tokio::time::sleep_until(wake) => {}
                }
                continue;
            }
            if picked.more {
                mirror.pass_on(); // another taker may take what this one leaves
            }
            // The ZooKeeper part runs to its end even if the client goes meanwhile, so that
            // every claim made is kept (and given back at its deadline), never orphaned.
            let took = tokio::spawn(self.clone().take_picked(
                Picking {
                    queue: queue.to_string(),
                    principal: owner.map(str::to_string),
                    names: picked.names,
                    options: options.clone(),
                },
                session,
                mirror.mirror(),
                paths.clone(),
            ));
            let got = took.await.map_err(|_| ZkError::ConnectionLoss)??;
            if !got.is_empty() {
                return Ok(got);
            }
        }
    }

    /// Takes the items `picking` names (see [take_items](super::take_items)) with a claim each,
    /// or removes them (at most once), telling the mirror what came of each; keeps the claims
    /// made. Its own task: it runs to its end even if the taker goes.
    async fn take_picked(
        self,
        picking: Picking,
        session: Session,
        mirror: Arc<Mirror>,
        paths: QueuePaths,
    ) -> Result<Vec<(Taken, Option<Claim>)>, Failure> {
        let Picking {
            queue,
            principal: owner,
            names,
            options,
        } = picking;
        let claims: Vec<Option<Claim>> = names
            .iter()
            .map(|item| {
                options
                    .ack_deadline
                    .map(|deadline| self.new_claim(&queue, item, owner.as_deref(), deadline))
            })
            .collect();
        let picks: Vec<Pick> = names
            .into_iter()
            .zip(&claims)
            .map(|(item, claim)| Pick {
                item,
                claim_data: claim
                    .as_ref()
                    .map(|c| c.record(&self.instance).to_bytes())
                    .unwrap_or_default(),
            })
            .collect();
        let outcome = super::take_items(
            session.client(),
            &self.quotas,
            &paths,
            &picks,
            options.ack_deadline.is_none(),
            (options.max_deliveries, options.max_bytes),
            &options.guards,
        )
        .await;
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(err) => {
                for pick in &picks {
                    mirror.tried(&pick.item, Tried::Again);
                }
                // Whether the claims were made is unknown (the reply was lost and the session
                // went before the check): those that were are timed all the same.
                let made: Vec<Claim> = claims.into_iter().flatten().collect();
                if !made.is_empty() && err != Failure::Unguarded {
                    tokio::spawn(self.clone().keep_those_made(made));
                }
                return Err(err);
            }
        };
        let mut got = Vec::new();
        for ((pick, claim), (tried, taken)) in picks.iter().zip(claims).zip(outcome) {
            mirror.tried(&pick.item, tried);
            let Some(taken) = taken else { continue };
            let claim = claim.map(|c| Claim {
                version: Some(taken.version),
                charge: taken.envelope.charge.clone(),
                ..c
            });
            if let Some(claim) = &claim {
                self.keep(claim.clone());
            }
            got.push((taken, claim));
        }
        Ok(got)
    }

    fn new_claim(&self, queue: &str, item: &str, owner: Option<&str>, deadline: Duration) -> Claim {
        Claim {
            id: crate::ids::claim_id(&self.instance, item),
            queue: queue.to_string(),
            item: item.to_string(),
            deadline_ms: crate::time::ms_after_now(deadline),
            principal: owner.map(str::to_string),
            version: None,
            charge: None,
            expire: CancellationToken::new(),
        }
    }

    /// Acknowledges claims of `queue`: all in one multi-op without reading first when this
    /// instance made them all (and they are as claimed), otherwise each on its own. Whether
    /// each was acknowledged (`false`: no longer held, given back or taken by another), in
    /// order.
    pub async fn ack(&self, queue: &str, held: &[Claim], guards: &Checked) -> Result<Vec<bool>, Failure> {
        let session = self.zk.connected().await.map_err(|_| ZkError::ConnectionLoss)?;
        let paths = self.paths(queue);
        let made_here: Option<Vec<HeldClaim<'_>>> = held
            .iter()
            .map(|c| {
                Some(HeldClaim {
                    item: &c.item,
                    version: c.version?,
                    charge: c.charge.as_ref(),
                })
            })
            .collect();
        if let Some(claims) = made_here
            && super::ack_held(session.client(), &self.quotas, &paths, &claims, guards).await?
        {
            return Ok(vec![true; held.len()]);
        }
        let mut acked = Vec::with_capacity(held.len());
        for claim in held {
            let at = (claim.item.as_str(), claim.id.as_str());
            acked.push(super::claim::ack(session.client(), &self.quotas, &paths, at, guards).await?);
        }
        Ok(acked)
    }

    /// Gives a claim of `queue` back; whether it was still held.
    pub async fn release(&self, claim: &Claim, guards: &Checked) -> Result<bool, Failure> {
        let session = self.zk.connected().await.map_err(|_| ZkError::ConnectionLoss)?;
        let (paths, at) = (self.paths(&claim.queue), (claim.item.as_str(), claim.id.as_str()));
        super::release_claim_guarded(session.client(), &paths, at, guards).await
    }

    /// Moves the deadline of `claim` to `ack_deadline` from now, if the writer's `guards`
    /// hold: the new deadline, or `None` if the claim is no longer held. Its record says it
    /// ([super::extend_claim]); a claim timed here has its timer moved too, and one timed by
    /// another instance is found extended there when that timer fires ([Queues::keep]).
    pub async fn extend(
        &self,
        claim: &Claim,
        ack_deadline: Duration,
        guards: &Checked,
    ) -> Result<Option<i64>, Failure> {
        let session = self.zk.connected().await.map_err(|_| ZkError::ConnectionLoss)?;
        let deadline_ms = crate::time::ms_after_now(ack_deadline);
        let at = (claim.item.as_str(), claim.id.as_str());
        if !super::extend_claim(session.client(), &self.paths(&claim.queue), at, deadline_ms, guards).await? {
            return Ok(None);
        }
        if let Some(timed) = self.forget(&claim.id) {
            self.keep(Claim {
                deadline_ms,
                expire: CancellationToken::new(),
                ..timed
            });
        }
        Ok(Some(deadline_ms))
    }

    /// Remembers a claim and gives it back when its deadline passes unacknowledged (or
    /// extended through another instance, at the deadline its record says then).
    fn keep(&self, claim: Claim) {
        let id = claim.id.clone();
        self.claims.locked().insert(id.clone(), claim.clone());
        let queues = self.clone();
        tokio::spawn(async move {
            let mut deadline_ms = claim.deadline_ms;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(crate::time::until_ms(deadline_ms)) => {}
                    _ = claim.expire.cancelled() => return,
                }
                match queues.give_back(&claim).await {
                    Some(Expiry::Extended(later)) => {
                        deadline_ms = later;
                        if let Some(timed) = queues.claims.locked().get_mut(&id) {
                            timed.deadline_ms = later;
                        }
                    }
                    Some(Expiry::GivenBack) => {
                        if queues.forget(&id).is_some() {
                            tracing::info!(queue = %claim.queue, item = %claim.item, "ack deadline passed: item given back");
                        }
                        return;
                    }
                    Some(Expiry::NotHeld) | None => {
                        queues.forget(&id);
                        return;
                    }
                }
            }
        });
    }

    /// Gives back a claim whose deadline passed, as its record says ([super::expire_claim]),
    /// however long ZooKeeper is away: tried again with each session until ZooKeeper says what
    /// became of it. Once the deadline's timer has fired nobody else times the claim, so a
    /// give-back that failed once (in an outage) and was not tried again left its node for
    /// good: the item in flight forever, never delivered again (issue 53's outage test found
    /// one). `None` if the instance stops first; the claim's node then waits for the reaper's
    /// instance, which adopts the claims of an instance gone.
    async fn give_back(&self, claim: &Claim) -> Option<Expiry> {
        let paths = self.paths(&claim.queue);
        let mut failed = None;
        loop {
            // Waits without polling; the give-back itself waits out a dropped connection, so
            // it fails only when its session is gone, and the next one is waited for.
            let session = self.zk.next_session(failed).await?;
            match super::expire_claim(session.client(), &paths, &claim.item, &claim.id).await {
                Ok(expiry) => return Some(expiry),
                Err(err) => {
                    tracing::debug!(queue = %claim.queue, item = %claim.item, error = %err, "giving a claim back: again with the next session");
                    failed = Some(session.generation);
                }
            }
        }
    }

    /// Times those of `claims` that their take made although it could not tell (its reply
    /// lost, its session gone before the check): looked for with the next session, each one
    /// found is kept as any claim is, and given back at its deadline (at once if past).
    async fn keep_those_made(self, claims: Vec<Claim>) {
        let mut failed = None;
        for claim in claims {
            let paths = self.paths(&claim.queue);
            let found = loop {
                let Some(session) = self.zk.next_session(failed).await else {
                    return; // stopping: the reaper's instance adopts what this one made
                };
                match super::read_claim(session.client(), &paths, &claim.item).await {
                    Ok(found) => break found,
                    Err(_) => failed = Some(session.generation),
                }
            };
            if found.is_some_and(|(record, _)| record.claim == claim.id) {
                tracing::info!(queue = %claim.queue, item = %claim.item, "a take that could not tell made its claim: timing it");
                self.keep(claim);
            }
        }
    }

    /// The claim `id` of `queue` as an ack or a nack finds it: timed here, or else as recorded in
    /// ZooKeeper (made through another instance, which times it, or one gone, whose claims the
    /// reaper's instance times) while its deadline has not passed. `None` if it is not held.
    pub async fn find(&self, queue: &str, id: &str) -> Result<Option<Claim>, Failure> {
        if let Some(held) = self.claim(queue, id) {
            return Ok(Some(held));
        }
        let Some(item) = crate::ids::claimed_item(id) else {
            return Ok(None);
        };
        let session = self.zk.connected().await.map_err(|_| ZkError::ConnectionLoss)?;
        let paths = self.paths(queue);
        let mut recorded = super::read_claim(session.client(), &paths, &item).await?;
        if recorded.is_none() {
            // Made through another instance a moment ago, maybe: this session's server may not
            // have it yet. As of now, after a sync.
            session.sync().await?;
            recorded = super::read_claim(session.client(), &paths, &item).await?;
        }
        Ok(recorded
            .filter(|(record, _)| record.claim == id && record.deadline_ms > crate::time::now_ms())
            .map(|(record, _)| Claim::recorded(queue.to_string(), item, record)))
    }

    /// Takes over the timing of every claim whose instance is not in `live` (gone): each is
    /// given back at its deadline (at once if past) unless acknowledged meanwhile through any
    /// instance. Run by the lease reaper's instance, when an instance goes and when it starts.
    /// How many it adopted.
    pub async fn adopt_orphans(
        &self,
        client: &zookeeper_client::Client,
        live: &HashSet<&str>,
    ) -> Result<usize, ZkError> {
        let mut adopted = 0;
        for super::StandingClaim { queue, item, record } in super::all_claims(client, &self.base).await? {
            if live.contains(record.instance.as_str()) || self.claim(&queue, &record.claim).is_some() {
                continue;
            }
            let claim = Claim::recorded(queue, item, record);
            if claim.deadline_ms <= crate::time::now_ms() {
                // Past its deadline already (every instance was gone meanwhile): given back
                // before this returns, so before a starting instance is ready.
                if super::release_claim(client, &self.paths(&claim.queue), &claim.item, &claim.id).await? {
                    tracing::info!(queue = %claim.queue, item = %claim.item, "ack deadline passed while its instance was gone: item given back");
                }
            } else {
                tracing::info!(queue = %claim.queue, item = %claim.item, "timing a claim of an instance gone");
                self.keep(claim);
            }
            adopted += 1;
        }
        Ok(adopted)
    }

    /// The claim with this id, if it is `queue`'s and still held.
    pub fn claim(&self, queue: &str, id: &str) -> Option<Claim> {
        self.claims.locked().get(id).filter(|c| c.queue == queue).cloned()
    }

    /// Remembers that the claim `id` (held as `claim`) was acknowledged or given back.
    pub fn settle(&self, id: &str, claim: &Claim, acked: bool) {
        let settled = Settled {
            queue: claim.queue.clone(),
            acked,
            principal: claim.principal.clone(),
        };
        self.settled.locked().insert(id.to_string(), settled);
    }

    /// How the claim `id` of `queue` was settled, if this instance remembers.
    pub fn settled(&self, queue: &str, id: &str) -> Option<Settled> {
        let settled = self.settled.locked();
        settled.get(id).filter(|s| s.queue == queue).cloned()
    }

    /// Forgets a claim (acknowledged, given back or expired).
    pub fn forget(&self, id: &str) -> Option<Claim> {
        let claim = self.claims.locked().remove(id);
        if let Some(claim) = &claim {
            claim.expire.cancel();
        }
        claim
    }
}
