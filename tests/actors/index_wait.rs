//! `wait_for_indexes`: a document put or deleted through the root's handle and acknowledged
//! before the call is in (or out of) the index once the call returns. The index batches at
//! most every 40 ms, so right after an acknowledgement it is usually behind: 8 tokio tasks each
//! put a document with a term of its own, wait, and must find it; then delete it, wait, and
//! must not. Afterwards the root's flushes reach its last commit (no index pins an old root
//! snapshot).

use std::time::Duration;

use omnibus::actors::{Engine, EngineOptions, IndexDefinition};
use omnibus::Options;

use crate::common::index as index_common;

fn map_term(_key: &[u8], doc: &[u8]) -> Vec<Vec<u8>> {
    index_common::field(doc, "term")
        .map(|t| vec![t.to_vec()])
        .unwrap_or_default()
}

#[test]
fn an_acknowledged_write_is_in_the_index_after_the_wait() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::start(EngineOptions {
        executors: Some(2),
        ..EngineOptions::default()
    })
    .unwrap();
    let db = engine
        .blocking_open_database(
            dir.path().join("db"),
            Options {
                flush_max_age: Duration::from_millis(20),
                ..Options::default()
            },
        )
        .unwrap();
    db.blocking_define_index(
        IndexDefinition::new("by_term", map_term).min_batch_interval(Duration::from_millis(40)),
    )
    .unwrap();
    let index = db.blocking_storage("by_term").unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let behind = rt.block_on(async {
        let mut tasks = Vec::new();
        for t in 0..8u32 {
            let (db, index) = (db.clone(), index.clone());
            tasks.push(tokio::spawn(async move {
                let mut behind = 0;
                for i in 0..6u32 {
                    let key = format!("doc-{t}-{i}");
                    let term = format!("t{t}x{i}");
                    let entry = [term.as_bytes(), b"\0", key.as_bytes()].concat();
                    let root = db.root();
                    root.put(key.clone(), format!("term={term}")).await.unwrap();
                    behind += usize::from(index.snapshot().unwrap().get(&entry).unwrap().is_none());
                    db.wait_for_indexes().await.unwrap();
                    assert!(
                        index.snapshot().unwrap().get(&entry).unwrap().is_some(),
                        "{key}: not in the index after wait_for_indexes"
                    );
                    assert!(root.delete(key.clone()).await.unwrap());
                    db.wait_for_indexes().await.unwrap();
                    assert!(
                        index.snapshot().unwrap().get(&entry).unwrap().is_none(),
                        "{key}: still in the index after its delete and wait_for_indexes"
                    );
                }
                behind
            }));
        }
        let mut behind = 0;
        for t in tasks {
            behind += t.await.unwrap();
        }
        behind
    });
    eprintln!("{behind} of 48 puts were not yet indexed when acknowledged");
    let s = &db.index_stats()[0];
    assert_eq!(s.name, "by_term");
    assert_eq!(s.entries, 0, "{s:?}");
    assert_eq!(s.changes, 96, "48 puts and 48 deletes: {s:?}");
    assert_eq!(s.apply_lag.samples, 96, "{s:?}");
    assert!(s.apply_lag.max_ms > 0.0, "{s:?}");
    // Regression: the index actor held the root snapshot of its registration for its whole
    // life, which kept the root's flushes at that txn. Now the root's flushes reach its last
    // commit.
    let root = db.root();
    let last = root.stats().last_committed_txn;
    assert!(last > 2, "{last}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while root.stats().last_flushed_txn < last {
        assert!(
            std::time::Instant::now() < deadline,
            "the root's flushes stay at txn {} of {last}",
            root.stats().last_flushed_txn
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    drop((db, index, root));
    engine.shutdown().unwrap();
}
