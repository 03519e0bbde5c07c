//! The committed OpenAPI description is exactly what the code generates, and the server
//! serves it with Swagger UI (and the status page); without ZooKeeper the API answers 503
//! with `Retry-After`.

mod common;

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
        "openapi/openapi.json differs from the code: run `UPDATE_OPENAPI=1 cargo test --test openapi` and commit it"
    );
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
