//! The bad-input conformance vectors (`tests/vectors/errors/*.json`):
//! malformed policy texts, bad limiter options and bad call arguments, each
//! with the error kind and the exact message the core gives. Policy texts go
//! through `Policy::from_str_any`; options and calls run against the
//! embedded backend (async and in process) and a real redis-server. Every
//! mismatch is reported with its file, case and step.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use throttlegate::{CheckOptions, ErrorKind, FailureMode, Limiter, Policy};
use throttlegate_testkit::RedisServer;

fn errors_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/vectors/errors")
}

/// One case of a file, with where it came from.
struct Case {
    at: String,
    doc: Value,
}

fn load_cases() -> Vec<Case> {
    let dir = errors_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.expect("readable directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    let mut cases = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).expect("readable vector file");
        let doc: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{}: not valid JSON: {e}", path.display()));
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        for case in doc["cases"]
            .as_array()
            .unwrap_or_else(|| panic!("{file}: no `cases` array"))
        {
            let name = case["name"].as_str().unwrap_or("?");
            cases.push(Case {
                at: format!("{file} {name}"),
                doc: case.clone(),
            });
        }
    }
    cases
}

/// Compare an outcome with the `expect_error` and `message` of `want`.
fn expect_error<T>(
    at: &str,
    want: &Value,
    got: throttlegate::Result<T>,
    problems: &mut Vec<String>,
) {
    let kind = want["expect_error"].as_str().expect("expect_error");
    let message = want["message"].as_str().expect("message");
    match got {
        Ok(_) => problems.push(format!("{at}: expected {kind} {message:?}, got success")),
        Err(e) => {
            let (got_kind, got_message) = (e.kind().as_str(), e.to_string());
            if got_kind != kind || got_message != message {
                problems.push(format!(
                    "{at}: expected {kind} {message:?}, got {got_kind} {got_message:?}"
                ));
            }
        }
    }
}

/// How a replay reaches the backend (as in `vectors.rs`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    Async,
    InProcess,
}

fn attributes(step: &Value) -> Vec<(String, String)> {
    step["attributes"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().expect("string values").to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// A limiter for the case's policy and options on `url` (`None`: embedded),
/// with a fresh prefix unless the case sets one.
fn build(case: &Value, url: Option<&str>, n: usize) -> throttlegate::Result<Limiter> {
    let policy = Policy::from_value(&case["policy"]).expect("the case's policy is valid");
    let mut builder = Limiter::builder(policy)
        .prefix(format!("tge{}-{n}:", std::process::id()))
        .timeout(Duration::from_secs(10))
        .on_backend_error(FailureMode::Error);
    if let Some(url) = url {
        builder = builder.url(url);
    }
    if let Some(options) = case.get("options") {
        for (name, value) in options.as_object().expect("options is an object") {
            let value = value.as_str().expect("option values are strings");
            builder = match name.as_str() {
                "url" => builder.url(value),
                "prefix" => builder.prefix(value),
                other => panic!("unknown option {other:?}"),
            };
        }
    }
    builder.build()
}

fn run_steps(
    rt: &tokio::runtime::Runtime,
    at: &str,
    case: &Value,
    limiter: &Limiter,
    route: Route,
    problems: &mut Vec<String>,
) {
    for (i, step) in case["steps"].as_array().expect("steps").iter().enumerate() {
        let at = format!("{at} step {i}");
        let attrs = attributes(step);
        let cost = step["cost"].as_u64().unwrap_or(1);
        let options = CheckOptions {
            cost,
            call_id: step["call_id"].as_str().map(str::to_string),
        };
        let in_process = route == Route::InProcess;
        let got = match step["op"].as_str().unwrap_or("check") {
            "close" => {
                limiter.close();
                continue;
            }
            "check" if in_process => limiter
                .check_in_process(&attrs, &options)
                .expect("the embedded backend answers in process")
                .map(drop),
            "peek" if in_process => limiter
                .peek_in_process(&attrs, cost)
                .expect("the embedded backend answers in process")
                .map(drop),
            "check" => rt.block_on(limiter.check_with(&attrs, &options)).map(drop),
            "peek" => rt.block_on(limiter.peek(&attrs, cost)).map(drop),
            "reset" => rt.block_on(limiter.reset(&attrs)).map(drop),
            "reload" => Policy::from_value(&step["policy"]).and_then(|p| limiter.reload(p)).map(drop),
            "override_set" => rt
                .block_on(limiter.set_override(
                    step["rule"].as_str().unwrap_or(""),
                    &attrs,
                    step["limit"].as_u64().unwrap_or(0),
                ))
                .map(drop),
            "override_clear" => rt
                .block_on(limiter.clear_override(step["rule"].as_str().unwrap_or(""), &attrs))
                .map(drop),
            "overrides" => rt.block_on(limiter.overrides(step["rule"].as_str().unwrap_or(""))).map(drop),
            "settle" => {
                let (id, actual) = (step["call_id"].as_str().unwrap(), step["actual_cost"].as_u64().unwrap());
                if in_process {
                    limiter.settle_call_blocking(&attrs, id, cost, actual).map(drop)
                } else {
                    rt.block_on(limiter.settle_call(&attrs, id, cost, actual)).map(drop)
                }
            }
            "release" => {
                let id = step["call_id"].as_str().unwrap();
                if in_process {
                    limiter.release_call_blocking(&attrs, id).map(drop)
                } else {
                    rt.block_on(limiter.release_call(&attrs, id)).map(drop)
                }
            }
            "extend" => {
                let id = step["call_id"].as_str().unwrap();
                let d = std::time::Duration::from_millis(step["duration_ms"].as_u64().unwrap());
                if in_process {
                    limiter.extend_call_blocking(&attrs, id, d).map(drop)
                } else {
                    rt.block_on(limiter.extend_call(&attrs, id, d)).map(drop)
                }
            }
            "acquire" => {
                let timeout = std::time::Duration::from_millis(step["timeout_ms"].as_u64().unwrap());
                rt.block_on(limiter.acquire(&attrs, cost, timeout)).map(drop)
            }
            other => panic!("{at}: unknown op {other:?}"),
        };
        expect_error(&at, step, got, problems);
    }
}

/// Every option and call case on one backend; every mismatch, one line each.
fn replay_all(url: Option<&str>, route: Route) -> (usize, Vec<String>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let backend = match (url, route) {
        (Some(_), _) => "redis",
        (None, Route::Async) => "memory",
        (None, Route::InProcess) => "memory, in process",
    };
    let mut problems = Vec::new();
    let mut checked = 0;
    for (n, case) in load_cases().iter().enumerate() {
        let at = format!("{} [{backend}]", case.at);
        if case.doc.get("options").is_some() {
            checked += 1;
            expect_error(&at, &case.doc, build(&case.doc, url, n), &mut problems);
        } else if case.doc.get("steps").is_some() {
            checked += 1;
            let limiter = build(&case.doc, url, n).expect("limiter builds");
            run_steps(&rt, &at, &case.doc, &limiter, route, &mut problems);
            limiter.close();
        }
    }
    (checked, problems)
}

fn assert_clean(what: &str, (cases, problems): (usize, Vec<String>)) {
    assert!(
        cases > 0,
        "no error cases found in {}",
        errors_dir().display()
    );
    assert!(
        problems.is_empty(),
        "{} mismatch(es) {what} over {cases} cases:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn every_policy_text_gets_its_error() {
    let mut problems = Vec::new();
    let mut cases = 0;
    for case in load_cases() {
        if let Some(text) = case.doc.get("policy_text") {
            cases += 1;
            let text = text.as_str().expect("policy_text is a string");
            expect_error(
                &case.at,
                &case.doc,
                Policy::from_str_any(text),
                &mut problems,
            );
        }
    }
    assert_clean("in the policy texts", (cases, problems));
}

#[test]
fn every_option_and_call_error_on_the_memory_backend() {
    assert_clean("on the memory backend", replay_all(None, Route::Async));
}

#[test]
fn every_option_and_call_error_on_the_memory_backend_in_process() {
    assert_clean(
        "on the memory backend (in process)",
        replay_all(None, Route::InProcess),
    );
}

#[test]
fn every_option_and_call_error_on_redis() {
    let server = RedisServer::start();
    assert_clean("on redis", replay_all(Some(&server.url()), Route::Async));
}

#[test]
fn the_error_suite_is_large_and_well_formed() {
    let cases = load_cases();
    let kinds: Vec<&str> = ErrorKind::ALL.iter().map(|k| k.as_str()).collect();
    let mut names = std::collections::BTreeSet::new();
    let mut expectations = 0;
    for case in &cases {
        let doc = &case.doc;
        let name = doc["name"].as_str().expect("every case has a name");
        assert!(
            names.insert(name.to_string()),
            "{}: the name is used twice",
            case.at
        );
        let shapes = ["policy_text", "options", "steps"]
            .iter()
            .filter(|k| doc.get(**k).is_some())
            .count();
        assert_eq!(
            shapes, 1,
            "{}: exactly one of policy_text, options, steps",
            case.at
        );
        let mut wants = Vec::new();
        if let Some(steps) = doc.get("steps") {
            assert!(
                doc["policy"].is_object(),
                "{}: steps need a policy",
                case.at
            );
            for step in steps.as_array().expect("steps is an array") {
                if step["op"] == "close" {
                    assert!(
                        step.get("expect_error").is_none(),
                        "{}: close expects nothing",
                        case.at
                    );
                } else {
                    wants.push(step);
                }
            }
        } else {
            if doc.get("options").is_some() {
                assert!(
                    doc["policy"].is_object(),
                    "{}: options need a policy",
                    case.at
                );
            }
            wants.push(doc);
        }
        assert!(!wants.is_empty(), "{}: expects no error", case.at);
        for want in wants {
            let kind = want["expect_error"].as_str().unwrap_or("");
            assert!(kinds.contains(&kind), "{}: unknown kind {kind:?}", case.at);
            let message = want["message"].as_str().unwrap_or("");
            assert!(!message.is_empty(), "{}: no message", case.at);
            expectations += 1;
        }
    }
    assert!(cases.len() >= 30, "only {} error cases", cases.len());
    assert!(expectations >= 30, "only {expectations} expected errors");
}
