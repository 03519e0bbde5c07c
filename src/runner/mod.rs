//! `zkgate lock` and `zkgate elect`: run a command while holding a lock (or one of the N
//! permits of a semaphore: `lock -n N`, as `consul lock -n N`), or leading an election, of a
//! running zkgate, the way `etcdctl lock` and `consul lock` do.
//!
//! The runner creates a lease, waits in the lock's queue with it (re-polling with
//! `keep_queued=true`, so its place is kept between long polls), then runs the command with the
//! grant in its environment. While the command runs, [guard] keeps the lease alive and watches
//! the handle; [supervise] stops the command (SIGTERM, then SIGKILL after `--grace`) when the
//! lock is revoked or lost, and forwards SIGINT/SIGTERM. When the command ends the runner
//! deletes the lease, which releases the lock, and exits with the command's exit code.

pub mod answers;
pub mod api;
pub mod command;
pub mod guard;
pub mod queue;
pub mod resources;
pub mod supervise;
pub mod target;
pub mod watch;

use std::time::Duration;

use clap::Args;
use tokio::sync::mpsc;
use tokio::time::Instant;

use self::api::{Api, CallError, Lease, Standing, Target};
use self::command::Command;
use self::supervise::{Signals, Trouble};
use crate::time::parse_duration;

/// Exit code when the lock (or leadership) was not granted within `--wait`; GNU `timeout`'s
/// code for "time ran out".
pub const EXIT_NOT_GRANTED: u8 = 124;
/// Exit code when the runner itself failed and the command never ran: zkgate unreachable, an
/// error answer, the lease lost while waiting. `env`, `timeout` and `docker run` use 125 the
/// same way, so that it is not mistaken for the command's own failure.
pub const EXIT_RUNNER_FAILED: u8 = 125;

/// The longest one acquire long poll asks to wait (zkgate may cut it to its `--max-wait`).
const ACQUIRE_POLL: Duration = Duration::from_secs(30);

/// Pause before calling again after zkgate could not be reached (or could not reach ZooKeeper).
const RETRY: Duration = Duration::from_secs(1);

/// What to exit with after the long help of `lock` and `elect`.
const EXIT_CODES: &str = "\
Environment of the command: ZKGATE_FENCING_TOKEN (the grant's fencing token; for `elect` the
leader's term), ZKGATE_LOCK, ZKGATE_SEMAPHORE (with -n above 1) or ZKGATE_ELECTION (the name), ZKGATE_LEASE, ZKGATE_HANDLE,
ZKGATE_GUARD (send it as the `ZKGATE-Guard` header: a write lands only while this holds),
ZKGATE_URL (the URLs given, comma-separated).

Exit status: the command's, or 128 + the signal that ended it. Otherwise:
  124  not granted within --wait
  125  zkgate unreachable, an error answer (its detail is printed), or the lease lost while waiting
  126  the command could not be run
  127  the command was not found";

/// How a client subcommand reaches zkgate: its instances, their CA, the token.
#[derive(Args, Clone, Debug)]
pub struct Connection {
    /// Base URL of a zkgate instance to use (`http://` or `https://`). Give several (`--url A
    /// --url B`, or `ZKGATE_URL=A,B`): calls go to the one that answered last and, while it
    /// does not answer (or answers 503), to the next.
    #[arg(
        long = "url",
        env = "ZKGATE_URL",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:7070",
        global = true
    )]
    pub urls: Vec<String>,

    /// CA certificates (PEM) to trust for an `https://` zkgate, besides the system's.
    #[arg(long, env = "ZKGATE_CA", global = true)]
    pub ca: Option<std::path::PathBuf>,

    /// Bearer token sent as `Authorization: Bearer <token>`.
    #[arg(long, env = "ZKGATE_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
}

impl Connection {
    /// A client of the instances given.
    pub fn api(&self) -> Result<Api, String> {
        Api::new(&self.urls, self.token.as_deref(), self.ca.as_deref())
    }
}

/// Options shared by `zkgate lock` and `zkgate elect`.
#[derive(Args, Clone, Debug)]
pub struct RunnerOptions {
    #[command(flatten)]
    pub connection: Connection,

    /// TTL of the lease that holds the lock (or leadership): if this runner dies, it is released
    /// this long after the last keepalive (sent every third of it).
    #[arg(long, default_value = "15s", value_parser = positive_duration)]
    pub ttl: Duration,

    /// How long to wait for the lock (or leadership) in all (`0`: try once); default: as long as
    /// it takes.
    #[arg(long, value_parser = parse_duration)]
    pub wait: Option<Duration>,

    /// How long the command has to exit after SIGTERM (sent when the lock is revoked or lost,
    /// or leadership lost) before it gets SIGKILL.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub grace: Duration,
}

/// `zkgate lock [-n N] NAME [options] -- COMMAND [ARGS...]`.
#[derive(Args, Clone, Debug)]
#[command(after_long_help = EXIT_CODES)]
pub struct LockArgs {
    /// The lock's name (the semaphore's, with `-n` above 1).
    pub name: String,

    /// Hold one of N permits of semaphore NAME instead of the lock NAME: at most N commands
    /// run at once (a rolling restart, N at a time). Every runner of NAME must give the same
    /// N. 1, the default, is the exclusive lock.
    #[arg(short = 'n', long = "permits", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub permits: u32,

    #[command(flatten)]
    pub options: RunnerOptions,

    /// The command to run while holding the lock, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// `zkgate elect NAME [--value V] [options] -- COMMAND [ARGS...]`.
#[derive(Args, Clone, Debug)]
#[command(after_long_help = EXIT_CODES)]
pub struct ElectArgs {
    /// The election's name.
    pub name: String,

    /// The value this candidate proclaims while it leads: JSON (`{"host":"a"}`, `7`), or else
    /// taken as a string.
    #[arg(long)]
    pub value: Option<String>,

    #[command(flatten)]
    pub options: RunnerOptions,

    /// The command to run while leading, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// Runs `zkgate lock`; returns the exit code.
pub async fn lock(args: LockArgs) -> u8 {
    let target = match args.permits {
        1 => Target::Lock { name: args.name },
        permits => Target::Semaphore {
            name: args.name,
            permits,
        },
    };
    run(target, &args.options, &args.command).await
}

/// Runs `zkgate elect`; returns the exit code.
pub async fn elect(args: ElectArgs) -> u8 {
    let value = args
        .value
        .map(|text| serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)));
    let target = Target::Election { name: args.name, value };
    run(target, &args.options, &args.command).await
}

/// A grant to run the command under.
struct Grant {
    handle: String,
    fencing_token: i64,
}

/// Why the command did not run.
enum NotGranted {
    /// `--wait` ran out first.
    TimedOut(Duration),
    Failed(CallError),
    LeaseLost(Trouble),
    /// The runner was told to stop (SIGINT, SIGTERM) while it waited.
    Signalled(i32),
}

impl NotGranted {
    fn exit_code(&self) -> u8 {
        match self {
            NotGranted::TimedOut(_) => EXIT_NOT_GRANTED,
            NotGranted::Failed(_) | NotGranted::LeaseLost(_) => EXIT_RUNNER_FAILED,
            NotGranted::Signalled(signal) => 128u8.saturating_add(*signal as u8),
        }
    }

    fn explain(&self, what: &str) -> String {
        match self {
            NotGranted::TimedOut(wait) => {
                format!("{what} was not granted within {}", humantime::format_duration(*wait))
            }
            NotGranted::Failed(error) => error.to_string(),
            NotGranted::LeaseLost(trouble) => format!("{what} not granted: the lease was {trouble}"),
            NotGranted::Signalled(_) => format!("interrupted while waiting for {what}"),
        }
    }
}

async fn run(target: Target, options: &RunnerOptions, argv: &[String]) -> u8 {
    let what = format!("{} \"{}\"", target.noun(), target.name());
    let api = match options.connection.api() {
        Ok(api) => api,
        Err(message) => return fail(&message),
    };
    // Caught from the start: a Ctrl-C while waiting must still delete the lease.
    let mut signals = match Signals::catch() {
        Ok(signals) => signals,
        Err(error) => return fail(&format!("cannot catch signals: {error}")),
    };
    let created = Instant::now();
    let lease = match api.create_lease(options.ttl).await {
        Ok(lease) => lease,
        Err(error) => return fail(&error.to_string()),
    };
    let (report, mut troubles) = mpsc::channel(4);
    let keeper = tokio::spawn(guard::keep_alive(api.clone(), lease.clone(), created, report.clone()));
    let waited = tokio::select! {
        granted = acquire(&api, &target, &lease, options.wait, &what) => granted,
        Some(trouble) = troubles.recv() => Err(NotGranted::LeaseLost(trouble)),
        signal = signals.recv() => Err(NotGranted::Signalled(signal)),
    };
    let code = match waited {
        Ok(grant) => {
            let watcher = tokio::spawn(guard::watch_handle(
                api.clone(),
                target.clone(),
                grant.handle.clone(),
                report,
            ));
            let env = environment(&api, &target, options, &lease, &grant);
            let code = run_command(argv, &env, &mut troubles, &mut signals, options.grace, &what).await;
            watcher.abort();
            code
        }
        Err(not_granted) => {
            eprintln!("zkgate: {}", not_granted.explain(&what));
            not_granted.exit_code()
        }
    };
    keeper.abort();
    release(&api, &lease).await;
    code
}

/// Waits in the queue until granted, `wait` has passed, or something fails for good. zkgate
/// unreachable (or answering 503) is retried: the keeper decides when the lease is lost.
///
/// While it waits it says so on stderr, with its place in the queue, once and again each time
/// the place changes: a runner that stays silent while it waits looks hung.
async fn acquire(
    api: &Api,
    target: &Target,
    lease: &Lease,
    wait: Option<Duration>,
    what: &str,
) -> Result<Grant, NotGranted> {
    let deadline = wait.map(|wait| Instant::now() + wait);
    let mut told: Option<u64> = None;
    loop {
        let left = deadline.map(|deadline| deadline.saturating_duration_since(Instant::now()));
        let poll = left.unwrap_or(ACQUIRE_POLL).min(ACQUIRE_POLL);
        match api.contend(target, &lease.id, poll).await {
            Ok(Standing::Granted { handle, fencing_token }) => return Ok(Grant { handle, fencing_token }),
            Ok(Standing::Queued { position }) => {
                if told != Some(position) {
                    eprintln!("zkgate: waiting for {what} (position {position})");
                    told = Some(position);
                }
            }
            Err(error) if error.is_transient() => {
                let pause = left.map_or(RETRY, |left| left.min(RETRY));
                tokio::time::sleep(pause).await;
            }
            Err(error) => return Err(NotGranted::Failed(error)),
        }
        if let (Some(wait), Some(deadline)) = (wait, deadline)
            && Instant::now() >= deadline
        {
            return Err(NotGranted::TimedOut(wait));
        }
    }
}

/// What the command finds in its environment (added to the runner's own).
fn environment(
    api: &Api,
    target: &Target,
    options: &RunnerOptions,
    lease: &Lease,
    grant: &Grant,
) -> Vec<(&'static str, String)> {
    vec![
        ("ZKGATE_FENCING_TOKEN", grant.fencing_token.to_string()),
        (target.env_var(), target.name().to_string()),
        ("ZKGATE_LEASE", lease.id.clone()),
        ("ZKGATE_HANDLE", grant.handle.clone()),
        // The command's writes to zkgate, guarded by what the runner holds.
        (
            "ZKGATE_GUARD",
            format!("{}/{}; handle={}", target.guard_kind(), target.name(), grant.handle),
        ),
        // So that the command can talk to the same zkgate instances (e.g. proclaim a new value):
        // as given, the one that answers first.
        ("ZKGATE_URL", url_list(&options.connection.urls, &api.url())),
    ]
}

/// The URLs given, comma-separated, the one that answers now (`first`) first: a command that
/// takes only the first (`${ZKGATE_URL%%,*}`) or a lone URL (`$ZKGATE_URL`) reaches zkgate.
fn url_list(urls: &[String], first: &str) -> String {
    let first = first.trim_end_matches('/');
    let others = urls
        .iter()
        .map(|u| u.trim())
        .filter(|u| u.trim_end_matches('/') != first);
    std::iter::once(first).chain(others).collect::<Vec<_>>().join(",")
}

/// Runs the command under supervision; its exit code.
async fn run_command(
    argv: &[String],
    env: &[(&str, String)],
    troubles: &mut mpsc::Receiver<Trouble>,
    signals: &mut Signals,
    grace: Duration,
    what: &str,
) -> u8 {
    let program = argv.first().map(String::as_str).unwrap_or_default();
    let mut command = match Command::spawn(argv, env) {
        Ok(command) => command,
        Err(error) => {
            eprintln!("zkgate: cannot run `{program}`: {error}");
            return command::spawn_failure_code(&error);
        }
    };
    match supervise::supervise(&mut command, troubles, signals, grace, what).await {
        Ok(status) => command::exit_code(status),
        Err(error) => fail(&format!("lost track of `{program}`: {error}")),
    }
}

/// Deletes the lease, which releases the lock before zkgate answers. A lease already gone
/// (lost, and reported) needs no word; one that could not be deleted will expire by itself.
async fn release(api: &Api, lease: &Lease) {
    match api.delete_lease(&lease.id).await {
        Ok(()) => {}
        Err(error) if error.is_gone() => {}
        Err(error) => eprintln!(
            "zkgate: could not delete lease {} (it expires within {}): {error}",
            lease.id,
            humantime::format_duration(lease.ttl())
        ),
    }
}

fn fail(message: &str) -> u8 {
    eprintln!("zkgate: {message}");
    EXIT_RUNNER_FAILED
}

fn positive_duration(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        Duration::ZERO => Err("must be above zero".to_string()),
        duration => Ok(duration),
    }
}
