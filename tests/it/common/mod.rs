//! The test harness: real ZooKeeper servers on free loopback ports, zkgate instances running
//! in-process on real sockets, an HTTP client, and fault helpers (session expiry).
//!
//! Nothing here mocks ZooKeeper. Servers and instances stop when their handles drop.

pub mod checker;
pub mod java;
pub mod linearizability;
pub mod options;
pub mod process;
pub mod proxy;
pub mod sse;
pub mod tls;
pub mod ws;

use std::collections::BTreeMap;
use std::time::Duration;

pub use options::test_server_options;
use reqwest::{Method, StatusCode};
use serde_json::Value;
use zkgate::config::ServeConfig;
use zkgate::zk::server::{ServerOptions, ZooKeeperServer};
use zookeeper_client::{Client, SessionInfo};

/// The environment variable that names the run's shared ZooKeeper server (`host:port`);
/// `scripts/test.sh` starts one (`examples/test_zookeeper.rs`) and sets it.
pub const SHARED_ZOOKEEPER: &str = "ZKGATE_TEST_ZOOKEEPER";

/// A ZooKeeper for one test: a root of its own on the run's shared server, or (without one)
/// a standalone server of its own. Either way the test sees a ZooKeeper that holds nothing
/// but what it writes. Tests that need the server itself (server-wide figures, its process,
/// a fault of the server) take [zookeeper_own] instead.
pub enum TestZooKeeper {
    Shared { hosts: String, chroot: String },
    Own(ZooKeeperServer),
}

impl TestZooKeeper {
    /// The connect string, with the test's chroot on a shared server.
    pub fn connect_string(&self) -> String {
        match self {
            TestZooKeeper::Shared { hosts, chroot } => format!("{hosts}{chroot}"),
            TestZooKeeper::Own(server) => server.connect_string(),
        }
    }
}

/// A ZooKeeper for one test (see [TestZooKeeper]), serving when this returns.
pub async fn zookeeper() -> TestZooKeeper {
    let Ok(hosts) = std::env::var(SHARED_ZOOKEEPER) else {
        return TestZooKeeper::Own(zookeeper_own().await);
    };
    // Unique on the server: nextest runs each test in a process of its own.
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let chroot = format!("/t/{}-{nanos}-{n}", std::process::id());
    // Made here, not by zkgate: a peer (a ZooKeeper client, Curator, kazoo) that connects
    // first needs it to exist.
    let client = zk_client(&hosts).await;
    let persistent = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    for path in ["/t", chroot.as_str()] {
        match client.create(path, &[], &persistent).await {
            Ok(_) | Err(zookeeper_client::Error::NodeExists) => {}
            Err(e) => panic!("cannot make the test's root {path}: {e}"),
        }
    }
    TestZooKeeper::Shared { hosts, chroot }
}

/// A standalone ZooKeeper server of the test's own, serving when this returns: for tests
/// that read server-wide figures (`mntr`, `wchp`), its whole tree, its process, or fault it.
pub async fn zookeeper_own() -> ZooKeeperServer {
    ZooKeeperServer::start_standalone(&test_server_options())
        .await
        .expect("start ZooKeeper")
}

/// A 3-server ensemble on loopback, serving (a quorum answers) when this returns.
pub struct Ensemble {
    pub servers: Vec<ZooKeeperServer>,
    pub options: ServerOptions,
}

impl Ensemble {
    pub async fn start(size: u32) -> Ensemble {
        let options = test_server_options();
        let servers = ZooKeeperServer::start_ensemble(&options, size)
            .await
            .expect("the ensemble starts");
        Ensemble { servers, options }
    }

    /// The index of the member that is the quorum's leader, by asking each (`srvr`).
    pub async fn leader(&self) -> Option<usize> {
        for (i, server) in self.servers.iter().enumerate() {
            if server_mode(server.client_port()).await.as_deref() == Some("leader") {
                return Some(i);
            }
        }
        None
    }

    /// `host:port,host:port,...` of every member.
    pub fn connect_string(&self) -> String {
        self.servers
            .iter()
            .map(|s| s.connect_string())
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// A zkgate instance on a free port, with an HTTP client.
pub struct Gate {
    pub running: zkgate::Running,
    pub url: String,
    pub http: reqwest::Client,
}

/// Config for a test instance against `connect`: short session timeout, 1 s minimum TTL.
pub fn test_config(connect: &str) -> ServeConfig {
    let mut config = ServeConfig::with_zookeeper(connect);
    config.session_timeout = Duration::from_secs(4);
    config.lease_ttl_min = Duration::from_millis(500);
    config.max_wait = Duration::from_secs(30);
    // Tests drive instances hard from one address; tests/it/limits.rs turns it on.
    config.write_rate = 0;
    // Tests fire bursts of thousands of requests at once on a busy machine, which may take
    // longer than the burst's allowance to serve; tests/it/limits.rs sheds on purpose.
    config.queue_delay_target = Duration::ZERO;
    // Instances of one test trust each other (tests/it/peers.rs tries them without it).
    config.cluster_secret = Some(zkgate::peer::PeerKey::parse(TEST_CLUSTER_SECRET).expect("secret"));
    config
}

/// A grant of every kind, on names under `prefix`, with `access` (`read` or `write`), as
/// `--auth-config` writes it.
pub fn grant(prefix: &str, access: &str) -> String {
    format!("[[principals.grants]]\nkinds = [\"*\"]\nprefixes = [\"{prefix}\"]\naccess = \"{access}\"\n")
}

/// The admin's line of a principal in `--auth-config`.
pub const ADMIN: &str = "admin = true\n";

/// An `--auth-config` file in `dir` listing `principals` (name, then its `admin` line and
/// grants), each with a new token: the file and the tokens, in order.
pub fn auth_config<const N: usize>(
    dir: &tempfile::TempDir,
    principals: [(&str, String); N],
) -> (std::path::PathBuf, [String; N]) {
    let mut text = String::new();
    let tokens = principals.map(|(name, rest)| {
        let (token, hash) = zkgate::auth::new_token();
        text.push_str(&format!(
            "[[principals]]\nname = \"{name}\"\ntokens = [\"{hash}\"]\n{rest}\n"
        ));
        token
    });
    let path = dir.path().join("auth.toml");
    std::fs::write(&path, text).expect("write the auth config");
    (path, tokens)
}

/// The `--cluster-secret` of [test_config].
pub const TEST_CLUSTER_SECRET: &str = "the test deployment's secret";

impl Gate {
    pub async fn start(connect: &str) -> Gate {
        Gate::start_with(test_config(connect)).await
    }

    pub async fn start_with(config: ServeConfig) -> Gate {
        let running = zkgate::start(config).await.expect("start zkgate");
        // Every session (lane), so that leases spread over them as they do in a running service.
        for lane in running.state.lanes.all() {
            lane.wait_connected(Duration::from_secs(20))
                .await
                .expect("zkgate connects to ZooKeeper");
        }
        // Ready: registered (other instances can hand requests to it), its heartbeat answered
        // (it can keep leases), the leases of instances gone before it taken over.
        within(Duration::from_secs(20), "zkgate is ready", running.state.wait_ready()).await;
        let url = running.url();
        let http = http_builder().pool_max_idle_per_host(64).build().expect("http client");
        Gate { running, url, http }
    }

    /// Sends a request; the body is JSON when given.
    pub async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Reply {
        self.call_as(None, method, path, body).await
    }

    /// Sends a request with `Authorization: Bearer <token>` when a token is given.
    pub async fn call_as(&self, token: Option<&str>, method: Method, path: &str, body: Option<Value>) -> Reply {
        let mut request = self.http.request(method, format!("{}{}", self.url, path));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .expect("HTTP request");
        Reply::read(response).await
    }

    pub async fn post(&self, path: &str, body: Option<Value>) -> Reply {
        self.call(Method::POST, path, body).await
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.call(Method::GET, path, None).await
    }

    pub async fn delete(&self, path: &str) -> Reply {
        self.call(Method::DELETE, path, None).await
    }

    /// Creates a lease with `ttl` and returns its id.
    pub async fn lease(&self, ttl: &str) -> String {
        let reply = self.post("/v1/leases", Some(serde_json::json!({ "ttl": ttl }))).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
        reply.str("id")
    }

    /// `POST /v1/locks/{lock}/acquire?{query}` with the lease.
    pub async fn acquire(&self, lock: &str, lease: &str, query: &str) -> Reply {
        self.post(
            &format!("/v1/locks/{lock}/acquire?{query}"),
            Some(serde_json::json!({ "lease": lease })),
        )
        .await
    }

    /// Releases a handle; panics unless 204.
    pub async fn release(&self, lock: &str, handle: &str) {
        let reply = self.delete(&format!("/v1/locks/{lock}/handles/{handle}")).await;
        assert_eq!(reply.status, StatusCode::NO_CONTENT, "{reply:?}");
    }

    /// The instance's current primary ZooKeeper session (id and password).
    pub fn session(&self) -> SessionInfo {
        self.running.state.zk().session_info().expect("zkgate has a session")
    }

    /// Every current ZooKeeper session of the instance (all its lanes), once all are connected.
    pub async fn sessions(&self) -> Vec<SessionInfo> {
        self.wait_generation(1).await;
        let lanes = self.running.state.lanes.all();
        lanes
            .iter()
            .map(|lane| lane.session_info().expect("a session"))
            .collect()
    }

    /// The current session of the lane that `lease` lives on.
    pub fn session_of(&self, lease: &str) -> SessionInfo {
        let lease = self.running.state.leases.peek(lease).expect("a live lease");
        lease.zk.session_info().expect("the lease's lane has a session")
    }

    /// Waits (bounded) until every session of the instance (each lane) runs on generation
    /// `generation` or later, connected.
    pub async fn wait_generation(&self, generation: u64) {
        for lane in 0..self.running.state.lanes.all().len() {
            self.wait_lane_generation(lane, generation).await;
        }
    }

    /// Waits (bounded) until the instance's session `lane` runs on generation `generation` or
    /// later, connected.
    pub async fn wait_lane_generation(&self, lane: usize, generation: u64) {
        let mut status = self.running.state.lanes.all()[lane].subscribe();
        let reached = status.wait_for(|s| {
            s.generation >= generation
                && s.client.is_some()
                && s.connection == zkgate::zk::session::Connection::Connected
        });
        tokio::time::timeout(Duration::from_secs(30), reached)
            .await
            .expect("new session in time")
            .expect("supervisor alive");
    }
}

/// A response: status, content type and body (JSON when it parses).
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub content_type: String,
    pub body: Value,
    /// `Retry-After`, in seconds, when present.
    pub retry_after: Option<u64>,
    /// `Idempotent-Replayed: true`: an answer given before to a request with the same key.
    pub replayed: bool,
}

impl Reply {
    pub async fn read(response: reqwest::Response) -> Reply {
        let status = response.status();
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        let replayed = response
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|v| v.as_bytes() == b"true");
        let bytes = response.bytes().await.expect("body");
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into()));
        Reply {
            status,
            content_type,
            body,
            retry_after,
            replayed,
        }
    }

    pub fn str(&self, key: &str) -> String {
        self.body[key]
            .as_str()
            .unwrap_or_else(|| panic!("no string `{key}` in {:?}", self.body))
            .to_string()
    }

    pub fn i64(&self, key: &str) -> i64 {
        self.body[key]
            .as_i64()
            .unwrap_or_else(|| panic!("no integer `{key}` in {:?}", self.body))
    }

    /// Asserts a problem document with this status (and `field`, when given).
    pub fn assert_problem(&self, status: StatusCode, field: Option<&str>) {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(self.content_type, "application/problem+json", "{self:?}");
        assert!(
            self.body["type"]
                .as_str()
                .is_some_and(|t| t.starts_with("urn:zkgate:problem:")),
            "{self:?}"
        );
        assert_eq!(self.body["status"].as_u64(), Some(status.as_u16() as u64), "{self:?}");
        assert!(self.body["detail"].as_str().is_some_and(|d| !d.is_empty()), "{self:?}");
        if let Some(field) = field {
            assert_eq!(self.body["field"].as_str(), Some(field), "{self:?}");
        }
    }
}

/// Two instances on one ZooKeeper (each a root of its own, as [zookeeper] gives), with an
/// `--auth-config` of `principals` (name, then its `admin` line and grants).
pub struct TwoInstances<const N: usize> {
    pub zk: TestZooKeeper,
    pub a: Gate,
    pub b: Gate,
    /// The principals' tokens, in the order given.
    pub tokens: [String; N],
    _dir: tempfile::TempDir,
}

/// [TwoInstances] whose configuration `tune` changes first.
pub async fn two_instances<const N: usize>(
    principals: [(&str, String); N],
    tune: impl Fn(&mut ServeConfig),
) -> TwoInstances<N> {
    two_instances_on(zookeeper().await, principals, tune).await
}

/// [two_instances] on `zk` (say, a server of the test's own, to stop).
pub async fn two_instances_on<const N: usize>(
    zk: TestZooKeeper,
    principals: [(&str, String); N],
    tune: impl Fn(&mut ServeConfig),
) -> TwoInstances<N> {
    let dir = tempfile::tempdir().expect("temp dir");
    let (path, tokens) = auth_config(&dir, principals);
    let mut config = test_config(&zk.connect_string());
    config.auth_config = Some(path);
    tune(&mut config);
    let a = Gate::start_with(config.clone()).await;
    let b = Gate::start_with(config).await;
    TwoInstances {
        zk,
        a,
        b,
        tokens,
        _dir: dir,
    }
}

/// The examples a spec's request body (`requestBody`) gives: its `example`, or each of its
/// `examples`, in the order written.
pub fn examples(body: &Value) -> Vec<Value> {
    let contents = body["content"].as_object().into_iter().flat_map(|c| c.values());
    contents
        .flat_map(|content| {
            let single = content.get("example").cloned();
            let named =
                (content["examples"].as_object().into_iter().flatten()).filter_map(|(_, e)| e.get("value").cloned());
            single.into_iter().chain(named).collect::<Vec<_>>()
        })
        .collect()
}

/// The path (under the test's root) of `principal`'s record of idempotency key `key`.
pub fn idempotency_record(principal: &str, key: &str) -> String {
    let id = zkgate::recipes::idempotency::record_id(key);
    format!("/zkgate/idempotency/{principal}/{id}")
}

/// A plain ZooKeeper client, to look at znodes from outside zkgate.
pub async fn zk_client(connect: &str) -> Client {
    Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(connect)
        .await
        .expect("connect ZooKeeper")
}

/// Every znode under `path` with its data, for before/after comparisons.
pub async fn tree(client: &Client, path: &str) -> BTreeMap<String, Vec<u8>> {
    let mut nodes = BTreeMap::new();
    let mut pending = vec![path.to_string()];
    while let Some(path) = pending.pop() {
        let Ok((data, _)) = client.get_data(&path).await else {
            continue;
        };
        let children = client.list_children(&path).await.unwrap_or_default();
        for child in children {
            pending.push(if path == "/" {
                format!("/{child}")
            } else {
                format!("{path}/{child}")
            });
        }
        nodes.insert(path, data);
    }
    nodes
}

/// Expires zkgate's ZooKeeper session from outside, as a partition longer than the session
/// timeout would, without waiting that long: zkgate reaches ZooKeeper through `proxy`, which
/// is partitioned; a second client attaches directly to the same session id and password and
/// closes it; the partition heals and zkgate's client learns `Expired` when it reconnects.
/// (Without the partition, the owner and the intruder steal the session from each other.)
pub async fn expire_session(proxy: &proxy::Proxy, direct: &str, session: SessionInfo) {
    expire_sessions(proxy, direct, vec![session]).await;
}

/// [expire_session] for several sessions at once (an instance's lanes: the instance loses
/// ZooKeeper altogether).
pub async fn expire_sessions(proxy: &proxy::Proxy, direct: &str, sessions: Vec<SessionInfo>) {
    proxy.partition();
    for session in sessions {
        close_from_outside(direct, session).await;
    }
    proxy.heal();
}

/// Cuts `gate` off ZooKeeper (through `proxy`) until it has seen the disconnection, then heals:
/// shorter than the session timeout, so the session survives and the connection comes back.
pub async fn drop_connection(gate: &Gate, proxy: &proxy::Proxy) {
    let mut status = gate.running.state.zk().subscribe();
    proxy.partition();
    within(
        Duration::from_secs(20),
        "zkgate to see the disconnection",
        status.wait_for(|s| s.connection == zkgate::zk::session::Connection::Disconnected),
    )
    .await
    .expect("supervisor");
    proxy.heal();
}

/// Attaches to `session` directly and closes it.
async fn close_from_outside(direct: &str, session: SessionInfo) {
    let intruder = within(Duration::from_secs(30), "attaching to the session", async {
        loop {
            let attempt = Client::connector()
                .with_session(session.clone())
                .with_session_timeout(Duration::from_secs(10))
                .connect(direct)
                .await;
            match attempt {
                Ok(client) => return client,
                // The server may still be closing the owner's cut connection.
                Err(zookeeper_client::Error::Timeout | zookeeper_client::Error::ConnectionLoss) => {
                    continue;
                }
                Err(err) => panic!("cannot attach to the session: {err}"),
            }
        }
    })
    .await;
    drop(intruder); // the last clone closes the session
}

/// Runs `command` to completion within `limit` (killed otherwise), failing the test with its
/// output unless it succeeds: its stdout and stderr.
pub async fn run_to_success(mut command: tokio::process::Command, limit: Duration, what: &str) -> String {
    let output = within(limit, what, command.kill_on_drop(true).output())
        .await
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{what} failed:\n{report}");
    report
}

/// Awaits `future`, failing the test (naming `what`) if it takes longer than `limit`.
/// Asks `probe` again every 20 ms until it holds, for at most `limit`. For what no event
/// announces (that the instance is ready, that it vouches for a lease again): a client finds
/// out the same way, by asking again.
pub async fn until_answered(limit: Duration, what: &str, probe: impl AsyncFn() -> bool) {
    within(limit, what, async {
        while !probe().await {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

pub async fn within<T>(limit: Duration, what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("timed out after {limit:?} waiting for {what}"))
}

/// Waits, with ZooKeeper's children watch (no polling), until `path` has at least `count`
/// children; returns them.
pub async fn wait_children(connect: &str, path: &str, count: usize) -> Vec<String> {
    let client = zk_client(connect).await;
    within(
        Duration::from_secs(30),
        &format!("{count} children under {path}"),
        async {
            loop {
                match client.list_and_watch_children(path).await {
                    Ok((children, _)) if children.len() >= count => return children,
                    Ok((_, watcher)) => {
                        watcher.changed().await;
                    }
                    Err(zookeeper_client::Error::NoNode) => {
                        // Not created yet: watch for its creation instead (unless it just was).
                        let (stat, watcher) = client.check_and_watch_stat(path).await.expect("exists watch");
                        if stat.is_none() {
                            watcher.changed().await;
                        }
                    }
                    Err(err) => panic!("listing {path}: {err}"),
                }
            }
        },
    )
    .await
}

/// Sends a request byte for byte over a fresh TCP connection (no client-side path
/// normalisation, so `..` and odd encodings reach the server as written).
pub async fn raw_request(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Reply {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let given = |name: &str| headers.iter().any(|(h, _)| h.eq_ignore_ascii_case(name));
    let mut head = format!("{method} {path} HTTP/1.1\r\nContent-Length: {}\r\n", body.len());
    // `Host` and `Connection` unless the caller sends its own.
    if !given("host") {
        head.push_str(&format!("Host: {addr}\r\n"));
    }
    if !given("connection") {
        head.push_str("Connection: close\r\n");
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.expect("write head");
    stream.write_all(body).await.expect("write body");
    let mut response = Vec::new();
    within(
        Duration::from_secs(30),
        "the raw response",
        stream.read_to_end(&mut response),
    )
    .await
    .expect("read");
    let text = String::from_utf8_lossy(&response).to_string();
    let (head, body) = text.split_once("\r\n\r\n").expect("a complete HTTP response");
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status code");
    let content_type = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type:")
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_default();
    let body = serde_json::from_str(body).unwrap_or(Value::String(body.to_string()));
    let retry_after = head.lines().find_map(|l| {
        l.to_ascii_lowercase()
            .strip_prefix("retry-after:")
            .and_then(|v| v.trim().parse().ok())
    });
    Reply {
        status: StatusCode::from_u16(status).expect("status"),
        content_type,
        body,
        retry_after,
        replayed: head.to_ascii_lowercase().contains("\r\nidempotent-replayed: true"),
    }
}

/// A server's `Mode:` (`standalone`, `leader`, `follower`) from the `srvr` four-letter word.
pub async fn server_mode(port: u16) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    stream.write_all(b"srvr").await.ok()?;
    let mut text = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut text))
        .await
        .ok()?
        .ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("Mode: ").map(|m| m.trim().to_string()))
}

/// Whether the server on `port` holds a connection of session `session_id` (the `cons`
/// four-letter word).
pub async fn serves_session(port: u16, session_id: i64) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return false;
    };
    if stream.write_all(b"cons").await.is_err() {
        return false;
    }
    let mut text = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut text)).await;
    text.contains(&format!("sid={session_id:#x}"))
}

/// How many sessions a ZooKeeper server says watch `path` (the `wchp` four-letter word).
pub async fn sessions_watching(port: u16, path: &str) -> usize {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    stream.write_all(b"wchp").await.expect("wchp");
    let mut text = String::new();
    within(Duration::from_secs(5), "wchp", stream.read_to_string(&mut text))
        .await
        .expect("read wchp");
    let mut lines = text.lines().skip_while(|line| *line != path);
    lines.next();
    lines.take_while(|line| line.starts_with(char::is_whitespace)).count()
}

/// How many packets a ZooKeeper server has received (the `mntr` four-letter word).
pub async fn packets_received(port: u16) -> u64 {
    monitored(port, "zk_packets_received").await
}

/// How many watches a ZooKeeper server holds, over all sessions (`mntr`'s `zk_watch_count`).
pub async fn watch_count(port: u16) -> u64 {
    monitored(port, "zk_watch_count").await
}

/// How many znodes a ZooKeeper server holds, its own (`/zookeeper/...`) included (`mntr`'s
/// `zk_znode_count`).
pub async fn znode_count(port: u16) -> u64 {
    monitored(port, "zk_znode_count").await
}

/// A figure of the `mntr` four-letter word.
async fn monitored(port: u16, figure: &str) -> u64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    stream.write_all(b"mntr").await.expect("mntr");
    let mut text = String::new();
    within(Duration::from_secs(5), "mntr", stream.read_to_string(&mut text))
        .await
        .expect("read mntr");
    text.lines()
        .find_map(|line| {
            let (name, value) = line.split_once(char::is_whitespace)?;
            (name == figure).then(|| value.trim().parse().expect("a count"))
        })
        .unwrap_or_else(|| panic!("{figure} in mntr"))
}

/// Makes `<base>/<name>` with `contenders` ephemeral sequential children named as a lock's
/// contenders, for each `(name, contenders)`, on `client`'s session (they live as long as it
/// does): thousands of contended locks in a few multi-ops, as a busy deployment would have.
pub async fn make_contended(client: &Client, base: &str, locks: &[(String, usize)]) {
    use zookeeper_client::{Acls, CreateMode};
    let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
    let ephemeral = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
    let mut path = String::new();
    for segment in base.trim_start_matches('/').split('/') {
        path = format!("{path}/{segment}");
        match client.create(&path, b"", &persistent).await {
            Ok(_) | Err(zookeeper_client::Error::NodeExists) => {}
            Err(err) => panic!("create {path}: {err}"),
        }
    }
    for chunk in locks.chunks(200) {
        let mut writer = client.new_multi_writer();
        for (name, contenders) in chunk {
            writer
                .add_create(&format!("{base}/{name}"), b"", &persistent)
                .expect("create");
            for i in 0..*contenders {
                let node = format!("{base}/{name}/_c_{i:08}-0000-0000-0000-000000000000-lock-");
                writer.add_create(&node, b"", &ephemeral).expect("create");
            }
        }
        writer.commit().await.expect("make the locks");
    }
}

/// A throwaway self-signed certificate for `localhost` and `127.0.0.1`, in PEM files.
pub struct Certificate {
    pub dir: tempfile::TempDir,
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    pub pem: String,
}

pub fn certificate() -> Certificate {
    let generated =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).expect("certificate");
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let pem = generated.cert.pem();
    std::fs::write(&cert, &pem).expect("write cert");
    std::fs::write(&key, generated.signing_key.serialize_pem()).expect("write key");
    Certificate { dir, cert, key, pem }
}

/// The value of the unlabelled series `name` in the `/metrics` of the zkgate at `url`.
pub async fn metric(url: &str, name: &str) -> f64 {
    let text = http_client()
        .get(format!("{url}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

/// An HTTP client (reqwest needs the process's rustls provider installed first).
pub fn http_client() -> reqwest::Client {
    http_builder().build().expect("http client")
}

pub fn http_builder() -> reqwest::ClientBuilder {
    zkgate::install_crypto_provider();
    // Idle connections go before zkgate closes them (`--header-timeout`, 30 s).
    reqwest::Client::builder().pool_idle_timeout(Duration::from_secs(20))
}

/// Lowers this test process's CPU priority (nice 5), every thread of it and what it starts
/// from now on (threads and processes inherit it): for the long churns, whose figures (memory,
/// znodes) do not depend on how fast they run, so that the tests beside them (which time a
/// fault, a lease or a session) get the CPU first when they need it. Not the least priority:
/// the churn's own zkgate has heartbeats to answer in time.
pub fn yield_the_cpu() {
    let threads = std::fs::read_dir("/proc/self/task").expect("/proc/self/task");
    for thread in threads.flatten() {
        if let Ok(tid) = thread.file_name().to_string_lossy().parse::<libc::id_t>() {
            // SAFETY: setpriority(2) on a thread of this process; on Linux a nice value is
            // a thread's, hence each.
            unsafe {
                libc::setpriority(libc::PRIO_PROCESS, tid, 5);
            }
        }
    }
}

/// The resident memory of this test process (zkgate runs in it), in bytes.
pub fn resident_bytes() -> u64 {
    resident_bytes_of("self")
}

/// The resident memory of process `pid` (or `self`), in bytes.
pub fn resident_bytes_of(pid: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/<pid>/status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kib * 1024
}
