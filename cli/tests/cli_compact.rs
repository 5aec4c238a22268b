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
    ingest_countries(&db);
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

#[test]
fn compact_keeps_indexes_in_step_and_is_skipped_beside_a_reader() {
    // Regressions: after `compact` the index was "behind the documents" for `check` until the
    // next `ingest --index`; beside a reader the data files grew and the report said nothing;
    // `get --storage country '\x00'` printed the index's applied record.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let d = db.to_str().unwrap();
    ingest_countries(&db);
    cli::ok(&["compact", d]);
    let out = cli::ok(&["check", d]);
    assert!(out.contains("index `country`: ok"), "{out}");
    assert!(!out.contains("behind"), "{out}");
    let o = cli::omnibus(&["get", d, "--storage", "country", "\\x00"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("not found"),
        "{o:?}"
    );

    // A reader in this process (a read-only open holding reader slots), as a reader process.
    let ro = Options {
        read_only: true,
        ..Default::default()
    };
    let reader = Database::open(&db, ro).unwrap();
    let seen = reader.root().begin_read().unwrap();
    let before = data_bytes(&db);
    let out = cli::ok(&["compact", d, "--json"]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    for s in v["storages"].as_array().unwrap() {
        assert_eq!(s["skipped_for_readers"], 1, "{v}");
        assert_eq!(s["pages_moved"], 0, "{v}");
        assert!(
            s["skipped_reason"].as_str().unwrap().contains("reader"),
            "{v}"
        );
    }
    let out = cli::ok(&["compact", d]);
    assert!(out.contains("(root): skipped: 1 read-only opener"), "{out}");
    assert_eq!(data_bytes(&db), before);

    // `stat` lists the reader's slot in every storage (its own slot is not listed).
    let me = u64::from(std::process::id());
    let out = cli::ok(&["stat", d, "--json"]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    for s in v["storages"].as_array().unwrap() {
        let readers = s["readers"].as_array().unwrap();
        assert_eq!(readers.len(), 1, "{v}");
        assert_eq!(readers[0]["pid"], me, "{v}");
    }
    assert_eq!(v["storages"][0]["readers"][0]["txn"], seen.txn_id(), "{v}");
    let out = cli::ok(&["stat", d]);
    assert!(
        out.contains(&format!("readers    1 in other processes: pid {me} at txn")),
        "{out}"
    );
    drop((seen, reader));
    let out = cli::ok(&["stat", d]);
    assert!(out.contains("readers    none"), "{out}");
}

#[test]
fn compact_names_a_plain_storage_as_check_and_stat_do() {
    // Compaction of a plain storage printed it as `(root)`, where `check` and `stat` say
    // `(storage)`.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plain");
    {
        let s = omnibus::Storage::open(&path, Options::default()).unwrap();
        let mut w = s.begin_write().unwrap();
        for i in 0..500u32 {
            w.put(i.to_be_bytes(), [7u8; 300]).unwrap();
        }
        w.commit().unwrap();
        s.close().unwrap();
    }
    let p = path.to_str().unwrap();
    let o = cli::omnibus(&["compact", p]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("(storage)") && !out.contains("(root)"),
        "{out}"
    );
    let o = cli::omnibus(&["compact", "--json", p]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["storages"][0]["storage"], "(storage)", "{v}");
}

/// Ingests 3,000 documents of 7 countries (300-byte notes) into `db` with the index `country`.
fn ingest_countries(db: &std::path::Path) {
    let lines: Vec<String> = (0..3000)
        .map(|i| {
            format!(
                r#"{{"id": {i}, "country": "C{}", "note": "{}"}}"#,
                i % 7,
                "x".repeat(300)
            )
        })
        .collect();
    cli::ingest_lines(db, &lines, &["country"]);
}
