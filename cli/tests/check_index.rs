//! `check` cross-checks each engine index against the documents: entries missing for a
//! document, entries naming no document, and entries a changed document no longer gives.
//!
//! Story: `check` verified each storage's pages and tree but never compared an index with the
//! documents, so an index damaged by writes to its branch storage (or a document changed behind
//! the index's back) passed `check`, and queries through the index returned wrong documents.
//! Here an index built by the engine is healthy (nothing reported); then its branch is written
//! directly (an entry removed, a stray one added, a stale one added) and a document is changed
//! through the core `Database` with the index's applied record moved along (as if the feed had
//! missed it): the library function, the engine's `check_indexes` and `omnibus check` report
//! each kind with the right count.

use omnibus::actors::{check_index, IndexCheckReport, IndexDefinition};
use omnibus::{Database, Options};

use crate::common::children;
use crate::common::cli;
use crate::common::index as index_common;

fn map() -> IndexDefinition {
    IndexDefinition::new("by_tag", index_common::map_tags)
}

fn doc(i: u32) -> String {
    format!("color=c{};tags=t{},u{};n={i}", i % 3, i % 5, i % 7)
}

/// The applied record (documented layout: `omniIDX2`, then the txn id, little-endian).
fn applied(txn: u64) -> Vec<u8> {
    let mut v = b"omniIDX2".to_vec();
    v.extend_from_slice(&txn.to_le_bytes());
    v
}

fn core_check(path: &std::path::Path) -> IndexCheckReport {
    let db = Database::open(
        path,
        Options {
            read_only: true,
            ..Options::default()
        },
    )
    .unwrap();
    let docs = db.root().begin_read().unwrap();
    let index = db.storage("by_tag").unwrap().begin_read().unwrap();
    check_index(&docs, &index, &map(), 10).unwrap()
}

fn assert_damage(r: &IndexCheckReport, what: &str) {
    assert!(!r.is_ok(), "{what}: {r:?}");
    assert_eq!(r.documents, 300, "{what}");
    assert_eq!(r.missing_entries, 2, "{what}: {r:?}");
    assert_eq!(r.documents_missing, 2, "{what}: {r:?}");
    assert_eq!(r.entries_without_document, 1, "{what}: {r:?}");
    assert_eq!(r.stale_entries, 3, "{what}: {r:?}");
    let mut missing = r.missing_examples.clone();
    missing.sort();
    assert_eq!(missing, vec![b"t1\0d001".to_vec(), b"x1\0d003".to_vec()]);
    assert_eq!(r.without_document_examples, vec![b"zz\0nodoc".to_vec()]);
    let mut stale = r.stale_examples.clone();
    stale.sort();
    assert_eq!(
        stale,
        vec![
            b"t3\0d003".to_vec(),
            b"t9\0d002".to_vec(),
            b"u3\0d003".to_vec()
        ]
    );
}

#[test]
fn a_damaged_index_is_reported_with_counts_and_a_healthy_one_is_not() {
    let _no_children = children::no_children_meanwhile();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");

    // Built and kept by the engine: healthy.
    let (e, db) = index_common::open_engine(&path);
    db.blocking_define_index(map()).unwrap();
    let root = db.root();
    for i in 0..300 {
        root.blocking_put(format!("d{i:03}"), doc(i)).unwrap();
    }
    db.blocking_wait_for_indexes().unwrap();
    let reports = db.blocking_check_indexes(10).unwrap();
    assert_eq!(reports.len(), 1);
    let r = &reports[0];
    assert!(r.is_ok() && r.in_step, "{r:?}");
    assert_eq!(
        (r.documents, r.entries, r.expected_entries),
        (300, 600, 600)
    );
    drop((root, db));
    e.shutdown().unwrap();
    let r = core_check(&path);
    assert!(r.is_ok() && r.in_step, "{r:?}");

    // Written behind the engine's back.
    {
        let db = Database::open(&path, Options::default()).unwrap();
        let idx = db.storage("by_tag").unwrap();
        let mut w = idx.begin_write().unwrap();
        assert!(w.delete(b"t1\0d001").unwrap(), "the entry existed");
        w.put(b"zz\0nodoc", b"").unwrap();
        w.put(b"t9\0d002", b"").unwrap();
        w.commit().unwrap();
        // A document changed through the core: the index does not follow.
        let mut w = db.root().begin_write().unwrap();
        w.put(b"d003", b"color=c0;tags=x1;n=3").unwrap();
        w.commit().unwrap();
        db.close().unwrap();
    }
    // The index is behind the documents now: the differences are counted but not in step.
    let r = core_check(&path);
    assert!(!r.in_step, "{r:?}");
    assert_damage(&r, "behind");
    // The same, with the applied record moved to the documents' txn (the feed "missed" it).
    {
        let db = Database::open(&path, Options::default()).unwrap();
        let txn = db.root().begin_read().unwrap().txn_id();
        let idx = db.storage("by_tag").unwrap();
        let mut w = idx.begin_write().unwrap();
        w.put(omnibus::actors::INDEX_APPLIED_KEY, applied(txn))
            .unwrap();
        w.commit().unwrap();
        db.close().unwrap();
    }
    let r = core_check(&path);
    assert!(r.in_step, "{r:?}");
    assert_damage(&r, "core");

    // The engine resumes the index from its record (no reconcile) and reports the same.
    let (e, db) = index_common::open_engine(&path);
    db.blocking_define_index(map()).unwrap();
    let reports = db.blocking_check_indexes(10).unwrap();
    assert!(reports[0].in_step, "{:?}", reports[0]);
    assert_damage(&reports[0], "engine");
    drop(db);
    e.shutdown().unwrap();
}

#[test]
fn omnibus_check_cross_checks_the_cli_indexes() {
    let _no_children = children::no_children_meanwhile();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let db = path.to_str().unwrap();
    let lines: Vec<String> = (0..200)
        .map(|i| format!("{{\"id\":\"p{i:03}\",\"color\":\"c{}\"}}", i % 4))
        .collect();
    cli::ingest_lines(&path, &lines, &["color"]);
    let out = cli::ok(&["check", db]);
    assert!(
        out.contains("index `color`: ok (200 documents, 200 entries, 0 differences)"),
        "{out}"
    );

    // Damage the index: one entry removed, one naming no document.
    {
        let d = Database::open(&path, Options::default()).unwrap();
        let idx = d.storage("color").unwrap();
        let mut w = idx.begin_write().unwrap();
        assert!(w.delete(b"c1\0p001").unwrap());
        w.put(b"c9\0p999", b"").unwrap();
        w.commit().unwrap();
        d.close().unwrap();
    }
    let o = cli::omnibus(&["check", db]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("index `color`: 1 missing entries (1 documents missing from it), 1 entries without document, 0 stale entries"),
        "{err}"
    );
    assert!(err.contains("missing entry: c1\\x00p001"), "{err}");
    assert!(err.contains("entry without document: c9\\x00p999"), "{err}");

    // `put` on the root leaves the index behind: reported, not a problem.
    cli::ok(&["put", db, "p000", "{\"id\":\"p000\",\"color\":\"c2\"}"]);
    let o = cli::omnibus(&["check", db]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("index `color`: behind the documents"), "{out}");
}
