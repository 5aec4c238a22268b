//! A branch storage's own path (`DB/Indexes/NAME`) is refused by every command, naming the
//! database and `--storage NAME`; so is the database's `Indexes/` directory itself.
//!
//! Regression: `ingest` killed with SIGKILL left unflushed index
//! entries in the shared journal; the journal file was then cut to zero. `check DB` reported
//! the damage (exit 2), but `check DB/Indexes/c` opened the branch on its own, without the
//! root's statement of the journal's files, and printed "ok (0 entries)" with exit 0, and
//! `put DB/Indexes/c k v` wrote into it (making the loss permanent) and created an `Indexes/`
//! directory inside the branch. A branch is only read and written through its database.

use omnibus::{Database, Options};

use crate::common::children;
use crate::common::cli as cli_common;

#[test]
fn a_branch_path_is_refused_with_the_database_form() {
    let _no_children = children::no_children_meanwhile();
    let dir = tempfile::tempdir().unwrap();
    let db_path = dir.path().join("db");
    {
        let db = Database::open(&db_path, Options::default()).unwrap();
        let c = db.create_storage("c").unwrap();
        let mut w = c.begin_write().unwrap();
        w.put("k", "v").unwrap();
        w.commit().unwrap();
    }
    let branch = db_path.join("Indexes").join("c");
    let b = branch.to_str().unwrap();
    for args in [
        vec!["get", b, "k"],
        vec!["put", b, "k2", "v2"],
        vec!["scan", b],
        vec!["stat", b],
        vec!["check", b],
    ] {
        let o = cli_common::omnibus(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("this is the storage \"c\" of the database")
                && err.contains("--storage c"),
            "{args:?}: {err}"
        );
    }
    // Nothing was written into the branch: no database layout inside it.
    assert!(!branch.join("Indexes").exists());
    // Nor into the database's `Indexes/` itself (it was opened as a database of its own).
    let indexes = db_path.join("Indexes");
    let ix = indexes.to_str().unwrap();
    for args in [
        vec!["put", ix, "k", "v"],
        vec!["get", ix, "k"],
        vec!["stat", ix],
    ] {
        let o = cli_common::omnibus(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("this is the branch directory of the database"),
            "{args:?}: {err}"
        );
    }
    assert!(
        !indexes.join("Journals").exists(),
        "a database was made in Indexes/"
    );
    // The database form works.
    let db = db_path.to_str().unwrap();
    let o = cli_common::omnibus(&["get", db, "--storage", "c", "k"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(o.stdout, b"v");
}
