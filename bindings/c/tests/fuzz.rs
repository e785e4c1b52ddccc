//! Random inputs at the C entry points, called exactly as C calls them:
//! NUL-terminated byte strings (any bytes, invalid UTF-8 included), file
//! names, attribute arrays with NULL names and values, any cost, any
//! option value, and NULL in every pointer parameter. Every call must return
//! a result code its documentation lists (never `TG_INTERNAL`, which is a
//! caught panic), leave its outputs untouched on failure, set the thread's
//! message exactly when it fails, and release everything it made.
//!
//! Policy texts are mostly byte-level mutations of the seeds in
//! `tests/fuzz-seeds/`, so the cases reach past the parser into limiters,
//! checks and decisions. Each property runs a few thousand cases; set
//! `PROPTEST_CASES` for more (e.g. `PROPTEST_CASES=1000000`) and
//! `PROPTEST_RNG_SEED` to replay a run.
//!
//! Leaks: a counting global allocator measures the bytes alive before and
//! after each property's cases (after a warm-up that starts the runtime);
//! the growth must stay below a bound far smaller than one leaked object
//! per case.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ffi::{c_char, CStr};
use std::path::PathBuf;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicIsize, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use throttlegate_c::*;

/// Counts the bytes currently allocated by the whole test process.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        System.dealloc(p, layout);
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let q = System.realloc(p, layout, new_size);
        if !q.is_null() {
            LIVE.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        }
        q
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Growth of live bytes allowed over one property's cases: room for the
/// thread's last message and allocator noise, far below one leaked policy,
/// decision or message per case at the default case count.
const LEAK_SLACK: isize = 16 * 1024;

/// How far the limiter sessions got: limiters built, decisions inspected.
static LIMITERS: AtomicU64 = AtomicU64::new(0);
static DECISIONS: AtomicU64 = AtomicU64::new(0);

/// Tests run one at a time: the allocation count is process-wide (a panic
/// elsewhere, for one, caches debug information for its backtrace).
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000)
}

/// Run `test` on `cases()` values of `strategy`, after a warm-up, and fail
/// when live memory grew by more than [`LEAK_SLACK`].
fn run<S: Strategy>(name: &str, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>) {
    let config = |cases| Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    TestRunner::new(config(64))
        .run(&strategy, &test)
        .unwrap_or_else(|e| panic!("{name} (warm-up): {e}"));
    let cases = cases();
    let before = LIVE.load(Ordering::SeqCst);
    TestRunner::new(config(cases))
        .run(&strategy, &test)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let grown = LIVE.load(Ordering::SeqCst) - before;
    assert!(
        grown < LEAK_SLACK,
        "{name}: {grown} bytes more are allocated after {cases} cases than before: a leak"
    );
    println!("{name}: {cases} cases, live memory {grown:+} bytes");
}

// ---- inputs ----

fn seeds() -> &'static [(String, Vec<u8>)] {
    static SEEDS: OnceLock<Vec<(String, Vec<u8>)>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-seeds");
        let mut seeds: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
            .expect("tests/fuzz-seeds")
            .map(|e| {
                let path = e.expect("tests/fuzz-seeds entry").path();
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                (name, std::fs::read(&path).expect("read a seed"))
            })
            .collect();
        seeds.sort();
        assert!(seeds.len() >= 3, "tests/fuzz-seeds holds the seed inputs");
        seeds
    })
}

/// The seeds that are valid policies (the start of every limiter case).
fn valid_seeds() -> &'static [Vec<u8>] {
    static VALID: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    VALID.get_or_init(|| {
        let valid: Vec<Vec<u8>> = seeds()
            .iter()
            .filter(|(_, text)| with_policy(text, |_| ()).is_some())
            .map(|(_, text)| text.clone())
            .collect();
        assert!(valid.len() >= 2, "at least two seeds must be valid policies");
        valid
    })
}

/// A NUL-terminated copy of `bytes`; C reads it up to its first NUL.
fn c(bytes: &[u8]) -> Vec<u8> {
    let mut v = bytes.to_vec();
    v.push(0);
    v
}

fn c_ptr(s: &Option<Vec<u8>>) -> *const c_char {
    s.as_ref().map_or(ptr::null(), |v| v.as_ptr().cast())
}

/// What C sees of a NUL-terminated buffer: the bytes before the first NUL.
fn seen(s: &[u8]) -> &[u8] {
    &s[..s.iter().position(|&b| b == 0).unwrap_or(s.len())]
}

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..max)
}

#[derive(Debug, Clone)]
enum Edit {
    Set(usize, u8),
    Insert(usize, u8),
    Remove(usize),
    Truncate(usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        4 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Set(i, b)),
        3 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Insert(i, b)),
        3 => any::<usize>().prop_map(Edit::Remove),
        1 => any::<usize>().prop_map(Edit::Truncate),
    ]
}

fn apply(mut text: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for e in edits {
        let n = text.len();
        match *e {
            Edit::Set(i, b) if n > 0 => text[i % n] = b,
            Edit::Insert(i, b) => text.insert(i % (n + 1), b),
            Edit::Remove(i) if n > 0 => {
                text.remove(i % n);
            }
            Edit::Truncate(i) => text.truncate(i % (n + 1)),
            _ => {}
        }
    }
    text
}

/// Policy text: random bytes, a seed, or (mostly) a mutated seed.
fn policy_text() -> impl Strategy<Value = Vec<u8>> {
    let n = seeds().len();
    prop_oneof![
        2 => bytes(256),
        1 => (0..n).prop_map(|i| seeds()[i].1.clone()),
        6 => (0..n, prop::collection::vec(edit(), 1..6)).prop_map(|(i, e)| apply(seeds()[i].1.clone(), &e)),
    ]
}

/// A valid seed policy with a few edits that may or may not break it.
fn limiter_policy() -> impl Strategy<Value = Vec<u8>> {
    let n = valid_seeds().len();
    prop_oneof![
        3 => (0..n).prop_map(|i| valid_seeds()[i].clone()),
        1 => (0..n, prop::collection::vec(edit(), 1..3)).prop_map(|(i, e)| apply(valid_seeds()[i].clone(), &e)),
    ]
}

fn maybe<T: std::fmt::Debug>(s: impl Strategy<Value = T>) -> impl Strategy<Value = Option<T>> {
    prop::option::weighted(0.95, s)
}

fn name() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        12 => prop::sample::select(vec!["ip", "api_key", "route", "method", "user", "tenant"])
            .prop_map(|s| s.as_bytes().to_vec()),
        2 => "\\PC{0,12}".prop_map(|s| s.into_bytes()),
        1 => bytes(12),
    ]
}

fn value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        10 => prop::sample::select(vec!["1.2.3.4", "k1", "/login", "POST", "DELETE", "u", ""])
            .prop_map(|s| s.as_bytes().to_vec()),
        3 => "\\PC{0,40}".prop_map(|s| s.into_bytes()),
        1 => bytes(40),
    ]
}

#[derive(Debug, Clone)]
enum Attrs {
    /// A NULL array with this (non-zero) length.
    Null(usize),
    /// Pairs; `None` is a NULL pointer.
    List(Vec<Pair>),
}

/// One attribute as C strings (NUL-terminated); `None` is a NULL pointer.
type Pair = (Option<Vec<u8>>, Option<Vec<u8>>);

fn attrs() -> impl Strategy<Value = Attrs> {
    prop_oneof![
        1 => (1usize..4).prop_map(Attrs::Null),
        30 => prop::collection::vec((prop::option::weighted(0.99, name()), prop::option::weighted(0.99, value())), 0..5)
            .prop_map(|pairs| Attrs::List(pairs.into_iter().map(|(n, v)| (n.map(|n| c(&n)), v.map(|v| c(&v)))).collect())),
    ]
}

impl Attrs {
    /// The array C passes, and its length.
    fn raw(&self) -> (Vec<tg_attribute>, usize) {
        match self {
            Attrs::Null(n) => (Vec::new(), *n),
            Attrs::List(pairs) => {
                let v: Vec<tg_attribute> = pairs
                    .iter()
                    .map(|(n, v)| tg_attribute {
                        name: c_ptr(n),
                        value: c_ptr(v),
                    })
                    .collect();
                let n = v.len();
                (v, n)
            }
        }
    }

    /// The code the binding's conversion must give, before the core sees anything.
    fn verdict(&self) -> Option<tg_result> {
        let pairs = match self {
            Attrs::Null(_) => return Some(tg_result::TG_NULL_POINTER),
            Attrs::List(pairs) => pairs,
        };
        let mut names: Vec<&[u8]> = Vec::new();
        for (n, v) in pairs {
            let Some(n) = n else {
                return Some(tg_result::TG_NULL_POINTER);
            };
            if std::str::from_utf8(seen(n)).is_err() {
                return Some(tg_result::TG_INVALID_UTF8);
            }
            let Some(v) = v else {
                return Some(tg_result::TG_NULL_POINTER);
            };
            if std::str::from_utf8(seen(v)).is_err() {
                return Some(tg_result::TG_INVALID_UTF8);
            }
            if names.contains(&seen(n)) {
                return Some(tg_result::TG_INVALID_ARGUMENT);
            }
            names.push(seen(n));
        }
        None
    }
}

fn cost() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => Just(1u64),
        1 => Just(0u64),
        4 => 1u64..8,
        1 => Just(u64::MAX),
        1 => any::<u64>(),
    ]
}

#[derive(Debug, Clone)]
enum Url {
    Memory,
    /// One of the schemes followed by random bytes, or random bytes alone.
    Other(&'static str, Vec<u8>),
    Null,
}

fn url() -> impl Strategy<Value = Url> {
    let schemes = vec![
        "",
        "redis://",
        "rediss://",
        "redis+unix://",
        "redis+cluster://",
        "rediss+cluster://",
        "memory://",
        "ftp://",
    ];
    prop_oneof![
        8 => Just(Url::Memory),
        3 => (prop::sample::select(schemes), bytes(24)).prop_map(|(s, b)| Url::Other(s, b)),
        1 => Just(Url::Null),
    ]
}

impl Url {
    fn text(&self) -> Option<Vec<u8>> {
        match self {
            Url::Memory => Some(c(b"memory://")),
            Url::Other(scheme, rest) => Some(c(&[scheme.as_bytes(), rest].concat())),
            Url::Null => None,
        }
    }
}

#[derive(Debug, Clone)]
enum Opt {
    Url(Url),
    Timeout(u64),
    Mode(u32),
    Prefix(Option<Vec<u8>>),
    Secret(Option<Vec<u8>>),
    RootCert(Option<Vec<u8>>),
    ClientCert(Option<Vec<u8>>, Option<Vec<u8>>),
    ManualClock(i64),
    SystemClock,
    /// The setter called with NULL options.
    NullOptions,
}

fn opt() -> impl Strategy<Value = Opt> {
    prop_oneof![
        2 => url().prop_map(Opt::Url),
        2 => prop_oneof![1 => Just(0u64), 1 => 1u64..100, 4 => Just(60_000u64), 1 => any::<u64>()].prop_map(Opt::Timeout),
        2 => prop_oneof![0u32..4, any::<u32>()].prop_map(Opt::Mode),
        2 => maybe(prop_oneof![3 => Just(b"fz:".to_vec()), 1 => bytes(16)]).prop_map(Opt::Prefix),
        1 => maybe(bytes(32)).prop_map(Opt::Secret),
        1 => maybe(bytes(64)).prop_map(Opt::RootCert),
        1 => (maybe(bytes(64)), maybe(bytes(64))).prop_map(|(c, k)| Opt::ClientCert(c, k)),
        2 => prop_oneof![0i64..2_000_000_000_000_000, any::<i64>()].prop_map(Opt::ManualClock),
        1 => Just(Opt::SystemClock),
        1 => Just(Opt::NullOptions),
    ]
}

#[derive(Debug, Clone)]
enum Call {
    Check(Attrs, u64),
    CheckWithId(Attrs, u64, Option<Vec<u8>>),
    Peek(Attrs, u64),
    Reset(Attrs),
    /// A check with a NULL output or a NULL limiter.
    CheckNull {
        out: bool,
        limiter: bool,
    },
    Ping,
    Stats,
    Close,
    Advance(u64),
    SetUs(i64),
}

fn call_id() -> impl Strategy<Value = Option<Vec<u8>>> {
    maybe(prop_oneof![
        2 => "[A-Za-z0-9_-]{1,64}".prop_map(|s| c(s.as_bytes())),
        1 => bytes(80).prop_map(|b| c(&b)),
    ])
}

fn call() -> impl Strategy<Value = Call> {
    prop_oneof![
        8 => (attrs(), cost()).prop_map(|(a, n)| Call::Check(a, n)),
        3 => (attrs(), cost(), call_id()).prop_map(|(a, n, id)| Call::CheckWithId(a, n, id)),
        3 => (attrs(), cost()).prop_map(|(a, n)| Call::Peek(a, n)),
        2 => attrs().prop_map(Call::Reset),
        1 => (any::<bool>(), any::<bool>()).prop_map(|(out, limiter)| Call::CheckNull { out, limiter }),
        1 => Just(Call::Ping),
        1 => Just(Call::Stats),
        1 => Just(Call::Close),
        2 => prop_oneof![0u64..120_000, any::<u64>()].prop_map(Call::Advance),
        1 => any::<i64>().prop_map(Call::SetUs),
    ]
}

#[derive(Debug, Clone)]
struct Session {
    policy: Vec<u8>,
    /// Build with `tg_limiter_new(url)` instead of options.
    plain: Option<Url>,
    options: Vec<Opt>,
    calls: Vec<Call>,
    index: usize,
    code: u32,
}

fn session() -> impl Strategy<Value = Session> {
    (
        limiter_policy(),
        prop::option::weighted(0.2, url()),
        prop::collection::vec(opt(), 0..5),
        prop::collection::vec(call(), 0..16),
        prop_oneof![0usize..6, any::<usize>()],
        prop_oneof![0u32..12, 98u32..102, any::<u32>()],
    )
        .prop_map(|(policy, plain, options, calls, index, code)| Session {
            policy,
            plain,
            options,
            calls,
            index,
            code,
        })
}

// ---- checks ----

use tg_result::*;

fn message() -> Vec<u8> {
    let p = tg_last_error_message();
    assert!(!p.is_null());
    unsafe { CStr::from_ptr(p) }.to_bytes().to_vec()
}

/// `rc` is one of `allowed`, and the thread's message is empty exactly on success.
fn documented(call: &str, rc: tg_result, allowed: &[tg_result]) -> Result<(), TestCaseError> {
    let msg = message();
    let text = String::from_utf8_lossy(&msg);
    prop_assert!(
        allowed.contains(&rc),
        "{}: {:?} is not among {:?} ({})",
        call,
        rc,
        allowed,
        text
    );
    if rc == TG_OK {
        prop_assert!(msg.is_empty(), "{}: success with a message: {}", call, text);
    } else {
        prop_assert!(!msg.is_empty(), "{}: {:?} without a message", call, rc);
        prop_assert!(std::str::from_utf8(&msg).is_ok(), "{}: message is not UTF-8", call);
    }
    Ok(())
}

/// A non-NULL pointer no call returns: an output that must stay untouched.
fn sentinel<T>() -> *mut T {
    NonNull::dangling().as_ptr()
}

fn c_string_ok(p: *const c_char, what: &str) -> Result<(), TestCaseError> {
    prop_assert!(!p.is_null(), "{} is NULL", what);
    let s = unsafe { CStr::from_ptr(p) };
    prop_assert!(std::str::from_utf8(s.to_bytes()).is_ok(), "{} is not UTF-8", what);
    Ok(())
}

/// Parse `text` as C would pass it, run `f` on the policy, free it.
fn with_policy<R>(text: &[u8], f: impl FnOnce(*const tg_policy) -> R) -> Option<R> {
    let text = c(text);
    let mut p: *mut tg_policy = ptr::null_mut();
    if unsafe { tg_policy_from_str(text.as_ptr().cast(), &mut p) } != TG_OK {
        return None;
    }
    let r = f(p);
    unsafe { tg_policy_free(p) };
    Some(r)
}

/// Every reader of a decision, at valid and invalid indexes, with NULL outputs.
fn inspect(d: *const tg_decision, index: usize) -> Result<(), TestCaseError> {
    unsafe {
        let mut info: tg_decision_info = std::mem::zeroed();
        let rc = tg_decision_get(d, &mut info);
        documented("tg_decision_get", rc, &[TG_OK])?;
        prop_assert_eq!(tg_decision_allowed(d), info.allowed);
        if !info.rule.is_null() {
            c_string_ok(info.rule, "info.rule")?;
        }
        documented(
            "tg_decision_get(NULL out)",
            tg_decision_get(d, ptr::null_mut()),
            &[TG_NULL_POINTER],
        )?;
        for i in [0, info.result_count, index] {
            let mut r: tg_rule_result = std::mem::zeroed();
            let rc = tg_decision_result(d, i, &mut r);
            if i < info.result_count {
                documented("tg_decision_result", rc, &[TG_OK])?;
                c_string_ok(r.rule, "result.rule")?;
            } else {
                documented("tg_decision_result(out of range)", rc, &[TG_INVALID_ARGUMENT])?;
            }
        }
        for legacy in [false, true] {
            let mut count = usize::MAX;
            documented(
                "tg_decision_header_count",
                tg_decision_header_count(d, legacy, &mut count),
                &[TG_OK],
            )?;
            for i in [0, count, index] {
                let (mut name, mut value) = (
                    sentinel::<c_char>() as *const c_char,
                    sentinel::<c_char>() as *const c_char,
                );
                let rc = tg_decision_header(d, legacy, i, &mut name, &mut value);
                if i < count {
                    documented("tg_decision_header", rc, &[TG_OK])?;
                    c_string_ok(name, "header name")?;
                    c_string_ok(value, "header value")?;
                } else {
                    documented("tg_decision_header(out of range)", rc, &[TG_INVALID_ARGUMENT])?;
                    let untouched = sentinel::<c_char>() as *const c_char;
                    prop_assert!(
                        ptr::eq(name, untouched) && ptr::eq(value, untouched),
                        "header written on failure"
                    );
                }
            }
            let rc = tg_decision_header(d, legacy, 0, ptr::null_mut(), ptr::null_mut());
            documented("tg_decision_header(NULL)", rc, &[TG_NULL_POINTER])?;
        }
        let mut body = ptr::null();
        documented(
            "tg_decision_problem_json",
            tg_decision_problem_json(d, &mut body),
            &[TG_OK],
        )?;
        // A body for a denial, NULL when allowed.
        if info.allowed {
            prop_assert!(body.is_null(), "problem json of an allowed decision");
        } else {
            c_string_ok(body, "problem json")?;
        }
    }
    Ok(())
}

/// Codes a check, peek or reset may return (their documentation).
const DECIDE: &[tg_result] = &[
    TG_OK,
    TG_NULL_POINTER,
    TG_INVALID_UTF8,
    TG_INVALID_ARGUMENT,
    TG_CLOSED,
    TG_BACKEND_UNAVAILABLE,
    TG_TIMEOUT,
    TG_BACKEND,
];

/// One decision call; the decision it makes is inspected and freed.
fn decide(
    what: &str,
    attrs: &Attrs,
    closed: bool,
    index: usize,
    f: impl FnOnce(*const tg_attribute, usize, *mut *mut tg_decision) -> tg_result,
) -> Result<(), TestCaseError> {
    let (raw, len) = attrs.raw();
    let arr = if matches!(attrs, Attrs::Null(_)) {
        ptr::null()
    } else {
        raw.as_ptr()
    };
    let mut d: *mut tg_decision = sentinel();
    let rc = f(arr, len, &mut d);
    documented(what, rc, DECIDE)?;
    if let Some(want) = attrs.verdict() {
        prop_assert_eq!(rc, want, "{}: attributes {:?}", what, attrs);
    }
    if closed {
        prop_assert!(rc != TG_OK, "{} succeeded on a closed limiter", what);
    }
    if rc == TG_OK {
        prop_assert!(!d.is_null() && d != sentinel());
        DECISIONS.fetch_add(1, Ordering::Relaxed);
        let r = inspect(d, index);
        unsafe { tg_decision_free(d) };
        r?;
    } else {
        prop_assert!(d == sentinel(), "{}: output written on failure", what);
    }
    Ok(())
}

/// Apply one options setter; returns the clock to keep (a manual one).
fn set_option(
    o: *mut tg_limiter_options,
    opt: &Opt,
    clock: &mut *mut tg_clock,
    memory: &mut bool,
) -> Result<(), TestCaseError> {
    unsafe {
        match opt {
            Opt::Url(u) => {
                let text = u.text();
                let rc = tg_limiter_options_set_url(o, c_ptr(&text));
                documented("set_url", rc, &[TG_OK, TG_NULL_POINTER, TG_INVALID_UTF8])?;
                if rc == TG_OK {
                    *memory = matches!(u, Url::Memory);
                }
            }
            Opt::Timeout(ms) => documented("set_timeout_ms", tg_limiter_options_set_timeout_ms(o, *ms), &[TG_OK])?,
            Opt::Mode(m) => {
                let rc = tg_limiter_options_set_on_backend_error(o, *m);
                documented("set_on_backend_error", rc, &[TG_OK, TG_INVALID_ARGUMENT])?;
                prop_assert_eq!(rc == TG_OK, *m <= 2);
            }
            Opt::Prefix(p) => {
                let p = p.as_ref().map(|p| c(p));
                let rc = tg_limiter_options_set_prefix(o, c_ptr(&p));
                documented("set_prefix", rc, &[TG_OK, TG_NULL_POINTER, TG_INVALID_UTF8])?;
            }
            Opt::Secret(s) => {
                let (p, n) = s.as_ref().map_or((ptr::null(), 1), |s| (s.as_ptr(), s.len()));
                let rc = tg_limiter_options_set_key_secret(o, p, n);
                documented("set_key_secret", rc, &[TG_OK, TG_NULL_POINTER, TG_INVALID_ARGUMENT])?;
                prop_assert_eq!(rc == TG_OK, s.as_ref().is_some_and(|s| !s.is_empty()));
            }
            Opt::RootCert(pem) => {
                let (p, n) = pem.as_ref().map_or((ptr::null(), 1), |s| (s.as_ptr(), s.len()));
                let rc = tg_limiter_options_set_tls_root_cert(o, p, n);
                documented("set_tls_root_cert", rc, &[TG_OK, TG_NULL_POINTER, TG_INVALID_ARGUMENT])?;
                prop_assert_eq!(rc == TG_OK, pem.as_ref().is_some_and(|s| !s.is_empty()));
            }
            Opt::ClientCert(cert, key) => {
                let (cp, cn) = cert.as_ref().map_or((ptr::null(), 1), |s| (s.as_ptr(), s.len()));
                let (kp, kn) = key.as_ref().map_or((ptr::null(), 1), |s| (s.as_ptr(), s.len()));
                let rc = tg_limiter_options_set_tls_client_cert(o, cp, cn, kp, kn);
                documented(
                    "set_tls_client_cert",
                    rc,
                    &[TG_OK, TG_NULL_POINTER, TG_INVALID_ARGUMENT],
                )?;
                let good = |b: &Option<Vec<u8>>| b.as_ref().is_some_and(|s| !s.is_empty());
                prop_assert_eq!(rc == TG_OK, good(cert) && good(key));
            }
            Opt::ManualClock(start) => {
                let mut made: *mut tg_clock = sentinel();
                let rc = tg_clock_manual_new(*start, &mut made);
                documented("tg_clock_manual_new", rc, &[TG_OK, TG_INVALID_ARGUMENT])?;
                prop_assert_eq!(rc == TG_OK, *start >= 0);
                if rc == TG_OK {
                    documented("set_clock", tg_limiter_options_set_clock(o, made), &[TG_OK])?;
                    tg_clock_free(*clock);
                    *clock = made;
                } else {
                    prop_assert!(made == sentinel());
                }
            }
            Opt::SystemClock => {
                let mut made: *mut tg_clock = ptr::null_mut();
                documented("tg_clock_system_new", tg_clock_system_new(&mut made), &[TG_OK])?;
                documented("set_clock", tg_limiter_options_set_clock(o, made), &[TG_OK])?;
                // The options keep their own share: free it at once.
                tg_clock_free(made);
            }
            Opt::NullOptions => {
                let one = c"x".as_ptr().cast::<u8>();
                for rc in [
                    tg_limiter_options_set_url(ptr::null_mut(), one.cast()),
                    tg_limiter_options_set_timeout_ms(ptr::null_mut(), 1),
                    tg_limiter_options_set_on_backend_error(ptr::null_mut(), 0),
                    tg_limiter_options_set_prefix(ptr::null_mut(), one.cast()),
                    tg_limiter_options_set_key_secret(ptr::null_mut(), one, 1),
                    tg_limiter_options_set_tls_root_cert(ptr::null_mut(), one, 1),
                    tg_limiter_options_set_tls_client_cert(ptr::null_mut(), one, 1, one, 1),
                    tg_limiter_options_set_clock(o, ptr::null()),
                ] {
                    documented("options setter with NULL", rc, &[TG_NULL_POINTER])?;
                }
            }
        }
    }
    Ok(())
}

fn run_session(s: Session) -> Result<(), TestCaseError> {
    unsafe {
        // Static answers first: never NULL, never failing.
        c_string_ok(tg_version(), "tg_version")?;
        c_string_ok(tg_result_name(s.code), "tg_result_name")?;
        prop_assert!(!tg_decision_allowed(ptr::null()));
        tg_policy_free(ptr::null_mut());
        tg_limiter_free(ptr::null_mut());
        tg_limiter_options_free(ptr::null_mut());
        tg_decision_free(ptr::null_mut());
        tg_clock_free(ptr::null_mut());

        let text = c(&s.policy);
        let mut policy: *mut tg_policy = ptr::null_mut();
        let rc = tg_policy_from_str(text.as_ptr().cast(), &mut policy);
        documented("tg_policy_from_str", rc, &[TG_OK, TG_INVALID_UTF8, TG_INVALID_POLICY])?;
        if rc != TG_OK {
            return Ok(());
        }
        let mut clock: *mut tg_clock = ptr::null_mut();
        let mut memory = true;
        let mut limiter: *mut tg_limiter = sentinel();
        let result = (|| {
            let rc = match &s.plain {
                Some(u) => {
                    memory = matches!(u, Url::Memory);
                    let url = u.text();
                    let rc = tg_limiter_new(policy, c_ptr(&url), &mut limiter);
                    documented(
                        "tg_limiter_new",
                        rc,
                        &[TG_OK, TG_NULL_POINTER, TG_INVALID_UTF8, TG_INVALID_ARGUMENT],
                    )?;
                    rc
                }
                None => {
                    let mut o = ptr::null_mut();
                    documented("tg_limiter_options_new", tg_limiter_options_new(&mut o), &[TG_OK])?;
                    let mut set = Ok(());
                    for opt in &s.options {
                        set = set_option(o, opt, &mut clock, &mut memory);
                        if set.is_err() {
                            break;
                        }
                    }
                    let rc = if set.is_ok() {
                        tg_limiter_new_with_options(policy, o, &mut limiter)
                    } else {
                        TG_OK
                    };
                    tg_limiter_options_free(o);
                    set?;
                    documented(
                        "tg_limiter_new_with_options",
                        rc,
                        &[TG_OK, TG_NULL_POINTER, TG_INVALID_ARGUMENT],
                    )?;
                    rc
                }
            };
            if rc != TG_OK {
                prop_assert!(limiter == sentinel(), "limiter written on failure");
                limiter = ptr::null_mut();
                return Ok(());
            }
            prop_assert!(!limiter.is_null() && limiter != sentinel());
            LIMITERS.fetch_add(1, Ordering::Relaxed);
            // Only the embedded backend is called: any other URL here is
            // random text, which must not turn into network traffic.
            let mut closed = false;
            for call in &s.calls {
                let l = limiter as *const tg_limiter;
                match call {
                    Call::Check(a, n) if memory => decide("tg_limiter_check", a, closed, s.index, |p, len, out| {
                        tg_limiter_check(l, p, len, *n, out)
                    })?,
                    Call::CheckWithId(a, n, id) if memory => {
                        decide("tg_limiter_check_with_call_id", a, closed, s.index, |p, len, out| {
                            tg_limiter_check_with_call_id(l, p, len, *n, c_ptr(id), out)
                        })?
                    }
                    Call::Peek(a, n) if memory => decide("tg_limiter_peek", a, closed, s.index, |p, len, out| {
                        tg_limiter_peek(l, p, len, *n, out)
                    })?,
                    Call::Reset(a) if memory => {
                        let (raw, len) = a.raw();
                        let arr = if matches!(a, Attrs::Null(_)) {
                            ptr::null()
                        } else {
                            raw.as_ptr()
                        };
                        let mut deleted = u64::MAX;
                        let rc = tg_limiter_reset(l, arr, len, &mut deleted);
                        documented("tg_limiter_reset", rc, DECIDE)?;
                        if let Some(want) = a.verdict() {
                            prop_assert_eq!(rc, want);
                        }
                        if rc == TG_OK {
                            prop_assert!(!closed && deleted != u64::MAX);
                        } else {
                            prop_assert_eq!(deleted, u64::MAX);
                        }
                    }
                    Call::CheckNull {
                        out,
                        limiter: null_limiter,
                    } => {
                        let a = [tg_attribute {
                            name: c"ip".as_ptr(),
                            value: c"1.2.3.4".as_ptr(),
                        }];
                        let mut d: *mut tg_decision = sentinel();
                        let lp = if *null_limiter { ptr::null() } else { l };
                        let op: *mut *mut tg_decision = if *out { ptr::null_mut() } else { &mut d as *mut _ };
                        if lp.is_null() || op.is_null() {
                            let rc = tg_limiter_check(lp, a.as_ptr(), 1, 1, op);
                            documented("tg_limiter_check(NULL)", rc, &[TG_NULL_POINTER])?;
                            prop_assert!(d == sentinel());
                        }
                    }
                    Call::Ping if memory => {
                        let rc = tg_limiter_ping(l);
                        documented(
                            "tg_limiter_ping",
                            rc,
                            &[TG_OK, TG_CLOSED, TG_BACKEND_UNAVAILABLE, TG_TIMEOUT, TG_BACKEND],
                        )?;
                        prop_assert_eq!(rc == TG_CLOSED, closed);
                    }
                    Call::Stats => {
                        let mut st = tg_stats::default();
                        documented("tg_limiter_stats", tg_limiter_stats(l, &mut st), &[TG_OK])?;
                        prop_assert!(st.allowed + st.denied <= st.calls);
                        documented(
                            "tg_limiter_stats(NULL)",
                            tg_limiter_stats(l, ptr::null_mut()),
                            &[TG_NULL_POINTER],
                        )?;
                    }
                    Call::Close => {
                        documented("tg_limiter_close", tg_limiter_close(l), &[TG_OK])?;
                        closed = true;
                    }
                    Call::Advance(ms) if !clock.is_null() => {
                        let mut before = 0i64;
                        documented("tg_clock_now_us", tg_clock_now_us(clock, &mut before), &[TG_OK])?;
                        let rc = tg_clock_advance_ms(clock, *ms);
                        documented("tg_clock_advance_ms", rc, &[TG_OK, TG_INVALID_ARGUMENT])?;
                        let fits = ms
                            .checked_mul(1000)
                            .and_then(|us| i64::try_from(us).ok())
                            .and_then(|us| before.checked_add(us))
                            .is_some();
                        prop_assert_eq!(rc == TG_OK, fits, "advance {} ms from {} us", ms, before);
                    }
                    Call::SetUs(us) if !clock.is_null() => {
                        let rc = tg_clock_set_us(clock, *us);
                        documented("tg_clock_set_us", rc, &[TG_OK, TG_INVALID_ARGUMENT])?;
                        prop_assert_eq!(rc == TG_OK, *us >= 0);
                    }
                    _ => {}
                }
            }
            Ok(())
        })();
        if !limiter.is_null() && limiter != sentinel() {
            tg_limiter_free(limiter);
        }
        tg_clock_free(clock);
        tg_policy_free(policy);
        result
    }
}

// ---- properties ----

#[test]
fn policy_text_from_random_bytes() {
    let _serial = serial();
    run(
        "tg_policy_from_str",
        (maybe(policy_text()), any::<bool>()),
        |(text, null_out)| {
            let text = text.map(|t| c(&t));
            let mut out: *mut tg_policy = sentinel();
            let out_ptr = if null_out { ptr::null_mut() } else { &mut out as *mut _ };
            let rc = unsafe { tg_policy_from_str(c_ptr(&text), out_ptr) };
            documented(
                "tg_policy_from_str",
                rc,
                &[TG_OK, TG_NULL_POINTER, TG_INVALID_UTF8, TG_INVALID_POLICY],
            )?;
            match &text {
                _ if null_out => prop_assert_eq!(rc, TG_NULL_POINTER),
                None => prop_assert_eq!(rc, TG_NULL_POINTER),
                Some(t) => prop_assert_eq!(rc == TG_INVALID_UTF8, std::str::from_utf8(seen(t)).is_err()),
            }
            if rc == TG_OK {
                prop_assert!(!out.is_null() && out != sentinel());
                let mut n = usize::MAX;
                let rc = unsafe { tg_policy_rule_count(out, &mut n) };
                unsafe { tg_policy_free(out) };
                documented("tg_policy_rule_count", rc, &[TG_OK])?;
                prop_assert!(n != usize::MAX);
            } else {
                prop_assert!(out == sentinel(), "policy written on failure");
            }
            Ok(())
        },
    );
}

#[derive(Debug, Clone)]
enum PathInput {
    /// Random bytes as a file name (almost never an existing file).
    Raw(Vec<u8>),
    /// A file written by the test with this content and extension.
    Written(Vec<u8>, &'static str),
    Null,
}

#[test]
fn policy_files_from_random_names_and_contents() {
    let _serial = serial();
    let dir = std::env::temp_dir().join(format!("throttlegate-c-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let counter = AtomicU64::new(0);
    let paths = prop_oneof![
        3 => bytes(48).prop_map(PathInput::Raw),
        6 => (policy_text(), prop::sample::select(vec![".toml", ".json", ".txt", ""])).prop_map(|(t, e)| PathInput::Written(t, e)),
        1 => Just(PathInput::Null),
    ];
    run("tg_policy_from_file", (paths, any::<bool>()), |(input, null_out)| {
        let path: Option<Vec<u8>> = match &input {
            PathInput::Raw(b) => Some(c(b)),
            PathInput::Written(content, ext) => {
                let p = dir.join(format!("case-{}{ext}", counter.fetch_add(1, Ordering::Relaxed)));
                std::fs::write(&p, content).expect("write a case file");
                Some(c(p.as_os_str().as_encoded_bytes()))
            }
            PathInput::Null => None,
        };
        let mut out: *mut tg_policy = sentinel();
        let out_ptr = if null_out { ptr::null_mut() } else { &mut out as *mut _ };
        let rc = unsafe { tg_policy_from_file(c_ptr(&path), out_ptr) };
        if let (PathInput::Written(..), Some(p)) = (&input, &path) {
            let _ = std::fs::remove_file(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(seen(p)));
        }
        documented(
            "tg_policy_from_file",
            rc,
            &[TG_OK, TG_NULL_POINTER, TG_IO, TG_INVALID_POLICY],
        )?;
        if null_out || path.is_none() {
            prop_assert_eq!(rc, TG_NULL_POINTER);
        }
        if let PathInput::Written(content, _) = &input {
            if !null_out && std::str::from_utf8(content).is_err() {
                prop_assert_eq!(rc, TG_INVALID_POLICY, "a file that is not UTF-8");
            }
            prop_assert!(rc != TG_IO || null_out, "a written file could not be read");
        }
        if rc == TG_OK {
            prop_assert!(!out.is_null() && out != sentinel());
            unsafe { tg_policy_free(out) };
        } else {
            prop_assert!(out == sentinel(), "policy written on failure");
        }
        Ok(())
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn limiters_checks_and_decisions_from_random_calls() {
    let _serial = serial();
    run("limiter sessions", session(), run_session);
    let (limiters, decisions) = (LIMITERS.load(Ordering::Relaxed), DECISIONS.load(Ordering::Relaxed));
    println!("limiter sessions: {limiters} limiters built, {decisions} decisions inspected");
    // Cases that never reach a decision would test the parser only.
    assert!(decisions > u64::from(cases()) / 2, "too few decisions: {decisions}");
}

/// Every committed seed, as text and as a file, gives a documented answer;
/// the valid ones make limiters that answer a check.
#[test]
fn every_seed_is_handled() {
    let _serial = serial();
    for (name, text) in seeds() {
        let t = c(text);
        let mut p: *mut tg_policy = ptr::null_mut();
        let rc = unsafe { tg_policy_from_str(t.as_ptr().cast(), &mut p) };
        let utf8 = std::str::from_utf8(text).is_ok();
        assert_eq!(rc == TG_INVALID_UTF8, !utf8, "{name}: {rc:?}");
        assert!(
            matches!(rc, TG_OK | TG_INVALID_UTF8 | TG_INVALID_POLICY),
            "{name}: {rc:?}"
        );
        unsafe { tg_policy_free(p) };
    }
    for text in valid_seeds() {
        let s = Session {
            policy: text.clone(),
            plain: Some(Url::Memory),
            options: Vec::new(),
            calls: vec![Call::Check(
                Attrs::List(vec![
                    (Some(c(b"ip")), Some(c(b"1.2.3.4"))),
                    (Some(c(b"api_key")), Some(c(b"k1"))),
                ]),
                1,
            )],
            index: 0,
            code: 0,
        };
        run_session(s).unwrap_or_else(|e| panic!("{e}"));
    }
}
