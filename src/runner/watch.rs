//! `zkgate watch KIND NAME [-- COMMAND]`: follows one resource's events (its topic's stream,
//! `GET /v1/events?topic=KIND:NAME`), printing each as a JSON line, or running a command for
//! each with the event on its stdin, the way `consul watch -handler` and `etcdctl watch -- cmd`
//! do.
//!
//! **No change is dropped silently.** The stream is read only as fast as the commands take its
//! events (at most [QUEUED] read ahead). A watcher that falls behind is not dropped from: zkgate
//! sees its socket full, and when it reads again sends a `resync` with the resource's whole
//! state, which the command runs with like any event, and so is told. A stream that ends (its
//! instance killed, restarted, cut off) is opened again with the id of the last event queued
//! (`Last-Event-ID`), on the same instance or the next that answers: one that still has the
//! events missed sends just those, so none runs twice; one that cannot (another instance, or a
//! gap longer than it keeps) sends a `resync`.
//!
//! The first event is the resource's `state`, so a command learns where things stand before
//! the first change.

use std::io::Write;

use clap::Args;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::api::{Api, STREAM_IDLE};
use super::command::Command;
use super::supervise::Signals;
use super::{Connection, RETRY, fail};

/// Events read ahead of the commands. Beyond it the stream waits to be read, and zkgate, its
/// socket full, sends a `resync` when it is read again instead of holding every event.
const QUEUED: usize = 64;

/// The longest line of an event stream taken: far over the largest event zkgate sends (a
/// state of 50 listed holders, or a value of `--max-value-bytes`), so only a stream that is
/// not zkgate's reaches it.
const MAX_LINE: usize = 8 << 20;

const WATCH_HELP: &str = "\
Without a command, each event is printed on stdout as one JSON line. With one, the command runs
for each event (at most -j at once), with the event as one JSON line on its stdin and in its
environment: ZKGATE_EVENT_TYPE (`state`, `resync`, or the change: `granted`, `changed`, ...),
ZKGATE_TOPIC, ZKGATE_EVENT_ID (the stream's position after it), ZKGATE_URL (the instance
followed). A command that fails is reported on stderr and the watch goes on.

The first event is the resource's state. A `resync` carries the whole state where changes may
have been missed (the watcher fell behind, or resumed through an instance that could not replay
them): a command is told of every gap; none is dropped silently.

Exit status:
    0  stopped by SIGINT or SIGTERM (after the commands running end; a second signal exits at
       once, and the commands get SIGTERM)
  125  no zkgate answered when the watch started, or one refused it (a bad token, an unknown
       topic: its detail is printed)";

/// `zkgate watch KIND NAME [-j N] [options] [-- COMMAND [ARGS...]]`.
#[derive(Args, Clone, Debug)]
#[command(after_long_help = WATCH_HELP)]
pub struct WatchArgs {
    /// What to follow: a kind with an event stream (lock, rwlock, semaphore, election, barrier,
    /// double_barrier, queue, counter, group, service, txn), `kv` (a key), `lease` (a lease
    /// this instance keeps) or `summary` (NAME: a kind's plural, `locks`).
    pub kind: String,

    /// The resource's name (a kv key, a lease's id).
    pub name: String,

    /// How many commands may run at once. Events are handed out in order; with more than one,
    /// a later event's command may end first.
    #[arg(short = 'j', long = "jobs", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub jobs: u32,

    #[command(flatten)]
    pub connection: Connection,

    /// The command to run for each event, after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// The topic of `kind` `name` as an event stream names it (a kv key is its znode's data).
fn topic(kind: &str, name: &str) -> String {
    match kind {
        "kv" => format!("znode:data:kv/{}", name.trim_start_matches('/')),
        kind => format!("{kind}:{name}"),
    }
}

/// One event of the stream, as read.
struct Delivery {
    /// The event's JSON, as zkgate sent it.
    line: String,
    /// Its `type`.
    kind: String,
    /// The stream's position after it.
    id: String,
}

/// Runs `zkgate watch`; returns the exit code.
pub async fn watch(args: WatchArgs) -> u8 {
    let api = match args.connection.api() {
        Ok(api) => api,
        Err(message) => return fail(&message),
    };
    let mut signals = match Signals::catch() {
        Ok(signals) => signals,
        Err(error) => return fail(&format!("cannot catch signals: {error}")),
    };
    let topic = topic(&args.kind, &args.name);
    let (queue, queued) = mpsc::channel(QUEUED);
    let stop = CancellationToken::new();
    let handling = handle(queued, &args.command, args.jobs, &api, &topic, stop.clone());
    let following = follow(&api, &topic, queue);
    tokio::pin!(handling, following);
    tokio::select! {
        code = &mut following => {
            // It ends only when it cannot go on: nothing more comes, but what came is handled.
            handling.await;
            return code;
        }
        () = &mut handling => return 0,
        _ = signals.recv() => stop.cancel(),
    }
    tokio::select! {
        () = handling => 0,
        _ = signals.recv() => 0,
    }
}

/// The events of `topic` as JSON, followed as [watch] follows them (resumed across reconnects),
/// for a subcommand that waits for one; the channel ends when the stream cannot go on.
pub fn events(api: Api, topic: String) -> mpsc::Receiver<serde_json::Value> {
    let (queue, mut queued) = mpsc::channel::<Delivery>(QUEUED);
    let (events, receiver) = mpsc::channel(QUEUED);
    tokio::spawn(async move {
        let following = follow(&api, &topic, queue);
        tokio::pin!(following);
        loop {
            let delivery = tokio::select! {
                Some(delivery) = queued.recv() => delivery,
                _ = &mut following => return,
            };
            let event = serde_json::from_str(&delivery.line).unwrap_or_default();
            if events.send(event).await.is_err() {
                return;
            }
        }
    });
    receiver
}

/// Reads the stream of `topic` into `queue`, resuming after the last event queued whenever it
/// ends. Returns only when it cannot go on: no instance answered at the start, or one refused
/// the stream (the exit code); or when the queue is closed (0).
async fn follow(api: &Api, topic: &str, queue: mpsc::Sender<Delivery>) -> u8 {
    let mut last_id: Option<String> = None;
    // Whether the watch is between streams and has said so (once, not on every retry); whether
    // a stream was ever opened (before, no instance answering is a mistake to report).
    let (mut lost, mut opened) = (false, false);
    loop {
        let response = match api.events(topic, last_id.as_deref()).await {
            Ok(response) => response,
            Err(error) if error.is_transient() && opened => {
                if !std::mem::replace(&mut lost, true) {
                    eprintln!("zkgate: {error}; trying again");
                }
                tokio::time::sleep(RETRY).await;
                continue;
            }
            Err(error) => return fail(&error.to_string()),
        };
        opened = true;
        if std::mem::take(&mut lost) {
            eprintln!("zkgate: following `{topic}` again through {}", api.url());
        }
        let (read, ended) = read(response, &queue, &mut last_id).await;
        match ended {
            Ended::Stopped => return 0,
            Ended::Broken(why) => {
                eprintln!(
                    "zkgate: the stream of `{topic}` from {} ended: {why}; resuming",
                    api.url()
                );
                lost = true;
                // A stream that ends before its first event is not opened again at once.
                if read == 0 {
                    tokio::time::sleep(RETRY).await;
                }
            }
        }
    }
}

/// Why a stream stopped being read.
enum Ended {
    /// The queue closed: the watch is over.
    Stopped,
    /// The stream ended or failed: to be resumed.
    Broken(String),
}

/// Queues the events of one stream until it ends; `last_id` follows the last one queued. How
/// many it queued, and why it stopped.
async fn read(
    mut response: reqwest::Response,
    queue: &mpsc::Sender<Delivery>,
    last_id: &mut Option<String>,
) -> (usize, Ended) {
    let mut lines = Lines::default();
    let mut read = 0;
    loop {
        let chunk = match tokio::time::timeout(STREAM_IDLE, response.chunk()).await {
            Ok(Ok(Some(chunk))) => chunk,
            Ok(Ok(None)) => return (read, Ended::Broken("closed".into())),
            Ok(Err(error)) => return (read, Ended::Broken(error.to_string())),
            Err(_) => {
                let silent = humantime::format_duration(STREAM_IDLE);
                return (read, Ended::Broken(format!("nothing came for {silent}")));
            }
        };
        let events = match lines.push(&chunk) {
            Ok(events) => events,
            Err(why) => return (read, Ended::Broken(why)),
        };
        for (id, data) in events {
            let kind = serde_json::from_str::<serde_json::Value>(&data)
                .ok()
                .and_then(|event| event["type"].as_str().map(str::to_string))
                .unwrap_or_default();
            let delivery = Delivery {
                line: data,
                kind,
                id: id.clone().unwrap_or_default(),
            };
            if queue.send(delivery).await.is_err() {
                return (read, Ended::Stopped);
            }
            read += 1;
            if id.is_some() {
                *last_id = id;
            }
        }
    }
}

/// Hands the queued events out: printed, or each to a run of `argv` (at most `jobs` at once),
/// until the queue ends or `stop` is cancelled; then waits for the commands running.
async fn handle(
    mut queued: mpsc::Receiver<Delivery>,
    argv: &[String],
    jobs: u32,
    api: &Api,
    topic: &str,
    stop: CancellationToken,
) {
    let mut running = JoinSet::new();
    loop {
        let delivery = tokio::select! {
            () = stop.cancelled() => break,
            Some(ended) = running.join_next(), if running.len() >= jobs as usize => {
                let _ = ended;
                continue;
            }
            delivery = queued.recv(), if running.len() < jobs as usize => match delivery {
                Some(delivery) => delivery,
                None => break,
            },
        };
        if argv.is_empty() {
            let mut out = std::io::stdout().lock();
            if writeln!(out, "{}", delivery.line).and_then(|()| out.flush()).is_err() {
                // Nobody reads the events any more (a closed pipe): the watch is over.
                break;
            }
            continue;
        }
        let env = vec![
            ("ZKGATE_EVENT_TYPE", delivery.kind.clone()),
            ("ZKGATE_TOPIC", topic.to_string()),
            ("ZKGATE_EVENT_ID", delivery.id.clone()),
            ("ZKGATE_URL", api.url()),
        ];
        let command = Command::spawn_with_input(argv, &env, format!("{}\n", delivery.line).into_bytes());
        running.spawn(async move { ran(command, &delivery).await });
    }
    while running.join_next().await.is_some() {}
}

/// Waits for one event's command; says on stderr when it failed.
async fn ran(command: std::io::Result<Command>, delivery: &Delivery) {
    let what = format!("the `{}` event {}", delivery.kind, delivery.id);
    match command {
        Ok(mut command) => match command.wait().await {
            Ok(status) if status.success() => {}
            Ok(status) => eprintln!(
                "zkgate: the command for {what} exited {}",
                super::command::exit_code(status)
            ),
            Err(error) => eprintln!("zkgate: lost track of the command for {what}: {error}"),
        },
        Err(error) => eprintln!("zkgate: cannot run the command for {what}: {error}"),
    }
}

/// The events of a Server-Sent Events stream, from its bytes as they come: each event's `id`
/// (if it has one) and its `data` lines, joined. Comments and other fields are passed over.
#[derive(Default)]
struct Lines {
    partial: Vec<u8>,
    data: Vec<String>,
    id: Option<String>,
}

impl Lines {
    /// Takes `bytes`; the events they complete.
    fn push(&mut self, bytes: &[u8]) -> Result<Vec<(Option<String>, String)>, String> {
        self.partial.extend_from_slice(bytes);
        let mut events = Vec::new();
        let mut start = 0;
        while let Some(end) = self.partial[start..].iter().position(|&b| b == b'\n') {
            let line = String::from_utf8_lossy(&self.partial[start..start + end]).into_owned();
            start += end + 1;
            let line = line.strip_suffix('\r').unwrap_or(&line);
            if line.is_empty() {
                if !self.data.is_empty() {
                    events.push((self.id.take(), self.data.join("\n")));
                    self.data.clear();
                }
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "data" => self.data.push(value.to_string()),
                "id" => self.id = Some(value.to_string()),
                _ => {}
            }
        }
        self.partial.drain(..start);
        if self.partial.len() > MAX_LINE {
            return Err(format!("a line over {MAX_LINE} bytes: not zkgate's event stream"));
        }
        Ok(events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_read_across_chunks_with_their_ids_and_comments_are_passed_over() {
        let mut lines = Lines::default();
        assert_eq!(lines.push(b"retry: 1000\n\n: ping\n\nid: 4\nda").unwrap(), vec![]);
        let events = lines
            .push(b"ta: {\"type\":\"state\"}\r\n\r\nid: 5\ndata: a\ndata: b\n\n")
            .unwrap();
        assert_eq!(
            events,
            vec![
                (Some("4".to_string()), "{\"type\":\"state\"}".to_string()),
                (Some("5".to_string()), "a\nb".to_string())
            ]
        );
        assert!(Lines::default().push(&vec![b'x'; MAX_LINE + 1]).is_err());
    }

    #[test]
    fn a_kv_key_is_followed_as_its_znode_and_other_kinds_by_their_topic() {
        assert_eq!(topic("kv", "app/config"), "znode:data:kv/app/config");
        assert_eq!(topic("lock", "orders"), "lock:orders");
        assert_eq!(topic("summary", "locks"), "summary:locks");
    }
}
