//! The process's runtime for network calls, fork awareness, and call ids.
//!
//! Python's asyncio calls, and a Redis Cluster's calls from every front end
//! without an event loop of its own, run on one Tokio runtime that the core
//! makes on first use (blocking calls to one Redis node need none: the
//! calling thread uses a connection of its own): one worker thread named
//! `throttlegate`, which drives every connection of the process (measured
//! from Node: about a tenth less CPU per Redis check than a worker per CPU,
//! and no slower, since a check's work is mostly waiting). Node's Promises
//! run on a runtime made by [`new_runtime`] too, owned by napi-rs.
//!
//! **Fork.** A runtime's threads do not survive `fork()`: in a child, tasks
//! of the parent's runtime would never run. Every fork bumps a counter (a
//! `pthread_atfork` handler, so the check is an atomic load, not a system
//! call); the runtime and each limiter's Redis connections belong to the
//! generation they were made in, and a child makes its own on first use.
//! The parent's copies are leaked in the child (dropping them would wait
//! for threads that do not exist), and kept reachable so that leak checkers
//! do not report them. Call ids are reseeded in the child.

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use tokio::runtime::Runtime;

use crate::clock::system_now_us;
use crate::error::{Error, ErrorKind, Result};

/// Forks this process has gone through, as seen by the child: changes in a
/// child after every `fork()` (on Unix; constant elsewhere).
pub fn fork_generation() -> u64 {
    static FORKS: AtomicU64 = AtomicU64::new(1);
    #[cfg(unix)]
    {
        extern "C" fn in_child() {
            FORKS.fetch_add(1, Ordering::Relaxed);
        }
        static REGISTERED: std::sync::Once = std::sync::Once::new();
        // SAFETY: registers a handler that only increments an atomic, which
        // is async-signal-safe and valid in a freshly forked child.
        REGISTERED.call_once(|| unsafe {
            libc::pthread_atfork(None, None, Some(in_child));
        });
    }
    FORKS.load(Ordering::Relaxed)
}

/// A new runtime with the settings every throttlegate front end uses: one
/// worker thread named `throttlegate`, time and I/O drivers on. Node hands
/// one to napi-rs; everything else shares [`runtime`].
pub fn new_runtime() -> std::io::Result<Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("throttlegate")
        .enable_all()
        .build()
}

/// The runtimes of this process: the current generation's, and the ones
/// inherited through `fork()` (leaked, but reachable).
struct Runtimes {
    current: Option<(u64, &'static Runtime)>,
    inherited: Vec<&'static Runtime>,
}

static RUNTIMES: Mutex<Runtimes> = Mutex::new(Runtimes { current: None, inherited: Vec::new() });

thread_local! {
    /// This thread's last answer of [`runtime`]: its generation and runtime.
    static CACHED: Cell<Option<(u64, &'static Runtime)>> = const { Cell::new(None) };
}

/// The runtime that blocking and background calls run on: made on first use
/// (and again in a forked child), shared by every limiter and thread, never
/// shut down.
pub fn runtime() -> Result<&'static Runtime> {
    let generation = fork_generation();
    if let Some((g, rt)) = CACHED.with(Cell::get) {
        if g == generation {
            return Ok(rt);
        }
    }
    let mut slot = RUNTIMES.lock().unwrap_or_else(|p| p.into_inner());
    let rt = match slot.current {
        Some((g, rt)) if g == generation => rt,
        current => {
            if let Some((_, old)) = current {
                slot.inherited.push(old);
            }
            let rt = new_runtime()
                .map_err(|e| Error::new(ErrorKind::Internal, format!("cannot start the Tokio runtime: {e}")))?;
            let rt: &'static Runtime = Box::leak(Box::new(rt));
            slot.current = Some((generation, rt));
            rt
        }
    };
    CACHED.with(|c| c.set(Some((generation, rt))));
    Ok(rt)
}

/// The runtime of this generation if one was made (for dropping connections
/// inside it), without making one.
pub(crate) fn current_runtime() -> Option<&'static Runtime> {
    let generation = fork_generation();
    match RUNTIMES.lock().unwrap_or_else(|p| p.into_inner()).current {
        Some((g, rt)) if g == generation => Some(rt),
        _ => None,
    }
}

/// Run `fut` to completion on the calling thread, with [`runtime`]'s drivers.
/// Called from inside an async context (where blocking would stall it) it
/// is refused with an `invalid_argument` error instead.
pub fn block_on<F: Future>(fut: F) -> Result<F::Output> {
    refuse_inside_async()?;
    Ok(runtime()?.block_on(fut))
}

/// The error of a blocking call made from inside an async runtime, where
/// waiting would stall every task of the runtime's thread.
pub(crate) fn refuse_inside_async() -> Result<()> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(Error::invalid_argument(
            "a blocking call was made from inside an async runtime; await the async method instead",
        ));
    }
    Ok(())
}

/// Answers finished on the runtime, for a caller that waits in an event
/// loop of its own (Python's asyncio): any thread pushes without waiting for
/// the caller, only the first push of a batch wakes it (one byte on a socket
/// pair it watches, or a callback), and the caller takes every answer of the
/// batch at once on its own thread.
pub struct Inbox<T> {
    state: Mutex<(Vec<T>, bool)>,
    signal: Signal,
}

/// How an [`Inbox`] wakes its caller.
enum Signal {
    /// The pushing thread writes a byte; the caller watches the other end.
    #[cfg(unix)]
    Socket { tx: std::os::unix::net::UnixStream, rx: std::os::unix::net::UnixStream },
    /// The pushing thread calls this.
    Callback(Box<dyn Fn() + Send + Sync>),
}

impl<T> Inbox<T> {
    /// An inbox that wakes its caller through a socket pair: watch
    /// [`Inbox::fd`] for readability, then [`Inbox::drain`].
    #[cfg(unix)]
    pub fn with_socket() -> std::io::Result<Inbox<T>> {
        let (tx, rx) = std::os::unix::net::UnixStream::pair()?;
        tx.set_nonblocking(true)?;
        rx.set_nonblocking(true)?;
        Ok(Inbox { state: Mutex::new((Vec::new(), false)), signal: Signal::Socket { tx, rx } })
    }

    /// An inbox that wakes its caller by calling `wake` on the pushing thread.
    pub fn with_callback(wake: impl Fn() + Send + Sync + 'static) -> Inbox<T> {
        Inbox { state: Mutex::new((Vec::new(), false)), signal: Signal::Callback(Box::new(wake)) }
    }

    /// The socket to watch for readability (`None` for a callback inbox).
    #[cfg(unix)]
    pub fn fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        match &self.signal {
            Signal::Socket { rx, .. } => Some(rx.as_raw_fd()),
            Signal::Callback(_) => None,
        }
    }

    /// Hand over an answer (from any thread); only the first of a batch wakes the caller.
    pub fn push(&self, item: T) {
        let first = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            state.0.push(item);
            !std::mem::replace(&mut state.1, true)
        };
        if first {
            match &self.signal {
                #[cfg(unix)]
                Signal::Socket { tx, .. } => {
                    use std::io::Write;
                    // Non-blocking: a full buffer already means "readable".
                    let _ = (&*tx).write(&[1]);
                }
                Signal::Callback(wake) => wake(),
            }
        }
    }

    /// Every answer handed over since the last drain, in order (on the caller's thread).
    pub fn drain(&self) -> Vec<T> {
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
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.1 = false;
        std::mem::take(&mut state.0)
    }
}

thread_local! {
    static RNG: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// A random call id (16 hex digits). The generator is reseeded from the OS
/// after a fork, so parent and child never produce the same ids.
pub(crate) fn random_call_id() -> String {
    let generation = fork_generation();
    let x = RNG.with(|cell| {
        let (mut state, seeded) = cell.get();
        if seeded != generation || state == 0 {
            let mut seed = [0u8; 8];
            if getrandom::fill(&mut seed).is_err() {
                seed = (system_now_us() as u64 ^ ((std::process::id() as u64) << 32)).to_le_bytes();
            }
            state = u64::from_le_bytes(seed) | 1;
        }
        // wyrand
        state = state.wrapping_add(0xa076_1d64_78bd_642f);
        let t = (state as u128).wrapping_mul((state ^ 0xe703_7ed1_a0b4_28db) as u128);
        cell.set((state, generation));
        ((t >> 64) as u64) ^ (t as u64)
    });
    format!("{x:016x}")
}

/// A random lease id: 128 bits from the OS, as 32 hex digits (two
/// [`random_call_id`]s when the OS has none to give).
pub(crate) fn random_lease_id() -> String {
    let mut b = [0u8; 16];
    if getrandom::fill(&mut b).is_err() {
        return format!("{}{}", random_call_id(), random_call_id());
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(all(test, unix))]
mod tests {
    use super::{random_call_id, runtime};

    /// Fork, run `child` in the child and send back what it returns.
    fn in_child(child: impl FnOnce() -> String) -> String {
        let mut fds = [0i32; 2];
        // SAFETY: plain pipe/fork/write/_exit; the child only runs `child`.
        unsafe {
            assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
            let pid = libc::fork();
            assert!(pid >= 0, "fork failed");
            if pid == 0 {
                let out = child();
                libc::write(fds[1], out.as_ptr().cast(), out.len());
                libc::_exit(0);
            }
            libc::close(fds[1]);
            let mut buf = [0u8; 256];
            let n = libc::read(fds[0], buf.as_mut_ptr().cast(), buf.len());
            libc::waitpid(pid, std::ptr::null_mut(), 0);
            String::from_utf8_lossy(&buf[..n.max(0) as usize]).into_owned()
        }
    }

    #[test]
    fn an_inbox_wakes_once_per_batch() {
        use super::Inbox;
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        let wakes = Arc::new(AtomicUsize::new(0));
        let w = wakes.clone();
        let inbox = Inbox::with_callback(move || {
            w.fetch_add(1, Ordering::SeqCst);
        });
        (0..3).for_each(|i| inbox.push(i));
        assert_eq!((inbox.drain(), wakes.load(Ordering::SeqCst)), (vec![0, 1, 2], 1));
        inbox.push(3);
        assert_eq!((inbox.drain(), wakes.load(Ordering::SeqCst)), (vec![3], 2));
        let socket = Inbox::with_socket().unwrap();
        let fd = socket.fd().unwrap();
        (0..300).for_each(|i| socket.push(i));
        let mut pending = [0u8; 8];
        // SAFETY: a non-blocking read of our own socket into a local buffer.
        let n = unsafe { libc::recv(fd, pending.as_mut_ptr().cast(), 8, libc::MSG_PEEK) };
        assert_eq!(n, 1, "one byte for the whole batch");
        assert_eq!(socket.drain().len(), 300);
        assert!(socket.drain().is_empty());
    }

    #[test]
    fn a_forked_child_draws_other_call_ids() {
        let _ = random_call_id();
        let child = in_child(random_call_id);
        assert_eq!(child.len(), 16);
        assert_ne!(child, random_call_id(), "child and parent drew the same id");
    }

    #[test]
    fn a_forked_child_gets_a_runtime_of_its_own_that_runs() {
        let parent = runtime().unwrap() as *const _ as usize;
        let child = in_child(move || {
            let rt = runtime().unwrap();
            let mine = rt as *const _ as usize;
            // A spawned task runs: the child's runtime has live threads.
            let ran = rt.block_on(async { rt.spawn(async { 7 }).await.unwrap() });
            format!("{} {ran}", mine != parent)
        });
        assert_eq!(child, "true 7");
        assert_eq!(runtime().unwrap() as *const _ as usize, parent);
    }
}
