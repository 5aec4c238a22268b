//! The keepalive thread wakes every executor from outside every 100 ms, so that a wake-up
//! glommio 0.9 loses costs at most that long.
//!
//! The story: `bench shop` in separate mode stalled three times on the 2-core VM (12 minutes,
//! then 167 s), every thread asleep, both executors in
//! `io_uring_enter` with their flushers' tick timers pending, until a debugger's attach woke
//! them. The lost wake-up is inside glommio (see `KEEPALIVE` in `actors/engine.rs`); what this
//! asserts: an idle executor keeps being woken from outside (about 10 times a second), and
//! the pokes go on while shutdown waits on the executors and stop once it is done.

use std::time::Duration;

use omnibus::actors::{Engine, EngineOptions};

#[test]
fn idle_executors_are_woken_from_outside_until_shutdown() {
    let engine = Engine::start(EngineOptions {
        executors: Some(1),
        ..EngineOptions::default()
    })
    .unwrap();
    // The pokes go on while the executor is idle: counted, not timed (about 10 a second, but
    // a loaded machine may delay the keepalive thread; the deadline only ends a failing run).
    let before = engine.executor_keepalive_wakes();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while engine.executor_keepalive_wakes() - before < 5 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let idle = engine.executor_keepalive_wakes() - before;
    assert!(idle >= 5, "an idle executor was woken {idle} times in 60 s");
    let probe = engine.clone();
    engine.shutdown().unwrap();
    std::thread::sleep(Duration::from_millis(150));
    let at_shutdown = probe.executor_keepalive_wakes();
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(
        probe.executor_keepalive_wakes(),
        at_shutdown,
        "pokes went on after shutdown"
    );
}

/// Shutdown waits on the executors' actors (the indexes apply what is queued); the keepalive
/// thread stopped as shutdown began, so a wake-up lost during that wait hung `bench shop`'s
/// close for minutes. The pokes must go on until the executors have stopped.
#[test]
fn executors_are_woken_from_outside_while_shutdown_waits_on_them() {
    use std::sync::{Arc, Mutex};

    use omnibus::actors::IndexDefinition;

    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::start(EngineOptions {
        executors: Some(2),
        ..EngineOptions::default()
    })
    .unwrap();
    let db = engine
        .blocking_open_database(dir.path().join("db"), omnibus::Options::default())
        .unwrap();
    // The map function holds the document `hold` until the test lets it go: the index actor
    // cannot stop before, so shutdown waits on it.
    let (entered_tx, entered_rx) = flume::bounded::<()>(1);
    let (release_tx, release_rx) = flume::bounded::<()>(1);
    let entered = Mutex::new(Some(entered_tx));
    let release = Arc::new(Mutex::new(release_rx));
    let hold = release.clone();
    db.blocking_define_index(IndexDefinition::new(
        "held",
        move |key: &[u8], _doc: &[u8]| {
            if key == b"hold" {
                if let Some(tx) = entered.lock().unwrap().take() {
                    let _ = tx.send(());
                }
                let _ = hold.lock().unwrap().recv_timeout(Duration::from_secs(120));
            }
            vec![key.to_vec()]
        },
    ))
    .unwrap();
    db.root()
        .blocking_put(b"hold".to_vec(), b"v".to_vec())
        .unwrap();
    entered_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the index applies the document");
    let probe = engine.clone();
    let closing = std::thread::spawn(move || engine.shutdown());
    // Shutdown has begun (it is waiting on the held index): the pokes go on, counted, not
    // timed (the deadline only ends a failing run).
    std::thread::sleep(Duration::from_millis(300));
    let waiting = probe.executor_keepalive_wakes();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while probe.executor_keepalive_wakes() - waiting < 3 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let during = probe.executor_keepalive_wakes() - waiting;
    release_tx.send(()).unwrap();
    closing.join().unwrap().unwrap();
    assert!(
        during >= 3,
        "the executors were woken {during} times while shutdown waited on them"
    );
}
