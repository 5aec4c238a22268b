//! An index storage's applied record (the key `0x00`, design.md 10.1) is the engine's, not an
//! entry: every public view of the index storage through the engine leaves it out, for an
//! index defined now and for one left on disk by an earlier open, while the engine still
//! reads it (the index resumes without a rebuild, `index_applied_txn` answers).
//!
//! Regression: `len`, `iter`, `first`, ranges and prefixes of `storage(name).snapshot()` and the
//! handles' reads counted and returned the record as the index's first key.

use omnibus::actors::{index_applied_txn, IndexDefinition, StorageHandle, INDEX_APPLIED_KEY};
use omnibus::ReadTransaction;

use crate::common::index::{map_color, open_engine};

const DOCS: u64 = 30;

/// Asserts that `r`, a snapshot of an index storage of `n` entries, shows exactly them.
fn assert_entries_only(r: &ReadTransaction, n: u64, what: &str) {
    assert_eq!(r.len(), n, "{what}: len");
    assert!(!r.is_empty(), "{what}");
    let keys: Vec<Vec<u8>> = r.iter().unwrap().map(|e| e.unwrap().0.to_vec()).collect();
    assert_eq!(keys.len() as u64, n, "{what}: iter");
    assert!(
        keys.iter().all(|k| k.as_slice() != INDEX_APPLIED_KEY),
        "{what}"
    );
    let back = r.iter().unwrap().rev().count() as u64;
    assert_eq!(back, n, "{what}: iter backwards");
    assert_ne!(
        r.first().unwrap().unwrap().0,
        INDEX_APPLIED_KEY,
        "{what}: first"
    );
    assert_eq!(r.range::<&[u8], _>(..).unwrap().count() as u64, n, "{what}");
    assert_eq!(r.range(&[0u8][..]..).unwrap().count() as u64, n, "{what}");
    assert_eq!(r.range(..=&[0u8][..]).unwrap().count(), 0, "{what}");
    assert_eq!(r.prefix([]).unwrap().count() as u64, n, "{what}: prefix");
    assert_eq!(r.prefix([0u8]).unwrap().count(), 0, "{what}: prefix 0x00");
    assert_eq!(r.get(INDEX_APPLIED_KEY).unwrap(), None, "{what}: get");
    assert!(!r.contains_key(INDEX_APPLIED_KEY).unwrap(), "{what}");
    let got = r.multi_get(&[INDEX_APPLIED_KEY, &keys[0]]).unwrap();
    assert_eq!(got[0], None, "{what}: multi_get");
    assert!(got[1].is_some(), "{what}: multi_get of an entry");
    // The engine's own read of it still answers.
    assert!(index_applied_txn(r).unwrap().is_some(), "{what}");
}

fn assert_handle(h: &StorageHandle, n: u64, what: &str) {
    assert_entries_only(&h.snapshot().unwrap(), n, what);
    assert_eq!(h.blocking_get(INDEX_APPLIED_KEY).unwrap(), None, "{what}");
    let multi = h.blocking_multi_get(&[INDEX_APPLIED_KEY]).unwrap();
    assert_eq!(multi, vec![None], "{what}");
    let ranged: Vec<_> = h
        .blocking_range::<&[u8], _>(..)
        .unwrap()
        .map(|e| e.unwrap().0)
        .collect();
    assert_eq!(ranged.len() as u64, n, "{what}: handle range");
    assert!(ranged.iter().all(|k| k.as_slice() != INDEX_APPLIED_KEY));
    let back = h.blocking_range_rev::<&[u8], _>(..).unwrap().count() as u64;
    assert_eq!(back, n, "{what}: handle range backwards");
}

/// Puts [`DOCS`] documents of three colors into `db`'s root and defines the index `by_color`
/// over them (one entry per document), waiting until it is current; returns the root.
fn documents_indexed(db: &omnibus::actors::DatabaseHandle) -> StorageHandle {
    let root = db.root();
    for i in 0..DOCS {
        root.blocking_put(format!("doc{i:03}"), format!("color=c{};n={i}", i % 3))
            .unwrap();
    }
    db.blocking_define_index(IndexDefinition::new("by_color", map_color))
        .unwrap();
    db.blocking_wait_for_indexes().unwrap();
    root
}

#[test]
fn the_applied_record_is_in_no_view_of_an_index_storage() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let (engine, db) = open_engine(&path);
    let root = documents_indexed(&db);
    let h = db.blocking_storage("by_color").unwrap();
    // One entry per document (one color each).
    assert_handle(&h, DOCS, "defined now");
    let stats = db.index_stats();
    assert_eq!(stats[0].entries, DOCS);
    drop((h, root, db));
    engine.shutdown().unwrap();

    // The next open, before the index is defined again: the storage holds an applied record.
    let (engine, db) = open_engine(&path);
    let h = db.blocking_storage("by_color").unwrap();
    assert_handle(&h, DOCS, "left on disk");
    db.blocking_define_index(IndexDefinition::new("by_color", map_color))
        .unwrap();
    db.blocking_wait_for_indexes().unwrap();
    assert_handle(&h, DOCS, "defined again");
    drop((h, db));
    engine.shutdown().unwrap();
}

#[test]
fn a_plain_branch_keeps_its_key_0x00() {
    // Only index storages hide it: any other storage's key 0x00 is an ordinary key.
    let dir = tempfile::tempdir().unwrap();
    let (engine, db) = open_engine(dir.path().join("db"));
    let b = db.blocking_create_storage("plain").unwrap();
    b.blocking_put(INDEX_APPLIED_KEY, "mine").unwrap();
    let r = b.snapshot().unwrap();
    assert_eq!(r.len(), 1);
    assert_eq!(r.first().unwrap().unwrap().0, INDEX_APPLIED_KEY);
    assert_eq!(
        b.blocking_get(INDEX_APPLIED_KEY).unwrap().as_deref(),
        Some(&b"mine"[..])
    );
    drop((b, db));
    engine.shutdown().unwrap();
}

#[test]
fn a_database_opened_without_the_engine_hides_it_too() {
    // Regression: `omnibus::Database::storage(name)` snapshots (and so `omnibus get --storage
    // IDX '\x00'`) returned the applied record of an index the engine had defined.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let (engine, db) = open_engine(&path);
    let root = documents_indexed(&db);
    drop((root, db));
    engine.shutdown().unwrap();

    for read_only in [false, true] {
        let opts = omnibus::Options {
            read_only,
            ..Default::default()
        };
        let core = omnibus::Database::open(&path, opts).unwrap();
        let idx = core.storage("by_color").unwrap();
        assert_entries_only(
            &idx.begin_read().unwrap(),
            DOCS,
            &format!("core, read_only {read_only}"),
        );
        drop(idx);
        core.close().unwrap();
    }
}

#[test]
fn a_backup_counts_documents_and_entries_not_applied_records() {
    // Regression: `BackupReport::entries` of a database of n documents and one index of one
    // term each was 2 n + 1, the index's applied record counted as a key.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let (engine, db) = open_engine(&path);
    let root = documents_indexed(&db);
    let through_engine = db.blocking_backup(dir.path().join("copy1")).unwrap();
    assert_eq!(through_engine.entries, 2 * DOCS, "DatabaseHandle::backup");
    drop((root, db));
    engine.shutdown().unwrap();

    let core = omnibus::Database::open(&path, omnibus::Options::default()).unwrap();
    let r = core.backup(dir.path().join("copy2")).unwrap();
    assert_eq!(r.entries, 2 * DOCS, "Database::backup");
    let idx = core.storage("by_color").unwrap();
    let r = idx.backup(dir.path().join("copy3")).unwrap();
    assert_eq!(r.entries, DOCS, "Storage::backup of the index");
    // The copy keeps the record (a copy's index resumes from it).
    let copy = omnibus::Storage::open(dir.path().join("copy3"), Default::default()).unwrap();
    assert_eq!(copy.stats().entries, DOCS + 1);
    drop((copy, idx));
    core.close().unwrap();
}
