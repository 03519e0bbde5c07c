//! The README's walkthroughs, pasted as a newcomer would: each section on a fresh zkgate of its
//! own (`scripts/readme_walkthroughs.py`, which says how the expected outputs written in the
//! README are checked and which blocks cannot run here and why), each under a root of its own
//! on the test's ZooKeeper (that `zkgate serve` starts an embedded one is `cli`'s test).

use crate::common;

use std::time::Duration;

#[tokio::test]
async fn the_readme_walkthroughs_run_as_written() {
    let zk = common::zookeeper().await;
    let mut command = tokio::process::Command::new("python3");
    command
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/readme_walkthroughs.py"))
        .arg("--zkgate")
        .arg(env!("CARGO_BIN_EXE_zkgate"))
        .arg("--zookeeper")
        .arg(zk.connect_string());
    let report = common::run_to_success(command, Duration::from_secs(600), "the walkthroughs").await;
    // Sections are run, not merely skipped.
    let ran = report.lines().filter(|l| l.starts_with("ok ")).count();
    assert!(ran >= 15, "only {ran} walkthroughs ran:\n{report}");
    println!("{report}");
}
