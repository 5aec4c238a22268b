//! Background applies of a write buffer (docs/design.md 16.1): commits made while an apply holds
//! the writer are logical-only and carried by the apply's record; a transaction that needs the
//! tree takes the writer back; the flush service applies full buffers while a thread commits.
//! Every state is checked against a `BTreeMap` model, after reopening too.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use omnibus::{Error, FlushMode, Options, Storage};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::common::model::Model;

fn opts(buffer: u64) -> Options {
    Options {
        flush_mode: FlushMode::Manual,
        write_buffer_bytes: buffer,
        // The reopen replays the journal: the apply's record and the commits around it.
        flush_on_close: false,
        ..Options::default()
    }
}

fn key(i: u32) -> Vec<u8> {
    format!("key-{i:06}").into_bytes()
}

/// Every entry `s` reads now.
fn content(s: &Storage) -> Model {
    crate::common::model::content(s).unwrap()
}

/// 3,000 keys in the tree, then 400 one-put commits buffered (the buffer is far from full).
fn loaded(dir: &std::path::Path) -> (Storage, Model) {
    let s = Storage::open(dir.join("s"), opts(1 << 20)).unwrap();
    let mut model = Model::new();
    let mut w = s.begin_write().unwrap();
    for i in 0..3000u32 {
        let v = format!("tree-{i}").into_bytes();
        w.put(key(i * 2), &v).unwrap();
        model.insert(key(i * 2), v);
    }
    w.commit().unwrap();
    // Applied into the tree: the buffer starts empty.
    s.flush().unwrap();
    for i in 0..400u32 {
        let mut w = s.begin_write().unwrap();
        let k = key((i * 7919) % 6000);
        let v = format!("buffered-{i}").into_bytes();
        w.put(&k, &v).unwrap();
        model.insert(k, v);
        w.commit().unwrap();
    }
    assert!(s.stats().buffer_entries >= 300, "{:?}", s.stats());
    (s, model)
}

/// Commits made while a background apply holds the writer are logical-only: the apply
/// publishes once they ended, its record carrying their entries (an overwrite of a key the
/// apply writes, a delete of one, a new key), and a reopen that replays the journal rebuilds
/// the same state. A snapshot taken before the apply keeps seeing its own state.
#[test]
fn commits_during_an_apply_are_carried_and_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let (s, mut model) = loaded(dir.path());
    let before = s.stats();
    let snap = s.begin_read().unwrap();
    let snap_model = model.clone();
    let frozen_key = key((7 * 7919) % 6000);
    let mut during = 0u32;
    let published = omnibus::testing::apply_in_background(&s, &mut || {
        // The apply holds the writer: no page transaction can begin, a logical-only one can.
        let mut w = s
            .try_begin_write()
            .expect("a logical-only transaction begins");
        w.put(&frozen_key, b"overwritten while applying").unwrap();
        model.insert(frozen_key.clone(), b"overwritten while applying".to_vec());
        assert!(w.delete(key(2)).unwrap());
        model.remove(&key(2));
        w.put(b"new-while-applying", b"n").unwrap();
        model.insert(b"new-while-applying".to_vec(), b"n".to_vec());
        w.commit().unwrap();
        during += 1;
        let pages = s.stats().pages_journaled;
        for i in 0..20u32 {
            let mut w = s.begin_write().unwrap();
            let k = key(10_000 + i);
            w.put(&k, b"x").unwrap();
            model.insert(k, b"x".to_vec());
            w.commit().unwrap();
            during += 1;
        }
        assert_eq!(
            s.stats().pages_journaled,
            pages,
            "a logical-only commit journals no page"
        );
        assert_eq!(
            content(&s),
            model,
            "reads merge the buffer during the apply"
        );
    })
    .unwrap();
    assert!(published, "the apply was published");
    assert_eq!(during, 21);
    let after = s.stats();
    assert_eq!(after.background_applies, before.background_applies + 1);
    assert_eq!(
        after.buffer_entries, 23,
        "only what was committed during the apply stays buffered: {after:?}"
    );
    assert!(after.pages_journaled > before.pages_journaled, "{after:?}");
    assert_eq!(content(&s), model);
    let old: Model = snap
        .iter()
        .unwrap()
        .map(|e| {
            let (k, v) = e.unwrap();
            (k.to_vec(), v.to_vec())
        })
        .collect();
    assert_eq!(
        old, snap_model,
        "a snapshot from before the apply is unchanged"
    );
    drop(snap);
    // One more commit, then a reopen that replays every record since the last flush.
    let mut w = s.begin_write().unwrap();
    w.put(b"after", b"a").unwrap();
    model.insert(b"after".to_vec(), b"a".to_vec());
    w.commit().unwrap();
    drop(s);
    let s = Storage::open(dir.path().join("s"), opts(1 << 20)).unwrap();
    assert_eq!(content(&s), model, "after the replay");
    assert_eq!(s.stats().buffer_entries, 24, "{:?}", s.stats());
    assert!(s.check().unwrap().is_ok());
    s.flush().unwrap();
    assert_eq!(s.stats().buffer_entries, 0);
    assert_eq!(content(&s), model);
}

/// A range delete in a transaction begun while an apply holds the writer takes the writer
/// back: the apply gives up and publishes nothing, the buffer is whole again, and the range
/// delete writes the tree with every buffered entry. (The transaction runs on a thread of its
/// own, as an application's does beside the flush service's apply.)
#[test]
fn a_range_delete_during_an_apply_takes_the_writer_back() {
    let dir = tempfile::tempdir().unwrap();
    let (s, mut model) = loaded(dir.path());
    let s = Arc::new(s);
    let before = s.stats();
    let from = key(1000);
    let to = key(2000);
    model.insert(b"kept".to_vec(), b"k".to_vec());
    model.retain(|k, _| !(k[..] >= from[..] && k[..] < to[..]));
    let mut writer = None;
    let published = omnibus::testing::apply_in_background(&s, &mut || {
        let (begun_tx, begun) = std::sync::mpsc::channel();
        let (s, from, to) = (s.clone(), from.clone(), to.clone());
        writer = Some(std::thread::spawn(move || {
            let mut w = s.begin_write().unwrap();
            w.put(b"kept", b"k").unwrap();
            begun_tx.send(()).unwrap();
            w.delete_range(&from[..]..&to[..]).unwrap();
            w.commit().unwrap();
        }));
        // The apply waits to publish only once the transaction is open.
        begun.recv().unwrap();
    })
    .unwrap();
    writer.take().unwrap().join().unwrap();
    assert!(!published, "the apply gave up");
    let after = s.stats();
    assert_eq!(after.background_applies, before.background_applies);
    assert_eq!(
        after.buffer_entries, 0,
        "the range delete applied all: {after:?}"
    );
    assert_eq!(content(&s), model);
    // The writer is free again: an apply runs to its end now.
    let mut w = s.begin_write().unwrap();
    w.put(b"z", b"z").unwrap();
    model.insert(b"z".to_vec(), b"z".to_vec());
    w.commit().unwrap();
    assert!(omnibus::testing::apply_in_background(&s, &mut || {}).unwrap());
    assert_eq!(s.stats().buffer_entries, 0);
    drop(s);
    let s = Storage::open(dir.path().join("s"), opts(1 << 20)).unwrap();
    assert_eq!(content(&s), model);
    assert!(s.check().unwrap().is_ok());
}

/// A transaction that holds the writer keeps a background apply from starting (it does
/// nothing and says so), and an aborted logical-only transaction lets the apply publish.
#[test]
fn an_apply_waits_for_no_writer_and_an_abort_frees_it() {
    let dir = tempfile::tempdir().unwrap();
    let (s, mut model) = loaded(dir.path());
    let w = s.begin_write().unwrap();
    assert!(!omnibus::testing::apply_in_background(&s, &mut || {}).unwrap());
    drop(w);
    let published = omnibus::testing::apply_in_background(&s, &mut || {
        let mut w = s.begin_write().unwrap();
        w.put(b"aborted", b"a").unwrap();
        w.abort();
        // One logical-only transaction at a time: another begins only after.
        let mut w = s.begin_write().unwrap();
        assert!(matches!(s.try_begin_write(), Err(Error::WriteInProgress)));
        w.put(b"committed", b"c").unwrap();
        model.insert(b"committed".to_vec(), b"c".to_vec());
        w.commit().unwrap();
    })
    .unwrap();
    assert!(published);
    assert_eq!(s.stats().buffer_entries, 1);
    assert_eq!(content(&s), model);
}

/// With background flushes, the flush service applies each full buffer while one thread
/// commits one-put and one-delete transactions and another reads: every commit is seen at
/// once, reads never see a partial apply, and the storage reopens to the model.
#[test]
fn the_flush_service_applies_while_a_thread_commits() {
    let dir = tempfile::tempdir().unwrap();
    let o = Options {
        write_buffer_bytes: 8 << 10,
        flush_on_close: false,
        ..Options::default()
    };
    let s = Arc::new(Storage::open(dir.path().join("s"), o.clone()).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (s, stop) = (s.clone(), stop.clone());
        std::thread::spawn(move || {
            // Bounded by the writer's end.
            let mut reads = 0u64;
            while !stop.load(Ordering::Acquire) {
                let r = s.begin_read().unwrap();
                // Keys are written in pairs in one transaction: a snapshot holds both or none.
                for e in r.prefix(b"a-").unwrap() {
                    let (k, v) = e.unwrap();
                    let twin = [b"b-", &k[2..]].concat();
                    assert_eq!(r.get(&twin).unwrap(), Some(v), "{k:?}");
                }
                reads += 1;
            }
            reads
        })
    };
    let mut rng = SmallRng::seed_from_u64(0xBAC6);
    let mut model = Model::new();
    for i in 0..3000u32 {
        let n = rng.random_range(0..500u32);
        let mut w = s.begin_write().unwrap();
        let (a, b) = (format!("a-{n:04}"), format!("b-{n:04}"));
        if rng.random_bool(0.2) && model.contains_key(a.as_bytes()) {
            w.delete(&a).unwrap();
            w.delete(&b).unwrap();
            model.remove(a.as_bytes());
            model.remove(b.as_bytes());
        } else {
            let v = format!("v{i}-{}", "x".repeat(rng.random_range(0..200)));
            w.put(&a, &v).unwrap();
            w.put(&b, &v).unwrap();
            model.insert(a.into_bytes(), v.clone().into_bytes());
            model.insert(b.into_bytes(), v.into_bytes());
        }
        w.commit().unwrap();
        if i % 500 == 0 {
            assert_eq!(content(&s), model, "after commit {i}");
        }
    }
    stop.store(true, Ordering::Release);
    assert!(reader.join().unwrap() > 0);
    let st = s.stats();
    assert!(st.background_applies > 0, "{st:?}");
    assert!(
        st.buffer_bytes <= 2 * (8 << 10) + 1024,
        "the buffer stays within about twice its size: {st:?}"
    );
    assert_eq!(content(&s), model);
    drop(s);
    let s = Storage::open(dir.path().join("s"), o).unwrap();
    assert_eq!(content(&s), model, "after the replay");
    assert!(s.check().unwrap().is_ok());
}

/// Dropping the last handle while a transaction begun during a background apply was still open
/// hung for ever: the drop waited for the flush service, whose apply waited for that
/// transaction to end. The apply now gives up.
#[test]
fn dropping_the_last_handle_beside_an_open_transaction_during_an_apply_returns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let (done_tx, done) = std::sync::mpsc::channel();
    let p = path.clone();
    std::thread::spawn(move || {
        for round in 0..40u32 {
            let s = Storage::open(
                &p,
                Options {
                    write_buffer_bytes: 64 << 10,
                    ..Options::default()
                },
            )
            .unwrap();
            // A full buffer: the flush service starts an apply.
            for i in 0..(20 + round % 30) {
                let mut w = s.begin_write().unwrap();
                w.put(key(i), [1u8; 3000]).unwrap();
                w.commit().unwrap();
            }
            let open = s.begin_write().unwrap();
            drop(s);
            drop(open);
        }
        done_tx.send(()).unwrap();
    });
    done.recv_timeout(std::time::Duration::from_secs(120))
        .expect("dropping the last handle hung");
    let s = Storage::open(&path, opts(0)).unwrap();
    assert_eq!(s.begin_read().unwrap().len(), 49);
    assert!(s.check().unwrap().is_ok());
}
