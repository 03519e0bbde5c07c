//! `zkgate queue put|work|ls|stat`: a queue from the shell. `put` stores items from its
//! arguments or stdin's lines, each under an idempotency key, so that a line sent again after
//! a lost reply is stored once. `work` is a worker: it takes items (at least once, with an ack
//! deadline), runs a command for each with the item on its stdin, extends the claim while the
//! command runs, acknowledges the item when the command exits 0 and gives it back otherwise
//! (delivered again, then dead-lettered after the queue's `--queue-max-deliveries`).
//!
//! A worker that dies leaves its claims to lapse at their deadline (a third of which is the
//! longest an extension waits), and their items are delivered again: at least once. SIGTERM
//! (or SIGINT) stops a worker taking, and it finishes what it holds.

use std::io::Read;
use std::time::Duration;

use base64::Engine;
use clap::{Args, Subcommand};
use reqwest::header::HeaderValue;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::task::JoinSet;

use super::answers::{Client, Output, Printed, body_of, checked, finish};
use super::api::{Api, CallError, Request};
use super::command::Command;
use super::supervise::Signals;
use super::{EXIT_RUNNER_FAILED, RETRY, fail, positive_duration};

/// The longest one take waits (zkgate may cut it to its `--max-wait`).
const TAKE_WAIT: Duration = Duration::from_secs(30);

/// How long `put` goes on retrying one item while no instance answers (or all answer 503).
const PUT_PATIENCE: Duration = Duration::from_secs(60);

const QUEUE_HELP: &str = "\
The command of `work` gets the item's body on stdin (JSON as JSON, text as text, bytes as
bytes) and ZKGATE_QUEUE, ZKGATE_ITEM, ZKGATE_CLAIM, ZKGATE_DELIVERIES (1 the first time) and
ZKGATE_CONTENT_TYPE in its environment.

Exit status:
    0  done (`work`: stopped by SIGINT or SIGTERM, after the items held were settled)
    1  the answer was no (no such queue)
  125  zkgate unreachable, or an error answer (a refused token, a bad name: its detail is
       printed); for `put`, what was stored is said, and running it again with the same
       --key-prefix stores the rest, each line once";

/// `zkgate queue ...`.
#[derive(Args, Clone, Debug)]
#[command(after_long_help = QUEUE_HELP)]
pub struct QueueArgs {
    #[command(subcommand)]
    pub command: QueueCommand,
    #[command(flatten)]
    pub client: Client,
}

#[derive(Subcommand, Clone, Debug)]
pub enum QueueCommand {
    /// Put items: each ITEM, or each line of stdin without any (JSON if it parses as JSON,
    /// else text), each under an idempotency key.
    Put {
        name: String,
        items: Vec<String>,
        /// 0 (first) to 99 (last); default 50.
        #[arg(long)]
        priority: Option<u8>,
        /// The items' idempotency keys are this, `-`, and the item's number (1 for the first):
        /// the same prefix again stores each item once, however often it is run. A new one each
        /// run by default.
        #[arg(long)]
        key_prefix: Option<String>,
    },
    /// Take items and run COMMAND for each: ack on exit 0, give back otherwise.
    Work {
        name: String,
        /// How many items (and commands) at once.
        #[arg(short = 'j', long = "jobs", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
        jobs: u32,
        /// Each claim's ack deadline, extended every third of it while its command runs: how
        /// long an item waits for another worker if this one dies.
        #[arg(long, default_value = "30s", value_parser = positive_duration)]
        ack_deadline: Duration,
        /// The command to run for each item, after `--`.
        #[arg(last = true, required = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
    /// List the items waiting (the first 1000).
    Ls { name: String },
    /// Print how many items wait, are in flight, are dead.
    Stat { name: String },
}

/// Runs `zkgate queue`; the exit code.
pub async fn queue(args: QueueArgs) -> u8 {
    let Ok(api) = args.client.api() else {
        return EXIT_RUNNER_FAILED;
    };
    let output = args.client.output;
    match args.command {
        QueueCommand::Put {
            name,
            items,
            priority,
            key_prefix,
        } => put(&api, &name, items, priority, key_prefix).await,
        QueueCommand::Work {
            name,
            jobs,
            ack_deadline,
            command,
        } => work(&api, &name, jobs as usize, ack_deadline, &command).await,
        QueueCommand::Ls { name } => {
            read(&api, vec!["v1", "queues", &name, "items"], output, |items| {
                (items.as_array().into_iter().flatten())
                    .map(|item| {
                        format!(
                            "{} priority={} deliveries={}",
                            item["item"].as_str().unwrap_or_default(),
                            item["priority"],
                            item["deliveries"]
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .await
        }
        QueueCommand::Stat { name } => {
            read(&api, vec!["v1", "queues", &name], output, |state| {
                format!(
                    "depth={} in_flight={} dead_letters={}",
                    state["depth"], state["in_flight"], state["dead_letters"]
                )
            })
            .await
        }
    }
}

/// `GET` of `path`, printed as `text` makes it, or as JSON; exit 1 if there is no such queue.
async fn read(api: &Api, path: Vec<&str>, output: Output, text: impl Fn(&Value) -> String) -> u8 {
    let answer = match api.send(&Request::new(Method::GET, path)).await {
        Ok(answer) => checked(answer),
        Err(error) => Err(error.into()),
    };
    finish(answer.map(|answer| match output {
        Output::Json => Printed::Json(answer.json()),
        Output::Text => Printed::Text(text(&answer.json())),
    }))
}

/// Puts each of `items` (stdin's lines without any), retrying one that gets no answer with
/// its key, so that it is stored once.
async fn put(api: &Api, name: &str, items: Vec<String>, priority: Option<u8>, key_prefix: Option<String>) -> u8 {
    let items = match items.is_empty() {
        false => items,
        true => {
            let mut text = String::new();
            if let Err(error) = std::io::stdin().read_to_string(&mut text) {
                return fail(&format!("cannot read the items from stdin: {error}"));
            }
            text.lines()
                .filter(|line| !line.trim().is_empty())
                .map(str::to_string)
                .collect()
        }
    };
    let prefix = key_prefix.unwrap_or_else(crate::ids::new_instance_id);
    for (at, item) in items.iter().enumerate() {
        let key = format!("{prefix}-{}", at + 1);
        let mut request = Request::new(Method::POST, vec!["v1", "queues", name, "items"]);
        request.body = Some(body_of(item.clone()));
        request.query.extend(priority.map(|p| ("priority", p.to_string())));
        match HeaderValue::from_str(&key) {
            Ok(key) => request.headers.insert("idempotency-key", key),
            Err(_) => return fail(&format!("--key-prefix `{prefix}` is not a header value")),
        };
        let stored = patiently(PUT_PATIENCE, || api.send(&request)).await;
        let error = match stored {
            Ok(answer) => match answer.error() {
                None => continue,
                Some(error) => error,
            },
            Err(error) => error,
        };
        eprintln!(
            "zkgate: item {} of {}: {error}; {at} stored; `--key-prefix {prefix}` again stores the rest, each once",
            at + 1,
            items.len()
        );
        return EXIT_RUNNER_FAILED;
    }
    0
}

/// `call` until it answers (retrying, each [RETRY], while no instance does or all answer 503),
/// for up to `patience`.
async fn patiently<T, F>(patience: Duration, call: impl Fn() -> F) -> Result<T, CallError>
where
    F: std::future::Future<Output = Result<T, CallError>>,
{
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        match call().await {
            Err(error) if error.is_transient() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(RETRY).await;
            }
            answered => return answered,
        }
    }
}

/// An item taken.
struct Taken {
    item: String,
    claim: String,
    deliveries: u64,
    content_type: String,
    /// The body, as the command gets it.
    body: Vec<u8>,
}

impl Taken {
    /// An item as a take answers it.
    fn of(answer: &Value) -> Option<Taken> {
        let body = match (&answer["body"], answer["text"].as_str(), answer["body_base64"].as_str()) {
            (_, Some(text), _) => text.as_bytes().to_vec(),
            (_, _, Some(encoded)) => base64::engine::general_purpose::STANDARD.decode(encoded).ok()?,
            (Value::Null, None, None) => Vec::new(),
            (json, None, None) => json.to_string().into_bytes(),
        };
        Some(Taken {
            item: answer["item"].as_str()?.to_string(),
            claim: answer["claim"].as_str()?.to_string(),
            deliveries: answer["deliveries"].as_u64().unwrap_or(1),
            content_type: answer["content_type"].as_str().unwrap_or_default().to_string(),
            body,
        })
    }
}

/// Takes items of `name` and runs `argv` for each, `jobs` at once, until SIGINT or SIGTERM
/// (then finishes what it holds) or an answer that taking again will not change.
async fn work(api: &Api, name: &str, jobs: usize, ack_deadline: Duration, argv: &[String]) -> u8 {
    let mut signals = match Signals::catch() {
        Ok(signals) => signals,
        Err(error) => return fail(&format!("cannot catch signals: {error}")),
    };
    let mut running = JoinSet::new();
    let code = loop {
        if running.len() >= jobs {
            tokio::select! {
                _ = running.join_next() => continue,
                _ = signals.recv() => break 0,
            }
        }
        let taken = tokio::select! {
            taken = take(api, name, ack_deadline) => taken,
            _ = signals.recv() => break 0,
        };
        let taken = match taken {
            Ok(Some(taken)) => taken,
            Ok(None) => continue,
            Err(error) if error.is_transient() => {
                tokio::time::sleep(RETRY).await;
                continue;
            }
            Err(error) => break fail(&error.to_string()),
        };
        let env = vec![
            ("ZKGATE_QUEUE", name.to_string()),
            ("ZKGATE_ITEM", taken.item.clone()),
            ("ZKGATE_CLAIM", taken.claim.clone()),
            ("ZKGATE_DELIVERIES", taken.deliveries.to_string()),
            ("ZKGATE_CONTENT_TYPE", taken.content_type.clone()),
        ];
        // Started here, on the task that lives as long as the worker (see [Command::spawn]).
        let command = Command::spawn_with_input(argv, &env, taken.body.clone());
        let (api, name) = (api.clone(), name.to_string());
        running.spawn(async move { settle(&api, &name, taken, command, ack_deadline).await });
    };
    // Stopped taking: what is held is finished and settled; a second signal leaves at once
    // (the commands get SIGTERM as the worker goes).
    tokio::select! {
        _ = async { while running.join_next().await.is_some() {} } => {}
        _ = signals.recv() => {}
    }
    code
}

/// One take: an item, or `None` when the wait ended with the queue empty.
async fn take(api: &Api, name: &str, ack_deadline: Duration) -> Result<Option<Taken>, CallError> {
    let mut request = Request::new(Method::POST, vec!["v1", "queues", name, "take"]);
    request.query = vec![
        ("wait", format!("{}ms", TAKE_WAIT.as_millis())),
        ("ack_deadline", format!("{}ms", ack_deadline.as_millis())),
    ];
    request.limit += TAKE_WAIT;
    let answer = api.send(&request).await?;
    if let Some(error) = answer.error() {
        return Err(error);
    }
    Ok(match answer.status {
        StatusCode::NO_CONTENT => None,
        _ => Taken::of(&answer.json()),
    })
}

/// Waits for `taken`'s command, extending its claim every third of `ack_deadline` meanwhile,
/// then acknowledges the item (exit 0) or gives it back. A claim lost meanwhile (its deadline
/// passed while no extension got through) stops the command: its item is someone else's now.
async fn settle(api: &Api, name: &str, taken: Taken, command: std::io::Result<Command>, ack_deadline: Duration) {
    let claim = ["v1", "queues", name, "claims", taken.claim.as_str()];
    let mut command = match command {
        Ok(command) => command,
        Err(error) => {
            eprintln!("zkgate: cannot run the command for item {}: {error}", taken.item);
            give_back(api, &claim, &taken).await;
            return;
        }
    };
    let mut extensions = tokio::time::interval_at(tokio::time::Instant::now() + ack_deadline / 3, ack_deadline / 3);
    let status = loop {
        tokio::select! {
            status = command.wait() => break status,
            _ = extensions.tick() => {
                let body = json!({"ack_deadline": format!("{}ms", ack_deadline.as_millis())});
                let extend = Request::new(Method::POST, [&claim[..], &["extend"]].concat()).json(&body);
                if let Ok(answer) = api.send(&extend).await
                    && answer.status == StatusCode::GONE
                {
                    eprintln!("zkgate: item {}: its claim was lost (its deadline passed); stopping its command", taken.item);
                    command.signal(libc::SIGTERM);
                }
            }
        }
    };
    match status {
        Ok(status) if status.success() => {
            let ack = Request::new(Method::POST, [&claim[..], &["ack"]].concat());
            match patiently(PUT_PATIENCE, || api.send(&ack)).await.map(|a| a.error()) {
                Ok(None) => {}
                Ok(Some(error)) | Err(error) => {
                    eprintln!(
                        "zkgate: item {}: not acknowledged ({error}): it is delivered again",
                        taken.item
                    )
                }
            }
        }
        Ok(status) => {
            let code = super::command::exit_code(status);
            eprintln!("zkgate: item {}: the command exited {code}; given back", taken.item);
            give_back(api, &claim, &taken).await;
        }
        Err(error) => {
            eprintln!(
                "zkgate: item {}: lost track of its command ({error}); given back",
                taken.item
            );
            give_back(api, &claim, &taken).await;
        }
    }
}

/// Gives an item back (nack): delivered again, or dead-lettered once it has been delivered the
/// queue's most times. One that cannot be given back comes again at its deadline anyway.
async fn give_back(api: &Api, claim: &[&str], taken: &Taken) {
    let nack = Request::new(Method::POST, [claim, &["nack"]].concat());
    if let Ok(Some(error)) | Err(error) = patiently(PUT_PATIENCE, || api.send(&nack)).await.map(|a| a.error()) {
        eprintln!(
            "zkgate: item {}: not given back ({error}): it comes again at its deadline",
            taken.item
        );
    }
}
