//! [`Storage`]: one self-contained storage directory.
//!
//! ```text
//! <dir>/LOCK          flock()ed while open (exclusive; shared by read-only opens)
//! <dir>/data.pages    header pages 0 and 1, then B+tree, overflow and free-space pages
//! <dir>/Journals/     numbered journal files
//! ```
//! Open: take the lock, read the newest valid header, replay the journal records after its
//! flushed txn id into the scratch table (design.md invariant I7), start a fresh journal file,
//! flush what was replayed, and delete journal files that hold nothing unflushed.
//!
//! `flush.rs` builds on this module, never the other way (docs/ARCHITECTURE.md): a storage
//! calls the flush through the `FlushHooks` it is opened with, and the public
//! [`Storage::open`], which supplies them, is implemented there.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use arc_swap::ArcSwap;

use crate::btree::CheckReport;
use crate::env::{EnvFile, OpenMode, StorageEnv};
use crate::error::{Error, Result};
use crate::freespace::{Allocator, BITS_PER_BITMAP, WORDS};
use crate::journal::record::CommitMeta;
use crate::journal::{recovery, Journal, JournalConfig, JournalStats};
use crate::options::{FlushMode, Options};
use crate::page::header::{self, Header};
use crate::page::{self, PageKind, HEADER_LEN, PAGE_SIZE};
use crate::state::{Mapping, Scratch, ScratchPage, SnapshotRegistry, State};
use crate::txn::{ReadTransaction, WriteTransaction};

use crate::layout::{DATA_FILE, INDEXES_DIR, JOURNALS_DIR, LOCK_FILE};

// The storage's open, by concern (`storage/`): the classification of a directory's files and
// creation, the `LOCK`, and journal replay.
mod damage;
mod lock;
mod readers;
mod replay;

pub(crate) use damage::{
    classify_data_file, init_files, missing_data_file_is_damage, read_header,
    read_header_or_damage, read_header_pages, unfinished_backup, DataFile,
};
pub(crate) use lock::{take_lock, writer_live, Lock};
pub use readers::ReaderInfo;
use replay::recover;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Which journal a storage's commits go to.
pub(crate) enum Binding {
    /// Its own journal in its own `Journals/` (a standalone storage, separate-journals mode, or
    /// any storage of a read-only database). `lock` is its LOCK when the caller (a database, for
    /// its root) already holds it. `borrowed`: journal files (number, path) that its
    /// `Journals/` lacks although they hold its records, read through another name of the same
    /// file (a read-only database open, which repairs nothing: docs/design.md 6.1).
    Own {
        lock: Option<Lock>,
        borrowed: Vec<(u64, PathBuf)>,
        /// A read-only database's point in its shared journal (design.md 6.5): replay stops
        /// there, and the header must be the one read before the point was taken.
        at: Option<OnePoint>,
    },
    /// A database's shared journal. `rel` is the storage's path relative to the root (empty for
    /// the root); `lock` is the root's LOCK, already held by the database.
    Shared {
        journal: Arc<Journal>,
        rel: String,
        lock: Option<Lock>,
    },
}

/// One point of a database's shared journal at which a read-only open beside a live writer
/// reads every storage (design.md 6.5): records in files numbered above `file`, or at or past
/// `offset` in it, are not replayed; `sequence` is the storage's header sequence read before
/// the point was taken, and the open fails (to be tried again) when the header it reads
/// differs, before or after its replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OnePoint {
    pub file: u64,
    pub offset: u64,
    pub sequence: Option<u64>,
}

/// What one flush did ([`Storage::flush`], [`crate::Database::flush`]). Page counts are 8 KiB
/// pages (an overflow run counts its pages), sizes are bytes.
///
/// A flush writes only up to the oldest live snapshot (design.md invariant I4): with an older
/// snapshot held, the pages committed after it stay in the scratch table (memory, and the
/// journal) until it ends, and are counted in [`FlushReport::pages_held_back`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlushReport {
    /// Transaction id the data file and its durable header reach after this flush.
    pub flushed_txn: u64,
    /// Pages written to the data file by this flush (header pages not counted).
    pub pages_written: u64,
    /// Bytes written to the data file by this flush (header pages not counted).
    pub bytes_written: u64,
    /// Pages committed but not written because a live snapshot older than them holds the
    /// flush back: they stay in the scratch table until it ends.
    pub pages_held_back: u64,
    /// Bytes of those pages.
    pub bytes_held_back: u64,
    /// The txn id of the snapshot that limited this flush, when one did (the flush stopped
    /// at it instead of the last committed transaction).
    pub limited_by_snapshot: Option<u64>,
    /// Aligned 1 MiB runs punched by this flush.
    pub runs_punched: u64,
    /// Journal files this storage's `Journals/` released.
    pub journals_deleted: u64,
}

impl FlushReport {
    /// Adds `o`'s counts to this report (a database's flush sums its storages): the counters
    /// are summed; `flushed_txn` and `limited_by_snapshot` stay this report's unless unset.
    pub(crate) fn add(&mut self, o: &FlushReport) {
        self.pages_written += o.pages_written;
        self.bytes_written += o.bytes_written;
        self.pages_held_back += o.pages_held_back;
        self.bytes_held_back += o.bytes_held_back;
        self.runs_punched += o.runs_punched;
        self.journals_deleted += o.journals_deleted;
        self.limited_by_snapshot = self.limited_by_snapshot.or(o.limited_by_snapshot);
    }
}

/// The flush, as a storage calls it. `flush.rs` builds on this module and provides them; a
/// storage is given them when it is opened ([`Storage::open_with`]), so this module never
/// names the flush (the dependency points one way).
#[derive(Debug)]
pub(crate) struct FlushHooks {
    /// Called once a writable storage is recovered: writes what was replayed to the data file
    /// and drops journal files fully flushed, makes both header slots hold the newest header,
    /// and joins the background flush service ([`FlushMode::Background`], setting
    /// `Inner::flusher`).
    pub opened: fn(&Arc<Inner>) -> Result<()>,
    /// Flushes the storage up to its oldest live snapshot (design.md 5).
    pub flush: fn(&Inner) -> Result<FlushReport>,
    /// Wakes the background flush service: a commit crossed a flush threshold.
    pub signal: fn(),
}

/// Leaves the background flush service: returns once the service no longer flushes or holds
/// the storage (unless called on the service thread itself).
pub(crate) type LeaveFlushService = Box<dyn FnOnce() + Send>;

/// The writer's state between transactions (taken by the open write transaction).
#[derive(Debug)]
pub(crate) struct WriterState {
    pub alloc: Allocator,
    /// The last write transaction's page maps, emptied (`txn::TxnMaps`).
    pub maps: crate::txn::TxnMaps,
}

/// Who holds the writer (design.md 16.1). Normally a write transaction takes the writer's
/// state (`state`) and gives it back at its end. A background apply of the write buffer
/// *lends* it (`lent`) for as long as it writes the buffer into the tree: meanwhile at most one
/// *logical-only* write transaction at a time may be open (`logical_open`), which buffers its
/// operations and commits without the writer's state; the apply publishes only while none is
/// open (`finishing` keeps a new one from beginning).
#[derive(Debug, Default)]
pub(crate) struct WriterSlot {
    /// The writer's state while no transaction (and no background apply) holds it. Boxed: it
    /// moves into each write transaction and back as a pointer.
    state: Option<Box<WriterState>>,
    /// `begin_write` calls waiting: a commit wakes one only when one waits
    /// (`Condvar::notify_one` is a `futex` system call even with nobody waiting, one per serial
    /// commit).
    waiting: usize,
    /// A background apply holds `state`.
    lent: bool,
    /// A logical-only write transaction is open (only while `lent`, or while such a
    /// transaction takes the state back: `Inner::reclaim_writer`).
    logical_open: bool,
    /// The background apply waits to publish, or publishes: no logical-only transaction begins.
    finishing: bool,
}

/// State owned by the flush (one flush at a time).
#[derive(Debug)]
pub(crate) struct FlushState {
    /// Sequence of the newest header written.
    pub header_seq: u64,
    /// Slot (0 or 1) the newest header is in.
    pub header_slot: u64,
    /// Aligned 1 MiB runs currently punched.
    pub punched: BTreeSet<u64>,
    /// False after the file system answered EOPNOTSUPP.
    pub punching: bool,
    /// The newest header written (the durable one once its flush returned): a flush that only
    /// changes the journal's start statement rewrites it with the new statement.
    pub header: Header,
    /// Pages the commits flushed by the last flush that wrote pages allocated: about what
    /// the commits until the next flush will allocate again, from the lowest free pages. That
    /// many pages of the lowest wholly free runs are left unpunched (see `flush::punch`).
    pub reuse_slack: u64,
}

/// What [`Storage::compact`] did. Sizes are bytes: the data file's length, and the bytes it
/// occupies on disk (`st_blocks * 512`, holes not counted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompactReport {
    /// Pages (8 KiB) moved toward the start of the file (an overflow run counts its pages).
    pub pages_moved: u64,
    /// Transactions that moved pages.
    pub passes: u64,
    /// Length of the data file before.
    pub data_file_bytes_before: u64,
    /// Length of the data file after.
    pub data_file_bytes_after: u64,
    /// Bytes on disk before.
    pub allocated_bytes_before: u64,
    /// Bytes on disk after.
    pub allocated_bytes_after: u64,
    /// True when the data file was truncated.
    pub truncated: bool,
    /// The txn id of a live snapshot that limited compaction (held flushes back, or kept the
    /// file from being truncated): call again once it ended.
    pub limited_by_snapshot: Option<u64>,
    /// Non-zero when compaction was skipped (or stopped before its next pass) because this
    /// many read-only openers in other processes held reader slots (design.md 6.5): pages a
    /// reader may read are never reused, so moving pages then would only grow the file. Call
    /// again once they closed.
    pub skipped_for_readers: u64,
}

/// Counters and sizes of one storage. Page counts are 8 KiB pages, sizes are bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StorageStats {
    /// Last committed (durable, visible) transaction id.
    pub last_committed_txn: u64,
    /// Last transaction whose pages are in the data file under a durable header.
    pub last_flushed_txn: u64,
    /// Keys stored.
    pub entries: u64,
    /// Pages in use (tree, overflow, free-space map and the two header pages).
    pub pages_used: u64,
    /// Pages free in the free-space map (reusable, waiting for old snapshots, or punched).
    pub pages_free: u64,
    /// Length of the data file in bytes.
    pub data_file_bytes: u64,
    /// Bytes the data file occupies on disk (`st_blocks * 512`).
    pub allocated_bytes: u64,
    /// Journal files in this storage's `Journals/`.
    pub journal_files: u64,
    /// Bytes of unflushed page images held in the scratch table.
    pub scratch_bytes: u64,
    /// Pages in the scratch table.
    pub scratch_pages: u64,
    /// Aligned 1 MiB runs punched since open (cumulative `fallocate(PUNCH_HOLE)` calls).
    pub holes_punched: u64,
    /// Flushes completed since open.
    pub flushes: u64,
    /// Pages (8 KiB) written to the data file by flushes since open, headers not counted.
    /// Images of pages freed before a flush's target are not written.
    pub pages_flushed: u64,
    /// Page images journaled by commits since open (a run of overflow pages counts once).
    pub pages_journaled: u64,
    /// Of [`StorageStats::pages_journaled`], those written as a page diff instead of a full
    /// image (design.md invariant I9): a tree page against the page it was copied from, a
    /// free-space bitmap page against its own previous version.
    pub pages_journaled_as_diffs: u64,
    /// The journal writer's counters (commits, batches, fdatasyncs, ...).
    pub journal: JournalStats,
    /// Entries the write buffer holds, not yet applied to the tree
    /// ([`Options::write_buffer_bytes`]; 0 without one). A key put or deleted again by a later
    /// commit counts once per run of the buffer that holds it until those runs merge
    /// (docs/design.md section 16), as [`StorageStats::buffer_bytes`] counts its bytes: what
    /// the buffer holds in memory, not the keys it changes (for those, `len`).
    pub buffer_entries: u64,
    /// Bytes the write buffer counts for (each entry its key, its value and 16 bytes).
    pub buffer_bytes: u64,
    /// Page commits since this open that were apply steps ([`Storage::set_apply_step_pages`]):
    /// part of the buffer applied, the rest carried. Starts at 0 at each open.
    pub apply_steps: u64,
    /// Background applies of the write buffer published since this open (design.md 16.1): the
    /// flush service wrote a full or aged buffer into the tree while commits went on. Starts
    /// at 0 at each open.
    pub background_applies: u64,
    /// This storage's journal records replayed into memory since open: at the open's recovery,
    /// and, for a read-only open, by each [`Storage::catch_up`] (or
    /// [`crate::Database::catch_up`]): the records after those it had replayed while the
    /// durable header is the one it read, every record after the header otherwise.
    pub journal_records_replayed: u64,
}

pub(crate) struct Inner {
    /// An index storage kept by the actor runtime: its snapshots leave its applied record (the
    /// key `0x00`) out (design.md 10.1; [`Storage::hide_reserved_key`]).
    hide_reserved: AtomicBool,
    /// The most bytes the write buffer holds before a commit applies it: 0 for none
    /// ([`Options::write_buffer_bytes`] at open; [`Storage::set_write_buffer_bytes`]).
    pub buffer_limit: AtomicU64,
    /// The bytes of this storage's current buffer counted in [`crate::live_buffer_bytes`]
    /// (written under `publish`).
    buffer_counted: AtomicU64,
    /// Most pages an apply that a commit must make copies before it stops and leaves the rest
    /// buffered (an apply step); 0: the whole buffer at once ([`Storage::set_apply_step_pages`]).
    pub apply_step_pages: AtomicU64,
    pub path: PathBuf,
    pub data_path: Arc<PathBuf>,
    pub journals_dir: PathBuf,
    pub env: Arc<dyn StorageEnv>,
    pub opts: Options,
    pub storage_id: u64,
    /// The `LOCK` file: the writers' `flock` and the reader table (`storage/readers.rs`).
    pub lock_file: Lock,
    /// Journal files read through another name at open (a read-only database's storage whose
    /// own name is missing), read again by [`Storage::catch_up`].
    borrowed: Vec<(u64, PathBuf)>,
    /// Set by a read-only [`crate::Database`] open for each of its storages: catching one up
    /// alone could show one part of a group transaction without the others.
    pub in_database: AtomicBool,
    /// A read-only open's position in the journal: the durable header its state was replayed
    /// after and where that replay ended (`Storage::catch_up` goes on from there).
    pub replay_pos: Mutex<Option<ReplayPos>>,
    /// [`StorageStats::journal_records_replayed`].
    pub records_replayed: AtomicU64,
    pub data: Arc<dyn EnvFile>,
    /// How flushes write the data file, and why ([`crate::write_mode::resolve`]), resolved on
    /// first need (the first flush that writes pages, or [`Storage::write_mode`]): `Auto`'s
    /// probe then costs an open nothing.
    write_mode: std::sync::OnceLock<(crate::env::WriteMode, String)>,
    pub current: ArcSwap<State>,
    pub registry: SnapshotRegistry,
    publish: Mutex<()>,
    /// The writer's state while no transaction holds it, and who waits for it ([`WriterSlot`]).
    writer: Mutex<WriterSlot>,
    writer_cv: Condvar,
    /// Set by a logical-only write transaction that needs the writer's state back (a range
    /// delete, a compaction move): the background apply holding it gives up at its next check
    /// (`txn/write/background.rs`).
    pub apply_cancel: AtomicBool,
    /// Background applies published since open (design.md 16.1).
    pub background_applies: AtomicU64,
    pub flush_state: Mutex<FlushState>,
    pub journal: Arc<Journal>,
    poisoned: Mutex<Option<String>>,
    pub file_len: AtomicU64,
    /// The end of the data file for readers of every [`Mapping`] of this storage: `u64::MAX`
    /// until [`Inner::trim_tail`] cuts the file, then the new length. A page at or past it is
    /// refused as corruption instead of touched (a mapped byte past the end of the file is
    /// `SIGBUS`).
    pub map_end: Arc<AtomicU64>,
    pub closed: AtomicBool,
    /// Set by [`Storage::close`] and the last handle's drop before their flush: that flush
    /// keeps no punch slack and cuts the free tail of the data file (no commit follows).
    pub closing: AtomicBool,
    /// Writes refused because the database this storage belongs to has damaged storages.
    refused: Mutex<Option<Vec<String>>>,
    pub holes_punched: AtomicU64,
    /// Page images journaled since open, and those journaled as diffs.
    pub pages_journaled: AtomicU64,
    pub pages_journaled_as_diffs: AtomicU64,
    /// Page commits since open that were apply steps.
    pub apply_steps: AtomicU64,
    pub flushes: AtomicU64,
    pub pages_flushed: AtomicU64,
    /// Flush latency and pages, recorded once per flush (`crate::metrics`).
    pub flush_recorders: crate::metrics::FlushRecorders,
    /// Pages freed by commits since the last flush began: they wait for a durable header
    /// before reuse, so they count toward the flush threshold like scratch bytes.
    pub freed_unflushed: AtomicU64,
    /// Pages allocated by commits since the last flush started (its punch slack).
    pub allocated_unflushed: AtomicU64,
    /// The highest target txn of any flush started since open (the durable header's txn at
    /// open). A page whose freed version was written by a txn above it has never been, and
    /// never will be, in the data file: see `Allocator::early`.
    pub flush_started: AtomicU64,
    /// The txn id of the last commit that lowered next page ([`Storage::compact`]): the data
    /// file is cut only once no live state and no replayable record is older.
    pub last_shrink: AtomicU64,
    /// The flush's entry points (see [`FlushHooks`]).
    pub flush_hooks: &'static FlushHooks,
    /// Membership in the background flush service (`FlushMode::Background`).
    pub flusher: Mutex<Option<LeaveFlushService>>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Storage({})", self.path.display())
    }
}

/// A handle to one open storage: a directory with its own single-writer ACID transactions
/// over a copy-on-write B+tree of 8 KiB pages. Cheap to clone (`Arc`), `Send + Sync`.
///
/// Writes: one [`WriteTransaction`] at a time; a second [`Storage::begin_write`] waits until
/// the first commits or aborts ([`Storage::try_begin_write`] fails instead). Reads:
/// [`Storage::begin_read`] never blocks and takes no lock.
#[derive(Clone, Debug)]
pub struct Storage {
    pub(crate) inner: Arc<Inner>,
    _last: Arc<LastHandle>,
}

/// Dropped with the last [`Storage`] clone: stops and joins the flusher and flushes, so the
/// lock is released as soon as the last handle is gone (not whenever a background thread lets
/// go of it), unless a write transaction is still open: it holds the storage, and the lock,
/// until it ends (its commit then fails with `Closed`).
#[derive(Debug)]
struct LastHandle(Arc<Inner>);

impl Drop for Inner {
    fn drop(&mut self) {
        // The storage is gone: its buffer leaves the process count.
        crate::buffer::account(*self.buffer_counted.get_mut(), 0);
    }
}

impl Drop for LastHandle {
    fn drop(&mut self) {
        let inner = &self.0;
        if inner.opts.flush_on_close
            && !inner.closed.load(Ordering::Acquire)
            && inner.poisoned().is_none()
        {
            // As a close: the buffer goes into the tree unless a write transaction is open.
            if let Err(e) = inner.apply_buffer(false) {
                tracing::warn!(error = %e, "applying the write buffer on drop failed");
            }
        }
        inner.shutdown();
    }
}

impl Storage {
    /// Opens the storage in `path` bound to a journal as `binding` says, calling the flush
    /// through `flush_hooks`. [`Storage::open`] (in `flush.rs`) is the public entry.
    pub(crate) fn open_with(
        path: &Path,
        opts: Options,
        binding: Binding,
        flush_hooks: &'static FlushHooks,
    ) -> Result<Storage> {
        let inner = Inner::open(path, opts, binding, flush_hooks)?;
        Ok(Storage {
            _last: Arc::new(LastHandle(inner.clone())),
            inner,
        })
    }

    /// True when the directory `path` holds a storage: its data file exists (a plain storage
    /// made by [`Storage::open`], or a database's root or branch storage; see
    /// [`crate::Database::exists`] to tell a database). Reads directory entries only.
    pub fn exists(path: impl AsRef<Path>) -> bool {
        path.as_ref().join(DATA_FILE).is_file()
    }

    /// The storage directory.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The random 64-bit id that tags this storage's journal records.
    pub fn storage_id(&self) -> u64 {
        self.inner.storage_id
    }

    /// Starts the write transaction, waiting while another one is open.
    ///
    /// Errors: [`Error::ReadOnly`], [`Error::Poisoned`], [`Error::Closed`].
    pub fn begin_write(&self) -> Result<WriteTransaction> {
        self.inner.begin_write(true, true)
    }

    /// Starts the write transaction, or fails with [`Error::WriteInProgress`] when one is open.
    pub fn try_begin_write(&self) -> Result<WriteTransaction> {
        self.inner.begin_write(false, true)
    }

    /// Refreshes what the current map knows of its pages' residency in the page cache, 256 MiB
    /// of it a call (one `mincore`), in passes over the map that start only when reads used it
    /// since the last pass began ([`crate::ReadTransaction::get_if_resident`]). The actor
    /// engine's flushers call it every tick, on their I/O pool.
    pub(crate) fn refresh_residency(&self) {
        self.inner.current.load().mapping.refresh_residency();
    }

    /// Checks a few pages of the current map known resident against the page cache (one
    /// `mincore` of 16 pages at most), so that an eviction is noticed between refreshes
    /// (`Mapping::probe_residency`). The actor engine's readers call it after a read that a
    /// caller's thread sent them for a page not known resident. Returns whether it found one.
    pub(crate) fn probe_residency(&self) -> bool {
        self.inner.current.load().mapping.probe_residency()
    }

    /// A snapshot of the last committed state. Never blocks, takes no lock.
    ///
    /// Errors: [`Error::Closed`] after [`Storage::close`].
    pub fn begin_read(&self) -> Result<ReadTransaction> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        Ok(ReadTransaction::new(
            self.inner.current.load_full(),
            self.inner.hide_reserved.load(Ordering::Relaxed),
        ))
    }

    /// Marks the storage as an index kept by the actor runtime: from now on its snapshots leave
    /// the index's applied record (the key `0x00`) out of every view (design.md 10.1). For the
    /// handle of every storage that holds the same directory open.
    pub(crate) fn hide_reserved_key(&self) {
        self.inner.hide_reserved.store(true, Ordering::Relaxed);
    }

    /// Marks the storage as an index ([`Storage::hide_reserved_key`]) when its key `0x00` holds
    /// an index's applied record (design.md 10.1): a database's branch that an index defined
    /// in any open, whether or not the engine runs it now. Returns whether it is marked. A read
    /// that fails (a damaged page) marks nothing: the damage is reported by the reads.
    pub(crate) fn hide_if_index(&self) -> bool {
        let Ok(r) = self.begin_read() else {
            return false;
        };
        if matches!(r.get_reserved(crate::txn::RESERVED_KEY), Ok(Some(v)) if crate::txn::is_index_record(v))
        {
            self.hide_reserved_key();
        }
        self.inner.hide_reserved.load(Ordering::Relaxed)
    }

    /// True when the storage's snapshots leave the key `0x00` out (an index storage).
    pub(crate) fn hides_reserved_key(&self) -> bool {
        self.inner.hide_reserved.load(Ordering::Relaxed)
    }

    /// A read-only storage reads the state that was committed when it was opened (design.md
    /// 6.5); this reads the newest committed state again, as an open does (the durable header
    /// and the journal after it, replayed into memory), and makes it the state that
    /// [`Storage::begin_read`] returns from now on. Snapshots taken before stay as they were
    /// (their pages stay pinned in the reader table). Returns the txn id now read. On a
    /// writable storage it does nothing (its snapshots are always the newest).
    ///
    /// Cost: while the durable header is the one the current state was replayed after, it reads
    /// only the journal records written after those it replayed before (from the file and
    /// offset where that replay ended), so a catch-up costs the new records, not the whole
    /// unflushed journal; once a flush moved the header, it loads again from the new header
    /// (the journal after it). [`StorageStats::journal_records_replayed`] counts them.
    ///
    /// Errors: as a read-only [`Storage::open`]; [`Error::Closed`];
    /// [`Error::InvalidOptions`] on a storage of a read-only [`crate::Database`], where
    /// catching one storage up alone could show one part of a group transaction without the
    /// others: [`crate::Database::catch_up`] moves every storage to one point.
    pub fn catch_up(&self) -> Result<u64> {
        let inner = &self.inner;
        if inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if !inner.opts.read_only {
            return Ok(inner.current.load().txn_id);
        }
        if inner.in_database.load(Ordering::Acquire) {
            return Err(Error::InvalidOptions(
                "catch_up on a storage of a read-only database: Database::catch_up moves every storage to one point".into(),
            ));
        }
        let _g = self.publish_lock();
        let next = self.read_newer(None, &self.inner.borrowed)?;
        Ok(self.publish_caught_up(next))
    }

    /// Held while a read-only storage reads and publishes a newer state (one catch-up at a
    /// time; a database's catch-up holds every storage's).
    pub(crate) fn publish_lock(&self) -> MutexGuard<'_, ()> {
        lock(&self.inner.publish)
    }

    /// Reads a read-only storage's newest committed state, or its state at a database's point
    /// `at`, without publishing it ([`Storage::publish_caught_up`]); the caller holds
    /// [`Storage::publish_lock`]. While the durable header is the one the current state was
    /// replayed after, only the journal's records after the previous replay's end are read
    /// (`Source::load_after`); otherwise the state is loaded again from the header, as an open
    /// does (design.md 6.5).
    ///
    /// `borrowed`: the journal files (number, path) it reads through another name, its own
    /// being missing, as they are now (a database's catch-up surveys them again at each point:
    /// the names the open found are released by the writer in time, and reading them again
    /// failed every later catch-up of the storage with the same missing file).
    ///
    /// Errors: as a read-only [`Storage::open`]; with `at`, [`Error::AlreadyOpen`] when a
    /// writer moved the header meanwhile (the database takes a new point).
    pub(crate) fn read_newer(
        &self,
        at: Option<OnePoint>,
        borrowed: &[(u64, PathBuf)],
    ) -> Result<CaughtUp> {
        let inner = &self.inner;
        let cur = inner.current.load_full();
        let floor = inner.registry.oldest_live().map(|s| s.txn_id);
        let src = Source {
            env: &*inner.env,
            data: &inner.data,
            data_path: &inner.data_path,
            journals_dir: &inner.journals_dir,
            borrowed,
            map_end: &inner.map_end,
            at,
        };
        let len = inner.data.len()?;
        let pos = *lock(&inner.replay_pos);
        let (hdr, _, state, rec, len) = match pos.and_then(|p| src.load_after(&cur, p, len)) {
            Some(l) => {
                if let Some(slot) = inner.lock_file.slot() {
                    let t = l.2.txn_id;
                    slot.set_txn(floor.map_or(t, |f| f.min(t)));
                }
                l
            }
            None => src.load(len, inner.lock_file.slot(), floor)?,
        };
        Ok(CaughtUp {
            state,
            len,
            pos: ReplayPos {
                sequence: hdr.sequence,
                end: rec.end,
            },
            records: rec.records,
        })
    }

    /// Makes `next` (from [`Storage::read_newer`]) the state [`Storage::begin_read`] returns,
    /// unless the current one is as new; returns the txn id now read.
    pub(crate) fn publish_caught_up(&self, next: CaughtUp) -> u64 {
        let inner = &self.inner;
        *lock(&inner.replay_pos) = Some(next.pos);
        inner
            .records_replayed
            .fetch_add(next.records, Ordering::Relaxed);
        let cur = inner.current.load_full();
        if next.state.txn_id <= cur.txn_id {
            return cur.txn_id;
        }
        let state = Arc::new(next.state);
        inner.file_len.fetch_max(next.len, Ordering::AcqRel);
        inner.current.store(state.clone());
        inner.registry.register(&state);
        state.txn_id
    }

    /// The read-only openers in other open files of this storage's `LOCK` that are alive now:
    /// each one's pid and the oldest txn it reads (design.md 6.5). Empty where the storage has
    /// no reader table (a read-only open that took a shared `flock` or no lock).
    ///
    /// Errors: I/O errors of `fcntl` on `LOCK`.
    pub fn readers(&self) -> Result<Vec<ReaderInfo>> {
        match self.inner.lock_file.table() {
            Some(t) => t.live(),
            None => Ok(Vec::new()),
        }
    }

    /// Clears the reader slots of processes that died without freeing them (their slot lock
    /// is gone), so that their pinned pages can be reused; a writer does it at open and at each
    /// flush too. Returns how many slots it cleared.
    ///
    /// Errors: I/O errors of `fcntl` on `LOCK`.
    pub fn clear_dead_readers(&self) -> Result<usize> {
        match self.inner.lock_file.table() {
            Some(t) => t.sweep(),
            None => Ok(0),
        }
    }

    /// Writes every committed page to the data file, advances the header, punches free 1 MiB
    /// runs and deletes journal files that hold nothing unflushed (design.md 5). Pages that
    /// an older live snapshot still reads are held back until it ends (design.md invariant I4).
    ///
    /// Returns what it did ([`FlushReport`]): pages and bytes written, and, when
    /// an older snapshot held it back, that snapshot's txn id and the pages kept in the scratch
    /// table for it.
    ///
    /// Errors: an I/O error writing or syncing the data file (the storage is then poisoned);
    /// [`Error::Poisoned`].
    pub fn flush(&self) -> Result<FlushReport> {
        self.inner.apply_buffer(false)?;
        self.flush_pages()
    }

    /// The most bytes the write buffer holds before a commit applies it (0: no buffer):
    /// [`Options::write_buffer_bytes`] at open, or what [`Storage::set_write_buffer_bytes`]
    /// set since.
    pub fn write_buffer_bytes(&self) -> u64 {
        self.inner.buffer_limit.load(Ordering::Relaxed)
    }

    /// Sets the write buffer's size in bytes from the next write transaction on, for this open
    /// of the storage (the option is not stored: the next open takes
    /// [`Options::write_buffer_bytes`] again). 0 turns buffering off: the next commit applies
    /// what is buffered. Shrinking below what is buffered makes the next commit apply it.
    /// A read-only storage takes the value and never buffers (it never commits). Under the
    /// actor engine, leave the root of a database unbuffered (its open refuses the option for
    /// this reason): an apply there outside a documents commit makes every index reconcile at
    /// its next definition.
    pub fn set_write_buffer_bytes(&self, bytes: u64) {
        self.inner.buffer_limit.store(bytes, Ordering::Relaxed);
    }

    /// Sets the most pages an apply that a commit must make (the buffer full or aged) copies
    /// before it stops: 0 (the default at open) applies the whole buffer in one page
    /// transaction, whose dirty pages are as many as the leaves its entries land on. With
    /// `pages` > 0 the apply is a *step*: it groups the buffered entries by the tree's leaf
    /// they land in and applies whole leaves' worth, the leaves with the most entries pending
    /// first (as PerconaFT flushes its heaviest child; among equals, from where the last step
    /// ended, wrapping around at the last key), until the transaction has copied `pages` pages
    /// and what is left fits the buffer's size (so the buffer never grows past it by more than
    /// one transaction's operations), commits them with the entries still buffered, and
    /// leaves those for the next steps (design.md section 16, record kind 6). Each leaf copy
    /// then takes the most entries a leaf has pending, and one commit holds at most about
    /// `pages` pages of images. A commit that finds the buffer aged
    /// ([`Options::flush_max_age`]) but not full takes a step of no pages: its record journals
    /// the buffer anew, so that the buffer pins no older journal file. A transaction of 4,096
    /// operations or more (which writes the tree directly when the storage does not step) is
    /// buffered and stepped like the rest. Applies made for another reason (a flush, a close, a backup, a range delete,
    /// compaction) are whole.
    /// Not stored: the next open starts at 0. The actor engine sets it for the buffered index
    /// storages (1/16 of its memory budget, as an index batch's transactions).
    pub fn set_apply_step_pages(&self, pages: u64) {
        self.inner.apply_step_pages.store(pages, Ordering::Relaxed);
    }

    /// The most pages an apply step copies ([`Storage::set_apply_step_pages`]; 0: whole applies).
    pub fn apply_step_pages(&self) -> u64 {
        self.inner.apply_step_pages.load(Ordering::Relaxed)
    }

    /// [`Storage::flush`] without applying the write buffer first (the actor runtime's
    /// flushers: only a storage's actor takes its writer).
    pub(crate) fn flush_pages(&self) -> Result<FlushReport> {
        (self.inner.flush_hooks.flush)(&self.inner)
    }

    /// Writes a standalone copy of the last committed state into `dest` (a new directory, or
    /// an empty one) while writers go on: an online backup. The copy is consistent (exactly
    /// one snapshot: every commit up to its txn id, none after), opens with
    /// [`Storage::open`] on its own without any journal, and passes [`Storage::check`]. It is
    /// built from the snapshot's pages, wherever they are (scratch table or data file): the
    /// tree's pages at their page numbers (free pages stay holes: the file is sparse), a new
    /// free-space map, then the header pages; its storage id is new (design.md, section 12).
    /// Every page copied has its checksum verified. Writers are never blocked; the snapshot
    /// holds flushes at its txn id (and freed pages from reuse) until the copy is written.
    ///
    /// Errors: [`Error::DestinationInsideSource`] when `dest` lies inside this storage's directory;
    /// [`Error::DestinationNotEmpty`] when `dest` exists and is not an empty
    /// directory; [`Error::Closed`]; [`Error::Corruption`] for a damaged page of the snapshot;
    /// I/O errors with the operation and path, `ENOSPC` among them
    /// ([`Error::is_no_space`]). On any error, everything the backup wrote is removed again.
    ///
    /// A storage with a write buffer ([`crate::Options::write_buffer_bytes`]) is copied with
    /// it, taking no writer (so also read-only and beside a writer in another process): the
    /// copy's tree is the snapshot's, and its buffered entries, each key once with its newest
    /// operation, are one logical record in the copy's journal, which the copy's open puts
    /// back into its buffer (design.md 12).
    pub fn backup(&self, dest: impl AsRef<Path>) -> Result<crate::backup::BackupReport> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        // The current state as published: buffered entries go into the copy's journal
        // (`backup::write_copy`), so no writer is needed, in this process or another.
        let state = self.inner.current.load_full();
        crate::backup::check_outside(&self.inner.path, dest.as_ref())?;
        let index = self.hides_reserved_key();
        crate::backup::backup_storage(&self.inner.env, &state, dest.as_ref(), index)
    }

    /// Compacts the data file: moves the pages in use toward its start, then shrinks it.
    ///
    /// 1. Passes (at most 8), each a flush (so pages freed by earlier commits become reusable)
    ///    then one write transaction that moves every tree page, overflow run and free-space
    ///    map page above a limit (the pages in use plus slack) into free pages below it. The
    ///    moves are ordinary copy-on-write: the moved pages are new pages of the commit, their
    ///    old numbers are freed, readers and recovery see nothing special.
    /// 2. A flush, then a transaction that lowers the state's next page over the free tail
    ///    (only pages the writer may reuse now: none a snapshot or a journal record still
    ///    needs), then a flush, so the durable header names the shorter page space.
    /// 3. Only then, holding the writer (no commit grows the file meanwhile) and when no live
    ///    snapshot is older than that transaction, `ftruncate` the data file to the new next
    ///    page and map it again.
    ///
    /// A crash at any point loses nothing: before step 3's truncation the file is only longer
    /// than the header needs (as after any growth), and the truncation cuts only pages above
    /// every state's next page (design.md, section 13).
    ///
    /// With an older snapshot held it does what it safely can: moves into pages already
    /// reusable, no truncation (the snapshot may read the tail), and
    /// [`CompactReport::limited_by_snapshot`] says so; call it again once the snapshot ended.
    /// Writers wait for each of compaction's transactions as for any other; readers never.
    ///
    /// Beside a reader in another process (a read-only open holding a slot of the reader table,
    /// design.md 6.5) it does nothing: the pages such a reader may read cannot be reused, so
    /// moving pages would only add pages at the end of the file.
    /// [`CompactReport::skipped_for_readers`] then counts the live slots (dead readers' slots
    /// are cleared first), and the data file is left as it was; call it again once they closed
    /// or caught up. A reader that takes a slot while it runs stops it before its next pass.
    ///
    /// Errors: [`Error::Closed`], [`Error::ReadOnly`], [`Error::Poisoned`]; the flushes' and
    /// commits' errors; an I/O error of `ftruncate` (nothing lost: the file stays longer) or of
    /// `fcntl` on `LOCK` (reading the reader table).
    pub fn compact(&self) -> Result<CompactReport> {
        self.compact_counting().map(|(r, _)| r)
    }

    /// Live reader slots of other open files of `LOCK`, dead ones cleared first (0 without a
    /// reader table).
    fn live_readers(&self) -> Result<u64> {
        if self.inner.lock_file.table().is_none() || self.inner.other_readers().is_none() {
            return Ok(0);
        }
        self.clear_dead_readers()?;
        Ok(self.readers()?.len() as u64)
    }

    /// [`Storage::compact`], and the number of transactions it committed (a database's index
    /// records move past the root's compaction commits, design.md 13).
    pub(crate) fn compact_counting(&self) -> Result<(CompactReport, u64)> {
        self.inner.check_writable()?;
        let mut report = CompactReport {
            data_file_bytes_before: self.inner.data.len()?,
            allocated_bytes_before: self.inner.data.allocated_bytes()?,
            ..Default::default()
        };
        let mut commits = 0u64;
        report.skipped_for_readers = self.live_readers()?;
        if report.skipped_for_readers > 0 {
            report.data_file_bytes_after = report.data_file_bytes_before;
            report.allocated_bytes_after = self.inner.data.allocated_bytes()?;
            return Ok((report, 0));
        }
        let mut note = |f: &FlushReport| {
            if f.limited_by_snapshot.is_some() {
                report.limited_by_snapshot = f.limited_by_snapshot;
            }
        };
        // Bounded: at most 8 passes.
        for _ in 0..8 {
            note(&self.flush()?);
            let readers = self.live_readers()?;
            if readers > 0 {
                // A reader came meanwhile: further moves would only grow the file.
                report.skipped_for_readers = readers;
                break;
            }
            let mut w = self.inner.begin_write(true, false)?;
            let Some(limit) = w.compaction_limit() else {
                break;
            };
            let moved = w.relocate_above(limit)?;
            if moved == 0 {
                break;
            }
            w.commit()?;
            commits += 1;
            report.pages_moved += moved;
            report.passes += 1;
        }
        note(&self.flush()?);
        let mut w = self.inner.begin_write(true, false)?;
        let shrink_txn = w.txn_id();
        let shrunk = w.shrink_tail()?;
        if shrunk.is_some() {
            w.commit()?;
            commits += 1;
            self.inner
                .last_shrink
                .fetch_max(shrink_txn, Ordering::AcqRel);
            note(&self.flush()?);
        } else {
            drop(w);
        }
        // Truncate, holding the writer: no commit grows the file while it is cut.
        let w = self.inner.begin_write(true, false)?;
        {
            let mut fs = lock(&self.inner.flush_state);
            let cur = self.inner.current.load_full();
            let oldest = self
                .inner
                .registry
                .oldest_live()
                .map_or(cur.txn_id, |s| s.txn_id);
            let new_len = cur.next_page * PAGE_SIZE as u64;
            let len = self.inner.data.len()?;
            // States from the last shrink on have a next page no higher than the current one
            // (it only grows after a shrink): with none older alive, and the durable header
            // past it (recovery replays nothing older), no one reads above the new end.
            let shrink = self.inner.last_shrink.load(Ordering::Acquire);
            // A reader in another process may read a state from before a shrink of this or an
            // earlier open: no cut while one reads an older state than this one.
            let other_old = self.inner.other_readers().is_some_and(|r| r < cur.txn_id);
            if oldest < shrink || cur.flushed_txn < shrink || other_old {
                report.limited_by_snapshot = Some(self.inner.oldest_reader(oldest));
            } else if new_len < len {
                self.inner.data.set_len(new_len)?;
                self.inner.file_len.store(new_len, Ordering::Release);
                let runs = new_len / (crate::freespace::RUN_PAGES * PAGE_SIZE as u64);
                fs.punched.retain(|r| *r < runs);
                let mapping = Arc::new(Mapping::new(
                    &self.inner.data,
                    new_len,
                    self.inner.data_path.clone(),
                    self.inner.map_end.clone(),
                )?);
                self.inner.publish_mapping(mapping);
                report.truncated = true;
            }
        }
        drop(w);
        report.data_file_bytes_after = self.inner.data.len()?;
        report.allocated_bytes_after = self.inner.data.allocated_bytes()?;
        Ok((report, commits))
    }

    /// Makes every commit acknowledged so far durable: the eventual commits
    /// ([`crate::Durability::Eventual`]) still queued for this storage's journal (of every
    /// storage sharing it) are written and synced, or, when a batch holding some is being
    /// written, that batch is waited for. Returns at once when none is queued (no I/O).
    ///
    /// Errors: the batch's I/O error (the journal and its storages are then poisoned, and the
    /// cause names the eventual commits lost); [`Error::Poisoned`]; [`Error::Closed`].
    pub fn sync_journal(&self) -> Result<()> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        self.inner.journal.sync_queued()
    }

    /// How flushes write this storage's data file ([`crate::WriteMode`], never `Auto`: the
    /// mode `Auto` picked) and why, e.g. `"auto: measured on this device (mmap 900 µs, ...)"`.
    pub fn write_mode(&self) -> (crate::WriteMode, String) {
        self.inner.write_mode().clone()
    }

    /// How this storage's journal writes batches ([`crate::JournalIo`], never `Auto`: the path
    /// `Auto` picked) and why, e.g. `"auto: measured on this device (syscalls 131 µs, ring 152
    /// µs)"`. A storage of a database with a shared journal reports the shared journal's; a
    /// read-only open reports `Syscalls` ("opened read-only": it writes nothing).
    pub fn journal_io(&self) -> (crate::JournalIo, String) {
        self.inner.journal.io_path()
    }

    /// Sizes and counters (see [`StorageStats`]).
    pub fn stats(&self) -> StorageStats {
        self.inner.stats()
    }

    /// Latency histograms and counters since open, in memory (see [`crate::Metrics`]): this
    /// storage's flushes, and the journal it writes to (a storage of a database with a shared
    /// journal reports that whole journal's commits; [`crate::Database::metrics`] has the
    /// database's flushes too). Takes a few short locks; no I/O.
    pub fn metrics(&self) -> crate::Metrics {
        let mut g = crate::metrics::Gather::default();
        self.inner.journal.gather_metrics(&mut g);
        self.inner.gather_flush_metrics(&mut g);
        g.finish()
    }

    /// Checks the last committed state: every page checksum, key order and bounds, equal leaf
    /// depth, overflow runs, and the free-space map (every page in use or free, never both).
    /// Problems are listed in the report, causes only: a damaged page is one problem, and the
    /// pages it hides (below it, or covered by a damaged free-space page) are one summary,
    /// [`CheckReport::hidden`], not leaks. `Err` only when the storage is closed. With a write
    /// buffer, the check covers the tree: buffered entries (their records passed their checksums
    /// when the journal was written or replayed) are not in it, and
    /// [`CheckReport::entries`] counts the tree's keys ([`StorageStats::buffer_entries`] says
    /// how many are buffered). On a read-only storage it keeps writers in other processes out
    /// while it runs (a shared `flock` on `LOCK`: a read-write open meanwhile fails with
    /// [`Error::AlreadyOpen`]); when a writer holds the storage already, it checks the tree only
    /// ([`CheckReport::free_space_checked`] false), the writer updating the free-space map and
    /// the header slots in place.
    pub fn check(&self) -> Result<CheckReport> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        // Free-space pages are updated in place; holding the flush lock keeps the checked
        // state's free-space map from being overwritten by a newer flushed version meanwhile.
        let _flush = lock(&self.inner.flush_state);
        // A read-only storage with a reader slot keeps writers in other processes out for the
        // check (a shared `flock`); beside a live one it checks the tree only: the writer
        // updates the map's pages and the header slots in place (design.md 6.5).
        let exclusion = match self.inner.lock_file.table() {
            Some(t) if self.inner.opts.read_only => Some(t.exclude_writers()),
            _ => None,
        };
        let free_space = exclusion.as_ref().is_none_or(|g| g.is_some());
        let s = self.inner.current.load_full();
        let mut report = crate::btree::check(&s, free_space);
        if !free_space {
            return Ok(report);
        }
        // The header slots are read from the file: readers never use them after the open, so
        // only a check sees one that was damaged since (or torn by a crash).
        let pages = read_header_pages(&*self.inner.data, &self.inner.data_path).ok();
        for slot in 0..2u64 {
            let valid = pages.as_ref().is_some_and(|p| {
                matches!(
                    header::decode(&p[slot as usize], slot),
                    header::Slot::Valid(_)
                )
            });
            if !valid {
                report.header_slots_damaged.push(slot);
            }
        }
        Ok(report)
    }

    /// Flushes (or, with `flush_on_close` off, makes the queued eventual commits durable in
    /// the journal), stops the background flusher and marks this storage closed: later calls
    /// on any clone fail with [`Error::Closed`]. The lock is released when the last clone is
    /// dropped.
    ///
    /// Errors: the flush's or journal sync's error (committed data stays safe in the journal;
    /// eventual commits not yet written are then lost, and named in the poisoning cause).
    pub fn close(self) -> Result<()> {
        let r = if self.inner.opts.read_only || self.inner.poisoned().is_some() {
            Ok(())
        } else if !self.inner.opts.flush_on_close {
            self.inner.journal.sync_queued()
        } else {
            self.inner.closing.store(true, Ordering::Release);
            // The buffer goes into the tree, unless a write transaction is open (on this
            // thread, it would never end): its entries then stay in the journal, replayed at
            // the next open.
            self.inner
                .apply_buffer(false)
                .and_then(|()| self.flush())
                .map(|_| ())
        };
        self.inner.closed.store(true, Ordering::Release);
        self.inner.stop_flusher();
        r
    }

    /// Closes this storage without flushing (its directory is about to be deleted).
    pub(crate) fn close_for_drop(&self) {
        self.inner.closed.store(true, Ordering::Release);
        self.inner.stop_flusher();
    }

    /// The journal this storage commits to.
    pub(crate) fn journal(&self) -> &Arc<Journal> {
        &self.inner.journal
    }

    /// True when a flush is due: the scratch table passed its size or age threshold, or the
    /// storage holds records in a journal file that is no longer current (bounded retention).
    /// The actor runtime's flushers poll this.
    pub fn flush_due(&self) -> bool {
        self.inner.needs_flush() || self.inner.journal.pins_old_file(self.inner.storage_id)
    }

    /// Grows the data file (`fallocate`, in steps of 1/8 of its size, 1 MiB to 64 MiB) so that
    /// it holds at least `pages` pages of 8 KiB; does nothing when it already does. A write
    /// transaction's commit grows the file itself when it must
    /// ([`crate::WriteTransaction::prepare`]); the actor runtime calls this first on its journal
    /// I/O pool for a transaction that needs it ([`crate::WriteTransaction::data_file_growth`]),
    /// so that no executor waits for `fallocate`. Blocking: one `fallocate` when the file is too
    /// short.
    ///
    /// Errors: [`Error::Closed`], [`Error::ReadOnly`], [`Error::Poisoned`]; the `fallocate`
    /// error (`ENOSPC` when the file system is full: nothing is lost and the storage stays
    /// usable).
    pub(crate) fn grow_data_file(&self, pages: u64) -> Result<()> {
        self.inner.check_writable()?;
        self.inner.ensure_data_len(pages)
    }

    /// Bytes a flush would give back: the scratch table's page images (memory) plus the pages
    /// freed since the last flush (data file space that cannot be reused until a flush).
    /// Cheap (two atomic loads).
    pub fn unflushed_bytes(&self) -> u64 {
        self.inner.unflushed_bytes()
    }

    /// Bytes of page images in the scratch table: committed pages not yet in the data file,
    /// held in memory until a flush. Cheap (one atomic load); the engine's flushers hold the
    /// sum over all storages under their memory budget with it.
    pub fn scratch_bytes(&self) -> u64 {
        self.inner.current.load().scratch_bytes
    }

    /// Poisons the storage and its journal (an actor that panicked while writing it).
    pub(crate) fn poison(&self, cause: &str) {
        let e = Error::Poisoned {
            cause: cause.to_string(),
        };
        self.inner.poison(&e);
        self.inner.journal.poison(cause.to_string());
    }

    /// True after an I/O failure poisoned the storage.
    pub fn is_poisoned(&self) -> bool {
        self.inner.poisoned().is_some()
    }
}

impl Inner {
    fn open(
        path: &Path,
        opts: Options,
        binding: Binding,
        flush_hooks: &'static FlushHooks,
    ) -> Result<Arc<Inner>> {
        let lock_path = path.join(LOCK_FILE);
        // Only a LOCK this open creates itself is removed again when it fails (one a database
        // holds for its storage stays with the database).
        let takes_lock = matches!(
            binding,
            Binding::Own { lock: None, .. } | Binding::Shared { lock: None, .. }
        );
        let lock_existed = !takes_lock || lock_path.exists();
        // Built once per process, here rather than inside the first commit.
        crate::page::init_seal_tables();
        let read_only = opts.read_only;
        // INFO: an open (and its recovery, whose events nest in this span) is not steady state.
        let _span = tracing::info_span!("open storage", path = %path.display()).entered();
        let timed = tracing::enabled!(tracing::Level::DEBUG).then(Instant::now);
        let r = Inner::open_inner(path, opts, binding, flush_hooks);
        if r.is_err() && !lock_existed && !read_only {
            // A refused open creates nothing: leave the directory as it was.
            let _ = std::fs::remove_file(&lock_path);
        }
        if let (Some(t), Ok(inner)) = (timed, &r) {
            let st = inner.current.load();
            tracing::debug!(
                txn = st.txn_id,
                flushed_txn = st.flushed_txn,
                read_only,
                us = t.elapsed().as_micros() as u64,
                "storage opened"
            );
        }
        r
    }

    fn open_inner(
        path: &Path,
        opts: Options,
        binding: Binding,
        flush_hooks: &'static FlushHooks,
    ) -> Result<Arc<Inner>> {
        opts.validate()?;
        // Every operation retries EINTR/EAGAIN a bounded number of times (`env::retry`).
        let mut opts = opts;
        opts.env = crate::env::retry::wrap(opts.env);
        let env = opts.env.clone();
        let path = path.to_path_buf();
        let data_path = Arc::new(path.join(DATA_FILE));
        let journals_dir = path.join(JOURNALS_DIR);
        let mut created_dir = false;
        if !env.exists(&path) {
            if !opts.create || opts.read_only {
                return Err(Error::NotAStorage {
                    path,
                    reason: "the directory does not exist".into(),
                });
            }
            env.create_dir(&path)?;
            created_dir = true;
        }
        // The lock first: nothing is read or written before it is held.
        let (binding, held, borrowed, at) = match binding {
            Binding::Shared { journal, rel, lock } => {
                (Some((journal, rel)), lock, Vec::new(), None)
            }
            Binding::Own { lock, borrowed, at } => (None, lock, borrowed, at),
        };
        let lock_file = match held {
            Some(f) => f,
            None => take_lock(&path, opts.read_only)?,
        };
        let names = env.list_dir(&path)?;
        let has_data = names.iter().any(|n| n == DATA_FILE);
        if !has_data {
            if let Some(e) = unfinished_backup(&path, &names) {
                return Err(e);
            }
            if let Some(e) = missing_data_file_is_damage(&*env, &path, &data_path)? {
                return Err(e);
            }
        }
        if !has_data {
            let foreign: Vec<&String> = names
                .iter()
                .filter(|n| *n != LOCK_FILE && *n != JOURNALS_DIR && *n != INDEXES_DIR)
                .collect();
            if !foreign.is_empty() {
                return Err(Error::NotAStorage {
                    path,
                    reason: format!(
                        "no {DATA_FILE}, and the directory holds other files ({})",
                        foreign[0]
                    ),
                });
            }
            if !opts.create || opts.read_only {
                return Err(Error::NotAStorage {
                    path,
                    reason: format!("no {DATA_FILE}"),
                });
            }
        }
        let data = env.open(
            &data_path,
            if opts.read_only {
                OpenMode::ReadOnly
            } else {
                OpenMode::Create
            },
        )?;
        let mut len = data.len()?;
        if classify_data_file(&*env, &path, &*data, len, opts.read_only, opts.create)?
            == DataFile::Create
        {
            // A new storage (or a creation that crashed before its header was durable).
            init_files(&*env, &path, &*data, created_dir)?;
            len = 2 * PAGE_SIZE as u64;
        }
        if !opts.read_only {
            // A writable open names a foreign or cut data file before it creates anything.
            Source::precheck(&*env, &*data, &data_path, &journals_dir, len)?;
        }
        if !env.exists(&journals_dir) {
            if opts.read_only {
                return Err(Error::NotAStorage {
                    path,
                    reason: "no Journals directory".into(),
                });
            }
            env.create_dir(&journals_dir)?;
            env.sync_dir(&path)?;
        }
        let map_end = Arc::new(AtomicU64::new(u64::MAX));
        let src = Source {
            env: &*env,
            data: &data,
            data_path: &data_path,
            journals_dir: &journals_dir,
            borrowed: &borrowed,
            map_end: &map_end,
            at,
        };
        let (hdr, slot, mut state, recovered, len) = src.load(len, lock_file.slot(), None)?;
        let (files, recovered_end, recovered_records) =
            (recovered.files, recovered.end, recovered.records);
        let max_no = files.keys().next_back().copied().unwrap_or(0);
        let replayed = state.txn_id > hdr.flushed_txn;
        if replayed {
            state.dirty_since = Some(Instant::now());
            tracing::info!(path = %path.display(), from = hdr.flushed_txn, to = state.txn_id, "replayed journal");
        }
        // A read-only open never allocates, so it does not read the free-space map: a damaged
        // map page leaves the tree readable, and a backup of it is a healthy storage with a new
        // map (the salvage; as LMDB's `mdb_copy -c` rebuilds the free list from the tree).
        let alloc = if opts.read_only {
            Allocator::default()
        } else {
            build_allocator(&state).map_err(|e| match e {
                Error::Corruption(mut c) => {
                    c.what.push_str(
                        " (in the free-space map; the tree may be intact: open the storage read-only and back it up, `omnibus backup`, for a copy with a new map)",
                    );
                    Error::Corruption(c)
                }
                e => e,
            })?
        };
        let mut alloc = alloc;
        if let Some(r) = lock_file
            .table()
            .filter(|_| !opts.read_only)
            .and_then(|t| t.oldest())
            .filter(|r| *r < state.txn_id)
        {
            // A reader in another process reads an older state: the pages free now may be in
            // use there. They wait under this state's txn, as pages freed by it would
            // (invariant I16).
            let runs: Vec<(u64, u64)> = alloc.reusable.iter().collect();
            alloc.reusable = Default::default();
            alloc.pending_pages += runs.iter().map(|(_, l)| l).sum::<u64>();
            tracing::debug!(path = %path.display(), reader = r, pages = alloc.pending_pages, "free pages wait for a reader in another process");
            alloc.pending.push_back((state.txn_id, runs));
        }
        let mine: BTreeMap<u64, u64> = files
            .iter()
            .map(|(no, per)| (*no, per.get(&hdr.storage_id).copied().unwrap_or(0)))
            .collect();
        let journal = match binding {
            _ if opts.read_only => Journal::open_read_only(env.clone(), hdr.storage_id, &path),
            Some((journal, rel)) => {
                journal.register(hdr.storage_id, &path, &rel, &mine);
                journal
            }
            None => {
                let cfg = JournalConfig::of(&opts);
                let j = Journal::open(env.clone(), hdr.storage_id, &path, max_no + 1, cfg)?;
                j.register(hdr.storage_id, &path, "", &mine);
                j
            }
        };
        let state = Arc::new(state);
        crate::buffer::account(0, state.buffer_bytes);
        let inner = Arc::new(Inner {
            buffer_limit: AtomicU64::new(opts.write_buffer_bytes),
            buffer_counted: AtomicU64::new(state.buffer_bytes),
            apply_step_pages: AtomicU64::new(0),
            write_mode: std::sync::OnceLock::new(),
            path,
            data_path,
            journals_dir,
            env,
            storage_id: hdr.storage_id,
            lock_file,
            borrowed,
            in_database: AtomicBool::new(false),
            replay_pos: Mutex::new(opts.read_only.then_some(ReplayPos {
                sequence: hdr.sequence,
                end: recovered_end,
            })),
            records_replayed: AtomicU64::new(recovered_records),
            data,
            current: ArcSwap::new(state.clone()),
            registry: SnapshotRegistry::default(),
            publish: Mutex::new(()),
            writer: Mutex::new(WriterSlot {
                state: Some(Box::new(WriterState {
                    alloc,
                    maps: Default::default(),
                })),
                ..WriterSlot::default()
            }),
            writer_cv: Condvar::new(),
            apply_cancel: AtomicBool::new(false),
            background_applies: AtomicU64::new(0),
            flush_state: Mutex::new(FlushState {
                header_seq: hdr.sequence,
                header_slot: slot,
                header: hdr,
                punched: BTreeSet::new(),
                punching: opts.punch_holes,
                reuse_slack: 0,
            }),
            journal,
            poisoned: Mutex::new(None),
            file_len: AtomicU64::new(len),
            map_end,
            closed: AtomicBool::new(false),
            hide_reserved: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            refused: Mutex::new(None),
            holes_punched: AtomicU64::new(0),
            pages_journaled: AtomicU64::new(0),
            pages_journaled_as_diffs: AtomicU64::new(0),
            apply_steps: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            pages_flushed: AtomicU64::new(0),
            flush_recorders: Default::default(),
            freed_unflushed: AtomicU64::new(0),
            allocated_unflushed: AtomicU64::new(0),
            flush_started: AtomicU64::new(hdr.flushed_txn),
            last_shrink: AtomicU64::new(0),
            flush_hooks,
            flusher: Mutex::new(None),
            opts,
        });
        inner.registry.register(&state);
        if !inner.opts.read_only {
            inner.ensure_data_len(state.next_page)?;
            // Write what was replayed to the data file and drop journal files fully flushed;
            // then make both header slots hold the newest header, and join the flush service.
            (inner.flush_hooks.opened)(&inner)?;
        }
        Ok(inner)
    }

    pub fn poisoned(&self) -> Option<String> {
        lock(&self.poisoned)
            .clone()
            .or_else(|| self.journal.poisoned())
    }

    /// Marks the storage failed (fail-stop, design.md invariant I2).
    pub fn poison(&self, e: &Error) {
        let mut p = lock(&self.poisoned);
        if p.is_none() {
            tracing::error!(path = %self.path.display(), error = %e, "storage poisoned");
            *p = Some(e.to_string());
        }
    }

    pub fn check_writable(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if self.opts.read_only {
            return Err(Error::ReadOnly);
        }
        if let Some(cause) = self.poisoned() {
            return Err(Error::Poisoned { cause });
        }
        if let Some(storages) = lock(&self.refused).clone() {
            return Err(Error::DatabaseDamaged { storages });
        }
        Ok(())
    }

    /// The flush write mode and why, resolved on first call ([`crate::write_mode::resolve`]).
    pub fn write_mode(&self) -> &(crate::env::WriteMode, String) {
        self.write_mode.get_or_init(|| {
            if self.opts.read_only {
                (
                    crate::env::WriteMode::VectoredFileIo,
                    "read-only: no flushes".into(),
                )
            } else {
                crate::write_mode::resolve(self.opts.write_mode, &self.env, &self.path)
            }
        })
    }

    /// Refuses writes with [`Error::DatabaseDamaged`] naming `damaged` (a database with damaged
    /// storages; see `Database::open`).
    pub(crate) fn refuse_writes(&self, damaged: Vec<String>) {
        *lock(&self.refused) = Some(damaged);
    }

    /// Begins a write transaction. `wait`: wait for an open one to end (else
    /// [`Error::WriteInProgress`]). `logical_ok`: while a background apply holds the writer's
    /// state, a buffered storage's transaction may begin *logical-only* (its operations
    /// buffered; it takes the state back if it needs the tree: `reclaim_writer`); without it the
    /// caller waits for the apply to end (even when not `wait`: an apply is bounded, and waits
    /// for no transaction of the caller's unless a logical-only one is open, which makes this
    /// fail with [`Error::WriteInProgress`] when not `wait`).
    pub(crate) fn begin_write(
        self: &Arc<Self>,
        wait: bool,
        logical_ok: bool,
    ) -> Result<WriteTransaction> {
        self.check_writable()?;
        let mut g = lock(&self.writer);
        // Bounded: each wait ends with a transaction's or an apply's end.
        let mut writer = loop {
            if !g.logical_open {
                if let Some(w) = g.state.take() {
                    break w;
                }
            }
            if g.lent && !g.logical_open && !g.finishing && logical_ok && !self.buffer_backlogged()
            {
                g.logical_open = true;
                drop(g);
                if let Err(e) = self.check_writable() {
                    self.return_logical();
                    return Err(e);
                }
                let base = self.current.load_full();
                return Ok(WriteTransaction::new_logical(self.clone(), base));
            }
            // Not waiting for a transaction: an apply without one open is still waited for.
            let apply_alone = g.lent && !g.logical_open;
            if !wait && !apply_alone {
                return Err(Error::WriteInProgress);
            }
            g.waiting += 1;
            g = self.writer_cv.wait(g).unwrap_or_else(|e| e.into_inner());
            g.waiting -= 1;
        };
        drop(g);
        if let Err(e) = self.check_writable() {
            self.return_writer(writer);
            return Err(e);
        }
        self.release_freed(&mut writer);
        let base = self.current.load_full();
        Ok(WriteTransaction::new(self.clone(), writer, base))
    }

    /// Makes the pages freed by earlier transactions that no snapshot can read any more
    /// reusable by the writer's allocator: at the start of each write transaction.
    pub(crate) fn release_freed(&self, writer: &mut WriterState) {
        // Pages freed by transaction t are reused once no live snapshot predates t and a
        // durable header reaches t: until then t's journal record may name them as the base
        // of a page diff, which recovery reads from the data file (design.md invariant I9). Pages
        // whose freed version never reached the data file wait for the snapshots only
        // (`Allocator::early`).
        // Readers in other processes count as snapshots (their reader slots, invariant I16).
        if let Some(oldest) = self.registry.oldest_live() {
            let oldest = self.oldest_reader(oldest.txn_id);
            let flushed = self.current.load().flushed_txn;
            let started = self.flush_started.load(Ordering::Acquire);
            let early = writer.alloc.release_early(oldest, started);
            if early > 0 {
                let _ =
                    self.freed_unflushed
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                            Some(v.saturating_sub(early))
                        });
            }
            writer.alloc.release(oldest.min(flushed));
        }
    }

    /// True when the write buffer holds more than twice its size: a transaction begins only
    /// once the background apply running ends (as an LSM-tree stalls writes behind its
    /// flushes), so the buffer stays within about twice its size.
    fn buffer_backlogged(&self) -> bool {
        let limit = self.buffer_limit.load(Ordering::Relaxed);
        self.current.load().buffer_bytes > limit.saturating_mul(2)
    }

    /// Ends a logical-only write transaction (committed or not).
    pub(crate) fn return_logical(&self) {
        let mut g = lock(&self.writer);
        g.logical_open = false;
        if g.waiting > 0 || g.lent {
            self.writer_cv.notify_all();
        }
    }

    /// Takes the writer's state back from the background apply for the open logical-only
    /// transaction, which then holds it as any write transaction does: the apply gives up at
    /// its next check (it publishes nothing while that transaction is open). Bounded by the
    /// apply's checks (every few entries it writes).
    pub(crate) fn reclaim_writer(&self) -> Box<WriterState> {
        self.apply_cancel.store(true, Ordering::Release);
        let mut g = lock(&self.writer);
        debug_assert!(
            g.logical_open,
            "only the open logical-only transaction reclaims"
        );
        self.writer_cv.notify_all();
        let mut w = loop {
            if let Some(w) = g.state.take() {
                break w;
            }
            g.waiting += 1;
            g = self.writer_cv.wait(g).unwrap_or_else(|e| e.into_inner());
            g.waiting -= 1;
        };
        g.logical_open = false;
        drop(g);
        self.apply_cancel.store(false, Ordering::Release);
        self.release_freed(&mut w);
        w
    }

    /// Lends the writer's state to a background apply, when no transaction holds it and the
    /// storage is writable; `None` otherwise.
    pub(crate) fn lend_writer(&self) -> Option<Box<WriterState>> {
        if self.check_writable().is_err() {
            return None;
        }
        let mut g = lock(&self.writer);
        if g.logical_open || g.lent {
            return None;
        }
        let mut w = g.state.take()?;
        g.lent = true;
        drop(g);
        self.apply_cancel.store(false, Ordering::Release);
        self.release_freed(&mut w);
        Some(w)
    }

    /// The background apply is ready to publish: waits until no logical-only transaction is
    /// open, and keeps a new one from beginning until the apply gives the writer's state back.
    /// `false` when a logical-only transaction asked for the state back meanwhile
    /// ([`Inner::reclaim_writer`]): the apply gives up.
    pub(crate) fn begin_finishing(&self) -> bool {
        let mut g = lock(&self.writer);
        g.finishing = true;
        // Bounded: the open logical-only transaction commits, aborts or reclaims.
        while g.logical_open && !self.apply_cancel.load(Ordering::Acquire) {
            g.waiting += 1;
            g = self.writer_cv.wait(g).unwrap_or_else(|e| e.into_inner());
            g.waiting -= 1;
        }
        if self.apply_cancel.load(Ordering::Acquire) {
            g.finishing = false;
            return false;
        }
        true
    }

    /// The oldest txn read by a reader in another process (its reader slot, design.md 6.5),
    /// when one is there; `None` for a read-only storage. Reads the shared table: no system
    /// call.
    pub fn other_readers(&self) -> Option<u64> {
        if self.opts.read_only {
            return None;
        }
        self.lock_file.table().and_then(|t| t.oldest())
    }

    /// `txn` (the oldest txn a snapshot of this process reads), lowered to the oldest one a
    /// reader in another process reads.
    pub fn oldest_reader(&self, txn: u64) -> u64 {
        self.other_readers().map_or(txn, |r| r.min(txn))
    }

    /// Gives the writer's state back at the end of a write transaction or a background apply.
    pub fn return_writer(&self, w: Box<WriterState>) {
        let mut g = lock(&self.writer);
        g.state = Some(w);
        if g.lent {
            // A background apply ended: waiters of every kind may go on.
            g.lent = false;
            g.finishing = false;
            self.writer_cv.notify_all();
        } else if g.waiting > 0 {
            self.writer_cv.notify_one();
        }
    }

    /// Grows the data file (in steps of 1/8 of its size, 1 MiB to 64 MiB) to hold `pages`.
    /// The known length only grows (`fetch_max`), so two growths racing (a commit's and
    /// [`Storage::grow_data_file`]'s) leave it at most the length really allocated.
    pub fn ensure_data_len(&self, pages: u64) -> Result<()> {
        let need = pages * PAGE_SIZE as u64;
        let cur = self.file_len.load(Ordering::Acquire);
        if need <= cur {
            return Ok(());
        }
        let step = (cur / 8).clamp(1 << 20, 64 << 20);
        let target = (need.max(cur + step)).div_ceil(1 << 20) << 20;
        // `allocate_or_zero`: where the file system has no fallocate, grow by writing zeros.
        match crate::env::allocate_or_zero(&*self.data, cur, target - cur) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && target > need => {
                // Try just what is needed before giving up.
                crate::env::allocate_or_zero(&*self.data, cur, need - cur)?;
                self.file_len.fetch_max(need, Ordering::AcqRel);
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        }
        self.file_len.fetch_max(target, Ordering::AcqRel);
        Ok(())
    }

    /// Cuts the data file to `next_page` pages when the storage is closing, no write
    /// transaction is open, and every committed transaction is flushed (called by the closing
    /// flush, which holds the flush lock). The tail past `next_page` is no page of any state
    /// (states' `next_page` only grows, and the current one is the newest), so nothing is lost,
    /// and a crash before the cut reaches the disk leaves a longer file, which is harmless. Every
    /// mapping first learns the new end ([`Inner::map_end`]): a reader still holding a snapshot
    /// gets a corruption error for a page past it, never `SIGBUS`. Best effort: a failed
    /// `ftruncate` is logged and leaves the file as it was. Returns the bytes cut.
    pub fn trim_tail(&self) -> u64 {
        if self.opts.read_only || self.poisoned().is_some() {
            return 0;
        }
        // No write transaction may grow the file (or allocate past `next_page`) meanwhile.
        let writer = lock(&self.writer);
        if writer.state.is_none() || writer.logical_open {
            return 0;
        }
        let cur = self.current.load_full();
        if cur.txn_id != cur.flushed_txn {
            return 0;
        }
        // A reader in another process may read an older state, whose next page may be higher
        // (a compaction lowered it since).
        if self.other_readers().is_some_and(|r| r < cur.txn_id) {
            return 0;
        }
        let end = cur.next_page.max(2) * PAGE_SIZE as u64;
        let len = self.file_len.load(Ordering::Acquire);
        if len <= end {
            return 0;
        }
        self.map_end.store(end, Ordering::SeqCst);
        match self.data.set_len(end) {
            Ok(()) => {
                self.file_len.store(end, Ordering::Release);
                drop(writer);
                len - end
            }
            Err(e) => {
                self.map_end.store(u64::MAX, Ordering::SeqCst);
                tracing::warn!(path = %self.data_path.display(), error = %e, "cutting the free tail of the data file failed");
                0
            }
        }
    }

    /// Publishes the state after a durable page commit `txn` (design.md invariant I3: one
    /// pointer swap); with `step`, an apply step's, published as `txn + 1` with the entries it
    /// left buffered.
    pub fn publish_commit(
        &self,
        txn: u64,
        meta: CommitMeta,
        images: Vec<(u64, crate::page::SharedImage)>,
        freed: &[(u64, u64)],
        step: Option<crate::txn::StepCarry>,
    ) {
        let _g = lock(&self.publish);
        let cur = self.current.load_full();
        debug_assert_eq!(cur.txn_id + 1, txn, "commits publish in txn order");
        let buffered = step.as_ref().map_or(0, |c| c.buffer_bytes);
        // One link of the table's chain (`scratch.rs`): the freed pages out, the new images in.
        let (scratch, gained) = cur.scratch.with_commit(
            freed.iter().map(|(p, _)| *p),
            images
                .into_iter()
                .map(|(p, image)| (p, ScratchPage { txn, image })),
        );
        let bytes = cur.scratch_bytes.saturating_add_signed(gained);
        // A page commit of a buffered storage holds every buffered entry before it (design.md
        // invariant I13): the buffer starts empty again, or, after an apply step (which takes
        // a second txn id for them), holds exactly the entries the step carried.
        let (txn_id, buffer, buffer_since, sweep) = match step {
            None => (txn, Default::default(), None, None),
            Some(c) => (
                txn + 1,
                crate::buffer::Buffer::from_run(c.carried),
                Some(c.buffer_since),
                Some(c.sweep),
            ),
        };
        let next = Arc::new(State {
            txn_id,
            root: meta.root,
            freedir: meta.freedir,
            next_page: meta.next_page,
            entries: meta.entries,
            flushed_txn: cur.flushed_txn,
            tree_txn: txn,
            buffer,
            buffer_bytes: buffered,
            len_delta: Default::default(),
            len_wanted: cur.len_wanted.clone(),
            buffer_since,
            sweep,
            scratch,
            scratch_bytes: bytes,
            dirty_since: cur.dirty_since.or_else(|| Some(Instant::now())),
            mapping: cur.mapping.clone(),
        });
        self.registry.register(&next);
        self.count_buffer(buffered);
        self.current.store(next);
    }

    /// Moves this storage's share of [`crate::live_buffer_bytes`] to `bytes` (under `publish`).
    fn count_buffer(&self, bytes: u64) {
        let old = self.buffer_counted.swap(bytes, Ordering::Relaxed);
        crate::buffer::account(old, bytes);
    }

    /// Publishes logical commit `txn` of a buffered storage: its operations `ops` (key, value
    /// or `None` for a delete, strictly increasing by key) join the buffer as its newest run;
    /// the tree is unchanged. `delta`, when the commit counted its keys
    /// ([`State::len_wanted`]), is what they add to the count.
    pub fn publish_logical(&self, txn: u64, ops: crate::txn::LogicalOps, delta: Option<i64>) {
        let _g = lock(&self.publish);
        let cur = self.current.load_full();
        debug_assert_eq!(cur.txn_id + 1, txn, "commits publish in txn order");
        let mut buffer = cur.buffer.clone();
        let grown = buffer.push_run(ops);
        let bytes = cur.buffer_bytes.saturating_add_signed(grown);
        let next = Arc::new(State {
            txn_id: txn,
            buffer,
            buffer_bytes: bytes,
            len_delta: match (delta, cur.len_delta.get()) {
                (Some(d), Some(c)) => std::sync::OnceLock::from(c + d),
                _ => Default::default(),
            },
            buffer_since: cur.buffer_since.or_else(|| Some(Instant::now())),
            ..(*cur).clone()
        });
        self.registry.register(&next);
        self.count_buffer(bytes);
        self.current.store(next);
    }

    /// Publishes the current state with every run of its buffer frozen, for a background apply
    /// that holds the writer's state (`txn/write/background.rs`), and returns it: the same txn
    /// and contents, so snapshots see no change.
    pub fn freeze_buffer(&self) -> Arc<State> {
        self.republish(|cur| {
            Some(State {
                buffer: cur.buffer.freeze(),
                ..cur.clone()
            })
        })
    }

    /// Publishes the current state with no run of its buffer frozen: a background apply gave
    /// up.
    pub fn thaw_buffer(&self) {
        self.republish(|cur| {
            (cur.buffer.frozen_runs() > 0).then(|| State {
                buffer: cur.buffer.thawed(),
                ..cur.clone()
            })
        });
    }

    /// Publishes `change` of the current state (the same txn, under the publish lock: no commit
    /// comes between), or nothing when it returns `None`; returns the state current after.
    fn republish(&self, change: impl FnOnce(&State) -> Option<State>) -> Arc<State> {
        let _g = lock(&self.publish);
        let cur = self.current.load_full();
        let Some(next) = change(&cur) else {
            return cur;
        };
        let next = Arc::new(next);
        self.registry.register(&next);
        self.current.store(next.clone());
        next
    }

    /// Publishes the state after a flush of everything up to `target`.
    pub fn publish_flush(&self, target: u64, mapping: Option<Arc<Mapping>>) {
        let _g = lock(&self.publish);
        let cur = self.current.load_full();
        // Usually the flush wrote everything (target = current): the new table is built from
        // the entries kept rather than by removing the others one by one (each removal copies
        // a path of the persistent map).
        let mut bytes = cur.scratch_bytes;
        let all = cur.scratch.folded();
        let kept = all.values().filter(|sp| sp.txn > target).count();
        let scratch = if kept < cur.scratch.len() / 2 {
            let mut s = Scratch::new();
            for (p, sp) in all.iter() {
                if sp.txn > target {
                    s.insert(p, sp.clone());
                } else {
                    bytes -= sp.image.len() as u64;
                }
            }
            s
        } else {
            // The folded table, so each removal copies a path of one map (no second fold).
            let mut s = Scratch::from_base(all.clone());
            for (p, sp) in all.iter() {
                if sp.txn <= target {
                    s.remove(&p);
                    bytes -= sp.image.len() as u64;
                }
            }
            s
        };
        let empty = scratch.is_empty();
        let next = Arc::new(State {
            flushed_txn: target.max(cur.flushed_txn),
            scratch,
            scratch_bytes: bytes,
            dirty_since: if empty {
                None
            } else if target < cur.txn_id {
                Some(Instant::now())
            } else {
                cur.dirty_since
            },
            mapping: mapping.unwrap_or_else(|| cur.mapping.clone()),
            ..(*cur).clone()
        });
        self.registry.register(&next);
        self.current.store(next);
    }

    /// Publishes the current state with `mapping` instead of its map (compaction truncated the
    /// data file: the new map covers the new length).
    pub fn publish_mapping(&self, mapping: Arc<Mapping>) {
        self.republish(|cur| {
            Some(State {
                mapping,
                ..cur.clone()
            })
        });
    }

    pub fn unflushed_bytes(&self) -> u64 {
        let freed = self.freed_unflushed.load(Ordering::Relaxed) * PAGE_SIZE as u64;
        self.current.load().scratch_bytes + freed
    }

    pub fn needs_flush(&self) -> bool {
        let s = self.current.load();
        let freed = self.freed_unflushed.load(Ordering::Relaxed) * PAGE_SIZE as u64;
        s.scratch_bytes + freed >= self.opts.flush_scratch_bytes
            || s.dirty_since
                .is_some_and(|t| t.elapsed() >= self.opts.flush_max_age)
    }

    /// Applies the write buffer to the tree in one page transaction (`txn/write/logical.rs`),
    /// unless it is empty. `wait`: wait for an open write transaction to end; else leave the
    /// buffer as it is while one is open (its own commit applies the buffer when due).
    ///
    /// Errors: as [`WriteTransaction::commit`].
    pub fn apply_buffer(self: &Arc<Self>, wait: bool) -> Result<()> {
        if self.current.load().buffer.is_empty() || self.opts.read_only {
            return Ok(());
        }
        let mut t = match self.begin_write(wait, false) {
            Ok(t) => t,
            Err(Error::WriteInProgress) if !wait => return Ok(()),
            Err(e) => return Err(e),
        };
        t.apply_buffered()?;
        t.commit()
    }

    /// How long until the write buffer's oldest entry is [`Options::flush_max_age`] old
    /// (zero once it is; `None` with an empty buffer).
    pub fn buffer_due_in(&self) -> Option<std::time::Duration> {
        self.current.load().buffer_due_in(self.opts.flush_max_age)
    }

    /// True when the next commit would have to apply the write buffer: it holds more than its
    /// size, or its oldest entry is older than [`Options::flush_max_age`] (a group part that
    /// left its buffer so applies it in a transaction of its own right after).
    pub fn buffer_over(&self) -> bool {
        let state = self.current.load();
        let limit = self.buffer_limit.load(Ordering::Relaxed);
        (limit > 0 && state.buffer_bytes > limit) || state.buffer_aged(self.opts.flush_max_age)
    }

    /// True when the write buffer's oldest entry is older than [`Options::flush_max_age`]:
    /// the background flush applies it, so an idle storage pins no journal file for long.
    pub fn buffer_aged(&self) -> bool {
        self.current.load().buffer_aged(self.opts.flush_max_age)
    }

    /// True when the flush service applies this storage's write buffer in the background
    /// (design.md 16.1): it has a buffer, flushes in the background, and takes no apply steps
    /// (the engine's index storages step on their executors). Decided by the options alone:
    /// the service may look at a storage before the open has recorded its membership, and an
    /// apply made then as a write transaction of its own made a `flush` called meanwhile skip
    /// the buffer (it does not wait for a transaction, but waits for a background apply). Where
    /// the service's thread could not start, commits apply the buffer at twice its size.
    pub fn applies_in_background(&self) -> bool {
        self.opts.flush_mode == FlushMode::Background
            && self.buffer_limit.load(Ordering::Relaxed) > 0
            && self.apply_step_pages.load(Ordering::Relaxed) == 0
    }

    /// True when a background apply should start: the buffer holds its size or more, or its
    /// oldest entry is older than [`Options::flush_max_age`].
    pub fn wants_background_apply(&self) -> bool {
        if !self.applies_in_background() {
            return false;
        }
        let state = self.current.load();
        if state.buffer.is_empty() {
            return false;
        }
        state.buffer_bytes >= self.buffer_limit.load(Ordering::Relaxed)
            || state.buffer_aged(self.opts.flush_max_age)
    }

    pub fn after_commit(&self) {
        if self.wants_background_apply() {
            (self.flush_hooks.signal)();
        }
        if !self.needs_flush() {
            return;
        }
        match self.opts.flush_mode {
            FlushMode::Inline => {
                if let Err(e) = (self.flush_hooks.flush)(self) {
                    tracing::warn!(error = %e, "inline flush failed");
                }
            }
            FlushMode::Background => {
                (self.flush_hooks.signal)();
            }
            FlushMode::Manual => {}
        }
    }

    /// Adds this storage's flush histograms and counters to `g`.
    pub fn gather_flush_metrics(&self, g: &mut crate::metrics::Gather) {
        g.flushes(
            &self.flush_recorders,
            self.flushes.load(Ordering::Relaxed),
            self.pages_flushed.load(Ordering::Relaxed),
        );
    }

    fn stats(&self) -> StorageStats {
        let s = self.current.load_full();
        let free = count_free(&s);
        StorageStats {
            last_committed_txn: s.txn_id,
            last_flushed_txn: s.flushed_txn,
            entries: s.len(),
            buffer_entries: s.buffer.len() as u64,
            buffer_bytes: s.buffer_bytes,
            pages_used: s.next_page - free,
            pages_free: free,
            data_file_bytes: self.data.len().unwrap_or(0),
            allocated_bytes: self.data.allocated_bytes().unwrap_or(0),
            journal_files: recovery::list(&*self.env, &self.journals_dir)
                .map(|v| v.len() as u64)
                .unwrap_or(0),
            scratch_bytes: s.scratch_bytes,
            scratch_pages: s.scratch.len() as u64,
            holes_punched: self.holes_punched.load(Ordering::Relaxed),
            pages_journaled: self.pages_journaled.load(Ordering::Relaxed),
            pages_journaled_as_diffs: self.pages_journaled_as_diffs.load(Ordering::Relaxed),
            apply_steps: self.apply_steps.load(Ordering::Relaxed),
            background_applies: self.background_applies.load(Ordering::Relaxed),
            flushes: self.flushes.load(Ordering::Relaxed),
            pages_flushed: self.pages_flushed.load(Ordering::Relaxed),
            journal: self.journal.stats(),
            journal_records_replayed: self.records_replayed.load(Ordering::Relaxed),
        }
    }

    fn stop_flusher(&self) {
        let membership = lock(&self.flusher).take();
        if let Some(leave) = membership {
            leave();
        }
    }
}

impl Inner {
    /// Stops the flusher and, unless closed already, flushes (best effort: a clean close leaves
    /// nothing to replay; committed data is safe in the journal either way). Without a flush,
    /// the queued eventual commits are made durable in the journal before the lock goes.
    fn shutdown(&self) {
        // A background apply waiting to publish until an open logical-only transaction ends
        // gives up: the thread holding that transaction may be this one, dropping the last
        // handle with it open, while leaving the flush service waits for the apply.
        {
            let _g = lock(&self.writer);
            self.apply_cancel.store(true, Ordering::Release);
            self.writer_cv.notify_all();
        }
        self.stop_flusher();
        if !self.opts.read_only
            && !self.opts.flush_on_close
            && !self.closed.load(Ordering::Acquire)
            && self.poisoned().is_none()
        {
            if let Err(e) = self.journal.sync_queued() {
                tracing::warn!(error = %e, "syncing the queued eventual commits on drop failed");
            }
        }
        if !self.opts.read_only
            && self.opts.flush_on_close
            && !self.closed.load(Ordering::Acquire)
            && self.poisoned().is_none()
        {
            self.closing.store(true, Ordering::Release);
            if let Err(e) = (self.flush_hooks.flush)(self) {
                tracing::warn!(error = %e, "flush on drop failed");
            }
        }
        self.closed.store(true, Ordering::Release);
    }
}

/// Counts free bits of the state's free-space map below `next_page`.
fn count_free(s: &State) -> u64 {
    let mut n = 0;
    let _ = for_each_bitmap(s, |idx, words| {
        let base = idx as u64 * BITS_PER_BITMAP;
        for (w, bits) in words.iter().enumerate() {
            let first = base + w as u64 * 64;
            if first >= s.next_page {
                break;
            }
            let valid = (s.next_page - first).min(64);
            let mask = if valid == 64 {
                u64::MAX
            } else {
                (1u64 << valid) - 1
            };
            n += (bits & mask).count_ones() as u64;
        }
    });
    n
}

/// Calls `f(index, words)` for each bitmap page of the state's free-space map.
pub(crate) fn for_each_bitmap(s: &State, mut f: impl FnMut(usize, &[u64])) -> Result<()> {
    if s.freedir == 0 {
        return Ok(());
    }
    let (img, h) = s.page(s.freedir)?;
    if h.kind != PageKind::FreeDir {
        return Err(Error::corruption(
            s.path(),
            Some(s.freedir),
            None,
            "expected a free-space directory page",
        ));
    }
    let mut words = vec![0u64; WORDS];
    for i in 0..h.count as usize {
        let Some(bp) = page::rd_u64(img, HEADER_LEN + 8 * i) else {
            break;
        };
        let (bimg, bh) = s.page(bp)?;
        if bh.kind != PageKind::FreeBitmap {
            return Err(Error::corruption(
                s.path(),
                Some(bp),
                None,
                "expected a free-space bitmap page",
            ));
        }
        for (w, v) in words.iter_mut().enumerate() {
            *v = page::rd_u64(bimg, HEADER_LEN + 8 * w).unwrap_or(0);
        }
        f(i, &words);
    }
    Ok(())
}

fn build_allocator(s: &State) -> Result<Allocator> {
    let mut maps: Vec<(usize, Vec<u64>)> = Vec::new();
    for_each_bitmap(s, |i, w| maps.push((i, w.to_vec())))?;
    Ok(Allocator::from_bitmaps(
        maps.iter().map(|(i, w)| (*i, &w[..])),
        s.next_page,
    ))
}

/// Where a storage's committed state is read from at open (and by [`Storage::catch_up`]).
struct Source<'a> {
    env: &'a dyn StorageEnv,
    data: &'a Arc<dyn EnvFile>,
    data_path: &'a Arc<PathBuf>,
    journals_dir: &'a Path,
    borrowed: &'a [(u64, PathBuf)],
    map_end: &'a Arc<AtomicU64>,
    at: Option<OnePoint>,
}

/// What [`Source::load`] read: the durable header and its slot, the recovered state, the
/// highest txn of each storage in each journal file, and the data file's length.
type Loaded = (Header, u64, State, replay::Recovered, u64);

/// A read-only storage's newer state, read and not yet published ([`Storage::read_newer`]).
pub(crate) struct CaughtUp {
    state: State,
    len: u64,
    pos: ReplayPos,
    records: u64,
}

/// Where a read-only open's replay of the journal stands: the durable header's sequence it
/// replayed after, and `(journal number, offset)` where the records it took end.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReplayPos {
    pub sequence: u64,
    pub end: (u64, u64),
}

/// Attempts of a read-only open beside a live writer before it gives up (each one after a
/// flush moved the header under it, a journal file it read was released meanwhile, or one was
/// read short: a writer process created or emptied it meanwhile, and may have exited since).
const LOAD_ATTEMPTS: u32 = 50;

impl Source<'_> {
    /// Reads the newest durable header and replays the journal after it into a new state
    /// (design.md 6, steps 5 to 7). `len`: the data file's length as the caller knows it (read
    /// again for a later attempt).
    ///
    /// With a reader slot (a read-only open that took one, design.md 6.5), a writer in
    /// another process may flush, reuse pages and release journal files meanwhile, so each
    /// attempt first pins every page (slot txn 0), or with `floor` (a catch-up: the oldest state
    /// this process still reads) every page that state reads, then states the header's flushed
    /// txn (never above `floor`), replays, and is accepted only when
    /// the durable header has not moved past what it replayed (a journal file released during
    /// the replay could hide records, but only records a newer header covers). An attempt
    /// that fails while a writer is live, the header moved, or a journal file was read short
    /// is made again, up to [`LOAD_ATTEMPTS`]; the slot then states the replayed txn. An
    /// attempt that a flush passed goes on from where its replay ended
    /// ([`Source::attempt_resumed`]): the next one reads only the records written since, not
    /// the whole journal again.
    fn load(
        &self,
        len: u64,
        slot: Option<&readers::ReaderSlot>,
        floor: Option<u64>,
    ) -> Result<Loaded> {
        let Some(slot) = slot else {
            return self.attempt(len);
        };
        let pin = |t: u64| slot.set_txn(floor.map_or(t, |f| f.min(t)));
        if let Some(at) = self.at {
            // One attempt: the database tries again from a new point when the header moved.
            pin(0);
            let moved = || Error::AlreadyOpen {
                path: self.data_path.to_path_buf(),
                holder: "a read-write opener that flushed while it was read".into(),
            };
            let l = self.attempt_pinned(len, &pin, None)?;
            let (now, _) = read_header(&**self.data, self.data_path)?;
            if at
                .sequence
                .is_some_and(|q| q != l.0.sequence || q != now.sequence)
            {
                return Err(moved());
            }
            pin(l.2.txn_id);
            return Ok(l);
        }
        let mut last = None;
        // The replayed txn and the end of the records taken of the last attempt a flush passed.
        let mut passed: Option<(u64, (u64, u64))> = None;
        for attempt in 0..LOAD_ATTEMPTS {
            // Every page pinned (an open), or every page the oldest state held here reads (a
            // catch-up: pages the newer state reads are in use there too, or freed later).
            slot.set_txn(floor.unwrap_or(0));
            let len = if attempt == 0 { len } else { self.data.len()? };
            let before = read_header(&**self.data, self.data_path)
                .ok()
                .map(|(h, _)| h.sequence);
            let r = self.attempt_resumed(len, &pin, passed.take()).and_then(|l| {
                // Accepted only when no durable header is past what was replayed.
                let (now, _) = read_header(&**self.data, self.data_path)?;
                if now.flushed_txn > l.2.txn_id {
                    passed = Some((l.2.txn_id, l.3.end));
                    return Err(Error::AlreadyOpen {
                        path: self.data_path.to_path_buf(),
                        holder: format!(
                            "a read-write opener that flushed past the replayed transaction {} during each of {LOAD_ATTEMPTS} attempts to read it",
                            l.2.txn_id
                        ),
                    });
                }
                Ok(l)
            });
            match r {
                Ok(l) => {
                    pin(l.2.txn_id);
                    return Ok(l);
                }
                Err(e) => {
                    let after = read_header(&**self.data, self.data_path)
                        .ok()
                        .map(|(h, _)| h.sequence);
                    let live = slot.table().writer_live();
                    // A journal file read short: a writer process created or emptied it while
                    // it was read, and may be gone already (a short `omnibus put`).
                    if !live
                        && !e.is_short_read()
                        && before == after
                        && !matches!(e, Error::AlreadyOpen { .. })
                    {
                        return Err(e);
                    }
                    tracing::debug!(path = %self.data_path.display(), attempt, error = %e, "reading beside a live writer: trying again");
                    last = Some(e);
                    std::thread::sleep(std::time::Duration::from_millis(1 + u64::from(attempt)));
                }
            }
        }
        Err(last.unwrap_or(Error::Closed))
    }

    /// One attempt of [`Source::load`] without a slot.
    fn attempt(&self, len: u64) -> Result<Loaded> {
        self.attempt_pinned(len, &|_| {}, None)
    }

    /// One attempt of [`Source::load`] after one whose replay a flush passed: `passed` is that
    /// replay's txn `x` and the `(journal number, offset)` where the records it took end. Every
    /// record after `x` lies at or after that end (a storage's records are in txn order across
    /// the files, and a file started since is numbered above every file listed then), and the
    /// newest durable header is past `x`, so its state plus the records from that end on is
    /// the newest committed state: only those records are read (as a catch-up reads them,
    /// design.md 6.5). When that cannot be done (the header is not past `x`, the end's file was
    /// released meanwhile, or that replay fails) the attempt reads the whole journal after the
    /// header instead. `None`: a whole attempt.
    fn attempt_resumed(
        &self,
        len: u64,
        pin: &dyn Fn(u64),
        passed: Option<(u64, (u64, u64))>,
    ) -> Result<Loaded> {
        if let Some((x, end)) = passed.filter(|(_, (file, _))| *file != 0) {
            match self.attempt_pinned(len, pin, Some((x, end))) {
                Ok(l) => return Ok(l),
                Err(e) => {
                    tracing::debug!(path = %self.data_path.display(), error = %e, "reading only the records after a passed replay failed: reading the journal again");
                }
            }
        }
        self.attempt_pinned(len, pin, None)
    }

    /// The newest header, read as an open does (a foreign data file next to journals is
    /// damage), and the data file's length checked against it (design.md 6, step 5).
    fn precheck(
        env: &dyn StorageEnv,
        data: &dyn EnvFile,
        data_path: &Path,
        journals_dir: &Path,
        len: u64,
    ) -> Result<(Header, u64)> {
        let (hdr, slot) = read_header_or_damage(env, data, data_path, journals_dir)?;
        // Every page below the durable header's `next_page` was in the file when that header
        // was written (the file grows before pages are allocated past its end, the flush syncs
        // the data file before the header, and `trim_tail` never cuts below `next_page`): a
        // shorter file lost pages of the tree or its map. Opening it would read zeros or fail
        // at a page deep in the tree at some later read; it is damage, named now.
        let in_use = hdr.next_page.saturating_mul(PAGE_SIZE as u64);
        if len < in_use {
            return Err(Error::corruption(
                data_path,
                None,
                None,
                format!(
                    "the data file is {len} bytes, shorter than the {} pages ({in_use} bytes) its header says are in use: it was truncated",
                    hdr.next_page
                ),
            ));
        }
        Ok((hdr, slot))
    }

    /// One attempt: header, length check, map, replay. `pin` is told the header's flushed txn
    /// before anything of the state is read. `after`: `(x, end)` of a replay a flush passed
    /// ([`Source::attempt_resumed`]): the journal is read from `end` on only, and the header
    /// must be past `x` (else [`Error::AlreadyOpen`]).
    fn attempt_pinned(
        &self,
        len: u64,
        pin: &dyn Fn(u64),
        after: Option<(u64, (u64, u64))>,
    ) -> Result<Loaded> {
        let (env, data, data_path) = (self.env, self.data, self.data_path);
        let (hdr, slot) = Source::precheck(env, &**data, data_path, self.journals_dir, len)?;
        if after.is_some_and(|(x, _)| hdr.flushed_txn < x) {
            return Err(Error::AlreadyOpen {
                path: data_path.to_path_buf(),
                holder: "a read-write opener whose durable header is behind a replay".into(),
            });
        }
        pin(hdr.flushed_txn);
        let mapping = Arc::new(Mapping::new(
            data,
            len,
            data_path.clone(),
            self.map_end.clone(),
        )?);
        let mut state = State {
            txn_id: hdr.flushed_txn,
            root: hdr.root,
            freedir: hdr.freedir,
            next_page: hdr.next_page,
            entries: hdr.entries,
            flushed_txn: hdr.flushed_txn,
            tree_txn: hdr.flushed_txn,
            buffer: Default::default(),
            buffer_bytes: 0,
            len_delta: Default::default(),
            len_wanted: Default::default(),
            buffer_since: None,
            sweep: None,
            scratch: Default::default(),
            scratch_bytes: 0,
            dirty_since: None,
            mapping,
        };
        let cut = self.at.map(|a| (a.file, a.offset));
        let files = recover(
            env,
            self.journals_dir,
            self.borrowed,
            &hdr,
            &mut state,
            cut,
            after.map(|(_, end)| end),
        )?;
        Ok((hdr, slot, state, files, len))
    }

    /// A catch-up that reads only what was written after `pos` (design.md 6.5): when the newest
    /// durable header is still the one `base` was replayed after (and, at a database's point,
    /// the one read before the point), the journal's records from `pos.end` on are replayed
    /// onto `base` over a new map of the data file (`len` bytes). `None` when the header moved
    /// (before or during the replay), or the replay failed (a journal file released meanwhile):
    /// the caller loads again from the header.
    fn load_after(&self, base: &State, pos: ReplayPos, len: u64) -> Option<Loaded> {
        let (env, data, data_path) = (self.env, self.data, self.data_path);
        let header = || read_header(&**data, data_path).ok();
        let (hdr, slot) = header()?;
        if hdr.sequence != pos.sequence
            || self
                .at
                .is_some_and(|a| a.sequence.is_some_and(|q| q != pos.sequence))
        {
            return None;
        }
        let cut = self.at.map(|a| (a.file, a.offset));
        if cut.is_some_and(|c| c < pos.end) {
            return None;
        }
        let mut state = base.clone();
        state.mapping =
            Arc::new(Mapping::new(data, len, data_path.clone(), self.map_end.clone()).ok()?);
        let rec = recover(
            env,
            self.journals_dir,
            self.borrowed,
            &hdr,
            &mut state,
            cut,
            Some(pos.end),
        )
        .ok()?;
        let (now, _) = header()?;
        if now.sequence != pos.sequence {
            return None;
        }
        Some((hdr, slot, state, rec, len))
    }
}
