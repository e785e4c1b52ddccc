//! The request model: the attributes every HTTP integration (Flask,
//! FastAPI/Starlette, any ASGI or WSGI app, Django, Express, Fastify) gives a
//! check, made here once so that one policy behaves the same in every
//! framework.
//!
//! | attribute | what |
//! | --- | --- |
//! | `ip` | the client address ([`crate::ClientIpConfig`]: the peer, forwarded headers only through trusted proxies) |
//! | `method` | upper case; `HEAD` is `GET` (routers dispatch it to the `GET` handler) |
//! | `route` | the template of the route the framework dispatches the request to, in one syntax whatever the framework's (`/users/{id}`); absent when no route matches |
//! | `path` | the request's path: query removed, percent-decoded, `//` as `/`, dot segments resolved, and the router's case and trailing-slash rules applied |
//! | `host` | the `Host` header, lower case, without its port |
//! | *others* | the policy's `[attributes]` table: `api_key = "header:x-api-key"` |
//!
//! A front end reads the framework's raw parts (the matched route's template,
//! the raw path, the router's settings) and passes them in an [`HttpRequest`];
//! [`crate::Limiter::request_attributes`] does the rest.

use std::borrow::Cow;

/// The attributes every HTTP integration provides (beyond the policy's
/// `[attributes]` sources).
pub const REQUEST_MODEL: [&str; 5] = ["ip", "method", "route", "path", "host"];

/// How a framework's router compares paths, read from the framework's own
/// settings: Express's `case sensitive routing` (off by default: the router
/// ignores case) and `strict routing` (off: a trailing slash is ignored);
/// Fastify's `caseSensitive` and `ignoreTrailingSlash`. Flask, Starlette
/// and Django compare paths exactly (both `false`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RouterRules {
    /// The router matches paths in any case: `path` is lower-cased.
    pub case_insensitive: bool,
    /// The router matches a path with or without a trailing slash: `path`
    /// loses it.
    pub ignore_trailing_slash: bool,
}

/// One request's raw parts, as the framework has them.
#[derive(Debug, Clone, Copy, Default)]
pub struct HttpRequest<'a> {
    /// The client address, already resolved by [`crate::ClientIpConfig`];
    /// `None` when the peer has none (a Unix socket).
    pub ip: Option<&'a str>,
    /// The request method as received.
    pub method: &'a str,
    /// The template of the route the framework dispatches the request to,
    /// in the framework's own syntax and with any mount prefix (Flask
    /// `/users/<int:id>`, Starlette `/users/{id:int}`, Express `/users/:id`,
    /// Django `users/<int:pk>/`); `None` when no route matches.
    pub route: Option<&'a str>,
    /// The request target's path as received: it may carry a query,
    /// percent-encoding and repeated slashes.
    pub path: &'a str,
    /// The `Host` header, if any.
    pub host: Option<&'a str>,
    /// Header (name, value) pairs: those [`crate::Limiter::request_headers`]
    /// names (any case); others are ignored.
    pub headers: &'a [(&'a str, &'a str)],
    /// The router's comparison rules.
    pub router: RouterRules,
}

/// The method as routers dispatch it: upper case, and `HEAD` as `GET`.
pub fn normalize_method(method: &str) -> String {
    let m = method.trim().to_ascii_uppercase();
    if m == "HEAD" {
        "GET".to_string()
    } else {
        m
    }
}

/// The `Host` header without its port, in lower case, without a trailing dot.
pub fn normalize_host(host: &str) -> String {
    let h = host.trim();
    let without_port = if let Some(rest) = h.strip_prefix('[') {
        // [v6]:port
        match rest.find(']') {
            Some(end) => &h[..end + 2],
            None => h,
        }
    } else {
        match h.rfind(':') {
            Some(i) if h[i + 1..].bytes().all(|b| b.is_ascii_digit()) && h[..i].find(':').is_none() => &h[..i],
            _ => h,
        }
    };
    without_port.trim_end_matches('.').to_ascii_lowercase()
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn percent_decode(text: &str) -> Cow<'_, str> {
    if !text.contains('%') {
        return Cow::Borrowed(text);
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push(h * 16 + l);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

/// The path a policy sees: the query and fragment removed, percent-decoded,
/// repeated slashes as one, `.` and `..` segments resolved, always starting
/// with `/`; lower-cased and without a trailing slash when the router
/// ignores case and trailing slashes.
pub fn normalize_path(raw: &str, router: RouterRules) -> String {
    let end = raw.find(['?', '#']).unwrap_or(raw.len());
    let decoded = percent_decode(&raw[..end]);
    let trailing = decoded.ends_with('/') || decoded.ends_with("/.") || decoded.ends_with("/..");
    let mut segments: Vec<&str> = Vec::new();
    for seg in decoded.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut out = String::with_capacity(decoded.len() + 1);
    for s in &segments {
        out.push('/');
        out.push_str(s);
    }
    if out.is_empty() || (trailing && !router.ignore_trailing_slash) {
        out.push('/');
    }
    if router.case_insensitive {
        out.make_ascii_lowercase();
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// A route template in one syntax: every parameter as `{name}`, whatever
/// the framework wrote: Flask and Django `<int:id>` / `<id>`, Starlette
/// `{id:int}`, Express and Fastify `:id` (with a `(regex)` or a `?`, `*`,
/// `+` after it), Express 5's `*name`, Django's regular expressions
/// `^users/(?P<pk>[0-9]+)/$`. Express 5's optional groups `{/:id}` become
/// `[/{id}]`. Always starts with `/`; repeated slashes are one.
pub fn normalize_route(template: &str) -> String {
    let mut t = template.trim();
    let regex = t.starts_with('^');
    if regex {
        t = t.trim_start_matches('^').trim_end_matches('$');
    }
    let chars: Vec<char> = t.chars().collect();
    let mut out = String::with_capacity(t.len() + 1);
    out.push('/');
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '(' if regex && chars.get(i + 1) == Some(&'?') && chars.get(i + 2) == Some(&'P') && chars.get(i + 3) == Some(&'<') => {
                let start = i + 4;
                let mut j = start;
                while j < chars.len() && chars[j] != '>' {
                    j += 1;
                }
                let name: String = chars[start..j.min(chars.len())].iter().collect();
                i = skip_group(&chars, i);
                push_param(&mut out, &name);
                continue;
            }
            '<' => {
                let close = chars[i..].iter().position(|&c| c == '>').map(|p| i + p);
                if let Some(end) = close {
                    let inner: String = chars[i + 1..end].iter().collect();
                    let name = inner.rsplit(':').next().unwrap_or("").trim();
                    push_param(&mut out, name);
                    i = end + 1;
                    continue;
                }
            }
            '{' => {
                let close = chars[i..].iter().position(|&c| c == '}').map(|p| i + p);
                if let Some(end) = close {
                    let inner: String = chars[i + 1..end].iter().collect();
                    if inner.starts_with(|c: char| is_ident(c)) {
                        let name = inner.split(':').next().unwrap_or("").trim();
                        push_param(&mut out, name);
                    } else {
                        // Express 5's optional group: `{/:id}`.
                        let group = normalize_route(&inner);
                        out.push('[');
                        out.push_str(if inner.starts_with('/') { &group } else { &group[1..] });
                        out.push(']');
                    }
                    i = end + 1;
                    continue;
                }
            }
            ':' | '*' if chars.get(i + 1).is_some_and(|&c| is_ident(c)) && (i == 0 || !is_ident(chars[i - 1])) => {
                let start = i + 1;
                let mut j = start;
                while j < chars.len() && is_ident(chars[j]) {
                    j += 1;
                }
                let name: String = chars[start..j].iter().collect();
                if chars.get(j) == Some(&'(') {
                    j = skip_group(&chars, j);
                }
                if matches!(chars.get(j), Some('?' | '*' | '+')) {
                    j += 1;
                }
                push_param(&mut out, &name);
                i = j;
                continue;
            }
            _ => {}
        }
        if !(c == '/' && out.ends_with('/')) {
            out.push(c);
        }
        i += 1;
    }
    out
}

fn push_param(out: &mut String, name: &str) {
    out.push('{');
    out.push_str(name);
    out.push('}');
}

/// The index after the parenthesised group that starts at `open`.
fn skip_group(chars: &[char], open: usize) -> usize {
    let mut depth = 0usize;
    let mut j = open;
    while j < chars.len() {
        match chars[j] {
            '\\' => j += 1,
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return j + 1;
                }
            }
            _ => {}
        }
        j += 1;
    }
    chars.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_in_one_syntax() {
        for (given, want) in [
            ("/users/<int:id>", "/users/{id}"),
            ("/users/<id>", "/users/{id}"),
            ("/files/<path:rest>", "/files/{rest}"),
            ("users/<int:pk>/", "/users/{pk}/"),
            ("/users/{id:int}", "/users/{id}"),
            ("/users/{id}", "/users/{id}"),
            ("/users/:id", "/users/{id}"),
            ("/users/:id(\\d+)", "/users/{id}"),
            ("/users/:id?", "/users/{id}"),
            ("/a/:x-:y", "/a/{x}-{y}"),
            ("/files/*rest", "/files/{rest}"),
            ("/files/*", "/files/*"),
            ("/users{/:id}", "/users[/{id}]"),
            ("^users/(?P<pk>[0-9]+)/$", "/users/{pk}/"),
            ("//login", "/login"),
            ("", "/"),
            ("/api/users/:id", "/api/users/{id}"),
            ("/time/12:30", "/time/12:30"),
        ] {
            assert_eq!(normalize_route(given), want, "{given}");
        }
    }

    #[test]
    fn paths_as_routers_see_them() {
        let exact = RouterRules::default();
        let loose = RouterRules { case_insensitive: true, ignore_trailing_slash: true };
        for (given, strict, lenient) in [
            ("/login", "/login", "/login"),
            ("/LOGIN", "/LOGIN", "/login"),
            ("/Login/", "/Login/", "/login"),
            ("//login", "/login", "/login"),
            ("/%6Cogin", "/login", "/login"),
            ("/%6cogin?x=1", "/login", "/login"),
            ("/login?x=1", "/login", "/login"),
            ("/./login", "/login", "/login"),
            ("/x/../login", "/login", "/login"),
            ("/../../login", "/login", "/login"),
            ("/login#frag", "/login", "/login"),
            ("/files/a%20b", "/files/a b", "/files/a b"),
            ("/bad%zz%4", "/bad%zz%4", "/bad%zz%4"),
            ("/", "/", "/"),
            ("", "/", "/"),
            ("/a/b/.", "/a/b/", "/a/b"),
            ("/%E2%82%AC", "/\u{20ac}", "/\u{20ac}"),
            ("/%FF", "/\u{fffd}", "/\u{fffd}"),
        ] {
            assert_eq!(normalize_path(given, exact), strict, "{given}");
            assert_eq!(normalize_path(given, loose), lenient, "{given}");
        }
    }

    #[test]
    fn methods_and_hosts() {
        assert_eq!(normalize_method("post"), "POST");
        assert_eq!(normalize_method("HEAD"), "GET");
        assert_eq!(normalize_method("head"), "GET");
        assert_eq!(normalize_host("API.Example.COM:8080"), "api.example.com");
        assert_eq!(normalize_host("example.com."), "example.com");
        assert_eq!(normalize_host("[::1]:8080"), "[::1]");
        assert_eq!(normalize_host("[::1]"), "[::1]");
        assert_eq!(normalize_host("::1"), "::1");
    }
}
