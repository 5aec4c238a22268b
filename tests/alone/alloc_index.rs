//! Heap allocations per index entry applied, counted (not timed) by a counting global
//! allocator over every thread: an index's feed, batch building and transaction must not come
//! back to allocating per entry or per document (the command line's old feed sent a message
//! with three owned buffers per document and index).
//!
//! The same documents go into two databases, one with an index of 8 terms per document and
//! one without; the difference, over the entries applied, is the index's cost per entry. Both
//! runs include the engine's background ticks (flusher, readers), a few allocations each,
//! which the 8,000 entries make negligible.

use std::time::Duration;

use omnibus::actors::{IndexDefinition, WriteBatch};

use crate::common::alloc;
use crate::common::index as index_common;

const DOCS: u64 = 1_000;
const TERMS: usize = 8;

fn terms(_key: &[u8], doc: &[u8]) -> Vec<Vec<u8>> {
    // Document `d<n>`: terms t0-<n> .. t7-<n>, each index of terms in its own key range. One
    // allocation per term and one for the list: the map function's share.
    let n = &doc[1..];
    let mut out = Vec::with_capacity(TERMS);
    for i in 0..TERMS {
        let mut t = Vec::with_capacity(3 + n.len());
        t.extend_from_slice(&[b't', b'0' + i as u8, b'-']);
        t.extend_from_slice(n);
        out.push(t);
    }
    out
}

/// Allocations over every thread for putting `DOCS` documents (in batches of 100) and
/// waiting for the indexes, with or without the index.
fn run(indexed: bool) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let (engine, db) = index_common::open_engine(dir.path().join("db"));
    if indexed {
        db.blocking_define_index(
            IndexDefinition::new("by_term", terms).min_batch_interval(Duration::ZERO),
        )
        .unwrap();
        db.blocking_wait_for_indexes().unwrap();
    }
    let root = db.root();
    // Warm-up: a first batch grows the trees' first pages and the engine's buffers.
    let mut warm = WriteBatch::new();
    for n in 0..100u64 {
        warm.put(format!("w{n:05}"), format!("d{}", n % 97));
    }
    root.blocking_write(warm).unwrap();
    db.blocking_wait_for_indexes().unwrap();
    let a0 = alloc::process_allocs();
    for chunk in 0..DOCS / 100 {
        let mut b = WriteBatch::new();
        for n in chunk * 100..(chunk + 1) * 100 {
            b.put(format!("k{n:05}"), format!("d{}", n % 97));
        }
        root.blocking_write(b).unwrap();
    }
    db.blocking_wait_for_indexes().unwrap();
    let used = alloc::process_allocs() - a0;
    if indexed {
        let s = &db.index_stats()[0];
        assert_eq!(s.applied_txn, s.root_txn, "{s:?}");
    }
    drop(root);
    drop(db);
    engine.shutdown().unwrap();
    used
}

#[test]
fn allocations_per_index_entry_applied() {
    let _alone = crate::common::alone();
    let without = run(false);
    let with = run(true);
    let entries = DOCS * TERMS as u64;
    let per = with.saturating_sub(without) as f64 / entries as f64;
    println!(
        "allocations: {without} without the index, {with} with it: {per:.2} per entry applied"
    );
    // 3.71 when written: the map function's list and terms (TERMS + 1 per document, 1.125 per
    // entry), the root's captured change (its key and value copies, 0.25 per entry), and the
    // index transaction's B+tree inserts (page copies as leaves are first touched). The old
    // command-line feed allocated a message and three buffers per document and index on top.
    assert!(per <= 4.0, "{per:.2} allocations per index entry applied");
}
