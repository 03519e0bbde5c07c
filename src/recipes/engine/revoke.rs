//! Taking a lock back: finds the holders of a lock (or the one contender asked for) in its
//! queue, checks the caller may take each back, and signals each ([super::revocation]): the
//! guide's revocable locks, for exclusive and read/write locks alike.

use crate::zk::{Failure, Session};
use std::time::Duration;

use zookeeper_client::Error as ZkError;

use super::contender::{Next, Role};
use super::revocation::{Revocation, audit, force_after, signal};
use super::view::{principal_of, read_queue};
use crate::auth::{Caller, Forbidden};
use crate::kind::Kind;

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
