//! The index actor: one per defined index, keeping a branch storage current from the change
//! feed of the root storage (the documents), as RavenDB's indexes.
//!
//! An index is an [`IndexDefinition`]: a name (its branch storage) and a map function giving
//! the *terms* of a document (`Fn(document key, document value) -> Vec<term>`). Its storage
//! holds one entry per (term, document): key `escape(term) ++ 0x00 ++ document key`
//! (`index_key.rs`: the escaped term holds no 0x00, so no term's entries are another's), empty
//! value, plus
//! one reserved entry, [`INDEX_APPLIED_KEY`] (the single byte `0x00`, which no entry can be:
//! document keys are at least one byte, so every entry key is at least two bytes long), whose
//! value records the root txn id the index has applied up to ([`index_applied_txn`]). That
//! record is written in the same transaction as the entries it covers.
//!
//! Messages in ([`IndexMsg`], one bounded flume mailbox per index of
//! [`crate::actors::EngineOptions::index_queue_capacity`] root commits): `Commit(Arc<RootCommit>)`
//! from the root's storage actor, once per durable root transaction that has any index (one
//! `Arc` shared by every index: one queue hop per root transaction, not per document), holding
//! each changed document's key, old value and new value; `Stop { reply }` from the engine.
//! Messages out: one [`StorageMsg::Apply`] job per batch to the index storage's own storage
//! actor (same executor: both are placed by the same hash of the name), which runs it in its
//! write transaction; jobs for the build's scans and diffs to the background I/O lane.
//!
//! State owned: the index's pending batch, the applied txn, and its shared progress
//! ([`IndexShared`]: state, counters, lag histogram, and the waiters of
//! `DatabaseHandle::wait_for_indexes`). It never writes the index storage itself: the storage
//! actor stays its only writer.
//!
//! Loop: first catch up. The root actor answered the registration with a snapshot of its last
//! commit (txn `R`; every later commit comes through the mailbox). If the index's applied record
//! is not `R` (a new index, a crash between a root commit and the index's, writes to the root
//! that bypassed the engine), *reconcile*: scan the snapshot, map every document, and diff the
//! expected entries against the index's entries, writing the difference in bounded batches, then
//! record `R`. The expected entries are held sorted in one buffer of at most
//! [`IndexDefinition::reconcile_memory`] bytes: when they do not fit, a pass keeps the smallest
//! keys and diffs only that key range, and the next pass starts where it stopped (each pass
//! rescans the snapshot). Meanwhile live commits wait in the mailbox. Then follow the feed: wait
//! for a commit, take every commit already queued (up to [`IndexDefinition::max_batch_changes`]
//! document changes), skip those at or below the applied txn, map each change's old and new
//! value, keep the terms that left (delete) and came (put), sort the keys (keeping the last
//! operation of a key), and apply them and the applied record as one transaction (several when
//! the batch copies more pages than 1/16 of the engine's memory budget, 64 at least: each
//! transaction but the last commits a key range of the sorted batch and deletes the applied
//! record, so a crash between them leaves no record and the next definition reconciles; the last
//! one writes the record). Keys are built
//! in one buffer per batch: no allocation per entry. A batch that changes no entry writes
//! nothing (the record catches up with the next batch that does, or at stop). If the txn ids of
//! the commits are not consecutive from the applied one, the root was committed outside the
//! engine (the core `Database`): reconcile from a fresh root snapshot first (every commit up to
//! it is in it, every later one comes through the mailbox). Between two batches the actor
//! rests: [`IndexDefinition::min_batch_interval`] at first, doubled after a batch whose
//! transaction copied more than one page per 4 entries and halved after one that copied fewer
//! than one per 8, within [`IndexDefinition::max_batch_interval`] (so a large index with
//! scattered terms gets larger batches, each copied leaf serving more entries); a mailbox half
//! full or a `wait_for_indexes` caller cuts the rest short.
//!
//! Invariants: the applied record and the entries it covers commit together (a batch split in
//! several transactions has no record until its last one), and every root
//! commit after the applied one reaches the mailbox in txn order, so a durable index state with
//! record `A` holds exactly the entries the map function gives for the root's documents at txn
//! `A`; after a crash the root is at `R >= A` for immediate root commits (an index is fed only
//! acknowledged root commits), while a crash that loses acknowledged `Durability::Eventual` root
//! commits can leave `R < A` (the index applied commits the root lost): either way the applied
//! record differs from `R` and reconciling from `R` fixes it whatever the index holds (a reconcile interrupted by a crash
//! left the record at `A`, so the next definition reconciles again). `wait_for_indexes` returns
//! only once the index's applied txn reaches every root commit acknowledged before the call. A
//! stored index entry never has a key over [`crate::MAX_KEY_LEN`]: longer ones are skipped and
//! counted ([`IndexStats::skipped_terms`]).
//!
//! Queue bounds: the mailbox holds at most `index_queue_capacity` root commits; when it is full
//! the root's storage actor waits before answering its writers (back-pressure on the documents,
//! design.md invariant I10). So while an index builds, the documents accept that many commits and
//! then wait for the build. At most one build per executor runs at a time (a shared pool of
//! slots), so builds hold at most that many expected-entry buffers.
//!
//! Failure: a map function that panics (caught with `catch_unwind`) or a failed read or write
//! poisons this index only ([`Error::IndexPoisoned`] with an [`IndexFailure`]): its actor
//! stops, the root drops its feed, `wait_for_indexes` and [`IndexStats::state`] report the
//! error, and nothing of the failed batch is written. Defining the index again starts a new
//! actor, which reconciles. A clean shutdown lets every index apply what is queued and record
//! its applied txn, so the next definition needs no reconcile; a build in progress at shutdown
//! is abandoned (the next definition reconciles).

use std::cmp::Ordering;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::index_key;
use super::io_lane::IoLane;
use super::messages::{ApplyJob, DocumentChange, IndexMsg, RootCommit, RootFeed, StorageMsg};
use super::storage::StorageHandle;
use crate::error::{Error, IndexFailure, Result};
use crate::txn::ReadTransaction;
use crate::Storage;

/// The reserved key of an index storage holding the root txn id the index has applied up to:
/// the single byte `0x00`. Entry keys ([`super::index_entry_key`]: `escape(term) ++ 0x00 ++
/// document key`, document keys at least 1 byte) are at least 2 bytes, so it is never an entry; skip it when reading an index storage
/// directly: it is the storage's first key, counted by `ReadTransaction::len` and returned by
/// `iter` and `first` (the entries are `range(&[0u8, 0][..]..)`).
pub const INDEX_APPLIED_KEY: &[u8] = &[0];

/// The first 8 bytes of the value at [`INDEX_APPLIED_KEY`]; the next 8 are the txn id,
/// little-endian.
/// Version 2: entry keys with escaped terms (`index_key.rs`). A version-1 record (terms stored
/// as they were) reads as no record, so that the index is reconciled once into escaped keys.
const APPLIED_MAGIC: &[u8; 8] = b"omniIDX2";

/// The applied record's magic before terms were escaped.
const APPLIED_MAGIC_V1: &[u8; 8] = b"omniIDX1";

/// Documents a build scans per job on the background lane.
const SCAN_CHUNK: usize = 4096;

/// Entries a build writes per transaction at most.
const DIFF_BATCH: usize = 16_384;

/// How often an index resting between batches looks at its mailbox and its waiters.
const ACCUMULATE_POLL: Duration = Duration::from_millis(2);

/// Pages copied per entry above which an index's next rest doubles, and below which it halves
/// (see `IndexDefinition::min_batch_interval`): as fractions, 1/4 and 1/8.
const REST_GROW_ABOVE: (usize, usize) = (1, 4);
const REST_SHRINK_BELOW: (usize, usize) = (1, 8);

/// Smallest reconcile memory accepted (bytes).
const MIN_RECONCILE_MEMORY: usize = 64 << 10;

/// The map function of an index: the terms of the document with key `key` and value `value`.
pub type MapFn = dyn Fn(&[u8], &[u8]) -> Vec<Vec<u8>> + Send + Sync + 'static;

/// An index: a branch storage kept by the engine from the documents' change feed.
///
/// `name` is the branch storage (`Indexes/NAME`); `map` gives a document's terms. For each term
/// `t` of document `k`, the index holds the key [`super::index_entry_key`]`(t, k)` =
/// `escape(t) ++ 0x00 ++ k` with an empty value (the escape turns 0x00 into `01 01` and 0x01
/// into `01 02`; any other byte is kept, so most terms are stored as they are): a prefix scan
/// for [`super::index_term_prefix`]`(t)` lists exactly the documents whose terms include `t`,
/// whatever bytes the terms hold. A term whose key would pass [`crate::MAX_KEY_LEN`] (1,024)
/// bytes is skipped and counted ([`IndexStats::skipped_terms`]). The map function must be deterministic
/// (the same terms for the same document, in every process): entries are removed by mapping the
/// old value again, and the index is resumed without rebuilding when the same name is defined
/// after a reopen. If it changes, define the index with [`IndexDefinition::rebuild`].
#[derive(Clone)]
pub struct IndexDefinition {
    pub(crate) name: String,
    pub(crate) map: Arc<MapFn>,
    pub(crate) min_batch_interval: Duration,
    pub(crate) max_batch_interval: Option<Duration>,
    pub(crate) max_batch_changes: usize,
    pub(crate) reconcile_memory: usize,
    pub(crate) rebuild: bool,
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
            .finish_non_exhaustive()
    }
}

impl IndexDefinition {
    /// An index named `name` (its branch storage; the rules of
    /// [`crate::Database::validate_storage_name`], checked by `define_index`) with map function
    /// `map`. Defaults: at least 250 ms between the starts of two batches, at most 16,384 document
    /// changes per batch, 32 MiB of reconcile memory, no forced rebuild.
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
        }
    }

    /// The index's name (its branch storage).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The default of [`IndexDefinition::min_batch_interval`]: 250 ms. Measured with
    /// `omnibus bench shop` (1 + 100 storages, 2 cores, 15 s): every document's 100 index
    /// entries land in leaves all over each index, so an index transaction copies about one
    /// leaf per entry when it is small. Starting each batch as soon as changes were queued cost
    /// about 320 µs of CPU per document; resting 100 ms, 246 µs (index lag p99 0.6 s); 250 ms,
    /// 181 µs (lag p99 1.5 s); 500 ms, 171 µs (docs/BENCHMARKS.md).
    pub const DEFAULT_MIN_BATCH_INTERVAL: Duration = Duration::from_millis(250);

    /// Least time between the starts of two batches: changes accumulate meanwhile, giving
    /// fewer, larger index transactions for more lag. A batch starts early when the index's
    /// mailbox is half full (so resting never holds up the documents) or when
    /// `wait_for_indexes` waits on it. Default [`Self::DEFAULT_MIN_BATCH_INTERVAL`]; zero
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
    fn max_rest(&self) -> Duration {
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
    match index.get(INDEX_APPLIED_KEY)? {
        None => Ok(None),
        // Built before terms were escaped: to be reconciled, as an index never built.
        Some(v) if is_applied_v1(v) => Ok(None),
        Some(v) => decode_applied(v).map(Some).ok_or_else(|| {
            Error::corruption(
                "",
                None,
                None,
                format!(
                    "the reserved index key 0x00 holds {} bytes that are not an applied-txn record",
                    v.len()
                ),
            )
        }),
    }
}

/// The applied record of an index storage's snapshot; a value at the reserved key that is not
/// one counts as none.
pub(crate) fn read_applied(index: &ReadTransaction) -> Result<Option<u64>> {
    Ok(index.get(INDEX_APPLIED_KEY)?.and_then(decode_applied))
}

fn decode_applied(v: &[u8]) -> Option<u64> {
    if v.len() != 16 || &v[..8] != APPLIED_MAGIC {
        return None;
    }
    Some(u64::from_le_bytes(v[8..16].try_into().ok()?))
}

/// Whether `v` is an applied record of the first version (entries with unescaped terms).
fn is_applied_v1(v: &[u8]) -> bool {
    v.len() == 16 && &v[..8] == APPLIED_MAGIC_V1
}

fn applied_record(txn: u64) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..8].copy_from_slice(APPLIED_MAGIC);
    v[8..].copy_from_slice(&txn.to_le_bytes());
    v
}

/// What an index is doing.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum IndexState {
    /// Building or reconciling from a snapshot of the documents ([`IndexStats::build`] has the
    /// progress); live changes wait in its queue.
    Building,
    /// Following the change feed (possibly [`IndexStats::lag_txns`] behind).
    Current,
    /// Stopped by a failure ([`Error::IndexPoisoned`]); define it again to rebuild it.
    Poisoned(Error),
    /// Stopped by the engine's shutdown or by dropping its storage.
    Stopped,
}

/// Progress of a build or reconcile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuildProgress {
    /// Pass over the documents, from 1 (more than one when the expected entries do not fit in
    /// [`IndexDefinition::reconcile_memory`]).
    pub pass: u32,
    /// Documents scanned in this pass.
    pub scanned: u64,
    /// Documents in the snapshot being indexed.
    pub total: u64,
}

/// Lag from a root commit's acknowledgement to the durable commit of the index batch that
/// applied it, one sample per document change, since the index was defined (milliseconds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LagStats {
    /// Document changes measured.
    pub samples: u64,
    /// Median, milliseconds.
    pub p50_ms: f64,
    /// 99th percentile, milliseconds.
    pub p99_ms: f64,
    /// Largest, milliseconds.
    pub max_ms: f64,
}

/// Counters and state of one index ([`crate::actors::DatabaseHandle::index_stats`]).
#[derive(Debug, Clone)]
pub struct IndexStats {
    /// The index's name (its branch storage).
    pub name: String,
    /// Building, current, poisoned (with the error) or stopped.
    pub state: IndexState,
    /// The root txn id the index has applied up to.
    pub applied_txn: u64,
    /// The last root txn id acknowledged through the engine, when the stats were taken.
    pub root_txn: u64,
    /// Root transactions not yet applied: `root_txn - applied_txn` (0 when ahead).
    pub lag_txns: u64,
    /// Milliseconds since the oldest root commit not yet applied was acknowledged, or since
    /// the build started while building; 0 when current.
    pub lag_ms: f64,
    /// Entries in the index storage (the applied record excluded).
    pub entries: u64,
    /// Progress of the build or reconcile in progress.
    pub build: Option<BuildProgress>,
    /// Builds or reconciles from a snapshot of the documents this definition has run: 0 when it
    /// resumed from its applied record and saw no commit made outside the engine.
    pub reconciles: u32,
    /// Passes over the documents of the last build or reconcile (0 without one; more than 1
    /// when its expected entries did not fit in [`IndexDefinition::reconcile_memory`]).
    pub build_passes: u32,
    /// Index transactions committed from the feed since the definition.
    pub batches: u64,
    /// Document changes applied from the feed since the definition.
    pub changes: u64,
    /// Terms left out because their key would pass [`crate::MAX_KEY_LEN`] bytes.
    pub skipped_terms: u64,
    /// Most root transactions the index was behind when it started a batch.
    pub max_lag_txns: u64,
    /// Lag of the applied changes.
    pub apply_lag: LagStats,
}

/// A pool of build slots (one per executor), shared by the indexes of a database.
#[derive(Clone)]
pub(crate) struct BuildSlots {
    tx: flume::Sender<()>,
    rx: flume::Receiver<()>,
}

struct Slot(flume::Sender<()>);

impl Drop for Slot {
    fn drop(&mut self) {
        let _ = self.0.try_send(());
    }
}

impl BuildSlots {
    pub fn new(n: usize) -> BuildSlots {
        let (tx, rx) = flume::bounded(n.max(1));
        for _ in 0..n.max(1) {
            let _ = tx.try_send(());
        }
        BuildSlots { tx, rx }
    }

    async fn acquire(&self) -> Option<Slot> {
        self.rx.recv_async().await.ok()?;
        Some(Slot(self.tx.clone()))
    }
}

enum Phase {
    Building { since: Instant },
    Current,
    Poisoned(Error),
    Stopped,
}

struct Progress {
    phase: Phase,
    applied: u64,
    build: Option<BuildProgress>,
    reconciles: u32,
    build_passes: u32,
    batches: u64,
    changes: u64,
    skipped_terms: u64,
    max_lag_txns: u64,
    /// When the oldest commit of the batch being applied was acknowledged.
    pending_since: Option<Instant>,
    /// Microseconds from acknowledgement to the index commit, per document change.
    lag_us: Histogram<u64>,
    /// `wait_for_indexes` callers: (target txn, answer).
    waiters: Vec<(u64, flume::Sender<Result<()>>)>,
}

/// An index's progress, shared by its actor and the database handle.
pub(crate) struct IndexShared {
    pub name: String,
    /// Set by shutdown and by dropping the storage: a build in progress stops.
    pub abandon: AtomicBool,
    progress: Mutex<Progress>,
}

impl IndexShared {
    pub fn new(name: &str, applied: u64) -> IndexShared {
        IndexShared {
            name: name.to_string(),
            abandon: AtomicBool::new(false),
            progress: Mutex::new(Progress {
                phase: Phase::Building {
                    since: Instant::now(),
                },
                applied,
                build: None,
                reconciles: 0,
                build_passes: 0,
                batches: 0,
                changes: 0,
                skipped_terms: 0,
                max_lag_txns: 0,
                pending_since: None,
                lag_us: Histogram::new(3).expect("3 significant digits is valid"),
                waiters: Vec::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The root txn applied up to, when the index is current (following the feed, not building,
    /// poisoned or stopped): every root commit up to it is in the index storage's snapshots
    /// taken from now on.
    pub fn applied_if_current(&self) -> Option<u64> {
        let p = self.lock();
        matches!(p.phase, Phase::Current).then_some(p.applied)
    }

    /// Registers a wait for `target`: `Ok(None)` when already applied, a receiver answered once
    /// it is (or with the poison error); the poison error at once when poisoned.
    pub fn waiter(&self, target: u64) -> Result<Option<flume::Receiver<Result<()>>>> {
        let mut p = self.lock();
        if let Phase::Poisoned(e) = &p.phase {
            return Err(e.clone());
        }
        if p.applied >= target && !matches!(p.phase, Phase::Building { .. }) {
            return Ok(None);
        }
        if matches!(p.phase, Phase::Stopped) {
            return Err(Error::Closed);
        }
        let (tx, rx) = flume::bounded(1);
        p.waiters.push((target, tx));
        Ok(Some(rx))
    }

    /// True while a `wait_for_indexes` caller waits on this index.
    fn has_waiters(&self) -> bool {
        !self.lock().waiters.is_empty()
    }

    fn notify(p: &mut Progress) {
        let applied = p.applied;
        p.waiters.retain(|(t, tx)| {
            if *t <= applied {
                let _ = tx.send(Ok(()));
                false
            } else {
                true
            }
        });
    }

    fn set_build(&self, b: BuildProgress, skipped: u64) {
        let mut p = self.lock();
        if !matches!(p.phase, Phase::Building { .. }) {
            p.phase = Phase::Building {
                since: Instant::now(),
            };
        }
        p.build = Some(b);
        p.build_passes = b.pass;
        p.skipped_terms += skipped;
    }

    fn reconcile_started(&self) {
        self.lock().reconciles += 1;
    }

    fn set_current(&self, applied: u64) {
        let mut p = self.lock();
        p.phase = Phase::Current;
        p.build = None;
        p.applied = applied;
        Self::notify(&mut p);
    }

    fn batch_started(&self, oldest: Instant, behind: u64) {
        let mut p = self.lock();
        p.pending_since = Some(oldest);
        p.max_lag_txns = p.max_lag_txns.max(behind);
    }

    fn batch_applied(&self, applied: u64, commits: &[Arc<RootCommit>], skipped: u64, wrote: bool) {
        let now = Instant::now();
        let mut p = self.lock();
        p.applied = applied;
        p.batches += u64::from(wrote);
        p.skipped_terms += skipped;
        for c in commits {
            let n = c.changes.len() as u64;
            p.changes += n;
            let us = now.saturating_duration_since(c.acked).as_micros() as u64;
            let _ = p.lag_us.record_n(us, n.max(1));
        }
        p.pending_since = None;
        Self::notify(&mut p);
    }

    /// Poisons the index with `cause`; answers every waiter with the error.
    fn poison(&self, cause: IndexFailure) {
        let e = Error::IndexPoisoned {
            index: self.name.clone(),
            cause,
        };
        tracing::error!(index = %self.name, error = %e, "index poisoned");
        let mut p = self.lock();
        for (_, tx) in p.waiters.drain(..) {
            let _ = tx.send(Err(e.clone()));
        }
        p.build = None;
        p.phase = Phase::Poisoned(e);
    }

    /// The actor exited: waiters not yet answered get [`Error::Closed`].
    fn stopped(&self) {
        let mut p = self.lock();
        if !matches!(p.phase, Phase::Poisoned(_)) {
            p.phase = Phase::Stopped;
        }
        p.build = None;
        p.waiters.clear();
    }

    pub fn stats(&self, root_txn: u64, entries: u64) -> IndexStats {
        let p = self.lock();
        let lag_txns = root_txn.saturating_sub(p.applied);
        let ms = |t: Instant| t.elapsed().as_secs_f64() * 1000.0;
        let (state, lag_ms) = match &p.phase {
            Phase::Building { since } => (IndexState::Building, ms(*since)),
            Phase::Current => (
                IndexState::Current,
                match (lag_txns, p.pending_since) {
                    (0, _) | (_, None) => 0.0,
                    (_, Some(t)) => ms(t),
                },
            ),
            Phase::Poisoned(e) => (IndexState::Poisoned(e.clone()), 0.0),
            Phase::Stopped => (IndexState::Stopped, 0.0),
        };
        let h = &p.lag_us;
        let q = |x: f64| h.value_at_quantile(x) as f64 / 1000.0;
        IndexStats {
            name: self.name.clone(),
            state,
            applied_txn: p.applied,
            root_txn,
            lag_txns,
            lag_ms,
            entries,
            build: p.build,
            reconciles: p.reconciles,
            build_passes: p.build_passes,
            batches: p.batches,
            changes: p.changes,
            skipped_terms: p.skipped_terms,
            max_lag_txns: p.max_lag_txns,
            apply_lag: LagStats {
                samples: h.len(),
                p50_ms: q(0.5),
                p99_ms: q(0.99),
                max_ms: h.max() as f64 / 1000.0,
            },
        }
    }
}

/// Entries in an index storage's snapshot, the applied record excluded.
pub(crate) fn entries(index: &ReadTransaction) -> u64 {
    let marker = matches!(index.get(INDEX_APPLIED_KEY), Ok(Some(_)));
    index.len().saturating_sub(u64::from(marker))
}

/// Runs the map function, turning a panic into [`IndexFailure::MapPanicked`].
pub(crate) fn call_map(
    map: &MapFn,
    key: &[u8],
    value: &[u8],
) -> std::result::Result<Vec<Vec<u8>>, IndexFailure> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| map(key, value))).map_err(|p| {
        let message = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        IndexFailure::MapPanicked {
            key: key.to_vec(),
            message,
        }
    })
}

fn storage_failure(e: Error) -> IndexFailure {
    IndexFailure::Storage(Box::new(e))
}

/// One put or delete of a batch: its key is `arena[start..start + len]`; `prefix` is the key's
/// first 8 bytes, big-endian, zero-padded (sorting compares it before the bytes).
#[derive(Clone, Copy)]
struct Op {
    prefix: u64,
    start: usize,
    len: u32,
    put: bool,
}

/// The first 8 bytes of `key` as a big-endian number, zero-padded: ordered as the keys are,
/// except that keys equal in it need a byte comparison.
fn key_prefix(key: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = key.len().min(8);
    b[..n].copy_from_slice(&key[..n]);
    u64::from_be_bytes(b)
}

/// A batch of index operations, keys in one buffer.
#[derive(Default)]
struct Ops {
    arena: Vec<u8>,
    ops: Vec<Op>,
}

impl Ops {
    fn with_capacity(bytes: usize, ops: usize) -> Ops {
        Ops {
            arena: Vec::with_capacity(bytes),
            ops: Vec::with_capacity(ops),
        }
    }

    fn len(&self) -> usize {
        self.ops.len()
    }

    fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    fn key(&self, o: &Op) -> &[u8] {
        &self.arena[o.start..o.start + o.len as usize]
    }

    /// Adds the entry of `term` for document `doc` (`index_key.rs`); false (nothing added)
    /// when its key would pass [`crate::MAX_KEY_LEN`].
    fn push_entry(&mut self, term: &[u8], doc: &[u8], put: bool) -> bool {
        let Some(len) = index_key::entry_len(term, doc) else {
            return false;
        };
        let start = self.arena.len();
        index_key::push_entry_key(&mut self.arena, term, doc);
        self.ops.push(Op {
            prefix: key_prefix(&self.arena[start..]),
            start,
            len: len as u32,
            put,
        });
        true
    }

    fn push_key(&mut self, key: &[u8], put: bool) {
        let start = self.arena.len();
        self.arena.extend_from_slice(key);
        self.ops.push(Op {
            prefix: key_prefix(key),
            start,
            len: key.len() as u32,
            put,
        });
    }

    /// Sorts the operations by key, keeping only the last operation of each key (the state a
    /// key ends in after applying them in order).
    fn settle(&mut self) {
        let arena = &self.arena;
        let key = |o: &Op| &arena[o.start..o.start + o.len as usize];
        // Operations on one key stay in their order: `start` grows with each push. Unstable
        // (no buffer), and most comparisons end at the 8-byte prefix.
        self.ops.sort_unstable_by(|a, b| {
            a.prefix
                .cmp(&b.prefix)
                .then_with(|| key(a).cmp(key(b)))
                .then(a.start.cmp(&b.start))
        });
        let n = self.ops.len();
        let mut out = 0;
        for i in 0..n {
            if i + 1 < n && key(&self.ops[i]) == key(&self.ops[i + 1]) {
                continue;
            }
            self.ops[out] = self.ops[i];
            out += 1;
        }
        self.ops.truncate(out);
    }
}

fn contains(list: &[Vec<u8>], sorted: bool, t: &[u8]) -> bool {
    if sorted {
        list.binary_search_by(|x| x.as_slice().cmp(t)).is_ok()
    } else {
        list.iter().any(|x| x == t)
    }
}

/// Adds the operations of one document change: deletes for the terms it lost, puts for the
/// ones it gained. Returns the terms skipped for their length.
fn diff_change(
    map: &MapFn,
    c: &DocumentChange,
    ops: &mut Ops,
) -> std::result::Result<u64, IndexFailure> {
    let mut old = match &c.old {
        Some(v) => call_map(map, &c.key, v)?,
        None => Vec::new(),
    };
    let mut new = match &c.new {
        Some(v) => call_map(map, &c.key, v)?,
        None => Vec::new(),
    };
    let sorted = old.len() > 8 && new.len() > 8;
    if sorted {
        old.sort_unstable();
        new.sort_unstable();
    }
    let mut skipped = 0;
    for t in &old {
        if !contains(&new, sorted, t) {
            ops.push_entry(t, &c.key, false);
        }
    }
    for t in &new {
        if !contains(&old, sorted, t) && !ops.push_entry(t, &c.key, true) {
            skipped += 1;
        }
    }
    Ok(skipped)
}

/// Writes `ops` (and, with `applied`, the applied record) through the index storage's actor;
/// returns once durable, with the number of pages its transactions copied or created (tree
/// pages, not free-space bitmaps).
///
/// One transaction, unless it copies `max_pages` pages or more (a batch of entries scattered
/// over a large index copies most of its leaves, and every copy is a page image held until
/// flushed: [`crate::live_image_bytes`]): then the transaction commits what it applied so far
/// and the next one goes on from there, so no single transaction holds more than about
/// `max_pages` dirty pages. Each transaction but the last deletes the applied record (the
/// entries it commits belong to root commits past the record): a crash between them leaves an
/// index with no record, which the next definition reconciles. The last one writes `applied`.
async fn write_ops(
    branch: &StorageHandle,
    ops: Ops,
    applied: Option<u64>,
    max_pages: usize,
) -> Result<usize> {
    let ops = Arc::new(ops);
    let mut from = 0;
    let mut pages = 0;
    // Bounded: every turn applies at least one operation (or ends).
    loop {
        let progress = Arc::new((AtomicUsize::new(0), AtomicUsize::new(0)));
        let seen = progress.clone();
        let job_ops = ops.clone();
        let job: ApplyJob = Box::new(move |w| {
            let mut next = from;
            for o in &job_ops.ops[from..] {
                let k = job_ops.key(o);
                if o.put {
                    w.put(k, b"")?;
                } else {
                    w.delete(k)?;
                }
                next += 1;
                if w.dirty_pages() >= max_pages && next < job_ops.ops.len() {
                    break;
                }
            }
            if next < job_ops.ops.len() {
                if applied.is_some() {
                    w.delete(INDEX_APPLIED_KEY)?;
                }
            } else if let Some(t) = applied {
                w.put(INDEX_APPLIED_KEY, applied_record(t))?;
            }
            seen.0.store(next, std::sync::atomic::Ordering::Relaxed);
            seen.1
                .store(w.dirty_pages(), std::sync::atomic::Ordering::Relaxed);
            Ok(())
        });
        let (tx, rx) = flume::bounded(1);
        branch
            .tx
            .send_async(StorageMsg::Apply { job, reply: tx })
            .await
            .map_err(|_| Error::Closed)?;
        rx.recv_async().await.map_err(|_| Error::Closed)??;
        let next = progress.0.load(std::sync::atomic::Ordering::Relaxed);
        pages += progress.1.load(std::sync::atomic::Ordering::Relaxed);
        if next >= ops.ops.len() || next <= from {
            return Ok(pages);
        }
        from = next;
    }
}

/// Everything an index actor starts with.
pub(crate) struct IndexActor {
    pub def: IndexDefinition,
    pub shared: Arc<IndexShared>,
    pub rx: flume::Receiver<IndexMsg>,
    /// The root's snapshot when the feed was registered (taken at start: a snapshot held
    /// pins the root's pages and holds back its flushes).
    pub snapshot: Option<ReadTransaction>,
    /// The index's applied record when it was defined.
    pub applied: Option<u64>,
    /// The index storage's handle (its storage actor writes it).
    pub branch: StorageHandle,
    /// The root storage (for a fresh snapshot when its txn ids show a gap).
    pub root: Storage,
    pub lane: IoLane,
    pub slots: BuildSlots,
    pub feed: Arc<RootFeed>,
    /// Most pages one transaction of an index batch copies before the batch goes on in another
    /// transaction (see `write_ops`): 1/16 of the engine's memory budget.
    pub batch_pages: usize,
}

/// The index actor's loop: catch up, then follow the feed until stopped.
pub(crate) async fn run(mut a: IndexActor) {
    let Some(snapshot) = a.snapshot.take() else {
        a.shared.stopped();
        return;
    };
    let root_txn = snapshot.txn_id();
    let result = if a.def.rebuild || a.applied != Some(root_txn) {
        // INFO: a catch-up (build or reconcile) happens at definition, not in steady state.
        let span = tracing::info_span!("index catch-up", index = %a.shared.name, applied = ?a.applied, to = root_txn);
        let t = Instant::now();
        let r = tracing::Instrument::instrument(reconcile(&a, snapshot), span.clone()).await;
        if let Ok(true) = r {
            span.in_scope(|| {
                tracing::info!(
                    ms = t.elapsed().as_millis() as u64,
                    "index caught up with the documents"
                )
            });
        }
        r
    } else {
        drop(snapshot);
        Ok(true)
    };
    let result = match result {
        Ok(true) => {
            a.shared.set_current(root_txn);
            follow(&a, root_txn).await
        }
        other => other,
    };
    match result {
        Ok(_) => a.shared.stopped(),
        Err(f) => a.shared.poison(f),
    }
}

/// True when the txn ids of `commits` (all above `applied`) are not `applied + 1, + 2, ...`:
/// the root was committed outside the engine in between, and those changes never reached the
/// feed.
fn has_gap(applied: u64, commits: &[Arc<RootCommit>]) -> bool {
    let mut next = applied + 1;
    for c in commits {
        if c.txn != next {
            return true;
        }
        next = c.txn + 1;
    }
    false
}

/// Follows the feed from `applied` until stopped. Returns false when abandoned.
async fn follow(a: &IndexActor, mut applied: u64) -> std::result::Result<bool, IndexFailure> {
    let (def, shared, rx) = (&a.def, &a.shared, &a.rx);
    // The applied txn of the last record written (batches that change no entry write none).
    let mut durable = applied;
    let mut last_start: Option<Instant> = None;
    // The rest before the next batch: adapts between the definition's bounds (see
    // `IndexDefinition::min_batch_interval`).
    let mut rest = def.min_batch_interval;
    let (mut cap_bytes, mut cap_ops) = (0usize, 0usize);
    let half_full = rx.capacity().unwrap_or(1).div_ceil(2);
    loop {
        let first = rx.recv_async().await.ok();
        if let (Some(t), Some(IndexMsg::Commit(_))) = (last_start, &first) {
            // Accumulate until the interval since the last batch has passed, unless the
            // mailbox is half full (the root must not wait for an index that is only resting)
            // or a `wait_for_indexes` caller waits. Bounded: ends at the deadline.
            let deadline = t + rest;
            loop {
                let now = Instant::now();
                if now >= deadline || rx.len() + 1 >= half_full || shared.has_waiters() {
                    break;
                }
                glommio::timer::sleep((deadline - now).min(ACCUMULATE_POLL)).await;
            }
        }
        last_start = Some(Instant::now());
        let mut commits: Vec<Arc<RootCommit>> = Vec::new();
        let mut stop = None;
        let mut changes = 0usize;
        let mut next = first;
        let ended = next.is_none();
        // Bounded by max_batch_changes (at least one commit).
        while let Some(m) = next.take() {
            match m {
                IndexMsg::Commit(c) => {
                    changes += c.changes.len().max(1);
                    commits.push(c);
                }
                IndexMsg::Stop { reply } => {
                    stop = Some(reply);
                    break;
                }
            }
            if changes < def.max_batch_changes {
                next = rx.try_recv().ok();
            }
        }
        commits.retain(|c| c.txn > applied);
        while has_gap(applied, &commits) {
            // Every commit up to a fresh snapshot is in it, and every later one is fed.
            tracing::warn!(
                index = %shared.name,
                "the root was committed outside the engine: reconciling the index"
            );
            let snap = a.root.begin_read().map_err(storage_failure)?;
            let txn = snap.txn_id();
            if !reconcile(a, snap).await? {
                return Ok(false);
            }
            (applied, durable) = (txn, txn);
            shared.set_current(txn);
            commits.retain(|c| c.txn > applied);
        }
        if let (Some(first), Some(last)) = (commits.first(), commits.last()) {
            let last_txn = last.txn;
            let behind = a
                .feed
                .acked_txn
                .load(std::sync::atomic::Ordering::Acquire)
                .saturating_sub(applied);
            shared.batch_started(first.acked, behind);
            let mut ops = Ops::with_capacity(cap_bytes, cap_ops);
            let mut skipped = 0;
            for c in &commits {
                for ch in &c.changes {
                    skipped += diff_change(&*def.map, ch, &mut ops)?;
                }
            }
            ops.settle();
            let wrote = !ops.is_empty();
            if wrote {
                (cap_bytes, cap_ops) = (ops.arena.len(), ops.ops.len());
                let entries = ops.len();
                let pages = write_ops(&a.branch, ops, Some(last_txn), a.batch_pages)
                    .await
                    .map_err(storage_failure)?;
                rest = next_rest(def, rest, pages, entries);
                durable = last_txn;
            }
            tracing::debug!(
                index = %shared.name,
                commits = commits.len(),
                to = last_txn,
                wrote,
                "index batch"
            );
            applied = last_txn;
            shared.batch_applied(applied, &commits, skipped, wrote);
        }
        if stop.is_some() || ended {
            if durable < applied {
                write_ops(&a.branch, Ops::default(), Some(applied), a.batch_pages)
                    .await
                    .map_err(storage_failure)?;
            }
            if let Some(reply) = stop {
                let _ = reply.send(());
            }
            return Ok(true);
        }
        glommio::yield_if_needed().await;
    }
}

/// The rest before an index's next batch, after one whose transaction wrote `entries` entries
/// and copied `pages` pages: doubled (up to the maximum) above [`REST_GROW_ABOVE`] pages per
/// entry, halved (down to the minimum) below [`REST_SHRINK_BELOW`], else kept.
fn next_rest(def: &IndexDefinition, rest: Duration, pages: usize, entries: usize) -> Duration {
    let (min, max) = (def.min_batch_interval, def.max_rest());
    let above = |(n, d): (usize, usize)| pages.saturating_mul(d) > entries.saturating_mul(n);
    let next = if above(REST_GROW_ABOVE) {
        rest.saturating_mul(2)
            .max(min.max(Duration::from_millis(1)))
    } else if !above(REST_SHRINK_BELOW) {
        rest / 2
    } else {
        rest
    };
    next.clamp(min, max)
}

/// The expected entries of one reconcile pass: keys at or above `lo` and below `cutoff`, in one
/// buffer of at most `budget` bytes (keys plus 16 bytes each).
struct Expected {
    arena: Vec<u8>,
    spans: Vec<(usize, u32)>,
    lo: Option<Vec<u8>>,
    cutoff: Option<Vec<u8>>,
    budget: usize,
    /// Count terms skipped for their length (first pass only: later passes see them again).
    count_skipped: bool,
    skipped: u64,
}

impl Expected {
    fn new(budget: usize, lo: Option<Vec<u8>>, count_skipped: bool) -> Expected {
        Expected {
            arena: Vec::new(),
            spans: Vec::new(),
            lo,
            cutoff: None,
            budget,
            count_skipped,
            skipped: 0,
        }
    }

    fn key(&self, s: (usize, u32)) -> &[u8] {
        &self.arena[s.0..s.0 + s.1 as usize]
    }

    fn add(&mut self, term: &[u8], doc: &[u8]) {
        let Some(len) = index_key::entry_len(term, doc) else {
            self.skipped += u64::from(self.count_skipped);
            return;
        };
        let start = self.arena.len();
        index_key::push_entry_key(&mut self.arena, term, doc);
        let k = &self.arena[start..];
        if self.lo.as_deref().is_some_and(|lo| k < lo)
            || self.cutoff.as_deref().is_some_and(|c| k >= c)
        {
            self.arena.truncate(start);
            return;
        }
        self.spans.push((start, len as u32));
        if self.arena.len() + self.spans.len() * 16 > self.budget && self.spans.len() > 1 {
            self.shrink();
        }
    }

    fn sort_dedup(&mut self) {
        let arena = &self.arena;
        let key = |s: &(usize, u32)| &arena[s.0..s.0 + s.1 as usize];
        self.spans.sort_unstable_by(|a, b| key(a).cmp(key(b)));
        self.spans.dedup_by(|a, b| key(a) == key(b));
    }

    /// Keeps the smaller half of the keys; the first one dropped becomes the cutoff.
    fn shrink(&mut self) {
        self.sort_dedup();
        if self.spans.len() < 2 {
            return;
        }
        let keep = self.spans.len() / 2;
        self.cutoff = Some(self.key(self.spans[keep]).to_vec());
        let mut arena = Vec::with_capacity(self.arena.len() / 2 + 1);
        let mut spans = Vec::with_capacity(keep);
        for s in &self.spans[..keep] {
            let start = arena.len();
            arena.extend_from_slice(self.key(*s));
            spans.push((start, s.1));
        }
        self.arena = arena;
        self.spans = spans;
    }
}

/// Scans up to `max_docs` documents after `after`, adding their entries to `exp`. Returns the
/// documents scanned and whether the snapshot ended.
fn scan_chunk(
    root: &ReadTransaction,
    map: &MapFn,
    exp: &mut Expected,
    after: &mut Option<Vec<u8>>,
    max_docs: usize,
) -> std::result::Result<(u64, bool), IndexFailure> {
    let prev = after.take();
    let start = match prev.as_deref() {
        Some(k) => Bound::Excluded(k),
        None => Bound::Unbounded,
    };
    let mut n = 0usize;
    let mut last: Option<&[u8]> = None;
    for item in root
        .range((start, Bound::Unbounded))
        .map_err(storage_failure)?
    {
        let (k, v) = item.map_err(storage_failure)?;
        for t in call_map(map, k, v)? {
            exp.add(&t, k);
        }
        n += 1;
        last = Some(k);
        if n >= max_docs {
            break;
        }
    }
    *after = last.map(<[u8]>::to_vec).or(prev);
    Ok((n as u64, n < max_docs))
}

/// Where a diff stopped: the next expected key, and the last index key consumed.
#[derive(Default)]
struct DiffPos {
    e: usize,
    after: Option<Vec<u8>>,
}

/// Diffs the expected keys against the index's entries in the pass's range, from `pos`, adding
/// up to `max_ops` operations to `ops`. Returns whether the range is done.
fn diff_chunk(
    index: &ReadTransaction,
    exp: &Expected,
    pos: &mut DiffPos,
    max_ops: usize,
    ops: &mut Ops,
) -> Result<bool> {
    let start = match (&pos.after, &exp.lo) {
        (Some(k), _) => Bound::Excluded(k.as_slice()),
        (None, Some(lo)) => Bound::Included(lo.as_slice()),
        (None, None) => Bound::Unbounded,
    };
    let end = match &exp.cutoff {
        Some(c) => Bound::Excluded(c.as_slice()),
        None => Bound::Unbounded,
    };
    let mut it = index.range((start, end))?;
    let mut cur = it.next().transpose()?;
    let mut consumed: Option<&[u8]> = None;
    let done = loop {
        if ops.len() >= max_ops {
            break false;
        }
        let e = exp.spans.get(pos.e).map(|s| exp.key(*s));
        let Some((ik, iv)) = cur else {
            match e {
                None => break true,
                Some(e) => {
                    ops.push_key(e, true);
                    pos.e += 1;
                    continue;
                }
            }
        };
        match e.map_or(Ordering::Greater, |e| e.cmp(ik)) {
            Ordering::Less => {
                if let Some(e) = e {
                    ops.push_key(e, true);
                }
                pos.e += 1;
            }
            Ordering::Equal => {
                if !iv.is_empty() {
                    ops.push_key(ik, true);
                }
                pos.e += 1;
                consumed = Some(ik);
                cur = it.next().transpose()?;
            }
            Ordering::Greater => {
                if ik != INDEX_APPLIED_KEY {
                    ops.push_key(ik, false);
                }
                consumed = Some(ik);
                cur = it.next().transpose()?;
            }
        }
    };
    if let Some(k) = consumed {
        pos.after = Some(k.to_vec());
    }
    Ok(done)
}

/// Makes the index equal to what the map function gives for the documents of `root`, then
/// records `root`'s txn. Returns false when abandoned (shutdown, drop).
async fn reconcile(
    a: &IndexActor,
    root: ReadTransaction,
) -> std::result::Result<bool, IndexFailure> {
    let (def, shared, branch, lane, slots) = (&a.def, &a.shared, &a.branch, &a.lane, &a.slots);
    let abandoned = || shared.abandon.load(std::sync::atomic::Ordering::Acquire);
    shared.reconcile_started();
    let total = root.len();
    shared.set_build(
        BuildProgress {
            pass: 1,
            scanned: 0,
            total,
        },
        0,
    );
    // A slot bounds the expected-entry buffers held at once; an empty snapshot needs none.
    let _slot = match total {
        0 => None,
        _ => match slots.acquire().await {
            Some(s) => Some(s),
            None => return Ok(false),
        },
    };
    let root_txn = root.txn_id();
    let mut lo: Option<Vec<u8>> = None;
    let mut pass = 0u32;
    loop {
        pass += 1;
        // Phase 1: the expected entries of this pass's key range.
        let mut exp = Expected::new(def.reconcile_memory, lo.take(), pass == 1);
        let mut after: Option<Vec<u8>> = None;
        let mut scanned = 0u64;
        loop {
            if abandoned() {
                return Ok(false);
            }
            let (snap, map) = (root.clone(), def.map.clone());
            let (mut e, a) = (exp, after);
            let (e, a, r) = lane
                .run(move || {
                    let mut a = a;
                    let r = scan_chunk(&snap, &*map, &mut e, &mut a, SCAN_CHUNK);
                    if matches!(r, Ok((_, true))) {
                        e.sort_dedup();
                    }
                    Ok((e, a, r))
                })
                .await
                .map_err(storage_failure)?;
            (exp, after) = (e, a);
            let (n, done) = r?;
            scanned += n;
            let skipped = std::mem::take(&mut exp.skipped);
            shared.set_build(
                BuildProgress {
                    pass,
                    scanned,
                    total,
                },
                skipped,
            );
            if done {
                break;
            }
        }
        // Phase 2: the difference, written in bounded batches.
        let index = branch.storage.begin_read().map_err(storage_failure)?;
        let mut pos = DiffPos::default();
        loop {
            if abandoned() {
                return Ok(false);
            }
            let (snap, e, p) = (index.clone(), exp, pos);
            let (e, p, ops, done) = lane
                .run(move || {
                    let mut p = p;
                    let mut ops = Ops::default();
                    let done = diff_chunk(&snap, &e, &mut p, DIFF_BATCH, &mut ops)?;
                    Ok((e, p, ops, done))
                })
                .await
                .map_err(storage_failure)?;
            (exp, pos) = (e, p);
            if !ops.is_empty() {
                write_ops(branch, ops, None, a.batch_pages)
                    .await
                    .map_err(storage_failure)?;
            }
            if done {
                break;
            }
        }
        match exp.cutoff.take() {
            Some(c) => lo = Some(c),
            None => break,
        }
    }
    drop(root);
    write_ops(branch, Ops::default(), Some(root_txn), a.batch_pages)
        .await
        .map_err(storage_failure)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MAX_KEY_LEN;

    #[test]
    fn the_rest_doubles_when_batches_copy_many_pages_per_entry_and_halves_when_few() {
        let ms = Duration::from_millis;
        let def = IndexDefinition::new("i", |_: &[u8], _: &[u8]| Vec::new());
        // Default bounds: 250 ms .. 4 x 250 ms.
        assert_eq!(def.max_rest(), ms(1000));
        // 300 pages for 1,000 entries (> 1/4): doubles, then stops at the maximum.
        assert_eq!(next_rest(&def, ms(250), 300, 1000), ms(500));
        assert_eq!(next_rest(&def, ms(500), 300, 1000), ms(1000));
        assert_eq!(next_rest(&def, ms(1000), 300, 1000), ms(1000));
        // Between 1/8 and 1/4: kept.
        assert_eq!(next_rest(&def, ms(500), 200, 1000), ms(500));
        // 100 pages for 1,000 entries (< 1/8): halves, down to the minimum.
        assert_eq!(next_rest(&def, ms(1000), 100, 1000), ms(500));
        assert_eq!(next_rest(&def, ms(250), 100, 1000), ms(250));
        // Explicit bounds; a maximum under the minimum counts as the minimum.
        let def = def.min_batch_interval(ms(10)).max_batch_interval(ms(25));
        assert_eq!(next_rest(&def, ms(20), 5, 1), ms(25));
        let def = def.max_batch_interval(ms(1));
        assert_eq!(def.max_rest(), ms(10));
        assert_eq!(next_rest(&def, ms(10), 5, 1), ms(10));
        // A zero minimum still grows (from 1 ms) when batches are costly.
        let def = IndexDefinition::new("i", |_: &[u8], _: &[u8]| Vec::new())
            .min_batch_interval(Duration::ZERO)
            .max_batch_interval(ms(8));
        assert_eq!(next_rest(&def, Duration::ZERO, 5, 1), ms(1));
        assert_eq!(next_rest(&def, ms(4), 5, 1), ms(8));
        assert_eq!(next_rest(&def, ms(1), 0, 100), Duration::ZERO + ms(1) / 2);
    }

    fn keys(o: &Ops) -> Vec<(Vec<u8>, bool)> {
        o.ops.iter().map(|x| (o.key(x).to_vec(), x.put)).collect()
    }

    #[test]
    fn settle_keeps_the_last_operation_of_each_key_in_key_order() {
        let mut o = Ops::default();
        o.push_key(b"b", true);
        o.push_key(b"a", true);
        o.push_key(b"b", false);
        o.push_key(b"c", false);
        o.push_key(b"a", false);
        o.push_key(b"a", true);
        o.settle();
        assert_eq!(
            keys(&o),
            vec![
                (b"a".to_vec(), true),
                (b"b".to_vec(), false),
                (b"c".to_vec(), false)
            ]
        );
    }

    #[test]
    fn settle_matches_a_model_for_keys_sharing_their_8_byte_prefix() {
        // Keys of 0..12 bytes over a 2-letter alphabet: many share the first 8 bytes, are
        // prefixes of one another, or differ only by a trailing 0x00 (zero padding).
        let mut x = 0x1234_5678_9abc_def0u64;
        let mut model = std::collections::BTreeMap::new();
        let mut o = Ops::default();
        for _ in 0..5000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 13) as usize;
            let key: Vec<u8> = (0..len)
                .map(|i| [0u8, b'a'][((x >> (i + 8)) & 1) as usize])
                .collect();
            let put = (x >> 40) & 1 == 1;
            o.push_key(&key, put);
            model.insert(key, put);
        }
        o.settle();
        assert_eq!(keys(&o), model.into_iter().collect::<Vec<_>>());
    }

    #[test]
    fn a_change_deletes_lost_terms_and_puts_gained_ones() {
        let map: Arc<MapFn> =
            Arc::new(|_k: &[u8], v: &[u8]| v.split(|b| *b == b',').map(<[u8]>::to_vec).collect());
        let c = DocumentChange {
            key: b"d1".to_vec(),
            old: Some(b"x,y".to_vec()),
            new: Some(b"y,z".to_vec()),
        };
        let mut o = Ops::default();
        assert_eq!(diff_change(&*map, &c, &mut o).unwrap(), 0);
        assert_eq!(
            keys(&o),
            vec![(b"x\0d1".to_vec(), false), (b"z\0d1".to_vec(), true)]
        );
        // A term whose key passes the key limit is skipped and counted.
        let long = DocumentChange {
            key: b"d2".to_vec(),
            old: None,
            new: Some(vec![b'q'; MAX_KEY_LEN]),
        };
        let mut o = Ops::default();
        assert_eq!(diff_change(&*map, &long, &mut o).unwrap(), 1);
        assert!(o.is_empty());
    }

    #[test]
    fn a_panicking_map_is_a_typed_failure() {
        let map: Arc<MapFn> = Arc::new(|_k: &[u8], _v: &[u8]| panic!("bad document"));
        match call_map(&*map, b"k", b"v") {
            Err(IndexFailure::MapPanicked { key, message }) => {
                assert_eq!(key, b"k");
                assert_eq!(message, "bad document");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn expected_entries_shrink_to_the_smallest_keys_under_the_budget() {
        let mut e = Expected::new(4096, None, true);
        for i in (0..2000u32).rev() {
            e.add(format!("{i:06}").as_bytes(), b"d");
        }
        e.sort_dedup();
        let cutoff = e.cutoff.clone().expect("over budget: a cutoff");
        assert!(e.arena.len() + e.spans.len() * 16 <= 4096 + 64);
        // Every kept key is below the cutoff, and every key below the cutoff was kept.
        let kept: Vec<Vec<u8>> = e.spans.iter().map(|s| e.key(*s).to_vec()).collect();
        let want: Vec<Vec<u8>> = (0..2000u32)
            .map(|i| {
                let mut k = format!("{i:06}").into_bytes();
                k.extend_from_slice(b"\0d");
                k
            })
            .filter(|k| k.as_slice() < cutoff.as_slice())
            .collect();
        assert_eq!(kept, want);
        assert!(!kept.is_empty());
    }

    #[test]
    fn applied_records_round_trip_and_foreign_values_are_not_records() {
        assert_eq!(decode_applied(&applied_record(42)), Some(42));
        assert_eq!(decode_applied(b"x"), None);
        assert_eq!(decode_applied(&[0u8; 16]), None);
    }
}
