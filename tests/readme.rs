//! The README's walkthroughs, pasted as a newcomer would: each section on a fresh zkgate of its
//! own (`scripts/readme_walkthroughs.py`, which says how the expected outputs written in the
//! README are checked and which blocks cannot run here and why).

use std::time::Duration;

#[tokio::test]
async fn the_readme_walkthroughs_run_as_written() {
    let root = env!("CARGO_MANIFEST_DIR");
    let run = tokio::process::Command::new("python3")
        .arg(format!("{root}/scripts/readme_walkthroughs.py"))
        .arg("--zkgate")
        .arg(env!("CARGO_BIN_EXE_zkgate"))
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(600), run)
        .await
        .expect("the walkthroughs finish within 10 minutes")
        .expect("run python3");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "a walkthrough failed:\n{report}");
    // Sections are run, not merely skipped.
    let ran = report.lines().filter(|l| l.starts_with("ok ")).count();
    assert!(ran >= 15, "only {ran} walkthroughs ran:\n{report}");
    println!("{report}");
}
