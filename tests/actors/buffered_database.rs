//! Write buffers and the actor engine: the engine refuses a database with
//! `Options::write_buffer_bytes`, and a database written with buffers through the library
//! opens under it with its buffers put back from the journal; the storage actors' first commits
//! apply them without a blocking call on an executor, and nothing is lost.

use omnibus::actors::{Engine, EngineOptions};
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
            write_buffer_bytes: 1 << 20,
            ..Options::default()
        },
    );
    assert!(matches!(r, Err(Error::InvalidOptions(_))), "{r:?}");
    assert!(
        std::fs::read_dir(dir.path()).unwrap().next().is_none(),
        "a refused open leaves nothing behind"
    );
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
            s.storage().stats().buffer_entries,
            300,
            "{prefix}: put back from the journal"
        );
        assert_eq!(
            s.blocking_get(format!("{prefix}-0123")).unwrap().as_deref(),
            Some(&b"value 123"[..])
        );
        s.blocking_put(format!("{prefix}-new"), "after").unwrap();
        assert_eq!(
            s.storage().stats().buffer_entries,
            0,
            "{prefix}: the actor's commit applied the buffer"
        );
        assert_eq!(s.storage().stats().entries, 301);
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
