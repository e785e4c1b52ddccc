//! The request model and route limits, on the embedded backend: the shared
//! table `tests/http/request-model.json` as far as the core's part goes (the
//! frameworks' routers are tested by each language's framework suites), and
//! `Limiter::add_route_limit` stacked with a policy's own rules.

use std::path::PathBuf;

use serde_json::Value;
use throttlegate::http::{normalize_path, normalize_route, HttpRequest, RouterRules};
use throttlegate::{ErrorKind, Limiter, Policy, RouteLimit, REQUEST_MODEL};

fn table(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/http").join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn limiter(policy: &Value) -> Limiter {
    Limiter::in_memory(Policy::from_value(policy).unwrap())
}

#[test]
fn every_framework_syntax_gives_the_template() {
    let t = table("request-model.json");
    for route in t["routes"].as_array().unwrap() {
        let want = route["template"].as_str().unwrap();
        for fw in ["flask", "starlette", "django", "express", "fastify"] {
            let given = route[fw].as_str().unwrap();
            assert_eq!(normalize_route(given), want, "{fw}: {given}");
        }
    }
}

#[test]
fn the_request_model_table() {
    let t = table("request-model.json");
    let l = limiter(&t["policy"]);
    assert_eq!(l.request_headers(), ["x-api-key"]);
    for case in t["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let req = &case["request"];
        let expect = case["expect"].as_object().unwrap();
        let headers: Vec<(&str, &str)> = req["headers"]
            .as_object()
            .map(|h| h.iter().map(|(k, v)| (k.as_str(), v.as_str().unwrap())).collect())
            .unwrap_or_default();
        let host = headers.iter().find(|(k, _)| k.eq_ignore_ascii_case("host")).map(|(_, v)| *v);
        // The route is the framework's to resolve: pass the template the table expects.
        let route = expect["route"].as_str();
        let got = l.request_attributes(&HttpRequest {
            ip: Some("127.0.0.1"),
            method: req["method"].as_str().unwrap(),
            route,
            path: req["target"].as_str().unwrap(),
            host,
            headers: &headers,
            router: RouterRules::default(),
        });
        let get = |k: &str| got.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("ip"), Some("127.0.0.1"), "{name}");
        for (k, v) in expect {
            assert_eq!(get(k), v.as_str(), "{name}: {k}");
        }
        for k in ["host", "api_key"] {
            if !expect.contains_key(k) {
                assert_eq!(get(k), None, "{name}: {k}");
            }
        }
    }
}

#[test]
fn bypass_spellings_reach_one_path_where_the_router_says_so() {
    let t = table("bypass.json");
    let loose = RouterRules { case_insensitive: true, ignore_trailing_slash: true };
    for s in t["spellings"].as_array().unwrap() {
        let target = s["target"].as_str().unwrap();
        // Every spelling is /login to a router that ignores case and trailing slashes.
        assert_eq!(normalize_path(target, loose), "/login", "{target}");
    }
}

#[test]
fn route_limits_stack_with_the_policy_all_or_nothing() {
    let l = limiter(&serde_json::json!({"rules": [
        {"name": "per-ip", "key": "ip:{ip}", "limit": 4, "window": "1m"}
    ]}));
    let names = l
        .add_route_limit(&RouteLimit {
            rate: "2/minute".into(),
            route: "/login".into(),
            methods: vec!["post".into()],
            ..Default::default()
        })
        .unwrap();
    assert_eq!(names, ["route.POST.login"]);
    // Idempotent: the same limit again changes nothing.
    assert_eq!(
        l.add_route_limit(&RouteLimit {
            rate: "2/minute".into(),
            route: "/login".into(),
            methods: vec!["POST".into()],
            ..Default::default()
        })
        .unwrap(),
        names
    );
    assert_eq!(l.policy().rules().len(), 2);
    let login = [("ip", "203.0.113.7"), ("route", "/login"), ("method", "POST")];
    let other = [("ip", "203.0.113.7"), ("route", "/"), ("method", "GET")];
    let check = |a: &[(&str, &str)]| l.check_blocking(a, &Default::default()).unwrap();
    for _ in 0..2 {
        let d = check(&login);
        assert!(d.allowed);
        assert_eq!(d.results.len(), 2);
    }
    // The route limit denies: the per-ip rule keeps what it had (2 of 4 used).
    let d = check(&login);
    assert!(!d.allowed);
    assert_eq!(d.rule.as_deref(), Some("route.POST.login"));
    let ip = d.results.iter().find(|r| r.rule.as_str() == "per-ip").unwrap();
    assert_eq!(ip.remaining, 2, "a denied request consumes nothing, and says so");
    assert!(check(&other).allowed);
    assert!(check(&other).allowed);
    assert!(!check(&other).allowed);
    // A reload keeps the route limit (and its state).
    l.reload(Policy::from_value(&serde_json::json!({"rules": [
        {"name": "per-ip", "key": "ip:{ip}", "limit": 100, "window": "1m"}
    ]})).unwrap())
    .unwrap();
    assert_eq!(l.policy().rules().len(), 2);
    let d = check(&login);
    assert!(!d.allowed);
    assert_eq!(d.rule.as_deref(), Some("route.POST.login"));
}

#[test]
fn route_limit_names_keys_and_errors() {
    let l = limiter(&serde_json::json!({"rules": [
        {"name": "route.GET.users.id", "key": "u:{ip}", "limit": 4, "window": "1m"}
    ]}));
    let err = l
        .add_route_limit(&RouteLimit { rate: "5/minute".into(), route: "/users/<int:id>".into(), methods: vec!["GET".into()], ..Default::default() })
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.message().contains("\"route.GET.users.id\" is used by another rule"), "{err}");
    let names = l
        .add_route_limit(&RouteLimit {
            rate: "5/minute; 100 per hour".into(),
            route: "/users/:id".into(),
            methods: vec![],
            key: Some("user:{user}".into()),
            name: Some("users".into()),
        })
        .unwrap();
    assert_eq!(names, ["users.1m", "users.1h"]);
    let policy = l.policy();
    let rule = &policy.rules()[1];
    assert_eq!(rule.key, "user:{user}");
    assert_eq!(rule.matches.get("route").unwrap(), &vec!["/users/{id}".to_string()]);
    assert!(!rule.matches.contains_key("method"));
    for (limit, want) in [
        (RouteLimit { rate: "5 a minute".into(), route: "/x".into(), ..Default::default() }, "rate \"5 a minute\": expected \"/\" or \"per\""),
        (RouteLimit { rate: "5/minute".into(), route: "/x".into(), methods: vec!["GE T".into()], ..Default::default() }, "\"GE T\" is not an HTTP method"),
        (RouteLimit { rate: "5/minute".into(), route: "/x".into(), key: Some("{ip".into()), ..Default::default() }, "key:"),
        (RouteLimit { rate: "5/minute".into(), route: "/x".into(), name: Some("bad name".into()), ..Default::default() }, "name:"),
    ] {
        let err = l.add_route_limit(&limit).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        assert!(err.message().contains(want), "{err} should contain {want}");
    }
    // A refused limit leaves the policy as it was.
    assert_eq!(l.policy().rules().len(), 3);
    l.close();
    assert_eq!(
        l.add_route_limit(&RouteLimit { rate: "5/minute".into(), route: "/y".into(), ..Default::default() }).unwrap_err().kind(),
        ErrorKind::Closed
    );
}

#[test]
fn warnings_for_attributes_no_integration_provides() {
    let l = limiter(&serde_json::json!({
        "attributes": {"api_key": "header:x-api-key"},
        "rules": [
            {"name": "login", "key": "login:{ip}", "match": {"route": "/login", "method": "POST"}, "limit": 5, "window": "1m"},
            {"name": "per-key", "key": "k:{api_key}", "limit": 5, "window": "1m"},
            {"name": "per-tenant", "key": "t:{tenant}:{user}", "limit": 5, "window": "1m"}
        ]
    }));
    assert_eq!(
        l.attribute_warnings(&REQUEST_MODEL),
        ["rule \"per-tenant\" needs the attributes \"tenant\", \"user\", which this integration does not provide, so it never applies; \
          read it from a header in the policy's [attributes] table (api_key = \"header:x-api-key\") or pass an attributes function"]
    );
    assert_eq!(l.attribute_warnings(&["ip"]).len(), 2);
}

#[test]
fn diff_and_reload_see_the_attributes_table() {
    let without = Policy::from_toml_str("[[rules]]\nname = \"k\"\nkey = \"k:{api_key}\"\nlimit = 5\nwindow = \"1m\"\n").unwrap();
    let with = Policy::from_toml_str(
        "[attributes]\napi_key = \"header:X-Api-Key\"\n[[rules]]\nname = \"k\"\nkey = \"k:{api_key}\"\nlimit = 5\nwindow = \"1m\"\n",
    )
    .unwrap();
    assert_eq!(with.attribute_sources(), [("api_key".to_string(), "x-api-key".to_string())]);
    let diff = throttlegate::PolicyDiff::between(&without, &with);
    assert_eq!(diff.settings.len(), 1);
    assert_eq!(diff.settings[0].field, "attributes");
    assert!(diff.to_text().starts_with("setting attributes: null -> {\"api_key\":\"header:x-api-key\"}"), "{}", diff.to_text());
    // A reload puts the new table in force: the header is read from then on.
    let l = Limiter::in_memory(without);
    assert!(l.request_headers().is_empty());
    l.reload(with.clone()).unwrap();
    assert_eq!(l.request_headers(), ["x-api-key"]);
    // The table round-trips through the file format.
    assert_eq!(Policy::from_value(&with.to_value()).unwrap(), with);
}
