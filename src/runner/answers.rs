//! How a client subcommand answers: what it prints on stdout (as text a shell script reads,
//! or with `--output json` as zkgate answered), and the exit status its outcome means: 0 done,
//! [EXIT_NO] when the answer was "no" (404, 410, 412), 125 ([super::EXIT_RUNNER_FAILED]) when zkgate
//! could not be asked or refused. Shared by [super::resources] and [super::queue]; also a
//! list's pages (`Link` to the next) and the body a text from the command line makes.

use std::io::Write;

use clap::{Args, ValueEnum};
use reqwest::{Method, StatusCode};
use serde_json::Value;

use super::api::{Answer, Api, CallError, Request};
use super::{Connection, fail};

/// Exit status when the answer was "no" (see the module's docs).
pub const EXIT_NO: u8 = 1;

/// How answers are printed.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// What a script reads: a value, an id, a number, a name a line.
    Text,
    /// The answer as zkgate gave it, one JSON document.
    Json,
}

/// Options of every subcommand here.
#[derive(Args, Clone, Debug)]
pub struct Client {
    #[command(flatten)]
    pub connection: Connection,

    /// How to print the answer.
    #[arg(long, short = 'o', value_enum, default_value = "text", global = true)]
    pub output: Output,
}

impl Client {
    /// A client of the instances given; the exit code if they are given wrong.
    pub fn api(&self) -> Result<Api, u8> {
        self.connection.api().map_err(|message| fail(&message))
    }
}

/// What a subcommand came to: printed, or why not.
pub type Outcome = Result<Printed, Failure>;

/// What a subcommand prints on success.
pub enum Printed {
    /// Bytes as they are (a value).
    Raw(Vec<u8>),
    /// Lines of text.
    Text(String),
    /// A JSON document.
    Json(Value),
    /// Nothing.
    Nothing,
}

/// Why a subcommand did not succeed.
pub enum Failure {
    /// The answer was "no": said, exit [EXIT_NO].
    No(String),
    /// zkgate could not be asked, or refused: exit 125.
    Call(CallError),
}

impl From<CallError> for Failure {
    fn from(error: CallError) -> Failure {
        Failure::Call(error)
    }
}

/// Prints what `outcome` came to; the exit code.
pub fn finish(outcome: Outcome) -> u8 {
    let printed = match outcome {
        Ok(printed) => printed,
        Err(Failure::No(why)) => {
            eprintln!("zkgate: {why}");
            return EXIT_NO;
        }
        Err(Failure::Call(error)) => return fail(&error.to_string()),
    };
    let mut out = std::io::stdout().lock();
    let written = match printed {
        Printed::Raw(bytes) => out.write_all(&bytes),
        Printed::Text(text) if text.is_empty() => Ok(()),
        Printed::Text(text) => writeln!(out, "{text}"),
        Printed::Json(value) => writeln!(out, "{value}"),
        Printed::Nothing => Ok(()),
    };
    match written.and_then(|()| out.flush()) {
        Ok(()) => 0,
        Err(error) => fail(&format!("cannot write the answer: {error}")),
    }
}

/// `answer` if its status is a success; a "no" (404, 410, 412) or the error it is otherwise.
pub fn checked(answer: Answer) -> Result<Answer, Failure> {
    match answer.error() {
        None => Ok(answer),
        Some(error)
            if [StatusCode::NOT_FOUND, StatusCode::GONE, StatusCode::PRECONDITION_FAILED].contains(&answer.status) =>
        {
            Err(Failure::No(error.to_string()))
        }
        Some(error) => Err(Failure::Call(error)),
    }
}

/// Every page of the list at `path` (`Link: <...cursor=...>; rel="next"` until none).
pub async fn every_page(api: &Api, path: Vec<&str>, query: Vec<(&str, String)>) -> Result<Vec<Value>, Failure> {
    let mut pages = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut request = Request::new(Method::GET, path.clone());
        request.query = query.clone();
        request.query.extend(cursor.take().map(|cursor| ("cursor", cursor)));
        let answer = checked(api.send(&request).await?)?;
        pages.push(answer.json());
        match answer.header("link").and_then(next_cursor) {
            Some(next) => cursor = Some(next),
            None => return Ok(pages),
        }
    }
}

/// The `cursor` of a `Link` header's next page.
fn next_cursor(link: &str) -> Option<String> {
    let target = link
        .split(';')
        .next()?
        .trim()
        .trim_start_matches('<')
        .trim_end_matches('>');
    let query = target.split_once('?')?.1;
    form_urlencoded::parse(query.as_bytes())
        .find(|(name, _)| name == "cursor")
        .map(|(_, value)| value.into_owned())
}

/// The entries of `pages` (`entries` of each), a line each as text or one JSON array.
pub fn listed(pages: Vec<Value>, output: Output, entries: impl Fn(&Value) -> Vec<Value>) -> Printed {
    let all: Vec<Value> = pages.iter().flat_map(entries).collect();
    match output {
        Output::Json => Printed::Json(Value::Array(all)),
        Output::Text => Printed::Text(
            all.iter()
                .map(|entry| entry.as_str().map_or_else(|| entry.to_string(), str::to_string))
                .collect::<Vec<_>>()
                .join("\n"),
        ),
    }
}

/// A value or an item given as text: JSON (its `Content-Type` and bytes) if it parses as JSON,
/// else text.
pub fn body_of(text: String) -> (String, Vec<u8>) {
    let content_type = match serde_json::from_str::<serde::de::IgnoredAny>(&text) {
        Ok(_) => "application/json",
        Err(_) => "text/plain; charset=utf-8",
    };
    (content_type.to_string(), text.into_bytes())
}
