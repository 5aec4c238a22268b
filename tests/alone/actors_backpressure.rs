//! Back-pressure: with every journal fdatasync delayed by 50 ms, 10,000 puts sent at once (each
//! its own task, none waiting for another) complete; the storage actor's mailbox never holds more
//! than its capacity (64: the senders wait instead of queueing without limit), and the process's
//! resident memory grows by less than 128 MiB.

use std::sync::Arc;
use std::time::Duration;

use omnibus::actors::{Engine, EngineOptions};
use omnibus::env::testing::{Fault, HookedEnv, OpKind};
use omnibus::env::DefaultEnv;
use omnibus::Options;

fn rss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = s.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[test]
fn slow_fdatasync_slows_clients_instead_of_growing_memory() {
    let _alone = crate::common::alone();
    let dir = tempfile::tempdir().unwrap();
    let env = Arc::new(HookedEnv::new(Arc::new(DefaultEnv::new())));
    let engine = Engine::start(EngineOptions {
        executors: Some(2),
        mailbox_capacity: 64,
        ..EngineOptions::default()
    })
    .unwrap();
    let db = engine
        .blocking_open_database(
            dir.path().join("db"),
            Options {
                env: env.clone(),
                ..Options::default()
            },
        )
        .unwrap();
    env.fail_always(
        OpKind::SyncData,
        ".journal",
        Fault::Delay(Duration::from_millis(50)),
    );
    let h = db.blocking_create_storage("s").unwrap();
    let before = rss_bytes();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let peak = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let depth = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (p2, d2, h2, done2) = (peak.clone(), depth.clone(), h.clone(), done.clone());
    let sampler = std::thread::spawn(move || {
        while !done2.load(std::sync::atomic::Ordering::Relaxed) {
            p2.fetch_max(rss_bytes(), std::sync::atomic::Ordering::Relaxed);
            d2.fetch_max(h2.mailbox_len(), std::sync::atomic::Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(1));
        }
    });
    rt.block_on(async {
        let mut tasks = Vec::new();
        for t in 0..500u32 {
            for i in 0..20u32 {
                let h = h.clone();
                tasks.push(tokio::spawn(async move {
                    h.put(format!("k{t:03}-{i:02}"), vec![7u8; 1024])
                        .await
                        .unwrap();
                }));
            }
        }
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(120), t)
                .await
                .expect("puts hang")
                .unwrap();
        }
    });
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    sampler.join().unwrap();
    peak.fetch_max(rss_bytes(), std::sync::atomic::Ordering::Relaxed);
    let deepest = depth.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        deepest <= 64,
        "the mailbox held {deepest} requests, over its capacity of 64"
    );
    // The senders outran the actor: the mailbox filled (so the bound, not the senders, held it).
    assert!(deepest >= 32, "the mailbox never filled: {deepest}");
    let grew = peak
        .load(std::sync::atomic::Ordering::Relaxed)
        .saturating_sub(before);
    assert!(
        grew < 128 << 20,
        "resident memory grew by {} MiB",
        grew >> 20
    );
    assert_eq!(h.snapshot().unwrap().len(), 10_000);
    let st = db.stats();
    assert!(
        st.batches < 2_000,
        "commits were not merged under a slow disk: {st:?}"
    );
    env.clear();
    drop(db);
    engine.shutdown().unwrap();
}
