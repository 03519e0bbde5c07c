//! TLS for tests: a throwaway certificate authority (made with rcgen, in a temporary
//! directory) and real ZooKeeper servers with a TLS client port (`secureClientPort` on Netty)
//! presenting a certificate it signed.

use std::path::PathBuf;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use tempfile::TempDir;
use zkgate::zk::server::{ZooKeeperServer, free_port};

/// A CA and what it signed, as PEM files: the server's certificate names `127.0.0.1` and
/// `localhost`; the client's is zkgate's identity for mutual TLS.
pub struct Pki {
    /// The CA certificate (what `--zookeeper-tls-ca` and the server's trust store take).
    pub ca: PathBuf,
    /// The server's private key and certificate in one file (ZooKeeper's PEM key store).
    pub server_key_store: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    _dir: TempDir,
}

impl Pki {
    /// A new CA called `name`, with a server and a client certificate.
    pub fn new(name: &str) -> Pki {
        let dir = tempfile::Builder::new()
            .prefix("zkgate-pki-")
            .tempdir()
            .expect("temp dir");
        let mut ca_params = CertificateParams::default();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(DnType::CommonName, name);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("CA key")).expect("CA");

        let mut server_params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).expect("server names");
        server_params.distinguished_name.push(DnType::CommonName, "zookeeper");
        server_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server_key = KeyPair::generate().expect("server key");
        let server_cert = server_params.signed_by(&server_key, &ca).expect("server certificate");

        let mut client_params = CertificateParams::new(Vec::<String>::new()).expect("client params");
        client_params.distinguished_name.push(DnType::CommonName, "zkgate");
        client_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client_key = KeyPair::generate().expect("client key");
        let client_cert = client_params.signed_by(&client_key, &ca).expect("client certificate");

        let write = |file: &str, text: String| {
            let path = dir.path().join(file);
            std::fs::write(&path, text).expect("write PEM");
            path
        };
        Pki {
            ca: write("ca.pem", ca.pem()),
            server_key_store: write(
                "server.pem",
                format!("{}{}", server_key.serialize_pem(), server_cert.pem()),
            ),
            client_cert: write("client.pem", client_cert.pem()),
            client_key: write("client-key.pem", client_key.serialize_pem()),
            _dir: dir,
        }
    }
}

/// A standalone ZooKeeper server with a plain client port (used only to see that it serves)
/// and a TLS one.
pub struct TlsZooKeeper {
    pub server: ZooKeeperServer,
    pub secure_port: u16,
}

impl TlsZooKeeper {
    /// Starts one whose TLS port presents `pki`'s server certificate and checks client
    /// certificates against `pki`'s CA; `client_auth` is ZooKeeper's `ssl.clientAuth`
    /// (`none`, `want` or `need`).
    pub async fn start(pki: &Pki, client_auth: &str) -> TlsZooKeeper {
        let secure_port = free_port().expect("port");
        let mut options = super::test_server_options();
        options.extra_config = vec![
            format!("secureClientPort={secure_port}"),
            "secureClientPortAddress=127.0.0.1".to_string(),
            "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory".to_string(),
            format!("ssl.keyStore.location={}", pki.server_key_store.display()),
            "ssl.keyStore.type=PEM".to_string(),
            format!("ssl.trustStore.location={}", pki.ca.display()),
            "ssl.trustStore.type=PEM".to_string(),
            format!("ssl.clientAuth={client_auth}"),
        ];
        let server = ZooKeeperServer::start_standalone(&options)
            .await
            .expect("start ZooKeeper with a TLS port");
        TlsZooKeeper { server, secure_port }
    }

    /// `127.0.0.1:<TLS port>`.
    pub fn secure_connect_string(&self) -> String {
        format!("127.0.0.1:{}", self.secure_port)
    }
}
