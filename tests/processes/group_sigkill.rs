//! Real crashes of group transactions (docs/design.md 4.3, invariant I14): a child process (this
//! test binary re-executed to run `child_entry` only) commits groups over a root and 20 branches
//! from 3 threads, each group putting one random key into every storage of a member set the key
//! itself determines (every storage for some keys), and prints the key only after `commit()`
//! returned; background flushes run with small thresholds. The parent kills it with SIGKILL at
//! random moments (10 rounds on one directory); after each kill it reopens the database and
//! checks that every printed key is in every member storage, and that every key found in any
//! storage is in all of its members with its value (no partial group), and `check()` on every
//! storage. The directory is on tmpfs where there is one (`/dev/shm`): a SIGKILL is a process
//! crash, which needs no real sync to lose nothing.

use std::collections::BTreeSet;
use std::time::Duration;

use omnibus::{Database, FlushMode, Options, Prezero, Storage};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::common;
use crate::common::children;

const CHILD_DIR: &str = "OMNIBUS_GROUP_SIGKILL_DIR";
const BRANCHES: usize = 20;
const ROUNDS: u64 = 10;

fn hash(key: &str, salt: usize) -> u64 {
    key.bytes()
        .chain(salt.to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        })
}

/// The storages of the group of `key`: 0 is the root, `1..=20` the branches.
fn members(key: &str) -> Vec<usize> {
    if hash(key, 99).is_multiple_of(4) {
        return (0..=BRANCHES).collect();
    }
    let mut m: Vec<usize> = (0..=BRANCHES)
        .filter(|&i| hash(key, i).is_multiple_of(3))
        .collect();
    if m.len() < 2 {
        m = vec![0, 1 + (hash(key, 98) % BRANCHES as u64) as usize];
    }
    m
}

fn value_for(key: &str, m: usize) -> Vec<u8> {
    let mut v = format!("{key}/{m}/").into_bytes();
    v.resize(20 + (hash(key, m) % 600) as usize, b'v');
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

fn name(i: usize) -> String {
    format!("b{i:02}")
}

fn open_all(db: &Database) -> Vec<Storage> {
    let mut v = vec![db.root()];
    for i in 1..=BRANCHES {
        v.push(db.create_storage(&name(i)).expect("storage"));
    }
    v
}

#[test]
fn child_entry() {
    let Ok(dir) = std::env::var(CHILD_DIR) else {
        return;
    };
    let db = Database::open(&dir, opts()).expect("child: open");
    let ss = open_all(&db);
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    for t in 0..3u64 {
        let (db, ss, tx) = (db.clone(), ss.clone(), tx.clone());
        std::thread::spawn(move || {
            let mut rng = SmallRng::seed_from_u64(t ^ ((std::process::id() as u64) << 8));
            loop {
                let key = format!("{:016x}", rng.random::<u64>());
                let m = members(&key);
                let refs: Vec<&Storage> = m.iter().map(|&i| &ss[i]).collect();
                // Waits for busy storages, in lock order.
                let mut g = db.begin_group(&refs).expect("child: begin_group");
                for &i in &m {
                    g.put(&ss[i], &key, value_for(&key, i)).expect("child: put");
                }
                g.commit().expect("child: commit");
                if tx.send(format!("0 {key}")).is_err() {
                    return;
                }
            }
        });
    }
    drop(tx);
    children::print_acks(rx);
}

#[test]
fn sigkill_rounds_never_show_part_of_a_group() {
    if std::env::var(CHILD_DIR).is_ok() {
        return;
    }
    // On tmpfs where there is one: a process crash needs no real sync, and the 21 storages'
    // opens and flushes then cost each round little of its time.
    let dir = crate::common::points::scratch_base("omnibus-groupkill");
    let path = dir.path().join("db");
    let mut rng = SmallRng::seed_from_u64(11);
    let mut acked: Vec<String> = Vec::new();
    {
        // The storages are made here first (21 creations take a while): each round's child
        // spends its time on groups.
        let _no_children = children::no_children_meanwhile();
        let db = Database::open(&path, opts()).unwrap();
        drop(open_all(&db));
        db.close().unwrap();
    }
    for round in 0..ROUNDS {
        let got = common::run_and_kill(
            &common::test_name(module_path!(), "child_entry"),
            CHILD_DIR,
            &path,
            Duration::from_millis(rng.random_range(300..900)),
        );
        acked.extend(got.into_iter().map(|(_, k)| k));
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
        let ss = open_all(&db);
        let mut found: BTreeSet<String> = BTreeSet::new();
        for (i, s) in ss.iter().enumerate() {
            let r = s.begin_read().unwrap();
            for kv in r.iter().unwrap() {
                let (k, v) = kv.unwrap();
                let k = String::from_utf8(k.to_vec()).unwrap();
                assert_eq!(
                    v,
                    &value_for(&k, i)[..],
                    "round {round}: storage {i} key {k}"
                );
                found.insert(k);
            }
        }
        for k in &found {
            let with: Vec<usize> = members(k)
                .into_iter()
                .filter(|&i| ss[i].begin_read().unwrap().get(k).unwrap().is_some())
                .collect();
            assert_eq!(
                with,
                members(k),
                "round {round}: group {k} is partial: in {with:?} of {:?}",
                members(k)
            );
        }
        for k in &acked {
            assert!(
                found.contains(k),
                "round {round}: acknowledged group {k} lost"
            );
        }
        for s in &ss {
            let rep = s.check().unwrap();
            assert!(
                rep.is_ok(),
                "round {round}: {}: {:?}",
                s.path().display(),
                rep.problems
            );
        }
        drop(ss);
        db.close().unwrap();
    }
    println!("{} groups acknowledged over {ROUNDS} rounds", acked.len());
    assert!(
        acked.len() > 200,
        "only {} groups acknowledged over {ROUNDS} rounds",
        acked.len()
    );
}
