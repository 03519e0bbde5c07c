//! What a lease holds, across kinds: each kind's registry of the holdings this instance drives,
//! which takes over the holdings of a lease adopted here, and the view of the holdings that
//! other instances drive, for the lease's own view. Above every recipe, since it asks each
//! kind's module how its holdings stand.

use std::sync::Arc;

use crate::kind::Kind;
use crate::zk::{Failure, Session};

use crate::recipes::engine::contender::Contenders;
use crate::recipes::engine::lease::{HoldingView, Lease};
use crate::recipes::engine::node::NodeHoldings;
use crate::recipes::engine::record::{HoldingRecord, Shape};
use crate::recipes::kv::bound::BoundKeys;
use crate::recipes::locks::semaphore::Semaphores;
use crate::recipes::recorded::{exists, recorded};
use crate::recipes::usage::Quotas;

/// The registries of what leases hold, one a kind (and the lock sets' records on locks).
#[derive(Clone)]
pub struct Registries {
    pub locks: Contenders,
    /// The records of locks held together (`/v1/lock-sets`, on `locks`' handles): lease-bound
    /// nodes under `<root>/lock-sets`.
    pub lock_sets: NodeHoldings,
    pub rwlocks: Contenders,
    pub elections: Contenders,
    pub semaphores: Semaphores,
    pub groups: NodeHoldings,
    /// Service instances registered through this instance (`/v1/services`).
    pub services: NodeHoldings,
    pub barriers: NodeHoldings,
    pub double_barriers: NodeHoldings,
    /// Two-phase commit transactions (`<root>/txns/<id>`) and their registered participants.
    pub txn_members: NodeHoldings,
    /// Keys bound to leases (`/v1/kv/{key}?lease=`).
    pub kv_keys: BoundKeys,
    /// What a binding's end refunds.
    quotas: Quotas,
}

impl Registries {
    pub fn new(root: &str, quotas: &Quotas) -> Registries {
        Registries {
            locks: Contenders::new(root, Kind::Lock),
            lock_sets: NodeHoldings::new(root, Kind::Lock),
            rwlocks: Contenders::new(root, Kind::RwLock),
            elections: Contenders::new(root, Kind::Election),
            semaphores: Semaphores::new(root, Kind::Semaphore),
            groups: NodeHoldings::new(root, Kind::Group),
            services: NodeHoldings::new(root, Kind::Service),
            barriers: NodeHoldings::new(root, Kind::Barrier),
            double_barriers: NodeHoldings::new(root, Kind::DoubleBarrier),
            txn_members: NodeHoldings::new(root, Kind::Txn),
            kv_keys: BoundKeys::new(root, Kind::Kv),
            quotas: quotas.clone(),
        }
    }

    /// Takes over the holdings of a lease this instance adopts: each holding record names a
    /// kind and a shape, whose registry takes the handle over (its task finds its znodes and
    /// goes on, see [crate::recipes::engine::handle]).
    pub fn adopt(&self, lease: &Arc<Lease>, holdings: Vec<(String, HoldingRecord)>) {
        for (record_name, holding) in holdings {
            let (name, id, record_name) = (holding.name.as_str(), holding.handle.as_str(), record_name.as_str());
            // A kind this version does not know is not taken over.
            let adopted = holding
                .kind()
                .is_some_and(|kind| self.adopt_one(kind, lease, (name, id), record_name, &holding.shape));
            if !adopted {
                tracing::warn!(lease = %lease.id, ?holding, "a holding of a lease taken over was not understood");
            }
        }
    }

    /// Takes over one holding of `kind` and `shape`: whether its kind's registry did. Which
    /// kinds have contenders or node holdings is said by [Registries::contenders] and
    /// [Registries::nodes], whose matches have no wildcard, so a new kind decides there.
    fn adopt_one(&self, kind: Kind, lease: &Arc<Lease>, at: (&str, &str), record_name: &str, shape: &Shape) -> bool {
        match shape {
            Shape::Contender { role } => self
                .contenders(kind)
                .zip(crate::recipes::roles::from_label(role))
                .is_some_and(|(registry, role)| registry.adopt_contender(lease, at, record_name, role).is_ok()),
            Shape::Permit { permits } => {
                kind == Kind::Semaphore && self.semaphores.adopt_permit(lease, at, record_name, *permits).is_ok()
            }
            Shape::Node { .. } if kind == Kind::Kv => self
                .kv_keys
                .adopt_binding(lease, &self.quotas, at, record_name, shape)
                .is_ok(),
            Shape::Node { .. } => self
                .nodes(kind)
                .is_some_and(|nodes| nodes.adopt_node(lease, at, record_name, shape).is_ok()),
        }
    }

    /// How many handles of `owner` wait their turn on this instance, over every kind that
    /// queues (a new kind must say whether it does: the match has no wildcard).
    pub fn waiting_of(&self, owner: &Option<String>) -> usize {
        Kind::ALL
            .into_iter()
            .map(|kind| match kind {
                Kind::Lock => self.locks.queued_of(owner),
                Kind::RwLock => self.rwlocks.queued_of(owner),
                Kind::Election => self.elections.queued_of(owner),
                Kind::Semaphore => self.semaphores.queued_of(owner),
                Kind::Barrier
                | Kind::DoubleBarrier
                | Kind::Txn
                | Kind::Queue
                | Kind::Group
                | Kind::Kv
                | Kind::Counter
                | Kind::Service => 0,
            })
            .sum()
    }

    /// The registry of a kind's contenders, if it has any.
    fn contenders(&self, kind: Kind) -> Option<&Contenders> {
        match kind {
            Kind::Lock => Some(&self.locks),
            Kind::RwLock => Some(&self.rwlocks),
            Kind::Election => Some(&self.elections),
            Kind::Semaphore
            | Kind::Barrier
            | Kind::DoubleBarrier
            | Kind::Txn
            | Kind::Queue
            | Kind::Group
            | Kind::Kv
            | Kind::Counter
            | Kind::Service => None,
        }
    }

    /// The registry of a kind's node holdings, if it has any (a lock's are lock sets').
    fn nodes(&self, kind: Kind) -> Option<&NodeHoldings> {
        match kind {
            Kind::Group => Some(&self.groups),
            Kind::Service => Some(&self.services),
            Kind::Barrier => Some(&self.barriers),
            Kind::DoubleBarrier => Some(&self.double_barriers),
            Kind::Txn => Some(&self.txn_members),
            Kind::Lock => Some(&self.lock_sets),
            Kind::RwLock | Kind::Semaphore | Kind::Election | Kind::Queue | Kind::Kv | Kind::Counter => None,
        }
    }
}

/// How the holdings of `lease` that are not attached here show, from ZooKeeper: those that
/// other instances drive (an acquire served where it arrived: see [crate::recipes::engine::lease]).
/// A contender or a permit holds or waits as its node's place says; a node holding holds while
/// it is there; one whose node is gone while its holding record stays was lost.
pub async fn driven_elsewhere(session: &Session, root: &str, lease: &Lease) -> Result<Vec<HoldingView>, Failure> {
    use crate::recipes::engine::record;
    let here = lease.attached_records();
    let record_names = record::holdings(session.client(), &lease.path).await?;
    let mut views = Vec::new();
    let elsewhere = record_names.into_iter().filter(|(name, _)| !here.contains(name));
    for holding in elsewhere.map(|(_, holding)| holding) {
        let Some(kind) = holding.kind() else { continue };
        let dir = kind.path(root, &holding.name);
        // `None`: lost (its node gone while its holding record stays).
        let standing = match &holding.shape {
            Shape::Node { hidden: true, .. } => continue,
            // A node holds while it is there.
            Shape::Node { path, .. } => exists(session, path).await?.then_some(("held", None)),
            // A contender or a permit holds or waits as its node's place says.
            Shape::Permit { .. } => {
                crate::recipes::locks::semaphore::recorded(session, &dir, &holding.name, &holding.handle)
                    .await?
                    .as_ref()
                    .map(place)
            }
            Shape::Contender { .. } => recorded(session, kind, &dir, &holding.name, &holding.handle)
                .await?
                .as_ref()
                .map(place),
        };
        let (state, fencing_token) = standing.unwrap_or(("lost", None));
        views.push(HoldingView {
            kind: kind.name(),
            name: holding.name,
            handle: holding.handle,
            state,
            fencing_token,
            revocation: None,
        });
    }
    Ok(views)
}

/// Where a contender or a permit request stands: held with its fencing token, or waiting.
fn place(found: &crate::recipes::recorded::Recorded) -> (&'static str, Option<i64>) {
    match found.holds() {
        true => ("held", Some(found.node.czxid)),
        false => ("waiting", None),
    }
}

impl crate::recipes::Recipes {
    /// [driven_elsewhere] for `lease`, as this instance's server has it (no `sync`: a view of a
    /// lease's holdings, which a keepalive answers too).
    pub async fn driven_elsewhere(&self, lease: &Lease) -> Result<Vec<HoldingView>, crate::problem::ApiError> {
        let session = self
            .reader(crate::recipes::consistency::Consistency::Sequential)
            .await?;
        Ok(driven_elsewhere(&session, &self.root, lease).await?)
    }
}
