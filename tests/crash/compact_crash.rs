//! A power loss at any point of `Storage::compact` loses nothing: for every durable operation
//! of a compaction (each `fdatasync` and directory `fsync`, the truncation's length change
//! among the unsynced changes after it), crash right after it, in each crash mode; the reopened
//! storage holds exactly the content it held before compaction and `check` is clean. Compaction
//! moves pages by ordinary copy-on-write commits and cuts the file only after a flush made the
//! header naming the shorter page space durable.

use std::sync::Arc;

use omnibus::env::testing::{CrashMode, PowerLossEnv};
use omnibus::env::{default_env, StorageEnv};
use omnibus::{FlushMode, Options, Storage};

use crate::common::model;
use model::{content, diff, Model};

fn opts(env: Arc<dyn StorageEnv>) -> Options {
    Options {
        env,
        flush_mode: FlushMode::Manual,
        // No background pre-zeroing thread: its syncs would land among compaction's durable
        // operations at times of their own, and a crash point counted in one run would not
        // come in the next.
        journal_prezero: omnibus::Prezero::Off,
        ..Options::default()
    }
}

/// Loads 4,000 keys (and a few overflow values), deletes 90% of them, flushes: a storage
/// with most of its file free. Returns the storage and its content.
fn setup(pl: &PowerLossEnv, path: &std::path::Path) -> (Storage, Model) {
    let s = Storage::open(path, opts(Arc::new(pl.clone()))).unwrap();
    let mut m = Model::new();
    for c in 0..8u32 {
        let mut w = s.begin_write().unwrap();
        for i in c * 500..(c + 1) * 500 {
            let k = format!("key{:06}", (i * 7919) % 4000).into_bytes();
            let v = vec![(i % 251) as u8; if i % 400 == 0 { 12_000 } else { 200 }];
            w.put(&k, &v).unwrap();
            m.insert(k, v);
        }
        w.commit().unwrap();
    }
    s.flush().unwrap();
    let keys: Vec<Vec<u8>> = m.keys().cloned().collect();
    let mut w = s.begin_write().unwrap();
    for (j, k) in keys.iter().enumerate() {
        if j % 10 != 0 {
            w.delete(k).unwrap();
            m.remove(k);
        }
    }
    w.commit().unwrap();
    s.flush().unwrap();
    (s, m)
}

#[test]
fn a_crash_at_any_point_of_compact_loses_nothing() {
    let base = tempfile::tempdir().unwrap();
    // Without a crash: how many durable operations compaction makes, and that it shrinks.
    let dir = tempfile::tempdir_in(base.path()).unwrap();
    let pl = PowerLossEnv::new(default_env(), dir.path());
    let path = dir.path().join("s");
    let (s, want) = setup(&pl, &path);
    let d0 = pl.durable_ops();
    let r = s.compact().unwrap();
    assert!(r.truncated && r.pages_moved > 0, "{r:?}");
    let ops = pl.durable_ops() - d0;
    assert!(ops >= 6, "compaction made only {ops} durable operations");
    drop(s);
    drop(dir);

    let mut points = 0;
    for k in 1..=ops {
        for (mode, seed) in [
            (CrashMode::DropUnsynced, 0),
            (CrashMode::KeepSubset, k),
            (CrashMode::TornSectors, k * 31),
        ] {
            let dir = tempfile::tempdir_in(base.path()).unwrap();
            let pl = PowerLossEnv::new(default_env(), dir.path());
            let path = dir.path().join("s");
            let (s, m) = setup(&pl, &path);
            assert!(m == want);
            pl.crash_after(pl.durable_ops() + k, mode, true, seed)
                .unwrap();
            let _ = s.compact();
            drop(s);
            assert!(pl.is_crashed(), "crash point {k} never reached");
            let s = Storage::open(&path, opts(default_env()))
                .unwrap_or_else(|e| panic!("point {k} {mode:?}: reopen failed: {e}"));
            let got = content(&s).unwrap();
            assert!(got == want, "point {k} {mode:?}: {}", diff(&want, &got));
            let report = s.check().unwrap();
            assert!(report.is_ok(), "point {k} {mode:?}: {:?}", report.problems);
            // And it compacts to the end after recovery.
            let r = s.compact().unwrap();
            assert!(r.limited_by_snapshot.is_none(), "{r:?}");
            assert!(s.check().unwrap().is_ok());
            points += 1;
        }
    }
    assert_eq!(points, ops * 3);
}
