//! Cross-checking an index against the documents: [`check_index`] compares what an index
//! storage holds with what its map function gives for the documents, and reports each kind of
//! disagreement with its count and the first few examples ([`IndexCheckReport`]).
//!
//! Bounded memory: both storages are walked in key order, each with point lookups into the
//! other; nothing grows with the database but the examples kept (at most `max_examples` of each
//! kind). Memory is one document's terms at a time.
//!
//! 1. The documents in key order: map each one, and look each of its entry keys
//!    (`escape(term) ++ 0x00 ++ document key`, `index_key.rs`; terms deduplicated, keys over
//!    [`crate::MAX_KEY_LEN`] skipped as the index actor skips them) up in the index: found, or a
//!    *missing entry*.
//! 2. The index in key order (the applied record at [`super::INDEX_APPLIED_KEY`] skipped): the
//!    document each entry names (after the first 0x00 byte, which ends the escaped term) is
//!    looked up: none exists (or the key is no entry key at all), an *entry without document*;
//!    otherwise the entry names a document, and the entries naming a document beyond the ones
//!    found in step 1 are *stale entries* (their document's current terms do not give them):
//!    the count is exact without mapping again.
//! 3. Only when there are stale entries and examples are wanted: the index again, mapping the
//!    named document of each entry, until enough examples are found.
//!
//! Cost: one map call per document (plus step 3), one index lookup per expected entry and one
//! document lookup per index entry.

use super::index::{call_map, IndexDefinition, INDEX_APPLIED_KEY};
use super::index_key::{decode_index_entry, entry_len, push_entry_key};
use crate::actor_interface::{Error, IndexFailure, ReadTransaction, Result};

/// What [`check_index`] found, for one index.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IndexCheckReport {
    /// The index's name (its branch storage).
    pub name: String,
    /// The txn id of the documents' (root storage's) snapshot checked.
    pub documents_txn: u64,
    /// The root txn the index's snapshot records as applied (`None`: never built).
    pub applied_txn: Option<u64>,
    /// Whether the index snapshot is known to reflect exactly the documents snapshot: by
    /// [`check_index`], when `applied_txn == Some(documents_txn)`; by
    /// [`crate::actors::DatabaseHandle::check_indexes`], when the index actor had applied the
    /// documents' txn. When false the differences may be changes the index has not applied yet
    /// (a crash, writes to the root through the core `Database`, a batch that changed no entry
    /// and so did not write the record): they are not evidence of damage.
    pub in_step: bool,
    /// Documents checked.
    pub documents: u64,
    /// Entries in the index (the applied record excluded).
    pub entries: u64,
    /// Entries the map function gives for the documents (terms whose key would pass
    /// [`crate::MAX_KEY_LEN`] excluded, as the index actor excludes them).
    pub expected_entries: u64,
    /// Terms left out because their key would pass [`crate::MAX_KEY_LEN`].
    pub skipped_terms: u64,
    /// Expected entries that the index lacks.
    pub missing_entries: u64,
    /// Documents with at least one missing entry (documents missing from the index).
    pub documents_missing: u64,
    /// Entries that name no existing document (deleted behind the index's back, or stray).
    pub entries_without_document: u64,
    /// Entries that name an existing document whose current terms do not give them (a changed
    /// document whose old entries stayed).
    pub stale_entries: u64,
    /// Up to `max_examples` entry keys that are missing.
    pub missing_examples: Vec<Vec<u8>>,
    /// Up to `max_examples` entry keys without a document.
    pub without_document_examples: Vec<Vec<u8>>,
    /// Up to `max_examples` stale entry keys.
    pub stale_examples: Vec<Vec<u8>>,
}

impl IndexCheckReport {
    /// True when the index holds exactly the entries the map function gives.
    pub fn is_ok(&self) -> bool {
        self.missing_entries == 0 && self.entries_without_document == 0 && self.stale_entries == 0
    }

    /// Missing, without-document and stale entries together.
    pub fn differences(&self) -> u64 {
        self.missing_entries + self.entries_without_document + self.stale_entries
    }
}

fn failed(def: &IndexDefinition, f: IndexFailure) -> Error {
    Error::IndexPoisoned {
        index: def.name.clone(),
        cause: f,
    }
}

/// Cross-checks the index storage snapshot `index` of `def` against the documents snapshot
/// `documents` (the root storage): entries missing for a document, entries naming no document,
/// entries a document's current terms no longer give. Counts are exact; up to `max_examples`
/// entry keys of each kind are kept. The entries' values are not compared.
///
/// Walks both snapshots in key order with point lookups into the other (see the module docs):
/// memory is bounded by one document's terms and the examples, whatever the database's size.
/// The two snapshots should be of one moment: [`IndexCheckReport::in_step`] says whether the
/// index's applied record shows it.
///
/// Errors: the snapshots' read errors ([`Error::Corruption`] for a damaged page);
/// [`Error::IndexPoisoned`] with [`crate::IndexFailure::MapPanicked`] when the map function
/// panics on a document.
pub fn check_index(
    documents: &ReadTransaction,
    index: &ReadTransaction,
    def: &IndexDefinition,
    max_examples: usize,
) -> Result<IndexCheckReport> {
    let applied_txn = super::index::read_applied(index)?;
    let mut r = IndexCheckReport {
        name: def.name.clone(),
        documents_txn: documents.txn_id(),
        applied_txn,
        in_step: applied_txn == Some(documents.txn_id()),
        ..Default::default()
    };
    let map = &*def.map;
    // 1. Every document's entries, looked up in the index.
    let mut key = Vec::new();
    let mut found = 0u64;
    for item in documents.iter()? {
        let (doc, value) = item?;
        r.documents += 1;
        let mut terms = call_map(map, doc, value).map_err(|f| failed(def, f))?;
        terms.sort_unstable();
        terms.dedup();
        let mut missing = false;
        for t in &terms {
            if entry_len(t, doc).is_none() {
                r.skipped_terms += 1;
                continue;
            }
            key.clear();
            push_entry_key(&mut key, t, doc);
            r.expected_entries += 1;
            if index.get(&key)?.is_some() {
                found += 1;
            } else {
                r.missing_entries += 1;
                missing = true;
                if r.missing_examples.len() < max_examples {
                    r.missing_examples.push(key.clone());
                }
            }
        }
        r.documents_missing += u64::from(missing);
    }
    // 2. Every index entry: does it name a document?
    let mut naming = 0u64;
    for item in index.iter()? {
        let (entry, _) = item?;
        if entry == INDEX_APPLIED_KEY {
            continue;
        }
        r.entries += 1;
        let names = match decode_index_entry(entry) {
            Some((_, doc)) => documents.get(doc)?.is_some(),
            None => false,
        };
        if names {
            naming += 1;
        } else {
            r.entries_without_document += 1;
            if r.without_document_examples.len() < max_examples {
                r.without_document_examples.push(entry.to_vec());
            }
        }
    }
    r.stale_entries = naming.saturating_sub(found);
    // 3. Examples of stale entries: map the named documents again until enough are found.
    let want = (r.stale_entries as usize).min(max_examples);
    if want > 0 {
        for item in index.iter()? {
            let (entry, _) = item?;
            if entry == INDEX_APPLIED_KEY {
                continue;
            }
            let Some((term, doc)) = decode_index_entry(entry) else {
                continue;
            };
            let Some(value) = documents.get(doc)? else {
                continue;
            };
            let terms = call_map(map, doc, value).map_err(|f| failed(def, f))?;
            if !terms.contains(&term) {
                r.stale_examples.push(entry.to_vec());
                if r.stale_examples.len() >= want {
                    break;
                }
            }
        }
    }
    Ok(r)
}
