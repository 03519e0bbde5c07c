//! The command a runner runs under its lock: started in a process group of its own, with the
//! grant in its environment, and signalled as a group.
//!
//! A group of its own, so that a stop reaches everything the command started (a shell's
//! children too), not only the process we spawned: a lock that is lost must not leave part of
//! the work running. It also means Ctrl-C in a terminal reaches only the runner, which forwards
//! it once. The price: the command is not in the terminal's foreground, so it must not read the
//! terminal; when the runner's stdin is a terminal the command gets `/dev/null` instead (an
//! end of input rather than a process stopped by SIGTTIN forever).

use std::io;
use std::io::IsTerminal;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};

/// A running command.
pub struct Command {
    child: tokio::process::Child,
}

/// Exit code when the command was found but could not be run (the shell's convention).
pub const EXIT_CANNOT_RUN: u8 = 126;
/// Exit code when the command was not found (the shell's convention).
pub const EXIT_NOT_FOUND: u8 = 127;

impl Command {
    /// Starts `argv` with `env` added to the runner's own environment.
    ///
    /// Call it from the task that lives as long as the runner (the main one): the parent-death
    /// signal set here fires when the *thread* that spawned the command ends.
    pub fn spawn(argv: &[String], env: &[(&str, String)]) -> io::Result<Command> {
        Command::start(argv, env, None)
    }

    /// Starts `argv` as [Command::spawn] does, with `input` as its whole stdin (written by a
    /// task of its own, so that a command that does not read it does not block the caller).
    pub fn spawn_with_input(argv: &[String], env: &[(&str, String)], input: Vec<u8>) -> io::Result<Command> {
        Command::start(argv, env, Some(input))
    }

    fn start(argv: &[String], env: &[(&str, String)], input: Option<Vec<u8>>) -> io::Result<Command> {
        let Some((program, args)) = argv.split_first() else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "no command given"));
        };
        let mut command = tokio::process::Command::new(program);
        command
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .process_group(0);
        if input.is_some() {
            command.stdin(Stdio::piped());
        } else if io::stdin().is_terminal() {
            command.stdin(Stdio::null());
        }
        // SAFETY: prctl(2) is async-signal-safe and touches nothing of the parent's.
        // If the runner is killed outright (SIGKILL), the command gets SIGTERM: the lease still
        // holds the lock for one TTL, time enough for the command to stop cleanly.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let mut child = command.spawn()?;
        if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                // A command that exits without reading it all closes the pipe: not an error.
                let _ = stdin.write_all(&input).await;
            });
        }
        Ok(Command { child })
    }

    /// Sends `signal` to the command's process group. Once the command has been reaped its
    /// group id may be reused, so then this does nothing.
    pub fn signal(&self, signal: i32) {
        if let Some(pid) = self.child.id() {
            // SAFETY: kill(2) on the process group of a child we have not reaped (its pid is
            // the group's id, set by `process_group(0)` before the command started).
            unsafe {
                libc::kill(-(pid as libc::pid_t), signal);
            }
        }
    }

    /// Waits for the command to exit. Cancel-safe.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        self.child.wait().await
    }
}

/// The runner's exit code for the command's exit status: its code, or 128 + the signal that
/// killed it (as a shell reports it).
pub fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => 128u8.saturating_add(signal as u8),
        (None, None) => 1,
    }
}

/// The runner's exit code when the command could not be started.
pub fn spawn_failure_code(error: &io::Error) -> u8 {
    match error.kind() {
        io::ErrorKind::NotFound => EXIT_NOT_FOUND,
        _ => EXIT_CANNOT_RUN,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_shell() {
        assert_eq!(exit_code(ExitStatus::from_raw(7 << 8)), 7);
        assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGTERM)), 143);
        assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGKILL)), 137);
        let missing = io::Error::from(io::ErrorKind::NotFound);
        assert_eq!(spawn_failure_code(&missing), 127);
        let denied = io::Error::from(io::ErrorKind::PermissionDenied);
        assert_eq!(spawn_failure_code(&denied), 126);
    }
}
