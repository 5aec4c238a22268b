//! `Storage::compact` after deleting most keys: the data file's length (`st_size`) and the
//! bytes it occupies (`st_blocks`) shrink, every remaining key reads back (big values in
//! overflow runs too), `check` is clean, and so it is after a reopen. Without compaction a
//! storage whose keys were deleted keeps its file length for good (only whole free 1 MiB runs
//! are punched).

use std::os::unix::fs::MetadataExt;

use omnibus::{Options, Storage};

use crate::common::model;
use model::{content, diff, Model};

fn on_disk(path: &std::path::Path) -> (u64, u64) {
    let m = std::fs::metadata(path.join("data.pages")).unwrap();
    (m.len(), m.blocks() * 512)
}

#[test]
fn compact_moves_live_pages_down_and_truncates_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let s = Storage::open(&path, Options::default()).unwrap();
    let mut m = Model::new();
    // 20,000 keys of 200 B in 40 commits, and a value of 20 KiB every 500 keys.
    for c in 0..40u32 {
        let mut w = s.begin_write().unwrap();
        for i in c * 500..(c + 1) * 500 {
            let k = format!("key{:07}", (i * 7919) % 20_000).into_bytes();
            let v = if i % 500 == 0 {
                vec![(i % 251) as u8; 20_000]
            } else {
                vec![(i % 251) as u8; 200]
            };
            w.put(&k, &v).unwrap();
            m.insert(k, v);
        }
        w.commit().unwrap();
    }
    s.flush().unwrap();
    // Delete 90%: keep every tenth key, spread over the whole key space (so over the file).
    let keys: Vec<Vec<u8>> = m.keys().cloned().collect();
    for chunk in keys.chunks(2_000) {
        let mut w = s.begin_write().unwrap();
        for (j, k) in chunk.iter().enumerate() {
            if j % 10 != 3 {
                w.delete(k).unwrap();
                m.remove(k);
            }
        }
        w.commit().unwrap();
    }
    s.flush().unwrap();
    s.flush().unwrap();
    let before = on_disk(&path);
    let r = s.compact().unwrap();
    let after = on_disk(&path);
    println!("{r:?}\nbefore {before:?} after {after:?}");
    assert!(r.pages_moved > 0, "{r:?}");
    assert!(r.truncated && r.limited_by_snapshot.is_none(), "{r:?}");
    assert_eq!(
        (r.data_file_bytes_before, r.data_file_bytes_after),
        (before.0, after.0)
    );
    assert!(
        after.0 * 3 < before.0,
        "st_size {} -> {}",
        before.0,
        after.0
    );
    assert!(
        after.1 < before.1,
        "st_blocks bytes {} -> {}",
        before.1,
        after.1
    );
    assert!(s.check().unwrap().is_ok());
    let got = content(&s).unwrap();
    assert!(got == m, "{}", diff(&m, &got));
    // The storage keeps working: the file grows again from its new end.
    let mut w = s.begin_write().unwrap();
    for i in 0..3000u32 {
        let k = format!("new{i:05}").into_bytes();
        w.put(&k, [7u8; 300]).unwrap();
        m.insert(k, vec![7u8; 300]);
    }
    w.commit().unwrap();
    s.flush().unwrap();
    drop(s);
    let s = Storage::open(&path, Options::default()).unwrap();
    assert!(s.check().unwrap().is_ok());
    let got = content(&s).unwrap();
    assert!(got == m, "after reopen: {}", diff(&m, &got));
}

/// `Database::compact` compacts every storage in one call: the root and each branch, a report
/// each by name, every data file shorter, every key still there.
#[test]
fn database_compact_compacts_every_storage() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    // Page commits: each commit's leaves land across the file, so compaction has pages to move
    // (buffered, the puts were applied in a few large transactions and the file only shrank).
    let unbuffered = Options {
        write_buffer_bytes: 0,
        ..Options::default()
    };
    let db = omnibus::Database::open(&path, unbuffered).unwrap();
    let storages = [
        db.root(),
        db.create_storage("a").unwrap(),
        db.create_storage("b").unwrap(),
    ];
    for s in &storages {
        for c in 0..10u32 {
            let mut w = s.begin_write().unwrap();
            for i in 0..500u32 {
                w.put(format!("key{:06}", (c * 500 + i) * 7919 % 5000), [9u8; 200])
                    .unwrap();
            }
            w.commit().unwrap();
        }
        let mut w = s.begin_write().unwrap();
        for i in 100..5000u32 {
            w.delete(format!("key{i:06}")).unwrap();
        }
        w.commit().unwrap();
    }
    let reports = db.compact().unwrap();
    let names: Vec<&str> = reports.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["", "a", "b"]);
    for ((name, r), s) in reports.iter().zip(&storages) {
        assert!(r.pages_moved > 0, "{name:?}: {r:?}");
        assert!(
            r.data_file_bytes_after * 2 < r.data_file_bytes_before,
            "{name:?}: {r:?}"
        );
        assert_eq!(s.begin_read().unwrap().len(), 100, "{name:?}");
        assert!(s.check().unwrap().is_ok(), "{name:?}");
    }
    drop(storages);
    db.close().unwrap();
}
