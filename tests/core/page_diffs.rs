//! Page diffs (design.md invariant I9): a page copied from a committed page is journaled as the
//! byte ranges that differ from it, and recovery rebuilds it from that base.

use std::sync::Arc;

use omnibus::env::testing::{Fault, HookedEnv, OpKind};
use omnibus::env::DefaultEnv;
use omnibus::{FlushMode, Options, Storage};

fn opts() -> Options {
    Options {
        flush_mode: FlushMode::Manual,
        flush_on_close: false,
        // Page commits: their diffs are what is measured.
        write_buffer_bytes: 0,
        ..Options::default()
    }
}

fn value(i: u32, gen: u32) -> String {
    format!("value-{i}-{gen}-{}", "x".repeat((i % 60) as usize))
}

/// Loads `n` keys in one commit and flushes them.
fn load(path: &std::path::Path, n: u32) {
    let s = Storage::open(path, opts()).unwrap();
    let mut w = s.begin_write().unwrap();
    for i in 0..n {
        w.put(format!("key{i:06}"), value(i, 0)).unwrap();
    }
    w.commit().unwrap();
    s.flush().unwrap();
    s.close().unwrap();
}

/// Journal files in the storage's `Journals/` that hold commit records (non-empty).
fn replay_pending(path: &std::path::Path) -> bool {
    let s = Storage::open(
        path,
        Options {
            read_only: true,
            ..opts()
        },
    )
    .unwrap();
    let st = s.stats();
    st.last_committed_txn > st.last_flushed_txn
}

#[test]
fn small_commits_journal_diffs_of_a_few_hundred_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    load(&path, 20_000);
    let s = Storage::open(&path, opts()).unwrap();
    let before = s.stats();
    const COMMITS: u32 = 300;
    for c in 0..COMMITS {
        let i = (c * 7919) % 20_000;
        let mut w = s.begin_write().unwrap();
        w.put(format!("key{i:06}"), value(i, 1)).unwrap();
        w.commit().unwrap();
    }
    let st = s.stats();
    let pages = st.pages_journaled - before.pages_journaled;
    let diffs = st.pages_journaled_as_diffs - before.pages_journaled_as_diffs;
    // Each commit copies a leaf and its branches (diffs) and rewrites one bitmap page (full).
    assert!(pages >= 3 * COMMITS as u64, "{pages} pages journaled");
    assert!(
        diffs >= 2 * COMMITS as u64,
        "only {diffs} of {pages} pages were diffs"
    );
    let bytes = st.journal.bytes - before.journal.bytes;
    assert!(
        bytes <= 4096 * COMMITS as u64,
        "{} journal bytes per one-put commit: diffs should fit one 4 KiB block",
        bytes / COMMITS as u64
    );
    // Everything reads back after recovery rebuilds the diffs (no flush since the load).
    drop(s);
    assert!(
        replay_pending(&path),
        "the commits must be replayed from the journal"
    );
    let s = Storage::open(&path, opts()).unwrap();
    let r = s.begin_read().unwrap();
    for c in 0..COMMITS {
        let i = (c * 7919) % 20_000;
        assert_eq!(
            r.get(format!("key{i:06}")).unwrap(),
            Some(value(i, 1).as_bytes())
        );
    }
    assert!(s.check().unwrap().is_ok());
}

// Regression: the first version of page diffs let the writer reuse a page as soon as no
// snapshot could read it. A commit journaled leaf X as a diff against the leaf B it was copied
// from (and freed); the next commit reused B; a flush wrote that new B into the data file and
// then failed before its header. Recovery replayed X from the old header, read the base B from
// the data file, found the newer page there, and rebuilt a page that failed its checksum: every
// commit since the header was lost. Freed pages now wait for a durable header past the
// transaction that freed them.
#[test]
fn a_diff_base_is_not_overwritten_before_the_header_passes_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    load(&path, 5_000);
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
        // Many one-put commits: each copies (and frees) the leaf the previous one wrote.
        for gen in 1..=40u32 {
            let mut w = s.begin_write().unwrap();
            for i in (0..5_000).step_by(500) {
                w.put(format!("key{i:06}"), value(i, gen)).unwrap();
            }
            w.commit().unwrap();
        }
        assert!(s.stats().pages_journaled_as_diffs > 100);
        // The flush writes its pages, then its data-file sync fails: the header never moves.
        env.fail_matching(OpKind::SyncData, "data.pages", 1, Fault::Eio);
        assert!(s.flush().is_err());
    }
    let s = Storage::open(&path, opts()).unwrap();
    let r = s.begin_read().unwrap();
    assert_eq!(r.len(), 5_000);
    for i in 0..5_000u32 {
        let gen = if i % 500 == 0 { 40 } else { 0 };
        assert_eq!(
            r.get(format!("key{i:06}")).unwrap(),
            Some(value(i, gen).as_bytes()),
            "key {i}"
        );
    }
    let report = s.check().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
}

#[test]
fn a_missing_diff_base_is_reported_as_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    load(&path, 5_000);
    {
        let s = Storage::open(&path, opts()).unwrap();
        let mut w = s.begin_write().unwrap();
        w.put("key000100", "changed").unwrap();
        w.commit().unwrap();
        assert!(s.stats().pages_journaled_as_diffs >= 1);
    }
    assert!(
        replay_pending(&path),
        "the commit must be replayed from the journal"
    );
    // Damage every tree page of the data file (all flushed: the diffs' bases).
    let data = path.join("data.pages");
    let mut bytes = std::fs::read(&data).unwrap();
    for p in 2..bytes.len() / 8192 {
        let kind = bytes[p * 8192 + 4];
        if kind == 2 || kind == 3 {
            bytes[p * 8192 + 100] ^= 0xff;
        }
    }
    std::fs::write(&data, &bytes).unwrap();
    match Storage::open(&path, opts()) {
        Err(omnibus::Error::Corruption(_)) => {}
        other => panic!("expected a corruption error, got {other:?}"),
    }
}
