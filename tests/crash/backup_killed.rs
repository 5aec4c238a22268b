//! A backup stopped at any point (a kill or a power loss during it) leaves a destination that
//! either opens as the whole copy or does not open at all: never a copy with a storage missing
//! or empty.
//!
//! The story: `omnibus backup dbA kb` killed with SIGKILL after
//! 161 ms left `kb` with the root and one branch whole and the other branch an empty
//! directory. The copy opened, `check` passed, and the branch was silently gone (a branch
//! directory without a data file reads as a creation that crashed before it made one). Copies
//! of plain storages cut short had a data file without header pages, which a read-write open
//! took for an unfinished creation and made an empty storage. Now a backup creates a marker
//! file first and removes it last, writes each data file under a temporary name renamed once
//! complete and durable, and puts the root's data file in place after every branch: until the
//! end, the destination opens as nothing, with an error that says "unfinished backup".

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use omnibus::env::testing::{CrashMode, PowerLossEnv};
use omnibus::env::{default_env, DefaultEnv, StorageEnv};
use omnibus::{Database, Error, Options, Storage};

const BRANCHES: [&str; 3] = ["a", "b", "c"];

/// The crash after the `k`-th durable operation: what it keeps of the unsynced writes. With
/// directory entries kept (`lose_unsynced_entries` false) and a prefix of the writes, it is
/// what a SIGKILL leaves (the page cache survives); with them lost, a power loss.
fn mode(k: u64) -> CrashMode {
    match k % 3 {
        0 => CrashMode::KeepPrefix,
        1 => CrashMode::KeepSubset,
        _ => CrashMode::DropUnsynced,
    }
}

fn opts(env: Arc<dyn StorageEnv>) -> Options {
    Options {
        env,
        ..Options::default()
    }
}

fn plain() -> Options {
    opts(Arc::new(DefaultEnv::new()))
}

fn fill(s: &Storage, n: u64, tag: &str) {
    let mut w = s.begin_write().unwrap();
    for i in 0..n {
        w.put(format!("{tag}{i:06}"), format!("value of {tag} {i}"))
            .unwrap();
    }
    w.commit().unwrap();
}

fn contents(s: &Storage) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let r = s.begin_read().unwrap();
    r.range(..)
        .unwrap()
        .map(|e| {
            let (k, v) = e.unwrap();
            (k.to_vec(), v.to_vec())
        })
        .collect()
}

/// What a database holds: storage name -> its entries.
type DbContents = BTreeMap<String, BTreeMap<Vec<u8>, Vec<u8>>>;

fn db_contents(db: &Database) -> DbContents {
    let mut out = BTreeMap::new();
    out.insert("(root)".to_string(), contents(&db.root()));
    for n in db.storages() {
        out.insert(n.clone(), contents(&db.storage(&n).unwrap()));
    }
    out
}

/// Opens the destination the way a user would after the crash; `Some` when it opened.
fn open_copy(dest: &Path, read_only: bool) -> Option<DbContents> {
    let o = Options {
        read_only,
        create: false,
        ..plain()
    };
    match Database::open(dest, o) {
        Ok(db) => {
            assert!(db.damaged().is_empty(), "{:?}", db.damaged());
            Some(db_contents(&db))
        }
        Err(Error::NotAStorage { reason, .. }) => {
            // A kill before the marker was durable leaves an empty directory (or none).
            let names: Vec<String> = std::fs::read_dir(dest)
                .map(|d| {
                    d.map(|e| e.unwrap().file_name().into_string().unwrap())
                        .collect()
                })
                .unwrap_or_default();
            let empty = names.iter().all(|n| n == "LOCK");
            assert!(
                reason.contains("unfinished backup") || empty,
                "{reason} ({names:?})"
            );
            None
        }
        Err(e) => panic!("a cut-short copy gave {e:?}"),
    }
}

/// Arms a crash after the `k`-th durable operation from now, runs `backup`, and crashes now
/// if the backup finished first (so the destination is always what a crash leaves). Returns
/// whether the backup finished.
fn cut_backup<T: std::fmt::Debug>(
    pl: &PowerLossEnv,
    k: u64,
    lose: bool,
    backup: impl FnOnce() -> omnibus::Result<T>,
) -> bool {
    pl.crash_after(pl.durable_ops() + k, mode(k), lose, k)
        .unwrap();
    let r = backup();
    assert!(r.is_ok() || pl.is_crashed(), "k {k}: {r:?}");
    let done = !pl.is_crashed();
    if done {
        pl.crash(mode(k), lose, k).unwrap();
    }
    done
}

#[test]
fn a_database_backup_cut_at_any_durable_operation_is_whole_or_refused() {
    let (mut whole, mut refused) = (0, 0);
    for (k, lose) in (1..=40u64).flat_map(|k| [(k, false), (k, true)]) {
        let dir = tempfile::tempdir().unwrap();
        let pl = Arc::new(PowerLossEnv::new(default_env(), dir.path()).with_real_sync(false));
        let src = dir.path().join("db");
        let dest = dir.path().join("copy");
        let (expected, done) = {
            let db = Database::open(&src, opts(pl.clone())).unwrap();
            fill(&db.root(), 300, "doc");
            for (i, b) in BRANCHES.iter().enumerate() {
                fill(&db.create_storage(b).unwrap(), 100 * (i as u64 + 1), b);
            }
            db.flush().unwrap();
            let expected = db_contents(&db);
            (expected, cut_backup(&pl, k, lose, || db.backup(&dest)))
        };
        for read_only in [true, false] {
            match open_copy(&dest, read_only) {
                Some(got) => {
                    assert!(
                        got == expected,
                        "k {k} lose {lose}: a copy that opens is not whole"
                    );
                    if read_only {
                        whole += 1;
                    }
                }
                None => {
                    assert!(!done, "k {k}: a finished backup must open");
                    if read_only {
                        refused += 1;
                    }
                }
            }
        }
    }
    // Both outcomes were reached: the cut points span the whole backup.
    assert!(
        whole > 0 && refused > 10,
        "whole {whole}, refused {refused}"
    );
}

#[test]
fn a_storage_backup_cut_at_any_durable_operation_is_whole_or_refused() {
    let (mut whole, mut refused) = (0, 0);
    for (k, lose) in (1..=12u64).flat_map(|k| [(k, false), (k, true)]) {
        let dir = tempfile::tempdir().unwrap();
        let pl = Arc::new(PowerLossEnv::new(default_env(), dir.path()).with_real_sync(false));
        let src = dir.path().join("s");
        let dest = dir.path().join("copy");
        let (expected, done) = {
            let s = Storage::open(&src, opts(pl.clone())).unwrap();
            fill(&s, 2_000, "k");
            s.flush().unwrap();
            let expected = contents(&s);
            (expected, cut_backup(&pl, k, lose, || s.backup(&dest)))
        };
        for read_only in [true, false] {
            let o = Options {
                read_only,
                create: false,
                ..plain()
            };
            match Storage::open(&dest, o) {
                Ok(s) => {
                    assert!(
                        contents(&s) == expected,
                        "k {k} lose {lose}: a copy that opens is not whole"
                    );
                    whole += 1;
                }
                Err(Error::NotAStorage { reason, .. }) => {
                    assert!(!done, "k {k}: a finished backup must open: {reason}");
                    refused += 1;
                }
                Err(e) => panic!("k {k}: a cut-short copy gave {e:?}"),
            }
        }
        // `create: true` (the default) must not turn a cut-short copy into an empty storage:
        // it may create one only where the crash left no directory at all.
        let existed = dest.exists();
        if let Ok(s) = Storage::open(&dest, plain()) {
            let got = contents(&s);
            assert!(
                got == expected || (!existed && got.is_empty()),
                "k {k}: opened with create: {} keys (existed: {existed})",
                got.len()
            );
        }
    }
    assert!(whole > 0 && refused > 4, "whole {whole}, refused {refused}");
}
