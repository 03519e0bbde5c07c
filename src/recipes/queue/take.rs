//! A take: pick from the mirror, claim (or delete, at most once) in one multi-op each, and bury
//! an item delivered too often in `dead/`.

use super::mirror::Tried;
use zookeeper_client::{Client, CreateMode, Error as ZkError, MultiWriteError, Stat};

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

/// What a multi-op's operation was for.
#[derive(Clone, Copy, PartialEq)]
enum Op {
    Item,
    Claim,
    Refund,
}

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
    max_deliveries: u32,
    max_bytes: usize,
) -> Result<Vec<(Tried, Option<Taken>)>, ZkError> {
    let mut outcome: Vec<(Tried, Option<Taken>)> = picks.iter().map(|_| (Tried::Again, None)).collect();
    let item_paths: Vec<String> = picks.iter().map(|p| format!("{}/{}", paths.items, p.item)).collect();
    let read = crate::zk::get_each_of_size(client, &item_paths, max_bytes).await?;
    let mut candidates = Vec::with_capacity(picks.len());
    for (index, read) in read.into_iter().enumerate() {
        let Some((data, stat)) = read else {
            outcome[index].0 = Tried::TakenElsewhere;
            continue;
        };
        let mut envelope = Envelope::parse(&data);
        if !at_most_once {
            if envelope.deliveries >= max_deliveries {
                let buried = bury(client, paths, &picks[index].item, &envelope, &stat).await?;
                outcome[index].0 = if buried { Tried::TakenElsewhere } else { Tried::Again };
                continue;
            }
            envelope.deliveries += 1;
        }
        candidates.push(Candidate {
            index,
            refund: at_most_once && envelope.charge.is_some(),
            data: if at_most_once { Vec::new() } else { envelope.to_bytes() },
            envelope,
            version: stat.version,
        });
    }
    // Persistent: a claim outlives the instance (and session) that made it, until acknowledged,
    // given back or past its deadline (see the module's docs).
    let persistent = CreateMode::Persistent.with_acls(crate::zk::acls());
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
        let mut writer = client.new_multi_writer();
        let mut ops = Vec::with_capacity(chunk * 2);
        for (at, c) in candidates[..chunk].iter().enumerate() {
            let pick = &picks[c.index];
            let item_path = &item_paths[c.index];
            if at_most_once {
                writer.add_delete(item_path, Some(c.version))?;
                ops.push((at, Op::Item));
                if c.refund
                    && let Some(charge) = &c.envelope.charge
                {
                    quotas.add_refund(&mut writer, charge)?;
                    ops.push((at, Op::Refund));
                }
            } else {
                writer.add_set_data(item_path, &c.data, Some(c.version))?;
                ops.push((at, Op::Item));
                writer.add_create(
                    &format!("{}/{}", paths.claims, pick.item),
                    &pick.claim_data,
                    &persistent,
                )?;
                ops.push((at, Op::Claim));
            }
        }
        let happened = match writer.commit().await {
            Ok(_) => true,
            Err(MultiWriteError::OperationFailed { index, source }) => {
                let Some(&(at, op)) = ops.get(index) else {
                    return Err(source);
                };
                match (op, source) {
                    // Its charge is gone (usage removed by hand): deleted alone.
                    (Op::Refund, ZkError::NoNode) => candidates[at].refund = false,
                    // Changed since read (claimed and given back meanwhile): try again later.
                    (_, ZkError::BadVersion) => outcome[candidates.remove(at).index].0 = Tried::Again,
                    // Gone, or claimed by another.
                    (_, ZkError::NoNode | ZkError::NodeExists) => {
                        outcome[candidates.remove(at).index].0 = Tried::TakenElsewhere;
                    }
                    (_, source) => return Err(source),
                }
                continue;
            }
            // A lost reply: the multi-op's first effect tells whether all of it happened.
            Err(MultiWriteError::RequestFailed { source }) if crate::zk::is_loss(&source) => {
                let first = &candidates[0];
                if at_most_once {
                    // Gone: ours (taken at most once, a reply lost here loses the item if it
                    // was another's, as the mode says).
                    retry_on_loss(|| client.check_stat(&item_paths[first.index]))
                        .await?
                        .is_none()
                } else {
                    let pick = &picks[first.index];
                    let claim_path = format!("{}/{}", paths.claims, pick.item);
                    match retry_on_loss(|| client.get_data(&claim_path)).await {
                        Ok((data, _)) => data == pick.claim_data,
                        Err(ZkError::NoNode) => false,
                        Err(err) => return Err(err),
                    }
                }
            }
            Err(MultiWriteError::RequestFailed { source }) => return Err(source),
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

/// Moves an item that has been delivered too often to `dead/`.
async fn bury(
    client: &Client,
    paths: &QueuePaths,
    item: &str,
    envelope: &Envelope,
    stat: &Stat,
) -> Result<bool, ZkError> {
    let mut writer = client.new_multi_writer();
    writer.add_delete(&format!("{}/{item}", paths.items), Some(stat.version))?;
    writer.add_create(
        &format!("{}/{item}", paths.dead),
        &envelope.to_bytes(),
        &CreateMode::Persistent.with_acls(crate::zk::acls()),
    )?;
    match writer.commit().await {
        Ok(_) => {
            tracing::info!(queue = %paths.dir, %item, deliveries = envelope.deliveries, "item dead-lettered");
            let queue = paths.dir.rsplit('/').next().unwrap_or_default();
            let m = crate::metrics::get();
            m.queue_dead_lettered.with_label_values(&[m.queue(queue)]).inc();
            Ok(true)
        }
        Err(MultiWriteError::OperationFailed { .. }) => Ok(false), // changed meanwhile: someone else decides
        Err(MultiWriteError::RequestFailed { source }) if crate::zk::is_loss(&source) => Ok(false),
        Err(MultiWriteError::RequestFailed { source }) => Err(source),
    }
}
