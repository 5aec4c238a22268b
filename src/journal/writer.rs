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
    /// No pre-zeroing: every batch appends and grows the file, so each `fdatasync` also
    /// flushes the file size (the baseline the pre-zeroing is measured against).
    Off,
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
}

struct Waiting {
    ticket: u64,
    record: OutRecord,
    /// The committer's own condition variable (used with `Journal::shared`): the leader wakes
    /// exactly the committers of the batch it wrote, and the first queued one to lead next,
    /// instead of every waiting thread.
    wake: Option<Arc<Condvar>>,
}

#[derive(Default)]
struct Shared {
    queue: Vec<Waiting>,
    leader: bool,
    next_ticket: u64,
    done: HashMap<u64, Result<u64>>,
    poisoned: Option<String>,
}

/// A storage whose records this journal carries.
#[derive(Debug, Clone)]
struct StorageDir {
    /// The storage directory (absolute or as given to open).
    dir: PathBuf,
    /// Its path relative to the journal owner's directory, written in link records.
    rel: String,
}

struct Io {
    file: Arc<dyn EnvFile>,
    no: u64,
    pos: u64,
    zeroed_end: u64,
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
    created: std::collections::HashSet<u64>,
}

/// Pre-zeroed journal files prepared in the background (as Voron's zeroed journal pool).
struct Pool {
    ready: Mutex<std::collections::VecDeque<PathBuf>>,
    cv: Condvar,
    stop: std::sync::atomic::AtomicBool,
    /// Set once the current file is half full: only then is the next file prepared, so a short
    /// session (a command-line lookup) never writes a whole journal file of zeros.
    wanted: std::sync::atomic::AtomicBool,
    target: usize,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
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
    shared: Mutex<Shared>,
    io: Mutex<Io>,
    pool: Arc<Pool>,
    commits: AtomicU64,
    batches: AtomicU64,
    bytes: AtomicU64,
    fdatasyncs: AtomicU64,
    dir_syncs: AtomicU64,
    files_created: AtomicU64,
    links_made: AtomicU64,
    files_recycled: AtomicU64,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Journal({})", self.dir.display())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

static ZEROS: [u8; 64 << 10] = [0u8; 64 << 10];
const POOL_SUFFIX: &str = ".zeroed";

fn write_zeros(file: &dyn EnvFile, from: u64, to: u64) -> Result<()> {
    let mut at = from;
    // Bounded: advances by up to 64 KiB a turn until `to`.
    while at < to {
        let n = (to - at).min(ZEROS.len() as u64) as usize;
        file.write_all_at(&ZEROS[..n], at)?;
        at += n as u64;
    }
    Ok(())
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
        let dir = owner_dir.join(crate::storage::JOURNALS_DIR);
        let j = Arc::new(Journal::new(env, owner, owner_dir, cfg));
        // Leftover pool files from an earlier session are ready to use; others are removed.
        for name in j.env.list_dir(&dir)? {
            if name.ends_with(POOL_SUFFIX) {
                let p = dir.join(&name);
                let ok = j
                    .env
                    .open(&p, OpenMode::Existing)
                    .and_then(|f| f.len())
                    .map(|l| l == cfg.file_size)
                    .unwrap_or(false);
                if ok && cfg.pool_files > 0 {
                    lock(&j.pool.ready).push_back(p);
                } else {
                    let _ = j.env.remove_file(&p);
                }
            }
        }
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
        let mut storages = HashMap::new();
        storages.insert(
            owner,
            StorageDir {
                dir: owner_dir.to_path_buf(),
                rel: String::new(),
            },
        );
        Journal {
            env,
            dir: owner_dir.join(crate::storage::JOURNALS_DIR),
            owner,
            file_size: cfg.file_size,
            prezero: cfg.prezero,
            shared: Mutex::new(Shared::default()),
            io: Mutex::new(Io {
                file: Arc::new(NoFile),
                no: 0,
                pos: 0,
                zeroed_end: 0,
                entries: BTreeMap::new(),
                storages,
                links: HashMap::new(),
                unlinked: HashMap::new(),
                dir_synced: HashMap::new(),
                seq: 1,
                created: Default::default(),
            }),
            pool: Arc::new(Pool {
                ready: Mutex::new(Default::default()),
                cv: Condvar::new(),
                stop: std::sync::atomic::AtomicBool::new(false),
                wanted: std::sync::atomic::AtomicBool::new(false),
                target: cfg.pool_files,
                thread: Mutex::new(None),
            }),
            commits: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            fdatasyncs: AtomicU64::new(0),
            dir_syncs: AtomicU64::new(0),
            files_created: AtomicU64::new(0),
            links_made: AtomicU64::new(0),
            files_recycled: AtomicU64::new(0),
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

    /// Registers storage `sid` living in `dir`, whose path relative to the owner's directory
    /// is `rel` (written in link records), and the journal files its `Journals/` holds with the
    /// highest txn id of its records in each (`files`, from its recovery scan).
    pub fn register(&self, sid: u64, dir: &Path, rel: &str, files: &BTreeMap<u64, u64>) {
        let mut io = lock(&self.io);
        io.storages.insert(
            sid,
            StorageDir {
                dir: dir.to_path_buf(),
                rel: rel.to_string(),
            },
        );
        for (no, max) in files {
            let m = io.entries.entry(*no).or_default().entry(sid).or_insert(0);
            *m = (*m).max(*max);
        }
        // Entries that existed before this session count as synced: the database syncs every
        // branch's Journals/ once at open.
        let seq = io.seq;
        io.dir_synced.insert(sid, seq);
        io.seq += 1;
    }

    /// Forgets storage `sid` (dropped): its directory is going away, its records no longer pin
    /// any journal file.
    pub fn unregister(&self, sid: u64) {
        let mut io = lock(&self.io);
        io.storages.remove(&sid);
        io.dir_synced.remove(&sid);
        for per in io.entries.values_mut() {
            per.remove(&sid);
        }
        for l in io.links.values_mut() {
            l.retain(|(s, _)| *s != sid);
        }
        for u in io.unlinked.values_mut() {
            u.retain(|(s, _)| *s != sid);
        }
        let current = io.no;
        io.entries
            .retain(|no, per| *no == current || !per.is_empty());
        let Io {
            entries, unlinked, ..
        } = &mut *io;
        unlinked.retain(|no, u| !u.is_empty() && entries.contains_key(no));
    }

    /// Counters since open.
    pub fn stats(&self) -> JournalStats {
        let io = lock(&self.io);
        JournalStats {
            commits: self.commits.load(Ordering::Relaxed),
            batches: self.batches.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            fdatasyncs: self.fdatasyncs.load(Ordering::Relaxed),
            dir_syncs: self.dir_syncs.load(Ordering::Relaxed),
            files_created: self.files_created.load(Ordering::Relaxed),
            links_made: self.links_made.load(Ordering::Relaxed),
            files_live: io.entries.len() as u64,
            files_recycled: self.files_recycled.load(Ordering::Relaxed),
            pool_ready: lock(&self.pool.ready).len() as u64,
        }
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
        let wake = Arc::new(Condvar::new());
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
                for w in &batch {
                    g.done.insert(w.ticket, result.clone());
                }
                g.leader = false;
                for w in batch.iter().chain(g.queue.first()) {
                    if let Some(cv) = &w.wake {
                        cv.notify_one();
                    }
                }
                continue;
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
        let mut off = io.pos;
        for chunk in slices.chunks(crate::env::IOV_MAX_SLICES) {
            io.file.write_vectored_all_at(chunk, off)?;
            off += chunk.iter().map(|s| s.len() as u64).sum::<u64>();
        }
        debug_assert_eq!(off, io.pos + len);
        io.file.sync_data()?;
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

    /// Hard-links the current file into the `Journals/` of every storage of the batch that has
    /// no entry for it yet, and returns the link records that go in the same batch (they stand
    /// in for a directory fsync: recovery re-creates a missing link from its record).
    fn link_batch(&self, io: &mut Io, batch: &[Waiting]) -> Result<Vec<OutRecord>> {
        let mut out = Vec::new();
        let no = io.no;
        let name = super::file_name(no);
        for w in batch {
            let sid = w.record.storage_id;
            if sid == self.owner || io.entries.get(&no).is_some_and(|e| e.contains_key(&sid)) {
                continue;
            }
            // A storage dropped while its commit was queued: its directory is going away.
            let Some(sd) = io.storages.get(&sid).cloned() else {
                continue;
            };
            let to = sd.dir.join(crate::storage::JOURNALS_DIR).join(&name);
            match self.env.link(&self.dir.join(&name), &to) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                Err(e) => return Err(e.into()),
            }
            io.entries.entry(no).or_default().insert(sid, 0);
            let seq = io.seq;
            io.seq += 1;
            io.links.entry(no).or_default().push((sid, seq));
            self.links_made.fetch_add(1, Ordering::Relaxed);
            let mut body = Vec::with_capacity(8 + sd.rel.len());
            body.extend_from_slice(&sid.to_le_bytes());
            body.extend_from_slice(sd.rel.as_bytes());
            out.push(OutRecord::new(
                super::record::RecordKind::Link,
                sid,
                0,
                vec![body.into()],
            ));
        }
        Ok(out)
    }

    /// Writes zeros so that `[pos, end)` and some room after it is pre-zeroed.
    fn ensure_zeroed(&self, io: &mut Io, end: u64) -> Result<()> {
        let ahead = match self.prezero {
            Prezero::Ahead(a) => a.max(BATCH_ALIGN),
            Prezero::WholeFile => self.file_size.max(BATCH_ALIGN),
            Prezero::Off => return Ok(()),
        };
        // Keep at least half the window zeroed past the write position; refill to a whole one.
        if end + ahead / 2 <= io.zeroed_end
            || (end <= io.zeroed_end && io.zeroed_end >= self.file_size)
        {
            return Ok(());
        }
        let target = (end + ahead).div_ceil(BATCH_ALIGN) * BATCH_ALIGN;
        write_zeros(&*io.file, io.zeroed_end, target)?;
        io.zeroed_end = target;
        Ok(())
    }

    /// Makes journal file `no` current: a pre-zeroed file from the pool renamed into place, or
    /// a new file zeroed here (room for at least `need` bytes); then syncs the directory.
    fn new_file(&self, io: &mut Io, no: u64, need: u64) -> Result<()> {
        let path = self.dir.join(super::file_name(no));
        let pooled = if need <= self.file_size {
            lock(&self.pool.ready).pop_front()
        } else {
            None
        };
        let (file, zeroed) = match pooled {
            Some(p) => {
                self.pool.cv.notify_all();
                self.env.rename(&p, &path)?;
                let f = self.env.open(&path, OpenMode::Existing)?;
                let len = f.len()?;
                (f, len)
            }
            None => {
                let f = self.env.open(&path, OpenMode::CreateNew)?;
                self.files_created.fetch_add(1, Ordering::Relaxed);
                let first = match self.prezero {
                    Prezero::Ahead(a) => a.max(need),
                    Prezero::WholeFile => self.file_size.max(need),
                    Prezero::Off => 0,
                };
                let first = first.div_ceil(BATCH_ALIGN) * BATCH_ALIGN;
                write_zeros(&*f, 0, first)?;
                f.sync_data()?;
                self.fdatasyncs.fetch_add(1, Ordering::Relaxed);
                (f, first)
            }
        };
        self.pool.wanted.store(false, Ordering::Release);
        io.file = file;
        io.no = no;
        io.pos = 0;
        io.zeroed_end = zeroed;
        self.env.sync_dir(&self.dir)?;
        self.dir_syncs.fetch_add(1, Ordering::Relaxed);
        io.entries
            .entry(no)
            .or_default()
            .entry(self.owner)
            .or_insert(0);
        io.created.insert(no);
        Ok(())
    }

    /// Storage `sid` has flushed every transaction up to `flushed`: removes its directory
    /// entry of every journal file (but the current one) whose records of `sid` are all at or
    /// below it. Before removing an entry, every directory that got a link to that file since
    /// its last fsync is fsynced (DESIGN invariant 5), so no storage that still needs the file
    /// can lose it to a power loss. Returns the journal numbers removed for `sid`.
    pub fn release(&self, sid: u64, flushed: u64) -> Result<Vec<u64>> {
        let mut io = lock(&self.io);
        let current = io.no;
        let done: Vec<u64> = io
            .entries
            .iter()
            .filter(|(no, per)| **no != current && per.get(&sid).is_some_and(|m| *m <= flushed))
            .map(|(no, _)| *no)
            .collect();
        for no in &done {
            self.make_links_durable(&mut io, *no)?;
            let Some(sd) = io.storages.get(&sid).cloned() else {
                break;
            };
            let path = sd
                .dir
                .join(crate::storage::JOURNALS_DIR)
                .join(super::file_name(*no));
            let last = io.entries.get(no).map(|p| p.len() == 1).unwrap_or(true);
            // Recycle only a file this journal created in this session whose only name is the
            // one being removed: a file from an earlier session may still be hard-linked from
            // another directory (a branch opened standalone), and reusing it would overwrite
            // records another storage still needs.
            let recycle = last
                && sid == self.owner
                && io.created.contains(no)
                && lock(&self.pool.ready).len() < self.pool.target
                && std::fs::metadata(&path)
                    .map(|m| std::os::unix::fs::MetadataExt::nlink(&m) == 1)
                    .unwrap_or(false);
            let r = if recycle {
                let to = self.dir.join(format!("{no:016}{POOL_SUFFIX}"));
                let ok = self
                    .env
                    .open(&path, OpenMode::Existing)
                    .and_then(|f| f.len())
                    .map(|l| l == self.file_size)
                    .unwrap_or(false);
                if ok {
                    self.make_unlinks_durable(&mut io, *no)?;
                    self.env.rename(&path, &to).map(|()| {
                        lock(&self.pool.ready).push_back(to);
                        self.files_recycled.fetch_add(1, Ordering::Relaxed);
                    })
                } else {
                    self.env.remove_file(&path)
                }
            } else {
                self.env.remove_file(&path)
            };
            match r {
                Ok(()) => {}
                Err(e) if e.source.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
            if sid != self.owner {
                let seq = io.seq;
                io.seq += 1;
                io.unlinked.entry(*no).or_default().push((sid, seq));
            }
            if let Some(per) = io.entries.get_mut(no) {
                per.remove(&sid);
                if per.is_empty() {
                    io.entries.remove(no);
                    io.links.remove(no);
                    io.unlinked.remove(no);
                    io.created.remove(no);
                }
            }
        }
        Ok(done)
    }

    /// Fsyncs the `Journals/` of every storage that got a link to file `no` after that
    /// directory's last fsync (one fsync covers every link made before it).
    fn make_links_durable(&self, io: &mut Io, no: u64) -> Result<()> {
        let links = io.links.get(&no).cloned().unwrap_or_default();
        for (sid, made) in links {
            if io.dir_synced.get(&sid).is_some_and(|s| *s > made) {
                continue;
            }
            let Some(sd) = io.storages.get(&sid).cloned() else {
                continue;
            };
            self.env
                .sync_dir(&sd.dir.join(crate::storage::JOURNALS_DIR))?;
            self.dir_syncs.fetch_add(1, Ordering::Relaxed);
            let seq = io.seq;
            io.seq += 1;
            io.dir_synced.insert(sid, seq);
        }
        Ok(())
    }

    /// Fsyncs the `Journals/` of every (still registered) storage whose entry for file `no` was
    /// removed after that directory's last fsync: before the file is recycled, no power loss
    /// may bring such an entry back to name the file's new contents.
    fn make_unlinks_durable(&self, io: &mut Io, no: u64) -> Result<()> {
        let unlinked = io.unlinked.get(&no).cloned().unwrap_or_default();
        for (sid, removed) in unlinked {
            if io.dir_synced.get(&sid).is_some_and(|s| *s > removed) {
                continue;
            }
            // A dropped storage's directory is gone with every entry in it.
            let Some(sd) = io.storages.get(&sid).cloned() else {
                continue;
            };
            self.env
                .sync_dir(&sd.dir.join(crate::storage::JOURNALS_DIR))?;
            self.dir_syncs.fetch_add(1, Ordering::Relaxed);
            let seq = io.seq;
            io.seq += 1;
            io.dir_synced.insert(sid, seq);
        }
        Ok(())
    }

    /// True when storage `sid` still has an entry for a journal file older than the current
    /// one: flushing it lets that file go (bounded retention, DESIGN invariant 11).
    pub fn pins_old_file(&self, sid: u64) -> bool {
        let io = lock(&self.io);
        io.entries
            .iter()
            .any(|(no, per)| *no != io.no && per.contains_key(&sid))
    }

    /// The number of the current journal file.
    pub fn current_no(&self) -> u64 {
        lock(&self.io).no
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        {
            let _g = lock(&self.pool.ready);
            self.pool.stop.store(true, Ordering::Release);
        }
        self.pool.cv.notify_all();
        if let Some(h) = lock(&self.pool.thread).take() {
            let _ = h.join();
        }
    }
}

/// The pool thread: keeps `target` whole pre-zeroed files ready (`<number>.zeroed`, synced).
fn start_pool(j: &Arc<Journal>) {
    let pool = j.pool.clone();
    let env = j.env.clone();
    let dir = j.dir.clone();
    let size = j.file_size;
    let mut k = j.current_no() * 1000;
    let h = std::thread::Builder::new()
        .name("omnibus-journal-pool".into())
        .spawn(move || {
            if let Err(e) = crate::env::set_thread_io_priority(7) {
                tracing::debug!(error = %e, "ioprio_set failed for the journal pool thread");
            }
            pool_loop(&pool, &*env, &dir, size, &mut k)
        });
    if let Ok(h) = h {
        *lock(&j.pool.thread) = Some(h);
    }
}

fn pool_loop(pool: &Pool, env: &dyn StorageEnv, dir: &Path, size: u64, k: &mut u64) {
    loop {
        if pool.stop.load(Ordering::Acquire) {
            return;
        }
        let g = lock(&pool.ready);
        if g.len() < pool.target && pool.wanted.load(Ordering::Acquire) {
            drop(g);
            *k += 1;
            let p = dir.join(format!("pool-{k:016}{POOL_SUFFIX}"));
            let r = env
                .open(&p, OpenMode::CreateNew)
                .map_err(Error::from)
                .and_then(|f| {
                    write_zeros(&*f, 0, size)?;
                    f.sync_data()?;
                    Ok(())
                });
            match r {
                Ok(()) => lock(&pool.ready).push_back(p),
                Err(e) => {
                    tracing::warn!(error = %e, "preparing a pre-zeroed journal file failed");
                    let _ = env.remove_file(&p);
                    return;
                }
            }
            continue;
        }
        // Checked under the lock the stopper notifies with: a stop is never missed.
        if pool.stop.load(Ordering::Acquire) {
            return;
        }
        let _ = pool
            .cv
            .wait_timeout(g, std::time::Duration::from_millis(200));
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
