//! Browsers on other sites: a page elsewhere cannot make a visitor's browser change anything in
//! zkgate (POST, socket) unless its origin is allowed, and allowed origins get CORS.

use crate::common;

use common::ws::Ws;
use common::{Gate, test_config, zookeeper};
use reqwest::StatusCode;

async fn post_from(gate: &Gate, origin: Option<&str>, path: &str) -> reqwest::Response {
    let mut request = gate.http.post(format!("{}{path}", gate.url));
    if let Some(origin) = origin {
        request = request.header("origin", origin);
    }
    request.send().await.expect("request")
}

#[tokio::test]
async fn pages_on_other_origins_cannot_change_anything_or_open_sockets() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let own = format!("http://{}", gate.running.addr);

    let refused = post_from(&gate, Some("https://evil.example"), "/v1/locks/l/acquire?wait=0").await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    let problem: serde_json::Value = refused.json().await.expect("json");
    assert_eq!(problem["type"], "urn:zkgate:problem:forbidden");
    assert!(
        problem["detail"].as_str().is_some_and(|d| d.contains("evil.example")),
        "{problem}"
    );
    let state = gate.get("/v1/locks/l").await;
    assert!(state.body["holder"].is_null(), "nothing was taken: {state:?}");

    // The page's own origin (the dashboard) and clients that send no Origin are served.
    assert_eq!(
        post_from(&gate, Some(&own), "/v1/locks/l/acquire?wait=0")
            .await
            .status(),
        StatusCode::OK
    );
    assert_eq!(
        post_from(&gate, None, "/v1/locks/m/acquire?wait=0").await.status(),
        StatusCode::OK
    );
    // A read from elsewhere is answered, but without CORS headers the page cannot see it.
    let read = gate
        .http
        .get(format!("{}/v1/locks/l", gate.url))
        .header("origin", "https://evil.example")
        .send()
        .await
        .expect("request");
    assert_eq!(read.status(), StatusCode::OK);
    assert!(!read.headers().contains_key("access-control-allow-origin"));

    let addr = gate.running.addr;
    match Ws::connect_with(addr, "/v1/ws", &[("origin", "https://evil.example")]).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => assert_eq!(response.status().as_u16(), 403),
        Err(other) => panic!("unexpected error {other}"),
        Ok(_) => panic!("a socket from another site's page was accepted"),
    }
    assert!(Ws::connect_with(addr, "/v1/ws", &[("origin", &own)]).await.is_ok());
}

#[tokio::test]
async fn allowed_origins_get_cors_and_others_do_not() {
    let zk = zookeeper().await;
    let mut config = test_config(&zk.connect_string());
    config.cors_origin = vec!["https://app.example".into()];
    let gate = Gate::start_with(config).await;

    let preflight = |origin: &'static str| {
        gate.http
            .request(reqwest::Method::OPTIONS, format!("{}/v1/locks/l/acquire", gate.url))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header("access-control-request-headers", "authorization,content-type")
            .send()
    };
    let allowed = preflight("https://app.example").await.expect("preflight");
    assert!(allowed.status().is_success(), "{}", allowed.status());
    let headers = allowed.headers();
    assert_eq!(headers["access-control-allow-origin"], "https://app.example");
    let allow_headers = headers["access-control-allow-headers"]
        .to_str()
        .expect("ascii")
        .to_lowercase();
    assert!(
        allow_headers.contains("authorization") && allow_headers.contains("content-type"),
        "{allow_headers}"
    );
    assert!(
        headers["access-control-allow-methods"]
            .to_str()
            .expect("ascii")
            .contains("POST")
    );

    let other = preflight("https://evil.example").await.expect("preflight");
    assert!(!other.headers().contains_key("access-control-allow-origin"));

    let posted = post_from(&gate, Some("https://app.example"), "/v1/locks/l/acquire?wait=0").await;
    assert_eq!(posted.status(), StatusCode::OK);
    assert_eq!(posted.headers()["access-control-allow-origin"], "https://app.example");
    let exposed = posted.headers()["access-control-expose-headers"]
        .to_str()
        .expect("ascii")
        .to_lowercase();
    assert!(exposed.contains("retry-after") && exposed.contains("etag"), "{exposed}");
    assert!(
        Ws::connect_with(gate.running.addr, "/v1/ws", &[("origin", "https://app.example")])
            .await
            .is_ok()
    );
    assert_eq!(
        post_from(&gate, Some("https://evil.example"), "/v1/locks/n/acquire?wait=0")
            .await
            .status(),
        StatusCode::FORBIDDEN
    );
}
