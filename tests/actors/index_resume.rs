//! Indexes across reopens. A clean shutdown lets each index apply what is queued and record the
//! root txn it applied, so defining it again in the next process resumes it without a reconcile
//! and its entries are right. Documents changed through the core `Database` (outside the
//! engine, so without index updates) leave the index's applied record behind the root: the
//! next definition reconciles, removing the entries of deleted and changed documents.

use omnibus::actors::{index_applied_txn, DatabaseHandle, Engine, IndexDefinition, IndexState};
use omnibus::{Database, Options};
use rand::rngs::SmallRng;
use rand::SeedableRng;

use crate::common::index as index_common;
use index_common::{diff, documents, entries, expected, map_tags};

/// A new engine on the database at `path`, its index `by_tag` defined and caught up.
fn reopen(path: &std::path::Path) -> (Engine, DatabaseHandle) {
    let (e, db) = index_common::open_engine(path);
    db.blocking_define_index(IndexDefinition::new("by_tag", map_tags))
        .unwrap();
    db.blocking_wait_for_indexes().unwrap();
    (e, db)
}

#[test]
fn clean_reopen_resumes_and_outside_writes_are_reconciled() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut rng = SmallRng::seed_from_u64(9);

    // First process: define, load, shut down cleanly (no wait: the shutdown catches up).
    let (e, db) = index_common::open_engine(&path);
    db.blocking_define_index(IndexDefinition::new("by_tag", map_tags))
        .unwrap();
    let root = db.root();
    for i in 0..500 {
        root.blocking_put(format!("d{i:03}"), index_common::random_doc(&mut rng))
            .unwrap();
    }
    drop((root, db));
    e.shutdown().unwrap();

    // The applied record equals the root's last txn.
    let core = Database::open(&path, Options::default()).unwrap();
    let root_txn = core.root().begin_read().unwrap().txn_id();
    let idx = core.storage("by_tag").unwrap();
    assert_eq!(
        index_applied_txn(&idx.begin_read().unwrap()).unwrap(),
        Some(root_txn)
    );
    drop(idx);
    core.close().unwrap();

    // Second process: resumes, no reconcile.
    let (e, db) = reopen(&path);
    let s = &db.index_stats()[0];
    assert_eq!(s.reconciles, 0, "{s:?}");
    assert!(matches!(s.state, IndexState::Current), "{s:?}");
    assert_eq!(s.applied_txn, root_txn);
    let docs = documents(&db.root().snapshot().unwrap());
    let want = expected(docs.iter().map(|(k, v)| (&k[..], &v[..])), map_tags);
    let got = entries(&db.blocking_storage("by_tag").unwrap());
    assert!(got == want, "{}", diff(&got, &want));
    assert_eq!(s.entries as usize, want.len());
    drop(db);
    e.shutdown().unwrap();

    // Outside the engine: delete and change documents with the core API.
    let core = Database::open(&path, Options::default()).unwrap();
    let mut w = core.root().begin_write().unwrap();
    for i in 0..100 {
        w.delete(format!("d{i:03}")).unwrap();
    }
    for i in 100..200 {
        w.put(format!("d{i:03}"), "color=red;tags=only-this;n=1")
            .unwrap();
    }
    w.commit().unwrap();
    core.close().unwrap();

    // Third process: the index is behind the root, so it is reconciled.
    let (e, db) = reopen(&path);
    let s = &db.index_stats()[0];
    assert!(s.reconciles > 0, "{s:?}");
    let docs = documents(&db.root().snapshot().unwrap());
    assert_eq!(docs.len(), 400);
    let want = expected(docs.iter().map(|(k, v)| (&k[..], &v[..])), map_tags);
    let got = entries(&db.blocking_storage("by_tag").unwrap());
    assert!(got == want, "{}", diff(&got, &want));
    assert_eq!(
        got.iter().filter(|k| k.starts_with(b"only-this\0")).count(),
        100
    );
    drop(db);
    e.shutdown().unwrap();
}
