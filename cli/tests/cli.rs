//! The `throttlegate` binary, run as a user runs it: real processes, a real
//! redis-server, the example files of the repository.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use throttlegate_testkit::RedisServer;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_throttlegate"))
}

fn repo(path: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path)
        .to_string_lossy()
        .into_owned()
}

fn run(args: &[&str]) -> Output {
    bin()
        .args(args)
        .output()
        .expect("the throttlegate binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON value ({e}): {}{}",
            stdout(o),
            stderr(o)
        )
    })
}

/// A failure: the given exit code, and exactly one line on stderr that
/// contains every one of `needles`.
fn assert_fails(o: &Output, code: i32, needles: &[&str]) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(code), "exit code; stderr: {err}");
    assert_eq!(err.lines().count(), 1, "one line on stderr, got: {err:?}");
    assert!(err.starts_with("throttlegate: error: "), "{err}");
    for n in needles {
        assert!(err.contains(n), "{err:?} should mention {n:?}");
    }
}

fn temp_file(name: &str, text: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("throttlegate-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

const SMALL_POLICY: &str = r#"
[[rules]]
name = "per-ip"
key = "ip:{ip}"
limit = 3
window = "1m"

[[rules]]
name = "per-key"
key = "key:{api_key}"
algorithm = "token_bucket"
capacity = 5
refill_rate = 0.01
"#;

// ---- help and usage --------------------------------------------------------

#[test]
fn help_everywhere() {
    for args in [
        vec!["--help"],
        vec!["simulate", "--help"],
        vec!["check", "--help"],
        vec!["peek", "--help"],
        vec!["reset", "--help"],
        vec!["settle", "--help"],
        vec!["acquire", "--help"],
        vec!["bench", "--help"],
        vec!["serve", "--help"],
        vec!["help", "simulate"],
    ] {
        let o = run(&args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
        let out = stdout(&o);
        assert!(out.contains("Usage: throttlegate"), "{args:?}: {out}");
    }
    assert!(stdout(&run(&["--help"])).contains("Exit status"));
    assert!(stdout(&run(&["simulate", "--help"])).contains("Scenario file"));
    assert!(stdout(&run(&["serve", "--help"])).contains("[env: THROTTLEGATE_RULES="));
    let v = run(&["--version"]);
    assert_eq!(v.status.code(), Some(0));
    assert!(stdout(&v).contains("0.1.0"));
}

#[test]
fn usage_errors_are_one_line_with_exit_2() {
    assert_fails(&run(&["frobnicate"]), 2, &["frobnicate"]);
    assert_fails(
        &run(&["check", "--rules", &repo("examples/rules.toml"), "ip=1"]),
        2,
        &["--redis"],
    );
    assert_fails(&run(&["simulate"]), 2, &["--rules"]);
    assert_fails(
        &run(&[
            "simulate",
            "--rules",
            &repo("examples/rules.toml"),
            "--rate",
            "fast",
        ]),
        2,
        &["--rate", "fast"],
    );
    assert_fails(
        &run(&[
            "simulate",
            "--rules",
            &repo("examples/rules.toml"),
            "--duration",
            "10 parsecs",
        ]),
        2,
        &["--duration"],
    );
    assert_fails(
        &run(&[
            "simulate",
            "--rules",
            &repo("examples/rules.toml"),
            "--scenario",
            &repo("examples/scenario-launch.toml"),
            "--rate",
            "3",
        ]),
        2,
        &["--scenario", "--rate"],
    );
    // No subcommand: the help, on stderr, and a failure status.
    let o = run(&[]);
    assert_eq!(o.status.code(), Some(2));
}

// ---- policy and input errors -------------------------------------------------

#[test]
fn bad_policies_name_the_problem() {
    let missing = run(&["simulate", "--rules", "/nonexistent/rules.toml"]);
    assert_fails(&missing, 2, &["io", "/nonexistent/rules.toml"]);

    let bad = temp_file(
        "bad-limit.toml",
        "[[rules]]\nname = \"a\"\nkey = \"ip:{ip}\"\nlimit = 0\nwindow = \"1m\"\n",
    );
    assert_fails(
        &run(&["simulate", "--rules", bad.to_str().unwrap()]),
        2,
        &["invalid_policy", "limit"],
    );

    let unknown = temp_file(
        "unknown-field.toml",
        "[[rules]]\nname = \"a\"\nkey = \"ip:{ip}\"\nlimit = 5\nwindow = \"1m\"\nburst = 3\n",
    );
    assert_fails(
        &run(&["simulate", "--rules", unknown.to_str().unwrap()]),
        2,
        &["burst"],
    );

    let malformed = temp_file("malformed.toml", "[[rules]\nname = \n");
    assert_fails(
        &run(&["simulate", "--rules", malformed.to_str().unwrap()]),
        2,
        &["invalid_policy", "TOML"],
    );
}

#[test]
fn bad_traffic_flags_and_scenarios_name_the_problem() {
    let rules = repo("examples/rules.toml");
    assert_fails(
        &run(&["simulate", "--rules", &rules, "--attr", "ip"]),
        2,
        &["--attr", "NAME=TEMPLATE"],
    );
    assert_fails(
        &run(&["simulate", "--rules", &rules, "--attr", "ip=10.{host}"]),
        2,
        &["{host}", "{client}"],
    );
    assert_fails(
        &run(&["simulate", "--rules", &rules, "--clients", "0"]),
        2,
        &["clients"],
    );
    assert_fails(
        &run(&["simulate", "--rules", &rules, "--rate", "-1"]),
        2,
        &["rate"],
    );
    assert_fails(
        &run(&[
            "simulate",
            "--rules",
            &rules,
            "--rate",
            "1000000",
            "--duration",
            "1d",
        ]),
        2,
        &["at most"],
    );
    assert_fails(
        &run(&["simulate", "--rules", &rules, "--cost", "500"]),
        2,
        &["invalid_argument", "cost"],
    );

    let unknown = temp_file(
        "scenario-unknown.toml",
        "[[phases]]\nduration = \"1m\"\nrate = 5\nspeed = 3\n",
    );
    assert_fails(
        &run(&[
            "simulate",
            "--rules",
            &rules,
            "--scenario",
            unknown.to_str().unwrap(),
        ]),
        2,
        &["speed", "line 4"],
    );
    let empty = temp_file("scenario-empty.toml", "seed = 3\n");
    assert_fails(
        &run(&[
            "simulate",
            "--rules",
            &rules,
            "--scenario",
            empty.to_str().unwrap(),
        ]),
        2,
        &["phases"],
    );
    let bad_duration = temp_file(
        "scenario-duration.toml",
        "[[phases]]\nduration = \"soon\"\nrate = 5\n",
    );
    assert_fails(
        &run(&[
            "simulate",
            "--rules",
            &rules,
            "--scenario",
            bad_duration.to_str().unwrap(),
        ]),
        2,
        &["phases[0]", "duration"],
    );
    assert_fails(
        &run(&[
            "simulate",
            "--rules",
            &rules,
            "--scenario",
            "/nonexistent/scenario.toml",
        ]),
        2,
        &["/nonexistent/scenario.toml"],
    );
}

#[test]
fn json_errors_are_machine_readable() {
    let o = run(&[
        "check",
        "--json",
        "--rules",
        "/nonexistent.toml",
        "--redis",
        "memory://",
        "ip=1",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let v = json(&o);
    assert_eq!(v["error"]["kind"], "io");
    assert_eq!(v["error"]["exit"], 2);
}

// ---- simulate ----------------------------------------------------------------

#[test]
fn the_demo_runs_and_shows_every_rule() {
    let o = run(&["simulate", "--rules", &repo("examples/rules.toml")]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    for needle in [
        "per-ip",
        "per-api-key",
        "login",
        "global",
        "per-ip-strict (shadow)",
        "Summary",
        "0:09:00",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in:\n{out}");
    }
}

#[test]
fn every_example_scenario_runs() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !(name.starts_with("scenario") && name.ends_with(".toml")) {
            continue;
        }
        n += 1;
        let o = run(&[
            "simulate",
            "--rules",
            &repo("examples/rules.toml"),
            "--scenario",
            path.to_str().unwrap(),
            "--json",
        ]);
        assert_eq!(o.status.code(), Some(0), "{name}: {}", stderr(&o));
        let v = json(&o);
        assert!(v["phases"].as_array().unwrap().len() >= 2, "{name}");
        assert!(
            v["denied"].as_u64().unwrap() > 0,
            "{name}: the example crosses a limit"
        );
    }
    assert!(n >= 2, "example scenarios found: {n}");
}

#[test]
fn simulation_is_deterministic_per_seed() {
    let rules = repo("examples/rules.toml");
    let a = run(&[
        "simulate",
        "--rules",
        &rules,
        "--duration",
        "2m",
        "--seed",
        "9",
    ]);
    let b = run(&[
        "simulate",
        "--rules",
        &rules,
        "--duration",
        "2m",
        "--seed",
        "9",
    ]);
    let c = run(&[
        "simulate",
        "--rules",
        &rules,
        "--duration",
        "2m",
        "--seed",
        "10",
    ]);
    assert_eq!(a.status.code(), Some(0), "{}", stderr(&a));
    assert_eq!(stdout(&a), stdout(&b));
    assert_ne!(stdout(&a), stdout(&c));
}

#[test]
fn simulated_counts_add_up_and_respect_the_limit() {
    let p = temp_file(
        "one-rule.toml",
        "[[rules]]\nname = \"w\"\nkey = \"ip:{ip}\"\nlimit = 10\nwindow = \"1m\"\n",
    );
    let o = run(&[
        "simulate",
        "--rules",
        p.to_str().unwrap(),
        "--rate",
        "5",
        "--duration",
        "10m",
        "--clients",
        "1",
        "--interval",
        "1m",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = json(&o);
    let requests = v["requests"].as_u64().unwrap();
    assert_eq!(
        requests,
        v["allowed"].as_u64().unwrap() + v["denied"].as_u64().unwrap()
    );
    assert!(
        (2_500..3_500).contains(&requests),
        "about 5/s for 10 minutes: {requests}"
    );
    let intervals = v["intervals"].as_array().unwrap();
    assert_eq!(intervals.len(), 10);
    let mut sum = 0;
    for row in intervals {
        let allowed = row["allowed"].as_u64().unwrap();
        // One client far above 10/min: exactly 10 admitted per aligned minute.
        assert_eq!(allowed, 10, "{row}");
        assert_eq!(row["rules"]["w"]["allowed"], row["allowed"]);
        sum += row["requests"].as_u64().unwrap();
    }
    assert_eq!(sum, requests);
    assert_eq!(v["rules"][0]["decided_denials"], v["denied"]);
}

#[test]
fn scenario_phases_and_templates_shape_the_traffic() {
    let rules = temp_file("per-route.toml", SMALL_POLICY);
    let scenario = temp_file(
        "two-phases.toml",
        r#"
seed = 3
interval = "30s"
[attributes]
ip = "10.0.{client}.1"
[[phases]]
name = "quiet"
duration = "1m"
rate = 0
[[phases]]
name = "busy"
duration = "1m"
rate = 2
clients = 2
burst = 2
attributes = { api_key = "k-{phase}-{client}" }
"#,
    );
    let o = run(&[
        "simulate",
        "--rules",
        rules.to_str().unwrap(),
        "--scenario",
        scenario.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["interval_ms"], 30_000);
    assert_eq!(v["phases"][0]["requests"], 0);
    let busy = v["phases"][1]["requests"].as_u64().unwrap();
    assert!(busy > 0 && busy % 2 == 0, "bursts of 2: {busy}");
    // Two clients, 3 per minute each on per-ip: at most 6 admitted.
    assert!(v["allowed"].as_u64().unwrap() <= 6);
    let top = v["most_denied_clients"].as_array().unwrap();
    assert!(
        top.iter().all(|c| c["attributes"]
            .as_str()
            .unwrap()
            .contains("api_key=k-busy-")),
        "{top:?}"
    );
}

#[test]
fn simulation_on_redis_matches_the_embedded_backend() {
    let server = RedisServer::start();
    // Redis expires keys on its own clock, not the simulation's: every key
    // here lives at least 10 s of real time, far longer than the run, so a
    // stalled test machine cannot make Redis forget state the manual clock
    // still counts.
    let rules = temp_file(
        "sim-redis.toml",
        r#"
[[rules]]
name = "per-ip"
key = "ip:{ip}"
limit = 30
window = "1m"
[[rules]]
name = "per-key"
key = "key:{api_key}"
algorithm = "token_bucket"
capacity = 20
refill_rate = 0.1
[[rules]]
name = "login"
key = "login:{ip}"
match = { route = "/login" }
limit = 5
window = "5m"
[[rules]]
name = "trial"
key = "t:{ip}"
limit = 10
window = "1m"
shadow = true
"#,
    );
    let rules = rules.to_string_lossy().into_owned();
    let args = [
        "simulate",
        "--rules",
        rules.as_str(),
        "--duration",
        "3m",
        "--rate",
        "20",
        "--json",
    ];
    let memory = run(&args);
    let mut with_redis: Vec<&str> = args.to_vec();
    let url = server.url();
    with_redis.extend(["--redis", url.as_str()]);
    let redis = run(&with_redis);
    assert_eq!(redis.status.code(), Some(0), "{}", stderr(&redis));
    let (mut m, mut r) = (json(&memory), json(&redis));
    assert_eq!(m["backend"], "memory");
    assert_eq!(r["backend"], "redis");
    m["backend"] = Value::Null;
    r["backend"] = Value::Null;
    assert!(
        m["denied"].as_u64().unwrap() > 0,
        "the traffic crosses the limits"
    );
    assert_eq!(
        m, r,
        "the same traffic gets the same decisions on both backends"
    );
    // The simulation removed its keys.
    assert_eq!(server.command(&["DBSIZE"]).unwrap(), "0");
}

// ---- check, peek, reset against redis ----------------------------------------

#[test]
fn check_peek_reset_against_redis() {
    let server = RedisServer::start();
    let url = server.url();
    let rules = temp_file("oneshot.toml", SMALL_POLICY);
    let rules = rules.to_str().unwrap();
    let base = |cmd: &str| -> Vec<String> {
        vec![
            cmd.into(),
            "--rules".into(),
            rules.into(),
            "--redis".into(),
            url.clone(),
            "--json".into(),
        ]
    };
    let call = |cmd: &str, extra: &[&str]| -> Output {
        let mut a = base(cmd);
        a.extend(extra.iter().map(|s| s.to_string()));
        bin().args(&a).output().unwrap()
    };

    let o = call("check", &["ip=203.0.113.7", "api_key=k1"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let d = json(&o);
    assert_eq!(d["allowed"], true);
    assert_eq!(d["rule"], "per-ip");
    assert_eq!(d["remaining"], 2);
    assert_eq!(d["results"].as_array().unwrap().len(), 2);
    assert_eq!(d["headers"][0], serde_json::json!(["RateLimit-Limit", "3"]));

    // peek consumes nothing.
    let p1 = json(&call("peek", &["ip=203.0.113.7"]));
    let p2 = json(&call("peek", &["ip=203.0.113.7"]));
    assert_eq!(p1["remaining"], 1, "a peek shows what a check would leave");
    assert_eq!(p1, p2);

    // A repeated call id counts once.
    for _ in 0..2 {
        let o = call("check", &["--call-id", "order-42", "ip=203.0.113.7"]);
        assert_eq!(json(&o)["remaining"], 1);
    }
    assert_eq!(json(&call("check", &["ip=203.0.113.7"]))["remaining"], 0);

    // Denied: exit status 1, Retry-After among the headers.
    let o = call("check", &["ip=203.0.113.7"]);
    assert_eq!(o.status.code(), Some(1));
    let d = json(&o);
    assert_eq!(d["allowed"], false);
    assert!(d["retry_after_ms"].as_u64().unwrap() > 0);
    assert!(d["headers"]
        .as_array()
        .unwrap()
        .iter()
        .any(|h| h[0] == "Retry-After"));
    let o = call("peek", &["ip=203.0.113.7"]);
    assert_eq!(o.status.code(), Some(1));

    // The text form shows the decision and the headers.
    let o = bin()
        .args([
            "check",
            "--rules",
            rules,
            "--redis",
            &url,
            "--legacy-headers",
            "ip=203.0.113.7",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let text = stdout(&o);
    assert!(text.contains("DENIED by rule \"per-ip\""), "{text}");
    assert!(text.contains("Retry-After: "), "{text}");
    assert!(text.contains("X-RateLimit-Limit: 3"), "{text}");

    // reset unblocks the client and says how many keys it removed.
    let o = call("reset", &["ip=203.0.113.7", "api_key=k1"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let r = json(&o);
    assert_eq!(r["deleted"], 2);
    assert_eq!(r["keys"].as_array().unwrap().len(), 2);
    assert_eq!(json(&call("reset", &["ip=203.0.113.7"]))["deleted"], 0);
    assert_eq!(json(&call("check", &["ip=203.0.113.7"]))["remaining"], 2);

    // No applicable rule: allowed, no headline rule.
    let d = json(&call("check", &["user=nobody"]));
    assert_eq!(d["allowed"], true);
    assert_eq!(d["rule"], Value::Null);
    let o = bin()
        .args(["reset", "--rules", rules, "--redis", &url, "user=nobody"])
        .output()
        .unwrap();
    assert!(stdout(&o).contains("nothing to reset"));

    // Bad input against a live backend.
    assert_fails(
        &call("check", &["--cost", "4", "ip=203.0.113.7"]),
        2,
        &["invalid_argument", "cost", "per-ip"],
    );
    assert_fails(&call("check", &["--cost", "0", "ip=1"]), 2, &["--cost"]);
    assert_fails(
        &call("check", &["--call-id", "no spaces", "ip=1"]),
        2,
        &["call_id"],
    );
    assert_fails(&call("check", &["ip"]), 2, &["NAME=VALUE"]);
    assert_fails(&call("check", &["ip=1", "ip=2"]), 2, &["twice"]);

    // Operator overrides (the same server): set, seen by check, listed, cleared.
    let tiered = temp_file(
        "overrides.toml",
        "[[rules]]\nname = \"per-key\"\nkey = \"key:{api_key}\"\nlimit = 2\nwindow = \"1m\"\noverrides = true\n",
    );
    let tiered = tiered.to_str().unwrap();
    let ovr = |args: &[&str]| -> Output {
        let mut a = vec!["override", args[0], "--rules", tiered, "--redis", &url, "--rule", "per-key", "--json"];
        a.extend(&args[1..]);
        bin().args(&a).output().unwrap()
    };
    let o = ovr(&["set", "--limit", "7", "api_key=k9"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let d = json(&bin().args(["check", "--rules", tiered, "--redis", &url, "--json", "api_key=k9"]).output().unwrap());
    assert_eq!((d["limit"].as_u64(), d["remaining"].as_u64()), (Some(7), Some(6)));
    let l = json(&ovr(&["list"]));
    assert_eq!(l["overrides"], serde_json::json!([{ "attributes": { "api_key": "k9" }, "limit": 7 }]));
    assert_eq!(json(&ovr(&["clear", "api_key=k9"]))["cleared"], true);
    assert_eq!(json(&ovr(&["clear", "api_key=k9"]))["cleared"], false);
    assert_eq!(json(&ovr(&["list"]))["overrides"], serde_json::json!([]));
    assert_fails(&ovr(&["set", "--limit", "0", "api_key=k9"]), 2, &["invalid_argument", "limit"]);
    let o = bin()
        .args(["override", "list", "--rules", rules, "--redis", &url, "--rule", "per-ip"])
        .output()
        .unwrap();
    assert_fails(&o, 2, &["overrides = true"]);
    // settle: a check at an estimate of 3 that really cost 1 gives 2 back, once.
    let o = call("check", &["--cost", "3", "--call-id", "job-9", "ip=198.51.100.9"]);
    assert_eq!(json(&o)["remaining"], 0, "{}", stderr(&o));
    let settle = ["--call-id", "job-9", "--cost", "3", "--actual", "1", "ip=198.51.100.9"];
    assert_eq!(json(&call("settle", &settle)), serde_json::json!({ "settled": 1 }));
    assert_eq!(json(&call("settle", &settle)), serde_json::json!({ "settled": 0 }));
    assert_eq!(json(&call("peek", &["ip=198.51.100.9"]))["remaining"], 1);
    // acquire: admitted at once while there is room; a wait longer than --wait exits 3.
    for left in [1, 0] {
        let o = call("acquire", &["--wait", "1s", "ip=198.51.100.9"]);
        assert_eq!((o.status.code(), json(&o)["remaining"].clone()), (Some(0), serde_json::json!(left)));
    }
    assert_fails(&call("acquire", &["--wait", "1s", "ip=198.51.100.9"]), 3, &["timeout", "acquire: not admitted within 1000 ms"]);
}

#[test]
fn release_and_extend_a_lease_against_redis() {
    let server = RedisServer::start();
    let url = server.url();
    let rules = temp_file(
        "lease.toml",
        "[[rules]]\nname = \"jobs\"\nkey = \"jobs:{tenant}\"\nalgorithm = \"concurrency\"\nlimit = 1\nlease = \"60s\"\n",
    );
    let rules = rules.to_str().unwrap();
    let call = |cmd: &str, extra: &[&str]| -> Output {
        let mut a = vec![cmd, "--rules", rules, "--redis", url.as_str()];
        a.extend_from_slice(extra);
        bin().args(&a).output().unwrap()
    };
    let o = call("check", &["--json", "--call-id", "job-7", "tenant=t1"]);
    assert_eq!((o.status.code(), json(&o)["allowed"].clone()), (Some(0), serde_json::json!(true)), "{}", stderr(&o));
    assert_eq!(call("check", &["--json", "--call-id", "job-8", "tenant=t1"]).status.code(), Some(1), "the one slot is held");
    // Extend, then release, by the call id: as JSON and as text; a second release frees nothing.
    let o = call("extend", &["--json", "--call-id", "job-7", "--duration", "30s", "tenant=t1"]);
    assert_eq!(json(&o), serde_json::json!({ "extended": 1 }), "{}", stderr(&o));
    let o = call("release", &["--call-id", "job-7", "tenant=t1"]);
    assert_eq!(stdout(&o).trim(), "released lease \"job-7\" on 1 rule(s)", "{}", stderr(&o));
    let o = call("release", &["--json", "--call-id", "job-7", "tenant=t1"]);
    assert_eq!(json(&o), serde_json::json!({ "released": 0 }));
    let o = call("extend", &["--call-id", "job-7", "--duration", "30s", "tenant=t1"]);
    assert!(stdout(&o).starts_with("nothing extended: lease \"job-7\" holds no slot"), "{}", stdout(&o));
    assert_eq!(call("check", &["--json", "--call-id", "job-9", "tenant=t1"]).status.code(), Some(0), "the slot is free again");
    assert_fails(&call("extend", &["--call-id", "job-9", "--duration", "0s", "tenant=t1"]), 2, &["duration"]);
}

#[test]
fn unreachable_backend_exits_3() {
    // Port 1 on loopback: nothing listens there, so the connection is refused
    // (a freed test port could be taken by another suite's server meanwhile).
    let url = "redis://127.0.0.1:1".to_string();
    let rules = repo("examples/rules.toml");
    for cmd in ["check", "peek", "reset"] {
        let o = run(&[
            cmd,
            "--rules",
            &rules,
            "--redis",
            &url,
            "--timeout",
            "2s",
            "ip=203.0.113.7",
        ]);
        assert_fails(&o, 3, &["backend_unavailable"]);
    }
    let o = run(&[
        "simulate",
        "--rules",
        &rules,
        "--redis",
        &url,
        "--duration",
        "1m",
    ]);
    assert_fails(&o, 3, &["backend_unavailable"]);
    assert_fails(
        &run(&[
            "check",
            "--rules",
            &rules,
            "--redis",
            "http://example.com",
            "ip=1",
        ]),
        2,
        &["url"],
    );
}

/// A `redis+sentinel://` URL: the one-shot commands run on the primary the
/// sentinels name (the core's Sentinel path; failovers: core/tests/sentinel.rs).
#[test]
fn check_through_sentinel() {
    let group = throttlegate_testkit::SentinelGroup::start();
    let rules = temp_file("sentinel.toml", SMALL_POLICY);
    let rules = rules.to_str().unwrap();
    let url = group.url();
    let o = bin().args(["check", "--rules", rules, "--redis", &url, "--json", "ip=203.0.113.8", "api_key=k1"]).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(json(&o)["remaining"], 2);
    let o = bin().args(["peek", "--rules", rules, "--redis", &url, "--json", "ip=203.0.113.8"]).output().unwrap();
    assert_eq!(json(&o)["remaining"], 1, "a peek shows what a check would leave");
    assert!(group.primary.command(&["DBSIZE"]).unwrap() != "0");
    let o = run(&["check", "--rules", rules, "--redis", "redis+sentinel://127.0.0.1:1", "ip=1"]);
    assert_fails(&o, 2, &["no SERVICE", "/SERVICE[/DB]"]);
}

/// One-shot commands start strict: a wrong password, a user who may not run
/// the script, and a server that never answers fail at once (exit 3, one
/// line naming the kind and the failed step), within the timeout.
#[test]
fn wrong_password_or_silent_server_fail_at_start() {
    let server = RedisServer::start();
    let rules = repo("examples/rules.toml");
    let check = |url: &str, timeout: &str| {
        run(&["check", "--rules", &rules, "--redis", url, "--timeout", timeout, "ip=203.0.113.7"])
    };
    assert_eq!(
        server.command(&["ACL", "SETUSER", "cli-strict", "on", ">right", "~*", "+@all", "-@scripting"]).unwrap(),
        "+OK"
    );
    let o = check(&format!("redis://cli-strict:wrong@127.0.0.1:{}", server.port()), "2s");
    assert_fails(&o, 3, &["backend", "strict: ", "PING"]);
    let o = check(&format!("redis://cli-strict:right@127.0.0.1:{}", server.port()), "2s");
    assert_fails(&o, 3, &["backend", "check script", "refuses scripts", "+evalsha +eval +script|load", "Lua module"]);
    // A listener that accepts and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://127.0.0.1:{}", silent.local_addr().unwrap().port());
    let started = std::time::Instant::now();
    let o = check(&url, "300ms");
    assert_fails(&o, 3, &["timeout", "strict: "]);
    // The process's own start-up included; generous for a loaded machine.
    assert!(started.elapsed() < std::time::Duration::from_secs(3), "{:?}", started.elapsed());
}

// ---- bench ---------------------------------------------------------------------

#[test]
fn bench_reports_throughput_and_percentiles() {
    let o = run(&[
        "bench",
        "--rules",
        &repo("examples/rules.toml"),
        "--requests",
        "3000",
        "--concurrency",
        "4",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["backend"], "memory");
    assert_eq!(v["checks"], 3000);
    assert_eq!(
        v["allowed"].as_u64().unwrap() + v["denied"].as_u64().unwrap(),
        3000
    );
    let lat = &v["latency_us"];
    let (p50, p99, max) = (
        lat["p50"].as_f64().unwrap(),
        lat["p99"].as_f64().unwrap(),
        lat["max"].as_f64().unwrap(),
    );
    assert!(p50 <= p99 && p99 <= max && max > 0.0, "{lat}");
    assert!(v["checks_per_second"].as_f64().unwrap() > 0.0);

    let text = run(&[
        "bench",
        "--rules",
        &repo("examples/rules.toml"),
        "--requests",
        "500",
        "--no-progress",
    ]);
    assert_eq!(text.status.code(), Some(0));
    assert!(stdout(&text).contains("checks/s"));
    assert!(stdout(&text).contains("p99"));
    assert_fails(
        &run(&[
            "bench",
            "--rules",
            &repo("examples/rules.toml"),
            "--concurrency",
            "0",
        ]),
        2,
        &["--concurrency"],
    );
}

#[test]
fn bench_against_redis_cleans_up() {
    let server = RedisServer::start();
    let rules = temp_file("bench.toml", SMALL_POLICY);
    let o = run(&[
        "bench",
        "--rules",
        rules.to_str().unwrap(),
        "--redis",
        &server.url(),
        "--requests",
        "400",
        "--clients",
        "20",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["backend"], "redis");
    assert_eq!(v["checks"], 400);
    // 20 clients, 3 per minute on per-ip: at most 60 admitted.
    assert!(v["allowed"].as_u64().unwrap() <= 60);
    assert_eq!(
        server.command(&["DBSIZE"]).unwrap(),
        "0",
        "the benchmark removed its keys"
    );
}

// ---- the conformance vectors through the command line ----------------------------

/// The first step of every conformance vector (an empty state, so the real
/// clock cannot change the answer) through `check`/`peek`/`reset --json` on
/// the embedded backend: the command prints exactly the vector's fields.
#[test]
fn json_output_matches_the_conformance_vectors() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/vectors");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let name = v["name"].as_str().unwrap().to_string();
        // The command runs on the real clock, so only a first step whose
        // answer does not depend on where "now" falls is compared here: the
        // algorithms aligned to the epoch or the calendar (sub-windows,
        // fixed windows, quota periods) are replayed on a manual clock by
        // every language's vector runner instead.
        let aligned = v["policy"]["rules"].as_array().unwrap().iter().any(|r| {
            matches!(r["algorithm"].as_str(), Some("sliding_window" | "fixed_window" | "quota"))
        });
        if aligned {
            continue;
        }
        let policy = temp_file(&format!("{name}.json"), &v["policy"].to_string());
        let step = &v["steps"][0];
        let op = step["op"].as_str().unwrap_or("check");
        // An override on the embedded backend lives only as long as the
        // process: those cases are replayed by the vector runners.
        if op.starts_with("override") {
            continue;
        }
        let mut args: Vec<String> = vec![
            op.into(),
            "--rules".into(),
            policy.to_string_lossy().into_owned(),
            "--redis".into(),
            "memory://".into(),
            "--json".into(),
        ];
        if op != "reset" {
            args.push(format!("--cost={}", step["cost"].as_u64().unwrap_or(1)));
        }
        if let Some(id) = step["call_id"].as_str() {
            args.push(format!("--call-id={id}"));
        }
        if let Some(ms) = step["timeout_ms"].as_u64() {
            args.push(format!("--wait={}ms", ms.max(1)));
        }
        for (k, val) in step["attributes"].as_object().unwrap() {
            args.push(format!("{k}={}", val.as_str().unwrap()));
        }
        let o = bin().args(&args).output().unwrap();
        let got = json(&o);
        if let Some(kind) = step.get("expect_error") {
            assert_eq!(o.status.code(), Some(2), "{name}");
            assert_eq!(&got["error"]["kind"], kind, "{name}");
        } else {
            let want = step["expect"].as_object().unwrap();
            for (field, w) in want {
                assert_eq!(&got[field], w, "{name}: {field}");
            }
            if op != "reset" {
                let allowed = want["allowed"].as_bool().unwrap();
                assert_eq!(o.status.code(), Some(if allowed { 0 } else { 1 }), "{name}");
                assert_eq!(got["degraded"], false);
            }
        }
        checked += 1;
    }
    assert!(checked >= 40, "vectors checked: {checked}");
}

#[test]
fn script_prints_the_check_script() {
    let o = run(&["script"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), throttlegate::CHECK_SCRIPT);
    assert!(stdout(&o).starts_with("#!lua\n"));
}

/// `lint` and `diff` against golden outputs (`cli/tests/golden/`; rewrite
/// them with `TG_UPDATE_GOLDEN=1` and review the change).
#[test]
fn lint_and_diff_print_their_golden_outputs_and_exit_codes() {
    let cases: &[(&str, &[&str], i32)] = &[
        ("lint-clean.txt", &["lint", "lint-clean.toml"], 0),
        ("lint-warnings.txt", &["lint", "lint-warnings.toml"], 1),
        ("lint-mistakes.txt", &["lint", "lint-mistakes.toml", "--cost", "10", "--attributes", "ip,route,method"], 2),
        ("lint-mistakes.json", &["lint", "lint-mistakes.toml", "--cost=10", "--attributes=ip,route,method", "--format", "json"], 2),
        ("lint-broken.json", &["lint", "lint-broken.toml", "--format=json"], 2),
        ("lint-model.txt", &["lint", "lint-model.toml"], 1),
        ("lint-any.txt", &["lint", "lint-model.toml", "--any-attributes"], 1),
        ("diff-same.txt", &["diff", "diff-old.toml", "diff-old.toml"], 0),
        ("diff-new.txt", &["diff", "diff-old.toml", "diff-new.toml"], 1),
        ("diff-new.json", &["diff", "diff-old.toml", "diff-new.toml", "--format", "json"], 1),
        ("diff-conflict.txt", &["diff", "diff-old.toml", "diff-conflict.toml"], 2),
        ("diff-conflict.json", &["diff", "diff-old.toml", "diff-conflict.toml", "--format", "json"], 2),
    ];
    let update = std::env::var_os("TG_UPDATE_GOLDEN").is_some();
    for (golden, args, code) in cases {
        let o = bin().args(*args).current_dir(repo("cli/tests/policies")).output().unwrap();
        assert_eq!(o.status.code(), Some(*code), "{args:?}: {}{}", stdout(&o), stderr(&o));
        assert_eq!(stderr(&o), "", "{args:?}");
        let path = repo(&format!("cli/tests/golden/{golden}"));
        if update {
            std::fs::write(&path, stdout(&o)).unwrap();
        }
        let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(stdout(&o), expected, "{args:?} differs from {golden}");
        if golden.ends_with(".json") {
            json(&o);
        }
    }
    // A file that does not parse is an error of diff (exit 2, one line).
    let o = bin().args(["diff", "diff-old.toml", "lint-broken.toml"]).current_dir(repo("cli/tests/policies")).output().unwrap();
    assert_fails(&o, 2, &["invalid_policy", "lint-broken.toml", "limit"]);
    let o = bin().args(["diff", "diff-old.toml", "missing.toml", "--format", "json"]).current_dir(repo("cli/tests/policies")).output().unwrap();
    assert_eq!(json(&o)["error"]["kind"], "io");
}

// ---- simulate --report -------------------------------------------------------

#[test]
fn the_report_is_one_page_that_escapes_every_name() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("report-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let scenario = temp_file(
        "report-scenario.toml",
        "seed = 3\ninterval = \"1m\"\n[attributes]\nip = \"10.0.0.{client}\"\nagent = \"<script>alert(1)</script>&{client}\"\n\
         [[phases]]\nname = \"<b>quiet</b>\"\nduration = \"3m\"\nrate = 2\nclients = 2\n\
         [[phases]]\nname = \"storm & \\\"more\\\"\"\nduration = \"4m\"\nrate = 40\nclients = 3\n",
    );
    let page = dir.join("report.html");
    let o = run(&[
        "simulate",
        "--rules",
        &repo("examples/rules.toml"),
        "--scenario",
        scenario.to_str().unwrap(),
        "--report",
        page.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("wrote "), "{}", stderr(&o));
    let v = json(&o);
    assert!(v.get("compare").is_none());
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.contains("default-src 'none'"), "a CSP that loads nothing");
    for raw in ["<script", "<b>quiet"] {
        assert!(!html.contains(raw), "{raw:?} is not escaped");
    }
    for escaped in [
        "&lt;script&gt;alert(1)&lt;/script&gt;&amp;",
        "&lt;b&gt;quiet&lt;/b&gt;",
        "storm &amp; &quot;more&quot;",
    ] {
        assert!(html.contains(escaped), "missing {escaped:?}");
    }
    for rule in ["per-ip", "per-api-key", "login", "global", "per-ip-strict"] {
        assert!(html.contains(&format!("data-chart=\"rule:{rule}\"")), "{rule}");
    }
    assert_eq!(html.matches("data-chart=\"total\"").count(), 1);
    assert_eq!(html.matches("data-chart=\"shadow\"").count(), 1);
}

#[test]
fn compare_runs_a_second_policy_on_the_same_traffic() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("compare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let page = dir.join("compare.html");
    let args = |extra: &[&str]| {
        let mut a = vec!["simulate", "--rules", "RULES", "--duration", "3m", "--seed", "5", "--json"];
        a.extend_from_slice(extra);
        a.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let rules = repo("examples/rules.toml");
    let enforced = repo("examples/rules-enforced.toml");
    let with = |extra: &[&str]| {
        let a: Vec<String> = args(extra).into_iter().map(|s| if s == "RULES" { rules.clone() } else { s }).collect();
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        run(&a)
    };
    let o = with(&["--compare", &enforced, "--report", page.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = json(&o);
    let other = &v["compare"];
    assert_eq!(other["rules_file"], enforced.as_str());
    // The same traffic: as many requests, and the first policy's numbers as without --compare.
    assert_eq!(v["requests"], other["requests"]);
    let alone = json(&with(&[]));
    assert_eq!(alone["denied"], v["denied"]);
    assert!(other["denied"].as_u64() > v["denied"].as_u64(), "enforcing the candidate denies more");
    let html = std::fs::read_to_string(&page).unwrap();
    // One cell per policy in each row: header, every request, shadow, clients, 5 rules, table.
    assert_eq!(html.matches("<div class=\"row\">").count(), 10);
    assert_eq!(html.matches("<div class=\"cell\" data-policy=").count(), 20);
    // The enforced policy has no shadow rule: one shadow chart, on the first side.
    assert_eq!(html.matches("data-chart=\"shadow\"").count(), 1);
    assert!(html.contains("This policy has no shadow rule."));

    let missing = with(&["--compare", "/nonexistent/other.toml"]);
    assert_fails(&missing, 2, &["/nonexistent/other.toml"]);
    let unwritable = with(&["--report", "/nonexistent/dir/report.html"]);
    assert_fails(&unwritable, 2, &["--report", "/nonexistent/dir/report.html"]);
}
