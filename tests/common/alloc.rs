//! A counting global allocator for the allocation tests: every allocation (and reallocation)
//! is counted on the calling thread and process-wide, then forwarded to the system allocator.
//! The `alone` binary installs it (`tests/alone/main.rs`): a process has one global allocator,
//! and the process-wide count is only meaningful while no other test runs (`common::alone`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// The counting allocator.
pub struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

static ALL: AtomicU64 = AtomicU64::new(0);

fn count() {
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
    ALL.fetch_add(1, Ordering::Relaxed);
}

// SAFETY: every call is forwarded unchanged to the system allocator; counting touches only a
// const-initialized thread-local `Cell` and a static atomic (no allocation, no re-entry).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        count();
        // SAFETY: forwarded with the caller's pointer, layout and size.
        unsafe { System.realloc(p, l, n) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(p, l) }
    }
}

/// Allocations made by the calling thread so far.
#[allow(dead_code)]
pub fn thread_allocs() -> u64 {
    ALLOCS.with(|c| c.get())
}

/// Allocations made by every thread of the process so far.
#[allow(dead_code)]
pub fn process_allocs() -> u64 {
    ALL.load(Ordering::Relaxed)
}
