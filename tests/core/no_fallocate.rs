//! Regression: on a file system without `fallocate` (FUSE, some network and
//! overlay file systems answer EOPNOTSUPP) every commit failed once the data file had to grow:
//! growth had no fallback, only hole punching had one. Now growth extends the file and writes
//! zeros (the blocks are allocated, so a full disk is still ENOSPC at commit time), warns once,
//! and every guarantee holds: here every `fallocate` mode fails with EOPNOTSUPP, for a storage,
//! a database with a shared journal, and under power loss at many crash points.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use omnibus::env::testing::{CrashMode, Fault, HookedEnv, OpKind, PowerLossEnv};
use omnibus::env::{DefaultEnv, StorageEnv};
use omnibus::{Database, FlushMode, Options, Storage};

use crate::common::model;

/// A real environment whose `fallocate` (allocation and hole punching) always fails with
/// EOPNOTSUPP; the counter says how often it was asked.
fn no_fallocate() -> (Arc<HookedEnv>, Arc<AtomicU64>) {
    let env = Arc::new(HookedEnv::new(Arc::new(DefaultEnv::new())));
    let n = Arc::new(AtomicU64::new(0));
    let c = n.clone();
    env.set_hook(Box::new(move |op| {
        if matches!(op.kind, OpKind::Allocate | OpKind::PunchHole) {
            c.fetch_add(1, Ordering::Relaxed);
            return Some(Fault::Eopnotsupp);
        }
        None
    }));
    (env, n)
}

fn opts(env: Arc<dyn StorageEnv>) -> Options {
    Options {
        env,
        flush_mode: FlushMode::Manual,
        journal_file_size: 1 << 20,
        ..Options::default()
    }
}

fn key(i: u64) -> Vec<u8> {
    format!("k{:010}", i.wrapping_mul(0x9e37_79b9) % 10_000_000).into_bytes()
}

/// `n` keys from `from` in transactions of 500 (values of 200 bytes), each acknowledged one in
/// `model`.
fn load(s: &Storage, from: u64, n: u64, model: &mut model::Model) -> omnibus::Result<()> {
    for t in (from..from + n).step_by(500) {
        let mut w = s.begin_write()?;
        let mut mine = Vec::new();
        for i in t..(t + 500).min(from + n) {
            let v = vec![(i % 251) as u8; 200];
            w.put(key(i), &v)?;
            mine.push((key(i), v));
        }
        w.commit()?;
        model.extend(mine);
    }
    Ok(())
}

fn assert_model(path: &Path, want: &model::Model, what: &str) {
    let s = Storage::open(path, opts(Arc::new(DefaultEnv::new()))).unwrap();
    s.check().unwrap_or_else(|e| panic!("{what}: check: {e}"));
    let got = model::content(&s).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(got == *want, "{what}: {}", model::diff(want, &got));
}

#[test]
fn a_storage_grows_flushes_and_frees_without_fallocate() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let (env, asked) = no_fallocate();
    let mut want = BTreeMap::new();
    {
        let s = Storage::open(&path, opts(env.clone())).unwrap();
        load(&s, 0, 40_000, &mut want).unwrap();
        s.flush().unwrap();
        let mut w = s.begin_write().unwrap();
        for i in 0..30_000 {
            w.delete(key(i)).unwrap();
            want.remove(&key(i));
        }
        w.commit().unwrap();
        s.flush().unwrap();
        s.flush().unwrap();
        load(&s, 100_000, 20_000, &mut want).unwrap();
        s.flush().unwrap();
        let st = s.stats();
        assert!(
            st.data_file_bytes >= 8 << 20,
            "the file grew: {}",
            st.data_file_bytes
        );
        // Zeros were written, not a sparse extension: the growth is allocated.
        assert!(
            st.allocated_bytes + (1 << 20) >= st.data_file_bytes,
            "{st:?}"
        );
    }
    assert!(
        asked.load(Ordering::Relaxed) > 3,
        "fallocate was tried and refused"
    );
    assert_model(&path, &want, "after reopen");
}

#[test]
fn a_database_with_a_shared_journal_commits_without_fallocate() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let (env, asked) = no_fallocate();
    let mut root_model = BTreeMap::new();
    let mut branch_model = BTreeMap::new();
    {
        let db = Database::open(&path, opts(env.clone())).unwrap();
        let root = db.root();
        let branch = db.create_storage("by_name").unwrap();
        for round in 0..4 {
            load(&root, round * 10_000, 10_000, &mut root_model).unwrap();
            load(&branch, round * 10_000, 10_000, &mut branch_model).unwrap();
            db.flush().unwrap();
        }
    }
    assert!(asked.load(Ordering::Relaxed) > 0);
    let db = Database::open(&path, opts(Arc::new(DefaultEnv::new()))).unwrap();
    let got = model::content(&db.root()).unwrap();
    assert!(
        got == root_model,
        "root: {}",
        model::diff(&root_model, &got)
    );
    let got = model::content(&db.create_storage("by_name").unwrap()).unwrap();
    assert!(
        got == branch_model,
        "branch: {}",
        model::diff(&branch_model, &got)
    );
}

#[test]
fn power_loss_without_fallocate_loses_nothing_acknowledged() {
    for (round, crash_at) in [2u64, 5, 9, 14, 22, 31, 45].into_iter().enumerate() {
        for mode in [CrashMode::DropUnsynced, CrashMode::KeepSubset] {
            let dir = tempfile::tempdir().unwrap();
            let root = dir.path().to_path_buf();
            let (hooked, _) = no_fallocate();
            let pl = Arc::new(PowerLossEnv::new(hooked, &root));
            pl.crash_after(crash_at, mode, true, round as u64).unwrap();
            let path = root.join("s");
            let mut want = BTreeMap::new();
            let mut run = || -> omnibus::Result<()> {
                let s = Storage::open(&path, opts(pl.clone()))?;
                for k in 0..8 {
                    load(&s, k * 3_000, 3_000, &mut want)?;
                    s.flush()?;
                }
                Ok(())
            };
            let r = run();
            if !pl.is_crashed() {
                r.unwrap();
                pl.crash(mode, true, round as u64).unwrap();
            }
            assert_model(&path, &want, &format!("crash after {crash_at} ({mode:?})"));
        }
    }
}
