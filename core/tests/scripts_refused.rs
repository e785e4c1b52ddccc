//! A server that refuses scripts (an ACL denying `EVALSHA`/`EVAL`, the
//! commands renamed away) gives one typed error naming the cause and the
//! fix, at a strict start-up and at the first check, on every path.

use std::time::Duration;

use throttlegate::{CheckOptions, ErrorKind, FailureMode, Limiter, OutageCause, Policy, Rule};
use throttlegate_testkit::RedisServer;

fn policy() -> Policy {
    Policy::new(vec![Rule::sliding_window_log(
        "w",
        "ip:{ip}",
        10,
        Duration::from_secs(60),
    )])
    .unwrap()
}

fn ip() -> [(&'static str, String); 1] {
    [("ip", "203.0.113.9".to_string())]
}

fn build(url: &str, strict: bool) -> throttlegate::Result<Limiter> {
    Limiter::builder(policy())
        .url(url)
        .timeout(Duration::from_secs(2))
        .on_backend_error(FailureMode::Error)
        .strict(strict)
        .build()
}

/// The error's message names the cause and the fix (the ACL rule and the module).
fn assert_named(e: &throttlegate::Error, cause: &str) {
    assert_eq!(e.kind(), ErrorKind::Backend, "{e:?}");
    assert!(!e.is_temporary(), "{e:?}");
    let text = e.to_string();
    for part in [
        "redis refuses scripts",
        cause,
        "+evalsha +eval +script|load",
        "Lua module",
    ] {
        assert!(text.contains(part), "{part:?} not in {text}");
    }
}

#[test]
fn an_acl_denying_evalsha_and_eval_is_named_at_start_and_at_the_first_check() {
    let server = RedisServer::start();
    let acl = [
        "ACL", "SETUSER", "no-lua", "on", ">pw", "~*", "+@all", "-evalsha", "-eval",
    ];
    assert_eq!(server.command(&acl).unwrap(), "+OK");
    let url = format!("redis://no-lua:pw@127.0.0.1:{}", server.port());
    let e = build(&url, true).unwrap_err();
    assert_named(&e, "NOPERM");
    assert!(
        e.to_string().starts_with("strict: ") && e.to_string().contains("running the check script"),
        "{e}"
    );
    // Not strict: the first check says the same, on the async and blocking paths.
    let l = build(&url, false).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let e = rt.block_on(l.check(&ip(), 1)).unwrap_err();
    assert_named(&e, "NOPERM");
    assert_eq!(OutageCause::of(&e), Some(OutageCause::AuthFailed));
    let e = l
        .check_blocking(
            &ip(),
            &CheckOptions {
                cost: 1,
                call_id: None,
            },
        )
        .unwrap_err();
    assert_named(&e, "NOPERM");
    // Allowed again: the same limiter works from its next check.
    assert_eq!(
        server
            .command(&["ACL", "SETUSER", "no-lua", "+evalsha", "+eval"])
            .unwrap(),
        "+OK"
    );
    assert!(rt.block_on(l.check(&ip(), 1)).unwrap().allowed);
    assert!(build(&url, true).is_ok());
}

#[test]
fn renamed_away_script_commands_are_named() {
    let server = RedisServer::start_with(&[
        "--rename-command",
        "EVALSHA",
        "",
        "--rename-command",
        "EVAL",
        "",
    ]);
    let e = build(&server.url(), true).unwrap_err();
    assert_named(&e, "does not know EVALSHA/EVAL");
    let l = build(&server.url(), false).unwrap();
    let e = l
        .check_blocking(
            &ip(),
            &CheckOptions {
                cost: 1,
                call_id: None,
            },
        )
        .unwrap_err();
    assert_named(&e, "does not know EVALSHA/EVAL");
}

/// Valkey 9.1 with its Lua module unloaded (`MODULE UNLOAD lua`): the
/// server has no scripting engine. Runs on the valkey-server that
/// scripts/deps-valkey.sh installs (`make deps` does).
#[test]
fn valkey_without_its_lua_module_is_named() {
    let bin = std::env::var("THROTTLEGATE_VALKEY_SERVER")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../.valkey/bin/valkey-server").to_string());
    assert!(
        std::path::Path::new(&bin).exists(),
        "{bin} is missing: run scripts/deps-valkey.sh (make deps does) or set THROTTLEGATE_VALKEY_SERVER"
    );
    let server = RedisServer::start_bin(&bin, &["--enable-module-command", "yes"]);
    assert_eq!(server.command(&["MODULE", "UNLOAD", "lua"]).unwrap(), "+OK");
    let e = build(&server.url(), true).unwrap_err();
    assert_named(&e, "no Lua engine");
    let l = build(&server.url(), false).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let e = rt.block_on(l.check(&ip(), 1)).unwrap_err();
    assert_named(&e, "no Lua engine");
    let e = l.check_blocking(&ip(), &CheckOptions { cost: 1, call_id: None }).unwrap_err();
    assert_named(&e, "no Lua engine");
}
