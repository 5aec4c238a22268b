//! The process's journal activity, as flushes and durable marks see it: how many batches are
//! being written and synced right now, and when the last one ended. A flush yields the disk
//! while the journal is busy (`crate::flush`'s pacing), because `ioprio_set` does nothing under
//! the `none` I/O scheduler of virtio and NVMe disks: priority has to come from omnibus itself;
//! an idle journal's durable mark waits likewise (design.md 3.12).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
/// Microseconds since [`epoch`] at the end of the last batch (0: none yet).
static LAST_END_US: AtomicU64 = AtomicU64::new(0);

fn epoch() -> Instant {
    static E: OnceLock<Instant> = OnceLock::new();
    *E.get_or_init(Instant::now)
}

fn now_us() -> u64 {
    epoch().elapsed().as_micros() as u64
}

/// Marks a batch's write + sync in flight until dropped.
pub(crate) struct Batch(());

/// Call around a batch's write and `fdatasync`.
pub(crate) fn batch() -> Batch {
    let _ = epoch();
    IN_FLIGHT.fetch_add(1, Ordering::AcqRel);
    Batch(())
}

impl Drop for Batch {
    fn drop(&mut self) {
        LAST_END_US.store(now_us().max(1), Ordering::Release);
        IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
    }
}

/// True while a batch is in flight or one ended less than `window` ago.
pub(crate) fn busy_within(window: Duration) -> bool {
    if IN_FLIGHT.load(Ordering::Acquire) > 0 {
        return true;
    }
    let last = LAST_END_US.load(Ordering::Acquire);
    last != 0 && now_us().saturating_sub(last) < window.as_micros() as u64
}
