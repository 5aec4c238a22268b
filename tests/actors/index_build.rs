//! Defining an index over existing documents builds it: 6,000 documents are stored first, then
//! two indexes are defined, one with the smallest reconcile memory (64 KiB, so the build takes
//! several passes over the documents, each for a key range) and one whose storage already holds
//! wrong entries (stale terms, an entry with a value, a stray one-byte key) that the build must
//! remove. Documents written while the builds run wait in the feed and are applied after.
//! After `wait_for_indexes` both equal the entries computed from the documents.

use omnibus::actors::{IndexDefinition, IndexState, WriteBatch};
use rand::rngs::SmallRng;
use rand::SeedableRng;

use crate::common::index as index_common;
use index_common::{diff, documents, entries, expected, map_color, map_tags};

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
        let got = entries(&db.blocking_storage(name).unwrap());
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

/// The terms of a document `a|b|...`: its `|`-separated parts, as they are (NUL bytes too).
fn map_parts(_k: &[u8], v: &[u8]) -> Vec<Vec<u8>> {
    v.split(|&b| b == b'|').map(<[u8]>::to_vec).collect()
}

/// The documents of an index's entries of term `t`, found by the prefix scan the docs give.
fn docs_of_term(index: &omnibus::actors::StorageHandle, t: &[u8]) -> Vec<Vec<u8>> {
    let r = index.snapshot().unwrap();
    let prefix = omnibus::actors::index_term_prefix(t);
    r.prefix(&prefix[..])
        .unwrap()
        .map(|e| {
            let (k, _) = e.unwrap();
            let (term, doc) = omnibus::actors::decode_index_entry(k).unwrap();
            assert_eq!(term, t);
            doc.to_vec()
        })
        .collect()
}

// Regression: a term `a\0b` was stored as is, and the prefix scan for the term `a` (`a` 0x00)
// returned that document too.
#[test]
fn terms_holding_nul_bytes_never_collide() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, db) = index_common::open_engine(dir.path().join("db"));
    db.blocking_define_index(IndexDefinition::new("parts", map_parts))
        .unwrap();
    let root = db.root();
    root.blocking_put("d1", "a").unwrap();
    root.blocking_put("d2", "a\0b").unwrap();
    root.blocking_put("d3", "a\0|a\x01|\x01").unwrap();
    root.blocking_put("d4", "ab|a").unwrap();
    db.blocking_wait_for_indexes().unwrap();
    let index = db.blocking_storage("parts").unwrap();
    let s = &index;
    assert_eq!(docs_of_term(s, b"a"), vec![b"d1".to_vec(), b"d4".to_vec()]);
    assert_eq!(docs_of_term(s, b"a\0b"), vec![b"d2".to_vec()]);
    assert_eq!(docs_of_term(s, b"a\0"), vec![b"d3".to_vec()]);
    assert_eq!(docs_of_term(s, b"a\x01"), vec![b"d3".to_vec()]);
    assert_eq!(docs_of_term(s, b"\x01"), vec![b"d3".to_vec()]);
    assert_eq!(docs_of_term(s, b"\0"), Vec::<Vec<u8>>::new());
    // Moving a document off a term with NUL bytes removes its entry.
    root.blocking_put("d2", "c").unwrap();
    db.blocking_wait_for_indexes().unwrap();
    assert_eq!(docs_of_term(s, b"a\0b"), Vec::<Vec<u8>>::new());
    let docs = documents(&root.snapshot().unwrap());
    let want = expected(docs.iter().map(|(k, v)| (&k[..], &v[..])), map_parts);
    assert_eq!(entries(s), want);
    // The cross-check agrees, term by term.
    let report = omnibus::actors::check_index(
        &root.snapshot().unwrap(),
        &s.snapshot().unwrap(),
        &IndexDefinition::new("parts", map_parts),
        5,
    )
    .unwrap();
    assert_eq!(report.differences(), 0, "{report:?}");
    assert_eq!(report.expected_entries, want.len() as u64);
    drop(index);
    drop(db);
    engine.shutdown().unwrap();
}

/// An index written before terms were escaped (its applied record of version 1, its entries'
/// terms as they were) is reconciled into escaped keys at its next definition.
#[test]
fn an_index_of_unescaped_terms_is_rebuilt_at_its_next_definition() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    {
        let (engine, db) = index_common::open_engine(&path);
        let root = db.root();
        root.blocking_put("d1", "x\0y|z").unwrap();
        root.blocking_put("d2", "x").unwrap();
        // The index as the earlier format wrote it, current with the documents.
        let old = db.blocking_create_storage("parts").unwrap();
        let txn = root.stats().last_committed_txn;
        let mut b = WriteBatch::new();
        let mut record = b"omniIDX1".to_vec();
        record.extend_from_slice(&txn.to_le_bytes());
        b.put(vec![0u8], record);
        for (t, d) in [(&b"x\0y"[..], "d1"), (b"z", "d1"), (b"x", "d2")] {
            b.put([t, b"\0", d.as_bytes()].concat(), Vec::new());
        }
        old.blocking_write(b).unwrap();
        drop(old);
        drop(db);
        engine.shutdown().unwrap();
    }
    let (engine, db) = index_common::open_engine(&path);
    db.blocking_define_index(IndexDefinition::new("parts", map_parts))
        .unwrap();
    db.blocking_wait_for_indexes().unwrap();
    let st = db.index_stats();
    assert!(st[0].reconciles > 0, "{st:?}");
    let index = db.blocking_storage("parts").unwrap();
    let root = db.root();
    let docs = documents(&root.snapshot().unwrap());
    let want = expected(docs.iter().map(|(k, v)| (&k[..], &v[..])), map_parts);
    assert_eq!(entries(&index), want);
    assert_eq!(docs_of_term(&index, b"x"), vec![b"d2".to_vec()]);
    drop(index);
    drop(db);
    engine.shutdown().unwrap();
}

/// Redefining an index, then dropping it, while its first build is still running: each call
/// returns, and the last definition is exact. (An actor that ended on its abandoned build left
/// the `Stop` of the redefinition unanswered in its mailbox, and the redefinition, or the drop,
/// waited for good.)
#[test]
fn redefining_or_dropping_an_index_during_its_build_returns() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, db) = index_common::open_engine_on(dir.path().join("db"), 2);
    let root = db.root();
    for i in 0..100u64 {
        let mut b = WriteBatch::new();
        for j in 0..1000u64 {
            let n = i * 1000 + j;
            b.put(format!("doc{n:08}"), format!("{}", n * 7919 % 1000));
        }
        root.blocking_write(b).unwrap();
    }
    fn three(_k: &[u8], v: &[u8]) -> Vec<Vec<u8>> {
        vec![v[..v.len().min(3)].to_vec()]
    }
    // Each call must return: run on a thread, waited for with a deadline.
    let within = |what: &str, f: Box<dyn FnOnce() + Send>| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            f();
            let _ = tx.send(());
        });
        rx.recv_timeout(std::time::Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("{what} did not return within 60 s"));
    };
    for round in 0..2 {
        db.blocking_define_index(IndexDefinition::new("ix", three).write_buffer_bytes(1 << 20))
            .unwrap();
        let d = db.clone();
        within(
            &format!("round {round}: a redefinition during the build"),
            Box::new(move || {
                d.blocking_define_index(
                    IndexDefinition::new("ix", three).write_buffer_bytes(4 << 20),
                )
                .unwrap()
            }),
        );
        let d = db.clone();
        within(
            &format!("round {round}: a drop during the build"),
            Box::new(move || futures_lite::future::block_on(d.drop_storage("ix")).unwrap()),
        );
    }
    db.blocking_define_index(IndexDefinition::new("ix", three))
        .unwrap();
    db.blocking_wait_for_indexes().unwrap();
    let docs = documents(&root.snapshot().unwrap());
    let got = entries(&db.blocking_storage("ix").unwrap());
    let want = expected(docs.iter().map(|(k, v)| (&k[..], &v[..])), three);
    assert!(got == want, "{}", diff(&got, &want));
    drop((root, db));
    engine.shutdown().unwrap();
}
