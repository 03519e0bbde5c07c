//! Trust between zkgate instances: a key every instance of one deployment shares, with which
//! each signs what another must believe.
//!
//! Two things cross from one instance to another, and both go through places an attacker may
//! reach: the registration an instance keeps in ZooKeeper (the URL it is reached at; world
//! writable unless `--zookeeper-auth` is set), and the requests it forwards to the owner of a
//! lease (over the network). So:
//!
//! - a **registration** carries a MAC over the instance's name, its URL and the session that
//!   made it ([PeerKey::sign_registration]); an instance forwards only to a registration whose
//!   MAC verifies *and* whose znode's `ephemeralOwner` is that session, so that neither a forged
//!   one nor a genuine one copied onto another session is believed;
//! - a **forwarded request** carries, instead of the client's bearer token (which never leaves
//!   the instance it was sent to), the principal the forwarding instance authenticated and a
//!   MAC over the request: method, path and query, both instances, the principal, the time and
//!   a digest of the body ([Forward]). The owner believes the principal only if the MAC
//!   verifies, the request is addressed to it and the time is within [FORWARD_WINDOW].
//!
//! The key is HMAC-SHA256's, derived from `--cluster-secret` or, failing that, from the
//! `--zookeeper-auth` credential (instances that share it can already rewrite each other's
//! znodes, so it proves no less). With neither there is no key: instances do not forward
//! (a request for another instance's lease is answered `421` naming that instance).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

/// How far a forwarded request's time may be from the owner's clock (either way): past it, the
/// request is refused as a possible replay.
pub const FORWARD_WINDOW: Duration = Duration::from_secs(30);

/// The shortest `--cluster-secret` accepted.
pub const MIN_SECRET_LEN: usize = 16;

/// The key the instances of one deployment share. Its `Debug` never shows it.
#[derive(Clone)]
pub struct PeerKey(Arc<[u8; 32]>);

impl fmt::Debug for PeerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PeerKey(<redacted>)")
    }
}

impl PeerKey {
    /// The key of a secret (`--cluster-secret`; or a ZooKeeper digest credential, with another
    /// `purpose`, so that the two never give the same key).
    pub fn derive(purpose: &str, secret: &[u8]) -> PeerKey {
        let mut hash = Sha256::new();
        hash.update(b"zkgate peer key\0");
        hash.update(purpose.as_bytes());
        hash.update(b"\0");
        hash.update(secret);
        PeerKey(Arc::new(hash.finalize().into()))
    }

    /// `--cluster-secret`: at least [MIN_SECRET_LEN] characters.
    pub fn parse(text: &str) -> Result<PeerKey, String> {
        let text = text.trim();
        if text.len() < MIN_SECRET_LEN {
            return Err(format!(
                "at least {MIN_SECRET_LEN} characters (e.g. `openssl rand -hex 32`)"
            ));
        }
        Ok(PeerKey::derive("cluster-secret", text.as_bytes()))
    }

    /// `--cluster-secret-file`: the secret is the file's first line.
    pub fn read(path: &str) -> Result<PeerKey, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
        PeerKey::parse(text.lines().next().unwrap_or_default()).map_err(|e| format!("{path}: {e}"))
    }

    /// The MAC of `fields` (each length-prefixed, so that no two lists of fields give the same
    /// input), under the label `what`.
    fn mac(&self, what: &str, fields: &[&[u8]]) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0[..]).expect("HMAC takes any key length");
        for field in std::iter::once(what.as_bytes()).chain(fields.iter().copied()) {
            mac.update(&(field.len() as u64).to_be_bytes());
            mac.update(field);
        }
        mac
    }

    fn sign(&self, what: &str, fields: &[&[u8]]) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(self.mac(what, fields).finalize().into_bytes())
    }

    /// Whether `signature` is the MAC of `fields` (compared in constant time).
    fn verify(&self, what: &str, fields: &[&[u8]], signature: &str) -> bool {
        let Ok(bytes) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(signature) else {
            return false;
        };
        self.mac(what, fields).verify_slice(&bytes).is_ok()
    }

    /// The MAC of the registration `name` → `url` made by `session`.
    pub fn sign_registration(&self, name: &str, url: &str, session: i64) -> String {
        let session = session.to_be_bytes();
        self.sign("registration", &[name.as_bytes(), url.as_bytes(), &session])
    }

    /// Whether `signature` is [PeerKey::sign_registration]'s.
    pub fn verify_registration(&self, name: &str, url: &str, session: i64, signature: &str) -> bool {
        let session = session.to_be_bytes();
        self.verify("registration", &[name.as_bytes(), url.as_bytes(), &session], signature)
    }

    /// The MAC of a forwarded request.
    pub fn sign_forward(&self, forward: &Forward<'_>) -> String {
        let (at, body) = forward.parts();
        self.sign("forward", &forward.fields(&at, &body))
    }

    /// Whether `signature` is [PeerKey::sign_forward]'s.
    pub fn verify_forward(&self, forward: &Forward<'_>, signature: &str) -> bool {
        let (at, body) = forward.parts();
        self.verify("forward", &forward.fields(&at, &body), signature)
    }
}

/// What the MAC of a forwarded request covers.
pub struct Forward<'a> {
    pub method: &'a str,
    /// Path and query, as sent.
    pub path: &'a str,
    /// The forwarding instance's id.
    pub from: &'a str,
    /// The owner's id: a forward is good for the instance it was sent to only.
    pub to: &'a str,
    /// The caller, as the forwarding instance authenticated it (`None`: auth is off there).
    pub principal: Option<&'a str>,
    /// When it was sent (ms since the Unix epoch).
    pub at_ms: u64,
    pub body: &'a [u8],
}

impl Forward<'_> {
    fn parts(&self) -> ([u8; 8], [u8; 32]) {
        (self.at_ms.to_be_bytes(), Sha256::digest(self.body).into())
    }

    fn fields<'f>(&'f self, at: &'f [u8; 8], body: &'f [u8; 32]) -> [&'f [u8]; 7] {
        [
            self.method.as_bytes(),
            self.path.as_bytes(),
            self.from.as_bytes(),
            self.to.as_bytes(),
            // `None` and `Some("")` differ: no principal name is empty.
            self.principal.map_or(b"\0".as_slice(), str::as_bytes),
            at,
            body,
        ]
    }

    /// Whether `at_ms` is within [FORWARD_WINDOW] of `now_ms`.
    pub fn is_fresh(&self, now_ms: u64) -> bool {
        now_ms.abs_diff(self.at_ms) <= FORWARD_WINDOW.as_millis() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forward<'a>(principal: Option<&'a str>, body: &'a [u8]) -> Forward<'a> {
        Forward {
            method: "POST",
            path: "/v1/locks/a/acquire?wait=0",
            from: "0000000a",
            to: "0000000b",
            principal,
            at_ms: 1_000_000,
            body,
        }
    }

    #[test]
    fn a_forward_verifies_only_as_signed() {
        let key = PeerKey::parse("a secret of some length").expect("key");
        let signed = key.sign_forward(&forward(Some("app"), b"{}"));
        assert!(key.verify_forward(&forward(Some("app"), b"{}"), &signed));
        // Any field changed, or another key: refused.
        assert!(!key.verify_forward(&forward(Some("admin"), b"{}"), &signed));
        assert!(!key.verify_forward(&forward(None, b"{}"), &signed));
        assert!(!key.verify_forward(&forward(Some("app"), b"{ }"), &signed));
        let mut moved = forward(Some("app"), b"{}");
        moved.to = "0000000c";
        assert!(!key.verify_forward(&moved, &signed));
        let other = PeerKey::parse("another secret, as long").expect("key");
        assert!(!other.verify_forward(&forward(Some("app"), b"{}"), &signed));
        assert!(!key.verify_forward(&forward(Some("app"), b"{}"), "not base64!"));
    }

    #[test]
    fn a_registration_names_its_session() {
        let key = PeerKey::parse("a secret of some length").expect("key");
        let signed = key.sign_registration("0000000a", "http://10.0.0.1:8080", 42);
        assert!(key.verify_registration("0000000a", "http://10.0.0.1:8080", 42, &signed));
        assert!(!key.verify_registration("0000000a", "http://10.0.0.1:8080", 43, &signed));
        assert!(!key.verify_registration("0000000a", "http://evil:8080", 42, &signed));
        assert!(!key.verify_registration("0000000b", "http://10.0.0.1:8080", 42, &signed));
    }

    #[test]
    fn short_secrets_are_refused_and_purposes_differ() {
        assert!(PeerKey::parse("short").is_err());
        let a = PeerKey::derive("cluster-secret", b"same");
        let b = PeerKey::derive("zookeeper-digest", b"same");
        assert_ne!(a.0, b.0);
        assert_eq!(format!("{a:?}"), "PeerKey(<redacted>)");
    }

    #[test]
    fn freshness_is_a_window_both_ways() {
        let f = forward(None, b"");
        assert!(f.is_fresh(1_000_000 + 30_000));
        assert!(f.is_fresh(1_000_000 - 30_000));
        assert!(!f.is_fresh(1_000_000 + 30_001));
        assert!(!f.is_fresh(0));
    }
}
