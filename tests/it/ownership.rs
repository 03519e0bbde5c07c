//! Ownership on every instance: whatever a lease owns (the lease itself, handles, permits,
//! candidates and their proclamations, queue claims, group members, transaction participants,
//! double barrier participants, lease-bound barriers, lock holders to revoke, keys bound to a
//! lease: made plain, rebound or deleted, alone or in a transaction) is acted on only
//! by the lease's principal or an admin, through the instance that made it or any other.
//!
//! Two instances share one ZooKeeper; `app` makes each thing through instance A, then `app`,
//! `other` (the same grants) and `admin` try the operation through A and through B. `other` is
//! refused with 403 and the thing is left as it was (the owner's operation still succeeds
//! afterwards); the owner and the admin succeed.

use crate::common;

use common::{ADMIN, Gate, Reply, auth_config, grant, test_config, zookeeper};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

struct Setup {
    _zk: common::TestZooKeeper,
    _dir: tempfile::TempDir,
    a: Gate,
    b: Gate,
    app: String,
    other: String,
    admin: String,
}

async fn setup() -> Setup {
    let zk = zookeeper().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let (path, [app, other, admin]) = auth_config(
        &dir,
        [
            ("app", grant("", "write")),
            ("other", grant("", "write")),
            ("admin", format!("{ADMIN}{}", grant("", "write"))),
        ],
    );
    let mut config = test_config(&zk.connect_string());
    config.auth_config = Some(path);
    let a = Gate::start_with(config.clone()).await;
    let b = Gate::start_with(config).await;
    Setup {
        _zk: zk,
        _dir: dir,
        a,
        b,
        app,
        other,
        admin,
    }
}

/// Every operation on something a lease owns.
#[derive(Clone, Copy, Debug)]
enum Op {
    KeepAlive,
    EndLease,
    ReadHandle,
    ReleaseLock,
    AcquireWithLease,
    ReleasePermit,
    Resign,
    Proclaim,
    Ack,
    Nack,
    RemoveMember,
    JoinWithLease,
    RegisterWithLease,
    Vote,
    EnterWithLease,
    EnterAgain,
    LeaveDoubleBarrier,
    LowerBarrier,
    RaiseWithLease,
    Revoke,
    UnbindKey,
    DeleteBoundKey,
    DeleteBoundKeyInTxn,
}

const OPS: [Op; 23] = [
    Op::KeepAlive,
    Op::EndLease,
    Op::ReadHandle,
    Op::ReleaseLock,
    Op::AcquireWithLease,
    Op::ReleasePermit,
    Op::Resign,
    Op::Proclaim,
    Op::Ack,
    Op::Nack,
    Op::RemoveMember,
    Op::JoinWithLease,
    Op::RegisterWithLease,
    Op::Vote,
    Op::EnterWithLease,
    Op::EnterAgain,
    Op::LeaveDoubleBarrier,
    Op::LowerBarrier,
    Op::RaiseWithLease,
    Op::Revoke,
    Op::UnbindKey,
    Op::DeleteBoundKey,
    Op::DeleteBoundKeyInTxn,
];

/// A request: method, path, body, and the status that means it was done.
type Request = (Method, String, Option<Value>, StatusCode);

impl Setup {
    async fn as_app(&self, method: Method, path: &str, body: Option<Value>, expect: StatusCode) -> Reply {
        let reply = self.a.call_as(Some(&self.app), method, path, body).await;
        assert_eq!(reply.status, expect, "setting up {path}: {reply:?}");
        reply
    }

    async fn lease(&self) -> String {
        let reply = self
            .as_app(
                Method::POST,
                "/v1/leases",
                Some(json!({"ttl": "60s"})),
                StatusCode::CREATED,
            )
            .await;
        reply.str("id")
    }

    /// Makes, as `app` through A, what `op` acts on (resources named with `n`), and returns the
    /// request that does `op`.
    async fn prepare(&self, op: Op, n: usize) -> Request {
        let ttl = || Some(json!({"ttl": "60s"}));
        match op {
            Op::KeepAlive => {
                let lease = self.lease().await;
                (
                    Method::POST,
                    format!("/v1/leases/{lease}/keepalive"),
                    None,
                    StatusCode::OK,
                )
            }
            Op::EndLease => {
                let lease = self.lease().await;
                (
                    Method::DELETE,
                    format!("/v1/leases/{lease}"),
                    None,
                    StatusCode::NO_CONTENT,
                )
            }
            Op::ReadHandle | Op::ReleaseLock => {
                let path = format!("/v1/locks/lk-{n}/acquire?wait=0");
                let handle = self
                    .as_app(Method::POST, &path, ttl(), StatusCode::OK)
                    .await
                    .str("handle");
                let path = format!("/v1/locks/lk-{n}/handles/{handle}");
                match op {
                    Op::ReadHandle => (Method::GET, path, None, StatusCode::OK),
                    _ => (Method::DELETE, path, None, StatusCode::NO_CONTENT),
                }
            }
            Op::AcquireWithLease => {
                let lease = self.lease().await;
                let path = format!("/v1/locks/lk-{n}/acquire?wait=0");
                (Method::POST, path, Some(json!({"lease": lease})), StatusCode::OK)
            }
            Op::ReleasePermit => {
                let path = format!("/v1/semaphores/sem-{n}/acquire?permits=2&wait=0");
                let handle = self
                    .as_app(Method::POST, &path, ttl(), StatusCode::OK)
                    .await
                    .str("handle");
                let path = format!("/v1/semaphores/sem-{n}/permits/{handle}");
                (Method::DELETE, path, None, StatusCode::NO_CONTENT)
            }
            Op::Resign | Op::Proclaim => {
                let path = format!("/v1/elections/el-{n}/campaign?wait=0");
                let body = Some(json!({"ttl": "60s", "value": "first"}));
                let handle = self
                    .as_app(Method::POST, &path, body, StatusCode::OK)
                    .await
                    .str("handle");
                match op {
                    Op::Resign => {
                        let path = format!("/v1/elections/el-{n}/candidates/{handle}");
                        (Method::DELETE, path, None, StatusCode::NO_CONTENT)
                    }
                    _ => {
                        let path = format!("/v1/elections/el-{n}/leader");
                        let body = json!({"handle": handle, "value": "second"});
                        (Method::PUT, path, Some(body), StatusCode::OK)
                    }
                }
            }
            Op::Ack | Op::Nack => {
                let items = format!("/v1/queues/q-{n}/items");
                self.as_app(Method::POST, &items, Some(json!({"job": n})), StatusCode::CREATED)
                    .await;
                let take = format!("/v1/queues/q-{n}/take?ack_deadline=60s");
                let claim = self
                    .as_app(Method::POST, &take, None, StatusCode::OK)
                    .await
                    .str("claim");
                let verb = if matches!(op, Op::Ack) { "ack" } else { "nack" };
                let path = format!("/v1/queues/q-{n}/claims/{claim}/{verb}");
                (Method::POST, path, None, StatusCode::NO_CONTENT)
            }
            Op::RemoveMember => {
                let path = format!("/v1/groups/g-{n}/members/m1");
                self.as_app(Method::PUT, &path, ttl(), StatusCode::CREATED).await;
                (Method::DELETE, path, None, StatusCode::NO_CONTENT)
            }
            Op::JoinWithLease => {
                let lease = self.lease().await;
                let path = format!("/v1/groups/g-{n}/members/m1");
                (Method::PUT, path, Some(json!({"lease": lease})), StatusCode::CREATED)
            }
            Op::RegisterWithLease | Op::Vote => {
                let body = json!({"id": format!("t-{n}"), "participants": ["p1"], "deadline": "60s"});
                self.as_app(Method::POST, "/v1/txns", Some(body), StatusCode::CREATED)
                    .await;
                let path = format!("/v1/txns/t-{n}/participants/p1");
                match op {
                    Op::RegisterWithLease => {
                        let lease = self.lease().await;
                        (Method::PUT, path, Some(json!({"lease": lease})), StatusCode::CREATED)
                    }
                    _ => {
                        self.as_app(Method::PUT, &path, ttl(), StatusCode::CREATED).await;
                        let path = format!("{path}/vote");
                        (Method::POST, path, Some(json!({"vote": "commit"})), StatusCode::OK)
                    }
                }
            }
            Op::EnterWithLease => {
                let lease = self.lease().await;
                let path = format!("/v1/double-barriers/db-{n}/enter?wait=0");
                let body = json!({"participant": "w1", "size": 2, "lease": lease});
                (Method::POST, path, Some(body), StatusCode::ACCEPTED)
            }
            Op::EnterAgain => {
                // Inside already with its lease: entering again goes on waiting.
                let lease = self.lease().await;
                let path = format!("/v1/double-barriers/db-{n}/enter?wait=0");
                let body = json!({"participant": "w1", "size": 2, "lease": lease});
                self.as_app(Method::POST, &path, Some(body.clone()), StatusCode::ACCEPTED)
                    .await;
                (Method::POST, path, Some(body), StatusCode::ACCEPTED)
            }
            Op::LeaveDoubleBarrier => {
                let path = format!("/v1/double-barriers/db-{n}/enter?wait=0");
                let body = json!({"participant": "w1", "size": 1, "ttl": "60s"});
                self.as_app(Method::POST, &path, Some(body), StatusCode::OK).await;
                let path = format!("/v1/double-barriers/db-{n}/leave?wait=0");
                (Method::POST, path, Some(json!({"participant": "w1"})), StatusCode::OK)
            }
            Op::LowerBarrier => {
                let path = format!("/v1/barriers/b-{n}");
                self.as_app(Method::PUT, &path, ttl(), StatusCode::CREATED).await;
                (Method::DELETE, path, None, StatusCode::NO_CONTENT)
            }
            Op::RaiseWithLease => {
                let lease = self.lease().await;
                let path = format!("/v1/barriers/b-{n}");
                (Method::PUT, path, Some(json!({"lease": lease})), StatusCode::CREATED)
            }
            Op::UnbindKey | Op::DeleteBoundKey | Op::DeleteBoundKeyInTxn => {
                let lease = self.lease().await;
                let key = format!("bk-{n}");
                let bind = format!("/v1/kv/{key}?lease={lease}");
                self.as_app(Method::PUT, &bind, Some(json!("bound")), StatusCode::CREATED)
                    .await;
                match op {
                    Op::UnbindKey => {
                        let path = format!("/v1/kv/{key}?rebind=true");
                        (Method::PUT, path, Some(json!("plain")), StatusCode::OK)
                    }
                    Op::DeleteBoundKey => (Method::DELETE, format!("/v1/kv/{key}"), None, StatusCode::NO_CONTENT),
                    _ => {
                        let body = json!({"then": [{"delete": key}]});
                        (Method::POST, "/v1/kv-txn".into(), Some(body), StatusCode::OK)
                    }
                }
            }
            Op::Revoke => {
                let path = format!("/v1/locks/lk-{n}/acquire?wait=0");
                self.as_app(Method::POST, &path, ttl(), StatusCode::OK).await;
                let path = format!("/v1/locks/lk-{n}/revoke");
                let body = json!({"by": "someone", "reason": "wanted"});
                (Method::POST, path, Some(body), StatusCode::ACCEPTED)
            }
        }
    }
}

#[tokio::test]
async fn every_owned_operation_is_the_owners_or_an_admins_on_either_instance() {
    let s = setup().await;
    let mut n = 0;
    // Every cell is tried; the failures are listed together at the end.
    let mut wrong = Vec::new();
    for op in OPS {
        for (instance, gate) in [("A", &s.a), ("B", &s.b)] {
            for (who, token) in [("app", &s.app), ("other", &s.other), ("admin", &s.admin)] {
                n += 1;
                let (method, path, body, done) = s.prepare(op, n).await;
                let reply = gate.call_as(Some(token), method.clone(), &path, body.clone()).await;
                let cell = format!("{op:?} through {instance} as {who}");
                if who == "other" {
                    if reply.status != StatusCode::FORBIDDEN || !reply.str("type").ends_with(":forbidden") {
                        wrong.push(format!("{cell}: {reply:?}"));
                        continue;
                    }
                    // Untouched: its owner can still do it.
                    let again = s.a.call_as(Some(&s.app), method, &path, body).await;
                    if again.status != done {
                        wrong.push(format!("{cell}, then as app: {again:?}"));
                    }
                } else if reply.status != done {
                    wrong.push(format!("{cell}: {reply:?}"));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {n} cells wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// A key bound to app's lease is rebound onto another lease only by app or an admin: `other`,
/// with a lease of its own and `rebind=true`, is refused and the key stays bound (on a82bd35 it
/// left app's lease).
#[tokio::test]
async fn a_bound_key_is_rebound_only_by_its_leases_principal_or_an_admin() {
    let s = setup().await;
    let apps = s.lease().await;
    let bind = format!("/v1/kv/shared?lease={apps}");
    s.as_app(Method::PUT, &bind, Some(json!("app's")), StatusCode::CREATED)
        .await;
    for (gate, token, allowed) in [(&s.b, &s.other, false), (&s.a, &s.other, false), (&s.b, &s.admin, true)] {
        let own = gate
            .call_as(Some(token), Method::POST, "/v1/leases", Some(json!({"ttl": "60s"})))
            .await
            .str("id");
        let path = format!("/v1/kv/shared?lease={own}&rebind=true");
        let rebound = gate.call_as(Some(token), Method::PUT, &path, Some(json!("mine"))).await;
        let read = s.a.call_as(Some(&s.app), Method::GET, "/v1/kv/shared", None).await;
        if allowed {
            assert_eq!(rebound.status, StatusCode::OK, "{rebound:?}");
            assert_eq!(read.body, json!("mine"));
        } else {
            rebound.assert_problem(StatusCode::FORBIDDEN, None);
            assert_eq!(read.body, json!("app's"), "the key is as it was");
            let view =
                s.a.call_as(Some(&s.app), Method::GET, &format!("/v1/leases/{apps}"), None)
                    .await;
            let holds = view.body["holdings"].as_array().expect("holdings");
            assert!(holds.iter().any(|h| h["name"] == "shared"), "{view:?}");
        }
    }
}

#[tokio::test]
async fn reads_show_another_principals_lease_but_not_what_it_holds() {
    let s = setup().await;
    let lease = s.lease().await;
    s.as_app(
        Method::PUT,
        "/v1/barriers/gate",
        Some(json!({"lease": lease})),
        StatusCode::CREATED,
    )
    .await;
    let path = "/v1/locks/secret-lock/acquire?wait=0";
    s.as_app(Method::POST, path, Some(json!({"lease": lease})), StatusCode::OK)
        .await;
    for gate in [&s.a, &s.b] {
        let barrier = gate
            .call_as(Some(&s.other), Method::GET, "/v1/barriers/gate", None)
            .await;
        assert_eq!(barrier.status, StatusCode::OK, "{barrier:?}");
        assert_eq!(barrier.body["bound"], true, "{barrier:?}");
        assert!(!barrier.body.to_string().contains("secret-lock"), "{barrier:?}");
        let read = format!("/v1/leases/{lease}");
        gate.call_as(Some(&s.other), Method::GET, &read, None)
            .await
            .assert_problem(StatusCode::FORBIDDEN, None);
        let mine = gate.call_as(Some(&s.other), Method::GET, "/v1/leases", None).await;
        assert_eq!(mine.body, json!([]), "{mine:?}");
        // Its owner and an admin see the holdings.
        for token in [&s.app, &s.admin] {
            let lease = gate.call_as(Some(token), Method::GET, &read, None).await;
            assert!(lease.body.to_string().contains("secret-lock"), "{lease:?}");
        }
    }
}
