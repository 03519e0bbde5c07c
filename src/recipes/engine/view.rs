//! What readers see of a queue of contenders (a lock's, an election's, a semaphore's): the
//! queue read in two round trips, bounded to what a state lists, and each contender's view.
//! Every topic and `GET` of a contended resource reads through here.

use crate::zk::{Failure, Session};
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use serde::Serialize;
use zookeeper_client::{Client, Error as ZkError};

use super::contender::Contender;
use super::handle::Phase;
use super::revocation;
use crate::recipes::in_sequence_order;
use crate::time::{from_millis, timestamp};
use crate::zk::retry_on_loss;

/// One contender as read from ZooKeeper.
#[derive(Clone, Debug)]
pub struct ContenderRecord {
    pub name: String,
    pub sequence: u64,
    pub czxid: i64,
    /// Creation time, ms since the epoch.
    pub ctime: i64,
    /// The znode's data (zkgate writes `{"lease":..,"handle":..}`; Curator its IP address).
    pub data: Vec<u8>,
}

/// Most contenders a state lists in each of its lists (the counts are always complete): a
/// state is sent whole with every event, so it must stay small however long the queue.
pub const LISTED: usize = 50;

/// A queue of contenders as read: the first ones with their data, in queue order, and the
/// names of all of them.
pub struct Queue {
    /// Every contender's node name, lowest sequence first.
    pub names: Vec<String>,
    /// Those picked, read, in queue order.
    pub records: Vec<ContenderRecord>,
}

/// The contenders of the resource at `dir`, in queue order: every name, and the records of
/// those that `wanted(names, index)` picks ([pick]). Empty if the resource does not exist.
pub async fn read_queue(
    client: &Client,
    dir: &str,
    wanted: impl Fn(&[String], usize) -> bool,
) -> Result<Queue, ZkError> {
    let children = crate::zk::children(client, dir).await?;
    let names = in_sequence_order(&children)
        .into_iter()
        .map(|(_, name)| name.to_string())
        .collect();
    pick(names, wanted, |to_read| async move {
        let found = crate::zk::read_each(client, dir, to_read).await?;
        Ok(found
            .into_iter()
            .filter_map(|(name, data, stat)| {
                Some(ContenderRecord {
                    sequence: crate::recipes::sequence_of(&name)?,
                    czxid: stat.czxid,
                    ctime: stat.ctime,
                    data,
                    name,
                })
            })
            .collect())
    })
    .await
}

/// The records of the contenders `wanted` picks among `names` (listed in queue order), read
/// with `read` (which leaves out a contender that is gone).
///
/// A contender can leave between the listing and the read of its data. It is then dropped
/// from the names too, and the pick is made again (the window moves: the writer behind a
/// reader that just left now holds), reading what it newly picks, until every pick was read.
/// So the names and the records always agree; names only shrink, so this ends.
pub async fn pick<F, Fut>(
    mut names: Vec<String>,
    wanted: impl Fn(&[String], usize) -> bool,
    mut read: F,
) -> Result<Queue, ZkError>
where
    F: FnMut(Vec<String>) -> Fut,
    Fut: Future<Output = Result<Vec<ContenderRecord>, ZkError>>,
{
    let mut records: HashMap<String, ContenderRecord> = HashMap::new();
    loop {
        let to_read: Vec<String> = (0..names.len())
            .filter(|&i| wanted(&names, i) && !records.contains_key(&names[i]))
            .map(|i| names[i].clone())
            .collect();
        if to_read.is_empty() {
            break;
        }
        for record in read(to_read.clone()).await? {
            records.insert(record.name.clone(), record);
        }
        names.retain(|name| !to_read.contains(name) || records.contains_key(name));
    }
    let records = (0..names.len())
        .filter(|&i| wanted(&names, i))
        .filter_map(|i| records.remove(&names[i]))
        .collect();
    Ok(Queue { names, records })
}

/// One contender, as ZooKeeper has it and as this instance knows it.
#[derive(Serialize, utoipa::ToSchema, Clone, Debug, PartialEq)]
pub struct ContenderView {
    /// Znode name under the resource.
    #[schema(example = "_c_6c1f1a9e-8d2b-4d43-9b7a-0e1c2d3e4f50-lock-0000000007")]
    pub node: String,
    /// ZooKeeper's sequence number: the queue order.
    pub sequence: u64,
    /// `read` or `write`, for a read/write lock.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, example = "read")]
    pub mode: Option<&'static str>,
    /// The znode's czxid: the fencing token of this contender once it holds (an election's
    /// term).
    #[schema(example = 4294967302_i64)]
    pub fencing_token: i64,
    /// When the contender joined the queue.
    #[schema(example = "2026-11-22T10:00:00.000Z")]
    #[schema(format = DateTime)]
    pub created_at: String,
    /// The zkgate lease of the contender, for zkgate's contenders.
    pub lease: Option<String>,
    /// Who created it: `zkgate`, `curator` or `kazoo` (by node name), or `other`.
    #[schema(value_type = String, example = "zkgate")]
    pub client: &'static str,
    /// For a holder, when it was granted, if this instance knows (its own contenders).
    #[schema(format = DateTime)]
    pub held_since: Option<String>,
    /// Whether someone asked this holder to give the lock up.
    pub revocation_requested: bool,
    /// Who asked, why and when (for zkgate's holders; Curator's signal carries no record).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revocation: Option<revocation::Revocation>,
    /// Its lease expired, and it stays held by it until then (the lease's lock-delay): nobody
    /// else is granted before.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime, example = "2026-11-22T10:00:15.000Z")]
    pub held_by_ended_lease_until: Option<String>,
}

impl ContenderView {
    /// The view of `record`; `local` is this instance's handles at the resource, which know
    /// when theirs were granted.
    pub fn of(record: &ContenderRecord, mode: Option<&'static str>, local: &HashMap<String, Arc<Contender>>) -> Self {
        let held_since = local.get(&record.name).and_then(|c| match c.state().phase {
            Phase::Held { since } => Some(timestamp(since)),
            _ => None,
        });
        let lease = lease_of(&record.data);
        let client = if lease.is_some() {
            "zkgate"
        } else if record.name.starts_with("_c_") {
            "curator"
        } else if record.name.contains("__lock__") || record.name.contains("__rlock__") {
            "kazoo"
        } else {
            "other"
        };
        let revocation = revocation::record_in(&record.data);
        ContenderView {
            held_by_ended_lease_until: delayed_until(&record.data).map(|ms| timestamp(from_millis(ms))),
            revocation_requested: revocation.is_some() || record.data == revocation::CURATOR_REVOKE,
            revocation,
            node: record.name.clone(),
            sequence: record.sequence,
            mode,
            fencing_token: record.czxid,
            created_at: timestamp(from_millis(record.ctime)),
            lease,
            client,
            held_since,
        }
    }
}

#[cfg(test)]
impl ContenderView {
    /// A zkgate contender `node` (its sequence from its name), for tests: token 1, nothing else known.
    pub fn for_node(node: &str) -> ContenderView {
        ContenderView {
            node: node.into(),
            sequence: crate::recipes::sequence_of(node).unwrap_or(0),
            mode: None,
            fencing_token: 1,
            created_at: String::new(),
            lease: None,
            client: "zkgate",
            held_since: None,
            revocation_requested: false,
            revocation: None,
            held_by_ended_lease_until: None,
        }
    }
}

/// Until when a zkgate contender's node says its ended lease holds it (its lock-delay).
pub fn delayed_until(data: &[u8]) -> Option<i64> {
    let value: serde_json::Value = serde_json::from_slice(data).ok()?;
    value.get(super::contender::DELAYED_UNTIL)?.as_i64()
}

/// What happened to the holders of a shared resource (a read/write lock's, a semaphore's)
/// between two reads: `before` and `after` are the holders listed, with their full counts.
/// `granted` if someone new holds; `released` if holders left and nobody new holds (a reader
/// leaving while others still read is a release too); `None` if the holders are the same.
pub fn holders_change<E>(
    (before, before_count): (&[ContenderView], usize),
    (after, after_count): (&[ContenderView], usize),
    granted: E,
    released: E,
) -> Option<E> {
    let same = before.len() == after.len() && before.iter().zip(after).all(|(b, a)| b.node == a.node);
    if same && before_count == after_count {
        return None;
    }
    let nobody_new = after.iter().all(|a| before.iter().any(|b| b.node == a.node)) && after_count <= before_count;
    Some(if nobody_new { released } else { granted })
}

/// The views of `queue`'s records, split into those among its first `holding` names (the
/// holders) and the others (the waiters), each in queue order.
pub fn split_holders(
    queue: &Queue,
    holding: usize,
    mode: impl Fn(&str) -> Option<&'static str>,
    local: &HashMap<String, Arc<Contender>>,
) -> (Vec<ContenderView>, Vec<ContenderView>) {
    let held = |r: &&ContenderRecord| queue.names.iter().take(holding).any(|n| *n == r.name);
    let (holders, waiters): (Vec<_>, Vec<_>) = queue.records.iter().partition(held);
    let view = |r: &ContenderRecord| ContenderView::of(r, mode(&r.name), local);
    let views = |records: Vec<&ContenderRecord>| records.into_iter().map(view).collect();
    (views(holders), views(waiters))
}

/// The lease a zkgate contender names in its node's data (`None` for other clients' nodes).
pub fn lease_of(data: &[u8]) -> Option<String> {
    serde_json::from_slice::<serde_json::Value>(data)
        .ok()?
        .get("lease")?
        .as_str()
        .map(str::to_string)
}

/// The principal a zkgate contender names in its node's data (`None` for others' nodes).
pub fn principal_of(data: &[u8]) -> Option<String> {
    serde_json::from_slice::<serde_json::Value>(data)
        .ok()?
        .get("principal")?
        .as_str()
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(name: &str) -> ContenderRecord {
        ContenderRecord {
            name: name.to_string(),
            sequence: crate::recipes::sequence_of(name).unwrap_or(0),
            czxid: 1,
            ctime: 0,
            data: Vec::new(),
        }
    }

    /// A reader that left between the listing and the read: the writer behind it is the
    /// holder of the read/write lock, and read as such, not counted with a ghost ahead of it.
    #[tokio::test]
    async fn a_contender_gone_before_its_read_leaves_the_names_and_the_window_moves() {
        let names: Vec<String> = [
            "_c_a-__READ__0000000001",
            "_c_b-__WRIT__0000000002",
            "_c_c-__READ__0000000003",
        ]
        .map(str::to_string)
        .to_vec();
        let gone = names[0].clone();
        // The holders (readers ahead of the first writer, or the writer at the head) and one
        // waiter.
        let wanted = |names: &[String], i: usize| {
            let holding = crate::recipes::locks::rwlock::holding(names);
            i <= holding
        };
        let mut reads = Vec::new();
        let queue = pick(names, wanted, |to_read: Vec<String>| {
            reads.push(to_read.clone());
            let gone = gone.clone();
            async move { Ok(to_read.iter().filter(|n| **n != gone).map(|n| record(n)).collect()) }
        })
        .await
        .expect("read");
        assert_eq!(queue.names, ["_c_b-__WRIT__0000000002", "_c_c-__READ__0000000003"]);
        let read: Vec<&str> = queue.records.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(read, queue.names, "every name picked is read");
        assert_eq!(
            crate::recipes::locks::rwlock::holding(&queue.names),
            1,
            "the writer holds"
        );
        assert_eq!(reads.len(), 2, "the second read takes what the moved window picks");
    }
}

/// What a fencing token is worth now: whether the contender created at `token` (its znode's
/// `czxid`, which zkgate gives as the token) holds the resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fencing {
    /// A current holder's token.
    Holds,
    /// Someone else holds: the newest holder's token.
    Superseded { current: i64 },
    /// Nobody holds.
    NotHeld,
}

/// Checks `token` against the holders of the resource at `dir`: the first `holding(names)`
/// contenders in queue order (one for a lock or an election, the readers at the head of a
/// read/write lock).
///
/// One listing, then the holders' `czxid`s: a resource server asks this on every write it
/// guards, so it must stay cheap however many hold. A znode's sequence number and its `czxid`
/// grow together (the leader assigns both, in one order, to the creates in a directory), so
/// the holders' tokens are sorted like their names and a binary search reads about
/// log2(holders) of them. A holder that leaves during the search changes the answer anyway;
/// the check starts again from a new listing (a few times at most).
pub async fn check_fencing(
    session: &Session,
    dir: &str,
    holding: impl Fn(&[String]) -> usize,
    token: i64,
) -> Result<Fencing, Failure> {
    let client = session.client();
    let mut attempts = 0;
    loop {
        attempts += 1;
        let children = crate::zk::children(client, dir).await?;
        let names: Vec<String> = in_sequence_order(&children)
            .into_iter()
            .map(|(_, name)| name.to_string())
            .collect();
        let holders = &names[..holding(&names).min(names.len())];
        if holders.is_empty() {
            return Ok(Fencing::NotHeld);
        }
        match search(client, dir, holders, token).await? {
            Some(found) => return Ok(found),
            None if attempts >= 3 => return Err(ZkError::ConnectionLoss.into()),
            None => continue,
        }
    }
}

/// The binary search of [check_fencing] over `holders`; `None` if one it read was gone.
async fn search(client: &Client, dir: &str, holders: &[String], token: i64) -> Result<Option<Fencing>, ZkError> {
    let czxid = |name: &String| {
        let path = format!("{dir}/{name}");
        async move { Ok::<_, ZkError>(retry_on_loss(|| client.check_stat(&path)).await?.map(|stat| stat.czxid)) }
    };
    let newest = holders.len() - 1;
    // The newest holder's token, once read (the search often reads it; a lock's only holder
    // always is): a 409 names it without asking again.
    let mut current = None;
    let (mut low, mut high) = (0, holders.len());
    while low < high {
        let middle = (low + high) / 2;
        let Some(found) = czxid(&holders[middle]).await? else {
            return Ok(None);
        };
        if middle == newest {
            current = Some(found);
        }
        match found.cmp(&token) {
            std::cmp::Ordering::Equal => return Ok(Some(Fencing::Holds)),
            std::cmp::Ordering::Less => low = middle + 1,
            std::cmp::Ordering::Greater => high = middle,
        }
    }
    let current = match current {
        Some(current) => current,
        None => match czxid(&holders[newest]).await? {
            Some(current) => current,
            None => return Ok(None),
        },
    };
    Ok(Some(Fencing::Superseded { current }))
}
