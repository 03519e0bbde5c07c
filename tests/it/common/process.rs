//! zkgate as a separate process, for the faults that an in-process instance cannot take
//! (`kill -9`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A zkgate process (not in-process: it is killed with SIGKILL).
pub struct Process {
    pub child: tokio::process::Child,
    pub url: String,
    log: Arc<Mutex<Vec<String>>>,
    /// The number of log lines so far: changes with every line, for waiting on one.
    logged: tokio::sync::watch::Receiver<usize>,
    /// How many ZooKeeper sessions (lanes) it opens.
    pub lanes: usize,
}

impl Process {
    /// SIGSTOP (`true`) or SIGCONT (`false`): the whole process freezes, as in a long GC
    /// pause or a stopped VM, with its sockets open.
    pub fn pause(&self, paused: bool) {
        if let Some(pid) = self.child.id() {
            let signal = if paused { libc::SIGSTOP } else { libc::SIGCONT };
            // SAFETY: plain kill(2) on the pid of a child we own and have not reaped.
            unsafe {
                libc::kill(pid as libc::pid_t, signal);
            }
        }
    }

    /// Sends `method path` with an optional JSON body; the status and the JSON answer (`null`
    /// for an empty one).
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (reqwest::StatusCode, serde_json::Value) {
        let mut request = super::http_client().request(method, format!("{}{path}", self.url));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let reply = request.send().await.expect("HTTP request");
        let status = reply.status();
        let text = reply.text().await.expect("body");
        (status, serde_json::from_str(&text).unwrap_or(serde_json::Value::Null))
    }

    /// Waits (bounded) until a line of the log matches: the process says when things happen.
    pub async fn wait_log(&self, within_: Duration, what: &str, matches: impl Fn(&str) -> bool) {
        let mut logged = self.logged.clone();
        let found = tokio::time::timeout(within_, async {
            loop {
                if self.log.lock().unwrap().iter().any(|line| matches(line)) {
                    return true;
                }
                if logged.changed().await.is_err() {
                    return false; // the log ended: the process exited
                }
            }
        })
        .await;
        if found != Ok(true) {
            let log = self.log.lock().unwrap().clone();
            panic!("zkgate never logged {what:?}; its log: {log:#?}");
        }
    }

    /// Waits (bounded) until each of the process's ZooKeeper sessions (lanes) has had session
    /// number `generation` (it logs each one it establishes), and it keeps leases on its primary
    /// session of that generation (it logs that too, once it has checked every lease it keeps).
    pub async fn wait_session(&self, generation: u64) {
        for lane in 0..self.lanes {
            let established = format!("lane={lane} generation={generation} ");
            self.wait_log(
                Duration::from_secs(30),
                &format!("session {generation} of lane {lane}"),
                |line| line.contains("ZooKeeper session established") && line.contains(&established),
            )
            .await;
        }
        let keeping = format!("generation={generation}");
        self.wait_log(
            Duration::from_secs(30),
            &format!("keeping leases on session {generation}"),
            |line| line.contains("keeping leases on this session") && line.trim_end().ends_with(&keeping),
        )
        .await;
    }

    /// Waits (bounded) until the process has a ZooKeeper session, which is when it is ready.
    pub async fn wait_ready(&mut self) {
        self.wait_session(1).await;
    }

    /// Creates a lease with `ttl` on this process and returns its id.
    pub async fn lease(&self, ttl: &str) -> String {
        let (status, lease) = self
            .call(
                reqwest::Method::POST,
                "/v1/leases",
                Some(serde_json::json!({ "ttl": ttl })),
            )
            .await;
        assert_eq!(status, reqwest::StatusCode::CREATED, "{lease}");
        lease["id"].as_str().expect("lease id").to_string()
    }

    /// `POST /v1/locks/{lock}/acquire?{query}` with `lease`: the status and the answer.
    pub async fn acquire(&self, lock: &str, lease: &str, query: &str) -> (reqwest::StatusCode, serde_json::Value) {
        self.call(
            reqwest::Method::POST,
            &format!("/v1/locks/{lock}/acquire?{query}"),
            Some(serde_json::json!({ "lease": lease })),
        )
        .await
    }

    /// `kill -9`, and waits until it is gone.
    pub async fn kill(&mut self) {
        self.child.start_kill().expect("kill -9");
        self.child.wait().await.expect("reaped");
    }

    /// Whether the process still runs, and the end of its log: for failure messages.
    pub fn diagnose(&mut self) -> String {
        let status = self.child.try_wait();
        let log = self.log.lock().unwrap();
        let tail: Vec<&String> = log.iter().rev().take(30).collect();
        format!("exit status {status:?}; last log lines (newest first): {tail:#?}")
    }

    /// Every line of its log so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    pub async fn start(connect: &str) -> Process {
        Process::start_with(connect, &["--session-timeout", "2s"]).await
    }

    /// SIGTERM, as a service manager stops a service.
    pub fn terminate(&self) {
        if let Some(pid) = self.child.id() {
            // SAFETY: plain kill(2) on the pid of a child we own and have not reaped.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGTERM);
            }
        }
    }

    /// A process with these `serve` flags, once it logs that it serves (which it does after
    /// connecting to ZooKeeper, or after giving up waiting for that).
    pub async fn start_with(connect: &str, flags: &[&str]) -> Process {
        Process::start_until(connect, flags, "zkgate serving").await
    }

    /// A process with these `serve` flags, once a line of its log contains `marker` (say, the
    /// warning that it cannot reach ZooKeeper). Its HTTP listener is up by then.
    pub async fn start_until(connect: &str, flags: &[&str], marker: &str) -> Process {
        Process::start_in(connect, flags, marker, &[]).await
    }

    /// [Process::start_with], with these variables added to its environment.
    pub async fn start_with_env(connect: &str, flags: &[&str], env: &[(&str, &str)]) -> Process {
        Process::start_in(connect, flags, "zkgate serving", env).await
    }

    /// `kill -9`, then a new process on the same address with these flags, as a service
    /// manager restarts one that crashed.
    pub async fn restart(&mut self, connect: &str, flags: &[&str]) {
        self.kill().await;
        let port = self
            .url
            .rsplit(':')
            .next()
            .and_then(|port| port.parse().ok())
            .expect("a port");
        *self = Process::start_on(Some(port), connect, flags, "zkgate serving", &[]).await;
    }

    async fn start_in(connect: &str, flags: &[&str], marker: &str, env: &[(&str, &str)]) -> Process {
        Process::start_on(None, connect, flags, marker, env).await
    }

    async fn start_on(port: Option<u16>, connect: &str, flags: &[&str], marker: &str, env: &[(&str, &str)]) -> Process {
        use tokio::io::AsyncBufReadExt;
        let port = port.unwrap_or_else(|| zkgate::zk::server::free_port().expect("port"));
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_zkgate"))
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--zookeeper",
                connect,
                // The fault scenarios drive instances hard from one address; limits have
                // their own tests.
                "--write-rate",
                "0",
                // Processes of one test trust each other, as the in-process ones do.
                "--cluster-secret",
                super::TEST_CLUSTER_SECRET,
            ])
            .args(flags)
            // `ZKGATE_TEST_PROCESS_LOG=info,zkgate::recipes::engine::handle=debug`: more of what the
            // processes do, for a failure's message.
            .env(
                "ZKGATE_LOG",
                std::env::var("ZKGATE_TEST_PROCESS_LOG").unwrap_or_else(|_| "info".into()),
            )
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::piped())
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start zkgate");
        let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
        // The whole log is kept (for waiting on a line, and for diagnosis), and drained all the
        // time so that the process never blocks on a full pipe.
        let log = Arc::new(Mutex::new(Vec::new()));
        let (count, logged) = tokio::sync::watch::channel(0);
        let kept = log.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let mut log = kept.lock().unwrap();
                log.push(line);
                count.send_replace(log.len());
            }
        });
        let lanes = flags
            .iter()
            .position(|f| *f == "--zookeeper-sessions")
            .and_then(|i| flags.get(i + 1)?.parse().ok())
            .unwrap_or(zkgate::config::DEFAULT_ZOOKEEPER_SESSIONS.into());
        let process = Process {
            child,
            url: format!("http://127.0.0.1:{port}"),
            log,
            logged,
            lanes,
        };
        process
            .wait_log(Duration::from_secs(60), marker, |line| line.contains(marker))
            .await;
        process
    }
}

/// `zkgate <args> --url <url>... [-- <command>...]` as a client subcommand runs (no
/// `ZKGATE_URL` or `ZKGATE_TOKEN` from the test's environment), its stdout and stderr piped,
/// killed if dropped: to spawn, with stdin set as the test needs.
pub fn client(args: &[&str], urls: &[&str], command: &[&str]) -> tokio::process::Command {
    let mut client = tokio::process::Command::new(env!("CARGO_BIN_EXE_zkgate"));
    client
        .args(args)
        .args(urls.iter().flat_map(|url| ["--url", url]))
        .args(if command.is_empty() {
            vec![]
        } else {
            [&["--"], command].concat()
        })
        .env_remove("ZKGATE_URL")
        .env_remove("ZKGATE_TOKEN")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    client
}
