//! Index queries as calls: `DatabaseHandle::query`, `query_count`, `query_documents` and
//! `query_terms` answer from an index's storage what a hand-made prefix scan of its entries
//! would, never list the index's applied record, read an index left on disk that this process
//! has not defined, and refuse a name that is no index.
//! Terms hold the escaped bytes 0x00 and 0x01 and one term is a prefix of another.

use std::collections::BTreeMap;
use std::ops::Bound;

use omnibus::actors::IndexDefinition;
use omnibus::Error;

use crate::common::index as index_common;

fn map_term(_key: &[u8], doc: &[u8]) -> Vec<Vec<u8>> {
    // `term=` holds the rest of the document, whatever its bytes.
    doc.strip_prefix(b"term=")
        .map(|t| vec![t.to_vec()])
        .unwrap_or_default()
}

#[test]
fn queries_answer_what_the_index_holds() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, db) = index_common::open_engine(dir.path().join("db"));
    db.blocking_define_index(IndexDefinition::new("by_term", map_term))
        .unwrap();
    let root = db.root();
    let terms: [&[u8]; 6] = [b"", b"a", b"a\0", b"a\x01b", b"ab", b"b"];
    // Model: term -> document keys.
    let mut model: BTreeMap<Vec<u8>, Vec<Vec<u8>>> = BTreeMap::new();
    for i in 0..300u32 {
        let t = terms[i as usize % terms.len()];
        let key = format!("doc-{i:04}").into_bytes();
        let mut doc = b"term=".to_vec();
        doc.extend_from_slice(t);
        root.blocking_put(key.clone(), doc).unwrap();
        model.entry(t.to_vec()).or_default().push(key);
    }
    // Moved to another term, and deleted: the index follows.
    root.blocking_put(b"doc-0000".to_vec(), b"term=b".to_vec())
        .unwrap();
    model
        .get_mut(&b""[..])
        .unwrap()
        .retain(|k| k != b"doc-0000");
    model.get_mut(&b"b"[..]).unwrap().push(b"doc-0000".to_vec());
    model.get_mut(&b"b"[..]).unwrap().sort();
    assert!(root.blocking_delete(b"doc-0001".to_vec()).unwrap());
    model
        .get_mut(&b"a"[..])
        .unwrap()
        .retain(|k| k != b"doc-0001");
    db.blocking_wait_for_index("by_term").unwrap();

    for t in terms {
        let want = &model[t];
        assert_eq!(
            &db.blocking_query("by_term", t).unwrap(),
            want,
            "term {t:?}"
        );
        assert_eq!(
            db.blocking_query_count("by_term", t).unwrap(),
            want.len() as u64
        );
        let docs = db.blocking_query_documents("by_term", t).unwrap();
        assert_eq!(docs.len(), want.len());
        for (k, v) in &docs {
            assert!(want.contains(k));
            assert_eq!(&v[5..], t, "the document of {k:?}");
        }
    }
    // The empty term's keys start where the applied record (the key 0x00) is: it is no answer.
    assert!(db
        .blocking_query("by_term", b"")
        .unwrap()
        .iter()
        .all(|k| k.starts_with(b"doc-")));
    assert_eq!(
        db.blocking_query("by_term", b"none").unwrap(),
        Vec::<Vec<u8>>::new()
    );

    // Ranges of terms, in term then key order, with a limit and a continuation.
    let all: Vec<(Vec<u8>, Vec<u8>)> = model
        .iter()
        .flat_map(|(t, ks)| ks.iter().map(move |k| (t.clone(), k.clone())))
        .collect();
    assert_eq!(
        db.blocking_query_terms("by_term", Bound::Unbounded, Bound::Unbounded, usize::MAX)
            .unwrap(),
        all
    );
    let ranged: Vec<_> = all
        .iter()
        .filter(|(t, _)| t.as_slice() > &b"a"[..] && t.as_slice() <= &b"ab"[..])
        .cloned()
        .collect();
    assert_eq!(
        db.blocking_query_terms(
            "by_term",
            Bound::Excluded(&b"a"[..]),
            Bound::Included(&b"ab"[..]),
            usize::MAX
        )
        .unwrap(),
        ranged
    );
    let first = db
        .blocking_query_terms("by_term", Bound::Unbounded, Bound::Unbounded, 7)
        .unwrap();
    assert_eq!(first, all[..7]);
    assert!(db
        .blocking_query_terms("by_term", Bound::Unbounded, Bound::Unbounded, 0)
        .unwrap()
        .is_empty());

    // A name that is no index (no storage, an empty name, a branch that is no index) is a
    // typed error.
    let plain = db.blocking_create_storage("plain").unwrap();
    plain.blocking_put(b"\0".to_vec(), b"x".to_vec()).unwrap();
    for name in ["by_nothing", "", "plain"] {
        assert!(
            matches!(db.blocking_query(name, b"a"), Err(Error::InvalidOptions(_))),
            "{name:?}"
        );
    }
    drop((plain, root, db));
    engine.shutdown().unwrap();

    // Reopened by a process that has not defined the index (yet): it is read as it is on disk
    // (such a query was refused as an undefined index).
    let (engine, db) = index_common::open_engine(dir.path().join("db"));
    for t in terms {
        assert_eq!(
            &db.blocking_query("by_term", t).unwrap(),
            &model[t],
            "term {t:?}"
        );
    }
    drop(db);
    engine.shutdown().unwrap();
}
