//! Graceful shutdown: on SIGTERM an instance closes its sockets with a close frame, removes
//! its registration at once and stops keeping its leases without ending any: the other
//! instances take them over, and every lock, leadership and membership stays as it was.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::process::Process;
use common::{Gate, wait_children, within, zookeeper};
use futures::StreamExt;
use reqwest::{Method, StatusCode};
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_hands_every_lease_over_and_ends_none() {
    let zk = zookeeper().await;
    // A long session timeout: the others must not need it to take the leases over.
    let mut leaving = Process::start_with(&zk.connect_string(), &["--session-timeout", "20s"]).await;
    let staying = Arc::new(Gate::start(&zk.connect_string()).await);
    let lease = leaving.lease("60s").await;
    let (status, held) = leaving
        .call(
            Method::POST,
            "/v1/locks/handover/acquire?wait=0",
            Some(json!({"lease": lease})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (joined, _) = leaving
        .call(
            Method::PUT,
            "/v1/groups/workers/members/leaving",
            Some(json!({"lease": lease})),
        )
        .await;
    assert_eq!(joined, StatusCode::CREATED);
    let (mut socket, _) =
        tokio_tungstenite::connect_async(format!("ws{}/v1/ws", leaving.url.trim_start_matches("http")))
            .await
            .expect("socket");

    let waiter = staying.lease("60s").await;
    let waiting = {
        let staying = staying.clone();
        tokio::spawn(async move { staying.acquire("handover", &waiter, "wait=30s").await })
    };
    wait_children(&zk.connect_string(), "/zkgate/locks/handover", 2).await;

    let sent = Instant::now();
    leaving.terminate();
    // The socket gets a close frame saying the server goes away.
    let close = within(Duration::from_secs(10), "the close frame", async {
        loop {
            match socket.next().await {
                Some(Ok(Message::Close(frame))) => return frame.map(|f| u16::from(f.code)),
                Some(Ok(_)) => continue,
                other => panic!("no close frame: {other:?}"),
            }
        }
    })
    .await;
    assert_eq!(close, Some(1001));
    let status = within(Duration::from_secs(30), "the process to exit", leaving.child.wait())
        .await
        .expect("exit status");
    assert!(status.success(), "{status:?}; {}", leaving.diagnose());

    // The lease lives on, kept alive through the other instance, and holds what it held.
    let kept = staying.post(&format!("/v1/leases/{lease}/keepalive"), None).await;
    assert_eq!(kept.status, StatusCode::OK, "{kept:?}");
    println!("keepalive answered again {:?} after SIGTERM", sent.elapsed());
    let state = staying.get("/v1/locks/handover").await;
    assert_eq!(
        state.body["holder"]["fencing_token"], held["fencing_token"],
        "{state:?}"
    );
    let members = staying.get("/v1/groups/workers").await;
    assert_eq!(members.body["members"][0]["id"], "leaving", "{members:?}");
    assert!(!waiting.is_finished(), "nothing was released");
    // Until its holder lets it go, through the instance that keeps it now.
    let handle = held["handle"].as_str().expect("handle");
    staying.release("handover", handle).await;
    let granted = within(Duration::from_secs(10), "the waiter's grant", waiting)
        .await
        .expect("task");
    assert_eq!(granted.status, StatusCode::OK, "{granted:?}");
}

/// When the graceful part cannot finish (here ZooKeeper does not answer, so the registration
/// cannot be removed), a second SIGTERM ends the process at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_exits_at_once() {
    let zk = zookeeper().await;
    let proxy = common::proxy::Proxy::start(&zk.connect_string()).await;
    let mut leaving = Process::start_with(&proxy.connect_string(), &["--session-timeout", "20s"]).await;
    let (held, _) = leaving.call(Method::POST, "/v1/locks/stuck/acquire?wait=0", None).await;
    assert_eq!(held, StatusCode::OK);

    // Connections stay open but nothing comes back: the shutdown's delete waits for an answer.
    proxy.black_hole(true);
    leaving.terminate();
    // The first signal's shutdown now waits for ZooKeeper to remove the registration.
    assert!(
        tokio::time::timeout(Duration::from_millis(500), leaving.child.wait())
            .await
            .is_err(),
        "the graceful shutdown is under way"
    );
    let second = Instant::now();
    leaving.terminate();
    let status = within(
        Duration::from_secs(5),
        "the exit after the second signal",
        leaving.child.wait(),
    )
    .await
    .expect("exit status");
    assert!(
        second.elapsed() < Duration::from_secs(2),
        "exited {:?} after the second signal",
        second.elapsed()
    );
    assert_eq!(status.code(), Some(1), "{status:?}");
}
