//! Hostile input, generated: arbitrary methods, paths (the API's routes with hostile
//! parameters, and random ones), queries, headers and bodies at the HTTP router, and arbitrary
//! frames at the socket. Whatever comes, zkgate answers (it never panics: a panicking handler
//! would drop the connection), never with a 5xx, and what ZooKeeper holds is not lost or
//! changed: with a read-only caller the whole tree stays as it was; with a writer confined to
//! `fz` names, everything stored before stays byte for byte.
//!
//! proptest shrinks a failing case to a small one and prints it.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{ADMIN, Gate, auth_config, grant, test_config, tree, zk_client};
use futures::{SinkExt, StreamExt};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

/// One generated request.
#[derive(Debug, Clone)]
struct Request {
    method: String,
    path: String,
    query: Vec<(String, String)>,
    headers: Vec<(String, String)>,
    body: Option<Vec<u8>>,
}

/// The API's operations, from the spec: method, route template, and the example body if it
/// documents one (mutated below, so that cases get past the first check of a handler).
fn operations() -> Vec<(String, String, Option<Value>)> {
    let spec = serde_json::to_value(zkgate::openapi()).expect("spec");
    let mut operations = Vec::new();
    for (path, item) in spec["paths"].as_object().expect("paths") {
        for (method, operation) in item.as_object().expect("operations") {
            let example = common::examples(&operation["requestBody"]).into_iter().next();
            operations.push((method.to_uppercase(), path.clone(), example));
        }
    }
    operations
}

/// An example body with one field replaced by anything, one dropped, or as it is.
fn mutated(example: Value) -> impl Strategy<Value = Option<Vec<u8>>> {
    let keys: Vec<String> = example
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    let keys = if keys.is_empty() { vec![String::new()] } else { keys };
    (prop::sample::select(keys), json_value(), 0..3u8).prop_map(move |(key, value, how)| {
        let mut body = example.clone();
        if let Some(object) = body.as_object_mut() {
            match how {
                0 => {
                    object.insert(key, value);
                }
                1 => {
                    object.remove(&key);
                }
                _ => {}
            }
        }
        Some(body.to_string().into_bytes())
    })
}

/// A path segment: a name the writer may use (`fz…`), or something hostile.
fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        16 => "fz[a-z0-9-]{0,6}",
        1 => Just(String::new()),
        1 => Just(".".to_string()),
        1 => Just("..".to_string()),
        1 => Just("fz%2Fx".to_string()),
        1 => Just("%2E%2E".to_string()),
        1 => Just("%00".to_string()),
        1 => Just("%FF%FE".to_string()),
        1 => Just("fz%0Aforged".to_string()),
        1 => Just("zookeeper".to_string()),
        1 => Just("_c_fz-lock-0000000001".to_string()),
        1 => Just("deadbeef-0123456789abcdef0123456789abcdef".to_string()),
        1 => Just("a".repeat(300)),
        1 => Just("%C3%BC".to_string()),
        1 => "[ -~]{0,12}".prop_map(|s| percent(&s)),
    ]
}

fn percent(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC).to_string()
}

fn query() -> impl Strategy<Value = (String, String)> {
    let key = prop_oneof![
        Just("wait"),
        Just("ttl"),
        Just("ack_deadline"),
        Just("permits"),
        Just("mode"),
        Just("limit"),
        Just("after"),
        Just("priority"),
        Just("recursive"),
        Just("zz"),
    ];
    let value = prop_oneof![
        Just(String::new()),
        Just("0".to_string()),
        Just("-1".to_string()),
        Just("1ms".to_string()),
        Just("1s".to_string()),
        Just("99999999999h".to_string()),
        Just("18446744073709551616".to_string()),
        Just("1e309".to_string()),
        Just("%ZZ".to_string()),
        Just("write".to_string()),
        Just("true".to_string()),
        "[ -~]{0,10}".prop_map(|s| percent(&s)),
    ];
    (key.prop_map(str::to_string), value)
}

fn header() -> impl Strategy<Value = (String, String)> {
    prop_oneof![
        Just(("if-match".to_string(), "\"garbage\"".to_string())),
        Just(("if-none-match".to_string(), "*".to_string())),
        Just(("if-none-match".to_string(), "\"1-2-3\"".to_string())),
        Just(("idempotency-key".to_string(), "k".repeat(500))),
        Just(("idempotency-key".to_string(), "fz-key".to_string())),
        Just(("content-type".to_string(), "application/json".to_string())),
        Just(("content-type".to_string(), "text/plain".to_string())),
        Just(("content-type".to_string(), "application/octet-stream".to_string())),
        Just((
            "content-type".to_string(),
            "multipart/form-data; boundary=x".to_string()
        )),
        Just(("origin".to_string(), "http://evil.example".to_string())),
        Just(("zkgate-forwarded-by".to_string(), "0000000a".to_string())),
        Just(("zkgate-forwarded-for".to_string(), "admin".to_string())),
        Just(("accept".to_string(), "text/event-stream".to_string())),
        ("[a-z-]{1,12}", "[ -~]{0,20}"),
    ]
}

/// A JSON value, nested a little.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "fz[a-z0-9-]{0,6}".prop_map(Value::from),
        "[ -~]{0,16}".prop_map(Value::from),
        Just(Value::from("99999999999h")),
        Just(Value::from("0s")),
        Just(Value::from("commit")),
        Just(Value::from("deadbeef-0123456789abcdef0123456789abcdef")),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-z_]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A body object with the fields zkgate's bodies have, holding anything.
fn fields() -> impl Strategy<Value = Value> {
    let names = [
        "lease",
        "ttl",
        "value",
        "data",
        "participants",
        "size",
        "vote",
        "id",
        "handle",
        "by",
        "reason",
        "deadline",
        "participant",
        "payload",
        "grace",
        "priority",
        "mode",
        "permits",
    ];
    prop::collection::btree_map(prop::sample::select(names.to_vec()), json_value(), 0..5)
        .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_string(), v)).collect()))
}

fn body() -> impl Strategy<Value = Option<Vec<u8>>> {
    prop_oneof![
        2 => Just(None),
        3 => fields().prop_map(|v| Some(v.to_string().into_bytes())),
        1 => json_value().prop_map(|v| Some(v.to_string().into_bytes())),
        1 => prop::collection::vec(any::<u8>(), 0..64).prop_map(Some),
        1 => Just(Some(b"{\"value\":".to_vec())),
    ]
}

fn request(operations: Vec<(String, String, Option<Value>)>) -> impl Strategy<Value = Request> {
    let other_method = prop_oneof![
        Just("GET"),
        Just("POST"),
        Just("PUT"),
        Just("DELETE"),
        Just("PATCH"),
        Just("HEAD"),
        Just("OPTIONS"),
        Just("FROB"),
    ];
    let operation = prop::sample::select(operations).prop_flat_map(move |(method, template, example)| {
        let method = prop_oneof![6 => Just(method), 1 => other_method.clone().prop_map(str::to_string)];
        let path = prop::collection::vec(segment(), 4).prop_map(move |s| fill(&template, &s));
        let body = match example {
            Some(example) => prop_oneof![3 => mutated(example), 1 => body()].boxed(),
            None => body().boxed(),
        };
        (method, path, body)
    });
    let random = (
        Just("GET".to_string()),
        prop_oneof![
            "/[ -~]{0,24}".prop_map(|p| p.replace(['?', '#', ' '], "_")),
            Just("/v1/kv/fz/%2E%2E/%2E%2E/zookeeper".to_string()),
        ],
        body(),
    );
    (
        prop_oneof![8 => operation, 1 => random],
        prop::collection::vec(query(), 0..3),
        prop::collection::vec(header(), 0..3),
    )
        .prop_map(|((method, path, body), query, headers)| Request {
            method,
            path,
            query,
            headers,
            body,
        })
}

/// `template` with its `{…}` parameters replaced, in order, by `segments`.
fn fill(template: &str, segments: &[String]) -> String {
    let mut out = String::new();
    let mut rest = template;
    let mut next = segments.iter().cycle();
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let end = rest[start..].find('}').map_or(rest.len(), |e| start + e + 1);
        out.push_str(next.next().map_or("x", String::as_str));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// Sends `request` as `token`; the status, or a failure if no answer came.
async fn send(gate: &Gate, token: Option<&str>, request: &Request) -> Result<StatusCode, TestCaseError> {
    let mut url = format!("{}{}", gate.url, request.path);
    if !request.query.is_empty() {
        let query: Vec<String> = request.query.iter().map(|(k, v)| format!("{k}={v}")).collect();
        url = format!("{url}?{}", query.join("&"));
    }
    let method = Method::from_bytes(request.method.as_bytes()).expect("method");
    let mut builder = gate.http.request(method, &url).timeout(Duration::from_secs(15));
    for (name, value) in &request.headers {
        builder = builder.header(name.as_str(), value.as_str());
    }
    if let Some(token) = token {
        builder = builder.bearer_auth(token);
    }
    if let Some(body) = &request.body {
        builder = builder.body(body.clone());
    }
    match builder.send().await {
        Ok(response) => Ok(response.status()),
        // A URL reqwest itself refuses to send is no test of zkgate.
        Err(err) if err.is_builder() => Ok(StatusCode::BAD_REQUEST),
        Err(err) => Err(TestCaseError::fail(format!("no answer: {err}"))),
    }
}

struct Setup {
    _zk: zkgate::zk::server::ZooKeeperServer,
    _dir: tempfile::TempDir,
    gate: Gate,
    connect: String,
    reader: String,
    writer: String,
}

async fn setup() -> Setup {
    // ZooKeeper's own removal of emptied containers (a semaphore's `locks` after its first
    // permit) would change the tree under the comparisons below: at its stock pace here.
    let options = zkgate::zk::server::ServerOptions {
        container_check_interval: std::time::Duration::from_secs(60),
        ..common::test_server_options()
    };
    let zk = zkgate::zk::server::ZooKeeperServer::start_standalone(&options)
        .await
        .expect("ZooKeeper");
    let dir = tempfile::tempdir().expect("temp dir");
    let (path, [reader, writer, ops]) = auth_config(
        &dir,
        [
            ("reader", grant("", "read")),
            ("fuzzer", grant("fz", "write")),
            ("ops", ADMIN.to_string()),
        ],
    );
    let mut config = test_config(&zk.connect_string());
    config.auth_config = Some(path);
    // Any long poll a case happens to make ends soon.
    config.max_wait = Duration::from_secs(1);
    let gate = Gate::start_with(config).await;
    // Something of every kind stored before, by the admin, outside the writer's names.
    for (method, path, body) in [
        (Method::PUT, "/v1/kv/keep/a", json!({"value": {"n": 1}})),
        (Method::POST, "/v1/queues/keep-q/items", json!({"job": 1})),
        (
            Method::POST,
            "/v1/locks/keep-lock/acquire?wait=0",
            json!({"ttl": "10m"}),
        ),
        (
            Method::POST,
            "/v1/elections/keep-el/campaign?wait=0",
            json!({"ttl": "10m", "value": "me"}),
        ),
        (
            Method::PUT,
            "/v1/groups/keep-g/members/m1",
            json!({"ttl": "10m", "data": {"port": 1}}),
        ),
        (Method::PUT, "/v1/barriers/keep-b", json!({"ttl": "10m"})),
        (
            Method::POST,
            "/v1/txns",
            json!({"id": "keep-t", "participants": ["p"], "deadline": "10m"}),
        ),
        (
            Method::POST,
            "/v1/semaphores/keep-s/acquire?permits=2&wait=0",
            json!({"ttl": "10m"}),
        ),
    ] {
        let reply = gate.call_as(Some(&ops), method, path, Some(body)).await;
        assert!(reply.status.is_success(), "seeding {path}: {reply:?}");
    }
    Setup {
        connect: zk.connect_string(),
        _zk: zk,
        _dir: dir,
        gate,
        reader,
        writer,
    }
}

async fn snapshot(connect: &str) -> BTreeMap<String, Vec<u8>> {
    let client = zk_client(connect).await;
    tree(&client, "/zkgate").await
}

/// Runs `cases` generated requests as each of `tokens`, failing on a missing answer or a 5xx.
fn fuzz_http(rt: &tokio::runtime::Runtime, s: &Setup, tokens: &[Option<&str>], cases: u32, seed: u8) {
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        },
        proptest::test_runner::TestRng::from_seed(proptest::test_runner::RngAlgorithm::ChaCha, &[seed; 32]),
    );
    runner
        .run(&request(operations()), |request| {
            for token in tokens {
                let status = rt.block_on(send(&s.gate, *token, &request))?;
                prop_assert!(!status.is_server_error(), "{status} for {request:?}");
            }
            Ok(())
        })
        .unwrap_or_else(|failure| panic!("{failure}"));
}

#[test]
fn hostile_requests_get_a_4xx_and_change_nothing_they_may_not() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let s = rt.block_on(setup());
    let before = rt.block_on(snapshot(&s.connect));

    // No token, a wrong one, and a reader: nothing in ZooKeeper changes at all.
    fuzz_http(&rt, &s, &[None, Some("not-a-token"), Some(&s.reader)], 300, 1);
    let after = rt.block_on(snapshot(&s.connect));
    assert_eq!(before, after, "the tree changed under read-only callers");

    // A writer of `fz` names: whatever it does, what was stored before is still there, as it was.
    fuzz_http(&rt, &s, &[Some(&s.writer)], 600, 2);
    let after = rt.block_on(snapshot(&s.connect));
    for (path, data) in &before {
        assert_eq!(after.get(path), Some(data), "{path} was lost or changed by the fuzzer");
    }
    let healthy = rt.block_on(s.gate.get("/readyz"));
    assert_eq!(healthy.status, StatusCode::OK, "{healthy:?}");
}

/// A socket message: text that is JSON of the socket's ops with anything in them, any text, or
/// binary.
fn frame() -> impl Strategy<Value = Message> {
    let op = prop::sample::select(vec!["subscribe", "unsubscribe", "call", "lease", "frob"]);
    let topic = prop_oneof![
        json_value(),
        (
            prop::sample::select(vec!["lock", "queue", "znode", "lease", "kv", "election"]),
            segment()
        )
            .prop_map(|(kind, name)| json!({ kind: name })),
    ];
    let extra = prop_oneof![3 => Just(json!({})), 1 => fields()];
    let structured = (op, "[a-z0-9]{0,4}", extra, topic, segment(), any::<bool>()).prop_map(
        |(op, id, mut fields, topic, name, header)| {
            fields["op"] = op.into();
            fields["id"] = id.into();
            match op {
                "subscribe" => fields["topic"] = topic,
                "call" => {
                    fields["method"] = "POST".into();
                    fields["path"] = format!("/v1/locks/{name}/acquire?wait=0").into();
                    if header {
                        fields["headers"] = json!({"zkgate-forwarded-for": "ops", "authorization": "Bearer x"});
                    }
                }
                _ => {}
            }
            Message::text(fields.to_string())
        },
    );
    prop_oneof![
        6 => structured,
        1 => "[ -~]{0,40}".prop_map(Message::text),
        1 => prop::collection::vec(any::<u8>(), 0..40).prop_map(Message::binary),
    ]
}

#[test]
fn hostile_socket_frames_get_errors_not_a_crash() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let s = rt.block_on(setup());
    let before = rt.block_on(snapshot(&s.connect));
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases: 60,
            failure_persistence: None,
            ..Config::default()
        },
        proptest::test_runner::TestRng::from_seed(proptest::test_runner::RngAlgorithm::ChaCha, &[3; 32]),
    );
    let addr = s.gate.running.addr;
    let reader = s.reader.clone();
    runner
        .run(&prop::collection::vec(frame(), 1..12), |frames| {
            rt.block_on(async {
                use base64::Engine;
                let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&reader);
                let mut request = tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
                    format!("ws://{addr}/v1/ws"),
                )
                .expect("request");
                request.headers_mut().insert(
                    "sec-websocket-protocol",
                    format!("zkgate, zkgate.bearer.{token}").parse().expect("header"),
                );
                let (mut socket, _) = tokio_tungstenite::connect_async(request).await.expect("handshake");
                for frame in &frames {
                    if socket.send(frame.clone()).await.is_err() {
                        break;
                    }
                }
                // A message of our own last: its answer shows every frame before it was handled.
                let marker = json!({"op": "unsubscribe", "id": "end-marker"}).to_string();
                let _ = socket.send(Message::text(marker)).await;
                let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
                loop {
                    let next = tokio::time::timeout_at(deadline, socket.next()).await;
                    match next {
                        Err(_) => return Err(TestCaseError::fail(format!("no answer to the marker for {frames:?}"))),
                        Ok(None) | Ok(Some(Err(_))) => return Ok(()), // closed (e.g. a binary frame): allowed
                        Ok(Some(Ok(Message::Close(Some(close))))) => {
                            let code = u16::from(close.code);
                            prop_assert!(code != 1011, "closed as an internal error for {frames:?}");
                            return Ok(());
                        }
                        Ok(Some(Ok(Message::Text(text)))) => {
                            let value: Value = serde_json::from_str(&text).expect("JSON from zkgate");
                            if let Some(kind) = value["type"].as_str() {
                                prop_assert!(!kind.ends_with(":internal"), "{value} for {frames:?}");
                            }
                            if value["id"] == "end-marker" {
                                return Ok(());
                            }
                        }
                        Ok(Some(Ok(_))) => {}
                    }
                }
            })
        })
        .unwrap_or_else(|failure| panic!("{failure}"));
    let after = rt.block_on(snapshot(&s.connect));
    assert_eq!(before, after, "the tree changed under a read-only socket");
    let healthy = rt.block_on(s.gate.get("/readyz"));
    assert_eq!(healthy.status, StatusCode::OK, "{healthy:?}");
}
