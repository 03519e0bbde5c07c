//! Trust between instances: a request goes to another instance only with the deployment's key,
//! only to a registration that verifies, and without the client's token; a request posing as a
//! peer's is refused; an instance's registration is its own session's, made again when lost.

use crate::common;

use std::time::Duration;

use common::{ADMIN, Gate, TEST_CLUSTER_SECRET, auth_config, grant, test_config, within, zk_client, zookeeper};
use reqwest::{Method, StatusCode};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use zkgate::peer::{Forward, PeerKey};
use zookeeper_client::{Acls, CreateMode};

fn principals(dir: &tempfile::TempDir) -> (std::path::PathBuf, String) {
    let (path, [token, _]) = auth_config(dir, [("app", grant("", "write")), ("ops", ADMIN.to_string())]);
    (path, token)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("time")
        .as_millis() as u64
}

/// Without a shared secret an instance cannot hand a request to another, nor believe one: it
/// takes the lease over instead (one conditional write), and serves it. The lease moves to
/// whichever instance was asked last, and nothing it holds is lost on the way.
#[tokio::test]
async fn without_a_secret_an_instance_takes_the_lease_over_instead_of_handing_it_on() {
    let zk = zookeeper().await;
    let mut config = test_config(&zk.connect_string());
    config.cluster_secret = None;
    let a = Gate::start_with(config.clone()).await;
    let b = Gate::start_with(config).await;
    let lease = a.lease("30s").await;
    let held = a.acquire("moved", &lease, "wait=0").await;
    assert_eq!(held.status, StatusCode::OK, "{held:?}");
    let keepalive = format!("/v1/leases/{lease}/keepalive");
    let kept = b.post(&keepalive, None).await;
    assert_eq!(kept.status, StatusCode::OK, "{kept:?}");
    let kept_by = |gate: &Gate| gate.running.state.leases.peek(&lease).is_ok();
    assert!(kept_by(&b), "B keeps it now");
    // A learns of the takeover through its notice before its next heartbeat counts.
    within(Duration::from_secs(10), "A to drop the lease", async {
        while kept_by(&a) {
            a.running.state.leases.next_heartbeat().await;
        }
    })
    .await;
    // And back: A takes it over again, and the lock was held throughout.
    assert_eq!(a.post(&keepalive, None).await.status, StatusCode::OK);
    let state = b.get("/v1/locks/moved").await;
    assert_eq!(
        state.body["holder"]["fencing_token"], held.body["fencing_token"],
        "{state:?}"
    );
    // An id no instance ever issued: not found, wherever asked.
    let unknown = format!("0123abcd-{}", &lease[9..]);
    b.get(&format!("/v1/leases/{unknown}"))
        .await
        .assert_problem(StatusCode::NOT_FOUND, None);
}

/// A lease record in ZooKeeper naming `keeper` for `id`, owned by principal `app`, as an
/// attacker with write access to ZooKeeper could make it.
async fn record_foreign_lease(client: &zookeeper_client::Client, id: &str, keeper: &str) {
    let record = json!({"ttl_ms": 30000, "principal": "app", "created_ms": 1, "keeper": keeper});
    let path = format!("/zkgate/leases/{id}");
    let _ = client.delete(&path, None).await;
    client
        .create(
            &path,
            record.to_string().as_bytes(),
            &CreateMode::Persistent.with_acls(Acls::anyone_all()),
        )
        .await
        .expect("record the lease");
}

/// A registration for instance `instance` pointing at `url`, made by `client`'s session,
/// signed with `key` (or not at all).
async fn register_foreign(client: &zookeeper_client::Client, instance: &str, url: &str, key: Option<&PeerKey>) {
    let session = client.session_id().0;
    let mut registration = json!({"url": url, "session": session});
    if let Some(key) = key {
        registration["mac"] = key.sign_registration(instance, url, session).into();
    }
    let path = &format!("/zkgate/instances/{instance}");
    let _ = client.delete(path, None).await;
    client
        .create(
            path,
            registration.to_string().as_bytes(),
            &CreateMode::Ephemeral.with_acls(Acls::anyone_all()),
        )
        .await
        .expect("register deadbeef");
}

#[tokio::test]
async fn hand_offs_go_only_to_verified_registrations_and_never_carry_the_token() {
    let zk = zookeeper().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let (auth, token) = principals(&dir);
    let mut config = test_config(&zk.connect_string());
    config.auth_config = Some(auth);
    let gate = Gate::start_with(config).await;
    let attacker = zk_client(&zk.connect_string()).await;
    // A listener that answers whatever reaches it with 204 and keeps what it read.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    // Each step with a lease of its own, so that what an earlier step's take-over leaves (the
    // record naming this instance, its watch, the reaper's next pass) cannot serve a later
    // step's lease here.
    let lease = |step: u32| format!("deadbeef-{step:032x}");
    let keepalive = |step: u32| format!("/v1/leases/{}/keepalive", lease(step));

    // Unsigned, signed with another key, or signed for another session: nothing is sent; the
    // lease (which a record says `deadbeef` keeps) is taken over and served here instead.
    let wrong = PeerKey::parse("not the deployment's secret").expect("key");
    let right = PeerKey::parse(TEST_CLUSTER_SECRET).expect("key");
    // (Registered before the record names it, so that the reaper never finds the lease's
    // keeper gone and takes it over itself.)
    for (step, key) in [(1, None), (2, Some(&wrong))] {
        register_foreign(&attacker, "deadbeef", &url, key).await;
        record_foreign_lease(&attacker, &lease(step), "deadbeef").await;
        let served = gate.call_as(Some(&token), Method::POST, &keepalive(step), None).await;
        assert_eq!(served.status, StatusCode::OK, "{served:?}");
        assert!(!served.body.to_string().contains(&url), "names no URL: {served:?}");
        gate.running.state.leases.hand_over_all();
    }
    // A genuine registration copied by another session: its owner is not the session it names.
    register_foreign(&attacker, "deadbeef", &url, Some(&right)).await;
    let (copied, _) = attacker.get_data("/zkgate/instances/deadbeef").await.expect("read");
    let thief = zk_client(&zk.connect_string()).await;
    attacker
        .delete("/zkgate/instances/deadbeef", None)
        .await
        .expect("delete");
    thief
        .create(
            "/zkgate/instances/deadbeef",
            &copied,
            &CreateMode::Ephemeral.with_acls(Acls::anyone_all()),
        )
        .await
        .expect("copy");
    record_foreign_lease(&attacker, &lease(3), "deadbeef").await;
    let served = gate.call_as(Some(&token), Method::POST, &keepalive(3), None).await;
    assert_eq!(served.status, StatusCode::OK, "{served:?}");
    gate.running.state.leases.hand_over_all();
    thief.delete("/zkgate/instances/deadbeef", None).await.expect("delete");

    // Nothing reached the listener so far.
    let std_listener = listener.into_std().expect("std listener");
    std_listener.set_nonblocking(true).expect("nonblocking");
    let nothing = std_listener.accept();
    assert!(
        nothing
            .as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock),
        "a forward reached an unverified registration: {nothing:?}"
    );
    let listener = tokio::net::TcpListener::from_std(std_listener).expect("tokio listener");

    // Signed by the deployment's key and owned by the session it names: handed over, with the
    // principal asserted and signed, and without the client's token.
    // (Another instance's name: the reaper's passes that deadbeef's going set off must find
    // this lease's keeper registered, whenever they read.)
    register_foreign(&attacker, "cafef00d", &url, Some(&right)).await;
    record_foreign_lease(&attacker, &lease(4), "cafef00d").await;
    let received = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.expect("accept");
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            stream.read_exact(&mut byte).await.expect("read");
            head.push(byte[0]);
        }
        stream
            .write_all(b"HTTP/1.1 204 No Content\r\nSet-Cookie: a=b\r\nX-Peer: secret\r\n\r\n")
            .await
            .expect("answer");
        String::from_utf8(head).expect("utf-8").to_ascii_lowercase()
    });
    let relayed = gate.call_as(Some(&token), Method::POST, &keepalive(4), None).await;
    assert_eq!(relayed.status, StatusCode::NO_CONTENT, "{relayed:?}");
    let head = within(Duration::from_secs(10), "the forward arrives", received)
        .await
        .expect("listener");
    assert!(!head.contains("authorization:"), "the token went along: {head}");
    assert!(
        !head.contains(&token.to_ascii_lowercase()),
        "the token went along: {head}"
    );
    assert!(head.contains("zkgate-forwarded-for: app\r\n"), "{head}");
    assert!(head.contains("zkgate-signature: "), "{head}");
}

/// A forward of `GET /v1/leases` by instance `0000000a` to `to`, as `ops`.
fn forward(to: &str, at_ms: u64) -> Forward<'_> {
    Forward {
        method: "GET",
        path: "/v1/leases",
        from: "0000000a",
        to,
        principal: Some("ops"),
        at_ms,
        body: b"",
    }
}

#[tokio::test]
async fn the_peer_headers_from_a_client_are_refused_unless_a_peer_signed_them() {
    let zk = zookeeper().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let (auth, _token) = principals(&dir);
    let mut config = test_config(&zk.connect_string());
    config.auth_config = Some(auth);
    let gate = Gate::start_with(config).await;
    let me = gate.running.state.instance.id.to_string();
    let path = "/v1/leases";
    let right = PeerKey::parse(TEST_CLUSTER_SECRET).expect("key");
    let wrong = PeerKey::parse("not the deployment's secret").expect("key");
    let me = me.as_str();
    let now = now_ms();
    let send = |key: &PeerKey, forward: Forward<'_>| {
        let mut headers = reqwest::header::HeaderMap::new();
        for (name, value) in zkgate::http::handoff::peer_headers(key, &forward).iter() {
            headers.insert(name.clone(), value.clone());
        }
        let request = gate.http.get(format!("{}{path}", gate.url)).headers(headers);
        async move { request.send().await.expect("send").status() }
    };
    // Signed with another key, for another instance, or too old: 401.
    assert_eq!(send(&wrong, forward(me, now)).await, StatusCode::UNAUTHORIZED);
    assert_eq!(send(&right, forward("0000000b", now)).await, StatusCode::UNAUTHORIZED);
    assert_eq!(send(&right, forward(me, now - 60_000)).await, StatusCode::UNAUTHORIZED);
    // Headers without a signature at all.
    let bare = gate
        .http
        .get(format!("{}{path}", gate.url))
        .header("zkgate-forwarded-by", "0000000a")
        .header("zkgate-forwarded-for", "ops")
        .send()
        .await
        .expect("send");
    assert_eq!(bare.status(), StatusCode::UNAUTHORIZED);
    // Signed by a peer: served as the principal it asserts.
    assert_eq!(send(&right, forward(me, now)).await, StatusCode::OK);
}

/// Another client overwrites the instance's registration (same session, another URL): the
/// instance notices and writes its own again, so that requests handed to it keep reaching it.
#[tokio::test]
async fn a_registration_changed_by_another_client_is_written_again() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let path = format!("/zkgate/instances/{}", gate.running.state.instance.id);
    let other = zk_client(&zk.connect_string()).await;
    let (genuine, _) = other.get_data(&path).await.expect("registered");
    other
        .set_data(&path, b"{\"url\":\"http://127.0.0.1:1\"}", None)
        .await
        .expect("overwrite");
    within(Duration::from_secs(20), "the registration is written again", async {
        loop {
            let (data, _, watcher) = other.get_and_watch_data(&path).await.expect("watch");
            if data == genuine {
                return;
            }
            watcher.changed().await;
        }
    })
    .await;
}

#[tokio::test]
async fn a_registration_replaced_by_another_session_is_made_again() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let path = format!("/zkgate/instances/{}", gate.running.state.instance.id);
    let mine = gate
        .running
        .state
        .zk()
        .current()
        .expect("session")
        .client()
        .session_id()
        .0;
    let other = zk_client(&zk.connect_string()).await;
    // Another session takes the name: deleted and made in one step.
    let stat = other.check_stat(&path).await.expect("stat").expect("registered");
    assert_eq!(stat.ephemeral_owner, mine);
    let mut writer = other.new_multi_writer();
    writer.add_delete(&path, None).expect("delete");
    writer
        .add_create(
            &path,
            b"{\"url\":\"http://127.0.0.1:1\"}",
            &CreateMode::Ephemeral.with_acls(Acls::anyone_all()),
        )
        .expect("create");
    writer.commit().await.expect("replace");
    // The instance takes it back, as its own session's.
    within(Duration::from_secs(20), "the registration is made again", async {
        loop {
            let (stat, watcher) = other.check_and_watch_stat(&path).await.expect("watch");
            if stat.is_some_and(|s| s.ephemeral_owner == mine) {
                return;
            }
            watcher.changed().await;
        }
    })
    .await;
    within(
        Duration::from_secs(20),
        "ready again",
        gate.running.state.instances.wait_registered(),
    )
    .await;
    assert_eq!(gate.get("/readyz").await.status, StatusCode::OK);
    // The other session ending takes nothing of the instance's with it.
    drop(other);
    let checker = zk_client(&zk.connect_string()).await;
    let stat = checker
        .check_stat(&path)
        .await
        .expect("stat")
        .expect("still registered");
    assert_eq!(stat.ephemeral_owner, mine);
}
