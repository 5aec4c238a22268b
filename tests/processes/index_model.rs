//! Indexes maintained by the engine, against a model. Four threads put, overwrite and delete
//! documents with random field values through the root's handle (single operations and
//! batches that touch a key twice), with three indexes defined (one term per document, zero to
//! several terms with repeats, a term for some documents only; batches capped at 7 changes for
//! one, spaced 3 ms apart for another). After `wait_for_indexes`, each index storage's entries
//! equal those computed from a `BTreeMap` of the documents, exactly; after a clean shutdown and
//! reopen, defining them again resumes them without a reconcile.
//!
//! Then real crashes: a child process (this test binary re-executed) loads random documents
//! with the indexes defined and is killed with SIGKILL mid-load, five times; after each kill the
//! parent reopens the database, defines the indexes and waits, and each index must equal the
//! entries computed from the reopened documents (a crash between a root commit and an index
//! commit is caught up by a reconcile).

use std::collections::BTreeMap;
use std::time::Duration;

use omnibus::actors::{DatabaseHandle, Engine, EngineOptions, IndexState, WriteBatch};
use omnibus::Options;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::common;
use crate::common::children;
use crate::common::index as index_common;
use index_common::{definitions, diff, documents, entries, expected, expected_of_model, INDEXES};

const CHILD_DIR: &str = "OMNIBUS_INDEX_MODEL_DIR";

fn engine() -> Engine {
    Engine::start(EngineOptions {
        executors: Some(2),
        ..EngineOptions::default()
    })
    .expect("engine")
}

fn define_all(db: &DatabaseHandle) {
    for d in definitions() {
        db.blocking_define_index(d).unwrap();
    }
}

/// Random operations on the keys `k{thread}-{0..200}`, applied to `model` as they are
/// acknowledged.
fn load(
    db: &DatabaseHandle,
    thread: u64,
    seed: u64,
    ops: usize,
    model: &mut BTreeMap<Vec<u8>, Vec<u8>>,
) {
    let root = db.root();
    let mut rng = SmallRng::seed_from_u64(seed ^ (thread << 32));
    let key =
        |rng: &mut SmallRng| format!("k{thread}-{:03}", rng.random_range(0..200)).into_bytes();
    for _ in 0..ops {
        match rng.random_range(0..10) {
            0..5 => {
                let (k, v) = (key(&mut rng), index_common::random_doc(&mut rng));
                root.blocking_put(k.clone(), v.clone()).unwrap();
                model.insert(k, v);
            }
            5..7 => {
                let k = key(&mut rng);
                let was = root.blocking_delete(k.clone()).unwrap();
                assert_eq!(was, model.remove(&k).is_some());
            }
            _ => {
                let mut b = WriteBatch::new();
                let mut after = Vec::new();
                for _ in 0..rng.random_range(2..6) {
                    // Sometimes the same key again in the same batch.
                    let k = match after.last() {
                        Some((k, _)) if rng.random_ratio(1, 3) => Vec::clone(k),
                        _ => key(&mut rng),
                    };
                    if rng.random_ratio(1, 4) {
                        b.delete(k.clone());
                        after.push((k, None));
                    } else {
                        let v = index_common::random_doc(&mut rng);
                        b.put(k.clone(), v.clone());
                        after.push((k, Some(v)));
                    }
                }
                root.blocking_write(b).unwrap();
                for (k, v) in after {
                    match v {
                        Some(v) => model.insert(k, v),
                        None => model.remove(&k),
                    };
                }
            }
        }
    }
}

fn assert_indexes_match(db: &DatabaseHandle, model: &BTreeMap<Vec<u8>, Vec<u8>>, when: &str) {
    for (name, map) in INDEXES {
        let got = entries(&db.blocking_storage(name).unwrap());
        let want = expected_of_model(model, map);
        assert!(got == want, "{when}: index {name}: {}", diff(&got, &want));
    }
}

#[test]
fn random_operations_match_the_model() {
    let _no_children = children::no_children_meanwhile();
    if std::env::var(CHILD_DIR).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let engine = engine();
    let db = engine
        .blocking_open_database(&path, Options::default())
        .unwrap();
    define_all(&db);
    let mut models: Vec<BTreeMap<Vec<u8>, Vec<u8>>> = vec![BTreeMap::new(); 4];
    for round in 0..3u64 {
        let handles: Vec<_> = std::mem::take(&mut models)
            .into_iter()
            .enumerate()
            .map(|(t, mut m)| {
                let db = db.clone();
                std::thread::spawn(move || {
                    load(&db, t as u64, round * 1000 + 7, 400, &mut m);
                    m
                })
            })
            .collect();
        models = handles.into_iter().map(|h| h.join().unwrap()).collect();
        db.blocking_wait_for_indexes().unwrap();
        let model: BTreeMap<Vec<u8>, Vec<u8>> = models
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        assert_eq!(
            documents(&db.root().snapshot().unwrap()),
            model,
            "round {round}: documents"
        );
        assert_indexes_match(&db, &model, &format!("round {round}"));
        for s in db.index_stats() {
            assert!(matches!(s.state, IndexState::Current), "{s:?}");
            assert_eq!(s.lag_txns, 0, "{s:?}");
            assert_eq!(
                s.entries as usize,
                expected_of_model(&model, INDEXES.iter().find(|i| i.0 == s.name).unwrap().1).len()
            );
        }
    }
    let model: BTreeMap<Vec<u8>, Vec<u8>> = models.into_iter().flatten().collect();
    let stats = db.index_stats();
    let tag = stats.iter().find(|s| s.name == "by_tag").unwrap();
    assert!(tag.batches > 1 && tag.changes > 0, "{tag:?}");
    drop(db);
    engine.shutdown().unwrap();

    // A clean shutdown left every index current: defining them again resumes, no reconcile.
    let engine = self::engine();
    let db = engine
        .blocking_open_database(&path, Options::default())
        .unwrap();
    define_all(&db);
    db.blocking_wait_for_indexes().unwrap();
    for s in db.index_stats() {
        assert_eq!(s.reconciles, 0, "{s:?}");
        assert!(matches!(s.state, IndexState::Current), "{s:?}");
    }
    assert_indexes_match(&db, &model, "after reopen");
    drop(db);
    engine.shutdown().unwrap();
}

/// The child: defines the indexes and loads random documents until killed.
#[test]
fn child_entry() {
    let Ok(dir) = std::env::var(CHILD_DIR) else {
        return;
    };
    let engine = engine();
    let o = Options {
        flush_scratch_bytes: 256 << 10,
        flush_max_age: Duration::from_millis(50),
        journal_file_size: 1 << 20,
        ..Options::default()
    };
    let db = engine.blocking_open_database(&dir, o).expect("open");
    define_all(&db);
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let root = db.root();
            std::thread::spawn(move || {
                let mut rng = SmallRng::seed_from_u64(t ^ ((std::process::id() as u64) << 8));
                loop {
                    let k = format!("doc-{:04}", rng.random_range(0..3000)).into_bytes();
                    if rng.random_ratio(1, 5) {
                        root.blocking_delete(k).expect("delete");
                    } else {
                        let mut b = WriteBatch::new();
                        b.put(k, index_common::random_doc(&mut rng));
                        let k2 = format!("doc-{:04}", rng.random_range(0..3000)).into_bytes();
                        b.put(k2, index_common::random_doc(&mut rng));
                        root.blocking_write(b).expect("write");
                    }
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
}

#[test]
fn sigkill_mid_load_then_reopen_matches_the_documents() {
    if std::env::var(CHILD_DIR).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut rng = SmallRng::seed_from_u64(23);
    let mut reconciles = 0;
    let mut docs_seen = 0;
    for round in 0..5 {
        common::run_and_kill(
            &common::test_name(module_path!(), "child_entry"),
            CHILD_DIR,
            &path,
            Duration::from_millis(rng.random_range(500..1200)),
        );
        // This round's checks open the database here: no other test starts a child meanwhile.
        let _no_children = children::no_children_meanwhile();
        let engine = engine();
        let db = engine
            .blocking_open_database(&path, Options::default())
            .unwrap();
        define_all(&db);
        db.blocking_wait_for_indexes().unwrap();
        let snap = db.root().snapshot().unwrap();
        let docs = documents(&snap);
        docs_seen = docs.len();
        for (name, map) in INDEXES {
            let got = entries(&db.blocking_storage(name).unwrap());
            let want = expected(docs.iter().map(|(k, v)| (&k[..], &v[..])), map);
            assert!(
                got == want,
                "round {round}: index {name}: {}",
                diff(&got, &want)
            );
        }
        for s in db.index_stats() {
            assert_eq!(s.applied_txn, snap.txn_id(), "round {round}: {s:?}");
            reconciles += s.reconciles as usize;
        }
        for n in db.storages() {
            let r = db.blocking_storage(&n).unwrap().blocking_check().unwrap();
            assert!(r.is_ok(), "round {round}: {n}: {:?}", r.problems);
        }
        drop(snap);
        drop(db);
        engine.shutdown().unwrap();
    }
    eprintln!("{docs_seen} documents after the last round; {reconciles} reconciles");
    assert!(docs_seen > 100, "only {docs_seen} documents loaded");
    // A kill mid-load leaves indexes behind the documents: the reconcile path was taken.
    assert!(reconciles >= 1, "no reconcile in 5 rounds");
}
