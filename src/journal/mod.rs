//! The write-ahead journal: numbered files of checksummed records holding page images.
//!
//! - [`record`]: the byte layout of records.
//! - [`writer`]: [`Journal`], the group-commit writer: every commit that arrives while a batch
//!   is being written joins the next batch; one `pwritev` and one `fdatasync` per batch; no
//!   commit is acknowledged before the sync that covers it (design.md invariant I1).
//! - `files`: the journal file lifecycle: the next file, hard links and link records for branch
//!   storages, per-file retention (`release`), recycling, and the directory syncs of design.md invariants I5 and I6.
//! - `pool`: whole pre-zeroed files prepared in the background.
//! - `prezero`: zeros ahead of the write position ([`Prezero`]) and the process's background
//!   pre-zeroing thread.
//! - `activity`: whether a batch is being written now (flushes yield the disk to it).
//! - [`recovery`]: reading a storage's `Journals/` back on open (design.md invariant I7).

pub(crate) mod activity;
mod cut;
pub(crate) mod diff;
mod files;
mod pool;
mod prezero;
pub mod record;
pub mod recovery;
pub mod writer;

pub use writer::{JournalConfig, JournalStats, Prezero};

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use crate::env::{EnvFile, StorageEnv};
use crate::error::Result;
use pool::Pool;
use prezero::ZeroCtl;
use record::OutRecord;

// ---- the journal's shared state: one struct, its parts defined here, its behaviour in the
// files below (writer: the group commit; files: the file lifecycle; prezero and pool: zeros
// ahead). Fields are private to this module, so every file of it reaches them and nothing
// outside does.

/// A record waiting in a batch (and, with [`Journal::commit_with`], its committer).
struct Waiting {
    ticket: u64,
    record: OutRecord,
    /// The committer's own condition variable (used with `Journal::shared`): the leader wakes
    /// exactly the committers of the batch it wrote, and the first queued one to lead next,
    /// instead of every waiting thread. `None` for an eventual record: nobody waits for it.
    wake: Option<Arc<Condvar>>,
}

impl Waiting {
    /// True for an eventual record (acknowledged when queued).
    fn eventual(&self) -> bool {
        self.wake.is_none()
    }
}

/// The group-commit queue, under the `shared` lock.
#[derive(Default)]
struct Shared {
    queue: Vec<Waiting>,
    /// Callers of [`Journal::sync_queued`] waiting for everything queued before them: the next
    /// batch takes them with the queue (ticket, wake-up).
    syncs: Vec<(u64, Arc<Condvar>)>,
    leader: bool,
    next_ticket: u64,
    done: HashMap<u64, Result<u64>>,
    poisoned: Option<String>,
    /// When the oldest eventual record in `queue` was queued; `None` when none is.
    eventual_since: Option<Instant>,
    /// Bytes of the eventual records in `queue`.
    eventual_bytes: u64,
    /// The sync thread was started (by the first eventual commit).
    sync_thread: bool,
    /// Set by the journal's drop: the sync thread exits.
    stop: bool,
    /// The batch being written holds eventual records.
    writing_eventual: bool,
    /// When the last batch ended, if no durable mark was written after it yet (docs/design.md
    /// 3.12): the sync thread writes one once this is [`Journal::mark_idle`] old with no batch
    /// since. `None` when the last batch is marked (or none was written).
    unmarked: Option<Instant>,
}

/// A group-commit journal writer over the numbered files of one `Journals/` directory: a
/// storage's own journal, or the shared journal of a database, whose files are hard-linked
/// into the `Journals/` of every branch storage that has a record in them.
pub struct Journal {
    env: Arc<dyn StorageEnv>,
    dir: PathBuf,
    owner: u64,
    file_size: u64,
    prezero: Prezero,
    /// How batches reach the device, resolved at open, and why (`crate::journal_io`).
    io_path: (crate::env::JournalIo, String),
    /// The group-commit queue (shared with the sync thread, which must not keep the journal
    /// alive: it holds this and a `Weak` of the journal).
    shared: Arc<Mutex<Shared>>,
    /// The sync thread's wake-up: an eventual record queued into an empty queue, a batch done.
    sync_cv: Arc<Condvar>,
    /// Longest wait of a queued eventual record ([`JournalConfig::eventual_sync`]).
    eventual_sync: Duration,
    /// How long the journal stays idle after a batch before its sync thread writes a durable
    /// mark ([`JournalConfig::mark_idle`]; zero: never).
    mark_idle: Duration,
    /// This journal, for the sync thread.
    me: Weak<Journal>,
    io: Mutex<Io>,
    pool: Arc<Pool>,
    /// The zeroed end of the current file and the background pre-zeroing of it.
    zero: Arc<ZeroCtl>,
    commits: AtomicU64,
    batches: AtomicU64,
    bytes: AtomicU64,
    fdatasyncs: AtomicU64,
    dir_syncs: AtomicU64,
    files_created: AtomicU64,
    links_made: AtomicU64,
    files_recycled: AtomicU64,
    inline_zero_bytes: AtomicU64,
    inline_zeroings: AtomicU64,
    zeroing_waits: AtomicU64,
    /// Storage id -> highest txn id it has flushed (`Journal::note_flushed`): on drop, a current
    /// file whose records are all flushed is emptied.
    flushed: Mutex<HashMap<u64, u64>>,
    /// Start records written (one per file started after the session's first).
    start_records: AtomicU64,
    eventual_commits: AtomicU64,
    eventual_lost: AtomicU64,
    /// Durable marks written (docs/design.md 3.12).
    marks: AtomicU64,
    /// Histograms recorded once per batch (`crate::metrics`).
    recorders: crate::metrics::JournalRecorders,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Journal({})", self.dir.display())
    }
}

/// A storage whose records this journal carries.
#[derive(Debug, Clone)]
struct StorageDir {
    /// The storage directory (absolute or as given to open).
    dir: PathBuf,
    /// Its path relative to the journal owner's directory, written in link records.
    rel: String,
}

/// The journal's files, under its `io` lock (held by the batch writer for a whole batch).
struct Io {
    /// The current file.
    file: Arc<dyn EnvFile>,
    /// Its journal number.
    no: u64,
    /// The write position in it: where the next batch starts (4 KiB-aligned).
    pos: u64,
    /// Journal number -> storage id -> highest txn id of that storage in the file, for every
    /// storage whose directory holds an entry (the owner's name or a hard link) for the file.
    entries: BTreeMap<u64, HashMap<u64, u64>>,
    /// Storages registered with this journal.
    storages: HashMap<u64, StorageDir>,
    /// Journal number -> links made to it in this session: (storage id, sequence when made).
    links: HashMap<u64, Vec<(u64, u64)>>,
    /// Journal number -> entries of it removed from branch storages' `Journals/` in this
    /// session: (storage id, sequence when removed). Until that directory is fsynced, a power
    /// loss can bring the entry back, so the file is not recycled before (its new contents would
    /// be read under the old name).
    unlinked: HashMap<u64, Vec<(u64, u64)>>,
    /// Storage id -> sequence of the last `fsync` of its `Journals/` directory.
    dir_synced: HashMap<u64, u64>,
    /// Orders links and directory syncs (invariant 5: a sync covers the links made before it).
    seq: u64,
    /// Journal files this journal created (or took from its pool) in this session.
    created: HashSet<u64>,
    /// Journal number -> the durable length it was started with (its synced zeros), for every
    /// file started in this session: the length its start statement gives.
    started: BTreeMap<u64, u64>,
    /// The start statement `(file, length)` of the owner's durable header (docs/design.md 3.8):
    /// the owner's names of files numbered at or above `stated.0` are never released, so the
    /// statement and the start records that follow it name files that exist. `(0, 0)` until the
    /// owner's first flush of the session writes one.
    stated: (u64, u64),
    /// The owner's closing flush flushed every record it has and its durable header carries no
    /// statement (see [`Journal::start_statement`]): the journal's drop may empty the current
    /// file.
    closed_clean: bool,
    /// The write position right after the last durable mark in the current file (0: none):
    /// when `pos` is still there, no batch came since and no mark is due.
    marked: u64,
}

/// Locks `m`, taking the inner value of a poisoned mutex (a panic in one thread must not turn
/// into panics in others).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// File name of journal number `no`: 16 decimal digits and `.journal`.
pub fn file_name(no: u64) -> String {
    format!("{no:016}.journal")
}

/// The journal number in a file name made by [`file_name`], if it is one.
pub fn parse_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".journal")?;
    if digits.len() != 16 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_roundtrip() {
        assert_eq!(super::file_name(15), "0000000000000015.journal");
        assert_eq!(super::parse_file_name("0000000000000015.journal"), Some(15));
        assert_eq!(super::parse_file_name("15.journal"), None);
        assert_eq!(super::parse_file_name("000000000000001x.journal"), None);
    }
}
