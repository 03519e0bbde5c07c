//! Who is calling, and what they may touch.
//!
//! With `--auth-config FILE` every request (and every WebSocket handshake) must carry a bearer
//! token listed in that file, by its SHA-256, under a *principal*. A principal has grants: for
//! some resource kinds (`locks`, `queues`, ...), the names starting with some prefixes, read or
//! write access. An `admin` principal may do everything, including acting on the leases and
//! handles of others. Without the file, zkgate serves everyone with full rights (meant for the
//! embedded default on loopback; `serve` warns loudly when it listens elsewhere like that).
//!
//! Three checks, at three places, so that no handler can forget one:
//! - *authentication* ([authenticate], the outermost layer): token → principal, 401 otherwise;
//! - *authorisation by name* ([authorize], a layer on the API routes, which WebSocket calls go
//!   through too): the kind and name in the path against the grants, 403 otherwise;
//! - *ownership* ([current] + [Caller::owns]): a lease remembers the principal that created it,
//!   and every place that resolves a lease or a handle from a request checks it (403).
//!
//! The caller travels in a task-local for the duration of a request: the lease and handle
//! lookups deep in the handlers read it there instead of every signature carrying it.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::AppState;
use crate::http::error::ApiError;

/// The resource kinds a grant can name: the first segment of `/v1/<kind>/...` (and of a znode
/// path under the root), plus `metrics` for `/metrics`.
pub const KINDS: &[&str] = &[
    "locks",
    "rwlocks",
    "semaphores",
    "elections",
    "barriers",
    "double-barriers",
    "txns",
    "queues",
    "groups",
    "kv",
    "metrics",
];

/// The WebSocket subprotocol a client offers (besides [SUBPROTOCOL]) to carry its token:
/// `zkgate.bearer.<token in base64url, no padding>`. Browsers cannot set an `Authorization`
/// header on a WebSocket; this keeps the token out of the URL (and so out of access logs).
pub const BEARER_SUBPROTOCOL: &str = "zkgate.bearer.";

/// The subprotocol zkgate answers with when the client offered it.
pub const SUBPROTOCOL: &str = "zkgate";

/// Read or write. Write includes read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    Read,
    Write,
}

/// The auth config file (TOML).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default)]
    principals: Vec<PrincipalConfig>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PrincipalConfig {
    name: String,
    /// `sha256:<hex>` of each token this principal may present.
    tokens: Vec<String>,
    #[serde(default)]
    admin: bool,
    #[serde(default)]
    grants: Vec<Grant>,
}

/// Access to the names of some kinds that start with some prefixes.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    /// Resource kinds (see [KINDS]), or `*` for all.
    pub kinds: Vec<String>,
    /// Name prefixes; `""` matches every name.
    pub prefixes: Vec<String>,
    pub access: Access,
}

impl Grant {
    fn covers_kind(&self, kind: &str) -> bool {
        self.kinds.iter().any(|k| k == "*" || k == kind)
    }

    fn covers(&self, kind: &str, name: &str, access: Access) -> bool {
        self.access >= access && self.covers_kind(kind) && self.prefixes.iter().any(|p| name.starts_with(p.as_str()))
    }
}

/// A principal of the config file.
#[derive(Debug)]
pub struct Principal {
    pub name: String,
    pub admin: bool,
    pub grants: Vec<Grant>,
}

/// The tokens of the config file, by their SHA-256.
pub struct Authority {
    by_hash: HashMap<[u8; 32], Arc<Principal>>,
}

impl Authority {
    /// Reads and checks the config file; the error names the file and what is wrong in it.
    pub fn load(path: &Path) -> Result<Authority, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Authority::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Authority, String> {
        let file: ConfigFile = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut by_hash = HashMap::new();
        let mut names = std::collections::HashSet::new();
        for config in file.principals {
            if config.name.is_empty() || !names.insert(config.name.clone()) {
                return Err(format!("principal name `{}` is empty or repeated", config.name));
            }
            for grant in &config.grants {
                if let Some(kind) = grant.kinds.iter().find(|k| *k != "*" && !KINDS.contains(&k.as_str())) {
                    return Err(format!(
                        "principal `{}`: unknown kind `{kind}` (kinds: {}, or `*`)",
                        config.name,
                        KINDS.join(", ")
                    ));
                }
            }
            if config.tokens.is_empty() {
                return Err(format!("principal `{}` has no tokens", config.name));
            }
            let principal = Arc::new(Principal {
                name: config.name.clone(),
                admin: config.admin,
                grants: config.grants,
            });
            for token in &config.tokens {
                let hash = parse_hash(token).map_err(|e| format!("principal `{}`: {e}", config.name))?;
                if by_hash.insert(hash, principal.clone()).is_some() {
                    return Err(format!("principal `{}`: a token hash is listed twice", config.name));
                }
            }
        }
        Ok(Authority { by_hash })
    }

    /// The principal whose token this is.
    pub fn principal(&self, token: &str) -> Option<Arc<Principal>> {
        self.by_hash.get(&sha256(token)).cloned()
    }
}

fn sha256(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// `sha256:<64 hex digits>`.
fn parse_hash(text: &str) -> Result<[u8; 32], String> {
    let hex = text
        .strip_prefix("sha256:")
        .ok_or_else(|| format!("token `{text}` must be written `sha256:<hex>` (see `zkgate token`)"))?;
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("`{text}`: a SHA-256 is 64 hex digits"));
    }
    let mut hash = [0u8; 32];
    for (i, byte) in hash.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
    }
    Ok(hash)
}

/// A new random token and the line that lists it in the config file (`zkgate token`).
pub fn new_token() -> (String, String) {
    let bytes: [u8; 32] = rand::random();
    let token = format!("zkg_{}", to_hex(&bytes));
    let hash = format!("sha256:{}", to_hex(&sha256(&token)));
    (token, hash)
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Who a request is from.
#[derive(Clone, Debug)]
pub enum Caller {
    /// Auth is off: everyone may do everything.
    Anyone,
    Principal(Arc<Principal>),
}

impl Caller {
    /// The principal's name (`None` when auth is off): what leases record as their owner.
    pub fn name(&self) -> Option<&str> {
        match self {
            Caller::Anyone => None,
            Caller::Principal(p) => Some(&p.name),
        }
    }

    pub fn is_admin(&self) -> bool {
        match self {
            Caller::Anyone => true,
            Caller::Principal(p) => p.admin,
        }
    }

    /// May the caller read (or write) the resource `name` of `kind`?
    pub fn may(&self, kind: &str, name: &str, access: Access) -> bool {
        match self {
            Caller::Anyone => true,
            Caller::Principal(p) => p.admin || p.grants.iter().any(|g| g.covers(kind, name, access)),
        }
    }

    /// May the caller do `access` to some names of `kind` (a listing, which is then filtered)?
    fn may_some(&self, kind: &str, access: Access) -> bool {
        match self {
            Caller::Anyone => true,
            Caller::Principal(p) => p.admin || p.grants.iter().any(|g| g.access >= access && g.covers_kind(kind)),
        }
    }

    /// Is a lease (or handle) created by `owner` the caller's to use? An admin's is everyone's.
    pub fn owns(&self, owner: Option<&str>) -> bool {
        self.is_admin() || owner == self.name()
    }

    /// 403 unless [Caller::may].
    pub fn require(&self, kind: &str, name: &str, access: Access) -> Result<(), ApiError> {
        if self.may(kind, name, access) {
            return Ok(());
        }
        Err(self.forbidden(format!("no {} access to {kind} `{name}`", access_word(access))))
    }

    /// 403 unless [Caller::owns]: `what` names the thing (`lease 6f1c…`).
    pub fn require_owner(&self, owner: Option<&str>, what: &str) -> Result<(), ApiError> {
        if self.owns(owner) {
            return Ok(());
        }
        Err(self.forbidden(format!("{what} belongs to another principal")))
    }

    fn forbidden(&self, detail: String) -> ApiError {
        let who = self.name().unwrap_or("anyone");
        ApiError::forbidden(format!("principal `{who}`: {detail}"))
    }
}

fn access_word(access: Access) -> &'static str {
    match access {
        Access::Read => "read",
        Access::Write => "write",
    }
}

tokio::task_local! {
    static CALLER: Caller;
}

/// The caller of the request being served. Outside a request (background tasks, tests that
/// call the library directly) it is [Caller::Anyone]: the layers scope every request.
pub fn current() -> Caller {
    CALLER.try_with(Caller::clone).unwrap_or(Caller::Anyone)
}

/// Runs `f` as `caller` (what the layers do for a request, and a socket for its calls).
pub async fn scope<F: Future>(caller: Caller, f: F) -> F::Output {
    CALLER.scope(caller, f).await
}

/// The bearer token of a request: the `Authorization` header, or on a WebSocket handshake the
/// `zkgate.bearer.<base64url>` subprotocol.
fn token_of(headers: &HeaderMap) -> Result<Option<String>, &'static str> {
    if let Some(value) = headers.get(header::AUTHORIZATION) {
        let value = value.to_str().map_err(|_| "the Authorization header is not ASCII")?;
        let token = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .ok_or("the Authorization header must be `Bearer <token>`")?;
        return Ok(Some(token.trim().to_string()));
    }
    for value in headers.get_all(header::SEC_WEBSOCKET_PROTOCOL) {
        let Ok(value) = value.to_str() else { continue };
        for protocol in value.split(',').map(str::trim) {
            if let Some(encoded) = protocol.strip_prefix(BEARER_SUBPROTOCOL) {
                use base64::Engine;
                let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .decode(encoded)
                    .map_err(|_| "the zkgate.bearer subprotocol must carry the token in base64url")?;
                return String::from_utf8(bytes).map(Some).map_err(|_| "the token is not UTF-8");
            }
        }
    }
    Ok(None)
}

/// Paths anyone may read: probes, the API description and the dashboard's page (which holds
/// no data; it asks for a token when its socket needs one).
fn is_public(path: &str) -> bool {
    matches!(path, "/" | "/healthz" | "/readyz" | "/openapi.json") || path == "/docs" || path.starts_with("/docs/")
}

/// The outermost layer: finds the caller from the token (401 without a valid one) and serves
/// the request as that caller.
pub async fn authenticate(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    let caller = match &state.authority {
        None => Caller::Anyone,
        Some(_) if is_public(request.uri().path()) => Caller::Anyone,
        Some(authority) => match token_of(request.headers()) {
            Err(detail) => return ApiError::unauthorized(detail).into_response(),
            Ok(None) => {
                return ApiError::unauthorized(
                    "send `Authorization: Bearer <token>` (on a WebSocket, the `zkgate.bearer.<base64url token>` subprotocol)",
                )
                .into_response();
            }
            Ok(Some(token)) => match authority.principal(&token) {
                Some(principal) => Caller::Principal(principal),
                None => return ApiError::unauthorized("the token is not valid").into_response(),
            },
        },
    };
    request.extensions_mut().insert(caller.clone());
    let address = request
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|info| crate::limits::ClientAddr(info.0.ip()));
    if let Some(address) = address {
        request.extensions_mut().insert(address);
    }
    scope(caller, next.run(request)).await
}

/// The layer on the API routes: checks the kind and name in the path against the caller's
/// grants (403), then serves the request as that caller. It reads the caller from the
/// request's extensions, where [authenticate] or a WebSocket call put it.
pub async fn authorize(request: Request, next: Next) -> Response {
    let caller = request.extensions().get::<Caller>().cloned().unwrap_or(Caller::Anyone);
    if let Err(err) = check_path(&caller, request.method(), request.uri().path()) {
        return err.into_response();
    }
    scope(caller, next.run(request)).await
}

/// What a request touches, read from its path: `/v1/<kind>[/<name>[/...]]`.
fn check_path(caller: &Caller, method: &Method, path: &str) -> Result<(), ApiError> {
    let access = if method == Method::GET || method == Method::HEAD {
        Access::Read
    } else {
        Access::Write
    };
    let mut segments = path.trim_start_matches('/').splitn(3, '/');
    let first = segments.next().unwrap_or_default();
    if first == "metrics" {
        return caller.require("metrics", "", Access::Read);
    }
    if first != "v1" {
        return Ok(());
    }
    let kind = segments.next().unwrap_or_default();
    let rest = segments.next();
    match kind {
        // Leases and sockets: any principal; ownership is checked where a lease is used, and
        // each subscription where it is made. The audit log is filtered by name.
        "leases" | "ws" | "revocations" => Ok(()),
        kind if KINDS.contains(&kind) => match rest.filter(|r| !r.is_empty()) {
            // A listing (or `POST /v1/txns`): some access to the kind; the handler filters
            // (or checks the name in the body).
            None if caller.may_some(kind, access) => Ok(()),
            None => Err(caller.forbidden(format!("no {} access to any of {kind}", access_word(access)))),
            Some(rest) => {
                // The same decoding as the handlers' path extractors; the handlers refuse what
                // is not a valid name (`..`, `/` in a name) after this.
                let name = if kind == "kv" {
                    percent_decode(rest)
                } else {
                    percent_decode(rest.split('/').next().unwrap_or_default())
                };
                caller.require(kind, &name, access)
            }
        },
        _ => Ok(()),
    }
}

/// Percent-decoding as in a URL path (`+` stays `+`), as axum's path extractor does.
pub(crate) fn percent_decode(text: &str) -> String {
    percent_encoding::percent_decode_str(text)
        .decode_utf8_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = r#"
        [[principals]]
        name = "billing"
        tokens = ["sha256:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"]
        [[principals.grants]]
        kinds = ["locks", "queues"]
        prefixes = ["billing-"]
        access = "write"
        [[principals.grants]]
        kinds = ["*"]
        prefixes = [""]
        access = "read"
    "#;

    #[test]
    fn tokens_are_found_by_hash_and_grants_apply_by_kind_prefix_and_access() {
        let authority = Authority::parse(CONFIG).expect("parse");
        assert!(authority.principal("wrong").is_none());
        let caller = Caller::Principal(authority.principal("password").expect("sha256 of `password`"));
        assert!(caller.may("locks", "billing-x", Access::Write));
        assert!(!caller.may("locks", "orders", Access::Write));
        assert!(caller.may("locks", "orders", Access::Read));
        assert!(!caller.may("elections", "billing-x", Access::Write));
        assert!(!caller.owns(Some("ops")));
        assert!(caller.owns(Some("billing")));
    }

    #[test]
    fn paths_map_to_kind_and_decoded_name() {
        let authority = Authority::parse(CONFIG).expect("parse");
        let caller = Caller::Principal(authority.principal("password").expect("principal"));
        assert!(check_path(&caller, &Method::POST, "/v1/locks/billing-a/acquire").is_ok());
        assert!(check_path(&caller, &Method::POST, "/v1/locks/orders/acquire").is_err());
        // An encoded name is decoded before the prefix check.
        assert!(check_path(&caller, &Method::POST, "/v1/locks/%62illing-a/acquire").is_ok());
        assert!(check_path(&caller, &Method::POST, "/v1/kv/billing-a").is_err());
        assert!(check_path(&caller, &Method::GET, "/v1/kv/anything/at/all").is_ok());
        assert!(check_path(&caller, &Method::GET, "/metrics").is_ok());
        assert!(check_path(&caller, &Method::DELETE, "/v1/leases/abc").is_ok());
    }

    #[test]
    fn bad_configs_are_refused_with_the_reason() {
        let err = |text: &str| Authority::parse(text).err().expect("refused");
        assert!(err("[[principals]]\nname = \"a\"\ntokens = [\"abc\"]").contains("sha256:"));
        assert!(
            err("[[principals]]\nname = \"a\"\ntokens = [\"sha256:00\"]\n[[principals.grants]]\nkinds=[\"lox\"]\nprefixes=[\"\"]\naccess=\"read\"")
                .contains("unknown kind `lox`")
        );
        assert!(err("[[principals]]\nname = \"a\"\ntokens = []").contains("no tokens"));
        assert!(err("[[principal]]").contains("unknown field"));
    }

    #[test]
    fn new_tokens_hash_to_their_config_line() {
        let (token, line) = new_token();
        let authority =
            Authority::parse(&format!("[[principals]]\nname = \"a\"\ntokens = [\"{line}\"]")).expect("parse");
        assert!(authority.principal(&token).is_some());
    }
}
