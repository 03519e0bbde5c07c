//! The tree stays bounded under churn: after many unique lock names, transactions and keyed
//! puts have come and gone, ZooKeeper holds what it held before plus what is still live.
//! Lock names go as containers (ZooKeeper removes them); idempotency keys, decided
//! transactions and empty queues go by the janitor, which one instance of the cluster runs.

use crate::common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Gate, test_config, tree, zk_client, znode_count, zookeeper, zookeeper_own};
use reqwest::{Method, StatusCode};
use serde_json::json;

/// The subtrees of what stays live (the item's charge is under the usage).
/// ZooKeeper's own nodes count too: a principal's quota has its node under `/zookeeper/quota`.
const LIVE: [&str; 6] = [
    "/zkgate/locks/held",
    "/zkgate/idempotency",
    "/zkgate/txns/open",
    "/zkgate/queues/keep",
    "/zkgate/usage",
    "/zookeeper/quota/zkgate/usage",
];

/// Whether `path` is an idempotency key's charge (`usage/<principal>/ik-<id>`): it goes with its
/// key, past the window, so it is not live (the usage directories are).
fn is_key_charge(path: &str) -> bool {
    path.starts_with("/zkgate/usage/") && path.rsplit('/').next().is_some_and(|name| name.starts_with("ik-"))
}

/// How many unique names the churn goes through: lock names, transactions, keyed puts. A few
/// thousand leave every kind of leftover, many times over, for the containers and the janitor
/// to take back, and a larger churn only repeats them; the 100,000-name run is a bench
/// (`ZKGATE_BENCH_PARTS=retention cargo bench --bench costs`, figures in BENCHMARKS.md).
const CHURN: (usize, usize, usize) = (2_000, 1_000, 1_000);

/// Runs `each(i)` for i in 0..n on `workers` tasks.
async fn spread<F, Fut>(n: usize, workers: usize, each: F)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let each = Arc::new(each);
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            let each = each.clone();
            tokio::spawn(async move {
                for i in (w..n).step_by(workers) {
                    each(i).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("worker");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_churn_zookeeper_holds_its_baseline_plus_what_is_live() {
    common::yield_the_cpu();
    let zk = zookeeper_own().await;
    let port = zk.client_port();
    let mut config = test_config(&zk.connect_string());
    config.idempotency_window = Duration::from_secs(1);
    config.txn_retention = Duration::from_secs(1);
    config.janitor_interval = Duration::from_millis(200);
    config.janitor_rate = 1_000_000;
    config.quota_znodes = 0;
    config.quota_znodes_per_principal = 0;
    let gate = Arc::new(Gate::start_with(config).await);
    let client = zk_client(&zk.connect_string()).await;
    // The kinds' directories are part of the baseline (they stay, empty).
    let options = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    for kind in ["locks", "txns", "queues"] {
        let _ = client.create(&format!("/zkgate/{kind}"), &[], &options).await;
    }
    let baseline = znode_count(port).await;
    let baseline_tree: BTreeSet<String> = tree(&client, "/").await.into_keys().collect();

    // What stays live: a held lock, an open transaction, a queue with one keyed item.
    let lease = gate.lease("10m").await;
    assert_eq!(gate.acquire("held", &lease, "wait=0").await.status, StatusCode::OK);
    let open = gate
        .post(
            "/v1/txns",
            Some(json!({"id": "open", "participants": ["p"], "deadline": "10m"})),
        )
        .await;
    assert_eq!(open.status, StatusCode::CREATED, "{open:?}");
    let kept = gate
        .http
        .post(format!("{}/v1/queues/keep/items", gate.url))
        .header("Idempotency-Key", "kept")
        .json(&json!("kept"))
        .send()
        .await
        .expect("put");
    assert_eq!(kept.status(), StatusCode::CREATED);

    let (locks, txns, puts) = CHURN;
    let started = Instant::now();
    // Unique lock names, each taken and released.
    {
        let (gate, lease) = (gate.clone(), lease.clone());
        spread(locks, 16, move |i| {
            let (gate, lease) = (gate.clone(), lease.clone());
            async move {
                let held = gate.acquire(&format!("order-{i}"), &lease, "wait=5s").await;
                assert_eq!(held.status, StatusCode::OK, "{held:?}");
                gate.release(&format!("order-{i}"), &held.str("handle")).await;
            }
        })
        .await;
    }
    // Transactions, each decided (an abort at its deadline: nobody registered).
    {
        let gate = gate.clone();
        spread(txns, 16, move |i| {
            let gate = gate.clone();
            async move {
                let body = json!({"id": format!("t-{i}"), "participants": ["p"], "deadline": "1ms"});
                let created = gate.post("/v1/txns", Some(body)).await;
                assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
            }
        })
        .await;
    }
    // Keyed puts, each taken.
    {
        let gate = gate.clone();
        spread(puts, 16, move |i| {
            let gate = gate.clone();
            async move {
                let put = gate
                    .http
                    .post(format!("{}/v1/queues/churn/items", gate.url))
                    .header("Idempotency-Key", format!("k-{i}"))
                    .json(&json!(i))
                    .send()
                    .await
                    .expect("put");
                assert_eq!(put.status(), StatusCode::CREATED);
                let taken = gate
                    .call(Method::POST, "/v1/queues/churn/take?wait=5s&mode=at-most-once", None)
                    .await;
                assert_eq!(taken.status, StatusCode::OK, "{taken:?}");
            }
        })
        .await;
    }
    let churned = started.elapsed();
    // Every creation and deletion from here on is an event (set before the count is read, so
    // none is missed): the test follows the count by them, and reads ZooKeeper's own count
    // when they say it should be down.
    let mut events = client
        .watch("/", zookeeper_client::AddWatchMode::PersistentRecursive)
        .await
        .expect("a recursive watch");
    let peak = znode_count(port).await;

    // ZooKeeper's containers and the janitor take it back down to the baseline and the live
    // resources (counted from their subtrees).
    let settled = Instant::now();
    let mut now = peak;
    let mut expected = peak;
    // The live lease's record and its reference to the held lock are live too.
    let record = format!("/zkgate/leases/{lease}");
    let live = |path: &str| {
        (LIVE.iter().any(|prefix| path.starts_with(prefix)) && !is_key_charge(path)) || path.starts_with(&record)
    };
    // What the tree holds beyond the baseline that is not live: what the wait is for, and what
    // the test names if it stays.
    let left_behind = |after: &BTreeSet<String>| -> Vec<String> {
        after.difference(&baseline_tree).filter(|p| !live(p)).cloned().collect()
    };
    // (Past the bound, what is left behind is named below.)
    let _ = tokio::time::timeout(Duration::from_secs(180), async {
        loop {
            let mut live = tree(&client, &format!("/zkgate/leases/{lease}")).await.len() as u64;
            for prefix in LIVE {
                let below = tree(&client, prefix).await;
                live += below.keys().filter(|path| !is_key_charge(path)).count() as u64;
            }
            if expected <= baseline + live {
                now = znode_count(port).await;
                if now <= baseline + live {
                    // The count is down; done if the tree says so too (the live count was read
                    // before ZooKeeper's, and something live may have gone in between, so the
                    // count alone once ended the wait with a key's charge still there).
                    let after: BTreeSet<String> = tree(&client, "/").await.into_keys().collect();
                    if left_behind(&after).is_empty() {
                        return;
                    }
                    events.changed().await;
                    continue;
                }
                expected = now;
            }
            // Counted from the events until they say it is down (events between the watch
            // and the first count may be counted twice: that only makes the count read early).
            while expected > baseline + live {
                match events.changed().await.event_type {
                    zookeeper_client::EventType::NodeCreated => expected += 1,
                    zookeeper_client::EventType::NodeDeleted => expected = expected.saturating_sub(1),
                    _ => {}
                }
            }
        }
    })
    .await;
    let after: BTreeSet<String> = tree(&client, "/").await.into_keys().collect();
    let extra: Vec<&String> = after.difference(&baseline_tree).collect();
    assert!(left_behind(&after).is_empty(), "left behind: {:?}", left_behind(&after));
    assert!(baseline_tree.is_subset(&after), "something of the baseline went");
    assert_eq!(znode_count(port).await, baseline + extra.len() as u64, "{extra:?}");
    eprintln!(
        "churn of {locks} lock names, {txns} transactions, {puts} keyed puts in {:.1?}: znodes {baseline} before, {peak} after the churn, {now} {:.1?} later ({} live: {extra:?})",
        churned,
        settled.elapsed(),
        extra.len()
    );
    // What is live is still there, and works.
    assert_eq!(gate.get("/v1/txns/open").await.status, StatusCode::OK);
    let item = gate
        .call(Method::POST, "/v1/queues/keep/take?wait=0&mode=at-most-once", None)
        .await;
    assert_eq!(item.body["body"], "kept", "{item:?}");
}

/// A config for `connect` whose janitor keeps keys and decided transactions for `window`.
fn quick_janitor(connect: &str, window: Duration) -> zkgate::config::ServeConfig {
    let mut config = test_config(connect);
    config.idempotency_window = window;
    config.txn_retention = window;
    config.janitor_interval = Duration::from_millis(100);
    config
}

/// The id of the instance holding the janitor's node once it is not `not` (watched, not
/// polled).
async fn janitor_other_than(client: &zookeeper_client::Client, not: Option<&str>) -> String {
    common::within(Duration::from_secs(30), "a janitor", async {
        loop {
            let (data, _, watcher) = match client.get_and_watch_data("/zkgate/janitor").await {
                Ok(read) => read,
                Err(zookeeper_client::Error::NoNode) => {
                    let (stat, watcher) = client.check_and_watch_stat("/zkgate/janitor").await.expect("exists");
                    if stat.is_none() {
                        watcher.changed().await;
                    }
                    continue;
                }
                Err(err) => panic!("read the janitor's node: {err}"),
            };
            let id = String::from_utf8(data).expect("an id");
            if Some(id.as_str()) != not {
                return id;
            }
            watcher.changed().await;
        }
    })
    .await
}

/// Waits until `path` does not exist (an exists-watch: the event, not a poll).
async fn until_gone(client: &zookeeper_client::Client, path: &str) {
    common::within(Duration::from_secs(30), &format!("{path} to go"), async {
        loop {
            let (stat, watcher) = client.check_and_watch_stat(path).await.expect("exists");
            if stat.is_none() {
                return;
            }
            watcher.changed().await;
        }
    })
    .await;
}

async fn put_keyed(gate: &Gate, queue: &str, key: &str) -> StatusCode {
    gate.http
        .post(format!("{}/v1/queues/{queue}/items", gate.url))
        .header("Idempotency-Key", key)
        .json(&json!(key))
        .send()
        .await
        .expect("put")
        .status()
}

#[tokio::test]
async fn a_key_dedups_within_its_window_and_a_decided_transaction_is_readable_until_its_retention() {
    let zk = zookeeper().await;
    let gate = Gate::start_with(quick_janitor(&zk.connect_string(), Duration::from_secs(2))).await;
    let client = zk_client(&zk.connect_string()).await;

    assert_eq!(put_keyed(&gate, "mail", "welcome-7").await, StatusCode::CREATED);
    assert_eq!(
        put_keyed(&gate, "mail", "welcome-7").await,
        StatusCode::OK,
        "a retry within the window"
    );
    let created = gate
        .post(
            "/v1/txns",
            Some(json!({"id": "order-9", "participants": ["p"], "deadline": "1ms"})),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED);
    let decided = gate.get("/v1/txns/order-9?wait=10s").await;
    assert_eq!(decided.body["decision"]["outcome"], "abort", "{decided:?}");

    // Past the window: the key is gone (a put with it is new), and so is the transaction.
    until_gone(&client, &common::idempotency_record("anyone", "welcome-7")).await;
    assert_eq!(
        put_keyed(&gate, "mail", "welcome-7").await,
        StatusCode::CREATED,
        "a new put"
    );
    until_gone(&client, "/zkgate/txns/order-9").await;
    gate.get("/v1/txns/order-9")
        .await
        .assert_problem(StatusCode::NOT_FOUND, None);
    // The queue still holds both items: only the key went.
    assert_eq!(gate.get("/v1/queues/mail").await.body["depth"], 2);
}

#[tokio::test]
async fn one_janitor_per_cluster_and_another_takes_over_when_it_stops() {
    let zk = zookeeper().await;
    let connect = zk.connect_string();
    let a = Gate::start_with(quick_janitor(&connect, Duration::from_secs(1))).await;
    let b = Gate::start_with(quick_janitor(&connect, Duration::from_secs(1))).await;
    let client = zk_client(&connect).await;
    let ids = [
        a.running.state.instance.id.to_string(),
        b.running.state.instance.id.to_string(),
    ];

    // One of them holds the janitor's node (the other waits on it).
    let holder = janitor_other_than(&client, None).await;
    assert!(ids.contains(&holder), "{holder} not in {ids:?}");

    // It stops: the other takes over, and does the work.
    let (janitor, other) = if holder == ids[0] { (a, b) } else { (b, a) };
    janitor.running.stop().await.expect("stop");
    let successor = janitor_other_than(&client, Some(&holder)).await;
    assert_eq!(successor, other.running.state.instance.id.to_string());
    assert_eq!(put_keyed(&other, "mail", "k").await, StatusCode::CREATED);
    until_gone(&client, "/zkgate/queues/mail/keys/k").await;
}
