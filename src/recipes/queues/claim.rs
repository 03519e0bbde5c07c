//! A claim: the persistent `claims/<item>` record that any instance reads, acknowledges,
//! extends or gives back, and that outlives the instance that made it.
//!
//! Its deadline is the record's: an extension rewrites it through whichever instance it comes
//! to, and the instance that times the claim reads it again when its own timer fires
//! ([expire_claim]), so that no message between instances is needed for a later deadline.

use crate::zk::{Failed, Multi};
use serde::{Deserialize, Serialize};
use zookeeper_client::{Client, Error as ZkError, Stat};

use super::*;
use crate::recipes::usage::{Charge, Quotas};
use crate::zk::retry_on_loss;

/// What a claim node holds: enough for any instance to acknowledge the claim, to give it
/// back, or to time it once the instance that made it is gone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRecord {
    /// The claim's id, as the consumer got it (see [crate::ids::claim_id]).
    pub claim: String,
    /// When the item is given back unless acknowledged (ms since the epoch, the instances'
    /// clocks).
    pub deadline_ms: i64,
    /// The principal that took it, who alone (or an admin) acknowledges it; `None` with
    /// authentication off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    /// The instance that times the deadline (made the claim).
    #[serde(default)]
    pub instance: String,
}

impl ClaimRecord {
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The record in a claim node's data (`None` if it holds something else).
    pub fn parse(data: &[u8]) -> Option<ClaimRecord> {
        serde_json::from_slice(data).ok()
    }
}

/// The claim on `item`, as recorded, and its node's version (`None` if the item is not claimed
/// or its claim node holds something else).
pub async fn read_claim(
    client: &Client,
    paths: &QueuePaths,
    item: &str,
) -> Result<Option<(ClaimRecord, Stat)>, ZkError> {
    let path = format!("{}/{item}", paths.claims);
    Ok(crate::zk::data(client, &path)
        .await?
        .and_then(|(data, stat)| ClaimRecord::parse(&data).map(|record| (record, stat))))
}

/// A claim as [all_claims] finds it.
pub struct StandingClaim {
    pub queue: String,
    pub item: String,
    pub record: ClaimRecord,
}

/// Every claim of every queue under `base`, for the reaper: one listing of the queues, one of
/// each queue's claims, one read of each claim (pipelined, 32 at a time).
pub async fn all_claims(client: &Client, base: &str) -> Result<Vec<StandingClaim>, ZkError> {
    use futures::StreamExt;
    let queues = crate::zk::children(client, base).await?;
    let listed: Vec<Result<(String, Vec<String>), ZkError>> = futures::stream::iter(queues)
        .map(|queue| async move {
            let dir = format!("{base}/{queue}/claims");
            Ok((queue, crate::zk::children(client, &dir).await?))
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let mut claimed = Vec::new();
    for listed in listed {
        let (queue, items) = listed?;
        claimed.extend(items.into_iter().map(|item| (queue.clone(), item)));
    }
    let read: Vec<Result<Option<StandingClaim>, ZkError>> = futures::stream::iter(claimed)
        .map(|(queue, item)| async move {
            let paths = QueuePaths::new(format!("{base}/{queue}"));
            let found = read_claim(client, &paths, &item).await?;
            Ok(found.map(|(record, _)| StandingClaim { queue, item, record }))
        })
        .buffer_unordered(32)
        .collect()
        .await;
    read.into_iter().filter_map(Result::transpose).collect()
}

/// Acknowledges the claim `claim` on `item`: deletes the claim (if it is still that claim) and
/// the item together, refunding the item's charge. `false` if the claim is no longer held
/// (given back, and maybe taken by another).
pub async fn ack(
    client: &Client,
    quotas: &Quotas,
    paths: &QueuePaths,
    (item, claim): (&str, &str),
    guards: &Checked,
) -> Result<bool, Failure> {
    let claim_path = format!("{}/{item}", paths.claims);
    let item_path = format!("{}/{item}", paths.items);
    let stat = match read_claim(client, paths, item).await? {
        Some((record, stat)) if record.claim == claim => stat,
        _ => return Ok(false),
    };
    // Nobody changes the item while the claim stands: its charge is the one read here.
    let Some((data, _)) = crate::zk::data(client, &item_path).await? else {
        return Ok(false);
    };
    let charge = Envelope::parse(&data).charge;
    match delete_item(
        client,
        quotas,
        &item_path,
        None,
        charge.as_ref(),
        (Some((&claim_path, stat.version)), guards),
    )
    .await
    {
        Ok(()) => Ok(true),
        Err(Failed::Refused { tag: Part::Guard, .. }) => Err(Failure::Unguarded),
        Err(Failed::Refused { .. }) => Ok(false),
        // A lost reply: done if the item is gone (nobody else could delete it while the claim
        // stood), otherwise not.
        Err(failed) if failed.is_loss() => Ok(retry_on_loss(|| client.check_stat(&item_path)).await?.is_none()),
        Err(failed) => Err(failed.error().into()),
    }
}

/// A claim this instance made, as its acknowledgement needs it.
pub struct HeldClaim<'a> {
    pub item: &'a str,
    /// The item's version when claimed ([Taken::version]).
    pub version: i32,
    pub charge: Option<&'a Charge>,
}

/// Acknowledges claims this instance made, all in one multi-op: each item deleted if it still
/// has the version its claim gave it, its claim deleted, its charge refunded. No read first:
/// an item claimed by anyone since has another version (a claim always raises it), so a claim
/// node there is still ours, and one given back meanwhile is missing (the delete fails).
/// `false` (nothing done) if any of them is no longer as claimed; the caller then settles each
/// on its own ([ack]).
pub async fn ack_held(
    client: &Client,
    quotas: &Quotas,
    paths: &QueuePaths,
    claims: &[HeldClaim<'_>],
    guards: &Checked,
) -> Result<bool, Failure> {
    let Some(first) = claims.first() else {
        return Ok(true);
    };
    let mut multi = Multi::new(client);
    guards.add_to(&mut multi, Part::Guard)?;
    for claim in claims {
        // The item first: its deletion event reaches the queue's mirrors before the claim's,
        // so that no taker is woken for an item that is going.
        multi.delete(
            Part::Item,
            &format!("{}/{}", paths.items, claim.item),
            Some(claim.version),
        )?;
        multi.delete(Part::Claim, &format!("{}/{}", paths.claims, claim.item), None)?;
        if let Some(charge) = claim.charge {
            quotas.add_refund(&mut multi, Part::Charge, charge)?;
        }
    }
    match multi.commit().await {
        Ok(_) => Ok(true),
        Err(Failed::Refused { tag: Part::Guard, .. }) => Err(Failure::Unguarded),
        Err(Failed::Refused { .. }) => Ok(false),
        // A lost reply: done if the first item is gone (nobody else deletes an item while a
        // claim on it stands); if not, nothing happened.
        Err(failed) if failed.is_loss() => {
            let path = format!("{}/{}", paths.items, first.item);
            Ok(retry_on_loss(|| client.check_stat(&path)).await?.is_none())
        }
        Err(failed) => Err(failed.error().into()),
    }
}

/// Gives the claim `claim` on `item` back (nack, or a missed deadline): the item is taken
/// again later. `false` if it is no longer held.
pub async fn release_claim(client: &Client, paths: &QueuePaths, item: &str, claim: &str) -> Result<bool, ZkError> {
    match release_claim_guarded(client, paths, (item, claim), &Checked::default()).await {
        Ok(released) => Ok(released),
        Err(Failure::Unguarded) => Err(ZkError::UnexpectedError(
            "a guard refused a give-back that carried none".into(),
        )),
        Err(Failure::Unanswered(err) | Failure::Unexpected(err)) => Err(err),
        Err(err) => Err(ZkError::UnexpectedError(err.to_string())),
    }
}

/// [release_claim], if the writer's `guards` hold when ZooKeeper applies it
/// ([Failure::Unguarded] otherwise).
pub async fn release_claim_guarded(
    client: &Client,
    paths: &QueuePaths,
    (item, claim): (&str, &str),
    guards: &Checked,
) -> Result<bool, Failure> {
    let claim_path = format!("{}/{item}", paths.claims);
    match read_claim(client, paths, item).await? {
        Some((record, stat)) if record.claim == claim => loop {
            let mut multi = Multi::new(client);
            guards.add_to(&mut multi, Part::Guard)?;
            multi.delete(Part::Claim, &claim_path, Some(stat.version))?;
            match multi.commit().await {
                Ok(_) => return Ok(true),
                Err(Failed::Refused { tag: Part::Guard, .. }) => return Err(Failure::Unguarded),
                Err(Failed::Refused {
                    error: ZkError::NoNode, ..
                }) => return Ok(true),
                Err(Failed::Refused {
                    error: ZkError::BadVersion,
                    ..
                }) => return Ok(false),
                // Sent again: a delete at the version read applies once.
                Err(failed) if failed.is_loss() => continue,
                Err(failed) => return Err(failed.into()),
            }
        },
        _ => Ok(false),
    }
}

/// Moves the deadline of the claim `claim` on `item` to `deadline_ms`, if the writer's
/// `guards` hold: its record rewritten at the version read, so that an ack or a give-back
/// meanwhile wins. `false` if it is no longer held.
pub async fn extend_claim(
    client: &Client,
    paths: &QueuePaths,
    (item, claim): (&str, &str),
    deadline_ms: i64,
    guards: &Checked,
) -> Result<bool, Failure> {
    let claim_path = format!("{}/{item}", paths.claims);
    loop {
        let Some((mut record, stat)) = read_claim(client, paths, item).await?.filter(|(r, _)| r.claim == claim) else {
            return Ok(false);
        };
        record.deadline_ms = deadline_ms;
        let mut multi = Multi::new(client);
        guards.add_to(&mut multi, Part::Guard)?;
        multi.set(Part::Claim, &claim_path, &record.to_bytes(), Some(stat.version))?;
        match multi.commit().await {
            Ok(_) => return Ok(true),
            Err(Failed::Refused { tag: Part::Guard, .. }) => return Err(Failure::Unguarded),
            // Changed meanwhile (extended again, or settled), or a lost reply: read again; the
            // record says whether it is still this claim (a write of the same deadline twice
            // is harmless).
            Err(Failed::Refused {
                error: ZkError::BadVersion | ZkError::NoNode,
                ..
            }) => continue,
            Err(failed) if failed.is_loss() => continue,
            Err(failed) => return Err(failed.into()),
        }
    }
}

/// What became of a claim whose deadline, as its timer knew it, passed.
#[derive(Debug, PartialEq, Eq)]
pub enum Expiry {
    /// Given back: its item is delivered again.
    GivenBack,
    /// Not held any more (acknowledged or given back meanwhile).
    NotHeld,
    /// Extended (through any instance): its deadline is now this.
    Extended(i64),
}

/// Gives the claim `claim` on `item` back if its deadline, as recorded, has passed: the timer of
/// the instance that times it calls this, and an extension made through another instance is
/// found here, in the record, instead of being given back.
pub async fn expire_claim(client: &Client, paths: &QueuePaths, item: &str, claim: &str) -> Result<Expiry, ZkError> {
    let claim_path = format!("{}/{item}", paths.claims);
    loop {
        let Some((record, stat)) = read_claim(client, paths, item).await?.filter(|(r, _)| r.claim == claim) else {
            return Ok(Expiry::NotHeld);
        };
        if record.deadline_ms > crate::time::now_ms() {
            return Ok(Expiry::Extended(record.deadline_ms));
        }
        // At the version read: an extension that lands meanwhile makes this fail, and the
        // record is read again.
        match retry_on_loss(|| client.delete(&claim_path, Some(stat.version))).await {
            Ok(()) | Err(ZkError::NoNode) => return Ok(Expiry::GivenBack),
            Err(ZkError::BadVersion) => continue,
            Err(err) => return Err(err),
        }
    }
}
