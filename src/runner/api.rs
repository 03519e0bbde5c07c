//! The runner's side of the HTTP API: the few calls `zkgate lock` and `zkgate elect` make
//! (create, keep alive and delete a lease; acquire a lock or a permit, or campaign; long-poll
//! a handle), each answering a typed reply or a [CallError] that is worth showing to a user as
//! it is.
//!
//! Given several zkgate instances, a call goes to the one that last answered and, while an
//! instance does not answer (or answers 503), to the next: any instance serves any lease, so
//! the runner keeps its lease, and its command runs on, through the loss of the instance it
//! started on.
//!
//! `http://` and `https://` (rustls with the ring provider; the system's CAs, plus `--ca`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use reqwest::{Client, Method, StatusCode, Url};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::recipes::locks::contention::Revocation;

pub use super::target::Target;

/// How long to wait for a TCP connection to zkgate.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Time allowed on top of a long poll's `wait` for the answer to arrive (zkgate may spend up
/// to 10 s on its first round trip to ZooKeeper even for `wait=0`).
const ANSWER_MARGIN: Duration = Duration::from_secs(15);

/// Limit of the calls that do not wait for anything.
const QUICK_CALL: Duration = Duration::from_secs(10);

/// How long an event stream may stay silent before it is taken for dead: zkgate sends a
/// comment every `--ws-ping-interval` (15 s by default), so four of them missed. A killed
/// instance's stream ends at once (its connection is reset); this is for one cut off.
pub const STREAM_IDLE: Duration = Duration::from_secs(60);

/// Why a call to zkgate failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// No answer: connection refused or reset, or no reply in time.
    #[error("cannot reach zkgate at {url}: {cause}")]
    Unreachable { url: String, cause: String },
    /// An error answer; `detail` is the problem document's, which says what went wrong.
    #[error("{detail}")]
    Refused { status: StatusCode, detail: String },
    /// An answer that is not what zkgate sends (another server at that address?).
    #[error("unexpected answer from {url}: {what}")]
    Unexpected { url: String, what: String },
}

impl CallError {
    /// Worth trying again: no answer, or zkgate cannot reach ZooKeeper for now (503).
    pub fn is_transient(&self) -> bool {
        match self {
            CallError::Unreachable { .. } => true,
            CallError::Refused { status, .. } => *status == StatusCode::SERVICE_UNAVAILABLE,
            CallError::Unexpected { .. } => false,
        }
    }

    /// The lease or handle is no more (404: unknown, e.g. zkgate restarted; 410: ended).
    pub fn is_gone(&self) -> bool {
        matches!(self, CallError::Refused { status, .. }
            if *status == StatusCode::NOT_FOUND || *status == StatusCode::GONE)
    }
}

/// A request of a subcommand.
pub struct Request<'a> {
    pub method: Method,
    /// The path's segments after the base URL (each one segment, whatever it holds).
    pub path: Vec<&'a str>,
    pub query: Vec<(&'a str, String)>,
    pub headers: HeaderMap,
    /// The body, with its `Content-Type`.
    pub body: Option<(String, Vec<u8>)>,
    /// How long it may take in all.
    pub limit: Duration,
}

impl<'a> Request<'a> {
    /// `method` of `path`, with nothing else, within [QUICK_CALL].
    pub fn new(method: Method, path: Vec<&'a str>) -> Request<'a> {
        Request {
            method,
            path,
            query: Vec::new(),
            headers: HeaderMap::new(),
            body: None,
            limit: QUICK_CALL,
        }
    }

    /// With a JSON body.
    pub fn json(mut self, body: &Value) -> Request<'a> {
        self.body = Some(("application/json".into(), body.to_string().into_bytes()));
        self
    }
}

/// An answer, as it came.
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: bytes::Bytes,
}

impl Answer {
    /// Its body as JSON (see [json_or_text]).
    pub fn json(&self) -> Value {
        json_or_text(&self.body)
    }

    /// The error it is, when its status is one: the problem's `detail`.
    pub fn error(&self) -> Option<CallError> {
        (!self.status.is_success() && self.status != StatusCode::NOT_MODIFIED)
            .then(|| refused(self.status, &self.json()))
    }

    /// A header's value, as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }
}

/// A lease as created.
#[derive(Clone, Debug, Deserialize)]
pub struct Lease {
    pub id: String,
    /// The TTL granted (zkgate clamps what is asked to its bounds).
    pub ttl_ms: u64,
}

impl Lease {
    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms)
    }
}

/// Where an acquire or a campaign stands when its long poll answers.
#[derive(Debug)]
pub enum Standing {
    /// Granted (200): the handle and its fencing token (a lock's, or the leader's term).
    Granted { handle: String, fencing_token: i64 },
    /// Still queued (202) at `position`.
    Queued { position: u64 },
}

/// A handle's long poll answer, reduced to what a runner acts on.
#[derive(Debug, Deserialize)]
pub struct HandleNews {
    /// `held` while all is well; `lost`, `released` or `failed` once it is not.
    pub state: String,
    /// Why it was lost or failed.
    pub reason: Option<String>,
    /// Someone asked for the lock back.
    pub revocation: Option<Revocation>,
}

/// A client of the zkgate instances of one deployment; clones share which one answers.
#[derive(Clone)]
pub struct Api {
    http: Client,
    bases: Arc<[Url]>,
    /// The instance calls go to first: the last that answered.
    current: Arc<AtomicUsize>,
}

/// `text` as the base URL of a zkgate: `http(s)://host:port`, maybe with a path prefix.
fn base_url(text: &str) -> Result<Url, String> {
    let base = Url::parse(text).map_err(|e| format!("--url `{text}` is not a URL: {e}"))?;
    match base.scheme() {
        "http" | "https" => {}
        other => {
            return Err(format!(
                "--url `{base}`: the scheme must be http or https, not `{other}`"
            ));
        }
    }
    if base.cannot_be_a_base() || base.host().is_none() {
        return Err(format!("--url `{base}` names no host"));
    }
    Ok(base)
}

impl Api {
    /// A client for the zkgate instances at `bases` (`http(s)://host:port`, maybe with a path
    /// prefix; at least one), sending `Authorization: Bearer <token>` when a token is given,
    /// and trusting the CAs in the PEM file `ca` besides the system's.
    pub fn new<S: AsRef<str>>(bases: &[S], token: Option<&str>, ca: Option<&std::path::Path>) -> Result<Api, String> {
        let bases: Vec<Url> = bases
            .iter()
            .map(|base| base_url(base.as_ref().trim()))
            .collect::<Result<_, _>>()?;
        if bases.is_empty() {
            return Err("--url: give at least one zkgate URL".to_string());
        }
        let mut headers = HeaderMap::new();
        if let Some(token) = token {
            let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| "the token must be visible ASCII (--token / ZKGATE_TOKEN)".to_string())?;
            value.set_sensitive(true);
            headers.insert(AUTHORIZATION, value);
        }
        crate::tls::install_crypto_provider();
        // Idle connections go before zkgate closes them (`--header-timeout`, 30 s by default).
        let mut builder = Client::builder().pool_idle_timeout(std::time::Duration::from_secs(20));
        if let Some(ca) = ca {
            let pem = std::fs::read(ca).map_err(|e| format!("--ca {}: {e}", ca.display()))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| format!("--ca {}: not PEM certificates: {e}", ca.display()))?;
            builder = builder.tls_certs_merge(certs);
        }
        let http = builder
            .default_headers(headers)
            .connect_timeout(CONNECT_TIMEOUT)
            .user_agent(concat!("zkgate-runner/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("cannot set up an HTTP client: {e}"))?;
        Ok(Api {
            http,
            bases: bases.into(),
            current: Arc::default(),
        })
    }

    /// The zkgate calls go to now (the last that answered), as given.
    pub fn url(&self) -> String {
        self.bases[self.current.load(Ordering::Relaxed) % self.bases.len()]
            .as_str()
            .trim_end_matches('/')
            .to_string()
    }

    /// Creates a lease with `ttl`.
    pub async fn create_lease(&self, ttl: Duration) -> Result<Lease, CallError> {
        let body = json!({ "ttl": wire_duration(ttl) });
        let (_, answer) = self
            .call(Method::POST, &["v1", "leases"], &[], Some(body), QUICK_CALL)
            .await?;
        self.parse(answer)
    }

    /// Restarts the lease's TTL; gives up after `limit`.
    pub async fn keepalive(&self, lease: &str, limit: Duration) -> Result<(), CallError> {
        let path = ["v1", "leases", lease, "keepalive"];
        self.call(Method::POST, &path, &[], None, limit).await.map(drop)
    }

    /// Deletes the lease, which releases everything it holds before zkgate answers.
    pub async fn delete_lease(&self, lease: &str) -> Result<(), CallError> {
        let path = ["v1", "leases", lease];
        self.call(Method::DELETE, &path, &[], None, QUICK_CALL).await.map(drop)
    }

    /// Acquires (or campaigns) with `lease`, waiting up to `wait` and staying queued when the
    /// wait ends first; the same call again resumes the wait with the same place in the queue.
    pub async fn contend(&self, target: &Target, lease: &str, wait: Duration) -> Result<Standing, CallError> {
        let mut query = vec![("wait", wire_duration(wait)), ("keep_queued", "true".to_string())];
        query.extend(target.contend_query());
        let (path, body, limit) = (target.contend_path(), target.contend_body(lease), wait + ANSWER_MARGIN);
        let (status, answer) = self.call(Method::POST, &path, &query, Some(body), limit).await?;
        // A lock's and a permit's grant say `fencing_token`; a leader's says `term`, which plays
        // that part.
        let token = answer["fencing_token"].as_i64().or(answer["term"].as_i64());
        match (status, answer["handle"].as_str(), token) {
            (StatusCode::OK, Some(handle), Some(fencing_token)) => Ok(Standing::Granted {
                handle: handle.to_string(),
                fencing_token,
            }),
            (StatusCode::ACCEPTED, Some(_), _) => Ok(Standing::Queued {
                position: answer["position"].as_u64().unwrap_or_default(),
            }),
            _ => Err(self.unexpected(format!("{status} with {answer}"))),
        }
    }

    /// Reads a handle, waiting up to `wait` for news (a revocation request, a loss).
    pub async fn news(&self, target: &Target, handle: &str, wait: Duration) -> Result<HandleNews, CallError> {
        let query = [("wait", wire_duration(wait))];
        let (path, limit) = (target.handle_path(handle), wait + ANSWER_MARGIN);
        let (_, answer) = self.call(Method::GET, &path, &query, None, limit).await?;
        self.parse(answer)
    }

    /// Sends `request` to the instance that answered last, or the next that answers (as
    /// [Api::call] does): its answer, whatever its status but 503 (tried on the next instance;
    /// the last one's 503 is the error).
    pub async fn send(&self, request: &Request<'_>) -> Result<Answer, CallError> {
        self.first_answering(|at| self.send_at(at, request)).await
    }

    /// [Api::send] to the instance `at`.
    async fn send_at(&self, at: usize, request: &Request<'_>) -> Result<Answer, CallError> {
        let base = &self.bases[at];
        let url = endpoint(base, &request.path, &request.query);
        let mut built = (self.http.request(request.method.clone(), url))
            .headers(request.headers.clone())
            .timeout(request.limit);
        if let Some((content_type, bytes)) = &request.body {
            built = built
                .header(reqwest::header::CONTENT_TYPE, content_type)
                .body(bytes.clone());
        }
        let response = built.send().await.map_err(|e| unreachable(base, &e, request.limit))?;
        let (status, headers) = (response.status(), response.headers().clone());
        let body = response
            .bytes()
            .await
            .map_err(|e| unreachable(base, &e, request.limit))?;
        if status == StatusCode::SERVICE_UNAVAILABLE {
            return Err(refused(status, &json_or_text(&body)));
        }
        Ok(Answer { status, headers, body })
    }

    /// Opens the event stream of `topic` (`GET /v1/events?topic=…`), resuming after the event
    /// whose id is `last_id` (sent as `Last-Event-ID`), on the instance that answered last or
    /// the next that answers: the answer, whose body is read as the events come. The head
    /// must come within [QUICK_CALL]; the body has no limit (see [STREAM_IDLE]).
    pub async fn events(&self, topic: &str, last_id: Option<&str>) -> Result<reqwest::Response, CallError> {
        let query = [("topic", topic.to_string())];
        let mut headers = HeaderMap::new();
        if let Some(id) = last_id {
            let id = HeaderValue::from_str(id).map_err(|_| self.unexpected(format!("an event id `{id}`")))?;
            headers.insert("last-event-id", id);
        }
        self.first_answering(|at| self.events_at(at, &query, headers.clone()))
            .await
    }

    /// [Api::events] on the instance `at`.
    async fn events_at(
        &self,
        at: usize,
        query: &[(&str, String)],
        headers: HeaderMap,
    ) -> Result<reqwest::Response, CallError> {
        let base = &self.bases[at];
        let request = self.http.get(endpoint(base, &["v1", "events"], query)).headers(headers);
        let response = match tokio::time::timeout(QUICK_CALL, request.send()).await {
            Ok(sent) => sent.map_err(|e| unreachable(base, &e, QUICK_CALL))?,
            Err(_) => return Err(no_answer(base, QUICK_CALL)),
        };
        match response.status() {
            status if status.is_success() => Ok(response),
            status => Err(refused(status, &read_answer(base, response, QUICK_CALL).await?)),
        }
    }

    /// Sends one request to the instance that answered last and, while the instance tried
    /// does not answer or answers 503, to each next one in turn (each within `limit`); a
    /// success status with its JSON answer (`null` when empty), or why not (the last
    /// instance's answer).
    async fn call(
        &self,
        method: Method,
        path: &[&str],
        query: &[(&str, String)],
        body: Option<Value>,
        limit: Duration,
    ) -> Result<(StatusCode, Value), CallError> {
        self.first_answering(|at| self.call_at(at, method.clone(), path, query, body.clone(), limit))
            .await
    }

    /// [Api::call] to the instance `at`.
    async fn call_at(
        &self,
        at: usize,
        method: Method,
        path: &[&str],
        query: &[(&str, String)],
        body: Option<Value>,
        limit: Duration,
    ) -> Result<(StatusCode, Value), CallError> {
        let base = &self.bases[at];
        let mut request = self.http.request(method, endpoint(base, path, query)).timeout(limit);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.map_err(|e| unreachable(base, &e, limit))?;
        let status = response.status();
        let answer = read_answer(base, response, limit).await?;
        match status.is_success() {
            true => Ok((status, answer)),
            false => Err(refused(status, &answer)),
        }
    }

    /// `attempt` on the instance that answered last and, while it does not answer (or answers
    /// 503), on each next one in turn: the first answer, or the last instance's failure. The
    /// one that answered is tried first next time.
    async fn first_answering<T, F>(&self, attempt: impl Fn(usize) -> F) -> Result<T, CallError>
    where
        F: std::future::Future<Output = Result<T, CallError>>,
    {
        let first = self.current.load(Ordering::Relaxed);
        let mut failed = None;
        for tried in 0..self.bases.len() {
            let at = (first + tried) % self.bases.len();
            match attempt(at).await {
                Err(error) if error.is_transient() => failed = Some(error),
                answered => {
                    self.current.store(at, Ordering::Relaxed);
                    return answered;
                }
            }
        }
        Err(failed.expect("at least one instance was tried"))
    }

    fn parse<T: serde::de::DeserializeOwned>(&self, answer: Value) -> Result<T, CallError> {
        serde_json::from_value(answer).map_err(|e| self.unexpected(e.to_string()))
    }

    fn unexpected(&self, what: String) -> CallError {
        CallError::Unexpected { url: self.url(), what }
    }
}

/// `base` + the path segments (each percent-encoded, so a name is always one segment).
fn endpoint(base: &Url, path: &[&str], query: &[(&str, String)]) -> Url {
    let mut url = base.clone();
    if let Ok(mut segments) = url.path_segments_mut() {
        segments.pop_if_empty().extend(path);
    }
    if !query.is_empty() {
        url.query_pairs_mut().extend_pairs(query);
    }
    url
}

/// An answer's body as JSON (`null` when empty, a string when it is not JSON).
async fn read_answer(base: &Url, response: reqwest::Response, limit: Duration) -> Result<Value, CallError> {
    let bytes = response.bytes().await.map_err(|e| unreachable(base, &e, limit))?;
    Ok(json_or_text(&bytes))
}

/// A body as JSON: `null` when empty, a string when it is not JSON.
pub fn json_or_text(bytes: &[u8]) -> Value {
    match bytes.is_empty() {
        true => Value::Null,
        false => serde_json::from_slice(bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into())),
    }
}

/// No answer from `base` within `limit`.
pub fn no_answer(base: &Url, limit: Duration) -> CallError {
    CallError::Unreachable {
        url: base.to_string(),
        cause: format!("no answer within {}", humantime::format_duration(limit)),
    }
}

fn unreachable(base: &Url, error: &reqwest::Error, limit: Duration) -> CallError {
    let cause = if error.is_timeout() {
        format!("no answer within {}", humantime::format_duration(limit))
    } else {
        innermost_cause(error)
    };
    CallError::Unreachable {
        url: base.to_string(),
        cause,
    }
}

/// The error for a failure status: the problem document's `detail` when there is one.
fn refused(status: StatusCode, answer: &Value) -> CallError {
    let detail = match (answer["detail"].as_str(), answer.as_str()) {
        (Some(detail), _) => detail.to_string(),
        (None, Some(text)) if !text.trim().is_empty() => {
            format!("{status}: {}", text.trim().chars().take(200).collect::<String>())
        }
        _ => status.to_string(),
    };
    CallError::Refused { status, detail }
}

/// reqwest's own message ("error sending request for url ...") hides the reason ("Connection
/// refused"), which is at the bottom of the chain of sources.
fn innermost_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
}

/// A duration as zkgate reads it (`1500ms`).
fn wire_duration(duration: Duration) -> String {
    format!("{}ms", duration.as_millis())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_one_path_segment_each() {
        let base = base_url("http://127.0.0.1:7070/prefix/").expect("url");
        let url = endpoint(&base, &["v1", "locks", "a/b c", "acquire"], &[("wait", "0ms".into())]);
        assert_eq!(
            url.as_str(),
            "http://127.0.0.1:7070/prefix/v1/locks/a%2Fb%20c/acquire?wait=0ms"
        );
    }

    #[test]
    fn only_http_and_https_urls_are_accepted() {
        assert!(Api::new(&["http://zkgate:7070"], Some("t0ken"), None).is_ok());
        assert!(Api::new(&["https://zkgate:7070"], Some("t0ken"), None).is_ok());
        assert!(Api::new(&["http://a:7070", "http://b:7070"], None, None).is_ok());
        assert!(Api::new::<&str>(&[], None, None).is_err());
        for (url, complaint) in [
            ("ftp://zkgate", "the scheme must be http or https"),
            ("zkgate:7070", "the scheme must be http"),
            ("not a url", "is not a URL"),
        ] {
            match Api::new(&["http://fine:7070", url], None, None) {
                Ok(_) => panic!("{url} accepted"),
                Err(message) => assert!(message.contains(complaint), "{url}: {message}"),
            }
        }
        assert!(Api::new(&["http://zkgate"], Some("bad\ntoken"), None).is_err());
    }

    #[test]
    fn a_problem_document_is_reported_by_its_detail() {
        let problem = json!({"type": "urn:zkgate:problem:lease-ended", "status": 410, "detail": "lease `x` has ended"});
        let error = refused(StatusCode::GONE, &problem);
        assert_eq!(error.to_string(), "lease `x` has ended");
        assert!(error.is_gone() && !error.is_transient());
        let plain = refused(StatusCode::BAD_GATEWAY, &Value::String("upstream down\n".into()));
        assert_eq!(plain.to_string(), "502 Bad Gateway: upstream down");
        assert!(refused(StatusCode::SERVICE_UNAVAILABLE, &Value::Null).is_transient());
    }
}
