// Regression: in a database, the shared journal file lives in the root's
// `Journals/` and is hard-linked into every branch that has a record in it. With one of those
// names deleted:
// - the root's: the root recovered without the file and lost its unflushed documents without an
//   error, and the read-write open then flushed the branches and deleted their links, the last
//   names of the file: the documents were gone for good;
// - a branch's: a read-only open (`omnibus scan`, `check`) showed an empty index without an
//   error (a read-write open re-creates the link from its link record).
// The same bytes are still reachable through another name of the file: a read-write open now
// links the root's name back (before anything is released), and a read-only open reads
// through the other name; both get every acknowledged commit.

use std::path::{Path, PathBuf};

use omnibus::{Database, FlushMode, Options, Storage};

const DOCS: u32 = 30;

fn opts() -> Options {
    Options {
        flush_mode: FlushMode::Manual,
        flush_on_close: false,
        ..Options::default()
    }
}

fn read_only() -> Options {
    Options {
        read_only: true,
        ..opts()
    }
}

fn put(s: &Storage, key: &str, value: &[u8]) {
    let mut w = s.begin_write().unwrap();
    w.put(key, value).unwrap();
    w.commit().unwrap();
}

/// A database whose root holds `DOCS` documents and whose branch `idx` holds `DOCS` entries,
/// all only in the shared journal (nothing flushed); returns its path and the journal file's
/// name.
fn database(dir: &Path) -> (PathBuf, String) {
    let path = dir.join("db");
    let db = Database::open(&path, opts()).unwrap();
    let idx = db.create_storage("idx").unwrap();
    for i in 0..DOCS {
        put(&db.root(), &format!("doc{i:03}"), b"document");
        put(&idx, &format!("term{i:03}"), b"");
    }
    drop((idx, db));
    let names = journal_names(&path.join("Indexes/idx/Journals"));
    assert_eq!(names.len(), 1, "{names:?}");
    (path, names[0].clone())
}

fn journal_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".journal"))
        .collect();
    v.sort();
    v
}

fn assert_complete(db: &Database, what: &str) {
    let root = db.root().begin_read().unwrap();
    assert_eq!(root.len(), DOCS as u64, "{what}: root documents");
    let idx = db.storage("idx").unwrap().begin_read().unwrap();
    assert_eq!(idx.len(), DOCS as u64, "{what}: index entries");
}

#[test]
fn the_roots_link_deleted_is_repaired_from_a_branch_link() {
    let dir = tempfile::tempdir().unwrap();
    let (path, name) = database(dir.path());
    std::fs::remove_file(path.join("Journals").join(&name)).unwrap();
    // Read-only: read through the branch's name of the file, writing nothing.
    {
        let db = Database::open(&path, read_only()).unwrap();
        assert_complete(&db, "read-only");
    }
    assert!(
        !path.join("Journals").join(&name).exists(),
        "a read-only open wrote"
    );
    // Read-write: the root's name is linked back before anything is flushed or released.
    {
        let db = Database::open(&path, opts()).unwrap();
        assert_complete(&db, "read-write");
        db.close().unwrap();
    }
    let db = Database::open(&path, opts()).unwrap();
    assert_complete(&db, "after the repair");
    assert!(db.damaged().is_empty());
    assert!(db.root().check().unwrap().is_ok());
}

#[test]
fn a_branch_link_deleted_reads_through_the_roots_name() {
    let dir = tempfile::tempdir().unwrap();
    let (path, name) = database(dir.path());
    std::fs::remove_file(path.join("Indexes/idx/Journals").join(&name)).unwrap();
    {
        let db = Database::open(&path, read_only()).unwrap();
        assert_complete(&db, "read-only");
    }
    assert!(
        !path.join("Indexes/idx/Journals").join(&name).exists(),
        "a read-only open wrote"
    );
    let db = Database::open(&path, opts()).unwrap();
    assert_complete(&db, "read-write");
}

#[test]
fn a_branch_whose_journals_directory_is_deleted_gets_its_links_back() {
    // The branch's read-write open used to re-create `Journals/` empty: every unflushed entry
    // gone without an error. Its link records name it, so the database links the file back.
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = database(dir.path());
    std::fs::remove_dir_all(path.join("Indexes/idx/Journals")).unwrap();
    {
        // Read-only, a storage without `Journals/` does not open: reported, not empty.
        let db = Database::open(&path, read_only()).unwrap();
        assert_eq!(db.damaged().len(), 1, "{:?}", db.damaged());
    }
    let db = Database::open(&path, opts()).unwrap();
    assert_complete(&db, "read-write");
}
