//! Real crashes of group writes through the actors and of synchronous indexes: a child process
//! (this test binary re-executed to run `child_entry` only) runs an engine over a database with
//! two synchronous indexes and three plain branches; from 3 threads it writes documents through
//! the root's handle and groups through `DatabaseHandle::write` (a document in the root and a
//! value in the branches the key picks), printing each key once its write returned. The parent
//! kills it with SIGKILL at random moments (6 rounds on one directory) and opens the database
//! with the core after each: every acknowledged write is there, no group is partial, and each
//! synchronous index records the root's last txn as applied and holds exactly the entries its map
//! function gives for the documents (`check_index`): never a document without its entries.

use std::collections::BTreeSet;
use std::time::Duration;

use omnibus::actors::{check_index, Engine, EngineOptions, IndexDefinition, IndexMode, WriteBatch};
use omnibus::{Database, FlushMode, Options};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::common;
use crate::common::children;
use crate::common::index::{map_color, map_tags, random_doc};

const CHILD_DIR: &str = "OMNIBUS_ACTORS_GROUP_SIGKILL_DIR";
const ROUNDS: u64 = 6;
const BRANCHES: [&str; 3] = ["b1", "b2", "b3"];

fn definitions() -> [IndexDefinition; 2] {
    [
        IndexDefinition::new("by_color", map_color).mode(IndexMode::Synchronous),
        IndexDefinition::new("by_tag", map_tags)
            .mode(IndexMode::Synchronous)
            .write_buffer_bytes(64 << 10),
    ]
}

/// The branches of the group of `key` (at least one).
fn members(key: &str) -> Vec<usize> {
    let h = key.bytes().fold(7u64, |h, b| h.wrapping_mul(31) ^ b as u64);
    let m: Vec<usize> = (0..BRANCHES.len()).filter(|i| h >> i & 1 == 1).collect();
    if m.is_empty() {
        vec![(h % 3) as usize]
    } else {
        m
    }
}

fn branch_value(key: &str, i: usize) -> Vec<u8> {
    format!("{key}@{}", BRANCHES[i]).into_bytes()
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
    .expect("child: engine");
    let db = engine
        .blocking_open_database(
            &dir,
            Options {
                flush_scratch_bytes: 256 << 10,
                journal_file_size: 1 << 20,
                ..Options::default()
            },
        )
        .expect("child: open");
    for def in definitions() {
        db.blocking_define_index(def).expect("child: define");
    }
    let branches: Vec<_> = BRANCHES
        .iter()
        .map(|n| db.blocking_create_storage(n).expect("child: branch"))
        .collect();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    for t in 0..3u64 {
        let (db, branches, tx) = (db.clone(), branches.clone(), tx.clone());
        std::thread::spawn(move || {
            let root = db.root();
            let mut rng = SmallRng::seed_from_u64(t ^ ((std::process::id() as u64) << 8));
            loop {
                let key = format!("{:016x}", rng.random::<u64>() >> 4 << 4 | t);
                let doc = random_doc(&mut rng);
                let kind = if rng.random_bool(0.5) {
                    root.blocking_put(key.clone(), doc).expect("child: put");
                    0
                } else {
                    let mut rb = WriteBatch::new();
                    rb.put(key.clone(), doc);
                    let mut parts = vec![(&root, rb)];
                    for i in members(&key) {
                        let mut b = WriteBatch::new();
                        b.put(key.clone(), branch_value(&key, i));
                        parts.push((&branches[i], b));
                    }
                    db.blocking_write(parts).expect("child: group write");
                    1
                };
                if tx.send(format!("{kind} {key}")).is_err() {
                    return;
                }
            }
        });
    }
    drop(tx);
    children::print_acks(rx);
}

#[test]
fn sigkill_rounds_never_show_a_document_without_its_entries_or_part_of_a_group() {
    if std::env::var(CHILD_DIR).is_ok() {
        return;
    }
    let dir = crate::common::points::scratch_base("omnibus-actors-groupkill");
    let path = dir.path().join("db");
    let mut rng = SmallRng::seed_from_u64(5);
    let mut acked: Vec<(usize, String)> = Vec::new();
    for round in 0..ROUNDS {
        acked.extend(common::run_and_kill(
            &common::test_name(module_path!(), "child_entry"),
            CHILD_DIR,
            &path,
            Duration::from_millis(rng.random_range(600..1500)),
        ));
        let _no_children = children::no_children_meanwhile();
        let db = Database::open(
            &path,
            Options {
                flush_mode: FlushMode::Manual,
                ..Options::default()
            },
        )
        .unwrap();
        let docs = db.root().begin_read().unwrap();
        // The child defines its indexes and creates its branches before it writes anything:
        // a round killed before then (a loaded machine) has no documents to check.
        let names = db.storages();
        let all_there = definitions()
            .iter()
            .map(|d| d.name().to_string())
            .chain(BRANCHES.iter().map(|n| n.to_string()))
            .all(|n| names.contains(&n));
        if !all_there {
            assert!(
                docs.is_empty(),
                "round {round}: documents before the indexes"
            );
            assert!(
                acked.is_empty(),
                "round {round}: {} acknowledged",
                acked.len()
            );
            continue;
        }
        for def in definitions() {
            let index = db.storage(def.name()).unwrap().begin_read().unwrap();
            let r = check_index(&docs, &index, &def, 5).unwrap();
            assert_eq!(
                r.applied_txn,
                Some(docs.txn_id()),
                "round {round}: index {} is not at the root's txn",
                def.name()
            );
            assert!(r.is_ok(), "round {round}: {r:?}");
        }
        let branches: Vec<_> = BRANCHES
            .iter()
            .map(|n| db.storage(n).unwrap().begin_read().unwrap())
            .collect();
        let mut in_branches: BTreeSet<String> = BTreeSet::new();
        for (i, b) in branches.iter().enumerate() {
            for kv in b.iter().unwrap() {
                let (k, v) = kv.unwrap();
                let k = String::from_utf8(k.to_vec()).unwrap();
                assert_eq!(v, &branch_value(&k, i)[..], "round {round}");
                in_branches.insert(k);
            }
        }
        for k in &in_branches {
            assert!(
                docs.get(k).unwrap().is_some(),
                "round {round}: group {k} is in a branch, not in the root"
            );
            for i in members(k) {
                assert!(
                    branches[i].get(k).unwrap().is_some(),
                    "round {round}: group {k} is missing from {}",
                    BRANCHES[i]
                );
            }
        }
        for (kind, k) in &acked {
            assert!(docs.get(k).unwrap().is_some(), "round {round}: {k} lost");
            assert_eq!(
                *kind == 1,
                in_branches.contains(k),
                "round {round}: acknowledged {k} (kind {kind})"
            );
        }
        drop((docs, branches));
        db.close().unwrap();
    }
    let groups = acked.iter().filter(|(k, _)| *k == 1).count();
    println!(
        "{} writes acknowledged, {groups} of them groups",
        acked.len()
    );
    assert!(
        groups > 50 && acked.len() > groups + 50,
        "only {} writes ({groups} groups) acknowledged over {ROUNDS} rounds",
        acked.len()
    );
}
