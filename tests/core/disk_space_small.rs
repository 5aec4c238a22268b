//! Regression: a small storage kept a 50 MiB data file on disk for 0.4 MB of data.
//!
//! The story: 2,000 keys of 200 B over 287 small commits gave a
//! 50 MiB data file with 6,161 of 6,271 pages free and no hole punched, 55 MiB on disk in all.
//! The flush left unpunched as many of the lowest free pages as the commits since the last
//! flush had allocated (the "punch slack"), which was the whole file, even when the storage
//! was closing; the file kept its growth steps past `next_page`; and the closed journal kept
//! its zeroed tail. Now a flush keeps at most 1/32 of the pages in use as slack (none when
//! closing), a closing storage cuts the free tail of its data file, and a dropped journal whose
//! records are all flushed is emptied.
//!
//! The scenario writes the same workload (Manual flushes, a snapshot held across every 16
//! commits), flushes, checks the data file's bytes on disk, then closes and checks the whole
//! directory on disk. Early reuse keeps this data file small even with the old slack (the
//! user's 50 MiB file is not reproduced here; `tests/core/punch_clustered_delete.rs` covers the
//! slack); without the journal emptying at close the directory holds 5.6 MiB and this fails.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use omnibus::{FlushMode, Options, Storage};

/// Bytes on disk (st_blocks * 512) of every file under `dir`, each inode once.
fn du(dir: &Path) -> u64 {
    let mut seen = std::collections::HashSet::new();
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            if m.is_dir() {
                stack.push(e.path());
            } else if seen.insert(m.ino()) {
                total += m.blocks() * 512;
            }
        }
    }
    total
}

#[test]
fn two_thousand_small_keys_stay_small_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let s = Storage::open(
        &path,
        Options {
            flush_mode: FlushMode::Manual,
            ..Options::default()
        },
    )
    .unwrap();
    let mut next = 0u32;
    let mut held = None;
    for c in 0..287u32 {
        if c % 16 == 0 {
            // A reader that lives across a few commits keeps their freed pages from early reuse.
            held = Some(s.begin_read().unwrap());
        }
        let mut w = s.begin_write().unwrap();
        let n = if c < 2_000 % 287 { 7 } else { 6 };
        for _ in 0..n {
            let k = next.wrapping_mul(2_654_435_761) % 1_000_003;
            w.put(format!("key{k:08}"), vec![(next % 251) as u8; 200])
                .unwrap();
            next += 1;
        }
        w.commit().unwrap();
    }
    drop(held);
    assert_eq!(s.stats().entries, 2_000);
    s.flush().unwrap();
    let st = s.stats();
    let data_on_disk = std::fs::metadata(path.join("data.pages")).unwrap().blocks() * 512;
    // About 110 pages in use (0.9 MiB): the rest of the file must be holes but for partial runs.
    assert!(
        data_on_disk <= (st.pages_used * 8192) + (3 << 20),
        "{data_on_disk} bytes on disk for {} pages in use: {st:?}",
        st.pages_used
    );
    s.close().unwrap();
    let total = du(&path);
    assert!(
        total <= 3 << 20,
        "{total} bytes on disk after close (data file and journals)"
    );
    let s = Storage::open(&path, Options::default()).unwrap();
    assert_eq!(s.stats().entries, 2_000);
    assert!(s.check().unwrap().is_ok());
}
