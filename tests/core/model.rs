//! Model test: random puts, deletes, large values, commits, aborts, snapshots held across
//! commits and reopens, checked against a `BTreeMap`, growing to 100,000 keys.

use std::collections::BTreeMap;

use omnibus::{FlushMode, Options, ReadTransaction, Storage};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

fn opts(mode: FlushMode) -> Options {
    Options {
        flush_mode: mode,
        flush_scratch_bytes: 4 << 20,
        ..Options::default()
    }
}

fn assert_same(snap: &ReadTransaction, model: &Model) {
    assert_eq!(snap.len(), model.len() as u64, "entry count");
    let mut it = snap.iter().unwrap();
    for (k, v) in model {
        let (gk, gv) = it.next().expect("snapshot ended early").unwrap();
        assert_eq!(gk, k.as_slice());
        assert_eq!(
            gv.len(),
            v.len(),
            "value length of {:?}",
            String::from_utf8_lossy(k)
        );
        assert!(
            gv == v.as_slice(),
            "value of {:?}",
            String::from_utf8_lossy(k)
        );
    }
    assert!(it.next().is_none(), "snapshot has extra entries");
}

fn value(rng: &mut SmallRng) -> Vec<u8> {
    let len = match rng.random_range(0..100) {
        0 => rng.random_range(3000..200_000),
        1..=4 => rng.random_range(1000..2500),
        _ => rng.random_range(0..120),
    };
    let b: u8 = rng.random();
    (0..len).map(|i| b.wrapping_add(i as u8)).collect()
}

fn key(rng: &mut SmallRng, space: u32) -> Vec<u8> {
    let n = rng.random_range(0..space);
    let pad = rng.random_range(0..3) * 8;
    format!("k{n:08}{}", "x".repeat(pad)).into_bytes()
}

fn run(seed: u64, rounds: usize, target_keys: u32, mode: FlushMode) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut s = Storage::open(&path, opts(mode)).unwrap();
    let mut model = Model::new();
    let mut held: Vec<(ReadTransaction, Model)> = Vec::new();
    for round in 0..rounds {
        let mut w = s.begin_write().unwrap();
        let mut next = model.clone();
        let ops = if next.len() < target_keys as usize {
            2000
        } else {
            300
        };
        for _ in 0..ops {
            match rng.random_range(0..10) {
                0..=5 => {
                    let (k, v) = (key(&mut rng, target_keys * 2), value(&mut rng));
                    w.put(&k, &v).unwrap();
                    next.insert(k, v);
                }
                6..=8 => {
                    let k = if rng.random_bool(0.7) && !next.is_empty() {
                        let i = rng.random_range(0..next.len());
                        next.keys().nth(i).unwrap().clone()
                    } else {
                        key(&mut rng, target_keys * 2)
                    };
                    assert_eq!(w.delete(&k).unwrap(), next.remove(&k).is_some());
                }
                _ => {
                    let k = key(&mut rng, target_keys * 2);
                    assert_eq!(w.get(&k).unwrap().as_ref(), next.get(&k));
                }
            }
        }
        match rng.random_range(0..10) {
            0 => w.abort(),
            1 => drop(w),
            _ => {
                w.commit().unwrap();
                model = next;
            }
        }
        // Hold snapshots across later commits; check them when released.
        if rng.random_bool(0.3) {
            held.push((s.begin_read().unwrap(), model.clone()));
        }
        if held.len() > 3 || (rng.random_bool(0.2) && !held.is_empty()) {
            let (snap, m) = held.remove(0);
            assert_same(&snap, &m);
        }
        if rng.random_bool(0.1) {
            s.flush().unwrap();
        }
        if round % 17 == 16 {
            for (snap, m) in held.drain(..) {
                assert_same(&snap, &m);
            }
            let report = s.check().unwrap();
            assert!(
                report.is_ok(),
                "round {round}: {:?}",
                &report.problems[..report.problems.len().min(5)]
            );
            if rng.random_bool(0.5) {
                s.close().unwrap();
            } else {
                drop(s);
            }
            s = Storage::open(&path, opts(mode)).unwrap();
            assert_same(&s.begin_read().unwrap(), &model);
        }
    }
    for (snap, m) in held.drain(..) {
        assert_same(&snap, &m);
    }
    assert_same(&s.begin_read().unwrap(), &model);
    let report = s.check().unwrap();
    assert!(
        report.is_ok(),
        "{:?}",
        &report.problems[..report.problems.len().min(5)]
    );
}

#[test]
fn model_small_keyspace_many_rounds() {
    run(1, 120, 3_000, FlushMode::Inline);
}

#[test]
fn model_grows_to_100k_keys() {
    // 2000 puts a round at 60% puts over a 200k key space: about 100,000 keys by the end.
    run(2, 90, 100_000, FlushMode::Background);
}

#[test]
fn model_seeds() {
    for seed in 10..14 {
        run(seed, 40, 500, FlushMode::Manual);
    }
}
