//! The systems under test as child processes: their memory and CPU time from `/proc`.

use std::time::{Duration, Instant};

/// A child process, killed when dropped.
pub struct Child {
    child: std::process::Child,
}

impl Child {
    /// Output is dropped, or with `ZKGATE_BENCH_LOGS=<dir>` written to `<dir>/<program>.<n>.log`
    /// (to see why a system failed mid-run).
    pub fn spawn(program: &str, args: &[&str]) -> Child {
        Child::spawn_with_env(program, args, &[])
    }

    /// [Child::spawn] with these variables added to its environment.
    pub fn spawn_with_env(program: &str, args: &[&str], env: &[(&str, &str)]) -> Child {
        static SPAWNED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let output = match std::env::var_os("ZKGATE_BENCH_LOGS") {
            Some(dir) => {
                let name = std::path::Path::new(program).file_name().expect("program name");
                let n = SPAWNED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let path = std::path::Path::new(&dir).join(format!("{}.{n}.log", name.to_string_lossy()));
                std::process::Stdio::from(std::fs::File::create(&path).expect("log file"))
            }
            None => std::process::Stdio::null(),
        };
        let child = std::process::Command::new(program)
            .args(args)
            .env("ZKGATE_LOG", "warn")
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::null())
            .stderr(output)
            .spawn()
            .unwrap_or_else(|e| panic!("start {program}: {e}"));
        Child { child }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (SIGTERM: a clean stop; SIGKILL: `kill -9`) and waits for the exit.
    pub fn stop(&mut self, signal: libc::c_int) {
        // SAFETY: kill(2) on the pid of a child we own and have not reaped.
        unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        let _ = self.child.wait();
    }

    /// Resident memory, from `/proc/<pid>/status`.
    pub fn rss_bytes(&self) -> u64 {
        rss_bytes_of(self.pid())
    }

    /// CPU time used so far (user + system), from `/proc/<pid>/stat`.
    pub fn cpu_time(&self) -> Duration {
        cpu_time_of(&self.pid().to_string())
    }
}

/// Resident memory of process `pid`, from `/proc/<pid>/status`.
pub fn rss_bytes_of(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("VmRSS");
    kib * 1024
}

/// CPU time (user + system) that process `pid` (or `self`) has used so far, from
/// `/proc/<pid>/stat`.
pub fn cpu_time_of(pid: &str) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("proc stat");
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let fields: Vec<&str> = stat[stat.rfind(')').expect("comm") + 2..].split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_micros(ticks * 1_000_000 / per_second)
}

/// Time on a CPU that each live thread of process `pid` has had, to the nanosecond: each
/// thread's `/proc/<pid>/task/<tid>/schedstat`. [cpu_time_of] counts in clock ticks (10 ms),
/// too coarse for a request of tens of microseconds unless tens of thousands are counted.
pub struct ThreadTimes(std::collections::HashMap<String, u64>);

impl ThreadTimes {
    pub fn of(pid: &str) -> ThreadTimes {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("proc tasks");
        let times = tasks
            .filter_map(|task| {
                let task = task.ok()?;
                let stat = std::fs::read_to_string(task.path().join("schedstat")).ok()?;
                let nanos = stat.split_whitespace().next()?.parse::<u64>().ok()?;
                Some((task.file_name().to_string_lossy().into_owned(), nanos))
            })
            .collect();
        ThreadTimes(times)
    }

    /// The time `pid`'s threads have had since `self` was read, thread by thread: a thread
    /// that exited meanwhile (a blocking pool's, after its idle time) takes only its own time
    /// with it, rather than making the sum go back; a new one counts from its start.
    pub fn since(&self, pid: &str) -> Duration {
        let now = ThreadTimes::of(pid);
        let nanos = now
            .0
            .iter()
            .map(|(tid, nanos)| nanos.saturating_sub(self.0.get(tid).copied().unwrap_or(0)))
            .sum();
        Duration::from_nanos(nanos)
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until `url` answers 2xx (a process starting up).
pub async fn wait_http_ok(http: &reqwest::Client, url: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(reply) = http.get(url).send().await
            && reply.status().is_success()
        {
            return;
        }
        assert!(Instant::now() < deadline, "{url} did not answer");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A figure of a ZooKeeper server's `mntr` four-letter word (e.g. `zk_watch_count`).
pub fn zookeeper_figure(port: u16, figure: &str) -> u64 {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("ZooKeeper");
    stream.write_all(b"mntr").expect("mntr");
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("read mntr");
    text.lines()
        .find_map(|line| line.strip_prefix(figure)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{figure} in mntr"))
}

/// A ZooKeeper server's last transaction id (its `srvr` four-letter word): the transactions
/// between two readings are the writes it took meanwhile.
pub fn zookeeper_zxid(port: u16) -> u64 {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("ZooKeeper");
    stream.write_all(b"srvr").expect("srvr");
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("read srvr");
    text.lines()
        .find_map(|line| u64::from_str_radix(line.strip_prefix("Zxid: 0x")?.trim(), 16).ok())
        .unwrap_or_else(|| panic!("Zxid in srvr: {text}"))
}

/// The Java heap a JVM uses after a full collection (`jcmd GC.run`, then `GC.heap_info`'s
/// `used`), in bytes; `None` without `jcmd`.
pub fn java_heap_used(pid: u32) -> Option<u64> {
    let jcmd = |command: &str| {
        std::process::Command::new("jcmd")
            .args([&pid.to_string(), command])
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
    };
    jcmd("GC.run")?;
    let info = jcmd("GC.heap_info")?;
    // " garbage-first heap   total 3145728K, used 123456K [...]"
    let used = info
        .split("used ")
        .nth(1)?
        .split('K')
        .next()?
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(used * 1024)
}

/// A zkgate process (this package's binary) serving on a free port of loopback, on ZooKeeper
/// `connect`, with `flags` after `serve --zookeeper … --listen …`; once it is ready. The process,
/// and the address it listens on.
pub async fn zkgate(connect: &str, flags: &[&str]) -> (Child, std::net::SocketAddr) {
    let port = zkgate::zk::server::free_port().expect("free port");
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let listen = addr.to_string();
    let mut args = vec!["serve", "--zookeeper", connect, "--listen", &listen];
    args.extend_from_slice(flags);
    let child = Child::spawn(env!("CARGO_BIN_EXE_zkgate"), &args);
    wait_http_ok(&reqwest::Client::new(), &format!("http://{addr}/readyz")).await;
    (child, addr)
}

/// A standalone ZooKeeper without fsync, so that what zkgate adds is not hidden behind the disk.
pub async fn zookeeper_without_fsync() -> zkgate::zk::server::ZooKeeperServer {
    let options = zkgate::zk::server::ServerOptions {
        force_sync: false,
        ..Default::default()
    };
    zkgate::zk::server::ZooKeeperServer::start_standalone(&options)
        .await
        .expect("start ZooKeeper")
}

/// A bench's setting from the environment (`ZKGATE_BENCH_…`), or `default`.
pub fn setting<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}
