//! How long requests take inside zkgate, stage by stage from their arrival, and how late the
//! runtime runs what is due: the series of issue 33's breakdown (BENCHMARKS.md).

use std::time::Duration;

use prometheus::Histogram;

use super::{Metrics, get};

impl Metrics {
    /// A request that took a turn (or not: `turn`) reached `stage` (see
    /// `zkgate_request_stage_seconds`) `elapsed` after it arrived.
    pub fn observe_stage(&self, stage: Stage, turn: bool, elapsed: Duration) {
        // Every request records two or three stages: the series are looked up once, not by
        // label on each request.
        static SERIES: std::sync::OnceLock<[[Histogram; 2]; 3]> = std::sync::OnceLock::new();
        let series = SERIES.get_or_init(|| {
            [Stage::Admitted, Stage::Answered, Stage::Written].map(|stage| {
                ["none", "taken"].map(|turn| self.request_stages.with_label_values(&[stage.label(), turn]))
            })
        });
        series[stage as usize][usize::from(turn)].observe(elapsed.as_secs_f64());
    }
}

/// How far into zkgate a request had come (`stage` in `zkgate_request_stage_seconds`).
#[derive(Clone, Copy, Debug)]
pub enum Stage {
    /// Its turn among the requests in service.
    Admitted = 0,
    /// Its answer ready.
    Answered = 1,
    /// Its answer's last byte handed to the connection.
    Written = 2,
}

impl Stage {
    fn label(self) -> &'static str {
        match self {
            Stage::Admitted => "admitted",
            Stage::Answered => "answered",
            Stage::Written => "written",
        }
    }
}

/// Measures, every [PROBE_INTERVAL] until `stop`, how late the runtime behind `runtime` starts
/// a task spawned when due (`zkgate_runtime_delay_seconds`): a thread of its own keeps the
/// time, so a worker kept busy (a long poll of one task, a backlog of many) shows as delay.
pub fn probe_runtime(runtime: tokio::runtime::Handle, stop: tokio_util::sync::CancellationToken) {
    std::thread::Builder::new()
        .name("runtime-probe".into())
        .spawn(move || {
            while !stop.is_cancelled() {
                std::thread::sleep(PROBE_INTERVAL);
                let due = std::time::Instant::now();
                runtime.spawn(async move {
                    get().runtime_delay.observe(due.elapsed().as_secs_f64());
                });
            }
        })
        .expect("spawn the runtime probe");
}

/// How often the runtime is probed. Each probe wakes two threads (the probe's and, when idle, a
/// worker), and a wake-up is what a request costs most on a small VM (BENCHMARKS.md, issue 40):
/// at 10 ms the probes were a tenth of the wake-ups of a lone client's requests, and woke an
/// idle instance 200 times a second. Ten a second still fill the histogram within a scrape.
const PROBE_INTERVAL: Duration = Duration::from_millis(100);

/// Records one ZooKeeper request's time.
pub fn zookeeper_request(elapsed: Duration) {
    get().zookeeper_requests.observe(elapsed.as_secs_f64());
}
