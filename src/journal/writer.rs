//! The journal writer: group commit of records into the current journal file.
//!
//! Callers hand a finished [`OutRecord`] to [`Journal::commit_with`] and block until it is durable.
//! The first caller to find no batch in progress becomes the leader: it takes every queued
//! record, lays them out back to back from the current 4 KiB-aligned position, appends a padding
//! record to end on a 4 KiB boundary, writes them with `pwritev` and calls `fdatasync`, then
//! answers every caller of the batch (leader/follower group commit, as RocksDB's write groups).
//! The actor runtime's journal writer does its own batching and hands each batch to
//! [`Journal::write_records`] instead, which joins the same queue.
//!
//! Eventual commits ([`Durability::Eventual`], [`Journal::commit_with`]): the record is queued
//! and the call returns at once, with no write. Queued records go out, in queue order, with the
//! next batch any leader writes (a later immediate commit of any storage of the journal, a
//! [`Journal::sync_queued`] by a flush or close), or, when none comes, with the batch the
//! journal's sync thread (`omnibus-journal-sync`, started by the first eventual commit) writes
//! once the oldest queued eventual record is [`JournalConfig::eventual_sync`] old. Every write
//! is still followed by its `fdatasync` in the same batch, so the journal on disk never holds
//! unsynced records: a crash loses a suffix of the queue order, never a hole. The thread waits
//! on a condition variable (no eventual record queued: without timeout; else until the
//! oldest's deadline, or the end of the batch in progress): no polling.
//!
//! Durable marks (design.md 3.12, invariant I15): the same thread, started by the first batch,
//! writes a mark after the last batch once the journal has been idle for
//! [`JournalConfig::mark_idle`] (`Journal::write_mark`): a 4 KiB padding record stating that
//! every batch below it was synced, so that recovery reports damage to that batch instead of
//! taking it for a torn tail. One write and one `fdatasync` per idle period; none while batches
//! keep coming (the thread wakes at most once per idle delay to look).
//!
//! This module holds the [`Journal`] itself (its state, counters, opening and dropping) and the
//! writing of batches. The rest of the journal's work is split by concern: `files.rs` (the
//! file lifecycle: creating the next file, links into branch storages, releasing and recycling
//! files, directory syncs), `pool.rs` (whole pre-zeroed files prepared in the background) and
//! `prezero.rs` (zeros ahead of the write position, [`Prezero`]).
//!
//! Fail-stop: a failed write or sync poisons the journal; that batch and every later commit get
//! an error, and a failed `fdatasync` is never retried (design.md invariant I2). A failed background
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
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use super::lock;
use super::pool::{start_pool, Pool};
use super::prezero::ZeroCtl;
use super::record::{mark_record, padding_for, OutRecord, BATCH_ALIGN, RECORD_HEADER_LEN};
use super::{Io, Journal, Shared, Waiting};
use crate::env::{JournalIo, StorageEnv};
use crate::error::{Error, Result};
use crate::options::Durability;

pub use super::prezero::Prezero;

/// Bytes of eventual records queued at most: past it an eventual commit is written and synced
/// before it returns, as an immediate one (back-pressure; the queue holds page images).
pub const EVENTUAL_QUEUE_BYTES: u64 = 16 << 20;

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
    /// Bytes of zeros written into new pool files (whole files, by the pool thread), off the
    /// commit path. A recycled file is reused as it is and adds nothing here.
    pub pool_zero_bytes: u64,
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
    /// Commits acknowledged as [`Durability::Eventual`] when queued (also counted in
    /// `commits` once their batch is written).
    pub eventual_commits: u64,
    /// Eventual commits acknowledged and then lost: their batch failed (the journal is then
    /// poisoned), or the journal was poisoned before they were written.
    pub eventual_lost: u64,
    /// Start records written: one per journal file started after the session's first, each
    /// a 4 KiB batch of its own in the previous file with one `fdatasync` (counted in
    /// `fdatasyncs`; docs/design.md 3.8).
    pub start_records: u64,
    /// Durable marks written: one per idle period after a batch, each a 4 KiB batch of its own
    /// (counted in `bytes`) with one `fdatasync` (counted in `fdatasyncs`), never in `batches`
    /// (docs/design.md 3.12).
    pub durable_marks: u64,
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
    /// Longest time an eventual record waits in the queue before the sync thread writes and
    /// syncs it ([`crate::Options::eventual_sync_ms`]).
    pub eventual_sync: Duration,
    /// How batches reach the device, as requested ([`crate::Options::journal_io`]; resolved
    /// when the journal opens, `crate::journal_io`).
    pub io: JournalIo,
    /// How long the journal must stay idle after a batch before its sync thread writes a
    /// durable mark after it ([`crate::Options::journal_mark_ms`]); zero: never.
    pub mark_idle: Duration,
}

impl JournalConfig {
    /// The journal options of `opts`.
    pub fn of(opts: &crate::Options) -> JournalConfig {
        JournalConfig {
            file_size: opts.journal_file_size,
            prezero: opts.journal_prezero,
            pool_files: opts.journal_pool_files,
            eventual_sync: Duration::from_millis(opts.eventual_sync_ms),
            io: opts.journal_io,
            mark_idle: Duration::from_millis(opts.journal_mark_ms),
        }
    }
}

impl Journal {
    /// Starts a journal in `<owner_dir>/Journals` owned by storage `owner`, with a new file
    /// numbered `first_no` (always a fresh file after open, so bytes after a torn tail of an
    /// older file are never overwritten and re-read). The file is pre-zeroed, synced, and the
    /// directory synced before this returns (design.md invariant I6).
    pub fn open(
        env: Arc<dyn StorageEnv>,
        owner: u64,
        owner_dir: &Path,
        first_no: u64,
        cfg: JournalConfig,
    ) -> Result<Arc<Journal>> {
        // The batch path first (a short probe in `Journals/` when `Auto`, once per device),
        // after removing any probe file a killed process left there.
        let journals = owner_dir.join(crate::layout::JOURNALS_DIR);
        crate::journal_io::sweep(&*env, &journals);
        let io_path = crate::journal_io::resolve(cfg.io, &env, &journals);
        tracing::debug!(journal = %owner_dir.display(), path = io_path.0.name(), why = %io_path.1, "journal I/O path");
        let j = Arc::new_cyclic(|me| Journal::new(env, owner, owner_dir, cfg, io_path, me.clone()));
        // Leftover pool files from an earlier open are ready to use; others are removed.
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

    fn new(
        env: Arc<dyn StorageEnv>,
        owner: u64,
        owner_dir: &Path,
        cfg: JournalConfig,
        io_path: (JournalIo, String),
        me: Weak<Journal>,
    ) -> Journal {
        let zero = Arc::new(ZeroCtl::new(env.clone(), cfg.prezero, cfg.file_size));
        Journal {
            env,
            dir: owner_dir.join(crate::layout::JOURNALS_DIR),
            owner,
            file_size: cfg.file_size,
            prezero: cfg.prezero,
            io_path,
            shared: Arc::new(Mutex::new(Shared::default())),
            sync_cv: Arc::new(Condvar::new()),
            eventual_sync: cfg.eventual_sync,
            mark_idle: cfg.mark_idle,
            me,
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
            flushed: Mutex::new(HashMap::new()),
            start_records: AtomicU64::new(0),
            eventual_commits: AtomicU64::new(0),
            eventual_lost: AtomicU64::new(0),
            marks: AtomicU64::new(0),
            recorders: Default::default(),
        }
    }

    /// Storage `sid` has flushed every transaction up to `flushed` (a durable header records
    /// it). Used when the journal is dropped: see `Drop for Journal`.
    pub fn note_flushed(&self, sid: u64, flushed: u64) {
        let mut g = lock(&self.flushed);
        let m = g.entry(sid).or_insert(0);
        *m = (*m).max(flushed);
    }

    /// On drop: empties the current file when every storage with records in it has flushed
    /// them (its zeroed tail, up to the journal file size, and its records cost disk space that
    /// no recovery needs), removes the owner's names of older files whose records are all
    /// flushed (after a clean close of the owner), and removes the pre-zeroed pool files (an idle database keeps no
    /// zeros; the next open zeroes new ones in the background). Best effort, not synced:
    /// after a crash the file may be back whole, which is harmless (its records are at or below
    /// every storage's durable header). Returns the bytes given back (by file lengths).
    fn release_on_drop(&self) -> u64 {
        if self.file_size == 0 || self.poisoned().is_some() {
            return 0;
        }
        let mut pool: Vec<PathBuf> = std::iter::from_fn(|| self.pool.take()).collect();
        let current = {
            let io = lock(&self.io);
            let flushed = lock(&self.flushed);
            let done = |per: &HashMap<u64, u64>| {
                per.iter()
                    .all(|(sid, max)| flushed.get(sid).is_some_and(|f| f >= max) || *max == 0)
            };
            // The owner's durable start statement must let the file be emptied (its closing
            // flush stated the current file with length 0), else the next open would take the
            // empty file for one that was cut.
            let clean = io.no != 0 && self.current_stated_empty(&io);
            if clean {
                // The owner's names of older files whose records are all flushed: the owner
                // releases no file at or above its last statement while it runs (3.8), so a
                // file started since that statement kept the owner's name, a whole file (a
                // pool file's 256 MiB by default). With no statement left, nothing needs it.
                // Regression: a database closed after a rotation kept the previous journal
                // file, pre-zeroed to its full size.
                pool.extend(
                    io.entries
                        .iter()
                        .filter(|(no, per)| {
                            **no < io.no && per.contains_key(&self.owner) && done(per)
                        })
                        .map(|(no, _)| self.dir.join(super::file_name(*no))),
                );
            }
            let all_flushed = clean && io.entries.get(&io.no).is_some_and(done);
            all_flushed.then(|| io.file.clone())
        };
        let env = self.env.clone();
        let release = move || {
            let mut given = 0u64;
            for p in &pool {
                let len = std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
                if env.remove_file(p).is_ok() {
                    given += len;
                }
            }
            if let Some(file) = current {
                let len = file.len().unwrap_or(0);
                match file.set_len(0) {
                    Ok(()) => given += len,
                    Err(e) => {
                        tracing::warn!(error = %e, "emptying the flushed journal file at close failed")
                    }
                }
            }
            given
        };
        // The last handle may be dropped on an executor (an actor's storage), which must never
        // wait for the disk: the release then runs on a short-lived thread of its own.
        if crate::env::executor_guard::on_executor() {
            let spawned = std::thread::Builder::new()
                .name("omnibus-journal-release".into())
                .spawn(release);
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "releasing the journal's disk space at close skipped");
            }
            return 0;
        }
        release()
    }

    /// A journal that refuses every commit (storages opened read-only).
    pub fn open_read_only(env: Arc<dyn StorageEnv>, owner: u64, owner_dir: &Path) -> Arc<Journal> {
        let j = Arc::new_cyclic(|me| {
            Journal::new(
                env,
                owner,
                owner_dir,
                JournalConfig {
                    file_size: 0,
                    prezero: Prezero::default(),
                    pool_files: 0,
                    eventual_sync: Duration::from_millis(100),
                    io: JournalIo::Syscalls,
                    mark_idle: Duration::ZERO,
                },
                (JournalIo::Syscalls, "opened read-only".into()),
                me.clone(),
            )
        });
        lock(&j.shared).poisoned = Some("opened read-only".into());
        j
    }

    /// How batches reach the device (never [`JournalIo::Auto`]) and why.
    pub fn io_path(&self) -> (JournalIo, String) {
        self.io_path.clone()
    }

    /// The storage that owns the journal directory (the root, or a storage's own journal):
    /// the flush compares it with its storage to know whether it writes the journal's start
    /// statement into its header (design.md 3.8).
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
            pool_zero_bytes: self.pool.zero_bytes.load(Ordering::Relaxed),
            background_zero_bytes: self.zero.bytes.load(Ordering::Relaxed),
            inline_zero_bytes: self.inline_zero_bytes.load(Ordering::Relaxed),
            inline_zeroings: self.inline_zeroings.load(Ordering::Relaxed),
            zeroing_waits: self.zeroing_waits.load(Ordering::Relaxed),
            eventual_commits: self.eventual_commits.load(Ordering::Relaxed),
            eventual_lost: self.eventual_lost.load(Ordering::Relaxed),
            start_records: self.start_records.load(Ordering::Relaxed),
            durable_marks: self.marks.load(Ordering::Relaxed),
        }
    }

    /// Adds this journal's histograms and counters to `g` (`crate::metrics`).
    pub fn gather_metrics(&self, g: &mut crate::metrics::Gather) {
        let queued = lock(&self.shared).queue.len() as u64;
        g.journal(
            &self.recorders,
            (
                self.commits.load(Ordering::Relaxed),
                self.batches.load(Ordering::Relaxed),
                self.fdatasyncs.load(Ordering::Relaxed)
                    + self.zero.fdatasyncs.load(Ordering::Relaxed),
                self.bytes.load(Ordering::Relaxed),
                queued,
            ),
        );
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

    /// Appends `record` and returns the journal number it was written to, once it is durable
    /// ([`Durability::Immediate`]; see [`Journal::commit_with`]). Unit tests only: the engine
    /// commits through `commit_with`.
    ///
    /// Errors: as [`Journal::commit_with`].
    #[cfg(test)]
    pub fn commit(&self, record: OutRecord) -> Result<u64> {
        self.submit(std::iter::once(record), Durability::Immediate)
    }

    /// Appends `record` with `durability`. `Immediate`: returns the journal number it was
    /// written to, once it is durable (joining or leading a batch). `Eventual`:
    /// queues the record and returns `Ok(0)` at once (no journal number yet); it is written,
    /// in queue order, with the next batch, or by the sync thread within
    /// [`JournalConfig::eventual_sync`]. When [`EVENTUAL_QUEUE_BYTES`] of eventual records are
    /// queued already, or the sync thread cannot be started, the record is committed as
    /// `Immediate` instead.
    ///
    /// Errors: the I/O error of the batch write or sync (which also poisons the journal), or
    /// [`Error::Poisoned`] once the journal has failed; an eventual record only fails with
    /// [`Error::Poisoned`] (when the journal failed before it was queued). The failure of a
    /// later batch that holds it poisons the journal and names it in the cause.
    pub fn commit_with(&self, record: OutRecord, durability: Durability) -> Result<u64> {
        self.submit(std::iter::once(record), durability)
    }

    /// Returns once every eventual record acknowledged before the call is durable: joins or
    /// leads a batch when one is queued or being written; returns at once (no lock held long,
    /// no I/O) when none is. Flushes call it before writing pages, so that no data file gets
    /// ahead of the journal's durable order (docs/design.md, section 4.2); closes call it too.
    ///
    /// Errors: the failed batch's error, or [`Error::Poisoned`] once the journal has failed.
    pub fn sync_queued(&self) -> Result<()> {
        self.submit(std::iter::empty(), Durability::Immediate)
            .map(|_| ())
    }

    /// Writes `records` as one group (they stay together and in order in one batch, after
    /// every record queued before them) and returns the journal number they went to, once
    /// durable; with [`Durability::Eventual`], queues them and returns `Ok(0)` as
    /// [`Journal::commit_with`]. Used by the journal-writer actor, which does its own batching
    /// before; a failure poisons the journal as in [`Journal::commit_with`].
    pub fn write_records(&self, records: Vec<OutRecord>, durability: Durability) -> Result<u64> {
        self.submit(records, durability)
    }

    /// Queues `records` and, unless they are eventual, waits for (or leads) the batch that
    /// makes them durable. No records and `Immediate`: waits for everything queued before.
    fn submit<I: IntoIterator<Item = OutRecord>>(
        &self,
        records: I,
        durability: Durability,
    ) -> Result<u64> {
        let mut g = lock(&self.shared);
        if let Some(cause) = &g.poisoned {
            return Err(Error::Poisoned {
                cause: cause.clone(),
            });
        }
        if durability == Durability::Eventual
            && g.eventual_bytes < EVENTUAL_QUEUE_BYTES
            && self.start_sync_thread(&mut g)
        {
            let mut n = 0;
            for record in records {
                g.eventual_bytes += record.total_len();
                g.queue.push(Waiting {
                    ticket: 0,
                    record,
                    wake: None,
                });
                n += 1;
            }
            if n > 0 {
                self.eventual_commits.fetch_add(n, Ordering::Relaxed);
                if g.eventual_since.is_none() {
                    g.eventual_since = Some(Instant::now());
                    self.sync_cv.notify_one();
                }
            }
            return Ok(0);
        }
        let ticket = g.next_ticket;
        g.next_ticket += 1;
        // Each committing thread waits on its own condition variable (kept per thread, so a
        // commit allocates none).
        thread_local! {
            static WAKE: Arc<Condvar> = Arc::new(Condvar::new());
        }
        let wake = WAKE.with(Arc::clone);
        let before = g.queue.len();
        for record in records {
            g.queue.push(Waiting {
                ticket,
                record,
                wake: Some(wake.clone()),
            });
        }
        if g.queue.len() == before {
            // A sync: nothing to wait for when no eventual record is queued or being written.
            if g.eventual_since.is_none() && !g.writing_eventual {
                return Ok(0);
            }
            g.syncs.push((ticket, wake.clone()));
        }
        // Bounded: each turn either finds this ticket answered, writes a batch (which answers
        // every ticket it took, this one included), or waits for the leader's notification.
        loop {
            if let Some(r) = g.done.remove(&ticket) {
                return r;
            }
            if !g.leader {
                let (_g, result) = self.lead(g, Some(ticket));
                return result;
            }
            g = wake.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Leads one batch: takes every queued record and waiting sync, writes them (one write,
    /// one `fdatasync`), then answers the others of the batch and wakes the next leader (the
    /// first queued committer or sync) and the sync thread. Returns the batch's result for
    /// `own`, the caller's ticket (answered directly, no wake-up call). A failure poisons the
    /// journal, naming the eventual commits it loses.
    fn lead<'a>(
        &'a self,
        mut g: MutexGuard<'a, Shared>,
        own: Option<u64>,
    ) -> (MutexGuard<'a, Shared>, Result<u64>) {
        g.leader = true;
        let batch = std::mem::take(&mut g.queue);
        let syncs = std::mem::take(&mut g.syncs);
        g.writing_eventual = g.eventual_since.is_some();
        g.eventual_since = None;
        g.eventual_bytes = 0;
        let poisoned = g.poisoned.clone();
        drop(g);
        let result = match poisoned {
            Some(cause) => Err(Error::Poisoned { cause }),
            None if batch.is_empty() => Ok(0),
            None => self.write_batch(&batch),
        };
        g = lock(&self.shared);
        if let Err(e) = &result {
            let lost = lost_eventual(&batch);
            if !lost.is_empty() {
                let n = batch.iter().filter(|w| w.eventual()).count() as u64;
                self.eventual_lost.fetch_add(n, Ordering::Relaxed);
                tracing::error!(journal = %self.dir.display(), error = %e, lost = %lost,
                    "eventual commits acknowledged earlier are lost");
            }
            if g.poisoned.is_none() {
                g.poisoned = Some(if lost.is_empty() {
                    e.to_string()
                } else {
                    format!(
                        "{e}; eventual commits acknowledged before the failure are lost: {lost}"
                    )
                });
            }
        }
        g.leader = false;
        g.writing_eventual = false;
        if result.is_ok() && !batch.is_empty() && !self.mark_idle.is_zero() {
            // A durable mark is due once the journal stays idle (docs/design.md 3.12). The sync
            // thread is woken only when the last batch was marked: during a busy stream it
            // wakes once per idle interval at most, and this costs a clock read.
            let was = g.unmarked.replace(Instant::now());
            if was.is_none() && self.start_sync_thread(&mut g) {
                self.sync_cv.notify_one();
            }
        }
        // The leader answers the others of its batch and wakes them, and the first queued
        // committer to lead next; its own answer it returns (no wake-up call).
        for w in &batch {
            if let Some(cv) = &w.wake {
                if Some(w.ticket) != own {
                    g.done.insert(w.ticket, result.clone());
                    cv.notify_one();
                }
            }
        }
        for (t, cv) in &syncs {
            if Some(*t) != own {
                g.done.insert(*t, result.clone());
                cv.notify_one();
            }
        }
        let next = g
            .queue
            .iter()
            .find_map(|w| w.wake.as_ref())
            .or_else(|| g.syncs.first().map(|(_, cv)| cv));
        if let Some(cv) = next {
            cv.notify_one();
        }
        if g.eventual_since.is_some() {
            self.sync_cv.notify_one();
        }
        (g, result)
    }

    /// Starts the sync thread unless it runs; false when it cannot be started (the caller
    /// commits immediately instead).
    fn start_sync_thread(&self, g: &mut Shared) -> bool {
        if g.sync_thread {
            return true;
        }
        let (shared, cv, me, every, idle) = (
            self.shared.clone(),
            self.sync_cv.clone(),
            self.me.clone(),
            self.eventual_sync,
            self.mark_idle,
        );
        match std::thread::Builder::new()
            .name("omnibus-journal-sync".into())
            .spawn(move || sync_thread(shared, cv, me, every, idle))
        {
            Ok(_) => {
                g.sync_thread = true;
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the journal's sync thread: eventual commits are synced at once");
                false
            }
        }
    }

    /// Writes a durable mark (docs/design.md 3.12) at the write position, as a 4 KiB batch of
    /// its own with one `fdatasync`, when a batch was written since the last mark in the
    /// current file and the file keeps room for it and for the next file's start record.
    /// Called by the sync thread once the journal is idle; a committer that arrives meanwhile
    /// waits for the `io` lock (one sync at most). Returns whether a mark was written.
    ///
    /// Errors: the write's or sync's I/O error, which poisons the journal as a failed batch
    /// does (the sync is never retried).
    fn write_mark(&self) -> Result<bool> {
        let mut io = lock(&self.io);
        if self.poisoned().is_some()
            || io.no == 0
            || io.pos == io.marked
            || io.pos + 2 * BATCH_ALIGN > self.file_size
        {
            return Ok(false);
        }
        let durable = lock(&self.zero.state).zeroed_end;
        let mark = mark_record(io.pos, durable);
        let end = io.pos + mark.total_len();
        let written = self.ensure_zeroed(&mut io, end).and_then(|()| {
            let header = mark.header(io.no);
            let mut slices = vec![IoSlice::new(&header)];
            slices.extend(mark.parts.iter().map(|p| IoSlice::new(p)));
            Ok(io
                .file
                .write_vectored_and_sync(&slices, io.pos, self.io_path.0)?)
        });
        if let Err(e) = written {
            let cause = format!("writing the journal's durable mark failed: {e}");
            tracing::error!(journal = %self.dir.display(), error = %e, "writing the journal's durable mark failed");
            self.poison(cause);
            return Err(e);
        }
        self.fdatasyncs.fetch_add(1, Ordering::Relaxed);
        self.marks.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(mark.total_len(), Ordering::Relaxed);
        io.pos = end;
        io.marked = end;
        Ok(true)
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
            .map(|w| {
                // A link record per storage of the record (a group has several).
                let links = w.record.commits().count().max(1) as u64;
                w.record.total_len() + (RECORD_HEADER_LEN as u64 + 512) * links
            })
            .sum::<u64>()
            + 2 * BATCH_ALIGN;
        // And for the start record of the next file (4 KiB), which goes after the last batch.
        if io.pos > 0 && io.pos + est + BATCH_ALIGN > self.file_size {
            let next = io.no + 1;
            self.new_file(&mut io, next, est)?;
        }
        let links = self.link_batch(&mut io, batch)?;
        let records: Vec<&OutRecord> = links
            .iter()
            .chain(batch.iter().map(|w| &w.record))
            .collect();
        let body: u64 = records.iter().map(|r| r.total_len()).sum();
        // The file's durable length before this batch, recorded in its padding: every byte
        // below the zeroed end is a record or a zero that is synced (published by the background
        // after its sync, or written by an earlier batch whose sync succeeded: a failed one
        // poisons). No power loss can make the file shorter, so recovery takes a file shorter
        // than this for a file that was cut (`recovery::scan`).
        let durable = lock(&self.zero.state).zeroed_end;
        let pad = padding_for(io.pos + body, durable);
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
        // One write and one fdatasync, by the path chosen at open (`journal_io.rs`). The span
        // is DEBUG: disabled, it costs two interest checks per batch; its fields are evaluated
        // only when enabled. The clock is read twice per batch for the metrics either way.
        let span = tracing::debug_span!(
            "journal batch",
            journal = io.no,
            records = batch.len(),
            bytes = len,
            storages = tracing::field::Empty,
            syncs = 1u64,
            sync_us = tracing::field::Empty,
        );
        if !span.is_disabled() {
            span.record("storages", distinct_storages(batch));
        }
        let started = Instant::now();
        {
            let _in = span.enter();
            let _busy = super::activity::batch();
            io.file
                .write_vectored_and_sync(&slices, io.pos, self.io_path.0)?;
        }
        let done = Instant::now();
        let us = micros(done.saturating_duration_since(started));
        span.record("sync_us", us);
        // The event that closes the span: a subscriber that prints events (the command line's)
        // shows the span's fields with it.
        span.in_scope(|| tracing::debug!("journal batch written and synced"));
        drop(span);
        self.recorders.batch_us.record(us);
        self.recorders.batch_records.record(batch.len() as u64);
        self.recorders.commit_us.record_all(
            batch
                .iter()
                .filter_map(|w| w.record.started)
                .map(|t| micros(done.saturating_duration_since(t))),
        );
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
        let mut commits = 0u64;
        for (sid, txn) in batch.iter().flat_map(|w| w.record.commits()) {
            let m = entry.entry(sid).or_insert(0);
            *m = (*m).max(txn);
            commits += 1;
        }
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.commits.fetch_add(commits, Ordering::Relaxed);
        self.bytes.fetch_add(len, Ordering::Relaxed);
        Ok(no)
    }
}

/// `d` in whole µs (saturating).
fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The eventual records of `batch`, described per storage (`storage 0x.. txn a..=b`), for a
/// failure's report; empty when it has none.
fn lost_eventual(batch: &[Waiting]) -> String {
    let mut per: Vec<(u64, u64, u64)> = Vec::new();
    for (sid, txn) in batch
        .iter()
        .filter(|w| w.eventual())
        .flat_map(|w| w.record.commits())
    {
        match per.iter_mut().find(|(s, _, _)| *s == sid) {
            Some(e) => {
                e.1 = e.1.min(txn);
                e.2 = e.2.max(txn);
            }
            None => per.push((sid, txn, txn)),
        }
    }
    per.iter()
        .map(|(s, a, b)| format!("storage {s:#018x} txn {a}..={b}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The sync thread: writes the queued eventual records once the oldest is `every` old and no
/// batch took them meanwhile, and a durable mark once the journal has been idle for `idle`
/// after a batch (zero: never; docs/design.md 3.12). Waits on `cv` (no polling: a busy journal
/// wakes it once per `idle` at most); exits when the journal is dropped.
/// How many mark delays (`Options::journal_mark_ms`) a journal's mark waits at most, after its
/// last batch, for the process's other journals to go idle too.
const MARK_PATIENCE: u32 = 10;

fn sync_thread(
    shared: Arc<Mutex<Shared>>,
    cv: Arc<Condvar>,
    me: Weak<Journal>,
    every: Duration,
    idle: Duration,
) {
    let mut g = lock(&shared);
    // Bounded: each turn waits for a notification or a deadline, or writes one batch or mark.
    loop {
        if g.stop {
            return;
        }
        let eventual_due = g.eventual_since.map(|since| since + every);
        let mark_due = g
            .unmarked
            .filter(|_| !idle.is_zero())
            .map(|since| since + idle);
        let Some(due) = eventual_due.into_iter().chain(mark_due).min() else {
            g = cv.wait(g).unwrap_or_else(|e| e.into_inner());
            continue;
        };
        let now = Instant::now();
        if now < due {
            g = cv
                .wait_timeout(g, due - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            continue;
        }
        if g.leader || (eventual_due.is_none() && !g.queue.is_empty()) {
            // The batch in progress (or the one a queued committer is about to lead) ends with
            // a notification when eventual records wait, and moves `unmarked` on; a mark waits
            // for the journal to be idle again.
            g = if idle.is_zero() {
                cv.wait(g).unwrap_or_else(|e| e.into_inner())
            } else {
                cv.wait_timeout(g, idle)
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            };
            continue;
        }
        let eventual = eventual_due.is_some_and(|d| d <= now);
        if !eventual {
            if let Some(since) = g.unmarked {
                // The device is the process's: while another journal of it wrote a batch within
                // the delay, the mark waits (at most MARK_PATIENCE delays after this journal's
                // last batch), so idle journals beside busy ones never take syncs from them
                // (docs/design.md 3.12).
                let patient_until = since + idle * MARK_PATIENCE;
                if now < patient_until && super::activity::busy_within(idle) {
                    g = cv
                        .wait_timeout(g, idle.min(patient_until - now))
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                    continue;
                }
            }
            g.unmarked = None;
            if eventual_due.is_some() {
                // Eventual records are queued: their batch comes within `every` and is marked
                // once the journal is idle after it.
                continue;
            }
        }
        drop(g);
        let Some(j) = me.upgrade() else {
            return;
        };
        if eventual {
            let jg = lock(&j.shared);
            if !jg.leader && jg.eventual_since.is_some() && !jg.stop {
                // A failure is recorded (poisoned, lost commits named) by `lead`.
                let _ = j.lead(jg, None);
            }
        } else {
            // A failure poisons the journal (recorded by `write_mark`).
            let _ = j.write_mark();
        }
        // Possibly the last reference: the journal's drop then runs here.
        drop(j);
        g = lock(&shared);
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        // Eventual records still queued (a storage dropped without a flush) are written now;
        // the sync thread exits.
        {
            let mut g = lock(&self.shared);
            g.stop = true;
            self.sync_cv.notify_all();
            if !g.queue.is_empty() && !g.leader {
                let (_g, r) = self.lead(g, None);
                if let Err(e) = r {
                    tracing::error!(journal = %self.dir.display(), error = %e, "writing the queued eventual commits at close failed");
                }
            }
        }
        // No background zeroing of this journal's file after this (bounded: one window).
        self.zero.close();
        self.pool.stop();
        self.release_on_drop();
    }
}

/// The number of distinct storages with a record in `batch` (for the batch's trace event only).
fn distinct_storages(batch: &[Waiting]) -> usize {
    let mut ids: Vec<u64> = batch
        .iter()
        .flat_map(|w| w.record.commits().map(|(s, _)| s))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::record::{Part, RecordKind};

    const OWNER: u64 = 0x0123_4567_89ab_cdef;

    fn journal(dir: &Path) -> Arc<Journal> {
        std::fs::create_dir_all(dir.join(crate::layout::JOURNALS_DIR)).unwrap();
        let cfg = JournalConfig {
            file_size: 1 << 20,
            prezero: Prezero::Off,
            pool_files: 0,
            eventual_sync: Duration::from_secs(60),
            io: crate::JournalIo::Auto,
            mark_idle: Duration::ZERO,
        };
        Journal::open(crate::env::default_env(), OWNER, dir, 1, cfg).unwrap()
    }

    fn record(txn: u64, len: usize) -> OutRecord {
        OutRecord::new(
            RecordKind::Commit,
            OWNER,
            txn,
            vec![Part::Owned(vec![7; len])],
        )
    }

    #[test]
    fn eventual_records_wait_for_the_next_batch() {
        let dir = tempfile::tempdir().unwrap();
        let j = journal(dir.path());
        assert_eq!(
            j.commit_with(record(1, 100), Durability::Eventual).unwrap(),
            0
        );
        assert_eq!(
            j.commit_with(record(2, 100), Durability::Eventual).unwrap(),
            0
        );
        let s = j.stats();
        assert_eq!((s.eventual_commits, s.commits, s.batches), (2, 0, 0));
        // An immediate commit writes them first, in the same batch.
        j.commit(record(3, 100)).unwrap();
        let s = j.stats();
        assert_eq!((s.commits, s.batches), (3, 1));
        // Nothing eventual queued: a sync returns without a batch.
        j.sync_queued().unwrap();
        assert_eq!(j.stats().batches, 1);
        // Queued: a sync writes them.
        j.commit_with(record(4, 100), Durability::Eventual).unwrap();
        j.sync_queued().unwrap();
        let s = j.stats();
        assert_eq!((s.commits, s.batches), (4, 2));
    }

    #[test]
    fn a_full_queue_commits_immediately() {
        let dir = tempfile::tempdir().unwrap();
        let j = journal(dir.path());
        j.commit_with(
            record(1, EVENTUAL_QUEUE_BYTES as usize),
            Durability::Eventual,
        )
        .unwrap();
        assert_eq!(j.stats().batches, 0);
        // Past the bound: written and synced (with the queued one) before it returns.
        j.commit_with(record(2, 100), Durability::Eventual).unwrap();
        let s = j.stats();
        assert_eq!((s.eventual_commits, s.commits, s.batches), (1, 2, 1));
    }

    #[test]
    fn lost_eventual_commits_are_named_per_storage() {
        let w = |sid: u64, txn: u64, eventual: bool| Waiting {
            ticket: 0,
            record: OutRecord::new(RecordKind::Commit, sid, txn, vec![Part::Zeros(1)]),
            wake: (!eventual).then(|| Arc::new(Condvar::new())),
        };
        let batch = [
            w(1, 5, true),
            w(2, 9, true),
            w(1, 6, true),
            w(1, 7, false),
            w(1, 4, true),
        ];
        assert_eq!(
            lost_eventual(&batch),
            "storage 0x0000000000000001 txn 4..=6, storage 0x0000000000000002 txn 9..=9"
        );
        assert_eq!(lost_eventual(&batch[3..4]), "");
    }

    #[test]
    fn dropping_the_journal_writes_the_queue() {
        let dir = tempfile::tempdir().unwrap();
        let j = journal(dir.path());
        j.commit_with(record(1, 100), Durability::Eventual).unwrap();
        let path = dir
            .path()
            .join(crate::layout::JOURNALS_DIR)
            .join(super::super::file_name(1));
        drop(j);
        // The record is in the file: its first bytes are no longer zeros.
        let bytes = std::fs::read(path).unwrap();
        assert!(bytes[..64].iter().any(|&b| b != 0));
    }
}
