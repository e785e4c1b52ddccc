//! Rate strings: `"5/minute"`, `"100 per hour"`, `"10/30s"`, several joined
//! by `;`. One grammar for every front end: a route limit written in a
//! framework's idiom (`@throttle.limit("5/minute")`, `limit('5/minute')`) and
//! a policy rule's `rate` field are read here.
//!
//! Grammar, spaces allowed between the parts:
//!
//! ```text
//! rates  = rate *( (";" / "," / "|") rate )
//! rate   = count ( "/" / "per" ) [ n ] unit
//! unit   = ms | s | sec | second | m | min | minute | h | hr | hour
//!        | d | day | month | year            (each with an optional plural "s")
//! ```
//!
//! `count` is the limit (1 to [`crate::MAX_LIMIT`]), `n` (default 1) times
//! the unit is the window. A month is 30 days and a year 365 days (a window,
//! not a calendar period: for calendar periods use `algorithm = "quota"`).

use std::time::Duration;

use crate::error::{Error, Result};
use crate::policy::{MAX_LIMIT, MAX_WINDOW};

/// One limit of a rate string: `limit` units per `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Units admitted per window.
    pub limit: u64,
    /// The window.
    pub window: Duration,
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.limit, crate::duration::format_duration(self.window))
    }
}

const UNITS: &[(&[&str], u64)] = &[
    (&["ms", "millisecond"], 1),
    (&["s", "sec", "second"], 1_000),
    (&["m", "min", "minute"], 60_000),
    (&["h", "hr", "hour"], 3_600_000),
    (&["d", "day"], 86_400_000),
    (&["month"], 30 * 86_400_000),
    (&["year"], 365 * 86_400_000),
];

fn unit_ms(word: &str) -> Option<u64> {
    let lower = word.to_ascii_lowercase();
    let single = lower.strip_suffix('s').filter(|s| s.len() > 1 && *s != "m");
    UNITS.iter().find_map(|(names, ms)| {
        names
            .iter()
            .any(|n| *n == lower || Some(*n) == single)
            .then_some(*ms)
    })
}

/// Parse one or more rates (`"5/minute"`, `"100 per hour; 1000/day"`).
///
/// Errors are [`crate::ErrorKind::InvalidArgument`] and name the part that
/// is wrong and the form expected. Two rates with the same window are
/// refused (one of them would never matter).
pub fn parse_rate(text: &str) -> Result<Vec<Rate>> {
    let mut out: Vec<Rate> = Vec::new();
    let several = text.contains([';', ',', '|']);
    for part in text.split([';', ',', '|']) {
        let lead = if several { format!("{:?}: ", part.trim()) } else { String::new() };
        let rate = parse_one(part.trim(), &lead).map_err(|m| Error::invalid_argument(format!("rate {text:?}: {m}")))?;
        if out.iter().any(|r| r.window == rate.window) {
            return Err(Error::invalid_argument(format!(
                "rate {text:?}: two limits per {}; give one limit per window",
                crate::duration::format_duration(rate.window)
            )));
        }
        out.push(rate);
    }
    Ok(out)
}

fn parse_one(part: &str, lead: &str) -> std::result::Result<Rate, String> {
    const FORM: &str = "write a count per window, e.g. \"5/minute\", \"100 per hour\" or \"10/30s\"";
    if part.is_empty() {
        return Err(format!("{lead}an empty rate; {FORM}"));
    }
    let digits = part.find(|c: char| !c.is_ascii_digit()).unwrap_or(part.len());
    if digits == 0 {
        return Err(format!("{lead}no count at the start; {FORM}"));
    }
    let limit: u64 = part[..digits].parse().map_err(|_| format!("{lead}the count is too large"))?;
    if limit == 0 || limit > MAX_LIMIT {
        return Err(format!("{lead}the count must be between 1 and {MAX_LIMIT}, not {limit}"));
    }
    let rest = part[digits..].trim_start();
    let rest = if let Some(r) = rest.strip_prefix('/') {
        r
    } else if rest.len() >= 3 && rest[..3].eq_ignore_ascii_case("per") {
        &rest[3..]
    } else {
        return Err(format!("{lead}expected \"/\" or \"per\" after the count; {FORM}"));
    };
    let rest = rest.trim();
    let n_end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
    let n: u64 = if n_end == 0 {
        1
    } else {
        rest[..n_end].parse().map_err(|_| format!("{lead}the window is too large"))?
    };
    let word = rest[n_end..].trim();
    if word.is_empty() {
        return Err(format!("{lead}no unit after the count; {FORM}"));
    }
    let ms = unit_ms(word).ok_or_else(|| {
        format!("{lead}unknown unit {word:?}; use ms, second, minute, hour, day, month or year (or s, m, h, d)")
    })?;
    if n == 0 {
        return Err(format!("{lead}the window must be longer than zero"));
    }
    let window = n
        .checked_mul(ms)
        .map(Duration::from_millis)
        .filter(|w| *w <= MAX_WINDOW)
        .ok_or_else(|| format!("{lead}the window must be at most 366d"))?;
    Ok(Rate { limit, window })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(text: &str) -> (u64, u64) {
        let r = parse_rate(text).unwrap();
        assert_eq!(r.len(), 1, "{text}");
        (r[0].limit, r[0].window.as_millis() as u64)
    }

    #[test]
    fn the_forms_limits_reads() {
        assert_eq!(one("5/minute"), (5, 60_000));
        assert_eq!(one("5 / minute"), (5, 60_000));
        assert_eq!(one("100 per hour"), (100, 3_600_000));
        assert_eq!(one("100 PER Hours"), (100, 3_600_000));
        assert_eq!(one("10/30 seconds"), (10, 30_000));
        assert_eq!(one("10/30s"), (10, 30_000));
        assert_eq!(one("3/2d"), (3, 172_800_000));
        assert_eq!(one("7/250ms"), (7, 250));
        assert_eq!(one("1/second"), (1, 1_000));
        assert_eq!(one("1/secs"), (1, 1_000));
        assert_eq!(one("2/mins"), (2, 60_000));
        assert_eq!(one("2/hrs"), (2, 3_600_000));
        assert_eq!(one("1/month"), (1, 30 * 86_400_000));
        assert_eq!(one("1 per year"), (1, 365 * 86_400_000));
    }

    #[test]
    fn several() {
        let r = parse_rate("5/minute; 100/hour, 1000 per day").unwrap();
        assert_eq!(r.iter().map(|r| r.limit).collect::<Vec<_>>(), vec![5, 100, 1000]);
    }

    #[test]
    fn errors_name_the_part() {
        let msg = |t: &str| parse_rate(t).unwrap_err().message().to_string();
        assert_eq!(
            msg("five/minute"),
            "rate \"five/minute\": no count at the start; write a count per window, e.g. \"5/minute\", \"100 per hour\" or \"10/30s\""
        );
        assert!(msg("5/fortnight").contains("unknown unit \"fortnight\""), "{}", msg("5/fortnight"));
        assert!(msg("5").contains("expected \"/\" or \"per\""));
        assert!(msg("5/").contains("no unit after the count"));
        assert!(msg("5/minute;x").contains("\"x\": no count at the start"), "{}", msg("5/minute;x"));
        assert!(msg("0/minute").contains("between 1 and"));
        assert!(msg("5/0s").contains("longer than zero"));
        assert!(msg("5/400d").contains("at most 366d"));
        assert!(msg("5/minute;6/60s").contains("two limits per 1m"));
        assert!(msg("").contains("an empty rate"));
    }

    #[test]
    fn errors_are_invalid_argument() {
        assert_eq!(parse_rate("x").unwrap_err().kind(), crate::ErrorKind::InvalidArgument);
    }
}
