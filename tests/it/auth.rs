//! Authentication and authorisation with `--auth-config`: every endpoint and the socket refuse
//! a missing or wrong token (401) and a name outside the principal's grants (403); leases,
//! handles and claims belong to the principal that made them; names cannot climb out of the
//! root or the granted prefixes.

use crate::common;

use common::ws::Ws;
use common::{Gate, Reply, TestZooKeeper, raw_request, test_config, tree, zk_client, zookeeper, zookeeper_own};
use reqwest::{Method, StatusCode};
use serde_json::json;

/// Tokens of the principals in [config].
struct Tokens {
    billing: String,
    billing2: String,
    reader: String,
    ops: String,
}

/// `billing` and `billing2` may write every kind under `billing-` (and keys under `billing/`);
/// `reader` may read everything; `ops` is an admin.
fn config() -> (String, Tokens) {
    let mut tokens = Vec::new();
    let mut text = String::new();
    for (name, grants) in [
        (
            "billing",
            "[[principals.grants]]\nkinds = [\"*\"]\nprefixes = [\"billing-\", \"billing/\"]\naccess = \"write\"\n",
        ),
        (
            "billing2",
            "[[principals.grants]]\nkinds = [\"*\"]\nprefixes = [\"billing-\", \"billing/\"]\naccess = \"write\"\n",
        ),
        (
            "reader",
            "[[principals.grants]]\nkinds = [\"*\"]\nprefixes = [\"\"]\naccess = \"read\"\n",
        ),
        ("ops", ""),
    ] {
        let (token, hash) = zkgate::auth::new_token();
        tokens.push(token);
        let admin = name == "ops";
        text.push_str(&format!(
            "[[principals]]\nname = \"{name}\"\ntokens = [\"{hash}\"]\nadmin = {admin}\n{grants}\n"
        ));
    }
    let [billing, billing2, reader, ops] = tokens.try_into().expect("four tokens");
    (
        text,
        Tokens {
            billing,
            billing2,
            reader,
            ops,
        },
    )
}

struct Setup {
    _zk: common::TestZooKeeper,
    _dir: tempfile::TempDir,
    gate: Gate,
    tokens: Tokens,
    connect: String,
}

async fn setup() -> Setup {
    setup_on(zookeeper().await).await
}

async fn setup_on(zk: TestZooKeeper) -> Setup {
    let dir = tempfile::tempdir().expect("temp dir");
    let (text, tokens) = config();
    let path = dir.path().join("auth.toml");
    std::fs::write(&path, text).expect("write auth config");
    let mut config = test_config(&zk.connect_string());
    config.auth_config = Some(path);
    let gate = Gate::start_with(config).await;
    Setup {
        connect: zk.connect_string(),
        _zk: zk,
        _dir: dir,
        gate,
        tokens,
    }
}

/// Every operation of the API as (method, path with `{…}` filled in): `name` for resource
/// names and keys, made-up ids for the rest.
fn every_operation(name: &str) -> Vec<(Method, String)> {
    let spec = serde_json::to_value(zkgate::openapi()).expect("spec");
    let mut operations = Vec::new();
    for (path, item) in spec["paths"].as_object().expect("paths") {
        let filled = path
            .replace("/leases/{id}", "/leases/0123456789abcdef0123456789abcdef")
            .replace("{name}", name)
            .replace("{group}", name)
            .replace("{id}", name)
            .replace("{key}", name)
            .replace("{handle}", "_c_x-lock-0000000000")
            .replace("{member}", "m1")
            .replace("{participant}", "p1")
            .replace("{claim}", "c1")
            .replace("{set}", "s1")
            .replace("{item}", "i1")
            .replace("{token}", "42");
        assert!(!filled.contains('{'), "a parameter left in {filled}");
        for method in item.as_object().expect("operations").keys() {
            let method = Method::from_bytes(method.to_uppercase().as_bytes()).expect("method");
            operations.push((method, filled.clone()));
        }
    }
    assert!(operations.len() > 50, "{} operations", operations.len());
    operations
}

fn is_probe(path: &str) -> bool {
    path == "/healthz" || path == "/readyz"
}

#[tokio::test]
async fn every_endpoint_and_the_socket_refuse_a_missing_or_wrong_token() {
    let s = setup().await;
    for (method, path) in every_operation("billing-a") {
        let body = (method != Method::GET).then(|| json!({}));
        for token in [None, Some("zkg_not-a-token")] {
            let reply = s.gate.call_as(token, method.clone(), &path, body.clone()).await;
            if is_probe(&path) {
                assert_eq!(reply.status, StatusCode::OK, "{method} {path}: {reply:?}");
                continue;
            }
            reply.assert_problem(StatusCode::UNAUTHORIZED, None);
        }
    }
    // The challenge says how to authenticate.
    let response = s
        .gate
        .http
        .get(format!("{}/v1/locks", s.gate.url))
        .send()
        .await
        .expect("request");
    assert_eq!(
        response.headers()["www-authenticate"].to_str().ok(),
        Some("Bearer realm=\"zkgate\"")
    );

    let addr = s.gate.running.addr;
    let refused = |result: Result<Ws, tokio_tungstenite::tungstenite::Error>| match result {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => response.status().as_u16(),
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("the handshake was accepted"),
    };
    assert_eq!(refused(Ws::connect_with(addr, "/v1/ws", &[]).await), 401);
    let wrong = format!("zkgate, zkgate.bearer.{}", base64url("zkg_wrong"));
    assert_eq!(
        refused(Ws::connect_with(addr, "/v1/ws", &[("sec-websocket-protocol", &wrong)]).await),
        401
    );
    assert_eq!(
        refused(Ws::connect_with(addr, "/v1/elections/billing-a/observe", &[]).await),
        401
    );

    // The right token as a subprotocol (what browsers can send): accepted, and `zkgate` is
    // the protocol answered, not the one carrying the token.
    let offered = format!("zkgate, zkgate.bearer.{}", base64url(&s.tokens.billing));
    let mut ws = Ws::connect_with(addr, "/v1/ws", &[("sec-websocket-protocol", &offered)])
        .await
        .expect("accepted");
    ws.send(json!({"op": "subscribe", "id": "a", "topic": {"lock": "billing-a"}}));
    assert_eq!(ws.next_for("a").await["type"], "state");
    let bearer = format!("Bearer {}", s.tokens.billing);
    let ws = Ws::connect_with(addr, "/v1/ws", &[("authorization", &bearer)]).await;
    assert!(ws.is_ok(), "an Authorization header works for non-browser clients");
}

#[tokio::test]
async fn the_socket_answers_zkgate_as_its_subprotocol() {
    let s = setup().await;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut request = format!("ws://{}/v1/ws", s.gate.running.addr)
        .into_client_request()
        .expect("request");
    let offered = format!("zkgate, zkgate.bearer.{}", base64url(&s.tokens.reader));
    request
        .headers_mut()
        .insert("sec-websocket-protocol", offered.parse().expect("header"));
    let (_, response) = tokio_tungstenite::connect_async(request).await.expect("accepted");
    assert_eq!(
        response.headers()["sec-websocket-protocol"].to_str().ok(),
        Some("zkgate")
    );
}

#[tokio::test]
async fn names_outside_the_grants_are_forbidden_everywhere() {
    let s = setup().await;
    let billing = Some(s.tokens.billing.as_str());
    for (method, path) in every_operation("orders") {
        let body = (method != Method::GET).then(|| json!({}));
        let reply = s.gate.call_as(billing, method.clone(), &path, body).await;
        let named = path.contains("/orders") && !path.starts_with("/v1/leases");
        if named || path == "/metrics" {
            reply.assert_problem(StatusCode::FORBIDDEN, None);
            assert!(
                reply.str("detail").contains("principal `billing`"),
                "{method} {path}: {reply:?}"
            );
        } else {
            assert_ne!(reply.status, StatusCode::FORBIDDEN, "{method} {path}: {reply:?}");
            assert_ne!(reply.status, StatusCode::UNAUTHORIZED, "{method} {path}: {reply:?}");
        }
    }
    // A reader may read but not write.
    let reader = Some(s.tokens.reader.as_str());
    assert_eq!(
        s.gate
            .call_as(reader, Method::GET, "/v1/locks/orders", None)
            .await
            .status,
        StatusCode::OK
    );
    s.gate
        .call_as(reader, Method::POST, "/v1/locks/orders/acquire?wait=0", None)
        .await
        .assert_problem(StatusCode::FORBIDDEN, None);

    // Lists show only what the principal may read.
    let ops = Some(s.tokens.ops.as_str());
    for lock in ["orders", "billing-a"] {
        let reply = s
            .gate
            .call_as(ops, Method::POST, &format!("/v1/locks/{lock}/acquire?wait=0"), None)
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    }
    let listed = |reply: Reply| -> Vec<String> {
        reply
            .body
            .as_array()
            .expect("a list")
            .iter()
            .map(|l| l["name"].as_str().unwrap_or("").to_string())
            .collect()
    };
    assert_eq!(
        listed(s.gate.call_as(billing, Method::GET, "/v1/locks", None).await),
        ["billing-a"]
    );
    assert_eq!(
        listed(s.gate.call_as(reader, Method::GET, "/v1/locks", None).await),
        ["billing-a", "orders"]
    );

    // Over the socket: subscriptions and calls meet the same grants.
    let offered = format!("zkgate, zkgate.bearer.{}", base64url(&s.tokens.billing));
    let mut ws = Ws::connect_with(s.gate.running.addr, "/v1/ws", &[("sec-websocket-protocol", &offered)])
        .await
        .expect("accepted");
    ws.send(json!({"op": "subscribe", "id": "s1", "topic": {"lock": "orders"}}));
    let refused = ws.next_for("s1").await;
    assert_eq!(refused["type"], "urn:zkgate:problem:forbidden", "{refused}");
    for path in ["locks/orders", "kv/orders", "leases", ""] {
        ws.send(json!({"op": "subscribe", "id": path, "topic": {"znode": {"path": path}}}));
        let refused = ws.next_for(path).await;
        assert_eq!(refused["type"], "urn:zkgate:problem:forbidden", "{path}: {refused}");
    }
    let reply = ws.call("c1", "POST", "/v1/locks/orders/acquire?wait=0", None).await;
    assert_eq!(reply["status"], 403, "{reply}");
    let reply = ws.call("c2", "GET", "/v1/locks/billing-a", None).await;
    assert_eq!(reply["status"], 200, "{reply}");
}

#[tokio::test]
async fn leases_handles_and_claims_belong_to_their_principal_unless_admin() {
    let s = setup().await;
    let (billing, other, ops) = (
        Some(s.tokens.billing.as_str()),
        Some(s.tokens.billing2.as_str()),
        Some(s.tokens.ops.as_str()),
    );
    let granted = s
        .gate
        .call_as(
            billing,
            Method::POST,
            "/v1/locks/billing-a/acquire?wait=0",
            Some(json!({"ttl": "30s"})),
        )
        .await;
    assert_eq!(granted.status, StatusCode::OK, "{granted:?}");
    let lease = granted.body["lease"]["id"].as_str().expect("lease id").to_string();
    let handle = granted.str("handle");
    let handle_path = format!("/v1/locks/billing-a/handles/{handle}");

    // Another principal with the same grants: not its lease, not its handle.
    for (method, path, body) in [
        (Method::GET, format!("/v1/leases/{lease}"), None),
        (Method::POST, format!("/v1/leases/{lease}/keepalive"), None),
        (Method::DELETE, format!("/v1/leases/{lease}"), None),
        (Method::GET, handle_path.clone(), None),
        (Method::DELETE, handle_path.clone(), None),
        (
            Method::POST,
            "/v1/locks/billing-b/acquire?wait=0".to_string(),
            Some(json!({"lease": lease})),
        ),
        (
            Method::POST,
            "/v1/locks/billing-a/revoke".to_string(),
            Some(json!({"by": "billing2", "reason": "mine now"})),
        ),
    ] {
        s.gate
            .call_as(other, method, &path, body)
            .await
            .assert_problem(StatusCode::FORBIDDEN, None);
    }
    let mine = s.gate.call_as(other, Method::GET, "/v1/leases", None).await;
    assert_eq!(mine.body.as_array().map(Vec::len), Some(0), "{mine:?}");
    let offered = format!("zkgate, zkgate.bearer.{}", base64url(&s.tokens.billing2));
    let mut ws = Ws::connect_with(s.gate.running.addr, "/v1/ws", &[("sec-websocket-protocol", &offered)])
        .await
        .expect("accepted");
    ws.send(json!({"op": "lease", "id": "l1", "attach": lease}));
    assert_eq!(ws.next_for("l1").await["type"], "urn:zkgate:problem:forbidden");
    ws.send(json!({"op": "subscribe", "id": "s1", "topic": {"lease": lease}}));
    assert_eq!(ws.next_for("s1").await["type"], "urn:zkgate:problem:forbidden");

    // Still held by billing, untouched by all of that.
    let held = s.gate.call_as(billing, Method::GET, &handle_path, None).await;
    assert_eq!(held.str("state"), "held", "{held:?}");

    // A queue claim: only its taker acks it.
    let put = s
        .gate
        .call_as(
            billing,
            Method::POST,
            "/v1/queues/billing-q/items",
            Some(json!({"n": 1})),
        )
        .await;
    assert_eq!(put.status, StatusCode::CREATED, "{put:?}");
    let taken = s
        .gate
        .call_as(
            billing,
            Method::POST,
            "/v1/queues/billing-q/take?ack_deadline=30s",
            None,
        )
        .await;
    assert_eq!(taken.status, StatusCode::OK, "{taken:?}");
    let ack = format!("/v1/queues/billing-q/claims/{}/ack", taken.str("claim"));
    s.gate
        .call_as(other, Method::POST, &ack, None)
        .await
        .assert_problem(StatusCode::FORBIDDEN, None);
    assert_eq!(
        s.gate.call_as(billing, Method::POST, &ack, None).await.status,
        StatusCode::NO_CONTENT
    );

    // An admin may: keep alive, revoke, release.
    assert_eq!(
        s.gate
            .call_as(ops, Method::POST, &format!("/v1/leases/{lease}/keepalive"), None)
            .await
            .status,
        StatusCode::OK
    );
    let revoked = s
        .gate
        .call_as(
            ops,
            Method::POST,
            "/v1/locks/billing-a/revoke",
            Some(json!({"by": "ops", "reason": "maintenance"})),
        )
        .await;
    assert_eq!(revoked.status, StatusCode::ACCEPTED, "{revoked:?}");
    assert_eq!(
        s.gate.call_as(ops, Method::DELETE, &handle_path, None).await.status,
        StatusCode::NO_CONTENT
    );
    // The owner itself may revoke its own holder.
    let again = s
        .gate
        .call_as(
            billing,
            Method::POST,
            "/v1/locks/billing-a/acquire?wait=0",
            Some(json!({"lease": lease})),
        )
        .await;
    assert_eq!(again.status, StatusCode::OK, "{again:?}");
    let revoked = s
        .gate
        .call_as(
            billing,
            Method::POST,
            "/v1/locks/billing-a/revoke",
            Some(json!({"by": "billing", "reason": "done"})),
        )
        .await;
    assert_eq!(revoked.status, StatusCode::ACCEPTED, "{revoked:?}");
}

#[tokio::test]
async fn names_cannot_escape_the_root_or_the_granted_prefixes() {
    // ZooKeeper's own tree is compared before and after: a server of its own.
    let s = setup_on(TestZooKeeper::Own(zookeeper_own().await)).await;
    let (billing, ops) = (Some(s.tokens.billing.as_str()), Some(s.tokens.ops.as_str()));
    let outside = s
        .gate
        .call_as(ops, Method::PUT, "/v1/kv/orders", Some(json!({"v": "kept"})))
        .await;
    assert_eq!(outside.status, StatusCode::CREATED, "{outside:?}");
    let zk = zk_client(&s.connect).await;
    let before = (tree(&zk, "/zookeeper").await, tree(&zk, "/zkgate/kv").await);

    // Encoded dots and slashes decode to names that start with the prefix but climb out of
    // it: refused as bad names, before anything is written. (Sent byte for byte: HTTP client
    // libraries resolve `%2E%2E` segments before sending.)
    let addr = s.gate.running.addr;
    let token = s.tokens.billing.as_str();
    for path in [
        "/v1/kv/billing%2F..%2Forders",
        "/v1/kv/billing/%2E%2E/orders",
        "/v1/kv/billing/../orders",
        "/v1/kv/billing/%2e%2e/%2e%2e/zookeeper/quota",
        "/v1/locks/billing-a%2F..%2F..%2Fzookeeper/acquire?wait=0",
        "/v1/locks/billing-%2F%2E%2E/acquire?wait=0",
    ] {
        let method = if path.contains("acquire") { "POST" } else { "PUT" };
        let bearer = format!("Bearer {token}");
        let headers = [("Authorization", bearer.as_str()), ("Content-Type", "application/json")];
        raw_request(addr, method, path, &headers, br#"{"v":"overwritten"}"#)
            .await
            .assert_problem(StatusCode::BAD_REQUEST, None);
    }
    // Without the prefix at all: forbidden, even for names that look like ZooKeeper's own.
    for path in ["/v1/locks/zookeeper/acquire?wait=0", "/v1/kv/zookeeper/quota"] {
        let method = if path.contains("acquire") {
            Method::POST
        } else {
            Method::PUT
        };
        s.gate
            .call_as(billing, method, path, Some(json!({})))
            .await
            .assert_problem(StatusCode::FORBIDDEN, None);
    }
    // Not even an admin leaves the root.
    for path in [
        "/v1/kv/..%2F..%2Fzookeeper",
        "/v1/kv/%2Fzookeeper",
        "/v1/kv/../../zookeeper",
    ] {
        let bearer = format!("Bearer {}", s.tokens.ops);
        let headers = [("Authorization", bearer.as_str()), ("Content-Type", "application/json")];
        let reply = raw_request(addr, "PUT", path, &headers, br#"{"v":1}"#).await;
        assert!(
            reply.status == StatusCode::BAD_REQUEST || reply.status == StatusCode::NOT_FOUND,
            "{path}: {reply:?}"
        );
        assert_eq!(reply.content_type, "application/problem+json", "{path}: {reply:?}");
    }
    let offered = format!("zkgate, zkgate.bearer.{}", base64url(&s.tokens.ops));
    let mut ws = Ws::connect_with(s.gate.running.addr, "/v1/ws", &[("sec-websocket-protocol", &offered)])
        .await
        .expect("accepted");
    for (id, path) in [("a", "../zookeeper"), ("b", "/zookeeper"), ("c", "kv/../../zookeeper")] {
        ws.send(json!({"op": "subscribe", "id": id, "topic": {"znode": {"path": path}}}));
        let refused = ws.next_for(id).await;
        assert_eq!(refused["type"], "urn:zkgate:problem:invalid-topic", "{path}: {refused}");
    }

    let after = (tree(&zk, "/zookeeper").await, tree(&zk, "/zkgate/kv").await);
    assert_eq!(before, after, "nothing outside the grants was written");
    let kept = s.gate.call_as(ops, Method::GET, "/v1/kv/orders", None).await;
    assert_eq!(kept.body, json!({"v": "kept"}));
}

#[tokio::test]
async fn without_auth_config_everyone_may_do_everything() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let reply = gate.post("/v1/locks/orders/acquire?wait=0", None).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    // A token is ignored rather than refused.
    let reply = gate
        .call_as(Some("anything"), Method::GET, "/v1/locks/orders", None)
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
}

fn base64url(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text)
}

/// A socket's call that names another instance's lease acts as the principal of the socket's
/// handshake: an acquire is served where it arrives, a keepalive is forwarded to the lease's
/// keeper as an HTTP request would be; both are granted to the lease's principal and refused to
/// another principal's socket that borrows the lease.
#[tokio::test]
async fn a_socket_call_for_another_instances_lease_acts_as_the_sockets_principal() {
    let s = setup().await;
    let mut config = test_config(&s.connect);
    config.auth_config = Some(s._dir.path().join("auth.toml"));
    let other = Gate::start_with(config).await;
    let lease = s
        .gate
        .call_as(
            Some(&s.tokens.billing),
            Method::POST,
            "/v1/leases",
            Some(json!({"ttl": "30s"})),
        )
        .await
        .str("id");
    assert!(lease.starts_with(&*s.gate.running.state.instance.id), "{lease}");

    let as_billing = format!("zkgate, zkgate.bearer.{}", base64url(&s.tokens.billing));
    let mut ws = Ws::connect_with(other.running.addr, "/v1/ws", &[("sec-websocket-protocol", &as_billing)])
        .await
        .expect("accepted");
    let acquire = "/v1/locks/billing-fwd/acquire?wait=0";
    let reply = ws.call("a", "POST", acquire, Some(json!({"lease": lease}))).await;
    assert_eq!(reply["status"], 200, "{reply}");
    let handle = reply["body"]["handle"].as_str().expect("handle").to_string();
    assert!(
        handle.starts_with(&*other.running.state.instance.id),
        "served where it arrived: {handle}"
    );
    let keepalive = format!("/v1/leases/{lease}/keepalive");
    let kept = ws.call("k", "POST", &keepalive, None).await;
    assert_eq!(kept["status"], 200, "forwarded to its keeper as billing: {kept}");
    // Read through the other instance's socket, it is held.
    let read = ws
        .call("b", "GET", &format!("/v1/locks/billing-fwd/handles/{handle}"), None)
        .await;
    assert_eq!(
        (read["status"].as_u64(), read["body"]["state"].as_str()),
        (Some(200), Some("held")),
        "{read}"
    );

    let as_billing2 = format!("zkgate, zkgate.bearer.{}", base64url(&s.tokens.billing2));
    let mut stranger = Ws::connect_with(
        other.running.addr,
        "/v1/ws",
        &[("sec-websocket-protocol", &as_billing2)],
    )
    .await
    .expect("accepted");
    let reply = stranger.call("c", "POST", acquire, Some(json!({"lease": lease}))).await;
    assert_eq!(reply["status"], 403, "another principal's lease: {reply}");
    let reply = stranger.call("d", "POST", &keepalive, None).await;
    assert_eq!(
        reply["status"], 403,
        "another principal's lease, refused by its keeper: {reply}"
    );
}

#[tokio::test]
async fn probes_tell_their_details_to_an_admin_only() {
    let s = setup().await;
    for path in ["/healthz", "/readyz"] {
        for token in [None, Some("not-a-token"), Some(s.tokens.billing.as_str())] {
            let bare = s.gate.call_as(token, Method::GET, path, None).await;
            assert_eq!(bare.status, StatusCode::OK, "{bare:?}");
            assert_eq!(
                bare.body,
                json!({"status": "ok"}),
                "{path} tells {token:?} more: {bare:?}"
            );
        }
        let told = s.gate.call_as(Some(&s.tokens.ops), Method::GET, path, None).await;
        let servers = told.body["zookeeper"]["servers"].as_str().unwrap_or_default();
        assert!(s.connect.starts_with(servers) && !servers.is_empty(), "{told:?}");
    }
}
