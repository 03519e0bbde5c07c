//! Bad input gets the documented 4xx problem document naming what was wrong, and leaves
//! everything stored in ZooKeeper exactly as it was.

use crate::common;

use common::{Gate, raw_request, tree, zk_client, zookeeper};
use reqwest::StatusCode;

/// Method, raw path, headers, body, expected status, expected `field`.
type Case<'a> = (
    &'a str,
    &'a str,
    Vec<(&'a str, &'a str)>,
    &'a [u8],
    StatusCode,
    Option<&'a str>,
);

#[tokio::test]
async fn bad_names_bodies_and_handles_are_refused_and_change_nothing() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let lease = gate.lease("60s").await;
    let held = gate.acquire("keep", &lease, "wait=0").await;
    assert_eq!(held.status, StatusCode::OK, "{held:?}");
    let handle = held.str("handle");
    let zk_view = zk_client(&zk.connect_string()).await;
    // A counter at 7, and a znode where a counter would be that holds something else.
    let counter = gate
        .post("/v1/counters/c/add", Some(serde_json::json!({"delta": 7})))
        .await;
    assert_eq!(counter.status, StatusCode::OK, "{counter:?}");
    let options = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    zk_view
        .create("/zkgate/counters/text", b"abc", &options)
        .await
        .expect("create");
    let before = tree(&zk_view, "/zkgate").await;
    assert!(
        before.keys().any(|k| k.starts_with("/zkgate/locks/keep/_c_")),
        "{before:?}"
    );

    let long_name = "n".repeat(129);
    let long_key = "k".repeat(256);
    let huge = vec![b' '; 600 * 1024];
    let body_with_lease = format!(r#"{{"lease":"{lease}","ttl":"1s"}}"#);
    let acquire_long = format!("/v1/locks/{long_name}/acquire");
    let wrong_lock = format!("/v1/locks/other/handles/{handle}");
    let too_many_claims =
        serde_json::json!({ "claims": (0..101).map(|n| format!("c{n}")).collect::<Vec<_>>() }).to_string();
    let sixty_five = serde_json::json!({ "locks": (0..65).map(|n| format!("l{n}")).collect::<Vec<_>>() }).to_string();
    #[rustfmt::skip]
    let cases: Vec<Case> = vec![
        // Names: empty, dot-dot (raw and encoded), slash, control characters, too long.
        ("POST", "/v1/locks//acquire", vec![], b"", StatusCode::BAD_REQUEST, Some("name")),
        ("POST", "/v1/locks/../acquire", vec![], b"", StatusCode::BAD_REQUEST, Some("name")),
        ("POST", "/v1/locks/%2E%2E/acquire", vec![], b"", StatusCode::BAD_REQUEST, Some("name")),
        ("POST", "/v1/locks/a%2Fb/acquire", vec![], b"", StatusCode::BAD_REQUEST, Some("name")),
        ("POST", "/v1/locks/a%0Ab/acquire", vec![], b"", StatusCode::BAD_REQUEST, Some("name")),
        ("POST", "/v1/locks/a%00b/acquire", vec![], b"", StatusCode::BAD_REQUEST, Some("name")),
        ("POST", &acquire_long, vec![], b"", StatusCode::BAD_REQUEST, Some("name")),
        // Beyond U+FFFF (an emoji): ZooKeeper refuses it, so zkgate does first (not a 500).
        ("POST", "/v1/semaphores/a%F0%9F%98%80/acquire?permits=2", vec![], b"", StatusCode::BAD_REQUEST, Some("name")),
        ("PUT", "/v1/groups/g/members/%F0%9F%98%80", vec![], b"", StatusCode::BAD_REQUEST, Some("member")),
        ("PUT", "/v1/kv/a/%F0%9F%98%80", vec![], b"x", StatusCode::BAD_REQUEST, Some("key")),
        ("GET", "/v1/locks/a%2Fb", vec![], b"", StatusCode::BAD_REQUEST, Some("name")),
        ("GET", "/v1/locks/%2E%2E/handles/x", vec![], b"", StatusCode::BAD_REQUEST, Some("name")),
        // Query parameters.
        ("POST", "/v1/locks/keep/acquire?wait=soon", vec![], b"", StatusCode::BAD_REQUEST, Some("wait")),
        ("POST", "/v1/locks/keep/acquire?wait=-1s", vec![], b"", StatusCode::BAD_REQUEST, Some("wait")),
        ("POST", "/v1/locks/keep/acquire?keep_queued=maybe", vec![], b"", StatusCode::BAD_REQUEST, Some("keep_queued")),
        ("POST", "/v1/locks/keep/acquire?wiat=1s", vec![], b"", StatusCode::BAD_REQUEST, Some("wiat")),
        // Bodies.
        ("POST", "/v1/locks/keep/acquire", vec![], b"{\"lease\": 5}", StatusCode::BAD_REQUEST, Some("lease")),
        ("POST", "/v1/locks/keep/acquire", vec![], b"{\"tll\": \"5s\"}", StatusCode::BAD_REQUEST, None),
        ("POST", "/v1/locks/keep/acquire", vec![], b"{\"ttl\": \"0\"}", StatusCode::BAD_REQUEST, Some("ttl")),
        ("POST", "/v1/locks/keep/acquire", vec![], body_with_lease.as_bytes(), StatusCode::BAD_REQUEST, Some("ttl")),
        ("POST", "/v1/locks/keep/acquire", vec![], b"{\"lease\": ", StatusCode::BAD_REQUEST, None),
        ("POST", "/v1/locks/keep/acquire", vec![], b"[\"lease\"]", StatusCode::BAD_REQUEST, None),
        ("POST", "/v1/locks/keep/acquire", vec![], b"not json", StatusCode::BAD_REQUEST, None),
        ("POST", "/v1/locks/keep/acquire", vec![], &huge, StatusCode::PAYLOAD_TOO_LARGE, None),
        ("POST", "/v1/leases", vec![], b"{\"ttl\": 30}", StatusCode::BAD_REQUEST, Some("ttl")),
        ("POST", "/v1/leases", vec![], b"{\"ttl\": \"forever\"}", StatusCode::BAD_REQUEST, Some("ttl")),
        ("POST", "/v1/leases", vec![("Idempotency-Key", long_key.as_str())], b"", StatusCode::BAD_REQUEST, Some("Idempotency-Key")),
        // Unknown leases and handles; a handle of another lock.
        ("POST", "/v1/locks/keep/acquire", vec![], b"{\"lease\": \"nope\"}", StatusCode::NOT_FOUND, None),
        ("GET", "/v1/leases/nope", vec![], b"", StatusCode::NOT_FOUND, None),
        ("POST", "/v1/leases/nope/keepalive", vec![], b"", StatusCode::NOT_FOUND, None),
        ("DELETE", "/v1/leases/nope", vec![], b"", StatusCode::NOT_FOUND, None),
        ("GET", "/v1/locks/keep/handles/nope", vec![], b"", StatusCode::NOT_FOUND, None),
        ("DELETE", "/v1/locks/keep/handles/nope", vec![], b"", StatusCode::NOT_FOUND, None),
        ("DELETE", &wrong_lock, vec![], b"", StatusCode::NOT_FOUND, None),
        // Read/write locks share the same checks.
        ("POST", "/v1/rwlocks/../read", vec![], b"", StatusCode::BAD_REQUEST, Some("name")),
        ("POST", "/v1/rwlocks/a%2Fb/write", vec![], b"", StatusCode::BAD_REQUEST, Some("name")),
        ("POST", "/v1/rwlocks/keep/read?wait=soon", vec![], b"", StatusCode::BAD_REQUEST, Some("wait")),
        ("POST", "/v1/rwlocks/keep/write", vec![], b"{\"lease\": []}", StatusCode::BAD_REQUEST, Some("lease")),
        ("GET", "/v1/rwlocks/%00", vec![], b"", StatusCode::BAD_REQUEST, Some("name")),
        ("DELETE", "/v1/rwlocks/keep/handles/nope", vec![], b"", StatusCode::NOT_FOUND, None),
        ("PUT", "/v1/rwlocks/keep/read", vec![], b"", StatusCode::METHOD_NOT_ALLOWED, None),
        // Elections.
        ("POST", "/v1/elections/../campaign", vec![], b"", StatusCode::BAD_REQUEST, Some("name")),
        ("POST", "/v1/elections/e/campaign?keep_queued=1", vec![], b"", StatusCode::BAD_REQUEST, Some("keep_queued")),
        ("POST", "/v1/elections/e/campaign", vec![], b"{\"valeu\": 1}", StatusCode::BAD_REQUEST, None),
        ("PUT", "/v1/elections/e/leader", vec![], b"{\"value\": 1}", StatusCode::BAD_REQUEST, None),
        ("PUT", "/v1/elections/e/leader", vec![], b"{\"handle\": \"nope\", \"value\": 1}", StatusCode::NOT_FOUND, None),
        ("PUT", "/v1/elections/e/leader", vec![], b"", StatusCode::BAD_REQUEST, None),
        ("DELETE", "/v1/elections/e/candidates/nope", vec![], b"", StatusCode::NOT_FOUND, None),
        ("GET", "/v1/elections/%0A", vec![], b"", StatusCode::BAD_REQUEST, Some("name")),
        // Groups.
        ("PUT", "/v1/groups/../members/m", vec![], b"", StatusCode::BAD_REQUEST, Some("name")),
        ("PUT", "/v1/groups/g/members/..", vec![], b"", StatusCode::BAD_REQUEST, Some("member")),
        ("PUT", "/v1/groups/g/members/a%2Fb", vec![], b"", StatusCode::BAD_REQUEST, Some("member")),
        ("PUT", "/v1/groups/g/members/m", vec![], b"{\"dat\": 1}", StatusCode::BAD_REQUEST, None),
        ("PUT", "/v1/groups/g/members/m", vec![], b"{\"lease\": \"nope\"}", StatusCode::NOT_FOUND, None),
        ("GET", "/v1/groups/g?index=x", vec![], b"", StatusCode::BAD_REQUEST, Some("index")),
        ("GET", "/v1/groups/g?index=x&wait=1s", vec![], b"", StatusCode::BAD_REQUEST, Some("index")),
        ("DELETE", "/v1/groups/g/members/nobody", vec![], b"", StatusCode::NOT_FOUND, None),
        // Configuration keys and conditions.
        ("PUT", "/v1/kv/a/../b", vec![], b"x", StatusCode::BAD_REQUEST, Some("key")),
        ("PUT", "/v1/kv/a//b", vec![], b"x", StatusCode::BAD_REQUEST, Some("key")),
        ("PUT", "/v1/kv/a/", vec![], b"x", StatusCode::BAD_REQUEST, Some("key")),
        ("PUT", "/v1/kv/a%00", vec![], b"x", StatusCode::BAD_REQUEST, Some("key")),
        ("PUT", "/v1/kv/1/2/3/4/5/6/7/8/9/10/11/12/13/14/15/16/17", vec![], b"x", StatusCode::BAD_REQUEST, Some("key")),
        ("PUT", "/v1/kv/k", vec![("If-Match", "soon")], b"x", StatusCode::BAD_REQUEST, Some("if-match")),
        ("PUT", "/v1/kv/k", vec![("If-None-Match", "\"3\"")], b"x", StatusCode::BAD_REQUEST, Some("if-none-match")),
        ("PUT", "/v1/kv/k", vec![("If-Match", "*"), ("If-None-Match", "*")], b"x", StatusCode::BAD_REQUEST, Some("if-match")),
        ("PUT", "/v1/kv/k", vec![("Content-Type", "application/json")], b"{nope", StatusCode::BAD_REQUEST, None),
        ("PUT", "/v1/kv/k", vec![], &huge, StatusCode::PAYLOAD_TOO_LARGE, None),
        ("GET", "/v1/kv/k?wait=forever", vec![], b"", StatusCode::BAD_REQUEST, Some("wait")),
        ("GET", "/v1/kv?prefix=..", vec![], b"", StatusCode::BAD_REQUEST, Some("prefix")),
        ("GET", "/v1/kv/missing", vec![], b"", StatusCode::NOT_FOUND, None),
        ("DELETE", "/v1/kv/missing", vec![], b"", StatusCode::NOT_FOUND, None),
        // Revocation requests.
        ("POST", "/v1/locks/keep/revoke", vec![], b"{\"by\": \"\", \"reason\": \"x\"}", StatusCode::BAD_REQUEST, Some("by")),
        ("POST", "/v1/locks/keep/revoke", vec![], b"{\"by\": \"a\"}", StatusCode::BAD_REQUEST, None),
        ("POST", "/v1/locks/keep/revoke", vec![], b"{\"by\": \"a\", \"reason\": \"b\", \"grace\": \"soon\"}", StatusCode::BAD_REQUEST, Some("grace")),
        ("POST", "/v1/locks/keep/revoke", vec![], b"{\"by\": \"a\", \"reason\": \"b\", \"node\": \"nope\"}", StatusCode::NOT_FOUND, None),
        ("POST", "/v1/rwlocks/../revoke", vec![], b"{\"by\": \"a\", \"reason\": \"b\"}", StatusCode::BAD_REQUEST, Some("name")),
        ("GET", "/v1/revocations?limit=x", vec![], b"", StatusCode::BAD_REQUEST, Some("limit")),
        ("GET", "/v1/locks/keep/handles/nope?wait=x", vec![], b"", StatusCode::BAD_REQUEST, Some("wait")),
        // Semaphores.
        ("POST", "/v1/semaphores/s/acquire", vec![], b"", StatusCode::BAD_REQUEST, Some("permits")),
        ("POST", "/v1/semaphores/s/acquire?permits=0", vec![], b"", StatusCode::BAD_REQUEST, Some("permits")),
        ("POST", "/v1/semaphores/s/acquire?permits=-1", vec![], b"", StatusCode::BAD_REQUEST, Some("permits")),
        ("POST", "/v1/semaphores/s/acquire?permits=99999", vec![], b"", StatusCode::BAD_REQUEST, Some("permits")),
        ("POST", "/v1/semaphores/../acquire?permits=1", vec![], b"", StatusCode::BAD_REQUEST, Some("name")),
        ("POST", "/v1/semaphores/s/acquire?permits=1", vec![], b"{\"lease\": 1}", StatusCode::BAD_REQUEST, Some("lease")),
        ("DELETE", "/v1/semaphores/s/permits/nope", vec![], b"", StatusCode::NOT_FOUND, None),
        ("GET", "/v1/rwlocks/keep/handles/nope", vec![], b"", StatusCode::NOT_FOUND, None),
        ("GET", "/v1/elections/e/candidates/nope", vec![], b"", StatusCode::NOT_FOUND, None),
        ("GET", "/v1/semaphores/%2E%2E", vec![], b"", StatusCode::BAD_REQUEST, Some("name")),
        ("GET", "/v1/semaphores/s/permits/nope", vec![], b"", StatusCode::NOT_FOUND, None),
        ("GET", "/v1/groups/a%2Fb", vec![], b"", StatusCode::BAD_REQUEST, Some("name")),
        // Barriers.
        ("PUT", "/v1/barriers/..", vec![], b"", StatusCode::BAD_REQUEST, Some("name")),
        ("PUT", "/v1/barriers/b", vec![], b"{\"ttl\": 5}", StatusCode::BAD_REQUEST, Some("ttl")),
        ("PUT", "/v1/barriers/b", vec![], b"{\"lease\": \"nope\"}", StatusCode::NOT_FOUND, None),
        ("GET", "/v1/barriers/b/wait?wait=later", vec![], b"", StatusCode::BAD_REQUEST, Some("wait")),
        ("GET", "/v1/barriers/%0A/wait", vec![], b"", StatusCode::BAD_REQUEST, Some("name")),
        ("DELETE", "/v1/barriers/never-raised", vec![], b"", StatusCode::NOT_FOUND, None),
        // Double barriers.
        ("POST", "/v1/double-barriers/d/enter", vec![], b"{\"participant\": \"p\"}", StatusCode::BAD_REQUEST, None),
        ("POST", "/v1/double-barriers/d/enter", vec![], b"{\"participant\": \"p\", \"size\": 0}", StatusCode::BAD_REQUEST, Some("size")),
        ("POST", "/v1/double-barriers/d/enter", vec![], b"{\"participant\": \"ready\", \"size\": 2}", StatusCode::BAD_REQUEST, Some("participant")),
        ("POST", "/v1/double-barriers/d/enter", vec![], b"{\"participant\": \"a/b\", \"size\": 2}", StatusCode::BAD_REQUEST, Some("participant")),
        ("POST", "/v1/double-barriers/../enter", vec![], b"{\"participant\": \"p\", \"size\": 2}", StatusCode::BAD_REQUEST, Some("name")),
        ("POST", "/v1/double-barriers/d/leave?wait=x", vec![], b"{\"participant\": \"p\"}", StatusCode::BAD_REQUEST, Some("wait")),
        ("POST", "/v1/double-barriers/d/leave", vec![], b"{}", StatusCode::BAD_REQUEST, None),
        // Transactions.
        ("POST", "/v1/txns", vec![], b"{\"participants\": []}", StatusCode::BAD_REQUEST, Some("participants")),
        ("POST", "/v1/txns", vec![], b"{\"participants\": [\"a\", \"a\"]}", StatusCode::BAD_REQUEST, Some("participants")),
        ("POST", "/v1/txns", vec![], b"{\"id\": \"a/b\", \"participants\": [\"a\"]}", StatusCode::BAD_REQUEST, Some("id")),
        ("POST", "/v1/txns", vec![], b"{\"participants\": [\"a\"], \"deadline\": \"never\"}", StatusCode::BAD_REQUEST, Some("deadline")),
        ("POST", "/v1/txns/t/participants/a/vote", vec![], b"{\"vote\": \"maybe\"}", StatusCode::BAD_REQUEST, Some("vote")),
        ("PUT", "/v1/txns/nope/participants/a", vec![], b"", StatusCode::NOT_FOUND, None),
        ("GET", "/v1/txns/%2E%2E", vec![], b"", StatusCode::BAD_REQUEST, Some("name")),
        // Queues.
        ("POST", "/v1/queues/q/items?priority=100", vec![], b"x", StatusCode::BAD_REQUEST, Some("priority")),
        ("POST", "/v1/queues/q/items?priority=high", vec![], b"x", StatusCode::BAD_REQUEST, Some("priority")),
        ("POST", "/v1/queues/q/items", vec![("Content-Type", "application/json")], b"{nope", StatusCode::BAD_REQUEST, None),
        ("POST", "/v1/queues/q/items", vec![("Idempotency-Key", "a b")], b"x", StatusCode::BAD_REQUEST, Some("Idempotency-Key")),
        ("POST", "/v1/queues/q/items", vec![], &huge, StatusCode::PAYLOAD_TOO_LARGE, None),
        ("POST", "/v1/queues/../items", vec![], b"x", StatusCode::BAD_REQUEST, Some("name")),
        ("POST", "/v1/queues/q/items?delay=soon", vec![], b"x", StatusCode::BAD_REQUEST, Some("delay")),
        ("POST", "/v1/queues/q/items?delay=721h", vec![], b"x", StatusCode::BAD_REQUEST, Some("delay")),
        ("POST", "/v1/queues/q/items?not_before=tomorrow", vec![], b"x", StatusCode::BAD_REQUEST, Some("not_before")),
        ("POST", "/v1/queues/q/items?not_before=2026-11-23T10:00:00%2B01:00", vec![], b"x", StatusCode::BAD_REQUEST, Some("not_before")),
        ("POST", "/v1/queues/q/take?mode=sometimes", vec![], b"", StatusCode::BAD_REQUEST, Some("mode")),
        ("POST", "/v1/queues/q/take?mode=at-most-once&ack_deadline=1s", vec![], b"", StatusCode::BAD_REQUEST, Some("ack_deadline")),
        ("POST", "/v1/queues/q/take?ack_deadline=0", vec![], b"", StatusCode::BAD_REQUEST, Some("ack_deadline")),
        ("POST", "/v1/queues/q/take?max_items=0", vec![], b"", StatusCode::BAD_REQUEST, Some("max_items")),
        ("POST", "/v1/queues/q/take?max_items=101", vec![], b"", StatusCode::BAD_REQUEST, Some("max_items")),
        ("POST", "/v1/queues/q/take?max_items=some", vec![], b"", StatusCode::BAD_REQUEST, Some("max_items")),
        ("POST", "/v1/queues/q/claims/ack", vec![("Content-Type", "application/json")], br#"{"claims": []}"#, StatusCode::BAD_REQUEST, Some("claims")),
        ("POST", "/v1/queues/q/claims/ack", vec![("Content-Type", "application/json")], too_many_claims.as_bytes(), StatusCode::BAD_REQUEST, Some("claims")),
        ("POST", "/v1/queues/q/claims/ack", vec![("Content-Type", "application/json")], br#"{"claims": ["a/b"]}"#, StatusCode::BAD_REQUEST, Some("claims")),
        ("POST", "/v1/queues/q/claims/ack", vec![("Content-Type", "application/json")], br#"{"claims": ["nope", "nope"]}"#, StatusCode::BAD_REQUEST, Some("claims")),
        ("POST", "/v1/queues/q/claims/ack", vec![("Content-Type", "application/json")], br#"{"claims": ["nope"]}"#, StatusCode::BAD_REQUEST, Some("claims")),
        // A claim id whose item would be named by a NUL: no znode name (it reached ZooKeeper, 500).
        ("POST", "/v1/queues/q/claims/ack", vec![("Content-Type", "application/json")], br#"{"claims": ["00000000-00000000000000000000000000000000.00"]}"#, StatusCode::BAD_REQUEST, Some("claims")),
        ("POST", "/v1/queues/q/claims/00000000-00000000000000000000000000000000.00/ack", vec![], b"", StatusCode::GONE, None),
        ("POST", "/v1/queues/q/claims/ack", vec![("Content-Type", "application/json")], br#"{"claims": "nope"}"#, StatusCode::BAD_REQUEST, None),
        ("POST", "/v1/queues/q/claims/ack", vec![("Content-Type", "application/json")], br#"{"claims": ["nope"], "all": true}"#, StatusCode::BAD_REQUEST, None),
        ("POST", "/v1/queues/q/claims/nope/ack", vec![], b"", StatusCode::GONE, None),
        ("POST", "/v1/queues/q/claims/nope/nack", vec![], b"", StatusCode::GONE, None),
        ("POST", "/v1/queues/q/dead-letters/nope/replay", vec![], b"", StatusCode::NOT_FOUND, None),
        ("POST", "/v1/queues/q/dead/nope/replay", vec![], b"", StatusCode::NOT_FOUND, None),
        ("GET", "/v1/queues/%2E%2E", vec![], b"", StatusCode::BAD_REQUEST, Some("name")),
        // Counters: bad deltas and bounds, failed conditions, adds past a bound or 64 bits, a
        // znode that is not a counter.
        ("POST", "/v1/counters/c/add", vec![], b"{\"delta\": \"5\"}", StatusCode::BAD_REQUEST, Some("delta")),
        ("POST", "/v1/counters/c/add", vec![], b"{\"delta\": 1.5}", StatusCode::BAD_REQUEST, Some("delta")),
        ("POST", "/v1/counters/c/add", vec![], b"{\"delta\": 9223372036854775808}", StatusCode::BAD_REQUEST, Some("delta")),
        ("POST", "/v1/counters/c/add", vec![], b"{\"min\": 5, \"max\": 1}", StatusCode::BAD_REQUEST, Some("min")),
        ("POST", "/v1/counters/c/add", vec![], b"{\"step\": 1}", StatusCode::BAD_REQUEST, None),
        ("POST", "/v1/counters/c/add", vec![], b"{\"delta\": 1, \"max\": 7}", StatusCode::CONFLICT, None),
        ("POST", "/v1/counters/c/add", vec![], b"{\"delta\": 9223372036854775807}", StatusCode::CONFLICT, None),
        ("POST", "/v1/counters/text/add", vec![], b"", StatusCode::CONFLICT, None),
        ("POST", "/v1/counters/%2E%2E/add", vec![], b"", StatusCode::BAD_REQUEST, Some("name")),
        ("PUT", "/v1/counters/c", vec![], b"{\"value\": \"7\"}", StatusCode::BAD_REQUEST, Some("value")),
        ("PUT", "/v1/counters/c", vec![], b"{}", StatusCode::BAD_REQUEST, None),
        ("PUT", "/v1/counters/c", vec![("If-Match", "\"1\"")], b"{\"value\": 1}", StatusCode::PRECONDITION_FAILED, None),
        ("PUT", "/v1/counters/c", vec![("If-None-Match", "*")], b"{\"value\": 1}", StatusCode::PRECONDITION_FAILED, None),
        ("PUT", "/v1/counters/c", vec![("If-Match", "soon")], b"{\"value\": 1}", StatusCode::BAD_REQUEST, Some("if-match")),
        ("DELETE", "/v1/counters/c", vec![("If-Match", "\"1\"")], b"", StatusCode::PRECONDITION_FAILED, None),
        ("DELETE", "/v1/counters/never", vec![], b"", StatusCode::NOT_FOUND, None),
        // Lock sets: no locks, too many, one twice, a bad name, a lease that is not there, an
        // unknown set.
        ("POST", "/v1/lock-sets", vec![], b"{\"locks\": []}", StatusCode::BAD_REQUEST, Some("locks")),
        ("POST", "/v1/lock-sets", vec![], sixty_five.as_bytes(), StatusCode::BAD_REQUEST, Some("locks")),
        ("POST", "/v1/lock-sets", vec![], b"{\"locks\": [\"a\", \"b\", \"a\"]}", StatusCode::BAD_REQUEST, Some("locks")),
        ("POST", "/v1/lock-sets", vec![], b"{\"locks\": [\"a\", \"..\"]}", StatusCode::BAD_REQUEST, Some("locks")),
        ("POST", "/v1/lock-sets", vec![], b"{\"locks\": \"a\"}", StatusCode::BAD_REQUEST, Some("locks")),
        ("POST", "/v1/lock-sets", vec![], b"{}", StatusCode::BAD_REQUEST, None),
        ("POST", "/v1/lock-sets?wait=later", vec![], b"{\"locks\": [\"a\"]}", StatusCode::BAD_REQUEST, Some("wait")),
        ("POST", "/v1/lock-sets", vec![], b"{\"locks\": [\"a\"], \"lease\": \"nope\"}", StatusCode::NOT_FOUND, None),
        ("GET", "/v1/lock-sets/nope", vec![], b"", StatusCode::NOT_FOUND, None),
        ("DELETE", "/v1/lock-sets/nope", vec![], b"", StatusCode::NOT_FOUND, None),
        // Services: no address, a bad one, a bad port, a bad URI template, a bad id or
        // strategy, an instance that is not there.
        ("PUT", "/v1/services/s/instances/i", vec![], b"{\"port\": 80}", StatusCode::BAD_REQUEST, None),
        ("PUT", "/v1/services/s/instances/i", vec![], b"{\"address\": \"\"}", StatusCode::BAD_REQUEST, Some("address")),
        ("PUT", "/v1/services/s/instances/i", vec![], b"{\"address\": \"a\\nb\"}", StatusCode::BAD_REQUEST, Some("address")),
        ("PUT", "/v1/services/s/instances/i", vec![], b"{\"address\": \"h\", \"port\": 70000}", StatusCode::BAD_REQUEST, Some("port")),
        ("PUT", "/v1/services/s/instances/i", vec![], b"{\"address\": \"h\", \"uri_spec\": \"{scheme://x\"}", StatusCode::BAD_REQUEST, Some("uri_spec")),
        ("PUT", "/v1/services/s/instances/..", vec![], b"{\"address\": \"h\"}", StatusCode::BAD_REQUEST, Some("id")),
        ("PUT", "/v1/services/s/instances/i", vec![], b"{\"address\": \"h\", \"lease\": \"nope\"}", StatusCode::NOT_FOUND, None),
        ("GET", "/v1/services/s/pick?strategy=sticky", vec![], b"", StatusCode::BAD_REQUEST, Some("strategy")),
        ("GET", "/v1/services/s/pick", vec![], b"", StatusCode::NOT_FOUND, None),
        ("DELETE", "/v1/services/s/instances/i", vec![], b"", StatusCode::NOT_FOUND, None),
        // A transaction's compare of a version with no bound (it would always hold), or an
        // upside-down one.
        ("POST", "/v1/kv-txn", vec![], b"{\"compare\": [{\"key\": \"a\", \"version\": {}}], \"then\": [{\"put\": \"a\", \"text\": \"x\"}]}", StatusCode::BAD_REQUEST, Some("compare")),
        ("POST", "/v1/kv-txn", vec![], b"{\"compare\": [{\"key\": \"a\", \"version\": {\"at_least\": 3, \"at_most\": 2}}]}", StatusCode::BAD_REQUEST, Some("compare")),
        // Unknown endpoints and methods.
        ("GET", "/v2/locks", vec![], b"", StatusCode::NOT_FOUND, None),
        ("PUT", "/v1/locks/keep/acquire", vec![], b"", StatusCode::METHOD_NOT_ALLOWED, None),
    ];
    for (method, path, headers, body, status, field) in cases {
        let reply = raw_request(gate.running.addr, method, path, &headers, body).await;
        assert_eq!(
            reply.status,
            status,
            "{method} {path} {:?}: {reply:?}",
            String::from_utf8_lossy(&body[..body.len().min(40)])
        );
        reply.assert_problem(status, field);
    }

    assert_eq!(
        tree(&zk_view, "/zkgate").await,
        before,
        "bad requests changed ZooKeeper"
    );
    // A 405 says which methods the endpoint takes, in its body as in `Allow`.
    let wrong = raw_request(gate.running.addr, "PUT", "/v1/locks/keep/acquire", &[], b"").await;
    assert_eq!(wrong.body["allowed"], serde_json::json!(["POST"]), "{wrong:?}");
    assert!(
        wrong.body["detail"].as_str().unwrap_or_default().contains("POST"),
        "{wrong:?}"
    );
    let state = gate.get("/v1/locks/keep").await;
    assert_eq!(
        state.body["holder"]["lease"],
        lease.as_str(),
        "the holder is untouched: {state:?}"
    );
    let kept = gate.get(&format!("/v1/locks/keep/handles/{handle}")).await;
    assert_eq!(kept.body["state"], "held");
    assert_eq!(gate.get("/v1/counters/c").await.body["value"], 7);
}

/// A refusal quotes at most 64 characters of what it refuses, and says what is wrong with it:
/// a 4 KB key in a transaction (on a82bd35 echoed whole, with no reason) or in a path.
#[tokio::test]
async fn a_refusal_cuts_what_it_quotes_and_says_what_is_wrong() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let long = "k".repeat(4096);
    let txn = serde_json::json!({"then": [{"put": long, "text": "x"}]});
    let refused = gate.post("/v1/kv-txn", Some(txn)).await;
    refused.assert_problem(StatusCode::BAD_REQUEST, Some("then"));
    let in_path = gate
        .call(
            reqwest::Method::PUT,
            &format!("/v1/kv/a/{long}"),
            Some(serde_json::json!(1)),
        )
        .await;
    in_path.assert_problem(StatusCode::BAD_REQUEST, Some("key"));
    for reply in [&refused, &in_path] {
        let detail = reply.str("detail");
        assert!(detail.len() < 300, "{detail}");
        assert!(detail.contains("(4096 bytes)"), "{detail}");
        assert!(detail.contains("at most 128 bytes"), "says what is wrong: {detail}");
    }
}

/// A request head over the server's bounds is refused with a problem document naming the
/// bound, whether the app's bounds refuse it (a URI over 8 KiB, over 32 KiB of header fields)
/// or hyper does before routing (more than 100 header fields, a URI over 64 KiB, a head over
/// its buffer, a header hyper cannot parse): hyper's own answers have empty bodies.
#[tokio::test]
async fn oversized_and_malformed_request_heads_get_problem_documents() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let addr = gate.running.addr;
    let problem = |reply: &common::Reply, status: StatusCode, slug: &str| {
        assert_eq!(reply.status, status, "{reply:?}");
        assert_eq!(reply.content_type, "application/problem+json", "{reply:?}");
        assert_eq!(reply.body["type"], format!("urn:zkgate:problem:{slug}"), "{reply:?}");
        assert_eq!(reply.body["status"], status.as_u16(), "{reply:?}");
    };
    // The app's bounds.
    let long_uri = format!("/v1/kv/k?x={}", "a".repeat(9 * 1024));
    let reply = raw_request(addr, "GET", &long_uri, &[], b"").await;
    problem(&reply, StatusCode::URI_TOO_LONG, "uri-too-long");
    assert_eq!(reply.body["limit_bytes"], 8192, "{reply:?}");
    let big = "b".repeat(40 * 1024);
    let reply = raw_request(addr, "GET", "/v1/kv/k", &[("x-big", big.as_str())], b"").await;
    problem(&reply, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, "headers-too-large");
    assert_eq!(reply.body["limit"], "bytes", "{reply:?}");
    // hyper's: refused before the app sees the request, answered as problems all the same.
    let longest_uri = format!("/v1/kv/k?x={}", "a".repeat(70 * 1024));
    let reply = raw_request(addr, "GET", &longest_uri, &[], b"").await;
    problem(&reply, StatusCode::URI_TOO_LONG, "uri-too-long");
    let names: Vec<String> = (0..101).map(|i| format!("x-field-{i}")).collect();
    let too_many: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "1")).collect();
    let reply = raw_request(addr, "GET", "/v1/kv/k", &too_many, b"").await;
    problem(&reply, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, "headers-too-large");
    assert_eq!(reply.body["limit"], "head", "{reply:?}");
    let detail = reply.body["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("more than 100 header fields"), "{reply:?}");
    // A hundred are served (the client's own few among them).
    let names: Vec<String> = (0..95).map(|i| format!("x-field-{i}")).collect();
    let most: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "1")).collect();
    let reply = raw_request(addr, "GET", "/v1/kv/k", &most, b"").await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "{reply:?}");
    let reply = raw_request(addr, "GET", "/v1/kv/k", &[("bad header", "1")], b"").await;
    problem(&reply, StatusCode::BAD_REQUEST, "malformed-request");
    // The server still serves.
    let fine = gate.get("/v1/kv/k").await;
    assert_eq!(fine.status, StatusCode::NOT_FOUND, "{fine:?}");
}
