//! Idempotency keys, one mechanism for every operation that takes one (found in the served
//! spec, so that an operation added later is covered): a retry through either instance is
//! applied once and answered again; keys are per principal (alice's and bob's never meet);
//! the same key with another request is refused (422) the same way everywhere; records are
//! charged to their principal and bounded in number; a request that changes nothing stores
//! nothing.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{Gate, Reply, grant, idempotency_record, tree, within, zk_client, zookeeper};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use zkgate::config::ServeConfig;

/// Two instances on one ZooKeeper with principals alice and bob (each may write everything)
/// and a reader (who may read everything).
struct Two {
    both: common::TwoInstances<3>,
    alice: String,
    bob: String,
    reader: String,
}

impl std::ops::Deref for Two {
    type Target = common::TwoInstances<3>;

    fn deref(&self) -> &Self::Target {
        &self.both
    }
}

async fn two_instances(tune: impl Fn(&mut ServeConfig)) -> Two {
    let principals = [
        ("alice", grant("", "write")),
        ("bob", grant("", "write")),
        ("reader", grant("", "read")),
    ];
    let both = common::two_instances(principals, tune).await;
    let [alice, bob, reader] = both.tokens.clone();
    Two {
        both,
        alice,
        bob,
        reader,
    }
}

/// An operation of the served spec: its method, its path with its parameters filled in, and
/// the body its spec's example gives (or none).
#[derive(Clone, Debug)]
struct Operation {
    method: Method,
    path: String,
    body: Option<Vec<u8>>,
}

/// Every operation of the served spec that takes an `Idempotency-Key`, once with each of its
/// example bodies, its path parameters named after `tag` (so that each test has resources of
/// its own).
fn keyed_operations(tag: &str) -> Vec<Operation> {
    let spec = serde_json::to_value(zkgate::openapi()).expect("spec");
    let mut keyed = Vec::new();
    for (template, item) in spec["paths"].as_object().expect("paths") {
        for (method, operation) in item.as_object().expect("operations") {
            let takes_key = (operation["parameters"].as_array().into_iter().flatten())
                .any(|p| p["in"] == "header" && p["name"].as_str() == Some("Idempotency-Key"));
            if !takes_key {
                continue;
            }
            let examples = common::examples(&operation["requestBody"]);
            let bodies: Vec<Option<Value>> = match examples.is_empty() {
                true => vec![None],
                false => examples.into_iter().map(Some).collect(),
            };
            for body in bodies {
                let mut path = template.clone();
                while let (Some(open), Some(close)) = (path.find('{'), path.find('}')) {
                    path.replace_range(open..=close, &format!("{tag}-{}", keyed.len()));
                }
                keyed.push(Operation {
                    method: method.to_uppercase().parse().expect("method"),
                    path,
                    body: body.map(|e| e.to_string().into_bytes()),
                });
            }
        }
    }
    keyed
}

/// Sends `operation` as `token` with `key`, and `body` instead of its own when given.
async fn send(gate: &Gate, token: &str, operation: &Operation, key: &str, body: Option<&[u8]>) -> Reply {
    let mut request = gate
        .http
        .request(operation.method.clone(), format!("{}{}", gate.url, operation.path))
        .bearer_auth(token)
        .header("Idempotency-Key", key);
    if let Some(body) = body.map(<[u8]>::to_vec).or_else(|| operation.body.clone()) {
        request = request.header("content-type", "application/json").body(body);
    }
    Reply::read(request.send().await.expect("request")).await
}

/// An answer without what changes with time alone (a lease's remaining time).
fn settled(reply: &Reply) -> Value {
    let mut body = reply.body.clone();
    if let Some(object) = body.as_object_mut() {
        for moving in ["remaining_ms", "last_keepalive_at"] {
            object.remove(moving);
        }
    }
    body
}

/// What zkgate stores for its clients: every znode under the root with its data, but for what
/// the instances keep of themselves (registrations, heartbeats, the janitor's and the reaper's
/// nodes), which changes with time alone.
async fn stored(client: &zookeeper_client::Client) -> BTreeMap<String, Vec<u8>> {
    let mut nodes = tree(client, "/zkgate").await;
    nodes.retain(|path, _| {
        ![
            "/zkgate/instances",
            "/zkgate/keepers",
            "/zkgate/janitor",
            "/zkgate/reaper",
        ]
        .iter()
        .any(|own| path.starts_with(own))
    });
    nodes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_that_takes_a_key_applies_once_per_principal_through_either_instance() {
    let two = two_instances(|_| {}).await;
    let client = zk_client(&two.zk.connect_string()).await;
    let operations = keyed_operations("once");
    assert!(operations.len() >= 4, "{operations:?}");

    // Each applied through instance a: its key's record (and the record's charge) are
    // alice's, or (a request that changes nothing stores nothing) the tree is as it was.
    let mut firsts = Vec::new();
    for (i, operation) in operations.iter().enumerate() {
        let key = format!("retry-{i}");
        let before = stored(&client).await;
        let first = send(&two.a, &two.alice, operation, &key, None).await;
        assert!(first.status.is_success(), "{operation:?}: {first:?}");
        assert!(!first.replayed, "{operation:?}: {first:?}");
        let record = idempotency_record("alice", &key);
        let id = record.rsplit('/').next().expect("id");
        let recorded = client.check_stat(&record).await.expect("stat").is_some();
        if recorded {
            let charge = format!("/zkgate/usage/alice/ik-{id}");
            assert!(
                client.check_stat(&charge).await.expect("stat").is_some(),
                "{operation:?}: no {charge}"
            );
        } else {
            let differ = stored(&client).await != before;
            assert!(!differ, "{operation:?} kept no key but changed what ZooKeeper holds");
        }
        firsts.push((first, recorded));
    }
    let recorded = firsts.iter().filter(|(_, recorded)| *recorded).count();
    println!(
        "idempotency: {} requests (each example body of each operation of the served spec that takes an \
         Idempotency-Key): {recorded} kept their key, the other {} changed nothing and kept none: {:?}",
        operations.len(),
        operations.len() - recorded,
        operations
            .iter()
            .map(|o| format!("{} {}", o.method, o.path))
            .collect::<Vec<_>>()
    );
    assert!(recorded >= 4, "{recorded}");

    // The retries, through each instance: answered again, the same way, and nothing changes.
    let before = stored(&client).await;
    for (i, (operation, (first, recorded))) in operations.iter().zip(&firsts).enumerate() {
        let key = format!("retry-{i}");
        let via_a = send(&two.a, &two.alice, operation, &key, None).await;
        let via_b = send(&two.b, &two.alice, operation, &key, None).await;
        for retry in [&via_a, &via_b] {
            assert!(retry.status.is_success(), "{operation:?}: {retry:?}");
            assert_eq!(retry.replayed, *recorded, "{operation:?}: {retry:?}");
        }
        if !recorded {
            continue;
        }
        assert_eq!(via_a.status, via_b.status, "{operation:?}");
        assert_eq!(settled(&via_a), settled(&via_b), "{operation:?}");
        // A retry answers what the first request did, but where the first answer held what
        // only the write itself learns (a queue item's name): there it says it was stored.
        if first.body.get("duplicate").is_none() {
            assert_eq!(settled(&via_b), {
                let mut first = settled(first);
                for flag in ["repeated"] {
                    if let Some(object) = first.as_object_mut().filter(|o| o.contains_key(flag)) {
                        object.insert(flag.into(), json!(true));
                    }
                }
                first
            });
        }
    }
    assert_eq!(stored(&client).await, before, "a retry changed what ZooKeeper holds");

    for (i, (operation, (_, recorded))) in operations.iter().zip(&firsts).enumerate() {
        if !recorded {
            continue;
        }
        let key = format!("retry-{i}");
        // Bob's key of the same name is his own: applied, not alice's answer.
        let bobs = send(&two.b, &two.bob, operation, &key, None).await;
        assert!(bobs.status.is_success() && !bobs.replayed, "{operation:?}: {bobs:?}");
        // Alice's key with another request (one more byte of body) is refused, changing nothing.
        let before = stored(&client).await;
        let mut other = operation.body.clone().unwrap_or_else(|| b"{}".to_vec());
        other.push(b' ');
        let reused = send(&two.b, &two.alice, operation, &key, Some(&other)).await;
        reused.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, None);
        assert_eq!(reused.str("type"), "urn:zkgate:problem:idempotency-key-reused");
        assert_eq!(stored(&client).await, before, "{operation:?}");
    }
}

/// A principal that may only read stores nothing, with a key or without: a transaction of gets
/// with an `Idempotency-Key` leaves the tree as it was (on a82bd35 it stored its whole answer,
/// charged to nobody, for 24 h).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_that_only_reads_stores_nothing_for_its_key() {
    let two = two_instances(|_| {}).await;
    let client = zk_client(&two.zk.connect_string()).await;
    let value = json!({"blob": "x".repeat(200 * 1024)});
    let put = two
        .a
        .call_as(Some(&two.alice), Method::PUT, "/v1/kv/big", Some(value))
        .await;
    assert_eq!(put.status, StatusCode::CREATED, "{put:?}");
    let gets = json!({"then": [{"get": "big"}, {"get": "big"}]});
    let before = stored(&client).await;
    for (i, gate) in [&two.a, &two.b, &two.a].into_iter().enumerate() {
        let txn = Operation {
            method: Method::POST,
            path: "/v1/kv-txn".into(),
            body: Some(gets.to_string().into_bytes()),
        };
        for token in [&two.reader, &two.alice] {
            let read = send(gate, token, &txn, &format!("reads-{i}"), None).await;
            assert_eq!(read.status, StatusCode::OK, "{read:?}");
            assert_eq!(
                read.body["results"][0]["value"]["blob"].as_str().map(str::len),
                Some(200 * 1024)
            );
            assert!(!read.replayed, "{read:?}");
        }
    }
    assert_eq!(stored(&client).await, before, "a read stored something");
}

/// Alice's keys and bob's never meet: bob's transaction with `deploy-43` neither refuses nor
/// answers alice's with the same key (on a82bd35 hers was refused, naming his use).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_is_its_principals_own() {
    let two = two_instances(|_| {}).await;
    let txn = |key: &str| Operation {
        method: Method::POST,
        path: "/v1/kv-txn".into(),
        body: Some(json!({"then": [{"put": key, "text": key}]}).to_string().into_bytes()),
    };
    let bobs = send(&two.a, &two.bob, &txn("b/deploy"), "deploy-43", None).await;
    assert_eq!(bobs.status, StatusCode::OK, "{bobs:?}");
    let alices = send(&two.b, &two.alice, &txn("a/deploy"), "deploy-43", None).await;
    assert_eq!(alices.status, StatusCode::OK, "{alices:?}");
    assert!(!alices.replayed && alices.body["repeated"] == false, "{alices:?}");
    let written = two
        .a
        .call_as(Some(&two.alice), Method::GET, "/v1/kv/a/deploy", None)
        .await;
    assert_eq!(written.body, json!("a/deploy"), "alice's write applied");
    // Her own reuse is refused, saying nothing of bob's.
    let reused = send(&two.b, &two.alice, &txn("a/other"), "deploy-43", None).await;
    reused.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, None);
    assert!(!reused.body.to_string().contains("b/deploy"), "{reused:?}");
}

/// A lease's key holds through any instance (on a82bd35 only through the one that made it),
/// after that instance is killed, and refuses another body (a82bd35 returned the first lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_made_with_a_key_is_the_same_lease_through_any_instance_and_after_a_kill() {
    let zk = zookeeper().await;
    let mut maker = common::process::Process::start(&zk.connect_string()).await;
    let other = Gate::start(&zk.connect_string()).await;
    let create = |url: String, ttl: &str| {
        let request = common::http_client()
            .post(format!("{url}/v1/leases"))
            .header("Idempotency-Key", "worker-7")
            .json(&json!({ "ttl": ttl }));
        async move { Reply::read(request.send().await.expect("create")).await }
    };
    let first = create(maker.url.clone(), "20s").await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    let there = create(other.url.clone(), "20s").await;
    assert_eq!((there.status, there.str("id")), (StatusCode::CREATED, first.str("id")));
    assert!(there.replayed);
    let changed = create(other.url.clone(), "30s").await;
    changed.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, None);

    maker.kill().await;
    let after = create(other.url.clone(), "20s").await;
    assert_eq!(
        (after.status, after.str("id")),
        (StatusCode::CREATED, first.str("id")),
        "{after:?}"
    );
    let client = zk_client(&zk.connect_string()).await;
    let leases = client.list_children("/zkgate/leases").await.expect("leases");
    assert_eq!(leases, vec![first.str("id")], "one lease in all");
}

/// A principal's keys stay bounded at any rate: past `--idempotency-keys` the oldest are
/// forgotten (their charges with them), the newest are kept (on a82bd35 each kv transaction's
/// key stayed for 24 h, charged to nobody: the tree filled in minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_principals_keys_are_bounded_in_number_and_charged_to_it() {
    const LIMIT: usize = 40;
    let two = two_instances(|c| c.idempotency_keys = LIMIT as u32).await;
    let client = zk_client(&two.zk.connect_string()).await;
    let add = Operation {
        method: Method::POST,
        path: "/v1/counters/busy/add".into(),
        body: None,
    };
    for i in 0..(LIMIT * 5) {
        let gate = if i % 2 == 0 { &two.a } else { &two.b };
        let added = send(gate, &two.alice, &add, &format!("add-{i}"), None).await;
        assert_eq!(added.status, StatusCode::OK, "{added:?}");
    }
    // The evictions run beside the writes: wait for the store to be within its bound.
    let records = "/zkgate/idempotency/alice";
    let kept = within(Duration::from_secs(30), "the store within its bound", async {
        loop {
            let (children, watcher) = client.list_and_watch_children(records).await.expect("list");
            if children.len() <= LIMIT {
                return children;
            }
            watcher.changed().await;
        }
    })
    .await;
    let charges: Vec<String> = (client.list_children("/zkgate/usage/alice").await.expect("usage"))
        .into_iter()
        .filter(|c| c.starts_with("ik-"))
        .collect();
    assert_eq!(charges.len(), kept.len(), "one charge a record");
    // The newest key is remembered (its retry is answered, nothing added); the oldest is not.
    let newest = send(&two.b, &two.alice, &add, &format!("add-{}", LIMIT * 5 - 1), None).await;
    assert!(newest.replayed, "{newest:?}");
    let oldest = send(&two.b, &two.alice, &add, "add-0", None).await;
    assert!(!oldest.replayed, "{oldest:?}");
    // Both instances are in this process: the metric counts the evictions of either.
    let evicted = zkgate::metrics::get().idempotency_keys_evicted.get();
    assert!(evicted as usize >= LIMIT * 4, "{evicted}");
}
