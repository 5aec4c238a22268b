//! Defining an index over existing documents builds it: 6,000 documents are stored first, then
//! two indexes are defined, one with the smallest reconcile memory (64 KiB, so the build takes
//! several passes over the documents, each for a key range) and one whose storage already holds
//! wrong entries (stale terms, an entry with a value, a stray one-byte key) that the build must
//! remove. Documents written while the builds run wait in the feed and are applied after.
//! After `wait_for_indexes` both equal the entries computed from the documents.

#[path = "common/index.rs"]
mod index_common;

use index_common::{diff, documents, entries, expected, map_color, map_tags};
use omnibus::actors::{IndexDefinition, IndexState, WriteBatch};
use rand::rngs::SmallRng;
use rand::SeedableRng;

#[test]
fn defining_over_existing_documents_builds_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, db) = index_common::open_engine(dir.path().join("db"));
    let root = db.root();
    let mut rng = SmallRng::seed_from_u64(5);
    for chunk in 0..60 {
        let mut b = WriteBatch::new();
        for i in 0..100 {
            let doc = index_common::random_doc(&mut rng);
            b.put(format!("doc-{chunk:03}-{i:03}-with-a-longer-key"), doc);
        }
        root.blocking_write(b).unwrap();
    }
    // Wrong entries in the second index's storage before it is defined.
    let tags = db.blocking_create_storage("by_tag").unwrap();
    let mut junk = WriteBatch::new();
    junk.put(b"zzz\0doc-000-000-with-a-longer-key".to_vec(), Vec::new());
    junk.put(b"a\0no-such-document".to_vec(), Vec::new());
    junk.put(b"q".to_vec(), Vec::new());
    tags.blocking_write(junk).unwrap();
    let first = documents(&root.snapshot().unwrap());
    let probe = first.keys().next().unwrap().clone();
    let probe_entry = [
        index_common::map_tags(&probe, &first[&probe])
            .first()
            .cloned()
            .unwrap_or_else(|| b"a".to_vec()),
        vec![0],
        probe.clone(),
    ]
    .concat();
    tags.blocking_put(probe_entry, b"a value".to_vec()).unwrap();

    db.blocking_define_index(IndexDefinition::new("by_color", map_color).reconcile_memory(0))
        .unwrap();
    db.blocking_define_index(IndexDefinition::new("by_tag", map_tags))
        .unwrap();
    // Writes while the builds run.
    for i in 0..50 {
        root.blocking_put(format!("late-{i:02}"), index_common::random_doc(&mut rng))
            .unwrap();
    }
    root.blocking_delete(probe.clone()).unwrap();
    let mid = db.index_stats();
    db.blocking_wait_for_indexes().unwrap();

    let docs = documents(&root.snapshot().unwrap());
    assert_eq!(docs.len(), 6049);
    for (name, map) in [
        ("by_color", map_color as index_common::Map),
        ("by_tag", map_tags),
    ] {
        let got = entries(db.blocking_storage(name).unwrap().storage());
        let want = expected(docs.iter().map(|(k, v)| (&k[..], &v[..])), map);
        assert!(got == want, "{name}: {}", diff(&got, &want));
    }
    let stats = db.index_stats();
    for s in &stats {
        assert!(matches!(s.state, IndexState::Current), "{s:?}");
        assert!(s.reconciles > 0, "{s:?}");
        assert!(s.build.is_none(), "{s:?}");
        assert_eq!(s.lag_txns, 0, "{s:?}");
    }
    let color = &stats[0];
    assert_eq!(color.entries, 6049, "one color per document: {color:?}");
    // 6,000 keys of about 35 bytes (+16 each) do not fit in 64 KiB: several passes.
    assert!(color.build_passes > 2, "{color:?}");
    assert_eq!(stats[1].build_passes, 1, "{:?}", stats[1]);
    // While building, the progress was reported (or the build had already finished).
    for s in &mid {
        match s.state {
            IndexState::Building => {
                let b = s.build.expect("building: progress");
                assert_eq!(b.total, 6000, "{s:?}");
                assert!(b.scanned <= b.total, "{s:?}");
            }
            IndexState::Current => {}
            _ => panic!("{s:?}"),
        }
    }
    drop((root, tags, db));
    engine.shutdown().unwrap();
}
