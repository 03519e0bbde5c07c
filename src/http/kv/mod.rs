//! The kv family over HTTP: keys (plain, or bound to a lease) and transactions over them,
//! one file each.

pub mod keys;
pub mod txn;
