//! What dropping a handle's future before it is ready means, call by call (the rustdoc of each
//! async method says it): a write still waiting for room in a full mailbox is never sent; a
//! dropped range stream lets go of its snapshot, and a dropped `next()` of one loses no entry; work handed to the background pool (a
//! storage's creation, a database's open) runs to its end and its lost result is cleaned up;
//! an index definition dropped before it is ready leaves no index, and defining it again works.
//! (A write dropped after it was sent still commits: `update.rs`.)

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use futures_lite::StreamExt;
use omnibus::actors::{Engine, EngineOptions, IndexDefinition};
use omnibus::{Error, Options};

use crate::common::index::{map_color, open_engine};

/// Polls `f` once with a waker that does nothing; returns whether it completed.
fn poll_once<F: Future + ?Sized>(f: Pin<&mut F>) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    matches!(f.poll(&mut cx), Poll::Ready(_))
}

/// Waits until `done()` holds, for at most 30 s (a hang guard: the work runs on a pool thread
/// the test cannot join).
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{what}: not after 30 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_write_dropped_while_it_waits_for_room_in_a_full_mailbox_is_never_sent() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::start(EngineOptions {
        executors: Some(2),
        mailbox_capacity: 1,
        ..EngineOptions::default()
    })
    .unwrap();
    let db = engine
        .blocking_open_database(dir.path().join("db"), Options::default())
        .unwrap();
    let s = db.blocking_create_storage("s").unwrap();
    // An update that holds the actor (and its executor thread) until told to go on.
    let (started_tx, started) = std::sync::mpsc::channel();
    let (go, go_rx) = std::sync::mpsc::channel::<()>();
    let held = {
        let s = s.clone();
        std::thread::spawn(move || {
            s.blocking_update(move |t| {
                started_tx.send(()).unwrap();
                go_rx.recv().unwrap();
                t.put(b"held", b"1")?;
                Ok::<(), Error>(())
            })
        })
    };
    started.recv().unwrap();
    // The actor is inside the update: its mailbox (one request) takes one more and is full.
    let mut queued = Box::pin(s.put(b"queued".to_vec(), b"1".to_vec()));
    assert!(!poll_once(queued.as_mut()));
    assert_eq!(s.mailbox_len(), 1);
    let mut dropped = Box::pin(s.put(b"dropped".to_vec(), b"1".to_vec()));
    assert!(!poll_once(dropped.as_mut()), "the mailbox is full");
    assert_eq!(
        s.mailbox_len(),
        1,
        "the second put waits outside the mailbox"
    );
    drop(dropped);
    go.send(()).unwrap();
    held.join().unwrap().unwrap();
    futures_lite::future::block_on(queued).unwrap();
    // Served in order: once this is answered, anything queued before it has committed.
    s.blocking_put(b"later".to_vec(), b"1".to_vec()).unwrap();
    assert!(s.blocking_get(b"held").unwrap().is_some());
    assert!(s.blocking_get(b"queued").unwrap().is_some());
    assert_eq!(
        s.blocking_get(b"dropped").unwrap(),
        None,
        "a write dropped before it was sent committed"
    );
    drop((s, db));
    engine.shutdown().unwrap();
}

#[test]
fn a_dropped_range_stream_lets_go_of_its_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, db) = open_engine(dir.path().join("db"));
    let s = db.blocking_create_storage("s").unwrap();
    for i in 0..10u32 {
        s.blocking_put(format!("k{i}"), vec![b'v'; 2000]).unwrap();
    }
    let before = s.stats().last_committed_txn;
    let mut stream = s.range_stream::<&[u8], _>(..).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let first = rt.block_on(stream.next()).unwrap().unwrap();
    assert_eq!(first.0, b"k0");
    // One short chunk: the whole range is buffered, nothing is in flight.
    assert_eq!(stream.buffered(), (9, false));
    for i in 0..10u32 {
        s.blocking_put(format!("k{i}"), vec![b'w'; 2000]).unwrap();
    }
    // The stream's snapshot holds the flush back.
    let f = s.blocking_flush().unwrap();
    assert_eq!(f.limited_by_snapshot, Some(before), "{f:?}");
    drop(stream);
    let f = s.blocking_flush().unwrap();
    assert_eq!(
        f.limited_by_snapshot, None,
        "a dropped stream still holds its snapshot: {f:?}"
    );
    assert_eq!(s.stats().last_flushed_txn, s.stats().last_committed_txn);
    drop((s, db));
    engine.shutdown().unwrap();
}

#[test]
fn a_dropped_next_future_of_a_range_stream_loses_no_entry() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, db) = open_engine(dir.path().join("db"));
    let s = db.blocking_create_storage("s").unwrap();
    let keys: Vec<Vec<u8>> = (0..1000u32)
        .map(|i| format!("k{i:04}").into_bytes())
        .collect();
    let mut b = omnibus::actors::WriteBatch::new();
    for k in &keys {
        b.put(k.clone(), b"v".to_vec());
    }
    s.blocking_write(b).unwrap();
    let mut stream = s.range_stream::<&[u8], _>(..).unwrap();
    let mut got = Vec::new();
    {
        let mut next = stream.next();
        let mut cx = Context::from_waker(Waker::noop());
        match Pin::new(&mut next).poll(&mut cx) {
            // Answered already (the pool was quicker than this poll): nothing to drop.
            Poll::Ready(e) => got.push(e.unwrap().unwrap().0),
            Poll::Pending => {}
        }
    }
    if got.is_empty() {
        // The first chunk was in flight when its `next()` future was dropped.
        assert_eq!(stream.buffered(), (0, true));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        while let Some(e) = stream.next().await {
            got.push(e.unwrap().0);
        }
    });
    assert_eq!(got.len(), keys.len());
    assert!(got == keys, "entries lost or repeated");
    drop((stream, s, db));
    engine.shutdown().unwrap();
}

#[test]
fn a_storage_creation_dropped_after_its_first_poll_still_creates_the_storage() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, db) = open_engine(dir.path().join("db"));
    let mut create = Box::pin(db.create_storage("made"));
    assert!(
        !poll_once(create.as_mut()),
        "created on the pool, not at once"
    );
    drop(create);
    eventually("the dropped creation", || {
        db.storages().contains(&"made".to_string())
    });
    let h = db.blocking_storage("made").unwrap();
    h.blocking_put(b"k".to_vec(), b"v".to_vec()).unwrap();
    assert_eq!(h.blocking_get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
    drop((h, db));
    engine.shutdown().unwrap();
}

#[test]
fn a_database_open_dropped_after_its_first_poll_is_closed_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let engine = Engine::start(EngineOptions {
        executors: Some(2),
        ..EngineOptions::default()
    })
    .unwrap();
    let mut open = Box::pin(engine.open_database(&path, Options::default()));
    assert!(!poll_once(open.as_mut()), "opened on the pool, not at once");
    drop(open);
    // The open runs to its end on the pool and its lost database closes: the lock is free
    // again (`AlreadyOpen` only while that is under way).
    let mut db = None;
    eventually("the dropped open's close", || {
        match engine.blocking_open_database(&path, Options::default()) {
            Ok(d) => {
                db = Some(d);
                true
            }
            Err(Error::AlreadyOpen { .. }) => false,
            Err(e) => panic!("reopening: {e}"),
        }
    });
    let db = db.unwrap();
    db.root()
        .blocking_put(b"k".to_vec(), b"v".to_vec())
        .unwrap();
    drop(db);
    engine.shutdown().unwrap();
}

#[test]
fn an_index_definition_dropped_before_it_is_ready_leaves_no_index() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, db) = open_engine(dir.path().join("db"));
    let root = db.root();
    root.blocking_put(b"apple".to_vec(), b"color=red".to_vec())
        .unwrap();
    let mut define = Box::pin(db.define_index(IndexDefinition::new("by_color", map_color)));
    assert!(!poll_once(define.as_mut()), "its storage is created first");
    drop(define);
    eventually("the index's storage", || {
        db.storages().contains(&"by_color".to_string())
    });
    assert!(db.indexes().is_empty(), "{:?}", db.indexes());
    // The root goes on (a feed it was given meanwhile would be dropped at this commit).
    root.blocking_put(b"leek".to_vec(), b"color=green".to_vec())
        .unwrap();
    // Defining it again builds it from the documents.
    db.blocking_define_index(IndexDefinition::new("by_color", map_color))
        .unwrap();
    db.blocking_wait_for_indexes().unwrap();
    assert_eq!(db.indexes(), ["by_color"]);
    assert_eq!(
        db.blocking_query("by_color", b"green").unwrap(),
        [b"leek".to_vec()]
    );
    assert_eq!(
        db.blocking_query("by_color", b"red").unwrap(),
        [b"apple".to_vec()]
    );
    drop((root, db));
    engine.shutdown().unwrap();
}
