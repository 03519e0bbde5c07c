//! The `zkgate` binary as a user runs it: `serve` with its embedded ZooKeeper (started on a
//! free port, serving locks, stopped on exit), and the one-line errors for what is missing or
//! wrong on the command line.

use crate::common;

use std::process::Stdio;
use std::time::Duration;

use common::within;
use reqwest::StatusCode;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use zkgate::zk::server::free_port;

const ZKGATE: &str = env!("CARGO_BIN_EXE_zkgate");

/// Runs `zkgate` with `args` to completion; returns (success, stderr).
async fn run(args: &[&str], env: &[(&str, &str)], clear_env: bool) -> (bool, String) {
    let mut command = Command::new(ZKGATE);
    if clear_env {
        command.env_clear();
    }
    command
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let output = within(Duration::from_secs(60), "zkgate to exit", command.output())
        .await
        .expect("run zkgate");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).to_string(),
    )
}

#[tokio::test]
async fn serve_refuses_bad_settings_with_a_clear_message() {
    let (ok, stderr) = run(&["serve", "--zookeeper", "127.0.0.1:1", "--root", "zkgate"], &[], false).await;
    assert!(!ok);
    assert!(stderr.contains("must start with `/`"), "{stderr}");

    let args = [
        "serve",
        "--zookeeper",
        "127.0.0.1:1",
        "--lease-ttl-min",
        "10s",
        "--lease-ttl-max",
        "5s",
    ];
    let (ok, stderr) = run(&args, &[], false).await;
    assert!(!ok);
    assert!(stderr.contains("--lease-ttl-min"), "{stderr}");

    let (ok, stderr) = run(
        &["serve", "--zookeeper", "127.0.0.1:1", "--max-wait", "soon"],
        &[],
        false,
    )
    .await;
    assert!(!ok);
    assert!(stderr.contains("soon"), "{stderr}");

    let (ok, stderr) = run(
        &["serve", "--zookeeper", "127.0.0.1:1", "--zookeeper-sessions", "0"],
        &[],
        false,
    )
    .await;
    assert!(!ok);
    assert!(
        stderr.contains("--zookeeper-sessions") && stderr.contains("1..=64"),
        "{stderr}"
    );
}

#[tokio::test]
async fn the_embedded_zookeeper_needs_java_and_zookeeper_and_says_how_to_get_them() {
    let (ok, stderr) = run(&["serve"], &[("PATH", "/nonexistent")], true).await;
    assert!(!ok);
    assert!(
        stderr.contains("Java was not found") && stderr.contains("apt-get install"),
        "{stderr}"
    );

    let empty = tempfile::tempdir().expect("tempdir");
    let path = std::env::var("PATH").unwrap_or_default();
    let env = [
        ("PATH", path.as_str()),
        ("ZOOKEEPER_HOME", empty.path().to_str().expect("utf-8")),
    ];
    let (ok, stderr) = run(&["serve"], &env, true).await;
    assert!(!ok);
    assert!(
        stderr.contains("ZooKeeper was not found") && stderr.contains("apt-get install zookeeper"),
        "{stderr}"
    );
}

/// `zkgate serve <args>` with its log (stdout, level info) as lines; killed when dropped. It
/// leads a process group of its own, as a command started from a shell's prompt does.
fn serve_logging(
    args: &[&str],
) -> (
    tokio::process::Child,
    tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
) {
    let mut child = Command::new(ZKGATE)
        .arg("serve")
        .args(args)
        .env("ZKGATE_LOG", "info")
        .env_remove("ZKGATE_AUTH_CONFIG")
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .expect("start zkgate");
    let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    (child, lines)
}

#[tokio::test]
async fn serve_runs_an_embedded_zookeeper_serves_locks_and_stops_it_on_exit() {
    let port = free_port().expect("port");
    let data = tempfile::tempdir().expect("tempdir");
    let data_dir = data.path().to_str().expect("utf-8");
    let (mut child, mut lines) = serve_logging(&[
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--zookeeper-data-dir",
        data_dir,
    ]);
    let log = until_serving(&mut lines).await;
    let zookeeper = log
        .iter()
        .find_map(|line| {
            Some(
                line[line.find("connect=")? + 8..]
                    .split_whitespace()
                    .next()?
                    .to_string(),
            )
        })
        .expect("the log names the embedded ZooKeeper's address");
    assert!(
        data.path().join("zoo.cfg").is_file(),
        "the data directory given is used"
    );

    let url = format!("http://127.0.0.1:{port}");
    let ready = common::http_client()
        .get(format!("{url}/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status(), StatusCode::OK);
    let grant = take_the_lock(port).await;
    assert!(grant["fencing_token"].as_i64().is_some(), "{grant}");

    // SIGTERM: zkgate exits, and its ZooKeeper goes with it.
    let pid = child.id().expect("pid") as libc::pid_t;
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let status = within(Duration::from_secs(30), "zkgate to exit", child.wait())
        .await
        .expect("wait");
    assert!(status.success(), "{status}");
    // zkgate kills and reaps its ZooKeeper before it exits, so the port is closed by now.
    assert!(
        tokio::net::TcpStream::connect(&zookeeper).await.is_err(),
        "the embedded ZooKeeper still runs"
    );
}

/// Reads zkgate's log until it says it serves: the lines so far.
async fn until_serving(lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>) -> Vec<String> {
    let mut log = Vec::new();
    within(Duration::from_secs(60), "zkgate to report it serves", async {
        while let Some(line) = lines.next_line().await.expect("read log") {
            let serving = line.contains("zkgate serving");
            log.push(line);
            if serving {
                return;
            }
        }
        panic!("zkgate exited before serving:\n{}", log.join("\n"));
    })
    .await;
    log
}

/// Takes the lock `cli` on the zkgate at `port` (a lease is made for it): the grant.
async fn take_the_lock(port: u16) -> serde_json::Value {
    let grant = common::http_client()
        .post(format!("http://127.0.0.1:{port}/v1/locks/cli/acquire?wait=5s"))
        .send()
        .await
        .expect("acquire");
    assert_eq!(grant.status(), StatusCode::OK);
    grant.json().await.expect("json")
}

/// A Ctrl-C in the terminal goes to the whole foreground process group. It must reach zkgate
/// alone: were the embedded ZooKeeper to die with it, zkgate's sessions would be cut before it
/// could close them, and it would wait out their timeout (it did, for 14 s, with its locks
/// held that long for everyone else).
#[tokio::test]
async fn a_ctrl_c_stops_zkgate_before_its_embedded_zookeeper() {
    let port = free_port().expect("port");
    let (mut child, mut lines) = serve_logging(&["--listen", &format!("127.0.0.1:{port}")]);
    until_serving(&mut lines).await;
    take_the_lock(port).await;
    let pid = child.id().expect("pid") as libc::pid_t;
    // SAFETY: kill(2) on the process group our child leads, as a terminal's Ctrl-C does.
    unsafe { libc::kill(-pid, libc::SIGINT) };
    let mut log = Vec::new();
    within(Duration::from_secs(30), "zkgate's log to end", async {
        while let Some(line) = lines.next_line().await.expect("read log") {
            log.push(line);
        }
    })
    .await;
    let status = within(Duration::from_secs(30), "zkgate to exit", child.wait())
        .await
        .expect("wait");
    assert!(status.success(), "{status}");
    let log = log.join("\n");
    assert!(log.contains("leases handed over for shutdown leases=1"), "{log}");
    assert!(
        !log.contains("ZooKeeper connection lost"),
        "ZooKeeper stopped under zkgate's sessions:\n{log}"
    );
}

#[tokio::test]
async fn openapi_prints_the_spec() {
    let output = Command::new(ZKGATE).arg("openapi").output().await.expect("run");
    assert!(output.status.success());
    let printed: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(printed["info"]["title"], "zkgate");
    assert!(printed["paths"]["/v1/locks/{name}/acquire"]["post"].is_object());
}

#[tokio::test]
async fn serving_beyond_loopback_without_tokens_is_warned_about_loudly() {
    let port = free_port().expect("port");
    let (_child, mut lines) = serve_logging(&["--listen", &format!("0.0.0.0:{port}"), "--zookeeper", "127.0.0.1:1"]);
    within(Duration::from_secs(30), "the warning", async {
        while let Some(line) = lines.next_line().await.expect("read log") {
            if line.contains("AUTHENTICATION IS OFF") && line.contains(&format!("0.0.0.0:{port}")) {
                return;
            }
        }
        panic!("zkgate exited without warning");
    })
    .await;
}

#[tokio::test]
async fn token_makes_a_token_and_its_config_line_and_a_bad_auth_config_is_refused() {
    let output = Command::new(ZKGATE).arg("token").output().await.expect("run");
    assert!(output.status.success());
    let token = String::from_utf8_lossy(&output.stdout).trim().to_string();
    let advice = String::from_utf8_lossy(&output.stderr).to_string();
    let line = advice
        .lines()
        .find_map(|l| l.trim().strip_prefix("tokens = "))
        .unwrap_or_else(|| panic!("no config line in {advice}"));
    let config = format!("[[principals]]\nname = \"ci\"\ntokens = {line}\nadmin = true\n");
    let authority = zkgate::auth::Authority::parse(&config).expect("the printed line is valid config");
    assert!(authority.principal(&token).is_some(), "the token matches its line");

    let (ok, stderr) = run(
        &[
            "serve",
            "--zookeeper",
            "127.0.0.1:1",
            "--auth-config",
            "/nonexistent/auth.toml",
        ],
        &[],
        false,
    )
    .await;
    assert!(!ok);
    assert!(stderr.contains("cannot read /nonexistent/auth.toml"), "{stderr}");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("auth.toml");
    std::fs::write(&path, "[[principals]]\nname = \"a\"\ntokens = [\"plaintext\"]\n").expect("write");
    let (ok, stderr) = run(
        &[
            "serve",
            "--zookeeper",
            "127.0.0.1:1",
            "--auth-config",
            path.to_str().expect("utf-8"),
        ],
        &[],
        false,
    )
    .await;
    assert!(!ok);
    assert!(
        stderr.contains("sha256:") && stderr.contains("zkgate token"),
        "{stderr}"
    );
}

/// `zkgate <args>` to its end: its stdout.
async fn stdout_of(args: &[&str]) -> String {
    let output = within(
        Duration::from_secs(60),
        "zkgate to exit",
        Command::new(ZKGATE)
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("run zkgate");
    assert!(
        output.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8")
}

#[tokio::test]
async fn help_lists_every_subcommand_and_completions_and_manual_pages_cover_each() {
    // `zkgate --help`: one line a subcommand.
    let help = stdout_of(&["--help"]).await;
    let listed: Vec<(String, String)> = (help.lines())
        .skip_while(|line| !line.starts_with("Commands:"))
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| {
            line.trim()
                .split_once(' ')
                .map(|(name, about)| (name.to_string(), about.trim().to_string()))
        })
        .filter(|(name, _)| name != "help")
        .collect();
    let names: Vec<&str> = listed.iter().map(|(name, _)| name.as_str()).collect();
    for expected in [
        "serve",
        "lock",
        "elect",
        "watch",
        "kv",
        "lease",
        "counter",
        "leader",
        "queue",
        "completions",
        "man",
    ] {
        assert!(names.contains(&expected), "`{expected}` in --help: {help}");
    }
    assert!(listed.iter().all(|(_, about)| !about.is_empty()), "{help}");

    // A completion script for every shell clap knows, covering each subcommand; bash's loads.
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = stdout_of(&["completions", shell]).await;
        for name in &names {
            assert!(script.contains(name), "{shell}'s completions name `{name}`");
        }
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let bash = dir.path().join("zkgate.bash");
    std::fs::write(&bash, stdout_of(&["completions", "bash"]).await).expect("write");
    let loaded = Command::new("bash")
        .args(["-c", &format!("source {} && complete -p zkgate", bash.display())])
        .output()
        .await
        .expect("bash");
    assert!(
        String::from_utf8_lossy(&loaded.stdout).contains("-F _zkgate zkgate"),
        "{loaded:?}"
    );

    // The manual: one page, and one page a subcommand with its options and exit statuses.
    assert!(stdout_of(&["man"]).await.starts_with(".ie"), "roff");
    let pages = dir.path().join("man1");
    stdout_of(&["man", pages.to_str().expect("UTF-8")]).await;
    for name in &names {
        let page = std::fs::read_to_string(pages.join(format!("zkgate-{name}.1"))).expect("a page");
        assert!(page.contains(&format!("zkgate\\-{name}")), "{name}'s page names it");
    }
    for name in ["lock", "watch", "kv", "queue"] {
        let page = std::fs::read_to_string(pages.join(format!("zkgate-{name}.1"))).expect("a page");
        assert!(page.contains("Exit status"), "{name}'s page says its exit statuses");
    }
}
