//! Sixteen executors start under an 8 MiB locked-memory limit and pin little memory.
//!
//! The bug's story: `omnibus bench scale --executors 1,2,4,8,16` skipped 16 executors on this
//! machine ("glommio needs 9216 KiB of locked memory"), so the scaling benchmark could not have
//! run 16 executors on a 16-core machine with the common 8 MiB `RLIMIT_MEMLOCK` either. The
//! engine demanded 512 KiB per executor, but glommio only checks a 512 KiB minimum once, and
//! what an executor really pins is its I/O buffer registered with its three rings: glommio's
//! default 10 MiB buffer, i.e. 30 MiB pinned per executor (`VmPin`; 480 MiB for 16 as root,
//! where the limit does not apply). The engine never uses that buffer (its file I/O goes
//! through the storage environment and the I/O lanes), so it now asks glommio for the
//! minimum, 64 KiB, and only a limit under glommio's minimum is an error.

use omnibus::actors::{Engine, EngineOptions, MEMLOCK_PER_EXECUTOR};
use omnibus::Options;

/// `VmPin` of this process, bytes (0 where the kernel does not report it).
fn pinned_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmPin:"))
        .map(|v| {
            v.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .unwrap()
                << 10
        })
        .unwrap_or(0)
}

#[test]
fn sixteen_executors_start_and_pin_little() {
    let _alone = crate::common::alone();
    const EXECUTORS: usize = 16;
    let before = pinned_bytes();
    let engine = Engine::start(EngineOptions {
        executors: Some(EXECUTORS),
        ..EngineOptions::default()
    })
    .expect("16 executors start under the machine's locked-memory limit");
    let pinned = pinned_bytes().saturating_sub(before);
    // Each executor's buffer is registered with its three rings (or not at all, where the limit
    // does not cover it): at most MEMLOCK_PER_EXECUTOR each, plus a page of slack per executor.
    assert!(
        pinned <= EXECUTORS as u64 * (MEMLOCK_PER_EXECUTOR + 4096),
        "{EXECUTORS} executors pinned {} KiB ({} KiB each allowed)",
        pinned >> 10,
        MEMLOCK_PER_EXECUTOR >> 10
    );
    // The executors work: a database served by them takes a write and reads it back.
    let dir = tempfile::tempdir().unwrap();
    let db = engine
        .blocking_open_database(dir.path().join("db"), Options::default())
        .unwrap();
    db.root().blocking_put("k", "v").unwrap();
    assert_eq!(
        db.root().blocking_get("k").unwrap().as_deref(),
        Some(&b"v"[..])
    );
    drop(db);
    engine.shutdown().unwrap();
}
