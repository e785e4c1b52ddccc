//! The per-call entry points of `check` and `peek`, as plain Node-API
//! functions.
//!
//! A `#[napi]` method pays for napi-rs's general machinery on every call
//! (receiver unwrapping and class checks, borrow tracking, argument
//! conversion): several times the cost of an embedded check. These
//! functions take the limiter's state from a handle that index.js fetches
//! once per limiter (`Limiter._handle()`), or for `checkNow`, `enqueue` and
//! `wireBegin`, made once per limiter by `bind`, from the function itself;
//! and they read the attributes from the strings index.js passes: up to four attributes with a string value as
//! separate `name, value` arguments, more packed into one string (`name \0
//! value \0` each). Whatever those cannot carry (a value that is not a
//! string, a `\0` inside a packed name or value, not an object at all) is
//! read from the attributes object itself, by the same conversion as every
//! other call, so errors and their messages do not change. The limiter's
//! own connection to Redis (`wireReceived`, `wireOutput`) moves its bytes
//! through them too.

use std::cell::{Cell, RefCell};
use std::ptr;
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use napi::{sys, Env, Unknown};
use throttlegate::{record, AttributeBuf, BatchCall, CheckOptions, Error};

use crate::convert;
use crate::errors::{internal, js_error};

/// What the fast paths share with the `Limiter` class: the core limiter,
/// the buffer embedded decisions are written to, and the calls queued for
/// the next `_flush`.
pub(crate) struct Hot {
    pub limiter: throttlegate::Limiter,
    pub pending: RefCell<Vec<BatchCall<AttributeBuf>>>,
    scratch: Cell<Scratch>,
    /// An embedded decision record too long for the scratch buffer (a
    /// reload brought more rules), for `Limiter._overflow()`.
    pub overflow: RefCell<Vec<f64>>,
    /// The rule numbers decision records use.
    pub names: Arc<NameTable>,
    /// The limiter's calls on its own connection to Redis, moved by
    /// index.js on the JavaScript thread (`None` until `_wireAddress`, and
    /// for backends the core has no [`throttlegate::Wire`] for).
    pub wire: RefCell<Option<throttlegate::Wire>>,
    /// The lease id of the last decision answered in place that holds
    /// concurrency slots, for `Limiter._takeLease()`.
    pub lease: RefCell<Option<String>>,
    /// Where a call answered at once has its attributes read (see `Attrs`).
    attrs: RefCell<AttributeBuf>,
    /// The UTF-8 of the attribute names the last call that passed its
    /// names as separate strings had, in order (see [`split`]): a call
    /// whose names are the same ones (index.js compares them) passes only
    /// its values. Only ever a prefix of those names (a read cut short).
    keys: RefCell<Vec<Vec<u8>>>,
}

impl Hot {
    pub(crate) fn new(limiter: throttlegate::Limiter) -> Hot {
        let names = Arc::new(NameTable::new(&limiter));
        Hot {
            limiter,
            pending: RefCell::new(Vec::new()),
            scratch: Cell::new(Scratch {
                data: ptr::null_mut(),
                len: 0,
            }),
            overflow: RefCell::new(Vec::new()),
            names,
            wire: RefCell::new(None),
            lease: RefCell::new(None),
            attrs: RefCell::new(AttributeBuf::default()),
            keys: RefCell::new(Vec::new()),
        }
    }
}

/// The rule numbers of decision records: every rule name the limiter's
/// policies have had, in order of first appearance, so a number keeps its
/// name across reloads (a check that ran on the old policy is read with the
/// same names as one that ran on the new). Until a reload (or with
/// `reloadOnChange`), the numbers are the policy's indexes, and nothing is
/// renumbered.
pub(crate) struct NameTable {
    reloaded: AtomicBool,
    table: Mutex<Vec<throttlegate::RuleName>>,
}

impl NameTable {
    fn new(limiter: &throttlegate::Limiter) -> NameTable {
        NameTable {
            reloaded: AtomicBool::new(limiter.reload_status().watching.is_some()),
            table: Mutex::new(limiter.rule_names()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<throttlegate::RuleName>> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// From now on, renumber decisions (a reload happened).
    pub(crate) fn reloaded(&self) {
        self.reloaded.store(true, Ordering::Relaxed);
    }

    /// Give each rule result of `d` its number in the table.
    pub(crate) fn renumber(&self, d: &mut throttlegate::Decision) {
        if !self.reloaded.load(Ordering::Relaxed) {
            return;
        }
        let mut table = self.lock();
        for r in &mut d.results {
            r.index = match table.iter().position(|n| *n == r.rule) {
                Some(i) => i,
                None => {
                    table.push(r.rule);
                    table.len() - 1
                }
            };
        }
    }

    /// The names, by number.
    pub(crate) fn names(&self) -> Vec<throttlegate::RuleName> {
        self.lock().clone()
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

fn u32_arg(env: sys::napi_env, v: sys::napi_value, what: &'static str) -> Result<u32, Error> {
    let mut n = 0;
    check!(sys::napi_get_value_uint32(env, v, &mut n), what);
    Ok(n)
}

/// The packed attributes, when index.js could pack them: a string with
/// exactly `2 * pairs` separators. Read into this thread's recycled
/// attribute buffer, so an embedded check allocates nothing for them.
fn packed(
    env: sys::napi_env,
    text: sys::napi_value,
    pairs: usize,
) -> Result<Option<AttributeBuf>, Error> {
    if value_type(env, text)? != sys::ValueType::napi_string {
        return Ok(None);
    }
    let mut attrs = AttributeBuf::take();
    let mut bytes = std::mem::take(attrs.text_mut()).into_bytes();
    let read = |buf: *mut u8, size: usize, len: &mut usize| {
        check!(
            sys::napi_get_value_string_utf8(env, text, buf.cast(), size, len),
            "cannot read the attributes"
        );
        Ok(())
    };
    let mut len = 0;
    read(bytes.as_mut_ptr(), bytes.capacity(), &mut len)?;
    if len + 4 >= bytes.capacity() {
        // Maybe cut short (by up to 3 bytes more than the NUL: Node writes
        // whole characters only): make room for all of it.
        read(ptr::null_mut(), 0, &mut len)?;
        bytes.reserve(len + 1);
        read(bytes.as_mut_ptr(), len + 1, &mut len)?;
    }
    // SAFETY: Node wrote `len` bytes (and a NUL) at the start of `bytes`.
    unsafe { bytes.set_len(len) };
    if bytes.iter().filter(|&&b| b == 0).count() != 2 * pairs {
        // A name or value holds a `\0`: read the object instead.
        return Ok(None);
    }
    // Node writes whole characters, replacing unpaired surrogates, as for every other string.
    *attrs.text_mut() =
        String::from_utf8(bytes).map_err(|_| internal("the packed attributes are not UTF-8"))?;
    attrs.read_packed()?;
    Ok(Some(attrs))
}

/// Attributes with this many string values or fewer come as separate
/// string arguments (`name, value` each), after the fixed ones.
const SPLIT_PAIRS: usize = 4;
/// The fixed arguments of every fast path: `(attributes, packed, flags,
/// options, id)`.
const FIXED: usize = 5;
/// The most arguments a fast path reads.
const MAX_ARGS: usize = FIXED + 2 * SPLIT_PAIRS;
/// The arguments read at first (enough for one attribute with its name,
/// or two without).
const FEW_ARGS: usize = FIXED + 2;

/// Strings up to this many UTF-16 code units are read as such (see
/// [`append_string`]); longer ones as UTF-8.
const SHORT_STRING: usize = 128;

/// Append the UTF-8 of the JavaScript string `v` to `out`; false (and
/// nothing appended) when `v` is not a string. What is appended is UTF-8,
/// with unpaired surrogates replaced by U+FFFD, as Node's own UTF-8 read
/// writes it.
///
/// A short string is read as UTF-16 and narrowed here: V8 copies a
/// string's code units out faster than it encodes them as UTF-8, and
/// attribute values are mostly ASCII, whose narrowing is a byte copy.
fn append_string(env: sys::napi_env, v: sys::napi_value, out: &mut Vec<u8>) -> Result<bool, Error> {
    let mut units = [std::mem::MaybeUninit::<u16>::uninit(); SHORT_STRING];
    let mut len = 0;
    match unsafe { sys::napi_get_value_string_utf16(env, v, units.as_mut_ptr().cast(), SHORT_STRING, &mut len) } {
        sys::Status::napi_ok => {}
        sys::Status::napi_string_expected => return Ok(false),
        _ => return Err(internal("cannot read the attributes")),
    }
    if len + 1 >= SHORT_STRING {
        // Maybe cut short (Node leaves room for a NUL).
        return append_utf8(env, v, out);
    }
    // SAFETY: Node wrote `len` code units (and a NUL) at the start of `units`.
    let units = unsafe { std::slice::from_raw_parts(units.as_ptr().cast::<u16>(), len) };
    // Narrowed as if ASCII (one pass the compiler vectorises), kept if it was.
    out.reserve(len);
    let start = out.len();
    let mut seen = 0u16;
    for (to, &u) in out.spare_capacity_mut().iter_mut().zip(units) {
        to.write(u as u8);
        seen |= u;
    }
    if seen < 0x80 {
        // SAFETY: the loop wrote `len` bytes from `start` (room was reserved).
        unsafe { out.set_len(start + len) };
    } else {
        let mut at = [0u8; 4];
        for c in char::decode_utf16(units.iter().copied()) {
            let c = c.unwrap_or(char::REPLACEMENT_CHARACTER);
            out.extend_from_slice(c.encode_utf8(&mut at).as_bytes());
        }
    }
    Ok(true)
}

/// [`append_string`] for a long string: Node's UTF-8 read, checked.
fn append_utf8(env: sys::napi_env, v: sys::napi_value, out: &mut Vec<u8>) -> Result<bool, Error> {
    let start = out.len();
    if out.capacity() - start < 32 {
        out.reserve(64);
    }
    let read = |out: &mut Vec<u8>, len: &mut usize| {
        let room = out.capacity() - start;
        // SAFETY: `room` bytes of spare capacity from `start`.
        let at = unsafe { out.as_mut_ptr().add(start) };
        unsafe { sys::napi_get_value_string_utf8(env, v, at.cast(), room, len) }
    };
    let mut len = 0;
    match read(out, &mut len) {
        sys::Status::napi_ok => {}
        sys::Status::napi_string_expected => return Ok(false),
        _ => return Err(internal("cannot read the attributes")),
    }
    if len + 4 >= out.capacity() - start {
        // Maybe cut short (by up to 3 bytes more than the NUL: Node writes
        // whole characters only): make room for all of it.
        check!(
            sys::napi_get_value_string_utf8(env, v, ptr::null_mut(), 0, &mut len),
            "cannot read the attributes"
        );
        out.reserve(len + 1);
        if read(out, &mut len) != sys::Status::napi_ok {
            return Err(internal("cannot read the attributes"));
        }
    }
    // SAFETY: `len` bytes written from `start` (Node checks for nothing
    // more than its own output, which is checked next).
    if std::str::from_utf8(unsafe { std::slice::from_raw_parts(out.as_ptr().add(start), len) }).is_err() {
        return Err(internal("the attributes are not UTF-8"));
    }
    // SAFETY: Node wrote `len` bytes (and a NUL) from `start`.
    unsafe { out.set_len(start + len) };
    Ok(true)
}

/// The attributes given as separate strings, read straight into `attrs`
/// (empty): no string is made in JavaScript for them, and none is
/// flattened. `strings` holds `name, value` for each pair, and the names
/// are kept in `keys`; or, with `same`, only the values, whose names are
/// the ones kept. False (and `attrs` left empty) when one of them is not a
/// string after all, or `keys` holds fewer names than values (then the
/// object is read).
fn split(
    env: sys::napi_env,
    strings: &[sys::napi_value],
    same: bool,
    keys: &RefCell<Vec<Vec<u8>>>,
    attrs: &mut AttributeBuf,
) -> Result<bool, Error> {
    let mut keys = keys.borrow_mut();
    let per = if same { 1 } else { 2 };
    if same && keys.len() < strings.len() {
        return Ok(false);
    }
    for (i, pair) in strings.chunks_exact(per).enumerate() {
        // SAFETY: `append_string` appends UTF-8 only (as do the names kept,
        // which it appended before), and on an error or a value that is not
        // a string what it appended is cut off again.
        let bytes = unsafe { attrs.text_mut().as_mut_vec() };
        let start = bytes.len();
        let name = if same {
            bytes.extend_from_slice(&keys[i]);
            Ok(true)
        } else {
            // Kept names stay a prefix of the call's names, whatever happens next.
            keys.truncate(i);
            append_string(env, pair[0], bytes)
        };
        let read = name.and_then(|name| {
            let mid = bytes.len();
            Ok(name && append_string(env, pair[per - 1], bytes)?).map(|both| both.then_some(mid))
        });
        let mid = match read {
            Ok(Some(mid)) => mid,
            other => {
                bytes.truncate(start);
                clear(attrs);
                return other.map(|_| false);
            }
        };
        if !same {
            keys.push(bytes[start..mid].to_vec());
        }
        attrs.end_attribute(start, mid)?;
    }
    Ok(true)
}

/// Empty `attrs` (no text, no attribute), keeping its room.
fn clear(attrs: &mut AttributeBuf) {
    attrs.text_mut().clear();
    // Reading an empty text forgets every attribute and cannot fail.
    let _ = attrs.read_packed();
}

/// A call's attributes: in the limiter's own buffer (`Hot::attrs`), or,
/// when that one is in use (a getter of the attributes or options called
/// back into the limiter) or they were read another way, in one of their own.
enum Attrs<'h> {
    Kept(std::cell::RefMut<'h, AttributeBuf>),
    Own(AttributeBuf),
}

impl std::ops::Deref for Attrs<'_> {
    type Target = AttributeBuf;
    fn deref(&self) -> &AttributeBuf {
        match self {
            Attrs::Kept(a) => a,
            Attrs::Own(a) => a,
        }
    }
}

impl Drop for Attrs<'_> {
    /// Done with them: the limiter's buffer emptied, or one of their own given back for reuse.
    fn drop(&mut self) {
        match self {
            Attrs::Kept(a) => clear(a),
            Attrs::Own(a) => std::mem::take(a).recycle(),
        }
    }
}

/// The arguments of the fast paths: `(attributes, packed, flags, options,
/// id, name, value, ...)`, where `flags` is `16 * pairs + 8 *
/// (same) + 4 * (split) + 2 * (options given) + (peek)`: one number, so one
/// Node-API call, for what would be five arguments. With `split`, the
/// `pairs` attributes with a string value (at most `SPLIT_PAIRS`) come as
/// `name, value` arguments after the fixed ones, or with `same` (their
/// names are those of the last call that passed names: `Hot::keys`) as
/// their values alone; else `packed` holds them when index.js could pack
/// them; else they are read from `attributes`. `id` is `wireBegin`'s alone.
struct Args {
    hot: Rc<Hot>,
    env: Env,
    argv: [sys::napi_value; MAX_ARGS],
    peek: bool,
    has_options: bool,
    split: bool,
    same: bool,
    pairs: usize,
    /// How many of the arguments after the fixed ones are the attributes' strings.
    strings: usize,
}

impl Args {
    /// The attributes: as separate strings or packed by index.js if it
    /// could (see [`split`] and [`packed`]), else read from the object.
    fn attributes(&self) -> Result<AttributeBuf, Error> {
        if self.split {
            let mut attrs = AttributeBuf::take();
            if split(self.env.raw(), self.strings(), self.same, &self.hot.keys, &mut attrs)? {
                return Ok(attrs);
            }
            attrs.recycle();
        } else if let Some(attrs) = packed(self.env.raw(), self.argv[1], self.pairs)? {
            return Ok(attrs);
        }
        self.object()
    }

    /// [`Args::attributes`], separate strings read into the limiter's own
    /// buffer when it is free (no buffer taken and given back per call).
    fn attributes_kept(&self) -> Result<Attrs<'_>, Error> {
        if self.split {
            if let Ok(mut kept) = self.hot.attrs.try_borrow_mut() {
                if split(self.env.raw(), self.strings(), self.same, &self.hot.keys, &mut kept)? {
                    return Ok(Attrs::Kept(kept));
                }
                return self.object().map(Attrs::Own);
            }
        }
        self.attributes().map(Attrs::Own)
    }

    /// The `name, value` arguments (with `same`, the values alone).
    fn strings(&self) -> &[sys::napi_value] {
        &self.argv[FIXED..FIXED + self.strings]
    }

    /// The attributes read from the object itself.
    fn object(&self) -> Result<AttributeBuf, Error> {
        let attrs = unsafe { Unknown::from_raw_unchecked(self.env.raw(), self.argv[0]) };
        convert::attributes(&self.env, &attrs)
    }

    fn options(&self) -> Result<CheckOptions, Error> {
        if !self.has_options {
            return Ok(CheckOptions::default());
        }
        let options = unsafe { Unknown::from_raw_unchecked(self.env.raw(), self.argv[3]) };
        convert::check_options(&self.env, &options, !self.peek)
    }
}

/// The first `N` arguments of a call (missing ones are `undefined`) and how
/// many were passed.
fn call_args<const N: usize>(
    env: sys::napi_env,
    info: sys::napi_callback_info,
) -> Result<(usize, [sys::napi_value; N]), Error> {
    call_args_data(env, info, ptr::null_mut())
}

/// [`call_args`], and the function's data to `data` (unless null).
fn call_args_data<const N: usize>(
    env: sys::napi_env,
    info: sys::napi_callback_info,
    data: *mut *mut std::ffi::c_void,
) -> Result<(usize, [sys::napi_value; N]), Error> {
    let mut argc = N;
    let mut argv = [ptr::null_mut(); N];
    check!(
        sys::napi_get_cb_info(env, info, &mut argc, argv.as_mut_ptr(), ptr::null_mut(), data),
        "cannot read the arguments"
    );
    Ok((argc, argv))
}

#[inline(always)]
unsafe fn args(env: sys::napi_env, info: sys::napi_callback_info) -> Result<Args, Error> {
    // Most calls have few arguments: those are read in one call, with fewer
    // slots for Node to fill; the others are read again, all of them.
    let mut data = ptr::null_mut();
    let (argc, first) = call_args_data::<FEW_ARGS>(env, info, &mut data)?;
    let mut argv = [ptr::null_mut(); MAX_ARGS];
    if argc <= FEW_ARGS {
        argv[..FEW_ARGS].copy_from_slice(&first);
    } else {
        argv = call_args::<MAX_ARGS>(env, info)?.1;
    }
    if argc < 3 {
        return Err(internal("too few arguments"));
    }
    let hot = unsafe { bound_hot(data) }?;
    let flags = u32_arg(env, argv[2], "cannot read the call flags")?;
    let split = flags & 4 != 0;
    let same = flags & 8 != 0;
    let pairs = (flags >> 4) as usize;
    let strings = if same { pairs } else { 2 * pairs };
    if split && (pairs > SPLIT_PAIRS || argc < FIXED + strings) {
        return Err(internal("too few arguments"));
    }
    Ok(Args {
        hot,
        env: Env::from_raw(env),
        argv,
        peek: flags & 1 != 0,
        has_options: flags & 2 != 0,
        split,
        same,
        pairs,
        strings,
    })
}

/// `checkNow(attributes, packed, flags, options, _, ...strings)`: answer a check
/// (or a peek) of the embedded backend in place, write its decision record
/// at the start of the scratch buffer (see `setScratch`) and return
/// `undefined` (see [`answer_value`]); -1 when the backend is not in
/// process (queue the call instead). Bad arguments and core errors are
/// thrown, with `code`.
fn check_now(env: sys::napi_env, info: sys::napi_callback_info) -> Result<sys::napi_value, Error> {
    answer_now(env, &unsafe { args(env, info) }?)
}

/// `checkValues(attributes, ...values)`: `checkNow` of a check (not a
/// peek) without options whose attributes are strings under the names the
/// limiter keeps (`same`, see [`Args`]), passing the object and the values
/// alone: no flags to read, and fewer arguments.
fn check_values(env: sys::napi_env, info: sys::napi_callback_info) -> Result<sys::napi_value, Error> {
    answer_now(env, &unsafe { values_args(env, info) }?)
}

/// `checkValues`'s arguments, as [`args`] gives those of `checkNow`.
/// (Inlined, as is [`args`]: built where they are used, not moved there.)
#[inline(always)]
unsafe fn values_args(env: sys::napi_env, info: sys::napi_callback_info) -> Result<Args, Error> {
    let mut data = ptr::null_mut();
    let (argc, first) = call_args_data::<{ 1 + SPLIT_PAIRS }>(env, info, &mut data)?;
    if !(1..=1 + SPLIT_PAIRS).contains(&argc) {
        return Err(internal("too few arguments"));
    }
    let pairs = argc - 1;
    // Laid out as `checkNow`'s: the object first, the values after the fixed arguments.
    let mut argv = [ptr::null_mut(); MAX_ARGS];
    argv[0] = first[0];
    argv[FIXED..FIXED + pairs].copy_from_slice(&first[1..argc]);
    Ok(Args {
        hot: unsafe { bound_hot(data) }?,
        env: Env::from_raw(env),
        argv,
        peek: false,
        has_options: false,
        split: true,
        same: true,
        pairs,
        strings: pairs,
    })
}

/// The limiter a function made by `bind` holds (its `data`).
unsafe fn bound_hot(data: *mut std::ffi::c_void) -> Result<Rc<Hot>, Error> {
    // SAFETY: the data of a function made by `bind`, which lives as long as it.
    unsafe { data.cast::<Weak<Hot>>().as_ref() }
        .and_then(Weak::upgrade)
        .ok_or_else(|| internal("not a limiter's fast path"))
}

/// Answer the call of `a` in place (`checkNow`).
fn answer_now(env: sys::napi_env, a: &Args) -> Result<sys::napi_value, Error> {
    let attrs = a.attributes_kept()?;
    let opts = a.options()?;
    let mut answer = if a.peek {
        a.hot.limiter.peek_in_process(&*attrs, opts.cost)
    } else {
        a.hot.limiter.check_in_process(&*attrs, &opts)
    };
    drop(attrs);
    // Matched in place: a decision is written from where the core put it, not moved.
    let status = match answer {
        None => -1,
        Some(Err(e)) => return Err(e),
        Some(Ok(ref mut d)) => write_scratch(&a.hot, d),
    };
    answer_value(env, status)
}

/// Write a decision answered in place to the scratch buffer: 0, or
/// `OVERFLOW` when it went to `Hot::overflow` instead.
fn write_scratch(hot: &Hot, d: &mut throttlegate::Decision) -> i32 {
    hot.names.renumber(d);
    let scratch = hot.scratch.get();
    let len = record::len(d);
    if len > scratch.len {
        let mut overflow = hot.overflow.borrow_mut();
        overflow.clear();
        overflow.resize(len, 0.0);
        record::write(&mut overflow, d);
        *hot.lease.borrow_mut() = mark_lease(&mut overflow, d);
        return OVERFLOW;
    }
    // SAFETY: a live Float64Array of `scratch.len` numbers (see
    // `Scratch`), not read by JavaScript while this runs.
    let out = unsafe { std::slice::from_raw_parts_mut(scratch.data, len) };
    record::write(out, d);
    *hot.lease.borrow_mut() = mark_lease(out, d);
    0
}

/// The flag a decision record carries (with the core's flags, 1 allowed
/// and 2 degraded) when the decision holds concurrency slots: its lease id
/// then travels beside the record (`Limiter._takeLease()`, the batches'
/// `leases`). The core's `record::rebuild` ignores the flag.
pub(crate) const LEASED: f64 = 4.0;

/// Flag `out`, the record of `d`, when `d` holds concurrency slots; their lease id.
pub(crate) fn mark_lease(out: &mut [f64], d: &throttlegate::Decision) -> Option<String> {
    let id = d.lease_id().filter(|_| d.allowed)?;
    out[1] += LEASED;
    Some(id.to_string())
}

/// What `wireBegin` returns when the limiter has no wire (use `enqueue`).
const NO_WIRE: i32 = -3;

/// `wireBegin(attributes, packed, flags, options, id, ...strings)`: start a
/// check (or a peek) on the limiter's own connection (`Hot::wire`): -1 when
/// its command is queued for `_wireOutput` and its answer will come under
/// `id`; `undefined` (or `OVERFLOW`) when it was answered at once, as `checkNow`
/// answers; `NO_WIRE` when the limiter has none, or the call has a reserved
/// rule (then index.js queues it for `_flush`). Bad arguments are thrown,
/// with `code`.
fn wire_begin(env: sys::napi_env, info: sys::napi_callback_info) -> Result<sys::napi_value, Error> {
    let a = unsafe { args(env, info) }?;
    let id = u32_arg(env, a.argv[4], "cannot read the call id")?;
    let attrs = a.attributes_kept()?;
    let opts = a.options()?;
    let mut answer = match &mut *a.hot.wire.borrow_mut() {
        None => return status_value(env, NO_WIRE),
        // A reserved rule's calls take the general path (the limiter's reservations).
        Some(wire) if wire.reserved(&*attrs, &opts, a.peek) => return status_value(env, NO_WIRE),
        Some(wire) => wire.begin(id, &*attrs, &opts, a.peek),
    };
    drop(attrs);
    // Matched in place: a decision is written from where the core put it, not moved.
    let status = match answer {
        None => -1,
        Some(Err(e)) => return Err(e),
        Some(Ok(ref mut d)) => write_scratch(&a.hot, d),
    };
    answer_value(env, status)
}

/// What `checkNow` returns when the record is in `Hot::overflow`.
const OVERFLOW: i32 = -2;

/// What `checkNow` and `wireBegin` return for `status`: `undefined` for 0
/// (the decision is in the scratch buffer, the common case: no number is
/// made), else the number.
fn answer_value(env: sys::napi_env, status: i32) -> Result<sys::napi_value, Error> {
    if status == 0 {
        // A callback's null result is `undefined` in JavaScript.
        return Ok(ptr::null_mut());
    }
    status_value(env, status)
}

fn status_value(env: sys::napi_env, status: i32) -> Result<sys::napi_value, Error> {
    let mut out = ptr::null_mut();
    check!(sys::napi_create_int32(env, status, &mut out), "cannot return the status");
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

/// `enqueue(attributes, packed, flags, options, _, ...strings)`: queue a check
/// (or a peek) for the next `_flush`. Bad arguments are thrown at once, with
/// `code`, and queue nothing.
fn enqueue(env: sys::napi_env, info: sys::napi_callback_info) -> Result<sys::napi_value, Error> {
    let a = unsafe { args(env, info) }?;
    let attributes = a.attributes()?;
    let options = a.options()?;
    a.hot.pending.borrow_mut().push(BatchCall {
        attributes,
        options,
        peek: a.peek,
    });
    let mut out = ptr::null_mut();
    check!(sys::napi_get_undefined(env, &mut out), "cannot return");
    Ok(out)
}

/// `wireReceived(handle, bytes)`: bytes read from the limiter's own
/// connection, handed to its wire (`Hot::wire`). When what they settle is
/// only decisions holding no lease, the connection stays, nothing is to be
/// written back, and it all fits the scratch buffer, the number of calls
/// settled, their `[id, record...]` one after the other at the start of the
/// scratch buffer: no array, typed array or buffer made per reply.
/// Otherwise everything as `_wireReceived` returns it (`WireOut`); `null`
/// without a wire.
fn wire_received(env: sys::napi_env, info: sys::napi_callback_info) -> Result<sys::napi_value, Error> {
    let (_, argv) = call_args::<2>(env, info)?;
    let hot = hot_of(env, argv[0])?;
    let mut data = ptr::null_mut();
    let mut len = 0;
    check!(
        sys::napi_get_buffer_info(env, argv[1], &mut data, &mut len),
        "cannot read the bytes received"
    );
    let bytes: &[u8] = if len == 0 {
        &[]
    } else {
        // SAFETY: the Buffer's own `len` bytes, alive for this call.
        unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) }
    };
    let mut slot = hot.wire.borrow_mut();
    let Some(wire) = slot.as_mut() else {
        let mut out = ptr::null_mut();
        check!(sys::napi_get_null(env, &mut out), "cannot return");
        return Ok(out);
    };
    let mut done = Vec::new();
    let keep = wire.received(bytes, &mut done);
    let output = wire.take_output();
    if keep && output.is_empty() {
        if let Some(n) = write_settled(&hot, &mut done) {
            return status_value(env, n as i32);
        }
    }
    let out = crate::WireOut::from_parts(keep, done, wire, output, &hot.names);
    drop(slot);
    unsafe { <crate::WireOut as napi::bindgen_prelude::ToNapiValue>::to_napi_value(env, out) }
        .map_err(|_| internal("cannot return the calls settled"))
}

/// Write the calls settled in `done` to the scratch buffer as `[id,
/// record...]` each, and return how many; `None` (nothing written) when
/// one failed, holds a lease, or they do not all fit.
fn write_settled(hot: &Hot, done: &mut throttlegate::WireOutcomes) -> Option<usize> {
    let mut total = 0;
    for (_, outcome) in done.iter() {
        let d = outcome.as_ref().ok()?;
        if d.lease_id().is_some() && d.allowed {
            return None;
        }
        total += 1 + record::len(d);
    }
    let scratch = hot.scratch.get();
    if total > scratch.len || scratch.data.is_null() {
        return None;
    }
    // SAFETY: a live Float64Array of `scratch.len` numbers (see `Scratch`),
    // not read by JavaScript while this runs.
    let out = unsafe { std::slice::from_raw_parts_mut(scratch.data, total) };
    let mut at = 0;
    for (id, outcome) in done.iter_mut() {
        let d = outcome.as_mut().ok()?;
        hot.names.renumber(d);
        let len = record::len(d);
        out[at] = f64::from(*id);
        record::write(&mut out[at + 1..at + 1 + len], d);
        at += 1 + len;
    }
    Some(done.len())
}

/// `wireOutput(handle, buffer)`: the bytes to write on the limiter's own
/// connection now. When they fit `buffer` (index.js's own, for the
/// connection's writes), they are copied to its start and their number is
/// returned (0 when there are none); else they come as a Buffer of their own.
fn wire_output(env: sys::napi_env, info: sys::napi_callback_info) -> Result<sys::napi_value, Error> {
    let (_, argv) = call_args::<2>(env, info)?;
    let hot = hot_of(env, argv[0])?;
    let bytes = hot.wire.borrow_mut().as_mut().map(|w| w.take_output()).unwrap_or_default();
    let mut data = ptr::null_mut();
    let mut room = 0;
    check!(
        sys::napi_get_buffer_info(env, argv[1], &mut data, &mut room),
        "cannot read the output buffer"
    );
    if bytes.len() <= room {
        if !bytes.is_empty() {
            // SAFETY: the Buffer's own `room` bytes, alive for this call.
            unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), data.cast::<u8>(), bytes.len()) };
        }
        return status_value(env, i32::try_from(bytes.len()).map_err(|_| internal("output too long"))?);
    }
    unsafe { <crate::Bytes as napi::bindgen_prelude::ToNapiValue>::to_napi_value(env, crate::Bytes(bytes)) }
        .map_err(|_| internal("cannot return the bytes to write"))
}

/// Run `f` as a Node-API callback: its errors and panics are thrown as
/// JavaScript errors with `code`.
unsafe fn callback(
    env: sys::napi_env,
    info: sys::napi_callback_info,
    f: fn(sys::napi_env, sys::napi_callback_info) -> Result<sys::napi_value, Error>,
) -> sys::napi_value {
    let err = match Error::catch_panic(|| f(env, info)) {
        Ok(v) => return v,
        Err(e) => e,
    };
    if let Ok(js) = unsafe { js_error(env, &err) } {
        unsafe { sys::napi_throw(env, js) };
    }
    ptr::null_mut()
}

/// `f` as a Node-API callback (through [`callback`]).
macro_rules! node_callback {
    ($f:ident) => {{
        unsafe extern "C" fn cb(env: sys::napi_env, info: sys::napi_callback_info) -> sys::napi_value {
            unsafe { callback(env, info, $f) }
        }
        Some(cb)
    }};
}

/// `bind(handle)`: `{ checkNow, checkValues, enqueue, wireBegin }` for the limiter
/// behind `handle`, each holding it (weakly: a call after the limiter is
/// gone fails) as its data, so a call names no limiter and none is looked
/// up. index.js makes them once per limiter.
fn bind(env: sys::napi_env, info: sys::napi_callback_info) -> Result<sys::napi_value, Error> {
    let (_, argv) = call_args::<1>(env, info)?;
    let hot = hot_of(env, argv[0])?;
    let entries: [(&std::ffi::CStr, sys::napi_callback); 4] = [
        (c"checkNow", node_callback!(check_now)),
        (c"checkValues", node_callback!(check_values)),
        (c"enqueue", node_callback!(enqueue)),
        (c"wireBegin", node_callback!(wire_begin)),
    ];
    let mut out = ptr::null_mut();
    check!(sys::napi_create_object(env, &mut out), "cannot make the fast paths");
    for (name, cb) in entries {
        let data = Box::into_raw(Box::new(Rc::downgrade(&hot))).cast::<std::ffi::c_void>();
        let mut f = ptr::null_mut();
        let made = unsafe {
            sys::napi_create_function(env, name.as_ptr(), name.to_bytes().len() as isize, cb, data, &mut f)
        };
        if made != sys::Status::napi_ok
            || unsafe { sys::napi_add_finalizer(env, f, data, Some(drop_bound), ptr::null_mut(), ptr::null_mut()) }
                != sys::Status::napi_ok
        {
            // SAFETY: made by `Box::into_raw` above, and no finalizer holds it.
            drop(unsafe { Box::from_raw(data.cast::<Weak<Hot>>()) });
            return Err(internal("cannot make the fast paths"));
        }
        check!(
            sys::napi_set_named_property(env, out, name.as_ptr(), f),
            "cannot make the fast paths"
        );
    }
    Ok(out)
}

/// The finalizer of a function made by `bind`: its data let go.
unsafe extern "C" fn drop_bound(_env: sys::napi_env, data: *mut std::ffi::c_void, _hint: *mut std::ffi::c_void) {
    // SAFETY: `bind` made `data` by `Box::into_raw` and gave it to this finalizer alone.
    drop(unsafe { Box::from_raw(data.cast::<Weak<Hot>>()) });
}

/// `{ bind, setScratch, wireReceived, wireOutput }`, the fast paths as
/// JavaScript functions (`checkNow`, `checkValues`, `enqueue` and
/// `wireBegin` come from `bind`, per limiter).
pub(crate) unsafe fn functions(env: sys::napi_env) -> napi::Result<sys::napi_value> {
    let mut out = ptr::null_mut();
    napi::check_status!(unsafe { sys::napi_create_object(env, &mut out) })?;
    let entries: [(&std::ffi::CStr, sys::napi_callback); 4] = [
        (c"bind", node_callback!(bind)),
        (c"setScratch", node_callback!(set_scratch)),
        (c"wireReceived", node_callback!(wire_received)),
        (c"wireOutput", node_callback!(wire_output)),
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
        Rc::new(Hot::new(throttlegate::Limiter::in_memory(policy)))
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
}
