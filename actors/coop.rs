//! The cooperative budget of the handles' async calls that finish on the caller's thread.
//!
//! A point read with [`super::ReadPath::Caller`] (`StorageHandle::get`, `multi_get`) reads a
//! snapshot right where it is awaited: nothing is awaited, so its future is ready at once. A
//! task looping over such calls would then never give its thread back to its runtime: on tokio
//! (whose cooperative budget only counts tokio's own resources) or glommio, every other task of
//! that worker starves, timers included. So each such call first charges its work to a
//! per-thread budget of [`BUDGET`] units (a get is one unit, a `multi_get` one per key); a call
//! that finds the budget spent refills it and returns `Pending` once, waking itself at once, so
//! the runtime runs its other ready tasks and its timers before this one goes on. This is
//! tokio's `task::consume_budget` made runtime-independent (tokio's budget is 128 units, as
//! here).
//!
//! State: one counter per thread (the executor thread polling the future); no lock, no
//! allocation. Invariant: a task polled over and over on one thread gets `Pending` at least
//! once every [`BUDGET`] units of its own ready calls. The blocking twins (`blocking_get`...)
//! never charge the budget: they have no runtime to give back.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Units of ready work a thread does between two yields (as tokio's per-task budget, 128).
pub(crate) const BUDGET: u32 = 128;

thread_local! {
    /// Units charged on this thread since its last yield.
    static SPENT: Cell<u32> = const { Cell::new(0) };
}

/// Charges `units` (at least one) to this thread's budget; returns whether the budget is
/// spent, in which case it starts again from zero and the caller must yield once.
fn charge(units: usize) -> bool {
    SPENT.with(|s| {
        let u = u32::try_from(units.max(1)).unwrap_or(u32::MAX);
        let spent = s.get().saturating_add(u);
        if spent >= BUDGET {
            s.set(0);
            true
        } else {
            s.set(spent);
            false
        }
    })
}

/// Charges `units` of ready work to the calling thread's budget and, when it is spent, yields
/// to the runtime once (`Pending`, with this task woken at once) before the work is done.
pub(crate) async fn consume(units: usize) {
    if charge(units) {
        YieldOnce(false).await;
    }
}

/// `Pending` at the first poll (waking its task), ready at the next.
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_spent_every_budget_units() {
        SPENT.with(|s| s.set(0));
        let yields = (0..10 * BUDGET).filter(|_| charge(1)).count();
        assert_eq!(yields, 10);
        // A large call spends the budget at once.
        assert!(charge(BUDGET as usize * 4));
        // Zero units count as one.
        SPENT.with(|s| s.set(BUDGET - 1));
        assert!(charge(0));
    }

    #[test]
    fn a_spent_budget_yields_once_then_goes_on() {
        use futures_lite::future::{block_on, poll_once};
        SPENT.with(|s| s.set(BUDGET - 1));
        block_on(async {
            let mut f = std::pin::pin!(consume(1));
            assert!(poll_once(&mut f).await.is_none(), "pending once");
            assert!(poll_once(&mut f).await.is_some(), "then ready");
            let mut g = std::pin::pin!(consume(1));
            assert!(poll_once(&mut g).await.is_some(), "a fresh budget");
        });
    }
}
