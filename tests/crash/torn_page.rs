//! A torn data page (first 4 KiB new, second 4 KiB old) left by a flush that never reached its
//! header is repaired from the journal's full page images on recovery (design.md invariant I9).

use std::sync::Arc;

use omnibus::env::testing::{Fault, HookedEnv, OpKind};
use omnibus::env::DefaultEnv;
use omnibus::{FlushMode, Options, Storage};

fn opts() -> Options {
    Options {
        flush_mode: FlushMode::Manual,
        ..Options::default()
    }
}

#[test]
fn torn_data_pages_are_repaired_from_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let data = path.join("data.pages");
    let value = |i: u32, gen: u32| format!("value-{i}-{gen}-{}", "x".repeat((i % 50) as usize));
    {
        let s = Storage::open(&path, opts()).unwrap();
        let mut w = s.begin_write().unwrap();
        for i in 0..3000 {
            w.put(format!("key{i:05}"), value(i, 0)).unwrap();
        }
        w.commit().unwrap();
        s.flush().unwrap();
    }
    // The closing flush cuts the data file's free tail, so the next open's pages may lie
    // past its old end: those read as zeros before (a hole), which is what a tear restores.
    let mut before = std::fs::read(&data).unwrap();
    {
        let env = Arc::new(HookedEnv::new(Arc::new(DefaultEnv::new())));
        let s = Storage::open(
            &path,
            Options {
                env: env.clone(),
                ..opts()
            },
        )
        .unwrap();
        let mut w = s.begin_write().unwrap();
        for i in (0..3000).step_by(3) {
            w.put(format!("key{i:05}"), value(i, 1)).unwrap();
        }
        w.commit().unwrap();
        // The flush writes the pages, then its data-file sync fails: the header never moves.
        env.fail_matching(OpKind::SyncData, "data.pages", 1, Fault::Eio);
        assert!(s.flush().is_err());
    }
    // Tear every page that the failed flush changed: keep the new first half, restore the old
    // second half (a power loss between the two 4 KiB sectors of each page).
    let mut after = std::fs::read(&data).unwrap();
    before.resize(before.len().max(after.len()), 0);
    let mut torn = 0;
    for p in 2..(after.len() / 8192).min(before.len() / 8192) {
        let (a, b) = (p * 8192, p * 8192 + 4096);
        if after[a..a + 8192] != before[a..a + 8192] && after[b..b + 4096] != before[b..b + 4096] {
            after[b..b + 4096].copy_from_slice(&before[b..b + 4096]);
            assert!(
                !omnibus::testing::page::verify_checksum(&after[a..a + 8192]),
                "page {p} should now fail its checksum"
            );
            torn += 1;
        }
    }
    assert!(torn > 10, "only {torn} pages torn");
    std::fs::write(&data, &after).unwrap();

    let s = Storage::open(&path, opts()).unwrap();
    let r = s.begin_read().unwrap();
    assert_eq!(r.len(), 3000);
    for i in 0..3000 {
        let gen = if i % 3 == 0 { 1 } else { 0 };
        assert_eq!(
            r.get(format!("key{i:05}")).unwrap(),
            Some(value(i, gen).as_bytes())
        );
    }
    let report = s.check().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
}
