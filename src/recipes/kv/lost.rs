//! What became of a kv write whose ZooKeeper reply was lost: the one rule for a put, a delete
//! and a bound key's write (docs/ARCHITECTURE.md, "a write whose reply was lost").

use zookeeper_client::Stat;

use crate::zk::{Failure, Session};

/// What became of a write of `data` at `path` whose reply was lost, as the key tells now.
pub(super) enum LostReply {
    /// The key holds `data` at the version the write gave it: it applied.
    Applied(Stat),
    /// The key is as the write found it (the same `mzxid`): it did not apply, and may be
    /// decided again.
    NotApplied,
    /// The key changed since, and not to what the write left (or is gone): the write may have
    /// applied and been overwritten (or deleted) by another, or not have applied at all.
    Unknown,
}

/// Tells what became of a write of `data` at `path` that expected `expected` (`None`: it
/// created the key) and whose reply was lost.
///
/// Only the key can tell, and only while nobody else wrote it: before, a write the key no
/// longer showed was taken as not applied and decided again, so a compare-and-set that had
/// applied, and been overwritten by another client before the check, answered `412` (or an
/// unconditional write applied twice). The linearizability checker found the first across
/// ZooKeeper leader kills (issue 53, docs/RELIABILITY.md). Such a write now answers
/// `503 outcome-unknown`, as a counter's and a transaction's do: the client reads the key
/// before it tries again.
pub(super) async fn after_loss(
    session: &Session,
    path: &str,
    data: &[u8],
    expected: Option<&Stat>,
) -> Result<LostReply, Failure> {
    let version = expected.map_or(0, |stat| stat.version + 1);
    Ok(match crate::zk::data(session.client(), path).await? {
        Some((found, stat)) if found == data && stat.version == version => LostReply::Applied(stat),
        Some((_, stat)) if expected.is_some_and(|before| before.mzxid == stat.mzxid) => LostReply::NotApplied,
        _ => LostReply::Unknown,
    })
}
