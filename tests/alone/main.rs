//! Tests that each run alone in their process (each holds `common::alone()` throughout): they
//! count or disturb what belongs to the whole process: heap allocations (this binary installs
//! the counting allocator of `common::alloc`), resident and pinned memory, the page images the
//! memory budget holds, and signals sent to every thread.

#[allow(dead_code)] // no binary uses every helper
#[path = "../common/mod.rs"]
mod common;

#[global_allocator]
static GLOBAL: common::alloc::Counting = common::alloc::Counting;

mod actors_backpressure;
mod actors_reads_on_caller;
mod alloc_counts;
mod alloc_index;
mod delete_range_cost;
mod engine_sixteen_executors;
mod memory_budget;
mod ring_faults;
