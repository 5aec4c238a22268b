//! Write buffers and the actor engine: the engine refuses a database with
//! `Options::write_buffer_bytes` other than 0 and the default, which it takes as none (only
//! index storages are buffered under it), and a database
//! written with buffers through the library opens under it with its buffers put back from the
//! journal; the storage actors' first commits apply them without a blocking call on an
//! executor, and nothing is lost. A buffered index follows its documents exactly, its actor
//! applies the buffer once it is aged with no request coming, a backup takes no writer from an
//! actor (the index's buffered entries go into the copy's journal), and the buffers count in the engine's memory budget.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use omnibus::actors::{Engine, EngineOptions, IndexDefinition, WriteBatch};
use omnibus::testing::executor_guard::blocking_calls_on_executors;
use omnibus::{Database, Error, Options};

#[test]
fn the_engine_refuses_a_write_buffer() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::start(EngineOptions {
        executors: Some(1),
        ..EngineOptions::default()
    })
    .unwrap();
    let r = engine.blocking_open_database(
        dir.path().join("db"),
        Options {
            write_buffer_bytes: 2 << 20,
            ..Options::default()
        },
    );
    assert!(matches!(r, Err(Error::InvalidOptions(_))), "{r:?}");
    assert!(
        std::fs::read_dir(dir.path()).unwrap().next().is_none(),
        "a refused open leaves nothing behind"
    );
    // The default buffer is taken as none: the root opens unbuffered, its commits journal
    // pages.
    let db = engine
        .blocking_open_database(dir.path().join("db"), Options::default())
        .unwrap();
    db.root().blocking_put(b"k", b"v").unwrap();
    let st = db.root().stats();
    assert_eq!(
        (st.buffer_entries, st.pages_journaled > 0),
        (0, true),
        "{st:?}"
    );
    drop(db);
    engine.shutdown().unwrap();
}

#[test]
fn buffers_left_in_the_journal_are_applied_by_the_actors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    // Without a flush at close, a drop leaves the buffers in the journal.
    let db = Database::open(
        &path,
        Options {
            write_buffer_bytes: 64 << 20,
            flush_on_close: false,
            // The entries must stay buffered however long the commits take: an aged buffer
            // (5 s by default) is applied by the flush service.
            flush_max_age: Duration::from_secs(3600),
            ..Options::default()
        },
    )
    .unwrap();
    let branch = db.create_storage("branch").unwrap();
    for (s, prefix) in [(db.root(), "root"), (branch.clone(), "branch")] {
        for i in 0..300u32 {
            let mut w = s.begin_write().unwrap();
            w.put(format!("{prefix}-{i:04}"), format!("value {i}"))
                .unwrap();
            w.commit().unwrap();
        }
        assert_eq!(s.stats().buffer_entries, 300, "{prefix}: buffered");
        s.sync_journal().unwrap();
    }
    // Dropped without a close or flush: the entries are in the journal only.
    drop(branch);
    drop(db);

    let before = blocking_calls_on_executors();
    let engine = Engine::start(EngineOptions {
        executors: Some(1),
        ..EngineOptions::default()
    })
    .unwrap();
    let h = engine
        .blocking_open_database(&path, Options::default())
        .unwrap();
    let root = h.root();
    let branch = h.blocking_storage("branch").unwrap();
    for (s, prefix) in [(&root, "root"), (&branch, "branch")] {
        assert_eq!(
            s.stats().buffer_entries,
            300,
            "{prefix}: put back from the journal"
        );
        assert_eq!(
            s.blocking_get(format!("{prefix}-0123")).unwrap().as_deref(),
            Some(&b"value 123"[..])
        );
        s.blocking_put(format!("{prefix}-new"), "after").unwrap();
        assert_eq!(
            s.stats().buffer_entries,
            0,
            "{prefix}: the actor's commit applied the buffer"
        );
        assert_eq!(s.stats().entries, 301);
    }
    assert_eq!(
        blocking_calls_on_executors(),
        before,
        "an executor made a blocking call"
    );
    drop((root, branch, h));
    engine.shutdown().unwrap();
    let db = Database::open(&path, Options::default()).unwrap();
    assert_eq!(db.root().begin_read().unwrap().len(), 301);
    assert_eq!(
        db.storage("branch").unwrap().begin_read().unwrap().len(),
        301
    );
}

/// The one term of a document: its value's first byte.
fn first_byte(_key: &[u8], doc: &[u8]) -> Vec<Vec<u8>> {
    doc.first()
        .map(|b| vec![vec![*b]])
        .into_iter()
        .flatten()
        .collect()
}

/// The entries index `first` must hold for documents `doc-0..n` with values `value(i)`.
fn expected(n: u32, value: impl Fn(u32) -> String) -> BTreeSet<Vec<u8>> {
    (0..n)
        .map(|i| {
            let mut e = omnibus::actors::index_term_prefix(&value(i).as_bytes()[..1]);
            e.extend_from_slice(format!("doc-{i:05}").as_bytes());
            e
        })
        .collect()
}

/// Every entry of an index storage but its applied record.
fn index_entries(s: &impl crate::common::index::Snapshot) -> BTreeSet<Vec<u8>> {
    let r = s.snap();
    r.range::<&[u8], _>(..)
        .unwrap()
        .map(|e| e.unwrap().0.to_vec())
        .filter(|k| k.len() > 1)
        .collect()
}

#[test]
fn a_buffered_index_is_exact_applies_when_idle_and_backs_up_without_taking_writers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let engine = Engine::start(EngineOptions {
        executors: Some(1),
        ..EngineOptions::default()
    })
    .unwrap();
    let opts = Options {
        flush_max_age: Duration::from_millis(400),
        ..Options::default()
    };
    let db = engine.blocking_open_database(&path, opts.clone()).unwrap();
    db.blocking_define_index(
        IndexDefinition::new("first", first_byte)
            .min_batch_interval(Duration::ZERO)
            .write_buffer_bytes(8 << 20),
    )
    .unwrap();
    let index = db.blocking_storage("first").unwrap();
    assert!(index.write_buffer_bytes() > 0, "the index is buffered");
    let v1 = |i: u32| format!("{}-{i}", (b'a' + (i % 7) as u8) as char);
    for chunk in 0..20u32 {
        let mut b = WriteBatch::new();
        for i in chunk * 100..(chunk + 1) * 100 {
            b.put(format!("doc-{i:05}"), v1(i));
        }
        db.root().blocking_write(b).unwrap();
    }
    db.blocking_wait_for_indexes().unwrap();
    let st = index.stats();
    assert!(st.buffer_entries > 0, "entries wait in the buffer: {st:?}");
    assert!(
        omnibus::live_buffer_bytes() >= st.buffer_bytes,
        "the process counts the buffer"
    );
    assert_eq!(index_entries(&index), expected(2000, v1));

    // A backup while entries are buffered: they go into the copy's journal, no actor takes
    // part (nothing fails with WriteInProgress, nothing is poisoned).
    let copy = dir.path().join("copy");
    db.blocking_backup(&copy).unwrap();
    // Half the documents change their term afterwards: the actors go on.
    let v2 = |i: u32| {
        if i.is_multiple_of(2) {
            format!("z-{i}")
        } else {
            v1(i)
        }
    };
    let mut b = WriteBatch::new();
    for i in (0..2000u32).step_by(2) {
        b.put(format!("doc-{i:05}"), v2(i));
    }
    db.root().blocking_write(b).unwrap();
    db.blocking_wait_for_indexes().unwrap();
    assert_eq!(index_entries(&index), expected(2000, v2));

    // No request comes: the actor applies the aged buffer by itself (within the age and a
    // poll; bounded wait).
    let t0 = Instant::now();
    while index.stats().buffer_entries > 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the aged buffer was never applied: {:?}",
            index.stats()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(index_entries(&index), expected(2000, v2));
    let s = &db.index_stats()[0];
    assert!(
        matches!(s.state, omnibus::actors::IndexState::Current),
        "{s:?}"
    );
    drop((index, db));
    engine.shutdown().unwrap();

    // The copy holds the documents and the index as of the backup, whole.
    let c = Database::open(&copy, Options::default()).unwrap();
    assert_eq!(c.root().begin_read().unwrap().len(), 2000);
    let ci = c.storage("first").unwrap();
    // The buffered entries came back from the copy's journal into its write buffer; its flush
    // service may have applied that buffer already (on a loaded machine the check once came
    // after the apply and found the buffer empty).
    let st = ci.stats();
    assert!(
        st.journal_records_replayed >= 1 && (st.buffer_entries > 0 || st.background_applies > 0),
        "copied buffered: {st:?}"
    );
    assert_eq!(index_entries(&ci), expected(2000, v1));
    assert!(ci.check().unwrap().is_ok());
    drop((ci, c));

    // Reopened: the index resumes (its buffer went into the tree at close), no reconcile.
    let engine = Engine::start(EngineOptions {
        executors: Some(1),
        ..EngineOptions::default()
    })
    .unwrap();
    let db = engine.blocking_open_database(&path, opts).unwrap();
    db.blocking_define_index(IndexDefinition::new("first", first_byte).write_buffer_bytes(8 << 20))
        .unwrap();
    db.blocking_wait_for_indexes().unwrap();
    let s = &db.index_stats()[0];
    assert_eq!(s.reconciles, 0, "{s:?}");
    let index = db.blocking_storage("first").unwrap();
    assert_eq!(index_entries(&index), expected(2000, v2));
    drop((index, db));
    engine.shutdown().unwrap();
}
