//! Settings of `zkgate serve`, from flags or `ZKGATE_*` environment variables.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::recipes::leases::LeasePolicy;
use crate::time::parse_duration;

/// ZooKeeper sessions per instance unless `--zookeeper-sessions` says otherwise: a session's
/// requests are served in order, so contended locks on one session wait on each other; more
/// than four add little (BENCHMARKS.md, the compare bench's settings table).
pub const DEFAULT_ZOOKEEPER_SESSIONS: u16 = 4;

/// Options of `zkgate serve`.
#[derive(Args, Clone, Debug)]
pub struct ServeConfig {
    /// Address to listen on for HTTP.
    #[arg(long, env = "ZKGATE_LISTEN", default_value = "127.0.0.1:7070")]
    pub listen: SocketAddr,

    /// ZooKeeper connect string `host:port[,host:port...][/chroot]`. Without it zkgate starts
    /// an embedded ZooKeeper server (a child process) on a free loopback port.
    #[arg(long, env = "ZKGATE_ZOOKEEPER")]
    pub zookeeper: Option<String>,

    /// The znode under which zkgate keeps everything (`locks/`, `leases/`, ...).
    #[arg(long, env = "ZKGATE_ROOT", default_value = "/zkgate")]
    pub root: String,

    /// ZooKeeper session timeout asked for (the server may adjust it to 2..20 ticks).
    #[arg(long, env = "ZKGATE_SESSION_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub session_timeout: Duration,

    /// ZooKeeper sessions this instance opens; each lease lives on one of them. ZooKeeper
    /// serves one session's requests in order, so a single session limits how many locks a busy
    /// instance turns over (BENCHMARKS.md); losing one session ends only its own leases. With
    /// more than one, a read may briefly miss a write just made on another session when they
    /// are served by different servers of an ensemble, as with two instances.
    #[arg(long, env = "ZKGATE_ZOOKEEPER_SESSIONS", default_value_t = DEFAULT_ZOOKEEPER_SESSIONS,
          value_parser = clap::value_parser!(u16).range(1..=64))]
    pub zookeeper_sessions: u16,

    /// Threads that run zkgate's tasks (default: half the CPUs, at least one). zkgate mostly
    /// waits on ZooKeeper and the network, and every hand-off of a task between threads costs a
    /// wake-up; fewer threads leave the other CPUs to ZooKeeper (BENCHMARKS.md, the compare
    /// bench's settings table).
    #[arg(long, env = "ZKGATE_WORKER_THREADS", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub worker_threads: Option<u16>,

    /// Lease TTL when a request does not ask for one.
    #[arg(long, env = "ZKGATE_LEASE_TTL", default_value = "30s", value_parser = parse_duration)]
    pub lease_ttl: Duration,

    /// Shortest lease TTL granted; shorter requests are raised to it.
    #[arg(long, env = "ZKGATE_LEASE_TTL_MIN", default_value = "1s", value_parser = parse_duration)]
    pub lease_ttl_min: Duration,

    /// Longest lease TTL granted; longer requests are lowered to it.
    #[arg(long, env = "ZKGATE_LEASE_TTL_MAX", default_value = "1h", value_parser = parse_duration)]
    pub lease_ttl_max: Duration,

    /// Longest lock-delay a lease may ask for (`lock_delay`): how long the locks, read/write
    /// locks and permits of a lease that expired stay held by it before they are released.
    #[arg(long, env = "ZKGATE_MAX_LOCK_DELAY", default_value = "60s", value_parser = parse_duration)]
    pub max_lock_delay: Duration,

    /// Longest a blocking call (`?wait=`) may wait; longer waits are cut to it. Also the wait of
    /// a blocking call that does not give one.
    #[arg(long, env = "ZKGATE_MAX_WAIT", default_value = "60s", value_parser = parse_duration)]
    pub max_wait: Duration,

    /// Most items a queue may hold; a put beyond it answers 429. It keeps a queue's children
    /// listing well within what ZooKeeper carries in one reply.
    #[arg(long, env = "ZKGATE_QUEUE_MAX_DEPTH", default_value_t = 10_000)]
    pub queue_max_depth: usize,

    /// How many times an item is delivered (claimed) before it moves to the dead letters.
    #[arg(long, env = "ZKGATE_QUEUE_MAX_DELIVERIES", default_value_t = 5)]
    pub queue_max_deliveries: u32,

    /// How long an `Idempotency-Key` is remembered at most (a lease's creation, a queue put, a
    /// counter add, a kv transaction): a retry within it lands once; the janitor forgets the
    /// key after it.
    #[arg(long, env = "ZKGATE_IDEMPOTENCY_WINDOW", default_value = "24h", value_parser = parse_duration)]
    pub idempotency_window: Duration,

    /// How many `Idempotency-Key`s each principal's store holds (over all instances): past it
    /// the oldest are forgotten first, so that a principal's keys stay bounded at any rate
    /// (each is also charged to its quota). At most 20,000.
    #[arg(long, env = "ZKGATE_IDEMPOTENCY_KEYS", default_value_t = 10_000,
        value_parser = clap::value_parser!(u32).range(1..=crate::recipes::idempotency::MAX_KEYS_PER_PRINCIPAL as i64))]
    pub idempotency_keys: u32,

    /// How long a decided two-phase-commit transaction stays readable before the janitor
    /// removes it (its members, votes and decision with it).
    #[arg(long, env = "ZKGATE_TXN_RETENTION", default_value = "24h", value_parser = parse_duration)]
    pub txn_retention: Duration,

    /// Time between the janitor's passes (one instance of the cluster is the janitor).
    #[arg(long, env = "ZKGATE_JANITOR_INTERVAL", default_value = "1m", value_parser = parse_duration)]
    pub janitor_interval: Duration,

    /// Most znodes the janitor deletes a second.
    #[arg(long, env = "ZKGATE_JANITOR_RATE", default_value_t = 1000)]
    pub janitor_rate: u32,

    /// Largest value zkgate stores, as stored: a kv value, a queue item (with its small
    /// header), a member's data, a candidate's or proclaimed value, a transaction's payload.
    /// Larger ones answer 413 `value-too-large`. At most 896 KiB, so that a write with its
    /// bookkeeping stays under ZooKeeper's 1 MiB `jute.maxbuffer` (past it ZooKeeper drops the
    /// connection, and with it every client's requests).
    #[arg(long, env = "ZKGATE_MAX_VALUE_BYTES", default_value = "256KiB", value_parser = value_bytes)]
    pub max_value_bytes: usize,

    /// Bytes of data all of zkgate's znodes may hold (a ZooKeeper hard quota on the root, so
    /// that ZooKeeper's memory is bounded whatever the clients do); writes past it answer 507
    /// `quota-exceeded`. ZooKeeper's heap holds about four times what is stored (measured):
    /// give it at least five times this. `0`: no limit.
    #[arg(long, env = "ZKGATE_QUOTA_BYTES", default_value = "64MiB", value_parser = bytes)]
    pub quota_bytes: usize,

    /// Znodes zkgate may have in all (the same quota). `0`: no limit.
    #[arg(long, env = "ZKGATE_QUOTA_ZNODES", default_value_t = 500_000)]
    pub quota_znodes: u64,

    /// Bytes of values one principal may store (kv values, queue items, members' data,
    /// proclaimed values), over all instances. `0`: no limit.
    #[arg(long, env = "ZKGATE_QUOTA_BYTES_PER_PRINCIPAL", default_value = "32MiB", value_parser = bytes)]
    pub quota_bytes_per_principal: usize,

    /// Values one principal may store, over all instances. `0`: no limit.
    #[arg(long, env = "ZKGATE_QUOTA_ZNODES_PER_PRINCIPAL", default_value_t = 50_000)]
    pub quota_znodes_per_principal: u64,

    /// Bytes queued for one WebSocket (events and replies not yet written) before its
    /// subscriptions skip events and send a `resync` with the current state once the client
    /// reads again; replies wait for room. (`1MiB`, `256KiB` or a number of bytes.)
    #[arg(long, env = "ZKGATE_WS_SEND_BUFFER", default_value = "1MiB", value_parser = bytes)]
    pub ws_send_buffer: usize,

    /// Bytes queued over all the WebSockets of the instance: past it, events are skipped (and
    /// resynced) on every socket, so that clients that do not read cannot take the memory.
    #[arg(long, env = "ZKGATE_WS_SEND_BUDGET", default_value = "256MiB", value_parser = bytes)]
    pub ws_send_budget: usize,

    /// Largest message (and frame) a WebSocket client may send; a larger one closes the socket
    /// (code 1009) before it is buffered. Calls' bodies travel in messages, so a call with a
    /// larger body goes over HTTP (or this is raised, up to the API's 512 KiB body limit).
    #[arg(long, env = "ZKGATE_WS_MAX_MESSAGE", default_value = "64KiB", value_parser = bytes)]
    pub ws_max_message: usize,

    /// How often a WebSocket is pinged (and its socket-bound leases kept alive, at least three
    /// times per lease TTL).
    #[arg(long, env = "ZKGATE_WS_PING_INTERVAL", default_value = "15s", value_parser = parse_duration)]
    pub ws_ping_interval: Duration,

    /// A WebSocket from which nothing (not even a pong) came for this long, or whose sends
    /// have been blocked this long, is closed (code 4000).
    #[arg(long, env = "ZKGATE_WS_IDLE_TIMEOUT", default_value = "45s", value_parser = parse_duration)]
    pub ws_idle_timeout: Duration,

    /// Events each topic keeps so that a subscriber that reconnects (an SSE client's
    /// `Last-Event-ID`, a socket's `since`) resumes without the state again; a longer gap gets
    /// a `resync`.
    #[arg(long, env = "ZKGATE_EVENT_BACKLOG", default_value_t = 64, value_parser = positive)]
    pub event_backlog: usize,

    /// How long a topic stays live (with its ZooKeeper watches and recent events) after its last
    /// subscriber left, so that one that reconnects can resume; so does a queue's view (its
    /// watch) after its last taker. `0s`: not at all.
    #[arg(long, env = "ZKGATE_EVENT_LINGER", default_value = "30s", value_parser = parse_duration)]
    pub event_linger: Duration,

    /// Most topics lingering without a subscriber at once, and as many queue views without a
    /// taker; past it a topic ends with its last subscriber (and a client that comes back gets
    /// the state again), a queue's view with its last taker.
    #[arg(long, env = "ZKGATE_MAX_LINGERING_TOPICS", default_value_t = 1024)]
    pub max_lingering_topics: usize,

    /// How long a response (an event stream included) may go without the client taking any of
    /// it before the connection is closed: a client that stops reading holds nothing for long.
    #[arg(long, env = "ZKGATE_WRITE_TIMEOUT", default_value = "45s", value_parser = parse_duration)]
    pub write_timeout: Duration,

    /// Writes (requests other than GET) per second per principal, or per client address when
    /// auth is off; beyond it 429 with `Retry-After`. 0 turns the limit off.
    #[arg(long, env = "ZKGATE_WRITE_RATE", default_value_t = 1000)]
    pub write_rate: u32,

    /// Live leases one principal may hold (with auth off: the whole instance).
    #[arg(long, env = "ZKGATE_MAX_LEASES_PER_PRINCIPAL", default_value_t = 10_000)]
    pub max_leases_per_principal: usize,

    /// Contenders one principal may have queued (not yet granted) on this instance, over all
    /// locks, read/write locks and elections.
    #[arg(long, env = "ZKGATE_MAX_WAITERS_PER_PRINCIPAL", default_value_t = 1_000)]
    pub max_waiters_per_principal: usize,

    /// Contenders that may queue (not yet granted) for one lock or election through this
    /// instance.
    #[arg(long, env = "ZKGATE_MAX_WAITERS_PER_LOCK", default_value_t = 1_000)]
    pub max_waiters_per_lock: usize,

    /// WebSockets one principal may have open on this instance.
    #[arg(long, env = "ZKGATE_MAX_SOCKETS_PER_PRINCIPAL", default_value_t = 10_000)]
    pub max_sockets_per_principal: usize,

    /// WebSockets one client address may have open on this instance.
    #[arg(long, env = "ZKGATE_MAX_SOCKETS_PER_ADDRESS", default_value_t = 10_000)]
    pub max_sockets_per_address: usize,

    /// Subscriptions one principal may hold over all its sockets.
    #[arg(long, env = "ZKGATE_MAX_SUBSCRIPTIONS_PER_PRINCIPAL", default_value_t = 100_000)]
    pub max_subscriptions_per_principal: usize,

    /// Long polls (requests to an endpoint that takes `wait`) one principal may have in flight
    /// on this instance (with auth off: one client address); more answer 429.
    #[arg(long, env = "ZKGATE_MAX_LONG_POLLS_PER_PRINCIPAL", default_value_t = 1_000)]
    pub max_long_polls_per_principal: usize,

    /// Names of one kind (locks, elections, queues...) that may have series of their own in
    /// `/metrics`: those in use or used in the last two minutes, as long as there is room; the
    /// others are counted under the name `_other`, so that a new name per order cannot grow
    /// `/metrics` without end.
    #[arg(long, env = "ZKGATE_METRICS_NAMES_PER_KIND", default_value_t = crate::metrics::NAMES_PER_KIND)]
    pub metrics_names_per_kind: usize,

    /// Long polls in flight on this instance, over all principals.
    #[arg(long, env = "ZKGATE_MAX_LONG_POLLS", default_value_t = 10_000)]
    pub max_long_polls: usize,

    /// Requests doing their work at once (from their admission to their answer, or to the
    /// moment a long poll starts waiting by design); the others queue for a turn in arrival
    /// order. Writes that give something back (deletes, releases, acks, keepalives) take none.
    #[arg(long, env = "ZKGATE_MAX_IN_SERVICE", default_value_t = 64, value_parser = positive)]
    pub max_in_service: usize,

    /// How long a request may queue for its turn once the queue stands (has not emptied for
    /// `--queue-delay-interval`); one that waited longer is refused at once (503 `overloaded`,
    /// `Retry-After`) instead of being served late. `0s`: never refused, however long the wait.
    #[arg(long, env = "ZKGATE_QUEUE_DELAY_TARGET", default_value = "20ms", value_parser = parse_duration)]
    pub queue_delay_target: Duration,

    /// How long a queue may go without emptying before it counts as standing, and how long a
    /// request may wait in a burst (a queue that emptied within it): long enough for the bursts
    /// clients make (many workers taking their locks at once) to be served, short enough that
    /// under overload the refused are refused soon (BENCHMARKS.md, issue 33).
    #[arg(long, env = "ZKGATE_QUEUE_DELAY_INTERVAL", default_value = "250ms", value_parser = parse_duration)]
    pub queue_delay_interval: Duration,

    /// Origins (`https://app.example.com`) whose pages may call the API from a browser (CORS)
    /// and open its WebSockets; repeat, or separate with commas. Pages elsewhere get 403 on
    /// anything but reads.
    #[arg(long, env = "ZKGATE_CORS_ORIGIN", value_delimiter = ',')]
    pub cors_origin: Vec<String>,

    /// How long a connection may take to send a request head, from its accept and from the end
    /// of its previous response (so also how long a kept-alive connection may stay idle). A
    /// request being served (a long poll) is not cut.
    #[arg(long, env = "ZKGATE_HEADER_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub header_timeout: Duration,

    /// Connections open at once, in all (WebSockets included). Default: three quarters of the
    /// process's open-file limit (raised to its hard limit at start), at most 65536.
    #[arg(long, env = "ZKGATE_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,

    /// Connections open at once from one client address. Default: half of `--max-connections`,
    /// so that one address cannot take every connection.
    #[arg(long, env = "ZKGATE_MAX_CONNECTIONS_PER_ADDRESS")]
    pub max_connections_per_address: Option<usize>,

    /// Host names (`zkgate.internal` or `zkgate.internal:7070`) clients may reach zkgate by,
    /// besides its listen and advertised addresses, `localhost` and IP addresses; repeat, or
    /// separate with commas. A request that changes something or opens a socket with another
    /// `Host` is refused (403): a page that rebinds its own name to zkgate's address cannot
    /// act through it. `*` turns the check off.
    #[arg(long, env = "ZKGATE_ALLOWED_HOST", value_delimiter = ',')]
    pub allowed_host: Vec<String>,

    /// Serve HTTPS (and WSS) with this certificate chain (PEM); needs `--tls-key`.
    #[arg(long, env = "ZKGATE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The private key (PEM: PKCS#8, PKCS#1 or SEC1) of `--tls-cert`.
    #[arg(long, env = "ZKGATE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// The URL other zkgate instances reach this one at, to hand it requests for the leases it
    /// keeps (default: the listen address; with an unspecified address such as 0.0.0.0, this
    /// host's name).
    #[arg(long, env = "ZKGATE_ADVERTISE_URL")]
    pub advertise_url: Option<String>,

    /// A secret every instance of the deployment shares (16 characters or more): instances
    /// believe only the registrations and handed-over requests signed with it, and hand
    /// requests to each other only with it. Without it, the `--zookeeper-auth` credential
    /// serves; with neither, an instance takes a lease kept elsewhere over instead of handing
    /// the request to its keeper, and a claim made elsewhere is answered 421.
    #[arg(
        long,
        env = "ZKGATE_CLUSTER_SECRET",
        hide_env_values = true,
        value_name = "SECRET",
        value_parser = crate::peer::PeerKey::parse,
        conflicts_with = "cluster_secret_file"
    )]
    pub cluster_secret: Option<crate::peer::PeerKey>,

    /// Like `--cluster-secret`, read from this file (its first line), so that the secret is
    /// not on the command line.
    #[arg(long, env = "ZKGATE_CLUSTER_SECRET_FILE", value_name = "PATH", value_parser = crate::peer::PeerKey::read)]
    pub cluster_secret_file: Option<crate::peer::PeerKey>,

    /// Bearer tokens, principals and their grants (TOML; see the README's "Authentication").
    /// Without it everyone may do everything: fine on loopback, loudly warned about elsewhere.
    #[arg(long, env = "ZKGATE_AUTH_CONFIG")]
    pub auth_config: Option<PathBuf>,

    /// Data directory of the embedded ZooKeeper (default: a new temporary directory, removed
    /// on exit). Ignored with `--zookeeper`.
    #[arg(long, env = "ZKGATE_ZOOKEEPER_DATA_DIR")]
    pub zookeeper_data_dir: Option<PathBuf>,

    /// Digest authentication, ACLs and TLS of the ZooKeeper session (`--zookeeper-auth`, ...).
    #[command(flatten)]
    pub zookeeper_security: crate::zk::security::ZkSecurity,
}

/// A count of at least one.
fn positive(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// Parses a size: a number of bytes, or with `KiB`, `MiB`, `GiB` (or `KB`, `MB`, `GB`).
/// The largest `--max-value-bytes`: ZooKeeper's `jute.maxbuffer` (1 MiB) less room for the
/// rest of a request.
pub const MAX_VALUE_CEILING: usize = 896 * 1024;

/// `--max-value-bytes`: a size, at most [MAX_VALUE_CEILING].
pub fn value_bytes(text: &str) -> Result<usize, String> {
    let value = bytes(text)?;
    if value > MAX_VALUE_CEILING {
        return Err(format!(
            "at most {MAX_VALUE_CEILING} bytes (896KiB): ZooKeeper refuses requests over 1 MiB"
        ));
    }
    Ok(value)
}

pub fn bytes(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let digits = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let number: usize = number
        .parse()
        .map_err(|_| format!("`{text}` is not a size; write it like `65536`, `64KiB` or `1MiB`"))?;
    let scale: usize = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => return Err(format!("`{other}` is not a unit of size (KiB, MiB, GiB, KB, MB, GB)")),
    };
    number
        .checked_mul(scale)
        .ok_or_else(|| format!("`{text}` is too large"))
}

impl ServeConfig {
    /// Defaults with the given ZooKeeper connect string, listening on a free loopback port (for
    /// tests and embedding): the flags' own defaults, as `zkgate serve` has them with no flags,
    /// and no `ZKGATE_*` variable read from the environment.
    pub fn with_zookeeper(connect: &str) -> ServeConfig {
        use clap::{CommandFactory, FromArgMatches, Parser};
        #[derive(Parser)]
        struct Defaults {
            #[command(flatten)]
            serve: ServeConfig,
        }
        let matches = Defaults::command()
            .mut_args(|arg| arg.env(None))
            .try_get_matches_from(["zkgate"])
            .expect("every flag has a default");
        let mut config = Defaults::from_arg_matches(&matches)
            .expect("every flag has a default")
            .serve;
        config.listen = SocketAddr::from(([127, 0, 0, 1], 0));
        config.zookeeper = Some(connect.to_string());
        config
    }

    /// How the idempotency keys are bounded (`--idempotency-window`, `--idempotency-keys`).
    pub fn idempotency_settings(&self) -> crate::recipes::idempotency::Settings {
        crate::recipes::idempotency::Settings {
            window: self.idempotency_window,
            per_principal: self.idempotency_keys as usize,
        }
    }

    /// How the janitor works (`--janitor-interval`, `--janitor-rate`, `--idempotency-window`,
    /// `--txn-retention`).
    pub fn janitor_settings(&self) -> crate::recipes::janitor::Settings {
        crate::recipes::janitor::Settings {
            interval: self.janitor_interval,
            idempotency_window: self.idempotency_window,
            txn_retention: self.txn_retention,
            rate: self.janitor_rate,
        }
    }

    /// The runtime's worker threads: `--worker-threads`, or half the CPUs (at least one).
    pub fn worker_threads(&self) -> usize {
        match self.worker_threads {
            Some(threads) => threads.into(),
            None => std::thread::available_parallelism().map_or(1, |cpus| (cpus.get() / 2).max(1)),
        }
    }

    /// The connection limits, with the defaults derived from the open-file limit `open_files`.
    pub fn connection_limits(&self, open_files: u64) -> crate::listen::Limits {
        let max_connections = self.max_connections.unwrap_or_else(|| {
            usize::try_from(open_files / 4 * 3)
                .unwrap_or(usize::MAX)
                .clamp(64, 65_536)
        });
        crate::listen::Limits {
            header_timeout: self.header_timeout,
            write_timeout: self.write_timeout,
            max_connections,
            max_per_address: self.max_connections_per_address.unwrap_or((max_connections / 2).max(1)),
        }
    }

    pub fn limit_settings(&self) -> crate::limits::LimitSettings {
        crate::limits::LimitSettings {
            write_rate: self.write_rate,
            leases_per_principal: self.max_leases_per_principal,
            waiters_per_principal: self.max_waiters_per_principal,
            waiters_per_lock: self.max_waiters_per_lock,
            sockets_per_principal: self.max_sockets_per_principal,
            sockets_per_address: self.max_sockets_per_address,
            subscriptions_per_principal: self.max_subscriptions_per_principal,
            long_polls_per_principal: self.max_long_polls_per_principal,
            long_polls: self.max_long_polls,
        }
    }

    pub fn admission_settings(&self) -> crate::admission::AdmissionSettings {
        crate::admission::AdmissionSettings {
            slots: self.max_in_service,
            target: self.queue_delay_target,
            interval: self.queue_delay_interval,
        }
    }

    /// The quotas; `0` is no limit.
    pub fn quota_settings(&self) -> crate::recipes::usage::QuotaSettings {
        let limit = |n: u64| (n > 0).then_some(n);
        crate::recipes::usage::QuotaSettings {
            total: crate::zk::quota::Limits {
                bytes: limit(self.quota_bytes as u64),
                znodes: limit(self.quota_znodes),
            },
            per_principal: crate::zk::quota::Limits {
                bytes: limit(self.quota_bytes_per_principal as u64),
                znodes: limit(self.quota_znodes_per_principal),
            },
        }
    }

    pub fn lease_policy(&self) -> LeasePolicy {
        LeasePolicy {
            default_ttl: self.lease_ttl,
            min_ttl: self.lease_ttl_min,
            max_ttl: self.lease_ttl_max,
        }
    }

    /// The key instances trust each other with: `--cluster-secret(-file)`, else the one
    /// `--zookeeper-auth` gives; `None` with neither (then instances hand nothing over).
    pub fn peer_key(&self) -> Option<crate::peer::PeerKey> {
        self.cluster_secret
            .clone()
            .or_else(|| self.cluster_secret_file.clone())
            .or_else(|| self.zookeeper_security.peer_key())
    }

    /// `--advertise-url`, or one made from the listen address.
    pub fn advertised_url(&self) -> String {
        if let Some(url) = &self.advertise_url {
            return url.trim_end_matches('/').to_string();
        }
        let scheme = if self.tls_cert.is_some() { "https" } else { "http" };
        let host = if self.listen.ip().is_unspecified() {
            hostname().unwrap_or_else(|| "localhost".into())
        } else {
            self.listen.ip().to_string()
        };
        format!("{scheme}://{host}:{}", self.listen.port())
    }

    /// The TLS acceptor of `--tls-cert`/`--tls-key`, `None` without them.
    pub fn tls_acceptor(&self) -> Result<Option<tokio_rustls::TlsAcceptor>, String> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => crate::tls::acceptor(cert, key).map(Some),
            (None, None) => Ok(None),
            _ => Err("--tls-cert and --tls-key go together".into()),
        }
    }

    /// The principals of `--auth-config`, `None` without it.
    pub fn load_authority(&self) -> Result<Option<crate::auth::Authority>, String> {
        self.auth_config
            .as_deref()
            .map(crate::auth::Authority::load)
            .transpose()
    }

    /// Checks what clap cannot: the root path, the order of the TTL bounds, and the ZooKeeper
    /// security flags against each other and `--zookeeper`.
    pub fn validate(&self) -> Result<(), String> {
        crate::zk::names::validate_root(&self.root)?;
        self.zookeeper_security.validate(self.zookeeper.as_deref())?;
        if self.lease_ttl_min.is_zero() || self.lease_ttl_min > self.lease_ttl_max {
            return Err(format!(
                "--lease-ttl-min ({:?}) must be above zero and at most --lease-ttl-max ({:?})",
                self.lease_ttl_min, self.lease_ttl_max
            ));
        }
        Ok(())
    }
}

/// This host's name (gethostname(2)).
fn hostname() -> Option<String> {
    let mut buffer = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at most that many bytes.
    let result = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) };
    if result != 0 {
        return None;
    }
    let end = buffer.iter().position(|&b| b == 0).unwrap_or(buffer.len());
    String::from_utf8(buffer[..end].to_vec()).ok().filter(|h| !h.is_empty())
}

#[cfg(test)]
mod tests {
    use super::bytes;

    #[test]
    fn sizes() {
        assert_eq!(bytes("65536"), Ok(65536));
        assert_eq!(bytes("64KiB"), Ok(65536));
        assert_eq!(bytes("1MiB"), Ok(1 << 20));
        assert_eq!(bytes("2 MB"), Ok(2_000_000));
        assert!(bytes("lots").is_err());
        assert!(bytes("1XB").is_err());
        assert!(bytes("99999999999999999999GiB").is_err());
    }
}
