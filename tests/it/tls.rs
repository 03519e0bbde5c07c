//! HTTPS and WSS on the listener (`--tls-cert`, `--tls-key`): real TLS clients trusting a
//! throwaway self-signed certificate take a lock and open a socket; plain HTTP to the TLS
//! port gets nowhere; a client that stalls its handshake holds nobody up.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{certificate, test_config, within, zookeeper};
use reqwest::StatusCode;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let _ = rustls::crypto::CryptoProvider::install_default(provider.as_ref().clone());
    provider
}

#[tokio::test]
async fn https_and_wss_serve_with_the_given_certificate() {
    let provider = provider();
    let zk = zookeeper().await;
    let certificate = certificate();
    let mut config = test_config(&zk.connect_string());
    config.tls_cert = Some(certificate.cert.clone());
    config.tls_key = Some(certificate.key.clone());
    let running = zkgate::start(config).await.expect("start");
    assert!(running.url().starts_with("https://"), "{}", running.url());
    running
        .state
        .zk()
        .wait_connected(Duration::from_secs(20))
        .await
        .expect("connected");
    running.state.wait_ready().await;
    let addr = running.addr;

    // A client that connects and never says hello must not hold anyone up.
    let _stalled = tokio::net::TcpStream::connect(addr).await.expect("connect");

    let root = reqwest::Certificate::from_pem(certificate.pem.as_bytes()).expect("pem");
    let https = common::http_builder().tls_certs_only([root]).build().expect("client");
    let url = format!("https://127.0.0.1:{}", addr.port());
    let ready = https.get(format!("{url}/readyz")).send().await.expect("https");
    assert_eq!(ready.status(), StatusCode::OK);
    let grant = https
        .post(format!("{url}/v1/locks/secure/acquire?wait=0"))
        .send()
        .await
        .expect("acquire");
    assert_eq!(grant.status(), StatusCode::OK);

    // Plain HTTP to the TLS port is not served.
    let plain = common::http_client()
        .get(format!("http://127.0.0.1:{}/readyz", addr.port()))
        .timeout(Duration::from_secs(15))
        .send()
        .await;
    assert!(plain.is_err(), "plain HTTP was answered: {plain:?}");
    // Nor is a client that does not trust the certificate.
    let untrusting = common::http_builder()
        .tls_certs_only(Vec::<reqwest::Certificate>::new())
        .build()
        .expect("client");
    assert!(untrusting.get(format!("{url}/readyz")).send().await.is_err());

    // WSS: a TLS stream, then the WebSocket handshake over it.
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(certificate.pem.as_bytes()) {
        roots.add(cert.expect("cert")).expect("root");
    }
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let stream = tokio_rustls::TlsConnector::from(Arc::new(tls))
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
        .expect("TLS handshake");
    let (mut socket, _) = tokio_tungstenite::client_async(format!("wss://localhost:{}/v1/ws", addr.port()), stream)
        .await
        .expect("WebSocket over TLS");
    use futures::{SinkExt, StreamExt};
    let subscribe = serde_json::json!({"op": "subscribe", "id": "s", "topic": {"lock": "secure"}});
    socket
        .send(tokio_tungstenite::tungstenite::Message::Text(
            subscribe.to_string().into(),
        ))
        .await
        .expect("send");
    let first = within(Duration::from_secs(10), "the first event", socket.next())
        .await
        .expect("a message")
        .expect("readable");
    let event: serde_json::Value = serde_json::from_str(first.to_text().expect("text")).expect("json");
    assert_eq!(event["type"], "state", "{event}");
    assert!(event["state"]["holder"].is_object(), "{event}");
}

#[tokio::test]
async fn a_bad_certificate_or_key_is_refused_with_the_reason() {
    let certificate = certificate();
    let mut config = test_config("127.0.0.1:1");
    config.tls_cert = Some(certificate.key.clone());
    config.tls_key = Some(certificate.key.clone());
    let err = zkgate::start(config.clone()).await.err().expect("refused");
    assert!(err.to_string().contains("no certificate"), "{err}");
    config.tls_cert = Some(certificate.cert.clone());
    config.tls_key = Some(certificate.dir.path().join("missing.pem"));
    let err = zkgate::start(config).await.err().expect("refused");
    assert!(err.to_string().contains("missing.pem"), "{err}");
}
