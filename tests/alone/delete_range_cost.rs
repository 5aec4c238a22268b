//! `delete_range` over most of a three-level tree works per page, not per key: subtrees inside
//! the range are freed whole, and only the two boundary paths are copied and trimmed. Counted,
//! not timed: the heap allocations of the call (a delete per key, which descends from the root
//! and decodes the leaf each time, makes about a dozen allocations per key; this makes well under
//! one), and the pages the commit journals (a handful); the freed leaves and overflow runs
//! leave the tree, which `check` finds consistent.

use omnibus::{Options, Storage};

use crate::common::alloc;

fn key(i: u32) -> Vec<u8> {
    // Long keys keep branches narrow: 1,500 keys make a tree of three levels.
    let mut k = format!("{i:05}-").into_bytes();
    k.resize(6 + [0usize, 40, 300, 900][(i % 4) as usize], b'p');
    k
}

#[test]
fn delete_range_copies_only_the_boundary_paths() {
    let _alone = crate::common::alone();
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(
        dir.path().join("s"),
        Options {
            write_buffer_bytes: 0,
            ..Options::default()
        },
    )
    .unwrap();
    let mut w = s.begin_write().unwrap();
    for i in 0..1500 {
        // Every 10th value is an overflow run.
        let v = vec![i as u8; if i % 10 == 0 { 5000 } else { 20 }];
        w.put(key(i), v).unwrap();
    }
    w.commit().unwrap();
    let before = s.check().unwrap();
    assert!(before.is_ok());
    assert!(before.depth >= 3, "depth {}", before.depth);
    let leaves_etc = before.pages_in_use;

    let journaled = s.stats().pages_journaled;
    let mut w = s.begin_write().unwrap();
    let (lo, hi) = (key(100), key(1400));
    let allocs = alloc::thread_allocs();
    let n = w.delete_range(lo.as_slice()..hi.as_slice()).unwrap();
    let allocs = alloc::thread_allocs() - allocs;
    assert_eq!(n, 1300);
    eprintln!("delete_range of {n} keys: {allocs} allocations");
    assert!(allocs < n / 2, "{allocs} allocations to delete {n} keys");
    assert_eq!(w.len(), 200);
    w.commit().unwrap();
    let pages = s.stats().pages_journaled - journaled;
    // Root, two boundary branches, two boundary leaves, free-space map pages: a few; the range
    // covered over 100 leaves and 130 overflow runs.
    assert!(pages <= 12, "{pages} pages journaled for a range delete");

    let after = s.check().unwrap();
    assert!(after.is_ok(), "{:?}", after.problems);
    assert_eq!(after.entries, 200);
    assert!(
        after.pages_in_use * 4 < leaves_etc,
        "{} pages in use after, {} before",
        after.pages_in_use,
        leaves_etc
    );
    let r = s.begin_read().unwrap();
    let got: Vec<Vec<u8>> = r.iter().unwrap().map(|kv| kv.unwrap().0.to_vec()).collect();
    let want: Vec<Vec<u8>> = (0..100).chain(1400..1500).map(key).collect();
    assert!(got == want);
    let back: Vec<Vec<u8>> = r
        .iter()
        .unwrap()
        .rev()
        .map(|kv| kv.unwrap().0.to_vec())
        .collect();
    assert!(back.iter().eq(want.iter().rev()));
}
