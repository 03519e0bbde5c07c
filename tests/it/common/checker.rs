//! Invariant checkers for the fault tests.
//!
//! [FencedRegister] is the "storage" a lock protects: a counter that clients read, then write
//! back plus one, each write carrying the writer's fencing token. Fenced, it rejects a write
//! whose token is below the highest it has seen, as a storage service that honours fencing
//! tokens does. If two clients ever believe they hold the lock at once, one of their
//! read-modify-write cycles overwrites the other's: an increment is lost, unless fencing
//! rejected the stale writer. [FencedRegister::check] finds lost increments; a test with
//! fencing switched off shows that the check does catch two holders (it is not vacuous).
//!
//! [Terms] records who led in which term and fails on two leaders in one term.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

/// One accepted or rejected write.
#[derive(Debug, Clone)]
pub struct Write {
    pub client: String,
    pub token: i64,
    /// The value the client read, and wrote plus one.
    pub read: u64,
    pub accepted: bool,
}

#[derive(Default)]
struct Register {
    value: u64,
    highest_token: i64,
    writes: Vec<Write>,
}

/// A counter guarded by fencing tokens.
pub struct FencedRegister {
    fenced: bool,
    inner: Mutex<Register>,
}

/// What a run did to the register, for the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub accepted: usize,
    pub rejected: usize,
    pub value: u64,
}

impl FencedRegister {
    pub fn new(fenced: bool) -> FencedRegister {
        FencedRegister {
            fenced,
            inner: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Register> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current value (the first half of a read-modify-write).
    pub fn read(&self) -> u64 {
        self.lock().value
    }

    /// Writes `read + 1` with `token`; `false` if fencing rejected it.
    pub fn write(&self, client: &str, token: i64, read: u64) -> bool {
        let mut register = self.lock();
        let accepted = !self.fenced || token >= register.highest_token;
        if accepted {
            register.value = read + 1;
            register.highest_token = register.highest_token.max(token);
        }
        register.writes.push(Write {
            client: client.to_string(),
            token,
            read,
            accepted,
        });
        accepted
    }

    pub fn tally(&self) -> Tally {
        let register = self.lock();
        let accepted = register.writes.iter().filter(|w| w.accepted).count();
        Tally {
            accepted,
            rejected: register.writes.len() - accepted,
            value: register.value,
        }
    }

    /// The invariant: every accepted write read the value the previous accepted write left,
    /// so the counter equals the number of accepted writes and no increment was lost to a
    /// second holder. The error names the first lost update.
    pub fn check(&self) -> Result<Tally, String> {
        let register = self.lock();
        let mut expected = 0;
        for write in register.writes.iter().filter(|w| w.accepted) {
            if write.read != expected {
                return Err(format!(
                    "lost update: {} (token {}) read {} but the value was {expected}: two holders were accepted at once",
                    write.client, write.token, write.read
                ));
            }
            expected = write.read + 1;
        }
        drop(register);
        Ok(self.tally())
    }
}

/// Leaders seen per term.
#[derive(Default)]
pub struct Terms {
    inner: Mutex<BTreeMap<i64, Vec<String>>>,
}

impl Terms {
    /// Records that `leader` was told it leads in `term`.
    pub fn record(&self, term: i64, leader: &str) {
        let mut terms = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let leaders = terms.entry(term).or_default();
        if !leaders.iter().any(|l| l == leader) {
            leaders.push(leader.to_string());
        }
    }

    /// One leader per term, and terms in the order they were granted. Returns the number of
    /// terms seen.
    pub fn check(&self) -> Result<usize, String> {
        let terms = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        for (term, leaders) in terms.iter() {
            if leaders.len() > 1 {
                return Err(format!("two leaders in term {term}: {leaders:?}"));
            }
        }
        Ok(terms.len())
    }
}

/// What happened to a lock, in the order clients saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockEvent {
    Granted,
    Released,
}

/// The history of a lock: every grant, release and loss with its client, token and time.
#[derive(Default)]
pub struct History {
    inner: Mutex<Vec<(Instant, String, i64, LockEvent)>>,
}

impl History {
    pub fn record(&self, client: &str, token: i64, event: LockEvent) {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((Instant::now(), client.to_string(), token, event));
    }

    /// Grants come with strictly increasing fencing tokens, and each release or loss follows
    /// the grant of the same token to the same client, after no other grant: one holder at a
    /// time as the clients saw it. Returns the number of grants.
    pub fn check(&self) -> Result<usize, String> {
        let history = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut holder: Option<(&str, i64)> = None;
        let mut last_token = i64::MIN;
        let mut grants = 0;
        for (_, client, token, event) in history.iter() {
            match event {
                LockEvent::Granted => {
                    if *token <= last_token {
                        return Err(format!("{client} was granted token {token} after token {last_token}"));
                    }
                    if let Some((other, other_token)) = holder {
                        return Err(format!(
                            "{client} was granted token {token} while {other} held token {other_token}"
                        ));
                    }
                    holder = Some((client, *token));
                    last_token = *token;
                    grants += 1;
                }
                LockEvent::Released => {
                    if holder.is_some_and(|(c, t)| c == client && t == *token) {
                        holder = None;
                    } else if *event == LockEvent::Released {
                        return Err(format!("{client} released token {token} it was not seen to hold"));
                    }
                }
            }
        }
        Ok(grants)
    }
}
