//! Background pre-zeroing (`Prezero::Ahead`): the process's `omnibus-prezero` thread writes and
//! syncs the zeros ahead of the journal's write position, so commits only overwrite zeroed,
//! synced blocks; its zeros never land on bytes the writer wrote, it never touches a file after the journal
//! moved on or was dropped, and a failed background write or sync poisons the journal while
//! every acknowledged commit survives a reopen.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use omnibus::env::testing::{Fault, HookedEnv, OpKind};
use omnibus::env::{DefaultEnv, StorageEnv};
use omnibus::testing::journal::recovery;
use omnibus::{Error, FlushMode, Options, Prezero, Storage};

const PREZERO_THREAD: &str = "omnibus-prezero";
const WINDOW: u64 = 64 << 10;

fn on_prezero_thread() -> bool {
    std::thread::current().name() == Some(PREZERO_THREAD)
}

fn opts(env: Arc<dyn StorageEnv>, file_size: u64) -> Options {
    opts_window(env, file_size, WINDOW)
}

fn opts_window(env: Arc<dyn StorageEnv>, file_size: u64, window: u64) -> Options {
    Options {
        env,
        flush_mode: FlushMode::Manual,
        flush_on_close: false,
        journal_prezero: Prezero::Ahead(window),
        journal_file_size: file_size,
        ..Options::default()
    }
}

fn key(i: u32) -> String {
    format!("k{i:05}")
}

/// A value of about 4 KiB that differs per commit (so each commit journals ~4 KiB or more).
fn value(i: u32) -> Vec<u8> {
    (0..4000u32)
        .map(|j| (i.wrapping_mul(31).wrapping_add(j * 7) % 251) as u8)
        .collect()
}

fn commit(s: &Storage, i: u32) -> omnibus::Result<()> {
    let mut w = s.begin_write()?;
    w.put(key(i), value(i))?;
    w.commit()
}

fn assert_all(path: &Path, n: u32) {
    let s = Storage::open(path, opts(Arc::new(DefaultEnv::new()), 8 << 20)).unwrap();
    let r = s.begin_read().unwrap();
    assert_eq!(r.len(), n as u64);
    for i in 0..n {
        assert_eq!(r.get(key(i)).unwrap(), Some(&value(i)[..]), "{}", key(i));
    }
    drop(r);
    let report = s.check().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
}

/// For each journal file: (records' end, file length), after checking that every byte after
/// the last record is zero.
fn journal_tails(path: &Path) -> Vec<(u64, u64)> {
    let env = DefaultEnv::new();
    let mut out = Vec::new();
    for (no, p) in recovery::list(&env, &path.join("Journals")).unwrap() {
        let end = recovery::scan(&env, &p, no, &[], |_, _, _| Ok(())).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert!(
            bytes[end.offset as usize..].iter().all(|&b| b == 0),
            "bytes after the last record of {} are not all zeros",
            p.display()
        );
        out.push((end.offset, bytes.len() as u64));
    }
    out
}

#[test]
fn background_zeroes_ahead_of_commits() {
    background_zeroes_ahead(WINDOW, 600);
}

/// A window of several background chunks (256 KiB each, each synced and published in turn).
#[test]
fn background_zeroes_large_windows_in_chunks() {
    background_zeroes_ahead(1 << 20, 1500);
}

fn background_zeroes_ahead(window: u64, n: u32) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let stats = {
        let s = Storage::open(
            &path,
            // One file holds every commit: a 4 KiB value is packed into a value page run of its
            // leaf, copied with the others at each put (up to 32 KiB a commit).
            opts_window(Arc::new(DefaultEnv::new()), 64 << 20, window),
        )
        .unwrap();
        for i in 0..n {
            commit(&s, i).unwrap();
        }
        s.stats().journal
    };
    assert_eq!(stats.commits, n as u64);
    assert!(
        stats.bytes >= n as u64 * 4096,
        "each commit journals at least 4 KiB: {stats:?}"
    );
    // Windows the writer went through past the new file's first one.
    let windows = (stats.bytes - window) / window;
    assert!(windows >= 8, "{stats:?}");
    assert!(
        stats.background_zero_bytes > 0,
        "the background zeroed nothing: {stats:?}"
    );
    assert!(
        stats.inline_zeroings < windows,
        "every window was zeroed inline: {stats:?}"
    );
    // Every byte the batches wrote was zeroed before: the first window, the background's and the
    // inline fallback's zeros cover them.
    assert!(
        window + stats.background_zero_bytes + stats.inline_zero_bytes >= stats.bytes,
        "{stats:?}"
    );
    assert_eq!(stats.inline_zero_bytes == 0, stats.inline_zeroings == 0);
    assert_eq!(stats.files_created, 1, "{stats:?}");
    // The background syncs each 256 KiB chunk it zeroes (besides, one sync per batch and one
    // for the new file).
    assert!(
        stats.fdatasyncs - stats.batches - stats.files_created
            >= stats.background_zero_bytes.div_ceil(256 << 10),
        "{stats:?}"
    );
    // One journal file: records, then zeros up to the zeroed end (the file's length), which
    // is at least as far as the zeros counted.
    let tails = journal_tails(&path);
    assert_eq!(tails.len(), 1);
    let (end, len) = tails[0];
    assert!(end >= stats.bytes && end <= len, "{end} {len} {stats:?}");
    assert_eq!(len % 4096, 0);
    assert!(
        len >= window + stats.background_zero_bytes,
        "{len} {stats:?}"
    );
    assert_all(&path, n);
}

/// Per journal file path: the byte ranges written by the commit path and by the background.
#[derive(Default)]
struct Writes {
    writer: HashMap<PathBuf, Vec<(u64, u64)>>,
    background: HashMap<PathBuf, Vec<(u64, u64)>>,
    removed: HashSet<PathBuf>,
    /// Background operations on a file after it was removed or renamed, or zeros written over
    /// bytes the writer wrote before.
    late: Vec<String>,
}

fn overlaps(a: &[(u64, u64)], b: &[(u64, u64)]) -> Option<((u64, u64), (u64, u64))> {
    for x in a {
        for y in b {
            if x.0 < y.1 && y.0 < x.1 {
                return Some((*x, *y));
            }
        }
    }
    None
}

#[test]
fn background_zeros_never_overlap_records_across_rotations() {
    let dir = tempfile::tempdir().unwrap();
    // On a loaded machine the commits can outrun the pre-zeroing thread for a whole run (the
    // writer zeroes inline then): such a run shows nothing, so it is run again, up to 5 times.
    for i in 0..5 {
        if background_zeros_checked(&dir.path().join(format!("s{i}"))) {
            return;
        }
    }
    panic!("the pre-zeroing thread wrote nothing in 5 runs");
}

/// One run of the workload at `path`: false when the pre-zeroing thread wrote nothing, else
/// the checks (which panic on a failure) passed.
fn background_zeros_checked(path: &Path) -> bool {
    let path = path.to_path_buf();
    let env = Arc::new(HookedEnv::new(Arc::new(DefaultEnv::new())));
    let writes = Arc::new(Mutex::new(Writes::default()));
    let w2 = writes.clone();
    env.set_hook(Box::new(move |op| {
        let journal = op.path.extension().is_some_and(|e| e == "journal");
        let mut w = w2.lock().unwrap();
        if on_prezero_thread() {
            if w.removed.contains(op.path) {
                let msg = format!("{:?} {} after removal", op.kind, op.path.display());
                w.late.push(msg);
            }
            if op.kind == OpKind::Write {
                let range = (op.offset, op.offset + op.len);
                // Zeros go only where the writer has not written (yet): never over a record.
                let mine = w.writer.get(op.path).map(Vec::as_slice).unwrap_or(&[]);
                if let Some((a, b)) = overlaps(&[range], mine) {
                    let msg = format!(
                        "{}: background zeros {a:?} over the writer's {b:?}",
                        op.path.display()
                    );
                    w.late.push(msg);
                }
                w.background
                    .entry(op.path.to_path_buf())
                    .or_default()
                    .push(range);
            }
        } else if journal && op.kind == OpKind::Write {
            w.writer
                .entry(op.path.to_path_buf())
                .or_default()
                .push((op.offset, op.offset + op.len));
        } else if journal && matches!(op.kind, OpKind::Remove | OpKind::Rename) {
            w.removed.insert(op.path.to_path_buf());
        }
        None
    }));
    const N: u32 = 500;
    let stats = {
        // 256 KiB files: a rotation every ~30 commits, with windows in flight.
        let s = Storage::open(&path, opts(env.clone(), 256 << 10)).unwrap();
        for i in 0..N {
            commit(&s, i).unwrap();
            if i % 40 == 39 {
                s.flush().unwrap();
            }
        }
        s.stats().journal
    };
    env.clear();
    assert!(stats.files_created >= 10, "{stats:?}");
    if stats.background_zero_bytes == 0 {
        return false;
    }
    let w = writes.lock().unwrap();
    assert!(w.late.is_empty(), "{:?}", w.late);
    let bg: u64 = w.background.values().flatten().map(|(a, b)| b - a).sum();
    // A window requested by the last commits may still have been written after the stats were
    // taken (dropping the storage waits it out).
    assert!(
        bg >= stats.background_zero_bytes && bg <= stats.background_zero_bytes + WINDOW,
        "{bg} {stats:?}"
    );
    for ranges in w.background.values() {
        // The background starts where the file's first window ends, never below.
        assert!(
            ranges.iter().all(|r| r.0 >= WINDOW && r.1 <= 256 << 10),
            "{ranges:?}"
        );
    }
    drop(w);
    for (end, len) in journal_tails(&path) {
        assert!(end <= len);
    }
    assert_all(&path, N);
    true
}

/// Commits until one fails (at most `max`); returns the number acknowledged and the error.
fn commit_until_error(s: &Storage, max: u32) -> (u32, Error) {
    for i in 0..max {
        if let Err(e) = commit(s, i) {
            return (i, e);
        }
    }
    panic!("{max} commits and no error");
}

/// Arms `fault` on the `nth` operation of `kind` that the pre-zeroing thread makes through
/// `env`; the returned flag is set once it fired.
fn fail_background(env: &HookedEnv, kind: OpKind, nth: u64, fault: Fault) -> Arc<AtomicBool> {
    let seen = Arc::new(AtomicU64::new(0));
    let fired = Arc::new(AtomicBool::new(false));
    let f2 = fired.clone();
    env.set_hook(Box::new(move |op| {
        if op.kind == kind && on_prezero_thread() && seen.fetch_add(1, Ordering::SeqCst) + 1 == nth
        {
            f2.store(true, Ordering::SeqCst);
            return Some(fault);
        }
        None
    }));
    fired
}

fn background_failure_poisons(kind: OpKind, nth: u64, op: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let env = Arc::new(HookedEnv::new(Arc::new(DefaultEnv::new())));
    let fired = fail_background(&env, kind, nth, Fault::Eio);
    let s = Storage::open(&path, opts(env.clone(), 16 << 20)).unwrap();
    let (acked, err) = commit_until_error(&s, 2000);
    assert!(fired.load(Ordering::SeqCst), "the fault never fired");
    // The first failing commit reports the background's I/O error (its batch found it), or is
    // refused as poisoned (the storage saw it first); every later write is refused too (no
    // retry into success).
    match &err {
        Error::Io { op: o, source, .. } => {
            assert_eq!(*o, op, "{err:?}");
            assert_eq!(source.raw_os_error(), Some(libc::EIO), "{err:?}");
        }
        Error::Poisoned { cause } => {
            assert!(
                cause.contains("background pre-zeroing") && cause.contains(op),
                "{err:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(s.is_poisoned());
    let p = s.stats().journal;
    assert!(acked > 0, "{p:?}");
    assert!(matches!(
        s.begin_write().map(|_| ()),
        Err(Error::Poisoned { .. })
    ));
    assert!(matches!(commit(&s, acked), Err(Error::Poisoned { .. })));
    assert_eq!(s.begin_read().unwrap().len(), acked as u64);
    drop(s);
    env.clear();
    // Reopening recovers every acknowledged commit (the failed one wrote nothing: it failed
    // before its batch).
    assert_all(&path, acked);
}

#[test]
fn failed_background_zero_write_falls_back_to_inline_zeroing() {
    // A failed background write (a full disk, a bad block) published nothing: the background
    // stops for this file, commits zero inline when they need room, nothing is poisoned.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let env = Arc::new(HookedEnv::new(Arc::new(DefaultEnv::new())));
    let fired = fail_background(&env, OpKind::Write, 2, Fault::Eio);
    let s = Storage::open(&path, opts(env.clone(), 16 << 20)).unwrap();
    let n = 600;
    for i in 0..n {
        commit(&s, i).unwrap();
    }
    assert!(fired.load(Ordering::SeqCst), "the fault never fired");
    assert!(!s.is_poisoned());
    let j = s.stats().journal;
    assert!(j.inline_zeroings > 0, "{j:?}");
    drop(s);
    env.clear();
    assert_all(&path, n);
}

#[test]
fn a_full_disk_reaches_the_committer_as_no_space() {
    // Regression: with background pre-zeroing, ENOSPC from the zero writes
    // poisoned the journal from the background thread, and every caller got `Poisoned` with
    // the error as text: `is_no_space()` was false everywhere. The journal file's writes past
    // 256 KiB fail with ENOSPC on any thread, as on a full disk.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let env = Arc::new(HookedEnv::new(Arc::new(DefaultEnv::new())));
    env.set_hook(Box::new(|op| {
        let journal = op.path.to_string_lossy().contains("Journals");
        (journal && op.kind == OpKind::Write && op.offset + op.len > 256 << 10)
            .then_some(Fault::Enospc)
    }));
    let s = Storage::open(&path, opts(env.clone(), 16 << 20)).unwrap();
    let (acked, err) = commit_until_error(&s, 2000);
    assert!(acked > 10, "{acked}");
    assert!(err.is_no_space(), "{err:?}");
    drop(s);
    env.clear();
    assert_all(&path, acked);
}

#[test]
fn failed_background_fdatasync_poisons_and_reopen_recovers() {
    background_failure_poisons(OpKind::SyncData, 1, "fdatasync");
}

#[test]
fn dropping_the_storage_waits_out_background_zeroing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let env = Arc::new(HookedEnv::new(Arc::new(DefaultEnv::new())));
    let closed = Arc::new(AtomicBool::new(false));
    let late = Arc::new(AtomicU64::new(0));
    let background_syncs = Arc::new(AtomicU64::new(0));
    let (c2, l2, b2) = (closed.clone(), late.clone(), background_syncs.clone());
    env.set_hook(Box::new(move |op| {
        if !on_prezero_thread() {
            return None;
        }
        if c2.load(Ordering::SeqCst) {
            l2.fetch_add(1, Ordering::SeqCst);
        }
        if op.kind == OpKind::SyncData {
            b2.fetch_add(1, Ordering::SeqCst);
            // A slow background sync: the storage is dropped while it is held here, before the
            // sync runs; the drop must wait for it.
            std::thread::sleep(Duration::from_millis(150));
            if c2.load(Ordering::SeqCst) {
                l2.fetch_add(1, Ordering::SeqCst);
            }
        }
        None
    }));
    let s = Storage::open(&path, opts(env.clone(), 16 << 20)).unwrap();
    let mut i = 0;
    // Commit until a background window is in flight (bounded).
    while background_syncs.load(Ordering::SeqCst) == 0 && i < 2000 {
        commit(&s, i).unwrap();
        i += 1;
    }
    assert!(background_syncs.load(Ordering::SeqCst) > 0);
    drop(s);
    closed.store(true, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        late.load(Ordering::SeqCst),
        0,
        "the background touched the journal after the storage was dropped"
    );
    env.clear();
    assert_all(&path, i);
}

#[test]
fn a_window_larger_than_a_journal_file_is_capped_at_the_file() {
    // Regression: `Ahead(1 GiB)` with 1 MiB journal files zeroed every new file to
    // 1 GiB, inside the commit that started it. A window is capped at one file: every journal
    // file stays within two file sizes (a batch may end a window past the file's nominal end).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let env: Arc<dyn StorageEnv> = Arc::new(DefaultEnv::new());
    let s = Storage::open(&path, opts_window(env, 1 << 20, 64 << 20)).unwrap();
    let n = 700;
    for i in 0..n {
        commit(&s, i).unwrap();
    }
    assert!(s.stats().journal_files >= 2, "{:?}", s.stats());
    for e in std::fs::read_dir(path.join("Journals")).unwrap() {
        let len = e.unwrap().metadata().unwrap().len();
        assert!(len <= 2 << 20, "a journal file of {len} bytes");
    }
    drop(s);
    assert_all(&path, n);
}
