//! Transactions over keys, at the recipe (issue 43, docs/PRIMITIVES.md part 2): a branch
//! applies whole or not at all, on a real ZooKeeper.

use crate::common;

use std::sync::Arc;

use common::{Gate, zookeeper};
use zkgate::kind::Kind;
use zkgate::recipes::kv;
use zkgate::recipes::kv::txn::{self, Check, Compare, Step, StepResult, Txn};

const MAX_VALUE: usize = 256 * 1024;

fn payer(state: &zkgate::AppState) -> zkgate::recipes::usage::Payer<'_> {
    zkgate::recipes::usage::Payer {
        quotas: &state.quotas,
        principal: None,
    }
}

fn put(path: &str, value: &str) -> Step {
    Step::Put {
        path: path.to_string(),
        data: value.as_bytes().to_vec(),
        lease: None,
    }
}

/// The bindings of a transaction that binds nothing: this instance's, and no lease.
fn unbound(state: &zkgate::AppState) -> txn::Bindings<'_> {
    static NO_LEASES: std::sync::LazyLock<std::collections::HashMap<String, Arc<zkgate::recipes::leases::Lease>>> =
        std::sync::LazyLock::new(Default::default);
    txn::Bindings {
        keys: &state.kv_keys,
        leases: &NO_LEASES,
        quotas: &state.quotas,
        caller: &zkgate::auth::Caller::Anyone,
    }
}

/// A read of the kv znode at `path` (under the test's root).
async fn read_key(state: &zkgate::AppState, session: &zkgate::zk::Session, path: &str) -> Option<kv::Entry> {
    let name = path
        .strip_prefix(&format!("{}/", Kind::Kv.base(&state.config.root)))
        .expect("a key's path");
    kv::read(session, &kv::Key::new(&state.kv_keys, name))
        .await
        .expect("read")
}

#[tokio::test]
async fn the_compares_pick_one_branch_and_it_applies_whole() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let state = &gate.running.state;
    let session = state.zk().connected().await.expect("connected");
    let key = |name: &str| Kind::Kv.path(&state.config.root, name);
    let (a, b, c) = (key("app/a"), key("app/b"), key("app/c"));
    let create = Txn {
        compare: vec![Check::Key {
            path: a.clone(),
            compare: Compare::Absent,
        }],
        then: vec![put(&a, "1"), put(&b, "1"), Step::Get { path: a.clone() }],
        otherwise: vec![Step::Get { path: a.clone() }],
    };
    let first = txn::run(
        &session,
        &create,
        MAX_VALUE,
        payer(state),
        unbound(state),
        (None, &zkgate::recipes::guards::Guards::none(), &[]),
    )
    .await
    .expect("commits");
    assert_eq!(first.failed_compare, None);
    let [
        StepResult::Put { created: true, .. },
        StepResult::Put { created: true, .. },
        StepResult::Get(Some(got)),
    ] = &first.results[..]
    else {
        panic!("then's results: {:?}", first.results)
    };
    assert_eq!(got.data, b"1", "a get after a put answers the put");
    // Again: `a` exists now, so the other branch runs, and `then`'s writes do not.
    let second = txn::run(
        &session,
        &create,
        MAX_VALUE,
        payer(state),
        unbound(state),
        (None, &zkgate::recipes::guards::Guards::none(), &[]),
    )
    .await
    .expect("commits");
    assert_eq!(second.failed_compare, Some(0));
    let [StepResult::Get(Some(read))] = &second.results[..] else {
        panic!("else's results: {:?}", second.results)
    };
    assert_eq!(read.data, b"1");
    // A delete of a key that is not there is no failure, and a branch whose delete is refused
    // (a key with keys below it) applies none of its writes.
    let refused = Txn {
        then: vec![put(&c, "x"), Step::Delete { path: key("app") }],
        ..Txn::default()
    };
    assert!(matches!(
        txn::run(&session, &refused, MAX_VALUE, payer(state), unbound(state), (None, &zkgate::recipes::guards::Guards::none(), &[])).await,
        Err(txn::TxnError::NotEmpty(path)) if path == key("app")
    ));
    assert!(
        read_key(state, &session, &c).await.is_none(),
        "nothing of a refused branch applies"
    );
}

/// Sixteen writers race to move three keys on together, each by a transaction that compares
/// two of them (N = 2 compares) and writes all three (M = 3 writes): if any branch applied in
/// part, the keys would part; if any success had not seen its compares hold at its commit, two
/// successes would have moved on from the same value. The checker: the keys end equal, at the
/// number of successes, and the values the successes saw are 0, 1, 2... each once.
#[tokio::test]
async fn racing_transactions_never_apply_in_part() {
    let zk = zookeeper().await;
    let gate = Arc::new(Gate::start(&zk.connect_string()).await);
    let state = &gate.running.state;
    let key = |name: &str| Kind::Kv.path(&state.config.root, name);
    let (a, b, c) = (key("trio/a"), key("trio/b"), key("trio/c"));
    let seen_by_winners = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut racers = Vec::new();
    for _ in 0..16 {
        let (gate, winners, a, b, c) = (gate.clone(), seen_by_winners.clone(), a.clone(), b.clone(), c.clone());
        racers.push(tokio::spawn(async move {
            let state = &gate.running.state;
            let session = state.zk().connected().await.expect("connected");
            for _ in 0..10 {
                let now = read_key(state, &session, &a).await;
                let seen = now
                    .as_ref()
                    .map_or(0, |e| String::from_utf8_lossy(&e.data).parse::<u64>().unwrap());
                let compare = |path: &str| Check::Key {
                    path: path.to_string(),
                    compare: match &now {
                        Some(entry) => Compare::Value(entry.data.clone()),
                        None => Compare::Absent,
                    },
                };
                let next = (seen + 1).to_string();
                let txn = Txn {
                    compare: vec![compare(&a), compare(&b)],
                    then: vec![put(&a, &next), put(&b, &next), put(&c, &next)],
                    otherwise: vec![],
                };
                match txn::run(
                    &session,
                    &txn,
                    MAX_VALUE,
                    payer(state),
                    unbound(state),
                    (None, &zkgate::recipes::guards::Guards::none(), &[]),
                )
                .await
                {
                    Ok(outcome) if outcome.failed_compare.is_none() => winners.lock().unwrap().push(seen),
                    Ok(_) | Err(txn::TxnError::Contended) => {}
                    Err(err) => panic!("transaction failed: {err:?}"),
                }
            }
        }));
    }
    for racer in racers {
        racer.await.expect("racer");
    }
    let session = state.zk().connected().await.expect("connected");
    let value = |entry: Option<kv::Entry>| String::from_utf8(entry.expect("there").data).unwrap();
    let values = [
        value(read_key(state, &session, &a).await),
        value(read_key(state, &session, &b).await),
        value(read_key(state, &session, &c).await),
    ];
    let mut seen = seen_by_winners.lock().unwrap().clone();
    seen.sort_unstable();
    let won = seen.len();
    assert!(won > 0, "some transaction won");
    assert_eq!(
        values,
        [won.to_string(), won.to_string(), won.to_string()],
        "the keys moved together, once per win"
    );
    assert_eq!(
        seen,
        (0..won as u64).collect::<Vec<_>>(),
        "each win saw its compares hold: no two moved on from the same value"
    );
}

#[tokio::test]
async fn over_http_a_transaction_answers_its_branch_and_refuses_what_it_cannot_apply() {
    use reqwest::StatusCode;
    use serde_json::json;
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let create = json!({
        "compare": [{"key": "cfg/version", "absent": true}],
        "then": [{"put": "cfg/app", "value": {"dark": true}}, {"put": "cfg/version", "text": "1"},
                 {"get": "cfg/app"}],
        "else": [{"get": "cfg/version"}],
    });
    let first = gate.post("/v1/kv-txn", Some(create.clone())).await;
    assert_eq!(first.status, StatusCode::OK, "{:?}", first.body);
    assert_eq!(first.body["succeeded"], true);
    assert_eq!(first.body["results"][0]["put"], "cfg/app");
    assert_eq!(first.body["results"][0]["created"], true);
    assert_eq!(first.body["results"][2]["value"], json!({"dark": true}));
    // The key reads over the kv routes as the put stored it, at the ETag the answer gave.
    let read = gate.get("/v1/kv/cfg/version").await;
    assert_eq!(read.body, json!(1), "text `1` reads back as the JSON number it is");
    let again = gate.post("/v1/kv-txn", Some(create)).await;
    assert_eq!(again.body["succeeded"], false);
    assert_eq!(again.body["failed_compare"], json!({"index": 0, "key": "cfg/version"}));
    assert_eq!(again.body["results"][0]["get"], "cfg/version");
    for (branch, count) in [("then", 1.0), ("else", 1.0)] {
        let name = format!("zkgate_kv_transactions_total{{branch=\"{branch}\"}}");
        assert_eq!(common::metric(&gate.url, &name).await, count, "{name}");
    }
    // Refused before ZooKeeper is asked: too many operations, a key written twice, a put
    // without a value, a compare of two tests at once.
    let many: Vec<_> = (0..65).map(|i| json!({"get": format!("k{i}")})).collect();
    let refused = [
        json!({"then": many}),
        json!({"then": [{"put": "a", "text": "1"}, {"delete": "a"}]}),
        json!({"then": [{"put": "a"}]}),
        json!({"compare": [{"key": "a", "exists": true, "absent": true}]}),
        json!({"then": [{"get": "../etc"}]}),
    ];
    for body in refused {
        let reply = gate.post("/v1/kv-txn", Some(body.clone())).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{body}: {:?}", reply.body);
        reply.assert_problem(StatusCode::BAD_REQUEST, None);
    }
    // Bytes per transaction: the body is bounded (512 KiB), a value by `--max-value-bytes`.
    let big = "x".repeat(200 * 1024);
    let too_much: Vec<_> = (0..3).map(|i| json!({"put": format!("a{i}"), "text": big})).collect();
    let reply = gate.post("/v1/kv-txn", Some(json!({"then": too_much}))).await;
    reply.assert_problem(StatusCode::PAYLOAD_TOO_LARGE, None);
    assert_eq!(
        reply.body["type"], "urn:zkgate:problem:body-too-large",
        "{:?}",
        reply.body
    );
    let over = "x".repeat(300 * 1024);
    let reply = gate
        .post("/v1/kv-txn", Some(json!({"then": [{"put": "a", "text": over}]})))
        .await;
    reply.assert_problem(StatusCode::PAYLOAD_TOO_LARGE, None);
    assert_eq!(
        reply.body["type"], "urn:zkgate:problem:value-too-large",
        "{:?}",
        reply.body
    );
    let untouched = gate.get("/v1/kv/a").await;
    assert_eq!(
        untouched.status,
        StatusCode::NOT_FOUND,
        "a refused transaction wrote nothing"
    );
}

/// A transaction's puts bound to a lease make keys that end with it, and the rule for bound
/// keys holds inside a transaction as for single writes: a plain put of a bound key, or a
/// bound put of a plain one, refuses the whole transaction.
#[tokio::test]
async fn a_transaction_binds_keys_to_a_lease_by_the_rule_of_single_writes() {
    use reqwest::StatusCode;
    use serde_json::json;
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let lease = gate.lease("30s").await;
    let txn = |body: serde_json::Value| gate.post("/v1/kv-txn", Some(body));
    let made = txn(json!({"then": [{"put": "svc/a", "text": "10.0.0.1", "lease": lease},
                                   {"put": "svc/index", "value": ["a"]}]}))
    .await;
    assert_eq!(made.status, StatusCode::OK, "{:?}", made.body);
    assert_eq!(made.body["results"][0]["lease"], json!(lease));
    assert_eq!(made.body["results"][1]["lease"], json!(null));
    let read = gate
        .http
        .get(format!("{}/v1/kv/svc/a", gate.url))
        .send()
        .await
        .expect("GET");
    assert_eq!(read.headers()["zkgate-lease"], lease.as_str());
    let view = gate.get(&format!("/v1/leases/{lease}")).await;
    assert_eq!(view.body["holdings"][0]["kind"], "kv", "{:?}", view.body);
    assert_eq!(view.body["holdings"][0]["name"], "svc/a");

    // A plain put of the bound key refuses the whole transaction; so does a bound put of a
    // plain key. Nothing of either applies.
    let refused = txn(json!({"then": [{"put": "svc/index", "value": ["b"]}, {"put": "svc/a", "text": "x"}]})).await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{:?}", refused.body);
    assert_eq!(refused.body["type"], "urn:zkgate:problem:key-bound");
    assert_eq!(refused.body["lease"], json!(lease));
    let refused = txn(json!({"then": [{"put": "svc/index", "value": ["c"], "lease": lease}]})).await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{:?}", refused.body);
    assert_eq!(refused.body["type"], "urn:zkgate:problem:key-not-bound");
    assert_eq!(gate.get("/v1/kv/svc/index").await.body, json!(["a"]));

    // A put with the key's own lease rewrites it, still bound; a delete takes it off the lease.
    let rewritten = txn(json!({"then": [{"put": "svc/a", "text": "10.0.0.2", "lease": lease}]})).await;
    assert_eq!(rewritten.status, StatusCode::OK, "{:?}", rewritten.body);
    assert_eq!(rewritten.body["results"][0]["created"], false);
    let deleted = txn(json!({"then": [{"delete": "svc/a"}, {"put": "svc/index", "value": []}]})).await;
    assert_eq!(deleted.status, StatusCode::OK, "{:?}", deleted.body);
    let view = gate.get(&format!("/v1/leases/{lease}")).await;
    assert_eq!(view.body["holdings"], json!([]), "the key left the lease");

    // Bound again by a transaction, the key ends with the lease.
    let again = txn(json!({"then": [{"put": "svc/b", "text": "10.0.0.3", "lease": lease}]})).await;
    assert_eq!(again.status, StatusCode::OK, "{:?}", again.body);
    let ended = gate.delete(&format!("/v1/leases/{lease}")).await;
    assert_eq!(ended.status, StatusCode::NO_CONTENT, "{ended:?}");
    assert_eq!(gate.get("/v1/kv/svc/b").await.status, StatusCode::NOT_FOUND);
    assert_eq!(gate.get("/v1/kv/svc/index").await.body, json!([]), "a plain key stays");
    // A lease that is not there: 404 before ZooKeeper is asked.
    let unknown = txn(json!({"then": [{"put": "svc/c", "text": "x", "lease": "00000000-0000"}]})).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND, "{:?}", unknown.body);
}

/// A transaction whose commit's reply is lost: without an `Idempotency-Key`, 503
/// `outcome-unknown` (it applied, and says it cannot tell); with one, it applies once and is
/// answered as applied, and the client's retry gets the same answer without applying again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_with_an_idempotency_key_applies_once_through_a_lost_reply() {
    use common::Reply;
    use reqwest::StatusCode;
    use serde_json::json;
    let zk = zookeeper().await;
    let proxy = common::proxy::Proxy::start(&zk.connect_string()).await;
    let gate = Gate::start(&proxy.connect_string()).await;
    let send = |body: serde_json::Value, key: Option<&'static str>| {
        let mut request = gate.http.post(format!("{}/v1/kv-txn", gate.url)).json(&body);
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        async move { Reply::read(request.send().await.expect("POST")).await }
    };
    // Move one unit from `stock` to `sold`, compared on `stock`'s ETag: applied twice, the
    // second would fail its compare, so the answer must come from the first.
    let stocked = send(
        json!({"then": [{"put": "shop/stock", "text": "10"}, {"put": "shop/sold", "text": "0"}]}),
        None,
    )
    .await;
    assert_eq!(stocked.status, StatusCode::OK, "{stocked:?}");
    let etag = stocked.body["results"][0]["etag"].clone();
    let sell = json!({
        "compare": [{"key": "shop/stock", "etag": etag}],
        "then": [{"put": "shop/stock", "text": "9"}, {"put": "shop/sold", "text": "1"}, {"get": "shop/stock"}],
        "else": [{"get": "shop/stock"}],
    });

    // Without a key: the lost reply is an unknown outcome.
    proxy.lose_next_create_reply_of("kv/shop/lost");
    let unknown = send(json!({"then": [{"put": "shop/lost", "text": "x"}]}), None).await;
    unknown.assert_problem(StatusCode::SERVICE_UNAVAILABLE, None);
    assert_eq!(
        unknown.body["type"], "urn:zkgate:problem:outcome-unknown",
        "{unknown:?}"
    );
    assert_eq!(proxy.create_replies_lost(), 1);

    // With one: applied once, answered as applied.
    proxy.lose_next_create_reply_of(common::idempotency_record("anyone", "sale-1"));
    let first = send(sell.clone(), Some("sale-1")).await;
    assert_eq!(first.status, StatusCode::OK, "{first:?}");
    assert_eq!(proxy.create_replies_lost(), 2, "the reply of the keyed commit was lost");
    assert_eq!(first.body["succeeded"], true, "{first:?}");
    assert_eq!(first.body["repeated"], false, "{first:?}");
    assert_eq!(first.body["results"][2]["value"], json!(9), "{first:?}");
    assert_eq!(gate.get("/v1/kv/shop/sold").await.body, json!(1));

    // The client's retry: the same answer, nothing applied again.
    let again = send(sell.clone(), Some("sale-1")).await;
    assert_eq!(again.status, StatusCode::OK, "{again:?}");
    assert_eq!(again.body["repeated"], true, "{again:?}");
    assert_eq!(again.body["succeeded"], true);
    assert_eq!(
        again.body["results"], first.body["results"],
        "answered as the first time"
    );
    let read = gate
        .http
        .get(format!("{}/v1/kv/shop/stock", gate.url))
        .send()
        .await
        .expect("GET");
    assert_eq!(
        read.headers()["etag"],
        first.body["results"][0]["etag"].as_str().unwrap()
    );
    assert_eq!(gate.get("/v1/kv/shop/sold").await.body, json!(1), "applied once");

    // The key of another transaction is refused, and changes nothing.
    let other = send(json!({"then": [{"put": "shop/sold", "text": "5"}]}), Some("sale-1")).await;
    other.assert_problem(StatusCode::UNPROCESSABLE_ENTITY, None);
    assert_eq!(
        other.body["type"], "urn:zkgate:problem:idempotency-key-reused",
        "{other:?}"
    );
    assert_eq!(gate.get("/v1/kv/shop/sold").await.body, json!(1));
}
