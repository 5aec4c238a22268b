//! A write to a database with a damaged storage is refused with exit code 2 (damage), as the
//! README lists, not 1 (usage or input).
//!
//! Story: a user deleted a branch's `data.pages`; `omnibus put DB x y` printed
//! "writes refused: the database has damaged storages" and exited 1, the code for a mistyped
//! command, so a script could not tell damage from its own mistake.

use crate::common::cli;

#[test]
fn put_into_a_database_with_a_damaged_branch_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let db = path.to_str().unwrap();
    let lines: Vec<String> = (0..50)
        .map(|i| format!("{{\"id\":\"p{i:03}\",\"color\":\"c{}\"}}", i % 4))
        .collect();
    cli::ingest_lines(&path, &lines, &["color"]);
    std::fs::remove_file(path.join("Indexes").join("color").join("data.pages")).unwrap();
    let o = cli::omnibus(&["put", db, "x", "y"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("color"), "{err}");
    // Nothing was written: the documents are as they were.
    let o = cli::omnibus(&["get", db, "x"]);
    assert_ne!(o.status.code(), Some(0));
}
