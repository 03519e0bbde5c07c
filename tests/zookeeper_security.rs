//! The ZooKeeper side of zkgate's security.

/// Nothing in `src/` picks an ACL but `src/zk/acl.rs`: every create goes through
/// `zk::acls()`, so none can miss `--zookeeper-auth`.
#[test]
fn every_create_in_zkgate_takes_its_acl_from_one_function() {
    let mut pending = vec![std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/src"))];
    let mut offenders = Vec::new();
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src").flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") || path.ends_with("zk/acl.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read source");
            let chosen_elsewhere = text.contains("Acls::")
                || text.contains("LockOptions::new(")
                || text
                    .split("with_acls(")
                    .skip(1)
                    .any(|rest| !rest.starts_with("crate::zk::acls())") && !rest.starts_with("super::acls())"));
            if chosen_elsewhere {
                offenders.push(path.display().to_string());
            }
        }
    }
    assert!(offenders.is_empty(), "ACLs chosen outside zk::acls(): {offenders:?}");
}
