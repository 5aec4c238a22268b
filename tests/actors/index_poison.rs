//! A map function that panics poisons its index only. Two indexes; the second panics on a
//! document whose color is `black`. After such a put: `wait_for_indexes` returns the typed
//! error naming the index and the document, `index_stats` shows it poisoned, while the
//! documents and the other index keep working (later puts are stored and indexed by it).
//! Defining the poisoned index again with a fixed map function rebuilds it.

use omnibus::actors::{IndexDefinition, IndexState};
use omnibus::{Error, IndexFailure};

use crate::common::index as index_common;
use index_common::{diff, documents, entries, expected, map_color};

fn fragile(key: &[u8], doc: &[u8]) -> Vec<Vec<u8>> {
    if index_common::field(doc, "color") == Some(b"black") {
        panic!("cannot index black documents");
    }
    map_color(key, doc)
}

#[test]
fn a_panicking_map_function_poisons_only_its_index() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, db) = index_common::open_engine(dir.path().join("db"));
    db.blocking_define_index(IndexDefinition::new("good", map_color))
        .unwrap();
    db.blocking_define_index(IndexDefinition::new("fragile", fragile))
        .unwrap();
    let root = db.root();
    root.blocking_put("d1", "color=red").unwrap();
    db.blocking_wait_for_indexes().unwrap();
    root.blocking_put("d2", "color=black").unwrap();
    let err = db.blocking_wait_for_indexes().unwrap_err();
    match &err {
        Error::IndexPoisoned {
            index,
            cause: IndexFailure::MapPanicked { key, message },
        } => {
            assert_eq!(index, "fragile");
            assert_eq!(key, b"d2");
            assert_eq!(message, "cannot index black documents");
        }
        e => panic!("{e:?}"),
    }
    assert!(err.to_string().contains("fragile"), "{err}");

    // The documents and the other index carry on.
    root.blocking_put("d3", "color=blue").unwrap();
    root.blocking_put("d4", "color=black").unwrap();
    assert_eq!(
        root.blocking_get("d4").unwrap(),
        Some(b"color=black".to_vec())
    );
    let good = db.blocking_storage("good").unwrap();
    // Waiting for all indexes fails at once on the poisoned one; the healthy one can be waited
    // for by name (before `wait_for_index`, only polling `index_stats` could).
    assert!(db.blocking_wait_for_indexes().is_err());
    db.blocking_wait_for_index("good").unwrap();
    let s = db
        .index_stats()
        .into_iter()
        .find(|s| s.name == "good")
        .unwrap();
    assert!(matches!(s.state, IndexState::Current), "{s:?}");
    assert_eq!(s.lag_txns, 0, "{s:?}");
    assert!(matches!(
        db.blocking_wait_for_index("fragile"),
        Err(Error::IndexPoisoned { .. })
    ));
    assert!(matches!(
        db.blocking_wait_for_index("no_such_index"),
        Err(Error::InvalidOptions(_))
    ));
    let docs = documents(&root.snapshot().unwrap());
    let want = expected(docs.iter().map(|(k, v)| (&k[..], &v[..])), map_color);
    let got = entries(&good);
    assert!(got == want, "{}", diff(&got, &want));
    let s = db
        .index_stats()
        .into_iter()
        .find(|s| s.name == "fragile")
        .unwrap();
    match &s.state {
        IndexState::Poisoned(Error::IndexPoisoned { index, .. }) => assert_eq!(index, "fragile"),
        other => panic!("{other:?}"),
    }
    // Nothing of the failed batch was written: only d1's entry.
    assert_eq!(s.entries, 1, "{s:?}");

    // Defined again with a fixed map function, it is rebuilt and waits work again.
    db.blocking_define_index(IndexDefinition::new("fragile", map_color))
        .unwrap();
    db.blocking_wait_for_indexes().unwrap();
    let got = entries(&db.blocking_storage("fragile").unwrap());
    assert!(got == want, "{}", diff(&got, &want));
    drop((root, good, db));
    engine.shutdown().unwrap();
}
