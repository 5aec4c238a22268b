//! Real crashes of a database: a child process (this test binary re-executed to run
//! `child_entry` only) writes to 1 root + 20 branch storages from 6 threads through the shared
//! journal, printing `storage key` for each commit only after `commit()` returned. The parent
//! kills it with SIGKILL at random moments (24 times); after each kill it reopens the database
//! and checks every printed key in its storage, and `check()` on every storage. The rounds
//! rotate the child's flush write mode (`OMNIBUS_WRITE_MODE`: mmap, file_io, vectored_file_io,
//! io_ring), so every mode is killed mid-flush in CI (the crash suites run with each
//! write mode; the journal goes through the io_uring lane, the default path, in every round).

use std::time::Duration;

use omnibus::{Database, FlushMode, Options, Prezero};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::common;
use crate::common::children;

const CHILD_DIR: &str = "OMNIBUS_DB_SIGKILL_DIR";
const BRANCHES: usize = 20;
const ROUNDS: u64 = 24;

fn value_for(key: &str) -> Vec<u8> {
    let mut v = key.as_bytes().repeat(3);
    if key.ends_with('7') {
        v = v.repeat(200); // over 2 KiB: overflow pages
    }
    v
}

fn opts() -> Options {
    Options {
        flush_mode: FlushMode::Background,
        flush_scratch_bytes: 256 << 10,
        flush_max_age: Duration::from_millis(50),
        journal_file_size: 1 << 20,
        journal_prezero: Prezero::Ahead(256 << 10),
        ..Options::default()
    }
}

fn storage_name(i: usize) -> String {
    if i == 0 {
        String::new()
    } else {
        format!("b{i:02}")
    }
}

#[test]
fn child_entry() {
    let Ok(dir) = std::env::var(CHILD_DIR) else {
        return;
    };
    let db = Database::open(&dir, opts()).expect("child: open");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    for t in 0..6u64 {
        let db = db.clone();
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut rng = SmallRng::seed_from_u64(t ^ std::process::id() as u64);
            loop {
                let i = rng.random_range(0..=BRANCHES);
                let s = if i == 0 {
                    db.root()
                } else {
                    db.create_storage(&storage_name(i)).expect("child: storage")
                };
                let key = format!("{:016x}", rng.random::<u64>());
                let mut w = s.begin_write().expect("child: begin");
                w.put(&key, value_for(&key)).expect("child: put");
                w.commit().expect("child: commit");
                if tx.send(format!("{i} {key}")).is_err() {
                    return;
                }
            }
        });
    }
    drop(tx);
    children::print_acks(rx);
}

#[test]
fn sigkill_rounds_keep_every_acknowledged_commit() {
    if std::env::var(CHILD_DIR).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut rng = SmallRng::seed_from_u64(7);
    let mut acked: Vec<(usize, String)> = Vec::new();
    for round in 0..ROUNDS {
        let mode = omnibus::WriteMode::CONCRETE[round as usize % 4].name();
        let got = common::run_and_kill_with(
            &common::test_name(module_path!(), "child_entry"),
            CHILD_DIR,
            &path,
            Duration::from_millis(rng.random_range(150..600)),
            &[("OMNIBUS_WRITE_MODE", mode)],
        );
        acked.extend(got);
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
                db.create_storage(&storage_name(*i)).unwrap()
            };
            let r = s.begin_read().unwrap();
            assert_eq!(
                r.get(k).unwrap(),
                Some(&value_for(k)[..]),
                "round {round}: storage {i} key {k}"
            );
        }
        let mut all = vec![db.root()];
        for n in db.storages() {
            all.push(db.create_storage(&n).unwrap());
        }
        for s in all {
            let rep = s.check().unwrap();
            assert!(
                rep.is_ok(),
                "round {round}: {}: {:?}",
                s.path().display(),
                rep.problems
            );
        }
        db.close().unwrap();
    }
    assert!(
        acked.len() > 100,
        "only {} commits acknowledged over {ROUNDS} rounds",
        acked.len()
    );
}
