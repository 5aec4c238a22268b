//! An index's definition and its applied record: [`crate::actors::IndexDefinition`] (name, map function,
//! rest between batches, reconcile memory) and the reserved key 0x00 holding the root txn the
//! index has applied (design.md 10.1).

use crate::actor_interface::{Corruption, Error, ReadTransaction, Result};
use std::sync::Arc;
use std::time::Duration;

/// The reserved key of an index storage holding the root txn id the index has applied up to:
/// the single byte `0x00`. Entry keys ([`crate::actors::index_entry_key`]: `escape(term) ++ 0x00 ++
/// document key`, document keys at least 1 byte) are at least 2 bytes, so it is never an entry.
/// The snapshots of an index storage the engine runs leave it out of every view (`len`,
/// `get`, `iter`, `range`, `prefix`, `first`, the handles' reads: design.md 10.1); read it
/// with [`index_applied_txn`]. So do those of `omnibus::Database` without the engine: it marks
/// every branch holding an applied record at open. A branch directory opened alone with
/// `omnibus::Storage::open` still shows it as its first key.
pub const INDEX_APPLIED_KEY: &[u8] = &[0];

/// The applied record's magic before terms were escaped (the current one, version 2, is the
/// core's: entry keys with escaped terms, `index_key.rs`). A version-1 record (terms stored as
/// they were) reads as no record, so that the index is reconciled once into escaped keys.
pub(super) const APPLIED_MAGIC_V1: &[u8; 8] = crate::actor_interface::INDEX_RECORD_MAGIC_V1;

/// Smallest reconcile memory accepted (bytes).
pub(super) const MIN_RECONCILE_MEMORY: usize = 64 << 10;

/// The map function of an index: the terms of the document with key `key` and value `value`.
pub type MapFn = dyn Fn(&[u8], &[u8]) -> Vec<Vec<u8>> + Send + Sync + 'static;

/// An index: a branch storage kept by the engine from the documents' change feed.
///
/// `name` is the branch storage (`Indexes/NAME`); `map` gives a document's terms. For each term
/// `t` of document `k`, the index holds the key [`crate::actors::index_entry_key`]`(t, k)` =
/// `escape(t) ++ 0x00 ++ k` with an empty value (the escape turns 0x00 into `01 01` and 0x01
/// into `01 02`; any other byte is kept, so most terms are stored as they are): a prefix scan
/// for [`crate::actors::index_term_prefix`]`(t)` lists exactly the documents whose terms include `t`,
/// whatever bytes the terms hold. A term whose key would pass [`crate::MAX_KEY_LEN`] (1,024)
/// bytes is skipped and counted ([`crate::actors::IndexStats::skipped_terms`]). The map function must be deterministic
/// (the same terms for the same document, in every process): entries are removed by mapping the
/// old value again, and the index is resumed without rebuilding when the same name is defined
/// after a reopen. If it changes, define the index with [`crate::actors::IndexDefinition::rebuild`].
#[derive(Clone)]
pub struct IndexDefinition {
    pub(crate) name: String,
    pub(crate) map: Arc<MapFn>,
    pub(crate) min_batch_interval: Duration,
    pub(crate) max_batch_interval: Option<Duration>,
    pub(crate) max_batch_changes: usize,
    pub(crate) reconcile_memory: usize,
    pub(crate) rebuild: bool,
    pub(crate) write_buffer_bytes: u64,
    pub(crate) mode: IndexMode,
}

/// When an index's entries are committed ([`IndexDefinition::mode`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum IndexMode {
    /// After the documents: the index's actor applies the root's durable commits from its
    /// change feed in batches (RavenDB's indexes), so a query may miss the latest documents
    /// until [`crate::actors::DatabaseHandle::wait_for_indexes`] returns. The root's commits
    /// never wait for the index. The default.
    #[default]
    Asynchronous,
    /// With the documents: every root commit through the engine carries the index's entries
    /// and its applied record, committed with the documents as one group through the shared
    /// journal (docs/design.md 3.11), so the index never lags the root and
    /// `wait_for_indexes` returns at once for it. Each root commit costs one more
    /// transaction per synchronous index (prepared on the index storage's own actor, in
    /// parallel) and one larger journal record; a root transaction and its index entries
    /// together are held to [`crate::MAX_GROUP_BYTES`] of journal record, and a database to
    /// 255 synchronous indexes ([`crate::MAX_GROUP_STORAGES`] storages a group). A map function
    /// that panics fails the root transaction that reached it, with every write the root's
    /// actor merged into it (each caller gets [`crate::Error::IndexPoisoned`]; nothing is
    /// written, the other callers may retry), and poisons the index; later root commits go on
    /// without it. Shared journal only.
    Synchronous,
}

impl std::fmt::Debug for IndexDefinition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IndexDefinition")
            .field("name", &self.name)
            .field("min_batch_interval", &self.min_batch_interval)
            .field("max_batch_interval", &self.max_rest())
            .field("max_batch_changes", &self.max_batch_changes)
            .field("reconcile_memory", &self.reconcile_memory)
            .field("rebuild", &self.rebuild)
            .field("write_buffer_bytes", &self.write_buffer_bytes)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl IndexDefinition {
    /// An index named `name` (its branch storage; the rules of
    /// [`crate::Database::validate_storage_name`], checked by `define_index`) with map function
    /// `map`. Defaults: at least 250 ms between the starts of two batches, at most 16,384 document
    /// changes per batch, 32 MiB of reconcile memory, no forced rebuild, a write buffer of the
    /// engine's share ([`Self::DEFAULT_WRITE_BUFFER_BYTES`]).
    pub fn new(
        name: impl Into<String>,
        map: impl Fn(&[u8], &[u8]) -> Vec<Vec<u8>> + Send + Sync + 'static,
    ) -> IndexDefinition {
        IndexDefinition {
            name: name.into(),
            map: Arc::new(map),
            min_batch_interval: Self::DEFAULT_MIN_BATCH_INTERVAL,
            max_batch_interval: None,
            max_batch_changes: 16_384,
            reconcile_memory: 32 << 20,
            rebuild: false,
            write_buffer_bytes: Self::DEFAULT_WRITE_BUFFER_BYTES,
            mode: IndexMode::Asynchronous,
        }
    }

    /// When the index's entries are committed: after the documents, from the change feed (the
    /// default), or with them in the same atomic group ([`IndexMode`]). A synchronous index is
    /// first built (or caught up) as an asynchronous one, then turned synchronous between two
    /// root transactions.
    pub fn mode(mut self, mode: IndexMode) -> IndexDefinition {
        self.mode = mode;
        self
    }

    /// The index's [`IndexMode`].
    pub fn index_mode(&self) -> IndexMode {
        self.mode
    }

    /// The index's name (its branch storage).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The default of [`crate::actors::IndexDefinition::min_batch_interval`]: 250 ms. Measured with
    /// `omnibus bench shop` (1 + 100 storages, 2 cores, 15 s): every document's 100 index
    /// entries land in leaves all over each index, so an index transaction copies about one
    /// leaf per entry when it is small. Starting each batch as soon as changes were queued cost
    /// about 320 µs of CPU per document; resting 100 ms, 246 µs (index lag p99 0.6 s); 250 ms,
    /// 181 µs (lag p99 1.5 s); 500 ms, 171 µs (docs/BENCHMARKS.md).
    pub const DEFAULT_MIN_BATCH_INTERVAL: Duration = Duration::from_millis(250);

    /// Least time between the starts of two batches: changes accumulate meanwhile, giving
    /// fewer, larger index transactions for more lag. A batch starts early when the index's
    /// mailbox is half full (so resting never holds up the documents), when
    /// `wait_for_indexes` waits on it, or when the index is stopped (`Engine::shutdown`, the
    /// engine dropped, `drop_index`: none waits for a rest). Default [`Self::DEFAULT_MIN_BATCH_INTERVAL`]; zero
    /// starts each batch as soon as changes are queued.
    ///
    /// The rest adapts between this and [`Self::max_batch_interval`]: after a batch whose
    /// transaction copied more than one page per 4 entries (a large index whose entries land in
    /// leaves all over it: each copied leaf costs an 8 KiB copy, its checksum, its journal diff
    /// and a page in the next flush, several times an entry's own cost), the next rest doubles;
    /// after one that copied fewer than one page per 8 entries, it halves, down to this
    /// interval. Larger batches put more entries in each copied leaf.
    pub fn min_batch_interval(mut self, interval: Duration) -> IndexDefinition {
        self.min_batch_interval = interval;
        self
    }

    /// Longest rest between the starts of two batches (see [`Self::min_batch_interval`] for
    /// when the rest grows): bounds the index lag that resting adds. Default: 4 times the
    /// minimum (1 s for the default 250 ms); a value under the minimum counts as the minimum.
    /// Measured with `omnibus bench shop` (2 cores, 100 indexes, 20 s): resting 250 ms cost
    /// 319 µs of CPU per document (index lag p99 1.1 s), 1 s 208 µs (lag p99 1.7 s)
    /// (docs/BENCHMARKS.md).
    pub fn max_batch_interval(mut self, interval: Duration) -> IndexDefinition {
        self.max_batch_interval = Some(interval);
        self
    }

    /// The longest rest in effect: [`Self::max_batch_interval`] if set (at least the minimum),
    /// else 4 times [`Self::min_batch_interval`].
    pub(super) fn max_rest(&self) -> Duration {
        self.max_batch_interval
            .unwrap_or(self.min_batch_interval.saturating_mul(4))
            .max(self.min_batch_interval)
    }

    /// Document changes merged into one index transaction at most (at least one root commit is
    /// always taken whole). Default 16,384; values below 1 count as 1.
    pub fn max_batch_changes(mut self, changes: usize) -> IndexDefinition {
        self.max_batch_changes = changes.max(1);
        self
    }

    /// Bytes of expected entries a build or reconcile holds in memory at most (keys plus 16
    /// bytes each); beyond it, it works in several passes over the documents. Default 32 MiB;
    /// at least 64 KiB.
    pub fn reconcile_memory(mut self, bytes: usize) -> IndexDefinition {
        self.reconcile_memory = bytes.max(MIN_RECONCILE_MEMORY);
        self
    }

    /// The default of [`Self::write_buffer_bytes`]: 64 MiB asked, so the engine's share
    /// decides (3.4 MiB for each of 100 indexes under the default 512 MiB budget). Measured
    /// with the main job's 100 scattered indexes (docs/BENCHMARKS.md, "Buffered indexes in
    /// `bench shop`"): buffered, they write less than half the bytes per document of unbuffered
    /// ones in the first minute and a sixth at 600 s, at less CPU per document, within the
    /// memory budget. `write_buffer_bytes(0)` turns the buffer off for an index whose entries
    /// should reach its tree at every batch.
    pub const DEFAULT_WRITE_BUFFER_BYTES: u64 = 64 << 20;

    /// Bytes of index entries the index storage buffers before its commits apply them to its
    /// tree ([`crate::Options::write_buffer_bytes`], docs/design.md section 16): an index
    /// batch is journaled as one logical record and its leaves are written once per many
    /// entries instead of once per batch. The engine gives each buffered index at most an equal
    /// share of two thirds of its memory budget
    /// ([`crate::actors::EngineOptions::memory_budget_bytes`]; the buffers count in it with
    /// the page images), so 100 indexes under the default 512 MiB budget get 3.4 MiB each;
    /// when that share is under 64 KiB (more than 5,461 buffered indexes under the default
    /// budget, or 42 under a 4 MiB one), none is buffered. The engine applies the buffer in
    /// steps of at most 1/16 of the budget in pages ([`crate::Storage::set_apply_step_pages`]),
    /// so a batch of any size is buffered unless it alone passes the buffer's size.
    /// 0: no buffer, every batch writes its leaves. Default
    /// [`Self::DEFAULT_WRITE_BUFFER_BYTES`].
    pub fn write_buffer_bytes(mut self, bytes: u64) -> IndexDefinition {
        self.write_buffer_bytes = bytes;
        self
    }

    /// Reconcile the index with the documents even if its applied record is current (after the
    /// map function changed).
    pub fn rebuild(mut self) -> IndexDefinition {
        self.rebuild = true;
        self
    }
}

/// The applied txn recorded in an index storage's snapshot: `Some(txn)` once the index has been
/// built, `None` for a storage that was never an index or whose first build has not finished.
///
/// Errors: corruption reading the page; [`Error::Corruption`] when the reserved key holds a value
/// that is not an applied record.
pub fn index_applied_txn(index: &ReadTransaction) -> Result<Option<u64>> {
    match crate::actor_interface::get_index_record(index, INDEX_APPLIED_KEY)? {
        None => Ok(None),
        // Built before terms were escaped: to be reconciled, as an index never built.
        Some(v) if is_applied_v1(v) => Ok(None),
        Some(v) => decode_applied(v).map(Some).ok_or_else(|| {
            Error::Corruption(Corruption {
                file: "".into(),
                page: None,
                offset: None,
                what: format!(
                    "the reserved index key 0x00 holds {} bytes that are not an applied-txn record",
                    v.len()
                ),
            })
        }),
    }
}

/// The applied record of an index storage's snapshot; a value at the reserved key that is not
/// one counts as none.
pub(crate) fn read_applied(index: &ReadTransaction) -> Result<Option<u64>> {
    Ok(
        crate::actor_interface::get_index_record(index, INDEX_APPLIED_KEY)?
            .and_then(decode_applied),
    )
}

pub(super) fn decode_applied(v: &[u8]) -> Option<u64> {
    crate::actor_interface::decode_index_record(v)
}

/// Whether `v` is an applied record of the first version (entries with unescaped terms).
pub(super) fn is_applied_v1(v: &[u8]) -> bool {
    v.len() == 16 && &v[..8] == APPLIED_MAGIC_V1
}

pub(crate) fn applied_record(txn: u64) -> [u8; 16] {
    crate::actor_interface::index_record(txn)
}
