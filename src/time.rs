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

/// The longest duration zkgate accepts anywhere (each use has its own, shorter bound where it
/// matters): a year. Past it, arithmetic on instants and timestamps would be meaningless or
/// overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(366 * 24 * 3600);

/// Parses `0`, `250ms`, `5s`, `2m`, `1h 30m` (humantime syntax), at most [MAX_DURATION].
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let duration = humantime::parse_duration(text)
        .map_err(|e| format!("`{text}` is not a duration ({e}); write it like `500ms`, `5s` or `1m`"))?;
    if duration > MAX_DURATION {
        return Err(format!(
            "`{text}` is longer than {}",
            humantime::format_duration(MAX_DURATION)
        ));
    }
    Ok(duration)
}

/// Refuses `duration` above `max` for `what`, in words a problem document can carry.
pub fn at_most(duration: Duration, max: Duration) -> Result<Duration, String> {
    if duration > max {
        return Err(format!("must be at most {}", humantime::format_duration(max)));
    }
    Ok(duration)
}

/// How the spec writes a duration: a subset of what [parse_duration] reads (one number of up to
/// three digits and a unit), so that a client validating against the spec sends nothing the
/// server refuses as malformed.
pub const DURATION_PATTERN: &str = "^(0|[0-9]{1,3}(ms|s|m|h))$";

/// A duration above zero and at most `max` (without one, any three digits), as a pattern: the
/// numbers of each unit that fit, without leading zeros, so that a generated value is one the
/// server takes (`ttl`, a transaction's `deadline`, a claim's `ack_deadline`).
pub fn positive_duration_pattern(max: Option<Duration>) -> String {
    format!("^({})$", positive_durations(max))
}

/// A duration of zero or more, at most `max`, as a pattern (see [positive_duration_pattern]).
pub fn duration_pattern_up_to(max: Duration) -> String {
    format!("^(0|{})$", positive_durations(Some(max)))
}

/// The alternatives of [positive_duration_pattern], one per unit that fits under `max`.
fn positive_durations(max: Option<Duration>) -> String {
    let units = [("ms", 1u128), ("s", 1_000), ("m", 60_000), ("h", 3_600_000)];
    let alternatives: Vec<String> = units
        .iter()
        .filter_map(|&(unit, ms)| {
            let most = max.map_or(999, |max| (max.as_millis() / ms).min(999)) as u32;
            (most >= 1).then(|| format!("({}){unit}", one_to(most)))
        })
        .collect();
    alternatives.join("|")
}

/// A pattern for the whole numbers 1 to `most` (at most 999), without leading zeros.
fn one_to(most: u32) -> String {
    let mut parts = vec![format!("[1-{}]", most.min(9))];
    if most >= 10 {
        let top = most.min(99);
        let (tens, units) = (top / 10, top % 10);
        if tens > 1 {
            parts.push(format!("[1-{}][0-9]", tens - 1));
        }
        parts.push(format!("{tens}[0-{units}]"));
    }
    if most >= 100 {
        let (hundreds, tens, units) = (most / 100, most / 10 % 10, most % 10);
        if hundreds > 1 {
            parts.push(format!("[1-{}][0-9][0-9]", hundreds - 1));
        }
        if tens > 0 {
            parts.push(format!("{hundreds}[0-{}][0-9]", tens - 1));
        }
        parts.push(format!("{hundreds}{tens}[0-{units}]"));
    }
    parts.join("|")
}

impl utoipa::PartialSchema for HumanDuration {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .description(Some("A duration: `500ms`, `5s`, `1m`, `0`."))
            .pattern(Some(DURATION_PATTERN))
            .examples([serde_json::json!("30s")])
            .into()
    }
}

impl utoipa::ToSchema for HumanDuration {}

/// The latest instant a timestamp can show: the last millisecond of year 9999.
const LATEST: Duration = Duration::from_millis(253_402_300_799_999);

/// RFC 3339 with milliseconds, UTC: `2026-11-22T10:00:00.000Z`. Instants outside what RFC 3339
/// can write (before 1970 or after 9999, which only hostile data holds) are clamped to its
/// range: formatting them must not panic.
pub fn timestamp(time: SystemTime) -> String {
    let since_epoch = time.duration_since(UNIX_EPOCH).unwrap_or_default().min(LATEST);
    humantime::format_rfc3339_millis(UNIX_EPOCH + since_epoch).to_string()
}

/// A time as requests give it (`not_before`): RFC 3339 in UTC, `2026-11-23T10:00:00Z`, with up
/// to nine digits of a second's fraction, from 1970 to 9999, on a day the month has (the 29th of
/// February in leap years only). Exactly what [UTC_PATTERN] matches: humantime's parser takes
/// more (`+00:00`, a leap second, any number of digits), which the spec could not say.
pub fn parse_utc(text: &str) -> Result<SystemTime, String> {
    let bytes = text.as_bytes();
    let digits = |range: std::ops::Range<usize>| bytes.get(range).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    let fraction = match bytes.get(19) {
        Some(b'Z') if bytes.len() == 20 => 0,
        Some(b'.') if (22..=30).contains(&bytes.len()) && bytes.last() == Some(&b'Z') => bytes.len() - 21,
        _ => return Err("not `YYYY-MM-DDTHH:MM:SSZ` (with at most nine digits of fraction)".into()),
    };
    let shape = digits(0..4)
        && bytes[4] == b'-'
        && digits(5..7)
        && bytes[7] == b'-'
        && digits(8..10)
        && bytes[10] == b'T'
        && digits(11..13)
        && bytes[13] == b':'
        && digits(14..16)
        && bytes[16] == b':'
        && digits(17..19)
        && (fraction == 0 || digits(20..20 + fraction));
    if !shape {
        return Err("not `YYYY-MM-DDTHH:MM:SSZ` (with at most nine digits of fraction)".into());
    }
    if &text[17..19] > "59" {
        return Err("a second past 59".into());
    }
    humantime::parse_rfc3339(text).map_err(|e| e.to_string())
}

/// The JSON Schema pattern of [parse_utc]: a month's last day by its length, the 29th of
/// February in years divisible by 4 and not by 100 unless by 400 (from 1970 to 9999).
pub const UTC_PATTERN: &str = concat!(
    "^(",
    // Any year from 1970, any month, days 01-28.
    "(19[7-9][0-9]|[2-9][0-9]{3})-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])",
    // The 29th and 30th of every month but February, the 31st of the long ones.
    "|(19[7-9][0-9]|[2-9][0-9]{3})-(0[13-9]|1[0-2])-(29|30)",
    "|(19[7-9][0-9]|[2-9][0-9]{3})-(0[13578]|1[02])-31",
    // The 29th of February in leap years.
    "|(19(7[26]|8[048]|9[26])|[2-9][0-9](0[48]|[2468][048]|[13579][26])|([2468][048]|[3579][26])00)-02-29",
    ")T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,9})?Z$"
);

/// The instant `ms` milliseconds after the epoch (a znode's `ctime`; negative counts as 0).
pub fn from_millis(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)
}

/// Milliseconds since the epoch, `duration` from now (saturating).
pub fn ms_after_now(duration: Duration) -> i64 {
    now_ms().saturating_add(i64::try_from(duration.as_millis()).unwrap_or(i64::MAX))
}

/// How long from now until `at` (ms since the epoch, as ZooKeeper data says: any value), zero
/// if it has passed.
pub fn until_ms(at: i64) -> Duration {
    Duration::from_millis(u64::try_from(at.saturating_sub(now_ms())).unwrap_or(0))
}

/// The instant `duration` from now, or one far in the future if that overflows.
pub fn instant_after(duration: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(duration)
        .unwrap_or_else(|| now + Duration::from_secs(30 * 365 * 24 * 3600))
}

/// Milliseconds since the epoch, now.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as i64
}

/// Milliseconds since the epoch at `time` (0 before it).
pub fn millis_of(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as i64
}

/// Milliseconds since `time` (0 if it is in the future).
pub fn millis_since(time: SystemTime) -> u64 {
    SystemTime::now().duration_since(time).unwrap_or_default().as_millis() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pattern takes exactly the positive durations within the bound: every count of
    /// every unit is tried, against the server's own parser.
    #[test]
    fn a_positive_duration_pattern_takes_exactly_what_the_server_takes() {
        for max in [
            None,
            Some(Duration::from_secs(24 * 3600)),
            Some(Duration::from_secs(12 * 3600)),
            Some(Duration::from_secs(90)),
        ] {
            let pattern = regex::Regex::new(&positive_duration_pattern(max)).expect("a valid pattern");
            for unit in ["ms", "s", "m", "h"] {
                for n in 0..=999 {
                    let text = format!("{n}{unit}");
                    let parsed = parse_duration(&text).expect("parses");
                    let taken = !parsed.is_zero() && max.is_none_or(|max| parsed <= max);
                    assert_eq!(pattern.is_match(&text), taken, "{text} with {max:?}");
                }
            }
            assert!(!pattern.is_match("0") && !pattern.is_match("010s"));
        }
        let up_to = regex::Regex::new(&duration_pattern_up_to(Duration::from_secs(3600))).expect("a valid pattern");
        for (text, taken) in [
            ("0", true),
            ("0s", false),
            ("60m", true),
            ("61m", false),
            ("1h", true),
            ("2h", false),
        ] {
            assert_eq!(up_to.is_match(text), taken, "{text}");
        }
    }

    /// The pattern takes exactly the times the server takes: every day 00-32 of every month of
    /// years around the leap rules and the range's ends, and the shapes around the edges.
    #[test]
    fn the_utc_pattern_takes_exactly_what_the_server_takes() {
        let pattern = regex::Regex::new(UTC_PATTERN).expect("a valid pattern");
        let agree = |text: &str| {
            assert_eq!(
                pattern.is_match(text),
                parse_utc(text).is_ok(),
                "{text}: {:?}",
                parse_utc(text)
            );
        };
        for year in [
            1969, 1970, 1972, 1996, 1999, 2000, 2023, 2024, 2100, 2400, 2800, 3600, 9999,
        ] {
            for month in 0..=13 {
                for day in 0..=32 {
                    agree(&format!("{year:04}-{month:02}-{day:02}T10:00:00Z"));
                }
            }
        }
        for text in [
            "2026-11-23T10:00:00Z",
            "2026-11-23T10:00:00.5Z",
            "2026-11-23T10:00:00.123456789Z",
            "2026-11-23T10:00:00.1234567890Z",
            "2026-11-23T10:00:00.Z",
            "2026-11-23T10:00:00+00:00",
            "2026-11-23T10:00:00",
            "2026-11-23 10:00:00Z",
            "2026-11-23T23:59:59Z",
            "2026-11-23T24:00:00Z",
            "2026-11-23T10:60:00Z",
            "2026-11-23T10:00:60Z",
            "2026-11-23t10:00:00z",
            "+2026-11-23T10:00:00Z",
            "2026-11-23T10:00:00ZZ",
            "0000-01-01T00:00:00Z",
        ] {
            agree(text);
        }
        assert!(parse_utc("2024-02-29T10:00:00Z").is_ok() && parse_utc("2100-02-29T10:00:00Z").is_err());
        assert!(parse_utc("2026-12-31T23:59:59.999Z").is_ok());
    }

    #[test]
    fn timestamps_never_panic() {
        assert_eq!(timestamp(from_millis(0)), "1970-01-01T00:00:00.000Z");
        assert_eq!(timestamp(from_millis(i64::MAX)), "9999-12-31T23:59:59.999Z");
        assert_eq!(timestamp(from_millis(-5)), "1970-01-01T00:00:00.000Z");
        assert_eq!(until_ms(i64::MIN), Duration::ZERO);
        assert!(until_ms(i64::MAX) > Duration::from_secs(1_000_000));
        assert!(ms_after_now(Duration::MAX) == i64::MAX);
        let _ = instant_after(Duration::MAX);
    }

    #[test]
    fn durations() {
        assert!(parse_duration("99999999999h").is_err(), "past the bound");
        assert!(parse_duration("366d").is_ok());
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1m 30s"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("-5s").is_err());
    }
}
