//! `omnibus backup DB DEST` of a database built by `ingest --index`: the copy holds every
//! storage, opens writable, and `check` cross-checks its indexes as it does the source's.
//!
//! The story: the copy had no `cli-indexes` file, so `check` on
//! it listed the index as "not cross-checked (not defined by `ingest --index`)".

use crate::common::cli;

#[test]
fn a_backup_of_an_ingested_database_is_cross_checked_like_its_source() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let lines: Vec<String> = (0..500)
        .map(|i| {
            format!(
                r#"{{"id": {i}, "country": "C{}", "name": "place {i}"}}"#,
                i % 7
            )
        })
        .collect();
    cli::ingest_lines(&db, &lines, &["country"]);
    let copy = dir.path().join("copy");
    let out = cli::ok(&["backup", db.to_str().unwrap(), copy.to_str().unwrap()]);
    assert!(out.contains("backed up 2 storages"), "{out}");
    for d in [&db, &copy] {
        let out = cli::ok(&["check", d.to_str().unwrap()]);
        assert!(
            out.contains("index `country`: ok"),
            "{}: {out}",
            d.display()
        );
        assert!(!out.contains("not cross-checked"), "{}: {out}", d.display());
    }
    // The copy is a database of its own: writes go in, the source is unchanged.
    cli::ok(&["put", copy.to_str().unwrap(), "extra", "v"]);
    assert_eq!(
        cli::omnibus(&["get", db.to_str().unwrap(), "extra"])
            .status
            .code(),
        Some(1)
    );
    // A second backup into the same place is refused and leaves the copy alone.
    let o = cli::omnibus(&["backup", db.to_str().unwrap(), copy.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    cli::ok(&["get", copy.to_str().unwrap(), "extra"]);
}
