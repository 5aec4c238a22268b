//! Shared by the index tests: documents of the form `color=C;tags=T1,T2;n=N`, three map
//! functions over them, the expected entries of an index computed from documents, and the
//! entries an index storage holds.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};

use omnibus::actors::{DatabaseHandle, Engine, EngineOptions, IndexDefinition, INDEX_APPLIED_KEY};
use omnibus::{Options, ReadTransaction, Storage};
use rand::Rng;

/// An engine of two executors with the database at `path` open (default options).
pub fn open_engine(path: impl AsRef<std::path::Path>) -> (Engine, DatabaseHandle) {
    open_engine_on(path, 2)
}

/// An engine of `executors` executors with the database at `path` open (default options).
pub fn open_engine_on(
    path: impl AsRef<std::path::Path>,
    executors: usize,
) -> (Engine, DatabaseHandle) {
    let engine = Engine::start(EngineOptions {
        executors: Some(executors),
        ..EngineOptions::default()
    })
    .unwrap();
    let db = engine
        .blocking_open_database(path, Options::default())
        .unwrap();
    (engine, db)
}

/// The value of field `name` of a document.
pub fn field<'a>(doc: &'a [u8], name: &str) -> Option<&'a [u8]> {
    doc.split(|b| *b == b';').find_map(|part| {
        let (k, v) = part.split_at(part.iter().position(|b| *b == b'=')?);
        (k == name.as_bytes()).then(|| &v[1..])
    })
}

/// One term: the color.
pub fn map_color(_key: &[u8], doc: &[u8]) -> Vec<Vec<u8>> {
    field(doc, "color")
        .map(|c| vec![c.to_vec()])
        .unwrap_or_default()
}

/// Every tag (none, one or several; repeats allowed).
pub fn map_tags(_key: &[u8], doc: &[u8]) -> Vec<Vec<u8>> {
    match field(doc, "tags") {
        Some(t) if !t.is_empty() => t.split(|b| *b == b',').map(<[u8]>::to_vec).collect(),
        _ => Vec::new(),
    }
}

/// `even` for documents whose n is even, nothing otherwise.
pub fn map_even(_key: &[u8], doc: &[u8]) -> Vec<Vec<u8>> {
    let n: u64 = field(doc, "n")
        .and_then(|n| std::str::from_utf8(n).ok()?.parse().ok())
        .unwrap_or(1);
    if n.is_multiple_of(2) {
        vec![b"even".to_vec()]
    } else {
        Vec::new()
    }
}

pub type Map = fn(&[u8], &[u8]) -> Vec<Vec<u8>>;

/// The three indexes: (name, map function).
pub const INDEXES: [(&str, Map); 3] = [
    ("by_color", map_color),
    ("by_tag", map_tags),
    ("even", map_even),
];

/// The definitions of [`INDEXES`], with a few batch settings varied, and two of the three
/// with a write buffer: `by_tag`'s small (its commits apply it when it is full), `even`'s
/// large (applied when aged, at a backup or at close).
pub fn definitions() -> Vec<IndexDefinition> {
    vec![
        IndexDefinition::new("by_color", map_color),
        IndexDefinition::new("by_tag", map_tags)
            .max_batch_changes(7)
            .write_buffer_bytes(16 << 10),
        IndexDefinition::new("even", map_even)
            .min_batch_interval(std::time::Duration::from_millis(3))
            .write_buffer_bytes(1 << 20),
    ]
}

const COLORS: [&str; 5] = ["red", "green", "blue", "cyan", "black"];
const TAGS: [&str; 6] = ["a", "b", "c", "dd", "eee", "f"];

/// A random document.
pub fn random_doc(rng: &mut impl Rng) -> Vec<u8> {
    let color = COLORS[rng.random_range(0..COLORS.len())];
    let tags: Vec<&str> = (0..rng.random_range(0..4))
        .map(|_| TAGS[rng.random_range(0..TAGS.len())])
        .collect();
    format!(
        "color={color};tags={};n={}",
        tags.join(","),
        rng.random_range(0..100u32)
    )
    .into_bytes()
}

/// The entries index `map` must hold for `docs`.
pub fn expected<'a>(
    docs: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
    map: Map,
) -> BTreeSet<Vec<u8>> {
    let mut out = BTreeSet::new();
    for (k, v) in docs {
        for t in map(k, v) {
            out.insert(omnibus::actors::index_entry_key(&t, k));
        }
    }
    out
}

/// The entries of a model's documents.
pub fn expected_of_model(model: &BTreeMap<Vec<u8>, Vec<u8>>, map: Map) -> BTreeSet<Vec<u8>> {
    expected(model.iter().map(|(k, v)| (&k[..], &v[..])), map)
}

/// The documents of a root snapshot.
pub fn documents(root: &ReadTransaction) -> BTreeMap<Vec<u8>, Vec<u8>> {
    root.iter()
        .unwrap()
        .map(|e| {
            let (k, v) = e.unwrap();
            (k.to_vec(), v.to_vec())
        })
        .collect()
}

/// A snapshot of a storage, through the core's handle or an actor handle.
pub trait Snapshot {
    fn snap(&self) -> ReadTransaction;
}

impl Snapshot for Storage {
    fn snap(&self) -> ReadTransaction {
        self.begin_read().unwrap()
    }
}

impl Snapshot for omnibus::actors::StorageHandle {
    fn snap(&self) -> ReadTransaction {
        self.snapshot().unwrap()
    }
}

/// The entries an index storage holds (the applied record left out); every value is empty.
pub fn entries(index: &impl Snapshot) -> BTreeSet<Vec<u8>> {
    let r = index.snap();
    let mut out = BTreeSet::new();
    for e in r.iter().unwrap() {
        let (k, v) = e.unwrap();
        if k == INDEX_APPLIED_KEY {
            continue;
        }
        assert!(v.is_empty(), "entry {k:?} has a value");
        out.insert(k.to_vec());
    }
    out
}

/// Describes the difference of two entry sets (for assertion messages).
pub fn diff(got: &BTreeSet<Vec<u8>>, want: &BTreeSet<Vec<u8>>) -> String {
    let extra: Vec<String> = got
        .difference(want)
        .take(5)
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .collect();
    let missing: Vec<String> = want
        .difference(got)
        .take(5)
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .collect();
    format!(
        "{} entries, {} expected; extra (first 5) {extra:?}; missing (first 5) {missing:?}",
        got.len(),
        want.len()
    )
}
