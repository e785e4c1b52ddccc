//! The Tokio runtime behind every call, rebuilt after `os.fork()`.
//!
//! A runtime's worker threads do not survive a fork: in the child, tasks
//! spawned on the parent's runtime would never run. The runtime is therefore
//! keyed by process id; a child builds its own on first use and leaks the
//! parent's copy (dropping it would wait for threads that do not exist).
//!
//! The global is only touched while the GIL is held, and `os.fork()` runs
//! with the GIL held, so no other thread can hold its lock at the fork.

use std::cell::OnceCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3_async_runtimes::generic::{ContextExt, Runtime as GenericRuntime};
use pyo3_async_runtimes::TaskLocals;
use tokio::runtime::{Handle, Runtime};

static RUNTIME: Mutex<Option<(u32, &'static Runtime)>> = Mutex::new(None);

fn build() -> std::io::Result<&'static Runtime> {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(1, 4);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name("throttlegate")
        .enable_all()
        .build()?;
    Ok(Box::leak(Box::new(rt)))
}

fn current() -> std::io::Result<&'static Runtime> {
    let pid = std::process::id();
    let mut slot = RUNTIME.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((owner, rt)) = *slot {
        if owner == pid {
            return Ok(rt);
        }
    }
    let rt = build()?;
    *slot = Some((pid, rt));
    Ok(rt)
}

/// This process's runtime (built on first use, and again after a fork).
pub fn get(py: Python<'_>) -> PyResult<&'static Runtime> {
    current().map_err(|e| {
        crate::errors::internal(py, format!("cannot start the Tokio runtime: {e}"))
    })
}

fn handle() -> Handle {
    match Handle::try_current() {
        Ok(h) => h,
        Err(_) => match current() {
            Ok(rt) => rt.handle().clone(),
            Err(e) => panic!("cannot start the Tokio runtime: {e}"),
        },
    }
}

tokio::task_local! {
    static TASK_LOCALS: OnceCell<TaskLocals>;
}

/// `pyo3-async-runtimes`' view of the fork-aware runtime: futures handed to
/// asyncio run on this process's runtime.
pub struct ForkAware;

impl GenericRuntime for ForkAware {
    type JoinError = tokio::task::JoinError;
    type JoinHandle = tokio::task::JoinHandle<()>;

    fn spawn<F>(fut: F) -> Self::JoinHandle
    where
        F: Future<Output = ()> + Send + 'static,
    {
        handle().spawn(fut)
    }

    fn spawn_blocking<F>(f: F) -> Self::JoinHandle
    where
        F: FnOnce() + Send + 'static,
    {
        handle().spawn_blocking(f)
    }
}

impl ContextExt for ForkAware {
    fn scope<F, R>(locals: TaskLocals, fut: F) -> Pin<Box<dyn Future<Output = R> + Send>>
    where
        F: Future<Output = R> + Send + 'static,
    {
        let cell = OnceCell::new();
        let _ = cell.set(locals);
        Box::pin(TASK_LOCALS.scope(cell, fut))
    }

    fn get_task_locals() -> Option<TaskLocals> {
        TASK_LOCALS
            .try_with(|c| c.get().cloned())
            .unwrap_or_default()
    }
}

/// Run `fut` on the runtime and hand asyncio an awaitable of its outcome.
/// A panic inside `fut` becomes `InternalError`, never `PanicException`.
pub fn future_into_py<'py, F, T>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Result<T, throttlegate::Error>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    use futures_util::FutureExt;
    get(py)?;
    pyo3_async_runtimes::generic::future_into_py::<ForkAware, _, _>(py, async move {
        let outcome = match std::panic::AssertUnwindSafe(fut).catch_unwind().await {
            Ok(Ok(v)) => crate::errors::Outcome::Ok(v),
            Ok(Err(e)) => crate::errors::Outcome::Err(e),
            Err(payload) => crate::errors::Outcome::Panic(crate::errors::panic_message(payload.as_ref())),
        };
        Ok(outcome)
    })
}
