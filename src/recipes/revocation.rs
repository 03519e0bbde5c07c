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

use super::contender::{Next, Role};
use super::view::{principal_of, read_queue};
use crate::auth::{Caller, Forbidden};
use crate::kind::Kind;
use crate::zk::retry_on_loss;

/// Curator's revocation signal.
pub const CURATOR_REVOKE: &[u8] = b"__REVOKE__";

/// How many audit records are kept.
pub const AUDIT_KEPT: usize = 1000;

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

/// A request to take a lock back.
pub struct Request<'a> {
    pub kind: Kind,
    /// The lock's name and znode.
    pub name: &'a str,
    pub dir: String,
    /// Who asks and why (recorded).
    pub by: &'a str,
    pub reason: &'a str,
    /// After this long the holder's node is deleted (the forced variant).
    pub grace: Option<Duration>,
    /// Only this contender node (default: every current holder).
    pub node: Option<&'a str>,
    /// Tells a node's role from its name (a reader or a writer), which decides who holds.
    pub role_of: fn(&str) -> Role,
}

/// Why nothing was revoked.
#[derive(Debug)]
pub enum RevokeError {
    /// The node asked for is not a contender of the lock.
    NoSuchNode,
    /// Nobody holds the lock.
    NobodyHolds,
    /// A holder is another principal's (Curator's and kazoo's holders have no principal: only
    /// an admin may take theirs back).
    Forbidden(Forbidden),
    ZooKeeper(Failure),
}

impl From<ZkError> for RevokeError {
    fn from(err: ZkError) -> RevokeError {
        RevokeError::ZooKeeper(err.into())
    }
}

/// Asks the holders of a lock (or the one `node`) to give it up, as `caller`: signals each,
/// forces it after the grace if one is given, and appends each record to the audit log under
/// `audit_base`. Returns the revocations made (a holder that released meanwhile is skipped).
pub async fn revoke(
    session: &Session,
    audit_base: &str,
    request: Request<'_>,
    caller: &Caller,
) -> Result<Vec<Revocation>, RevokeError> {
    let client = session.client();
    let queue = read_queue(client, &request.dir, |names, i| match request.node {
        Some(node) => names[i] == node,
        None => (request.role_of)(&names[i]).next_step(names, &names[i]) == Next::Hold,
    })
    .await?;
    if queue.records.is_empty() {
        return Err(match request.node {
            Some(_) => RevokeError::NoSuchNode,
            None => RevokeError::NobodyHolds,
        });
    }
    for target in &queue.records {
        caller
            .require_owner(
                principal_of(&target.data).as_deref(),
                &format!("the holder `{}`", target.name),
            )
            .map_err(RevokeError::Forbidden)?;
    }
    let at_ms = crate::time::now_ms();
    let mut revocations = Vec::new();
    for target in &queue.records {
        let record = Revocation {
            kind: request.kind.name().to_string(),
            lock: request.name.to_string(),
            node: target.name.clone(),
            by: request.by.to_string(),
            reason: request.reason.to_string(),
            at_ms,
            grace_ms: request.grace.map(|g| g.as_millis() as u64),
        };
        let path = format!("{}/{}", request.dir, target.name);
        match signal(client, &path, &record).await {
            Ok(_) => {}
            Err(ZkError::NoNode) => continue, // released meanwhile
            Err(err) => return Err(err.into()),
        }
        if let Some(grace) = request.grace {
            force_after(client.clone(), path, target.czxid, grace);
        }
        audit(client, audit_base, &record).await?;
        // Who and why are the client's words: logged escaped (`?`), so that a newline in them
        // cannot forge a log line.
        tracing::info!(kind = %request.kind, lock = ?request.name, node = ?record.node, by = ?record.by, reason = ?record.reason, "revocation requested");
        let (m, kind) = (crate::metrics::get(), request.kind.label());
        m.lock_revocations
            .with_label_values(&[kind, m.name(kind, request.name)])
            .inc();
        revocations.push(record);
    }
    Ok(revocations)
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
    let mut names = match retry_on_loss(|| client.list_children(base)).await {
        Ok(names) => names,
        Err(ZkError::NoNode) => return Ok(Vec::new()),
        Err(err) => return Err(err.into()),
    };
    names.sort();
    names.reverse();
    names.truncate(limit);
    let mut records = Vec::with_capacity(names.len());
    for name in names {
        if let Ok((data, _)) = retry_on_loss(|| client.get_data(&format!("{base}/{name}"))).await
            && let Ok(record) = serde_json::from_slice(&data)
        {
            records.push(record);
        }
    }
    Ok(records)
}
