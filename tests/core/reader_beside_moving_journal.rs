//! A read-only open beside a writer (design.md 6.5) reads a journal that moves under it: the
//! writer's background zeroes the current file further while the reader scans it (a batch read
//! below the length the reader took records a longer durable length), the writer starts the
//! next file after the reader listed `Journals/` (a start record read names a file the reader
//! never listed), and a flush passes the reader's replay. None of it is damage, and each attempt
//! of the open meets it again here (a hook on the reader's first read of the newest journal file
//! makes the writer do it there): an open that took the first two for damage, or read the whole
//! journal again after the third, failed every attempt.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use omnibus::env::testing::{HookedEnv, OpKind};
use omnibus::env::{DefaultEnv, StorageEnv};
use omnibus::{FlushMode, Options, Prezero, Storage};

/// The writer's zero window (`Prezero::Ahead`): the background zeroes one window when a batch
/// ends within half of one of the zeroed end.
const WINDOW: u64 = 1 << 20;
/// The background's step: it publishes each chunk of a window once synced.
const CHUNK: u64 = 256 << 10;

fn commit(s: &Storage, i: u64) {
    let mut w = s.begin_write().unwrap();
    w.put(format!("k{i:06}"), vec![(i % 251) as u8; 32 << 10])
        .unwrap();
    w.commit().unwrap();
}

/// Number of the newest journal file in `journals`.
fn newest(journals: &Path) -> u64 {
    std::fs::read_dir(journals)
        .unwrap()
        .filter_map(|e| omnibus::testing::journal::parse_file_name(e.ok()?.file_name().to_str()?))
        .max()
        .unwrap()
}

/// A read-only open of `path` through an environment whose hook runs `dance` (once per
/// attempt of the open) when the reader first reads the newest journal file, after it listed
/// the files and took that file's length; returns the storage and the dances run. The hook is
/// removed once the open returns.
fn open_reader(
    path: &Path,
    dance: impl Fn() + Send + Sync + 'static,
) -> (omnibus::Result<Storage>, u64) {
    let journals: PathBuf = path.join(omnibus::testing::layout::JOURNALS_DIR);
    let hooked = HookedEnv::new(Arc::new(DefaultEnv::new()));
    let dances = Arc::new(AtomicU64::new(0));
    let d = dances.clone();
    hooked.set_hook(Box::new(move |op| {
        if op.kind == OpKind::Read && op.offset == 0 {
            let name = op.path.file_name().and_then(|n| n.to_str());
            let no = name.and_then(omnibus::testing::journal::parse_file_name);
            if no.is_some_and(|n| n == newest(&journals)) {
                d.fetch_add(1, Ordering::SeqCst);
                dance();
            }
        }
        None
    }));
    let env: Arc<dyn StorageEnv> = Arc::new(hooked.clone());
    let r = Storage::open(
        path,
        Options {
            read_only: true,
            env,
            ..Options::default()
        },
    );
    hooked.clear();
    (r, dances.load(Ordering::SeqCst))
}

/// A writer's options for these scenarios: flushes only when the test says, no durable marks
/// and no write buffer, so that nothing but the test's commits writes to the journal.
fn quiet() -> Options {
    Options {
        flush_mode: FlushMode::Manual,
        journal_mark_ms: 0,
        write_buffer_bytes: 0,
        ..Options::default()
    }
}

/// A writer at `path` with `opts` and `commits` commits made; the count of commits made.
fn writer_with(path: &Path, opts: Options, commits: u64) -> (Storage, Arc<AtomicU64>) {
    let writer = Storage::open(path, opts).unwrap();
    let n = Arc::new(AtomicU64::new(0));
    for _ in 0..commits {
        commit(&writer, n.fetch_add(1, Ordering::SeqCst));
    }
    (writer, n)
}

/// The path of the newest journal file of the storage at `path`.
fn newest_file(path: &Path) -> std::path::PathBuf {
    let dir = path.join(omnibus::testing::layout::JOURNALS_DIR);
    dir.join(omnibus::testing::journal::file_name(newest(&dir)))
}

/// Waits (bounded) until `f` holds.
fn wait_until(what: &str, f: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < until, "waited 30 s for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_journal_file_zeroed_further_while_a_reader_scans_it_is_not_cut_short() {
    // Regression: the reader compared the durable length a batch recorded with the file's
    // length taken before that batch was written, and reported the file cut short.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let (writer, n) = writer_with(
        &path,
        Options {
            journal_prezero: Prezero::Ahead(WINDOW),
            ..quiet()
        },
        4,
    );
    let journal = newest_file(&path);
    let (w, count) = (writer.clone(), n.clone());
    // The background is idle whenever the reader takes the file's length: at the open, and
    // after each dance (it waits for the window it caused).
    let dance = move || {
        // The zeroed end the reader's length saw (the file is exactly that long: idle).
        let zeroed = std::fs::metadata(&journal).unwrap().len();
        let zero_bytes = || w.stats().journal.background_zero_bytes;
        let before = zero_bytes();
        // Batches until one ends within half a window of the zeroed end: it asks the
        // background for the next window.
        while w.stats().journal.bytes + WINDOW / 2 <= zeroed {
            commit(&w, count.fetch_add(1, Ordering::SeqCst));
        }
        // Two chunks counted: the first one is published, so the next batch records a durable
        // length past what the reader took.
        wait_until("the background's zeros", || {
            zero_bytes() >= before + 2 * CHUNK
        });
        commit(&w, count.fetch_add(1, Ordering::SeqCst));
        assert!(
            w.stats().journal.bytes < zeroed,
            "the last batch lies below the length the reader took"
        );
        assert_eq!(w.stats().journal.inline_zero_bytes, 0);
        // The whole window, so the background is idle again.
        wait_until("the background's window", || {
            zero_bytes() == before + WINDOW
        });
    };
    let (reader, dances) = open_reader(&path, dance);
    let reader = reader
        .unwrap_or_else(|e| panic!("a read-only open beside the writer ({dances} attempts): {e}"));
    assert_eq!(dances, 1, "one attempt");
    // Every batch of the dance lies below the length the reader took: it reads every commit.
    assert_eq!(
        reader.begin_read().unwrap().len(),
        n.load(Ordering::SeqCst),
        "the reader reads every commit"
    );
}

#[test]
fn a_journal_file_cut_below_a_recorded_durable_length_is_still_damage_to_a_reader() {
    // The length is taken again only to tell growth from a cut: a file that stays shorter than
    // a durable length its batches recorded is reported as before.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let (writer, _) = writer_with(
        &path,
        Options {
            flush_on_close: false,
            journal_prezero: Prezero::Ahead(WINDOW),
            ..quiet()
        },
        0,
    );
    let journal = newest_file(&path);
    let zeroed = std::fs::metadata(&journal).unwrap().len();
    let mut i = 0;
    while writer.stats().journal.bytes + WINDOW / 2 <= zeroed {
        commit(&writer, i);
        i += 1;
    }
    wait_until("the background's window", || {
        writer.stats().journal.background_zero_bytes == WINDOW
    });
    // This batch records the durable length `zeroed + WINDOW`.
    commit(&writer, i);
    assert!(writer.stats().journal.bytes < zeroed);
    drop(writer);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&journal)
        .unwrap();
    f.set_len(zeroed).unwrap();
    drop(f);
    let e = Storage::open(
        &path,
        Options {
            read_only: true,
            ..Options::default()
        },
    )
    .expect_err("a read-only open of a cut journal");
    assert!(e.is_corruption(), "{e}");
    assert!(e.to_string().contains("cut short"), "{e}");
}

#[test]
fn a_journal_file_started_after_the_reader_listed_the_files_is_not_missing() {
    // Regression: a start record read in the file being scanned named a file started after the
    // listing, and the reader reported that file missing (every name of it deleted).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let (writer, n) = writer_with(
        &path,
        Options {
            // Small whole files: the reader's length of a file covers its start record.
            journal_file_size: 1 << 20,
            journal_prezero: Prezero::WholeFile,
            ..quiet()
        },
        4,
    );
    let (w, count) = (writer.clone(), n.clone());
    let dance = move || {
        // Commits until the writer starts the next file: its start record goes into the file
        // the reader is about to scan, and its first batch into the new file.
        let started = w.stats().journal.start_records;
        while w.stats().journal.start_records == started {
            commit(&w, count.fetch_add(1, Ordering::SeqCst));
        }
    };
    let (reader, dances) = open_reader(&path, dance);
    let reader = reader
        .unwrap_or_else(|e| panic!("a read-only open beside the writer ({dances} attempts): {e}"));
    assert_eq!(dances, 1, "one attempt");
    // Every commit but the one that started the new file, whose batch is in that file.
    assert_eq!(
        reader.begin_read().unwrap().len(),
        n.load(Ordering::SeqCst) - 1,
        "the reader reads every commit of the files it listed"
    );
    // The reader catches up into the new file.
    let last = writer.stats().last_committed_txn;
    assert_eq!(reader.catch_up().unwrap(), last);
    assert_eq!(reader.begin_read().unwrap().len(), n.load(Ordering::SeqCst));
}

#[test]
fn an_attempt_a_flush_passed_goes_on_from_where_its_replay_ended() {
    // Regression: an attempt whose replay a flush passed was made again from the header, over
    // the whole journal; a writer that flushed during every such read defeated all 50 attempts.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let (writer, n) = writer_with(
        &path,
        Options {
            // No zeros ahead: the file ends at its last batch, so a batch written after the
            // reader took the length lies past it, unread, and the flush passes the replay.
            journal_prezero: Prezero::Off,
            ..quiet()
        },
        20,
    );
    let (w, count) = (writer.clone(), n.clone());
    let dance = move || {
        commit(&w, count.fetch_add(1, Ordering::SeqCst));
        w.flush().unwrap();
    };
    let (reader, dances) = open_reader(&path, dance);
    let reader = reader
        .unwrap_or_else(|e| panic!("a read-only open beside the writer ({dances} attempts): {e}"));
    // The second attempt read the journal from where the first one ended (offset past 0: no
    // dance), after the header of the flush that passed it.
    assert_eq!(
        dances, 1,
        "the second attempt reads only what the first did not"
    );
    assert_eq!(reader.stats().journal_records_replayed, 0);
    assert_eq!(
        reader.begin_read().unwrap().len(),
        n.load(Ordering::SeqCst),
        "the reader reads every commit"
    );
    assert_eq!(
        reader.begin_read().unwrap().txn_id(),
        writer.stats().last_committed_txn
    );
}
