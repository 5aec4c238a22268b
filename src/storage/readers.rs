//! The reader table: the `LOCK` file's bytes, shared by every process that opens the storage
//! (as LMDB's lock file). A read-only open in another process takes a slot and states in it the
//! oldest transaction whose pages it may read; the writer reads every slot before it reuses
//! freed pages, punches holes or cuts the data file (design.md 6.5, invariant I16).
//!
//! Layout (8,192 bytes, little-endian, read and written as aligned 64-bit atomics through a
//! shared map of the file):
//!
//! ```text
//! 0    8   magic "OMNIRDR\0"
//! 8    8   version (1) in the low 32 bits, slot count (127) in the high 32 bits
//! 16   8   the writer's pid while a read-write opener holds the storage (informative; 0 after
//!          its clean close)
//! 24   40  zeros
//! 64 + 64 i   slot i (i < 127):
//!      0  8  pid of the reader (0: free)
//!      8  8  txn: the oldest state the reader may read (0 while it opens: pins every page)
//!      16 48 zeros
//! ```
//!
//! Liveness is an open-file-description lock (`fcntl(F_OFD_SETLK)`, write) over a slot's 64
//! bytes, held by the reader for as long as the slot is its own: the kernel drops it with the
//! reader's last descriptor, so a SIGKILLed reader's slot is found free by the next claim and
//! cleared by the writer's sweep ([`ReaderTable::sweep`]; LMDB's `mdb_reader_check`). The
//! writer holds the same kind of lock over bytes 16..24 for as long as it is open, so a reader can
//! tell whether a writer is live ([`ReaderTable::writer_live`]). `flock` on the same file (the
//! writers' mutual exclusion, `lock.rs`) and these locks do not interact.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};

/// The table's magic, bytes 0..8 of `LOCK`.
const MAGIC: u64 = u64::from_le_bytes(*b"OMNIRDR\0");
/// Table format version.
const VERSION: u64 = 1;
/// Reader slots in the table.
pub(crate) const SLOTS: usize = 127;
/// Bytes of one slot, and of the table's header.
const SLOT_LEN: u64 = 64;
/// Bytes of the whole table.
pub(crate) const TABLE_LEN: u64 = SLOT_LEN * (SLOTS as u64 + 1);
/// The byte range a live writer keeps locked.
const WRITER_RANGE: (u64, u64) = (16, 8);
/// The byte range locked (blocking, briefly) while the table is initialised.
const INIT_RANGE: (u64, u64) = (0, 8);

/// One open of the reader table: the `LOCK` file read-write and its shared map.
pub(crate) struct ReaderTable {
    file: File,
    map: memmap2::MmapMut,
    path: PathBuf,
}

impl std::fmt::Debug for ReaderTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReaderTable({})", self.path.display())
    }
}

/// One process's live reader slot, freed (and its lock released) when dropped.
#[derive(Debug)]
pub(crate) struct ReaderSlot {
    table: Arc<ReaderTable>,
    index: usize,
}

/// A reader slot that a live process holds ([`crate::Storage::readers`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReaderInfo {
    /// The reader's process id.
    pub pid: u32,
    /// The oldest transaction id whose pages the reader may still read (0 while it opens: it
    /// pins every page).
    pub txn: u64,
}

impl ReaderTable {
    /// Opens the table in `file` (the `LOCK` file, opened read-write), initialising it when the
    /// file is empty or all zeros (an older build's empty `LOCK`).
    ///
    /// Errors: [`Error::Corruption`] when the file holds something else; I/O errors.
    pub fn open(file: File, path: &Path) -> Result<ReaderTable> {
        let io = |op: &'static str, e: std::io::Error| Error::Io {
            op,
            path: path.to_path_buf(),
            source: e,
        };
        ofd_lock(&file, libc::F_WRLCK as i16, INIT_RANGE, true).map_err(|e| io("fcntl", e))?;
        let r = (|| {
            let len = file.metadata().map_err(|e| io("fstat", e))?.len();
            if len < TABLE_LEN {
                let mut head = [0u8; 8];
                let n = read_at(&file, &mut head).map_err(|e| io("pread", e))?;
                if n > 0 && head[..n].iter().any(|b| *b != 0) {
                    return Err(Error::corruption(
                        path,
                        None,
                        Some(0),
                        "the LOCK file holds no reader table",
                    ));
                }
                file.set_len(TABLE_LEN).map_err(|e| io("ftruncate", e))?;
            }
            // SAFETY: the file is at least TABLE_LEN bytes and open read-write; every process
            // touches the mapped bytes only through the aligned atomics of `word`, so the
            // shared mapping is never read or written as plain memory.
            let map = unsafe {
                memmap2::MmapOptions::new()
                    .len(TABLE_LEN as usize)
                    .map_mut(&file)
            }
            .map_err(|e| io("mmap", e))?;
            let t = ReaderTable {
                file: file.try_clone().map_err(|e| io("dup", e))?,
                map,
                path: path.to_path_buf(),
            };
            let magic = t.word(0).load(Ordering::Acquire);
            if magic == 0 {
                t.word(8)
                    .store(VERSION | ((SLOTS as u64) << 32), Ordering::Release);
                t.word(0).store(MAGIC, Ordering::Release);
            } else if magic != MAGIC
                || t.word(8).load(Ordering::Acquire) != VERSION | ((SLOTS as u64) << 32)
            {
                return Err(Error::corruption(
                    path,
                    None,
                    Some(0),
                    "the LOCK file's reader table has another magic or version",
                ));
            }
            Ok(t)
        })();
        let _ = ofd_lock(&file, libc::F_UNLCK as i16, INIT_RANGE, false);
        r
    }

    /// The aligned 64-bit word at byte `off` of the table.
    fn word(&self, off: u64) -> &AtomicU64 {
        debug_assert!(off.is_multiple_of(8) && off + 8 <= TABLE_LEN);
        // SAFETY: the map is TABLE_LEN bytes, page aligned, and lives as long as `self`;
        // `off` is a multiple of 8 below TABLE_LEN - 8, so the pointer is aligned and in
        // bounds. Every process accesses these bytes only as `AtomicU64`s.
        unsafe { &*(self.map.as_ptr().add(off as usize) as *const AtomicU64) }
    }

    fn slot_range(i: usize) -> (u64, u64) {
        (SLOT_LEN * (i as u64 + 1), SLOT_LEN)
    }

    /// Claims a free slot for this process with txn 0 (every page pinned until the opener
    /// states what it reads). A slot is free when its lock can be taken: a crashed reader's
    /// slot is free again, whatever its pid says.
    ///
    /// Errors: [`Error::TooManyReaders`] when every slot is held by a live reader; I/O errors.
    pub fn claim(self: &Arc<Self>) -> Result<ReaderSlot> {
        for i in 0..SLOTS {
            let got = ofd_lock(&self.file, libc::F_WRLCK as i16, Self::slot_range(i), false)
                .map_err(|e| self.io("fcntl", e))?;
            if got {
                let base = Self::slot_range(i).0;
                self.word(base + 8).store(0, Ordering::SeqCst);
                self.word(base)
                    .store(u64::from(std::process::id()), Ordering::SeqCst);
                return Ok(ReaderSlot {
                    table: self.clone(),
                    index: i,
                });
            }
        }
        Err(Error::TooManyReaders {
            path: self.path.clone(),
            slots: SLOTS,
        })
    }

    /// Marks a writer live for as long as this table stays open (a lock over bytes 16..24).
    pub fn mark_writer(&self) -> Result<()> {
        ofd_lock(&self.file, libc::F_WRLCK as i16, WRITER_RANGE, false)
            .map_err(|e| self.io("fcntl", e))?;
        self.word(16)
            .store(u64::from(std::process::id()), Ordering::Release);
        Ok(())
    }

    /// Clears the writer's pid (bytes 16..24) when it is this process's: a read-write open's
    /// close, before its lock and `flock` go with the file. The reader slots are left as they
    /// are (readers still attached keep theirs).
    pub fn clear_writer(&self) {
        let _ = self.word(16).compare_exchange(
            u64::from(std::process::id()),
            0,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// True when a read-write opener (another open file than this one) holds the storage.
    pub fn writer_live(&self) -> bool {
        held_by_other(&self.file, WRITER_RANGE).unwrap_or(true)
    }

    /// Keeps read-write openers out while the returned guard lives (a shared `flock` on
    /// `LOCK`, as before the table existed); `None` when a writer holds the storage now.
    pub fn exclude_writers(&self) -> Option<WritersExcluded<'_>> {
        use rustix::fs::FlockOperation as Op;
        rustix::fs::flock(&self.file, Op::NonBlockingLockShared)
            .ok()
            .map(|()| WritersExcluded(self))
    }

    /// The oldest txn any occupied slot states, or `None` when no slot is occupied. A slot of a
    /// crashed reader counts until [`ReaderTable::sweep`] clears it. No system call.
    pub fn oldest(&self) -> Option<u64> {
        let mut oldest: Option<u64> = None;
        for i in 0..SLOTS {
            let base = Self::slot_range(i).0;
            if self.word(base).load(Ordering::SeqCst) != 0 {
                let t = self.word(base + 8).load(Ordering::SeqCst);
                oldest = Some(oldest.map_or(t, |o| o.min(t)));
            }
        }
        oldest
    }

    /// Clears the slots whose pid is set but whose lock nobody holds (readers that died
    /// without freeing them). Returns how many it cleared.
    pub fn sweep(&self) -> Result<usize> {
        let mut cleared = 0;
        for i in 0..SLOTS {
            let (base, _) = Self::slot_range(i);
            if self.word(base).load(Ordering::SeqCst) == 0 {
                continue;
            }
            let range = Self::slot_range(i);
            if ofd_lock(&self.file, libc::F_WRLCK as i16, range, false)
                .map_err(|e| self.io("fcntl", e))?
            {
                if self.word(base).swap(0, Ordering::SeqCst) != 0 {
                    cleared += 1;
                }
                self.word(base + 8).store(0, Ordering::SeqCst);
                let _ = ofd_lock(&self.file, libc::F_UNLCK as i16, range, false);
            }
        }
        Ok(cleared)
    }

    /// The slots held by live readers (their lock held by another open file).
    pub fn live(&self) -> Result<Vec<ReaderInfo>> {
        let mut v = Vec::new();
        for i in 0..SLOTS {
            let base = Self::slot_range(i).0;
            let pid = self.word(base).load(Ordering::SeqCst);
            if pid != 0
                && held_by_other(&self.file, Self::slot_range(i))
                    .map_err(|e| self.io("fcntl", e))?
            {
                v.push(ReaderInfo {
                    pid: pid as u32,
                    txn: self.word(base + 8).load(Ordering::SeqCst),
                });
            }
        }
        Ok(v)
    }

    fn io(&self, op: &'static str, e: std::io::Error) -> Error {
        Error::Io {
            op,
            path: self.path.clone(),
            source: e,
        }
    }
}

/// A shared `flock` on `LOCK` taken by [`ReaderTable::exclude_writers`], released when
/// dropped.
pub(crate) struct WritersExcluded<'a>(&'a ReaderTable);

impl Drop for WritersExcluded<'_> {
    fn drop(&mut self) {
        let _ = rustix::fs::flock(&self.0.file, rustix::fs::FlockOperation::Unlock);
    }
}

impl ReaderSlot {
    /// States the oldest txn this reader may read from now on. A later call may lower or raise
    /// it; raising it lets the writer reuse pages freed up to it.
    pub fn set_txn(&self, txn: u64) {
        let base = ReaderTable::slot_range(self.index).0;
        self.table.word(base + 8).store(txn, Ordering::SeqCst);
        // The header read that follows must not be ordered before this store.
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    /// The table this slot belongs to.
    pub fn table(&self) -> &ReaderTable {
        &self.table
    }
}

impl Drop for ReaderSlot {
    fn drop(&mut self) {
        let range = ReaderTable::slot_range(self.index);
        self.table.word(range.0).store(0, Ordering::SeqCst);
        self.table.word(range.0 + 8).store(0, Ordering::SeqCst);
        let _ = ofd_lock(&self.table.file, libc::F_UNLCK as i16, range, false);
    }
}

/// Reads up to `buf.len()` bytes at offset 0.
fn read_at(file: &File, buf: &mut [u8]) -> std::io::Result<usize> {
    use std::os::unix::fs::FileExt;
    file.read_at(buf, 0)
}

fn flock_struct(kind: i16, (start, len): (u64, u64)) -> libc::flock {
    // SAFETY: `libc::flock` is a plain C struct of integers; all zeros is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind;
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_start = start as libc::off_t;
    fl.l_len = len as libc::off_t;
    fl.l_pid = 0;
    fl
}

/// Takes (`F_WRLCK`) or releases (`F_UNLCK`) an open-file-description lock over `range`;
/// `wait` blocks until it is free. Returns false when another open file holds it (not waiting).
fn ofd_lock(file: &File, kind: i16, range: (u64, u64), wait: bool) -> std::io::Result<bool> {
    let mut fl = flock_struct(kind, range);
    let cmd = if wait {
        libc::F_OFD_SETLKW
    } else {
        libc::F_OFD_SETLK
    };
    loop {
        // SAFETY: the descriptor is open for the call, and `fl` is a valid, initialised
        // `struct flock` that the kernel reads (and for GETLK writes) only during it.
        let r = unsafe { libc::fcntl(file.as_raw_fd(), cmd, &mut fl as *mut libc::flock) };
        if r == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN | libc::EACCES) if !wait => return Ok(false),
            _ => return Err(e),
        }
    }
}

/// True when another open file holds a lock over `range` that conflicts with a write lock.
fn held_by_other(file: &File, range: (u64, u64)) -> std::io::Result<bool> {
    let mut fl = flock_struct(libc::F_WRLCK as i16, range);
    // SAFETY: as in `ofd_lock`; F_OFD_GETLK writes the conflicting lock's description, or
    // F_UNLCK, into `fl`.
    let r = unsafe {
        libc::fcntl(
            file.as_raw_fd(),
            libc::F_OFD_GETLK,
            &mut fl as *mut libc::flock,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fl.l_type != libc::F_UNLCK as i16)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_table(path: &Path) -> Arc<ReaderTable> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .unwrap();
        Arc::new(ReaderTable::open(f, path).unwrap())
    }

    #[test]
    fn slots_are_claimed_stated_and_freed() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("LOCK");
        let writer = open_table(&p);
        let reader = open_table(&p);
        assert_eq!(writer.oldest(), None);
        let s = reader.claim().unwrap();
        assert_eq!(writer.oldest(), Some(0));
        s.set_txn(42);
        assert_eq!(writer.oldest(), Some(42));
        assert_eq!(writer.live().unwrap().len(), 1);
        assert_eq!(writer.sweep().unwrap(), 0, "a live slot is not swept");
        drop(s);
        assert_eq!(writer.oldest(), None);
        assert!(!reader.writer_live());
        writer.mark_writer().unwrap();
        assert!(reader.writer_live());
    }

    #[test]
    fn a_full_table_is_a_typed_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("LOCK");
        let tables: Vec<_> = (0..SLOTS).map(|_| open_table(&p)).collect();
        let slots: Vec<_> = tables.iter().map(|t| t.claim().unwrap()).collect();
        let one_more = open_table(&p);
        assert!(matches!(
            one_more.claim(),
            Err(Error::TooManyReaders { slots: SLOTS, .. })
        ));
        drop(slots);
        assert!(one_more.claim().is_ok());
    }

    #[test]
    fn a_slot_whose_lock_is_gone_is_swept() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("LOCK");
        let writer = open_table(&p);
        let reader = open_table(&p);
        let s = reader.claim().unwrap();
        s.set_txn(7);
        // A reader that died: its lock is released, its words stay.
        let _ = ofd_lock(
            &reader.file,
            libc::F_UNLCK as i16,
            ReaderTable::slot_range(s.index),
            false,
        );
        std::mem::forget(s);
        assert_eq!(writer.oldest(), Some(7));
        assert_eq!(writer.sweep().unwrap(), 1);
        assert_eq!(writer.oldest(), None);
    }
}
