//! Transactions over keys, at the recipe (issue 43, docs/PRIMITIVES.md part 2): a branch
//! applies whole or not at all, on a real ZooKeeper.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{Gate, zookeeper};
use zkgate::kind::Kind;
use zkgate::recipes::kv;
use zkgate::recipes::kv_txn::{self, Check, Compare, Step, StepResult, Txn};

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
    }
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
        compare: vec![Check {
            path: a.clone(),
            compare: Compare::Absent,
        }],
        then: vec![put(&a, "1"), put(&b, "1"), Step::Get { path: a.clone() }],
        otherwise: vec![Step::Get { path: a.clone() }],
    };
    let first = kv_txn::run(&session, &create, MAX_VALUE, payer(state))
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
    let second = kv_txn::run(&session, &create, MAX_VALUE, payer(state))
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
        kv_txn::run(&session, &refused, MAX_VALUE, payer(state)).await,
        Err(kv_txn::TxnError::NotEmpty(path)) if path == key("app")
    ));
    assert!(
        kv::read(&session, &c).await.expect("read").is_none(),
        "nothing of a refused branch applies"
    );
}

/// Sixteen writers race to move a pair of keys on together, each by a transaction that compares
/// the first key's value and writes both: if any branch applied in part, the two would part.
#[tokio::test]
async fn racing_transactions_never_apply_in_part() {
    let zk = zookeeper().await;
    let gate = Arc::new(Gate::start(&zk.connect_string()).await);
    let state = &gate.running.state;
    let key = |name: &str| Kind::Kv.path(&state.config.root, name);
    let (a, b) = (key("pair/a"), key("pair/b"));
    let won = Arc::new(AtomicUsize::new(0));
    let mut racers = Vec::new();
    for _ in 0..16 {
        let (gate, won, a, b) = (gate.clone(), won.clone(), a.clone(), b.clone());
        racers.push(tokio::spawn(async move {
            let session = gate.running.state.zk().connected().await.expect("connected");
            for _ in 0..10 {
                let now = kv::read(&session, &a).await.expect("read");
                let seen = now
                    .as_ref()
                    .map_or(0, |e| String::from_utf8_lossy(&e.data).parse::<u64>().unwrap());
                let compare = match &now {
                    Some(entry) => Compare::Value(entry.data.clone()),
                    None => Compare::Absent,
                };
                let next = (seen + 1).to_string();
                let txn = Txn {
                    compare: vec![Check {
                        path: a.clone(),
                        compare,
                    }],
                    then: vec![put(&a, &next), put(&b, &next)],
                    otherwise: vec![],
                };
                match kv_txn::run(&session, &txn, MAX_VALUE, payer(&gate.running.state)).await {
                    Ok(outcome) if outcome.failed_compare.is_none() => {
                        won.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(_) | Err(kv_txn::TxnError::Contended) => {}
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
    let (a, b) = (
        value(kv::read(&session, &a).await.unwrap()),
        value(kv::read(&session, &b).await.unwrap()),
    );
    let won = won.load(Ordering::Relaxed);
    assert!(won > 0, "some transaction won");
    assert_eq!(a, b, "both keys moved together");
    assert_eq!(
        a,
        won.to_string(),
        "each win moved them once: no win was lost or applied twice"
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
    let untouched = gate.get("/v1/kv/a").await;
    assert_eq!(
        untouched.status,
        StatusCode::NOT_FOUND,
        "a refused transaction wrote nothing"
    );
}
