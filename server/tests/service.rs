//! `State::should_rate_limit` on the embedded backend: the mapping of
//! descriptors onto one core check, without the network.

use std::path::PathBuf;

use throttlegate::Limiter;
use throttlegate_server::rls::{code, Entry, RateLimitDescriptor, RateLimitRequest};
use throttlegate_server::rules::Rules;
use throttlegate_server::service::{CheckError, State};

fn state(yaml: &str) -> State {
    let rules = Rules::from_yaml(&[("t.yaml".into(), yaml.into())]).unwrap();
    let limiter = Limiter::in_memory(rules.policy.clone());
    State::new(limiter, rules, PathBuf::from("t.yaml"), true)
}

fn native(toml: &str) -> State {
    let policy = throttlegate::Policy::from_toml_str(toml).unwrap();
    let rules = Rules { format: throttlegate_server::rules::Format::Native, policy: policy.clone(), domains: Default::default(), files: vec![] };
    State::new(Limiter::in_memory(policy), rules, PathBuf::from("p.toml"), false)
}

fn desc(entries: &[(&str, &str)], hits: Option<u64>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries.iter().map(|(k, v)| Entry { key: k.to_string(), value: v.to_string() }).collect(),
        limit: None,
        hits_addend: hits,
    }
}

fn req(domain: &str, descriptors: Vec<RateLimitDescriptor>, hits: u32) -> RateLimitRequest {
    RateLimitRequest { domain: domain.into(), descriptors, hits_addend: hits }
}

const TWO: &str = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 10}\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 2}\n";

#[tokio::test]
async fn a_denied_request_consumes_nothing() {
    let s = state(TWO);
    let both = || req("d", vec![desc(&[("user", "u")], None), desc(&[("tenant", "t")], None)], 0);
    for _ in 0..2 {
        assert_eq!(s.should_rate_limit(&both()).await.unwrap().overall_code, code::OK);
    }
    let r = s.should_rate_limit(&both()).await.unwrap();
    assert_eq!(r.overall_code, code::OVER_LIMIT);
    assert_eq!((r.statuses[0].code, r.statuses[0].limit_remaining), (code::OK, 8));
    assert_eq!((r.statuses[1].code, r.statuses[1].limit_remaining), (code::OVER_LIMIT, 0));
    let r = s.should_rate_limit(&req("d", vec![desc(&[("user", "u")], None)], 0)).await.unwrap();
    assert_eq!(r.statuses[0].limit_remaining, 7);
    // The headers the answer carries are the core's.
    assert!(r.response_headers_to_add.iter().any(|h| h.key == "RateLimit-Policy" && h.value == "\"d.user\";q=10;w=3600"));
}

#[tokio::test]
async fn each_descriptor_counts_its_own_hits_in_one_check() {
    let s = state(TWO);
    // Different costs, one check.
    let r = s
        .should_rate_limit(&req("d", vec![desc(&[("user", "u")], Some(2)), desc(&[("tenant", "t")], Some(1))], 0))
        .await
        .unwrap();
    assert_eq!(r.overall_code, code::OK);
    assert_eq!((r.statuses[0].limit_remaining, r.statuses[1].limit_remaining), (8, 1));
    // One limit reached with two values: each counted at its own cost.
    let r = s
        .should_rate_limit(&req("d", vec![desc(&[("user", "a")], Some(3)), desc(&[("user", "b")], Some(4))], 0))
        .await
        .unwrap();
    assert_eq!((r.statuses[0].limit_remaining, r.statuses[1].limit_remaining), (7, 6));
    // One limit reached twice with one value: counted twice (the sum), as envoyproxy/ratelimit does.
    let r = s
        .should_rate_limit(&req("d", vec![desc(&[("user", "c")], None), desc(&[("user", "c")], Some(2))], 0))
        .await
        .unwrap();
    assert_eq!((r.statuses[0].limit_remaining, r.statuses[1].limit_remaining), (7, 7));
    // All or nothing across costs: the tenant has 1 left, so nothing is counted.
    let r = s
        .should_rate_limit(&req("d", vec![desc(&[("user", "u")], Some(5)), desc(&[("tenant", "t")], Some(2))], 0))
        .await
        .unwrap();
    assert_eq!(r.overall_code, code::OVER_LIMIT);
    assert_eq!((r.statuses[0].code, r.statuses[0].limit_remaining), (code::OK, 8));
    assert_eq!((r.statuses[1].code, r.statuses[1].limit_remaining), (code::OVER_LIMIT, 1));
    // hits_addend 0 checks without counting, in the same check.
    let r = s
        .should_rate_limit(&req("d", vec![desc(&[("user", "u")], Some(1)), desc(&[("tenant", "t")], Some(0))], 0))
        .await
        .unwrap();
    assert_eq!(r.overall_code, code::OK);
    assert_eq!((r.statuses[0].limit_remaining, r.statuses[1].limit_remaining), (7, 1));
    s.should_rate_limit(&req("d", vec![desc(&[("tenant", "t")], None)], 0)).await.unwrap();
    let r = s
        .should_rate_limit(&req("d", vec![desc(&[("user", "u")], Some(1)), desc(&[("tenant", "t")], Some(0))], 0))
        .await
        .unwrap();
    assert_eq!(r.overall_code, code::OVER_LIMIT, "nothing left on the tenant: the user is not counted");
    assert_eq!((r.statuses[0].limit_remaining, r.statuses[1].code), (7, code::OVER_LIMIT));
    // Costs that could never pass are named by descriptor.
    let e = s
        .should_rate_limit(&req("d", vec![desc(&[("user", "z")], Some(1)), desc(&[("tenant", "y")], Some(3))], 0))
        .await
        .unwrap_err();
    assert!(matches!(e, CheckError::BadRequest(ref m) if m.starts_with("descriptors[1].cost: 3 is more than rule \"d.tenant\" allows (2)")), "{e:?}");
    let e = s
        .should_rate_limit(&req("d", vec![desc(&[("tenant", "y")], Some(2)), desc(&[("tenant", "y")], Some(1))], 0))
        .await
        .unwrap_err();
    assert!(matches!(e, CheckError::BadRequest(ref m) if m.contains("the descriptors reaching one key of rule \"d.tenant\" cost 3 together")), "{e:?}");
    let e = s
        .should_rate_limit(&req("d", vec![RateLimitDescriptor { limit: Some(Default::default()), ..desc(&[("user", "a")], None) }], 0))
        .await
        .unwrap_err();
    assert!(matches!(e, CheckError::BadRequest(ref m) if m.starts_with("descriptors[0].limit")), "{e:?}");
}

#[tokio::test]
async fn a_native_policy_takes_one_cost_for_its_counted_descriptors() {
    let s = native("[[rules]]\nname = \"per-user\"\nkey = \"user:{user}\"\nlimit = 5\nwindow = \"1m\"\n");
    let e = s
        .should_rate_limit(&req("web", vec![desc(&[("user", "u")], Some(2)), desc(&[("tenant", "t")], Some(3))], 0))
        .await
        .unwrap_err();
    assert!(matches!(e, CheckError::BadRequest(ref m) if m.starts_with("descriptors[1].hits_addend: 3 differs")), "{e:?}");
    let e = s
        .should_rate_limit(&req("web", vec![desc(&[("user", "a")], None), desc(&[("user", "b")], None)], 0))
        .await
        .unwrap_err();
    assert!(matches!(e, CheckError::BadRequest(ref m) if m.contains("\"user\" is given another value")), "{e:?}");
}

#[tokio::test]
async fn native_policies_take_entries_as_attributes() {
    let s = native("[[rules]]\nname = \"per-user\"\nkey = \"user:{user}\"\nmatch = { domain = \"web\" }\nlimit = 1\nwindow = \"1m\"\n");
    let one = || req("web", vec![desc(&[("user", "u")], None), desc(&[("other", "x")], None)], 0);
    let r = s.should_rate_limit(&one()).await.unwrap();
    assert_eq!(r.overall_code, code::OK);
    assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().name, "per-user");
    assert!(r.statuses[1].current_limit.is_none());
    assert_eq!(s.should_rate_limit(&one()).await.unwrap().overall_code, code::OVER_LIMIT);
    assert_eq!(s.should_rate_limit(&req("api", vec![desc(&[("user", "u")], None)], 0)).await.unwrap().overall_code, code::OK);
}
