//! The journal writer: group commit over numbered, pre-zeroed journal files.
//!
//! Callers hand a finished [`OutRecord`] to [`Journal::commit`] and block until it is durable.
//! The first caller to find no batch in progress becomes the leader: it takes every queued
//! record, lays them out back to back from the current 4 KiB-aligned position, appends a padding
//! record to end on a 4 KiB boundary, writes them with `pwritev` and calls `fdatasync`, then
//! answers every caller of the batch (leader/follower group commit, as RocksDB's write groups).
//!
//! Pre-zeroing (Dolt's trick): the file is written with zeros ahead of the write position so a
//! commit overwrites allocated, already synced blocks and its `fdatasync` has no file-size or
//! extent metadata to flush:
//! - [`Prezero::WholeFile`]: the whole file is zeroed when it is created (or taken whole from
//!   the pool of pre-zeroed files).
//! - [`Prezero::Ahead`] (default 4 MiB): a new file is zeroed for one window; after that, zeros
//!   are written *ahead of need by the background*: when a batch ends within half a window of
//!   the zeroed end, the writer asks the process's one pre-zeroing thread (`omnibus-prezero`,
//!   lazily started, a bounded queue of weak references to each journal's zeroing control)
//!   for the next window and does not wait. That thread writes zeros only in
//!   `[zeroed_end, zeroed_end + window)` (capped at the file size), through its own descriptor
//!   of the journal file (so the writer's `fdatasync` still sees any writeback error on its
//!   own descriptor: Linux reports one once per open file description), 256 KiB at a time,
//!   each chunk `fdatasync`ed before it is published as the new zeroed end. The writer never
//!   writes at or past the zeroed end while a range is claimed (`busy`); a batch that must
//!   write past it waits for the range in flight, and if the zeros are still short it zeroes
//!   inline as the fallback (counted in [`JournalStats::inline_zeroings`]; those zeros are
//!   covered by the batch's `fdatasync`). A rotation stops the claimed range after its chunk
//!   in flight, waits for it and resets the control for the new file; dropping the journal
//!   does the same and closes the control, so the thread never writes into a file after it is
//!   released, renamed into the pool, or the journal is gone.
//!
//! Fail-stop: a failed write or sync poisons the journal; that batch and every later commit get
//! an error, and a failed `fdatasync` is never retried (DESIGN invariant 2). A failed background
//! `fdatasync` poisons the journal the same way (the next batch returns that error). A failed
//! background zero *write* (or open) published nothing: background zeroing stops for that file
//! and commits zero inline, so the commit that needs the room gets the error itself (ENOSPC on a
//! full disk, as [`crate::Error::is_no_space`]).
//!
//! Only this module writes or syncs journal files (architecture invariant): the batch writer
//! (records, padding, a new file's first zeros, fallback zeros) and, beyond the zeroed end only,
//! the background pre-zeroing thread and the pool thread (whole `.zeroed` files).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::IoSlice;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};

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
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Journal({})", self.dir.display())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

const POOL_SUFFIX: &str = ".zeroed";

fn write_zeros(file: &dyn EnvFile, from: u64, to: u64) -> Result<()> {
    Ok(crate::env::write_zeros(
        file,
        from,
        to.saturating_sub(from),
    )?)
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
        let zero = Arc::new(ZeroCtl {
            env: env.clone(),
            // A window is at most one journal file (a larger one would zero every file that far).
            window: match cfg.prezero {
                Prezero::Ahead(a) => {
                    a.min(cfg.file_size).max(BATCH_ALIGN).div_ceil(BATCH_ALIGN) * BATCH_ALIGN
                }
                Prezero::WholeFile | Prezero::Off => 0,
            },
            cap: cfg.file_size,
            state: Mutex::new(ZeroState::default()),
            cv: Condvar::new(),
            bytes: AtomicU64::new(0),
            fdatasyncs: AtomicU64::new(0),
        });
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
            fdatasyncs: self.fdatasyncs.load(Ordering::Relaxed)
                + self.zero.fdatasyncs.load(Ordering::Relaxed),
            dir_syncs: self.dir_syncs.load(Ordering::Relaxed),
            files_created: self.files_created.load(Ordering::Relaxed),
            links_made: self.links_made.load(Ordering::Relaxed),
            files_live: io.entries.len() as u64,
            files_recycled: self.files_recycled.load(Ordering::Relaxed),
            pool_ready: lock(&self.pool.ready).len() as u64,
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
        io.file.write_vectored_and_sync(&slices, io.pos)?;
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
        // Named only when a link is made (most batches make none).
        let mut name = None;
        for w in batch {
            let sid = w.record.storage_id;
            if sid == self.owner || io.entries.get(&no).is_some_and(|e| e.contains_key(&sid)) {
                continue;
            }
            // A storage dropped while its commit was queued: its directory is going away.
            let Some(sd) = io.storages.get(&sid).cloned() else {
                continue;
            };
            let name = name.get_or_insert_with(|| super::file_name(no));
            let to = sd.dir.join(crate::storage::JOURNALS_DIR).join(&*name);
            match self.env.link(&self.dir.join(&*name), &to) {
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

    /// Makes sure `[pos, end)` is pre-zeroed before the batch writes it, and keeps zeros ahead:
    /// with [`Prezero::Ahead`] by asking the background for the next window (see the module
    /// doc), zeroing inline only when the background has not got far enough; with
    /// [`Prezero::WholeFile`] inline (a file shorter than a batch needs).
    fn ensure_zeroed(&self, io: &mut Io, end: u64) -> Result<()> {
        match self.prezero {
            Prezero::Ahead(_) => self.zero_ahead(io, end),
            Prezero::WholeFile => {
                let ahead = self.file_size.max(BATCH_ALIGN);
                let mut st = lock(&self.zero.state);
                if end + ahead / 2 <= st.zeroed_end
                    || (end <= st.zeroed_end && st.zeroed_end >= self.file_size)
                {
                    return Ok(());
                }
                let target = (end + ahead).div_ceil(BATCH_ALIGN) * BATCH_ALIGN;
                write_zeros(&*io.file, st.zeroed_end, target)?;
                st.zeroed_end = target;
                Ok(())
            }
            Prezero::Off => Ok(()),
        }
    }

    /// [`Prezero::Ahead`]: see the module doc. Called with the `io` lock held, so this writer
    /// is the only one that requests windows or claims a range inline.
    fn zero_ahead(&self, io: &mut Io, end: u64) -> Result<()> {
        let ctl = &*self.zero;
        let window = ctl.window;
        let mut st = lock(&ctl.state);
        if end > st.zeroed_end && st.busy.is_some() {
            self.zeroing_waits.fetch_add(1, Ordering::Relaxed);
            // Bounded: the background publishes each synced chunk of its one claimed range and
            // clears `busy` at its end (also when its job fails or panics: `Claim`'s drop),
            // notifying each time.
            while end > st.zeroed_end && st.busy.is_some() {
                st = ctl.cv.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        }
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        if end > st.zeroed_end {
            // The fallback, as before background zeroing: zeros up to a window past the batch,
            // through the writer's descriptor, covered by this batch's fdatasync. The range is
            // claimed so the background cannot start on it meanwhile.
            let from = st.zeroed_end;
            let to = (end + window).div_ceil(BATCH_ALIGN) * BATCH_ALIGN;
            st.requested = false;
            st.busy = Some((from, to));
            drop(st);
            let r = write_zeros(&*io.file, from, to);
            st = lock(&ctl.state);
            st.busy = None;
            ctl.cv.notify_all();
            r?;
            st.zeroed_end = to;
            self.inline_zero_bytes
                .fetch_add(to - from, Ordering::Relaxed);
            self.inline_zeroings.fetch_add(1, Ordering::Relaxed);
        }
        // Keep at least half a window zeroed past the batch: ask for the next one early, so it
        // is written and synced while this batch and the next ones are.
        let ahead_end = st.busy.map_or(st.zeroed_end, |(_, to)| to);
        if end + window / 2 > ahead_end && ahead_end < ctl.cap && !st.off {
            st.requested = true;
            if !st.queued {
                st.queued = queue_zeroing(&self.zero);
            }
        }
        Ok(())
    }

    /// Makes journal file `no` current: a pre-zeroed file from the pool renamed into place, or
    /// a new file zeroed here (room for at least `need` bytes); then syncs the directory.
    fn new_file(&self, io: &mut Io, no: u64, need: u64) -> Result<()> {
        let path = self.dir.join(super::file_name(no));
        {
            // The background may be zeroing the current file: let it finish; no new range
            // starts until the control names the new file (only this writer requests one).
            let mut st = lock(&self.zero.state);
            st.requested = false;
            st.stop = true;
            // Bounded: the background stops after the chunk in flight.
            while st.busy.is_some() {
                st = self.zero.cv.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            st.stop = false;
        }
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
                    Prezero::Ahead(_) => self.zero.window.max(need),
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
        {
            let mut st = lock(&self.zero.state);
            st.path = path;
            st.zeroed_end = zeroed;
            st.requested = false;
            st.off = false;
        }
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
        self.sync_dirs_after(io, links)
    }

    /// Fsyncs the `Journals/` of every (still registered) storage whose entry for file `no` was
    /// removed after that directory's last fsync: before the file is recycled, no power loss
    /// may bring such an entry back to name the file's new contents.
    fn make_unlinks_durable(&self, io: &mut Io, no: u64) -> Result<()> {
        let unlinked = io.unlinked.get(&no).cloned().unwrap_or_default();
        self.sync_dirs_after(io, unlinked)
    }

    /// For each `(storage, sequence)` of a directory change, fsyncs that storage's `Journals/`
    /// unless a sync after the change covered it already. A dropped storage (no longer
    /// registered) is skipped: its directory is gone with every entry in it.
    fn sync_dirs_after(&self, io: &mut Io, changes: Vec<(u64, u64)>) -> Result<()> {
        for (sid, changed) in changes {
            if io.dir_synced.get(&sid).is_some_and(|s| *s > changed) {
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
            // No background zeroing of this journal's file after this: close the control and
            // wait out a range in flight (bounded: one window).
            let mut st = lock(&self.zero.state);
            st.closed = true;
            st.requested = false;
            while st.busy.is_some() {
                st = self.zero.cv.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        }
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
                    // A new file: nothing of it is cached, so the zeros can bypass the cache.
                    f.write_zeros_uncached(0, size)?;
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

// ---- background pre-zeroing ([`Prezero::Ahead`]) ----------------------------------------------

/// Name of the process's pre-zeroing thread.
const PREZERO_THREAD: &str = "omnibus-prezero";

/// Bytes the background zeroes and `fdatasync`s at a time, publishing each synced chunk: a
/// batch's `fdatasync` that runs meanwhile also writes back the file's dirty zeros (and commits
/// their block allocation), so few dirty zeros at a time keep that cost small for the commits
/// that overlap, and each chunk is usable as soon as it is synced.
const ZERO_CHUNK: u64 = 256 << 10;

/// Most journals queued for the pre-zeroing thread at once (DESIGN invariant 10). Each journal
/// is queued at most once; a request that finds the queue full is queued again by its writer's
/// next batch, and a writer that catches up meanwhile zeroes inline.
const MAX_ZERO_QUEUE: usize = 4096;

/// One journal's zeroed end and its background pre-zeroing: shared (as `Arc`, queued as `Weak`)
/// with the pre-zeroing thread. Its own lock, never the `io` lock held during batches: the
/// thread takes no other lock of the journal.
struct ZeroCtl {
    /// The environment the thread opens the journal file through (its own descriptor).
    env: Arc<dyn StorageEnv>,
    /// Bytes zeroed per background request (the [`Prezero::Ahead`] window, 4 KiB-aligned;
    /// 0 for the other modes, which never request).
    window: u64,
    /// The background zeroes no further than this (bytes: the configured journal file size).
    cap: u64,
    state: Mutex<ZeroState>,
    /// Signalled whenever `busy` is cleared.
    cv: Condvar,
    /// Bytes of zeros the background wrote and synced for this journal.
    bytes: AtomicU64,
    /// `fdatasync` calls the background made for this journal.
    fdatasyncs: AtomicU64,
}

#[derive(Default)]
struct ZeroState {
    /// The current journal file (the background opens it again by this path).
    path: PathBuf,
    /// Bytes `[0, zeroed_end)` of the current file are records or zeros and allocated; the
    /// writer writes only below it. The background publishes a chunk only after its
    /// `fdatasync`; the writer's inline fallback zeros are synced by that batch's `fdatasync`.
    zeroed_end: u64,
    /// `[from, to)` claimed for zeroing (by the background, or by the writer's inline
    /// fallback); `from` is `zeroed_end`, so it never overlaps what the writer writes.
    busy: Option<(u64, u64)>,
    /// The writer wants the next window zeroed.
    requested: bool,
    /// An entry for this control is in the service's queue.
    queued: bool,
    /// The journal is dropped: no more zeroing.
    closed: bool,
    /// A rotation waits for the claimed range: stop after the chunk in flight.
    stop: bool,
    /// A background `fdatasync` failed: the journal is poisoned with this error.
    failed: Option<Error>,
    /// A background open or zero write failed (a full disk, say): no more background windows
    /// for this file; the writer zeros inline when it needs room, and the commit that needs it
    /// gets the error itself (`ENOSPC` as [`Error::is_no_space`]). Nothing was published, so
    /// nothing is lost; reset for the next file.
    off: bool,
}

/// Clears a claimed range however the background job ends (a panicking environment included:
/// then the journal is poisoned, so no writer waits forever or writes over a torn range).
struct Claim<'a> {
    ctl: &'a ZeroCtl,
    done: bool,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut st = lock(&self.ctl.state);
        st.busy = None;
        if st.failed.is_none() {
            st.failed = Some(Error::Io {
                op: "pre-zero",
                path: st.path.clone(),
                source: std::io::Error::other("the background pre-zeroing job panicked"),
            });
        }
        drop(st);
        self.ctl.cv.notify_all();
    }
}

impl ZeroCtl {
    /// One background job: zeros `[zeroed_end, zeroed_end + window)` (capped) of the current
    /// file through a descriptor of its own, `fdatasync`s it, then publishes the new zeroed end;
    /// a failure poisons the journal instead. Does nothing unless requested.
    fn zero_next_window(&self) {
        let (path, from, to) = {
            let mut st = lock(&self.state);
            st.queued = false;
            if !st.requested || st.busy.is_some() || st.closed || st.failed.is_some() || st.off {
                return;
            }
            st.requested = false;
            let from = st.zeroed_end;
            let to = from.saturating_add(self.window).min(self.cap);
            if to <= from {
                return;
            }
            st.busy = Some((from, to));
            (st.path.clone(), from, to)
        };
        let mut claim = Claim {
            ctl: self,
            done: false,
        };
        let file = match self.env.open(&path, OpenMode::Existing) {
            Ok(f) => Some(f),
            Err(e) => {
                self.give_up(&path, e.into());
                None
            }
        };
        let mut at = from;
        // Bounded: advances by one chunk a turn until `to`; stops at an error, or when a
        // rotation or the journal's drop asks (they wait for `busy` to clear).
        while let Some(f) = &file {
            let next = at.saturating_add(ZERO_CHUNK).min(to);
            if let Err(e) = write_zeros(&**f, at, next) {
                self.give_up(&path, e);
                break;
            }
            if let Err(e) = f.sync_data() {
                self.fail(&path, e.into());
                break;
            }
            self.fdatasyncs.fetch_add(1, Ordering::Relaxed);
            self.bytes.fetch_add(next - at, Ordering::Relaxed);
            let mut st = lock(&self.state);
            debug_assert_eq!(st.zeroed_end, at, "the zeroed end moved under a claim");
            // Published only now that the chunk is synced: the writer may use it.
            st.zeroed_end = next;
            at = next;
            if at >= to || st.closed || st.stop {
                break;
            }
            st.busy = Some((at, to));
            drop(st);
            self.cv.notify_all();
        }
        // The descriptor is closed before the claim is cleared.
        drop(file);
        let mut st = lock(&self.state);
        st.busy = None;
        claim.done = true;
        drop(st);
        self.cv.notify_all();
    }

    /// Stops background zeroing of the current file after a failed open or write (see `off`).
    fn give_up(&self, path: &Path, e: Error) {
        tracing::warn!(path = %path.display(), error = %e, "background pre-zeroing of the journal stopped: commits zero inline");
        lock(&self.state).off = true;
    }

    /// Poisons the journal with a failed background sync (the first failure wins).
    fn fail(&self, path: &Path, e: Error) {
        tracing::error!(path = %path.display(), error = %e, "background pre-zeroing of the journal failed: the journal is poisoned");
        let mut st = lock(&self.state);
        if st.failed.is_none() {
            st.failed = Some(e);
        }
    }
}

/// The process's pre-zeroing service: journals waiting for a window, and the thread's wake-up.
struct ZeroService {
    state: Mutex<ZeroQueue>,
    wake: Condvar,
}

#[derive(Default)]
struct ZeroQueue {
    jobs: VecDeque<Weak<ZeroCtl>>,
    started: bool,
    /// The thread could not be started: writers zero inline.
    unavailable: bool,
}

fn zero_service() -> &'static ZeroService {
    static SERVICE: OnceLock<ZeroService> = OnceLock::new();
    SERVICE.get_or_init(|| ZeroService {
        state: Mutex::new(ZeroQueue::default()),
        wake: Condvar::new(),
    })
}

/// Queues `ctl` for the pre-zeroing thread, starting the thread the first time. False when the
/// queue is full or the thread cannot be started.
fn queue_zeroing(ctl: &Arc<ZeroCtl>) -> bool {
    let svc = zero_service();
    let mut q = lock(&svc.state);
    if q.unavailable || q.jobs.len() >= MAX_ZERO_QUEUE {
        return false;
    }
    if !q.started {
        // Default I/O priority on purpose: the zeros are on the path of the next commits.
        let spawned = std::thread::Builder::new()
            .name(PREZERO_THREAD.into())
            .spawn(run_zero_service);
        match spawned {
            Ok(_) => q.started = true,
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the journal pre-zeroing thread: commits zero the journal inline");
                q.unavailable = true;
                return false;
            }
        }
    }
    q.jobs.push_back(Arc::downgrade(ctl));
    drop(q);
    svc.wake.notify_one();
    true
}

fn run_zero_service() {
    let svc = zero_service();
    loop {
        let job = {
            let mut q = lock(&svc.state);
            // Bounded: each wake-up pops a job or waits again.
            loop {
                if let Some(j) = q.jobs.pop_front() {
                    break j;
                }
                q = svc.wake.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        // Held only for this one job: a dropped journal is skipped, and `Journal::drop` waits
        // out a job in flight.
        if let Some(ctl) = job.upgrade() {
            // A panicking environment poisons that journal (`Claim`) and the thread goes on.
            let _ =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ctl.zero_next_window()));
        }
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
