//! The cooperative budget of the handles' async calls that finish on the caller's thread.
//!
//! A point read with [`super::ReadPath::Caller`] (`StorageHandle::get`, `multi_get`) reads a
//! snapshot right where it is awaited: nothing is awaited, so its future is ready at once. A
//! task looping over such calls would then never give its thread back to its runtime: on tokio
//! (whose cooperative budget only counts tokio's own resources) or glommio, every other task of
//! that worker starves, timers included. So each such call first charges its work to a
//! per-thread budget; a call that finds the budget spent starts a new one and returns `Pending`
//! once, waking itself at once, so the runtime runs its other ready tasks (and, now and then,
//! its timers) before this one goes on. This is tokio's `task::consume_budget` made
//! runtime-independent.
//!
//! The budget is spent by [`BUDGET`] units (a get is one unit, a `multi_get` one per key; 128
//! as tokio's per-task budget) or by [`SLICE`] of time, whichever comes first. Units alone are
//! not enough: a get that copies a large value or misses the CPU caches costs microseconds, and
//! a runtime looks at its timers only between task polls (tokio's workers every 61 polls, its
//! `event_interval`), so 128 such gets a poll made a 1 ms timer fire 11 ms late (p99), 29 ms at
//! worst, with 64 busy tasks (`cargo bench --bench cold_reads`, warm rows). With polls of at
//! most about [`SLICE`], 61 of them take under 1 ms; a yield costs a task switch (a fraction of
//! a microsecond), a few percent of a slice.
//!
//! State: per thread, the units charged since the last yield and the start and last instants
//! of the current burst of charges; no lock, no allocation; one clock read (`Instant::now`, the
//! vDSO) per call. Units count from one yield to the next whatever happens between calls. The
//! time slice counts within a burst: a charge more than [`IDLE`] after the previous one starts a
//! new burst (the thread was parked or ran other work, so a lone get after idle time is not
//! made to yield by the clock). A call that waited for the reader pool starts the budget again
//! ([`reset`]): its task gave the thread back meanwhile. Invariant: a task polled over and
//! over on one thread gets `Pending` at least once every [`BUDGET`] units of its own ready
//! calls, and within [`SLICE`] of ready calls made less than [`IDLE`] apart. The blocking twins
//! (`blocking_get`...) never charge the budget: they have no runtime to give back.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// Units of ready work a thread does between two yields (as tokio's per-task budget, 128).
pub(crate) const BUDGET: u32 = 128;

/// Time a thread spends in one burst of ready calls before it yields: 61 polls of this length
/// (tokio's default `event_interval`) stay under 1 ms. Measured (`cold_reads`, warm rows, 2
/// workers, 64 tasks): largest tick gap 15–29 ms with units alone, 5–7 ms with 50 µs, 3–5 ms
/// with 10 µs, at the same gets/s.
pub(crate) const SLICE: Duration = Duration::from_micros(10);

/// Longest pause between two charges of one burst: a longer one starts a new burst (the
/// time slice starts again; the units do not). A loop whose own work between two calls takes
/// longer than this (copying a 1 MiB value, the caller's work) yields by units alone.
pub(crate) const IDLE: Duration = Duration::from_millis(1);

/// One thread's budget: units charged since the last yield, when the current burst began and
/// when its last charge was made (`None`: no burst).
#[derive(Clone, Copy)]
struct Spent {
    units: u32,
    burst: Option<(Instant, Instant)>,
}

thread_local! {
    /// This thread's budget.
    static SPENT: Cell<Spent> = const { Cell::new(Spent { units: 0, burst: None }) };
}

/// Charges `units` (at least one) to this thread's budget at instant `now`; returns whether
/// the budget is spent, in which case it starts again from zero and the caller must yield once.
fn charge_at(units: usize, now: Instant) -> bool {
    SPENT.with(|cell| {
        let mut s = cell.get();
        let began = match s.burst {
            Some((began, last)) if now.saturating_duration_since(last) <= IDLE => began,
            // No burst, or a pause since the last charge: a new burst (the units go on).
            _ => now,
        };
        let u = u32::try_from(units.max(1)).unwrap_or(u32::MAX);
        s.units = s.units.saturating_add(u);
        let spent = s.units >= BUDGET || now.saturating_duration_since(began) >= SLICE;
        s = if spent {
            Spent {
                units: 0,
                burst: None,
            }
        } else {
            Spent {
                units: s.units,
                burst: Some((began, now)),
            }
        };
        cell.set(s);
        spent
    })
}

/// Charges `units` of ready work to the calling thread's budget and, when it is spent, yields
/// to the runtime once (`Pending`, with this task woken at once) before the work is done.
pub(crate) async fn consume(units: usize) {
    if charge_at(units, Instant::now()) {
        YieldOnce(false).await;
    }
}

/// Starts the calling thread's budget again: a call that waited for an answer from another
/// thread (the reader pool) gave the thread back to its runtime meanwhile, as a yield does.
pub(crate) fn reset() {
    SPENT.with(|cell| {
        cell.set(Spent {
            units: 0,
            burst: None,
        })
    });
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
        reset();
        let t = Instant::now();
        let yields = (0..10 * BUDGET).filter(|_| charge_at(1, t)).count();
        assert_eq!(yields, 10);
        // A large call spends the budget at once.
        assert!(charge_at(BUDGET as usize * 4, t));
        // Zero units count as one.
        reset();
        assert!((1..BUDGET).all(|_| !charge_at(0, t)));
        assert!(charge_at(0, t));
    }

    #[test]
    fn the_budget_is_spent_by_a_slice_of_time() {
        reset();
        let t = Instant::now();
        let step = SLICE / 4;
        // Charges a quarter slice apart: the fifth comes a whole slice after the burst began.
        let yields: Vec<bool> = (0..5).map(|i| charge_at(1, t + step * i)).collect();
        assert_eq!(yields, [false, false, false, false, true]);
        // And the next burst starts at the next charge.
        assert!(!charge_at(1, t + step * 5));
    }

    #[test]
    fn a_charge_after_idle_time_starts_a_new_burst() {
        reset();
        let t = Instant::now();
        assert!(!charge_at(1, t));
        // Longer than IDLE since the last charge: the clock owes no yield...
        let later = t + IDLE * 2;
        assert!(!charge_at(1, later));
        // ...but the units go on from the last yield.
        assert!((2..BUDGET - 1).all(|_| !charge_at(1, later)));
        assert!(charge_at(1, later));
    }

    /// A loop whose calls came more than the slice apart (a 1 MiB value copied, or 20 µs of
    /// the caller's work, between two gets) started a new burst, units reset, at every call:
    /// it never yielded, and a timer task on its thread never ran.
    #[test]
    fn calls_a_little_apart_still_yield() {
        reset();
        let t = Instant::now();
        let apart = Duration::from_micros(20);
        let yields = (0..100u32).filter(|i| charge_at(1, t + apart * *i)).count();
        assert!(yields >= 40, "{yields} yields in 100 calls 20 µs apart");
        // Calls further apart than IDLE yield by units: once every BUDGET.
        reset();
        let apart = IDLE * 2;
        let yields = (0..BUDGET * 3)
            .filter(|i| charge_at(1, t + apart * *i))
            .count();
        assert_eq!(yields, 3);
    }

    #[test]
    fn a_spent_budget_yields_once_then_goes_on() {
        use futures_lite::future::{block_on, poll_once};
        reset();
        block_on(async {
            let mut f = std::pin::pin!(consume(BUDGET as usize));
            assert!(poll_once(&mut f).await.is_none(), "pending once");
            assert!(poll_once(&mut f).await.is_some(), "then ready");
            let mut g = std::pin::pin!(consume(1));
            assert!(poll_once(&mut g).await.is_some(), "a fresh budget");
        });
    }
}
