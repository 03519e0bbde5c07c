//! The pure parts of a transaction: its compares, the branch a read picks, its multi-op.
use super::*;
use zookeeper_client::Stat;

fn entry(data: &str, mzxid: i64, version: i32) -> Entry {
    let stat = crate::recipes::test_stat(mzxid, data.len() as i32, 0);
    Entry {
        data: data.as_bytes().to_vec(),
        stat: Stat { version, ..stat },
        lease: None,
    }
}

fn reads(entries: &[(&str, Option<Entry>)]) -> HashMap<String, Option<Entry>> {
    entries
        .iter()
        .map(|(path, read)| (path.to_string(), read.clone()))
        .collect()
}

#[test]
fn compares_hold_as_etcd_s_do() {
    let there = entry("blue", 42, 3);
    assert!(Compare::Exists.holds(Some(&there)));
    assert!(!Compare::Exists.holds(None));
    assert!(Compare::Absent.holds(None));
    assert!(!Compare::Absent.holds(Some(&there)));
    assert!(Compare::Value(b"blue".to_vec()).holds(Some(&there)));
    assert!(!Compare::Value(b"green".to_vec()).holds(Some(&there)));
    // A value compare of an absent key fails, even against empty bytes.
    assert!(!Compare::Value(Vec::new()).holds(None));
    assert!(Compare::Etag(42).holds(Some(&there)));
    assert!(!Compare::Etag(41).holds(Some(&there)));
    let range = |at_least, at_most| Compare::Version { at_least, at_most };
    assert!(range(Some(3), Some(3)).holds(Some(&there)));
    assert!(range(Some(1), None).holds(Some(&there)));
    assert!(!range(Some(4), None).holds(Some(&there)));
    assert!(!range(None, Some(2)).holds(Some(&there)));
    assert!(!range(None, None).holds(None));
}

#[test]
fn the_first_failed_compare_picks_the_branch() {
    let txn = Txn {
        compare: vec![
            Check::Key {
                path: "/k/a".into(),
                compare: Compare::Exists,
            },
            Check::Key {
                path: "/k/b".into(),
                compare: Compare::Absent,
            },
        ],
        ..Txn::default()
    };
    let both = reads(&[("/k/a", Some(entry("1", 5, 0))), ("/k/b", None)]);
    assert_eq!(txn.first_failed(&both, |_| true), None);
    let b_there = reads(&[("/k/a", Some(entry("1", 5, 0))), ("/k/b", Some(entry("2", 6, 0)))]);
    assert_eq!(txn.first_failed(&b_there, |_| true), Some(1));
    let neither = reads(&[("/k/a", None), ("/k/b", Some(entry("2", 6, 0)))]);
    assert_eq!(txn.first_failed(&neither, |_| true), Some(0));
    // A compare of a hold fails as its standing says; it reads no key.
    let guard = crate::recipes::guards::Guard::new(
        crate::kind::Kind::Lock,
        "orders",
        "0a1b2c3d-00112233445566778899aabbccddeeff",
    )
    .unwrap();
    let held = Txn {
        compare: vec![txn.compare[0].clone(), Check::Holds(guard)],
        ..Txn::default()
    };
    assert_eq!(held.keys(), vec!["/k/a"]);
    assert_eq!(held.first_failed(&both, |index| index != 1), Some(1));
    assert_eq!(held.first_failed(&both, |_| true), None);
}

#[test]
fn keys_are_read_once_and_a_key_written_twice_is_named() {
    let txn = Txn {
        compare: vec![Check::Key {
            path: "/k/a".into(),
            compare: Compare::Exists,
        }],
        then: vec![
            Step::Get { path: "/k/a".into() },
            Step::Put {
                path: "/k/b".into(),
                data: b"x".to_vec(),
                lease: None,
            },
            Step::Delete { path: "/k/b".into() },
        ],
        otherwise: vec![Step::Get { path: "/k/c".into() }],
    };
    assert_eq!(txn.keys(), ["/k/a", "/k/b", "/k/c"]);
    assert_eq!(txn.written_twice(), Some("/k/b"));
    let once = Txn {
        then: vec![Step::Get { path: "/k/a".into() }, Step::Delete { path: "/k/a".into() }],
        ..txn
    };
    assert_eq!(once.written_twice(), None);
}

fn bound_to(lease: &str, version: i32) -> Option<ReadBinding> {
    Some(ReadBinding {
        binding: Binding {
            lease: lease.into(),
            principal: Some("alice".into()),
            handle: "h".into(),
        },
        version,
        record: Some(format!("/zkgate/leases/{lease}/kv-1")),
    })
}

#[test]
fn a_branch_pins_every_key_read_and_every_binding_then_writes() {
    let read = reads(&[
        ("/k/a", Some(entry("1", 5, 2))),
        ("/k/b", None),
        ("/k/d", Some(entry("4", 8, 0))),
    ]);
    let missing = HashMap::from([("/k/b".to_string(), vec!["/k".to_string()])]);
    let bindings = HashMap::from([
        ("/k/a".to_string(), None),
        ("/k/b".to_string(), None),
        ("/k/d".to_string(), bound_to("L", 3)),
    ]);
    let branch = [
        Step::Put {
            path: "/k/a".into(),
            data: b"2".to_vec(),
            lease: None,
        },
        Step::Put {
            path: "/k/b".into(),
            data: b"new".to_vec(),
            lease: Some("L".into()),
        },
        Step::Delete { path: "/k/d".into() },
        Step::Get { path: "/k/a".into() },
    ];
    assert_eq!(refused(&branch, &read, &bindings, &|_| true), None);
    assert_eq!(
        plan(&branch, &read, &missing, &bindings),
        vec![
            Planned::Pinned {
                path: "/k/a".into(),
                version: 2
            },
            Planned::PinnedAbsent {
                path: "/k/b".into(),
                parents: vec!["/k".into()]
            },
            Planned::Pinned {
                path: "/k/d".into(),
                version: 0
            },
            // A plain put: the key must still be bound to no lease.
            Planned::Unbound { path: "/k/a".into() },
            Planned::Set {
                path: "/k/a".into(),
                data: b"2".to_vec(),
                version: 2
            },
            Planned::Bind {
                path: "/k/b".into(),
                lease: "L".into()
            },
            Planned::Parent { path: "/k".into() },
            Planned::Create {
                path: "/k/b".into(),
                data: b"new".to_vec()
            },
            // A delete of a bound key deletes its binding.
            Planned::Unbind {
                path: "/k/d".into(),
                version: 3,
                record: Some("/zkgate/leases/L/kv-1".into())
            },
            Planned::Delete {
                path: "/k/d".into(),
                version: 0
            },
        ]
    );
}

#[test]
fn the_rule_for_bound_keys_refuses_a_put_that_would_change_a_binding() {
    let read = reads(&[
        ("/k/bound", Some(entry("x", 5, 0))),
        ("/k/plain", Some(entry("y", 6, 0))),
    ]);
    let bindings = HashMap::from([
        ("/k/bound".to_string(), bound_to("L", 0)),
        ("/k/plain".to_string(), None),
    ]);
    let put = |path: &str, lease: Option<&str>| Step::Put {
        path: path.into(),
        data: b"z".to_vec(),
        lease: lease.map(String::from),
    };
    let bound = |path: &str| {
        Some(BindingRefusal::Bound {
            path: path.into(),
            lease: "L".into(),
        })
    };
    assert_eq!(
        refused(&[put("/k/bound", None)], &read, &bindings, &|_| true),
        bound("/k/bound")
    );
    assert_eq!(
        refused(&[put("/k/bound", Some("M"))], &read, &bindings, &|_| true),
        bound("/k/bound")
    );
    assert_eq!(
        refused(&[put("/k/bound", Some("L"))], &read, &bindings, &|_| true),
        None
    );
    assert_eq!(
        refused(&[put("/k/plain", Some("L"))], &read, &bindings, &|_| true),
        Some(BindingRefusal::NotBound {
            path: "/k/plain".into()
        })
    );
    assert_eq!(refused(&[put("/k/plain", None)], &read, &bindings, &|_| true), None);
    // A delete of a bound key is no refusal, by its lease's principal (or an admin): it
    // deletes the binding too. By another principal it is.
    let delete = [Step::Delete {
        path: "/k/bound".into(),
    }];
    assert_eq!(refused(&delete, &read, &bindings, &|p| p == "alice"), None);
    assert_eq!(
        refused(&delete, &read, &bindings, &|p| p == "bob"),
        Some(BindingRefusal::NotYours {
            path: "/k/bound".into(),
            lease: "L".into(),
            principal: "alice".into(),
        })
    );
}

#[test]
fn deleting_an_absent_key_writes_nothing_but_its_pin() {
    let read = reads(&[("/k/gone", None)]);
    let bindings = HashMap::from([("/k/gone".to_string(), None)]);
    let planned = plan(
        &[Step::Delete { path: "/k/gone".into() }],
        &read,
        &HashMap::new(),
        &bindings,
    );
    assert_eq!(
        planned,
        vec![
            Planned::PinnedAbsent {
                path: "/k/gone".into(),
                parents: vec![]
            },
            Planned::Unbound { path: "/k/gone".into() }
        ]
    );
}
