// Regression: with a database's current journal file, which held 400 unflushed documents, cut
// to between 0 and 4,095 bytes, `omnibus check` exited
// 0 and showed the 3,000 flushed documents. The length check of `tests/crash/journal_cut.rs` lives in
// each batch's padding record, inside the file: a cut that removes the first batch (and with
// it every padding record) left nothing that said the file ever held a synced batch, and a file
// that a crash left right after its creation looks the same. Each journal file's start is now
// stated outside it before any batch in it is acknowledged (a start record in the previous
// file, or the journal owner's header for a session's first file), so recovery knows the length
// the file had at least: a shorter file is `Error::Corruption` naming it.

use std::path::Path;

use omnibus::{Database, Error, Options, Storage};

use crate::common::damage;
use damage::{cut, journals, put, unflushed as opts};

/// Opens the database `path` read-only, then for writing; each must fail with `Corruption`
/// naming `file`.
fn expect_database_corruption(path: &Path, o: &Options, file: &Path, what: &str) {
    for read_only in [true, false] {
        let o = Options {
            read_only,
            ..o.clone()
        };
        match Database::open(path, o) {
            Err(Error::Corruption(c)) => {
                let name = file.file_name().unwrap().to_string_lossy();
                assert!(c.to_string().contains(&*name), "{what}: {c}");
            }
            Err(e) => panic!("{what} (read_only {read_only}): expected Corruption, got {e:?}"),
            Ok(_) => panic!("{what} (read_only {read_only}): opened without the cut commits"),
        }
    }
}

#[test]
fn a_storage_journal_cut_into_its_first_batch_is_corruption() {
    for len in [0, 100, 4095] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let s = Storage::open(&path, opts()).unwrap();
        for i in 0..10 {
            put(&s, &format!("key{i}"), b"value");
        }
        drop(s);
        let files = journals(&path.join("Journals"));
        let newest = files.last().unwrap();
        cut(newest, len);
        let what = format!("the session's first file cut to {len} bytes");
        damage::expect_corruption(&path, &opts(), "journal", &what);
        damage::expect_corruption(
            &path,
            &opts(),
            &newest.file_name().unwrap().to_string_lossy(),
            &what,
        );
    }
}

#[test]
fn a_rotated_journal_file_cut_into_its_first_batch_is_corruption() {
    // The file started during the session (a rotation): its start is stated in the previous
    // file.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    // One commit in the new file, none flushed.
    let (o, newest) = damage::rotated_storage(&path);
    cut(&newest, 0);
    damage::expect_corruption(
        &path,
        &o,
        &newest.file_name().unwrap().to_string_lossy(),
        "a rotated file cut to 0",
    );
}

#[test]
fn a_database_journal_cut_into_its_first_batch_is_corruption() {
    // The root's unflushed documents, then (in another database) only a branch's unflushed
    // entries, in the current shared file: both lost to a cut to under 4 KiB.
    for branch_only in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let db = Database::open(&path, opts()).unwrap();
        let idx = db.create_storage("idx").unwrap();
        if branch_only {
            put(&db.root(), "doc", b"document");
            db.flush().unwrap();
        }
        // A fresh session: the next commits start a new file.
        drop((idx, db));
        let db = Database::open(&path, opts()).unwrap();
        let idx = db.storage("idx").unwrap();
        for i in 0..10 {
            if !branch_only {
                put(&db.root(), &format!("doc{i}"), b"document");
            }
            put(&idx, &format!("term{i}"), b"");
        }
        drop((idx, db));
        let newest = journals(&path.join("Journals")).pop().unwrap();
        let what = format!("branch only {branch_only}");
        for len in [0, 4095] {
            cut(&newest, len);
            expect_database_corruption(&path, &opts(), &newest, &what);
        }
    }
}

#[test]
fn a_crash_right_after_a_file_was_started_is_no_corruption() {
    // What a power loss may leave is never damage: a session that started its file and
    // acknowledged nothing, then the file's zeros kept (a crash after the sync of its creation).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let s = Storage::open(&path, opts()).unwrap();
    put(&s, "a", b"1");
    drop(s);
    for _ in 0..3 {
        let s = Storage::open(&path, opts()).unwrap();
        assert_eq!(s.begin_read().unwrap().len(), 1);
        drop(s);
    }
    let s = Storage::open(&path, opts()).unwrap();
    assert!(s.check().unwrap().is_ok());
}
