//! Indexes kept by the engine: define one over the root's documents, write documents through the
//! root's handle, wait for the index, and read it with a prefix scan. Run with
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

    // Entries are the term (its 0x00 and 0x01 bytes escaped), 0x00, the document key; a prefix
    // scan for `index_term_prefix(term)` lists exactly that term's documents.
    let index = db.blocking_storage("by_color")?.snapshot()?;
    let green: Vec<String> = index
        .prefix(&index_term_prefix(b"green")[..])?
        .map(|e| {
            e.map(|(k, _)| {
                let (_term, doc) = decode_index_entry(k).expect("an entry key");
                String::from_utf8_lossy(doc).into_owned()
            })
        })
        .collect::<Result<_>>()?;
    assert_eq!(green, ["apple", "leek"]);
    println!("green: {green:?}");
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
