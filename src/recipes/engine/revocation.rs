//! Revocation: asking a lock holder to give the lock up, the guide's "revocable shared locks".
//!
//! The revoker writes a signal into the holder's contender znode; the holder watches its own
//! node's data, learns of the request and releases when it is ready (it consents). For a
//! holder that zkgate drives, the signal is the node's JSON with a `revocation` record added
//! (who asked, why, when, and the grace); for any other node (a Curator holder), it is
//! Curator's own signal, the bytes `__REVOKE__`, which `InterProcessMutex.makeRevocable`
//! listens for. With a grace period the revoker's instance deletes the node itself when the
//! grace runs out (the guide's forced variant); its holder then learns it lost the lock.
//!
//! Every revocation is also appended to an audit log, `<root>/revocations/r-<seq>`
//! (persistent, the oldest trimmed beyond [AUDIT_KEPT]).

use crate::zk::{Failure, Session};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use zookeeper_client::{Client, CreateMode, Error as ZkError};

use crate::zk::retry_on_loss;

/// Curator's revocation signal.
pub const CURATOR_REVOKE: &[u8] = b"__REVOKE__";

/// How many audit records are kept.
pub const AUDIT_KEPT: usize = 1000;

/// `<root>/revocations`: the audit log's directory.
pub fn audit_dir(root: &str) -> String {
    format!("{root}/revocations")
}

/// Who asked for a lock back, why, when, and how long the holder has.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct Revocation {
    /// The kind of lock: `lock` or `rwlock`.
    #[schema(example = "lock")]
    pub kind: String,
    #[schema(example = "orders")]
    pub lock: String,
    /// The holder's znode.
    pub node: String,
    /// Who asked (as they said).
    #[schema(example = "ops@example.com")]
    pub by: String,
    /// Why.
    #[schema(example = "deploy in progress")]
    pub reason: String,
    /// When it was asked, ms since the epoch.
    pub at_ms: i64,
    /// After this many ms zkgate deletes the holder's node itself; `null`: the holder decides.
    pub grace_ms: Option<u64>,
}

/// The revocation record in a zkgate contender node's data, if any.
pub fn record_in(data: &[u8]) -> Option<Revocation> {
    let value: serde_json::Value = serde_json::from_slice(data).ok()?;
    serde_json::from_value(value.get("revocation")?.clone()).ok()
}

/// Writes the revocation signal into `path`, the holder's node: the record added to a zkgate
/// node's JSON, or Curator's signal into any other node. Returns whether the holder is a
/// zkgate one; `NoNode` if the node is gone.
pub async fn signal(client: &Client, path: &str, record: &Revocation) -> Result<bool, ZkError> {
    loop {
        let (data, stat) = retry_on_loss(|| client.get_data(path)).await?;
        let (ours, bytes) = match serde_json::from_slice::<serde_json::Value>(&data) {
            Ok(mut value) if value.get("lease").is_some() => {
                value["revocation"] = serde_json::to_value(record).unwrap_or_default();
                (true, serde_json::to_vec(&value).unwrap_or_default())
            }
            _ => (false, CURATOR_REVOKE.to_vec()),
        };
        match retry_on_loss(|| client.set_data(path, &bytes, Some(stat.version))).await {
            Ok(_) => return Ok(ours),
            // Changed meanwhile (another revocation): read again and write over it.
            Err(ZkError::BadVersion) => continue,
            Err(err) => return Err(err),
        }
    }
}

/// After `grace`, deletes the node at `path` if it is still the one created at `czxid`: the
/// forced variant. Runs in the background of the revoker's instance.
pub fn force_after(client: Client, path: String, czxid: i64, grace: Duration) {
    tokio::spawn(async move {
        tokio::time::sleep(grace).await;
        match retry_on_loss(|| client.check_stat(&path)).await {
            Ok(Some(stat)) if stat.czxid == czxid => {
                tracing::info!(%path, "revocation grace over: deleting the holder's node");
                match retry_on_loss(|| client.delete(&path, None)).await {
                    Ok(()) | Err(ZkError::NoNode) => {}
                    Err(err) => tracing::warn!(%path, error = %err, "forced revocation failed"),
                }
            }
            Ok(_) => {}
            Err(err) => tracing::warn!(%path, error = %err, "forced revocation could not check the holder"),
        }
    });
}

/// Appends `record` to the audit log under `base` (`<root>/revocations`), trimming it to
/// [AUDIT_KEPT] records.
pub async fn audit(client: &Client, base: &str, record: &Revocation) -> Result<(), ZkError> {
    let data = serde_json::to_vec(record).unwrap_or_default();
    let options = CreateMode::PersistentSequential.with_acls(crate::zk::acls());
    let prefix = format!("{base}/r-");
    // A lost reply may leave a duplicate record: an audit log can bear that; a lost one it
    // could not, so the create is retried.
    loop {
        match client.create(&prefix, &data, &options).await {
            Ok(_) => break,
            Err(ZkError::NoNode) => crate::zk::session::ensure_path(client, base).await?,
            Err(err) if crate::zk::is_loss(&err) => {}
            Err(err) => return Err(err),
        }
    }
    let mut records = retry_on_loss(|| client.list_children(base)).await?;
    if records.len() > AUDIT_KEPT {
        records.sort();
        for old in &records[..records.len() - AUDIT_KEPT] {
            let _ = retry_on_loss(|| client.delete(&format!("{base}/{old}"), None)).await;
        }
    }
    Ok(())
}

/// The audit log, newest first, at most `limit` records.
pub async fn read_audit(session: &Session, base: &str, limit: usize) -> Result<Vec<Revocation>, Failure> {
    let client = session.client();
    let mut names = crate::zk::children(client, base).await?;
    names.sort();
    names.reverse();
    names.truncate(limit);
    // One multi-read for the page (it read them one round trip each: a thousand for a full log).
    let read = crate::zk::read_each(client, base, names).await?;
    Ok(read
        .into_iter()
        .filter_map(|(_, data, _)| serde_json::from_slice(&data).ok())
        .collect())
}
