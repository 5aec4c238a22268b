//! A snapshot built on one state machine installs on another by replacing its storage
//! generation; a damaged snapshot (a flipped byte, a cut-short file) is refused with an error
//! and leaves the receiver exactly as it was: same generation, same applied state, no
//! half-built generation storage left behind.

use std::collections::BTreeSet;

use omnibus::actors::{DatabaseHandle, Engine, EngineOptions};
use omnibus_raft::{LogStore, Request, StateMachine, TypeConfig};
use openraft::storage::RaftStateMachine;
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, Membership, RaftSnapshotBuilder};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const KEYS: u64 = 3000;

async fn open(engine: &Engine, dir: &std::path::Path) -> (DatabaseHandle, StateMachine) {
    std::fs::create_dir_all(dir).expect("dir");
    let db = engine
        .open_database(dir.join("db"), omnibus::Options::default())
        .await
        .expect("database");
    let log = LogStore::new(db.create_storage("raft-log-0").await.expect("log"));
    let sm = StateMachine::open(db.clone(), 0, log, &dir.join("snapshots"))
        .await
        .expect("state machine");
    (db, sm)
}

fn id(index: u64) -> LogId<u64> {
    LogId::new(CommittedLeaderId::new(1, 1), index)
}

async fn file_with(bytes: &[u8], path: &std::path::Path) -> Box<tokio::fs::File> {
    let mut f = tokio::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .await
        .expect("file");
    f.write_all(bytes).await.expect("write");
    Box::new(f)
}

pub fn install_replaces_the_generation_and_refuses_damage() {
    let engine = Engine::start(EngineOptions {
        executors: Some(1),
        ..Default::default()
    })
    .expect("engine");
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let (_da, mut a) = open(&engine, &dir.path().join("a")).await;
        let (db_b, mut b) = open(&engine, &dir.path().join("b")).await;

        let mut entries: Vec<Entry<TypeConfig>> = vec![Entry {
            log_id: id(1),
            payload: EntryPayload::Membership(Membership::new(vec![BTreeSet::from([1])], None)),
        }];
        for i in 0..KEYS {
            entries.push(Entry {
                log_id: id(i + 2),
                payload: EntryPayload::Normal(Request::Set {
                    key: format!("key-{i}"),
                    value: format!("value-{i}"),
                }),
            });
        }
        a.apply(entries).await.expect("apply");
        let snap = a
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .expect("build");
        assert_eq!(snap.meta.last_log_id, Some(id(KEYS + 1)));
        let mut good = Vec::new();
        let mut f = *snap.snapshot;
        f.read_to_end(&mut good).await.expect("read snapshot");

        let before = b.applied_state().await.expect("applied");
        let storages_before = db_b.storages();
        // A flipped byte in a value, then a file cut short: both refused, nothing changed.
        let mut flipped = good.clone();
        let mid = flipped.len() / 2;
        flipped[mid] ^= 0x20;
        let cut = good[..good.len() - 7].to_vec();
        for (what, bytes) in [("flipped byte", flipped), ("cut short", cut)] {
            let f = file_with(&bytes, &dir.path().join("bad.snap")).await;
            let r = b.install_snapshot(&snap.meta, f).await;
            assert!(r.is_err(), "{what}: installed");
            assert_eq!(b.generation(), 0, "{what}");
            assert_eq!(b.applied_state().await.expect("applied"), before, "{what}");
            assert_eq!(db_b.storages(), storages_before, "{what}");
            assert!(
                b.get_current_snapshot().await.expect("current").is_none(),
                "{what}"
            );
        }

        // The good file installs: a new generation with every key, the old one dropped.
        let f = file_with(&good, &dir.path().join("good.snap")).await;
        b.install_snapshot(&snap.meta, f).await.expect("install");
        assert_eq!(b.generation(), 1);
        assert_eq!(
            b.applied_state().await.expect("applied"),
            (snap.meta.last_log_id, snap.meta.last_membership.clone())
        );
        let names = db_b.storages();
        assert!(names.contains(&"raft-sm-0-1".to_string()), "{names:?}");
        assert!(!names.contains(&"raft-sm-0-0".to_string()), "{names:?}");
        let kv = b.reader();
        assert_eq!(kv.len().expect("len"), KEYS);
        for i in (0..KEYS).step_by(97) {
            assert_eq!(
                kv.get(&format!("key-{i}")).expect("get"),
                Some(format!("value-{i}"))
            );
        }
        let cur = b
            .get_current_snapshot()
            .await
            .expect("current")
            .expect("some");
        assert_eq!(cur.meta, snap.meta);
    });
    engine.shutdown().expect("engine shutdown");
}
