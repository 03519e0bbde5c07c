//! Where an event is: its topic's incarnation (`epoch`) and its sequence number, written as
//! clients see it, and the epochs handed out.

use super::*;

/// Where a subscriber is in a topic: the topic's incarnation on its instance and the sequence
/// number of the last event taken. Written `<epoch in hex>-<seq>`, as clients see it (the
/// `position` of an event, an SSE event's id, the socket's `since`). In an event it is two
/// fields, `seq` and `position` (see [Event::position]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    pub epoch: u64,
    pub seq: u64,
}

impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:x}-{}", self.epoch, self.seq)
    }
}

impl std::str::FromStr for Position {
    type Err = String;

    fn from_str(text: &str) -> Result<Position, String> {
        let invalid = || {
            format!(
                "`{}` is not an event position (`<epoch>-<seq>`, as events carry it)",
                text.escape_debug()
            )
        };
        let (epoch, seq) = text.split_once('-').ok_or_else(invalid)?;
        let hex = |s: &str| !s.is_empty() && s.len() <= 16 && s.bytes().all(|b| b.is_ascii_hexdigit());
        let digits = |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
        if !hex(epoch) || !digits(seq) {
            return Err(invalid());
        }
        Ok(Position {
            epoch: u64::from_str_radix(epoch, 16).map_err(|_| invalid())?,
            seq: seq.parse().map_err(|_| invalid())?,
        })
    }
}

/// An event's `seq` and `position` fields (the event flattens its position into them).
impl Serialize for Position {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("seq", &self.seq)?;
        map.serialize_entry("position", &self.to_string())?;
        map.end()
    }
}

/// A new topic incarnation's epoch: random high bits per process (so that a restarted instance
/// does not reuse its predecessor's), a counter below.
pub(super) fn next_epoch() -> u64 {
    static BASE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let base = *BASE.get_or_init(|| u64::from(rand::random::<u32>()) << 32);
    base.wrapping_add(COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
}
