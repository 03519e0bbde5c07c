//! The Java peers of `tests/interop/` (Apache Curator from Debian's packages), run by Java's
//! source launcher: no compile step.

/// Where the peers' sources and `classpath.sh` are.
pub const INTEROP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop");

/// The command that runs `tests/interop/<class>.java` with `args` on the Curator class path.
pub fn command(class: &str, args: &[&str]) -> tokio::process::Command {
    let classpath = std::process::Command::new(format!("{INTEROP}/classpath.sh"))
        .output()
        .expect("classpath.sh");
    let classpath = String::from_utf8(classpath.stdout).expect("utf-8").trim().to_string();
    let mut command = tokio::process::Command::new("java");
    command
        .args(["-cp", &classpath, &format!("{INTEROP}/{class}.java")])
        .args(args);
    command
}
