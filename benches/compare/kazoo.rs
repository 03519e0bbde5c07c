//! kazoo's recipes (Lock, LockingQueue, Election) on the same ZooKeeper, run by
//! `kazoo_bench.py` with Debian's `python3-kazoo`, one thread and one session per client.

use std::time::Duration;

use serde_json::Value;

pub struct Kazoo {
    hosts: String,
}

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/compare/kazoo_bench.py");

impl Kazoo {
    /// `None` when kazoo is not installed (`apt-get install python3-kazoo`).
    pub fn new(hosts: &str) -> Option<Kazoo> {
        let found = std::process::Command::new("/usr/bin/python3")
            .args(["-c", "import kazoo"])
            .status()
            .is_ok_and(|s| s.success());
        found.then(|| Kazoo {
            hosts: hosts.to_string(),
        })
    }

    fn run(&self, args: &[String]) -> Value {
        let output = std::process::Command::new("/usr/bin/python3")
            .arg(SCRIPT)
            .arg(&self.hosts)
            .args(args)
            .output()
            .expect("run kazoo_bench.py");
        assert!(
            output.status.success(),
            "kazoo_bench.py {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).expect("JSON from kazoo_bench.py")
    }

    fn samples(value: &Value) -> Vec<Duration> {
        value["samples_us"]
            .as_array()
            .expect("samples")
            .iter()
            .map(|us| Duration::from_secs_f64(us.as_f64().unwrap_or(0.0) / 1e6))
            .collect()
    }

    pub fn cycles(&self, count: usize) -> Vec<Duration> {
        Kazoo::samples(&self.run(&["cycles".into(), count.to_string()]))
    }

    pub fn contended(&self, clients: usize, locks: usize, duration: Duration) -> f64 {
        let args = [
            "contended".into(),
            clients.to_string(),
            locks.to_string(),
            format!("{:.1}", duration.as_secs_f64()),
        ];
        self.run(&args)["rate"].as_f64().expect("rate")
    }

    pub fn queue_put(&self, producers: usize, duration: Duration) -> f64 {
        let args = [
            "queue_put".into(),
            producers.to_string(),
            format!("{:.1}", duration.as_secs_f64()),
        ];
        self.run(&args)["rate"].as_f64().expect("rate")
    }

    pub fn queue_take(&self, consumers: usize, items: usize) -> f64 {
        let result = self.run(&["queue_take".into(), consumers.to_string(), items.to_string()]);
        assert_eq!(
            result["taken"].as_u64(),
            Some(items as u64),
            "kazoo took every item once"
        );
        result["rate"].as_f64().expect("rate")
    }

    /// Open loop (see `stats::open_loop`): lock-and-release cycles due at `rate` a second for
    /// `duration`, run by `clients` threads (sessions); the latency of each acquire from when
    /// it was due.
    pub fn lock_load(&self, clients: usize, rate: f64, duration: Duration) -> Vec<Duration> {
        self.open_loop("lock_load", clients, rate, duration)
    }

    /// Open loop: takes (each consumed after) due at `rate` a second for `duration` from a
    /// queue filled first, by `consumers` threads; the latency of each take from when it was due.
    pub fn take_load(&self, consumers: usize, rate: f64, duration: Duration) -> Vec<Duration> {
        self.open_loop("take_load", consumers, rate, duration)
    }

    fn open_loop(&self, workload: &str, workers: usize, rate: f64, duration: Duration) -> Vec<Duration> {
        let args = [
            workload.to_string(),
            workers.to_string(),
            format!("{rate:.3}"),
            format!("{:.1}", duration.as_secs_f64()),
        ];
        Kazoo::samples(&self.run(&args))
    }

    pub fn failover(&self, rounds: usize) -> Vec<Duration> {
        Kazoo::samples(&self.run(&["failover".into(), rounds.to_string()]))
    }
}
