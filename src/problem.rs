//! Every problem zkgate can answer, in one catalogue, and the one error every operation
//! returns: [ApiError], a [Problem] and what it says in this case. Transport-neutral: the HTTP
//! edge renders it as an RFC 9457 problem document (`application/problem+json`,
//! `http::error`), a socket as an `error` message, and a recipe's operation returns it as it
//! is, so that a handler maps a refusal with `?`.
//!
//! A [Problem] has its `type` (a `urn:zkgate:problem:<slug>` URI), its status, its title, when
//! it happens and the extension members it carries (`field` for bad input, `reason` for an
//! ended lease, the queue `position` for a wait that ended...). Handlers declare the problems
//! they can answer with `http::error::Problems` in their `responses(...)`, and the spec's error
//! responses are generated from the catalogue, so the description of a problem is written once.
//! The README's tables of errors are checked against [Problem::ALL] by a test.
//!
//! ZooKeeper being unreachable is a 503 with `Retry-After`, never a 500. What each lower
//! layer's error answers is said beside that error (`impl From<…> for ApiError`).
//!
//! Why this file is long (over 400 lines): most of it is the catalogue, one table of every
//! problem, kept whole on purpose: one place is what keeps the slugs unique and the statuses
//! grouped for the spec.

use axum::http::StatusCode;
use serde::Serialize;
use serde_json::{Map, Value, json};

/// Where a problem can be answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Channel {
    /// As an HTTP response (and as a socket call's reply).
    Http,
    /// As a socket's `{"op":"error"}` message only.
    Socket,
}

macro_rules! catalogue {
    ($($variant:ident: $channel:ident, $status:literal, $slug:literal, $title:literal, [$($field:literal),*], $when:literal;)+) => {
        /// A problem zkgate can answer.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Problem {
            $($variant),+
        }

        impl Problem {
            /// Every problem.
            pub const ALL: &'static [Problem] = &[$(Problem::$variant),+];

            pub fn status(self) -> StatusCode {
                match self {
                    $(Problem::$variant => StatusCode::from_u16($status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)),+
                }
            }

            /// The last part of its `type`: `urn:zkgate:problem:<slug>`.
            pub fn slug(self) -> &'static str {
                match self {
                    $(Problem::$variant => $slug),+
                }
            }

            pub fn title(self) -> &'static str {
                match self {
                    $(Problem::$variant => $title),+
                }
            }

            /// When it happens, for the spec and the README.
            pub fn when(self) -> &'static str {
                match self {
                    $(Problem::$variant => $when),+
                }
            }

            /// The extension members it carries besides `type`, `title`, `status`, `detail`.
            pub fn fields(self) -> &'static [&'static str] {
                match self {
                    $(Problem::$variant => &[$($field),*]),+
                }
            }

            pub fn channel(self) -> Channel {
                match self {
                    $(Problem::$variant => Channel::$channel),+
                }
            }
        }

        /// One type per problem, to declare in an operation's `responses(...)` which problems
        /// it can answer: `Problems<(p::InvalidField, p::ZookeeperUnavailable)>`.
        pub mod p {
            $(
                #[doc = $when]
                pub struct $variant;

                impl super::Declared for $variant {
                    const PROBLEM: super::Problem = super::Problem::$variant;
                }
            )+
        }
    };
}

catalogue! {
    InvalidField: Http, 400, "invalid-field", "Invalid request field", ["field", "in"],
        "a bad name, parameter, header or body field; `field` and `in` say which; ZooKeeper is not touched";
    MalformedBody: Http, 400, "malformed-body", "Malformed request body", [],
        "the body is not JSON (or not the JSON object expected)";
    MalformedRequest: Http, 400, "malformed-request", "Malformed request", [],
        "a request head that is not HTTP/1.1 as it must be, refused before routing (the connection is closed after the answer)";
    NotAWebsocket: Http, 400, "not-a-websocket", "Not a WebSocket upgrade", [],
        "a plain request to a WebSocket endpoint";
    Unauthorized: Http, 401, "unauthorized", "Authentication required", [],
        "no bearer token, or one not in `--auth-config`";
    Forbidden: Http, 403, "forbidden", "Not allowed", [],
        "the token's principal may not touch that name, or the lease, handle or claim is another principal's";
    ZookeeperRefused: Http, 403, "zookeeper-refused", "ZooKeeper refused", [],
        "ZooKeeper's ACL on the znode leaves zkgate's own identity out (see `--zookeeper-auth`)";
    NotFound: Http, 404, "not-found", "Not found", ["resource"],
        "no such lease, handle, member, key, transaction, barrier or item (`resource` says which)";
    NotHeld: Http, 404, "not-held", "Not held", [],
        "a fencing check of a lock (or read/write lock, or election) that nobody holds (no leader)";
    NoSuchEndpoint: Http, 404, "no-such-endpoint", "No such endpoint", [],
        "an unknown path";
    MethodNotAllowed: Http, 405, "method-not-allowed", "Method not allowed", ["allowed"],
        "a known path with another method (`allowed` lists the methods it takes)";
    LockNotAcquired: Http, 409, "lock-not-acquired", "Lock not acquired", ["position", "queued", "lock"],
        "the wait ended without the lock (or permit, or leadership), and the request left the queue; for a lock set, `lock` names the lock not granted, and the set holds nothing";
    ModeChangeRefused: Http, 409, "mode-change-refused", "Lock mode change refused", ["handle", "mode"],
        "a lease that reads a read/write lock asked to write it (or the other way round)";
    NotLeader: Http, 409, "not-leader", "Not the leader", ["state"],
        "a candidate that does not lead asked to proclaim";
    MemberTaken: Http, 409, "member-taken", "Id taken", [],
        "a member or participant id that another lease holds";
    KeyNotEmpty: Http, 409, "key-not-empty", "Key has keys below it", [],
        "deleting a key with keys below it";
    KeyBound: Http, 409, "key-bound", "Key bound to a lease", ["lease"],
        "a write over a key bound to a lease (`lease` names it) that is bound to no lease or to another one, without `rebind=true`";
    KeyNotBound: Http, 409, "key-not-bound", "Key not bound to a lease", [],
        "a write bound to a lease over a key that exists bound to none, without `rebind=true`";
    StaleFencingToken: Http, 409, "stale-fencing-token", "Fencing token not current", ["current_token"],
        "a fencing check of a token that is not a current holder's (or the leader's term): `current_token` is the newest holder's";
    NothingToRevoke: Http, 409, "nothing-to-revoke", "Nothing to revoke", [],
        "revoking a lock nobody holds";
    PermitsMismatch: Http, 409, "permits-mismatch", "Permits mismatch", ["permits"],
        "a semaphore asked with another number of permits than it has";
    BarrierUp: Http, 409, "barrier-up", "Barrier still up", [],
        "a barrier still up when the wait ended";
    SizeMismatch: Http, 409, "size-mismatch", "Size mismatch", ["size"],
        "a double barrier entered with another size than it has";
    TxnExists: Http, 409, "txn-exists", "Transaction exists", [],
        "a transaction id that is taken";
    NotAParticipant: Http, 409, "not-a-participant", "Not a participant", [],
        "a name the transaction does not list as a participant";
    NotRegistered: Http, 409, "not-registered", "Not registered", [],
        "a participant that votes before it registered";
    AlreadyVoted: Http, 409, "already-voted", "Already voted", ["vote"],
        "a participant that voted otherwise before (a vote is final)";
    TxnDecided: Http, 409, "txn-decided", "Already decided", ["outcome"],
        "a vote after the decision";
    OutOfBounds: Http, 409, "out-of-bounds", "Counter out of bounds", ["value"],
        "an add that would take the counter past its `min` or `max` (or past a 64-bit integer); `value` is the counter's value, which did not change";
    NotACounter: Http, 409, "not-a-counter", "Not a counter", ["size_bytes"],
        "the counter's znode holds data that is not an 8-byte big-endian number (something else wrote it)";
    GuardLost: Http, 409, "guard-lost", "Guard lost", ["guard", "reason", "current_token"],
        "a write guarded by `ZKGATE-Guard` whose handle does not hold what the guard names (the lock, a read or write hold, a permit, the leadership) when ZooKeeper would apply it: nothing is written; `guard` names it, `reason` says why (`released`, `revoked`, `lost`, `lease-ended`, `not-held`), `current_token` is the holder's now if another holds";
    LeaseEnded: Http, 410, "lease-ended", "Lease ended", ["reason"],
        "the lease ended (`reason`: `deleted`, `expired`)";
    LockLost: Http, 410, "lock-lost", "Lock lost", ["reason", "lock"],
        "the lock (or leadership, or permit) was lost before this request: its lease expired, or its node was deleted (`reason` says which)";
    ClaimLost: Http, 410, "claim-lost", "Claim lost", [],
        "a queue claim acked or given back after it ended (its ack deadline passed: the item is delivered again)";
    PreconditionFailed: Http, 412, "precondition-failed", "Precondition failed", ["current_etag"],
        "`If-Match` / `If-None-Match` did not hold (`current_etag` says what is there)";
    BodyTooLarge: Http, 413, "body-too-large", "Request body too large", ["limit_bytes"],
        "a body over the limit (512 KiB)";
    ValueTooLarge: Http, 413, "value-too-large", "Value too large", ["limit_bytes", "size_bytes"],
        "a value, item, member's data, proclaimed value or payload whose stored size is over `--max-value-bytes` (256 KiB)";
    UriTooLong: Http, 414, "uri-too-long", "URI too long", ["limit_bytes"],
        "a request URI (path and query) over 8 KiB; `limit_bytes` says the bound";
    IdempotencyKeyReused: Http, 422, "idempotency-key-reused", "Idempotency key reused", [],
        "an `Idempotency-Key` the principal used for another request (another operation, resource, query or body): a retry must repeat its request byte for byte";
    QueueFull: Http, 429, "queue-full", "Queue full", ["depth"],
        "a put into a queue at `--queue-max-depth`; retry after `Retry-After` seconds";
    RateLimited: Http, 429, "rate-limited", "Too many writes", [],
        "more writes a second than `--write-rate`; retry after `Retry-After` seconds";
    TooMany: Http, 429, "too-many", "Limit reached", [],
        "a limit on leases, waiting contenders, long polls, sockets or subscriptions (see Limits); retry after `Retry-After` seconds";
    HeadersTooLarge: Http, 431, "headers-too-large", "Request headers too large", ["limit"],
        "a request head with more than 100 header fields or over 32 KiB of them; `limit` says which bound";
    Internal: Http, 500, "internal", "Internal error", [],
        "ZooKeeper answered what zkgate did not expect (a bug: please report it)";
    QuotaExceeded: Http, 507, "quota-exceeded", "Quota exceeded", ["quota"],
        "a write past a ZooKeeper quota: the principal's (`--quota-bytes-per-principal`, `--quota-znodes-per-principal`) or zkgate's whole tree's (`--quota-bytes`, `--quota-znodes`); `quota` names it. Delete something first";
    OutcomeUnknown: Http, 503, "outcome-unknown", "Outcome unknown", [],
        "ZooKeeper's connection was lost after a write was sent (a kv put or delete, a counter's write, a transaction without an `Idempotency-Key`) and nothing tells whether it happened. Read before trying again";
    InstanceUnavailable: Http, 503, "instance-unavailable", "Instance unavailable", [],
        "the lease moved to another instance while the request was on its way (or this instance, handed the request, keeps it no more); retry after `Retry-After` seconds";
    ZookeeperUnavailable: Http, 503, "zookeeper-unavailable", "ZooKeeper unavailable", [],
        "ZooKeeper is unreachable; retry after `Retry-After` seconds";
    Overloaded: Http, 503, "overloaded", "Overloaded", [],
        "the request waited longer than `--queue-delay-target` for its turn while requests queue here (more arrive than the instance serves): refused at once instead of served late; retry after `Retry-After` seconds";
    MalformedMessage: Socket, 400, "malformed-message", "Malformed message", [],
        "a message that is not one of the socket's operations";
    InvalidTopic: Socket, 400, "invalid-topic", "Invalid topic", [],
        "an unknown topic, or a bad name or znode path in one";
    InvalidCall: Socket, 400, "invalid-call", "Invalid call", [],
        "a call whose method, path or headers are not valid";
    InvalidLease: Socket, 400, "invalid-lease", "Invalid lease", [],
        "a socket lease with a zero TTL";
    UnknownSubscription: Socket, 404, "unknown-subscription", "Unknown subscription", [],
        "unsubscribing an id that is not subscribed";
    UnknownLease: Socket, 404, "unknown-lease", "Unknown lease", [],
        "attaching a lease this instance does not have";
    DuplicateSubscription: Socket, 409, "duplicate-subscription", "Duplicate subscription", [],
        "subscribing with an id already in use on the socket";
    TooManySubscriptions: Socket, 429, "too-many-subscriptions", "Too many subscriptions", [],
        "more than 64 subscriptions on one socket";
    TooManyCalls: Socket, 429, "too-many-calls", "Too many calls", [],
        "more than 32 calls in flight on one socket";
    TooManyLeases: Socket, 429, "too-many-leases", "Too many leases", [],
        "more than 16 leases kept alive by one socket";
}

/// The most characters of a client's input an error quotes: a name or key refused for its
/// length (or anything else) is cut to this, so that a 4 KB key is not sent back whole.
pub const MAX_QUOTED: usize = 64;

/// `text` with every span quoted in backticks longer than [MAX_QUOTED] characters cut, and
/// its length said (`` `aaaa…` (4096 bytes) ``); what follows an unpaired backtick is cut the
/// same way.
pub fn cut_quotes(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(1024));
    let mut parts = text.split('`').peekable();
    let mut quoted = false;
    while let Some(part) = parts.next() {
        if !quoted {
            out.push_str(part);
        } else {
            let (kept, was_cut) = cut(part, MAX_QUOTED);
            out.push('`');
            out.push_str(&kept);
            // Closed only if a backtick follows it in `text`.
            if parts.peek().is_some() {
                out.push('`');
            }
            if was_cut {
                out.push_str(&format!(" ({} bytes)", part.len()));
            }
        }
        quoted = !quoted;
    }
    out
}

/// `text` cut to `most` characters (with `…`), and whether it was.
fn cut(text: &str, most: usize) -> (String, bool) {
    match text.char_indices().nth(most) {
        Some((at, _)) => (format!("{}…", &text[..at]), true),
        None => (text.to_string(), false),
    }
}

impl Problem {
    /// `urn:zkgate:problem:<slug>`.
    pub fn type_uri(self) -> String {
        format!("urn:zkgate:problem:{}", self.slug())
    }
}

/// A problem type an operation declares (see [p]).
pub trait Declared {
    const PROBLEM: Problem;
}

/// Where in the request a bad field is.
#[derive(Clone, Copy, Debug, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Place {
    Body,
    Query,
    Path,
    Header,
}

/// Everything an HTTP handler can fail with: a [Problem] and what it says in this case.
#[derive(Debug)]
pub struct ApiError {
    problem: Problem,
    detail: String,
    extra: Map<String, Value>,
    retry_after: Option<u64>,
}

impl ApiError {
    /// `problem`, saying `detail`. Problems a client should retry (429, 503) say when:
    /// `Retry-After: 1` unless [ApiError::retry_after] says otherwise.
    pub fn new(problem: Problem, detail: impl Into<String>) -> ApiError {
        let status = problem.status();
        let retry = status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE;
        ApiError {
            problem,
            detail: detail.into(),
            extra: Map::new(),
            retry_after: retry.then_some(1),
        }
    }

    /// Adds an extension member to the problem document.
    pub fn with(mut self, key: &str, value: impl Serialize) -> ApiError {
        self.extra.insert(key.to_string(), json!(value));
        self
    }

    /// When to try again, in seconds (at least 1).
    pub fn retry_after(mut self, seconds: u64) -> ApiError {
        self.retry_after = Some(seconds.max(1));
        self
    }

    /// `field` of the request's `place` (`body`, `query`, `path` or `header`) is invalid.
    pub fn invalid(place: Place, field: &str, detail: impl std::fmt::Display) -> ApiError {
        let description = match place {
            Place::Body => "body field",
            Place::Query => "query parameter",
            Place::Path => "path parameter",
            Place::Header => "header",
        };
        let detail = cut_quotes(&format!("{description} `{field}`: {detail}"));
        ApiError::new(Problem::InvalidField, detail)
            .with("field", cut(field, MAX_QUOTED).0)
            .with("in", place)
    }

    /// The body is not valid JSON at all.
    pub fn malformed_body(detail: impl std::fmt::Display) -> ApiError {
        ApiError::new(Problem::MalformedBody, detail.to_string())
    }

    /// The body is larger than `limit` bytes.
    pub fn too_large(limit: usize) -> ApiError {
        ApiError::new(
            Problem::BodyTooLarge,
            format!("the request body exceeds the limit of {limit} bytes"),
        )
        .with("limit_bytes", limit)
    }

    /// A value of `size` bytes as stored, over the `limit` (`--max-value-bytes`).
    pub fn value_too_large(what: &str, size: usize, limit: usize) -> ApiError {
        ApiError::new(
            Problem::ValueTooLarge,
            format!("the {what} takes {size} bytes as stored, over the limit of {limit} bytes (--max-value-bytes)"),
        )
        .with("limit_bytes", limit)
        .with("size_bytes", size)
    }

    /// 507 naming the quota a write would pass (the flag that sets it: `--quota-znodes`...).
    pub fn quota(quota: &str, detail: impl Into<String>) -> ApiError {
        ApiError::new(Problem::QuotaExceeded, detail).with("quota", quota)
    }

    /// No such thing (`what` is e.g. "lease", "handle").
    pub fn not_found(what: &str, detail: impl Into<String>) -> ApiError {
        ApiError::new(Problem::NotFound, detail).with("resource", what)
    }

    /// ZooKeeper cannot be reached right now.
    pub fn unavailable(detail: impl Into<String>) -> ApiError {
        ApiError::new(Problem::ZookeeperUnavailable, detail)
    }

    /// The problem document: `type`, `title`, `status`, `detail` and the extension members.
    pub fn body(&self) -> Value {
        let mut body = Map::new();
        body.insert("type".into(), json!(self.problem.type_uri()));
        body.insert("title".into(), json!(self.problem.title()));
        body.insert("status".into(), json!(self.problem.status().as_u16()));
        body.insert("detail".into(), json!(self.detail));
        body.extend(self.extra.clone());
        Value::Object(body)
    }

    pub fn problem(&self) -> Problem {
        self.problem
    }

    pub fn detail(&self) -> &str {
        &self.detail
    }

    pub fn status(&self) -> StatusCode {
        self.problem.status()
    }

    /// When to try again, in seconds, if the problem says.
    pub fn retry_after_seconds(&self) -> Option<u64> {
        self.retry_after
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_are_unique_and_statuses_are_errors() {
        let mut slugs = std::collections::HashSet::new();
        for problem in Problem::ALL {
            assert!(slugs.insert(problem.slug()), "{problem:?}");
            assert!(problem.status().is_client_error() || problem.status().is_server_error());
        }
    }

    #[test]
    fn quoted_input_is_cut_and_its_length_said() {
        let long = "k".repeat(4096);
        let cut = cut_quotes(&format!("body field `compare`: `{long}` is not a valid key"));
        assert_eq!(
            cut,
            format!(
                "body field `compare`: `{}…` (4096 bytes) is not a valid key",
                "k".repeat(MAX_QUOTED)
            )
        );
        assert_eq!(cut_quotes("no quotes"), "no quotes");
        assert_eq!(cut_quotes("`short` and `x`"), "`short` and `x`");
        let unpaired = cut_quotes(&format!("a `{long}"));
        assert_eq!(unpaired, format!("a `{}… (4096 bytes)", "k".repeat(MAX_QUOTED)));
        // Characters, not bytes: never cut inside one.
        let wide = cut_quotes(&format!("`{}`", "é".repeat(100)));
        assert!(wide.starts_with(&format!("`{}…`", "é".repeat(MAX_QUOTED))), "{wide}");
    }
}
