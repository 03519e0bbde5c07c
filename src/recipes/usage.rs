//! What zkgate stores in ZooKeeper, bounded as a whole and per principal by ZooKeeper's own
//! hard quotas ([crate::zk::quota]), so that no client can exhaust ZooKeeper's memory and the
//! bounds hold whichever instance a write goes through.
//!
//! - **The whole tree**: a quota on the root (`--quota-bytes`, `--quota-znodes`) counts every
//!   znode under it that has no nearer quota: values, items, contenders, leases, directories.
//!   The instances' registrations (`<root>/instances`) have a quota without limits of their
//!   own, so that an instance can always register.
//! - **Per principal** (`--quota-bytes-per-principal`, `--quota-znodes-per-principal`):
//!   values live where the recipes' layout puts them (shared with Curator and kazoo), not under
//!   their writer, and a quota counts a subtree. So each stored value has a *charge*: a
//!   node `<root>/usage/<principal>/<id>` created in the same multi-op as the value and deleted
//!   in the same multi-op as it, whose data is one byte per KiB of the value. The quota on
//!   `<root>/usage/<principal>` then bounds the principal's values in number and in KiB, and a
//!   write past it fails as a whole, value included. A value bound to a lease (a member's
//!   data) goes with its charge when the lease ends, in the same multi-op.
//!
//! The servers enforce quotas only when started with `zookeeper.enforceQuota=true` (zkgate's
//! embedded and test servers are). Each session probes for it; where it is off, zkgate warns,
//! says so in `/readyz`, and checks the usage itself before each charge: the same bounds,
//! except for writes that race on several instances.

use crate::zk::{Failure, Session};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use crate::zk::Multi;
use serde::Serialize;
use tokio::sync::watch;
use zookeeper_client::{Client, CreateMode, Error as ZkError, MultiReadResult};

use crate::locked::Locked;
use crate::zk::quota::{self, Limits, Reached, Usage};
use crate::zk::retry_on_loss;
use crate::zk::session::ZkSession;

/// The limits, from the command line.
#[derive(Clone, Copy, Debug, Default)]
pub struct QuotaSettings {
    /// The whole tree under the root.
    pub total: Limits,
    /// Each principal's values.
    pub per_principal: Limits,
}

/// Whether the servers enforce quotas, as the session's probe found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Enforcement {
    /// Not probed yet (no session yet).
    Unknown,
    Enforced,
    /// The servers keep the usage but let writes past the limits: zkgate checks it itself.
    NotEnforced,
}

/// The principal charged when auth is off (everyone is one principal then).
pub const ANYONE: &str = "anyone";

/// A value's charge: the node `<root>/usage/<principal>/<id>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Charge {
    pub principal: String,
    pub id: String,
}

/// A charge's node, to be created with its value: its path and data.
#[derive(Clone, Debug)]
pub struct ChargeNode {
    pub path: String,
    pub data: Vec<u8>,
}

/// Which quota a write would pass, for its 507.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exceeded {
    /// The flag that sets it: `--quota-bytes-per-principal`, `--quota-znodes`...
    pub quota: &'static str,
    pub detail: String,
}

/// Why a value could not be charged.
#[derive(Debug)]
pub enum ChargeError {
    Exceeded(Exceeded),
    ZooKeeper(Failure),
}

impl From<ZkError> for ChargeError {
    fn from(err: ZkError) -> ChargeError {
        ChargeError::ZooKeeper(err.into())
    }
}

/// The quotas of this instance's root. Cheap to clone.
#[derive(Clone)]
pub struct Quotas(Arc<Inner>);

struct Inner {
    root: String,
    /// `<root>/usage`.
    dir: String,
    settings: QuotaSettings,
    /// Principals whose quota this process has set.
    prepared: Mutex<HashSet<String>>,
    enforcement: watch::Sender<Enforcement>,
}

/// The charge id of the value at `path` when a path has one charge, whoever stores there (a
/// kv key: `kv`; an election's proclaimed value: `el`): the prefix and a hash of the path, so
/// that any path makes a znode name.
pub fn path_id(prefix: &str, path: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(path.as_bytes());
    format!("{prefix}-{}", crate::ids::hex(&digest[..16]))
}

/// Who pays for a write: the principal (`None`: auth is off) and the quotas that bound it.
#[derive(Clone, Copy)]
pub struct Payer<'a> {
    pub quotas: &'a Quotas,
    pub principal: Option<&'a str>,
}

impl Payer<'_> {
    /// What to say of a write of `bytes` that ZooKeeper refused with `QuotaExceeded`.
    pub async fn exceeded(&self, session: &Session, bytes: usize) -> Exceeded {
        self.quotas.exceeded(session, self.principal, bytes).await
    }
}

/// One byte of a charge's data per KiB of its value (at least one for a value of any size).
pub fn units(bytes: usize) -> usize {
    bytes.div_ceil(1024).max(1)
}

/// What an operation of a charged write is for: the value's own node, or one of its charges
/// (created, resized or refunded with it).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Charged {
    Value,
    Charge,
}

impl Quotas {
    /// The quotas under `root`; on every session of `zk`, sets the root's (and the
    /// registrations') and probes whether the servers enforce them.
    pub fn start(zk: ZkSession, root: &str, settings: QuotaSettings) -> Quotas {
        let quotas = Quotas(Arc::new(Inner {
            root: root.to_string(),
            dir: format!("{root}/usage"),
            settings,
            prepared: Mutex::default(),
            enforcement: watch::Sender::new(Enforcement::Unknown),
        }));
        tokio::spawn(quotas.clone().keep_on_every_session(zk));
        quotas
    }

    pub fn enforcement(&self) -> Enforcement {
        *self.0.enforcement.borrow()
    }

    /// Waits until the servers' enforcement is known.
    pub async fn probed(&self) -> Enforcement {
        let mut known = self.0.enforcement.subscribe();
        let _ = known.wait_for(|e| *e != Enforcement::Unknown).await;
        self.enforcement()
    }

    async fn keep_on_every_session(self, zk: ZkSession) {
        let mut status = zk.subscribe();
        let mut done = None;
        loop {
            let current = status.borrow_and_update().clone();
            if let Some(client) = current.client.filter(|_| done != Some(current.generation)) {
                match self.set_up(&client).await {
                    Ok(enforcement) => {
                        done = Some(current.generation);
                        if enforcement == Enforcement::NotEnforced {
                            tracing::warn!(
                                "ZooKeeper does not enforce quotas (start its servers with -Dzookeeper.enforceQuota=true, or \
                                 enforceQuota=true in zoo.cfg): zkgate checks them itself, which writes racing on several \
                                 instances can pass"
                            );
                        }
                        self.0.enforcement.send_replace(enforcement);
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, "could not set zkgate's ZooKeeper quotas; retrying on the next session")
                    }
                }
            }
            if status.changed().await.is_err() {
                return;
            }
        }
    }

    /// Sets the root's quota and the registrations' (none), and probes enforcement.
    async fn set_up(&self, client: &Client) -> Result<Enforcement, ZkError> {
        let inner = &self.0;
        quota::set(client, &inner.root, inner.settings.total).await?;
        let instances = format!("{}/instances", inner.root);
        crate::zk::session::ensure_path(client, &instances).await?;
        quota::set(client, &instances, Limits::default()).await?;
        crate::zk::session::ensure_path(client, &inner.dir).await?;
        let probe = format!("{}/quota-probe", inner.root);
        Ok(if quota::enforced(client, &probe).await? {
            Enforcement::Enforced
        } else {
            Enforcement::NotEnforced
        })
    }

    fn principal_dir(&self, principal: &str) -> String {
        format!("{}/{principal}", self.0.dir)
    }

    /// The path of `charge`'s node.
    pub fn path(&self, charge: &Charge) -> String {
        format!("{}/{}", self.principal_dir(&charge.principal), charge.id)
    }

    /// Makes sure `principal` has its usage node and quota (once per process).
    async fn prepare(&self, client: &Client, principal: &str) -> Result<(), ZkError> {
        if self.0.prepared.locked().contains(principal) {
            return Ok(());
        }
        let dir = self.principal_dir(principal);
        crate::zk::session::ensure_path(client, &dir).await?;
        // In the charges' units (a byte per KiB), and counting the principal's own node.
        let limits = self.0.settings.per_principal;
        let in_units = Limits {
            bytes: limits.bytes.map(|b| b.div_ceil(1024)),
            znodes: limits.znodes.map(|n| n.saturating_add(1)),
        };
        quota::set(client, &dir, in_units).await?;
        self.0.prepared.locked().insert(principal.to_string());
        Ok(())
    }

    /// Sets `principal`'s usage node and quota up again (after a write found it missing).
    pub async fn repair(&self, client: &Client, principal: &str) -> Result<(), ZkError> {
        self.0.prepared.locked().remove(principal);
        self.prepare(client, principal).await
    }

    /// A new charge for a value of `bytes` that `principal` (`None`: auth is off) stores, its
    /// node to be created (with [Quotas::add_charge]) in the multi-op that stores the value.
    /// Where the servers do not enforce quotas, the usage is checked here first.
    pub async fn charge(
        &self,
        session: &Session,
        principal: Option<&str>,
        bytes: usize,
    ) -> Result<Charge, ChargeError> {
        let client = session.client();
        let id = uuid::Uuid::new_v4().simple().to_string();
        self.charge_as(client, principal, bytes, id).await
    }

    /// [Quotas::charge] under a given id (a path's, [path_id]).
    pub async fn charge_as(
        &self,
        client: &Client,
        principal: Option<&str>,
        bytes: usize,
        id: String,
    ) -> Result<Charge, ChargeError> {
        let principal = principal.unwrap_or(ANYONE);
        self.prepare(client, principal).await?;
        if self.enforcement() != Enforcement::Enforced
            && let Some(exceeded) = self.check(client, principal, bytes).await?
        {
            return Err(ChargeError::Exceeded(exceeded));
        }
        Ok(Charge {
            principal: principal.to_string(),
            id,
        })
    }

    /// The charges under `id` that exist now, whichever principal's, with their versions: a
    /// key is charged to whoever wrote it last, and a write or delete by anyone refunds the
    /// others. One listing and one multi-read, whatever the number of principals.
    pub async fn charges_of(&self, client: &Client, id: &str) -> Result<Vec<(Charge, i32)>, ZkError> {
        let principals = crate::zk::children(client, &self.0.dir).await?;
        if principals.is_empty() {
            return Ok(Vec::new());
        }
        let results = retry_on_loss(|| {
            let mut reader = client.new_multi_reader();
            for principal in &principals {
                let _ = reader.add_get_data(&format!("{}/{principal}/{id}", self.0.dir));
            }
            reader.commit()
        })
        .await?;
        Ok(principals
            .into_iter()
            .zip(results)
            .filter_map(|(principal, result)| match result {
                MultiReadResult::Data { stat, .. } => Some((
                    Charge {
                        principal,
                        id: id.to_string(),
                    },
                    stat.version,
                )),
                _ => None,
            })
            .collect())
    }

    /// [Quotas::charges_of] for each of `ids` at once: one listing and one multi-read (in
    /// chunks) for all of them, whatever their number (a transaction's keys).
    pub async fn charges_of_each(&self, client: &Client, ids: &[String]) -> Result<Vec<Vec<(Charge, i32)>>, ZkError> {
        let principals = crate::zk::children(client, &self.0.dir).await?;
        let mut each = vec![Vec::new(); ids.len()];
        if principals.is_empty() || ids.is_empty() {
            return Ok(each);
        }
        let paths: Vec<String> = (ids.iter())
            .flat_map(|id| {
                principals
                    .iter()
                    .map(move |principal| format!("{}/{principal}/{id}", self.0.dir))
            })
            .collect();
        // A charge's data is a byte per KiB of its value.
        let found = crate::zk::get_each_of_size(client, &paths, 1024).await?;
        for (at, found) in found.into_iter().enumerate() {
            let (key, principal) = (at / principals.len(), &principals[at % principals.len()]);
            if let Some((_, stat)) = found {
                let charge = Charge {
                    principal: principal.clone(),
                    id: ids[key].clone(),
                };
                each[key].push((charge, stat.version));
            }
        }
        Ok(each)
    }

    /// Adds to `multi` what moves the charges `existing` (from [Quotas::charges_of]) to
    /// `mine` for a value of `bytes`: the others' refunded, `mine` created or resized, each
    /// conditional on the version read, so that a write racing on the same key fails the
    /// multi-op rather than leaving two charges.
    pub fn add_recharge<T: Clone>(
        &self,
        multi: &mut Multi<'_, T>,
        tag: T,
        mine: &Charge,
        bytes: usize,
        existing: &[(Charge, i32)],
    ) -> Result<(), ZkError> {
        let mut had = false;
        for (charge, version) in existing {
            if charge == mine {
                had = true;
                multi.set(tag.clone(), &self.path(charge), &vec![0; units(bytes)], Some(*version))?;
            } else {
                multi.delete(tag.clone(), &self.path(charge), Some(*version))?;
            }
        }
        if !had {
            self.add_charge(multi, tag, mine, bytes)?;
        }
        Ok(())
    }

    /// Adds to `multi` the refund of each of `existing` (a deleted key's charges).
    pub fn add_refunds<T: Clone>(
        &self,
        multi: &mut Multi<'_, T>,
        tag: T,
        existing: &[(Charge, i32)],
    ) -> Result<(), ZkError> {
        for (charge, version) in existing {
            multi.delete(tag.clone(), &self.path(charge), Some(*version))?;
        }
        Ok(())
    }

    /// `charge`'s node for a value of `bytes`: its path and data.
    pub fn node(&self, charge: &Charge, bytes: usize) -> ChargeNode {
        ChargeNode {
            path: self.path(charge),
            data: vec![0; units(bytes)],
        }
    }

    /// Adds the creation of `charge`'s node (persistent), for a value of `bytes`, to `multi`.
    pub fn add_charge<T>(
        &self,
        multi: &mut Multi<'_, T>,
        tag: T,
        charge: &Charge,
        bytes: usize,
    ) -> Result<(), ZkError> {
        let options = CreateMode::Persistent.with_acls(crate::zk::acls());
        multi.create(tag, &self.path(charge), &vec![0; units(bytes)], &options)?;
        Ok(())
    }

    /// Adds the deletion of `charge`'s node to `multi` (with the value's).
    pub fn add_refund<T>(&self, multi: &mut Multi<'_, T>, tag: T, charge: &Charge) -> Result<(), ZkError> {
        multi.delete(tag, &self.path(charge), None)?;
        Ok(())
    }

    /// The quota that a value of `bytes` by `principal` would pass, if any: the principal's,
    /// then the whole tree's. Also what names the quota after ZooKeeper refused a write.
    pub async fn check(&self, client: &Client, principal: &str, bytes: usize) -> Result<Option<Exceeded>, ZkError> {
        let dir = self.principal_dir(principal);
        let read = quota::read_many(client, &[&dir, &self.0.root]).await?;
        let units = i64::try_from(units(bytes)).unwrap_or(i64::MAX);
        let value = i64::try_from(bytes).unwrap_or(i64::MAX);
        let one = |bytes| Usage { bytes, znodes: 1 };
        if let Some(Some((usage, limits))) = read.first()
            && let Some(reached) = limits.reached(*usage, one(units))
        {
            return Ok(Some(per_principal(principal, reached, *usage, *limits)));
        }
        if let Some(Some((usage, limits))) = read.get(1)
            && let Some(reached) = limits.reached(*usage, one(value))
        {
            return Ok(Some(whole_tree(reached, *usage, *limits)));
        }
        Ok(None)
    }

    /// What to say of a write ZooKeeper refused with `QuotaExceeded`: the quota it passed.
    pub async fn exceeded(&self, session: &Session, principal: Option<&str>, bytes: usize) -> Exceeded {
        let client = session.client();
        let principal = principal.unwrap_or(ANYONE);
        match self.check(client, principal, bytes).await {
            Ok(Some(exceeded)) => exceeded,
            _ => Exceeded {
                quota: "--quota-bytes",
                detail: "ZooKeeper refused the write: a quota on zkgate's znodes is full; delete something first"
                    .into(),
            },
        }
    }
}

fn per_principal(principal: &str, reached: Reached, usage: Usage, limits: Limits) -> Exceeded {
    match reached {
        Reached::Bytes => Exceeded {
            quota: "--quota-bytes-per-principal",
            detail: format!(
                "principal `{principal}` stores {} KiB of values, and its quota is {} KiB (--quota-bytes-per-principal); delete some first",
                usage.bytes,
                limits.bytes.unwrap_or_default()
            ),
        },
        Reached::Znodes => Exceeded {
            quota: "--quota-znodes-per-principal",
            detail: format!(
                "principal `{principal}` stores {} values, and its quota is {} (--quota-znodes-per-principal); delete some first",
                usage.znodes - 1,
                limits.znodes.unwrap_or_default().saturating_sub(1)
            ),
        },
    }
}

fn whole_tree(reached: Reached, usage: Usage, limits: Limits) -> Exceeded {
    match reached {
        Reached::Bytes => Exceeded {
            quota: "--quota-bytes",
            detail: format!(
                "zkgate's znodes hold {} bytes, and the quota on them all is {} (--quota-bytes); delete something first",
                usage.bytes,
                limits.bytes.unwrap_or_default()
            ),
        },
        Reached::Znodes => Exceeded {
            quota: "--quota-znodes",
            detail: format!(
                "zkgate has {} znodes, and the quota on them all is {} (--quota-znodes); delete something first",
                usage.znodes,
                limits.znodes.unwrap_or_default()
            ),
        },
    }
}

/// 507 naming the quota a write would pass.
impl From<Exceeded> for crate::problem::ApiError {
    fn from(exceeded: Exceeded) -> crate::problem::ApiError {
        crate::problem::ApiError::quota(exceeded.quota, exceeded.detail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_charge_is_a_byte_per_kib() {
        assert_eq!(units(0), 1);
        assert_eq!(units(1024), 1);
        assert_eq!(units(1025), 2);
        assert_eq!(units(256 * 1024), 256);
    }
}
