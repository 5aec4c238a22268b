// Regression: with a journal file cut short (`truncate -s`) in front of its last 30 batches,
// the next open took the end of the file for the torn tail of a crash,
// replayed the 20 commits before the cut and exited 0: 30 acknowledged commits gone without an
// error. A journal file is pre-zeroed (a new file's first window, the background's windows, or
// a whole pool file) and its length is synced before a batch is written over the zeros, so a
// power loss never makes it shorter than it was when its last surviving batch was written. Each
// batch's padding record now carries that durable length; a file shorter than the length a
// batch in it recorded was cut: `Error::Corruption` naming the file. A torn *last* batch (the
// file still as long as it was) still reads as the end of the journal.

use std::path::{Path, PathBuf};

use omnibus::{Database, Error, Options, Storage};

use crate::common::damage;
use damage::{cut, put, unflushed as opts};

const COMMITS: u32 = 50;

/// The newest journal file in `dir`.
fn newest_journal(dir: &Path) -> PathBuf {
    damage::journals(dir).pop().unwrap()
}

/// A standalone storage with `COMMITS` one-put commits in its journal, one batch each, none
/// flushed; returns its directory, the journal file and where each batch starts.
fn journaled(dir: &Path) -> (PathBuf, PathBuf, Vec<u64>) {
    let path = dir.join("s");
    let s = Storage::open(&path, opts()).unwrap();
    let mut starts = Vec::new();
    for i in 0..COMMITS {
        starts.push(s.stats().journal.bytes);
        put(&s, &format!("key{i:03}"), format!("value {i}").as_bytes());
    }
    drop(s);
    let journal = newest_journal(&path.join("Journals"));
    (path, journal, starts)
}

#[test]
fn a_journal_cut_at_a_batch_start_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let (path, journal, starts) = journaled(dir.path());
    cut(&journal, starts[20]);
    damage::expect_corruption(&path, &opts(), "cut short", "cut at batch 20");
    assert_eq!(
        std::fs::metadata(&journal).unwrap().len(),
        starts[20],
        "the failed opens changed the journal file"
    );
}

#[test]
fn a_journal_cut_inside_a_record_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let (path, journal, starts) = journaled(dir.path());
    cut(&journal, starts[30] + 100);
    damage::expect_corruption(&path, &opts(), "cut short", "cut inside batch 30");
}

#[test]
fn a_journal_cut_behind_its_last_batch_but_inside_its_zeros_is_corruption() {
    // The last batch is whole, but the pre-zeroed tail that was durable before it is gone: the
    // file was cut (records after the cut may have been lost to the same cut).
    let dir = tempfile::tempdir().unwrap();
    let (path, journal, starts) = journaled(dir.path());
    cut(&journal, starts[COMMITS as usize - 1] + 4096);
    damage::expect_corruption(&path, &opts(), "cut short", "cut after the last batch");
}

#[test]
fn a_torn_last_batch_is_still_the_end_of_the_journal() {
    // What a power loss can leave: the file keeps its synced length, the last batch is torn.
    let dir = tempfile::tempdir().unwrap();
    let (path, journal, starts) = journaled(dir.path());
    let mut bytes = std::fs::read(&journal).unwrap();
    let last = starts[COMMITS as usize - 1] as usize;
    bytes[last + 60..last + 4096].fill(0);
    std::fs::write(&journal, &bytes).unwrap();
    let s = Storage::open(&path, opts()).unwrap();
    let r = s.begin_read().unwrap();
    assert_eq!(r.len(), COMMITS as u64 - 1);
    assert!(s.check().unwrap().is_ok());
}

#[test]
fn a_cut_shared_journal_file_from_the_pool_is_corruption() {
    // A database's shared journal takes whole pre-zeroed files from its pool: any cut below the
    // file size is found.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let o = Options {
        journal_file_size: 1 << 20,
        ..opts()
    };
    let db = Database::open(&path, o.clone()).unwrap();
    let idx = db.create_storage("idx").unwrap();
    let mut at = 0;
    for i in 0..40 {
        if i == 20 {
            at = db.stats().journal_bytes;
        }
        put(&db.root(), &format!("doc{i:03}"), b"document");
        put(&idx, &format!("term{i:03}"), b"");
    }
    drop((idx, db));
    let journal = newest_journal(&path.join("Journals"));
    let len = std::fs::metadata(&journal).unwrap().len();
    assert!(at > 0 && at < len, "batch 20 at {at} of {len}");
    cut(&journal, at);
    for read_only in [true, false] {
        let o = Options {
            read_only,
            ..o.clone()
        };
        match Database::open(&path, o) {
            Err(Error::Corruption(c)) => {
                assert!(c.to_string().contains("cut short"), "{c}");
                assert!(c.to_string().contains(&*journal.to_string_lossy()), "{c}");
            }
            Err(e) => panic!("read_only {read_only}: expected Corruption, got {e:?}"),
            Ok(_) => panic!("read_only {read_only}: opened without the commits after the cut"),
        }
    }
}
