//! A rule's `exempt` lists: requests for which the rule does not apply,
//! decided in process before any round trip.

use std::net::IpAddr;

use crate::client_ip::{parse_ip, Net};

/// One entry of an `exempt` list: an IP network (a lone address is its
/// whole-length network), matched by address, or any other value, matched
/// exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Exemption {
    Net(Net),
    Exact(String),
}

/// True when `text` is written as an address or a network: hex digits,
/// dots and colons, with at least one dot or colon, optionally `/` and a
/// prefix length. Such an entry must parse as one.
fn looks_like_address(text: &str) -> bool {
    let head = text.split_once('/').map_or(text, |(a, _)| a);
    !head.is_empty()
        && head.contains(['.', ':'])
        && head.bytes().all(|b| b.is_ascii_hexdigit() || b == b'.' || b == b':')
}

impl Exemption {
    /// An entry as written in a policy; an entry that looks like an address
    /// or a CIDR network but is not a valid one is an error saying why.
    pub fn parse(text: &str) -> Result<Exemption, String> {
        if looks_like_address(text) {
            return Net::parse_cidr(text).map(Exemption::Net);
        }
        if text.contains('/') && text.split_once('/').is_some_and(|(_, p)| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())) {
            // "10.0.0/8", "host/24": a network with a malformed address.
            if let Some((a, _)) = text.split_once('/') {
                if !a.is_empty() && a.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b':') {
                    return Err(format!("{text:?} is not a valid CIDR network (write e.g. \"10.0.0.0/8\" or \"2001:db8::/32\")"));
                }
            }
        }
        Ok(Exemption::Exact(text.to_string()))
    }

    fn matches(&self, value: &str, ip: &mut Option<Option<IpAddr>>) -> bool {
        match self {
            Exemption::Exact(v) => v == value,
            Exemption::Net(net) => ip.get_or_insert_with(|| parse_ip(value)).is_some_and(|a| net.contains(a)),
        }
    }
}

/// A rule's compiled `exempt` table: attribute -> entries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Exempt(Vec<(String, Vec<Exemption>)>);

impl Exempt {
    /// Compile a validated table (entries that fail to parse are left out:
    /// the policy's validation refused them already).
    pub fn compile(table: &std::collections::BTreeMap<String, Vec<String>>) -> Exempt {
        Exempt(
            table
                .iter()
                .map(|(a, vs)| (a.clone(), vs.iter().filter_map(|v| Exemption::parse(v).ok()).collect()))
                .collect(),
        )
    }

    /// True when no entry is listed.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// True when an attribute of the request has an exempt value.
    pub fn covers(&self, attrs: &dyn crate::key::Attributes) -> bool {
        self.0.iter().any(|(attr, entries)| match attrs.get_attr(attr) {
            Some(v) => {
                let mut ip = None;
                entries.iter().any(|e| e.matches(v, &mut ip))
            }
            None => false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_parse_and_match_by_address() {
        let mut t = std::collections::BTreeMap::new();
        t.insert("ip".to_string(), vec!["10.0.0.0/8".to_string(), "2001:db8::/32".to_string(), "192.0.2.7".to_string()]);
        t.insert("route".to_string(), vec!["/health".to_string()]);
        let e = Exempt::compile(&t);
        for (ip, yes) in [
            ("10.1.2.3", true),
            ("::ffff:10.9.9.9", true),
            ("2001:DB8:0:0::1", true),
            ("192.0.2.7", true),
            ("192.0.2.8", false),
            ("11.0.0.1", false),
            ("not an ip", false),
        ] {
            assert_eq!(e.covers(&[("ip", ip)]), yes, "{ip}");
        }
        assert!(e.covers(&[("route", "/health")]));
        assert!(!e.covers(&[("route", "/healthz")]));
        assert!(!e.covers(&[("user", "x")]));
        for bad in ["10.0.0.0/33", "10.0.0/8", "2001:db8::/129", "1.2.3.4/x"] {
            assert!(Exemption::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(Exemption::parse("healthcheck"), Ok(Exemption::Exact("healthcheck".into())));
    }
}
