//! Requests in flight when the engine shuts down, or its last clone is dropped, all answer: a
//! `put` sent while the engine stopped stayed queued behind its storage actor's stop and its
//! future never resolved (nor did it fail), and the handle it held kept the database's `LOCK`,
//! so reopening the database in the same process failed with `AlreadyOpen`. Here tasks loop
//! over writes (or pool reads) while the engine goes away; every task must end within a
//! minute (a liveness bound, far above the milliseconds it takes), its last call answered with
//! `Ok` or `Error::Closed`, and the database must open again afterwards.

use std::time::Duration;

use omnibus::actors::{Engine, EngineOptions, ReadPath};
use omnibus::{Error, Options};

const TASKS: usize = 8;
const ROUNDS: usize = 6;

/// One round: `TASKS` tasks loop over `op` on the root until a call fails; the engine goes
/// away (`shutdown` or drop) while they run; each task's last error must be `Closed`.
fn round(dir: &std::path::Path, reads: ReadPath, shutdown: bool, writes: bool) {
    let path = dir.join("db");
    let engine = Engine::start(EngineOptions {
        executors: Some(2),
        reads,
        ..EngineOptions::default()
    })
    .unwrap();
    let db = engine
        .blocking_open_database(&path, Options::default())
        .unwrap();
    db.root().blocking_put("k", "v").unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let root = db.root();
            rt.spawn(async move {
                for i in 0u64.. {
                    let r = if writes {
                        root.put(format!("t{t}-{i}"), "x").await
                    } else {
                        root.get("k").await.map(|_| ())
                    };
                    if let Err(e) = r {
                        return (i, e);
                    }
                }
                unreachable!()
            })
        })
        .collect();
    drop(db);
    std::thread::sleep(Duration::from_millis(50));
    if shutdown {
        engine.shutdown().unwrap();
    } else {
        drop(engine);
    }
    rt.block_on(async {
        for t in tasks {
            let (calls, e) = tokio::time::timeout(Duration::from_secs(60), t)
                .await
                .expect("a call in flight when the engine went away never answered")
                .unwrap();
            assert!(calls > 0, "the task ran");
            assert!(matches!(e, Error::Closed), "{e:?}");
        }
    });
    drop(rt);
    // Every handle is gone: the database opens again.
    let engine = Engine::start(EngineOptions::default()).unwrap();
    let db = engine
        .blocking_open_database(&path, Options::default())
        .unwrap();
    assert_eq!(
        db.root().blocking_get("k").unwrap().as_deref(),
        Some(&b"v"[..])
    );
    engine.shutdown().unwrap();
}

#[test]
fn writes_in_flight_when_the_engine_goes_away_answer() {
    for r in 0..ROUNDS {
        let dir = tempfile::tempdir().unwrap();
        round(dir.path(), ReadPath::Caller, r % 2 == 0, true);
    }
}

#[test]
fn pool_reads_in_flight_when_the_engine_goes_away_answer() {
    for r in 0..ROUNDS {
        let dir = tempfile::tempdir().unwrap();
        round(dir.path(), ReadPath::Pool, r % 2 == 0, false);
    }
}
