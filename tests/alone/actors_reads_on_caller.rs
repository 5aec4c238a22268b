//! Point reads through the actors' handles run on the caller's thread.
//!
//! The story: every `StorageHandle::get` used to go to the reader pool, one shared mailbox
//! message and a one-shot reply channel per request, two cross-thread wake-ups: about 12 µs a
//! get against 0.28 µs for a get on a snapshot taken on the caller's thread. With
//! `ReadPath::Caller` (the default) a handle's `get` and `multi_get` load the storage's last
//! published state and read it right there. What this checks is deterministic, never timed:
//! the futures are ready at their first poll (nothing is awaited), a get allocates only the
//! copy of its value on the caller's thread (the pool path allocates a reply channel and the
//! request on top), a write acknowledged to one caller is seen at once by a get of any other,
//! a get after shutdown is `Error::Closed`, and loops of such ready gets still give the
//! caller's runtime (tokio or glommio) back, so that its other tasks and timers run.

use futures_lite::future::{block_on, poll_once};
use omnibus::actors::{Engine, EngineOptions, ReadPath, WriteBatch};
use omnibus::{Error, Options};

fn key(i: u32) -> String {
    format!("key-{i:05}")
}

#[test]
fn point_reads_run_on_the_callers_thread() {
    let _alone = crate::common::alone();
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::start(EngineOptions {
        executors: Some(1),
        ..EngineOptions::default()
    })
    .unwrap();
    assert_eq!(EngineOptions::default().reads, ReadPath::Caller);
    let db = engine
        .blocking_open_database(dir.path().join("db"), Options::default())
        .unwrap();
    let root = db.root();
    let mut b = WriteBatch::new();
    for i in 0..200 {
        b.put(key(i), format!("value-{i}"));
    }
    root.blocking_write(b).unwrap();
    // Warm up (the thread-local parker of block_on, first-use statics).
    assert_eq!(
        root.blocking_get(key(0)).unwrap(),
        Some(b"value-0".to_vec())
    );

    // Ready at the first poll: no message sent, nothing awaited (after a pause: a new burst
    // of the cooperative budget, as below).
    std::thread::sleep(std::time::Duration::from_millis(2));
    let first = block_on(async { poll_once(root.get(key(7))).await });
    assert_eq!(
        first.expect("ready at first poll").unwrap(),
        Some(b"value-7".to_vec())
    );
    let keys = [key(3), "absent".to_string(), key(3), key(199)];
    // Warmed once more (a background flush since the writes moves their pages into the map,
    // whose residency is unknown until read: such a read goes to the pool, as it should), then
    // a pause, so the read below starts a new burst of the cooperative budget: ready calls
    // within 10 µs of the last one share a burst that yields once it has run 10 µs, and on a
    // loaded machine the get above alone could spend it, so the multi-get was not ready at its
    // first poll.
    root.blocking_multi_get(&keys).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2));
    let first = block_on(async { poll_once(root.multi_get(&keys)).await });
    assert_eq!(
        first.expect("ready at first poll").unwrap(),
        vec![
            Some(b"value-3".to_vec()),
            None,
            Some(b"value-3".to_vec()),
            Some(b"value-199".to_vec())
        ]
    );

    // One allocation per get on this thread: the value's copy. Keys are built beforehand.
    let ks: Vec<String> = (0..200).map(key).collect();
    let before = alloc::thread_allocs();
    for k in &ks {
        assert!(root.blocking_get(k).unwrap().is_some());
    }
    let per_get = (alloc::thread_allocs() - before) as f64 / ks.len() as f64;
    assert!(
        per_get <= 1.0,
        "{per_get} allocations per get on the caller's thread (the value's copy is the only one)"
    );
    // A missing key: no allocation at all.
    let before = alloc::thread_allocs();
    assert_eq!(root.blocking_get("absent").unwrap(), None);
    assert_eq!(alloc::thread_allocs() - before, 0);

    // Read-your-writes across callers: once a put is acknowledged to one thread, a get from
    // another sees it (the storage actor publishes a commit before it answers).
    let writers: Vec<_> = (0..4u32)
        .map(|t| {
            let h = root.clone();
            std::thread::spawn(move || {
                for i in 0..50u32 {
                    let k = format!("t{t}-{i:03}");
                    h.blocking_put(k.clone(), vec![t as u8; 10]).unwrap();
                    assert_eq!(h.blocking_get(&k).unwrap(), Some(vec![t as u8; 10]), "{k}");
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    for t in 0..4u32 {
        assert_eq!(
            root.blocking_get(format!("t{t}-049")).unwrap(),
            Some(vec![t as u8; 10])
        );
    }

    drop(db);
    engine.shutdown().unwrap();
    assert!(matches!(root.blocking_get(key(1)), Err(Error::Closed)));
    assert!(matches!(
        root.blocking_multi_get(&[key(1)]),
        Err(Error::Closed)
    ));
}

#[test]
fn a_point_read_that_would_fault_goes_to_the_pool_and_a_warm_one_stays() {
    let _alone = crate::common::alone();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let start = || {
        Engine::start(EngineOptions {
            executors: Some(1),
            ..EngineOptions::default()
        })
        .unwrap()
    };
    let engine = start();
    let db = engine
        .blocking_open_database(&path, Options::default())
        .unwrap();
    let mut b = WriteBatch::new();
    for i in 0..3000 {
        b.put(key(i), vec![b'v'; 200]);
    }
    db.root().blocking_write(b).unwrap();
    // Into the data file (else the reopen replays the journal into the scratch table, which
    // is memory).
    db.blocking_flush().unwrap();
    drop(db);
    engine.shutdown().unwrap();
    // Reopened: the root's pages are in its data file only, none known to be in memory.
    let engine = start();
    let db = engine
        .blocking_open_database(&path, Options::default())
        .unwrap();
    let root = db.root();
    // Out of the page cache too (the flush left the pages there): else a residency refresh of
    // the flushers (every 50 ms) could find them resident before the get, on a slow machine.
    let f = std::fs::File::open(path.join("data.pages")).unwrap();
    // SAFETY: posix_fadvise only advises the kernel about the descriptor's pages.
    unsafe {
        libc::posix_fadvise(
            std::os::fd::AsRawFd::as_raw_fd(&f),
            0,
            0,
            libc::POSIX_FADV_DONTNEED,
        )
    };
    let before = omnibus::actors::cold_reads();
    let mut get = Box::pin(root.get(key(1234)));
    // Not answered on the caller's thread: sent to the reader pool.
    assert!(block_on(poll_once(get.as_mut())).is_none());
    assert_eq!(block_on(get).unwrap(), Some(vec![b'v'; 200]));
    assert_eq!(omnibus::actors::cold_reads(), before + 1);
    // The pool's read brought the path in: the same key now reads on the caller's thread.
    let first = block_on(async { poll_once(root.get(key(1234))).await });
    assert_eq!(
        first.expect("ready at first poll").unwrap(),
        Some(vec![b'v'; 200])
    );
    let cold = omnibus::actors::cold_reads();
    assert_eq!(cold, before + 1);
    // A multi_get with one cold key goes to the pool whole, and is right.
    let got = block_on(root.multi_get(&[key(1234), key(7)])).unwrap();
    assert_eq!(got, vec![Some(vec![b'v'; 200]), Some(vec![b'v'; 200])]);
    // Blocking reads run on the calling thread whatever the residency.
    assert_eq!(root.blocking_get(key(2999)).unwrap(), Some(vec![b'v'; 200]));
    drop((root, db));
    engine.shutdown().unwrap();
}

/// An engine with one executor and a root holding `key(0..100)`.
fn engine_with_keys(dir: &std::path::Path) -> (Engine, omnibus::actors::DatabaseHandle) {
    let engine = Engine::start(EngineOptions {
        executors: Some(1),
        ..EngineOptions::default()
    })
    .unwrap();
    let db = engine
        .blocking_open_database(dir.join("db"), Options::default())
        .unwrap();
    let mut b = WriteBatch::new();
    for i in 0..100 {
        b.put(key(i), format!("value-{i}"));
    }
    db.root().blocking_write(b).unwrap();
    (engine, db)
}

/// Waits (polling, at most `limit`) until `ticks` reaches `want`; returns what it reached.
/// A task on `rt` counting in `ticks` every 1 ms sleep it wakes from.
fn spawn_ticker(rt: &tokio::runtime::Runtime, ticks: Arc<AtomicU64>) {
    rt.spawn(async move {
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            ticks.fetch_add(1, Ordering::Release);
        }
    });
}

fn wait_for_ticks(ticks: &AtomicU64, want: u64, limit: std::time::Duration) -> u64 {
    let end = std::time::Instant::now() + limit;
    while ticks.load(Ordering::Acquire) < want && std::time::Instant::now() < end {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    ticks.load(Ordering::Acquire)
}

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::common::alloc;

// Regression: on a tokio runtime with 2 workers, 64 tasks looping over `get(..).await` kept
// both workers busy forever (the future was always ready, so it never gave the worker back)
// and a task sleeping 1 ms in a loop never ran again.
#[test]
fn a_loop_of_awaited_gets_lets_other_tokio_tasks_run() {
    let _alone = crate::common::alone();
    let dir = tempfile::tempdir().unwrap();
    let (engine, db) = engine_with_keys(dir.path());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (ticks, gets) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    for t in 0..64u32 {
        let (root, stop, gets) = (db.root(), stop.clone(), gets.clone());
        rt.spawn(async move {
            let mut i = t;
            while !stop.load(Ordering::Relaxed) {
                let v = root.get(key(i % 100)).await.unwrap();
                assert_eq!(v, Some(format!("value-{}", i % 100).into_bytes()));
                gets.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
        });
    }
    spawn_ticker(&rt, ticks.clone());
    let reached = wait_for_ticks(&ticks, 20, std::time::Duration::from_secs(60));
    stop.store(true, Ordering::Relaxed);
    rt.shutdown_timeout(std::time::Duration::from_secs(10));
    assert!(
        reached >= 20,
        "the ticker ran {reached} times beside the get loops (wanted 20)"
    );
    assert!(gets.load(Ordering::Relaxed) > 0, "the get loops ran");
    drop(db);
    engine.shutdown().unwrap();
}

// Regression: a get loop doing some work of its own between gets (20 µs here; or a large
// value's copy) made every get start a new budget, so it never yielded and a timer task on its
// thread never ran.
#[test]
fn a_get_loop_with_work_between_gets_lets_a_timer_run() {
    let _alone = crate::common::alone();
    let dir = tempfile::tempdir().unwrap();
    let (engine, db) = engine_with_keys(dir.path());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let ticks = Arc::new(AtomicU64::new(0));
    let (root, s2) = (db.root(), stop.clone());
    rt.spawn(async move {
        let mut i = 0u32;
        while !s2.load(Ordering::Relaxed) {
            assert!(root.get(key(i % 100)).await.unwrap().is_some());
            let t = std::time::Instant::now();
            while t.elapsed() < std::time::Duration::from_micros(20) {
                std::hint::spin_loop();
            }
            i += 1;
        }
    });
    spawn_ticker(&rt, ticks.clone());
    // The runtime runs on this thread only while it blocks on something: a watcher thread
    // stops the loop once the ticks arrived, or after 20 s.
    let (t3, s3) = (ticks.clone(), stop.clone());
    let watcher = std::thread::spawn(move || {
        let reached = wait_for_ticks(&t3, 20, std::time::Duration::from_secs(20));
        s3.store(true, Ordering::Relaxed);
        reached
    });
    rt.block_on(async {
        while !stop.load(Ordering::Relaxed) {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    });
    let reached = watcher.join().unwrap();
    rt.shutdown_timeout(std::time::Duration::from_secs(10));
    assert!(
        reached >= 20,
        "the ticker ran {reached} times beside the get loop (wanted 20)"
    );
    drop(db);
    engine.shutdown().unwrap();
}

// The same on glommio: get loops on one executor must let its timer task run.
#[test]
fn a_loop_of_awaited_gets_lets_other_glommio_tasks_run() {
    let _alone = crate::common::alone();
    let dir = tempfile::tempdir().unwrap();
    let (engine, db) = engine_with_keys(dir.path());
    let stop = Arc::new(AtomicBool::new(false));
    let ticks = Arc::new(AtomicU64::new(0));
    let (root, s2, t2) = (db.root(), stop.clone(), ticks.clone());
    let ex = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .name("get-loops")
        .spawn(move || async move {
            let mut loops = Vec::new();
            for t in 0..8u32 {
                let (root, stop) = (root.clone(), s2.clone());
                loops.push(glommio::spawn_local(async move {
                    let mut i = t;
                    while !stop.load(Ordering::Relaxed) {
                        assert!(root.get(key(i % 100)).await.unwrap().is_some());
                        i += 1;
                    }
                }));
            }
            let ticker = glommio::spawn_local(async move {
                while !s2.load(Ordering::Relaxed) {
                    glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
                    t2.fetch_add(1, Ordering::Release);
                }
            });
            for l in loops {
                l.await;
            }
            ticker.await;
        })
        .unwrap();
    let reached = wait_for_ticks(&ticks, 20, std::time::Duration::from_secs(60));
    stop.store(true, Ordering::Relaxed);
    ex.join().unwrap();
    assert!(
        reached >= 20,
        "the ticker ran {reached} times beside the get loops (wanted 20)"
    );
    drop(db);
    engine.shutdown().unwrap();
}

/// The nice values of this process's threads whose names start with `prefix`.
fn nice_of_threads(prefix: &str) -> Vec<i64> {
    let mut out = Vec::new();
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !comm.trim_end().starts_with(prefix) {
            continue;
        }
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap();
        // Fields after the command's closing parenthesis: state (3rd field) first, nice 19th.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        out.push(rest.split_whitespace().nth(16).unwrap().parse().unwrap());
    }
    out
}

/// The residency refresh (a `mincore` over 256 MiB of a map: milliseconds of CPU over pages the
/// process has not mapped) ran on the background I/O pool at the default CPU priority, and
/// took a CPU from the application's tokio workers for that long every flusher tick.
#[test]
fn residency_refreshes_run_on_one_thread_at_the_lowest_cpu_priority() {
    let _alone = crate::common::alone();
    let dir = tempfile::tempdir().unwrap();
    let (engine, db) = engine_with_keys(dir.path());
    assert_eq!(nice_of_threads("omnibus-residen"), vec![19]);
    // The other pools keep the process's priority.
    let flush = nice_of_threads("omnibus-flush-i");
    assert!(
        !flush.is_empty() && flush.iter().all(|n| *n == 0),
        "{flush:?}"
    );
    drop(db);
    engine.shutdown().unwrap();
    assert!(nice_of_threads("omnibus-residen").is_empty());
}
