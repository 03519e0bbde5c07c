//! `zkgate kv`, `lease`, `counter` and `leader`: the real binary against a real zkgate, as a
//! shell script uses them: what they print (as text and as JSON), and their exit statuses for
//! a "no" (1), a refused token and an unreachable instance (125), and a lease kept alive that
//! ends (1).

use crate::common;

use std::process::Stdio;
use std::time::Duration;

use common::process;
use common::{Gate, auth_config, grant, test_config, within, zookeeper};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

/// What one run of `zkgate` came to.
#[derive(Debug)]
struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

/// `zkgate <args>` against `url` (given as `ZKGATE_URL`, with `token` as `ZKGATE_TOKEN`, and
/// `input` on its stdin), to its end.
async fn zkgate(url: &str, token: Option<&str>, args: &[&str], input: Option<&str>) -> Ran {
    let mut command = process::client(args, &[], &[]);
    command
        .env("ZKGATE_URL", url)
        .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() });
    if let Some(token) = token {
        command.env("ZKGATE_TOKEN", token);
    }
    let mut child = command.spawn().expect("run zkgate");
    if let Some(input) = input {
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(input.as_bytes()).await.expect("write stdin");
    }
    let output = within(Duration::from_secs(60), "zkgate to exit", child.wait_with_output())
        .await
        .expect("zkgate's output");
    Ran {
        code: output.status.code().expect("exited"),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Asserts `ran` succeeded; its stdout.
fn ok(ran: Ran) -> String {
    assert_eq!(ran.code, 0, "{ran:?}");
    ran.stdout
}

#[tokio::test]
async fn kv_puts_gets_lists_deletes_and_runs_a_transaction_saying_no_with_exit_1() {
    let zk = zookeeper().await;
    let gate = Gate::start(&zk.connect_string()).await;
    let url = gate.url.as_str();
    let z = async |args: &[&str]| zkgate(url, None, args, None).await;

    let etag = ok(z(&["kv", "put", "app/color", "blue"]).await);
    assert!(etag.trim().starts_with('"'), "the ETag: {etag:?}");
    assert_eq!(ok(z(&["kv", "get", "app/color"]).await), "blue\n");
    // A value from stdin, JSON when it parses as JSON.
    ok(zkgate(url, None, &["kv", "put", "app/limits"], Some("{\"max\": 5}")).await);
    let limits: Value = serde_json::from_str(&ok(z(&["kv", "get", "app/limits", "-o", "json"]).await)).expect("JSON");
    assert_eq!(limits["value"], json!({"max": 5}), "{limits}");
    assert_eq!(ok(z(&["kv", "ls", "app"]).await), "color\nlimits\n");

    // A condition that does not hold is a "no": exit 1, and nothing written.
    let stale = z(&["kv", "put", "app/color", "red", "--if-match", "\"1\""]).await;
    assert_eq!(stale.code, 1, "{stale:?}");
    assert!(!ok(z(&["kv", "put", "app/color", "green", "--if-match", etag.trim()]).await).is_empty());
    assert_eq!(ok(z(&["kv", "get", "app/color"]).await), "green\n");

    // --wait prints the next value: past the version it names, whenever the write lands.
    let green: Value = serde_json::from_str(&ok(z(&["kv", "get", "app/color", "-o", "json"]).await)).expect("JSON");
    let green = green["etag"].as_str().expect("an ETag").to_string();
    let waiting = tokio::spawn({
        let (url, green) = (url.to_string(), green.clone());
        async move {
            zkgate(
                &url,
                None,
                &["kv", "get", "app/color", "--wait", "20s", "--after", &green],
                None,
            )
            .await
        }
    });
    ok(z(&["kv", "put", "app/color", "teal"]).await);
    let waited = within(Duration::from_secs(30), "the wait", waiting)
        .await
        .expect("joined");
    assert_eq!(ok(waited), "teal\n");
    let unchanged = z(&["kv", "get", "app/color", "--wait", "200ms"]).await;
    assert_eq!(unchanged.code, 1, "nothing changed: {unchanged:?}");

    let txn = json!({"compare": [{"key": "app/color", "text": "teal"}], "then": [{"put": "app/seen", "value": true}]});
    let ran = zkgate(url, None, &["kv", "txn"], Some(&txn.to_string())).await;
    let answer: Value = serde_json::from_str(&ok(ran)).expect("JSON");
    assert_eq!(answer["succeeded"], true, "{answer}");
    // A compare that does not hold: the `else` ran, printed all the same, and exit 1.
    let txn = json!({"compare": [{"key": "app/color", "text": "blue"}], "else": [{"get": "app/seen"}]});
    let ran = zkgate(url, None, &["kv", "txn"], Some(&txn.to_string())).await;
    assert_eq!(ran.code, 1, "{ran:?}");
    let answer: Value = serde_json::from_str(&ran.stdout).expect("JSON");
    assert_eq!(answer["succeeded"], false, "{answer}");

    ok(z(&["kv", "rm", "app/color"]).await);
    let gone = z(&["kv", "get", "app/color"]).await;
    assert_eq!((gone.code, gone.stdout.as_str()), (1, ""), "{gone:?}");
    assert!(gone.stderr.contains("no key `app/color`"), "{gone:?}");
}

#[tokio::test]
async fn leases_counters_and_leaders_and_the_exit_statuses_of_a_refused_token_an_unreachable_instance_and_a_lost_lease()
{
    let zk = zookeeper().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (auth, [ops, reader]) = auth_config(&dir, [("ops", grant("", "write")), ("reader", grant("", "read"))]);
    let mut config = test_config(&zk.connect_string());
    config.auth_config = Some(auth);
    let gate = Gate::start_with(config).await;
    let url = gate.url.as_str();
    let z = async |args: &[&str]| zkgate(url, Some(&ops), args, None).await;

    assert_eq!(ok(z(&["counter", "add", "hits"]).await), "1\n");
    assert_eq!(ok(z(&["counter", "add", "hits", "-3"]).await), "-2\n");
    let hits: Value = serde_json::from_str(&ok(z(&["counter", "get", "hits", "-o", "json"]).await)).expect("JSON");
    assert_eq!(hits["value"], -2, "{hits}");

    let lease = ok(z(&["lease", "create", "--ttl", "10s"]).await).trim().to_string();
    assert!(ok(z(&["lease", "ls"]).await).starts_with(&format!("{lease} ttl=10000ms")));
    // Nobody leads; then a campaign with the lease leads, and `leader` prints its value.
    let none = z(&["leader", "jobs"]).await;
    assert_eq!(none.code, 1, "{none:?}");
    let waiting = tokio::spawn({
        let (url, ops) = (url.to_string(), ops.clone());
        async move {
            zkgate(
                &url,
                Some(&ops),
                &["leader", "jobs", "--wait", "20s", "--after", "0"],
                None,
            )
            .await
        }
    });
    let campaign = gate
        .call_as(
            Some(&ops),
            reqwest::Method::POST,
            "/v1/elections/jobs/campaign",
            Some(json!({"lease": lease, "value": "worker-1"})),
        )
        .await;
    assert_eq!(campaign.status, reqwest::StatusCode::OK, "{campaign:?}");
    assert_eq!(ok(z(&["leader", "jobs"]).await), "worker-1\n");
    // The waiter, past "nobody leads", saw the first leader, whenever it read.
    let waited = within(Duration::from_secs(30), "the leader wait", waiting)
        .await
        .expect("joined");
    assert_eq!(ok(waited), "worker-1\n");

    // A lease kept alive ends when another deletes it: exit 1, saying so.
    let keeper = tokio::spawn({
        let (url, ops, lease) = (url.to_string(), ops.clone(), lease.clone());
        async move { zkgate(&url, Some(&ops), &["lease", "keepalive", &lease], None).await }
    });
    ok(z(&["lease", "keepalive", &lease, "--once"]).await);
    ok(z(&["lease", "rm", &lease]).await);
    let kept = within(Duration::from_secs(30), "the keepalive to end", keeper)
        .await
        .expect("joined");
    assert_eq!(kept.code, 1, "{kept:?}");
    assert!(kept.stderr.contains(&lease), "{kept:?}");

    // A token that may not write, none, and no instance: 125, with the reason in one line.
    let refused = zkgate(url, Some(&reader), &["counter", "add", "hits"], None).await;
    let anonymous = zkgate(url, None, &["kv", "get", "a"], None).await;
    let nowhere = zkgate("http://127.0.0.1:1", Some(&ops), &["lease", "ls"], None).await;
    for (ran, says) in [
        (refused, "no write access"),
        (anonymous, "token"),
        (nowhere, "cannot reach zkgate"),
    ] {
        assert_eq!(ran.code, 125, "{ran:?}");
        assert!(
            ran.stderr.contains(says) && ran.stderr.lines().count() == 1,
            "{says}: {ran:?}"
        );
    }
}
