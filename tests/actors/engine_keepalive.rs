//! The keepalive thread wakes every executor from outside every 100 ms, so that a wake-up
//! glommio 0.9 loses costs at most that long.
//!
//! The story: `bench shop` in separate mode stalled three times on the 2-core VM (12 minutes,
//! then 167 s), every thread asleep, both executors in
//! `io_uring_enter` with their flushers' tick timers pending, until a debugger's attach woke
//! them. The lost wake-up is inside glommio (see `KEEPALIVE` in `actors/engine.rs`); what this
//! asserts: an idle executor keeps being woken from outside (about 10 times a second), and
//! the pokes stop at shutdown.

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
