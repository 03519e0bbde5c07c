//! Paged lists: `limit` and `cursor`, and the `Link` header to the next page. A client that
//! follows the links sees every entry once and in order, even while entries come and go; the
//! default page is bounded.

use crate::common;

use common::{Gate, zookeeper};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// `GET url`: the status, the body and the next page's URL (from `Link`), if any.
async fn page(gate: &Gate, url: &str) -> (StatusCode, Value, Option<String>) {
    let response = gate.http.get(format!("{}{url}", gate.url)).send().await.expect("list");
    let status = response.status();
    let next = response
        .headers()
        .get(reqwest::header::LINK)
        .and_then(|v| v.to_str().ok())
        .map(|link| {
            assert!(link.ends_with("; rel=\"next\""), "{link}");
            link.trim_start_matches('<').split('>').next().expect("url").to_string()
        });
    let body = response.json().await.unwrap_or(Value::Null);
    (status, body, next)
}

async fn put_key(gate: &Gate, key: &str) {
    let response = gate
        .http
        .put(format!("{}/v1/kv/{key}", gate.url))
        .header("Content-Type", "text/plain")
        .body("v")
        .send()
        .await
        .expect("put");
    assert_eq!(response.status(), StatusCode::CREATED, "{key}");
}

#[tokio::test]
async fn following_the_links_lists_every_key_once_in_order_while_keys_come_and_go() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    for n in 0..25 {
        put_key(&gate, &format!("pages/k{n:02}")).await;
    }
    let mut seen = Vec::new();
    let mut url = "/v1/kv?prefix=pages&limit=10".to_string();
    let mut pages = 0;
    loop {
        let (status, body, next) = page(&gate, &url).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["prefix"], "pages");
        let keys: Vec<String> = serde_json::from_value(body["keys"].clone()).expect("keys");
        assert!(keys.len() <= 10, "{keys:?}");
        seen.extend(keys);
        pages += 1;
        if pages == 1 {
            // Between the pages: one key before the cursor goes and one comes, one after comes.
            let deleted = gate.delete("/v1/kv/pages/k03").await;
            assert_eq!(deleted.status, StatusCode::NO_CONTENT);
            put_key(&gate, "pages/k035").await;
            put_key(&gate, "pages/k175").await;
        }
        match next {
            Some(next) => url = next,
            None => break,
        }
    }
    let mut expected: Vec<String> = (0..25).map(|n| format!("k{n:02}")).collect();
    expected.insert(18, "k175".into());
    assert_eq!(seen, expected, "the first page's keys, then what came after the cursor");
    assert_eq!(pages, 3);
}

#[tokio::test]
async fn every_list_pages_and_the_default_page_is_bounded() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    // Leases, oldest first: pages of 4 give them back in the order they were made.
    let mut made = Vec::new();
    for _ in 0..10 {
        made.push(gate.lease("1m").await);
    }
    let mut listed = Vec::new();
    let mut url = Some("/v1/leases?limit=4".to_string());
    while let Some(at) = url {
        let (status, body, next) = page(&gate, &at).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        listed.extend(
            body.as_array()
                .expect("leases")
                .iter()
                .map(|l| l["id"].as_str().expect("id").to_string()),
        );
        url = next;
    }
    assert_eq!(listed, made);

    // Locks (as every kind's list): held by one lease, listed two by two.
    let lease = &made[0];
    for name in ["la", "lb", "lc", "ld", "le"] {
        let granted = gate
            .post(
                &format!("/v1/locks/{name}/acquire?wait=0"),
                Some(json!({ "lease": lease })),
            )
            .await;
        assert_eq!(granted.status, StatusCode::OK, "{granted:?}");
    }
    let (_, first, next) = page(&gate, "/v1/locks?limit=2").await;
    let names = |body: &Value| -> Vec<String> {
        body.as_array()
            .expect("list")
            .iter()
            .map(|l| l["name"].as_str().expect("name").to_string())
            .collect()
    };
    assert_eq!(names(&first), ["la", "lb"]);
    let (_, second, _) = page(&gate, &next.expect("a next page")).await;
    assert_eq!(names(&second), ["lc", "ld"]);

    // Without a limit, at most 1,000 keys and a link to the rest.
    for n in 0..1001 {
        put_key(&gate, &format!("many/k{n:04}")).await;
    }
    let (_, body, next) = page(&gate, "/v1/kv?prefix=many").await;
    assert_eq!(body["keys"].as_array().map(Vec::len), Some(1000));
    let (_, rest, last) = page(&gate, &next.expect("a link to the rest")).await;
    assert_eq!(rest["keys"], json!(["k1000"]));
    assert!(last.is_none(), "no link after the last page");

    // Limits and cursors the lists did not give are refused, naming the parameter.
    for url in [
        "/v1/kv?limit=0",
        "/v1/locks?limit=10001",
        "/v1/leases?limit=many",
        "/v1/groups?cursor=not-hex",
        "/v1/queues?cursor=abc",
    ] {
        let (status, body, _) = page(&gate, url).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{url}: {body}");
        let field = if url.contains("limit") { "limit" } else { "cursor" };
        assert_eq!(body["field"], field, "{url}: {body}");
    }
}

#[tokio::test]
async fn a_queues_items_page_in_the_order_they_will_be_taken() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    // Priorities put out of order: the pages follow (priority, then put order).
    for (n, priority) in [(0, 50), (1, 10), (2, 50), (3, 90), (4, 10), (5, 50), (6, 10)] {
        let put = gate
            .post(
                &format!("/v1/queues/paged/items?priority={priority}"),
                Some(json!({ "n": n })),
            )
            .await;
        assert_eq!(put.status, StatusCode::CREATED, "{put:?}");
    }
    let mut seen = Vec::new();
    let mut url = Some("/v1/queues/paged/items?limit=3".to_string());
    while let Some(at) = url {
        let (status, body, next) = page(&gate, &at).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let items = body.as_array().expect("items");
        assert!(items.len() <= 3);
        seen.extend(items.iter().map(|i| i["body"]["n"].as_u64().expect("n")));
        url = next;
    }
    assert_eq!(seen, [1, 4, 6, 0, 2, 5, 3]);
    let (status, body, _) = page(&gate, "/v1/queues/paged/items?limit=1001").await;
    assert_eq!(
        (status, body["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("limit"))
    );
}

/// Every list that takes a `cursor` says in the spec that its answer may carry a `Link` to the
/// next page (so that generated clients expose it), and no other operation claims one.
#[test]
fn the_spec_declares_the_link_of_every_paged_list() {
    let spec: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json")).expect("the spec"),
    )
    .expect("JSON");
    let mut paged = 0;
    for (path, operations) in spec["paths"].as_object().expect("paths") {
        for (method, operation) in operations.as_object().expect("operations") {
            let takes_cursor = operation["parameters"]
                .as_array()
                .is_some_and(|params| params.iter().any(|p| p["name"] == "cursor" && p["in"] == "query"));
            let declares_link = !operation["responses"]["200"]["headers"]["Link"].is_null();
            assert_eq!(
                takes_cursor, declares_link,
                "{method} {path}: takes a cursor {takes_cursor}, declares Link {declares_link}"
            );
            paged += usize::from(takes_cursor);
        }
    }
    assert!(paged >= 15, "only {paged} paged lists in the spec");
}
