//! What a storage handle offers instead of the writable core storage: its counters, a flush
//! of its pages and a whole check, run on the engine's background pool while its actor keeps
//! the writer; a database handle's flush of every storage.

use omnibus::actors::WriteBatch;

use crate::common::index::open_engine;

#[test]
fn a_handle_flushes_checks_and_counts_without_the_writable_core() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, db) = open_engine(dir.path().join("db"));
    let a = db.blocking_create_storage("a").unwrap();
    let b = db.blocking_create_storage("b").unwrap();
    for (h, n) in [(&a, 500u32), (&b, 300)] {
        let mut w = WriteBatch::new();
        for i in 0..n {
            w.put(format!("k{i:05}"), vec![7u8; 100]);
        }
        h.blocking_write(w).unwrap();
    }
    let st = a.stats();
    assert_eq!(st.entries, 500);
    assert!(
        a.scratch_bytes() > 0,
        "the commit's pages are in memory before a flush"
    );
    assert!(a.unflushed_bytes() >= a.scratch_bytes());
    let r = a.blocking_flush().unwrap();
    assert!(r.pages_written > 0, "{r:?}");
    let st = a.stats();
    assert_eq!(st.last_flushed_txn, st.last_committed_txn);
    assert_eq!(a.scratch_bytes(), 0);
    // The actor still holds the writer: writes go on after the flush.
    a.blocking_put(b"after".to_vec(), b"flush".to_vec())
        .unwrap();
    let c = a.blocking_check().unwrap();
    assert!(c.problems.is_empty(), "{:?}", c.problems);
    assert_eq!(c.entries, 501);
    // The database's flush reaches every storage.
    assert!(b.scratch_bytes() > 0);
    let r = db.blocking_flush().unwrap();
    assert!(r.pages_written > 0, "{r:?}");
    assert_eq!(b.scratch_bytes(), 0);
    assert_eq!(a.scratch_bytes(), 0);
    assert_eq!(a.write_buffer_bytes(), 0);
    drop((a, b, db));
    engine.shutdown().unwrap();
}
