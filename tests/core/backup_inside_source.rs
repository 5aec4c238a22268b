//! A backup written inside the directory it copies is refused.
//!
//! The story: a user called `db.backup("<db>/Indexes/bk")`; it succeeded, and the
//! copy then showed up as a branch storage `bk` of the very database it was taken from (in
//! `check`, in `scan --storage bk`). A copy inside a storage's own directory would be read back
//! the same way. Both backups now return `Error::DestinationInsideSource` and write nothing.

use omnibus::{Database, Error, Options, Storage};

#[test]
fn a_backup_inside_its_source_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let db = Database::open(&path, Options::default()).unwrap();
    let idx = db.create_storage("idx").unwrap();
    for s in [db.root(), idx.clone()] {
        let mut w = s.begin_write().unwrap();
        w.put("k", "v").unwrap();
        w.commit().unwrap();
    }
    // Inside the database: under Indexes/ (it would become a branch), and one level deeper
    // through a path that does not exist yet.
    for dest in [path.join("Indexes/bk"), path.join("Indexes/idx/deeper/bk")] {
        let e = db.backup(&dest).unwrap_err();
        assert!(
            matches!(&e, Error::DestinationInsideSource { .. }),
            "{}: {e:?}",
            dest.display()
        );
        assert!(!dest.exists(), "{} was created", dest.display());
    }
    // Through a symlink that points into the database.
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&path, &link).unwrap();
    let e = db.backup(link.join("Indexes/bk2")).unwrap_err();
    assert!(matches!(&e, Error::DestinationInsideSource { .. }), "{e:?}");
    assert_eq!(db.storages(), vec!["idx".to_string()]);

    // A storage's backup inside its own directory.
    let e = idx.backup(path.join("Indexes/idx/copy")).unwrap_err();
    assert!(matches!(&e, Error::DestinationInsideSource { .. }), "{e:?}");

    // Beside the database is fine, and the copy opens on its own.
    let beside = dir.path().join("copy");
    db.backup(&beside).unwrap();
    drop(db);
    let copy = Database::open(&beside, Options::default()).unwrap();
    let r = copy.root().begin_read().unwrap();
    assert_eq!(r.get("k").unwrap(), Some(&b"v"[..]));
    drop(r);
    drop(copy);
    let s = Storage::open(beside.join("Indexes/idx"), Options::default());
    assert!(s.is_ok(), "{:?}", s.err());
}
