//! The condition of a conditional write (kv keys and counters: `If-Match`, `If-None-Match`).

/// What a conditional write or delete requires of the current value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    /// Whatever is there (or nothing).
    Any,
    /// The key must not exist (create only).
    Absent,
    /// The key must exist, whatever its version.
    Exists,
    /// The key must exist with this version (its mzxid).
    Version(i64),
}
