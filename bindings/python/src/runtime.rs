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
use std::sync::{Arc, Mutex};

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
    /// A count (reset).
    Count(u64),
    /// Nothing (ping).
    Nothing,
}

impl Value {
    fn into_py(self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        match self {
            Value::Decision(d) => Bound::new(py, crate::types::Decision::from(d)).map(Bound::into_any),
            Value::Count(n) => n.into_bound_py_any(py),
            Value::Nothing => Ok(py.None().into_bound(py)),
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

/// How a loop is told that its inbox has answers.
enum Signal {
    /// A socket pair: the runtime writes a byte, the loop watches the other end.
    #[cfg(unix)]
    Socket {
        tx: std::os::unix::net::UnixStream,
        rx: std::os::unix::net::UnixStream,
    },
    /// `loop.call_soon_threadsafe(drain)`, from a blocking-pool thread. The
    /// loop is held weakly when it can be (the registry's entry must not keep
    /// its key alive): `weak` says `event_loop` is a `weakref.ref`.
    Threadsafe { event_loop: Py<PyAny>, weak: bool },
}

struct Inbox {
    done: Vec<(Py<PyAny>, Outcome)>,
    /// A wake-up is on its way: later pushes of the batch need not send one.
    armed: bool,
}

/// One event loop's inbox of finished calls.
pub struct LoopWaker {
    inbox: Mutex<Inbox>,
    signal: Signal,
}

impl LoopWaker {
    /// Hand `outcome` for `fut` to the loop (from any thread, without the GIL).
    fn complete(self: &Arc<Self>, fut: Py<PyAny>, outcome: Outcome) {
        let first = {
            let mut inbox = self.inbox.lock().unwrap_or_else(|p| p.into_inner());
            inbox.done.push((fut, outcome));
            !std::mem::replace(&mut inbox.armed, true)
        };
        if first {
            self.wake();
        }
    }

    fn wake(self: &Arc<Self>) {
        match &self.signal {
            #[cfg(unix)]
            Signal::Socket { tx, .. } => {
                use std::io::Write;
                // Non-blocking: a full buffer already means "readable".
                let _ = (&*tx).write(&[1]);
            }
            Signal::Threadsafe { .. } => {
                let me = Arc::clone(self);
                let wake = move || {
                    Python::attach(|py| {
                        let Signal::Threadsafe { event_loop, weak } = &me.signal else { return };
                        let mut event_loop = event_loop.bind(py).clone();
                        if *weak {
                            match event_loop.call0() {
                                Ok(lp) if !lp.is_none() => event_loop = lp,
                                _ => return, // the loop is gone, and its futures with it
                            }
                        }
                        let drain = Drain { waker: Arc::clone(&me), generation: generation() };
                        // A closed loop refuses: its futures are gone with it.
                        let _ = event_loop.call_method1("call_soon_threadsafe", (drain,));
                    })
                };
                match tokio::runtime::Handle::try_current() {
                    Ok(h) => drop(h.spawn_blocking(wake)),
                    Err(_) => wake(),
                }
            }
        }
    }

    /// Set every result in the inbox (on the loop's thread).
    fn drain(&self, py: Python<'_>) {
        #[cfg(unix)]
        if let Signal::Socket { rx, .. } = &self.signal {
            use std::io::Read;
            let mut buf = [0u8; 256];
            while let Ok(n) = (&*rx).read(&mut buf) {
                if n < buf.len() {
                    break;
                }
            }
        }
        let done = {
            let mut inbox = self.inbox.lock().unwrap_or_else(|p| p.into_inner());
            inbox.armed = false;
            std::mem::take(&mut inbox.done)
        };
        for (fut, outcome) in done {
            settle(py, fut.bind(py), outcome);
        }
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
        self.waker.drain(py);
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
        use std::os::fd::AsRawFd;
        // A waker inherited through fork shares its socket with the parent.
        if let Ok(old) = known.cast::<Drain>() {
            if let Signal::Socket { rx, .. } = &old.get().waker.signal {
                let _ = event_loop.call_method1("remove_reader", (rx.as_raw_fd(),));
            }
        }
        let pair = std::os::unix::net::UnixStream::pair().and_then(|(tx, rx)| {
            tx.set_nonblocking(true)?;
            rx.set_nonblocking(true)?;
            Ok((tx, rx))
        });
        let (tx, rx) = pair.map_err(|e| internal(py, format!("cannot make the event loop's wake-up socket: {e}")))?;
        let fd = rx.as_raw_fd();
        let waker = Arc::new(LoopWaker {
            inbox: Mutex::new(Inbox { done: Vec::new(), armed: false }),
            signal: Signal::Socket { tx, rx },
        });
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

    fn threadsafe_waker(event_loop: &Bound<'_, PyAny>) -> PyResult<Arc<LoopWaker>> {
        let py = event_loop.py();
        let signal = match py.import("weakref")?.getattr("ref")?.call1((event_loop,)) {
            Ok(weak) => Signal::Threadsafe { event_loop: weak.unbind(), weak: true },
            Err(_) => Signal::Threadsafe { event_loop: event_loop.clone().unbind(), weak: false },
        };
        Ok(Arc::new(LoopWaker { inbox: Mutex::new(Inbox { done: Vec::new(), armed: false }), signal }))
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
            waker.complete(target, outcome);
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
