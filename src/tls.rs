//! HTTPS (and WSS) on the listener: `--tls-cert` and `--tls-key` (PEM), served with rustls (the
//! listener that runs the handshakes is [crate::listen]'s); and the process's rustls provider.

use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;

/// Reads the certificate chain and key (PEM); the error names the file and the problem.
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("cannot read the certificate {}: {e}", cert.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: not a PEM certificate chain: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!("{}: no certificate in it", cert.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("cannot read the key {}: {e}", key.display()))?;
    // The provider is named rather than taken from the process default, so that it does not
    // matter which other rustls providers the dependencies bring in.
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("the certificate and key do not go together: {e}"))?;
    // HTTP/2 when the client offers it, HTTP/1.1 otherwise (WebSockets, older clients).
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Makes rustls's `ring` provider the process's default. reqwest (built without a provider of
/// its own) and zookeeper-client's TLS both build on the process default, which rustls picks
/// by itself only while exactly one provider is compiled in (zookeeper-client's rustls brings
/// aws-lc-rs too): naming one keeps every TLS connect from panicking. Idempotent; the binary
/// calls it first thing, the session before a TLS connect, tests and benches before building
/// clients.
pub fn install_crypto_provider() {
    let _ = tokio_rustls::rustls::crypto::CryptoProvider::install_default(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    );
}
