//! Who is calling, and what they may touch: the principals of `--auth-config` and their grants.
//!
//! With `--auth-config FILE` every request (and every WebSocket handshake) must carry a bearer
//! token listed in that file, by its SHA-256, under a *principal*. A principal has grants: for
//! some resource kinds (`locks`, `queues`, ...), the names starting with some prefixes, read or
//! write access. An `admin` principal may do everything, including acting on the leases and
//! handles of others. Without the file, zkgate serves everyone with full rights (meant for the
//! embedded default on loopback; `serve` warns loudly when it listens elsewhere like that).
//!
//! This module only decides; the HTTP layers that find the caller and refuse a request live in
//! `http::auth`. Three checks, so that no handler can forget one:
//! - *authentication* (`http::auth::authenticate`, the outermost layer): token → principal, 401
//!   otherwise;
//! - *authorisation by name* (`http::auth::authorize`, a layer after routing, which WebSocket
//!   calls go through too): the routed kind and name against the grants, 403 otherwise;
//! - *ownership* ([Caller::owns]): a lease remembers the principal that created it, and every
//!   place that resolves a lease, a handle or a claim checks it (403).
//!
//! The caller is passed explicitly (handlers take it as an extractor) to everything that needs
//! it: nothing reads it from an ambient context.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::kind::Kind;

/// What a grant can name besides the resource kinds' [Kind::auth]: the metrics.
pub const METRICS: &str = "metrics";

/// Whether a grant may name `kind`: a resource kind, or [METRICS].
fn is_grantable(kind: &str) -> bool {
    kind == METRICS || Kind::ALL.iter().any(|k| k.auth() == kind)
}

/// Every kind a grant may name, for error messages.
fn grantable() -> String {
    let mut kinds: Vec<&str> = Kind::ALL.iter().map(|k| k.auth()).collect();
    kinds.push(METRICS);
    kinds.join(", ")
}

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
    /// Resource kinds ([Kind::auth], or [METRICS]), or `*` for all.
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
            // The name is a znode's (its usage under `<root>/usage/`) and a log field.
            if config.name.len() > 64
                || matches!(config.name.as_str(), "." | "..")
                || !config
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-@".contains(&b))
            {
                return Err(format!(
                    "principal name `{}` must be at most 64 letters, digits and `.`, `_`, `-`, `@`",
                    config.name.escape_debug()
                ));
            }
            for grant in &config.grants {
                if let Some(kind) = grant.kinds.iter().find(|k| *k != "*" && !is_grantable(k)) {
                    return Err(format!(
                        "principal `{}`: unknown kind `{kind}` (kinds: {}, or `*`)",
                        config.name,
                        grantable()
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

    /// The principal named `name`: the caller of a request another instance forwarded,
    /// asserting the principal it authenticated (see [crate::peer]).
    pub fn principal_named(&self, name: &str) -> Option<Arc<Principal>> {
        self.by_hash.values().find(|p| p.name == name).cloned()
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
    crate::ids::unhex(&hex.to_ascii_lowercase())
        .and_then(|bytes| bytes.try_into().ok())
        .ok_or_else(|| format!("`{text}`: a SHA-256 is 64 hex digits"))
}

/// A new random token and the line that lists it in the config file (`zkgate token`).
pub fn new_token() -> (String, String) {
    let bytes: [u8; 32] = rand::random();
    let token = format!("zkg_{}", crate::ids::hex(&bytes));
    let hash = format!("sha256:{}", crate::ids::hex(&sha256(&token)));
    (token, hash)
}

/// Who a request is from.
#[derive(Clone, Debug)]
pub enum Caller {
    /// Auth is off: everyone may do everything.
    Anyone,
    Principal(Arc<Principal>),
    /// Auth is on and the request (to a public path: the probes, the spec, the page) carries
    /// no valid token: it may do nothing.
    Nobody,
}

impl Caller {
    /// The principal's name (`None` when auth is off): what leases record as their owner.
    pub fn name(&self) -> Option<&str> {
        match self {
            Caller::Anyone | Caller::Nobody => None,
            Caller::Principal(p) => Some(&p.name),
        }
    }

    pub fn is_admin(&self) -> bool {
        match self {
            Caller::Anyone => true,
            Caller::Principal(p) => p.admin,
            Caller::Nobody => false,
        }
    }

    /// May the caller read (or write) the resource `name` of `kind`?
    pub fn may(&self, kind: &str, name: &str, access: Access) -> bool {
        match self {
            Caller::Anyone => true,
            Caller::Principal(p) => p.admin || p.grants.iter().any(|g| g.covers(kind, name, access)),
            Caller::Nobody => false,
        }
    }

    /// May the caller do `access` to some names of `kind` (a listing, which is then filtered)?
    pub fn may_some(&self, kind: &str, access: Access) -> bool {
        match self {
            Caller::Anyone => true,
            Caller::Principal(p) => p.admin || p.grants.iter().any(|g| g.access >= access && g.covers_kind(kind)),
            Caller::Nobody => false,
        }
    }

    /// Is a lease (or handle) created by `owner` the caller's to use? An admin's is everyone's.
    pub fn owns(&self, owner: Option<&str>) -> bool {
        match self {
            Caller::Nobody => false,
            _ => self.is_admin() || owner == self.name(),
        }
    }

    /// [Forbidden] unless [Caller::may].
    pub fn require(&self, kind: &str, name: &str, access: Access) -> Result<(), Forbidden> {
        if self.may(kind, name, access) {
            return Ok(());
        }
        Err(self.forbidden(format!("no {} access to {kind} `{name}`", access_word(access))))
    }

    /// [Forbidden] unless the caller may do `access` to some names of `kind`: a listing, which
    /// is then filtered by [Caller::may].
    pub fn require_some(&self, kind: &str, access: Access) -> Result<(), Forbidden> {
        if self.may_some(kind, access) {
            return Ok(());
        }
        Err(self.forbidden(format!("no {} access to any of {kind}", access_word(access))))
    }

    /// [Forbidden] unless [Caller::owns]: `what` names the thing (`lease 6f1c…`).
    pub fn require_owner(&self, owner: Option<&str>, what: &str) -> Result<(), Forbidden> {
        if self.owns(owner) {
            return Ok(());
        }
        Err(self.forbidden(format!("{what} belongs to another principal")))
    }

    fn forbidden(&self, detail: String) -> Forbidden {
        let who = self.name().unwrap_or("anyone");
        Forbidden(format!("principal `{who}`: {detail}"))
    }
}

/// The caller may not do what it asked (HTTP 403); the text says who and what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Forbidden(pub String);

fn access_word(access: Access) -> &'static str {
    match access {
        Access::Read => "read",
        Access::Write => "write",
    }
}

/// An auth config for tests: `billing` (token `password`) writes its own locks and queues
/// and reads everything.
#[cfg(test)]
pub(crate) const EXAMPLE_CONFIG: &str = r#"
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

impl From<Forbidden> for crate::problem::ApiError {
    fn from(err: Forbidden) -> crate::problem::ApiError {
        crate::problem::ApiError::new(crate::problem::Problem::Forbidden, err.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = EXAMPLE_CONFIG;

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
    fn bad_configs_are_refused_with_the_reason() {
        let err = |text: &str| Authority::parse(text).err().expect("refused");
        assert!(err("[[principals]]\nname = \"a\"\ntokens = [\"abc\"]").contains("sha256:"));
        assert!(
            err("[[principals]]\nname = \"a\"\ntokens = [\"sha256:00\"]\n[[principals.grants]]\nkinds=[\"lox\"]\nprefixes=[\"\"]\naccess=\"read\"")
                .contains("unknown kind `lox`")
        );
        assert!(err("[[principals]]\nname = \"a\"\ntokens = []").contains("no tokens"));
        assert!(err("[[principals]]\nname = \"a/b\"\ntokens = [\"sha256:00\"]").contains("at most 64 letters"));
        assert!(err("[[principals]]\nname = \"..\"\ntokens = [\"sha256:00\"]").contains("at most 64 letters"));
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
