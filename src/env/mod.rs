//! Storage environments: every file operation of the engine goes through [`StorageEnv`]
//! (as RocksDB's `Env`/`FileSystem`), the `LOCK` file's `flock` aside.
//!
//! Implementations:
//! - [`DefaultEnv`]: the real file system through `pread` / `pwrite` / `pwritev` / `fdatasync` /
//!   `fallocate` / `link` / directory `fsync`.
//! - [`testing`]: wrappers for tests: power loss ([`testing::PowerLossEnv`]), fault injection
//!   ([`testing::HookedEnv`]) and the ordered list of durable operations
//!   ([`testing::RecordingEnv`]).
//!
//! Files are opened read-write and shared as `Arc<dyn EnvFile>`; every method takes `&self` and
//! positions explicitly (no seek pointer), so one handle serves several threads.

use std::io::{self, IoSlice};
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod default;
pub mod executor_guard;
pub mod testing;

pub use default::DefaultEnv;
pub use executor_guard::{mark_executor_thread, on_executor};

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
    /// Open it, creating an empty file when it is missing.
    Create,
    /// Create it; fail with `EEXIST` when it exists.
    CreateNew,
}

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
}

/// Slices per `pwritev` call (`IOV_MAX` on Linux).
pub const IOV_MAX_SLICES: usize = 1024;

/// The environment used when none is given: [`DefaultEnv`].
pub fn default_env() -> Arc<dyn StorageEnv> {
    Arc::new(DefaultEnv::new())
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
pub fn set_thread_io_priority(level: i64) -> std::io::Result<()> {
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
