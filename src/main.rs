//! The `zkgate` command line.

use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser, Subcommand};
use tracing_subscriber::EnvFilter;
use zkgate::config::ServeConfig;
use zkgate::runner::queue::QueueArgs;
use zkgate::runner::resources::{CounterArgs, KvArgs, LeaderArgs, LeaseArgs};
use zkgate::runner::watch::WatchArgs;
use zkgate::runner::{ElectArgs, LockArgs};
use zkgate::zk::server::{ServerOptions, ZooKeeperServer};

// mimalloc rather than glibc's allocator: under load glibc's malloc and free were a tenth of
// zkgate's CPU samples (perf, compare bench), for a server that allocates small, short-lived
// buffers per request across two threads.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// ZooKeeper's coordination recipes over HTTP.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP API (with an embedded ZooKeeper unless --zookeeper is given).
    Serve(Box<ServeConfig>),
    /// Print the OpenAPI description as JSON.
    Openapi,
    /// Make a new bearer token, and the line that lists it in the `--auth-config` file.
    Token,
    /// Run a command while holding a lock, or one of N permits (-n N), of a running zkgate.
    Lock(Box<LockArgs>),
    /// Run a command while leading an election of a running zkgate.
    Elect(Box<ElectArgs>),
    /// Follow a resource's events: print each as a JSON line, or run a command for each.
    Watch(Box<WatchArgs>),
    /// Read, write, delete and list keys; run a transaction.
    Kv(Box<KvArgs>),
    /// Create, keep alive, delete and list leases.
    Lease(Box<LeaseArgs>),
    /// Add to a counter, or read it.
    Counter(Box<CounterArgs>),
    /// Print who leads an election, or wait for the next leader.
    Leader(Box<LeaderArgs>),
    /// Put items into a queue, work them off with a command, list them.
    Queue(Box<QueueArgs>),
    /// Print the shell completion script for SHELL (bash, zsh, fish, elvish, powershell).
    Completions { shell: clap_complete::Shell },
    /// Print the manual page (roff: `zkgate man | man -l -`), or write it and one page a
    /// subcommand into DIR.
    Man { dir: Option<std::path::PathBuf> },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let workers = match &cli.command {
        Command::Serve(config) => config.worker_threads(),
        // The runners wait on one lease and one command: one thread is plenty.
        _ => 1,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build();
    match runtime {
        Ok(runtime) => runtime.block_on(run(cli)),
        Err(err) => {
            eprintln!("zkgate: cannot start the async runtime: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> ExitCode {
    zkgate::install_crypto_provider();
    let result = match cli.command {
        Command::Serve(config) => {
            init_logging();
            serve(*config).await
        }
        Command::Openapi => zkgate::openapi()
            .to_pretty_json()
            .map(|json| println!("{json}"))
            .map_err(|e| e.to_string()),
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "zkgate", &mut script);
            std::io::Write::write_all(&mut std::io::stdout().lock(), &script)
                .map_err(|e| format!("cannot write the script: {e}"))
        }
        Command::Man { dir } => manual(dir.as_deref()).map_err(|e| format!("cannot write the manual: {e}")),
        Command::Token => {
            let (token, hash) = zkgate::auth::new_token();
            println!("{token}");
            eprintln!("give the token above to the client; list it in --auth-config as:\n  tokens = [\"{hash}\"]");
            Ok(())
        }
        // The runners log nothing: the command's output is theirs, and their own messages are
        // one-line `zkgate: ...` notices on stderr. Their exit code is the command's.
        Command::Lock(args) => return ExitCode::from(zkgate::runner::lock(*args).await),
        Command::Elect(args) => return ExitCode::from(zkgate::runner::elect(*args).await),
        Command::Watch(args) => return ExitCode::from(zkgate::runner::watch::watch(*args).await),
        Command::Kv(args) => return ExitCode::from(zkgate::runner::resources::kv(*args).await),
        Command::Lease(args) => return ExitCode::from(zkgate::runner::resources::lease(*args).await),
        Command::Counter(args) => return ExitCode::from(zkgate::runner::resources::counter(*args).await),
        Command::Leader(args) => return ExitCode::from(zkgate::runner::resources::leader(*args).await),
        Command::Queue(args) => return ExitCode::from(zkgate::runner::queue::queue(*args).await),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("zkgate: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The manual pages, from the same definitions as `--help`: `zkgate.1` on stdout, or in `dir`
/// with one page a subcommand beside it (`zkgate-lock.1`: its options and the exit statuses
/// its long help says), as git's are.
fn manual(dir: Option<&std::path::Path>) -> std::io::Result<()> {
    let cli = Cli::command();
    let Some(dir) = dir else {
        return clap_mangen::Man::new(cli).render(&mut std::io::stdout().lock());
    };
    std::fs::create_dir_all(dir)?;
    let mut page = Vec::new();
    clap_mangen::Man::new(cli.clone()).render(&mut page)?;
    std::fs::write(dir.join("zkgate.1"), page)?;
    for sub in cli.get_subcommands().filter(|sub| sub.get_name() != "help") {
        let name = format!("zkgate-{}", sub.get_name());
        let mut page = Vec::new();
        let bin_name = format!("zkgate {}", sub.get_name());
        clap_mangen::Man::new(sub.clone().name(name.clone()).bin_name(bin_name))
            .title(name.clone())
            .render(&mut page)?;
        std::fs::write(dir.join(format!("{name}.1")), page)?;
    }
    Ok(())
}

fn init_logging() {
    tracing_subscriber::fmt()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .with_env_filter(
            EnvFilter::try_from_env("ZKGATE_LOG").unwrap_or_else(|_| EnvFilter::new("info,zookeeper_client=error")),
        )
        .init();
}

async fn serve(mut config: ServeConfig) -> Result<(), String> {
    config.validate()?;
    config.tls_acceptor()?;
    log_authentication(&config)?;
    config.zookeeper_security.log_summary();
    // Kept alive until the end of `serve`: dropping it stops the embedded ZooKeeper.
    let _embedded = match &config.zookeeper {
        Some(_) => None,
        None => Some(start_embedded(&mut config).await?),
    };
    let running = zkgate::start(config.clone())
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    if running
        .state
        .zk()
        .wait_connected(Duration::from_secs(15))
        .await
        .is_err()
    {
        tracing::warn!("ZooKeeper not connected yet; answering 503 until it is");
    } else if tokio::time::timeout(Duration::from_secs(15), running.state.wait_ready())
        .await
        .is_err()
    {
        // Ready (and "serving") means registered too (other instances can hand requests to
        // it), keeping leases, and the leases of instances gone meanwhile taken over or ended.
        tracing::warn!("not ready yet; /readyz answers 503 until it is");
    }
    zkgate::metrics::probe_runtime(tokio::runtime::Handle::current(), running.state.shutdown.clone());
    tracing::info!(url = %running.url(), docs = %format!("{}/docs", running.url()), "zkgate serving");
    shutdown_signal().await;
    tracing::info!(
        "shutting down: closing sockets, handing leases over to the other instances (a second signal exits at once)"
    );
    tokio::select! {
        stopped = running.stop() => stopped.map_err(|e| e.to_string()),
        _ = shutdown_signal() => {
            tracing::warn!("second signal: exiting without finishing the shutdown");
            // The embedded ZooKeeper (if any) dies with us (PR_SET_PDEATHSIG).
            std::process::exit(1);
        }
    }
}

/// Says whether requests are authenticated, and warns where they are not, or where tokens
/// cross the network in clear text.
fn log_authentication(config: &ServeConfig) -> Result<(), String> {
    // Checked (read and parsed) first: a bad file stops `serve` here.
    match config.load_authority()?.and(config.auth_config.as_deref()) {
        Some(path) => tracing::info!("authentication on: bearer tokens from {}", path.display()),
        None if config.listen.ip().is_loopback() => {
            tracing::info!(
                "authentication off (no --auth-config): anyone who can reach {} may do anything",
                config.listen
            )
        }
        None => warn_open_to_the_network(config),
    }
    if config.auth_config.is_some() && config.tls_cert.is_none() && !config.listen.ip().is_loopback() {
        tracing::warn!(
            "bearer tokens will cross the network in clear text: serve HTTPS with --tls-cert/--tls-key \
             or put a TLS-terminating proxy in front"
        );
    }
    Ok(())
}

/// Starts the embedded ZooKeeper (no `--zookeeper` given) and points `config` at it.
async fn start_embedded(config: &mut ServeConfig) -> Result<ZooKeeperServer, String> {
    let options = ServerOptions {
        data_dir: config.zookeeper_data_dir.clone(),
        ..ServerOptions::default()
    };
    let server = ZooKeeperServer::start_standalone(&options)
        .await
        .map_err(|e| e.to_string())?;
    tracing::info!(
        connect = %server.connect_string(),
        data_dir = %server.data_dir().display(),
        log = %server.log_path().display(),
        "embedded ZooKeeper started"
    );
    config.zookeeper = Some(server.connect_string());
    Ok(server)
}

/// Listening beyond loopback without tokens: say so where nobody can miss it.
fn warn_open_to_the_network(config: &ServeConfig) {
    let line = "!".repeat(78);
    tracing::warn!("{line}");
    tracing::warn!(
        "AUTHENTICATION IS OFF and zkgate listens on {}: anyone who can reach it may take, \
         release and revoke every lock, read and write every value. Pass --auth-config \
         (see `zkgate token`) or listen on 127.0.0.1.",
        config.listen
    );
    tracing::warn!("{line}");
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => {
            let _ = ctrl_c.await;
            return;
        }
    };
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
}
