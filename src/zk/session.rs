//! The ZooKeeper session supervisor, and the instance's set of sessions ([Lanes]).
//!
//! Every recipe borrows the current [Client] from here. The supervisor connects (retrying while
//! ZooKeeper is unreachable), makes sure the chroot and the root znode exist, follows the
//! session's state and, when the session ends (`Expired`, `Closed`, `AuthFailed`), builds a new
//! client. Each client gets a new *generation* number; a session's end takes its watches and
//! its ephemeral znodes (the instance's registration, the janitor's and the reaper's nodes,
//! queue claims) with it, and whoever relied on them starts again on the next generation. What
//! leases hold is persistent (`recipes::engine::lease`): a session's end ends no lease.
//! ZooKeeper, not zkgate, decides when a session is gone.
//!
//! Every session is built with the settings of [ZkSecurity] (digest authentication, TLS), so a
//! new session after an expiry authenticates again before it creates anything.
//!
//! # Why an instance has several sessions
//! ZooKeeper serves one session's requests strictly in order, and a session's read waits for
//! its own writes in flight to commit. With every lock of a busy instance on one session, the
//! locks wait for each other at ZooKeeper although they have nothing in common (BENCHMARKS.md
//! has the figures). So an instance opens `--zookeeper-sessions` supervised sessions, its
//! *lanes*, and each lease it keeps writes through one of them, so that one lease's requests
//! keep their order. The first lane is the instance's *primary* session: it registers the
//! instance, beats its heartbeat and serves everything that is not a lease's (reads, queues,
//! event topics).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use zookeeper_client::{Client, CreateMode, SessionInfo, SessionState};

use super::acl::AclPolicy;
use super::security::{ConnectError, ZkSecurity};
use super::sync::Syncs;

/// What a caller sees of the connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Connection {
    /// No session yet: connecting for the first time or after an expiry.
    #[default]
    Connecting,
    /// The session is connected to a server.
    Connected,
    /// The session lives but its connection dropped; the client is reconnecting.
    Disconnected,
}

/// The supervisor's view, published on a watch channel.
#[derive(Clone, Default)]
pub struct Status {
    /// The current client, if a session has been established.
    pub client: Option<Client>,
    /// The `sync`s of that client's linearizable reads ([super::sync]).
    pub syncs: Arc<Syncs>,
    /// Incremented with every new session; 0 before the first one.
    pub generation: u64,
    pub connection: Connection,
    /// How many times a connection has been established, over all sessions: a watcher that
    /// missed a brief disconnection (watch channels keep only the latest status) still sees
    /// that it reconnected.
    pub connects: u64,
}

impl Status {
    /// Whether a session is established and its connection up.
    pub fn is_connected(&self) -> bool {
        self.client.is_some() && self.connection == Connection::Connected
    }

    /// The current session's id, if a session is established.
    pub fn session_id(&self) -> Option<i64> {
        self.client.as_ref().map(|c| c.session_id().0)
    }
}

/// A borrowed client, with the generation of the session it belongs to.
#[derive(Clone)]
pub struct Session {
    client: Client,
    pub generation: u64,
    syncs: Arc<Syncs>,
}

impl Session {
    /// The session's ZooKeeper client, for the recipes and what sits below them. The edges
    /// (`http/`, `ws/`, `runner/`) hand the whole session to a recipe and never ask for its
    /// client (`tests/it/layers.rs`): what they do with ZooKeeper is a recipe's business.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Waits until this session's server has caught up with every write acknowledged before
    /// the call, by anyone on any server, so that a read on [Session::client] after it is
    /// linearizable (see [super::sync]: a transaction that changes nothing, not ZooKeeper's
    /// `sync`; concurrent callers share them). Retried on a connection loss: a barrier is safe
    /// to repeat.
    pub async fn sync(&self) -> Result<(), super::Failure> {
        Ok(super::retry_on_loss(|| self.syncs.sync(&self.client)).await?)
    }

    /// How many barriers this session has sent.
    pub fn syncs_sent(&self) -> u64 {
        self.syncs.sent()
    }

    /// Whether this session's barriers are transactions (on an ensemble) or `sync`s (on a
    /// standalone server): `None` before the first.
    pub fn barriers_are_transactions(&self) -> Option<bool> {
        self.syncs.transactions()
    }
}

/// Errors of [ZkSession::current].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    #[error("ZooKeeper is not reachable (no session yet)")]
    NoSession,
    #[error("ZooKeeper is not reachable (connection lost; reconnecting)")]
    Disconnected,
}

/// Handle to the supervisor; cheap to clone. The supervisor stops when [ZkSession::shutdown] is
/// called, and its session closes when the last client clone is dropped.
#[derive(Clone)]
pub struct ZkSession {
    /// Which of the instance's [Lanes] this is (0: the primary).
    lane: usize,
    status: watch::Receiver<Status>,
    stop: CancellationToken,
    hosts: Arc<str>,
    session_timeout: Duration,
}

impl ZkSession {
    /// Starts supervising a session to `connect` (`host:port,...[/chroot]`) with `security`,
    /// creating `root` (and the chroot) if missing. Returns at once; see
    /// [ZkSession::wait_connected].
    ///
    /// It also installs the ACL policy that `security` calls for as the process's (see
    /// [super::acl]): every znode created from then on, by any session of the process, gets
    /// it. If the process already has another policy, this session never connects (and says
    /// why in the log) rather than create znodes with an ACL it was not configured for.
    pub fn start(connect: &str, root: &str, session_timeout: Duration, security: ZkSecurity) -> ZkSession {
        ZkSession::start_lane(connect, root, session_timeout, security, 0)
    }

    /// [ZkSession::start] for lane `lane` of the instance's [Lanes] (which its log lines name).
    fn start_lane(
        connect: &str,
        root: &str,
        session_timeout: Duration,
        security: ZkSecurity,
        lane: usize,
    ) -> ZkSession {
        let installed_acl_policy = super::acl::install(security.acl_policy()).err();
        let (hosts, chroot) = split_chroot(connect);
        let (sender, status) = watch::channel(Status::default());
        let stop = CancellationToken::new();
        let supervisor = Supervisor {
            lane,
            hosts: hosts.to_string(),
            chroot: chroot.map(str::to_string),
            root: root.to_string(),
            session_timeout,
            security,
            installed_acl_policy,
            status: sender,
        };
        tokio::spawn(supervisor.run(stop.clone()));
        ZkSession {
            lane,
            status,
            stop,
            hosts: hosts.into(),
            session_timeout,
        }
    }

    /// Which of the instance's lanes this session is (0: the primary).
    pub fn lane(&self) -> usize {
        self.lane
    }

    /// The current session if it is connected.
    ///
    /// # Notable errors
    /// * [Unavailable::NoSession] before the first session and between an expiry and the next.
    /// * [Unavailable::Disconnected] while the session's connection is down.
    pub fn current(&self) -> Result<Session, Unavailable> {
        let status = self.status.borrow();
        match (&status.client, status.connection) {
            (Some(client), Connection::Connected) => Ok(Session {
                client: client.clone(),
                generation: status.generation,
                syncs: status.syncs.clone(),
            }),
            (_, Connection::Disconnected) => Err(Unavailable::Disconnected),
            _ => Err(Unavailable::NoSession),
        }
    }

    /// The current session, waiting out a dropped connection: a session whose connection is
    /// down is still alive for up to its timeout, and its client is reconnecting (to another
    /// server of the ensemble, say). Fails if no session is connected within that time.
    pub async fn connected(&self) -> Result<Session, Unavailable> {
        match self.current() {
            Err(Unavailable::Disconnected) => self.wait_connected(self.session_timeout).await,
            result => result,
        }
    }

    /// A receiver of every status change. Its first `changed()` may return at once, for a
    /// change made before this call: read it with `borrow_and_update` (or `wait_for`) before
    /// waiting. To wait for a session, use [ZkSession::next_session].
    pub fn subscribe(&self) -> watch::Receiver<Status> {
        self.status.clone()
    }

    /// Waits, for as long as it takes and without polling, for a connected session other than
    /// the one of generation `not` (one its caller found ended: its client fails every request
    /// at once until the supervisor publishes the next). `None` once the supervisor has stopped
    /// (the instance is shutting down).
    ///
    /// This is the one way a task waits for ZooKeeper. `wait_for` looks at the current status
    /// before it waits, so a session published between a caller's failed request and this call
    /// is seen; waiting with `changed()` on a fresh receiver instead returns at once for a
    /// change the receiver had not seen, and a loop around it spins a core for as long as
    /// ZooKeeper is away (issue 53 measured 35% of a core through a 40 s outage).
    pub async fn next_session(&self, not: Option<u64>) -> Option<Session> {
        let mut status = self.status.clone();
        loop {
            if let Ok(session) = self.current()
                && Some(session.generation) != not
            {
                return Some(session);
            }
            status
                .wait_for(|s| s.is_connected() && Some(s.generation) != not)
                .await
                .ok()?;
        }
    }

    pub fn status(&self) -> Status {
        self.status.borrow().clone()
    }

    /// What `read` finds in the status, read in place (nothing cloned: a probe asks often).
    pub fn peek<T>(&self, read: impl FnOnce(&Status) -> T) -> T {
        read(&self.status.borrow())
    }

    /// The servers this instance talks to, without the chroot.
    pub fn hosts(&self) -> &str {
        &self.hosts
    }

    /// The session's id and password (for tests that expire the session from outside).
    pub fn session_info(&self) -> Option<SessionInfo> {
        self.status.borrow().client.as_ref().map(|c| c.session().clone())
    }

    /// Waits until a session is connected, or `limit` passes.
    pub async fn wait_connected(&self, limit: Duration) -> Result<Session, Unavailable> {
        let mut status = self.status.clone();
        let wait = status.wait_for(|s| s.client.is_some() && s.connection == Connection::Connected);
        let _ = tokio::time::timeout(limit, wait).await;
        self.current()
    }

    /// Stops the supervisor; the session closes once the recipes drop their clients.
    pub fn shutdown(&self) {
        self.stop.cancel();
    }
}

struct Supervisor {
    lane: usize,
    hosts: String,
    chroot: Option<String>,
    root: String,
    session_timeout: Duration,
    security: ZkSecurity,
    /// The process's ACL policy when it differs from this session's: it then never connects.
    installed_acl_policy: Option<AclPolicy>,
    status: watch::Sender<Status>,
}

impl Supervisor {
    async fn run(self, stop: CancellationToken) {
        let mut generation = 0;
        loop {
            let client = tokio::select! {
                client = self.connect_until_ready() => client,
                _ = stop.cancelled() => return,
            };
            generation += 1;
            tracing::info!(
                lane = self.lane,
                generation,
                session_id = %client.session_id(),
                timeout = ?client.session_timeout(),
                "ZooKeeper session established"
            );
            let mut states = client.state_watcher();
            self.disable_nagle();
            self.publish(Some(client), generation, Connection::Connected);
            loop {
                let state = tokio::select! {
                    state = states.changed() => state,
                    _ = stop.cancelled() => {
                        self.publish(None, generation, Connection::Connecting);
                        return;
                    }
                };
                match state {
                    SessionState::SyncConnected | SessionState::ConnectedReadOnly => {
                        // A reconnection is a new socket.
                        self.disable_nagle();
                        self.set_connection(Connection::Connected)
                    }
                    SessionState::Disconnected => {
                        tracing::warn!(lane = self.lane, generation, "ZooKeeper connection lost; reconnecting");
                        self.set_connection(Connection::Disconnected)
                    }
                    SessionState::Expired | SessionState::Closed | SessionState::AuthFailed => {
                        tracing::warn!(
                            lane = self.lane,
                            generation,
                            ?state,
                            "ZooKeeper session ended; starting a new one"
                        );
                        break;
                    }
                }
            }
            // Dropping the client with the status makes the old session unusable to callers.
            self.publish(None, generation, Connection::Connecting);
        }
    }

    /// See [super::nodelay]: zookeeper-client leaves Nagle's algorithm on.
    fn disable_nagle(&self) {
        let changed = super::nodelay::disable_nagle_towards(&super::nodelay::server_ports(&self.hosts));
        tracing::debug!(
            lane = self.lane,
            sockets = changed,
            "TCP_NODELAY set on ZooKeeper connections"
        );
    }

    fn publish(&self, client: Option<Client>, generation: u64, connection: Connection) {
        self.status.send_modify(|s| {
            if connection == Connection::Connected {
                s.connects += 1;
            }
            if client.is_some() {
                // A new client's reads share only its own `sync`s.
                s.syncs = Arc::default();
            }
            s.client = client;
            s.generation = generation;
            s.connection = connection;
        });
    }

    fn set_connection(&self, connection: Connection) {
        self.status.send_modify(|s| {
            if connection == Connection::Connected && s.connection != Connection::Connected {
                s.connects += 1;
            }
            s.connection = connection;
        });
    }

    /// Connects, creating the chroot and the root, retrying until it works ([super::reconnect]).
    async fn connect_until_ready(&self) -> Client {
        super::reconnect::until_connected(self.lane, &self.hosts, || self.connect_once()).await
    }

    async fn connect_once(&self) -> Result<Client, ConnectError> {
        if let Some(installed) = self.installed_acl_policy {
            let wanted = self.security.acl_policy();
            return Err(ConnectError::AclConflict { installed, wanted });
        }
        let connector = Client::connector()
            .with_session_timeout(self.session_timeout)
            .with_fail_eagerly();
        let client = self.security.connect(connector, &self.hosts).await?;
        let client = match &self.chroot {
            Some(chroot) => {
                ensure_path(&client, chroot).await?;
                client
                    .chroot(chroot.as_str())
                    .map_err(|_| zookeeper_client::Error::BadArguments(&"bad chroot"))?
            }
            None => client,
        };
        ensure_path(&client, &self.root).await?;
        // A root that another identity created with its own ACL (an instance given
        // --zookeeper-auth, and this one not) would fail every request: say so here instead.
        if let Err(zookeeper_client::Error::NoAuth) = client.get_data(&self.root).await {
            return Err(ConnectError::RootDenied(self.root.clone()));
        }
        Ok(client)
    }
}

/// The sessions of one instance: the primary and the other lanes (see the module's docs), and
/// the keeper's session apart ([Apart]). Cheap to clone.
#[derive(Clone)]
pub struct Lanes {
    sessions: Arc<[ZkSession]>,
    /// Where the next lease's lane is looked for (round robin).
    next: Arc<std::sync::atomic::AtomicUsize>,
    keeper: Apart,
}

/// A session with a thread of its own: what lets an instance vouch for the leases it keeps
/// (its registration as a keeper, its heartbeat, the notices of takeovers; see
/// [crate::recipes::leases::keeping]) runs here, so that request traffic cannot delay it.
///
/// # Why apart
/// Under load, or in a container throttled at its CPU limit, a heartbeat on the primary session
/// waited twice: at ZooKeeper, which serves a session's requests in order, behind every read
/// and write of that session; and in the process, behind every ready task of the request
/// workers, which at saturation is most of a second per turn. Past [crate::recipes::leases::FRESH]
/// (3 s) without an answered heartbeat an instance must stop vouching, and it did exactly when
/// it was busiest (issue 41: 710 answers `cannot vouch` against 217 served, one instance at
/// nice 19 beside three CPU hogs). Here the heartbeat is the session's only traffic, and the
/// thread (a current-thread runtime that runs the supervisor, zookeeper-client's session task
/// and the keeper's tasks) is asleep but for a heartbeat a second: woken by its timer or its
/// reply, the scheduler runs it before the busy workers of its own process, so what the
/// instance's CPU share delays is milliseconds, not seconds.
#[derive(Clone)]
pub struct Apart {
    pub session: ZkSession,
    /// The runtime of the session's thread, to run the tasks that depend on nothing else.
    pub runtime: tokio::runtime::Handle,
}

impl Apart {
    /// Starts the session on a thread named `thread`, which lives as long as the process (a
    /// stopped session must still be closed on it, and an idle thread costs nothing).
    fn start(connect: &str, root: &str, session_timeout: Duration, security: ZkSecurity, lane: usize) -> Apart {
        let (sender, started) = std::sync::mpsc::channel();
        let (connect, root) = (connect.to_string(), root.to_string());
        let thread = std::thread::Builder::new().name("zk-keeper".into()).spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime,
                Err(err) => {
                    let _ = sender.send(Err(err));
                    return;
                }
            };
            runtime.block_on(async move {
                let session = ZkSession::start_lane(&connect, &root, session_timeout, security, lane);
                let _ = sender.send(Ok(Apart {
                    session,
                    runtime: tokio::runtime::Handle::current(),
                }));
                std::future::pending::<()>().await
            })
        });
        let started = thread
            .map_err(|err| err.to_string())
            .and_then(|_| started.recv().map_err(|err| err.to_string()))
            .and_then(|apart| apart.map_err(|err| err.to_string()));
        // Without a thread there is no heartbeat: nothing could be vouched for.
        started.unwrap_or_else(|err| panic!("cannot start the keeper's session thread: {err}"))
    }
}

impl Lanes {
    /// `primary`, `count - 1` more sessions like it, and the keeper's session apart (lane
    /// `count` in the log).
    pub fn start(
        primary: ZkSession,
        connect: &str,
        root: &str,
        session_timeout: Duration,
        security: &ZkSecurity,
        count: usize,
    ) -> Lanes {
        let others =
            (1..count.max(1)).map(|lane| ZkSession::start_lane(connect, root, session_timeout, security.clone(), lane));
        let sessions: Arc<[ZkSession]> = std::iter::once(primary).chain(others).collect();
        let keeper = Apart::start(connect, root, session_timeout, security.clone(), sessions.len());
        Lanes {
            sessions,
            next: Arc::default(),
            keeper,
        }
    }

    /// The keeper's session, apart from the lanes.
    pub fn keeper(&self) -> &Apart {
        &self.keeper
    }

    pub fn primary(&self) -> &ZkSession {
        &self.sessions[0]
    }

    pub fn all(&self) -> &[ZkSession] {
        &self.sessions
    }

    /// The lane for a new lease with its current session: the next connected one, round robin,
    /// so that leases spread evenly and a lane without a session gets none. If none is
    /// connected, the primary's error.
    pub fn pick(&self) -> Result<(&ZkSession, Session), Unavailable> {
        let start = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let count = self.sessions.len();
        (0..count)
            .map(|i| &self.sessions[(start + i) % count])
            .find_map(|lane| lane.current().ok().map(|session| (lane, session)))
            .ok_or_else(|| self.primary().current().err().unwrap_or(Unavailable::NoSession))
    }

    /// Stops every lane's supervisor, and the keeper's.
    pub fn shutdown(&self) {
        self.sessions.iter().for_each(ZkSession::shutdown);
        self.keeper.session.shutdown();
    }
}

/// Creates `path` and its missing ancestors as persistent znodes.
pub async fn ensure_path(client: &Client, path: &str) -> Result<(), zookeeper_client::Error> {
    match client
        .mkdir(path, &CreateMode::Persistent.with_acls(super::acls()))
        .await
    {
        Ok(()) | Err(zookeeper_client::Error::NodeExists) => Ok(()),
        Err(err) => Err(err),
    }
}

/// Splits `host:port,host:port/chroot` into hosts and chroot (`None` for none or `/`).
pub fn split_chroot(connect: &str) -> (&str, Option<&str>) {
    match connect.find('/') {
        Some(i) if connect.len() > i + 1 => (&connect[..i], Some(connect[i..].trim_end_matches('/'))),
        Some(i) => (&connect[..i], None),
        None => (connect, None),
    }
}

impl From<Unavailable> for crate::problem::ApiError {
    fn from(err: Unavailable) -> crate::problem::ApiError {
        crate::problem::ApiError::unavailable(err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::split_chroot;

    #[test]
    fn chroot_is_split_from_hosts() {
        assert_eq!(split_chroot("a:1,b:2"), ("a:1,b:2", None));
        assert_eq!(split_chroot("a:1,b:2/"), ("a:1,b:2", None));
        assert_eq!(split_chroot("a:1/apps/x"), ("a:1", Some("/apps/x")));
        assert_eq!(split_chroot("a:1/apps/x/"), ("a:1", Some("/apps/x")));
    }
}
