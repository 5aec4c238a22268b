//! `Database::compact` keeps indexes in step with their documents: compaction's root commits
//! change no document, so an index whose applied record named the root's txn before names the
//! root's txn after (design.md 13), `check_index` finds it in step and clean, and the next
//! definition resumes without a reconcile.

use omnibus::actors::{check_index, index_applied_txn, IndexDefinition, IndexMode};
use omnibus::{Database, Options};

use crate::common::index::{map_color, map_tags, open_engine};

const DOCS: u32 = 3_000;

#[test]
fn compaction_leaves_every_index_in_step() {
    // Regression: after `Database::compact` every index was behind the documents (compaction's
    // root commits advanced the root's txn past its applied record), and the next definition
    // reconciled it from a scan of every document.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let by_color = || IndexDefinition::new("by_color", map_color);
    let by_tags = || IndexDefinition::new("by_tags", map_tags).mode(IndexMode::Synchronous);
    let (engine, db) = open_engine(&path);
    db.blocking_define_index(by_color()).unwrap();
    db.blocking_define_index(by_tags()).unwrap();
    let root = db.root();
    let pad = "x".repeat(300);
    for i in 0..DOCS {
        root.blocking_put(
            format!("doc{i:06}"),
            format!("color=c{};tags=t{},u{};n={i};{pad}", i % 7, i % 5, i % 3),
        )
        .unwrap();
    }
    // Most documents deleted: compaction has pages to move.
    for i in 0..DOCS {
        if i % 8 != 0 {
            root.blocking_delete(format!("doc{i:06}")).unwrap();
        }
    }
    db.blocking_wait_for_indexes().unwrap();
    drop((root, db));
    engine.shutdown().unwrap();

    let core = Database::open(&path, Options::default()).unwrap();
    let before = core.root().begin_read().unwrap().txn_id();
    for name in ["by_color", "by_tags"] {
        let idx = core.storage(name).unwrap().begin_read().unwrap();
        assert_eq!(index_applied_txn(&idx).unwrap(), Some(before), "{name}");
    }
    let reports = core.compact().unwrap();
    let after = core.root().begin_read().unwrap().txn_id();
    // Whether pages moved or the file was only cut (where the writer left the free pages at
    // the end), compaction committed on the root.
    assert!(
        after > before,
        "compaction committed on the root: {reports:?}"
    );
    let docs = core.root().begin_read().unwrap();
    for def in [by_color(), by_tags()] {
        let idx = core.storage(def.name()).unwrap().begin_read().unwrap();
        assert_eq!(
            index_applied_txn(&idx).unwrap(),
            Some(after),
            "{}",
            def.name()
        );
        let r = check_index(&docs, &idx, &def, 5).unwrap();
        assert!(r.in_step, "{r:?}");
        assert!(r.is_ok(), "{r:?}");
    }
    drop(docs);
    core.close().unwrap();

    let (engine, db) = open_engine(&path);
    db.blocking_define_index(by_color()).unwrap();
    db.blocking_define_index(by_tags()).unwrap();
    db.blocking_wait_for_indexes().unwrap();
    for s in db.index_stats() {
        assert_eq!(
            s.reconciles, 0,
            "{}: reconciled after compaction: {s:?}",
            s.name
        );
        assert_eq!(s.applied_txn, after, "{s:?}");
    }
    drop(db);
    engine.shutdown().unwrap();
}
