//! The ZooKeeper side of zkgate's security, against real ZooKeeper servers: digest
//! authentication and the ACLs of the znodes zkgate creates (checked from outside with plain
//! clients, with and without the digest, and across a session expiry), and TLS to ZooKeeper
//! (one-way and mutual) with a throwaway CA.
//!
//! The ACL policy is process-wide (see `src/zk/acl.rs`), so every secured zkgate here runs as a
//! separate process; in-process instances keep the open default.

use crate::common;

use std::time::Duration;

use common::process::Process;
use common::proxy::Proxy;
use common::tls::{Pki, TlsZooKeeper};
use common::{within, zk_client, zookeeper};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use zookeeper_client::{Acl, Acls, AuthId, Client, CreateMode, Error as ZkError, Permission};

const DIGEST: &str = "zkgate:s3cret";
const ROOT: &str = "/zkgate";

/// A plain client authenticated with `digest`, as a Curator or kazoo peer would be.
async fn digest_client(connect: &str, digest: &str) -> Client {
    Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .with_auth("digest", digest.as_bytes())
        .connect(connect)
        .await
        .expect("connect ZooKeeper with a digest")
}

/// Every znode from `path` down, parents first.
async fn walk(client: &Client, path: &str) -> Vec<String> {
    let mut nodes = Vec::new();
    let mut pending = vec![path.to_string()];
    while let Some(path) = pending.pop() {
        let children = client.list_children(&path).await.expect("list children");
        pending.extend(children.into_iter().map(|child| format!("{path}/{child}")));
        nodes.push(path);
    }
    nodes
}

/// The ACL ZooKeeper stores for a znode created with `Acls::creator_all()` by a session
/// authenticated as `peer`'s digest: `digest:<user>:<hash>` with every permission.
async fn creator_acl(peer: &Client) -> Vec<Acl> {
    let probe = "/acl-probe";
    peer.create(probe, &[], &CreateMode::Ephemeral.with_acls(Acls::creator_all()))
        .await
        .expect("create the probe");
    let (acl, _) = peer.get_acl(probe).await.expect("probe's ACL");
    peer.delete(probe, None).await.expect("delete the probe");
    assert!(
        acl.len() == 1 && acl[0].scheme() == "digest" && acl[0].id().starts_with("zkgate:"),
        "{acl:?}"
    );
    acl
}

/// Takes a lock, puts a queue item, writes a value and joins a group through `gate` (the
/// lock and the member of each round are their own: what a round holds outlives a session).
async fn use_every_kind(gate: &Process, round: u32) {
    let lease = gate.lease("60s").await;
    let (status, body) = gate
        .call(
            Method::POST,
            &format!("/v1/locks/orders-{round}/acquire?wait=0"),
            Some(json!({ "lease": lease })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "lock: {body}");
    let (status, body) = gate
        .call(Method::POST, "/v1/queues/jobs/items", Some(json!({ "round": round })))
        .await;
    assert_eq!(status, StatusCode::CREATED, "queue put: {body}");
    let (status, body) = gate
        .call(Method::PUT, "/v1/kv/color", Some(json!({ "round": round })))
        .await;
    assert!(status.is_success(), "kv write: {status} {body}");
    let (status, body) = gate
        .call(
            Method::PUT,
            &format!("/v1/groups/workers/members/w{round}"),
            Some(json!({ "lease": lease, "data": round })),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "group join: {body}");
}

/// Checks every znode under the root: its ACL is exactly `expected` (never `world:anyone`),
/// and `outsider` (no auth) can neither read, change nor delete it. Returns how many there are.
async fn assert_digest_only(peer: &Client, outsider: &Client, expected: &[Acl]) -> usize {
    let nodes = walk(peer, ROOT).await;
    for path in &nodes {
        let (acl, _) = peer.get_acl(path).await.expect("getAcl");
        assert_eq!(acl, expected, "ACL of {path}");
        assert!(acl.iter().all(|a| a.auth_id() != &AuthId::anyone()), "{path}: {acl:?}");
        // Without READ or ADMIN, ZooKeeper does not even show the ACL.
        assert_eq!(
            outsider.get_acl(path).await.err(),
            Some(ZkError::NoAuth),
            "getAcl {path}"
        );
        assert_eq!(outsider.get_data(path).await.err(), Some(ZkError::NoAuth), "get {path}");
        assert_eq!(
            outsider.set_data(path, b"x", None).await.err(),
            Some(ZkError::NoAuth),
            "set {path}"
        );
        let child = format!("{path}/intruder");
        let create = outsider.create(&child, &[], &CreateMode::Persistent.with_acls(Acls::anyone_all()));
        assert_eq!(create.await.err(), Some(ZkError::NoAuth), "create under {path}");
        // Deleting a znode takes DELETE on its parent; the root's parent is not zkgate's.
        if path != ROOT {
            assert_eq!(
                outsider.delete(path, None).await.err(),
                Some(ZkError::NoAuth),
                "delete {path}"
            );
        }
    }
    nodes.len()
}

/// zkgate with `--zookeeper-auth`: what it creates admits its digest only; a client without
/// it is refused everything, a peer with it may change and delete; after a session expiry the
/// new session authenticates again (its creates would fail otherwise) and what it creates is
/// as closed; an instance without the digest is not ready on that root and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_digest_closes_zkgates_znodes_to_everyone_else_across_a_session_expiry() {
    let zk = zookeeper().await;
    let proxy = Proxy::start(&zk.connect_string()).await;
    let mut gate = Process::start_with(
        &proxy.connect_string(),
        &["--session-timeout", "2s", "--zookeeper-auth", DIGEST],
    )
    .await;
    gate.wait_ready().await;
    use_every_kind(&gate, 1).await;

    let peer = digest_client(&zk.connect_string(), DIGEST).await;
    let outsider = zk_client(&zk.connect_string()).await;
    let expected = creator_acl(&peer).await;
    let checked = assert_digest_only(&peer, &outsider, &expected).await;
    assert!(checked >= 9, "only {checked} znodes under {ROOT}");

    // Expire zkgate's sessions: cut them off for longer than their timeout; ZooKeeper deletes
    // a session's ephemeral znodes (each session's registration) when it expires it. Every lane's
    // must be gone before the cut heals: ZooKeeper expires sessions in ticks, and a lane whose
    // session outlived the others' would resume it on healing (no new session to wait for).
    let registrations = peer
        .list_children(&format!("{ROOT}/instances"))
        .await
        .expect("registrations");
    assert_eq!(
        registrations.len(),
        gate.lanes + 1,
        "one registration a session (each lane's and the keeper's): {registrations:?}"
    );
    let mut deletions = Vec::new();
    for registration in &registrations {
        let path = format!("{ROOT}/instances/{registration}");
        let (exists, deleted) = peer.check_and_watch_stat(&path).await.expect("watch");
        assert!(exists.is_some(), "{path}");
        deletions.push(deleted);
    }
    proxy.partition();
    for deleted in deletions {
        within(Duration::from_secs(30), "every session to expire", deleted.changed()).await;
    }
    proxy.heal();
    gate.wait_session(2).await;
    use_every_kind(&gate, 2).await;
    let checked = assert_digest_only(&peer, &outsider, &expected).await;
    assert!(checked >= 10, "only {checked} znodes under {ROOT}");

    // A peer with the same digest has every right over zkgate's znodes.
    let value = format!("{ROOT}/kv/color");
    peer.set_data(&value, br#"{"by":"peer"}"#, None)
        .await
        .expect("peer sets");
    let (status, body) = gate.call(Method::GET, "/v1/kv/color", None).await;
    assert_eq!((status, body), (StatusCode::OK, json!({ "by": "peer" })));
    peer.delete(&value, None).await.expect("peer deletes");
    let (status, _) = gate.call(Method::GET, "/v1/kv/color", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // An instance without the digest cannot use that root, and says so instead of failing
    // every request.
    let mut open = Process::start_until(&zk.connect_string(), &[], "refuses zkgate's session access").await;
    let (status, _) = open.call(Method::GET, "/readyz", None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{}", open.diagnose());
}

/// `--zookeeper-auth-file` and `--zookeeper-acl-world-read`: the digest comes from a file,
/// and anyone may read what zkgate creates but only the digest may change it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn world_read_lets_anyone_read_and_only_the_digest_write() {
    let zk = zookeeper().await;
    let secrets = tempfile::tempdir().expect("temp dir");
    let auth_file = secrets.path().join("zookeeper-auth");
    std::fs::write(&auth_file, format!("{DIGEST}\n")).expect("write the auth file");
    let auth_file = auth_file.display().to_string();
    let mut gate = Process::start_with(
        &zk.connect_string(),
        &["--zookeeper-auth-file", &auth_file, "--zookeeper-acl-world-read"],
    )
    .await;
    gate.wait_ready().await;
    let (status, body) = gate.call(Method::PUT, "/v1/kv/motd", Some(json!("hello"))).await;
    assert!(status.is_success(), "{status} {body}");

    let peer = digest_client(&zk.connect_string(), DIGEST).await;
    let outsider = zk_client(&zk.connect_string()).await;
    let mut expected = creator_acl(&peer).await;
    expected.push(Acl::new(Permission::READ, AuthId::anyone()));
    let value = format!("{ROOT}/kv/motd");
    // Without ADMIN, ZooKeeper shows the digest's user but not its hash.
    let redacted = vec![
        Acl::new(Permission::ALL, AuthId::new("digest", "zkgate:x")),
        Acl::new(Permission::READ, AuthId::anyone()),
    ];
    for path in [ROOT.to_string(), format!("{ROOT}/kv"), value.clone()] {
        assert_eq!(peer.get_acl(&path).await.expect("getAcl").0, expected, "ACL of {path}");
        let (acl, _) = outsider.get_acl(&path).await.expect("anyone reads the ACL");
        assert_eq!(acl, redacted, "ACL of {path} seen by anyone");
    }
    let (data, _) = outsider.get_data(&value).await.expect("anyone reads");
    assert_eq!(serde_json::from_slice::<Value>(&data).ok(), Some(json!("hello")));
    assert_eq!(outsider.set_data(&value, b"x", None).await.err(), Some(ZkError::NoAuth));
    assert_eq!(outsider.delete(&value, None).await.err(), Some(ZkError::NoAuth));
    peer.set_data(&value, br#""bye""#, None)
        .await
        .expect("the digest writes");
}

/// Nothing in `src/` picks an ACL but `src/zk/acl.rs`: every create goes through
/// `zk::acls()`, so none can miss `--zookeeper-auth`.
#[test]
fn every_create_in_zkgate_takes_its_acl_from_one_function() {
    let mut pending = vec![std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/src"))];
    let mut offenders = Vec::new();
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src").flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") || path.ends_with("zk/acl.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read source");
            let chosen_elsewhere = text.contains("Acls::")
                || text.contains("LockOptions::new(")
                || text
                    .split("with_acls(")
                    .skip(1)
                    .any(|rest| !rest.starts_with("crate::zk::acls())") && !rest.starts_with("super::acls())"));
            if chosen_elsewhere {
                offenders.push(path.display().to_string());
            }
        }
    }
    assert!(offenders.is_empty(), "ACLs chosen outside zk::acls(): {offenders:?}");
}

/// TLS to ZooKeeper: with `--zookeeper-tls-ca` zkgate connects to the TLS port and serves a
/// lock; with another CA, or without TLS, it never connects and says why (readyz 503).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zkgate_reaches_zookeeper_over_tls_only_with_the_right_ca() {
    let pki = Pki::new("zkgate test CA");
    let stranger = Pki::new("some other CA");
    let zk = TlsZooKeeper::start(&pki, "none").await;
    let connect = zk.secure_connect_string();
    let ca = pki.ca.display().to_string();
    let other_ca = stranger.ca.display().to_string();
    let (right_flags, wrong_flags) = (["--zookeeper-tls-ca", &ca], ["--zookeeper-tls-ca", &other_ca]);
    let (mut good, mut wrong_ca, mut plain) = tokio::join!(
        Process::start_with(&connect, &right_flags),
        Process::start_until(&connect, &wrong_flags, "cannot connect over TLS"),
        Process::start_until(&connect, &[], "cannot reach ZooKeeper"),
    );
    good.wait_ready().await;
    let (status, body) = good.call(Method::POST, "/v1/locks/over-tls/acquire?wait=0", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // The lock is on that server (seen through its plain port).
    let outside = zk_client(&zk.server.connect_string()).await;
    let contenders = outside
        .list_children(&format!("{ROOT}/locks/over-tls"))
        .await
        .expect("listed");
    assert_eq!(contenders.len(), 1, "{contenders:?}");

    for refused in [&mut wrong_ca, &mut plain] {
        let (status, _) = refused.call(Method::GET, "/readyz", None).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{}", refused.diagnose());
    }
}

/// Mutual TLS: a server that needs a client certificate accepts zkgate with
/// `--zookeeper-tls-cert`/`--zookeeper-tls-key`, and refuses it with the CA alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_needs_a_client_certificate_gets_zkgates() {
    let pki = Pki::new("zkgate test CA");
    let zk = TlsZooKeeper::start(&pki, "need").await;
    let connect = zk.secure_connect_string();
    let (ca, cert, key) = (
        pki.ca.display().to_string(),
        pki.client_cert.display().to_string(),
        pki.client_key.display().to_string(),
    );
    let mutual = [
        "--zookeeper-tls-ca",
        &ca,
        "--zookeeper-tls-cert",
        &cert,
        "--zookeeper-tls-key",
        &key,
    ];
    let one_way = ["--zookeeper-tls-ca", &ca];
    let (mut with_cert, mut without) = tokio::join!(
        Process::start_with(&connect, &mutual),
        Process::start_until(&connect, &one_way, "cannot connect over TLS"),
    );
    with_cert.wait_ready().await;
    let (status, body) = with_cert
        .call(Method::POST, "/v1/locks/mutual/acquire?wait=0", None)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _) = without.call(Method::GET, "/readyz", None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{}", without.diagnose());
}
