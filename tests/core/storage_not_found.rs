//! A user opened `db.storage("Users_ByNmae")` (a typo) and got a new, empty storage: the lookup
//! created whatever name it was given, and the data seemed lost. `Database::storage` now opens
//! an existing storage only and answers `Error::StorageNotFound` for a missing one, creating
//! nothing; `Database::create_storage` creates it.

use omnibus::{Database, Error, Options};

#[test]
fn a_missing_storage_is_not_found_and_only_create_storage_creates_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    {
        let db = Database::open(&path, Options::default()).unwrap();
        let s = db.create_storage("Users_ByName").unwrap();
        let mut w = s.begin_write().unwrap();
        w.put("alice", "1").unwrap();
        w.commit().unwrap();

        let e = db.storage("Users_ByNmae").unwrap_err();
        match &e {
            Error::StorageNotFound { name, path: p } => {
                assert_eq!(name, "Users_ByNmae");
                assert!(p.ends_with("Indexes/Users_ByNmae"), "{}", p.display());
            }
            other => panic!("expected StorageNotFound, got {other}"),
        }
        assert!(e.to_string().contains("Users_ByNmae"), "{e}");
        assert!(
            !path.join("Indexes/Users_ByNmae").exists(),
            "the lookup created a directory"
        );
        assert_eq!(db.storages(), vec!["Users_ByName".to_string()]);
        // create_storage of an existing name is that storage.
        let again = db.create_storage("Users_ByName").unwrap();
        assert_eq!(again.storage_id(), s.storage_id());
        db.close().unwrap();
    }
    let db = Database::open(&path, Options::default()).unwrap();
    let s = db.storage("Users_ByName").unwrap();
    assert_eq!(
        s.begin_read().unwrap().get(b"alice").unwrap(),
        Some(&b"1"[..])
    );
    assert!(matches!(
        db.storage("Users_ByNmae"),
        Err(Error::StorageNotFound { .. })
    ));
    assert!(matches!(
        db.storage("bad/name"),
        Err(Error::InvalidStorageName { .. })
    ));
}
