//! Writes to the root that bypass the engine (the core `Database` under a running engine) never
//! reach the change feed, but they take root txn ids: the index sees a gap in the txn ids of the
//! next commits fed to it and reconciles from a fresh snapshot, so after `wait_for_indexes` it
//! holds the outside write's entries too, and its applied record stays exact.

use omnibus::actors::{index_applied_txn, IndexDefinition};

use crate::common::index as index_common;
use index_common::{diff, documents, entries, expected, map_color};

#[test]
fn a_gap_in_the_root_txn_ids_is_reconciled() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, db) = index_common::open_engine(dir.path().join("db"));
    db.blocking_define_index(IndexDefinition::new("by_color", map_color))
        .unwrap();
    let root = db.root();
    root.blocking_put("a", "color=red").unwrap();
    db.blocking_wait_for_indexes().unwrap();
    // Built once (a new index).
    assert_eq!(db.index_stats()[0].reconciles, 1);

    // Outside the engine: a new document and a changed one.
    let core = db.core_database_for_tests().root();
    let mut w = core.begin_write().unwrap();
    w.put("b", "color=green").unwrap();
    w.put("a", "color=blue").unwrap();
    w.commit().unwrap();
    // The next commit through the engine shows the gap.
    root.blocking_put("c", "color=cyan").unwrap();
    db.blocking_wait_for_indexes().unwrap();

    let docs = documents(&root.snapshot().unwrap());
    let want = expected(docs.iter().map(|(k, v)| (&k[..], &v[..])), map_color);
    let index = db.blocking_storage("by_color").unwrap();
    let got = entries(&index);
    assert!(got == want, "{}", diff(&got, &want));
    assert!(got.contains(&b"blue\0a"[..]) && !got.contains(&b"red\0a"[..]));
    let s = &db.index_stats()[0];
    assert_eq!(
        s.reconciles, 2,
        "built, then reconciled after the gap: {s:?}"
    );
    assert_eq!(s.applied_txn, root.snapshot().unwrap().txn_id());
    assert_eq!(
        index_applied_txn(&index.snapshot().unwrap()).unwrap(),
        Some(s.applied_txn)
    );
    drop((root, index, core, db));
    engine.shutdown().unwrap();
}

/// A group transaction of the core over the root and another storage is such an outside write
/// to the root: its root part takes a root txn id without reaching the feed, and the index
/// reconciles at the gap as for a plain core write.
#[test]
fn a_group_over_the_root_is_reconciled_as_an_outside_write() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, db) = index_common::open_engine(dir.path().join("db"));
    db.blocking_define_index(IndexDefinition::new("by_color", map_color))
        .unwrap();
    let root = db.root();
    root.blocking_put("a", "color=red").unwrap();
    db.blocking_wait_for_indexes().unwrap();

    let core = db.core_database_for_tests();
    let (core_root, other) = (core.root(), core.create_storage("other").unwrap());
    let mut g = core.begin_group(&[&core_root, &other]).unwrap();
    g.put(&core_root, "b", "color=green").unwrap();
    g.put(&other, "b", "").unwrap();
    g.commit().unwrap();
    root.blocking_put("c", "color=cyan").unwrap();
    db.blocking_wait_for_indexes().unwrap();

    let docs = documents(&root.snapshot().unwrap());
    let want = expected(docs.iter().map(|(k, v)| (&k[..], &v[..])), map_color);
    let index = db.blocking_storage("by_color").unwrap();
    let got = entries(&index);
    assert!(got == want, "{}", diff(&got, &want));
    assert!(got.contains(&b"green\0b"[..]));
    let s = &db.index_stats()[0];
    assert_eq!(
        s.reconciles, 2,
        "built, then reconciled after the gap: {s:?}"
    );
    assert_eq!(s.applied_txn, root.snapshot().unwrap().txn_id());
    drop((root, index, core_root, other));
    drop(db);
    engine.shutdown().unwrap();
}
