//! Durable marks through the actors (docs/design.md 3.12): the shared journal's batches come from
//! the engine's journal writer thread, a separate journal's from its writer actor; either way
//! the journal writes one mark once it is idle after them, and damage to the last batch is then
//! `Error::Corruption` at the next open instead of a silently shorter database.

use std::time::{Duration, Instant};

use omnibus::actors::{Engine, EngineOptions};
use omnibus::{Database, Error, JournalMode, Options};

fn opts(mode: JournalMode) -> Options {
    Options {
        journal_mode: mode,
        journal_mark_ms: 20,
        flush_on_close: false,
        // No age-driven flush while the test looks.
        flush_max_age: Duration::from_secs(3600),
        ..Options::default()
    }
}

/// Waits until `done()`; panics after 20 s naming `what`.
fn wait_for(done: impl Fn() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "no mark after {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn the_journal_writers_batches_are_marked_once_idle() {
    for mode in [JournalMode::Shared, JournalMode::Separate] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let engine = Engine::start(EngineOptions {
            executors: Some(1),
            ..EngineOptions::default()
        })
        .unwrap();
        let db = engine.blocking_open_database(&path, opts(mode)).unwrap();
        let (root, a) = (db.root(), db.blocking_create_storage("a").unwrap());
        let marks = || root.stats().journal.durable_marks;
        // The branch's first write (and, in separate mode, the root's journal untouched), then
        // its mark (the shared journal's), so that the count below starts idle.
        a.blocking_put("a", "branch value").unwrap();
        if mode == JournalMode::Shared {
            wait_for(|| marks() > 0, "the branch's batch");
        }
        let before = root.stats().journal;
        root.blocking_put("r", "root value").unwrap();
        let end = root.stats().journal.bytes;
        wait_for(|| marks() > before.durable_marks, "the root's batch");
        std::thread::sleep(Duration::from_millis(100));
        let j = root.stats().journal;
        assert_eq!(j.durable_marks, before.durable_marks + 1, "{mode:?}: {j:?}");
        assert_eq!(
            j.bytes,
            end + 4096,
            "{mode:?}: one 4 KiB mark after the batch"
        );
        drop((root, a, db));
        engine.shutdown().unwrap();
        if mode == JournalMode::Separate {
            continue;
        }
        let journals = path.join("Journals");
        let mut files: Vec<_> = std::fs::read_dir(&journals)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "journal"))
            .collect();
        files.sort();
        let file = files.pop().unwrap();
        let mut bytes = std::fs::read(&file).unwrap();
        // The last batch is the root's put: damage it.
        let at = (before.bytes + 100) as usize;
        for b in &mut bytes[at..at + 64] {
            *b ^= 0x3c;
        }
        std::fs::write(&file, &bytes).unwrap();
        match Database::open(&path, opts(mode)) {
            Err(Error::Corruption(c)) => assert!(c.what.contains("known durable"), "{c}"),
            other => panic!("expected Corruption, got {other:?}"),
        }
    }
}
