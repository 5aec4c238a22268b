//! The story: an executor thread serves many actors (storage actors, index actors, a flusher,
//! a reader), so one `fdatasync` or `fallocate` made there stalls all of them for as long as
//! the disk takes. The engine marks its executor threads, and the default environment checks
//! every call that may wait for the disk: on a marked thread it is counted and, in this debug
//! build, panics. A panic inside an actor may be caught and turned into an error (a storage
//! actor poisons its storage), so the test does not rely on it: it reads the count.
//!
//! One engine workload, twice (a database with a shared journal, whose writer has a thread of
//! its own, and one with separate journals, whose writer actors live on the executors): puts
//! that grow the data file well past its initial size, a branch storage opened and dropped, an
//! index defined and kept current, deletes, journal files rotating (1 MiB each), flushes run by
//! the engine's flushers, shutdown, and a reopen in a second engine that resumes the index
//! and writes again. Afterwards no executor has made a single blocking call.

use std::time::{Duration, Instant};

use omnibus::actors::{DatabaseHandle, Engine, EngineOptions, IndexDefinition, WriteBatch};
use omnibus::testing::executor_guard::{
    blocking_calls_on_executors, first_blocking_call_on_executor,
};
use omnibus::{JournalMode, Options};

const DOCS: u32 = 4_000;
const VALUE: usize = 1_500;

fn options(mode: JournalMode) -> Options {
    Options {
        journal_mode: mode,
        journal_file_size: 1 << 20,
        flush_scratch_bytes: 512 << 10,
        flush_max_age: Duration::from_millis(50),
        ..Options::default()
    }
}

fn engine() -> Engine {
    Engine::start(EngineOptions {
        executors: Some(2),
        flush_tick: Duration::from_millis(10),
        ..EngineOptions::default()
    })
    .unwrap()
}

fn doc(i: u32) -> Vec<u8> {
    let mut v = format!("{{\"color\":\"c{}\",\"n\":{i}}}", i % 7).into_bytes();
    v.resize(VALUE, b' ');
    v
}

/// The index: a document's `color` field.
fn by_color() -> IndexDefinition {
    IndexDefinition::new("by_color", |_k: &[u8], v: &[u8]| {
        let s = std::str::from_utf8(v).unwrap_or("");
        s.split('"')
            .nth(3)
            .map(|c| vec![c.as_bytes().to_vec()])
            .unwrap_or_default()
    })
    .min_batch_interval(Duration::from_millis(5))
}

/// Waits until the engine's flushers have flushed every commit of `h`'s storage.
fn wait_flushed(db: &DatabaseHandle, name: &str) {
    let s = if name.is_empty() {
        db.root()
    } else {
        db.blocking_create_storage(name).unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let st = s.stats();
        if st.flushes > 0 && st.last_flushed_txn == st.last_committed_txn {
            return;
        }
        assert!(Instant::now() < deadline, "never flushed: {st:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn first_run(engine: &Engine, path: &std::path::Path, mode: JournalMode) {
    let db = engine.blocking_open_database(path, options(mode)).unwrap();
    let root = db.root();
    let initial = root.stats().data_file_bytes;
    db.blocking_define_index(by_color()).unwrap();
    // A branch opened (create: mkdir, open, directory syncs) and dropped (rename, rmdir).
    let scratch = db.blocking_create_storage("scratch").unwrap();
    scratch.blocking_put("k", "v").unwrap();
    db.blocking_create_storage("notes").unwrap();
    std::thread::scope(|s| {
        for t in 0..4u32 {
            let (root, notes) = (root.clone(), db.blocking_create_storage("notes").unwrap());
            s.spawn(move || {
                for chunk in (t * DOCS / 4..(t + 1) * DOCS / 4)
                    .collect::<Vec<_>>()
                    .chunks(20)
                {
                    let mut b = WriteBatch::new();
                    for &i in chunk {
                        b.put(format!("doc{i:05}"), doc(i));
                    }
                    root.blocking_write(b).unwrap();
                    notes.blocking_put(format!("n{t}"), doc(chunk[0])).unwrap();
                }
            });
        }
    });
    for i in (0..DOCS).step_by(3) {
        assert!(root.blocking_delete(format!("doc{i:05}")).unwrap());
    }
    db.blocking_wait_for_indexes().unwrap();
    futures_lite::future::block_on(db.drop_storage("scratch")).unwrap();
    wait_flushed(&db, "");
    wait_flushed(&db, "notes");
    wait_flushed(&db, "by_color");
    let st = root.stats();
    assert!(
        st.data_file_bytes >= initial + (4 << 20),
        "the data file did not grow: {initial} -> {st:?}"
    );
    // Journal files of 1 MiB: more than four of them were started (from the pool or created).
    assert!(
        st.journal.bytes > 4 << 20,
        "the journal did not rotate: {st:?}"
    );
}

fn second_run(engine: &Engine, path: &std::path::Path, mode: JournalMode) {
    let db = engine.blocking_open_database(path, options(mode)).unwrap();
    let root = db.root();
    let kept = (0..DOCS).filter(|i| i % 3 != 0).count() as u64;
    assert_eq!(root.snapshot().unwrap().len(), kept);
    db.blocking_define_index(by_color()).unwrap();
    for i in (0..DOCS).step_by(3) {
        root.blocking_put(format!("doc{i:05}"), doc(i)).unwrap();
    }
    db.blocking_wait_for_indexes().unwrap();
    assert_eq!(root.blocking_get("doc00000").unwrap(), Some(doc(0)));
    wait_flushed(&db, "");
    assert_eq!(
        db.storages(),
        vec!["by_color".to_string(), "notes".to_string()]
    );
}

#[test]
fn no_executor_blocks_on_the_disk() {
    let dir = tempfile::tempdir().unwrap();
    // A violation usually fails the workload too (a poisoned storage): report the violation
    // first, then the workload's failure.
    let workload = std::panic::catch_unwind(|| {
        for (name, mode) in [
            ("shared", JournalMode::Shared),
            ("separate", JournalMode::Separate),
        ] {
            let path = dir.path().join(name);
            let e = engine();
            first_run(&e, &path, mode);
            e.shutdown().unwrap();
            let e = engine();
            second_run(&e, &path, mode);
            e.shutdown().unwrap();
        }
    });
    assert_eq!(
        blocking_calls_on_executors(),
        0,
        "an executor blocked on the disk; the first time: {}",
        first_blocking_call_on_executor().unwrap_or_default()
    );
    if let Err(p) = workload {
        std::panic::resume_unwind(p);
    }
}
