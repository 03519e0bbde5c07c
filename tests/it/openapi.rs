//! The committed OpenAPI description is exactly what the code generates, and the server
//! serves it with Swagger UI (and the status page); without ZooKeeper the API answers 503
//! with `Retry-After`.

use crate::common;

use std::time::Duration;

use common::Reply;
use reqwest::StatusCode;
use zkgate::zk::server::free_port;

const SPEC_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json");

fn generated() -> String {
    zkgate::openapi().to_pretty_json().expect("spec serializes") + "\n"
}

#[test]
fn committed_spec_matches_the_code() {
    if std::env::var_os("UPDATE_OPENAPI").is_some() {
        std::fs::write(SPEC_PATH, generated()).expect("write spec");
    }
    let committed = std::fs::read_to_string(SPEC_PATH).unwrap_or_default();
    assert!(
        committed == generated(),
        "openapi/openapi.json differs from the code: run `UPDATE_OPENAPI=1 cargo test --test it openapi::` and commit it"
    );
}

/// What OpenAPI requires of every document and client generators refuse without: a description
/// on every response, every `$ref` pointing at a component that exists, every `operationId`
/// once. (Issue 32: the generators stopped on 37 responses without one, a dangling
/// `Strategy` and seven operation ids used twice.)
#[test]
fn every_response_is_described_every_reference_resolves_and_every_operation_id_is_unique() {
    let spec: serde_json::Value = serde_json::from_str(&generated()).expect("json");
    let mut wrong = Vec::new();
    let mut ids = std::collections::BTreeMap::<String, Vec<String>>::new();
    for (path, item) in spec["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("path item") {
            let Some(responses) = op.get("responses").and_then(|r| r.as_object()) else {
                continue;
            };
            let id = op["operationId"].as_str().unwrap_or_default().to_string();
            ids.entry(id).or_default().push(format!("{method} {path}"));
            for (status, response) in responses {
                let described = response["description"].as_str().is_some_and(|d| !d.trim().is_empty());
                if response.get("$ref").is_none() && !described {
                    wrong.push(format!("{method} {path} {status}: no description"));
                }
            }
        }
    }
    for (id, uses) in &ids {
        if id.is_empty() || uses.len() > 1 {
            wrong.push(format!("operationId `{id}` on {}", uses.join(", ")));
        }
    }
    fn refs(value: &serde_json::Value, out: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(map) => {
                if let Some(target) = map.get("$ref").and_then(|r| r.as_str()) {
                    out.push(target.to_string());
                }
                map.values().for_each(|v| refs(v, out));
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }
    let mut targets = Vec::new();
    refs(&spec, &mut targets);
    for target in targets {
        let pointer = target.trim_start_matches('#');
        if spec.pointer(pointer).is_none() {
            wrong.push(format!("`$ref` to {target}, which is not there"));
        }
    }
    assert!(wrong.is_empty(), "the spec is not valid OpenAPI:\n{}", wrong.join("\n"));
}

/// Generators name what they make for an operation after its operationId (orval's axios client
/// `AddResult` for the response of `add`, its `...Params` for the query; openapi-generator's
/// `...Request` for the parameters): no such name may be a schema's, or the generated code
/// declares it twice.
#[test]
fn no_operation_id_names_a_schema_as_generators_derive_names() {
    let spec: serde_json::Value = serde_json::from_str(&generated()).expect("json");
    let schemas = spec["components"]["schemas"].as_object().expect("schemas");
    let pascal = |id: &str| -> String {
        id.split(['_', '-'])
            .map(|w| {
                let mut c = w.chars();
                c.next()
                    .map(|f| f.to_uppercase().chain(c).collect::<String>())
                    .unwrap_or_default()
            })
            .collect()
    };
    let mut wrong = Vec::new();
    for item in spec["paths"].as_object().expect("paths").values() {
        for op in item.as_object().expect("path item").values() {
            let Some(id) = op.get("operationId").and_then(|i| i.as_str()) else {
                continue;
            };
            for suffix in ["Result", "Params", "Request", "Response", "Query", "Mutation"] {
                let derived = format!("{}{suffix}", pascal(id));
                if schemas.contains_key(&derived) {
                    wrong.push(format!("operationId `{id}` makes `{derived}`, a schema's name"));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[tokio::test]
async fn serves_the_spec_and_docs_and_answers_503_without_zookeeper() {
    // Nothing listens on this port: ZooKeeper is unreachable for the whole test.
    let nowhere = format!("127.0.0.1:{}", free_port().expect("port"));
    let running = zkgate::start(common::test_config(&nowhere)).await.expect("start");
    let http = common::http_client();
    let url = running.url();
    let get = |path: &str| http.get(format!("{url}{path}")).timeout(Duration::from_secs(10)).send();

    let spec: serde_json::Value = get("/openapi.json").await.expect("spec").json().await.expect("json");
    assert_eq!(
        spec,
        serde_json::from_str::<serde_json::Value>(&generated()).expect("generated spec")
    );
    let docs = get("/docs/").await.expect("docs");
    assert_eq!(docs.status(), StatusCode::OK);
    assert!(docs.text().await.expect("html").contains("swagger"), "Swagger UI page");

    let page = get("/").await.expect("status page");
    assert_eq!(page.status(), StatusCode::OK);
    assert!(
        page.headers()["content-type"]
            .to_str()
            .expect("ascii")
            .starts_with("text/html")
    );
    let page = page.text().await.expect("html");
    assert!(page.contains("<title>zkgate</title>"));
    // No references to other hosts (the browser test also checks every request it makes).
    for load in [
        "src=\"http",
        "src=\"//",
        "href=\"http",
        "href=\"//",
        "url(http",
        "url(//",
        "@import",
    ] {
        assert!(!page.contains(load), "the page loads nothing from elsewhere: {load}");
    }

    assert_eq!(get("/healthz").await.expect("healthz").status(), StatusCode::OK);
    for (method, path) in [
        ("GET", "/readyz"),
        ("POST", "/v1/leases"),
        ("POST", "/v1/locks/x/acquire?wait=0"),
        ("GET", "/v1/locks/x"),
        ("GET", "/v1/locks"),
    ] {
        let request = http.request(method.parse().expect("method"), format!("{url}{path}"));
        let response = request.timeout(Duration::from_secs(10)).send().await.expect("request");
        let retry_after = response.headers().get("retry-after").cloned();
        let reply = Reply::read(response).await;
        reply.assert_problem(StatusCode::SERVICE_UNAVAILABLE, None);
        assert_eq!(
            reply.body["type"], "urn:zkgate:problem:zookeeper-unavailable",
            "{method} {path}"
        );
        assert!(retry_after.is_some(), "{method} {path} has Retry-After");
    }
    running.stop().await.expect("stop");
}

/// The spec's lists of kinds come from the registry: the socket and the event stream name every
/// kind's topic, and a lease's holdings allow every kind's name (hand lists here missed the
/// semaphores, counters and services added later).
#[test]
fn the_spec_lists_every_kind_from_the_registry() {
    use zkgate::kind::Kind;
    let spec: serde_json::Value = serde_json::from_str(&generated()).expect("json");
    let description = |path: &str| {
        spec["paths"][path]["get"]["description"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let (socket, stream) = (description("/v1/ws"), description("/v1/events"));
    let kinds: Vec<&str> = spec["components"]["schemas"]["HoldingView"]["properties"]["kind"]["enum"]
        .as_array()
        .expect("a holding's kind is an enum")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    for kind in Kind::ALL {
        assert!(
            kinds.contains(&kind.name()),
            "a holding's kind may be `{}`",
            kind.name()
        );
        let Some(topic) = kind.topic() else { continue };
        assert!(
            socket.contains(&format!("`{{\"{topic}\":\"NAME\"}}`")),
            "/v1/ws names `{topic}`:\n{socket}"
        );
        assert!(
            stream.contains(&format!("`{topic}:NAME`")),
            "/v1/events names `{topic}`:\n{stream}"
        );
    }
    assert_eq!(kinds.len(), Kind::ALL.len());
}

/// The README's lists of kinds (the topics of the event streams and of the socket, the kinds
/// a grant names) name every kind of the registry.
#[test]
fn the_readme_lists_every_kind() {
    use zkgate::kind::Kind;
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README");
    // A paragraph: from the line that starts with `start` to the next blank line.
    let paragraph = |start: &str| -> String {
        let at = readme.find(start).unwrap_or_else(|| panic!("README has `{start}`"));
        readme[at..].split("\n\n").next().unwrap_or_default().to_string()
    };
    let stream_topics = paragraph("Topics are `lock:`");
    let grants = paragraph("[[principals.grants]]");
    for kind in Kind::ALL {
        let words = grants.split(|c: char| !(c.is_alphanumeric() || c == '-'));
        assert!(
            words.into_iter().any(|w| w == kind.auth()),
            "the grant example's comment names `{}`:\n{grants}",
            kind.auth()
        );
        let Some(topic) = kind.topic() else { continue };
        assert!(
            stream_topics.contains(&format!("`{topic}:`")),
            "the SSE topics name `{topic}:`"
        );
        assert!(
            readme.contains(&format!("\n| `{{\"{topic}\":")),
            "the socket's topic table has a row for `{topic}`"
        );
    }
}

/// The dashboard has a section for every kind with a topic (kv has none: its keys are followed
/// as znodes), named by the kind's segment as the summaries are.
#[test]
fn the_dashboard_has_a_section_for_every_kind_with_a_topic() {
    use zkgate::kind::Kind;
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/web/index.html")).expect("page");
    for kind in Kind::ALL.into_iter().filter(|k| k.topic().is_some()) {
        assert!(
            page.contains(&format!("data-kind=\"{}\"", kind.segment())),
            "the dashboard shows `{}`",
            kind.segment()
        );
    }
}
