//! The per-call entry points of `check` and `peek`, as plain Node-API
//! functions.
//!
//! A `#[napi]` method pays for napi-rs's general machinery on every call
//! (receiver unwrapping and class checks, borrow tracking, argument
//! conversion): several times the cost of an embedded check. These two
//! functions take the limiter's state from an external handle that index.js
//! fetches once per limiter (`Limiter._handle()`), and read the attributes
//! from one string that index.js packs (`name \0 value \0` for each attribute
//! with a string value). Whatever the packed form cannot carry (a value that
//! is not a string, a `\0` inside a name or value, not an object at all) is
//! read from the attributes object itself, by the same conversion as every
//! other call, so errors and their messages do not change.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::mem::MaybeUninit;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::rc::Rc;
use std::sync::Arc;

use napi::{sys, Env, Unknown};
use throttlegate::{Attributes, CheckOptions, Error, ErrorKind};

use crate::convert::{self, Attrs};
use crate::errors::{js_error, panic_error};
use crate::record;

/// What the fast paths share with the `Limiter` class: the core limiter, the
/// rule names that decision records refer to by index, the buffer embedded
/// decisions are written to, and the calls queued for the next `_flush`.
pub(crate) struct Hot {
    pub limiter: throttlegate::Limiter,
    pub names: Arc<[throttlegate::RuleName]>,
    pub pending: RefCell<Vec<Job>>,
    scratch: Cell<Scratch>,
}

impl Hot {
    pub(crate) fn new(limiter: throttlegate::Limiter, names: Arc<[throttlegate::RuleName]>) -> Hot {
        Hot {
            limiter,
            names,
            pending: RefCell::new(Vec::new()),
            scratch: Cell::new(Scratch {
                data: ptr::null_mut(),
                len: 0,
            }),
        }
    }
}

/// The Float64Array that an embedded decision record is written to (from
/// its start; index.js copies it out at once). index.js holds it for the
/// limiter's life, so it stays alive, and it is off the V8 heap (Node-API
/// moves a typed array's data off the heap when asked for it), so it stays
/// put.
#[derive(Clone, Copy)]
struct Scratch {
    data: *mut f64,
    len: usize,
}

/// A check or peek waiting for the next `_flush`.
pub(crate) struct Job {
    pub attrs: OwnedAttrs,
    pub opts: CheckOptions,
    pub peek: bool,
}

/// A request's attributes, owned: packed by index.js, or read from the object.
pub(crate) enum OwnedAttrs {
    Packed(String),
    Pairs(Attrs),
}

impl Attributes for OwnedAttrs {
    fn get_attr(&self, name: &str) -> Option<&str> {
        match self {
            OwnedAttrs::Packed(text) => packed_get(text, name),
            OwnedAttrs::Pairs(pairs) => pairs.get_attr(name),
        }
    }
}

/// Attributes packed as `name \0 value \0 ...`, with no `\0` inside a name or value.
struct Packed<'a>(&'a str);

impl Attributes for Packed<'_> {
    fn get_attr(&self, name: &str) -> Option<&str> {
        packed_get(self.0, name)
    }
}

fn packed_get<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let bytes = text.as_bytes();
    let field_end = |from: usize| {
        from + bytes[from..]
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(bytes.len() - from)
    };
    let mut at = 0;
    while at < bytes.len() {
        let name_end = field_end(at);
        let value_start = (name_end + 1).min(bytes.len());
        let value_end = field_end(value_start);
        if &bytes[at..name_end] == name.as_bytes() {
            // Both ends are at a `\0` or the end of the text: character boundaries.
            return Some(&text[value_start..value_end]);
        }
        at = value_end + 1;
    }
    None
}

fn internal(message: &str) -> Error {
    Error::new(
        ErrorKind::Internal,
        format!("internal error in throttlegate (please report it): {message}"),
    )
}

macro_rules! check {
    ($call:expr, $what:expr) => {
        if unsafe { $call } != sys::Status::napi_ok {
            return Err(internal($what));
        }
    };
}

/// The limiters of this thread, by handle: a handle is a number that
/// index.js passes to the fast paths (cheaper to look up than a tagged
/// external is to check). A slot's generation changes when its limiter is
/// dropped, so a stale handle never reaches another limiter.
#[derive(Default)]
struct Handles {
    slots: Vec<(u32, Option<Rc<Hot>>)>,
    free: Vec<u32>,
}

thread_local! {
    static HANDLES: RefCell<Handles> = RefCell::new(Handles::default());
}

/// Slots a handle can name (the generation is above them).
const SLOT_BITS: u32 = 24;
/// Generations, kept small enough for every handle to be an exact JavaScript number.
const GENERATIONS: u32 = 1 << 28;

/// A handle for `hot` (see [`Handles`]); [`unregister`] it when its limiter is dropped.
pub(crate) fn register(hot: Rc<Hot>) -> f64 {
    HANDLES.with(|h| {
        let mut h = h.borrow_mut();
        let index = match h.free.pop() {
            Some(i) => i,
            None => {
                h.slots.push((0, None));
                (h.slots.len() - 1) as u32
            }
        };
        let slot = &mut h.slots[index as usize];
        slot.1 = Some(hot);
        f64::from(index) + f64::from(slot.0) * f64::from(1u32 << SLOT_BITS)
    })
}

/// Forget the limiter behind `handle`.
pub(crate) fn unregister(handle: f64) {
    let index = (handle as u64 & ((1 << SLOT_BITS) - 1)) as usize;
    // During thread teardown the table may be gone already: nothing to forget then.
    let _ = HANDLES.try_with(|h| {
        let mut h = h.borrow_mut();
        if let Some(slot) = h.slots.get_mut(index) {
            if slot.1.take().is_some() {
                slot.0 = (slot.0 + 1) % GENERATIONS;
                h.free.push(index as u32);
            }
        }
    });
}

/// The state behind a handle made by [`register`].
fn hot_of(env: sys::napi_env, v: sys::napi_value) -> Result<Rc<Hot>, Error> {
    let mut handle = -1i64;
    check!(
        sys::napi_get_value_int64(env, v, &mut handle),
        "not a limiter handle"
    );
    u64::try_from(handle)
        .ok()
        .and_then(lookup)
        .ok_or_else(|| internal("not a limiter handle"))
}

fn lookup(handle: u64) -> Option<Rc<Hot>> {
    let index = (handle & ((1 << SLOT_BITS) - 1)) as usize;
    let generation = (handle >> SLOT_BITS) as u32;
    HANDLES.with(|h| match h.borrow().slots.get(index) {
        Some((g, Some(hot))) if *g == generation => Some(hot.clone()),
        _ => None,
    })
}

fn value_type(env: sys::napi_env, v: sys::napi_value) -> Result<i32, Error> {
    let mut t = 0;
    check!(
        sys::napi_typeof(env, v, &mut t),
        "cannot read a value's type"
    );
    Ok(t)
}

fn u32_arg(env: sys::napi_env, v: sys::napi_value, what: &str) -> Result<u32, Error> {
    let mut n = 0;
    check!(sys::napi_get_value_uint32(env, v, &mut n), what);
    Ok(n)
}

/// Bytes of a packed string read without allocating.
const STACK: usize = 512;

/// The packed attributes, when index.js could pack them: a string with
/// exactly `2 * pairs` separators. Read into `stack` when it fits, else into `heap`.
fn packed<'a>(
    env: sys::napi_env,
    text: sys::napi_value,
    pairs: usize,
    stack: &'a mut [MaybeUninit<u8>; STACK],
    heap: &'a mut Vec<u8>,
) -> Result<Option<&'a str>, Error> {
    if value_type(env, text)? != sys::ValueType::napi_string {
        return Ok(None);
    }
    let mut len = 0;
    check!(
        sys::napi_get_value_string_utf8(env, text, stack.as_mut_ptr().cast(), STACK, &mut len),
        "cannot read the attributes"
    );
    let bytes: &[u8] = if len + 1 < STACK {
        // SAFETY: Node wrote `len` bytes (and a NUL) at the start of `stack`.
        unsafe { std::slice::from_raw_parts(stack.as_ptr().cast::<u8>(), len) }
    } else {
        check!(
            sys::napi_get_value_string_utf8(env, text, ptr::null_mut(), 0, &mut len),
            "cannot read the attributes"
        );
        heap.resize(len + 1, 0);
        check!(
            sys::napi_get_value_string_utf8(env, text, heap.as_mut_ptr().cast(), len + 1, &mut len),
            "cannot read the attributes"
        );
        &heap[..len]
    };
    if bytes.iter().filter(|&&b| b == 0).count() != 2 * pairs {
        // A name or value holds a `\0`: read the object instead.
        return Ok(None);
    }
    // Node writes whole characters, replacing unpaired surrogates, as for every other string.
    std::str::from_utf8(bytes)
        .map(Some)
        .map_err(|_| internal("the packed attributes are not UTF-8"))
}

/// The arguments of both fast paths: `(handle, attributes, packed, flags,
/// options)`, where `flags` is `4 * pairs + 2 * (options given) + (peek)`:
/// one number, so one Node-API call, for what would be three arguments.
struct Args {
    hot: Rc<Hot>,
    env: Env,
    argv: [sys::napi_value; 5],
    peek: bool,
    has_options: bool,
    pairs: usize,
}

impl Args {
    /// The packed attributes, if index.js could pack them (see [`packed`]).
    fn packed<'a>(
        &self,
        stack: &'a mut [MaybeUninit<u8>; STACK],
        heap: &'a mut Vec<u8>,
    ) -> Result<Option<&'a str>, Error> {
        packed(self.env.raw(), self.argv[2], self.pairs, stack, heap)
    }

    fn options(&self) -> Result<CheckOptions, Error> {
        if !self.has_options {
            return Ok(CheckOptions::default());
        }
        let options = unsafe { Unknown::from_raw_unchecked(self.env.raw(), self.argv[4]) };
        convert::check_options(&self.env, &options, !self.peek)
    }

    fn attributes_object(&self) -> Result<Attrs, Error> {
        let attrs = unsafe { Unknown::from_raw_unchecked(self.env.raw(), self.argv[1]) };
        convert::attributes(&self.env, &attrs)
    }
}

/// The first `N` arguments of a call (missing ones are `undefined`) and how
/// many were passed.
fn call_args<const N: usize>(
    env: sys::napi_env,
    info: sys::napi_callback_info,
) -> Result<(usize, [sys::napi_value; N]), Error> {
    let mut argc = N;
    let mut argv = [ptr::null_mut(); N];
    check!(
        sys::napi_get_cb_info(
            env,
            info,
            &mut argc,
            argv.as_mut_ptr(),
            ptr::null_mut(),
            ptr::null_mut()
        ),
        "cannot read the arguments"
    );
    Ok((argc, argv))
}

unsafe fn args(env: sys::napi_env, info: sys::napi_callback_info) -> Result<Args, Error> {
    let (argc, argv) = call_args::<5>(env, info)?;
    if argc < 4 {
        return Err(internal("too few arguments"));
    }
    let flags = u32_arg(env, argv[3], "cannot read the call flags")?;
    Ok(Args {
        hot: hot_of(env, argv[0])?,
        env: Env::from_raw(env),
        argv,
        peek: flags & 1 != 0,
        has_options: flags & 2 != 0,
        pairs: (flags >> 2) as usize,
    })
}

/// `checkNow(handle, attributes, packed, flags, options)`: answer a check
/// (or a peek) of the embedded backend in place, write its decision record
/// at the start of the scratch buffer (see `setScratch`) and return 0; -1
/// when the backend is not in process (queue the call instead). Bad
/// arguments and core errors are thrown, with `code`.
fn check_now(env: sys::napi_env, info: sys::napi_callback_info) -> Result<sys::napi_value, Error> {
    let a = unsafe { args(env, info) }?;
    let mut stack = [MaybeUninit::uninit(); STACK];
    let mut heap = Vec::new();
    let text = a.packed(&mut stack, &mut heap)?;
    let (from_text, from_object);
    let attrs: &dyn Attributes = match text {
        Some(t) => {
            from_text = Packed(t);
            &from_text
        }
        None => {
            from_object = a.attributes_object()?;
            &from_object
        }
    };
    let opts = a.options()?;
    let answer = if a.peek {
        a.hot.limiter.peek_in_process(attrs, opts.cost)
    } else {
        a.hot.limiter.check_in_process(attrs, &opts)
    };
    let status = match answer {
        None => -1,
        Some(answer) => {
            let d = answer?;
            let scratch = a.hot.scratch.get();
            let len = record::len(&d);
            if len > scratch.len {
                return Err(internal("no room for the decision record"));
            }
            // SAFETY: a live Float64Array of `scratch.len` numbers (see
            // `Scratch`), not read by JavaScript while this runs.
            let out = unsafe { std::slice::from_raw_parts_mut(scratch.data, len) };
            record::write(out, &d, &a.hot.names);
            0
        }
    };
    let mut out = ptr::null_mut();
    check!(
        sys::napi_create_int32(env, status, &mut out),
        "cannot return the status"
    );
    Ok(out)
}

/// `setScratch(handle, scratch)`: the Float64Array, with room for any
/// decision of the limiter's policy, that `checkNow` writes to.
fn set_scratch(
    env: sys::napi_env,
    info: sys::napi_callback_info,
) -> Result<sys::napi_value, Error> {
    let (_, argv) = call_args::<2>(env, info)?;
    let hot = hot_of(env, argv[0])?;
    let mut kind = 0;
    let mut len = 0;
    let mut data = ptr::null_mut();
    check!(
        sys::napi_get_typedarray_info(
            env,
            argv[1],
            &mut kind,
            &mut len,
            &mut data,
            ptr::null_mut(),
            ptr::null_mut()
        ),
        "cannot read the scratch buffer"
    );
    if kind != sys::TypedarrayType::float64_array || data.is_null() {
        return Err(internal("the scratch buffer is not a Float64Array"));
    }
    hot.scratch.set(Scratch {
        data: data.cast(),
        len,
    });
    let mut out = ptr::null_mut();
    check!(sys::napi_get_undefined(env, &mut out), "cannot return");
    Ok(out)
}

/// `enqueue(handle, attributes, packed, flags, options)`: queue a check
/// (or a peek) for the next `_flush`. Bad arguments are thrown at once, with
/// `code`, and queue nothing.
fn enqueue(env: sys::napi_env, info: sys::napi_callback_info) -> Result<sys::napi_value, Error> {
    let a = unsafe { args(env, info) }?;
    let mut stack = [MaybeUninit::uninit(); STACK];
    let mut heap = Vec::new();
    let attrs = match a.packed(&mut stack, &mut heap)? {
        Some(t) => OwnedAttrs::Packed(t.to_owned()),
        None => OwnedAttrs::Pairs(a.attributes_object()?),
    };
    let opts = a.options()?;
    a.hot.pending.borrow_mut().push(Job {
        attrs,
        opts,
        peek: a.peek,
    });
    let mut out = ptr::null_mut();
    check!(sys::napi_get_undefined(env, &mut out), "cannot return");
    Ok(out)
}

/// Run `f` as a Node-API callback: its errors and panics are thrown as
/// JavaScript errors with `code`.
unsafe fn callback(
    env: sys::napi_env,
    info: sys::napi_callback_info,
    f: fn(sys::napi_env, sys::napi_callback_info) -> Result<sys::napi_value, Error>,
) -> sys::napi_value {
    let err = match catch_unwind(AssertUnwindSafe(|| f(env, info))) {
        Ok(Ok(v)) => return v,
        Ok(Err(e)) => e,
        Err(payload) => panic_error(payload as Box<dyn Any + Send>),
    };
    if let Ok(js) = unsafe { js_error(env, &err) } {
        unsafe { sys::napi_throw(env, js) };
    }
    ptr::null_mut()
}

unsafe extern "C" fn check_now_cb(
    env: sys::napi_env,
    info: sys::napi_callback_info,
) -> sys::napi_value {
    unsafe { callback(env, info, check_now) }
}

unsafe extern "C" fn set_scratch_cb(
    env: sys::napi_env,
    info: sys::napi_callback_info,
) -> sys::napi_value {
    unsafe { callback(env, info, set_scratch) }
}

unsafe extern "C" fn enqueue_cb(
    env: sys::napi_env,
    info: sys::napi_callback_info,
) -> sys::napi_value {
    unsafe { callback(env, info, enqueue) }
}

/// `{ checkNow, setScratch, enqueue }`, the fast paths as JavaScript functions.
pub(crate) unsafe fn functions(env: sys::napi_env) -> napi::Result<sys::napi_value> {
    let mut out = ptr::null_mut();
    napi::check_status!(unsafe { sys::napi_create_object(env, &mut out) })?;
    let entries: [(&std::ffi::CStr, sys::napi_callback); 3] = [
        (c"checkNow", Some(check_now_cb)),
        (c"setScratch", Some(set_scratch_cb)),
        (c"enqueue", Some(enqueue_cb)),
    ];
    for (name, cb) in entries {
        let mut f = ptr::null_mut();
        napi::check_status!(unsafe {
            sys::napi_create_function(
                env,
                name.as_ptr(),
                name.to_bytes().len() as isize,
                cb,
                ptr::null_mut(),
                &mut f,
            )
        })?;
        napi::check_status!(unsafe { sys::napi_set_named_property(env, out, name.as_ptr(), f) })?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hot() -> Rc<Hot> {
        let policy = throttlegate::Policy::from_str_any(
            r#"{"rules": [{"name": "a", "key": "ip:{ip}", "limit": 1, "window": "1m"}]}"#,
        )
        .unwrap();
        let names: Arc<[throttlegate::RuleName]> = vec![throttlegate::RuleName::new("a")].into();
        Rc::new(Hot::new(throttlegate::Limiter::in_memory(policy), names))
    }

    #[test]
    fn handles_name_their_limiter_until_it_is_dropped_and_never_after() {
        let (a, b) = (hot(), hot());
        let ha = register(a.clone());
        let hb = register(b.clone());
        assert!(Rc::ptr_eq(&lookup(ha as u64).unwrap(), &a));
        assert!(Rc::ptr_eq(&lookup(hb as u64).unwrap(), &b));
        unregister(ha);
        assert!(lookup(ha as u64).is_none());
        // the slot is reused, under a new generation: the stale handle stays dead
        let c = hot();
        let hc = register(c.clone());
        assert_ne!(hc, ha);
        assert_eq!(
            hc as u64 & ((1 << SLOT_BITS) - 1),
            ha as u64 & ((1 << SLOT_BITS) - 1)
        );
        assert!(lookup(ha as u64).is_none());
        assert!(Rc::ptr_eq(&lookup(hc as u64).unwrap(), &c));
        assert!(lookup(u64::MAX).is_none());
        unregister(hb);
        unregister(hc);
        unregister(hc);
        assert!(lookup(hb as u64).is_none());
    }

    #[test]
    fn packed_attributes_read_like_pairs() {
        let text = "ip\u{0}203.0.113.7\u{0}api_key\u{0}\u{0}route\u{0}/a:b\u{0}";
        let p = Packed(text);
        assert_eq!(p.get_attr("ip"), Some("203.0.113.7"));
        assert_eq!(p.get_attr("api_key"), Some(""));
        assert_eq!(p.get_attr("route"), Some("/a:b"));
        assert_eq!(p.get_attr("203.0.113.7"), None);
        assert_eq!(p.get_attr("tenant"), None);
        assert_eq!(Packed("").get_attr("ip"), None);
        let owned = OwnedAttrs::Packed(text.to_string());
        assert_eq!(owned.get_attr("route"), Some("/a:b"));
    }
}
