//! An index that rests between batches (`min_batch_interval`) never holds up its callers: a
//! `wait_for_indexes` caller cuts the rest short, and so does a mailbox filling up, so the
//! documents keep being acknowledged. With an interval of an hour, either would hang without
//! the early start: each step runs in a thread and must finish within a minute (a liveness
//! bound, far above the milliseconds it takes, never a performance threshold).

use std::sync::mpsc;
use std::time::Duration;

use omnibus::actors::{DatabaseHandle, Engine, EngineOptions, IndexDefinition};
use omnibus::Options;

use crate::common::index as index_common;

fn map_term(_key: &[u8], doc: &[u8]) -> Vec<Vec<u8>> {
    index_common::field(doc, "term")
        .map(|t| vec![t.to_vec()])
        .unwrap_or_default()
}

/// Runs `f` on a thread; fails the test binary if it has not finished within a minute (an exit,
/// not a panic: unwinding would drop the engine, whose shutdown waits for the resting index).
fn within_a_minute<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(v) => v,
        Err(_) => {
            eprintln!("{what} did not finish within a minute: the resting index held it up");
            std::process::exit(101);
        }
    }
}

fn open(dir: &std::path::Path, queue: usize) -> (Engine, DatabaseHandle) {
    let engine = Engine::start(EngineOptions {
        executors: Some(2),
        index_queue_capacity: queue,
        ..EngineOptions::default()
    })
    .unwrap();
    let db = engine
        .blocking_open_database(dir.join("db"), Options::default())
        .unwrap();
    db.blocking_define_index(
        IndexDefinition::new("by_term", map_term).min_batch_interval(Duration::from_secs(3600)),
    )
    .unwrap();
    db.blocking_wait_for_indexes().unwrap();
    (engine, db)
}

#[test]
fn a_waiter_cuts_the_rest_short() {
    let dir = tempfile::tempdir().unwrap();
    let (_engine, db) = open(dir.path(), 256);
    let index = db.blocking_storage("by_term").unwrap();
    for round in 0..3 {
        let key = format!("doc-{round}");
        db.root()
            .blocking_put(key.clone(), format!("term=t{round}"))
            .unwrap();
        let d = db.clone();
        within_a_minute("wait_for_indexes", move || d.blocking_wait_for_indexes()).unwrap();
        let entry = [format!("t{round}").as_bytes(), b"\0", key.as_bytes()].concat();
        assert!(
            index.snapshot().unwrap().get(&entry).unwrap().is_some(),
            "round {round}: not indexed after wait_for_indexes"
        );
    }
}

#[test]
fn a_filling_mailbox_cuts_the_rest_short() {
    let dir = tempfile::tempdir().unwrap();
    // 8 root commits fit the index's mailbox; 200 one-put commits must all be acknowledged.
    let (_engine, db) = open(dir.path(), 8);
    let d = db.clone();
    within_a_minute("200 document puts", move || {
        for i in 0..200 {
            d.root()
                .blocking_put(format!("doc-{i:03}"), format!("term=t{}", i % 7))
                .unwrap();
        }
    });
    db.blocking_wait_for_indexes().unwrap();
    let s = &db.index_stats()[0];
    assert_eq!(s.applied_txn, s.root_txn, "{s:?}");
    // The index took the 200 commits in a few batches, not one each and not in one.
    assert!(s.batches >= 2 && s.batches < 200, "{s:?}");
}

/// Shutting down (or dropping the engine) while an index rested with commits queued waited
/// for the rest to end (an hour here): the index's `Stop` sat behind those commits. Shutdown
/// now cuts the rest short; the index applies what was queued and records it.
#[test]
fn shutdown_cuts_the_rest_short() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, db) = open(dir.path(), 256);
    for i in 0..5 {
        db.root()
            .blocking_put(format!("doc-{i}"), format!("term=t{i}"))
            .unwrap();
    }
    let root_txn = db.index_stats()[0].root_txn;
    drop(db);
    within_a_minute("shutdown", move || engine.shutdown()).unwrap();
    // Reopened: the index holds every document.
    let (engine, db) = open(dir.path(), 256);
    let s = &db.index_stats()[0];
    assert!(s.applied_txn >= root_txn, "{s:?}");
    let index = db.blocking_storage("by_term").unwrap();
    let snap = index.snapshot().unwrap();
    for i in 0..5 {
        let entry = [
            format!("t{i}").as_bytes(),
            b"\0",
            format!("doc-{i}").as_bytes(),
        ]
        .concat();
        assert!(snap.get(&entry).unwrap().is_some(), "doc-{i} not indexed");
    }
    drop((snap, index, db));
    engine.shutdown().unwrap();
}
