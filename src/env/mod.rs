//! Storage environments: every file operation of the engine goes through [`StorageEnv`]
//! (as RocksDB's `Env`/`FileSystem`), but the `LOCK` file, the read-only map of the data file
//! and a few metadata reads (`docs/ARCHITECTURE.md` lists them all).
//!
//! Implementations:
//! - [`DefaultEnv`]: the real file system through `pread` / `pwrite` / `pwritev` / `fdatasync` /
//!   `fallocate` / `link` / directory `fsync`.
//! - [`UringEnv`]: [`DefaultEnv`] for namespace operations and reads; one io_uring ring per
//!   lane for journal batches (one linked `WRITEV` + `FSYNC`) and data-file writes, syncs and
//!   `fallocate`. [`default_env`] picks it where io_uring can be set up.
//! - Your own: implement [`StorageEnv`] and [`EnvFile`] (e.g. to count or throttle I/O) and
//!   pass it in [`crate::Options::env`]. The engine wraps whatever it is given in its bounded
//!   retry of `EINTR`/`EAGAIN` (at most 16 tries of one operation).
//! - `testing` (cargo feature `testing`, off by default): wrappers for tests: power loss
//!   (`PowerLossEnv`), fault injection (`HookedEnv`, and the io_uring lanes' `RingFaults`) and
//!   the ordered list of durable operations (`RecordingEnv`).
//!
//! Files are opened read-write and shared as `Arc<dyn EnvFile>`; every method takes `&self` and
//! positions explicitly (no seek pointer), so one handle serves several threads.

use std::io::{self, IoSlice};
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod default;
pub(crate) mod executor_guard;
pub(crate) mod page_reads;
pub(crate) mod retry;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod uring;

pub use default::DefaultEnv;
pub(crate) use executor_guard::{mark_executor_thread, on_executor};
pub use uring::UringEnv;

/// A failed file operation: the operation, the path and the operating system's error.
#[derive(Debug, thiserror::Error)]
#[error("{op} {path}: {source}")]
#[non_exhaustive]
pub struct EnvError {
    /// The operation, named after the system call (`"pwritev"`, `"fdatasync"`, `"link"`, ...).
    pub op: &'static str,
    /// The file or directory.
    pub path: PathBuf,
    /// The operating system's error.
    #[source]
    pub source: io::Error,
}

impl EnvError {
    /// Builds an error for `op` on `path`.
    pub fn new(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> EnvError {
        EnvError {
            op,
            path: path.into(),
            source,
        }
    }

    /// The OS error code (`libc::EIO`, `libc::ENOSPC`, ...), when there is one.
    pub fn raw_os_error(&self) -> Option<i32> {
        self.source.raw_os_error()
    }
}

/// Result of an environment operation.
pub type EnvResult<T> = std::result::Result<T, EnvError>;

/// How [`StorageEnv::open`] treats a missing or existing file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// The file must exist.
    Existing,
    /// The file must exist; it is opened for reading only (`O_RDONLY`), so that read-only
    /// media and files the user may not write open too. Writes through it fail with `EBADF`.
    ReadOnly,
    /// Open it, creating an empty file when it is missing.
    Create,
    /// Create it; fail with `EEXIST` when it exists.
    CreateNew,
}

/// How a flush writes pages into a data file (as RavenDB Voron's write modes; design.md 5).
/// [`EnvFile::write_runs`] carries it out; `Options::write_mode` chooses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WriteMode {
    /// Measure (a short probe at the first flush that writes pages, once per device in the
    /// process) and pick the cheapest of the others for the file system (the default; see
    /// `crate::write_mode`).
    Auto,
    /// Copy the pages into a writable shared map of the file; each run's range is
    /// re-allocated (`fallocate`) first, so a punched range on a full disk is `ENOSPC`, never
    /// a SIGBUS.
    Mmap,
    /// One `pwrite` per page.
    FileIo,
    /// One `pwritev` per run of adjacent pages (at most `IOV_MAX` pages or 8 MiB).
    VectoredFileIo,
    /// Every run submitted at once to the background io_uring lane (`IORING_OP_WRITEV` each),
    /// waited for together. Where no ring exists it writes as [`WriteMode::VectoredFileIo`].
    IoRing,
}

impl WriteMode {
    /// Every concrete mode (all but [`WriteMode::Auto`]).
    pub const CONCRETE: [WriteMode; 4] = [
        WriteMode::Mmap,
        WriteMode::FileIo,
        WriteMode::VectoredFileIo,
        WriteMode::IoRing,
    ];

    /// The name used by `OMNIBUS_WRITE_MODE` and `omnibus stat`: `auto`, `mmap`, `file_io`,
    /// `vectored_file_io`, `io_ring`.
    pub fn name(self) -> &'static str {
        match self {
            WriteMode::Auto => "auto",
            WriteMode::Mmap => "mmap",
            WriteMode::FileIo => "file_io",
            WriteMode::VectoredFileIo => "vectored_file_io",
            WriteMode::IoRing => "io_ring",
        }
    }

    /// Parses [`WriteMode::name`]'s spelling; `None` for anything else.
    pub fn parse(s: &str) -> Option<WriteMode> {
        [WriteMode::Auto]
            .into_iter()
            .chain(WriteMode::CONCRETE)
            .find(|m| m.name() == s.trim())
    }
}

/// How a journal batch reaches the device ([`EnvFile::write_vectored_and_sync`]);
/// `Options::journal_io` chooses it (design.md 4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JournalIo {
    /// Measure (a short probe when a journal opens, once per device in the process) and pick
    /// the faster of the others on that file system (the default; see `crate::journal_io`).
    Auto,
    /// `pwritev` then `fdatasync`, both issued by the thread that writes the batch: at queue
    /// depth 1 the cheapest path where measured (no worker thread between the caller and the
    /// device).
    Syscalls,
    /// One `IORING_OP_WRITEV` linked to one `IORING_OP_FSYNC(DATASYNC)` on the writing
    /// thread's own ring (one `io_uring_enter`; the kernel runs the sync on an io-wq worker).
    /// Where no ring exists it writes as [`JournalIo::Syscalls`].
    Ring,
}

impl JournalIo {
    /// Every concrete path (all but [`JournalIo::Auto`]), in the order a tie goes to.
    pub const CONCRETE: [JournalIo; 2] = [JournalIo::Syscalls, JournalIo::Ring];

    /// The name used by `OMNIBUS_JOURNAL_IO` and `omnibus stat`: `auto`, `syscalls`, `ring`.
    pub fn name(self) -> &'static str {
        match self {
            JournalIo::Auto => "auto",
            JournalIo::Syscalls => "syscalls",
            JournalIo::Ring => "ring",
        }
    }

    /// Parses [`JournalIo::name`]'s spelling; `None` for anything else.
    pub fn parse(s: &str) -> Option<JournalIo> {
        [JournalIo::Auto]
            .into_iter()
            .chain(JournalIo::CONCRETE)
            .find(|m| m.name() == s.trim())
    }
}

/// One run of a flush: the byte offset where it starts and its pages back to back.
pub type Run<'a> = (u64, &'a [IoSlice<'a>]);

/// One open file. Offsets and lengths are in bytes.
#[allow(clippy::len_without_is_empty)] // `len` is the file's length (fstat), not a collection's.
pub trait EnvFile: Send + Sync + std::fmt::Debug {
    /// The path the file was opened with (for error messages).
    fn path(&self) -> &Path;
    /// Reads `buf.len()` bytes at `offset`; bytes past the end of the file read as an
    /// `UnexpectedEof` error.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> EnvResult<()>;
    /// Writes all of `buf` at `offset` (`pwrite`, retried on short writes).
    fn write_all_at(&self, buf: &[u8], offset: u64) -> EnvResult<()>;
    /// Writes all of `bufs` back to back starting at `offset` (`pwritev`, retried on short
    /// writes). At most `IOV_MAX` (1,024) slices.
    fn write_vectored_all_at(&self, bufs: &[IoSlice<'_>], offset: u64) -> EnvResult<()>;
    /// `fdatasync`: makes the file's data, and its length, durable.
    fn sync_data(&self) -> EnvResult<()>;
    /// Writes all of `bufs` back to back from `offset`, then makes them durable: one journal
    /// batch. Returns only after both completed in full. Any number of slices. The default
    /// (and every environment's [`JournalIo::Syscalls`]) is [`EnvFile::write_vectored_all_at`]
    /// per `IOV_MAX` slices, then [`EnvFile::sync_data`]; [`UringEnv`] with [`JournalIo::Ring`]
    /// submits one `IORING_OP_WRITEV` linked to one `IORING_OP_FSYNC(DATASYNC)` on the calling
    /// thread's own ring of its critical lane. `io` is never [`JournalIo::Auto`] (the journal
    /// resolves it when it opens); an environment treats `Auto` as `Syscalls`.
    ///
    /// Errors: the write's or the sync's; after an error nothing of `bufs` may be assumed
    /// durable (and the caller must not retry the sync into success, design.md invariant I2).
    fn write_vectored_and_sync(
        &self,
        bufs: &[IoSlice<'_>],
        offset: u64,
        io: JournalIo,
    ) -> EnvResult<()> {
        let _ = io;
        write_vectored_chunks(self, bufs, offset)?;
        self.sync_data()
    }
    /// Writes every run (`(offset, slices)`, non-overlapping) the way `mode` says
    /// ([`WriteMode`]); not durable until [`EnvFile::sync_data`]. The default writes
    /// [`WriteMode::FileIo`] as one [`EnvFile::write_all_at`] per slice and every other mode as
    /// one [`EnvFile::write_vectored_all_at`] per run (so test environments see each write);
    /// [`DefaultEnv`] implements [`WriteMode::Mmap`] and [`UringEnv`] [`WriteMode::IoRing`].
    ///
    /// Errors: the first failed write's (`ENOSPC` when a re-allocation of a punched range
    /// fails in `Mmap` mode).
    fn write_runs(&self, runs: &[Run<'_>], mode: WriteMode) -> EnvResult<()> {
        write_runs_with_writes(self, runs, mode)
    }
    /// Writes back `offset..offset + len` (`sync_file_range`): with `wait`, waits until that
    /// range's dirty pages are on the device (`WAIT_BEFORE | WRITE | WAIT_AFTER`); without, only
    /// starts it (`WRITE`). A flush writes its pages in chunks and waits for each, so it never
    /// has more than one chunk queued on the device ahead of a journal `fdatasync`. Not a
    /// durability operation: metadata and the device cache still need [`EnvFile::sync_data`].
    /// The default does nothing (the test environments model no writeback).
    ///
    /// Errors: the OS error of `sync_file_range`.
    fn write_back(&self, offset: u64, len: u64, wait: bool) -> EnvResult<()> {
        let _ = (offset, len, wait);
        Ok(())
    }
    /// Ensures `offset..offset+len` is allocated (`fallocate` mode 0, file length grows to cover
    /// it). `ENOSPC` when the file system is full.
    fn allocate(&self, offset: u64, len: u64) -> EnvResult<()>;
    /// Hands `offset..offset+len` back to the file system (`fallocate(PUNCH_HOLE | KEEP_SIZE)`);
    /// the range then reads as zeros and the length is unchanged. `EOPNOTSUPP` when the file
    /// system cannot.
    fn punch_hole(&self, offset: u64, len: u64) -> EnvResult<()>;
    /// Sets the length in bytes (`ftruncate`).
    fn set_len(&self, len: u64) -> EnvResult<()>;
    /// The length in bytes.
    fn len(&self) -> EnvResult<u64>;
    /// Bytes allocated on disk (`st_blocks * 512`).
    fn allocated_bytes(&self) -> EnvResult<u64>;
    /// The raw file descriptor, used to map the file read-only (`mmap`). Reads through the map
    /// must show what [`EnvFile::write_all_at`] wrote, so wrappers return the real file's fd.
    fn raw_fd(&self) -> std::os::fd::RawFd;
    /// Writes zeros over `offset..offset + len` of a file none of whose pages in that range are
    /// cached or being written (a file just created, before anyone else writes it): the
    /// journal pool's pre-zeroed files. Not durable until [`EnvFile::sync_data`]. The default
    /// writes a zero buffer with [`EnvFile::write_all_at`] (so test environments see every
    /// write); [`DefaultEnv`] writes with `O_DIRECT` from one aligned zero buffer, so no CPU
    /// copies 256 MiB of zeros into the page cache per journal file.
    fn write_zeros_uncached(&self, offset: u64, len: u64) -> EnvResult<()> {
        write_zeros(self, offset, len)
    }
}

/// Writes any number of `bufs` back to back from `offset` with
/// [`EnvFile::write_vectored_all_at`], `IOV_MAX` slices a call.
pub(crate) fn write_vectored_chunks<F: EnvFile + ?Sized>(
    file: &F,
    bufs: &[IoSlice<'_>],
    offset: u64,
) -> EnvResult<()> {
    let mut off = offset;
    for chunk in bufs.chunks(IOV_MAX_SLICES) {
        file.write_vectored_all_at(chunk, off)?;
        off += chunk.iter().map(|s| s.len() as u64).sum::<u64>();
    }
    Ok(())
}

/// Ensures `offset..offset + len` of `file` is allocated: [`EnvFile::allocate`], or where the
/// file system has no `fallocate` (`EOPNOTSUPP`: FUSE, some network and overlay file systems)
/// extends the file with [`EnvFile::set_len`] and writes zeros over the range, which allocates
/// its blocks just the same (a full disk is then `ENOSPC` here, never later; and no page a map
/// can reach lies past the end of the file). Says so once per process (a `tracing` warning).
/// The range must hold no data (a file's growth).
///
/// Errors: `allocate`'s other errors (`ENOSPC`...); `set_len`'s or the zero writes'.
pub(crate) fn allocate_or_zero<F: EnvFile + ?Sized>(
    file: &F,
    offset: u64,
    len: u64,
) -> EnvResult<()> {
    match file.allocate(offset, len) {
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
            static WARNED: std::sync::atomic::AtomicBool =
                std::sync::atomic::AtomicBool::new(false);
            if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!(path = %file.path().display(), "the file system has no fallocate: files grow by writing zeros");
            }
            if file.len()? < offset + len {
                file.set_len(offset + len)?;
            }
            write_zeros(file, offset, len)
        }
        r => r,
    }
}

/// `sync_file_range` flags for [`EnvFile::write_back`]: with `wait`,
/// `WAIT_BEFORE | WRITE | WAIT_AFTER` (the range is on the device when it returns); without,
/// `WRITE` (writeback started).
pub(crate) fn write_back_flags(wait: bool) -> u32 {
    if wait {
        libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER
    } else {
        libc::SYNC_FILE_RANGE_WRITE
    }
}

/// [`EnvFile::write_runs`]'s default: `FileIo` as one [`EnvFile::write_all_at`] per slice,
/// every other mode as one [`EnvFile::write_vectored_all_at`] per run.
pub(crate) fn write_runs_with_writes<F: EnvFile + ?Sized>(
    file: &F,
    runs: &[Run<'_>],
    mode: WriteMode,
) -> EnvResult<()> {
    for (offset, bufs) in runs {
        if mode == WriteMode::FileIo {
            let mut at = *offset;
            for b in bufs.iter() {
                file.write_all_at(b, at)?;
                at += b.len() as u64;
            }
        } else {
            write_vectored_chunks(file, bufs, *offset)?;
        }
    }
    Ok(())
}

/// Writes zeros over `offset..offset + len` of `file` with [`EnvFile::write_all_at`], 64 KiB
/// a call.
pub(crate) fn write_zeros<F: EnvFile + ?Sized>(file: &F, offset: u64, len: u64) -> EnvResult<()> {
    static ZEROS: [u8; 64 << 10] = [0u8; 64 << 10];
    let end = offset + len;
    let mut at = offset;
    // Bounded: advances by up to 64 KiB a turn until `end`.
    while at < end {
        let n = (end - at).min(ZEROS.len() as u64) as usize;
        file.write_all_at(&ZEROS[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

/// Every file-system operation the engine performs.
pub trait StorageEnv: Send + Sync + std::fmt::Debug + 'static {
    /// Opens a file read-write.
    fn open(&self, path: &Path, mode: OpenMode) -> EnvResult<Arc<dyn EnvFile>>;
    /// True when `path` exists (file or directory).
    fn exists(&self, path: &Path) -> bool;
    /// Creates a directory; `Ok` when it already exists.
    fn create_dir(&self, path: &Path) -> EnvResult<()>;
    /// `fsync` of a directory: makes its entries (creates, links, unlinks, renames) durable.
    fn sync_dir(&self, path: &Path) -> EnvResult<()>;
    /// The names in a directory (not `.` or `..`), in no particular order.
    fn list_dir(&self, path: &Path) -> EnvResult<Vec<String>>;
    /// A hard link `to` naming the file `from` names (`link(2)`); `EXDEV` across file systems.
    fn link(&self, from: &Path, to: &Path) -> EnvResult<()>;
    /// Renames `from` to `to`, replacing `to` atomically.
    fn rename(&self, from: &Path, to: &Path) -> EnvResult<()>;
    /// Removes a directory entry (`unlink`).
    fn remove_file(&self, path: &Path) -> EnvResult<()>;
    /// Removes a directory and everything in it.
    fn remove_dir_all(&self, path: &Path) -> EnvResult<()>;
    /// The environment a [`retry::RetryEnv`] wraps; `None` for every other environment (the
    /// default). Lets the engine wrap an environment once and see through the wrapper.
    #[doc(hidden)]
    fn retry_inner(&self) -> Option<&Arc<dyn StorageEnv>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::uring::UringConfig;

    #[test]
    fn setup_failures_fall_back_to_pwritev() {
        for code in [libc::EPERM, libc::ENOMEM, libc::ENOSYS] {
            let (_, b) = choose_env(false, || {
                UringEnv::with_config(UringConfig {
                    setup_error: Some(code),
                    ..UringConfig::default()
                })
            });
            assert!(!b.io_uring);
            assert!(
                b.reason
                    .contains(&io::Error::from_raw_os_error(code).to_string()),
                "{}",
                b.reason
            );
        }
        let (_, b) = choose_env(true, || panic!("not called when disabled"));
        assert_eq!(b.reason, "disabled by OMNIBUS_IO_URING=0");
        let (_, b) = choose_env(false, UringEnv::new);
        assert!(b.io_uring, "this kernel has io_uring: {}", b.reason);
    }
}

/// Slices per `pwritev` call (`IOV_MAX` on Linux).
pub(crate) const IOV_MAX_SLICES: usize = 1024;

/// The I/O path [`default_env`] chose for this process.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct IoBackend {
    /// True when journal batches and data-file writes go through io_uring lanes
    /// ([`UringEnv`]); false for the plain `pwritev` paths ([`DefaultEnv`]).
    pub io_uring: bool,
    /// Why: `"io_uring"`, `"disabled by OMNIBUS_IO_URING=0"` or `"io_uring unavailable: <error>"`.
    pub reason: String,
}

static DEFAULT_ENV: std::sync::OnceLock<(Arc<dyn StorageEnv>, IoBackend)> =
    std::sync::OnceLock::new();

/// The environment used when none is given, one per process: [`UringEnv`] (its critical and
/// background lanes serve every storage of the process) when io_uring can be set up, else
/// [`DefaultEnv`], with a `tracing` warning once. `OMNIBUS_IO_URING=0` (or `false`, `off`, `no`)
/// forces [`DefaultEnv`].
pub fn default_env() -> Arc<dyn StorageEnv> {
    default_choice().0.clone()
}

/// Which I/O path [`default_env`] uses, and why (printed by `omnibus stat`).
pub fn io_backend() -> IoBackend {
    default_choice().1.clone()
}

fn default_choice() -> &'static (Arc<dyn StorageEnv>, IoBackend) {
    DEFAULT_ENV.get_or_init(|| choose_env(io_uring_disabled_by_env(), UringEnv::new))
}

/// True when `OMNIBUS_IO_URING` is `0`, `false`, `off` or `no` (any case): no io_uring, for
/// the default environment and MultiGet's reads alike.
pub(crate) fn io_uring_disabled_by_env() -> bool {
    std::env::var("OMNIBUS_IO_URING").is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "0" | "false" | "off" | "no"
        )
    })
}

/// The choice of [`default_env`], with the ring's setup as a parameter (tests force failures).
fn choose_env(
    off: bool,
    setup: impl FnOnce() -> io::Result<UringEnv>,
) -> (Arc<dyn StorageEnv>, IoBackend) {
    let plain = |reason: String| -> (Arc<dyn StorageEnv>, IoBackend) {
        (
            Arc::new(DefaultEnv::new()),
            IoBackend {
                io_uring: false,
                reason,
            },
        )
    };
    if off {
        return plain("disabled by OMNIBUS_IO_URING=0".into());
    }
    match setup() {
        Ok(env) => (
            Arc::new(env),
            IoBackend {
                io_uring: true,
                reason: "io_uring".into(),
            },
        ),
        Err(e) => {
            tracing::warn!(error = %e, "io_uring unavailable; using the pwritev I/O path");
            plain(format!("io_uring unavailable: {e}"))
        }
    }
}

/// Sets the calling thread's CPU nice value to `nice` (-20 highest, 19 lowest) with
/// `setpriority(PRIO_PROCESS, gettid(), nice)` (on Linux a nice value belongs to a thread):
/// used for the residency refresh, background bookkeeping that must not take a CPU from the
/// application's threads. Raising the value needs no privilege; lowering it below the
/// current one needs `CAP_SYS_NICE` (or `RLIMIT_NICE`).
///
/// Errors: the OS error of `setpriority` (`EACCES` when lowering it is not allowed).
pub(crate) fn set_thread_nice(nice: i32) -> std::io::Result<()> {
    // SAFETY: gettid and setpriority take and return integers and touch no memory of ours.
    let r = unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, nice)
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `IOPRIO_CLASS_BE` (best effort), `IOPRIO_CLASS_SHIFT` and `IOPRIO_WHO_PROCESS` from
/// `linux/ioprio.h`.
const IOPRIO_CLASS_BE: i64 = 2;
const IOPRIO_CLASS_SHIFT: i64 = 13;
const IOPRIO_WHO_PROCESS: i64 = 1;

/// Sets the calling thread's I/O priority to best-effort level `level` (0 highest, 7 lowest)
/// with `ioprio_set(IOPRIO_WHO_PROCESS, 0, IOPRIO_PRIO_VALUE(IOPRIO_CLASS_BE, level))`: used for
/// flushes and journal-pool preparation, so they yield the disk to commits.
///
/// Errors: the OS error of `ioprio_set` (e.g. `EINVAL` for a level over 7).
pub(crate) fn set_thread_io_priority(level: i64) -> std::io::Result<()> {
    // SAFETY: ioprio_set takes three integers and touches no memory of ours; `who = 0` with
    // IOPRIO_WHO_PROCESS means the calling thread.
    let r = unsafe {
        libc::syscall(
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
            0,
            (IOPRIO_CLASS_BE << IOPRIO_CLASS_SHIFT) | level,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
