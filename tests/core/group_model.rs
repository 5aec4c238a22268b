//! Model test of group transactions: seeded random groups over subsets of a root and three
//! branches (puts, deletes, values up to 10 KiB, some aborted, some eventual), single-storage
//! commits between them, snapshots held across commits, flushes and reopenings, all checked
//! against a `BTreeMap` per storage: reads inside a group see its own writes, a snapshot stays
//! its state, and every storage holds exactly its model after each reopen.

use std::collections::BTreeMap;

use omnibus::{Database, Durability, FlushMode, Options, ReadTransaction, Storage};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::common::model::{content, diff, Model};

const BRANCHES: [&str; 3] = ["a", "b", "c"];

fn opts() -> Options {
    Options {
        flush_mode: FlushMode::Manual,
        // Reopenings replay the groups from the journal (flushed only where the model asks).
        flush_on_close: false,
        journal_file_size: 512 << 10,
        ..Options::default()
    }
}

fn storages(db: &Database) -> Vec<Storage> {
    let mut v = vec![db.root()];
    for n in BRANCHES {
        v.push(db.create_storage(n).unwrap());
    }
    v
}

fn value(rng: &mut SmallRng) -> Vec<u8> {
    let len = if rng.random_ratio(1, 10) {
        rng.random_range(2000..10_000)
    } else {
        rng.random_range(0..40)
    };
    let b: u8 = rng.random();
    vec![b; len]
}

fn key(rng: &mut SmallRng) -> Vec<u8> {
    format!("k{:03}", rng.random_range(0..150)).into_bytes()
}

fn check_all(ss: &[Storage], models: &[Model], when: &str) {
    for (i, (s, m)) in ss.iter().zip(models).enumerate() {
        let got = content(s).unwrap();
        assert!(got == *m, "storage {i} {when}: {}", diff(m, &got));
    }
}

fn check_snapshot(r: &ReadTransaction, m: &Model, when: &str) {
    let mut got = Model::new();
    for kv in r.iter().unwrap() {
        let (k, v) = kv.unwrap();
        got.insert(k.to_vec(), v.to_vec());
    }
    assert!(got == *m, "snapshot {when}: {}", diff(m, &got));
}

#[test]
fn groups_single_commits_and_snapshots_match_a_model() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut rng = SmallRng::seed_from_u64(0x6a0f);
    let mut db = Database::open(&path, opts()).unwrap();
    let mut ss = storages(&db);
    let mut models: Vec<Model> = vec![BTreeMap::new(); ss.len()];
    let mut snaps: Vec<(usize, ReadTransaction, Model)> = Vec::new();
    let (mut groups, mut aborted, mut reopens) = (0, 0, 0);
    for step in 0..500 {
        let roll = rng.random_range(0..100);
        if roll < 55 {
            // A group over a random subset, given in a random order.
            let mut members: Vec<usize> = (0..ss.len()).filter(|_| rng.random_bool(0.6)).collect();
            if members.is_empty() {
                members.push(rng.random_range(0..ss.len()));
            }
            members.shuffle(&mut rng);
            let refs: Vec<&Storage> = members.iter().map(|&i| &ss[i]).collect();
            let mut g = db.begin_group(&refs).unwrap();
            let mut pending: Vec<Model> = models.clone();
            for _ in 0..rng.random_range(1..12) {
                let i = members[rng.random_range(0..members.len())];
                let k = key(&mut rng);
                if rng.random_ratio(1, 4) {
                    let had = g.delete(&ss[i], &k).unwrap();
                    assert_eq!(had, pending[i].remove(&k).is_some(), "step {step}");
                } else {
                    let v = value(&mut rng);
                    g.put(&ss[i], &k, &v).unwrap();
                    pending[i].insert(k.clone(), v);
                }
                // Reads see the group's own writes.
                assert_eq!(
                    g.get(&ss[i], &k).unwrap().as_ref(),
                    pending[i].get(&k),
                    "step {step}"
                );
            }
            let i = members[0];
            let n = g.range(&ss[i], ..).unwrap().count();
            assert_eq!(n, pending[i].len(), "step {step}: a range in the group");
            if rng.random_ratio(1, 10) {
                g.abort();
                aborted += 1;
            } else {
                if rng.random_ratio(1, 4) {
                    g.set_durability(Durability::Eventual);
                }
                g.commit().unwrap();
                models = pending;
                groups += 1;
            }
        } else if roll < 80 {
            let i = rng.random_range(0..ss.len());
            let mut w = ss[i].begin_write().unwrap();
            for _ in 0..rng.random_range(1..6) {
                let (k, v) = (key(&mut rng), value(&mut rng));
                w.put(&k, &v).unwrap();
                models[i].insert(k, v);
            }
            w.commit().unwrap();
        } else if roll < 90 {
            let i = rng.random_range(0..ss.len());
            snaps.push((i, ss[i].begin_read().unwrap(), models[i].clone()));
            if snaps.len() > 6 {
                let (_, r, m) = snaps.remove(0);
                check_snapshot(&r, &m, &format!("step {step}"));
            }
        } else if roll < 96 {
            db.flush().unwrap();
        } else {
            for (_, r, m) in snaps.drain(..) {
                check_snapshot(&r, &m, &format!("step {step}, before a reopen"));
            }
            check_all(&ss, &models, &format!("step {step}, before a reopen"));
            drop(ss);
            db.close().unwrap();
            db = Database::open(&path, opts()).unwrap();
            ss = storages(&db);
            check_all(&ss, &models, &format!("step {step}, after a reopen"));
            reopens += 1;
        }
    }
    for (_, r, m) in snaps.drain(..) {
        check_snapshot(&r, &m, "at the end");
    }
    check_all(&ss, &models, "at the end");
    assert!(
        groups > 200 && aborted > 10 && reopens >= 5,
        "{groups} groups, {aborted} aborted, {reopens} reopenings"
    );
    drop(ss);
    drop(db);
    let db = Database::open(&path, opts()).unwrap();
    let ss = storages(&db);
    check_all(&ss, &models, "after the last reopen");
    for s in &ss {
        assert!(s.check().unwrap().is_ok());
    }
}
