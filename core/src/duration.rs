//! Durations as written in policies: integer milliseconds, or a string with a
//! unit (`"250ms"`, `"30s"`, `"15m"`, `"1h"`, `"1d"`).

use std::time::Duration;

/// Parse a duration string such as `"100ms"`, `"1m"` or `"250"` (milliseconds).
///
/// The error is a short description of what is wrong, without the field name,
/// which the caller adds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits_end);
    if number.is_empty() {
        return Err(format!(
            "{text:?} is not a duration; write an integer with a unit: ms, s, m, h or d (e.g. \"1m\")"
        ));
    }
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is too large"))?;
    let ms_per_unit: u64 = match unit.trim() {
        "" | "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        other => {
            return Err(format!(
                "{text:?} has unknown unit {other:?}; use ms, s, m, h or d"
            ))
        }
    };
    let ms = n
        .checked_mul(ms_per_unit)
        .ok_or_else(|| format!("{text:?} is too large"))?;
    Ok(Duration::from_millis(ms))
}

/// Write a duration in the shortest exact form with a unit (`"90s"`, `"15m"`).
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis() as u64;
    for (unit, size) in [("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000)] {
        if ms != 0 && ms % size == 0 {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_duration("250").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("15m").unwrap(), Duration::from_secs(900));
        assert_eq!(parse_duration("2h").unwrap(), Duration::from_secs(7200));
        assert_eq!(parse_duration("1d").unwrap(), Duration::from_secs(86400));
    }

    #[test]
    fn rejects_garbage() {
        assert!(parse_duration("").is_err());
        assert!(parse_duration("m").is_err());
        assert!(parse_duration("1.5s").is_err());
        assert!(parse_duration("10 parsecs").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("99999999999999999999d").is_err());
    }

    #[test]
    fn formats_round_trip() {
        for text in ["1d", "3h", "15m", "90s", "250ms", "0ms"] {
            assert_eq!(format_duration(parse_duration(text).unwrap()), text);
        }
    }
}
