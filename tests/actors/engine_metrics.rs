//! `Engine::metrics` reports each open database's core metrics (commits through the actors,
//! their latencies, flushes), its mailboxes' depths and the memory budget. Counts only.

use omnibus::actors::{Engine, EngineOptions};

const N: u64 = 10;

#[test]
fn engine_metrics_count_each_databases_commits_and_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::start(EngineOptions {
        executors: Some(1),
        memory_budget_bytes: 64 << 20,
        ..EngineOptions::default()
    })
    .unwrap();
    let empty = engine.metrics();
    assert!(empty.databases.is_empty());
    assert_eq!(empty.memory_budget_bytes, 64 << 20);

    let db = engine
        .blocking_open_database(dir.path().join("db"), omnibus::Options::default())
        .unwrap();
    let root = db.root();
    for i in 0..N {
        // One at a time: each put is acknowledged (durable) before the next is sent.
        root.blocking_put(format!("k{i:03}"), vec![b'v'; 100])
            .unwrap();
    }
    let m = engine.metrics();
    assert_eq!(m.databases.len(), 1);
    let d = &m.databases[0];
    assert_eq!(d.path, dir.path().join("db"));
    assert!(
        (1..=N).contains(&d.metrics.commits),
        "each acknowledged put was committed, some merged: {d:?}"
    );
    assert_eq!(
        d.metrics.commit_us.count, d.metrics.commits,
        "a latency per commit record"
    );
    assert!(d.metrics.commit_us.p50 <= d.metrics.commit_us.max);
    assert!(d.metrics.journal_batches >= 1 && d.metrics.journal_batches <= d.metrics.commits);
    assert!(d.metrics.journal_bytes >= N * 100, "{d:?}");
    assert!(d.storage_mailbox_max <= d.storage_mailbox_depth);
    assert_eq!(db.metrics().metrics.commits, d.metrics.commits);
    assert_eq!(m.memory_budget_bytes, 64 << 20);
    assert_eq!(m.memory_budget_overruns, engine.memory_budget_overruns());

    db.blocking_flush().unwrap();
    let after = db.metrics();
    assert!(after.metrics.flushed_bytes > 0, "{after:?}");
    assert!(after.metrics.flush_us.count >= 1, "{after:?}");
    engine.shutdown().unwrap();
}

/// Set by [`map_blocking`] once it has begun to block.
static MAP_BLOCKING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Cleared to let [`map_blocking`] go on.
static MAP_HELD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// An index map that holds its executor (for a minute at most) on the document `block`, and
/// gives every document the term `t`.
fn map_blocking(_key: &[u8], doc: &[u8]) -> Vec<Vec<u8>> {
    use std::sync::atomic::Ordering;
    if doc == b"block" {
        MAP_BLOCKING.store(true, Ordering::SeqCst);
        let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while MAP_HELD.load(Ordering::SeqCst) && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    vec![b"t".to_vec()]
}

/// Polls `f` every millisecond until it holds, for 30 s at most (a liveness bound).
fn eventually(what: &str, f: impl Fn() -> bool) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !f() {
        assert!(std::time::Instant::now() < until, "{what}: not within 30 s");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// The gauges of what waits: root commits queued for an index that rests between batches,
/// and point reads queued for the reader pool while the one executor that runs it is held.
#[test]
fn mailbox_gauges_count_the_commits_and_reads_that_wait() {
    use omnibus::actors::{IndexDefinition, ReadPath};
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::start(EngineOptions {
        executors: Some(1),
        reads: ReadPath::Pool,
        // Room for every commit below: a mailbox half full would cut the index's rest short.
        index_queue_capacity: 1024,
        ..EngineOptions::default()
    })
    .unwrap();
    let db = engine
        .blocking_open_database(dir.path().join("db"), omnibus::Options::default())
        .unwrap();
    db.blocking_define_index(
        IndexDefinition::new("by_t", map_blocking).min_batch_interval(Duration::from_secs(3600)),
    )
    .unwrap();
    db.blocking_wait_for_indexes().unwrap();
    let idle = engine.metrics();
    assert_eq!(idle.databases[0].index_mailbox_depth, 0, "{idle:?}");
    assert_eq!(idle.reader_mailbox_depth, 0, "{idle:?}");

    // The index rests for an hour after a batch: the acknowledged puts' commits wait in its
    // mailbox (all but those a batch took as the rest began).
    let root = db.root();
    for i in 0..N {
        root.blocking_put(format!("k{i:03}"), "doc").unwrap();
    }
    let d = db.metrics();
    assert!(
        (1..=N).contains(&d.index_mailbox_depth),
        "a queued commit per put: {d:?}"
    );
    assert_eq!(
        d.index_mailbox_max, d.index_mailbox_depth,
        "one index: {d:?}"
    );

    // A waiter cuts the rest short; the batch maps `block` and holds the only executor, so
    // the reader pool's reads wait in its mailbox.
    root.blocking_put("blocker", "block").unwrap();
    let waiter = {
        let db = db.clone();
        std::thread::spawn(move || db.blocking_wait_for_indexes())
    };
    eventually("the map blocks", || MAP_BLOCKING.load(Ordering::SeqCst));
    const READS: u64 = 3;
    let readers: Vec<_> = (0..READS)
        .map(|i| {
            let root = root.clone();
            std::thread::spawn(move || root.blocking_get(format!("k{i:03}")))
        })
        .collect();
    eventually("the reads queue", || {
        engine.metrics().reader_mailbox_depth == READS
    });
    MAP_HELD.store(false, Ordering::SeqCst);
    for r in readers {
        assert_eq!(r.join().unwrap().unwrap().as_deref(), Some(&b"doc"[..]));
    }
    waiter.join().unwrap().unwrap();
    let after = engine.metrics();
    assert_eq!(after.reader_mailbox_depth, 0, "{after:?}");
    assert_eq!(after.databases[0].index_mailbox_depth, 0, "{after:?}");
    engine.shutdown().unwrap();
}
