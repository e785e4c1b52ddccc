//! The bridge that hands calls finished on the core's runtime to asyncio
//! (the runtime itself, and what happens to it across `os.fork()`, are the
//! core's: `throttlegate::runtime`).
//!
//! Measured machinery, kept in the binding because it is asyncio's own: with
//! 64 tasks in flight on Redis it settled 42,000-85,000 checks/s against
//! 11,800-16,000 for one `call_soon_threadsafe` per answer through
//! `pyo3-async-runtimes` (benches/python/README.md).
//!
//! Awaitables are plain asyncio futures made by the running loop
//! (`loop.create_future()`). A background call never takes the GIL: it
//! pushes its outcome onto the loop's inbox, and only the first push of a
//! batch wakes the loop, by writing one byte to a socket the loop watches
//! (`loop.add_reader`). The loop then drains the whole inbox on its own
//! thread and sets every result. Loops without `add_reader` (Windows'
//! proactor) are woken with one `call_soon_threadsafe` per batch instead.

use std::cell::RefCell;
use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;

use pyo3::exceptions::PyNotImplementedError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::IntoPyObjectExt;
use throttlegate as core;

use crate::errors::{core_to_py, internal};

/// The fork generation: changes in a child after every `os.fork()` (the
/// core counts forks; its runtime and connections follow them).
fn generation() -> u64 {
    core::runtime::fork_generation()
}

/// What a background call produces, turned into a Python object on the
/// loop's thread.
pub enum Value {
    /// A check or peek.
    Decision(core::Decision),
    /// A count (reset, settle).
    Count(u64),
    /// Nothing (ping).
    Nothing,
    /// A yes or no (clear_override).
    Flag(bool),
    /// The overrides of a rule.
    Overrides(Vec<core::Override>),
}

impl Value {
    fn into_py(self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        match self {
            Value::Decision(d) => Bound::new(py, crate::types::Decision::from(d)).map(Bound::into_any),
            Value::Count(n) => n.into_bound_py_any(py),
            Value::Nothing => Ok(py.None().into_bound(py)),
            Value::Flag(b) => b.into_bound_py_any(py),
            Value::Overrides(list) => crate::convert::overrides(py, &list),
        }
    }
}

/// The outcome of a background call (a panic is an internal error).
pub type Outcome = core::Result<Value>;

fn invalid_state_error(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static CLS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    CLS.import(py, "asyncio", "InvalidStateError")
}

/// Complete an asyncio future with `outcome`, on the loop's thread. A future
/// cancelled in the meantime keeps its cancellation: the answer is dropped.
pub fn settle(py: Python<'_>, fut: &Bound<'_, PyAny>, outcome: Outcome) {
    let done = match outcome {
        Ok(v) => v
            .into_py(py)
            .and_then(|v| fut.call_method1(pyo3::intern!(py, "set_result"), (v,))),
        Err(e) => fut.call_method1(pyo3::intern!(py, "set_exception"), (core_to_py(py, &e).into_value(py),)),
    };
    if let Err(e) = done {
        let cancelled = invalid_state_error(py).map(|cls| e.is_instance(py, cls)).unwrap_or(false);
        if !cancelled {
            e.write_unraisable(py, Some(fut));
        }
    }
}

/// One event loop's inbox of finished calls: the core's, woken through a
/// socket pair the loop watches (`loop.add_reader`), or by
/// `loop.call_soon_threadsafe(drain)` from a blocking-pool thread where the
/// loop has no `add_reader` (Windows' proactor).
type LoopWaker = core::runtime::Inbox<(Py<PyAny>, Outcome)>;

/// Set every result in the inbox (on the loop's thread).
fn drain(waker: &LoopWaker, py: Python<'_>) {
    for (fut, outcome) in waker.drain() {
        settle(py, fut.bind(py), outcome);
    }
}

/// The callback a loop runs when its inbox has answers.
#[pyclass(module = "throttlegate._native", frozen)]
struct Drain {
    waker: Arc<LoopWaker>,
    /// The fork generation the waker was made in.
    generation: u64,
}

#[pymethods]
impl Drain {
    fn __call__(&self, py: Python<'_>) {
        drain(&self.waker, py);
    }
}

/// The running event loop as seen by this thread's calls.
pub struct LoopCtx {
    generation: u64,
    event_loop: Py<PyAny>,
    create_future: Py<PyAny>,
    waker: Arc<LoopWaker>,
}

thread_local! {
    // The last loop seen on this thread; holding it keeps its address from
    // being reused by another loop while it is cached.
    static LAST_LOOP: RefCell<Option<Rc<LoopCtx>>> = const { RefCell::new(None) };
}

fn get_running_loop(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    static F: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    F.import(py, "asyncio", "get_running_loop")?.call0()
}

/// Loops already given an inbox, to their `Drain` (weakly keyed by loop).
fn registry(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static REG: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    REG.get_or_try_init(py, || -> PyResult<Py<PyAny>> {
        Ok(py.import("weakref")?.getattr("WeakKeyDictionary")?.call0()?.unbind())
    })
    .map(|r| r.bind(py))
}

impl LoopCtx {
    /// The running loop of this thread (`RuntimeError` outside one).
    pub fn current(py: Python<'_>) -> PyResult<Rc<LoopCtx>> {
        let event_loop = get_running_loop(py)?;
        let generation = generation();
        let cached = LAST_LOOP.with(|c| {
            c.borrow()
                .as_ref()
                .filter(|ctx| ctx.generation == generation && ctx.event_loop.is(&event_loop))
                .cloned()
        });
        if let Some(ctx) = cached {
            return Ok(ctx);
        }
        let ctx = Rc::new(LoopCtx::attach(py, event_loop, generation)?);
        let old = LAST_LOOP.with(|c| c.borrow_mut().replace(Rc::clone(&ctx)));
        drop(old);
        Ok(ctx)
    }

    fn attach(py: Python<'_>, event_loop: Bound<'_, PyAny>, generation: u64) -> PyResult<LoopCtx> {
        let create_future = event_loop.getattr(pyo3::intern!(py, "create_future"))?.unbind();
        let registry = registry(py)?;
        let known = registry.call_method1("get", (&event_loop,))?;
        if let Ok(drain) = known.cast::<Drain>() {
            if drain.get().generation == generation {
                let waker = Arc::clone(&drain.get().waker);
                return Ok(LoopCtx { generation, event_loop: event_loop.unbind(), create_future, waker });
            }
        }
        let waker = LoopCtx::new_waker(py, &event_loop, &known)?;
        // Loops that cannot be weakly referenced are simply not remembered.
        let drain = Bound::new(py, Drain { waker: Arc::clone(&waker), generation })?;
        let _ = registry.set_item(&event_loop, drain);
        Ok(LoopCtx { generation, event_loop: event_loop.unbind(), create_future, waker })
    }

    #[cfg(unix)]
    fn new_waker(py: Python<'_>, event_loop: &Bound<'_, PyAny>, known: &Bound<'_, PyAny>) -> PyResult<Arc<LoopWaker>> {
        // A waker inherited through fork shares its socket with the parent.
        if let Some(fd) = known.cast::<Drain>().ok().and_then(|old| old.get().waker.fd()) {
            let _ = event_loop.call_method1("remove_reader", (fd,));
        }
        let waker = Arc::new(
            LoopWaker::with_socket()
                .map_err(|e| internal(py, format!("cannot make the event loop's wake-up socket: {e}")))?,
        );
        let fd = waker.fd();
        let drain = Drain { waker: Arc::clone(&waker), generation: generation() };
        match event_loop.call_method1("add_reader", (fd, drain)) {
            Ok(_) => Ok(waker),
            Err(e) if e.is_instance_of::<PyNotImplementedError>(py) => LoopCtx::threadsafe_waker(event_loop),
            Err(e) => Err(e),
        }
    }

    #[cfg(not(unix))]
    fn new_waker(_py: Python<'_>, event_loop: &Bound<'_, PyAny>, _known: &Bound<'_, PyAny>) -> PyResult<Arc<LoopWaker>> {
        LoopCtx::threadsafe_waker(event_loop)
    }

    /// A waker calling `loop.call_soon_threadsafe(drain)` from a blocking-pool
    /// thread. The loop is held weakly when it can be (the registry's entry
    /// must not keep its key alive).
    fn threadsafe_waker(event_loop: &Bound<'_, PyAny>) -> PyResult<Arc<LoopWaker>> {
        let py = event_loop.py();
        let (target, weak) = match py.import("weakref")?.getattr("ref")?.call1((event_loop,)) {
            Ok(weak) => (weak.unbind(), true),
            Err(_) => (event_loop.clone().unbind(), false),
        };
        Ok(Arc::new_cyclic(|me: &std::sync::Weak<LoopWaker>| {
            let me = me.clone();
            let target = Arc::new(target);
            LoopWaker::with_callback(move || {
                let (me, target) = (me.clone(), Arc::clone(&target));
                let wake = move || {
                    Python::attach(|py| {
                        let Some(me) = me.upgrade() else { return };
                        let mut event_loop = target.bind(py).clone();
                        if weak {
                            match event_loop.call0() {
                                Ok(lp) if !lp.is_none() => event_loop = lp,
                                _ => return, // the loop is gone, and its futures with it
                            }
                        }
                        let drain = Drain { waker: me, generation: generation() };
                        // A closed loop refuses: its futures are gone with it.
                        let _ = event_loop.call_method1("call_soon_threadsafe", (drain,));
                    })
                };
                match tokio::runtime::Handle::try_current() {
                    Ok(h) => drop(h.spawn_blocking(wake)),
                    Err(_) => wake(),
                }
            })
        }))
    }

    /// A new pending future of this loop.
    pub fn create_future<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.create_future.bind(py).call0()
    }

    /// Run `fut` on the runtime; its outcome completes `py_fut` on this loop.
    /// A panic inside `fut` becomes `InternalError`, never `PanicException`.
    pub fn spawn<F>(&self, py: Python<'_>, py_fut: &Bound<'_, PyAny>, fut: F) -> PyResult<()>
    where
        F: Future<Output = core::Result<Value>> + Send + 'static,
    {
        use futures_util::FutureExt;
        let rt = core::runtime::runtime().map_err(|e| core_to_py(py, &e))?;
        let waker = Arc::clone(&self.waker);
        let target = py_fut.clone().unbind();
        drop(rt.spawn(async move {
            let outcome = std::panic::AssertUnwindSafe(fut)
                .catch_unwind()
                .await
                .unwrap_or_else(|payload| Err(core::Error::from_panic(payload.as_ref())));
            waker.push((target, outcome));
        }));
        Ok(())
    }
}

/// An awaitable of `fut`'s outcome, driven by the runtime.
pub fn future_into_py<'py, F>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = core::Result<Value>> + Send + 'static,
{
    let ctx = LoopCtx::current(py)?;
    let py_fut = ctx.create_future(py)?;
    ctx.spawn(py, &py_fut, fut)?;
    Ok(py_fut)
}

/// An awaitable that is already complete (answers that need no backend).
pub fn ready<'py>(py: Python<'py>, value: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let ctx = LoopCtx::current(py)?;
    let fut = ctx.create_future(py)?;
    fut.call_method1(pyo3::intern!(py, "set_result"), (value,))?;
    Ok(fut)
}
