//! The policy in force, swapped whole by a reload and read by every check.

use std::cell::UnsafeCell;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::{ArcSwap, Guard};

use super::stats::{self, StripeRef, OWNED};

/// The policy in force (an [`ArcSwap`]), with a copy per held counter
/// stripe (see [`stats::stripe`]) for the embedded backend's checks.
///
/// Loading from an `ArcSwap` takes two locked instructions (the guard's
/// debt is recorded, then paid back), about an eighth of an embedded check.
/// A thread that holds a stripe keeps the `Arc` it last read in that
/// stripe's slot, with the version it was read at, and only reads the
/// `ArcSwap` again after a reload: its check reads one version number
/// instead. Threads beyond the held stripes load from the `ArcSwap`.
pub(super) struct Current<T> {
    swap: ArcSwap<T>,
    /// Stores so far (a slot read at another version is stale).
    version: AtomicU64,
    slots: Box<[Slot<T>]>,
}

/// One held stripe's copy: only the thread holding stripe `i` touches
/// slot `i` (a stripe given back and taken again orders the last use of the
/// thread that gave it back before the first of the next; see `stats`).
#[repr(align(64))]
struct Slot<T>(UnsafeCell<Option<(u64, Arc<T>)>>);

// SAFETY: a slot is only read or written by the one live thread that holds
// its stripe (see `Slot`), so it is never accessed from two threads at once;
// what it holds is an `Arc<T>`, which may move between threads when `T` is
// `Send + Sync`.
unsafe impl<T: Send + Sync> Sync for Slot<T> {}

impl<T> Current<T> {
    /// `value` in force.
    pub fn new(value: T) -> Current<T> {
        Current {
            swap: ArcSwap::from_pointee(value),
            version: AtomicU64::new(0),
            slots: (0..OWNED).map(|_| Slot(UnsafeCell::new(None))).collect(),
        }
    }

    /// Put `value` in force: checks that start after this returns use it.
    pub fn store(&self, value: Arc<T>) {
        self.swap.store(value);
        // After the swap: a thread that reads the new version reads the new value.
        self.version.fetch_add(1, Ordering::Release);
    }

    /// The value in force (held by the guard until it is dropped).
    pub fn load(&self) -> Guard<Arc<T>> {
        self.swap.load()
    }

    /// The value in force, as an `Arc` of the caller's own.
    pub fn load_full(&self) -> Arc<T> {
        self.swap.load_full()
    }

    /// `f` of the value in force and this thread's stripe (for its
    /// counters), the value read from the thread's slot when the thread
    /// holds a stripe and no store happened since it filled it. The
    /// `Arc` is taken out of the slot for the time of `f`, so a call made
    /// from within `f` (an attribute read that checks again) finds the slot
    /// empty and loads for itself.
    #[inline]
    pub fn with<R>(&self, f: impl FnOnce(&T, StripeRef) -> R) -> R {
        let stripe = stats::stripe();
        let Some(slot) = stripe.held().then(|| &self.slots[stripe.index]) else {
            return f(&self.swap.load(), stripe);
        };
        let version = self.version.load(Ordering::Acquire);
        // SAFETY: this thread holds the stripe, so nothing else touches the slot (see `Slot`).
        let kept = unsafe { (*slot.0.get()).take() };
        let value = match kept {
            Some((v, value)) if v == version => value,
            _ => self.swap.load_full(),
        };
        // Put back when `f` has returned (or unwound), by a guard, so that
        // `f`'s answer is its caller's: made in place, not moved after.
        let back = PutBack { slot, version, value: ManuallyDrop::new(value) };
        f(&back.value, stripe)
    }
}

/// [`Current::with`]'s value, put back into its slot when dropped.
struct PutBack<'a, T> {
    slot: &'a Slot<T>,
    version: u64,
    value: ManuallyDrop<Arc<T>>,
}

impl<T> Drop for PutBack<'_, T> {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: the value is taken once, here, and not used after.
        let value = unsafe { ManuallyDrop::take(&mut self.value) };
        // SAFETY: as in `with`; `f` has returned, and a call from within it has put back what it took.
        unsafe { *self.slot.0.get() = Some((self.version, value)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store is seen by the next `with` of every thread, a slot's value
    /// is given back after `f`, and a `with` inside `with` reads the same value.
    #[test]
    fn with_reads_the_value_in_force_after_every_store() {
        let c = Current::new(1u64);
        assert_eq!(c.with(|v, _| *v), 1);
        assert_eq!(c.with(|v, _| *v), 1);
        c.store(Arc::new(2));
        assert_eq!(c.with(|v, _| *v), 2);
        assert_eq!(c.with(|outer, _| (*outer, c.with(|inner, _| *inner))), (2, 2));
        std::thread::scope(|s| {
            for t in 0..(2 * OWNED as u64) {
                let c = &c;
                s.spawn(move || {
                    for i in 0..200u64 {
                        let seen = c.with(|v, _| *v);
                        assert!(seen >= 2, "thread {t} read {seen}");
                        if t == 0 && i % 50 == 0 {
                            c.store(Arc::new(3 + i));
                        }
                    }
                });
            }
        });
        c.store(Arc::new(1_000));
        std::thread::scope(|s| {
            for _ in 0..(2 * OWNED) {
                s.spawn(|| assert_eq!(c.with(|v, _| *v), 1_000));
            }
        });
        assert_eq!(c.with(|v, _| *v), 1_000);
        assert_eq!(*c.load_full(), 1_000);
    }
}
