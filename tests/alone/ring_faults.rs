//! The io_uring lanes under every fault the kernel can answer with, through a whole database:
//! three storages commit concurrently through the shared journal (so batches hold several
//! commits) on a [`UringEnv`] whose lanes inject the fault; then the database is reopened on the
//! plain `pwritev` environment and every acknowledged commit must be there with its value.
//! Journal records are checksummed, so a ring that wrote other bytes than the `pwritev` path
//! would (a lost rest of a short write, a stale sector) fails recovery or loses a commit here.
//! Each test also checks the lane's counters: the fault was hit, and handled the way the lane's
//! module docs say.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use omnibus::env::testing::{
    LaneKind, LaneStats, RingFault, RingFaultRule, RingFaults, RingOp, UringConfig,
};
use omnibus::env::{DefaultEnv, StorageEnv, UringEnv};
use omnibus::{Database, FlushMode, JournalIo, Options};

const STORAGES: [&str; 3] = ["docs", "by_name", "by_city"];
const COMMITS: usize = 40;

type Acked = BTreeMap<(usize, Vec<u8>), Vec<u8>>;

fn ring(faults: &Arc<RingFaults>) -> UringEnv {
    UringEnv::with_config(UringConfig {
        faults: Some(faults.clone()),
        ..UringConfig::default()
    })
    .expect("io_uring setup")
}

fn rule(op: RingOp, fault: RingFault, skip: u32, times: u32) -> RingFaultRule {
    RingFaultRule {
        lane: Some(LaneKind::Critical),
        op,
        fault,
        skip,
        times,
    }
}

/// The journal's batches on the ring (the path these faults hit), whatever `Auto` would pick.
fn opts(env: Arc<dyn StorageEnv>) -> Options {
    Options {
        env,
        flush_mode: FlushMode::Manual,
        journal_io: JournalIo::Ring,
        ..Options::default()
    }
}

/// Three threads, one per storage, each committing [`COMMITS`] transactions of one to three
/// puts (values up to 20 KB, so batches have many slices). Returns what was acknowledged and
/// the first commit error, if any.
fn workload(path: &std::path::Path, env: Arc<dyn StorageEnv>) -> (Acked, Option<omnibus::Error>) {
    let db = Database::open(path, opts(env)).unwrap();
    let storages: Vec<_> = STORAGES
        .iter()
        .enumerate()
        .map(|(i, n)| {
            if i == 0 {
                db.root()
            } else {
                db.create_storage(n).unwrap()
            }
        })
        .collect();
    let barrier = Arc::new(Barrier::new(STORAGES.len()));
    let results: Vec<(Acked, Option<omnibus::Error>)> = std::thread::scope(|s| {
        let hs: Vec<_> = storages
            .iter()
            .enumerate()
            .map(|(si, st)| {
                let b = barrier.clone();
                s.spawn(move || {
                    let mut acked = Acked::new();
                    b.wait();
                    for c in 0..COMMITS {
                        let mut w = st.begin_write().unwrap();
                        let mut mine = Vec::new();
                        for k in 0..(c % 3 + 1) {
                            let key = format!("{si}-{c:04}-{k}").into_bytes();
                            let val = vec![(c + k) as u8; 1 + (c * 997 + k * 131) % 20_000];
                            w.put(&key, &val).unwrap();
                            mine.push((key, val));
                        }
                        match w.commit() {
                            Ok(_) => {
                                for (k, v) in mine {
                                    acked.insert((si, k), v);
                                }
                            }
                            Err(e) => return (acked, Some(e)),
                        }
                    }
                    (acked, None)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut all = Acked::new();
    let mut err = None;
    for (a, e) in results {
        all.extend(a);
        err = err.or(e);
    }
    drop(storages);
    drop(db);
    (all, err)
}

/// Reopens on the plain pwritev environment and checks every acknowledged put.
fn assert_all_there(path: &std::path::Path, acked: &Acked) {
    let db = Database::open(path, opts(Arc::new(DefaultEnv::new()))).unwrap();
    for (i, n) in STORAGES.iter().enumerate() {
        let s = if i == 0 {
            db.root()
        } else {
            db.create_storage(n).unwrap()
        };
        let r = s.begin_read().unwrap();
        for ((si, k), v) in acked.range((i, Vec::new())..(i + 1, Vec::new())) {
            assert_eq!(*si, i);
            let got = r.get(k).unwrap();
            assert_eq!(got, Some(&v[..]), "{n}: {}", String::from_utf8_lossy(k));
        }
    }
}

fn run_clean(faults: Arc<RingFaults>) -> LaneStats {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let env = ring(&faults);
    let (acked, err) = workload(&path, Arc::new(env.clone()));
    assert!(err.is_none(), "a commit failed: {err:?}");
    let puts: usize = (0..COMMITS).map(|c| c % 3 + 1).sum();
    assert_eq!(acked.len(), STORAGES.len() * puts, "every put acknowledged");
    let stats = env.lane_stats(LaneKind::Critical);
    drop(env);
    assert_all_there(&path, &acked);
    stats
}

#[test]
fn short_writes_resubmit_the_rest_and_redo_the_sync() {
    let _alone = crate::common::alone();
    let faults = RingFaults::new();
    // Every third journal write comes back short: the rest is resubmitted, and the sync the
    // kernel cancelled behind it is redone.
    for skip in [0, 2, 5, 8, 11, 14] {
        faults.add(rule(RingOp::Write, RingFault::ShortWrite, skip, 1));
    }
    let s = run_clean(faults.clone());
    assert!(faults.injected() >= 6, "{}", faults.injected());
    assert_eq!(s.short_writes, faults.injected());
    assert_eq!(s.syncs_redone, faults.injected());
}

#[test]
fn ecanceled_write_is_redone_with_pwritev_and_synced_again() {
    let _alone = crate::common::alone();
    let faults = RingFaults::new();
    faults.add(rule(RingOp::Write, RingFault::Errno(libc::ECANCELED), 1, 3));
    let s = run_clean(faults.clone());
    assert_eq!(faults.injected(), 3);
    assert_eq!(s.plain_redos, 3);
}

#[test]
fn ecanceled_linked_sync_is_redone() {
    let _alone = crate::common::alone();
    let faults = RingFaults::new();
    faults.add(rule(RingOp::Sync, RingFault::Errno(libc::ECANCELED), 1, 4));
    let s = run_clean(faults.clone());
    assert_eq!(faults.injected(), 4);
    assert_eq!(s.syncs_redone, 4);
}

#[test]
fn eagain_once_is_retried() {
    let _alone = crate::common::alone();
    let faults = RingFaults::new();
    faults.add(rule(RingOp::Write, RingFault::Errno(libc::EAGAIN), 2, 1));
    faults.add(rule(RingOp::Sync, RingFault::Errno(libc::EAGAIN), 4, 1));
    let s = run_clean(faults.clone());
    assert_eq!(faults.injected(), 2);
    assert_eq!(s.retries, 2);
}

#[test]
fn eagain_always_fails_the_commit_clearly_and_poisons() {
    let _alone = crate::common::alone();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let faults = RingFaults::new();
    // The first batches (creating the storages) go through; then EAGAIN forever.
    let env = ring(&faults);
    let db = Database::open(&path, opts(Arc::new(env.clone()))).unwrap();
    let s = db.root();
    let mut w = s.begin_write().unwrap();
    w.put(b"before", b"1").unwrap();
    w.commit().unwrap();
    faults.add(rule(
        RingOp::Write,
        RingFault::Errno(libc::EAGAIN),
        0,
        u32::MAX,
    ));
    let mut w = s.begin_write().unwrap();
    w.put(b"after", b"2").unwrap();
    let e = w.commit().unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("resubmissions"), "a clear error: {msg}");
    assert_poisoned(&s);
    drop(s);
    drop(db);
    drop(env);
    let db = Database::open(&path, opts(Arc::new(DefaultEnv::new()))).unwrap();
    let r = db.root().begin_read().unwrap();
    assert_eq!(r.get(b"before").unwrap(), Some(&b"1"[..]));
}

#[test]
fn failed_sync_poisons_and_is_never_retried() {
    let _alone = crate::common::alone();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let faults = RingFaults::new();
    let env = ring(&faults);
    let db = Database::open(&path, opts(Arc::new(env.clone()))).unwrap();
    let s = db.root();
    let mut w = s.begin_write().unwrap();
    w.put(b"a", b"1").unwrap();
    w.commit().unwrap();
    faults.add(rule(RingOp::Sync, RingFault::Errno(libc::EIO), 0, 1));
    let before = env.lane_stats(LaneKind::Critical);
    let mut w = s.begin_write().unwrap();
    w.put(b"b", b"2").unwrap();
    let e = w.commit().unwrap_err();
    assert!(e.to_string().contains("fsync"), "{e}");
    let after = env.lane_stats(LaneKind::Critical);
    assert_eq!(
        after.retries, before.retries,
        "a failed sync is not retried"
    );
    assert_poisoned(&s);
}

/// Fail-stop: the storage refuses the next write (at begin or at commit) although the ring
/// would now succeed.
fn assert_poisoned(s: &omnibus::Storage) {
    let refused = match s.begin_write() {
        Err(e) => matches!(e, omnibus::Error::Poisoned { .. }),
        Ok(mut w) => {
            w.put(b"later", b"3").unwrap();
            w.commit().is_err()
        }
    };
    assert!(refused, "poisoned after a failed batch");
}

/// Every thread of this process but `except` (from `/proc/self/task`).
fn threads_except(except: i32) -> Vec<i32> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
        .filter(|tid| *tid != except)
        .collect()
}

/// A thread sends SIGPROF 1,000 times a second to every other thread of the process (`tgkill`)
/// while three storages commit: the committing threads drive their journal batches through
/// their own rings and the lane threads wait in `io_uring_enter`; interrupted calls (EINTR)
/// are retried and no commit fails.
#[test]
fn signal_storm_never_fails_a_commit() {
    let _alone = crate::common::alone();
    extern "C" fn on_signal(_: libc::c_int) {}
    // SAFETY: installs a handler that does nothing (async-signal-safe), without SA_RESTART so
    // blocking calls really return EINTR.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        sa.sa_flags = 0;
        assert_eq!(libc::sigaction(libc::SIGPROF, &sa, std::ptr::null_mut()), 0);
    }
    let dir = tempfile::tempdir().unwrap();
    let env = ring(&RingFaults::new());
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let storm = std::thread::spawn(move || {
        let mut sent = 0u64;
        // SAFETY: getpid and gettid have no preconditions.
        let (pid, me) = unsafe { (libc::getpid(), libc::gettid()) };
        while !st.load(Ordering::Relaxed) {
            for tid in threads_except(me) {
                // SAFETY: tgkill(2) to a thread of our own process, with a handled signal.
                unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, libc::SIGPROF) };
                sent += 1;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        sent
    });
    let mut acked = Acked::new();
    for round in 0..3 {
        let (a, err) = workload(&dir.path().join(round.to_string()), Arc::new(env.clone()));
        assert!(
            err.is_none(),
            "a commit failed under the signal storm: {err:?}"
        );
        acked.extend(a.into_iter().map(|((si, k), v)| ((si + 10 * round, k), v)));
    }
    stop.store(true, Ordering::Relaxed);
    let sent = storm.join().unwrap();
    assert!(sent > 10, "the storm ran ({sent} signals)");
    let s = env.lane_stats(LaneKind::Critical);
    let b = env.lane_stats(LaneKind::Background);
    assert!(
        s.enter_interrupted + b.enter_interrupted > 0,
        "io_uring_enter was interrupted ({sent} signals sent)"
    );
    drop(env);
    for round in 0..3 {
        let mine: Acked = acked
            .iter()
            .filter(|((si, _), _)| si / 10 == round)
            .map(|((si, k), v)| ((si % 10, k.clone()), v.clone()))
            .collect();
        assert_all_there(&dir.path().join(round.to_string()), &mine);
    }
}

#[test]
fn a_dying_ring_thread_fails_commits_and_never_hangs() {
    let _alone = crate::common::alone();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let faults = RingFaults::new();
    faults.add(rule(RingOp::Write, RingFault::Panic, 30, 1));
    let (acked, err) = workload(&path, Arc::new(ring(&faults)));
    assert!(err.is_some(), "the commits after the ring died fail");
    assert!(acked.len() < STORAGES.len() * COMMITS * 2);
    assert_all_there(&path, &acked);
}
