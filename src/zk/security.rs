//! The ZooKeeper side of zkgate's security: how its session proves who it is (the `digest`
//! scheme), which ACL the znodes it creates get (the policy of [super::acl], which follows
//! from the digest), and how it reaches the servers (TLS, optionally mutual).
//!
//! Files named by the flags are read when the command line is parsed, so a missing or
//! unreadable file is a start-up error naming the flag, and the secret lives in memory only
//! (its `Debug` is redacted, and `--help` never prints the environment's values).

use std::fmt;
use std::path::{Path, PathBuf};

use clap::Args;
use zookeeper_client::{Client, Connector, TlsOptions};

use super::acl::AclPolicy;

/// The `serve` flags of this module (flattened into [crate::config::ServeConfig]).
#[derive(Args, Clone, Debug, Default)]
#[command(next_help_heading = "ZooKeeper security")]
pub struct ZkSecurity {
    /// `user:password` to authenticate zkgate's ZooKeeper session with (`digest` scheme), on
    /// every connection and every new session. The znodes zkgate creates then admit only that
    /// identity (ACL `auth::cdrwa`, which ZooKeeper stores as `digest:user:<hash>`) instead of
    /// `world:anyone`. Curator, kazoo or zkCli peers must authenticate with the same digest.
    #[arg(
        long,
        env = "ZKGATE_ZOOKEEPER_AUTH",
        hide_env_values = true,
        value_name = "USER:PASSWORD",
        value_parser = Digest::parse,
        conflicts_with = "zookeeper_auth_file"
    )]
    pub zookeeper_auth: Option<Digest>,

    /// Like `--zookeeper-auth`, with `user:password` read from this file (its first line), so
    /// that the secret is not on the command line.
    #[arg(long, env = "ZKGATE_ZOOKEEPER_AUTH_FILE", value_name = "PATH", value_parser = Digest::read)]
    pub zookeeper_auth_file: Option<Digest>,

    /// With `--zookeeper-auth`: anyone may also read (never change) the znodes zkgate creates
    /// (ACL `world:anyone:r` beside the digest's), for dashboards and watch-only peers.
    #[arg(long, env = "ZKGATE_ZOOKEEPER_ACL_WORLD_READ")]
    pub zookeeper_acl_world_read: bool,

    /// PEM file of the CA certificates that sign the ZooKeeper servers' certificates: zkgate
    /// then connects with TLS (to the servers' `secureClientPort`) and verifies each server's
    /// certificate, which must name the host as `--zookeeper` writes it (DNS name or IP).
    #[arg(long, env = "ZKGATE_ZOOKEEPER_TLS_CA", value_name = "PATH", value_parser = Pem::read)]
    pub zookeeper_tls_ca: Option<Pem>,

    /// PEM certificate (chain) zkgate presents to the servers, for mutual TLS (servers with
    /// `ssl.clientAuth=need`). Needs `--zookeeper-tls-key` and `--zookeeper-tls-ca`.
    #[arg(
        long,
        env = "ZKGATE_ZOOKEEPER_TLS_CERT",
        value_name = "PATH",
        value_parser = Pem::read,
        requires = "zookeeper_tls_key",
        requires = "zookeeper_tls_ca"
    )]
    pub zookeeper_tls_cert: Option<Pem>,

    /// PEM private key of `--zookeeper-tls-cert`.
    #[arg(
        long,
        env = "ZKGATE_ZOOKEEPER_TLS_KEY",
        value_name = "PATH",
        value_parser = Pem::read,
        requires = "zookeeper_tls_cert"
    )]
    pub zookeeper_tls_key: Option<Pem>,
}

/// A `user:password` for ZooKeeper's `digest` scheme. Its `Debug` shows the user only.
#[derive(Clone, PartialEq, Eq)]
pub struct Digest(String);

impl Digest {
    /// Parses `user:password` (the user may not be empty nor hold a `:`; the password may).
    pub fn parse(text: &str) -> Result<Digest, String> {
        match text.split_once(':') {
            Some((user, password)) if !user.is_empty() && !password.is_empty() => Ok(Digest(text.to_string())),
            _ => Err("expected `user:password`, with neither part empty".to_string()),
        }
    }

    /// Reads `user:password` from the first line of the file at `path`.
    pub fn read(path: &str) -> Result<Digest, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
        Digest::parse(text.lines().next().unwrap_or_default()).map_err(|e| format!("{path}: {e}"))
    }

    pub fn user(&self) -> &str {
        self.0.split_once(':').map_or("", |(user, _)| user)
    }

    /// What the `digest` scheme's auth packet carries.
    fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({}:<redacted>)", self.user())
    }
}

/// A PEM file read at start-up. Its `Debug` shows the path only (it may hold a private key).
#[derive(Clone)]
pub struct Pem {
    path: PathBuf,
    text: String,
}

impl Pem {
    pub fn read(path: &str) -> Result<Pem, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
        Ok(Pem {
            path: PathBuf::from(path),
            text,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl fmt::Debug for Pem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Pem({})", self.path.display())
    }
}

/// Why a session could not be established.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(transparent)]
    ZooKeeper(#[from] zookeeper_client::Error),
    /// A transport failure while TLS is on: the handshake is the likely culprit, and the client
    /// library only says "no hosts", so say what to check.
    #[error(
        "cannot connect over TLS ({0}): check that --zookeeper-tls-ca signs the servers' certificates, \
         that they name each host as written in --zookeeper, that the ports are the servers' \
         secureClientPort, and that the servers accept zkgate's client certificate if they ask for one"
    )]
    Tls(zookeeper_client::Error),
    #[error("bad TLS settings: {0}")]
    TlsSettings(String),
    #[error(
        "ZooKeeper refuses zkgate's session access to its root {0} (NoAuth): another identity created \
         it; give this instance the same --zookeeper-auth as the ones that did"
    )]
    RootDenied(String),
    /// This process already creates znodes with another ACL (see [super::acl::install]).
    #[error(
        "this process already creates znodes with the ACL policy {installed:?}; a session asking for \
         {wanted:?} is not started (one process, one --zookeeper-auth setting)"
    )]
    AclConflict { installed: AclPolicy, wanted: AclPolicy },
}

impl ZkSecurity {
    /// The digest of `--zookeeper-auth` or `--zookeeper-auth-file`.
    pub fn digest(&self) -> Option<&Digest> {
        self.zookeeper_auth.as_ref().or(self.zookeeper_auth_file.as_ref())
    }

    /// The key instances sharing this digest trust each other with ([crate::peer]), if there
    /// is a digest: whoever holds it can rewrite every znode zkgate made anyway.
    pub fn peer_key(&self) -> Option<crate::peer::PeerKey> {
        self.digest()
            .map(|digest| crate::peer::PeerKey::derive("zookeeper-digest", digest.as_bytes()))
    }

    /// The ACL policy these settings call for: open without a digest.
    pub fn acl_policy(&self) -> AclPolicy {
        match (self.digest(), self.zookeeper_acl_world_read) {
            (None, _) => AclPolicy::Open,
            (Some(_), false) => AclPolicy::Creator,
            (Some(_), true) => AclPolicy::CreatorWorldRead,
        }
    }

    pub fn uses_tls(&self) -> bool {
        self.zookeeper_tls_ca.is_some()
    }

    /// The TLS options of the flags, `None` without `--zookeeper-tls-ca`.
    pub fn tls_options(&self) -> Result<Option<TlsOptions>, String> {
        let Some(ca) = &self.zookeeper_tls_ca else {
            return Ok(None);
        };
        let options = TlsOptions::new()
            .with_pem_ca(&ca.text)
            .map_err(|e| format!("--zookeeper-tls-ca {}: {e}", ca.path.display()))?;
        match (&self.zookeeper_tls_cert, &self.zookeeper_tls_key) {
            (Some(cert), Some(key)) => options.with_pem_identity(&cert.text, &key.text).map_err(|e| {
                format!(
                    "--zookeeper-tls-cert {} / --zookeeper-tls-key {}: {e}",
                    cert.path.display(),
                    key.path.display()
                )
            }),
            (None, None) => Ok(options),
            _ => Err("--zookeeper-tls-cert and --zookeeper-tls-key go together".to_string()),
        }
        .map(Some)
    }

    /// Checks what clap cannot. `zookeeper` is the `--zookeeper` connect string (`None` for the
    /// embedded server).
    pub fn validate(&self, zookeeper: Option<&str>) -> Result<(), String> {
        if self.zookeeper_acl_world_read && self.digest().is_none() {
            return Err(
                "--zookeeper-acl-world-read needs --zookeeper-auth (or --zookeeper-auth-file): \
                 without it every znode is already open to everyone"
                    .to_string(),
            );
        }
        if zookeeper.is_some_and(|connect| connect.contains("://")) {
            return Err("--zookeeper takes `host:port,...[/chroot]` without a scheme: \
                 for TLS give --zookeeper-tls-ca (and the servers' secureClientPort)"
                .to_string());
        }
        if self.uses_tls() && zookeeper.is_none() {
            return Err("--zookeeper-tls-ca needs --zookeeper: the embedded ZooKeeper has no TLS port".to_string());
        }
        self.tls_options().map(drop)
    }

    /// Says in the log how the session will authenticate and reach ZooKeeper, and which ACL
    /// zkgate's znodes get (once, at start-up).
    pub fn log_summary(&self) {
        match self.digest() {
            Some(digest) => tracing::info!(
                user = digest.user(),
                acl = ?self.acl_policy(),
                "ZooKeeper: the session authenticates with a digest; the znodes zkgate creates admit that identity only"
            ),
            None => tracing::info!(
                "ZooKeeper: no --zookeeper-auth, so the znodes zkgate creates are open to anyone who reaches ZooKeeper (world:anyone)"
            ),
        }
        if let Some(ca) = &self.zookeeper_tls_ca {
            tracing::info!(
                ca = %ca.path.display(),
                client_certificate = ?self.zookeeper_tls_cert.as_ref().map(|c| c.path.display().to_string()),
                "ZooKeeper: TLS, servers verified against the CA"
            );
        }
    }

    /// Connects to `hosts` (no chroot) with `connector` plus the digest and TLS of these
    /// settings. The digest goes with the session's first packets, before any request, and
    /// the client sends it again on every reconnection of that session; a new session (after
    /// an expiry) comes through here again.
    pub async fn connect(&self, connector: Connector, hosts: &str) -> Result<Client, ConnectError> {
        let connector = match self.digest() {
            Some(digest) => connector.with_auth("digest", digest.as_bytes()),
            None => connector,
        };
        match self.tls_options().map_err(ConnectError::TlsSettings)? {
            None => Ok(connector.connect(hosts).await?),
            // `secure_connect`: every host of the connect string speaks TLS.
            Some(tls) => {
                crate::tls::install_crypto_provider();
                connector
                    .with_tls(tls)
                    .secure_connect(hosts)
                    .await
                    .map_err(|err| match err {
                        err if super::is_loss(&err) || matches!(err, zookeeper_client::Error::NoHosts) => {
                            ConnectError::Tls(err)
                        }
                        err => ConnectError::ZooKeeper(err),
                    })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_needs_a_user_and_a_password() {
        assert!(Digest::parse("zkgate:s3cret").is_ok());
        assert_eq!(
            Digest::parse("zkgate:a:b").map(|d| d.user().to_string()),
            Ok("zkgate".into())
        );
        for bad in ["", "zkgate", "zkgate:", ":s3cret", ":"] {
            assert!(Digest::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn secrets_stay_out_of_debug_output() {
        let security = ZkSecurity {
            zookeeper_auth: Digest::parse("zkgate:s3cret").ok(),
            ..ZkSecurity::default()
        };
        let shown = format!("{security:?}");
        assert!(shown.contains("zkgate"), "{shown}");
        assert!(!shown.contains("s3cret"), "{shown}");
    }

    #[test]
    fn the_acl_policy_follows_the_digest() {
        let mut security = ZkSecurity::default();
        assert_eq!(security.acl_policy(), AclPolicy::Open);
        security.zookeeper_auth = Digest::parse("zkgate:s3cret").ok();
        assert_eq!(security.acl_policy(), AclPolicy::Creator);
        security.zookeeper_acl_world_read = true;
        assert_eq!(security.acl_policy(), AclPolicy::CreatorWorldRead);
    }

    #[test]
    fn world_read_without_a_digest_and_tls_without_an_ensemble_are_refused() {
        let world_read = ZkSecurity {
            zookeeper_acl_world_read: true,
            ..ZkSecurity::default()
        };
        assert!(world_read.validate(Some("zk1:2181")).is_err());
        assert!(ZkSecurity::default().validate(Some("tcp+tls://zk1:2281")).is_err());
        assert!(ZkSecurity::default().validate(None).is_ok());
    }
}
