//! The limiter's and a check's options by name (see [`crate::options`]).
//!
//! A front end maps its spelling of an option to a [`LimiterOption`] (or a
//! [`CheckOption`]) and its value to an [`OptionValue`], and calls
//! [`LimiterOptions::set`]; `what` is the option as the caller wrote it
//! (`"timeout"`, `"options.keyPrefix"`), and every message starts with it.

use super::{CheckOptions, LimiterOptions};
use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::options::{unknown_option, DurationUnit, OptionValue};
use crate::policy::FailureMode;

/// The settings of [`LimiterOptions`], by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimiterOption {
    /// [`LimiterOptions::url`]: text.
    Url,
    /// [`LimiterOptions::timeout`]: a number in the front end's unit, or text such as `"250ms"`.
    Timeout,
    /// [`LimiterOptions::on_backend_error`]: `"allow"`, `"deny"` or `"error"`.
    OnBackendError,
    /// [`LimiterOptions::prefix`]: text.
    Prefix,
    /// [`LimiterOptions::clock`]: a clock object, `"backend"` or `"system"`.
    Clock,
    /// [`LimiterOptions::key_secret`]: text (as UTF-8) or bytes, not empty.
    KeySecret,
    /// [`LimiterOptions::tls_root_cert`]: PEM as text or bytes.
    TlsRootCert,
    /// [`LimiterOptions::tls_client_cert`]: a list of two PEM documents, the certificate and its key.
    TlsClientCert,
    /// The TLS settings as one mapping: `ca` (PEM, or a list of PEM
    /// documents), `cert` and `key` (PEM, given together).
    Tls,
    /// [`LimiterOptions::deny_cache`]: a boolean.
    DenyCache,
    /// [`LimiterOptions::legacy_headers`]: a boolean.
    LegacyHeaders,
    /// [`LimiterOptions::metrics`]: a boolean.
    Metrics,
    /// [`LimiterOptions::reload_on_change`]: a boolean.
    ReloadOnChange,
    /// [`LimiterOptions::strict`]: a boolean.
    Strict,
}

/// The settings of [`CheckOptions`], by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckOption {
    /// [`CheckOptions::cost`]: a whole number (the check says which are admitted).
    Cost,
    /// [`CheckOptions::call_id`]: text.
    CallId,
}

impl LimiterOptions {
    /// Set `option` from `value`, as the front end read it; `what` is the
    /// option as the caller wrote it, for messages. [`OptionValue::Unset`]
    /// leaves the setting at its default. Values are checked here for their
    /// type and form; [`crate::Limiter::with_options`] checks the rest (a
    /// URL's scheme, a prefix's characters, a timeout's range).
    pub fn set(&mut self, option: LimiterOption, what: &str, value: OptionValue, unit: DurationUnit) -> Result<()> {
        if value.is_unset() {
            return Ok(());
        }
        match option {
            LimiterOption::Url => self.url = Some(value.text(what)?),
            LimiterOption::Timeout => self.timeout = Some(value.duration(what, unit)?),
            LimiterOption::OnBackendError => {
                let text = value.text(what)?;
                let mode = FailureMode::parse(&text)
                    .map_err(|e| Error::invalid_argument(format!("{what}: {}", e.message())))?;
                self.on_backend_error = Some(mode);
            }
            LimiterOption::Prefix => self.prefix = Some(value.text(what)?),
            LimiterOption::Clock => {
                self.clock = match value {
                    OptionValue::Clock(c) => c,
                    OptionValue::Text(t) if t == "backend" => Clock::Backend,
                    OptionValue::Text(t) if t == "system" => Clock::System,
                    OptionValue::Text(t) => {
                        return Err(Error::invalid_argument(format!(
                            "{what}: expected a ManualClock, \"backend\" or \"system\", got {t:?}"
                        )))
                    }
                    other => return Err(other.expected(what, "a ManualClock, \"backend\" or \"system\"")),
                }
            }
            LimiterOption::KeySecret => self.key_secret = Some(value.bytes(what)?),
            LimiterOption::TlsRootCert => self.tls_root_cert = Some(value.bytes(what)?),
            LimiterOption::TlsClientCert => {
                let pair = match value {
                    OptionValue::List(items) if items.len() == 2 => items,
                    OptionValue::List(items) => {
                        return Err(Error::wrong_type(format!(
                            "{what}: expected a (certificate, key) pair, got {} items",
                            items.len()
                        )))
                    }
                    other => return Err(other.expected(what, "a (certificate, key) pair")),
                };
                let mut pair = pair.into_iter();
                let (cert, key) = (pair.next().unwrap_or(OptionValue::Unset), pair.next().unwrap_or(OptionValue::Unset));
                self.tls_client_cert =
                    Some((cert.bytes(&format!("{what}[0]"))?, key.bytes(&format!("{what}[1]"))?));
            }
            LimiterOption::Tls => self.set_tls(what, value)?,
            LimiterOption::DenyCache => self.deny_cache = value.boolean(what)?,
            LimiterOption::LegacyHeaders => self.legacy_headers = value.boolean(what)?,
            LimiterOption::Metrics => self.metrics = value.boolean(what)?,
            LimiterOption::ReloadOnChange => self.reload_on_change = value.boolean(what)?,
            LimiterOption::Strict => self.strict = value.boolean(what)?,
        }
        Ok(())
    }

    /// [`LimiterOption::Tls`]: `{ ca, cert, key }`.
    fn set_tls(&mut self, what: &str, value: OptionValue) -> Result<()> {
        let OptionValue::Map(entries) = value else {
            return Err(value.expected(what, "an object of ca, cert and key"));
        };
        let (mut cert, mut key) = (None, None);
        for (name, value) in entries {
            if value.is_unset() {
                continue;
            }
            let field = format!("{what}.{name}");
            match name.as_str() {
                "ca" => {
                    self.tls_root_cert = Some(match value {
                        // PEM files concatenate: one bundle holds every listed CA.
                        OptionValue::List(items) => {
                            let mut pem = Vec::new();
                            for (i, item) in items.into_iter().enumerate() {
                                pem.extend(item.bytes(&format!("{field}[{i}]"))?);
                                pem.push(b'\n');
                            }
                            pem
                        }
                        other => other.bytes(&field)?,
                    })
                }
                "cert" => cert = Some(value.bytes(&field)?),
                "key" => key = Some(value.bytes(&field)?),
                _ => return Err(unknown_option(what, &name, &["ca", "cert", "key"])),
            }
        }
        self.tls_client_cert = match (cert, key) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            (Some(_), None) => {
                return Err(Error::invalid_argument(format!(
                    "{what}.key: required with {what}.cert (the client certificate's private key)"
                )))
            }
            (None, Some(_)) => {
                return Err(Error::invalid_argument(format!(
                    "{what}.cert: required with {what}.key (the client certificate)"
                )))
            }
        };
        Ok(())
    }
}

impl CheckOptions {
    /// Set `option` from `value`, as [`LimiterOptions::set`] does. A cost is
    /// a whole number, not negative; the check itself says which costs it
    /// admits (0 never, nor more than a rule's limit).
    pub fn set(&mut self, option: CheckOption, what: &str, value: OptionValue) -> Result<()> {
        match (option, value) {
            (_, OptionValue::Unset) => {}
            (CheckOption::Cost, OptionValue::Number(n)) => {
                if n.fract() != 0.0 || !n.is_finite() || n < 0.0 || n >= u64::MAX as f64 {
                    return Err(Error::invalid_argument(format!(
                        "{what}: expected a whole number of at least 1, got {n}"
                    )));
                }
                self.cost = n as u64;
            }
            (CheckOption::Cost, other) => return Err(other.expected(what, "a whole number")),
            (CheckOption::CallId, value) => self.call_id = Some(value.text(what)?),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn set(option: LimiterOption, value: OptionValue) -> Result<LimiterOptions> {
        let mut o = LimiterOptions::default();
        o.set(option, "opt", value, DurationUnit::Millis)?;
        Ok(o)
    }

    #[test]
    fn durations_are_numbers_in_the_front_ends_unit_or_text() {
        let t = |v, unit| {
            let mut o = LimiterOptions::default();
            o.set(LimiterOption::Timeout, "timeout", v, unit).map(|_| o.timeout.unwrap())
        };
        assert_eq!(t(OptionValue::Number(1.5), DurationUnit::Seconds).unwrap(), Duration::from_millis(1500));
        assert_eq!(t(OptionValue::Number(1.5), DurationUnit::Millis).unwrap(), Duration::from_micros(1500));
        assert_eq!(t(OptionValue::Text("2s".into()), DurationUnit::Millis).unwrap(), Duration::from_secs(2));
        let e = t(OptionValue::Number(-1.0), DurationUnit::Seconds).unwrap_err();
        assert_eq!(e.message(), "timeout: expected seconds (a finite number, not negative), got -1");
        let e = t(OptionValue::Bool(true), DurationUnit::Millis).unwrap_err();
        assert_eq!(e.message(), "timeout: expected milliseconds or a duration string such as \"100ms\", got a boolean");
    }

    #[test]
    fn values_of_the_wrong_type_are_named() {
        let e = set(LimiterOption::Url, OptionValue::Number(1.0)).unwrap_err();
        assert_eq!(e.message(), "opt: expected a string, got a number");
        let e = set(LimiterOption::DenyCache, OptionValue::Other("a function".into())).unwrap_err();
        assert_eq!(e.message(), "opt: expected a boolean, got a function");
        let e = set(LimiterOption::OnBackendError, OptionValue::Text("maybe".into())).unwrap_err();
        assert_eq!(e.message(), "opt: on_backend_error must be \"allow\", \"deny\" or \"error\", not \"maybe\"");
        assert!(set(LimiterOption::Url, OptionValue::Unset).unwrap().url.is_none());
    }

    #[test]
    fn tls_as_one_mapping_or_two_settings() {
        let pem = |s: &str| OptionValue::Text(s.into());
        let o = set(
            LimiterOption::Tls,
            OptionValue::Map(vec![("ca".into(), OptionValue::List(vec![pem("A"), pem("B")])), ("cert".into(), pem("C")), ("key".into(), pem("K"))]),
        )
        .unwrap();
        assert_eq!(o.tls_root_cert.as_deref(), Some(&b"A\nB\n"[..]));
        assert_eq!(o.tls_client_cert, Some((b"C".to_vec(), b"K".to_vec())));
        let e = set(LimiterOption::Tls, OptionValue::Map(vec![("cert".into(), pem("C"))])).unwrap_err();
        assert_eq!(e.message(), "opt.key: required with opt.cert (the client certificate's private key)");
        let e = set(LimiterOption::Tls, OptionValue::Map(vec![("pem".into(), pem("C"))])).unwrap_err();
        assert_eq!(e.message(), "opt: unknown option \"pem\" (known: ca, cert, key)");
        let o = set(LimiterOption::TlsClientCert, OptionValue::List(vec![pem("C"), OptionValue::Bytes(b"K".to_vec())])).unwrap();
        assert_eq!(o.tls_client_cert, Some((b"C".to_vec(), b"K".to_vec())));
        let e = set(LimiterOption::TlsClientCert, OptionValue::List(vec![pem("C")])).unwrap_err();
        assert_eq!(e.message(), "opt: expected a (certificate, key) pair, got 1 items");
    }

    #[test]
    fn costs_are_whole_numbers() {
        let mut c = CheckOptions::default();
        c.set(CheckOption::Cost, "cost", OptionValue::Number(3.0)).unwrap();
        assert_eq!(c.cost, 3);
        let e = c.set(CheckOption::Cost, "cost", OptionValue::Number(1.5)).unwrap_err();
        assert_eq!(e.message(), "cost: expected a whole number of at least 1, got 1.5");
        let e = c.set(CheckOption::Cost, "cost", OptionValue::Text("1".into())).unwrap_err();
        assert_eq!(e.message(), "cost: expected a whole number, got a string");
    }
}
