//! Real crashes under the actor runtime: a child process (this test binary re-executed) runs an
//! engine with 2 executors and 16 tokio tasks putting into 1 root + 8 branch storages, printing
//! `storage key` once each put is acknowledged. The parent kills it with SIGKILL at random
//! moments, 12 times, and after each kill reopens the database and checks every printed key.

use std::time::Duration;

use omnibus::actors::{Engine, EngineOptions};
use omnibus::{Database, FlushMode, Options};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::common;
use crate::common::children;

const CHILD_DIR: &str = "OMNIBUS_ACTORS_SIGKILL_DIR";
const ROUNDS: u64 = 12;

fn value_for(key: &str) -> Vec<u8> {
    format!("value-of-{key}").into_bytes()
}

#[test]
fn child_entry() {
    let Ok(dir) = std::env::var(CHILD_DIR) else {
        return;
    };
    let engine = Engine::start(EngineOptions {
        executors: Some(2),
        ..EngineOptions::default()
    })
    .expect("engine");
    let o = Options {
        flush_scratch_bytes: 256 << 10,
        flush_max_age: Duration::from_millis(50),
        journal_file_size: 1 << 20,
        ..Options::default()
    };
    let db = engine.blocking_open_database(&dir, o).expect("open");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    rt.spawn(async move {
        let mut handles = vec![db.root()];
        for i in 1..=8 {
            handles.push(db.create_storage(&format!("b{i}")).await.expect("storage"));
        }
        for t in 0..16u64 {
            let hs = handles.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut rng = SmallRng::seed_from_u64(t ^ std::process::id() as u64);
                loop {
                    let i = rng.random_range(0..hs.len());
                    let key = format!("{:016x}", rng.random::<u64>());
                    hs[i].put(key.clone(), value_for(&key)).await.expect("put");
                    if tx.send(format!("{i} {key}")).is_err() {
                        return;
                    }
                }
            });
        }
    });
    children::print_acks(rx);
}

#[test]
fn sigkill_under_load_keeps_every_acknowledged_put() {
    if std::env::var(CHILD_DIR).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut rng = SmallRng::seed_from_u64(11);
    let mut acked: Vec<(usize, String)> = Vec::new();
    for round in 0..ROUNDS {
        acked.extend(common::run_and_kill(
            &common::test_name(module_path!(), "child_entry"),
            CHILD_DIR,
            &path,
            Duration::from_millis(rng.random_range(300..900)),
        ));
        // This round's checks open the database here: no other test starts a child meanwhile.
        let _no_children = children::no_children_meanwhile();
        let db = Database::open(
            &path,
            Options {
                flush_mode: FlushMode::Manual,
                ..Options::default()
            },
        )
        .unwrap();
        for (i, k) in &acked {
            let s = if *i == 0 {
                db.root()
            } else {
                db.create_storage(&format!("b{i}")).unwrap()
            };
            assert_eq!(
                s.begin_read().unwrap().get(k).unwrap(),
                Some(&value_for(k)[..]),
                "round {round}: storage {i} key {k}"
            );
        }
        for n in db.storages() {
            assert!(
                db.create_storage(&n).unwrap().check().unwrap().is_ok(),
                "round {round}: {n}"
            );
        }
        db.close().unwrap();
    }
    assert!(acked.len() > 100, "only {} puts acknowledged", acked.len());
}
