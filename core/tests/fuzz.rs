//! Property tests (fuzzing) of the policy parser and key rendering: no input
//! may panic, every error is typed, every key is bounded and unique.
//!
//! The test suite runs a few thousand cases; `make fuzz` runs a million
//! (`PROPTEST_CASES=1000000 cargo test --release -p throttlegate --test fuzz`).
//! The seeds in `tests/fuzz_seeds/` are always replayed first.

use std::collections::HashMap;

use proptest::prelude::*;
use throttlegate::{ErrorKind, KeyTemplate, Limiter, Policy, Rule, MAX_KEY_LEN};

fn cases(default: u32) -> ProptestConfig {
    let n = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    ProptestConfig { cases: n, failure_persistence: None, ..ProptestConfig::default() }
}

fn parse_never_panics(text: &str) {
    match Policy::from_str_any(text) {
        Ok(p) => assert!(!p.rules().is_empty()),
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::InvalidPolicy, "{e}");
            assert!(!e.message().is_empty());
        }
    }
}

#[test]
fn seeds() {
    let seeds = include_str!("fuzz_seeds/policies.txt");
    for line in seeds.lines() {
        parse_never_panics(line);
    }
    parse_never_panics(seeds);
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<u64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map(serde_json::Value::Number).unwrap_or_default()),
        prop_oneof![
            Just("1m".to_string()),
            Just("token_bucket".to_string()),
            Just("sliding_window_log".to_string()),
            Just("sliding_window".to_string()),
            Just("fixed_window".to_string()),
            Just("quota".to_string()),
            Just("month".to_string()),
            Just("+02:00".to_string()),
            Just("-12:00".to_string()),
            Just("ip:{ip}".to_string()),
            Just("deny".to_string()),
            ".{0,12}",
        ]
        .prop_map(serde_json::Value::from),
    ];
    let field = prop_oneof![
        Just("name"), Just("key"), Just("algorithm"), Just("limit"), Just("window"),
        Just("capacity"), Just("refill_rate"), Just("precision"), Just("period"), Just("utc_offset"),
        Just("match"), Just("shadow"),
        Just("on_backend_error"), Just("rules"), Just("prefix"), Just("timeout"), Just("x"),
    ];
    leaf.prop_recursive(4, 48, 8, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
            prop::collection::vec((field.clone(), inner), 0..8).prop_map(|kv| {
                serde_json::Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
            }),
        ]
    })
}

proptest! {
    #![proptest_config(cases(2000))]

    #[test]
    fn any_text_is_a_policy_or_a_typed_error(text in ".{0,200}") {
        parse_never_panics(&text);
    }

    #[test]
    fn any_value_tree_is_a_policy_or_a_typed_error(v in json_value()) {
        parse_never_panics(&v.to_string());
        let _ = Policy::from_value(&serde_json::json!({ "rules": [v] }));
    }

    #[test]
    fn any_template_parses_or_errs(t in "[a-z{}:#% ]{0,24}") {
        let _ = KeyTemplate::parse(&t);
    }

    #[test]
    fn keys_are_bounded_and_never_collide(
        a1 in any::<String>(), b1 in any::<String>(),
        a2 in any::<String>(), b2 in any::<String>(),
        long in 0usize..3,
    ) {
        let policy = Policy::new(vec![
            Rule::sliding_window_log("pair", "{a}:{b}", 5, std::time::Duration::from_secs(1)),
            Rule::token_bucket("tagged", "{{t:{a}}}:{b}", 5, 1.0),
        ]).unwrap();
        let l = Limiter::in_memory(policy);
        let pad = "p".repeat([0, 100, 5000][long]);
        let (a1, a2) = (format!("{a1}{pad}"), format!("{a2}{pad}"));
        let k1 = l.keys(&HashMap::from([("a", a1.as_str()), ("b", b1.as_str())]));
        let k2 = l.keys(&HashMap::from([("a", a2.as_str()), ("b", b2.as_str())]));
        for k in k1.iter().chain(&k2) {
            prop_assert!(k.len() <= MAX_KEY_LEN, "{} bytes", k.len());
            prop_assert!(k.chars().all(|c| c.is_ascii_graphic()), "{:?}", k);
        }
        prop_assert_eq!(k1 == k2, (&a1, &b1) == (&a2, &b2));
    }
}
