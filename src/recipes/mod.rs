//! The ZooKeeper recipes, one file each: pure decision logic (children in, next step out) kept
//! free of I/O, and a thin async driver beside it.

pub mod barrier;
pub mod config;
pub mod contender;
pub mod double_barrier;
pub mod election;
pub mod ephemeral;
pub mod lock;
pub mod queue;
pub mod revocation;
pub mod rwlock;
pub mod semaphore;
pub mod txn;

/// The sequence number ZooKeeper appended to a sequential znode's name: the trailing run of
/// digits, 10 of them (or 19 once a parent's counter passes `i32::MAX`).
///
/// Contenders are ordered by this suffix alone, whatever their prefix: Curator names its nodes
/// `_c_<uuid>-lock-<seq>`, kazoo `<uuid>__lock__<seq>`, and both may sit under one lock znode.
/// Children without such a suffix are not contenders.
pub fn sequence_of(child: &str) -> Option<u64> {
    let digits = child.bytes().rev().take_while(u8::is_ascii_digit).count();
    if digits != 10 && digits != 19 {
        return None;
    }
    child[child.len() - digits..].parse().ok()
}

/// The contenders among `children`, lowest sequence number first.
pub fn in_sequence_order<S: AsRef<str>>(children: &[S]) -> Vec<(u64, &str)> {
    let mut contenders: Vec<(u64, &str)> = children
        .iter()
        .filter_map(|c| sequence_of(c.as_ref()).map(|seq| (seq, c.as_ref())))
        .collect();
    contenders.sort_unstable();
    contenders
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_suffixes() {
        assert_eq!(sequence_of("_c_0b3c-lock-0000000042"), Some(42));
        assert_eq!(sequence_of("a1b2__lock__0000000007"), Some(7));
        assert_eq!(sequence_of("x-0000000000000000012"), Some(12));
        assert_eq!(sequence_of("lock-42"), None);
        assert_eq!(sequence_of("00000000001"), None);
        assert_eq!(sequence_of("leases"), None);
    }

    #[test]
    fn orders_by_suffix_not_name() {
        let children = [
            "z__lock__0000000003",
            "_c_a-lock-0000000001",
            "b__lock__0000000002",
            "readme",
        ];
        let names: Vec<&str> = in_sequence_order(&children).into_iter().map(|(_, n)| n).collect();
        assert_eq!(
            names,
            ["_c_a-lock-0000000001", "b__lock__0000000002", "z__lock__0000000003"]
        );
    }
}
