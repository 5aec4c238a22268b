//! Eventual commits of several storages sharing a database's journal keep one order across
//! storages: an immediate commit of the root makes a branch's earlier eventual commit durable,
//! and a flush of the root (whose header then holds the root's eventual commit) first makes
//! every eventual commit queued before it durable, so no data file gets ahead of the journal.
//! Each case ends in a power loss that drops everything unsynced.

use std::path::Path;
use std::sync::Arc;

use omnibus::env::testing::{CrashMode, PowerLossEnv};
use omnibus::env::{default_env, StorageEnv};
use omnibus::{Database, Durability, FlushMode, Options, Storage};

fn opts(env: Arc<dyn StorageEnv>) -> Options {
    Options {
        env,
        flush_mode: FlushMode::Manual,
        // Far beyond the test: only batches, flushes and closes write eventual records.
        eventual_sync_ms: 60_000,
        ..Options::default()
    }
}

fn put(s: &Storage, k: &str, durability: Durability) {
    let mut w = s.begin_write().unwrap();
    w.set_durability(durability);
    w.put(k, b"v").unwrap();
    w.commit().unwrap();
}

/// Runs `f` on a database (root and branch `a`, each with one immediate commit) over a
/// power-loss env, crashes dropping everything unsynced, reopens, and returns whether the root
/// holds `r1` and branch `a` holds `a1`.
fn after_crash(dir: &Path, f: impl FnOnce(&Database, &Storage, &Storage)) -> (bool, bool) {
    let pl = PowerLossEnv::new(default_env(), dir);
    let path = dir.join("db");
    {
        let db = Database::open(&path, opts(Arc::new(pl.clone()))).unwrap();
        let (root, a) = (db.root(), db.create_storage("a").unwrap());
        put(&root, "r0", Durability::Immediate);
        put(&a, "a0", Durability::Immediate);
        f(&db, &root, &a);
        pl.crash(CrashMode::DropUnsynced, true, 7).unwrap();
    }
    let db = Database::open(&path, opts(default_env())).unwrap();
    let (root, a) = (db.root(), db.storage("a").unwrap());
    let (r, b) = (root.begin_read().unwrap(), a.begin_read().unwrap());
    assert!(r.get("r0").unwrap().is_some() && b.get("a0").unwrap().is_some());
    (
        r.get("r1").unwrap().is_some(),
        b.get("a1").unwrap().is_some(),
    )
}

#[test]
fn eventual_commits_keep_one_order_across_storages_of_a_shared_journal() {
    // Alone, an eventual commit is lost by the power loss (it was acknowledged when queued).
    let d = tempfile::tempdir().unwrap();
    let (_, a1) = after_crash(d.path(), |_, _, a| put(a, "a1", Durability::Eventual));
    assert!(
        !a1,
        "the eventual commit was acknowledged before it was durable"
    );

    // An immediate commit of another storage of the journal, after it, makes it durable.
    let d = tempfile::tempdir().unwrap();
    let got = after_crash(d.path(), |_, root, a| {
        put(a, "a1", Durability::Eventual);
        put(root, "r1", Durability::Immediate);
    });
    assert_eq!(got, (true, true), "(root r1, branch a1)");

    // A flush of the root writes its eventual commit into its data file: the branch's eventual
    // commit before it must be durable first (else the crash keeps r1 and loses a1).
    let d = tempfile::tempdir().unwrap();
    let got = after_crash(d.path(), |_, root, a| {
        put(a, "a1", Durability::Eventual);
        put(root, "r1", Durability::Eventual);
        root.flush().unwrap();
    });
    assert_eq!(got, (true, true), "(root r1, branch a1)");
}
