//! The one-shot subcommands on resources, as `etcdctl` and `consul` have them: `zkgate kv
//! get|put|rm|ls|txn`, `zkgate lease create|keepalive|rm|ls`, `zkgate counter add|get`,
//! `zkgate leader`. Each is one or a few calls of the HTTP API ([Api::send]), printed as text a
//! shell script reads (a value, an id, a number) or, with `--output json`, as zkgate answered.
//!
//! Exit status ([super::answers]): 0 done; 1 the answer was "no" (no such key, lease or
//! counter; a condition that did not hold: `--if-match`, a transaction's compare; a lease kept
//! alive that ended); 125 zkgate unreachable or an error answer (a refused token, a bad name:
//! its detail printed).

use std::io::Read;
use std::time::Duration;

use clap::{Args, Subcommand};
use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::answers::{Client, Failure, Outcome, Output, Printed, body_of, checked, every_page, finish, listed};
use super::api::{Api, Request};
use super::{EXIT_RUNNER_FAILED, positive_duration};
use crate::time::parse_duration;

/// The longest one long poll of `kv get --wait` or `leader --wait` asks for; it asks again
/// until its own wait is over.
const POLL: Duration = Duration::from_secs(30);

const EXIT_STATUS: &str = "\
Exit status:
    0  done
    1  the answer was no: no such key, lease or counter; a condition that did not hold
       (--if-match, a transaction's compare); a lease kept alive that ended
  125  zkgate unreachable, or an error answer (a refused token, a bad name: its detail is
       printed)";

/// `zkgate kv ...`.
#[derive(Args, Clone, Debug)]
#[command(after_long_help = EXIT_STATUS)]
pub struct KvArgs {
    #[command(subcommand)]
    pub command: KvCommand,
    #[command(flatten)]
    pub client: Client,
}

#[derive(Subcommand, Clone, Debug)]
pub enum KvCommand {
    /// Print a key's value (with --wait, its next value).
    Get {
        key: String,
        /// Wait (up to this long) for the value to change, and print the new one; exit 1 if
        /// it did not.
        #[arg(long, value_parser = parse_duration)]
        wait: Option<Duration>,
        /// With --wait: the version (ETag, as `-o json` prints it) to wait past, as read
        /// before; by default the one there when it starts.
        #[arg(long, requires = "wait")]
        after: Option<String>,
    },
    /// Write a key: VALUE, or stdin without it; JSON if it parses as JSON, else text.
    Put {
        key: String,
        value: Option<String>,
        /// Bind the key to this lease: it is deleted when the lease ends.
        #[arg(long)]
        lease: Option<String>,
        /// Write only over this ETag (as `kv get -o json` prints it; `*`: only if it exists).
        #[arg(long)]
        if_match: Option<String>,
    },
    /// Delete a key.
    Rm {
        key: String,
        /// Delete only this version (its ETag).
        #[arg(long)]
        if_match: Option<String>,
    },
    /// List the keys directly under PREFIX (the top level without it).
    Ls { prefix: Option<String> },
    /// Run a transaction: its JSON (as `POST /v1/kv-txn` takes it) from FILE, or stdin.
    Txn { file: Option<std::path::PathBuf> },
}

/// `zkgate lease ...`.
#[derive(Args, Clone, Debug)]
#[command(after_long_help = EXIT_STATUS)]
pub struct LeaseArgs {
    #[command(subcommand)]
    pub command: LeaseCommand,
    #[command(flatten)]
    pub client: Client,
}

#[derive(Subcommand, Clone, Debug)]
pub enum LeaseCommand {
    /// Create a lease; print its id.
    Create {
        #[arg(long, default_value = "30s", value_parser = positive_duration)]
        ttl: Duration,
    },
    /// Keep a lease alive (every third of its TTL) until SIGINT or SIGTERM (exit 0) or its end
    /// (exit 1); with --once, one keepalive.
    Keepalive {
        id: String,
        #[arg(long)]
        once: bool,
    },
    /// Delete a lease, and release everything it holds.
    Rm { id: String },
    /// List the leases this principal has.
    Ls,
}

/// `zkgate counter ...`.
#[derive(Args, Clone, Debug)]
#[command(after_long_help = EXIT_STATUS)]
pub struct CounterArgs {
    #[command(subcommand)]
    pub command: CounterCommand,
    #[command(flatten)]
    pub client: Client,
}

#[derive(Subcommand, Clone, Debug)]
pub enum CounterCommand {
    /// Add DELTA (1 without it) atomically; print the new value.
    Add {
        name: String,
        #[arg(allow_negative_numbers = true)]
        delta: Option<i64>,
    },
    /// Print a counter's value (0 if it does not exist).
    Get { name: String },
}

/// `zkgate leader NAME`.
#[derive(Args, Clone, Debug)]
#[command(after_long_help = EXIT_STATUS)]
pub struct LeaderArgs {
    /// The election's name.
    pub name: String,
    /// Wait (up to this long) for another leader (or none), and print it; exit 1 if none came.
    #[arg(long, value_parser = parse_duration)]
    pub wait: Option<Duration>,
    /// With --wait: the term (as `-o json` prints it) to wait past, as read before; `0` for
    /// "nobody leads"; by default the leader there when it starts.
    #[arg(long, requires = "wait")]
    pub after: Option<i64>,
    #[command(flatten)]
    pub client: Client,
}

/// Runs `zkgate kv`; the exit code.
pub async fn kv(args: KvArgs) -> u8 {
    let Ok(api) = args.client.api() else {
        return EXIT_RUNNER_FAILED;
    };
    let output = args.client.output;
    finish(match args.command {
        KvCommand::Get { key, wait, after } => kv_get(&api, &key, (wait, after), output).await,
        KvCommand::Put {
            key,
            value,
            lease,
            if_match,
        } => kv_put(&api, &key, value, (lease, if_match), output).await,
        KvCommand::Rm { key, if_match } => {
            let mut request = Request::new(Method::DELETE, key_path(&key));
            request.headers = condition(if_match.as_deref());
            match api.send(&request).await {
                Ok(answer) => checked(answer).map(|_| Printed::Nothing),
                Err(error) => Err(error.into()),
            }
        }
        KvCommand::Ls { prefix } => {
            let query = prefix.map(|prefix| ("prefix", prefix)).into_iter().collect();
            match every_page(&api, vec!["v1", "kv"], query).await {
                Ok(pages) => Ok(listed(pages, output, |page| {
                    page["keys"].as_array().cloned().unwrap_or_default()
                })),
                Err(failure) => Err(failure),
            }
        }
        KvCommand::Txn { file } => kv_txn(&api, file).await,
    })
}

/// `/v1/kv/<key>`, the key's `/`s kept as the path's.
fn key_path(key: &str) -> Vec<&str> {
    ["v1", "kv"].into_iter().chain(key.split('/')).collect()
}

/// `If-Match` with `etag` (see [quoted]).
fn condition(etag: Option<&str>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if let Some(value) = etag.and_then(|etag| HeaderValue::from_str(&quoted(etag)).ok()) {
        headers.insert(reqwest::header::IF_MATCH, value);
    }
    headers
}

/// `etag` quoted as zkgate's ETags are (`"714"`), if it is not (a shell eats the quotes).
fn quoted(etag: &str) -> String {
    match etag == "*" || etag.starts_with('"') {
        true => etag.to_string(),
        false => format!("\"{etag}\""),
    }
}

async fn kv_get(api: &Api, key: &str, (wait, after): (Option<Duration>, Option<String>), output: Output) -> Outcome {
    let read = async |known: Option<&str>, poll: Duration| {
        let mut request = Request::new(Method::GET, key_path(key));
        if let Some(etag) = known.and_then(|etag| HeaderValue::from_str(etag).ok()) {
            request.headers.insert(reqwest::header::IF_NONE_MATCH, etag);
            request.query.push(("wait", format!("{}ms", poll.as_millis())));
            request.limit += poll;
        }
        checked(api.send(&request).await?)
    };
    let mut answer = match &after {
        // Waiting past a version already known: the first read may be the change.
        Some(etag) => read(Some(&quoted(etag)), Duration::ZERO).await?,
        None => read(None, Duration::ZERO).await?,
    };
    if let Some(wait) = wait.filter(|_| after.is_none() || answer.status == StatusCode::NOT_MODIFIED) {
        let deadline = tokio::time::Instant::now() + wait;
        let etag = match &after {
            Some(etag) => quoted(etag),
            None => answer.header("etag").unwrap_or_default().to_string(),
        };
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Err(Failure::No(format!(
                    "`{key}` did not change within {}",
                    humantime::format_duration(wait)
                )));
            }
            answer = read(Some(&etag), left.min(POLL)).await?;
            if answer.status != StatusCode::NOT_MODIFIED {
                break;
            }
        }
    }
    Ok(match output {
        Output::Text => {
            let mut bytes = answer.body.to_vec();
            if std::str::from_utf8(&bytes).is_ok() && !bytes.ends_with(b"\n") {
                bytes.push(b'\n');
            }
            Printed::Raw(bytes)
        }
        Output::Json => {
            let value = match answer.header("content-type") {
                Some(kind) if kind.starts_with("application/json") => answer.json(),
                _ => Value::String(String::from_utf8_lossy(&answer.body).into_owned()),
            };
            Printed::Json(json!({
                "key": key,
                "value": value,
                "etag": answer.header("etag"),
                "lease": answer.header("zkgate-lease"),
            }))
        }
    })
}

async fn kv_put(
    api: &Api,
    key: &str,
    value: Option<String>,
    (lease, if_match): (Option<String>, Option<String>),
    output: Output,
) -> Outcome {
    let value = match value {
        Some(value) => value,
        None => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|error| Failure::No(format!("cannot read the value from stdin: {error}")))?;
            text
        }
    };
    let mut request = Request::new(Method::PUT, key_path(key));
    request.body = Some(body_of(value));
    request.headers = condition(if_match.as_deref());
    request.query.extend(lease.map(|lease| ("lease", lease)));
    let answer = checked(api.send(&request).await?)?;
    Ok(match output {
        Output::Text => Printed::Text(answer.header("etag").unwrap_or_default().to_string()),
        Output::Json => Printed::Json(answer.json()),
    })
}

async fn kv_txn(api: &Api, file: Option<std::path::PathBuf>) -> Outcome {
    let text = match &file {
        Some(path) => std::fs::read_to_string(path).map_err(|e| Failure::No(format!("{}: {e}", path.display()))),
        None => {
            let mut text = String::new();
            (std::io::stdin().read_to_string(&mut text))
                .map(|_| text)
                .map_err(|e| Failure::No(format!("cannot read the transaction from stdin: {e}")))
        }
    }?;
    let body: Value =
        serde_json::from_str(&text).map_err(|e| Failure::No(format!("the transaction is not JSON: {e}")))?;
    let answer = checked(
        api.send(&Request::new(Method::POST, vec!["v1", "kv-txn"]).json(&body))
            .await?,
    )?;
    let answer = answer.json();
    match answer["succeeded"].as_bool() {
        Some(false) => {
            // Its `else` ran: printed all the same, since its gets are in it.
            println!("{answer}");
            Err(Failure::No(
                "a compare did not hold: the transaction's `else` ran".into(),
            ))
        }
        _ => Ok(Printed::Json(answer)),
    }
}

/// Runs `zkgate lease`; the exit code.
pub async fn lease(args: LeaseArgs) -> u8 {
    let Ok(api) = args.client.api() else {
        return EXIT_RUNNER_FAILED;
    };
    let output = args.client.output;
    finish(match args.command {
        LeaseCommand::Create { ttl } => match api.create_lease(ttl).await {
            Ok(lease) if output == Output::Text => Ok(Printed::Text(lease.id)),
            Ok(lease) => Ok(Printed::Json(json!({"id": lease.id, "ttl_ms": lease.ttl_ms}))),
            Err(error) => Err(error.into()),
        },
        LeaseCommand::Keepalive { id, once } => keep_alive(&api, &id, once).await,
        LeaseCommand::Rm { id } => match api.delete_lease(&id).await {
            Ok(()) => Ok(Printed::Nothing),
            Err(error) if error.is_gone() => Err(Failure::No(error.to_string())),
            Err(error) => Err(error.into()),
        },
        LeaseCommand::Ls => match every_page(&api, vec!["v1", "leases"], Vec::new()).await {
            Ok(pages) => Ok(listed(pages, output, |page| {
                let leases = page.as_array().cloned().unwrap_or_default();
                match output {
                    Output::Json => leases,
                    Output::Text => (leases.iter())
                        .map(|lease| {
                            json!(format!(
                                "{} ttl={}ms remaining={}ms holdings={}",
                                lease["id"].as_str().unwrap_or_default(),
                                lease["ttl_ms"],
                                lease["remaining_ms"],
                                lease["holdings"]
                            ))
                        })
                        .collect(),
                }
            })),
            Err(failure) => Err(failure),
        },
    })
}

/// Keeps lease `id` alive until a signal (or, `once`, for one keepalive).
async fn keep_alive(api: &Api, id: &str, once: bool) -> Outcome {
    let sent = tokio::time::Instant::now();
    let lease: super::api::Lease = {
        let answer = checked(
            api.send(&Request::new(Method::POST, vec!["v1", "leases", id, "keepalive"]))
                .await?,
        )?;
        serde_json::from_value(answer.json()).map_err(|e| Failure::No(format!("not a lease: {e}")))?
    };
    if once {
        return Ok(Printed::Nothing);
    }
    let mut signals =
        super::supervise::Signals::catch().map_err(|e| Failure::No(format!("cannot catch signals: {e}")))?;
    let (report, mut troubles) = tokio::sync::mpsc::channel(1);
    let keeper = tokio::spawn(super::guard::keep_alive(api.clone(), lease, sent, report));
    let outcome = tokio::select! {
        _ = signals.recv() => Ok(Printed::Nothing),
        Some(trouble) = troubles.recv() => Err(Failure::No(format!("lease `{id}` was {trouble}"))),
    };
    keeper.abort();
    outcome
}

/// Runs `zkgate counter`; the exit code.
pub async fn counter(args: CounterArgs) -> u8 {
    let Ok(api) = args.client.api() else {
        return EXIT_RUNNER_FAILED;
    };
    let output = args.client.output;
    let answer = match &args.command {
        CounterCommand::Add { name, delta } => {
            let body = json!({"delta": delta.unwrap_or(1)});
            api.send(&Request::new(Method::POST, vec!["v1", "counters", name, "add"]).json(&body))
                .await
        }
        CounterCommand::Get { name } => api.send(&Request::new(Method::GET, vec!["v1", "counters", name])).await,
    };
    finish(match answer.map_err(Failure::from).and_then(checked) {
        Ok(answer) if output == Output::Text => Ok(Printed::Text(answer.json()["value"].to_string())),
        Ok(answer) => Ok(Printed::Json(answer.json())),
        Err(failure) => Err(failure),
    })
}

/// Runs `zkgate leader`; the exit code.
pub async fn leader(args: LeaderArgs) -> u8 {
    let Ok(api) = args.client.api() else {
        return EXIT_RUNNER_FAILED;
    };
    let output = args.client.output;
    finish(leader_of(&api, &args.name, (args.wait, args.after), output).await)
}

async fn leader_of(api: &Api, name: &str, (wait, after): (Option<Duration>, Option<i64>), output: Output) -> Outcome {
    let read = async || -> Result<Value, Failure> {
        let answer = checked(
            api.send(&Request::new(Method::GET, vec!["v1", "elections", name]))
                .await?,
        )?;
        Ok(answer.json())
    };
    let mut state = read().await?;
    // The leader's term names it: another term (or none) is another leader.
    let term = match after {
        Some(0) => Value::Null,
        Some(term) => json!(term),
        None => state["leader"]["term"].clone(),
    };
    if let Some(wait) = wait.filter(|_| state["leader"]["term"] == term) {
        let mut updates = super::watch::events(api.clone(), format!("election:{name}"));
        let deadline = tokio::time::sleep(wait);
        tokio::pin!(deadline);
        loop {
            let event = tokio::select! {
                event = updates.recv() => event,
                () = &mut deadline => None,
            };
            let Some(event) = event else {
                let waited = humantime::format_duration(wait);
                return Err(Failure::No(format!(
                    "the leader of `{name}` did not change within {waited}"
                )));
            };
            if event["state"]["leader"]["term"] != term {
                state = event["state"].clone();
                break;
            }
        }
    }
    let leader = &state["leader"];
    match output {
        Output::Json => Ok(Printed::Json(state.clone())),
        Output::Text if leader.is_null() => Err(Failure::No(format!("nobody leads `{name}`"))),
        Output::Text => Ok(Printed::Text(match &leader["value"] {
            Value::Null => leader["node"].as_str().unwrap_or_default().to_string(),
            Value::String(text) => text.clone(),
            value => value.to_string(),
        })),
    }
}
