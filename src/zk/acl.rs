//! The ACL of every znode zkgate creates, chosen once per process.
//!
//! Every create in zkgate (the root, the recipe directories, contenders, queue items, values,
//! ...) takes its ACL from [acls], and nothing else in the crate names an ACL (a test in
//! `tests/it/zookeeper_security.rs` fails if something does), so a new call site cannot forget
//! the setting.
//!
//! How the choice reaches [acls]: it is a process-wide setting. [install] is called by
//! [crate::zk::session::ZkSession::start] with the policy that follows from the session's
//! `--zookeeper-auth` (see [crate::zk::security]), before the session creates anything. One
//! `zkgate serve` process runs one configuration and one session supervisor, so one setting per
//! process is exact there. A process that never starts an authenticated session (the in-process
//! tests, an embedding without `--zookeeper-auth`) keeps the open default, `world:anyone` with
//! every permission, which is what zkgate did before the option existed. The tests of the
//! secured mode therefore run zkgate as a separate process.
//!
//! Why not a value carried by each session: the recipes take a plain `&Client` from
//! zookeeper-client, which has no room for it, and threading an extra argument through every
//! recipe is how one would be forgotten.

use std::sync::OnceLock;

use zookeeper_client::{Acl, Acls, Permission};

/// Who may do what with the znodes zkgate creates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AclPolicy {
    /// `world:anyone` may do everything: zkgate without `--zookeeper-auth`.
    Open,
    /// Only the identities zkgate's session authenticated as (ZooKeeper's `auth` scheme, which
    /// the server turns into `digest:<user>:<hash>`) may do anything.
    Creator,
    /// [AclPolicy::Creator], and `world:anyone` may read (get data, list children, get the
    /// ACL): for dashboards and peers that only watch (`--zookeeper-acl-world-read`).
    CreatorWorldRead,
}

static POLICY: OnceLock<AclPolicy> = OnceLock::new();

static CREATOR_ALL_WORLD_READ: [Acl; 2] = [
    Acl::new_const(Permission::ALL, "auth", ""),
    Acl::new_const(Permission::READ, "world", "anyone"),
];

/// The ACL for a znode zkgate creates now, per the process's [AclPolicy] ([AclPolicy::Open]
/// until one is installed).
pub fn acls() -> Acls<'static> {
    match policy() {
        AclPolicy::Open => Acls::anyone_all(),
        AclPolicy::Creator => Acls::creator_all(),
        AclPolicy::CreatorWorldRead => Acls::new(&CREATOR_ALL_WORLD_READ),
    }
}

/// The process's policy.
pub fn policy() -> AclPolicy {
    POLICY.get().copied().unwrap_or(AclPolicy::Open)
}

/// Sets the process's policy. The first call decides (an open session installs
/// [AclPolicy::Open] too, so that a later authenticated one in the same process is refused
/// rather than mixing two policies); a later call with the same policy is fine.
///
/// # Notable errors
/// * The policy already installed, when it differs from `policy`: a second configuration in
///   the same process cannot change the ACLs of the first.
pub fn install(policy: AclPolicy) -> Result<(), AclPolicy> {
    let installed = *POLICY.get_or_init(|| policy);
    if installed == policy { Ok(()) } else { Err(installed) }
}
