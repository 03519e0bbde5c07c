//! Server-Sent Events over real HTTP connections: a topic's state then its changes, several
//! topics on one stream, resuming with `Last-Event-ID` (or `?since=`) within the topic's backlog
//! and beyond it, across a ZooKeeper reconnection and a session expiry, heartbeats, and the
//! refusals (bad topics, bad positions, no grant, a foreign page).

use crate::common;

use std::time::Duration;

use common::proxy::Proxy;
use common::sse::Sse;
use common::ws::assert_no_silent_gap;
use common::{ADMIN, Gate, auth_config, expire_sessions, grant, test_config, zookeeper};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// The key the resume tests change, and its topic.
const KEY: &str = "counter";
const TOPIC: &str = "znode:data:kv/counter";

/// Writes the key (the `writes`th time): its version goes up by one, from 0 at its creation
/// (the topic may fold several writes it saw together into one event, but its last event
/// always has the last version). Answers that version.
async fn write(gate: &Gate, writes: &mut i64) -> i64 {
    let url = format!("{}/v1/kv/{KEY}", gate.url);
    let put = gate
        .http
        .put(url)
        .header("content-type", "text/plain")
        .body("n")
        .send()
        .await
        .expect("PUT");
    let reply = common::Reply::read(put).await;
    assert!(reply.status.is_success(), "{reply:?}");
    *writes += 1;
    *writes - 1
}

/// Reads `stream` until the key's topic shows `version`.
async fn until_version(stream: &mut Sse, seen: &mut Vec<Value>, version: i64) -> Value {
    stream.until(TOPIC, seen, |e| e["state"]["version"] == version).await
}

#[tokio::test]
async fn a_lock_followed_with_curl_shows_its_state_then_each_change() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let mut stream = Sse::open(&gate.http, &format!("{}/v1/locks/orders/events", gate.url), None).await;
    let first = stream.message().await.expect("a first message");
    assert_eq!(
        first.retry,
        Some(1000),
        "the stream tells clients how soon to reconnect"
    );
    let state = stream.next().await;
    assert_eq!(
        (state["topic"].as_str(), state["type"].as_str()),
        (Some("lock:orders"), Some("state"))
    );
    assert_eq!(state["state"]["holder"], Value::Null);
    assert_eq!(
        stream.last_id.as_deref(),
        state["position"].as_str(),
        "one topic: its position is the id"
    );

    let lease = gate.lease("30s").await;
    let held = gate.acquire("orders", &lease, "wait=0").await;
    let mut seen = vec![state];
    let granted = stream.until("lock:orders", &mut seen, |e| e["type"] == "granted").await;
    assert_eq!(
        granted["state"]["holder"]["fencing_token"],
        json!(held.i64("fencing_token"))
    );
    gate.release("orders", &held.str("handle")).await;
    stream
        .until("lock:orders", &mut seen, |e| e["type"] == "released")
        .await;
    assert_no_silent_gap(&seen);
}

#[tokio::test]
async fn one_stream_follows_several_topics_and_its_id_says_where_each_is() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let url = format!(
        "{}/v1/events?topic=lock:a&topic=election:e&topic=queue:q&topic=znode:data:kv/flag",
        gate.url
    );
    let mut stream = Sse::open(&gate.http, &url, None).await;
    let mut states = Vec::new();
    for _ in 0..4 {
        let event = stream.next().await;
        assert_eq!(event["type"], "state", "{event}");
        states.push(event["topic"].as_str().unwrap().to_string());
    }
    states.sort();
    assert_eq!(states, ["election:e", "lock:a", "queue:q", "znode:data:kv/flag"]);

    let put = gate.post("/v1/queues/q/items", Some(json!({"job": 1}))).await;
    assert_eq!(put.status, StatusCode::CREATED);
    let mut seen = Vec::new();
    let event = stream.until("queue:q", &mut seen, |e| e["type"] != "state").await;
    assert_eq!(event["state"]["depth"], 1, "{event}");
    let id = stream.last_id.clone().expect("an id");
    let positions: Vec<&str> = id.split(',').collect();
    assert_eq!(positions.len(), 4, "one position per topic, in the order named: {id}");
    assert_eq!(
        Some(positions[2]),
        event["position"].as_str(),
        "the queue is the third topic"
    );
}

#[tokio::test]
async fn a_stream_resumes_with_just_what_it_missed() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let url = format!("{}/v1/events?topic={TOPIC}", gate.url);
    // A second client follows all along: what the topic published while the first was away.
    let mut watcher = Sse::open(&gate.http, &url, None).await;
    let mut truth = vec![watcher.next().await];

    let mut client = Sse::open(&gate.http, &url, None).await;
    client.next().await;
    let mut writes = 0;
    let version = write(&gate, &mut writes).await;
    until_version(&mut watcher, &mut truth, version).await;
    until_version(&mut client, &mut Vec::new(), version).await;
    let id = client.last_id.clone().expect("an id");
    drop(client);

    let missed_from = truth.len();
    let mut version = 0;
    for _ in 0..3 {
        version = write(&gate, &mut writes).await;
    }
    until_version(&mut watcher, &mut truth, version).await;
    let missed: Vec<(u64, String)> = truth[missed_from..]
        .iter()
        .map(|e| (e["seq"].as_u64().unwrap(), e["type"].as_str().unwrap().to_string()))
        .collect();

    // With the id as Last-Event-ID (what EventSource sends), and as ?since= (what curl users
    // paste): the events missed, in order, and no state.
    for (last_event_id, query) in [(Some(id.as_str()), String::new()), (None, format!("&since={id}"))] {
        let mut back = Sse::open(&gate.http, &format!("{url}{query}"), last_event_id).await;
        let mut replayed = Vec::new();
        for _ in 0..missed.len() {
            let event = back.next().await;
            replayed.push((
                event["seq"].as_u64().unwrap(),
                event["type"].as_str().unwrap().to_string(),
            ));
        }
        assert_eq!(replayed, missed, "resumed from {id}");
        assert_eq!(back.last_id, watcher.last_id, "both streams are at the same place");
    }
}

#[tokio::test]
async fn a_stream_resumed_past_the_backlog_or_elsewhere_gets_the_state_again() {
    let zk = zookeeper().await;
    let mut config = test_config(&zk.connect_string());
    config.event_backlog = 4;
    let gate = Gate::start_with(config).await;
    let other = Gate::start(&zk.connect_string()).await;
    let url = format!("{}/v1/events?topic={TOPIC}", gate.url);
    let mut watcher = Sse::open(&gate.http, &url, None).await;
    let mut truth = vec![watcher.next().await];
    let mut client = Sse::open(&gate.http, &url, None).await;
    client.next().await;
    let id = client.last_id.clone().expect("an id");
    drop(client);
    let mut writes = 0;
    // One event per write: each is seen before the next.
    for _ in 0..6 {
        let version = write(&gate, &mut writes).await;
        until_version(&mut watcher, &mut truth, version).await;
    }
    assert!(truth.len() > 5, "more events than the backlog keeps");

    let mut back = Sse::open(&gate.http, &url, Some(&id)).await;
    let resync = back.next().await;
    assert_eq!(
        (resync["type"].as_str(), resync["reason"].as_str()),
        (Some("resync"), Some("cannot_resume")),
        "{resync}"
    );
    assert_eq!(
        resync["seq"],
        truth.last().unwrap()["seq"],
        "the state as of the latest event"
    );
    assert_eq!(resync["state"]["version"], truth.last().unwrap()["state"]["version"]);
    // Then changes again, numbered on.
    let version = write(&gate, &mut writes).await;
    let mut after = vec![resync];
    until_version(&mut back, &mut after, version).await;
    assert_no_silent_gap(&after);

    // The id of a stream on another instance means nothing here: the state, honestly.
    let mut there = Sse::open(&other.http, &format!("{}/v1/events?topic={TOPIC}", other.url), None).await;
    there.next().await;
    let mut moved = Sse::open(&gate.http, &url, there.last_id.as_deref()).await;
    let event = moved.next().await;
    assert_eq!(
        (event["type"].as_str(), event["reason"].as_str()),
        (Some("resync"), Some("cannot_resume"))
    );
}

/// zkgate's ZooKeeper connection drops and comes back (`reconnected`) or its session expires
/// (`session_expired`) while a client is away: resuming, the client gets that `resync` (it is
/// among the recent events), then the changes after it.
#[tokio::test]
async fn a_resume_across_a_reconnection_or_a_session_expiry_carries_the_resync() {
    let zk = zookeeper().await;
    let connect = zk.connect_string();
    let proxy = Proxy::start(&connect).await;
    let gate = Gate::start(&proxy.connect_string()).await;
    let url = format!("{}/v1/locks/orders/events", gate.url);
    let mut watcher = Sse::open(&gate.http, &url, None).await;
    let mut truth = vec![watcher.next().await];
    let lease = gate.lease("60s").await;
    let held = gate.acquire("orders", &lease, "wait=0").await;
    assert_eq!(held.status, StatusCode::OK);
    watcher
        .until("lock:orders", &mut truth, |e| e["type"] == "granted")
        .await;

    for (fault, reason) in [("partition", "reconnected"), ("expiry", "session_expired")] {
        // A client took the watcher's last event, then went away.
        let id = watcher.last_id.clone().expect("an id");
        if fault == "partition" {
            common::drop_connection(&gate, &proxy).await;
        } else {
            expire_sessions(&proxy, &connect, gate.sessions().await).await;
        }
        let resync = watcher
            .until("lock:orders", &mut truth, |e| e["type"] == "resync")
            .await;
        assert_eq!(resync["reason"], reason, "{resync}");

        let mut back = Sse::open(&gate.http, &url, Some(&id)).await;
        let mut resumed = Vec::new();
        let event = back.until("lock:orders", &mut resumed, |e| e["type"] == "resync").await;
        assert_eq!(event["reason"], reason, "the fault is not hidden: {event}");
        assert_eq!(event["seq"], resync["seq"]);
        if reason == "session_expired" {
            assert_eq!(
                event["state"]["holder"]["fencing_token"], held.body["fencing_token"],
                "the holder's lease outlives the session"
            );
        }
    }
    assert_no_silent_gap(&truth);
}

#[tokio::test]
async fn a_quiet_stream_sends_heartbeats() {
    let zk = zookeeper().await;
    let mut config = test_config(&zk.connect_string());
    config.ws_ping_interval = Duration::from_millis(200);
    let gate = Gate::start_with(config).await;
    let mut stream = Sse::open(&gate.http, &format!("{}/v1/elections/quiet/events", gate.url), None).await;
    stream.next().await;
    stream.heartbeat().await;
    stream.heartbeat().await;
    assert!(stream.comments >= 2);
}

#[tokio::test]
async fn bad_streams_are_refused_with_a_problem_naming_what_is_wrong() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let many: String = (0..65).map(|i| format!("topic=lock:l{i}&")).collect();
    for (query, last_event_id, field) in [
        ("", None, "topic"),
        ("topic=nothing:x", None, "topic"),
        ("topic=lock", None, "topic"),
        ("topic=lock:a%2Fb", None, "topic"),
        ("topic=znode:sideways:kv", None, "topic"),
        ("topic=lease:no-such-lease", None, "topic"),
        ("topic=lock:a&topic=lock:a", None, "topic"),
        (many.as_str(), None, "topic"),
        ("topic=lock:a&wait=5s", None, "wait"),
        ("topic=lock:a&since=yesterday", None, "since"),
        ("topic=lock:a&topic=lock:b&since=1a-2", None, "since"),
        ("topic=lock:a", Some("not a position"), "Last-Event-ID"),
    ] {
        let url = format!("{}/v1/events?{query}", gate.url);
        let Err((status, body)) = Sse::try_open(&gate.http, &url, last_event_id, None).await else {
            panic!("{query} was followed");
        };
        let problem: Value = serde_json::from_str(&body).expect("a problem document");
        assert_eq!(
            (status, problem["field"].as_str()),
            (StatusCode::BAD_REQUEST, Some(field)),
            "{query}: {problem}"
        );
    }
    let Err((status, _)) = Sse::try_open(&gate.http, &format!("{}/v1/locks/a%2Fb/events", gate.url), None, None).await
    else {
        panic!("a bad name was followed");
    };
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn streams_need_a_grant_and_refuse_foreign_pages() {
    let zk = zookeeper().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let (path, [reader, admin]) = auth_config(&dir, [("reader", grant("team-", "read")), ("ops", ADMIN.to_string())]);
    let mut config = test_config(&zk.connect_string());
    config.auth_config = Some(path);
    let gate = Gate::start_with(config).await;
    let open = |url: String, token: Option<String>| {
        let http = gate.http.clone();
        async move { Sse::try_open(&http, &url, None, token.as_deref()).await.map(|_| ()) }
    };
    let mine = format!("{}/v1/events?topic=lock:team-a", gate.url);
    assert!(open(mine.clone(), Some(reader.clone())).await.is_ok());
    assert_eq!(open(mine.clone(), None).await.unwrap_err().0, StatusCode::UNAUTHORIZED);
    for url in [
        format!("{}/v1/events?topic=lock:team-a&topic=lock:other", gate.url),
        format!("{}/v1/locks/other/events", gate.url),
        format!("{}/v1/events?topic=znode:recursive:locks", gate.url),
    ] {
        assert_eq!(
            open(url.clone(), Some(reader.clone())).await.unwrap_err().0,
            StatusCode::FORBIDDEN,
            "{url}"
        );
        assert!(open(url, Some(admin.clone())).await.is_ok());
    }
    // A page elsewhere cannot make its visitor's browser follow zkgate's topics.
    let foreign = gate
        .http
        .get(&mine)
        .bearer_auth(&reader)
        .header("origin", "https://evil.example")
        .send()
        .await
        .expect("GET");
    assert_eq!(foreign.status(), StatusCode::FORBIDDEN);
}
