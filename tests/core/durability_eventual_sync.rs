//! An eventual commit is acknowledged before any journal `fdatasync`, is visible at once, and
//! becomes durable within `Options::eventual_sync_ms` with no later commit: the journal's sync
//! thread writes and syncs it. Counted through the recording env (journal `SyncData` calls) and
//! proven by a power loss that drops everything unsynced; the only wait is for an event, up to
//! a generous deadline.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use omnibus::env::testing::{CrashMode, DurableOp, PowerLossEnv, RecordingEnv};
use omnibus::env::{default_env, StorageEnv};
use omnibus::{Durability, FlushMode, Options, Storage};

fn opts(env: Arc<dyn StorageEnv>, eventual_sync_ms: u64) -> Options {
    Options {
        env,
        flush_mode: FlushMode::Manual,
        eventual_sync_ms,
        ..Options::default()
    }
}

/// Journal `fdatasync` calls recorded so far.
fn journal_syncs(rec: &RecordingEnv) -> usize {
    rec.ops()
        .iter()
        .filter(
            |op| matches!(op, DurableOp::SyncData(p) if p.to_string_lossy().ends_with(".journal")),
        )
        .count()
}

/// Opens a storage in `dir/s` over a recording env over a power-loss env, commits `k` = `v` as
/// an eventual commit, and returns the three.
fn eventual_commit(dir: &Path, eventual_sync_ms: u64) -> (PowerLossEnv, RecordingEnv, Storage) {
    let pl = PowerLossEnv::new(default_env(), dir);
    let rec = RecordingEnv::new(Arc::new(pl.clone()));
    let s = Storage::open(dir.join("s"), opts(Arc::new(rec.clone()), eventual_sync_ms)).unwrap();
    let mut w = s.begin_write().unwrap();
    w.put(b"base", b"immediate").unwrap();
    w.commit().unwrap();
    let before = journal_syncs(&rec);
    let mut w = s.begin_write().unwrap();
    w.set_durability(Durability::Eventual);
    w.put(b"k", b"v").unwrap();
    w.commit().unwrap();
    // Visible at once (as redb's non-durable commits).
    assert_eq!(s.begin_read().unwrap().get(b"k").unwrap(), Some(&b"v"[..]));
    assert_eq!(s.stats().journal.eventual_commits, 1);
    // With a long interval nothing was synced for it yet; with a short one the sync thread may
    // already have: checked by the caller.
    if eventual_sync_ms >= 60_000 {
        assert_eq!(
            journal_syncs(&rec),
            before,
            "acknowledged without a journal sync"
        );
    }
    (pl, rec, s)
}

#[test]
fn eventual_commits_become_durable_within_eventual_sync_ms() {
    // 1. Acknowledged before durable: a power loss right after the commit loses it (and only
    //    it: the immediate commit before it is kept).
    let a = tempfile::tempdir().unwrap();
    let (pl, rec, s) = eventual_commit(a.path(), 60_000);
    assert_eq!(
        s.stats().journal.batches,
        1,
        "only the immediate commit was written"
    );
    let syncs = journal_syncs(&rec);
    pl.crash(CrashMode::DropUnsynced, true, 1).unwrap();
    drop(s);
    let r = Storage::open(a.path().join("s"), opts(default_env(), 100)).unwrap();
    let t = r.begin_read().unwrap();
    assert_eq!(t.get(b"base").unwrap(), Some(&b"immediate"[..]));
    assert_eq!(
        t.get(b"k").unwrap(),
        None,
        "the eventual commit was not durable yet"
    );
    assert!(syncs >= 1);
    drop((t, r));

    // 2. With no later commit, the sync thread makes it durable within eventual_sync_ms: wait
    //    (up to a generous deadline, no timing asserted) for the journal sync that covers it.
    let b = tempfile::tempdir().unwrap();
    let (pl, rec, s) = eventual_commit(b.path(), 50);
    let deadline = Instant::now() + Duration::from_secs(60);
    while s.stats().journal.batches < 2 {
        assert!(
            Instant::now() < deadline,
            "the eventual commit was never synced"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let stats = s.stats().journal;
    assert_eq!(
        stats.batches, 2,
        "one batch for the immediate commit, one by the sync thread"
    );
    assert_eq!(stats.commits, 2);
    assert!(
        journal_syncs(&rec) >= 2,
        "the sync thread's batch ends with a journal fdatasync"
    );
    pl.crash(CrashMode::DropUnsynced, true, 2).unwrap();
    drop(s);
    let r = Storage::open(b.path().join("s"), opts(default_env(), 100)).unwrap();
    assert_eq!(
        r.begin_read().unwrap().get(b"k").unwrap(),
        Some(&b"v"[..]),
        "durable without a later commit"
    );
}
