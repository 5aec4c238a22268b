//! A write command's input is checked before anything is created, and an index storage's
//! applied record cannot be written from the command line.
//!
//! The story: `put fresh '' v` and `put fresh --storage .. --create k v`
//! exited 1, yet left a new empty database `fresh` behind, because the engine refused the key
//! or the name only after the database was opened with `create`. And `put DB --storage color
//! '\x00' garbage` exited 0, overwriting the index's applied record (its key is the single byte
//! 0x00): `check` then dropped that index's cross-check silently.

use crate::common::cli as cli_common;
use cli_common::{ok, omnibus};

#[test]
fn rejected_writes_create_nothing_and_the_applied_record_is_not_writable() {
    let dir = tempfile::tempdir().unwrap();
    for (i, args) in [
        vec!["put", "{db}", "", "v"],
        vec!["put", "{db}", "--storage", "..", "--create", "k", "v"],
        vec![
            "put",
            "{db}",
            "--storage",
            ".dropped-x",
            "--create",
            "k",
            "v",
        ],
        vec!["delete", "{db}", ""],
    ]
    .into_iter()
    .enumerate()
    {
        let db = dir.path().join(format!("fresh{i}"));
        let db_s = db.to_str().unwrap().to_string();
        let args: Vec<&str> = args
            .iter()
            .map(|a| if *a == "{db}" { db_s.as_str() } else { a })
            .collect();
        let o = omnibus(&args);
        assert_ne!(o.status.code(), Some(0), "{args:?} succeeded");
        assert!(!db.exists(), "{args:?} created {}", db.display());
    }

    // An index made by ingest: its applied record is the engine's.
    let db = dir.path().join("db");
    let db = db.to_str().unwrap();
    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, "{\"color\":\"red\"}\n{\"color\":\"blue\"}\n").unwrap();
    ok(&[
        "ingest",
        db,
        "--input",
        input.to_str().unwrap(),
        "--index",
        "color",
    ]);
    for args in [
        vec!["put", db, "--storage", "color", "\\x00", "garbage"],
        vec!["delete", db, "--storage", "color", "\\x00"],
    ] {
        let o = omnibus(&args);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("applied record"),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    // The index still cross-checks against the documents.
    let out = ok(&["check", db]);
    assert!(out.contains("color"), "{out}");
    // Other keys of an index storage stay writable (a user's own maintenance).
    ok(&["put", db, "--storage", "color", "mine", "v"]);
}
