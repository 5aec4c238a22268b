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
