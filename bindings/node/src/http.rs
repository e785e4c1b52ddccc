//! The core's HTTP request model for the Express middleware and the Fastify
//! plugin: the attributes of a request from the framework's raw parts
//! (`Limiter.requestAttributes`), the headers a policy reads, the rules no
//! integration can feed (`attributeWarnings`), route limits written in a
//! framework's idiom (`addRouteLimit`), and the rate-string grammar
//! (`parseRate`). Every normalisation is the core's (`throttlegate::http`).

use std::ptr;

use indexmap::IndexMap;
use napi::bindgen_prelude::FromNapiValue;
use napi::{sys, Env, JsValue, Unknown, ValueType};
use napi_derive::napi;
use throttlegate::Error;

use crate::convert;
use crate::errors::{guard, invalid_argument, Code};
use crate::Limiter;

/// The router's own comparison rules, read by an integration from the
/// framework's settings (Express: `case sensitive routing` off is
/// `caseInsensitive`, `strict routing` off is `ignoreTrailingSlash`;
/// Fastify: its `caseSensitive` and `ignoreTrailingSlash` router options).
#[napi(object)]
#[allow(dead_code)]
pub struct RouterRules {
    /// Paths that differ only in case reach the same route.
    pub case_insensitive: Option<bool>,
    /// `/login/` reaches the route `/login`.
    pub ignore_trailing_slash: Option<bool>,
}

/// An HTTP request's raw parts as the framework has them, for
/// `Limiter.requestAttributes` (declared for TypeScript; read property by
/// property, so errors name the part at fault).
#[napi(object)]
#[allow(dead_code)]
pub struct HttpRequest {
    /// The client address (a `ClientIp` result); null for a non-IP peer.
    #[napi(ts_type = "string | null")]
    pub ip: Option<String>,
    /// The method as received.
    pub method: String,
    /// The framework's template of the route it dispatches the request to,
    /// in its own syntax with any mount prefix (`/api/users/:id`); null when
    /// no route matches.
    #[napi(ts_type = "string | null")]
    pub route: Option<String>,
    /// The request target's path as received (it may carry the query,
    /// percent-encoding, `//`).
    pub path: String,
    /// The `Host` header as received.
    #[napi(ts_type = "string | null")]
    pub host: Option<String>,
    /// The request headers (`req.headers`; values a string or an array of strings).
    #[napi(ts_type = "Record<string, string | string[] | undefined>")]
    pub headers: Option<IndexMap<String, String>>,
    /// The router's comparison rules (default: case and trailing slash both matter).
    pub router: Option<RouterRules>,
}

/// A route limit written in a framework's idiom, for `Limiter.addRouteLimit`
/// (declared for TypeScript).
#[napi(object)]
#[allow(dead_code)]
pub struct RouteLimit {
    /// The rate: `"5/minute"`, `"100 per hour"`, `"10/30s"`, several joined by `;`.
    pub rate: String,
    /// The framework's route template, with any mount prefix (`/login`, `/users/:id`).
    pub route: String,
    /// The methods it limits (any when absent or empty; `HEAD` counts as `GET`).
    pub methods: Option<Vec<String>>,
    /// The key template (default `"{ip}"`).
    pub key: Option<String>,
    /// The rule's name (default derived from the route and methods).
    pub name: Option<String>,
}

/// One rate of a rate string: `limit` requests per `windowMs` milliseconds.
#[napi(object)]
pub struct Rate {
    /// Requests admitted per window.
    pub limit: i64,
    /// The window, in milliseconds.
    pub window_ms: f64,
}

/// Parse a rate string (`"5/minute"`, `"100 per hour"`, `"10/30s"`, several
/// joined by `;`) with the core's grammar, as route limits and a policy
/// rule's `rate` read it. Throws (`code` `invalid_argument`) naming what is
/// wrong.
#[napi(catch_unwind)]
pub fn parse_rate(text: String) -> napi::Result<Vec<Rate>, Code> {
    guard(|| {
        Ok(throttlegate::parse_rate(&text)?
            .into_iter()
            .map(|r| Rate { limit: r.limit as i64, window_ms: r.window.as_secs_f64() * 1000.0 })
            .collect())
    })
}

fn type_of(v: &Unknown<'_>) -> Result<ValueType, Error> {
    v.get_type().map_err(|_| crate::errors::internal("cannot read a JavaScript value's type"))
}

/// `v` must be an object (not null); `what` names it in the error.
fn expect_object(v: &Unknown<'_>, what: &str) -> Result<(), Error> {
    match type_of(v)? {
        ValueType::Object => Ok(()),
        ValueType::Null => Err(invalid_argument(format!("{what}: expected an object, got null"))),
        _ => Err(invalid_argument(format!("{what}: expected an object"))),
    }
}

/// Property `name` of the object `obj` (`undefined` when absent).
fn prop<'a>(env: &'a Env, obj: &Unknown<'_>, name: &str, what: &str) -> Result<Unknown<'a>, Error> {
    let key = std::ffi::CString::new(name).map_err(|_| invalid_argument(format!("{what}: a name has a NUL byte")))?;
    let mut out = ptr::null_mut();
    let status = unsafe { sys::napi_get_named_property(env.raw(), obj.raw(), key.as_ptr(), &mut out) };
    if status != sys::Status::napi_ok {
        return Err(invalid_argument(format!("{what}: cannot read {name}")));
    }
    Ok(unsafe { Unknown::from_raw_unchecked(env.raw(), out) })
}

fn opt_bool(env: &Env, v: &Unknown<'_>, what: &str) -> Result<bool, Error> {
    match type_of(v)? {
        ValueType::Undefined | ValueType::Null => Ok(false),
        ValueType::Boolean => unsafe { bool::from_napi_value(env.raw(), v.raw()) }
            .map_err(|e| invalid_argument(format!("{what}: {}", e.reason))),
        _ => Err(invalid_argument(format!("{what}: expected a boolean"))),
    }
}

/// An array of strings, or `None` for `undefined`/`null`.
fn opt_strings(env: &Env, v: &Unknown<'_>, what: &str) -> Result<Option<Vec<String>>, Error> {
    match type_of(v)? {
        ValueType::Undefined | ValueType::Null => return Ok(None),
        ValueType::Object => {}
        _ => return Err(invalid_argument(format!("{what}: expected an array of strings"))),
    }
    let mut is_array = false;
    unsafe { sys::napi_is_array(env.raw(), v.raw(), &mut is_array) };
    if !is_array {
        return Err(invalid_argument(format!("{what}: expected an array of strings")));
    }
    let mut len = 0u32;
    unsafe { sys::napi_get_array_length(env.raw(), v.raw(), &mut len) };
    let mut out = Vec::with_capacity(len as usize);
    for i in 0..len {
        let mut item = ptr::null_mut();
        if unsafe { sys::napi_get_element(env.raw(), v.raw(), i, &mut item) } != sys::Status::napi_ok {
            return Err(invalid_argument(format!("{what}[{i}]: cannot read it")));
        }
        let item = unsafe { Unknown::from_raw_unchecked(env.raw(), item) };
        out.push(convert::string(env, &item, &format!("{what}[{i}]"))?);
    }
    Ok(Some(out))
}

/// What `_requestModel` reads from `flags`: the router ignores case.
const CASE_INSENSITIVE: u32 = 1;
/// What `_requestModel` reads from `flags`: the router ignores a trailing slash.
const IGNORE_TRAILING_SLASH: u32 = 2;

/// The headers the policy's `[attributes]` reads, taken from the object
/// `headers` (`what` names it in errors); absent ones are left out.
fn policy_headers(env: &Env, limiter: &throttlegate::Limiter, headers: &Unknown<'_>, what: &str) -> Result<Vec<(String, String)>, Error> {
    let mut out = Vec::new();
    for name in limiter.request_headers() {
        let value = prop(env, headers, &name, what)?;
        let label = format!("{what}[{name:?}]");
        if let Some(value) = convert::header(env, Some(&value), &label)? {
            out.push((name, value));
        }
    }
    Ok(out)
}

#[napi]
impl Limiter {
    /// The attributes of an HTTP request per the core's request model: `ip`
    /// (as given), `method` (upper case, `HEAD` as `GET`), `route` (the
    /// framework's template of the route it dispatches to, normalised to
    /// `/users/{id}`; absent when `route` is null), `path` (query removed,
    /// percent-decoded, `//` and dot segments resolved, the router's case and
    /// trailing-slash rules applied), `host` (lower case, no port), then each
    /// attribute the policy's `[attributes]` table reads from a header of
    /// `headers` (a Node `req.headers` object; only the names
    /// `requestHeaders()` lists are read). Pass the result to `check`.
    #[napi(ts_args_type = "request: HttpRequest", ts_return_type = "Record<string, string>")]
    pub fn request_attributes(&self, env: &Env, request: Unknown<'_>) -> napi::Result<IndexMap<String, String>, Code> {
        guard(|| {
            let what = "request";
            expect_object(&request, what)?;
            let ip = convert::opt_string(env, &prop(env, &request, "ip", what)?, "request.ip")?;
            let method = convert::string(env, &prop(env, &request, "method", what)?, "request.method")?;
            let route = convert::opt_string(env, &prop(env, &request, "route", what)?, "request.route")?;
            let path = convert::string(env, &prop(env, &request, "path", what)?, "request.path")?;
            let host = convert::opt_string(env, &prop(env, &request, "host", what)?, "request.host")?;
            let mut router = throttlegate::RouterRules::default();
            let rules = prop(env, &request, "router", what)?;
            if !matches!(type_of(&rules)?, ValueType::Undefined | ValueType::Null) {
                expect_object(&rules, "request.router")?;
                router.case_insensitive = opt_bool(
                    env,
                    &prop(env, &rules, "caseInsensitive", "request.router")?,
                    "request.router.caseInsensitive",
                )?;
                router.ignore_trailing_slash = opt_bool(
                    env,
                    &prop(env, &rules, "ignoreTrailingSlash", "request.router")?,
                    "request.router.ignoreTrailingSlash",
                )?;
            }
            let mut headers: Vec<(String, String)> = Vec::new();
            let given = prop(env, &request, "headers", what)?;
            if !matches!(type_of(&given)?, ValueType::Undefined | ValueType::Null) {
                expect_object(&given, "request.headers")?;
                headers = policy_headers(env, &self.inner, &given, "request.headers")?;
            }
            let pairs: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
            let req = throttlegate::HttpRequest {
                ip: ip.as_deref(),
                method: &method,
                route: route.as_deref(),
                path: &path,
                host: host.as_deref(),
                headers: &pairs,
                router,
            };
            Ok(self.inner.request_attributes(&req).into_iter().collect())
        })
    }

    /// The lower-case names of the request headers the policy's
    /// `[attributes]` table reads (`attributes.api_key = "header:x-api-key"`).
    #[napi(catch_unwind)]
    pub fn request_headers(&self) -> Vec<String> {
        self.inner.request_headers()
    }

    /// One message per rule that needs an attribute neither in `provided`
    /// nor in the policy's `[attributes]` table, so the rule never applies.
    /// `provided` defaults to the request model the HTTP integrations give
    /// (`ip`, `method`, `route`, `path`, `host`).
    #[napi(ts_args_type = "provided?: string[]")]
    pub fn attribute_warnings(&self, env: &Env, provided: Option<Unknown<'_>>) -> napi::Result<Vec<String>, Code> {
        guard(|| {
            let given = match provided {
                Some(v) => opt_strings(env, &v, "provided")?,
                None => None,
            };
            Ok(match given {
                Some(names) => {
                    let names: Vec<&str> = names.iter().map(String::as_str).collect();
                    self.inner.attribute_warnings(&names)
                }
                None => self.inner.attribute_warnings(&throttlegate::REQUEST_MODEL),
            })
        })
    }

    /// Add a route limit written in a framework's idiom to the policy in
    /// force (kept across `reload`), so it is checked in the same single
    /// round trip as the policy's rules: `rate` (`"5/minute"`, see
    /// `parseRate`) on requests whose `route` is `route` (the framework's
    /// template, normalised) and whose method is one of `methods` (any when
    /// absent or empty), keyed on `key` (a key template, default `"{ip}"`),
    /// named `name` (default derived from the route). Returns the names of
    /// the rules added; adding the same limit again returns the same names.
    /// Throws (`code` `invalid_argument`) naming what is wrong.
    #[napi(ts_args_type = "limit: RouteLimit")]
    pub fn add_route_limit(&self, env: &Env, limit: Unknown<'_>) -> napi::Result<Vec<String>, Code> {
        guard(|| {
            let what = "limit";
            expect_object(&limit, what)?;
            let rate = convert::string(env, &prop(env, &limit, "rate", what)?, "limit.rate")?;
            let route = convert::string(env, &prop(env, &limit, "route", what)?, "limit.route")?;
            let methods = opt_strings(env, &prop(env, &limit, "methods", what)?, "limit.methods")?.unwrap_or_default();
            let key = convert::opt_string(env, &prop(env, &limit, "key", what)?, "limit.key")?;
            let name = convert::opt_string(env, &prop(env, &limit, "name", what)?, "limit.name")?;
            self.names.reloaded();
            self.inner.add_route_limit(&throttlegate::RouteLimit { rate, route, methods, key, name })
        })
    }

    /// `requestAttributes` for the Express middleware and the Fastify
    /// plugin, per request: the raw parts as arguments (the router's rules
    /// as `flags`), the attributes as a flat array of names and values (a
    /// JavaScript object made here costs more than one made from it).
    #[napi(js_name = "_requestModel", skip_typescript, enumerable = false)]
    #[allow(clippy::too_many_arguments)]
    pub fn request_model(
        &self,
        env: &Env,
        ip: Option<String>,
        method: String,
        route: Option<String>,
        path: String,
        host: Option<String>,
        headers: Option<Unknown<'_>>,
        flags: u32,
    ) -> napi::Result<Vec<String>, Code> {
        guard(|| {
            let mut given: Vec<(String, String)> = Vec::new();
            if let Some(h) = headers.as_ref() {
                if matches!(type_of(h)?, ValueType::Object) {
                    given = policy_headers(env, &self.inner, h, "headers")?;
                }
            }
            let pairs: Vec<(&str, &str)> = given.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
            let req = throttlegate::HttpRequest {
                ip: ip.as_deref(),
                method: &method,
                route: route.as_deref(),
                path: &path,
                host: host.as_deref(),
                headers: &pairs,
                router: throttlegate::RouterRules {
                    case_insensitive: flags & CASE_INSENSITIVE != 0,
                    ignore_trailing_slash: flags & IGNORE_TRAILING_SLASH != 0,
                },
            };
            let attrs = self.inner.request_attributes(&req);
            let mut flat = Vec::with_capacity(attrs.len() * 2);
            for (name, value) in attrs {
                flat.push(name);
                flat.push(value);
            }
            Ok(flat)
        })
    }
}
