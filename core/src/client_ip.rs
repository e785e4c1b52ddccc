//! The client address a middleware limits on, computed the same way in every
//! language.
//!
//! By default only the socket's peer address counts. Forwarded headers
//! (`Forwarded`, then `X-Forwarded-For`) are read only when the peer is one of
//! the explicitly trusted proxies, right to left, skipping trusted hops: the
//! first untrusted hop is the client. IPv4-mapped IPv6 addresses count as
//! their IPv4 address, and IPv6 clients are grouped by network prefix (/64 by
//! default), since one subscriber usually holds a whole /64.

use std::net::{IpAddr, Ipv6Addr};

use crate::error::{Error, Result};
use crate::options::OptionValue;

/// A network in CIDR form, such as `10.0.0.0/8` or `2001:db8::/32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Net {
    addr: IpAddr,
    prefix: u8,
}

impl Net {
    fn parse(text: &str) -> Result<Net> {
        let (a, p) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let addr: IpAddr = a.trim().parse().map_err(|_| {
            Error::invalid_argument(format!(
                "trusted_proxies: {text:?} is not an IP address or CIDR network"
            ))
        })?;
        let addr = canonical(addr);
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            None => max,
            Some(p) => match p.trim().parse::<u8>() {
                Ok(n) if n <= max => n,
                _ => {
                    return Err(Error::invalid_argument(format!(
                        "trusted_proxies: {text:?} has an invalid prefix length"
                    )))
                }
            },
        };
        Ok(Net { addr, prefix })
    }

    /// A network from `addr/prefix` (or a lone address, its whole length),
    /// the address normalised; the error says what is wrong.
    pub(crate) fn parse_cidr(text: &str) -> std::result::Result<Net, String> {
        let (a, p) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let addr: IpAddr = a.trim().parse().map_err(|_| format!("{text:?} is not an IP address or CIDR network"))?;
        let addr = canonical(addr);
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            None => max,
            Some(p) => match p.trim().parse::<u8>() {
                Ok(n) if n <= max => n,
                _ => return Err(format!("{text:?} has an invalid prefix length (0 to {max})")),
            },
        };
        Ok(Net { addr, prefix })
    }

    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = if self.prefix == 0 { 0 } else { u32::MAX << (32 - self.prefix) };
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = if self.prefix == 0 { 0 } else { u128::MAX << (128 - self.prefix) };
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// How a middleware finds the client address of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIpConfig {
    trusted: Vec<Net>,
    ipv6_prefix: u8,
}

impl Default for ClientIpConfig {
    fn default() -> Self {
        ClientIpConfig {
            trusted: Vec::new(),
            ipv6_prefix: 64,
        }
    }
}

/// The settings of [`ClientIpConfig::from_options`], by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientIpOption {
    /// Proxies whose forwarded headers are believed.
    TrustedProxies,
    /// Bits of an IPv6 client address that identify it.
    Ipv6Prefix,
}

impl ClientIpConfig {
    /// Trust these proxies (addresses or CIDR networks) and group IPv6
    /// clients by `ipv6_prefix` bits (1..=128; 64 is the usual choice).
    pub fn new<I, S>(trusted_proxies: I, ipv6_prefix: u8) -> Result<ClientIpConfig>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        if ipv6_prefix == 0 || ipv6_prefix > 128 {
            return Err(Error::invalid_argument(format!(
                "ipv6_prefix: must be between 1 and 128, not {ipv6_prefix}"
            )));
        }
        let trusted = trusted_proxies
            .into_iter()
            .map(|s| Net::parse(s.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        Ok(ClientIpConfig { trusted, ipv6_prefix })
    }

    /// A config from options given by name, as a front end read them
    /// (`(option, what, value)`, where `what` names the option as the caller
    /// wrote it): `TrustedProxies` a list of addresses or CIDR networks
    /// (default none), `Ipv6Prefix` a whole number (default 64).
    pub fn from_options(options: Vec<(ClientIpOption, String, OptionValue)>) -> Result<ClientIpConfig> {
        let (mut trusted, mut prefix) = (Vec::new(), 64u8);
        for (option, what, value) in options {
            match (option, value) {
                (_, OptionValue::Unset) => {}
                (ClientIpOption::TrustedProxies, OptionValue::List(items)) => {
                    for (i, item) in items.into_iter().enumerate() {
                        trusted.push(item.text(&format!("{what}[{i}]"))?);
                    }
                }
                (ClientIpOption::TrustedProxies, other) => {
                    return Err(other.expected(&what, "a list of addresses or CIDR networks"))
                }
                (ClientIpOption::Ipv6Prefix, OptionValue::Number(n)) if n.fract() == 0.0 && (1.0..=128.0).contains(&n) => {
                    prefix = n as u8
                }
                (ClientIpOption::Ipv6Prefix, OptionValue::Number(n)) => {
                    return Err(Error::invalid_argument(format!("{what}: must be between 1 and 128, not {n}")))
                }
                (ClientIpOption::Ipv6Prefix, other) => return Err(other.expected(&what, "a whole number")),
            }
        }
        ClientIpConfig::new(trusted, prefix)
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|n| n.contains(ip))
    }

    /// The client address to limit on, normalised (IPv4 dotted, or the IPv6
    /// network as `addr/prefix`).
    ///
    /// `peer` is the socket's remote address (a port, brackets or an IPv6
    /// zone are tolerated); `forwarded` and `x_forwarded_for` are the raw
    /// header values, all occurrences joined with `,`. `None` when `peer` is
    /// not an IP address (a Unix socket, for instance).
    pub fn client_ip(
        &self,
        peer: &str,
        forwarded: Option<&str>,
        x_forwarded_for: Option<&str>,
    ) -> Option<String> {
        let mut client = parse_ip(peer)?;
        if self.is_trusted(client) {
            let hops: Vec<IpAddr> = match forwarded.filter(|f| !f.trim().is_empty()) {
                Some(f) => forwarded_for_values(f),
                None => x_forwarded_for
                    .map(|x| x.split(',').filter_map(parse_ip).collect())
                    .unwrap_or_default(),
            };
            for hop in hops.iter().rev() {
                client = *hop;
                if !self.is_trusted(*hop) {
                    break;
                }
            }
        }
        Some(self.normalise(client))
    }

    fn normalise(&self, ip: IpAddr) -> String {
        match ip {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => {
                if self.ipv6_prefix >= 128 {
                    return v6.to_string();
                }
                let mask = u128::MAX << (128 - self.ipv6_prefix);
                let net = Ipv6Addr::from(u128::from(v6) & mask);
                format!("{net}/{}", self.ipv6_prefix)
            }
        }
    }
}

/// Parse one address as found in headers or socket names: `1.2.3.4`,
/// `1.2.3.4:5678`, `[::1]:80`, `::1`, `"[2001:db8::1]"`, `fe80::1%eth0`.
pub(crate) fn parse_ip(text: &str) -> Option<IpAddr> {
    let t = text.trim().trim_matches('"');
    let t = if let Some(rest) = t.strip_prefix('[') {
        rest.split(']').next()?
    } else if t.matches(':').count() == 1 {
        t.split(':').next()?
    } else {
        t
    };
    let t = t.split('%').next()?;
    t.parse::<IpAddr>().ok().map(canonical)
}

/// The `for=` values of a `Forwarded` header (RFC 7239), in order; obfuscated
/// or unknown identifiers end the usable chain.
fn forwarded_for_values(header: &str) -> Vec<IpAddr> {
    let mut out = Vec::new();
    for element in header.split(',') {
        for pair in element.split(';') {
            if let Some((k, v)) = pair.split_once('=') {
                if k.trim().eq_ignore_ascii_case("for") {
                    match parse_ip(v) {
                        Some(ip) => out.push(ip),
                        None => {
                            // "unknown" or "_hidden": nothing to the left of it can be trusted.
                            out.clear();
                        }
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_only_by_default() {
        let c = ClientIpConfig::default();
        assert_eq!(c.client_ip("203.0.113.7:5555", None, Some("1.1.1.1")).unwrap(), "203.0.113.7");
    }

    #[test]
    fn trusted_proxies_right_to_left() {
        let c = ClientIpConfig::new(["10.0.0.0/8"], 64).unwrap();
        assert_eq!(c.client_ip("10.0.0.1", None, Some("6.6.6.6, 198.51.100.9, 10.0.0.2")).unwrap(), "198.51.100.9");
        // Spoofed header from an untrusted peer is ignored.
        assert_eq!(c.client_ip("198.51.100.1", None, Some("1.2.3.4")).unwrap(), "198.51.100.1");
        assert_eq!(
            c.client_ip("10.0.0.1", Some("for=192.0.2.60;proto=http, for=\"[2001:db8:cafe::17]:4711\""), Some("9.9.9.9")).unwrap(),
            "2001:db8:cafe::/64"
        );
    }

    #[test]
    fn ipv6_grouping_and_mapped() {
        let c = ClientIpConfig::default();
        assert_eq!(c.client_ip("[2001:db8:1:2:3:4:5:6]:443", None, None).unwrap(), "2001:db8:1:2::/64");
        assert_eq!(c.client_ip("::ffff:192.0.2.1", None, None).unwrap(), "192.0.2.1");
        assert_eq!(ClientIpConfig::new(Vec::<String>::new(), 128).unwrap().client_ip("2001:db8::1", None, None).unwrap(), "2001:db8::1");
        assert!(c.client_ip("/tmp/socket", None, None).is_none());
        assert!(ClientIpConfig::new(["nope"], 64).is_err());
        assert!(ClientIpConfig::new(["10.0.0.0/33"], 64).is_err());
        assert!(ClientIpConfig::new(Vec::<String>::new(), 0).is_err());
    }
}
