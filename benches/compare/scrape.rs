//! Where a request's time goes inside zkgate and ZooKeeper during one point of the open loop:
//! zkgate's `/metrics` before and after (the stages of a request, its ZooKeeper requests, the
//! runtime's delay, the requests shed) and ZooKeeper's own latency (`srst`, then `mntr`).

use std::collections::HashMap;
use std::io::{Read, Write};

/// The series of zkgate's `/metrics` that say where time goes, by their full name (labels
/// included): cumulative at a scrape, or the difference of two.
pub struct Scrape(HashMap<String, f64>);

const SERIES: &[&str] = &[
    "zkgate_request_stage_seconds",
    "zkgate_zookeeper_request_duration_seconds",
    "zkgate_runtime_delay_seconds",
    "zkgate_requests_shed_total",
];

impl Scrape {
    pub fn parse(text: &str) -> Scrape {
        let series = text
            .lines()
            .filter(|line| SERIES.iter().any(|s| line.starts_with(s)))
            .filter_map(|line| {
                let (name, value) = line.rsplit_once(' ')?;
                Some((name.to_string(), value.parse().ok()?))
            })
            .collect();
        Scrape(series)
    }

    /// What happened between `before` and this scrape.
    pub fn since(&self, before: &Scrape) -> Scrape {
        Scrape(
            self.0
                .iter()
                .map(|(name, value)| (name.clone(), value - before.0.get(name).copied().unwrap_or(0.0)))
                .collect(),
        )
    }

    fn get(&self, name: &str) -> f64 {
        self.0.get(name).copied().unwrap_or(0.0)
    }

    /// Of the histogram `name` with the labels `labels` (`stage="admitted"`, or empty): how
    /// many, their mean and the bound of the bucket that holds the 99th percentile (seconds).
    pub fn histogram(&self, name: &str, labels: &str) -> Option<(f64, f64, f64)> {
        let braces = |more: &str| match (labels.is_empty(), more.is_empty()) {
            (true, true) => String::new(),
            (true, false) => format!("{{{more}}}"),
            (false, true) => format!("{{{labels}}}"),
            (false, false) => format!("{{{labels},{more}}}"),
        };
        let count = self.get(&format!("{name}_count{}", braces("")));
        if count < 1.0 {
            return None;
        }
        let mean = self.get(&format!("{name}_sum{}", braces(""))) / count;
        let mut buckets: Vec<(f64, f64)> = self
            .0
            .iter()
            .filter_map(|(series, n)| {
                let rest = series.strip_prefix(&format!("{name}_bucket{{"))?;
                let rest = match labels.is_empty() {
                    true => rest,
                    false => rest.strip_prefix(labels)?.strip_prefix(',')?,
                };
                let bound = rest.strip_prefix("le=\"")?.strip_suffix("\"}")?;
                Some((bound.parse::<f64>().unwrap_or(f64::INFINITY), *n))
            })
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        let p99 = buckets
            .iter()
            .find(|(_, n)| *n >= 0.99 * count)
            .map_or(f64::INFINITY, |(bound, _)| *bound);
        Some((count, mean, p99))
    }

    /// One line: each stage's mean and 99th percentile's bucket, the ZooKeeper requests', the
    /// runtime's delay, the requests shed.
    pub fn show(&self) -> String {
        let shown = |what: &str, figures: Option<(f64, f64, f64)>| {
            figures.map(|(_, mean, p99)| format!("{what} {} / {}", micros(mean), bound(p99)))
        };
        let stages = [
            ("admitted", "taken", "admitted"),
            ("answered", "taken", "answered"),
            ("written", "taken", "written"),
            ("answered", "none", "answered (no turn: releases, acks)"),
        ];
        let mut parts: Vec<String> = stages
            .iter()
            .filter_map(|(stage, turn, what)| {
                shown(
                    what,
                    self.histogram(
                        "zkgate_request_stage_seconds",
                        &format!("stage=\"{stage}\",turn=\"{turn}\""),
                    ),
                )
            })
            .collect();
        parts.extend(shown(
            "ZooKeeper request",
            self.histogram("zkgate_zookeeper_request_duration_seconds", ""),
        ));
        parts.extend(shown(
            "runtime delay",
            self.histogram("zkgate_runtime_delay_seconds", ""),
        ));
        let shed = self.get("zkgate_requests_shed_total");
        if shed > 0.0 {
            parts.push(format!("shed {shed:.0}"));
        }
        format!("mean / p99 bucket: {}", parts.join(", "))
    }
}

fn micros(seconds: f64) -> String {
    match seconds < 0.001 {
        true => format!("{:.0} µs", seconds * 1e6),
        false => format!("{:.1} ms", seconds * 1e3),
    }
}

fn bound(seconds: f64) -> String {
    match seconds.is_finite() {
        true => format!("≤ {}", micros(seconds)),
        false => "> 5 s".into(),
    }
}

/// A four-letter word to the ZooKeeper server at `address` (`host:port`): its answer.
fn four_letters(address: &str, word: &str) -> String {
    let mut answer = String::new();
    if let Ok(mut stream) = std::net::TcpStream::connect(address) {
        let _ = stream.write_all(word.as_bytes());
        let _ = stream.read_to_string(&mut answer);
    }
    answer
}

/// Resets ZooKeeper's latency statistics (`srst`).
pub fn reset_zookeeper(address: &str) {
    four_letters(address, "srst");
}

/// The value of `key` in `mntr`'s answer `answer`, or `?`.
fn mntr_value(answer: &str, key: &str) -> String {
    answer
        .lines()
        .find_map(|line| line.strip_prefix(key)?.strip_prefix('\t').map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// The requests ZooKeeper has received (`zk_packets_received` of `mntr`: every request of
/// every session, pings included; `srst` resets it).
pub fn zookeeper_requests(address: &str) -> Option<u64> {
    mntr_value(&four_letters(address, "mntr"), "zk_packets_received")
        .parse()
        .ok()
}

/// ZooKeeper's own request latency since the last reset (`mntr`): average and maximum, in
/// milliseconds, as it says them.
pub fn zookeeper_latency(address: &str) -> String {
    let answer = four_letters(address, "mntr");
    let value = |key: &str| mntr_value(&answer, key);
    format!(
        "ZooKeeper's latency avg {} ms, max {} ms",
        value("zk_avg_latency"),
        value("zk_max_latency")
    )
}
