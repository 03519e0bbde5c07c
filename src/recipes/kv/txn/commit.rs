//! Running a transaction: each attempt reads the keys, the bindings of those written and their
//! charges in one round trip, and commits the branch the compares pick in one multi-op pinned to
//! what was read (with the bindings it makes, keeps or removes, the charges and the idempotency
//! key), again while a pin is refused. Why this file is long (some 610 lines): the multi-op's
//! parts (bindings, charges, writer records, the leases' guards) are each a few functions over
//! the attempt's read, and belong with it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use zookeeper_client::{CreateMode, Error as ZkError};

use super::key::{Answered, answer_of, replayed};
use super::{
    ATTEMPTS, Binding, Entry, Outcome, Planned, ReadBinding, Step, Txn, TxnError, plan, put_stat, refused, results,
};
use crate::kind::Kind;
use crate::recipes::condition::Recheck;
use crate::recipes::engine::lease::{Guard, GuardError, Lease};
use crate::recipes::engine::node::owner_record_path;
use crate::recipes::engine::record;
use crate::recipes::guards::{Guards, Standing};
use crate::recipes::idempotency::Keyed;
use crate::recipes::kv::bound::{self, BoundKeys};
use crate::recipes::kv::writer;
use crate::recipes::usage::{self, Payer, Quotas};
use crate::zk::{Done, Failed, Failure, Multi, Session};

/// What the bindings of a transaction's keys need: the bindings this instance drives (and
/// zkgate's root, theirs), the leases its puts name (resolved by the caller, each one it may
/// use), the quotas a binding's end refunds, and the caller (whose ownership a delete of a
/// bound key checks).
#[derive(Clone, Copy)]
pub struct Bindings<'a> {
    pub keys: &'a BoundKeys,
    pub leases: &'a HashMap<String, Arc<Lease>>,
    pub quotas: &'a Quotas,
    pub caller: &'a crate::auth::Caller,
}

/// A binding a branch makes: its lease, its handle and the records written for it.
struct NewBinding {
    lease: Arc<Lease>,
    name: String,
    handle: String,
    record_name: String,
    owner: Vec<u8>,
    holding: Vec<u8>,
}

/// Runs `txn`: reads its keys (values of at most `max_value_bytes`) and the bindings of those it
/// writes, evaluates its compares, and commits the branch they pick pinned to what was read;
/// again if a pin fails. Each put's value is charged to `payer` and each delete refunds, in the
/// same multi-op, as a kv write's. With `key` at most once for the key, whatever replies are
/// lost; a branch that only reads stores no record (but is answered from one an earlier
/// attempt of the request left).
pub async fn run(
    session: &Session,
    txn: &Txn,
    max_value_bytes: usize,
    payer: Payer<'_>,
    bound: Bindings<'_>,
    (key, guards, held): (Option<Keyed<'_>>, &Guards, &[(usize, Standing)]),
) -> Result<Outcome, TxnError> {
    let caller = bound.caller;
    let owns = |principal: &str| caller.owns(Some(principal));
    let written = written_keys(txn);
    let mut running = Running {
        session,
        txn,
        max_value_bytes,
        payer,
        bound,
        key,
        guards,
        held,
        keys: txn.keys().into_iter().map(String::from).collect(),
        charge_ids: written.iter().map(|path| usage::path_id("kv", path)).collect(),
        recorded: recorded_keys(txn, guards),
        written,
        missing: HashMap::new(),
        lost_here: false,
    };
    let mut recheck = Recheck::default();
    for _ in 0..ATTEMPTS {
        let read = running.read().await?;
        let holds = |index| held.iter().any(|(at, standing)| *at == index && standing.holds());
        let failed_compare = txn.first_failed(&read.reads, holds);
        if let Some(refusal) = refused(txn.branch(failed_compare), &read.reads, &read.bindings, &owns) {
            recheck.confirm(session, TxnError::Binding(refusal)).await?;
            continue;
        }
        if let Some(outcome) = running.attempt(&read, failed_compare).await? {
            return Ok(outcome);
        }
    }
    Err(TxnError::Contended)
}

/// A transaction being run: what its attempts share.
struct Running<'a> {
    session: &'a Session,
    txn: &'a Txn,
    max_value_bytes: usize,
    payer: Payer<'a>,
    bound: Bindings<'a>,
    key: Option<Keyed<'a>>,
    /// What the writer must still hold when the branch commits.
    guards: &'a Guards,
    /// Where the guards of its compares stand, by the compare's index.
    held: &'a [(usize, Standing)],
    /// Every key it reads ([Txn::keys]).
    keys: Vec<String>,
    /// The keys it writes ([written_keys]), and their charge ids.
    written: Vec<String>,
    charge_ids: Vec<String>,
    /// The keys whose writer record ([writer]) a branch may write or delete.
    recorded: Vec<String>,
    /// The missing parents of absent keys, once a commit failed for want of one.
    missing: HashMap<String, Vec<String>>,
    /// Whether a commit of this call lost its reply: its key found then is this call's own.
    lost_here: bool,
}

/// What an attempt read: the keys, the bindings of those written, their charges, and which
/// of the keys whose writer record ([writer]) a branch may change have one.
struct Read {
    reads: HashMap<String, Option<Entry>>,
    bindings: HashMap<String, Option<ReadBinding>>,
    charges: HashMap<String, Vec<(usage::Charge, i32)>>,
    recorded: HashSet<String>,
}

impl Running<'_> {
    /// Reads the keys, the bindings of those written and their charges: requests sent
    /// together, one round trip.
    async fn read(&self) -> Result<Read, TxnError> {
        let (client, root) = (self.session.client(), self.bound.keys.root());
        let records: Vec<String> = (self.recorded.iter())
            .map(|path| writer::record_path(root, path))
            .collect();
        let (read, bindings, charges, recorded) = tokio::join!(
            crate::zk::get_each_of_size(client, &self.keys, self.max_value_bytes),
            read_bindings(client, &self.written, root),
            self.payer.quotas.charges_of_each(client, &self.charge_ids),
            crate::zk::stat_each(client, &records),
        );
        let recorded = (self.recorded.iter().zip(recorded?))
            .filter_map(|(path, stat)| stat.map(|_| path.clone()))
            .collect();
        let entries = read?.into_iter().map(|read| {
            read.map(|(data, stat)| Entry {
                data,
                stat,
                lease: None,
            })
        });
        Ok(Read {
            reads: self.keys.iter().cloned().zip(entries).collect(),
            bindings: bindings?,
            charges: self.charge_ids.iter().cloned().zip(charges?).collect(),
            recorded,
        })
    }

    /// Commits the branch that `read` picks, pinned to it: its outcome, or `None` to go again.
    async fn attempt(&mut self, read: &Read, failed_compare: Option<usize>) -> Result<Option<Outcome>, TxnError> {
        let (client, root) = (self.session.client(), self.bound.keys.root());
        let branch = self.txn.branch(failed_compare);
        let planned = plan(branch, &read.reads, &self.missing, &read.bindings);
        let made = new_bindings(&planned, &self.bound)?;
        // The bindings a delete removes, whose tasks here end after the commit.
        let unbound: Vec<(String, Binding)> = (planned.iter())
            .filter_map(|step| match step {
                Planned::Unbind { path, .. } => {
                    let read = read.bindings.get(path).cloned().flatten()?;
                    Some((key_name(root, path).to_string(), read.binding))
                }
                _ => None,
            })
            .collect();
        let options = CreateMode::Persistent.with_acls(crate::zk::acls());
        let writes = branch.iter().any(|step| !matches!(step, Step::Get { .. }));
        let record = match self.key {
            Some(keyed) if writes => {
                let answer = answer_of(branch, &read.reads, failed_compare);
                Some(keyed.record(client, &answer).await?)
            }
            // A branch that only reads stores nothing; but an earlier attempt of this request
            // that wrote (its reply lost) has a record, read after the keys were: that is the
            // answer.
            Some(keyed) => match keyed.recorded::<Answered>(client).await? {
                Some(replay) => return Ok(Some(self.replay(replay))),
                None => None,
            },
            None => None,
        };
        let mut multi = Multi::new(client);
        if let Some(record) = &record {
            // First: a retry whose first attempt applied is refused here, before any pin.
            record.add_to(&mut multi, Planned::Key)?;
        }
        self.guards.add_to(&mut multi, Planned::Holds)?;
        for (index, standing) in self.held {
            standing.pin(&mut multi, Planned::Held { index: *index })?;
        }
        let guards = guard_leases(&mut multi, &made)?;
        for planned in planned {
            add(&mut multi, planned, &options, (root, &made))?;
        }
        charge(&mut multi, branch, &self.payer, client, &read.charges).await?;
        add_writers(&mut multi, branch, read, (root, self.guards))?;
        let committed = multi.commit().await;
        settle_guards(client, guards, &committed).await?;
        let failed = match committed {
            Ok(done) => {
                if let Some(keyed) = self.key.filter(|_| record.is_some()) {
                    keyed.committed(client, &done, &Planned::Key);
                }
                adopt_bindings(&made, &self.bound);
                for (name, binding) in &unbound {
                    crate::recipes::kv::settled(self.bound.keys, name, binding).await;
                }
                return Ok(Some(self.answer(read, failed_compare, &done).await?));
            }
            Err(failed) => failed,
        };
        self.after_refused(read, branch, failed).await
    }

    /// The outcome an earlier attempt recorded: this call's own if one of its commits lost its
    /// reply, else a client's earlier request's (`repeated`).
    fn replay(&self, replay: crate::recipes::idempotency::Replay<Answered>) -> Outcome {
        Outcome {
            repeated: !self.lost_here,
            ..replayed(replay)
        }
    }

    /// The outcome of the branch committed as `done`.
    async fn answer(
        &self,
        read: &Read,
        failed_compare: Option<usize>,
        done: &Done<Planned>,
    ) -> Result<Outcome, TxnError> {
        let branch = self.txn.branch(failed_compare);
        // Servers may leave a created node's stat out of a multi-op's reply: read those.
        let unstated: Vec<String> = (branch.iter())
            .filter(|step| matches!(step, Step::Put { .. }) && put_stat(done, step.path()).is_none())
            .map(|step| step.path().to_string())
            .collect();
        let stats = crate::zk::stat_each(self.session.client(), &unstated).await?;
        let fresh = unstated
            .into_iter()
            .zip(stats)
            .filter_map(|(path, stat)| Some((path, stat?)));
        Ok(Outcome {
            failed_compare,
            results: results(branch, &read.reads, done, &fresh.collect()),
            repeated: false,
        })
    }

    /// After the commit of `branch`, as read, `failed`: the outcome (a key that says it applied
    /// before), `None` to go again, or why it applies nothing.
    async fn after_refused(
        &mut self,
        read: &Read,
        branch: &[Step],
        failed: Failed<Planned>,
    ) -> Result<Option<Outcome>, TxnError> {
        let client = self.session.client();
        match failed {
            // The key is there: this transaction applied before (its reply lost), or another
            // used the key.
            Failed::Refused {
                tag: Planned::Key,
                error: ZkError::NodeExists,
            } => {
                let recorded = match self.key {
                    Some(keyed) => keyed.recorded::<Answered>(client).await?,
                    None => None,
                };
                // None: forgotten meanwhile; again, as a new transaction.
                Ok(recorded.map(|replay| self.replay(replay)))
            }
            // The principal's directories are missing: made, then again.
            Failed::Refused {
                tag: Planned::Key,
                error: ZkError::NoNode,
            } => {
                if let Some(keyed) = self.key {
                    keyed.repair(client).await?;
                }
                Ok(None)
            }
            // Applied or not: with a key, the next attempt tells.
            failed if failed.is_loss() && self.key.is_some() => {
                self.lost_here = true;
                Ok(None)
            }
            // An absent key's parent is missing (or went): find the missing ones, then again.
            Failed::Refused {
                tag: Planned::PinnedAbsent { .. } | Planned::Parent { .. } | Planned::Create { .. },
                error: ZkError::NoNode,
            } => {
                let absent = self
                    .keys
                    .iter()
                    .filter(|path| matches!(read.reads.get(*path), Some(None)));
                for path in absent {
                    let missing = crate::recipes::kv::missing_parents(client, path).await?;
                    self.missing.insert(path.clone(), missing);
                }
                Ok(None)
            }
            Failed::Refused {
                tag: Planned::Delete { path, .. },
                error: ZkError::NotEmpty,
            } => Err(TxnError::NotEmpty(path)),
            Failed::Refused {
                tag: Planned::Holds, ..
            } => Err(TxnError::ZooKeeper(Failure::Unguarded)),
            Failed::Refused {
                tag: Planned::Held { .. },
                ..
            } => Err(TxnError::HeldChanged),
            // A writer record went meanwhile, or their directory is missing: again.
            Failed::Refused {
                tag: Planned::Writer,
                error: ZkError::NoNode,
            } => {
                writer::ensure_dir(client, self.bound.keys.root()).await?;
                Ok(None)
            }
            // A lease's guard (said by [settle_guards]), a key or a binding changed since it
            // was read (its pin, or a write on its version, refused): again.
            Failed::Refused {
                tag: Planned::Guard { .. },
                ..
            }
            | Failed::Refused {
                error: ZkError::BadVersion | ZkError::NodeExists | ZkError::NoNode,
                ..
            } => Ok(None),
            Failed::Refused {
                error: ZkError::QuotaExceeded,
                ..
            } => {
                let bytes = branch.iter().map(Step::bytes).sum();
                Err(TxnError::Quota(self.payer.exceeded(self.session, bytes).await))
            }
            failed if failed.is_loss() => Err(TxnError::OutcomeUnknown),
            failed => Err(TxnError::ZooKeeper(failed.into())),
        }
    }
}

/// Adds to `multi` what a branch does to its keys' writer records ([writer]): a guarded put
/// writes the key's, naming the `guards`; a delete of a key deletes its record if it has one.
fn add_writers(
    multi: &mut Multi<'_, Planned>,
    branch: &[Step],
    read: &Read,
    (root, guards): (&str, &Guards),
) -> Result<(), ZkError> {
    let by = guards.guarded_by();
    for step in branch {
        let (path, exists) = (step.path(), read.recorded.contains(step.path()));
        let record = writer::record_path(root, path);
        match step {
            Step::Put { .. } if !by.is_empty() => writer::add_written(multi, Planned::Writer, &record, &by, exists)?,
            Step::Delete { .. } if exists && matches!(read.reads.get(path), Some(Some(_))) => {
                multi.delete(Planned::Writer, &record, None)?
            }
            Step::Put { .. } | Step::Delete { .. } | Step::Get { .. } => {}
        }
    }
    Ok(())
}

/// The guards of the leases `made` binds keys to, one a lease, added to `multi`.
fn guard_leases(
    multi: &mut Multi<'_, Planned>,
    made: &HashMap<String, NewBinding>,
) -> Result<Vec<(String, Arc<Lease>, Guard)>, ZkError> {
    let mut guards: Vec<(String, Arc<Lease>, Guard)> = Vec::new();
    for new in made.values() {
        let id = &new.lease.id;
        if !guards.iter().any(|(guarded, _, _)| guarded == id) {
            let guard = new.lease.guard(multi, Planned::Guard { lease: id.clone() })?;
            guards.push((id.clone(), new.lease.clone(), guard));
        }
    }
    Ok(guards)
}

/// Tells each lease whose guard was in the multi-op how it went (`committed`): a guard refused
/// because a visited lease changed keeper is fine (again); one whose lease ended ends the
/// transaction.
async fn settle_guards(
    client: &zookeeper_client::Client,
    guards: Vec<(String, Arc<Lease>, Guard)>,
    committed: &Result<Done<Planned>, Failed<Planned>>,
) -> Result<(), TxnError> {
    let refused = match committed {
        Err(Failed::Refused {
            tag: Planned::Guard { lease },
            error,
        }) => Some((lease.clone(), error.clone())),
        _ => None,
    };
    for (id, lease, guard) in guards {
        let error = refused.as_ref().filter(|(refused, _)| *refused == id);
        match lease.guarded(guard, error.map(|(_, error)| error.clone())) {
            Ok(_) => {}
            // A visitor guards with the version it read: the lease may only have changed
            // keeper since.
            Err(GuardError::LeaseMoved) if lease.is_visiting() && lease.refresh(client).await? => {}
            Err(GuardError::LeaseMoved) => return Err(TxnError::LeaseEnded(id)),
            Err(GuardError::ZooKeeper(err)) => return Err(err.into()),
        }
    }
    Ok(())
}

/// The bindings of the `written` keys, as they are now: each owner record (one multi-read),
/// and for a bound key whether its lease's holding record is there.
async fn read_bindings(
    client: &zookeeper_client::Client,
    written: &[String],
    root: &str,
) -> Result<HashMap<String, Option<ReadBinding>>, ZkError> {
    let owners: Vec<String> = written.iter().map(|path| owner_record_path(root, path)).collect();
    let found = crate::zk::get_each_of_size(client, &owners, OWNER_RECORD_BYTES).await?;
    let parsed: Vec<Option<(Binding, i32)>> = (found.into_iter())
        .map(|found| found.and_then(|(data, stat)| Some((serde_json::from_slice(&data).ok()?, stat.version))))
        .collect();
    // Whether each bound key's holding record is there: one multi-read for them all.
    let records: Vec<String> = (written.iter().zip(&parsed))
        .filter_map(|(path, parsed)| Some(parsed.as_ref()?.0.holding_record(root, key_name(root, path))))
        .collect();
    let mut there = crate::zk::stat_each(client, &records).await?.into_iter().zip(records);
    let mut bindings = HashMap::new();
    for (path, parsed) in written.iter().cloned().zip(parsed) {
        let read = parsed.map(|(binding, version)| {
            let record = there.next().and_then(|(stat, record)| stat.map(|_| record));
            ReadBinding {
                binding,
                version,
                record,
            }
        });
        bindings.insert(path, read);
    }
    Ok(bindings)
}

/// The keys a branch of `txn` writes, each once.
fn written_keys(txn: &Txn) -> Vec<String> {
    let mut seen = HashSet::new();
    (txn.then.iter().chain(&txn.otherwise))
        .filter(|step| step.writes() && seen.insert(step.path()))
        .map(|step| step.path().to_string())
        .collect()
}

/// The keys whose writer record a branch of `txn` may change, each once: those it deletes
/// (the record goes with the key), and with `guards` those it puts (the record names them).
fn recorded_keys(txn: &Txn, guards: &Guards) -> Vec<String> {
    let mut seen = HashSet::new();
    (txn.then.iter().chain(&txn.otherwise))
        .filter(|step| match step {
            Step::Delete { .. } => true,
            Step::Put { .. } => !guards.is_empty(),
            Step::Get { .. } => false,
        })
        .filter(|step| seen.insert(step.path()))
        .map(|step| step.path().to_string())
        .collect()
}

/// The most an owner record's data takes (a lease id, a principal, a handle).
const OWNER_RECORD_BYTES: usize = 1024;

/// The key name (`a/b`) of the kv znode at `path`.
pub fn key_name<'p>(root: &str, path: &'p str) -> &'p str {
    let base = Kind::Kv.base(root);
    path.strip_prefix(base.as_str())
        .and_then(|rest| rest.strip_prefix('/'))
        .unwrap_or(path)
}

/// The bindings `planned` makes, by key path: a new handle for each, its records' content.
fn new_bindings(planned: &[Planned], bound: &Bindings<'_>) -> Result<HashMap<String, NewBinding>, TxnError> {
    let root = bound.keys.root();
    let mut made = HashMap::new();
    for step in planned {
        let Planned::Bind { path, lease } = step else {
            continue;
        };
        let lease = bound
            .leases
            .get(lease)
            .ok_or_else(|| TxnError::LeaseEnded(lease.clone()))?
            .clone();
        let name = key_name(root, path).to_string();
        let handle = crate::ids::owned_id(&lease.here);
        let record_name = record::record_name(Kind::Kv, &name, Some(&handle));
        let holding = bound::holding_record(&lease, (&name, &handle), path);
        let owner = Binding::of(&lease, &handle);
        let new = NewBinding {
            owner: serde_json::to_vec(&owner).unwrap_or_default(),
            holding: holding.to_bytes(),
            lease,
            name,
            handle,
            record_name,
        };
        made.insert(path.clone(), new);
    }
    Ok(made)
}

/// Takes up on this instance the bindings a committed branch made (their tasks find them
/// through their owner records and hold until their lease ends).
fn adopt_bindings(made: &HashMap<String, NewBinding>, bound: &Bindings<'_>) {
    for (path, new) in made {
        let taken = bound.keys.adopt_binding(
            &new.lease,
            bound.quotas,
            (&new.name, &new.handle),
            &new.record_name,
            &bound::shape(path),
        );
        if taken.is_err() {
            // Its lease ended meanwhile: its end (or the reaper's) finds the holding record.
            tracing::debug!(key = %new.name, lease = %new.lease.id, "a transaction's binding was not adopted");
        }
    }
}

/// Adds to `multi` what moves each put key's charges to `payer` and refunds each deleted key's
/// (conditional on the versions read: a write racing on the key fails the multi-op, and the
/// transaction goes again). The charges of every key are read at once, and the quota checked
/// once for all the branch's bytes.
async fn charge(
    multi: &mut Multi<'_, Planned>,
    branch: &[Step],
    payer: &Payer<'_>,
    client: &zookeeper_client::Client,
    existing: &HashMap<String, Vec<(usage::Charge, i32)>>,
) -> Result<(), TxnError> {
    let written: Vec<&Step> = branch.iter().filter(|step| step.writes()).collect();
    let ids: Vec<String> = written.iter().map(|step| usage::path_id("kv", step.path())).collect();
    let Some(first) = ids.first() else {
        return Ok(());
    };
    let bytes = written.iter().map(|step| step.bytes()).sum();
    let mine = payer
        .quotas
        .charge_as(client, payer.principal, bytes, first.clone())
        .await?;
    for (step, id) in written.into_iter().zip(ids) {
        let charges = existing.get(&id).map_or(&[][..], Vec::as_slice);
        let tag = Planned::Charge {
            path: step.path().to_string(),
        };
        match step {
            Step::Put { data, .. } => {
                let mine = usage::Charge { id, ..mine.clone() };
                payer.quotas.add_recharge(multi, tag, &mine, data.len(), charges)?;
            }
            Step::Delete { .. } | Step::Get { .. } => payer.quotas.add_refunds(multi, tag, charges)?,
        }
    }
    Ok(())
}

/// Adds `planned` to `multi`, tagged with itself (`root` and `made`: the bindings it makes).
fn add(
    multi: &mut Multi<'_, Planned>,
    planned: Planned,
    options: &zookeeper_client::CreateOptions<'_>,
    (root, made): (&str, &HashMap<String, NewBinding>),
) -> Result<(), ZkError> {
    match &planned {
        // Added by [Guards::add_to] and [Standing::pin], never planned.
        Planned::Holds | Planned::Held { .. } | Planned::Writer => Ok(()),
        Planned::Unbound { path } => {
            let owner = owner_record_path(root, path);
            multi.create(planned.clone(), &owner, &[], options)?;
            multi.delete(planned.clone(), &owner, None)
        }
        Planned::BoundTo { path, version } => multi.check(planned.clone(), &owner_record_path(root, path), *version),
        Planned::Bind { path, .. } => {
            let Some(new) = made.get(path) else {
                return Ok(());
            };
            multi.create(planned.clone(), &owner_record_path(root, path), &new.owner, options)?;
            let record = new.lease.record_path(&new.record_name);
            multi.create(planned.clone(), &record, &new.holding, options)
        }
        Planned::Unbind { path, version, record } => {
            multi.delete(planned.clone(), &owner_record_path(root, path), Some(*version))?;
            match record {
                Some(record) => multi.delete(planned.clone(), record, None),
                None => Ok(()),
            }
        }
        Planned::Guard { .. } | Planned::Key => Ok(()),
        Planned::Pinned { path, version } => multi.check(planned.clone(), path, *version),
        Planned::PinnedAbsent { path, parents } => {
            for made in parents.iter().chain([path]) {
                multi.create(planned.clone(), made, &[], options)?;
            }
            for made in [path].into_iter().chain(parents.iter().rev()) {
                multi.delete(planned.clone(), made, None)?;
            }
            Ok(())
        }
        Planned::Parent { path } => multi.create(planned.clone(), path, &[], options),
        Planned::Create { path, data } => multi.create(planned.clone(), path, data, options),
        Planned::Set { path, data, version } => multi.set(planned.clone(), path, data, Some(*version)),
        Planned::Delete { path, version } => multi.delete(planned.clone(), path, Some(*version)),
        Planned::Charge { .. } => Ok(()),
    }
}
