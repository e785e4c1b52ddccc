//! The conformance vectors (`tests/vectors/*.json`) replayed against the
//! embedded backend and a real redis-server, each on a manual clock. Every
//! step's decision, per-rule results and headers must equal the expected
//! values, which `tests/vectors/generate.py` derives from the contract; every
//! mismatch is reported with its file and step.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use throttlegate::{
    CheckOptions, Clock, Decision, FailureMode, HeaderOptions, Limiter, ManualClock, Policy,
};
use throttlegate_testkit::{RedisCluster, RedisServer};

fn vectors_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/vectors")
}

/// Where the replaying tests read vectors: the suite, or for exploratory runs
/// the directory in `THROTTLEGATE_VECTORS` (e.g. random cases from
/// `generate.py --random`).
fn replay_dir() -> PathBuf {
    std::env::var_os("THROTTLEGATE_VECTORS").map_or_else(vectors_dir, PathBuf::from)
}

struct Vector {
    file: String,
    doc: Value,
}

fn load_vectors(dir: &Path) -> Vec<Vector> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.expect("readable directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("readable vector file");
            let doc: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{}: not valid JSON: {e}", path.display()));
            Vector {
                file: path.file_name().unwrap().to_string_lossy().into_owned(),
                doc,
            }
        })
        .collect()
}

/// The decision in the vector format, so the comparison is one JSON equality
/// per field.
fn decision_json(d: &Decision) -> Value {
    d.to_json(HeaderOptions::default())
}

fn attributes(step: &Value) -> Vec<(String, String)> {
    step["attributes"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v.as_str()
                            .expect("attribute values are strings")
                            .to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The `rule` of an override step.
fn rule_of(step: &Value) -> &str {
    step["rule"].as_str().expect("override steps name a rule")
}

/// How a replay reaches the backend.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    /// The async methods (`check_with`, `peek`, `reset`).
    Async,
    /// The synchronous in-process answers the front ends use for the
    /// embedded backend (`check_in_process`, `peek_in_process`).
    InProcess,
}

fn in_process(answer: Option<throttlegate::Result<Decision>>) -> throttlegate::Result<Decision> {
    answer.expect("the embedded backend answers in process")
}

/// What one step produced: `{"expect": ...}` or `{"expect_error": kind}`.
fn run_step(rt: &tokio::runtime::Runtime, limiter: &Limiter, step: &Value, route: Route) -> Value {
    let attrs = attributes(step);
    let op = step["op"].as_str().unwrap_or("check");
    let cost = step["cost"].as_u64().unwrap_or(1);
    let options = CheckOptions {
        cost,
        call_id: step["call_id"].as_str().map(str::to_string),
    };
    let outcome = match (op, route) {
        ("peek", Route::InProcess) => {
            in_process(limiter.peek_in_process(&attrs, cost)).map(|d| decision_json(&d))
        }
        ("check", Route::InProcess) => {
            in_process(limiter.check_in_process(&attrs, &options)).map(|d| decision_json(&d))
        }
        _ => match op {
            "reload" => Policy::from_value(&step["policy"]).and_then(|p| limiter.reload(p)).map(|_| json!({})),
            "reset" => rt
                .block_on(limiter.reset(&attrs))
                .map(|n| json!({ "deleted": n })),
            "override_set" => rt
                .block_on(limiter.set_override(rule_of(step), &attrs, step["limit"].as_u64().expect("limit")))
                .map(|()| json!({})),
            "override_clear" => rt
                .block_on(limiter.clear_override(rule_of(step), &attrs))
                .map(|had| json!({ "cleared": had })),
            "overrides" => rt.block_on(limiter.overrides(rule_of(step))).map(|list| {
                let list: Vec<Value> =
                    list.iter().map(|o| json!({ "attributes": o.attributes, "limit": o.limit })).collect();
                json!({ "overrides": list })
            }),
            "peek" => rt.block_on(limiter.peek(&attrs, cost)).map(|d| {
                assert!(!d.degraded, "a degraded decision means the backend failed");
                decision_json(&d)
            }),
            "check" => rt.block_on(limiter.check_with(&attrs, &options)).map(|d| {
                assert!(!d.degraded, "a degraded decision means the backend failed");
                decision_json(&d)
            }),
            "settle" => {
                let (id, actual) = (step["call_id"].as_str().unwrap(), step["actual_cost"].as_u64().unwrap());
                let settled = match route {
                    Route::InProcess => limiter.settle_call_blocking(&attrs, id, cost, actual),
                    Route::Async => rt.block_on(limiter.settle_call(&attrs, id, cost, actual)),
                };
                settled.map(|n| json!({ "settled": n }))
            }
            "release" => {
                let id = step["call_id"].as_str().expect("a release names its call id");
                let released = match route {
                    Route::InProcess => limiter.release_call_blocking(&attrs, id),
                    Route::Async => rt.block_on(limiter.release_call(&attrs, id)),
                };
                released.map(|n| json!({ "released": n }))
            }
            "extend" => {
                let id = step["call_id"].as_str().expect("an extend names its call id");
                let d = std::time::Duration::from_millis(step["duration_ms"].as_u64().expect("duration_ms"));
                let extended = match route {
                    Route::InProcess => limiter.extend_call_blocking(&attrs, id, d),
                    Route::Async => rt.block_on(limiter.extend_call(&attrs, id, d)),
                };
                extended.map(|n| json!({ "extended": n }))
            }
            "acquire" => {
                let timeout = std::time::Duration::from_millis(step["timeout_ms"].as_u64().unwrap());
                rt.block_on(limiter.acquire(&attrs, cost, timeout)).map(|d| decision_json(&d))
            }
            other => panic!("unknown op {other:?}"),
        },
    };
    match outcome {
        Ok(v) => json!({ "expect": v }),
        Err(e) => json!({ "expect_error": e.kind().as_str(), "message": e.to_string() }),
    }
}

/// Replay every vector on one backend (`url` `None`: embedded) and return
/// every mismatch, one line each.
fn replay_all(url: Option<&str>, route: Route) -> (usize, Vec<String>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let backend = match (url, route) {
        (Some(u), _) if u.starts_with("redis+cluster://") => "cluster",
        (Some(_), _) => "redis",
        (None, Route::Async) => "memory",
        (None, Route::InProcess) => "memory, in process",
    };
    let mut problems = Vec::new();
    let mut steps_run = 0;
    for (i, v) in load_vectors(&replay_dir()).iter().enumerate() {
        let policy = match Policy::from_value(&v.doc["policy"]) {
            Ok(p) => p,
            Err(e) => {
                problems.push(format!("{} [{backend}]: policy rejected: {e}", v.file));
                continue;
            }
        };
        let start_us = v.doc["start_us"].as_i64().expect("start_us");
        let clock = ManualClock::new(start_us);
        let mut builder = Limiter::builder(policy)
            .clock(Clock::Manual(clock.clone()))
            .prefix(format!("tgv{}-{i}:", std::process::id()))
            .timeout(Duration::from_secs(10))
            .on_backend_error(FailureMode::Error);
        if let Some(url) = url {
            builder = builder.url(url);
        }
        let limiter = builder.build().expect("limiter builds");
        for (n, step) in v.doc["steps"].as_array().expect("steps").iter().enumerate() {
            steps_run += 1;
            let advance = step["advance_ms"].as_u64().unwrap_or(0);
            clock.advance(Duration::from_millis(advance));
            let got = run_step(&rt, &limiter, step, route);
            let at = format!("{} step {n} [{backend}]", v.file);
            match (step.get("expect"), step.get("expect_error")) {
                (Some(want), _) => match got.get("expect") {
                    Some(have) => compare(&at, want, have, &mut problems),
                    None => problems.push(format!(
                        "{at}: expected a decision, got error {} ({})",
                        got["expect_error"], got["message"]
                    )),
                },
                (None, Some(kind)) => {
                    if got.get("expect_error") != Some(kind) {
                        problems.push(format!("{at}: expected error {kind}, got {got}"));
                    }
                }
                (None, None) => {
                    problems.push(format!("{at}: step has neither expect nor expect_error"))
                }
            }
        }
    }
    (steps_run, problems)
}

fn compare(at: &str, want: &Value, have: &Value, problems: &mut Vec<String>) {
    let want = want.as_object().expect("expect is an object");
    for (field, w) in want {
        let h = have.get(field).unwrap_or(&Value::Null);
        if w != h {
            problems.push(format!("{at}: {field}: expected {w}, got {h}"));
        }
    }
    if let Some(have) = have.as_object() {
        for field in have.keys().filter(|f| !want.contains_key(*f)) {
            problems.push(format!("{at}: {field}: not in the vector"));
        }
    }
}

fn assert_clean(backend: &str, (steps, problems): (usize, Vec<String>)) {
    assert!(
        steps > 0,
        "no vector steps found in {}",
        replay_dir().display()
    );
    assert!(
        problems.is_empty(),
        "{} mismatch(es) on the {backend} backend over {steps} steps:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn every_vector_on_the_memory_backend() {
    assert_clean("memory", replay_all(None, Route::Async));
}

#[test]
fn every_vector_on_the_memory_backend_in_process() {
    assert_clean("memory (in process)", replay_all(None, Route::InProcess));
}

#[test]
fn every_vector_on_redis() {
    let server = RedisServer::start();
    assert_clean("redis", replay_all(Some(&server.url()), Route::Async));
}

/// The same vectors on a local Redis Cluster (3 primaries, 1 replica each):
/// rules of one check land in different slots, so stacking goes through the
/// per-slot path with give-backs, and must still decide exactly the same.
#[test]
fn every_vector_on_a_redis_cluster() {
    let cluster = RedisCluster::start(3);
    assert_clean("cluster", replay_all(Some(&cluster.url()), Route::Async));
}

#[test]
fn the_suite_is_large_and_well_formed() {
    let vectors = load_vectors(&vectors_dir());
    assert!(vectors.len() >= 40, "only {} vectors", vectors.len());
    let mut algorithms = std::collections::BTreeSet::new();
    for v in &vectors {
        assert_eq!(
            v.doc["name"]
                .as_str()
                .map(|n| format!("{n}.json"))
                .as_deref(),
            Some(v.file.as_str()),
            "a vector's name matches its file name"
        );
        for rule in v.doc["policy"]["rules"].as_array().expect("rules") {
            algorithms.insert(
                rule["algorithm"]
                    .as_str()
                    .unwrap_or("sliding_window_log")
                    .to_string(),
            );
        }
        for step in v.doc["steps"].as_array().expect("steps") {
            assert!(
                step.get("expect").is_some() != step.get("expect_error").is_some(),
                "{}: each step has exactly one of expect / expect_error",
                v.file
            );
        }
    }
    assert_eq!(
        algorithms.into_iter().collect::<Vec<_>>(),
        ["concurrency", "fixed_window", "quota", "sliding_window", "sliding_window_log", "token_bucket"],
        "every algorithm is covered"
    );
}

/// The committed files are exactly what the generator writes, so the cases
/// and the model cannot drift apart from the JSON every runner reads.
#[test]
fn vectors_are_not_stale() {
    let out = Command::new("python3")
        .arg(vectors_dir().join("generate.py"))
        .arg("--check")
        .output()
        .expect("python3 runs (it is required to check the vectors)");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
