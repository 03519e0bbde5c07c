//! Time as zkgate reads and writes it: durations as people write them (`500ms`, `5s`, `1m 30s`),
//! parsed the same way on the command line, in query parameters and in JSON bodies; and
//! instants as RFC 3339 timestamps with milliseconds (UTC).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer};

/// A duration written the human way: `500ms`, `5s`, `1m 30s`, `0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        parse_duration(&text)
            .map(HumanDuration)
            .map_err(serde::de::Error::custom)
    }
}

/// Parses `0`, `250ms`, `5s`, `2m`, `1h 30m` (humantime syntax).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(text)
        .map_err(|e| format!("`{text}` is not a duration ({e}); write it like `500ms`, `5s` or `1m`"))
}

impl utoipa::PartialSchema for HumanDuration {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .description(Some("A duration: `500ms`, `5s`, `1m 30s`, `0`."))
            .examples([serde_json::json!("30s")])
            .into()
    }
}

impl utoipa::ToSchema for HumanDuration {}

/// RFC 3339 with milliseconds, UTC: `2026-11-22T10:00:00.000Z`.
pub fn timestamp(time: SystemTime) -> String {
    humantime::format_rfc3339_millis(time).to_string()
}

/// The instant `ms` milliseconds after the epoch (a znode's `ctime`; negative counts as 0).
pub fn from_millis(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)
}

/// Milliseconds since the epoch, now.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as i64
}

/// Milliseconds since `time` (0 if it is in the future).
pub fn millis_since(time: SystemTime) -> u64 {
    SystemTime::now().duration_since(time).unwrap_or_default().as_millis() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1m 30s"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("-5s").is_err());
    }
}
