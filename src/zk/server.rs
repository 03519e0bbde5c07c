//! A real ZooKeeper server run as a supervised child process.
//!
//! `zkgate serve` without `--zookeeper` uses this to start a standalone server (the "embedded"
//! ZooKeeper), and the test harness uses it to start standalone servers and ensembles. The
//! server is the Java one from Debian's `zookeeper` package (or an Apache tarball under
//! `ZOOKEEPER_HOME`): zkgate never fakes ZooKeeper.
//!
//! Why a child process and not a library: ZooKeeper is Java. We keep it on a loopback port we
//! chose, its data in a directory we name, its output in a log file next to the data, and we
//! make sure it dies with us (SIGKILL on drop, and `PR_SET_PDEATHSIG` if we are killed first).

use std::fs;
use std::io::Read;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// Why a ZooKeeper server could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(
        "Java was not found (looked for $JAVA_HOME/bin/java and `java` on PATH): install it with `apt-get install default-jre-headless` or set JAVA_HOME"
    )]
    JavaMissing,
    #[error(
        "ZooKeeper was not found (looked in $ZOOKEEPER_HOME/lib and /usr/share/java/zookeeper.jar): install it with `apt-get install zookeeper` or set ZOOKEEPER_HOME"
    )]
    ZooKeeperMissing,
    #[error("ZooKeeper server failed to start: {0}")]
    Start(String),
    #[error("ZooKeeper I/O error: {0}")]
    Io(#[from] std::io::Error),
}

/// Settings of one server process.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// ZooKeeper's tick; the session timeouts it accepts are 2 to 20 ticks.
    pub tick_time: Duration,
    /// Where its data goes; `None` makes a temporary directory removed when the server drops.
    pub data_dir: Option<PathBuf>,
    /// `forceSync=no` trades durability on power loss for speed; only tests want it.
    pub force_sync: bool,
    /// Maximum Java heap.
    pub heap_mb: u32,
    /// Start fast at the cost of peak speed (the JVM's C1 compiler only): for tests, which
    /// start many short-lived servers.
    pub quick_start: bool,
    /// Lines appended to `zoo.cfg` as they are, e.g. a TLS client port:
    /// `secureClientPort=...`, `serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory`,
    /// `ssl.keyStore.location=...` (ZooKeeper turns unknown keys into `zookeeper.*` system
    /// properties, which is where its TLS settings are read).
    pub extra_config: Vec<String>,
    /// How often the server looks for empty container znodes to remove
    /// (`znode.container.checkIntervalMs`; ZooKeeper's own default is a minute).
    pub container_check_interval: Duration,
    /// Most empty containers it removes a minute (`znode.container.maxPerMinute`; ZooKeeper's
    /// default is 10,000, which leaves 100,000 lock names of a busy hour for ten minutes).
    pub containers_per_minute: u32,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            tick_time: Duration::from_millis(2000),
            data_dir: None,
            force_sync: true,
            heap_mb: 512,
            quick_start: false,
            extra_config: Vec::new(),
            container_check_interval: Duration::from_secs(10),
            containers_per_minute: 100_000,
        }
    }
}

/// Ports of one member of an ensemble.
#[derive(Clone, Copy, Debug)]
pub struct MemberPorts {
    pub client: u16,
    pub quorum: u16,
    pub election: u16,
}

/// A running ZooKeeper server process; killed when dropped.
pub struct ZooKeeperServer {
    child: Option<Child>,
    id: u32,
    client_port: u16,
    data_dir: PathBuf,
    config_path: PathBuf,
    _temp: Option<TempDir>,
}

impl ZooKeeperServer {
    /// Starts a standalone server on a free loopback port and waits until it serves.
    ///
    /// The port is chosen free, but another process may bind it before the server does (the
    /// server then exits): the start is tried again on a new port, three times in all.
    pub async fn start_standalone(options: &ServerOptions) -> Result<ZooKeeperServer, ServerError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let port = free_port()?;
            let mut server = Self::spawn(options, 0, port, None)?;
            match server.wait_serving(Duration::from_secs(60)).await {
                Ok(()) => return Ok(server),
                Err(error) if attempt >= 3 => return Err(error),
                Err(error) => tracing::warn!(%port, %error, "ZooKeeper did not start; trying another port"),
            }
        }
    }

    /// Starts an ensemble of `size` servers on free loopback ports and waits until every member
    /// serves (a quorum answers). As with [ZooKeeperServer::start_standalone], a port may be
    /// taken between its choice and the server's bind: the whole ensemble is tried again on new
    /// ports, three times in all (the failed members are stopped when dropped).
    pub async fn start_ensemble(options: &ServerOptions, size: u32) -> Result<Vec<ZooKeeperServer>, ServerError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let members = (0..size)
                .map(|_| {
                    Ok(MemberPorts {
                        client: free_port()?,
                        quorum: free_port()?,
                        election: free_port()?,
                    })
                })
                .collect::<std::io::Result<Vec<MemberPorts>>>()?;
            // Not waited for one by one: a member serves only once a quorum is up.
            let mut servers = (1..=size)
                .map(|id| Self::spawn(options, id, members[(id - 1) as usize].client, Some(&members)))
                .collect::<Result<Vec<_>, _>>()?;
            let serving = async {
                for server in &mut servers {
                    server.wait_serving(Duration::from_secs(60)).await?;
                }
                Ok(())
            };
            match serving.await {
                Ok(()) => return Ok(servers),
                Err(error) if attempt >= 3 => return Err(error),
                Err(error) => tracing::warn!(%error, "the ensemble did not start; trying other ports"),
            }
        }
    }

    fn spawn(
        options: &ServerOptions,
        id: u32,
        client_port: u16,
        members: Option<&[MemberPorts]>,
    ) -> Result<ZooKeeperServer, ServerError> {
        let java = find_java()?;
        let classpath = find_classpath()?;
        let (temp, data_dir) = match &options.data_dir {
            Some(dir) => (None, dir.clone()),
            None => {
                let temp = tempfile::Builder::new().prefix("zkgate-zookeeper-").tempdir()?;
                let dir = temp.path().to_path_buf();
                (Some(temp), dir)
            }
        };
        fs::create_dir_all(data_dir.join("data"))?;
        let config_path = data_dir.join("zoo.cfg");
        fs::write(&config_path, config_text(options, &data_dir, client_port, members))?;
        if id > 0 {
            fs::write(data_dir.join("data").join("myid"), format!("{id}\n"))?;
        }
        let mut server = ZooKeeperServer {
            child: None,
            id,
            client_port,
            data_dir,
            config_path,
            _temp: temp,
        };
        server.child = Some(server.launch(&java, &classpath, options, members.is_some())?);
        Ok(server)
    }

    fn launch(
        &self,
        java: &Path,
        classpath: &str,
        options: &ServerOptions,
        quorum: bool,
    ) -> Result<Child, ServerError> {
        let log = fs::OpenOptions::new().create(true).append(true).open(self.log_path())?;
        let main_class = if quorum {
            "org.apache.zookeeper.server.quorum.QuorumPeerMain"
        } else {
            "org.apache.zookeeper.server.ZooKeeperServerMain"
        };
        let mut command = Command::new(java);
        command
            .arg(format!("-Xmx{}m", options.heap_mb))
            .args(["-XX:+UseSerialGC", "-Xshare:auto"])
            // Every collection's pause, stamped in milliseconds since the epoch, so that a
            // stall seen from outside can be laid beside the server's own (two 10 MB files).
            .arg(format!(
                "-Xlog:gc:file={}:timemillis:filecount=2,filesize=10m",
                self.gc_log_path().display()
            ))
            .args(options.quick_start.then_some("-XX:TieredStopAtLevel=1"))
            .arg("-Dzookeeper.admin.enableServer=false")
            // zkgate's quotas on its subtrees are only limits if the servers enforce them.
            .arg("-Dzookeeper.enforceQuota=true")
            .arg("-Dzookeeper.jmx.log4j.disable=true")
            // Read by ZooKeeper's ContainerManager as they are (no `zookeeper.` prefix).
            .arg(format!(
                "-Dznode.container.checkIntervalMs={}",
                options.container_check_interval.as_millis()
            ))
            .arg(format!(
                "-Dznode.container.maxPerMinute={}",
                options.containers_per_minute
            ))
            .arg("-cp")
            .arg(classpath)
            .arg(main_class)
            .arg(&self.config_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // A process group of its own: a Ctrl-C in zkgate's terminal (sent to the whole
            // foreground group) reaches zkgate alone, which then closes its sessions (releasing
            // what its leases hold at once) before it stops the server. Were the server to die
            // first, every session would wait out its timeout.
            .process_group(0);
        // SAFETY: prctl is async-signal-safe and touches no memory of ours; it makes the kernel
        // kill ZooKeeper when the thread that spawned it dies, so a `kill -9` of zkgate or a
        // crashed test does not leave a server behind.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        Ok(command.spawn()?)
    }

    /// Polls with real client calls until the server answers one (`ruok` answers before a server
    /// serves, so it proves nothing), or fails if the process exits or the deadline passes.
    pub async fn wait_serving(&mut self, limit: Duration) -> Result<(), ServerError> {
        let deadline = Instant::now() + limit;
        let connect = self.connect_string();
        let failure = loop {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                break format!("exited with {status}");
            }
            if answers(&connect).await {
                return Ok(());
            }
            if Instant::now() > deadline {
                break format!("not serving after {limit:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        Err(ServerError::Start(format!("{failure}; log:\n{}", self.log_tail())))
    }

    /// `127.0.0.1:<port>`.
    pub fn connect_string(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    pub fn client_port(&self) -> u16 {
        self.client_port
    }

    /// The member id in an ensemble (0 for a standalone server).
    pub fn id(&self) -> u32 {
        self.id
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn log_path(&self) -> PathBuf {
        self.data_dir.join("zookeeper.log")
    }

    /// The JVM's log of its collections (`-Xlog:gc`).
    pub fn gc_log_path(&self) -> PathBuf {
        self.data_dir.join("gc.log")
    }

    /// The server's collection pauses that ended between `from` and `to` (milliseconds since
    /// the epoch): when each ended, and how long it paused the server.
    pub fn gc_pauses(&self, from: u128, to: u128) -> Vec<(u128, Duration)> {
        gc_pauses_in(&self.gc_log_path(), from, to)
    }

    /// The OS process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `kill -9`: the server dies without a goodbye, as in a crash.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the process again with the same configuration and data (after [Self::kill]).
    pub fn restart(&mut self, options: &ServerOptions) -> Result<(), ServerError> {
        self.kill();
        let quorum = self.id > 0;
        self.child = Some(self.launch(&find_java()?, &find_classpath()?, options, quorum)?);
        Ok(())
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`): a paused server keeps its sockets open but answers
    /// nothing, like a long GC pause.
    pub fn pause(&self, paused: bool) {
        if let Some(pid) = self.pid() {
            let signal = if paused { libc::SIGSTOP } else { libc::SIGCONT };
            // SAFETY: plain kill(2) on the pid of a child we own and have not reaped.
            unsafe {
                libc::kill(pid as libc::pid_t, signal);
            }
        }
    }

    fn log_tail(&self) -> String {
        let mut text = String::new();
        if let Ok(mut file) = fs::File::open(self.log_path()) {
            let _ = file.read_to_string(&mut text);
        }
        let start = text.len().saturating_sub(3000);
        let start = (start..text.len())
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(text.len());
        text[start..].to_string()
    }
}

impl Drop for ZooKeeperServer {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn answers(connect: &str) -> bool {
    let attempt = async {
        let client = zookeeper_client::Client::connector()
            .with_session_timeout(Duration::from_secs(4))
            .with_fail_eagerly()
            .connect(connect)
            .await
            .ok()?;
        client.check_stat("/").await.ok()
    };
    matches!(tokio::time::timeout(Duration::from_secs(5), attempt).await, Ok(Some(_)))
}

/// The collection pauses logged in `path` ([ZooKeeperServer::gc_log_path]) that ended between
/// `from` and `to` (milliseconds since the epoch).
pub fn gc_pauses_in(path: &Path, from: u128, to: u128) -> Vec<(u128, Duration)> {
    let text = fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(gc_pause)
        .filter(|(at, _)| (from..=to).contains(at))
        .collect()
}

/// A pause of a `-Xlog:gc` line with the `timemillis` decorator:
/// `[1764441001123ms] GC(3) Pause Young (Allocation Failure) 34M->5M(123M) 3.456ms`.
fn gc_pause(line: &str) -> Option<(u128, Duration)> {
    let (stamp, rest) = line.strip_prefix('[')?.split_once("ms]")?;
    if !rest.contains(" Pause ") {
        return None;
    }
    let millis = rest
        .trim_end()
        .strip_suffix("ms")?
        .rsplit(' ')
        .next()?
        .parse::<f64>()
        .ok()?;
    Some((stamp.parse().ok()?, Duration::from_secs_f64(millis / 1000.0)))
}

fn config_text(options: &ServerOptions, data_dir: &Path, client_port: u16, members: Option<&[MemberPorts]>) -> String {
    let mut text = format!(
        "tickTime={}\ninitLimit=10\nsyncLimit=5\ndataDir={}\nclientPort={}\nclientPortAddress=127.0.0.1\n\
         maxClientCnxns=0\nadmin.enableServer=false\nforceSync={}\n4lw.commands.whitelist=*\n\
         autopurge.snapRetainCount=3\nautopurge.purgeInterval=1\n",
        options.tick_time.as_millis().max(1),
        data_dir.join("data").display(),
        client_port,
        if options.force_sync { "yes" } else { "no" },
    );
    if let Some(members) = members {
        text.push_str("standaloneEnabled=false\nreconfigEnabled=false\n");
        for (i, m) in members.iter().enumerate() {
            text.push_str(&format!("server.{}=127.0.0.1:{}:{}\n", i + 1, m.quorum, m.election));
        }
    }
    for line in &options.extra_config {
        text.push_str(line);
        text.push('\n');
    }
    text
}

/// Debian's `zookeeper.jar` manifest lists netty-handler and netty-transport but not what they
/// need to run (found by starting a server with `secureClientPort`).
const DEBIAN_NETTY_JARS_BEYOND_THE_MANIFEST: [&str; 3] = [
    "netty-codec.jar",
    "netty-resolver.jar",
    "netty-transport-native-unix-common.jar",
];

/// A loopback port that was free a moment ago. There is a window in which another process may
/// take it; callers that care retry on a failed start.
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The `java` binary: `$JAVA_HOME/bin/java`, else the first `java` on `PATH`.
pub fn find_java() -> Result<PathBuf, ServerError> {
    if let Some(home) = std::env::var_os("JAVA_HOME") {
        let java = PathBuf::from(home).join("bin/java");
        if java.is_file() {
            return Ok(java);
        }
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("java"))
        .find(|java| java.is_file())
        .ok_or(ServerError::JavaMissing)
}

/// The class path of the ZooKeeper server: every jar of `$ZOOKEEPER_HOME` (an Apache binary
/// tarball keeps them in `lib/`), else Debian's `zookeeper.jar`, whose manifest names the rest
/// but for the Netty jars that only the Netty connection factory (TLS client ports) loads:
/// those are added when Debian's `libnetty-java` has them.
pub fn find_classpath() -> Result<String, ServerError> {
    if let Some(home) = std::env::var_os("ZOOKEEPER_HOME") {
        let home = PathBuf::from(home);
        let mut jars = Vec::new();
        for dir in [home.clone(), home.join("lib")] {
            if let Ok(entries) = fs::read_dir(&dir) {
                jars.extend(
                    entries
                        .flatten()
                        .map(|e| e.path())
                        .filter(|p| p.extension().is_some_and(|e| e == "jar")),
                );
            }
        }
        if jars.iter().any(|j| {
            j.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("zookeeper"))
        }) {
            let parts: Vec<String> = jars.iter().map(|j| j.display().to_string()).collect();
            return Ok(parts.join(":"));
        }
        return Err(ServerError::ZooKeeperMissing);
    }
    let debian = Path::new("/usr/share/java/zookeeper.jar");
    if !debian.is_file() {
        return Err(ServerError::ZooKeeperMissing);
    }
    let netty = DEBIAN_NETTY_JARS_BEYOND_THE_MANIFEST
        .iter()
        .map(|jar| Path::new("/usr/share/java").join(jar))
        .filter(|jar| jar.is_file());
    let parts: Vec<String> = std::iter::once(debian.to_path_buf())
        .chain(netty)
        .map(|jar| jar.display().to_string())
        .collect();
    Ok(parts.join(":"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_are_read_from_the_gc_log() {
        let pause = gc_pause("[1764441001123ms] GC(3) Pause Young (Allocation Failure) 34M->5M(123M) 3.456ms");
        assert_eq!(pause, Some((1_764_441_001_123, Duration::from_micros(3_456))));
        assert_eq!(gc_pause("[1764441001123ms] Using Serial"), None);
        assert_eq!(gc_pause("not a log line"), None);
    }
}
