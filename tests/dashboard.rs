//! The dashboard in a real browser: Debian's chromium, driven by playwright-core from npm
//! (`tests/browser/`), opens the page of a real zkgate on a real ZooKeeper, and checks that the
//! lock's holder, its number of waiters and the queue's depth change live as HTTP clients act.
//! The screenshot lands in the target directory (or at `ZKGATE_SCREENSHOT`).

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{Gate, within, zookeeper};

#[tokio::test]
async fn the_dashboard_follows_contention_and_queue_traffic_live() {
    let browser_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
    assert!(
        browser_dir.join("node_modules/playwright-core").exists(),
        "playwright-core is not installed: run `npm ci --prefix tests/browser` (scripts/test.sh does)"
    );
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let screenshot = std::env::var_os("ZKGATE_SCREENSHOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png"));
    let _ = std::fs::remove_file(&screenshot);
    let run = tokio::process::Command::new("node")
        .arg(browser_dir.join("dashboard.mjs"))
        .arg(&gate.url)
        .arg(&screenshot)
        .kill_on_drop(true)
        .output();
    let output = within(Duration::from_secs(120), "the browser run", run)
        .await
        .expect("run node");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "the browser check failed:\n{report}");
    let png = std::fs::read(&screenshot).expect("the screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
    println!("{report}");
}
