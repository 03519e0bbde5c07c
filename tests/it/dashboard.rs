//! The dashboard in a real browser: Debian's chromium, driven by playwright-core from npm
//! (`tests/browser/`), opens the page of a real zkgate on a real ZooKeeper, and checks that the
//! lock's holder, its number of waiters and the queue's depth change live as HTTP clients act.
//! The screenshot lands in the target directory (or at `ZKGATE_SCREENSHOT`).

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use common::{Gate, make_contended, test_config, zk_client, zookeeper, zookeeper_own};
use futures::StreamExt;

fn browser_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
    assert!(
        dir.join("node_modules/playwright-core").exists(),
        "playwright-core is not installed: run `npm ci --prefix tests/browser` (scripts/test.sh does)"
    );
    dir
}

/// Runs a browser script to completion (bounded); panics with its output unless it succeeds.
async fn run_script(command: tokio::process::Command) -> String {
    common::run_to_success(command, Duration::from_secs(120), "the browser check").await
}

#[tokio::test]
async fn the_dashboard_follows_contention_and_queue_traffic_live() {
    let browser_dir = browser_dir();
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let screenshot = std::env::var_os("ZKGATE_SCREENSHOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png"));
    let _ = std::fs::remove_file(&screenshot);
    let mut command = tokio::process::Command::new("node");
    command
        .arg(browser_dir.join("dashboard.mjs"))
        .arg(&gate.url)
        .arg(&screenshot);
    let report = run_script(command).await;
    let png = std::fs::read(&screenshot).expect("the screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
    println!("{report}");
}

/// Over HTTPS, chromium gets the page by HTTP/2 (ALPN `h2`) and the dashboard's socket by
/// HTTP/1.1, and the page is live (`tests/browser/http2.mjs`).
#[tokio::test]
async fn over_https_the_dashboard_comes_by_http2_and_is_live() {
    let browser_dir = browser_dir();
    let zk = zookeeper().await;
    let certificate = common::certificate();
    let mut config = test_config(&zk.connect_string());
    config.tls_cert = Some(certificate.cert.clone());
    config.tls_key = Some(certificate.key.clone());
    let gate = Gate::start_with(config).await;
    let mut command = tokio::process::Command::new("node");
    command
        .arg(browser_dir.join("http2.mjs"))
        .arg(format!("https://127.0.0.1:{}", gate.running.addr.port()))
        .env("NODE_EXTRA_CA_CERTS", &certificate.cert);
    println!("{}", run_script(command).await);
}

#[tokio::test]
async fn with_auth_the_dashboard_asks_for_a_token_and_is_live_once_signed_in() {
    let browser_dir = browser_dir();
    let zk = zookeeper().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (token, hash) = zkgate::auth::new_token();
    let path = dir.path().join("auth.toml");
    std::fs::write(
        &path,
        format!("[[principals]]\nname = \"ops\"\ntokens = [\"{hash}\"]\nadmin = true\n"),
    )
    .expect("write auth config");
    let mut config = test_config(&zk.connect_string());
    config.auth_config = Some(path);
    let gate = Gate::start_with(config).await;
    let mut command = tokio::process::Command::new("node");
    command
        .arg(browser_dir.join("signin.mjs"))
        .arg(&gate.url)
        .env("TOKEN", &token);
    println!("{}", run_script(command).await);
}

/// 10,000 locks (held by a peer, a few contended) and 1,000 queues: the page is usable soon
/// after it opens (the time is printed, and quoted in BENCHMARKS.md), follows only what it
/// shows, and what the page, zkgate and ZooKeeper hold stays bounded (`tests/browser/scale.mjs`).
#[tokio::test]
async fn the_dashboard_stays_usable_at_ten_thousand_locks_and_a_thousand_queues() {
    const LOCKS: usize = 10_000;
    const QUEUES: usize = 1_000;
    let browser_dir = browser_dir();
    let zk = zookeeper_own().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let peer = zk_client(&zk.connect_string()).await;
    let base = format!("{}/locks", gate.running.state.config.root);
    // `lock-00007` is the most contended, nine others have one waiter each.
    let locks: Vec<(String, usize)> = (0..LOCKS)
        .map(|i| {
            let contenders = match (i, i % 1000) {
                (7, _) => 8,
                (_, 7) => 2,
                _ => 1,
            };
            (format!("lock-{i:05}"), contenders)
        })
        .collect();
    make_contended(&peer, &base, &locks).await;
    let puts = futures::stream::iter(0..QUEUES)
        .map(|i| {
            let gate = &gate;
            async move {
                gate.post(
                    &format!("/v1/queues/queue-{i:04}/items"),
                    Some(serde_json::json!({ "i": i })),
                )
                .await
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    assert!(
        puts.iter().all(|p| p.status == reqwest::StatusCode::CREATED),
        "every put stored"
    );
    let screenshot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard-scale.png");
    let mut command = tokio::process::Command::new("node");
    command
        .arg(browser_dir.join("scale.mjs"))
        .arg(&gate.url)
        .arg(zk.client_port().to_string())
        .arg(LOCKS.to_string())
        .arg(QUEUES.to_string())
        .arg(&screenshot);
    println!("{}", run_script(command).await);
    drop(peer);
}
