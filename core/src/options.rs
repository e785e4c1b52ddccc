//! Options given by name: what a front end read from its language (a
//! keyword argument, a property of an options object) as an [`OptionValue`],
//! checked by the core so that every language accepts the same values and
//! words the same errors ([`crate::LimiterOptions::set`],
//! [`crate::CheckOptions::set`], [`crate::ClientIpConfig::from_options`]).

use std::time::Duration;

use crate::clock::Clock;
use crate::duration::parse_duration;
use crate::error::{Error, Result};

/// A value as a front end read it, before the core checks it.
#[derive(Debug, Clone)]
pub enum OptionValue {
    /// No value (`None`, `null`, `undefined`): the option keeps its default.
    Unset,
    /// A boolean.
    Bool(bool),
    /// A number (for a duration, in the front end's [`DurationUnit`]).
    Number(f64),
    /// Text.
    Text(String),
    /// Bytes (a `bytes` object, a `Buffer`).
    Bytes(Vec<u8>),
    /// A list (a list, a tuple, an array).
    List(Vec<OptionValue>),
    /// Named values (a dict, a plain object), in their order.
    Map(Vec<(String, OptionValue)>),
    /// A clock object of the front end (a `ManualClock`).
    Clock(Clock),
    /// Anything else; the text names its type as the front end's users know it.
    Other(String),
}

impl OptionValue {
    /// What this is, for "expected ..., got ..." messages.
    pub(crate) fn describe(&self) -> &str {
        match self {
            OptionValue::Unset => "nothing",
            OptionValue::Bool(_) => "a boolean",
            OptionValue::Number(_) => "a number",
            OptionValue::Text(_) => "a string",
            OptionValue::Bytes(_) => "bytes",
            OptionValue::List(_) => "a list",
            OptionValue::Map(_) => "an object",
            OptionValue::Clock(_) => "a clock",
            OptionValue::Other(name) => name,
        }
    }

    pub(crate) fn is_unset(&self) -> bool {
        matches!(self, OptionValue::Unset)
    }

    pub(crate) fn expected(&self, what: &str, expected: &str) -> Error {
        Error::wrong_type(format!("{what}: expected {expected}, got {}", self.describe()))
    }

    pub(crate) fn text(self, what: &str) -> Result<String> {
        match self {
            OptionValue::Text(t) => Ok(t),
            other => Err(other.expected(what, "a string")),
        }
    }

    pub(crate) fn boolean(self, what: &str) -> Result<bool> {
        match self {
            OptionValue::Bool(b) => Ok(b),
            other => Err(other.expected(what, "a boolean")),
        }
    }

    /// Text as UTF-8, or bytes as they are.
    pub(crate) fn bytes(self, what: &str) -> Result<Vec<u8>> {
        match self {
            OptionValue::Text(t) => Ok(t.into_bytes()),
            OptionValue::Bytes(b) => Ok(b),
            other => Err(other.expected(what, "a string or bytes")),
        }
    }

    pub(crate) fn duration(self, what: &str, unit: DurationUnit) -> Result<Duration> {
        let n = match self {
            OptionValue::Text(t) => {
                return parse_duration(&t).map_err(|m| Error::invalid_argument(format!("{what}: {m}")))
            }
            OptionValue::Number(n) => n,
            other => {
                let expected = format!("{} or a duration string such as \"100ms\"", unit.numbers());
                return Err(other.expected(what, &expected));
            }
        };
        if !n.is_finite() || n < 0.0 {
            return Err(Error::invalid_argument(format!(
                "{what}: expected {} (a finite number, not negative), got {n}",
                unit.numbers()
            )));
        }
        // Whole numbers are exact (no trip through float seconds), so an
        // error can name the very value given.
        if n.fract() == 0.0 && n < u64::MAX as f64 {
            return Ok(match unit {
                DurationUnit::Seconds => Duration::from_secs(n as u64),
                DurationUnit::Millis => Duration::from_millis(n as u64),
            });
        }
        let secs = match unit {
            DurationUnit::Seconds => n,
            DurationUnit::Millis => n / 1000.0,
        };
        Duration::try_from_secs_f64(secs).map_err(|_| Error::invalid_argument(format!("{what}: {n} is too large")))
    }
}

/// The unit of a bare number given for a duration: seconds in Python,
/// milliseconds in JavaScript and C. Text such as `"100ms"` means the same
/// everywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DurationUnit {
    /// Numbers are seconds.
    Seconds,
    /// Numbers are milliseconds.
    Millis,
}

impl DurationUnit {
    pub(crate) fn numbers(self) -> &'static str {
        match self {
            DurationUnit::Seconds => "seconds",
            DurationUnit::Millis => "milliseconds",
        }
    }
}

/// The error for an option name the front end does not know: names it and
/// lists the known ones. `what` names the options as a whole (`"options"`).
pub fn unknown_option(what: &str, name: &str, known: &[&str]) -> Error {
    Error::invalid_argument(format!("{what}: unknown option {name:?} (known: {})", known.join(", ")))
}

