//! What `zkgate lock` and `zkgate elect` contend for (a lock, a semaphore's permit, a
//! leadership), and how each says so: its paths and body in the API, its words in messages,
//! the guard and the variable it hands the command.

use serde_json::{Value, json};

/// What a runner contends for.
#[derive(Clone, Debug)]
pub enum Target {
    Lock {
        name: String,
    },
    /// One of the `permits` permits of a semaphore.
    Semaphore {
        name: String,
        permits: u32,
    },
    /// Leadership, proclaiming `value` once it leads.
    Election {
        name: String,
        value: Option<Value>,
    },
}

impl Target {
    pub fn name(&self) -> &str {
        match self {
            Target::Lock { name } | Target::Semaphore { name, .. } | Target::Election { name, .. } => name,
        }
    }

    /// What the grant is called in messages.
    pub fn noun(&self) -> &'static str {
        match self {
            Target::Lock { .. } => "lock",
            Target::Semaphore { .. } => "a permit of semaphore",
            Target::Election { .. } => "leadership of",
        }
    }

    /// What a `ZKGATE-Guard` calls its kind.
    pub fn guard_kind(&self) -> &'static str {
        match self {
            Target::Lock { .. } => "lock",
            Target::Semaphore { .. } => "semaphore",
            Target::Election { .. } => "election",
        }
    }

    /// The environment variable that names the resource for the command.
    pub fn env_var(&self) -> &'static str {
        match self {
            Target::Lock { .. } => "ZKGATE_LOCK",
            Target::Semaphore { .. } => "ZKGATE_SEMAPHORE",
            Target::Election { .. } => "ZKGATE_ELECTION",
        }
    }

    pub(super) fn contend_path(&self) -> [&str; 4] {
        match self {
            Target::Lock { name } => ["v1", "locks", name, "acquire"],
            Target::Semaphore { name, .. } => ["v1", "semaphores", name, "acquire"],
            Target::Election { name, .. } => ["v1", "elections", name, "campaign"],
        }
    }

    /// What the acquire's query says besides its wait: a semaphore's number of permits.
    pub(super) fn contend_query(&self) -> Option<(&'static str, String)> {
        match self {
            Target::Semaphore { permits, .. } => Some(("permits", permits.to_string())),
            Target::Lock { .. } | Target::Election { .. } => None,
        }
    }

    pub(super) fn handle_path<'a>(&'a self, handle: &'a str) -> [&'a str; 5] {
        match self {
            Target::Lock { name } => ["v1", "locks", name, "handles", handle],
            Target::Semaphore { name, .. } => ["v1", "semaphores", name, "permits", handle],
            Target::Election { name, .. } => ["v1", "elections", name, "candidates", handle],
        }
    }

    pub(super) fn contend_body(&self, lease: &str) -> Value {
        match self {
            Target::Election { value: Some(value), .. } => json!({ "lease": lease, "value": value }),
            Target::Lock { .. } | Target::Semaphore { .. } | Target::Election { value: None, .. } => {
                json!({ "lease": lease })
            }
        }
    }
}
