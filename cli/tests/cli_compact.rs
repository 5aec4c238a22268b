//! `omnibus compact DB`: every storage of a database (the root and its indexes) is compacted
//! with `Database::compact`; the data files shrink after most documents are deleted, each
//! storage's pages moved and bytes before and after are printed (and as JSON), and the
//! database holds the same documents and passes `check` afterwards.

use std::path::Path;

use omnibus::{Database, Options};

use crate::common::{children, cli};

fn data_bytes(db: &Path) -> u64 {
    let mut n = std::fs::metadata(db.join("data.pages")).unwrap().len();
    for e in std::fs::read_dir(db.join("Indexes")).unwrap() {
        n += std::fs::metadata(e.unwrap().path().join("data.pages"))
            .unwrap()
            .len();
    }
    n
}

#[test]
fn compact_shrinks_every_storage_and_keeps_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let lines: Vec<String> = (0..3000)
        .map(|i| {
            format!(
                r#"{{"id": {i}, "country": "C{}", "note": "{}"}}"#,
                i % 7,
                "x".repeat(300)
            )
        })
        .collect();
    cli::ingest_lines(&db, &lines, &["country"]);
    // Delete most documents through the library (the index is then behind; ingest catches it up).
    {
        let _no_children = children::no_children_meanwhile();
        let d = Database::open(&db, Options::default()).unwrap();
        let root = d.root();
        let keys: Vec<Vec<u8>> = root
            .begin_read()
            .unwrap()
            .iter()
            .unwrap()
            .map(|e| e.unwrap().0.to_vec())
            .collect();
        let mut w = root.begin_write().unwrap();
        for k in keys.iter().skip(100) {
            w.delete(k).unwrap();
        }
        w.commit().unwrap();
        d.close().unwrap();
    }
    let before = data_bytes(&db);
    let out = cli::ok(&["compact", db.to_str().unwrap()]);
    assert!(out.contains("(root): "), "{out}");
    assert!(out.contains("country: "), "{out}");
    assert!(out.contains("compacted 2 storages"), "{out}");
    let after = data_bytes(&db);
    assert!(after * 2 < before, "{before} -> {after}: {out}");
    {
        let _no_children = children::no_children_meanwhile();
        let d = Database::open(&db, Options::default()).unwrap();
        assert_eq!(d.root().begin_read().unwrap().len(), 100);
        d.close().unwrap();
    }
    cli::ok(&["check", db.to_str().unwrap()]);

    // Again, as JSON: nothing left to move in the root, the same totals' fields.
    let out = cli::ok(&["compact", db.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["storages"].as_array().unwrap().len(), 2, "{v}");
    assert_eq!(v["storages"][0]["storage"], "(root)", "{v}");
    assert_eq!(v["storages"][0]["pages_moved"], 0, "{v}");
    assert!(v["data_file_bytes_after"].as_u64().unwrap() <= after, "{v}");
}

#[test]
fn compact_of_a_missing_database_is_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let o = cli::omnibus(&["compact", dir.path().join("nothing").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
}
