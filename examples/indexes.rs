//! Indexes kept by the engine: define one over the root's documents, write documents through the
//! root's handle, wait for the index, and query it (and read it with a prefix scan). Run with
//! `cargo run --example indexes`.

use omnibus::actors::{
    decode_index_entry, index_term_prefix, Engine, EngineOptions, IndexDefinition, IndexState,
};
use omnibus::{Options, Result};

fn main() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("omnibus-indexes-{}", std::process::id()));
    let engine = Engine::start(EngineOptions {
        executors: Some(2),
        ..EngineOptions::default()
    })?;
    let db = engine.blocking_open_database(&dir, Options::default())?;
    // Every process defines its indexes after opening (the map function is code): the terms of
    // a document `color=C` are `[C]`.
    db.blocking_define_index(IndexDefinition::new(
        "by_color",
        |_key: &[u8], doc: &[u8]| {
            doc.strip_prefix(b"color=")
                .map(|c| vec![c.to_vec()])
                .unwrap_or_default()
        },
    ))?;
    let root = db.root();
    root.blocking_put("apple", "color=red")?;
    root.blocking_put("cherry", "color=red")?;
    root.blocking_put("leek", "color=green")?;
    root.blocking_put("apple", "color=green")?; // moves apple in the index
    db.blocking_wait_for_indexes()?; // every put above is in the index now

    // Queries as calls: the document keys of a term, the documents themselves, a count.
    let green: Vec<String> = db
        .blocking_query("by_color", b"green")?
        .into_iter()
        .map(|k| String::from_utf8_lossy(&k).into_owned())
        .collect();
    assert_eq!(green, ["apple", "leek"]);
    println!("green: {green:?}");
    assert_eq!(db.blocking_query_count("by_color", b"red")?, 1);
    for (key, doc) in db.blocking_query_documents("by_color", b"green")? {
        println!(
            "{}: {}",
            String::from_utf8_lossy(&key),
            String::from_utf8_lossy(&doc)
        );
    }

    // Underneath, entries are the term (its 0x00 and 0x01 bytes escaped), 0x00, the document
    // key: a prefix scan for `index_term_prefix(term)` lists exactly that term's documents.
    let index = db.blocking_storage("by_color")?.snapshot()?;
    let red: Vec<Vec<u8>> = index
        .prefix(&index_term_prefix(b"red")[..])?
        .map(|e| e.map(|(k, _)| decode_index_entry(k).expect("an entry key").1.to_vec()))
        .collect::<Result<_>>()?;
    assert_eq!(red, db.blocking_query("by_color", b"red")?);
    for s in db.index_stats() {
        assert!(matches!(s.state, IndexState::Current));
        println!(
            "{}: {} entries, applied root txn {}",
            s.name, s.entries, s.applied_txn
        );
    }
    drop((index, root, db));
    engine.shutdown()?;
    std::fs::remove_dir_all(&dir).expect("remove the example directory");
    Ok(())
}
