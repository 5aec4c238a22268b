//! Group writes through the actors (`DatabaseHandle::write`) and synchronous indexes
//! (`IndexMode::Synchronous`): a group's batches show in every storage once it returns, a
//! refused or failed group shows nowhere, and a synchronous index holds a document's entries as
//! soon as the document's write returns (no `wait_for_indexes`), through every root write path
//! (batches, groups, update closures), after a restart too without a rebuild; a map function
//! that panics fails the write that reached it and poisons that index only.

use std::collections::BTreeMap;

use omnibus::actors::{
    check_index, Engine, EngineOptions, IndexDefinition, IndexMode, IndexState, WriteBatch,
};
use omnibus::{Durability, Error, GroupError, JournalMode, Options};
use rand::{rngs::SmallRng, Rng, SeedableRng};

use crate::common::index::{self as index_common, entries, expected_of_model, map_color, map_tags};

fn batch(pairs: &[(&str, &str)]) -> WriteBatch {
    let mut b = WriteBatch::new();
    for (k, v) in pairs {
        b.put(*k, *v);
    }
    b
}

fn get(h: &omnibus::actors::StorageHandle, k: &str) -> Option<Vec<u8>> {
    h.blocking_get(k).unwrap()
}

#[test]
fn a_group_write_shows_in_every_storage_or_in_none() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, db) = index_common::open_engine(dir.path().join("db"));
    let root = db.root();
    let a = db.blocking_create_storage("a").unwrap();
    let b = db.blocking_create_storage("b").unwrap();

    db.blocking_write([
        (&b, batch(&[("k", "in b")])),
        (&root, batch(&[("k", "in root")])),
        (&a, batch(&[("k", "in a"), ("k2", "also a")])),
    ])
    .unwrap();
    assert_eq!(get(&root, "k").as_deref(), Some(&b"in root"[..]));
    assert_eq!(get(&a, "k").as_deref(), Some(&b"in a"[..]));
    assert_eq!(get(&a, "k2").as_deref(), Some(&b"also a"[..]));
    assert_eq!(get(&b, "k").as_deref(), Some(&b"in b"[..]));
    // One journal record for the three storages' parts: one more commit per storage.
    let mut del = WriteBatch::new();
    del.delete("k2");
    db.blocking_write([(&a, del), (&b, batch(&[("k3", "v")]))])
        .unwrap();
    assert_eq!(get(&a, "k2"), None);
    assert_eq!(get(&b, "k3").as_deref(), Some(&b"v"[..]));

    // Refusals, each before anything is written.
    let before = (
        a.snapshot().unwrap().txn_id(),
        b.snapshot().unwrap().txn_id(),
    );
    assert!(matches!(
        db.blocking_write([(&a, batch(&[("x", "1")])), (&a, batch(&[("y", "2")]))]),
        Err(Error::Group(GroupError::Duplicate { .. }))
    ));
    assert!(matches!(
        db.blocking_write([(&root, batch(&[("x", "1")])), (&root, batch(&[("y", "2")]))]),
        Err(Error::Group(GroupError::Duplicate { .. }))
    ));
    let mut bad = WriteBatch::new();
    bad.put("", "empty key");
    assert!(matches!(
        db.blocking_write([(&a, batch(&[("x", "1")])), (&b, bad)]),
        Err(Error::EmptyKey)
    ));
    let other = engine
        .blocking_open_database(dir.path().join("other"), Options::default())
        .unwrap();
    let foreign = other.blocking_create_storage("a").unwrap();
    assert!(matches!(
        db.blocking_write([(&a, batch(&[("x", "1")])), (&foreign, batch(&[("x", "1")]))]),
        Err(Error::Group(GroupError::NotInDatabase { .. }))
    ));
    db.blocking_define_index(IndexDefinition::new("by_color", map_color))
        .unwrap();
    let index = db.blocking_storage("by_color").unwrap();
    assert!(matches!(
        db.blocking_write([(&index, batch(&[("x", "1")]))]),
        Err(Error::InvalidOptions(_))
    ));
    // Nor through its own handle (reads are fine).
    assert!(matches!(
        index.blocking_put("x", "1"),
        Err(Error::InvalidOptions(_))
    ));
    assert!(matches!(
        index.blocking_update(|t| t.put("x", "1")),
        Err(Error::InvalidOptions(_))
    ));
    assert_eq!(get(&index, "x"), None);
    assert_eq!(
        (
            a.snapshot().unwrap().txn_id(),
            b.snapshot().unwrap().txn_id()
        ),
        before,
        "a refused group wrote something"
    );
    assert_eq!(get(&a, "x"), None);

    // Eventual groups, then a restart: every group is there after the clean close.
    for i in 0..50 {
        let mut x = batch(&[(&format!("e{i}"), "a")]);
        x.set_durability(Durability::Eventual);
        let mut y = batch(&[(&format!("e{i}"), "b")]);
        y.set_durability(Durability::Eventual);
        db.blocking_write([(&a, x), (&b, y)]).unwrap();
    }
    drop((root, a, b, index, foreign, db, other));
    engine.shutdown().unwrap();
    let (engine, db) = index_common::open_engine(dir.path().join("db"));
    let a = db.blocking_storage("a").unwrap();
    let b = db.blocking_storage("b").unwrap();
    for i in 0..50 {
        assert_eq!(get(&a, &format!("e{i}")).as_deref(), Some(&b"a"[..]));
        assert_eq!(get(&b, &format!("e{i}")).as_deref(), Some(&b"b"[..]));
    }
    assert_eq!(get(&db.root(), "k").as_deref(), Some(&b"in root"[..]));
    drop((a, b, db));
    engine.shutdown().unwrap();
}

#[test]
fn group_writes_are_refused_with_separate_journals() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::start(EngineOptions {
        executors: Some(1),
        ..EngineOptions::default()
    })
    .unwrap();
    let db = engine
        .blocking_open_database(
            dir.path().join("db"),
            Options {
                journal_mode: JournalMode::Separate,
                ..Options::default()
            },
        )
        .unwrap();
    let a = db.blocking_create_storage("a").unwrap();
    assert!(matches!(
        db.blocking_write([(&a, batch(&[("x", "1")]))]),
        Err(Error::Group(GroupError::SeparateJournals))
    ));
    assert!(matches!(
        db.blocking_define_index(
            IndexDefinition::new("by_color", map_color).mode(IndexMode::Synchronous)
        ),
        Err(Error::Group(GroupError::SeparateJournals))
    ));
    drop((a, db));
    engine.shutdown().unwrap();
}

/// Writes random documents through every root write path; after each write (no wait) the
/// synchronous indexes hold exactly the model's entries.
#[test]
fn a_synchronous_index_holds_a_documents_entries_when_its_write_returns() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, db) = index_common::open_engine(dir.path().join("db"));
    let root = db.root();
    let mut rng = SmallRng::seed_from_u64(7);
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    // Documents before the definitions: built from them, then made synchronous.
    for i in 0..200u32 {
        let (k, v) = (
            format!("d{i:04}").into_bytes(),
            index_common::random_doc(&mut rng),
        );
        root.blocking_put(k.clone(), v.clone()).unwrap();
        model.insert(k, v);
    }
    db.blocking_define_index(
        IndexDefinition::new("by_color", map_color).mode(IndexMode::Synchronous),
    )
    .unwrap();
    db.blocking_define_index(
        IndexDefinition::new("by_tag", map_tags)
            .mode(IndexMode::Synchronous)
            .write_buffer_bytes(16 << 10),
    )
    .unwrap();
    let colors = db.blocking_storage("by_color").unwrap();
    let tags = db.blocking_storage("by_tag").unwrap();
    let other = db.blocking_create_storage("other").unwrap();
    let check = |model: &BTreeMap<Vec<u8>, Vec<u8>>, what: &str| {
        for (h, map) in [(&colors, map_color as index_common::Map), (&tags, map_tags)] {
            let got = entries(h);
            let want = expected_of_model(model, map);
            assert!(got == want, "{what}: {}", index_common::diff(&got, &want));
        }
    };
    check(&model, "after the definitions");
    // A group writing the root holds both indexes' parts: they count among its storages.
    let mut many = vec![(&root, WriteBatch::new())];
    many.extend((0..254).map(|_| (&other, WriteBatch::new())));
    match db.blocking_write(many) {
        Err(Error::Group(GroupError::TooManyStorages { count, max })) => {
            assert_eq!((count, max), (257, 256))
        }
        r => panic!("255 storages and 2 synchronous indexes: {r:?}"),
    }
    // Without the root, 255 storages pass the count (and are refused as duplicates).
    let many: Vec<_> = (0..255).map(|_| (&other, WriteBatch::new())).collect();
    assert!(matches!(
        db.blocking_write(many),
        Err(Error::Group(GroupError::Duplicate { .. }))
    ));
    for round in 0..120u32 {
        let i = rng.random_range(0..260u32);
        let k = format!("d{i:04}").into_bytes();
        let v = index_common::random_doc(&mut rng);
        match round % 4 {
            0 => {
                root.blocking_put(k.clone(), v.clone()).unwrap();
                model.insert(k, v);
            }
            1 => {
                root.blocking_delete(k.clone()).unwrap();
                model.remove(&k);
            }
            2 => {
                // A group with a plain branch: the index part joins it.
                let mut rb = WriteBatch::new();
                rb.put(k.clone(), v.clone());
                db.blocking_write([(&root, rb), (&other, batch(&[("r", "x")]))])
                    .unwrap();
                model.insert(k, v);
            }
            _ => {
                let (k2, v2) = (k.clone(), v.clone());
                root.blocking_update(move |t| {
                    t.put(&k2, &v2)?;
                    Ok::<_, Error>(())
                })
                .unwrap();
                model.insert(k, v);
            }
        }
        check(&model, &format!("round {round}"));
    }
    let stats = db.index_stats();
    for s in &stats {
        assert!(s.synchronous, "{}", s.name);
        assert!(
            matches!(s.state, IndexState::Current),
            "{}: {:?}",
            s.name,
            s.state
        );
        assert_eq!(s.lag_txns, 0, "{}", s.name);
        assert_eq!(
            s.applied_txn,
            root.snapshot().unwrap().txn_id(),
            "{}",
            s.name
        );
    }
    db.blocking_wait_for_indexes().unwrap();
    for r in db.blocking_check_indexes(5).unwrap() {
        assert!(r.is_ok(), "{r:?}");
    }

    // A restart: defined again, they resume without a rebuild and stay exact.
    drop((root, colors, tags, other, db));
    engine.shutdown().unwrap();
    let (engine, db) = index_common::open_engine(dir.path().join("db"));
    for def in [
        IndexDefinition::new("by_color", map_color),
        IndexDefinition::new("by_tag", map_tags),
    ] {
        db.blocking_define_index(def.mode(IndexMode::Synchronous))
            .unwrap();
    }
    assert!(db.index_stats().iter().all(|s| s.reconciles == 0));
    let root = db.root();
    root.blocking_put("d9999", "color=violet;tags=zz;n=2")
        .unwrap();
    model.insert(b"d9999".to_vec(), b"color=violet;tags=zz;n=2".to_vec());
    let (colors, tags) = (
        db.blocking_storage("by_color").unwrap(),
        db.blocking_storage("by_tag").unwrap(),
    );
    for (h, map) in [(&colors, map_color as index_common::Map), (&tags, map_tags)] {
        let got = entries(h);
        let want = expected_of_model(&model, map);
        assert!(
            got == want,
            "after a restart: {}",
            index_common::diff(&got, &want)
        );
    }
    // Each index storage's snapshot records the root's txn exactly (checked by the core).
    let docs = root.snapshot().unwrap();
    let r = check_index(
        &docs,
        &colors.snapshot().unwrap(),
        &IndexDefinition::new("by_color", map_color),
        5,
    )
    .unwrap();
    assert!(r.is_ok() && r.applied_txn == Some(docs.txn_id()), "{r:?}");
    drop((root, colors, tags, db));
    engine.shutdown().unwrap();
}

#[test]
fn a_synchronous_map_function_that_panics_fails_its_write_and_poisons_only_its_index() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, db) = index_common::open_engine(dir.path().join("db"));
    db.blocking_define_index(
        IndexDefinition::new("fragile", |_k: &[u8], v: &[u8]| {
            assert!(v != b"boom", "the map function refuses this document");
            vec![v.to_vec()]
        })
        .mode(IndexMode::Synchronous),
    )
    .unwrap();
    db.blocking_define_index(
        IndexDefinition::new("sturdy", |_k: &[u8], v: &[u8]| vec![v.to_vec()])
            .mode(IndexMode::Synchronous),
    )
    .unwrap();
    let root = db.root();
    root.blocking_put("a", "fine").unwrap();
    match root.blocking_put("b", "boom") {
        Err(Error::IndexPoisoned { index, .. }) => assert_eq!(index, "fragile"),
        r => panic!("a panicking synchronous map function: {r:?}"),
    }
    assert_eq!(get(&root, "b"), None, "the failed write is visible");
    // Later writes go on without the poisoned index; the other stays exact.
    root.blocking_put("c", "later").unwrap();
    let sturdy = db.blocking_storage("sturdy").unwrap();
    assert_eq!(entries(&sturdy).len(), 2);
    let stats: BTreeMap<String, IndexState> = db
        .index_stats()
        .into_iter()
        .map(|s| (s.name, s.state))
        .collect();
    assert!(matches!(stats["fragile"], IndexState::Poisoned(_)));
    assert!(matches!(stats["sturdy"], IndexState::Current));
    assert!(matches!(
        db.blocking_wait_for_index("fragile"),
        Err(Error::IndexPoisoned { .. })
    ));
    db.blocking_wait_for_index("sturdy").unwrap();
    drop((root, sturdy, db));
    engine.shutdown().unwrap();
}

/// A buffered synchronous index's parts stay logical records: an apply of its write buffer
/// is a transaction of its own (a part that applied a step carried the step's pages into the
/// group record, 185 MB of them with 100 indexes).
#[test]
fn a_synchronous_index_part_never_carries_a_buffer_apply_step() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::start(EngineOptions {
        executors: Some(2),
        ..EngineOptions::default()
    })
    .unwrap();
    // No flush meanwhile: every journal file stays for the scan below.
    let opts = Options {
        flush_scratch_bytes: 1 << 30,
        flush_max_age: std::time::Duration::from_secs(600),
        ..Options::default()
    };
    let path = dir.path().join("db");
    let db = engine.blocking_open_database(&path, opts).unwrap();
    db.blocking_define_index(
        IndexDefinition::new("by_tag", map_tags)
            .mode(IndexMode::Synchronous)
            .write_buffer_bytes(64 << 10),
    )
    .unwrap();
    let root = db.root();
    let mut rng = SmallRng::seed_from_u64(3);
    for i in 0..2000u32 {
        let tags: Vec<String> = (0..4)
            .map(|_| format!("t{}", rng.random_range(0..500)))
            .collect();
        // Eventual: one group record each all the same, without a sync each.
        let mut b = WriteBatch::new();
        b.put(format!("d{i:04}"), format!("tags={}", tags.join(",")))
            .set_durability(Durability::Eventual);
        root.blocking_write(b).unwrap();
    }
    let kinds = crate::common::damage::group_part_kinds(&path);
    assert!(kinds.len() >= 500, "{} group records", kinds.len());
    // Each group: the root's page commit (kind 1), then the index's buffered operations as a
    // logical record (kind 5), never an apply of its buffer (a step, kind 6, or a page
    // commit of the whole buffer, kind 1).
    let odd: Vec<&Vec<u8>> = kinds.iter().filter(|k| k[..] != [1, 5]).collect();
    assert!(
        odd.is_empty(),
        "{} groups carry an apply: {:?}",
        odd.len(),
        &odd[..odd.len().min(3)]
    );
    // The buffer was applied all the same (in transactions of its own), more than once.
    let stats = db.blocking_storage("by_tag").unwrap().stats();
    let entries = entries(&db.blocking_storage("by_tag").unwrap()).len() as u64;
    assert!(
        stats.buffer_entries < entries / 2,
        "{stats:?}, {entries} entries"
    );
    drop((root, db));
    engine.shutdown().unwrap();
}
