//! `WriteBatch::set_durability(Durability::Eventual)` through the actors: the write is answered
//! once its record is queued in the shared journal (nothing written or synced for it yet) and is
//! visible at once; an immediate write of another storage writes it in the same batch, before
//! its own record; and with no later write the journal's sync thread writes it within
//! `eventual_sync_ms` (waited for up to a generous deadline, no timing asserted).

use std::time::{Duration, Instant};

use omnibus::actors::{Engine, EngineOptions, WriteBatch};
use omnibus::{Durability, Options};

#[test]
fn eventual_write_batches_are_answered_when_queued() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::start(EngineOptions {
        executors: Some(1),
        ..EngineOptions::default()
    })
    .unwrap();
    let db = engine
        .blocking_open_database(
            dir.path().join("db"),
            Options {
                eventual_sync_ms: 60_000,
                // No age-driven flush (it would write the queue) while the test looks.
                flush_max_age: Duration::from_secs(3600),
                ..Options::default()
            },
        )
        .unwrap();
    let (root, a) = (db.root(), db.blocking_create_storage("a").unwrap());
    root.blocking_put("r0", "immediate").unwrap();
    let journal = || root.stats().journal;
    let before = journal();

    let mut b = WriteBatch::new();
    b.put("a1", "eventual").set_durability(Durability::Eventual);
    a.blocking_write(b).unwrap();
    assert_eq!(
        a.snapshot().unwrap().get("a1").unwrap(),
        Some(&b"eventual"[..]),
        "visible once answered"
    );
    let queued = journal();
    assert_eq!(queued.eventual_commits, before.eventual_commits + 1);
    assert_eq!(
        (queued.batches, queued.commits),
        (before.batches, before.commits),
        "answered before anything was written for it"
    );

    // The next immediate write (another storage, same journal) takes it along, in one batch.
    root.blocking_put("r1", "immediate").unwrap();
    let after = journal();
    assert_eq!(after.batches, before.batches + 1);
    assert_eq!(after.commits, before.commits + 2);
    drop((root, a, db));
    engine.shutdown().unwrap();

    // With no later write, the sync thread writes it (a short interval this time).
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::start(EngineOptions {
        executors: Some(1),
        ..EngineOptions::default()
    })
    .unwrap();
    let db = engine
        .blocking_open_database(
            dir.path().join("db"),
            Options {
                eventual_sync_ms: 20,
                ..Options::default()
            },
        )
        .unwrap();
    let root = db.root();
    let before = root.stats().journal;
    let mut b = WriteBatch::new();
    b.put("k", "v").set_durability(Durability::Eventual);
    root.blocking_write(b).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while root.stats().journal.commits == before.commits {
        assert!(
            Instant::now() < deadline,
            "the eventual write was never written"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(root.stats().journal.batches, before.batches + 1);
    drop((root, db));
    engine.shutdown().unwrap();
}
