//! The kv family, as `src/recipes/kv/` has it: keys, keys bound to a lease, transactions.

mod bound;
mod keys;
mod txn;
