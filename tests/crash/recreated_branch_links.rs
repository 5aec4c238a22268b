//! A branch dropped and created again under the same name never gets its old incarnation's
//! journal links.
//!
//! The story (offline crash run, round 2 of `database_crash`): the workload dropped branch
//! `idx07` and was creating it again when the power failed: the new directory held an empty
//! `data.pages` (its header not yet durable) and no `Journals/`, an unfinished creation. The
//! reopen's link repair read the *old* `idx07`'s link record in the root's journal, re-created
//! `Journals/` and linked the old journal file into the new directory; the unfinished branch then
//! read as damaged ("the data file is empty, but Journals holds journal files") and the
//! database refused writes. Link records carry the storage id they were made for; the repair
//! now links only into a branch whose header holds that id.

use omnibus::{Database, FlushMode, Options};

fn opts() -> Options {
    Options {
        flush_mode: FlushMode::Manual,
        flush_on_close: false,
        ..Options::default()
    }
}

#[test]
fn an_unfinished_re_creation_is_not_given_the_old_links() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    {
        let db = Database::open(&path, opts()).unwrap();
        let idx = db.create_storage("idx07").unwrap();
        let mut w = idx.begin_write().unwrap();
        w.put("old", "entry").unwrap();
        w.commit().unwrap();
        let mut w = db.root().begin_write().unwrap();
        w.put("doc", "v").unwrap();
        w.commit().unwrap();
        drop(idx);
        db.drop_storage("idx07").unwrap();
        // Nothing flushed: the root's journal file, with idx07's link record, stays.
    }
    // What a crash during the new creation leaves: the directory and an empty data file.
    let branch = path.join("Indexes/idx07");
    std::fs::create_dir(&branch).unwrap();
    std::fs::File::create(branch.join("data.pages")).unwrap();

    let db = Database::open(&path, opts()).unwrap();
    assert!(db.damaged().is_empty(), "{:?}", db.damaged());
    let links: Vec<_> = std::fs::read_dir(branch.join("Journals"))
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(
        links.is_empty(),
        "the old incarnation's links were made into the new directory: {links:?}"
    );
    // The creation finishes; the new branch is empty and writable, the root intact.
    let idx = db.create_storage("idx07").unwrap();
    assert_eq!(idx.begin_read().unwrap().len(), 0);
    let mut w = idx.begin_write().unwrap();
    w.put("new", "entry").unwrap();
    w.commit().unwrap();
    let r = db.root().begin_read().unwrap();
    assert_eq!(r.get("doc").unwrap(), Some(&b"v"[..]));
}
