//! Fault injection through the hooked environment: failed syncs poison (fail-stop), ENOSPC
//! while growing the data file loses nothing, and reopening recovers every acknowledged commit.

use std::sync::Arc;

use omnibus::env::testing::{Fault, HookedEnv, OpKind};
use omnibus::env::{DefaultEnv, StorageEnv};
use omnibus::{Error, FlushMode, Options, Storage};

fn hooked() -> Arc<HookedEnv> {
    Arc::new(HookedEnv::new(Arc::new(DefaultEnv::new())))
}

fn opts(env: Arc<dyn StorageEnv>) -> Options {
    Options {
        env,
        flush_mode: FlushMode::Manual,
        ..Options::default()
    }
}

fn commit_n(s: &Storage, from: u32, to: u32) {
    for i in from..to {
        let mut w = s.begin_write().unwrap();
        w.put(format!("k{i:05}"), format!("v{i}")).unwrap();
        w.commit().unwrap();
    }
}

fn assert_keys(s: &Storage, n: u32) {
    let r = s.begin_read().unwrap();
    if r.len() != n as u64 {
        for kv in r.iter().unwrap() {
            let (k, _) = kv.unwrap();
            eprintln!("key {}", String::from_utf8_lossy(k));
        }
    }
    assert_eq!(r.len(), n as u64);
    for i in 0..n {
        assert_eq!(
            r.get(format!("k{i:05}")).unwrap(),
            Some(format!("v{i}").as_bytes()),
            "k{i:05}"
        );
    }
    let report = s.check().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
}

#[test]
fn eio_on_journal_fdatasync_fails_the_commit_and_poisons() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let env = hooked();
    let s = Storage::open(&path, opts(env.clone())).unwrap();
    commit_n(&s, 0, 50);
    env.fail_matching(OpKind::SyncData, ".journal", 1, Fault::Eio);
    let mut w = s.begin_write().unwrap();
    w.put(b"lost", b"x").unwrap();
    let err = w.commit().unwrap_err();
    assert!(
        matches!(&err, Error::Io { op: "fdatasync", source, .. } if source.raw_os_error() == Some(libc::EIO)),
        "{err:?}"
    );
    assert!(s.is_poisoned());
    // Every later write is refused, even though the next sync would succeed (no retry).
    assert!(matches!(s.begin_write(), Err(Error::Poisoned { .. })));
    assert!(matches!(s.flush(), Err(Error::Poisoned { .. })));
    // Reads still work on the last acknowledged state.
    assert_eq!(s.begin_read().unwrap().len(), 50);
    drop(s);
    let s = Storage::open(&path, opts(Arc::new(DefaultEnv::new()))).unwrap();
    // The failed commit may or may not be on disk; every acknowledged one is.
    let r = s.begin_read().unwrap();
    assert!(r.len() == 50 || r.len() == 51);
    drop(r);
    let mut w = s.begin_write().unwrap();
    w.delete(b"lost").unwrap();
    w.commit().unwrap();
    assert_keys(&s, 50);
}

#[test]
fn short_journal_write_poisons() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let env = hooked();
    let s = Storage::open(&path, opts(env.clone())).unwrap();
    commit_n(&s, 0, 10);
    env.fail_matching(OpKind::Write, ".journal", 1, Fault::ShortWrite);
    let mut w = s.begin_write().unwrap();
    w.put(b"k99999", b"x").unwrap();
    assert!(w.commit().is_err());
    assert!(s.is_poisoned());
    drop(s);
    let s = Storage::open(&path, opts(Arc::new(DefaultEnv::new()))).unwrap();
    // The failed commit is all or nothing: a half-written record fails its checksum and ends
    // the journal, unless the bytes not written were zeros anyway (the tail of a free-space
    // bitmap page over the pre-zeroed journal): then the record on disk is whole and valid.
    let r = s.begin_read().unwrap();
    match r.get(b"k99999").unwrap() {
        Some(v) => assert_eq!(v, b"x"),
        None => assert_eq!(r.len(), 10),
    }
    drop(r);
    let mut w = s.begin_write().unwrap();
    w.delete(b"k99999").unwrap();
    w.commit().unwrap();
    assert_keys(&s, 10);
}

#[test]
fn eio_on_data_file_sync_during_flush_poisons_and_reopen_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let env = hooked();
    let s = Storage::open(&path, opts(env.clone())).unwrap();
    commit_n(&s, 0, 200);
    env.fail_matching(OpKind::SyncData, "data.pages", 1, Fault::Eio);
    let err = s.flush().unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Io {
                op: "fdatasync",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(s.is_poisoned());
    assert!(matches!(s.begin_write(), Err(Error::Poisoned { .. })));
    drop(s);
    let s = Storage::open(&path, opts(Arc::new(DefaultEnv::new()))).unwrap();
    assert_keys(&s, 200);
}

#[test]
fn enospc_growing_the_data_file_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let env = hooked();
    let s = Storage::open(&path, opts(env.clone())).unwrap();
    commit_n(&s, 0, 20);
    // The next growth of the data file fails, the exact-size retry too.
    env.fail_always(OpKind::Allocate, "data.pages", Fault::Enospc);
    let mut w = s.begin_write().unwrap();
    w.put(b"huge", vec![1u8; 8 << 20]).unwrap();
    let err = w.commit().unwrap_err();
    assert!(err.is_no_space(), "{err:?}");
    // Not poisoned: nothing was written; the storage stays usable for what fits.
    assert!(!s.is_poisoned());
    assert_eq!(s.begin_read().unwrap().get(b"huge").unwrap(), None);
    commit_n(&s, 20, 30);
    env.clear();
    let mut w = s.begin_write().unwrap();
    w.put(b"huge", vec![1u8; 8 << 20]).unwrap();
    w.commit().unwrap();
    let mut w = s.begin_write().unwrap();
    w.delete(b"huge").unwrap();
    w.commit().unwrap();
    drop(s);
    let s = Storage::open(&path, opts(Arc::new(DefaultEnv::new()))).unwrap();
    assert_keys(&s, 30);
}

#[test]
fn eio_creating_a_journal_file_fails_open_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    {
        let s = Storage::open(&path, opts(Arc::new(DefaultEnv::new()))).unwrap();
        commit_n(&s, 0, 5);
    }
    let env = hooked();
    env.fail_matching(OpKind::SyncDir, "Journals", 1, Fault::Eio);
    let err = Storage::open(&path, opts(env.clone())).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    let s = Storage::open(&path, opts(Arc::new(DefaultEnv::new()))).unwrap();
    assert_keys(&s, 5);
}
