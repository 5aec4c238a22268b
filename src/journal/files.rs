//! The journal files: which file is current, which storage directories hold an entry for
//! which file, and every change to those entries.
//!
//! - Creating the next file (`Journal::new_file`): a pre-zeroed file from the pool renamed into
//!   place, or a new file zeroed and synced here; then the journal directory is fsynced before
//!   any record in the file is acknowledged (design.md invariant I6).
//! - Registering the storages whose records the journal carries, with the files their
//!   `Journals/` hold (`Journal::register`, `Journal::unregister`).
//! - Shared journal: the first record of a branch storage in a file hard-links the file into the
//!   branch's `Journals/` and adds a link record to the same batch (`Journal::link_batch`), which
//!   stands in for a directory fsync (recovery re-creates a missing link from its record).
//! - Retention (`Journal::release`): a storage's entry for a file is removed once the storage
//!   has flushed every record it has in it; before that, every directory that got a link to the
//!   file since its last fsync is fsynced (design.md invariant I5, one fsync covering every link made
//!   before it), and before a released file is recycled into the pool, every branch `Journals/`
//!   whose entry for it was removed since its last fsync is fsynced too, so a power loss cannot
//!   bring back a name for the file's new contents. Only files this journal created since this
//!   open, with no other name, are recycled, from whichever `Journals/` held the last name
//!   (a branch's is fsynced right after the rename).
//!
//! Apart from this module, only `database.rs` creates or removes journal file names (see
//! `docs/ARCHITECTURE.md`).

use std::collections::{BTreeMap, HashMap};
use std::io::IoSlice;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::lock;
use super::pool::POOL_SUFFIX;
use super::prezero::write_zeros;
use super::record::{
    padding_for, start_body, OutRecord, RecordKind, BATCH_ALIGN, RECORD_HEADER_LEN,
};
use super::Prezero;
use super::{Io, Journal, StorageDir, Waiting};
use crate::env::{EnvFile, OpenMode};
use crate::error::{Error, Result};

/// Released files kept in the pool beyond its target: one released file arrives about as often
/// as one is taken, but not exactly when the pool wants one, and a file kept saves writing a
/// whole journal file of zeros.
const RECYCLED_SPARE: usize = 1;

impl Io {
    /// Before the first file: storage `owner` in `owner_dir` registered, no file yet.
    pub(super) fn new(owner: u64, owner_dir: &Path) -> Io {
        let mut storages = HashMap::new();
        storages.insert(
            owner,
            StorageDir {
                dir: owner_dir.to_path_buf(),
                rel: String::new(),
            },
        );
        Io {
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
            started: BTreeMap::new(),
            stated: (0, 0),
            closed_clean: false,
            marked: 0,
        }
    }
}

impl Journal {
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
    /// Hard-links the current file into the `Journals/` of every storage of the batch that has
    /// no entry for it yet, and returns the link records that go in the same batch (they stand
    /// in for a directory fsync: recovery re-creates a missing link from its record).
    pub(super) fn link_batch(&self, io: &mut Io, batch: &[Waiting]) -> Result<Vec<OutRecord>> {
        let mut out = Vec::new();
        let no = io.no;
        // Named only when a link is made (most batches make none).
        let mut name = None;
        for sid in batch
            .iter()
            .flat_map(|w| w.record.commits().map(|(s, _)| s))
        {
            if sid == self.owner || io.entries.get(&no).is_some_and(|e| e.contains_key(&sid)) {
                continue;
            }
            // A storage dropped while its commit was queued: its directory is going away.
            let Some(sd) = io.storages.get(&sid).cloned() else {
                continue;
            };
            let name = name.get_or_insert_with(|| super::file_name(no));
            let to = sd.dir.join(crate::layout::JOURNALS_DIR).join(&*name);
            match self.env.link(&self.dir.join(&*name), &to) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                // Hard links never cross file systems or mounts: the branch directory is on
                // another one (the database checks device and mount at open; this catches a
                // mount made since).
                Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
                    return Err(crate::Error::CrossDevice { path: sd.dir })
                }
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
            out.push(OutRecord::new(RecordKind::Link, sid, 0, vec![body.into()]));
        }
        Ok(out)
    }

    /// Makes journal file `no` current: a pre-zeroed file from the pool renamed into place, or
    /// a new file zeroed here (room for at least `need` bytes); then syncs the directory. When
    /// the journal had a current file, a start record for the new one (its number and durable
    /// length) is then written into the old one as a batch of its own and synced, before any
    /// batch of the new file: the statement outside the new file that it exists and how long it
    /// is at least (docs/design.md 3.8). One `fdatasync` per file started.
    pub(super) fn new_file(&self, io: &mut Io, no: u64, need: u64) -> Result<()> {
        let path = self.dir.join(super::file_name(no));
        self.zero.pause();
        // The file the start record goes into: where its next batch would start, and how much
        // of it is durable (for the padding record, as any batch's).
        let prev = (io.no != 0).then(|| {
            let durable = lock(&self.zero.state).zeroed_end;
            (io.file.clone(), io.no, io.pos, durable)
        });
        let pooled = if need <= self.file_size {
            self.pool.take()
        } else {
            None
        };
        let (file, zeroed) = match pooled {
            Some(p) => {
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
                let zeroed = write_zeros(&*f, 0, first).and_then(|()| Ok(f.sync_data()?));
                if let Err(e) = zeroed {
                    drop(f);
                    // Nothing states this file yet (no header, no start record): removing it
                    // leaves the journal as it was, and a failed open leaves no new file.
                    let _ = self.env.remove_file(&path);
                    if prev.is_none() && e.is_no_space() {
                        // The open's first file: say what is needed (regression: every open
                        // of a full file system after a crash failed with a bare `pwrite
                        // ENOSPC` and left one more empty journal file behind).
                        return Err(Error::NoSpace {
                            available: available_bytes(&self.dir),
                            path,
                            what: "starting a journal file",
                            needed: first,
                        });
                    }
                    return Err(e);
                }
                self.fdatasyncs.fetch_add(1, Ordering::Relaxed);
                (f, first)
            }
        };
        self.pool.wanted.store(false, Ordering::Release);
        io.file = file;
        io.no = no;
        io.pos = 0;
        io.marked = 0;
        self.zero.start_file(path, zeroed);
        self.env.sync_dir(&self.dir)?;
        self.dir_syncs.fetch_add(1, Ordering::Relaxed);
        io.entries
            .entry(no)
            .or_default()
            .entry(self.owner)
            .or_insert(0);
        io.created.insert(no);
        io.started.insert(no, zeroed);
        if let Some((prev, prev_no, pos, durable)) = prev {
            // The new file's creation, zeros and name are durable: the statement is true from
            // here on, whatever crash follows.
            let rec = OutRecord::new(
                RecordKind::Start,
                self.owner,
                0,
                vec![start_body(no, zeroed).into()],
            );
            let pad = padding_for(pos + rec.total_len(), durable);
            let records: Vec<&OutRecord> = std::iter::once(&rec).chain(pad.iter()).collect();
            let headers: Vec<[u8; RECORD_HEADER_LEN]> =
                records.iter().map(|r| r.header(prev_no)).collect();
            let mut slices: Vec<IoSlice<'_>> = Vec::new();
            for (r, h) in records.iter().zip(&headers) {
                slices.push(IoSlice::new(h));
                for p in &r.parts {
                    slices.push(IoSlice::new(p));
                }
            }
            prev.write_vectored_and_sync(&slices, pos, self.io_path.0)?;
            self.fdatasyncs.fetch_add(1, Ordering::Relaxed);
            self.start_records.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// The start statement `(file, length)` the owner's next header carries when the owner has
    /// flushed every transaction up to `owner_flushed` (docs/design.md 3.8): the lowest journal
    /// file that is current or holds records of the owner above `owner_flushed`, but never
    /// below the durable statement; with the length it was started with. `(0, 0)`, no
    /// statement, before the first file, and for the owner's closing flush (`closing`) when it
    /// flushed every record the owner has in the journal: nothing of the owner needs a journal
    /// file then, the journal's drop may empty the current file (`release_on_drop`), and a
    /// cleanly closed storage opens without its journal files (its data file copied alone).
    pub fn start_statement(&self, owner_flushed: u64, closing: bool) -> (u64, u64) {
        let io = lock(&self.io);
        let f = self.statement_file(&io, owner_flushed);
        if f == 0 {
            return (0, 0);
        }
        let current_flushed = io
            .entries
            .get(&io.no)
            .and_then(|per| per.get(&self.owner))
            .is_none_or(|max| *max <= owner_flushed);
        if closing && f == io.no && current_flushed {
            return (0, 0);
        }
        (f, io.started.get(&f).copied().unwrap_or(0))
    }

    /// The file of [`Journal::start_statement`].
    fn statement_file(&self, io: &Io, owner_flushed: u64) -> u64 {
        if io.no == 0 {
            return 0;
        }
        // `entries` is ordered by journal number: the first file the owner needs is the
        // lowest. Other storages' entries do not count: the owner's names of the files before
        // it go as they always did once the owner flushed its records there (a branch's link
        // keeps such a file for the branch; see docs/design.md 3.8 for what that leaves).
        let needed = io.entries.iter().find_map(|(no, per)| {
            let needs = per.get(&self.owner).is_some_and(|max| *max > owner_flushed);
            (*no != io.no && needs).then_some(*no)
        });
        needed.unwrap_or(io.no).min(io.no).max(io.stated.0)
    }

    /// The owner's header holding start statement `stated` is durable: from now on the owner's
    /// names of files below `stated.0` may be released, and none at or above it. `(0, 0)`, no
    /// statement, from the closing flush: the journal's drop may empty the current file.
    pub fn note_statement(&self, stated: (u64, u64)) {
        let mut io = lock(&self.io);
        if stated == (0, 0) {
            io.closed_clean = io.no != 0;
        } else if stated.0 >= io.stated.0 {
            io.stated = stated;
        }
    }

    /// True when the journal's drop may empty its current file as far as the owner's durable
    /// start statement goes: its closing flush left none (see [`Journal::start_statement`]).
    pub(super) fn current_stated_empty(&self, io: &Io) -> bool {
        io.closed_clean
    }

    /// Storage `sid` has flushed every transaction up to `flushed`: removes its directory
    /// entry of every journal file (but the current one) whose records of `sid` are all at or
    /// below it. Before removing an entry, every directory that got a link to that file since
    /// its last fsync is fsynced (design.md invariant I5), so no storage that still needs the file
    /// can lose it to a power loss. Returns the journal numbers removed for `sid`.
    pub fn release(&self, sid: u64, flushed: u64) -> Result<Vec<u64>> {
        let mut io = lock(&self.io);
        let current = io.no;
        // The owner's names are released only below its durable start statement (every file at
        // or above it must exist: docs/design.md 3.8), which is at or below every file holding
        // its unflushed records; other storages' names once they flushed their records there.
        let stated = io.stated.0;
        let done: Vec<u64> = io
            .entries
            .iter()
            .filter(|(no, per)| {
                **no != current
                    && if sid == self.owner {
                        **no < stated && per.contains_key(&sid)
                    } else {
                        per.get(&sid).is_some_and(|m| *m <= flushed)
                    }
            })
            .map(|(no, _)| *no)
            .collect();
        for no in &done {
            self.make_links_durable(&mut io, *no)?;
            let Some(sd) = io.storages.get(&sid).cloned() else {
                break;
            };
            let path = sd
                .dir
                .join(crate::layout::JOURNALS_DIR)
                .join(super::file_name(*no));
            let last = io.entries.get(no).map(|p| p.len() == 1).unwrap_or(true);
            // Recycle only a file this journal created since this open whose only name is the
            // one being removed, whichever storage holds it (in a database the last name is
            // mostly a branch's: its buffered entries keep records longest): a file from an
            // earlier open may still be hard-linked from another directory (a branch opened
            // standalone), and reusing it would overwrite records another storage still needs.
            let recycle = last
                && io.created.contains(no)
                && self.pool.target > 0
                && self.pool.ready_len() < self.pool.target + RECYCLED_SPARE
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
                    let renamed = self.env.rename(&path, &to);
                    if renamed.is_ok() {
                        if sid != self.owner {
                            // The name left a branch's `Journals/`: that removal is made
                            // durable before the file can be reused, as every other one.
                            let seq = io.seq;
                            io.seq += 1;
                            self.sync_dirs_after(&mut io, vec![(sid, seq)])?;
                        }
                        self.pool.put(to);
                        self.files_recycled.fetch_add(1, Ordering::Relaxed);
                    }
                    renamed
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
                .sync_dir(&sd.dir.join(crate::layout::JOURNALS_DIR))?;
            self.dir_syncs.fetch_add(1, Ordering::Relaxed);
            let seq = io.seq;
            io.seq += 1;
            io.dir_synced.insert(sid, seq);
        }
        Ok(())
    }

    /// True when storage `sid` still has an entry for a journal file older than the current
    /// one: flushing it lets that file go (bounded retention, design.md invariant I11).
    pub fn pins_old_file(&self, sid: u64) -> bool {
        let io = lock(&self.io);
        if sid == self.owner && io.stated.0 != 0 {
            // The owner's names of old files go only with a new start statement: it pins files
            // with its own unflushed records, and those a new statement would let go.
            let flushed = lock(&self.flushed).get(&sid).copied().unwrap_or(0);
            return self.statement_file(&io, flushed) > io.stated.0
                || io.entries.iter().any(|(no, per)| {
                    *no != io.no && per.get(&sid).is_some_and(|max| *max > flushed)
                });
        }
        io.entries
            .iter()
            .any(|(no, per)| *no != io.no && per.contains_key(&sid))
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

/// Bytes available to this user on the file system of `dir` (`statvfs`: free blocks for
/// unprivileged users times the fragment size); 0 when it cannot be told.
fn available_bytes(dir: &Path) -> u64 {
    rustix::fs::statvfs(dir)
        .map(|v| v.f_bavail.saturating_mul(v.f_frsize))
        .unwrap_or(0)
}

fn no_file() -> crate::env::EnvError {
    crate::env::EnvError::new(
        "write",
        "<no journal file>",
        std::io::Error::from_raw_os_error(libc::EBADF),
    )
}
