//! Unit tests of the lanes: linked write + sync, short writes, bounded retries, a failed sync
//! never retried, a tiny ring under concurrent callers, `fallocate`/punch/writeback, a dead
//! lane, and a setup error.

use super::*;

fn env_with(faults: Option<Arc<RingFaults>>, entries: u32) -> UringEnv {
    UringEnv::with_config(UringConfig {
        entries,
        faults,
        setup_error: None,
    })
    .expect("io_uring setup")
}

fn journal_file(env: &UringEnv, dir: &Path) -> Arc<dyn EnvFile> {
    env.open(&dir.join("1.journal"), OpenMode::Create).unwrap()
}

fn read_all(f: &dyn EnvFile) -> Vec<u8> {
    let mut buf = vec![0u8; f.len().unwrap() as usize];
    f.read_exact_at(&mut buf, 0).unwrap();
    buf
}

#[test]
fn linked_write_and_sync_writes_every_byte() {
    let dir = tempfile::tempdir().unwrap();
    let env = env_with(None, 8);
    let f = journal_file(&env, dir.path());
    let a = vec![1u8; 5000];
    let b = vec![2u8; 3000];
    f.write_vectored_and_sync(&[IoSlice::new(&a), IoSlice::new(&b)], 100, JournalIo::Ring)
        .unwrap();
    let got = read_all(&*f);
    assert_eq!(got.len(), 8100);
    assert!(got[..100].iter().all(|&x| x == 0));
    assert!(got[100..5100].iter().all(|&x| x == 1));
    assert!(got[5100..].iter().all(|&x| x == 2));
    let s = env.lane_stats(LaneKind::Critical);
    assert_eq!(s.ops, 1);
    assert_eq!(s.sqes, 2, "one linked write + sync");
}

/// Waits (at most 5 s) until the critical lane's own thread has entered its ring to sleep, so
/// that its one `io_uring_enter` is not counted in what a test measures.
fn lane_thread_asleep(env: &UringEnv) {
    let t = std::time::Instant::now();
    while env.lane_stats(LaneKind::Critical).enters == 0 {
        assert!(
            t.elapsed().as_secs() < 5,
            "the lane's thread never entered its ring"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

#[test]
fn a_linked_write_and_sync_on_the_inline_ring_is_one_system_call() {
    // Regression: the ring waited for one completion at a time, so every batch cost two
    // `io_uring_enter` calls (the write's completion, then the sync's).
    let dir = tempfile::tempdir().unwrap();
    let env = env_with(None, 8);
    let f = journal_file(&env, dir.path());
    let block = vec![7u8; 4096];
    lane_thread_asleep(&env);
    let before = env.lane_stats(LaneKind::Critical);
    for i in 0..20u64 {
        f.write_vectored_and_sync(&[IoSlice::new(&block)], i * 4096, JournalIo::Ring)
            .unwrap();
    }
    let after = env.lane_stats(LaneKind::Critical);
    assert_eq!(after.ops - before.ops, 20);
    assert_eq!(
        after.enters - before.enters,
        20,
        "one io_uring_enter per batch"
    );
}

#[test]
fn the_syscalls_path_never_touches_the_ring() {
    let dir = tempfile::tempdir().unwrap();
    let env = env_with(None, 8);
    let f = journal_file(&env, dir.path());
    let block = vec![9u8; 4096];
    lane_thread_asleep(&env);
    let before = env.lane_stats(LaneKind::Critical);
    for i in 0..10u64 {
        f.write_vectored_and_sync(&[IoSlice::new(&block)], i * 4096, JournalIo::Syscalls)
            .unwrap();
    }
    let after = env.lane_stats(LaneKind::Critical);
    assert_eq!(after.ops, before.ops);
    assert_eq!(after.enters, before.enters);
    let got = read_all(&*f);
    assert_eq!(got.len(), 10 * 4096);
    assert!(got.iter().all(|&x| x == 9));
}

#[test]
fn short_write_resubmits_the_rest_and_redoes_the_cancelled_sync() {
    let dir = tempfile::tempdir().unwrap();
    let faults = RingFaults::new();
    faults.add(RingFaultRule {
        lane: None,
        op: RingOp::Write,
        fault: RingFault::ShortWrite,
        skip: 0,
        times: 2,
    });
    let env = env_with(Some(faults.clone()), 8);
    let f = journal_file(&env, dir.path());
    let data: Vec<u8> = (0..40_000u32).map(|i| (i % 251) as u8).collect();
    f.write_vectored_and_sync(&[IoSlice::new(&data)], 0, JournalIo::Ring)
        .unwrap();
    assert_eq!(read_all(&*f), data);
    let s = env.lane_stats(LaneKind::Critical);
    assert_eq!(s.short_writes, 2);
    assert_eq!(
        s.syncs_redone, 2,
        "each linked sync behind a short write is redone"
    );
    assert_eq!(faults.injected(), 2);
}

#[test]
fn eagain_retries_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let faults = RingFaults::new();
    faults.add(RingFaultRule {
        lane: None,
        op: RingOp::Write,
        fault: RingFault::Errno(libc::EAGAIN),
        skip: 0,
        times: u32::MAX,
    });
    let env = env_with(Some(faults), 8);
    let f = env
        .open(&dir.path().join("data.pages"), OpenMode::Create)
        .unwrap();
    let page = [7u8; 4096];
    let run = [IoSlice::new(&page)];
    let e = f
        .write_runs(&[(0, &run[..])], crate::env::WriteMode::IoRing)
        .unwrap_err();
    assert_eq!(e.raw_os_error(), None, "a message-carrying error: {e}");
    assert!(e.to_string().contains("resubmissions"), "{e}");
    let s = env.lane_stats(LaneKind::Background);
    assert_eq!(s.retries, u64::from(MAX_RETRIES) + 1);
}

#[test]
fn failed_sync_is_not_retried() {
    let dir = tempfile::tempdir().unwrap();
    let faults = RingFaults::new();
    faults.add(RingFaultRule {
        lane: None,
        op: RingOp::Sync,
        fault: RingFault::Errno(libc::EIO),
        skip: 0,
        times: 1,
    });
    let env = env_with(Some(faults), 8);
    let f = journal_file(&env, dir.path());
    let e = f
        .write_vectored_and_sync(&[IoSlice::new(&[1u8; 512])], 0, JournalIo::Ring)
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO));
    assert_eq!(env.lane_stats(LaneKind::Critical).retries, 0);
}

#[test]
fn a_tiny_ring_keeps_every_request() {
    let dir = tempfile::tempdir().unwrap();
    let env = env_with(None, 2);
    let f = env
        .open(&dir.path().join("data.pages"), OpenMode::Create)
        .unwrap();
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let f = f.clone();
            s.spawn(move || {
                for i in 0..32u64 {
                    let off = (t * 32 + i) * 4096;
                    let page = [(t * 32 + i) as u8; 4096];
                    let run = [IoSlice::new(&page)];
                    f.write_runs(&[(off, &run[..])], crate::env::WriteMode::IoRing)
                        .unwrap();
                }
            });
        }
    });
    f.sync_data().unwrap();
    let got = read_all(&*f);
    for k in 0..256usize {
        assert!(got[k * 4096..(k + 1) * 4096].iter().all(|&x| x == k as u8));
    }
}

#[test]
fn allocate_and_punch_through_the_ring() {
    let dir = tempfile::tempdir().unwrap();
    let env = env_with(None, 8);
    let f = env
        .open(&dir.path().join("data.pages"), OpenMode::Create)
        .unwrap();
    f.allocate(0, 4 << 20).unwrap();
    assert_eq!(f.len().unwrap(), 4 << 20);
    assert!(f.allocated_bytes().unwrap() >= 4 << 20);
    f.punch_hole(1 << 20, 1 << 20).unwrap();
    assert!(f.allocated_bytes().unwrap() < 4 << 20);
    f.write_back(0, 4 << 20, false).unwrap();
    f.write_back(0, 4 << 20, true).unwrap();
}

#[test]
fn a_dead_lane_answers_errors_and_never_hangs() {
    let dir = tempfile::tempdir().unwrap();
    let faults = RingFaults::new();
    faults.add(RingFaultRule {
        lane: None,
        op: RingOp::Write,
        fault: RingFault::Panic,
        skip: 1,
        times: 1,
    });
    let env = env_with(Some(faults), 8);
    let f = journal_file(&env, dir.path());
    f.write_vectored_and_sync(&[IoSlice::new(&[1u8; 512])], 0, JournalIo::Ring)
        .unwrap();
    assert!(f
        .write_vectored_and_sync(&[IoSlice::new(&[2u8; 512])], 512, JournalIo::Ring)
        .is_err());
    assert!(f
        .write_vectored_and_sync(&[IoSlice::new(&[3u8; 512])], 1024, JournalIo::Ring)
        .is_err());
    assert!(f.sync_data().is_err());
}

#[test]
fn setup_error_is_reported() {
    let e = UringEnv::with_config(UringConfig {
        setup_error: Some(libc::EPERM),
        ..UringConfig::default()
    })
    .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM));
}
