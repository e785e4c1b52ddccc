//! What the HTTP integrations ask of a limiter: the request model's
//! attributes ([`Limiter::request_attributes`]), the start-up warnings for
//! rules that could never apply ([`Limiter::attribute_warnings`]), and route
//! limits written in a framework's idiom ([`Limiter::add_route_limit`]).

use std::collections::BTreeSet;

use super::Limiter;
use crate::duration::format_duration;
use crate::error::{Error, Result};
use crate::http::{normalize_host, normalize_method, normalize_path, normalize_route, HttpRequest};
use crate::key::MAX_NAME_LEN;
use crate::policy::Rule;
use crate::policy::rate::parse_rate;

/// A limit on one route, written where the route is declared
/// (`@throttle.limit("5/minute")`, `limit('5/minute')`, a Fastify route's
/// `config.rateLimit`): see [`Limiter::add_route_limit`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteLimit {
    /// The rate: `"5/minute"`, `"100 per hour"`, `"10/30s"`, several joined
    /// by `;` (see [`crate::parse_rate`]).
    pub rate: String,
    /// The route's template in the framework's syntax (normalised as
    /// [`crate::http::normalize_route`] does).
    pub route: String,
    /// The methods it limits (any case; `HEAD` is `GET`); empty: every method.
    pub methods: Vec<String>,
    /// The key template (default `"{ip}"`: per client address).
    pub key: Option<String>,
    /// The rule's name (default: derived from the methods and the route,
    /// `route.POST.login`); with several rates each rule's name ends with
    /// its window (`route.POST.login.1m`).
    pub name: Option<String>,
}

/// The default key of a route limit: per client address.
pub const ROUTE_LIMIT_KEY: &str = "{ip}";

fn derived_name(methods: &[String], route: &str) -> String {
    let mut name = String::from("route");
    if !methods.is_empty() {
        name.push('.');
        name.push_str(&methods.join("-"));
    }
    for seg in route.split('/').filter(|s| !s.is_empty()) {
        let clean: String = seg
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' })
            .collect();
        let clean = clean.trim_matches('_');
        name.push('.');
        name.push_str(if clean.is_empty() { "_" } else { clean });
    }
    name
}

/// `name` cut to fit with `suffix` under [`MAX_NAME_LEN`], with a short
/// hash of the whole so that two long names stay apart.
fn fit(name: &str, suffix: &str) -> String {
    if name.len() + suffix.len() <= MAX_NAME_LEN {
        return format!("{name}{suffix}");
    }
    let hash = name.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3));
    let tag = format!(".{:08x}", hash as u32);
    let room = MAX_NAME_LEN - suffix.len() - tag.len();
    let mut cut = room.min(name.len());
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}{tag}{suffix}", &name[..cut])
}

impl Limiter {
    /// The header names (lower case) the policy's `[attributes]` table
    /// reads: what an integration passes in [`HttpRequest::headers`].
    pub fn request_headers(&self) -> Vec<String> {
        self.inner.current.load().policy.attribute_sources().iter().map(|(_, h)| h.clone()).collect()
    }

    /// The request model's attributes of one request, to pass to a check:
    /// `ip` (when known), `method`, `route` (when a route matches), `path`,
    /// `host` (when given), then each `[attributes]` source the request has
    /// (see [`crate::http`] for what each is).
    pub fn request_attributes(&self, req: &HttpRequest<'_>) -> Vec<(String, String)> {
        let g = self.inner.current.load();
        let sources = g.policy.attribute_sources();
        let mut out = Vec::with_capacity(5 + sources.len());
        if let Some(ip) = req.ip {
            out.push(("ip".to_string(), ip.to_string()));
        }
        out.push(("method".to_string(), normalize_method(req.method)));
        if let Some(route) = req.route {
            out.push(("route".to_string(), normalize_route(route)));
        }
        out.push(("path".to_string(), normalize_path(req.path, req.router)));
        if let Some(host) = req.host {
            out.push(("host".to_string(), normalize_host(host)));
        }
        for (name, header) in sources {
            if let Some((_, v)) = req.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(header)) {
                out.push((name.clone(), v.to_string()));
            }
        }
        out
    }

    /// One message per rule of the policy in force that needs an attribute
    /// (in its key or its `match`) that is neither in `provided` nor read
    /// by the policy's `[attributes]` table, so that it never applies. The
    /// HTTP integrations log each once at start-up, with
    /// [`crate::REQUEST_MODEL`] as `provided`.
    pub fn attribute_warnings(&self, provided: &[&str]) -> Vec<String> {
        let g = self.inner.current.load();
        let p = &g.policy;
        let known: BTreeSet<&str> =
            provided.iter().copied().chain(p.attribute_sources().iter().map(|(n, _)| n.as_str())).collect();
        let mut out = Vec::new();
        for (i, rule) in p.rules().iter().enumerate() {
            let mut needed: BTreeSet<&str> = p.templates[i].attributes().collect();
            needed.extend(rule.matches.keys().map(String::as_str));
            let missing: Vec<String> = needed.into_iter().filter(|a| !known.contains(a)).map(|a| format!("{a:?}")).collect();
            if !missing.is_empty() {
                out.push(format!(
                    "rule {:?} needs the attribute{} {}, which this integration does not provide, so it never applies; \
                     read it from a header in the policy's [attributes] table (api_key = \"header:x-api-key\") or pass an attributes function",
                    rule.name,
                    if missing.len() == 1 { "" } else { "s" },
                    missing.join(", ")
                ));
            }
        }
        out
    }

    /// Limit one route: the rate's rules (sliding-window logs, one per
    /// limit of the rate) are added to the policy in force, matching the
    /// route (`match = { route = ..., method = [...] }`) and keyed on `key`,
    /// so they are checked in the same single round trip as the policy's
    /// own rules, all or nothing. They stay across [`Limiter::reload`].
    /// Adding the same limit again changes nothing; a limit whose rule
    /// name is taken by another rule is refused. Returns the rules' names.
    ///
    /// Errors are [`crate::ErrorKind::InvalidArgument`] and name what is
    /// wrong: the rate, the key template, the name.
    pub fn add_route_limit(&self, limit: &RouteLimit) -> Result<Vec<String>> {
        self.ensure_open()?;
        let rates = parse_rate(&limit.rate)?;
        let route = normalize_route(&limit.route);
        let mut methods: Vec<String> = Vec::new();
        for m in &limit.methods {
            let m = normalize_method(m);
            if m.is_empty() || !m.bytes().all(|b| b.is_ascii_alphabetic() || b == b'-' || b == b'_') {
                return Err(Error::invalid_argument(format!("route limit {route:?}: {m:?} is not an HTTP method")));
            }
            if !methods.contains(&m) {
                methods.push(m);
            }
        }
        let key = limit.key.clone().unwrap_or_else(|| ROUTE_LIMIT_KEY.to_string());
        let base = match &limit.name {
            Some(n) => n.clone(),
            None => derived_name(&methods, &route),
        };
        let rules: Vec<Rule> = rates
            .iter()
            .map(|rate| {
                let suffix = if rates.len() > 1 { format!(".{}", format_duration(rate.window)) } else { String::new() };
                let name = if limit.name.is_some() { format!("{base}{suffix}") } else { fit(&base, &suffix) };
                let mut rule = Rule::sliding_window_log(name, key.clone(), rate.limit, rate.window)
                    .matching("route", [route.clone()]);
                if !methods.is_empty() {
                    rule = rule.matching("method", methods.clone());
                }
                rule
            })
            .collect();
        let names: Vec<String> = rules.iter().map(|r| r.name.clone()).collect();

        let _one = self.inner.reloads.serial.lock().unwrap_or_else(|p| p.into_inner());
        let mut added = self.inner.overrides.added.lock().unwrap_or_else(|p| p.into_inner());
        let fresh: Vec<Rule> = rules.into_iter().filter(|r| !added.contains(r)).collect();
        if fresh.is_empty() {
            return Ok(names);
        }
        let own = {
            let current = self.inner.current.load().policy.clone();
            current.without_rules(|r| added.iter().any(|a| a.name == r.name))
        };
        let mut all = added.clone();
        all.extend(fresh.iter().cloned());
        let policy = own.with_rules_added(&all).map_err(|e| {
            Error::invalid_argument(format!("route limit {:?} on {route:?}: {}", limit.rate, e.message()))
        })?;
        self.put_in_force(policy)?;
        *added = all;
        Ok(names)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(derived_name(&["POST".into()], "/login"), "route.POST.login");
        assert_eq!(derived_name(&[], "/users/{id}"), "route.users.id");
        assert_eq!(derived_name(&["GET".into(), "POST".into()], "/"), "route.GET-POST");
        assert_eq!(derived_name(&[], "/a b/{x}.json"), "route.a_b.x__json");
        let long = fit(&"route.x".repeat(20), ".1m");
        assert!(long.len() <= MAX_NAME_LEN && long.ends_with(".1m"), "{long}");
        assert_ne!(fit(&"a".repeat(100), ""), fit(&"a".repeat(101), ""));
    }
}
