//! Writes guarded by what their writer holds: `ZKGATE-Guard: lock/orders; handle=<handle>`.
//!
//! A fencing token leaves the check and the write as two steps, and a holder can lose the lock
//! between them. For data kept in ZooKeeper itself that gap need not exist: a guarded write's
//! multi-op carries, beside the write, a `check` of what makes the guard hold, so ZooKeeper
//! applies the write only if, at that moment, the holding still holds (Chubby's servers check
//! a sequencer with each request; etcd's users put `Mutex.IsOwner()` in their `Txn`).
//!
//! **What holds.** A guard names a contended resource (a lock, a read/write lock, a semaphore,
//! an election) and a handle at it. It holds while the handle's node exists and its lease is
//! live and kept where it was. Two checks say so, for each guard:
//! - the node (the contender's, or a permit's lease node), at any version (a revocation request
//!   or a proclaimed value changes its data, not whether it holds);
//! - the lease's record, at the version read: its end (written into the record before its
//!   holdings go) and a takeover both change it. So during a lock-delay, when the ended lease's
//!   node is kept so that nobody else is granted yet, the guard of the ended lease fails.
//!
//! Whether the handle *holds* (rather than waits) is decided when the guard is resolved, before
//! the write: a node that held keeps holding until it is deleted, since nodes queue in creation
//! order and new ones only come after it (a read/write lock's reader too: a writer after it
//! waits for it). So the checks hold exactly while the grant does.
//!
//! **Resolving.** A handle driven here is resolved from memory (its node and its lease's
//! version), with no ZooKeeper round trip; one driven elsewhere, or a semaphore's permit, is
//! read from ZooKeeper (after a `sync`). A refusal is explained from ZooKeeper, after a `sync`:
//! if the handle turns out to hold after all (memory was behind: a takeover changed the lease's
//! version), the checks are refreshed and the write is tried again, a bounded number of times;
//! otherwise the answer is 409 `guard-lost`, naming the guard, why, and the holder now.
//!
//! One mechanism for every write: an operation takes [Guards] and each multi-op it commits
//! begins with [Guards::add_to]; a refusal of those operations goes to [Guards::refused].
//! Here what a write function needs (the guards and their checks); in [resolve] how they are
//! found and explained, which reads the contended kinds' registries (a layer above the write
//! functions of every recipe, which this file must stay below).

use std::sync::Mutex;

use zookeeper_client::Error as ZkError;

use crate::auth::Caller;
use crate::kind::Kind;
use crate::locked::Locked;
use crate::zk::Multi;

mod resolve;

pub use resolve::standing;

/// The request header.
pub const HEADER: &str = "zkgate-guard";

/// Most guards one write may carry (each adds two checks to its multi-op).
pub const MAX_GUARDS: usize = 8;

/// How many times a write whose guard was refused while it still held (its lease taken over
/// meanwhile) is tried again with fresh checks before it gives up (503).
const REFRESHES: usize = 3;

/// What one guard names: a holding, by its resource and its handle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Guard {
    pub kind: Kind,
    pub name: String,
    pub handle: String,
}

impl std::fmt::Display for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}; handle={}", self.target(), self.handle)
    }
}

impl Guard {
    /// What it guards by, as answers name it: `lock/orders`.
    pub fn target(&self) -> String {
        format!("{}/{}", self.kind.name(), self.name)
    }

    /// The guard of `handle` at `kind`'s resource `name`, both checked: an error says which is
    /// not valid.
    pub fn new(kind: Kind, name: &str, handle: &str) -> Result<Guard, String> {
        crate::recipes::validate_name(name).map_err(|e| format!("guard's {} name {e}", kind.name()))?;
        if crate::ids::owner_of(handle).is_none() {
            return Err(format!(
                "guard of {} `{name}`: `{}` is not a handle (as the acquire answered it)",
                kind.name(),
                handle.escape_debug()
            ));
        }
        Ok(Guard {
            kind,
            name: name.to_string(),
            handle: handle.to_string(),
        })
    }
}

/// The kinds a guard may name: those whose holdings are contended.
fn guarded_kind(word: &str) -> Option<Kind> {
    Kind::from_topic(word).filter(|kind| kind.contended())
}

/// The guards of one header value: `<kind>/<name>; handle=<handle>`, several separated by `,`
/// (as a proxy may join repeated headers). A name with `; handle=` in it cannot be guarded.
pub fn parse(value: &str) -> Result<Vec<Guard>, String> {
    let mut guards = Vec::new();
    let mut rest = value.trim();
    while !rest.is_empty() {
        let (word, after) = rest.split_once('/').ok_or_else(|| {
            format!(
                "`{}` is not a guard: write `lock/NAME; handle=HANDLE`",
                rest.escape_debug()
            )
        })?;
        let kind = guarded_kind(word.trim()).ok_or_else(|| {
            format!(
                "`{}` cannot guard a write: a guard names a `lock`, `rwlock`, `semaphore` or `election`",
                word.escape_debug()
            )
        })?;
        let (name, after) = after.split_once(';').ok_or_else(|| {
            format!(
                "guard of {} `{}` names no handle: add `; handle=HANDLE`",
                kind.name(),
                after.escape_debug()
            )
        })?;
        let after = after.trim_start();
        let id = after.strip_prefix("handle=").ok_or_else(|| {
            format!(
                "guard of {} `{name}` names no handle: add `; handle=HANDLE`",
                kind.name()
            )
        })?;
        let end = id.find(|c: char| c == ',' || c.is_whitespace()).unwrap_or(id.len());
        let (handle, after) = id.split_at(end);
        guards.push(Guard::new(kind, name, handle)?);
        let after = after.trim_start();
        rest = match after.strip_prefix(',') {
            Some(next) => next.trim_start(),
            None if after.is_empty() => after,
            None => {
                return Err(format!(
                    "after guard of {} `{name}`: `{}` is not a guard",
                    kind.name(),
                    after.escape_debug()
                ));
            }
        };
    }
    if guards.len() > MAX_GUARDS {
        return Err(format!("at most {MAX_GUARDS} guards ({} given)", guards.len()));
    }
    Ok(guards)
}

/// What a guard's checks are, once resolved.
#[derive(Clone, Debug)]
pub struct Checks {
    /// The holding's node, and its czxid (the holder's fencing token).
    node: String,
    token: i64,
    /// Its lease's record, and the version it was read at.
    lease: String,
    version: i32,
}

/// A holding a guarded write was made under: its guard (`lock/orders`) and the holder's
/// fencing token then (its node's czxid; a semaphore permit's lease node's).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct GuardedBy {
    #[schema(example = "lock/orders")]
    pub guard: String,
    pub fencing_token: i64,
}

/// The guards of one write, resolved: what its multi-ops check. Empty for a write without.
pub struct Guards {
    caller: Caller,
    asked: Vec<Guard>,
    checks: Mutex<Vec<Checks>>,
    refreshed: Mutex<usize>,
}

impl Guards {
    /// A write without guards.
    pub fn none() -> Guards {
        Guards {
            caller: Caller::Anyone,
            asked: Vec::new(),
            checks: Mutex::default(),
            refreshed: Mutex::default(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.asked.is_empty()
    }

    /// Adds the checks to `multi`, each tagged `tag`: put them first, so that a refusal is the
    /// guard's before any of the write's own operations is looked at.
    pub fn add_to<T: Clone>(&self, multi: &mut Multi<'_, T>, tag: T) -> Result<(), ZkError> {
        self.checked().add_to(multi, tag)
    }

    /// Under which holdings the write is made, as a guarded key's writer record keeps it
    /// ([crate::recipes::kv::writer]); empty without guards.
    pub fn guarded_by(&self) -> Vec<GuardedBy> {
        let checks = self.checks.locked();
        (self.asked.iter().zip(checks.iter()))
            .map(|(guard, checks)| GuardedBy {
                guard: guard.target(),
                fencing_token: checks.token,
            })
            .collect()
    }

    /// The checks as they are now, for a write that a holding's task makes (a member's node,
    /// a participant's).
    pub fn checked(&self) -> Checked {
        Checked(self.checks.locked().clone())
    }
}

/// The checks of a write's guards, as resolved: what a holding's task carries to the multi-op
/// that makes its node. Empty: no guards.
#[derive(Clone, Debug, Default)]
pub struct Checked(Vec<Checks>);

impl Checked {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// As [Guards::add_to].
    pub fn add_to<T: Clone>(&self, multi: &mut Multi<'_, T>, tag: T) -> Result<(), ZkError> {
        for checks in &self.0 {
            multi.check(tag.clone(), &checks.node, -1)?;
            multi.check(tag.clone(), &checks.lease, checks.version)?;
        }
        Ok(())
    }
}

/// Whether a guard's handle holds, as resolved for a transaction's compare (`held`, `leads`),
/// and what keeps that answer true until the commit, which pins it ([Standing::pin]).
#[derive(Clone, Debug)]
pub enum Standing {
    /// It holds while these checks pass.
    Holds(Checks),
    /// It waits while the node `blocker` (the one whose deletion may grant it) exists.
    Waits { blocker: String },
    /// It does not hold, for good (`reason`: released, revoked, lost, its lease ended): a
    /// handle's node is named by its GUID, so none comes back, and an ended lease stays ended.
    /// (Also a semaphore's waiting permit, `not-held`, which a guard refuses and a compare does
    /// not take.)
    Gone { reason: &'static str },
}

impl Standing {
    pub fn holds(&self) -> bool {
        matches!(self, Standing::Holds(_))
    }

    /// Adds to `multi` what fails the commit if the answer changed: the guard's checks for a
    /// holder, the blocker's existence for a waiter; nothing for a handle gone for good.
    pub fn pin<T: Clone>(&self, multi: &mut Multi<'_, T>, tag: T) -> Result<(), ZkError> {
        match self {
            Standing::Holds(checks) => Checked(vec![checks.clone()]).add_to(multi, tag),
            Standing::Waits { blocker } => multi.check(tag, blocker, -1),
            Standing::Gone { .. } => Ok(()),
        }
    }
}

/// Evaluates `$write` (an operation's writing part, whose multi-ops begin with
/// [Guards::add_to]) again while its outcome is `$refused` (its refusal of the guards' checks)
/// and [Guards::refused] finds that they still hold; its outcome otherwise. Nothing of a refused
/// multi-op applied, so sending it again is safe. In an `async` function returning
/// `Result<_, ApiError>` (a lost guard returns from it).
macro_rules! retry_guarded {
    ($guards:expr, $recipes:expr, $refused:pat, $write:expr) => {
        loop {
            match $write {
                $refused => $guards.refused($recipes).await?,
                done => break done,
            }
        }
    };
}

pub(crate) use retry_guarded;

#[cfg(test)]
mod tests {
    use super::*;

    const H: &str = "0a1b2c3d-00112233445566778899aabbccddeeff";

    #[test]
    fn a_header_names_one_guard_or_several() {
        let one = parse(&format!("lock/orders; handle={H}")).unwrap();
        assert_eq!(
            one,
            vec![Guard {
                kind: Kind::Lock,
                name: "orders".into(),
                handle: H.into()
            }]
        );
        let two = parse(&format!("election/leader;handle={H} , rwlock/a,b; handle={H}")).unwrap();
        assert_eq!(two.len(), 2);
        assert_eq!((two[0].kind, two[1].kind), (Kind::Election, Kind::RwLock));
        assert_eq!(two[1].name, "a,b", "a name may hold a comma");
        assert_eq!(one[0].to_string(), format!("lock/orders; handle={H}"));
    }

    #[test]
    fn a_bad_guard_is_refused_saying_what_is_wrong() {
        for (value, says) in [
            ("lock/orders".to_string(), "names no handle"),
            (format!("kv/app; handle={H}"), "cannot guard"),
            ("lock/orders; handle=nope".to_string(), "is not a handle"),
            (format!("lock/; handle={H}"), "name"),
            (format!("lock/orders; handle={H} trailing"), "is not a guard"),
            ("orders".to_string(), "is not a guard"),
        ] {
            let err = parse(&value).unwrap_err();
            assert!(err.contains(says), "{value}: {err}");
        }
        let many = vec![format!("lock/a; handle={H}"); MAX_GUARDS + 1].join(", ");
        assert!(parse(&many).unwrap_err().contains("at most"));
    }
}
