//! The HTTP API: `POST /json` (envoyproxy/ratelimit's, proto3 JSON in and
//! out), `POST /v1/check` (native attributes), `POST /v1/release` and
//! `POST /v1/extend` (a concurrency limit's lease), `GET /healthcheck`,
//! `GET /metrics`, `GET /rules`.

// Early answers are axum's own `Response`, returned as the error of the helpers that parse a body.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State as AxState};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use throttlegate::{extend_duration, CheckOptions, DurationUnit, OptionValue};

use crate::rls::{code, unit, DescriptorStatus, Entry, RateLimitDescriptor, RateLimitRequest, RateLimitResponse};
use crate::service::CheckError;
use crate::Server;

/// The largest request body accepted, in bytes.
pub const MAX_BODY: usize = 1024 * 1024;

/// The HTTP routes over a server.
pub fn router(server: Arc<Server>) -> Router {
    Router::new()
        .route("/json", post(json_check))
        .route("/v1/check", post(native_check))
        .route("/v1/release", post(release))
        .route("/v1/extend", post(extend))
        .route("/healthcheck", get(healthcheck))
        .route("/metrics", get(metrics))
        .route("/rules", get(rules))
        .fallback(|| async { problem(StatusCode::NOT_FOUND, "no such endpoint (see /json, /v1/check, /v1/release, /v1/extend, /healthcheck, /metrics, /rules)") })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(server)
}

/// An `application/problem+json` answer.
pub fn problem(status: StatusCode, detail: &str) -> Response {
    let body = json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or(""),
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut r = (status, body.to_string()).into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
    r
}

fn error_response(e: CheckError) -> Response {
    match e {
        CheckError::BadRequest(m) => problem(StatusCode::BAD_REQUEST, &m),
        CheckError::Unavailable(m) => problem(StatusCode::SERVICE_UNAVAILABLE, &m),
        CheckError::Internal(m) => problem(StatusCode::INTERNAL_SERVER_ERROR, &m),
    }
}

/// The body, or the answer to a body that could not be read: over [`MAX_BODY`]
/// is a 413 naming the limit, anything else a 400.
fn read_body(body: Result<Bytes, BytesRejection>) -> Result<Bytes, Response> {
    body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            problem(StatusCode::PAYLOAD_TOO_LARGE, &format!("body: larger than {MAX_BODY} bytes"))
        } else {
            problem(StatusCode::BAD_REQUEST, &format!("body: {}", e.body_text()))
        }
    })
}

fn json_body<T: for<'de> Deserialize<'de>>(body: &Bytes) -> Result<T, Response> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let at = if path == "." { "body".to_string() } else { format!("body: {path}") };
        problem(StatusCode::BAD_REQUEST, &format!("{at}: {}", e.into_inner()))
    })
}

/// A uint64 of proto3 JSON: a number or a decimal string.
#[derive(Deserialize)]
#[serde(untagged)]
enum JsonU64 {
    Number(u64),
    Text(String),
}

impl JsonU64 {
    fn get(&self, field: &str) -> Result<u64, Response> {
        match self {
            JsonU64::Number(n) => Ok(*n),
            JsonU64::Text(t) => t
                .parse()
                .map_err(|_| problem(StatusCode::BAD_REQUEST, &format!("{field}: expected an unsigned integer, got \"{t}\""))),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRequest {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, alias = "hitsAddend")]
    hits_addend: Option<JsonU64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
    #[serde(default, alias = "hitsAddend")]
    hits_addend: Option<JsonU64>,
    #[serde(default)]
    limit: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
}

fn to_request(j: JsonRequest) -> Result<RateLimitRequest, Response> {
    let hits = match &j.hits_addend {
        Some(h) => {
            let n = h.get("hitsAddend")?;
            u32::try_from(n).map_err(|_| problem(StatusCode::BAD_REQUEST, "hitsAddend: larger than 4294967295"))?
        }
        None => 0,
    };
    let mut descriptors = Vec::with_capacity(j.descriptors.len());
    for (i, d) in j.descriptors.into_iter().enumerate() {
        let hits_addend = match &d.hits_addend {
            Some(h) => Some(h.get(&format!("descriptors[{i}].hitsAddend"))?),
            None => None,
        };
        if d.limit.is_some() {
            return Err(problem(
                StatusCode::BAD_REQUEST,
                &format!("descriptors[{i}].limit: a limit sent with the request is not supported; set it in the rules"),
            ));
        }
        descriptors.push(RateLimitDescriptor {
            entries: d.entries.into_iter().map(|e| Entry { key: e.key, value: e.value }).collect(),
            limit: None,
            hits_addend,
        });
    }
    Ok(RateLimitRequest { domain: j.domain, descriptors, hits_addend: hits })
}

/// A `RateLimitResponse` in proto3 JSON (default values left out, as protojson does).
pub fn response_json(r: &RateLimitResponse) -> Value {
    let mut out = Map::new();
    out.insert("overallCode".into(), json!(code::name(r.overall_code)));
    if !r.statuses.is_empty() {
        out.insert("statuses".into(), Value::Array(r.statuses.iter().map(status_json).collect()));
    }
    if !r.response_headers_to_add.is_empty() {
        let h: Vec<Value> = r.response_headers_to_add.iter().map(|h| json!({"key": h.key, "value": h.value})).collect();
        out.insert("responseHeadersToAdd".into(), Value::Array(h));
    }
    Value::Object(out)
}

fn status_json(s: &DescriptorStatus) -> Value {
    let mut out = Map::new();
    out.insert("code".into(), json!(code::name(s.code)));
    if let Some(l) = &s.current_limit {
        let mut limit = Map::new();
        if !l.name.is_empty() {
            limit.insert("name".into(), json!(l.name));
        }
        if l.requests_per_unit != 0 {
            limit.insert("requestsPerUnit".into(), json!(l.requests_per_unit));
        }
        limit.insert("unit".into(), json!(unit::name(l.unit)));
        out.insert("currentLimit".into(), Value::Object(limit));
    }
    if s.limit_remaining != 0 {
        out.insert("limitRemaining".into(), json!(s.limit_remaining));
    }
    if let Some(d) = &s.duration_until_reset {
        out.insert("durationUntilReset".into(), json!(format!("{}s", d.seconds)));
    }
    Value::Object(out)
}

async fn json_check(AxState(server): AxState<Arc<Server>>, body: Result<Bytes, BytesRejection>) -> Response {
    let req = match read_body(body).and_then(|b| json_body::<JsonRequest>(&b)).and_then(to_request) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    match server.state.should_rate_limit(&req).await {
        Ok(resp) => {
            let status = if resp.overall_code == code::OVER_LIMIT { StatusCode::TOO_MANY_REQUESTS } else { StatusCode::OK };
            let mut r = (status, axum::Json(response_json(&resp))).into_response();
            for h in &resp.response_headers_to_add {
                if let (Ok(name), Ok(value)) = (header::HeaderName::try_from(h.key.as_str()), HeaderValue::from_str(&h.value)) {
                    r.headers_mut().append(name, value);
                }
            }
            r
        }
        Err(e) => error_response(e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NativeRequest {
    attributes: HashMap<String, String>,
    #[serde(default)]
    cost: Option<u64>,
    #[serde(default)]
    call_id: Option<String>,
    #[serde(default)]
    peek: bool,
}

async fn native_check(AxState(server): AxState<Arc<Server>>, body: Result<Bytes, BytesRejection>) -> Response {
    let req: NativeRequest = match read_body(body).and_then(|b| json_body(&b)) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let limiter = &server.state.limiter;
    let cost = req.cost.unwrap_or(1);
    let result = if req.peek {
        limiter.peek(&req.attributes, cost).await
    } else {
        limiter.check_with(&req.attributes, &CheckOptions { cost, call_id: req.call_id }).await
    };
    let d = match result.map_err(CheckError::from) {
        Ok(d) => d,
        Err(e) => return error_response(e),
    };
    let options = limiter.header_options();
    let mut r = if d.allowed {
        let mut body = d.to_json(options);
        // The slots of a concurrency limit are held under this id until
        // POST /v1/release (or the lease's end).
        if let (Some(id), Some(o)) = (d.lease_id(), body.as_object_mut()) {
            o.insert("lease_id".into(), json!(id));
        }
        (StatusCode::OK, axum::Json(body)).into_response()
    } else {
        let body = d.problem_json().unwrap_or_else(|| d.to_json(options).to_string());
        let mut r = (StatusCode::TOO_MANY_REQUESTS, body).into_response();
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        r
    };
    for (k, v) in d.headers_with(options) {
        if let Ok(value) = HeaderValue::from_str(&v) {
            r.headers_mut().append(k, value);
        }
    }
    r
}

/// A lease of `POST /v1/check`: the check's attributes and the `lease_id`
/// its answer gave (its `call_id` when it had one).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LeaseRequest {
    attributes: HashMap<String, String>,
    lease_id: String,
    /// `/v1/extend` only: seconds, or text such as `"30s"`.
    #[serde(default)]
    duration: Option<Value>,
}

/// `POST /v1/release`: give back the slots a check holds, at once.
/// Answers `{"released": n}`, the number of concurrency rules whose slots
/// this freed (0 when none was held: released already, or the lease ended).
async fn release(AxState(server): AxState<Arc<Server>>, body: Result<Bytes, BytesRejection>) -> Response {
    let req: LeaseRequest = match read_body(body).and_then(|b| json_body(&b)) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    if req.duration.is_some() {
        return problem(StatusCode::BAD_REQUEST, "body: duration: a release takes none (see /v1/extend)");
    }
    match server.state.limiter.release_call(&req.attributes, &req.lease_id).await.map_err(CheckError::from) {
        Ok(n) => axum::Json(json!({ "released": n })).into_response(),
        Err(e) => error_response(e),
    }
}

/// `POST /v1/extend`: the slots a check holds now end `duration` from now.
/// Answers `{"extended": n}` (0 when none was held: a lease that ended or
/// was released is never brought back).
async fn extend(AxState(server): AxState<Arc<Server>>, body: Result<Bytes, BytesRejection>) -> Response {
    let req: LeaseRequest = match read_body(body).and_then(|b| json_body(&b)) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let value = match req.duration {
        None => return problem(StatusCode::BAD_REQUEST, "body: duration: missing (seconds, or text such as \"30s\")"),
        Some(Value::Number(n)) => OptionValue::Number(n.as_f64().unwrap_or(f64::NAN)),
        Some(Value::String(t)) => OptionValue::Text(t),
        Some(_) => return problem(StatusCode::BAD_REQUEST, "body: duration: expected seconds or text such as \"30s\""),
    };
    let answer = match extend_duration(value, DurationUnit::Seconds) {
        Ok(d) => server.state.limiter.extend_call(&req.attributes, &req.lease_id, d).await,
        Err(e) => Err(e),
    };
    match answer.map_err(CheckError::from) {
        Ok(n) => axum::Json(json!({ "extended": n })).into_response(),
        Err(e) => error_response(e),
    }
}

async fn healthcheck(AxState(server): AxState<Arc<Server>>) -> Response {
    if server.stopping() {
        return problem(StatusCode::SERVICE_UNAVAILABLE, "shutting down");
    }
    match server.state.limiter.ping().await {
        Ok(()) => (StatusCode::OK, "OK").into_response(),
        Err(e) => problem(StatusCode::SERVICE_UNAVAILABLE, &format!("backend: {e}")),
    }
}

async fn metrics(AxState(server): AxState<Arc<Server>>) -> Response {
    let core = server.state.limiter.metrics_text().unwrap_or_default();
    let mut text = core.strip_suffix("# EOF\n").unwrap_or(&core).to_string();
    text.push_str(&server.metrics_text());
    text.push_str("# EOF\n");
    let mut r = (StatusCode::OK, text).into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(throttlegate::METRICS_CONTENT_TYPE));
    r
}

async fn rules(AxState(server): AxState<Arc<Server>>) -> Response {
    let rules = server.state.rules();
    let mut domains: Vec<&String> = rules.domains.keys().collect();
    domains.sort();
    let body = json!({
        "format": match rules.format { crate::rules::Format::Native => "native", crate::rules::Format::Envoy => "envoy" },
        "files": rules.files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>(),
        "domains": domains,
        "policy": rules.policy.to_value(),
    });
    axum::Json(body).into_response()
}
