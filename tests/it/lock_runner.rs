//! `zkgate lock` and `zkgate elect`, the real binary against a real zkgate and ZooKeeper: the
//! command runs only while the lock is held (with the holder's fencing token), its exit code
//! is the runner's, two runners take turns, a revocation or a loss stops the command (SIGTERM,
//! then SIGKILL after the grace), signals to the runner reach the command, and the elect runner
//! runs its command only while it leads.
//!
//! The commands are `sh` scripts that report on their stdout (which is the runner's) and wait
//! for a line on their stdin (the runner's too), so the test waits for events, never for time.

use crate::common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::process::Process;
use common::{Gate, wait_children, within, zookeeper};
use reqwest::StatusCode;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::task::JoinHandle;

const ZKGATE: &str = env!("CARGO_BIN_EXE_zkgate");

/// Short enough to make a lost keepalive matter within a test.
const TTL: &str = "2s";

/// A `zkgate lock` / `zkgate elect` process, with the command's stdin and stdout.
struct Runner {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    stderr: JoinHandle<String>,
}

impl Runner {
    /// `zkgate <args> -- sh -c <script>` against `url`.
    fn start(url: &str, args: &[&str], script: &str) -> Runner {
        Runner::start_at(&[url], args, script)
    }

    /// `zkgate <args> --url <url>... -- sh -c <script>`: against the instances at `urls`.
    fn start_at(urls: &[&str], args: &[&str], script: &str) -> Runner {
        let mut child = tokio::process::Command::new(ZKGATE)
            .args(args)
            .args(urls.iter().flat_map(|url| ["--url", url]))
            .args(["--", "sh", "-c", script])
            .env_remove("ZKGATE_URL")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the runner");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut stderr = child.stderr.take().expect("stderr");
        let stderr = tokio::spawn(async move {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text).await;
            text
        });
        Runner {
            child,
            stdin,
            stdout,
            stderr,
        }
    }

    /// The command's next line of output.
    async fn line(&mut self, what: &str) -> String {
        within(Duration::from_secs(30), what, self.stdout.next_line())
            .await
            .expect("read the command's output")
            .unwrap_or_else(|| panic!("the runner's output ended before {what}"))
    }

    /// The words of the command's next line, which must start with `first`.
    async fn report(&mut self, first: &str) -> Vec<String> {
        let line = self.line(first).await;
        let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        assert_eq!(words.first().map(String::as_str), Some(first), "{line}");
        words
    }

    /// Writes a line to the command's stdin.
    async fn tell(&mut self, line: &str) {
        self.stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .expect("write to the command");
        self.stdin.flush().await.expect("flush");
    }

    fn signal(&self, signal: libc::c_int) {
        let pid = self.child.id().expect("the runner runs") as libc::pid_t;
        // SAFETY: kill(2) on our own child's pid, not yet reaped.
        unsafe { libc::kill(pid, signal) };
    }

    /// Waits for the runner to exit: its exit code and what it said on stderr.
    async fn exit(mut self) -> (i32, String) {
        let status = within(Duration::from_secs(30), "the runner to exit", self.child.wait())
            .await
            .expect("wait for the runner");
        let stderr = self.stderr.await.expect("stderr");
        (
            status.code().unwrap_or_else(|| panic!("killed: {status}; {stderr}")),
            stderr,
        )
    }
}

/// Waits (bounded) until process `pid` (not our child) has ended: its pidfd becomes readable
/// then, zombie or reaped.
async fn ended(pid: i32) {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open(2) takes a pid and no flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return; // no such process: it has ended and been reaped
    }
    // SAFETY: the descriptor is new and ours alone.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) };
    // SAFETY: the AsyncFd owns the descriptor, which stays open until it is dropped.
    let fd = unsafe { tokio::io::unix::AsyncFd::register(fd) }.expect("watch the pidfd");
    within(Duration::from_secs(30), "the process to end", fd.readable())
        .await
        .expect("pidfd readable")
        .retain_ready();
}

/// The lease and token of a lock's holder (`None` when nobody holds it).
async fn holder(gate: &Gate, lock: &str) -> Option<(String, i64)> {
    let state = gate.get(&format!("/v1/locks/{lock}")).await;
    assert_eq!(state.status, StatusCode::OK, "{state:?}");
    let holder = &state.body["holder"];
    let lease = holder["lease"].as_str()?.to_string();
    Some((lease, holder["fencing_token"].as_i64().expect("token")))
}

#[tokio::test]
async fn the_command_runs_under_the_lock_with_the_holders_token_and_the_lock_is_freed_after() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let script = r#"echo "env $ZKGATE_FENCING_TOKEN $ZKGATE_LEASE $ZKGATE_LOCK $ZKGATE_HANDLE"; echo "guard $ZKGATE_GUARD"; read go; echo done"#;
    let mut runner = Runner::start(&gate.url, &["lock", "orders", "--ttl", TTL], script);
    let env = runner.report("env").await;
    let (token, lease) = (env[1].parse::<i64>().expect("a token"), env[2].clone());
    assert_eq!(env[3], "orders");
    let guard = runner.report("guard").await.join(" ");
    assert_eq!(guard, format!("guard lock/orders; handle={}", env[4]));
    assert_eq!(holder(&gate, "orders").await, Some((lease.clone(), token)));

    // The runner keeps the lease alive: the lock outlives two TTLs with the same holder. (The
    // wait is the span under test, not a synchronisation.)
    let ttl = zkgate::time::parse_duration(TTL).expect("TTL");
    tokio::time::sleep(2 * ttl + Duration::from_millis(100)).await;
    let leases = gate.get("/v1/leases").await;
    let ours = leases
        .body
        .as_array()
        .and_then(|all| all.iter().find(|l| l["id"] == lease.as_str()))
        .unwrap_or_else(|| panic!("the lease is gone: {leases:?}"));
    assert!(ours["age_ms"].as_u64() > Some(2 * ttl.as_millis() as u64), "{ours}");
    assert_eq!(holder(&gate, "orders").await, Some((lease.clone(), token)));
    let handle = gate.get(&format!("/v1/locks/orders/handles/{}", env[4])).await;
    assert_eq!(handle.body["state"], "held", "{handle:?}");

    runner.tell("go").await;
    assert_eq!(runner.line("the command's end").await, "done");
    let (code, stderr) = runner.exit().await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stderr, "", "a runner that did its job says nothing");
    // The lease was deleted before the runner exited, and the lock with it.
    assert_eq!(holder(&gate, "orders").await, None);
    let gone = gate.get(&format!("/v1/leases/{lease}")).await;
    assert_eq!(gone.status, StatusCode::GONE, "{gone:?}");
}

#[tokio::test]
async fn given_two_instances_the_command_runs_on_through_a_kill_9_of_the_one_it_started_on() {
    let zk = zookeeper().await;
    let mut first = Process::start(&zk.connect_string()).await;
    let second = Process::start(&zk.connect_string()).await;
    let script = r#"echo "env $ZKGATE_FENCING_TOKEN $ZKGATE_LEASE $ZKGATE_URL"; read go; echo done"#;
    let mut runner = Runner::start_at(&[&first.url, &second.url], &["lock", "orders", "--ttl", TTL], script);
    let env = runner.report("env").await;
    let (token, lease) = (env[1].parse::<i64>().expect("a token"), env[2].clone());
    // The command is told every instance, the one that answers first.
    assert_eq!(env[3], format!("{},{}", first.url, second.url));
    let held_by = |(status, state): (StatusCode, serde_json::Value)| {
        assert_eq!(status, StatusCode::OK, "{state}");
        let holder = &state["holder"];
        (
            holder["lease"].as_str().map(str::to_string),
            holder["fencing_token"].as_i64(),
        )
    };
    let lock = "/v1/locks/orders";
    assert_eq!(
        held_by(second.call(reqwest::Method::GET, lock, None).await),
        (Some(lease.clone()), Some(token))
    );

    // The instance the runner made its lease on dies. Its keepalives go to the other, which
    // takes the lease over: the lock outlives two TTLs with the same holder and token, and the
    // command runs on. (The wait is the span under test, not a synchronisation.)
    first.kill().await;
    let ttl = zkgate::time::parse_duration(TTL).expect("TTL");
    tokio::time::sleep(2 * ttl + Duration::from_millis(100)).await;
    assert_eq!(
        held_by(second.call(reqwest::Method::GET, lock, None).await),
        (Some(lease.clone()), Some(token)),
        "the lock changed hands; the surviving instance's log: {:#?}",
        second.log()
    );

    runner.tell("go").await;
    assert_eq!(runner.line("the command's end").await, "done");
    let (code, stderr) = runner.exit().await;
    assert_eq!(code, 0, "{stderr}");
    // The runner deleted its lease through the instance that answers, and the lock with it.
    assert_eq!(
        held_by(second.call(reqwest::Method::GET, lock, None).await),
        (None, None)
    );
    let (status, gone) = second
        .call(reqwest::Method::GET, &format!("/v1/leases/{lease}"), None)
        .await;
    assert_eq!(status, StatusCode::GONE, "{gone}");
}

#[tokio::test]
async fn the_runner_exits_with_the_commands_code_or_says_why_it_could_not_run_it() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let lock = ["lock", "codes", "--ttl", TTL];
    for (script, expected) in [
        ("exit 7", 7),
        ("kill -KILL $$", 128 + 9),
        ("exec /nonexistent/tool", 127),
    ] {
        let (code, stderr) = Runner::start(&gate.url, &lock, script).exit().await;
        assert_eq!(code, expected, "{script}: {stderr}");
        assert_eq!(holder(&gate, "codes").await, None, "released after `{script}`");
    }

    // A command that cannot be started at all.
    let mut missing = tokio::process::Command::new(ZKGATE)
        .args(["lock", "codes", "--url", &gate.url, "--", "/nonexistent/tool"])
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the runner");
    let mut stderr = String::new();
    let mut pipe = missing.stderr.take().expect("stderr");
    pipe.read_to_string(&mut stderr).await.expect("stderr");
    let status = within(Duration::from_secs(30), "the runner to exit", missing.wait())
        .await
        .expect("wait");
    assert_eq!(status.code(), Some(127), "{stderr}");
    assert!(stderr.starts_with("zkgate: cannot run `/nonexistent/tool`"), "{stderr}");

    // Not granted within --wait: 124, and the runner left the queue.
    let other = gate.lease("30s").await;
    assert_eq!(gate.acquire("codes", &other, "wait=0").await.status, StatusCode::OK);
    let waited = Instant::now();
    let args = ["lock", "codes", "--wait", "500ms"];
    let (code, stderr) = Runner::start(&gate.url, &args, "echo ran").exit().await;
    assert_eq!(code, 124, "{stderr}");
    assert!(waited.elapsed() >= Duration::from_millis(500));
    assert_eq!(
        stderr.trim_end(),
        "zkgate: waiting for lock \"codes\" (position 1)\nzkgate: lock \"codes\" was not granted within 500ms",
        "it says that it waits, and where, then why it gave up"
    );
    let state = gate.get("/v1/locks/codes").await;
    assert_eq!(state.body["waiters"], json!([]), "{state:?}");

    // An error answer: 125 with the problem's detail.
    let long_name = "x".repeat(200);
    let args = ["lock", long_name.as_str()];
    let (code, stderr) = Runner::start(&gate.url, &args, "echo ran").exit().await;
    assert_eq!(code, 125, "{stderr}");
    assert!(
        stderr.starts_with("zkgate: ") && stderr.contains("128") && !stderr.contains("ran"),
        "{stderr}"
    );
}

#[tokio::test]
async fn an_unreachable_zkgate_is_exit_125_with_a_one_line_reason() {
    let nowhere = format!("http://127.0.0.1:{}", zkgate::zk::server::free_port().expect("port"));
    let (code, stderr) = Runner::start(&nowhere, &["lock", "any"], "echo ran").exit().await;
    assert_eq!(code, 125, "{stderr}");
    assert!(
        stderr.starts_with("zkgate: cannot reach zkgate at http://127.0.0.1:"),
        "{stderr}"
    );
    assert!(stderr.contains("refused"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[tokio::test]
async fn the_runner_speaks_https_with_a_token_to_a_zkgate_that_wants_both() {
    let zk = zookeeper().await;
    let certificate = common::certificate();
    let (token, hash) = zkgate::auth::new_token();
    let auth = certificate.dir.path().join("auth.toml");
    std::fs::write(
        &auth,
        format!("[[principals]]\nname = \"ci\"\ntokens = [\"{hash}\"]\nadmin = true\n"),
    )
    .expect("auth config");
    let mut config = common::test_config(&zk.connect_string());
    config.tls_cert = Some(certificate.cert.clone());
    config.tls_key = Some(certificate.key.clone());
    config.auth_config = Some(auth);
    // Started as every other test starts it: ready once its ZooKeeper sessions are.
    let gate = Gate::start_with(config).await;
    let url = gate.url.clone();
    let ca = certificate.cert.to_str().expect("utf-8");

    // The command runs holding the lock, with its token, over TLS and with the bearer token.
    let (code, stderr) = Runner::start(
        &url,
        &["lock", "tls", "--ca", ca, "--token", &token],
        "test -n \"$ZKGATE_FENCING_TOKEN\"",
    )
    .exit()
    .await;
    assert_eq!(code, 0, "{stderr}");
    // Without the token: the server's 401, as a one-line reason.
    let (code, stderr) = Runner::start(&url, &["lock", "tls", "--ca", ca], "echo ran")
        .exit()
        .await;
    assert_eq!(code, 125, "{stderr}");
    assert!(stderr.starts_with("zkgate: ") && stderr.contains("token"), "{stderr}");
    // Without trusting the certificate: refused by the client.
    let (code, stderr) = Runner::start(&url, &["lock", "tls", "--token", &token], "echo ran")
        .exit()
        .await;
    assert_eq!(code, 125, "{stderr}");
}

#[tokio::test]
async fn two_runners_take_turns_and_the_second_command_starts_only_after_the_first_ended() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("log");
    let log = log.to_str().expect("utf-8");
    // Each command writes its start and its end to a shared log, with its token.
    let script = |me: &str| {
        format!(
            r#"echo "{me} start $ZKGATE_FENCING_TOKEN" >> {log}; echo "started $ZKGATE_FENCING_TOKEN"; read go; echo "{me} end" >> {log}"#
        )
    };
    let args = ["lock", "shared", "--ttl", TTL];
    let mut first = Runner::start(&gate.url, &args, &script("1"));
    let first_token: i64 = first.report("started").await[1].parse().expect("token");
    let mut second = Runner::start(&gate.url, &args, &script("2"));
    // The second runner is in the queue...
    wait_children(&zk.connect_string(), "/zkgate/locks/shared", 2).await;
    let state = gate.get("/v1/locks/shared").await;
    assert_eq!(state.body["waiters"].as_array().map(Vec::len), Some(1), "{state:?}");
    // ...and its command has not started.
    let logged = std::fs::read_to_string(log).expect("log");
    assert_eq!(logged, format!("1 start {first_token}\n"));

    first.tell("go").await;
    let second_token: i64 = second.report("started").await[1].parse().expect("token");
    assert!(second_token > first_token, "{second_token} > {first_token}");
    assert_eq!(first.exit().await.0, 0);
    second.tell("go").await;
    assert_eq!(second.exit().await.0, 0);
    let logged = std::fs::read_to_string(log).expect("log");
    assert_eq!(
        logged,
        format!("1 start {first_token}\n1 end\n2 start {second_token}\n2 end\n")
    );
    assert_eq!(holder(&gate, "shared").await, None);
}

/// One command's span in a shared log, by its own clock: `start <ns> <who>`, `end <ns> <who>`.
fn most_at_once(log: &str) -> (usize, usize) {
    let mut marks: Vec<(u128, i32)> = log
        .lines()
        .map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let at: u128 = words[1].parse().unwrap_or_else(|_| panic!("a time in {line:?}"));
            (at, if words[0] == "start" { 1 } else { -1 })
        })
        .collect();
    // At one instant an end counts before a start: the spans are half-open.
    marks.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, step) in &marks {
        now += step;
        most = most.max(now);
    }
    (most as usize, marks.iter().filter(|(_, step)| *step == 1).count())
}

#[tokio::test]
async fn lock_n_runs_at_most_n_commands_at_once_each_with_a_token_and_a_guard_of_its_permit() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("log");
    let log = log.to_str().expect("utf-8");
    // Each command logs its span by its own clock, says its token, name and guard, and waits.
    let script = |me: &str| {
        format!(
            r#"echo "start $(date +%s%N) {me}" >> {log}; echo "started $ZKGATE_FENCING_TOKEN $ZKGATE_SEMAPHORE"; echo "guard $ZKGATE_GUARD"; read go; echo "end $(date +%s%N) {me}" >> {log}"#
        )
    };
    let args = ["lock", "-n", "2", "pool", "--ttl", TTL];
    let mut first = Runner::start(&gate.url, &args, &script("1"));
    let mut second = Runner::start(&gate.url, &args, &script("2"));
    let mut tokens = Vec::new();
    let mut guards = Vec::new();
    for runner in [&mut first, &mut second] {
        let started = runner.report("started").await;
        assert_eq!(started[2], "pool", "{started:?}");
        tokens.push(started[1].parse::<i64>().expect("a token"));
        guards.push(runner.line("the guard").await["guard ".len()..].to_string());
    }
    assert_ne!(tokens[0], tokens[1]);
    // A permit's guard lets a write through while the permit is held.
    let put = crate::guards::kv(
        &gate.url,
        reqwest::Method::PUT,
        "fenced",
        Some(json!(1)),
        Some(&guards[0]),
    )
    .await;
    assert!(put.status.is_success(), "{put:?}");

    // The third waits: it holds the semaphore's lock, waiting for a permit to come back, and
    // its command has not started.
    let mut third = Runner::start(&gate.url, &args, &script("3"));
    wait_children(&zk.connect_string(), "/zkgate/semaphores/pool/locks", 1).await;
    let state = gate.get("/v1/semaphores/pool").await;
    let leases = |list: &str| -> std::collections::BTreeSet<String> {
        let nodes = state.body[list].as_array().expect("a list");
        nodes
            .iter()
            .map(|node| node["lease"].as_str().expect("a lease").to_string())
            .collect()
    };
    // (The waiter shows with both of its nodes: the lock it holds and its lease node.)
    let (holders, waiters) = (leases("holders"), leases("waiters"));
    assert_eq!((holders.len(), waiters.len()), (2, 1), "{state:?}");
    assert!(holders.is_disjoint(&waiters), "{state:?}");
    assert_eq!(std::fs::read_to_string(log).expect("log").lines().count(), 2);

    // The first ends: its permit goes to the third, whose token is newer than both.
    first.tell("go").await;
    assert_eq!(first.exit().await.0, 0);
    let third_token: i64 = third.report("started").await[1].parse().expect("a token");
    assert!(
        tokens.iter().all(|token| third_token > *token),
        "{third_token} after {tokens:?}"
    );
    // The first's guard no longer holds: the write is refused and nothing is written.
    let refused = crate::guards::kv(
        &gate.url,
        reqwest::Method::PUT,
        "fenced",
        Some(json!(2)),
        Some(&guards[0]),
    )
    .await;
    crate::guards::assert_lost(&refused, "semaphore/pool", "released");
    for runner in [second, third] {
        let mut runner = runner;
        runner.tell("go").await;
        assert_eq!(runner.exit().await.0, 0);
    }
    let (most, commands) = most_at_once(&std::fs::read_to_string(log).expect("log"));
    assert_eq!(
        (most, commands),
        (2, 3),
        "at most two of the three at once, by their own clocks"
    );
    let state = gate.get("/v1/semaphores/pool").await;
    assert_eq!(state.body["holder_count"].as_u64(), Some(0), "{state:?}");
}

#[tokio::test]
async fn a_revocation_stops_the_command_with_sigterm_and_the_runner_exits() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    // `wait` returns as soon as a trapped signal arrives (`read` might not).
    let script = r#"trap 'echo TERM; exit 143' TERM; echo started; sleep 60 & wait"#;
    let args = ["lock", "deploy", "--ttl", TTL, "--grace", "5s"];
    let mut runner = Runner::start(&gate.url, &args, script);
    runner.report("started").await;

    let revoked = gate
        .post(
            "/v1/locks/deploy/revoke",
            Some(json!({"by": "test", "reason": "x", "grace": "1s"})),
        )
        .await;
    assert_eq!(revoked.status, StatusCode::ACCEPTED, "{revoked:?}");
    assert_eq!(runner.line("the trap's report").await, "TERM");
    let (code, stderr) = runner.exit().await;
    assert_eq!(code, 143, "{stderr}");
    assert!(
        stderr.starts_with(
            r#"zkgate: lock "deploy" revoked by test (x), taken back in 1s; stopping the command (SIGTERM"#
        ),
        "{stderr}"
    );
    assert_eq!(holder(&gate, "deploy").await, None);
}

/// Whether process `pid` runs (a zombie does not).
fn runs(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

#[tokio::test]
async fn a_command_that_ignores_sigterm_is_killed_with_its_children_after_the_grace() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let script = r#"trap '' TERM; sleep 60 & echo "started $ZKGATE_LEASE $!"; wait"#;
    let args = ["lock", "stubborn", "--ttl", TTL, "--grace", "1s"];
    let mut runner = Runner::start(&gate.url, &args, script);
    let started = runner.report("started").await;
    let (lease, sleeper) = (&started[1], started[2].parse::<i32>().expect("pid"));
    assert!(runs(sleeper));

    // The lock is lost: its lease ends (as when it expires, or zkgate loses its session).
    let lost = Instant::now();
    let deleted = gate.delete(&format!("/v1/leases/{lease}")).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{deleted:?}");
    let (code, stderr) = runner.exit().await;
    let took = lost.elapsed();
    assert_eq!(code, 128 + 9, "{stderr}");
    assert!(
        took >= Duration::from_secs(1),
        "SIGKILL came after {took:?}, before the grace"
    );
    assert!(took < Duration::from_secs(10), "SIGKILL came after {took:?}");
    assert!(
        stderr.contains(r#"zkgate: lock "stubborn" lost"#) && stderr.contains("sending SIGKILL"),
        "{stderr}"
    );
    // The whole process group was killed, the command's children too.
    ended(sleeper).await;
    assert!(!runs(sleeper));
}

/// A TCP forwarder to a zkgate that can cut every connection and refuse new ones: zkgate
/// becomes unreachable for whoever goes through it, while it keeps running for the test.
struct Cuttable {
    url: String,
    cut: tokio::sync::watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Cuttable {
    async fn start(target: std::net::SocketAddr) -> Cuttable {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let (cut, cuts) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if *cuts.borrow() {
                    continue; // dropped: refused
                }
                let mut cuts = cuts.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cuts.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        Cuttable { url, cut, task }
    }

    fn cut(&self) {
        self.cut.send_replace(true);
    }
}

impl Drop for Cuttable {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test]
async fn when_no_keepalive_gets_through_for_a_ttl_the_command_is_stopped() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let path = Cuttable::start(gate.running.addr).await;
    let script = r#"trap 'echo TERM; exit 143' TERM; echo started; sleep 60 & wait"#;
    let args = ["lock", "island", "--ttl", TTL, "--grace", "1s"];
    let mut runner = Runner::start(&path.url, &args, script);
    runner.report("started").await;

    let cut = Instant::now();
    path.cut();
    assert_eq!(runner.line("the trap's report").await, "TERM");
    // The last keepalive got through at most a third of the TTL before the cut.
    let took = cut.elapsed();
    assert!(took >= Duration::from_millis(1300), "stopped {took:?} after the cut");
    let (code, stderr) = runner.exit().await;
    assert_eq!(code, 143, "{stderr}");
    assert!(
        stderr.contains(
            r#"zkgate: lock "island" lost: no keepalive got through for a whole TTL (2s): cannot reach zkgate"#
        ),
        "{stderr}"
    );
    assert!(stderr.contains("zkgate: could not delete lease"), "{stderr}");
    // zkgate, which heard nothing either, let the lease expire and the lock go.
    let mut ws = common::ws::Ws::connect(gate.running.addr, "/v1/ws").await;
    ws.send(json!({"op": "subscribe", "id": "l", "topic": {"lock": "island"}}));
    within(Duration::from_secs(30), "the lock to be free", async {
        while !ws.next_for("l").await["state"]["holder"].is_null() {}
    })
    .await;
}

#[tokio::test]
async fn signals_to_the_runner_reach_the_command_or_end_the_wait() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let script = r#"trap 'echo TERM; exit 143' TERM; echo started; sleep 60 & wait"#;
    let args = ["lock", "signals", "--ttl", TTL];
    let mut runner = Runner::start(&gate.url, &args, script);
    runner.report("started").await;

    // Ctrl-C while waiting for the lock: the waiter leaves the queue and exits 130.
    let waiter = Runner::start(&gate.url, &args, "echo ran");
    wait_children(&zk.connect_string(), "/zkgate/locks/signals", 2).await;
    waiter.signal(libc::SIGINT);
    let (code, stderr) = waiter.exit().await;
    assert_eq!(code, 130, "{stderr}");
    assert!(stderr.contains("interrupted while waiting"), "{stderr}");
    let state = gate.get("/v1/locks/signals").await;
    assert_eq!(state.body["waiters"], json!([]), "{state:?}");

    // SIGTERM to a runner whose command runs: passed on, and the runner exits with it.
    runner.signal(libc::SIGTERM);
    assert_eq!(runner.line("the trap's report").await, "TERM");
    let (code, stderr) = runner.exit().await;
    assert_eq!(code, 143, "{stderr}");
    assert_eq!(holder(&gate, "signals").await, None);
}

#[tokio::test]
async fn the_elect_runner_runs_its_command_while_leading_and_the_next_takes_over() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let leader = |name: &str| format!(r#"echo "leader $ZKGATE_FENCING_TOKEN $ZKGATE_LEASE $ZKGATE_ELECTION {name}""#);
    let first_script = format!("{}; read go", leader("a"));
    let args = ["elect", "jobs", "--ttl", TTL, "--grace", "1s", "--value"];
    let mut first = Runner::start(&gate.url, &[&args[..], &["a"]].concat(), &first_script);
    let a = first.report("leader").await;
    let (a_term, a_lease) = (a[1].parse::<i64>().expect("term"), &a[2]);
    assert_eq!(a[3], "jobs");
    let state = gate.get("/v1/elections/jobs").await;
    assert_eq!(state.body["leader"]["lease"], a_lease.as_str(), "{state:?}");
    assert_eq!(state.body["leader"]["term"], a_term);
    assert_eq!(state.body["leader"]["value"], "a");

    let second_script = format!("trap 'echo TERM; exit 143' TERM; {}; sleep 60 & wait", leader("b"));
    let mut second = Runner::start(&gate.url, &[&args[..], &[r#"{"host":"b"}"#]].concat(), &second_script);
    // Candidates a and b, and the leader's acknowledgement node.
    wait_children(&zk.connect_string(), "/zkgate/elections/jobs", 3).await;
    first.tell("go").await;
    assert_eq!(first.exit().await.0, 0);
    let b = second.report("leader").await;
    let (b_term, b_lease) = (b[1].parse::<i64>().expect("term"), &b[2]);
    assert!(b_term > a_term, "{b_term} > {a_term}");
    let state = gate.get("/v1/elections/jobs").await;
    assert_eq!(state.body["leader"]["lease"], b_lease.as_str(), "{state:?}");
    assert_eq!(state.body["leader"]["value"], json!({"host": "b"}));

    // Leadership lost (its lease ends): the command is stopped.
    let deleted = gate.delete(&format!("/v1/leases/{b_lease}")).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{deleted:?}");
    assert_eq!(second.line("the trap's report").await, "TERM");
    let (code, stderr) = second.exit().await;
    assert_eq!(code, 143, "{stderr}");
    assert!(stderr.contains(r#"zkgate: leadership of "jobs" lost"#), "{stderr}");
    let state = gate.get("/v1/elections/jobs").await;
    assert!(state.body["leader"].is_null(), "{state:?}");
}
