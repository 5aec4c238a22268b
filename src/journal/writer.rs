//! The journal writer: group commit of records into the current journal file.
//!
//! Callers hand a finished [`OutRecord`] to [`Journal::commit`] and block until it is durable.
//! The first caller to find no batch in progress becomes the leader: it takes every queued
//! record, lays them out back to back from the current 4 KiB-aligned position, appends a padding
//! record to end on a 4 KiB boundary, writes them with `pwritev` and calls `fdatasync`, then
//! answers every caller of the batch (leader/follower group commit, as RocksDB's write groups).
//! The actor runtime's journal writer does its own batching and hands each batch to
//! [`Journal::write_records`] instead.
//!
//! This module holds the [`Journal`] itself (its state, counters, opening and dropping) and the
//! writing of batches. The rest of the journal's work is split by concern: `files.rs` (the
//! file lifecycle: creating the next file, links into branch storages, releasing and recycling
//! files, directory syncs), `pool.rs` (whole pre-zeroed files prepared in the background) and
//! `prezero.rs` (zeros ahead of the write position, [`Prezero`]).
//!
//! Fail-stop: a failed write or sync poisons the journal; that batch and every later commit get
//! an error, and a failed `fdatasync` is never retried (DESIGN invariant 2). A failed background
//! `fdatasync` of pre-zeroed space poisons the journal the same way (see `prezero.rs`).
//!
//! Only the journal's modules write or sync journal files (architecture invariant): the batch
//! writer here (records, padding, fallback zeros), `files.rs` (a new file's first zeros) and,
//! beyond the zeroed end only, the background pre-zeroing thread and the pool thread (whole
//! `.zeroed` files).

use std::collections::HashMap;
use std::io::IoSlice;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use super::files::Io;
use super::lock;
use super::pool::{start_pool, Pool};
use super::prezero::ZeroCtl;
use super::record::{padding_for, OutRecord, BATCH_ALIGN, RECORD_HEADER_LEN};
use crate::env::StorageEnv;
use crate::error::{Error, Result};

pub use super::prezero::Prezero;

/// Counters of one journal since open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JournalStats {
    /// Commit records acknowledged.
    pub commits: u64,
    /// Batches written (one `pwritev` group and one `fdatasync` each).
    pub batches: u64,
    /// Bytes of records and padding written.
    pub bytes: u64,
    /// `fdatasync` calls on journal files (batches, new files, and the background pre-zeroing
    /// of this journal's windows).
    pub fdatasyncs: u64,
    /// `fsync` calls on the journal directory.
    pub dir_syncs: u64,
    /// Journal files created (zeroed in the commit path, not taken from the pool).
    pub files_created: u64,
    /// Hard links made into branch storages' `Journals/` (shared journal).
    pub links_made: u64,
    /// Journal files that some storage directory still holds.
    pub files_live: u64,
    /// Released journal files renamed into the pool instead of deleted.
    pub files_recycled: u64,
    /// Pre-zeroed files ready in the pool.
    pub pool_ready: u64,
    /// Bytes of zeros written (and synced) ahead of the write position by the background
    /// pre-zeroing thread ([`Prezero::Ahead`]), off the commit path.
    pub background_zero_bytes: u64,
    /// Bytes of zeros written inside a batch because the background had not zeroed far enough
    /// ([`Prezero::Ahead`] fallback; covered by that batch's `fdatasync`). A new file's first
    /// window is not counted here (see `files_created`).
    pub inline_zero_bytes: u64,
    /// Batches that zeroed inline (the fallback counted in `inline_zero_bytes`).
    pub inline_zeroings: u64,
    /// Batches that waited for a background window in flight before writing.
    pub zeroing_waits: u64,
}

/// A record waiting in a batch (and, with [`Journal::commit`], its committer).
pub(super) struct Waiting {
    ticket: u64,
    pub(super) record: OutRecord,
    /// The committer's own condition variable (used with `Journal::shared`): the leader wakes
    /// exactly the committers of the batch it wrote, and the first queued one to lead next,
    /// instead of every waiting thread.
    wake: Option<Arc<Condvar>>,
}

/// The group-commit queue, under the `shared` lock.
#[derive(Default)]
struct Shared {
    queue: Vec<Waiting>,
    leader: bool,
    next_ticket: u64,
    done: HashMap<u64, Result<u64>>,
    poisoned: Option<String>,
}

/// A group-commit journal writer over the numbered files of one `Journals/` directory: a
/// storage's own journal, or the shared journal of a database, whose files are hard-linked
/// into the `Journals/` of every branch storage that has a record in them.
pub struct Journal {
    pub(super) env: Arc<dyn StorageEnv>,
    pub(super) dir: PathBuf,
    pub(super) owner: u64,
    pub(super) file_size: u64,
    pub(super) prezero: Prezero,
    shared: Mutex<Shared>,
    pub(super) io: Mutex<Io>,
    pub(super) pool: Arc<Pool>,
    /// The zeroed end of the current file and the background pre-zeroing of it.
    pub(super) zero: Arc<ZeroCtl>,
    commits: AtomicU64,
    batches: AtomicU64,
    bytes: AtomicU64,
    pub(super) fdatasyncs: AtomicU64,
    pub(super) dir_syncs: AtomicU64,
    pub(super) files_created: AtomicU64,
    pub(super) links_made: AtomicU64,
    pub(super) files_recycled: AtomicU64,
    pub(super) inline_zero_bytes: AtomicU64,
    pub(super) inline_zeroings: AtomicU64,
    pub(super) zeroing_waits: AtomicU64,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Journal({})", self.dir.display())
    }
}

/// Options of a journal (from [`crate::Options`]).
#[derive(Debug, Clone, Copy)]
pub struct JournalConfig {
    /// Bytes per journal file before the next one is started.
    pub file_size: u64,
    /// Pre-zeroing of the tail.
    pub prezero: Prezero,
    /// Whole pre-zeroed files kept ready in the background (0 = none).
    pub pool_files: usize,
}

impl Journal {
    /// Starts a journal in `<owner_dir>/Journals` owned by storage `owner`, with a new file
    /// numbered `first_no` (always a fresh file after open, so bytes after a torn tail of an
    /// older file are never overwritten and re-read). The file is pre-zeroed, synced, and the
    /// directory synced before this returns (DESIGN invariant 6).
    pub fn open(
        env: Arc<dyn StorageEnv>,
        owner: u64,
        owner_dir: &Path,
        first_no: u64,
        cfg: JournalConfig,
    ) -> Result<Arc<Journal>> {
        let j = Arc::new(Journal::new(env, owner, owner_dir, cfg));
        // Leftover pool files from an earlier session are ready to use; others are removed.
        j.pool.adopt_leftovers(&*j.env, &j.dir, cfg.file_size)?;
        {
            let mut io = lock(&j.io);
            j.new_file(&mut io, first_no, 0)?;
        }
        if cfg.pool_files > 0 {
            start_pool(&j);
        }
        Ok(j)
    }

    fn new(env: Arc<dyn StorageEnv>, owner: u64, owner_dir: &Path, cfg: JournalConfig) -> Journal {
        let zero = Arc::new(ZeroCtl::new(env.clone(), cfg.prezero, cfg.file_size));
        Journal {
            env,
            dir: owner_dir.join(crate::storage::JOURNALS_DIR),
            owner,
            file_size: cfg.file_size,
            prezero: cfg.prezero,
            shared: Mutex::new(Shared::default()),
            io: Mutex::new(Io::new(owner, owner_dir)),
            pool: Arc::new(Pool::new(cfg.pool_files)),
            zero,
            commits: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            fdatasyncs: AtomicU64::new(0),
            dir_syncs: AtomicU64::new(0),
            files_created: AtomicU64::new(0),
            links_made: AtomicU64::new(0),
            files_recycled: AtomicU64::new(0),
            inline_zero_bytes: AtomicU64::new(0),
            inline_zeroings: AtomicU64::new(0),
            zeroing_waits: AtomicU64::new(0),
        }
    }

    /// A journal that refuses every commit (storages opened read-only).
    pub fn open_read_only(env: Arc<dyn StorageEnv>, owner: u64, owner_dir: &Path) -> Arc<Journal> {
        let j = Journal::new(
            env,
            owner,
            owner_dir,
            JournalConfig {
                file_size: 0,
                prezero: Prezero::default(),
                pool_files: 0,
            },
        );
        lock(&j.shared).poisoned = Some("opened read-only".into());
        Arc::new(j)
    }

    /// The directory the journal files are in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The storage that owns the journal directory (the root, or a storage's own journal).
    pub fn owner(&self) -> u64 {
        self.owner
    }

    /// Counters since open.
    pub fn stats(&self) -> JournalStats {
        let io = lock(&self.io);
        JournalStats {
            commits: self.commits.load(Ordering::Relaxed),
            batches: self.batches.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            fdatasyncs: self.fdatasyncs.load(Ordering::Relaxed)
                + self.zero.fdatasyncs.load(Ordering::Relaxed),
            dir_syncs: self.dir_syncs.load(Ordering::Relaxed),
            files_created: self.files_created.load(Ordering::Relaxed),
            links_made: self.links_made.load(Ordering::Relaxed),
            files_live: io.entries.len() as u64,
            files_recycled: self.files_recycled.load(Ordering::Relaxed),
            pool_ready: self.pool.ready_len() as u64,
            background_zero_bytes: self.zero.bytes.load(Ordering::Relaxed),
            inline_zero_bytes: self.inline_zero_bytes.load(Ordering::Relaxed),
            inline_zeroings: self.inline_zeroings.load(Ordering::Relaxed),
            zeroing_waits: self.zeroing_waits.load(Ordering::Relaxed),
        }
    }

    /// The poisoning failure, if a write or sync failed (a batch's, or the background
    /// pre-zeroing's of this journal).
    pub fn poisoned(&self) -> Option<String> {
        let p = lock(&self.shared).poisoned.clone();
        p.or_else(|| {
            lock(&self.zero.state)
                .failed
                .as_ref()
                .map(|e| format!("background pre-zeroing of the journal failed: {e}"))
        })
    }

    /// Marks the journal failed (used when a sibling failure must stop commits).
    pub fn poison(&self, cause: String) {
        let mut g = lock(&self.shared);
        if g.poisoned.is_none() {
            g.poisoned = Some(cause);
        }
    }

    /// Appends `record` and returns the journal number it was written to, once it is durable.
    ///
    /// Errors: the I/O error of the batch write or sync (which also poisons the journal), or
    /// [`Error::Poisoned`] once the journal has failed.
    pub fn commit(&self, record: OutRecord) -> Result<u64> {
        let mut g = lock(&self.shared);
        if let Some(cause) = &g.poisoned {
            return Err(Error::Poisoned {
                cause: cause.clone(),
            });
        }
        let ticket = g.next_ticket;
        g.next_ticket += 1;
        // Each committing thread waits on its own condition variable (kept per thread, so a
        // commit allocates none).
        thread_local! {
            static WAKE: Arc<Condvar> = Arc::new(Condvar::new());
        }
        let wake = WAKE.with(Arc::clone);
        g.queue.push(Waiting {
            ticket,
            record,
            wake: Some(wake.clone()),
        });
        // Bounded: each turn either finds this ticket answered, writes a batch (which answers
        // every ticket it took, this one included), or waits for the leader's notification.
        loop {
            if let Some(r) = g.done.remove(&ticket) {
                return r;
            }
            if !g.leader {
                g.leader = true;
                let batch = std::mem::take(&mut g.queue);
                let poisoned = g.poisoned.clone();
                drop(g);
                let result = match poisoned {
                    Some(cause) => Err(Error::Poisoned { cause }),
                    None => self.write_batch(&batch),
                };
                g = lock(&self.shared);
                if let Err(e) = &result {
                    if g.poisoned.is_none() {
                        g.poisoned = Some(e.to_string());
                    }
                }
                g.leader = false;
                // The leader answers the others of its batch and wakes them, and the first
                // queued committer to lead next; its own answer it returns (no wake-up call).
                for w in &batch {
                    if w.ticket != ticket {
                        g.done.insert(w.ticket, result.clone());
                        if let Some(cv) = &w.wake {
                            cv.notify_one();
                        }
                    }
                }
                if let Some(cv) = g.queue.first().and_then(|w| w.wake.as_ref()) {
                    cv.notify_one();
                }
                return result;
            }
            g = wake.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Writes `records` as one batch (one `pwritev` group, one `fdatasync`) and returns the
    /// journal number they went to, once durable. Used by the journal-writer actor, which does
    /// its own batching; a failure poisons the journal as in [`Journal::commit`].
    pub fn write_records(&self, records: Vec<OutRecord>) -> Result<u64> {
        if let Some(cause) = self.poisoned() {
            return Err(Error::Poisoned { cause });
        }
        let batch: Vec<Waiting> = records
            .into_iter()
            .map(|record| Waiting {
                ticket: 0,
                record,
                wake: None,
            })
            .collect();
        let r = self.write_batch(&batch);
        if let Err(e) = &r {
            self.poison(e.to_string());
        }
        r
    }

    fn write_batch(&self, batch: &[Waiting]) -> Result<u64> {
        let mut io = lock(&self.io);
        // A failed background fdatasync fails this batch (fail-stop, invariant 2).
        if let Some(e) = &lock(&self.zero.state).failed {
            return Err(e.clone());
        }
        // Room for the records, link records and padding.
        let est: u64 = batch
            .iter()
            .map(|w| w.record.total_len() + RECORD_HEADER_LEN as u64 + 512)
            .sum::<u64>()
            + 2 * BATCH_ALIGN;
        if io.pos > 0 && io.pos + est > self.file_size {
            let next = io.no + 1;
            self.new_file(&mut io, next, est)?;
        }
        let links = self.link_batch(&mut io, batch)?;
        let records: Vec<&OutRecord> = links
            .iter()
            .chain(batch.iter().map(|w| &w.record))
            .collect();
        let body: u64 = records.iter().map(|r| r.total_len()).sum();
        let pad = padding_for(io.pos + body);
        let len = body + pad.as_ref().map_or(0, |p| p.total_len());
        debug_assert_eq!((io.pos + len) % BATCH_ALIGN, 0);
        let end = io.pos + len;
        self.ensure_zeroed(&mut io, end)?;
        let headers: Vec<[u8; RECORD_HEADER_LEN]> = records
            .iter()
            .copied()
            .chain(pad.iter())
            .map(|r| r.header(io.no))
            .collect();
        let mut slices: Vec<IoSlice<'_>> = Vec::new();
        for (r, h) in records.iter().copied().chain(pad.iter()).zip(&headers) {
            slices.push(IoSlice::new(h));
            for p in &r.parts {
                slices.push(IoSlice::new(p));
            }
        }
        debug_assert_eq!(
            slices.iter().map(|s| s.len() as u64).sum::<u64>(),
            len,
            "the batch's slices cover its records and padding"
        );
        // One write and one fdatasync (on io_uring: a linked WRITEV + FSYNC(DATASYNC)).
        // Timed only when a subscriber wants the batch event (no clock read otherwise).
        let timed = tracing::enabled!(tracing::Level::DEBUG).then(std::time::Instant::now);
        {
            let _busy = super::activity::batch();
            io.file.write_vectored_and_sync(&slices, io.pos)?;
        }
        if let Some(t) = timed {
            tracing::debug!(
                journal = io.no,
                records = batch.len(),
                bytes = len,
                storages = distinct_storages(batch),
                sync_us = t.elapsed().as_micros() as u64,
                "journal batch"
            );
        }
        self.fdatasyncs.fetch_add(1, Ordering::Relaxed);
        io.pos += len;
        if self.pool.target > 0
            && io.pos > self.file_size / 2
            && !self.pool.wanted.swap(true, Ordering::AcqRel)
        {
            self.pool.cv.notify_all();
        }
        let no = io.no;
        let entry = io.entries.entry(no).or_default();
        for w in batch {
            let m = entry.entry(w.record.storage_id).or_insert(0);
            *m = (*m).max(w.record.txn_id);
        }
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.commits
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        self.bytes.fetch_add(len, Ordering::Relaxed);
        Ok(no)
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        // No background zeroing of this journal's file after this (bounded: one window).
        self.zero.close();
        self.pool.stop();
    }
}

/// The number of distinct storages with a record in `batch` (for the batch's trace event only).
fn distinct_storages(batch: &[Waiting]) -> usize {
    let mut ids: Vec<u64> = batch.iter().map(|w| w.record.storage_id).collect();
    ids.sort_unstable();
    ids.dedup();
    ids.len()
}
