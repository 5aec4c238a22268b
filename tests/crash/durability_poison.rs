//! A failed journal sync after eventual commits were acknowledged: the sync thread's batch gets
//! `EIO` from `fdatasync`. The storage is poisoned (fail-stop, never retried), the poisoning
//! cause names the acknowledged eventual commits that are lost, the journal counts them, and a
//! reopen finds a prefix of the commit order with every immediate commit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use omnibus::env::testing::{Fault, HookedEnv, OpKind};
use omnibus::env::{DefaultEnv, StorageEnv};
use omnibus::{Durability, Error, FlushMode, Options, Storage};

fn opts(env: Arc<dyn StorageEnv>) -> Options {
    Options {
        env,
        flush_mode: FlushMode::Manual,
        eventual_sync_ms: 500,
        ..Options::default()
    }
}

#[test]
fn a_failed_sync_after_eventual_acks_poisons_and_names_the_lost_commits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let env = Arc::new(HookedEnv::new(Arc::new(DefaultEnv::new())));
    let s = Storage::open(&path, opts(env.clone())).unwrap();
    let mut w = s.begin_write().unwrap();
    w.put(b"k0", b"immediate").unwrap();
    w.commit().unwrap();
    // The next journal sync fails: the sync thread's batch of the three eventual commits.
    env.fail_matching(OpKind::SyncData, ".journal", 1, Fault::Eio);
    // Three eventual commits (on a stalled machine the sync thread may fail after the first:
    // later ones are then refused, which is fine).
    let mut acked = 0;
    for i in 1..=3 {
        let mut w = match s.begin_write() {
            Ok(w) => w,
            Err(Error::Poisoned { .. }) => break,
            Err(e) => panic!("{e}"),
        };
        w.set_durability(Durability::Eventual);
        w.put(format!("k{i}"), b"eventual").unwrap();
        w.commit().unwrap();
        acked += 1;
        // Acknowledged and visible.
        assert_eq!(s.begin_read().unwrap().len(), 1 + acked);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while s.stats().journal.eventual_lost < acked {
        assert!(
            Instant::now() < deadline,
            "the sync thread never wrote the batch"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(s.is_poisoned());
    let stats = s.stats().journal;
    assert_eq!(stats.eventual_commits, acked);
    assert_eq!(stats.eventual_lost, acked);
    let cause = match s.begin_write() {
        Err(Error::Poisoned { cause }) => cause,
        other => panic!("expected Poisoned, got {other:?}"),
    };
    assert!(cause.contains("fdatasync"), "{cause}");
    assert!(
        cause.contains("eventual commits acknowledged before the failure are lost")
            && cause.contains("txn 2..="),
        "{cause}"
    );
    assert!(matches!(s.flush(), Err(Error::Poisoned { .. })));
    drop(s);
    // The failed sync is never retried into success; what reached the disk anyway is a prefix.
    let s = Storage::open(&path, opts(Arc::new(DefaultEnv::new()))).unwrap();
    let r = s.begin_read().unwrap();
    let n = r.len();
    assert!((1..=4).contains(&n), "{n} keys");
    for i in 0..n {
        assert!(
            r.get(format!("k{i}")).unwrap().is_some(),
            "k{i} of a prefix of {n}"
        );
    }
    assert!(s.check().unwrap().is_ok());
}
