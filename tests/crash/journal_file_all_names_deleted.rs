// Regression: a journal file whose every name was deleted (the
// storage's own name, and in a database the root's name and every branch's hard link) took its
// unflushed commits with it, and the next open returned the flushed state with no error: nothing
// outside the file said it existed. Recovery found a missing file only when a later file held
// records of the same storage (a txn gap). Each journal file's start is now stated outside it
// before any batch in it is acknowledged (a start record in the previous file, or the journal
// owner's header for a session's first file): a stated file that is missing is
// `Error::Corruption` naming it.

use omnibus::{Database, Error, Options, Storage};

use crate::common::damage;
use damage::{journals, put, unflushed as opts};

#[test]
fn a_storage_journal_file_deleted_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let s = Storage::open(&path, opts()).unwrap();
    put(&s, "flushed", b"1");
    s.flush().unwrap();
    for i in 0..10 {
        put(&s, &format!("key{i}"), b"value");
    }
    drop(s);
    let newest = journals(&path.join("Journals")).pop().unwrap();
    std::fs::remove_file(&newest).unwrap();
    damage::expect_corruption(
        &path,
        &opts(),
        &newest.file_name().unwrap().to_string_lossy(),
        "the newest journal file deleted",
    );
}

#[test]
fn a_rotated_journal_file_deleted_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let (o, newest) = damage::rotated_storage(&path);
    std::fs::remove_file(&newest).unwrap();
    damage::expect_corruption(
        &path,
        &o,
        &newest.file_name().unwrap().to_string_lossy(),
        "a rotated file deleted",
    );
}

#[test]
fn a_shared_journal_file_with_every_name_deleted_is_corruption() {
    // Root documents and branch entries in the current shared file, none flushed; the root's
    // name and the branch's link are both deleted.
    for branch_only in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let db = Database::open(&path, opts()).unwrap();
        let idx = db.create_storage("idx").unwrap();
        put(&db.root(), "doc", b"document");
        put(&idx, "term", b"");
        db.flush().unwrap();
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
        let name = newest.file_name().unwrap().to_owned();
        std::fs::remove_file(&newest).unwrap();
        let link = path.join("Indexes/idx/Journals").join(&name);
        if link.exists() {
            std::fs::remove_file(&link).unwrap();
        }
        opens_as_corruption(&path, &name.to_string_lossy(), branch_only);
    }
}

/// Opening the database at `path` read-only, then read-write, is `Error::Corruption` naming
/// `name` (a journal file name).
fn opens_as_corruption(path: &std::path::Path, name: &str, branch_only: bool) {
    for read_only in [true, false] {
        let o = Options {
            read_only,
            ..opts()
        };
        match Database::open(path, o) {
            Err(Error::Corruption(c)) => assert!(c.to_string().contains(name), "{c}"),
            Err(e) => panic!("branch only {branch_only}, read_only {read_only}: {e:?}"),
            Ok(db) => panic!(
                "branch only {branch_only}, read_only {read_only}: opened without the journal \
                 file ({} root entries)",
                db.root().begin_read().unwrap().len()
            ),
        }
    }
}

#[test]
fn a_new_database_whose_only_journal_file_is_deleted_is_corruption_read_write_too() {
    // Regression: `omnibus ingest` into a new database, killed
    // with SIGKILL before any flush, then every journal name deleted. `check` (read-only)
    // said Corruption, but `put` (read-write) opened the database, silently fell back to the
    // root's flushed state and re-created the never-flushed index storages empty ("creation
    // crashed before the header pages were durable": a data file of two pages and no journal
    // file looked like an unfinished creation), and the next `check` was clean.
    // Dropped with `unflushed` options: nothing flushed, as after SIGKILL.
    for branch_only in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let db = Database::open(&path, opts()).unwrap();
        let idx = db.create_storage("idx").unwrap();
        for i in 0..10 {
            if !branch_only {
                put(&db.root(), &format!("doc{i}"), b"document");
            }
            put(&idx, &format!("term{i}"), b"");
        }
        drop((idx, db));
        let mut names = journals(&path.join("Journals"));
        names.extend(journals(&path.join("Indexes/idx/Journals")));
        assert!(!names.is_empty());
        for n in &names {
            std::fs::remove_file(n).unwrap();
        }
        let before = std::fs::read(path.join("Indexes/idx/data.pages")).unwrap();
        opens_as_corruption(&path, ".journal", branch_only);
        // Nothing was re-created over the damage.
        assert_eq!(
            std::fs::read(path.join("Indexes/idx/data.pages")).unwrap(),
            before
        );
    }
}
