//! Running the checks of one batch concurrently inside one task.
//!
//! The checks and peeks that JavaScript issues in the same tick cross into
//! Rust together (see `Limiter._flush` and index.js). [`JoinOrdered`] polls
//! them side by side, so their commands share the multiplexed connection
//! (pipelined on the wire), and it repolls only the checks whose wakers
//! fired: a batch of `n` checks costs `O(n)` polls, not `O(n^2)`.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

/// Which children asked to be polled again, and whom to tell.
#[derive(Default)]
struct Ready {
    queue: Mutex<Vec<usize>>,
    parent: Mutex<Option<Waker>>,
}

struct Child {
    index: usize,
    ready: Arc<Ready>,
}

impl Wake for Child {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        lock(&self.ready.queue).push(self.index);
        if let Some(w) = lock(&self.ready.parent).as_ref() {
            w.wake_by_ref();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

enum Slot<F: Future> {
    Running(Pin<Box<F>>, Waker),
    Done(F::Output),
    Taken,
}

/// Every future's output, in the order the futures were given.
pub(crate) struct JoinOrdered<F: Future> {
    slots: Vec<Slot<F>>,
    ready: Arc<Ready>,
    left: usize,
    started: bool,
}

impl<F: Future> JoinOrdered<F> {
    pub(crate) fn new(futures: impl IntoIterator<Item = F>) -> Self {
        let ready = Arc::new(Ready::default());
        let slots: Vec<Slot<F>> = futures
            .into_iter()
            .enumerate()
            .map(|(index, f)| {
                let waker = Waker::from(Arc::new(Child {
                    index,
                    ready: ready.clone(),
                }));
                Slot::Running(Box::pin(f), waker)
            })
            .collect();
        let left = slots.len();
        JoinOrdered {
            slots,
            ready,
            left,
            started: false,
        }
    }

    fn poll_child(&mut self, index: usize) {
        let Some(slot) = self.slots.get_mut(index) else {
            return;
        };
        if let Slot::Running(fut, waker) = slot {
            let mut cx = Context::from_waker(waker);
            if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
                *slot = Slot::Done(out);
                self.left -= 1;
            }
        }
    }
}

// The children are boxed, so the join itself holds nothing that must stay put.
impl<F: Future> Unpin for JoinOrdered<F> {}

impl<F: Future> Future for JoinOrdered<F> {
    type Output = Vec<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        {
            let mut parent = lock(&this.ready.parent);
            if !parent.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *parent = Some(cx.waker().clone());
            }
        }
        if !this.started {
            this.started = true;
            for i in 0..this.slots.len() {
                this.poll_child(i);
            }
        } else {
            // Once per poll: a child that wakes itself while polled (a used-up
            // cooperative budget) is polled on the next round, after the
            // runtime had its turn.
            let woken = std::mem::take(&mut *lock(&this.ready.queue));
            for i in woken {
                this.poll_child(i);
            }
        }
        if this.left > 0 {
            return Poll::Pending;
        }
        let out = this
            .slots
            .iter_mut()
            .map(|s| match std::mem::replace(s, Slot::Taken) {
                Slot::Done(v) => v,
                // `left` reached 0: every slot is done, and taken only here, once.
                Slot::Running(..) | Slot::Taken => {
                    unreachable!("a finished batch has every output")
                }
            })
            .collect();
        Poll::Ready(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn outputs_come_in_order_whatever_order_they_finish_in() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let futs = (0..100u64).map(|i| async move {
            tokio::time::sleep(Duration::from_micros((100 - i) * 37 % 1000)).await;
            tokio::task::yield_now().await;
            i
        });
        let out = rt.block_on(JoinOrdered::new(futs));
        assert_eq!(out, (0..100).collect::<Vec<_>>());
        let empty: Vec<std::future::Ready<u8>> = Vec::new();
        assert_eq!(rt.block_on(JoinOrdered::new(empty)), Vec::<u8>::new());
    }

    #[test]
    fn each_child_is_polled_only_when_woken() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let polls = Arc::new(AtomicUsize::new(0));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let futs = (0..64u64).map(|i| {
                let polls = polls.clone();
                let mut sleep = Box::pin(tokio::time::sleep(Duration::from_millis(1 + i % 5)));
                std::future::poll_fn(move |cx| {
                    polls.fetch_add(1, Ordering::Relaxed);
                    sleep.as_mut().poll(cx)
                })
            });
            JoinOrdered::new(futs).await
        });
        // Once to start, once when its timer fires (a spurious wake-up at most).
        assert!(polls.load(Ordering::Relaxed) <= 64 * 3, "{polls:?}");
    }
}
