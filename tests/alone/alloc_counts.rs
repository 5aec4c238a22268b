//! Heap allocations on the commit path, counted (not timed) by a counting global allocator, so
//! a change that brings back per-page or per-key allocations fails here instead of showing up
//! later as malloc in a profile. Only the test's own thread is counted: with
//! `FlushMode::Manual` and one committer, the commit (group commit included: a lone committer
//! leads its own batch) runs entirely on it; the pre-zeroing thread's allocations are not.
//!
//! The bounds are what the engine does now plus a little headroom; the comments say what the
//! code did before the allocation work.

use omnibus::{FlushMode, Options, Storage};

use crate::common::alloc;

fn allocs() -> u64 {
    alloc::thread_allocs()
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn key(i: u64) -> [u8; 24] {
    let mut k = [0u8; 24];
    k[..8].copy_from_slice(&splitmix64(i).to_be_bytes());
    k[8..16].copy_from_slice(&splitmix64(!i).to_be_bytes());
    k[16..].copy_from_slice(&i.to_be_bytes());
    k
}

fn open(dir: &std::path::Path) -> Storage {
    Storage::open(
        dir,
        Options {
            flush_mode: FlushMode::Manual,
            // Page commits: the counts are those of a commit that copies pages.
            write_buffer_bytes: 0,
            ..Options::default()
        },
    )
    .unwrap()
}

fn load(s: &Storage, from: u64, n: u64) {
    let mut w = s.begin_write().unwrap();
    for i in from..from + n {
        w.put(key(i), [7u8; 150]).unwrap();
    }
    w.commit().unwrap();
}

#[test]
fn allocations_per_one_put_commit() {
    let _alone = crate::common::alone();
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir.path().join("s"));
    load(&s, 0, 20_000);
    s.flush().unwrap();
    let one = |i: u64| {
        let mut w = s.begin_write().unwrap();
        w.put(key(i), [1u8; 100]).unwrap();
        w.commit().unwrap();
    };
    for i in 0..300 {
        one(1_000_000 + i);
    }
    let n = 1_000;
    let a0 = allocs();
    for i in 0..n {
        one(2_000_000 + i);
    }
    let per = (allocs() - a0) as f64 / n as f64;
    println!("allocations per one-put commit: {per:.1}");
    // 20.3 now (cargo test's profile), since a freed one-page image's buffer is reused by the
    // next image made on its thread, the writer keeps the free-space directory's and the taken
    // runs' vectors, and the scratch table's base is a trie of page numbers. Before that: 26.5
    // (25.5 when first recorded), since the writer keeps the transaction's page maps between
    // transactions (`TxnMaps`) and the commit makes no Vec for its bitmaps' writes; before
    // that: 34.6 (each map's table made anew in every commit); before (31fb501): 35.6 (a Vec
    // of diff ranges per page, a separate map of bitmap edits in between).
    assert!(per <= 22.0, "{per:.1} allocations per one-put commit");
}

#[test]
fn allocations_per_key_in_random_batches() {
    let _alone = crate::common::alone();
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir.path().join("s"));
    load(&s, 0, 20_000);
    s.flush().unwrap();
    for b in 0..3 {
        load(&s, 100_000 + b * 1_000, 1_000);
    }
    let batches = 10;
    let a0 = allocs();
    for b in 0..batches {
        load(&s, 200_000 + b * 1_000, 1_000);
    }
    let per = (allocs() - a0) as f64 / (batches * 1_000) as f64;
    println!("allocations per key in 1,000-key random batches: {per:.2}");
    // 2.78 now (cargo test's profile), since full leaves are re-packed or split in page form
    // (`LeafCells`: no decode into a Vec per key and per value); 7.33 before that (74696d2).
    // Before (31fb501): 8.12 (a Box and an Arc copy per re-encoded leaf, a Vec of diff ranges
    // per page).
    assert!(per <= 3.2, "{per:.2} allocations per key");
}

#[test]
fn allocations_per_key_in_random_delete_batches() {
    let _alone = crate::common::alone();
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir.path().join("s"));
    load(&s, 0, 40_000);
    s.flush().unwrap();
    let delete = |from: u64| {
        let mut w = s.begin_write().unwrap();
        // Every 20th key of a 20,000-key stretch: 1,000 deletes in leaves all over the tree.
        for i in (from..from + 20_000).step_by(20) {
            assert!(w.delete(key(i)).unwrap());
        }
        w.commit().unwrap();
    };
    delete(1);
    let a0 = allocs();
    delete(2);
    delete(3);
    let per = (allocs() - a0) as f64 / 2_000.0;
    println!("allocations per key in 1,000-key random delete batches: {per:.2}");
    // Deletes edit a leaf in page form (`leaf_delete_in_place`): 3.63 now (cargo test's
    // profile: the leaf's copy, scratch-table and record bookkeeping, as for puts). Before
    // (e9861da), each delete decoded its leaf and branches into a Vec per key and per value
    // and re-encoded them at commit: 50.56 per key.
    assert!(per <= 4.2, "{per:.2} allocations per key");
}
