//! Supervising the command while it runs under the lock: when to signal it, and when to stop
//! waiting for it.
//!
//! The decisions are one pure function, [step], from the current [Stage] and an [Event] to the
//! next stage and an [Action]; [supervise] only gathers events and carries actions out. The
//! command's exit is not an event of the machine: whatever the stage, it ends supervision, and
//! the runner exits with the command's code.

use std::io;
use std::process::ExitStatus;
use std::time::Duration;

use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::command::Command;

/// Something wrong with the lock (or leadership) the command runs under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Trouble {
    /// Someone asked for the lock back. With a `grace`, zkgate takes it by force when the grace
    /// runs out; without one, it waits for us.
    Revoked {
        by: String,
        reason: String,
        grace: Option<Duration>,
    },
    /// It is gone (lease ended or expired, node deleted, session lost) or cannot be kept.
    Lost(String),
}

impl std::fmt::Display for Trouble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Trouble::Revoked { by, reason, grace } => {
                write!(f, "revoked by {by} ({reason})")?;
                match grace {
                    Some(grace) => write!(f, ", taken back in {}", humantime::format_duration(*grace)),
                    None => Ok(()),
                }
            }
            Trouble::Lost(why) => write!(f, "lost: {why}"),
        }
    }
}

/// Where the supervision of the command stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Runs under the lock.
    Running,
    /// Asked to stop (SIGTERM sent): SIGKILL at `kill_at`, or already sent when `None`.
    Stopping { kill_at: Option<Instant> },
}

/// What can happen while the command runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Trouble(Trouble),
    /// The runner received this signal (SIGINT or SIGTERM).
    Signal(i32),
    /// The time to SIGKILL has come.
    KillDue,
}

/// What to do to the command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Nothing,
    /// Pass on a signal the runner received.
    Forward(i32),
    /// SIGTERM: stop, cleanly.
    Terminate,
    /// SIGKILL: it had its grace.
    Kill,
}

/// The next stage, and what to do, when `event` happens at `now`; `grace` is how long a
/// command has between SIGTERM and SIGKILL.
pub fn step(stage: Stage, event: &Event, now: Instant, grace: Duration) -> (Stage, Action) {
    match (stage, event) {
        // A signal sent to the runner is meant for the work: the command decides how to stop,
        // and the runner exits when it does. (Escalating is the sender's business.)
        (_, Event::Signal(signal)) => (stage, Action::Forward(*signal)),
        // The lock is going or gone: the work must stop before someone else's starts. Ask
        // nicely first.
        (Stage::Running, Event::Trouble(trouble)) => {
            let kill_at = now + time_to_stop(trouble, grace);
            (Stage::Stopping { kill_at: Some(kill_at) }, Action::Terminate)
        }
        // Already stopping: news can only bring SIGKILL closer (a revocation with a shorter
        // grace than ours), never push it back.
        (Stage::Stopping { kill_at }, Event::Trouble(trouble)) => {
            let sooner = now + time_to_stop(trouble, grace);
            let kill_at = kill_at.map(|at| at.min(sooner));
            (Stage::Stopping { kill_at }, Action::Nothing)
        }
        (Stage::Stopping { kill_at: Some(_) }, Event::KillDue) => (Stage::Stopping { kill_at: None }, Action::Kill),
        (_, Event::KillDue) => (stage, Action::Nothing),
    }
}

/// How long the command may take to stop: our grace, but no longer than the revoker's, after
/// which zkgate takes the lock away and the command would run unprotected.
fn time_to_stop(trouble: &Trouble, grace: Duration) -> Duration {
    match trouble {
        Trouble::Revoked {
            grace: Some(theirs), ..
        } => grace.min(*theirs),
        _ => grace,
    }
}

/// SIGINT and SIGTERM, caught for the runner's whole life so that neither kills it before it
/// has released its lease.
pub struct Signals {
    interrupt: Signal,
    terminate: Signal,
}

impl Signals {
    pub fn catch() -> io::Result<Signals> {
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    /// The next signal received. Cancel-safe.
    pub async fn recv(&mut self) -> i32 {
        tokio::select! {
            Some(()) = self.interrupt.recv() => libc::SIGINT,
            Some(()) = self.terminate.recv() => libc::SIGTERM,
            else => std::future::pending().await,
        }
    }
}

/// Runs the machine until the command exits; returns its exit status. `what` names the lock
/// (`lock "orders"`) in the messages.
pub async fn supervise(
    command: &mut Command,
    troubles: &mut mpsc::Receiver<Trouble>,
    signals: &mut Signals,
    grace: Duration,
    what: &str,
) -> io::Result<ExitStatus> {
    let mut stage = Stage::Running;
    loop {
        let event = tokio::select! {
            status = command.wait() => return status,
            Some(trouble) = troubles.recv() => Event::Trouble(trouble),
            signal = signals.recv() => Event::Signal(signal),
            () = kill_due(stage) => Event::KillDue,
        };
        let now = Instant::now();
        let (next, action) = step(stage, &event, now, grace);
        announce(&event, action, next, now, what);
        match action {
            Action::Nothing => {}
            Action::Forward(signal) => command.signal(signal),
            Action::Terminate => command.signal(libc::SIGTERM),
            Action::Kill => command.signal(libc::SIGKILL),
        }
        stage = next;
    }
}

async fn kill_due(stage: Stage) {
    match stage {
        Stage::Stopping { kill_at: Some(at) } => tokio::time::sleep_until(at).await,
        _ => std::future::pending().await,
    }
}

/// Says on stderr why the runner acts on the command (forwarding a signal needs no words).
fn announce(event: &Event, action: Action, next: Stage, now: Instant, what: &str) {
    let grace = match next {
        Stage::Stopping { kill_at: Some(at) } => at.saturating_duration_since(now),
        _ => Duration::ZERO,
    };
    let grace = humantime::format_duration(grace);
    match (event, action) {
        (Event::Trouble(trouble), Action::Terminate) => {
            eprintln!("zkgate: {what} {trouble}; stopping the command (SIGTERM, SIGKILL in {grace})");
        }
        (Event::Trouble(trouble), _) => eprintln!("zkgate: {what} {trouble}"),
        (Event::KillDue, Action::Kill) => eprintln!("zkgate: the command is still running; sending SIGKILL"),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(10);

    fn revoked(grace: Option<u64>) -> Event {
        Event::Trouble(Trouble::Revoked {
            by: "ops".into(),
            reason: "deploy".into(),
            grace: grace.map(Duration::from_secs),
        })
    }

    fn lost() -> Event {
        Event::Trouble(Trouble::Lost("the lease expired".into()))
    }

    #[test]
    fn signals_are_forwarded_whatever_the_stage() {
        let now = Instant::now();
        for stage in [Stage::Running, Stage::Stopping { kill_at: Some(now) }] {
            let (next, action) = step(stage, &Event::Signal(libc::SIGINT), now, GRACE);
            assert_eq!((next, action), (stage, Action::Forward(libc::SIGINT)));
        }
    }

    #[test]
    fn trouble_terminates_then_kills_after_the_grace() {
        let now = Instant::now();
        let (stopping, action) = step(Stage::Running, &lost(), now, GRACE);
        assert_eq!(action, Action::Terminate);
        assert_eq!(
            stopping,
            Stage::Stopping {
                kill_at: Some(now + GRACE)
            }
        );
        let (killed, action) = step(stopping, &Event::KillDue, now + GRACE, GRACE);
        assert_eq!(action, Action::Kill);
        assert_eq!(killed, Stage::Stopping { kill_at: None });
        // Killed once only.
        assert_eq!(step(killed, &Event::KillDue, now, GRACE), (killed, Action::Nothing));
    }

    #[test]
    fn a_revocation_grace_shorter_than_ours_brings_the_kill_forward() {
        let now = Instant::now();
        let (stopping, _) = step(Stage::Running, &revoked(Some(2)), now, GRACE);
        assert_eq!(
            stopping,
            Stage::Stopping {
                kill_at: Some(now + Duration::from_secs(2))
            }
        );
        let (stopping, _) = step(Stage::Running, &revoked(Some(60)), now, GRACE);
        assert_eq!(
            stopping,
            Stage::Stopping {
                kill_at: Some(now + GRACE)
            }
        );
        let (stopping, _) = step(Stage::Running, &revoked(None), now, GRACE);
        assert_eq!(
            stopping,
            Stage::Stopping {
                kill_at: Some(now + GRACE)
            }
        );
    }

    #[test]
    fn more_trouble_while_stopping_never_delays_the_kill() {
        let now = Instant::now();
        let (stopping, _) = step(Stage::Running, &revoked(None), now, GRACE);
        let later = now + Duration::from_secs(1);
        // The forced take-back is reported as a loss: same deadline, no second SIGTERM.
        assert_eq!(step(stopping, &lost(), later, GRACE), (stopping, Action::Nothing));
        let (sooner, action) = step(stopping, &revoked(Some(1)), later, GRACE);
        assert_eq!(action, Action::Nothing);
        assert_eq!(
            sooner,
            Stage::Stopping {
                kill_at: Some(later + Duration::from_secs(1))
            }
        );
        let killed = Stage::Stopping { kill_at: None };
        assert_eq!(step(killed, &lost(), later, GRACE), (killed, Action::Nothing));
    }

    #[test]
    fn a_stray_kill_timer_while_running_does_nothing() {
        let now = Instant::now();
        assert_eq!(
            step(Stage::Running, &Event::KillDue, now, GRACE),
            (Stage::Running, Action::Nothing)
        );
    }
}
