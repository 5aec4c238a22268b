// The root's name of the shared journal's newest file deleted, while only a branch has
// (unflushed) records in it and the branch's hard link is intact. The root's header states that
// file's start (docs/design.md 3.8), so the root's recovery would take the missing name for a
// file whose every name was deleted and fail the open with `Corruption`, although the branch's
// link still holds every byte. A read-write open links the root's name back from the branch's
// link before anything recovers (design.md 6.1), a read-only one reads through it: every
// acknowledged entry is there and nothing is reported.

use omnibus::{Database, Options, Storage};

use crate::common::damage;
use damage::{journals, unflushed as opts};

fn put(s: &Storage, key: &str) {
    damage::put(s, key, b"");
}

#[test]
fn the_roots_name_comes_back_from_a_branch_link() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let db = Database::open(&path, opts()).unwrap();
    let idx = db.create_storage("idx").unwrap();
    put(&db.root(), "doc");
    db.flush().unwrap();
    drop((idx, db));
    let db = Database::open(&path, opts()).unwrap();
    let idx = db.storage("idx").unwrap();
    for i in 0..10 {
        put(&idx, &format!("term{i}"));
    }
    drop((idx, db));
    let newest = journals(&path.join("Journals")).pop().unwrap();
    let link = path
        .join("Indexes/idx/Journals")
        .join(newest.file_name().unwrap());
    assert!(link.exists(), "the branch has no link to the newest file");
    std::fs::remove_file(&newest).unwrap();
    for read_only in [true, false] {
        let db = Database::open(
            &path,
            Options {
                read_only,
                ..opts()
            },
        )
        .unwrap_or_else(|e| panic!("read_only {read_only}: {e}"));
        assert!(db.damaged().is_empty(), "{:?}", db.damaged());
        assert_eq!(db.storage("idx").unwrap().begin_read().unwrap().len(), 10);
        assert_eq!(db.root().begin_read().unwrap().len(), 1);
    }
}
