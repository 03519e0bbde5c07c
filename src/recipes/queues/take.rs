//! A take: pick from the mirror, claim (or delete, at most once) in one multi-op each, and bury
//! an item delivered too often in `dead/`.

use super::mirror::Tried;
use crate::zk::{Failed, Multi};
use zookeeper_client::{Client, CreateMode, Error as ZkError, Stat};

use super::*;
use crate::recipes::usage::Quotas;
use crate::zk::retry_on_loss;

/// A claimed (or taken) item.
#[derive(Clone, Debug)]
pub struct Taken {
    pub item: String,
    pub envelope: Envelope,
    /// The item's version once claimed (its delivery count raised): while the item has it,
    /// nobody has claimed the item since.
    pub version: i32,
}

/// Most bytes of item data one multi-op of claims carries (a claim rewrites its item's data
/// with the delivery count raised), well within ZooKeeper's 1 MiB packet limit.
const CLAIMS_BYTES: usize = 512 * 1024;

/// An item a taker picked to take, and the claim data its claim will hold.
pub struct Pick {
    pub item: String,
    pub claim_data: Vec<u8>,
}

/// One picked item on its way to being taken.
struct Candidate {
    /// Its place among the picks.
    index: usize,
    envelope: Envelope,
    data: Vec<u8>,
    version: i32,
    /// Whether its charge is refunded with it (at most once; not if the charge is gone).
    refund: bool,
}

/// What an operation of a take's multi-op is for: which pick (its place among the picks) and
/// which of its nodes.
type Tag = (usize, Part);

/// Takes the items a taker picked from the queue's mirror: claims each (`claim_data`, its
/// [ClaimRecord], in its claim node, its delivery count raised) or, `at_most_once`, deletes it and refunds
/// its charge. The picks are read together and claimed together in one multi-op (several for
/// large items); a pick that fails leaves the others to a multi-op of their own. Items
/// claimed `max_deliveries` times already move to `dead/` on the way. Says for each pick, in
/// order, what came of it. `max_bytes` is the most an item may hold.
pub async fn take_items(
    client: &Client,
    quotas: &Quotas,
    paths: &QueuePaths,
    picks: &[Pick],
    at_most_once: bool,
    (max_deliveries, max_bytes): (u32, usize),
    guards: &Checked,
) -> Result<Vec<(Tried, Option<Taken>)>, Failure> {
    let take = Take {
        client,
        quotas,
        paths,
        picks,
        item_paths: picks.iter().map(|p| format!("{}/{}", paths.items, p.item)).collect(),
        at_most_once,
        guards,
    };
    let mut outcome: Vec<(Tried, Option<Taken>)> = picks.iter().map(|_| (Tried::Again, None)).collect();
    let mut candidates = take.candidates(&mut outcome, max_deliveries, max_bytes).await?;
    while !candidates.is_empty() {
        // As many as stay within one packet, at least one.
        let mut bytes = 0;
        let chunk = candidates
            .iter()
            .take_while(|c| {
                bytes += c.data.len();
                bytes <= CLAIMS_BYTES
            })
            .count()
            .max(1);
        let happened = match take.commit(&candidates[..chunk]).await {
            Ok(()) => true,
            Err(Failed::Refused {
                tag: (_, Part::Guard), ..
            }) => return Err(Failure::Unguarded),
            Err(Failed::Refused {
                tag: (index, part),
                error,
            }) => {
                let Some(at) = candidates.iter().position(|c| c.index == index) else {
                    return Err(error.into());
                };
                outcome[index].0 = match (part, error) {
                    // Its charge is gone (usage removed by hand): deleted alone.
                    (Part::Charge, ZkError::NoNode) => {
                        candidates[at].refund = false;
                        continue;
                    }
                    // Changed since read (claimed and given back meanwhile): try again later.
                    (_, ZkError::BadVersion) => Tried::Again,
                    // Gone, or claimed by another.
                    (_, ZkError::NoNode | ZkError::NodeExists) => Tried::TakenElsewhere,
                    (_, error) => return Err(error.into()),
                };
                candidates.remove(at);
                continue;
            }
            // A lost reply: the multi-op's first effect tells whether all of it happened.
            Err(failed) if failed.is_loss() => take.happened(&candidates[0]).await?,
            Err(failed) => return Err(failed.error().into()),
        };
        for c in candidates.drain(..chunk) {
            outcome[c.index] = if happened {
                let taken = Taken {
                    item: picks[c.index].item.clone(),
                    envelope: c.envelope,
                    // A set-data raises the version by exactly one.
                    version: c.version + i32::from(!at_most_once),
                };
                (Tried::Taken, Some(taken))
            } else {
                (Tried::Again, None)
            };
        }
    }
    Ok(outcome)
}

/// One take of picks from a queue: what its steps share.
struct Take<'a> {
    client: &'a Client,
    quotas: &'a Quotas,
    paths: &'a QueuePaths,
    picks: &'a [Pick],
    item_paths: Vec<String>,
    at_most_once: bool,
    /// What the taker must still hold when its claims are made.
    guards: &'a Checked,
}

impl Take<'_> {
    /// Reads the picks together: those still there become candidates (their delivery count
    /// raised); those gone, or buried for too many deliveries, get their outcome here.
    async fn candidates(
        &self,
        outcome: &mut [(Tried, Option<Taken>)],
        max_deliveries: u32,
        max_bytes: usize,
    ) -> Result<Vec<Candidate>, ZkError> {
        let read = crate::zk::get_each_of_size(self.client, &self.item_paths, max_bytes).await?;
        let mut candidates = Vec::with_capacity(self.picks.len());
        for (index, read) in read.into_iter().enumerate() {
            let Some((data, stat)) = read else {
                outcome[index].0 = Tried::TakenElsewhere;
                continue;
            };
            let mut envelope = Envelope::parse(&data);
            if !self.at_most_once {
                if envelope.deliveries >= max_deliveries {
                    let buried = bury(self.client, self.paths, &self.picks[index].item, &envelope, &stat).await?;
                    outcome[index].0 = if buried { Tried::TakenElsewhere } else { Tried::Again };
                    continue;
                }
                envelope.deliveries += 1;
            }
            candidates.push(Candidate {
                index,
                refund: self.at_most_once && envelope.charge.is_some(),
                data: if self.at_most_once {
                    Vec::new()
                } else {
                    envelope.to_bytes()
                },
                envelope,
                version: stat.version,
            });
        }
        Ok(candidates)
    }

    /// Claims (or, at most once, deletes) `chunk` in one multi-op.
    async fn commit(&self, chunk: &[Candidate]) -> Result<(), Failed<Tag>> {
        // Persistent: a claim outlives the instance (and session) that made it, until
        // acknowledged, given back or past its deadline (see the module's docs).
        let persistent = CreateMode::Persistent.with_acls(crate::zk::acls());
        let mut multi = Multi::new(self.client);
        (self.guards)
            .add_to(&mut multi, (usize::MAX, Part::Guard))
            .map_err(Failed::Request)?;
        for c in chunk {
            let pick = &self.picks[c.index];
            let item_path = &self.item_paths[c.index];
            let added = if self.at_most_once {
                multi
                    .delete((c.index, Part::Item), item_path, Some(c.version))
                    .and_then(|()| match c.envelope.charge.as_ref().filter(|_| c.refund) {
                        Some(charge) => self.quotas.add_refund(&mut multi, (c.index, Part::Charge), charge),
                        None => Ok(()),
                    })
            } else {
                let claim_path = format!("{}/{}", self.paths.claims, pick.item);
                multi
                    .set((c.index, Part::Item), item_path, &c.data, Some(c.version))
                    .and_then(|()| multi.create((c.index, Part::Claim), &claim_path, &pick.claim_data, &persistent))
            };
            added.map_err(Failed::Request)?;
        }
        multi.commit().await.map(|_| ())
    }

    /// Whether a multi-op whose reply was lost, `first` its first candidate, applied (it
    /// applied whole or not at all).
    async fn happened(&self, first: &Candidate) -> Result<bool, ZkError> {
        if self.at_most_once {
            // Gone: ours (taken at most once, a reply lost here loses the item if it was
            // another's, as the mode says).
            let gone = retry_on_loss(|| self.client.check_stat(&self.item_paths[first.index])).await?;
            return Ok(gone.is_none());
        }
        let pick = &self.picks[first.index];
        let claim_path = format!("{}/{}", self.paths.claims, pick.item);
        Ok(crate::zk::data(self.client, &claim_path)
            .await?
            .is_some_and(|(data, _)| data == pick.claim_data))
    }
}

/// Moves an item that has been delivered too often to `dead/`.
async fn bury(
    client: &Client,
    paths: &QueuePaths,
    item: &str,
    envelope: &Envelope,
    stat: &Stat,
) -> Result<bool, ZkError> {
    let mut multi = Multi::new(client);
    multi.delete(Part::Item, &format!("{}/{item}", paths.items), Some(stat.version))?;
    multi.create(
        Part::Item,
        &format!("{}/{item}", paths.dead),
        &envelope.to_bytes(),
        &CreateMode::Persistent.with_acls(crate::zk::acls()),
    )?;
    match multi.commit().await {
        Ok(_) => {
            tracing::info!(queue = %paths.dir, %item, deliveries = envelope.deliveries, "item dead-lettered");
            let queue = paths.dir.rsplit('/').next().unwrap_or_default();
            let m = crate::metrics::get();
            m.queue_dead_lettered.with_label_values(&[m.queue(queue)]).inc();
            Ok(true)
        }
        Err(Failed::Refused { .. }) => Ok(false), // changed meanwhile: someone else decides
        Err(failed) if failed.is_loss() => Ok(false),
        Err(failed) => Err(failed.error()),
    }
}
