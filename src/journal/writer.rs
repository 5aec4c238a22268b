//! The journal writer: group commit over numbered, pre-zeroed journal files.
//!
//! Callers hand a finished [`OutRecord`] to [`Journal::commit`] and block until it is durable.
//! The first caller to find no batch in progress becomes the leader: it takes every queued
//! record, lays them out back to back from the current 4 KiB-aligned position, appends a padding
//! record to end on a 4 KiB boundary, writes them with `pwritev` and calls `fdatasync`, then
//! answers every caller of the batch (leader/follower group commit, as RocksDB's write groups).
//!
//! Pre-zeroing (Dolt's trick): the file is written with zeros ahead of the write position, by
//! [`Prezero::Ahead`] bytes at a time (default 4 MiB), or whole when it is created
//! ([`Prezero::WholeFile`]), so a commit overwrites allocated blocks and its `fdatasync` has no
//! file-size or extent metadata to flush.
//!
//! Fail-stop: a failed write or sync poisons the journal; that batch and every later commit get
//! an error, and a failed `fdatasync` is never retried (DESIGN invariant 2).
//!
//! Only this type writes or syncs journal files (architecture invariant).

use std::collections::{BTreeMap, HashMap};
use std::io::IoSlice;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use super::record::{padding_for, OutRecord, BATCH_ALIGN, RECORD_HEADER_LEN};
use crate::env::{EnvFile, OpenMode, StorageEnv};
use crate::error::{Error, Result};

/// How the journal tail is zeroed before commits overwrite it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prezero {
    /// Write this many bytes of zeros ahead of the write position whenever the position gets
    /// within reach of the zeroed end (Dolt writes 4 MiB ahead).
    Ahead(u64),
    /// Zero the whole file (the configured journal file size) when it is created.
    WholeFile,
}

impl Default for Prezero {
    fn default() -> Prezero {
        Prezero::Ahead(4 << 20)
    }
}

/// Counters of one journal since open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JournalStats {
    /// Commit records acknowledged.
    pub commits: u64,
    /// Batches written (one `pwritev` group and one `fdatasync` each).
    pub batches: u64,
    /// Bytes of records and padding written.
    pub bytes: u64,
    /// `fdatasync` calls on journal files (batches and pre-zeroing).
    pub fdatasyncs: u64,
    /// `fsync` calls on the journal directory.
    pub dir_syncs: u64,
    /// Journal files created.
    pub files_created: u64,
}

struct Waiting {
    ticket: u64,
    record: OutRecord,
}

#[derive(Default)]
struct Shared {
    queue: Vec<Waiting>,
    leader: bool,
    next_ticket: u64,
    done: HashMap<u64, Result<u64>>,
    poisoned: Option<String>,
}

struct Io {
    file: Arc<dyn EnvFile>,
    no: u64,
    pos: u64,
    zeroed_end: u64,
    /// Journal number -> storage id -> highest txn id written there.
    files: BTreeMap<u64, HashMap<u64, u64>>,
}

/// A group-commit journal writer over the numbered files of one `Journals/` directory.
pub struct Journal {
    env: Arc<dyn StorageEnv>,
    dir: PathBuf,
    file_size: u64,
    prezero: Prezero,
    shared: Mutex<Shared>,
    cv: Condvar,
    io: Mutex<Io>,
    commits: AtomicU64,
    batches: AtomicU64,
    bytes: AtomicU64,
    fdatasyncs: AtomicU64,
    dir_syncs: AtomicU64,
    files_created: AtomicU64,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Journal({})", self.dir.display())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

const ZEROS: [u8; 64 << 10] = [0u8; 64 << 10];

impl Journal {
    /// Starts a journal in `dir` with a new file numbered `first_no` (always a fresh file after
    /// open, so bytes after a torn tail of an older file are never overwritten and re-read).
    /// The file is pre-zeroed, synced, and the directory synced before this returns (DESIGN
    /// invariant 6). `existing` lists older files still holding unflushed records, with the
    /// highest txn id of each storage in them, so they are released later.
    pub fn open(
        env: Arc<dyn StorageEnv>,
        dir: &Path,
        first_no: u64,
        file_size: u64,
        prezero: Prezero,
        existing: BTreeMap<u64, HashMap<u64, u64>>,
    ) -> Result<Journal> {
        let j = Journal {
            env,
            dir: dir.to_path_buf(),
            file_size,
            prezero,
            shared: Mutex::new(Shared::default()),
            cv: Condvar::new(),
            io: Mutex::new(Io {
                file: Arc::new(NoFile),
                no: 0,
                pos: 0,
                zeroed_end: 0,
                files: existing,
            }),
            commits: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            fdatasyncs: AtomicU64::new(0),
            dir_syncs: AtomicU64::new(0),
            files_created: AtomicU64::new(0),
        };
        {
            let mut io = lock(&j.io);
            j.new_file(&mut io, first_no, 0)?;
        }
        Ok(j)
    }

    /// A journal that refuses every commit (storages opened read-only).
    pub fn open_read_only(env: Arc<dyn StorageEnv>, dir: &Path) -> Journal {
        let j = Journal {
            env,
            dir: dir.to_path_buf(),
            file_size: 0,
            prezero: Prezero::default(),
            shared: Mutex::new(Shared::default()),
            cv: Condvar::new(),
            io: Mutex::new(Io { file: Arc::new(NoFile), no: 0, pos: 0, zeroed_end: 0, files: BTreeMap::new() }),
            commits: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            fdatasyncs: AtomicU64::new(0),
            dir_syncs: AtomicU64::new(0),
            files_created: AtomicU64::new(0),
        };
        lock(&j.shared).poisoned = Some("opened read-only".into());
        j
    }

    /// The directory the journal files are in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Counters since open.
    pub fn stats(&self) -> JournalStats {
        JournalStats {
            commits: self.commits.load(Ordering::Relaxed),
            batches: self.batches.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            fdatasyncs: self.fdatasyncs.load(Ordering::Relaxed),
            dir_syncs: self.dir_syncs.load(Ordering::Relaxed),
            files_created: self.files_created.load(Ordering::Relaxed),
        }
    }

    /// Journal files that exist (written or still holding unflushed records).
    pub fn live_files(&self) -> usize {
        lock(&self.io).files.len()
    }

    /// The poisoning failure, if a write or sync failed.
    pub fn poisoned(&self) -> Option<String> {
        lock(&self.shared).poisoned.clone()
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
        g.queue.push(Waiting { ticket, record });
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
                for w in &batch {
                    g.done.insert(w.ticket, result.clone());
                }
                g.leader = false;
                self.cv.notify_all();
                continue;
            }
            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn write_batch(&self, batch: &[Waiting]) -> Result<u64> {
        let mut io = lock(&self.io);
        let body: u64 = batch.iter().map(|w| w.record.total_len()).sum();
        let mut len = body;
        let pad = padding_for(io.pos + body);
        if let Some(p) = &pad {
            len += p.total_len();
        }
        if io.pos > 0 && io.pos + len > self.file_size {
            let next = io.no + 1;
            self.new_file(&mut io, next, len)?;
            // The position changed: recompute the padding.
            return self.write_laid_out(&mut io, batch, body);
        }
        drop(pad);
        self.write_laid_out(&mut io, batch, body)
    }

    fn write_laid_out(&self, io: &mut Io, batch: &[Waiting], body: u64) -> Result<u64> {
        let pad = padding_for(io.pos + body);
        let len = body + pad.as_ref().map_or(0, |p| p.total_len());
        debug_assert_eq!((io.pos + len) % BATCH_ALIGN, 0);
        self.ensure_zeroed(io, io.pos + len)?;
        let headers: Vec<[u8; RECORD_HEADER_LEN]> = batch
            .iter()
            .map(|w| &w.record)
            .chain(pad.iter())
            .map(|r| r.header(io.no))
            .collect();
        let mut slices: Vec<IoSlice<'_>> = Vec::new();
        for (r, h) in batch.iter().map(|w| &w.record).chain(pad.iter()).zip(&headers) {
            slices.push(IoSlice::new(h));
            for p in &r.parts {
                slices.push(IoSlice::new(p));
            }
        }
        let mut off = io.pos;
        for chunk in slices.chunks(crate::env::IOV_MAX_SLICES) {
            io.file.write_vectored_all_at(chunk, off)?;
            off += chunk.iter().map(|s| s.len() as u64).sum::<u64>();
        }
        debug_assert_eq!(off, io.pos + len);
        io.file.sync_data()?;
        self.fdatasyncs.fetch_add(1, Ordering::Relaxed);
        io.pos += len;
        let no = io.no;
        let entry = io.files.entry(no).or_default();
        for w in batch {
            let m = entry.entry(w.record.storage_id).or_insert(0);
            *m = (*m).max(w.record.txn_id);
        }
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.commits.fetch_add(batch.len() as u64, Ordering::Relaxed);
        self.bytes.fetch_add(len, Ordering::Relaxed);
        Ok(no)
    }

    /// Writes zeros so that `[pos, end)` and some room after it is pre-zeroed.
    fn ensure_zeroed(&self, io: &mut Io, end: u64) -> Result<()> {
        let ahead = match self.prezero {
            Prezero::Ahead(a) => a.max(BATCH_ALIGN),
            Prezero::WholeFile => self.file_size.max(BATCH_ALIGN),
        };
        // Keep at least half the window zeroed past the write position; refill to a whole one.
        if end + ahead / 2 <= io.zeroed_end {
            return Ok(());
        }
        let target = (end + ahead).div_ceil(BATCH_ALIGN) * BATCH_ALIGN;
        let mut at = io.zeroed_end;
        let mut bounded = 0u64;
        while at < target {
            let n = (target - at).min(ZEROS.len() as u64) as usize;
            io.file.write_all_at(&ZEROS[..n], at)?;
            at += n as u64;
            bounded += 1;
            debug_assert!(bounded < 1 << 32);
        }
        io.zeroed_end = target;
        Ok(())
    }

    /// Creates journal file `no`, pre-zeroes it (room for at least `need` bytes), syncs it and
    /// the directory, and makes it the current file.
    fn new_file(&self, io: &mut Io, no: u64, need: u64) -> Result<()> {
        let path = self.dir.join(super::file_name(no));
        let file = self.env.open(&path, OpenMode::CreateNew)?;
        self.files_created.fetch_add(1, Ordering::Relaxed);
        io.file = file;
        io.no = no;
        io.pos = 0;
        io.zeroed_end = 0;
        let first = match self.prezero {
            Prezero::Ahead(a) => a.max(need),
            Prezero::WholeFile => self.file_size.max(need),
        };
        let first = first.div_ceil(BATCH_ALIGN) * BATCH_ALIGN;
        let mut at = 0u64;
        while at < first {
            let n = (first - at).min(ZEROS.len() as u64) as usize;
            io.file.write_all_at(&ZEROS[..n], at)?;
            at += n as u64;
        }
        io.zeroed_end = first;
        io.file.sync_data()?;
        self.fdatasyncs.fetch_add(1, Ordering::Relaxed);
        self.env.sync_dir(&self.dir)?;
        self.dir_syncs.fetch_add(1, Ordering::Relaxed);
        io.files.entry(no).or_default();
        Ok(())
    }

    /// Deletes every journal file except the current one whose records of every storage are at
    /// or below that storage's `flushed` txn id. Returns the numbers deleted.
    pub fn release(&self, flushed: &HashMap<u64, u64>) -> Result<Vec<u64>> {
        let mut io = lock(&self.io);
        let current = io.no;
        let done: Vec<u64> = io
            .files
            .iter()
            .filter(|(no, per)| {
                **no != current
                    && per
                        .iter()
                        .all(|(sid, max)| flushed.get(sid).is_some_and(|f| f >= max))
            })
            .map(|(no, _)| *no)
            .collect();
        for no in &done {
            let path = self.dir.join(super::file_name(*no));
            match self.env.remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.source.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
            io.files.remove(no);
        }
        Ok(done)
    }

    /// The number of the current journal file.
    pub fn current_no(&self) -> u64 {
        lock(&self.io).no
    }
}

/// Placeholder before the first file is created.
#[derive(Debug)]
struct NoFile;

impl EnvFile for NoFile {
    fn path(&self) -> &Path {
        Path::new("")
    }
    fn read_exact_at(&self, _: &mut [u8], _: u64) -> crate::env::EnvResult<()> {
        Err(no_file())
    }
    fn write_all_at(&self, _: &[u8], _: u64) -> crate::env::EnvResult<()> {
        Err(no_file())
    }
    fn write_vectored_all_at(&self, _: &[IoSlice<'_>], _: u64) -> crate::env::EnvResult<()> {
        Err(no_file())
    }
    fn sync_data(&self) -> crate::env::EnvResult<()> {
        Err(no_file())
    }
    fn allocate(&self, _: u64, _: u64) -> crate::env::EnvResult<()> {
        Err(no_file())
    }
    fn punch_hole(&self, _: u64, _: u64) -> crate::env::EnvResult<()> {
        Err(no_file())
    }
    fn set_len(&self, _: u64) -> crate::env::EnvResult<()> {
        Err(no_file())
    }
    fn len(&self) -> crate::env::EnvResult<u64> {
        Err(no_file())
    }
    fn allocated_bytes(&self) -> crate::env::EnvResult<u64> {
        Err(no_file())
    }
    fn raw_fd(&self) -> std::os::fd::RawFd {
        -1
    }
}

fn no_file() -> crate::env::EnvError {
    crate::env::EnvError::new(
        "write",
        "<no journal file>",
        std::io::Error::from_raw_os_error(libc::EBADF),
    )
}
