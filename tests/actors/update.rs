//! Read-modify-write through the actors: `StorageHandle::update` runs a closure in a
//! transaction of its own (concurrent increments lose nothing; an error or a panic in the
//! closure commits nothing and leaves the storage writable), `compare_and_swap`, range deletes
//! in a write batch, index feeds from both, and what dropping a write's future means.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use omnibus::actors::{DatabaseHandle, Engine, EngineOptions, IndexDefinition, WriteBatch};
use omnibus::{Error, Options};

use crate::common::index as index_common;

fn start(dir: &std::path::Path) -> (Engine, DatabaseHandle) {
    index_common::open_engine(dir.join("db"))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn concurrent_updates_of_one_counter_lose_no_increment() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, db) = start(dir.path());
    let root = db.root();
    runtime().block_on(async {
        let mut tasks = Vec::new();
        for t in 0..8u32 {
            let root = root.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..40u32 {
                    let seen: u64 = root
                        .update(|txn| {
                            let n = match txn.get(b"counter")? {
                                Some(v) => u64::from_le_bytes(v.try_into().unwrap()),
                                None => 0,
                            };
                            txn.put(b"counter", (n + 1).to_le_bytes())?;
                            Ok::<u64, Error>(n + 1)
                        })
                        .await
                        .unwrap();
                    assert!(seen >= 1);
                    // Plain writes interleave with the updates.
                    root.put(format!("w{t}-{i}"), b"x".to_vec()).await.unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    let v = root.blocking_get(b"counter").unwrap().unwrap();
    assert_eq!(u64::from_le_bytes(v.try_into().unwrap()), 8 * 40);
    for t in 0..8 {
        for i in 0..40 {
            assert!(root.blocking_get(format!("w{t}-{i}")).unwrap().is_some());
        }
    }
    drop(db);
    engine.shutdown().unwrap();
}

/// An application's own error type, which an update closure aborts with.
#[derive(Debug)]
enum AppError {
    NotEnough { have: u64 },
    Engine(Error),
}

impl From<Error> for AppError {
    fn from(e: Error) -> AppError {
        AppError::Engine(e)
    }
}

#[test]
fn an_update_that_returns_an_error_commits_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, db) = start(dir.path());
    let root = db.root();
    root.blocking_put(b"balance", 5u64.to_le_bytes().to_vec())
        .unwrap();
    let withdraw = |amount: u64| {
        move |txn: &mut omnibus::actors::UpdateTransaction<'_>| {
            let have = u64::from_le_bytes(txn.get(b"balance")?.unwrap().try_into().unwrap());
            // Written before the check: must not survive an abort.
            txn.put(b"audit", format!("withdraw {amount}"))?;
            if have < amount {
                return Err(AppError::NotEnough { have });
            }
            txn.put(b"balance", (have - amount).to_le_bytes())?;
            Ok(have - amount)
        }
    };
    match root.blocking_update(withdraw(7)) {
        Err(AppError::NotEnough { have: 5 }) => {}
        other => panic!("expected NotEnough {{ have: 5 }}, got {other:?}"),
    }
    assert_eq!(root.blocking_get(b"audit").unwrap(), None);
    assert_eq!(
        root.blocking_get(b"balance").unwrap(),
        Some(5u64.to_le_bytes().to_vec())
    );
    assert_eq!(root.blocking_update(withdraw(3)).unwrap(), 2);
    assert_eq!(
        root.blocking_get(b"audit").unwrap().as_deref(),
        Some(&b"withdraw 3"[..])
    );
    // An engine error inside the closure comes back through the application's type.
    match root.blocking_update(|txn| txn.put(b"", b"v").map_err(AppError::from)) {
        Err(AppError::Engine(Error::EmptyKey)) => {}
        other => panic!("expected the engine's EmptyKey, got {other:?}"),
    }
    drop(db);
    engine.shutdown().unwrap();
}

#[test]
fn a_panicking_update_commits_nothing_and_leaves_the_storage_writable() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, db) = start(dir.path());
    let root = db.root();
    let r: Result<(), Error> = root.blocking_update(|txn| {
        txn.put(b"half", b"written")?;
        panic!("boom in the closure");
    });
    match r {
        Err(Error::UpdatePanicked { message }) => assert!(message.contains("boom"), "{message}"),
        other => panic!("expected UpdatePanicked, got {other:?}"),
    }
    assert_eq!(root.blocking_get(b"half").unwrap(), None);
    root.blocking_put(b"after", b"ok".to_vec()).unwrap();
    assert_eq!(
        root.blocking_get(b"after").unwrap().as_deref(),
        Some(&b"ok"[..])
    );
    drop((root, db));
    engine.shutdown().unwrap();
    // Reopened, the abandoned write is still absent and the later one is there.
    let (engine, db) = start(dir.path());
    assert_eq!(db.root().blocking_get(b"half").unwrap(), None);
    assert!(db.root().blocking_get(b"after").unwrap().is_some());
    drop(db);
    engine.shutdown().unwrap();
}

#[test]
fn compare_and_swap_swaps_only_the_expected_value() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, db) = start(dir.path());
    let s = db.blocking_create_storage("cas").unwrap();
    // Absent expected and absent found: inserted.
    assert_eq!(
        s.blocking_compare_and_swap(b"k".to_vec(), None, Some(b"1".to_vec()))
            .unwrap(),
        Ok(())
    );
    // Absent expected, present found: the current value comes back, nothing written.
    assert_eq!(
        s.blocking_compare_and_swap(b"k".to_vec(), None, Some(b"x".to_vec()))
            .unwrap(),
        Err(Some(b"1".to_vec()))
    );
    // The wrong value expected.
    assert_eq!(
        s.blocking_compare_and_swap(b"k".to_vec(), Some(b"0"), Some(b"x".to_vec()))
            .unwrap(),
        Err(Some(b"1".to_vec()))
    );
    assert_eq!(s.blocking_get(b"k").unwrap().as_deref(), Some(&b"1"[..]));
    // The right one.
    assert_eq!(
        s.blocking_compare_and_swap(b"k".to_vec(), Some(b"1"), Some(b"2".to_vec()))
            .unwrap(),
        Ok(())
    );
    assert_eq!(s.blocking_get(b"k").unwrap().as_deref(), Some(&b"2"[..]));
    // `None` as the new value removes the key.
    assert_eq!(
        s.blocking_compare_and_swap(b"k".to_vec(), Some(b"2"), None)
            .unwrap(),
        Ok(())
    );
    assert_eq!(s.blocking_get(b"k").unwrap(), None);
    // A present value expected on an absent key.
    assert_eq!(
        s.blocking_compare_and_swap(b"k".to_vec(), Some(b"2"), None)
            .unwrap(),
        Err(None)
    );
    // Limits are checked before anything is sent.
    assert!(matches!(
        s.blocking_compare_and_swap(Vec::new(), None, Some(b"v".to_vec())),
        Err(Error::EmptyKey)
    ));
    drop((s, db));
    engine.shutdown().unwrap();
}

/// The index entries (term, 0, document key) of `index` as `(term, key)` pairs, the applied
/// record left out.
fn entries(index: &omnibus::actors::StorageHandle) -> Vec<(Vec<u8>, Vec<u8>)> {
    let snap = index.snapshot().unwrap();
    let mut out = Vec::new();
    for e in snap.range::<&[u8], _>(..).unwrap() {
        let (k, _) = e.unwrap();
        if k == omnibus::actors::INDEX_APPLIED_KEY {
            continue;
        }
        let z = k.iter().position(|b| *b == 0).unwrap();
        out.push((k[..z].to_vec(), k[z + 1..].to_vec()));
    }
    out
}

#[test]
fn range_deletes_and_updates_on_the_root_reach_the_indexes() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, db) = start(dir.path());
    db.blocking_define_index(
        IndexDefinition::new("by_color", index_common::map_color)
            .min_batch_interval(Duration::from_millis(10)),
    )
    .unwrap();
    let index = db.blocking_storage("by_color").unwrap();
    let root = db.root();
    let colors = ["red", "green", "blue"];
    let mut b = WriteBatch::new();
    for i in 0..20 {
        b.put(
            format!("d{i:02}"),
            format!("color={}", colors[i % 3]).into_bytes(),
        );
    }
    root.blocking_write(b).unwrap();
    // One batch: a range delete between two puts (the first put falls inside the range and
    // is removed with it; the second lands after it).
    let mut b = WriteBatch::new();
    b.put(b"d07".to_vec(), b"color=black".to_vec())
        .delete_range(b"d05".as_slice()..b"d15".as_slice())
        .put(b"d10".to_vec(), b"color=white".to_vec());
    root.blocking_write(b).unwrap();
    // An update: a document changes color, another goes.
    root.blocking_update(|txn| {
        txn.put(b"d00", b"color=pink")?;
        assert!(txn.delete(b"d01")?);
        Ok::<(), Error>(())
    })
    .unwrap();
    db.blocking_wait_for_indexes().unwrap();

    let snap = root.snapshot().unwrap();
    let mut docs = Vec::new();
    for e in snap.range::<&[u8], _>(..).unwrap() {
        let (k, v) = e.unwrap();
        let color = index_common::field(v, "color").unwrap().to_vec();
        docs.push((color, k.to_vec()));
    }
    let keys: Vec<&[u8]> = docs.iter().map(|(_, k)| k.as_slice()).collect();
    let mut expected_keys: Vec<Vec<u8>> = (0..5)
        .chain(15..20)
        .filter(|i| *i != 1)
        .map(|i| format!("d{i:02}").into_bytes())
        .collect();
    expected_keys.push(b"d10".to_vec());
    expected_keys.sort();
    assert_eq!(
        keys,
        expected_keys
            .iter()
            .map(|k| k.as_slice())
            .collect::<Vec<_>>()
    );
    docs.sort();
    // The index holds exactly one entry per remaining document, with its current color.
    assert_eq!(entries(&index), docs);
    assert!(docs.contains(&(b"pink".to_vec(), b"d00".to_vec())));
    assert!(docs.contains(&(b"white".to_vec(), b"d10".to_vec())));
    drop((index, root, snap, db));
    engine.shutdown().unwrap();
}

/// Polls `f` once with a waker that does nothing; returns whether it completed.
fn poll_once<F: Future>(f: F) -> bool {
    let mut f = pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    matches!(f.as_mut().poll(&mut cx), Poll::Ready(_))
}

#[test]
fn a_write_future_dropped_after_its_first_poll_still_commits_and_one_never_polled_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, db) = start(dir.path());
    let s = db.blocking_create_storage("cancel").unwrap();
    // Sent at the first poll (the mailbox has room), then dropped: the write goes on.
    let done = poll_once(s.put(b"polled".to_vec(), b"1".to_vec()));
    assert!(!done, "a durable put cannot be done at its first poll");
    let _ = poll_once(s.update(|txn| {
        txn.put(b"updated", b"1")?;
        Ok::<(), Error>(())
    }));
    // Never polled: nothing was sent.
    drop(s.put(b"unpolled".to_vec(), b"1".to_vec()));
    // The mailbox is served in order: once a later request is answered, the dropped ones
    // before it have committed.
    s.blocking_put(b"later".to_vec(), b"1".to_vec()).unwrap();
    assert!(s.blocking_get(b"polled").unwrap().is_some());
    assert!(s.blocking_get(b"updated").unwrap().is_some());
    assert_eq!(s.blocking_get(b"unpolled").unwrap(), None);
    drop((s, db));
    engine.shutdown().unwrap();
}

#[test]
fn a_blocking_call_inside_an_update_is_refused_instead_of_hanging_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    // One executor: every actor and reader lives on the thread that runs the closure.
    let engine = Engine::start(EngineOptions {
        executors: Some(1),
        reads: omnibus::actors::ReadPath::Pool,
        ..EngineOptions::default()
    })
    .unwrap();
    let db = engine
        .blocking_open_database(dir.path().join("db"), Options::default())
        .unwrap();
    let a = db.blocking_create_storage("a").unwrap();
    let b = db.blocking_create_storage("b").unwrap();
    let (b2, a2) = (b.clone(), a.clone());
    let inner = a
        .blocking_update(move |t| {
            t.put(b"mine", b"1")?;
            Ok::<_, Error>((
                b2.blocking_put(b"other".to_vec(), b"1".to_vec()),
                a2.blocking_get(b"mine"),
            ))
        })
        .unwrap();
    for r in [inner.0.map(|_| ()), inner.1.map(|_| ())] {
        assert!(matches!(r, Err(Error::BlockingOnExecutor { .. })), "{r:?}");
    }
    // The update committed; nothing was sent by the refused calls; the engine goes on.
    assert!(a.blocking_get(b"mine").unwrap().is_some());
    assert_eq!(b.blocking_get(b"other").unwrap(), None);
    b.blocking_put(b"other".to_vec(), b"2".to_vec()).unwrap();
    drop((a, b, db));
    engine.shutdown().unwrap();
}
