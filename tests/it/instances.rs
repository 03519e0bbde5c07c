//! Two instances on one ensemble behind no sticky load balancer: a lease made on one is read,
//! kept alive, used and released through the other (forwarded to its owner); locks stay
//! exclusive whichever instance each call lands on; an owner that is gone is reported as such.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::checker::FencedRegister;
use common::{Gate, test_config, zookeeper};
use reqwest::{Method, StatusCode};
use serde_json::json;

#[tokio::test]
async fn a_lease_made_on_one_instance_is_kept_alive_used_and_released_through_the_other() {
    let zk = zookeeper().await;
    let a = Gate::start(&zk.connect_string()).await;
    let b = Gate::start(&zk.connect_string()).await;
    assert_ne!(a.running.state.instance.id, b.running.state.instance.id);

    let lease = a.lease("30s").await;
    assert!(lease.starts_with(&*a.running.state.instance.id), "{lease}");
    let read = b.get(&format!("/v1/leases/{lease}")).await;
    assert_eq!(read.status, StatusCode::OK, "{read:?}");
    assert_eq!(read.str("id"), lease);
    let kept = b.post(&format!("/v1/leases/{lease}/keepalive"), None).await;
    assert_eq!(kept.status, StatusCode::OK, "{kept:?}");

    // Acquire through B with A's lease: served by B (every instance a peer), whose handle it is.
    let granted = b.acquire("shared", &lease, "wait=0").await;
    assert_eq!(granted.status, StatusCode::OK, "{granted:?}");
    let handle = granted.str("handle");
    assert!(handle.starts_with(&*b.running.state.instance.id), "{handle}");
    // Reads work on either instance.
    for gate in [&a, &b] {
        let state = gate.get("/v1/locks/shared").await;
        assert_eq!(
            state.body["holder"]["fencing_token"], granted.body["fencing_token"],
            "{state:?}"
        );
        let view = gate.get(&format!("/v1/locks/shared/handles/{handle}")).await;
        assert_eq!(view.str("state"), "held", "{view:?}");
    }
    // The lease lists its lock, wherever it is asked.
    let listed = b.get(&format!("/v1/leases/{lease}")).await;
    assert_eq!(listed.body["holdings"][0]["handle"], handle.as_str(), "{listed:?}");

    b.release("shared", &handle).await;
    assert!(a.get("/v1/locks/shared").await.body["holder"].is_null());
    assert_eq!(
        b.delete(&format!("/v1/leases/{lease}")).await.status,
        StatusCode::NO_CONTENT
    );
    let gone = a.get(&format!("/v1/leases/{lease}")).await;
    gone.assert_problem(StatusCode::GONE, None);
    assert_eq!(gone.body["reason"], "deleted");
}

/// A lock released through the instance that does not keep its lease (from ZooKeeper), then
/// acquired again at once through the keeper, is a new grant: the keeper, whose own view of the
/// old handle has not caught up, never answers with the released handle and its old token.
#[tokio::test]
async fn a_lock_released_through_the_other_instance_and_acquired_again_is_a_new_grant() {
    let zk = zookeeper().await;
    let keeper = Gate::start(&zk.connect_string()).await;
    let other = Gate::start(&zk.connect_string()).await;
    let lease = keeper.lease("30s").await;
    for round in 0..20 {
        let first = keeper.acquire("again", &lease, "wait=0").await;
        assert_eq!(first.status, StatusCode::OK, "{first:?}");
        other.release("again", &first.str("handle")).await;
        let second = keeper.acquire("again", &lease, "wait=0").await;
        assert_eq!(second.status, StatusCode::OK, "round {round}: {second:?}");
        assert_ne!(
            second.str("handle"),
            first.str("handle"),
            "round {round}: the released handle again"
        );
        assert!(
            second.i64("fencing_token") > first.i64("fencing_token"),
            "round {round}: {second:?} after {first:?}"
        );
        keeper.release("again", &second.str("handle")).await;
    }
}

#[tokio::test]
async fn locks_stay_exclusive_when_every_call_lands_on_either_instance() {
    let zk = zookeeper().await;
    let gates = Arc::new([
        Gate::start(&zk.connect_string()).await,
        Gate::start(&zk.connect_string()).await,
    ]);
    let register = Arc::new(FencedRegister::new(false));
    let workers = (0..4).map(|worker| {
        let (gates, register) = (gates.clone(), register.clone());
        tokio::spawn(async move {
            for cycle in 0..15usize {
                // Alternate instances between every call of a cycle.
                let first = &gates[(worker + cycle) % 2];
                let second = &gates[(worker + cycle + 1) % 2];
                let lease = first.lease("30s").await;
                let granted = second.acquire("counter", &lease, "wait=30s").await;
                assert_eq!(granted.status, StatusCode::OK, "{granted:?}");
                let value = register.read();
                // Something asynchronous between the read and the write, as a real holder has.
                let view = first
                    .get(&format!("/v1/locks/counter/handles/{}", granted.str("handle")))
                    .await;
                assert_eq!(view.str("state"), "held", "{view:?}");
                register.write(&format!("w{worker}"), granted.i64("fencing_token"), value);
                let released = second
                    .delete(&format!("/v1/locks/counter/handles/{}", granted.str("handle")))
                    .await;
                assert_eq!(released.status, StatusCode::NO_CONTENT, "{released:?}");
                assert_eq!(
                    first.delete(&format!("/v1/leases/{lease}")).await.status,
                    StatusCode::NO_CONTENT
                );
            }
        })
    });
    for worker in futures::future::join_all(workers).await {
        worker.expect("worker");
    }
    let tally = register.check().expect("exclusive");
    assert_eq!(tally.value, 60);
}

/// An instance stops (what SIGTERM does: [zkgate::Running::stop]): it hands its leases over
/// rather than ending them. Its client keeps the lease alive through the other instance, which
/// takes it over; the lock stays held, with the same fencing token, and the handle goes on
/// there.
#[tokio::test]
async fn a_lease_whose_instance_stops_lives_on_through_the_other() {
    let zk = zookeeper().await;
    let a = Gate::start(&zk.connect_string()).await;
    let b = Gate::start(&zk.connect_string()).await;
    let lease = a.lease("30s").await;
    let granted = a.acquire("orphan", &lease, "wait=0").await;
    assert_eq!(granted.status, StatusCode::OK, "{granted:?}");
    let handle = granted.str("handle");
    a.running.stop().await.expect("stop A");
    let kept = b.post(&format!("/v1/leases/{lease}/keepalive"), None).await;
    assert_eq!(kept.status, StatusCode::OK, "{kept:?}");
    assert_eq!(kept.body["holdings"][0]["handle"], handle, "{kept:?}");
    let seen = b.get(&format!("/v1/locks/orphan/handles/{handle}?wait=10s")).await;
    assert_eq!(seen.body["state"], "held", "{seen:?}");
    assert_eq!(seen.body["fencing_token"], granted.body["fencing_token"], "{seen:?}");
    let state = b.get("/v1/locks/orphan").await;
    assert_eq!(
        state.body["holder"]["fencing_token"], granted.body["fencing_token"],
        "{state:?}"
    );
    b.post("/v1/locks/orphan/acquire?wait=0", Some(json!({})))
        .await
        .assert_problem(StatusCode::CONFLICT, None);
    // Released through B, which keeps the lease now: the lock is free at once.
    b.release("orphan", &handle).await;
    let next = b.post("/v1/locks/orphan/acquire?wait=5s", Some(json!({}))).await;
    assert_eq!(next.status, StatusCode::OK, "{next:?}");
    assert!(next.i64("fencing_token") > granted.i64("fencing_token"));
}

/// A request that found a lease's keeper failing takes the lease over from that keeper only:
/// if another (live) instance took it over meanwhile, it stays there (taking it from a live
/// keeper moved leases back and forth between the survivors of a rolling restart, and cut
/// off the requests each was serving).
#[tokio::test]
async fn a_takeover_leaves_the_lease_with_a_live_instance_that_took_it_first() {
    let zk = zookeeper().await;
    let a = Gate::start(&zk.connect_string()).await;
    let b = Gate::start(&zk.connect_string()).await;
    let c = Gate::start(&zk.connect_string()).await;
    let lease = a.lease("30s").await;
    let granted = a.acquire("contested", &lease, "wait=0").await;
    assert_eq!(granted.status, StatusCode::OK, "{granted:?}");
    let gone = a.running.state.instance.id.to_string();
    a.running.stop().await.expect("stop A");
    let kept = b.post(&format!("/v1/leases/{lease}/keepalive"), None).await;
    assert_eq!(kept.status, StatusCode::OK, "{kept:?}");
    // B took it over for the keepalive, or C's reaper did first (then B handed it to C).
    let (keeper, other) = match b.running.state.leases.peek(&lease) {
        Ok(_) => (&b, &c),
        Err(_) => (&c, &b),
    };
    assert!(
        keeper.running.state.leases.peek(&lease).is_ok(),
        "B or C keeps the lease"
    );
    // The other found A failing before that; it must not take the lease from the live keeper.
    let taken = other
        .running
        .state
        .leases
        .take_over(&zkgate::auth::Caller::Anyone, &lease, Some(&gone), false)
        .await;
    match taken {
        Err(zkgate::recipes::leases::LeaseError::Elsewhere { keeper: named, .. }) => {
            assert_eq!(named, *keeper.running.state.instance.id)
        }
        other => panic!(
            "the lease was taken from its live keeper: {:?}",
            other.map(|l| l.id.clone())
        ),
    }
    assert!(
        keeper.running.state.leases.peek(&lease).is_ok(),
        "its keeper keeps the lease"
    );
    let seen = c
        .get(&format!("/v1/locks/contested/handles/{}", granted.str("handle")))
        .await;
    assert_eq!(seen.body["state"], "held", "{seen:?}");
    assert_eq!(seen.body["fencing_token"], granted.body["fencing_token"], "{seen:?}");
}

#[tokio::test]
async fn a_forwarded_request_is_authorised_by_the_owner_as_its_sender() {
    let zk = zookeeper().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (owner, owner_hash) = zkgate::auth::new_token();
    let (other, other_hash) = zkgate::auth::new_token();
    let grants = "[[principals.grants]]\nkinds = [\"*\"]\nprefixes = [\"\"]\naccess = \"write\"\n";
    let path = dir.path().join("auth.toml");
    std::fs::write(
        &path,
        format!(
            "[[principals]]\nname = \"owner\"\ntokens = [\"{owner_hash}\"]\n{grants}\n[[principals]]\nname = \"other\"\ntokens = [\"{other_hash}\"]\n{grants}"
        ),
    )
    .expect("auth config");
    let mut config = test_config(&zk.connect_string());
    config.auth_config = Some(path);
    let a = Gate::start_with(config.clone()).await;
    let b = Gate::start_with(config).await;

    let created = a.call_as(Some(&owner), Method::POST, "/v1/leases", None).await;
    let lease = created.str("id");
    let keepalive = format!("/v1/leases/{lease}/keepalive");
    b.call_as(None, Method::POST, &keepalive, None)
        .await
        .assert_problem(StatusCode::UNAUTHORIZED, None);
    b.call_as(Some(&other), Method::POST, &keepalive, None)
        .await
        .assert_problem(StatusCode::FORBIDDEN, None);
    let kept = b.call_as(Some(&owner), Method::POST, &keepalive, None).await;
    assert_eq!(kept.status, StatusCode::OK, "{kept:?}");
}

#[tokio::test]
async fn a_member_that_joined_through_one_instance_leaves_through_the_other() {
    let zk = zookeeper().await;
    let a = Gate::start(&zk.connect_string()).await;
    let b = Gate::start(&zk.connect_string()).await;
    // As many members as A has sessions: leases go round robin over them, so some members'
    // znodes belong to A's primary session and others to its other sessions, and B must find A
    // from each.
    let sessions = a.running.state.lanes.all().len();
    let mut owners = std::collections::HashSet::new();
    for n in 0..sessions {
        let joined = a
            .call(
                Method::PUT,
                &format!("/v1/groups/workers/members/w{n}"),
                Some(json!({"data": {"slot": n}})),
            )
            .await;
        assert!(joined.status.is_success(), "{joined:?}");
        let lease = joined.body["lease"]["id"].as_str().expect("the member's lease");
        owners.insert(a.session_of(lease).id().0);
    }
    assert_eq!(owners.len(), sessions, "one member per session of A");
    for n in 0..sessions {
        let left = b.delete(&format!("/v1/groups/workers/members/w{n}")).await;
        assert_eq!(left.status, StatusCode::NO_CONTENT, "{left:?}");
    }
    let members = a.get("/v1/groups/workers").await;
    assert_eq!(members.body["members"].as_array().map(Vec::len), Some(0), "{members:?}");
    // A member nobody has: 404, wherever asked.
    b.delete("/v1/groups/workers/members/w9")
        .await
        .assert_problem(StatusCode::NOT_FOUND, None);
}

/// A lease of a 4 s TTL made through `process`.
async fn ttl_lease(process: &common::process::Process) -> String {
    let (status, body) = process
        .call(Method::POST, "/v1/leases", Some(json!({"ttl": "4s"})))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    body["id"].as_str().expect("lease id").to_string()
}

/// An acquire of the lock `peer` through the instance at `url` with `lease`.
async fn acquire(url: String, lease: String, wait: &'static str) -> (StatusCode, serde_json::Value) {
    let reply = common::http_client()
        .post(format!("{url}/v1/locks/peer/acquire?wait={wait}"))
        .json(&json!({ "lease": lease }))
        .send()
        .await
        .expect("acquire");
    let status = reply.status();
    (status, reply.json().await.expect("JSON"))
}

/// Every instance a peer: an acquire through an instance that does not keep the lease is served
/// there, its wait included (nothing is handed to the keeper, and the handle is that
/// instance's); its lock outlives that instance's `kill -9` while its client keeps the lease
/// alive through a third instance, which shows it on the lease; and the lease's end, through the
/// keeper, releases it although the instance that made it is gone.
#[tokio::test]
async fn an_acquire_through_another_instance_is_served_there_and_outlives_its_kill() {
    use common::process::Process;
    let zk = zookeeper().await;
    let connect = zk.connect_string();
    let keeper = Process::start(&connect).await;
    let mut visitor = Process::start(&connect).await;
    let third = Process::start(&connect).await;
    let (first, second) = (ttl_lease(&keeper).await, ttl_lease(&keeper).await);
    let handoffs = common::metric(&visitor.url, "zkgate_handoffs_total").await;

    let (status, held) = acquire(visitor.url.clone(), first.clone(), "0").await;
    assert_eq!(status, StatusCode::OK, "{held}");
    let visitor_id = held["handle"]
        .as_str()
        .expect("handle")
        .split('-')
        .next()
        .expect("prefix");
    assert!(
        !first.starts_with(visitor_id),
        "the handle is the visitor's, not the keeper's: {held}"
    );
    assert!(
        held["lease"].get("remaining_ms").is_none(),
        "the visitor keeps no TTL clock to tell: {held}"
    );
    // A waiter through the same instance waits there, and is granted when the holder releases
    // through the third instance.
    let waiting = tokio::spawn(acquire(visitor.url.clone(), second.clone(), "20s"));
    common::wait_children(&connect, "/zkgate/locks/peer", 2).await;
    let released = third
        .call(
            Method::DELETE,
            &format!("/v1/locks/peer/handles/{}", held["handle"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(released.0, StatusCode::NO_CONTENT, "{released:?}");
    let (status, granted) = waiting.await.expect("waiter");
    assert_eq!(status, StatusCode::OK, "{granted}");
    let token = granted["fencing_token"].as_i64().expect("token");
    assert!(token > held["fencing_token"].as_i64().expect("token"));
    assert_eq!(
        common::metric(&visitor.url, "zkgate_handoffs_total").await,
        handoffs,
        "nothing was handed over"
    );

    visitor.kill().await;
    // The reaper (whichever of the two is) drives what the dead instance drove, from its
    // references, once the instance's registration is gone.
    let adopted = |line: &str| line.contains("holdings of an instance gone adopted");
    let either = async {
        tokio::select! {
            _ = keeper.wait_log(Duration::from_secs(60), "the reaper adopting the lock", adopted) => {}
            _ = third.wait_log(Duration::from_secs(60), "the reaper adopting the lock", adopted) => {}
        }
    };
    if tokio::time::timeout(Duration::from_secs(30), either).await.is_err() {
        panic!(
            "no instance adopted the lock; the keeper's log: {:#?}; the third's: {:#?}",
            keeper.log(),
            third.log()
        );
    }
    // Kept alive through the third instance for three TTLs: the lock stays held, with its token,
    // and the lease (read through the keeper) shows it.
    // (The client's pace: one keepalive a second, as a holder sends them.)
    let mut pace = tokio::time::interval(Duration::from_secs(1));
    for _ in 0..12 {
        pace.tick().await;
        let kept = third
            .call(Method::POST, &format!("/v1/leases/{second}/keepalive"), None)
            .await;
        assert_eq!(kept.0, StatusCode::OK, "{kept:?}");
        let lock = third.call(Method::GET, "/v1/locks/peer", None).await;
        assert_eq!(lock.1["holder"]["fencing_token"], token, "{lock:?}");
    }
    let read = third.call(Method::GET, &format!("/v1/leases/{second}"), None).await;
    let holdings = read.1["holdings"].as_array().cloned().unwrap_or_default();
    assert!(
        holdings
            .iter()
            .any(|h| h["name"] == "peer" && h["state"] == "held" && h["fencing_token"] == token),
        "{read:?}"
    );
    // Its end releases the lock, though the instance that drove it is gone.
    let ended = third.call(Method::DELETE, &format!("/v1/leases/{second}"), None).await;
    assert_eq!(ended.0, StatusCode::NO_CONTENT, "{ended:?}");
    let client = common::zk_client(&connect).await;
    common::within(Duration::from_secs(10), "the lock freed by the lease's end", async {
        loop {
            match client.list_and_watch_children("/zkgate/locks/peer").await {
                Ok((children, watcher)) if !children.is_empty() => {
                    watcher.changed().await;
                }
                Ok(_) | Err(zookeeper_client::Error::NoNode) => break,
                Err(err) => panic!("listing the lock: {err}"),
            }
        }
    })
    .await;
    let lock = keeper.call(Method::GET, "/v1/locks/peer", None).await;
    assert!(lock.1["holder"].is_null(), "{lock:?}");
}

/// What another instance made for a lease ends with the lease, as its keeper ends it: deleted
/// by its owner through the keeper, the lock made through the other instance is free at once
/// and its handle there says `released`; expired (no keepalive), it is free and says `lost`,
/// because the lease expired. Either way the waiter behind it, also queued through the other
/// instance, is granted.
#[tokio::test]
async fn a_lease_ended_by_its_keeper_ends_what_another_instance_made_for_it() {
    let zk = zookeeper().await;
    let keeper = Gate::start(&zk.connect_string()).await;
    let other = Arc::new(Gate::start(&zk.connect_string()).await);
    for (ttl, delete, said) in [("30s", true, "released"), ("1s", false, "lost")] {
        let lock = format!("ends-{said}");
        let lease = keeper.lease(ttl).await;
        let held = other.acquire(&lock, &lease, "wait=0").await;
        assert_eq!(held.status, StatusCode::OK, "{held:?}");
        let handle = held.str("handle");
        assert!(handle.starts_with(&*other.running.state.instance.id), "{handle}");
        let next = keeper.lease("30s").await;
        let waiter = {
            let (other, lock, next) = (other.clone(), lock.clone(), next.clone());
            tokio::spawn(async move { other.acquire(&lock, &next, "wait=20s").await })
        };
        common::wait_children(&zk.connect_string(), &format!("/zkgate/locks/{lock}"), 2).await;
        if delete {
            let deleted = keeper.delete(&format!("/v1/leases/{lease}")).await;
            assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{deleted:?}");
        }
        // The handle's long poll through the instance that made it tells how it ended.
        let ended = other.get(&format!("/v1/locks/{lock}/handles/{handle}?wait=15s")).await;
        let state = ended.body["state"].as_str().map(str::to_string);
        let reason = ended.body["reason"].as_str().unwrap_or_default().to_string();
        let told = match said {
            "released" => state.as_deref() == Some("released") || ended.status == StatusCode::NOT_FOUND,
            _ => state.as_deref() == Some("lost") && reason.contains("expired"),
        };
        assert!(told, "{said}: {ended:?}");
        let granted = common::within(Duration::from_secs(20), "the next waiter's grant", waiter)
            .await
            .expect("waiter");
        assert_eq!(granted.status, StatusCode::OK, "{said}: {granted:?}");
        assert!(granted.i64("fencing_token") > held.i64("fencing_token"));
    }
}

/// One contender per lease and lock, whichever instances the attempts reach: an acquire left
/// queued through one instance, then sent again through another (a client retrying through its
/// balancer), answers with the same handle and queues nothing more; the grant comes to it.
#[tokio::test]
async fn an_acquire_retried_through_another_instance_finds_its_first_attempts_handle() {
    let zk = zookeeper().await;
    let connect = zk.connect_string();
    let (a, b, c) = (
        Gate::start(&connect).await,
        Gate::start(&connect).await,
        Gate::start(&connect).await,
    );
    let holder = a.lease("30s").await;
    let held = a.acquire("once", &holder, "wait=0").await;
    assert_eq!(held.status, StatusCode::OK, "{held:?}");
    let lease = a.lease("30s").await;
    let first = b.acquire("once", &lease, "wait=0&keep_queued=true").await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{first:?}");
    for gate in [&c, &a, &b] {
        let again = gate.acquire("once", &lease, "wait=0&keep_queued=true").await;
        assert_eq!(again.status, StatusCode::ACCEPTED, "{again:?}");
        assert_eq!(again.str("handle"), first.str("handle"), "{again:?}");
    }
    let queued = common::wait_children(&connect, "/zkgate/locks/once", 2).await;
    assert_eq!(queued.len(), 2, "one contender per lease: {queued:?}");
    a.release("once", &held.str("handle")).await;
    let granted = c.acquire("once", &lease, "wait=10s").await;
    assert_eq!(granted.status, StatusCode::OK, "{granted:?}");
    assert_eq!(granted.str("handle"), first.str("handle"));
}
