//! The io_uring storage environment: journal batches through a ring of the thread that writes
//! them (one per writing thread), everything else through one global ring per *lane*, each owned
//! by one dedicated thread (RavenDB Voron 7.1's global ring: one ring per lane for all files,
//! rather than one per file, so the kernel's io-wq workers are shared).
//!
//! - The **critical lane** carries the journal: a batch on the [`JournalIo::Ring`] path is one
//!   `IORING_OP_WRITEV` linked (`IOSQE_IO_LINK`) to one `IORING_OP_FSYNC` with
//!   `IORING_FSYNC_DATASYNC` (on [`JournalIo::Syscalls`], `pwritev` and `fdatasync` on the
//!   writing thread, no ring; `crate::journal_io` chooses), and the journal files' other
//!   syncs. These run on a ring owned by the thread that writes the batch (the shared
//!   journal's writer thread, a thread of the actor runtime's journal I/O pool for a separate
//!   journal, or a standalone storage's group-commit leader: one ring per thread, created on
//!   first use), which submits and waits itself: a hand-off to a lane thread cost two thread
//!   wake-ups each way (`Lane::call_inline`, docs/BENCHMARKS.md). The lane's own thread
//!   (`omnibus-ring-critical`) serves the journal files' rare other requests (`fallocate`).
//! - The **background lane** (`omnibus-ring-background`, its thread at
//!   `ioprio_set(IOPRIO_CLASS_BE, 7)` and each write SQE carrying that priority) carries the
//!   data files: flush writes, header writes, `fallocate` (growth and `PUNCH_HOLE`),
//!   `sync_file_range` and `fdatasync`.
//!
//! A file's lane follows its role, which the storage layout (design.md 1) gives by name: files
//! ending in `.journal` or `.zeroed` are journal files (critical lane; their plain writes, the
//! pre-zeroing's, stay on the writing thread), every other file is a data file (background lane).
//! Reads, `ftruncate` and `fstat` run on the caller's thread through the [`DefaultEnv`] file the
//! [`UringFile`] wraps.
//!
//! "Lane" means these two and nothing else: the actor runtime's thread pools for blocking calls
//! are its *I/O pools* (`actors/io_pool.rs`: the journal I/O pool, `omnibus-journal-io-N`, and
//! the background I/O pool, `omnibus-flush-io-N`), and the shared journal's writer thread
//! (`omnibus-journal-writer`) is the *journal writer*; a job of either may write through a lane.
//!
//! # How a lane works
//! Callers build a request (file descriptor, offset, the `iovec`s of their buffers, what to do),
//! push it on the lane's bounded queue ([`LANE_QUEUE`] requests: a full queue makes the caller
//! wait, back-pressure), write the lane's `eventfd`, and block until the lane answers. The ring
//! always holds one `IORING_OP_READ` of that eventfd, so the thread sleeps in one place,
//! `io_uring_enter`, and wakes for a completion or a new request alike. Requests start in
//! arrival order; at most [`RING_ENTRIES`] SQEs are in flight, so the completion queue (twice
//! as large) can never overflow; the rest wait in order in the thread's backlog.
//!
//! # Every result handled
//! An operation runs in *rounds*: a round submits the SQEs still needed (the unwritten rest,
//! the sync) and the thread decides what comes next once every CQE of the round is back.
//! - A short write (`0 < res < len`) advances and resubmits the rest at `offset + res`; the
//!   kernel cancels a sync linked behind a short write (`-ECANCELED`), and a sync counts only
//!   when the whole write of its round completed, so it is redone after the rest.
//! - `-ECANCELED` on a write: the write is redone with plain `pwritev` on the ring thread, then
//!   the sync is redone (counted in [`LaneStats::plain_redos`]). `-ECANCELED` on a sync: the
//!   sync is redone (it never ran).
//! - `-EAGAIN` and `-EINTR` in a CQE: the round is resubmitted, at most [`MAX_RETRIES`] times per
//!   operation, then the operation fails with that error (never a busy loop).
//! - `EINTR` from `io_uring_enter` itself (a signal): retried; a signal storm never fails a commit.
//! - `EBUSY` from `io_uring_enter` (completions not reaped yet): reap, then enter again.
//! - A full submission queue: submit, then push the rest; linked pairs are pushed together.
//! - Any other error of a write, `fallocate` or `sync_file_range` is the operation's error; a
//!   failed sync is the operation's error and is **never** retried into success (fsyncgate,
//!   design.md invariant I2): the journal poisons itself on it as on any failed sync.
//! - The ring thread dying (a panic): the thread first waits for every SQE still in the kernel
//!   (their buffers belong to callers that are blocked until then), then every waiter, queued
//!   or in flight, gets an error and later calls fail at once; the journal then poisons the
//!   database. Never a hang.
//!
//! # Fallback
//! [`crate::env::default_env`] uses this environment when `io_uring_setup` succeeds and the
//! kernel supports every opcode used; otherwise (ENOSYS on old kernels, EPERM under seccomp or
//! in containers, ENOMEM under a low `ulimit -l`) it uses [`DefaultEnv`]'s `pwritev` paths, says
//! so once (a `tracing` warning) and reports why in [`crate::env::io_backend`].
//! `OMNIBUS_IO_URING=0` forces the fallback.
//!
//! # Fault injection
//! [`RingFaults`] makes a lane's thread alter what it submits or what the kernel answered
//! (short writes, errnos, a panic of the thread) and [`UringConfig::setup_error`] makes setup
//! fail, so each case above is tested (`tests/alone/ring_faults.rs`).
//!
//! # Files
//! This file holds the environment ([`UringEnv`], [`UringFile`]: which lane each file operation
//! takes), the lanes' public types and limits; `uring/` the rest, by concern: `request.rs`
//! (what a caller hands a lane, where it waits for the answer), `lane.rs` (the lanes' threads
//! and the calling threads' own rings), `ring.rs` (a ring's setup, probe, event loop and state),
//! `rounds.rs` (an operation's rounds: every completion handled), `faults.rs` (the fault hooks)
//! and `tests.rs`.

use std::io::{self, IoSlice};
use std::os::fd::RawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::{DefaultEnv, EnvError, EnvFile, EnvResult, JournalIo, OpenMode, StorageEnv};

// The lanes' machinery, by concern (`uring/`): the requests and their answers, the lanes'
// threads and the calling threads' own rings, a ring's event loop, an operation's rounds, and
// the fault hooks.
mod faults;
mod lane;
mod request;
mod ring;
mod rounds;
#[cfg(test)]
mod tests;

pub use faults::RingFaults;
// For `env::testing` (and the tests): the lanes use them through `faults` directly.
#[cfg(any(test, feature = "testing"))]
pub use faults::{RingFault, RingFaultRule, RingOp};
use lane::Lane;
use request::{Work, IOVECS};

/// Submission queue entries of each ring (the completion queue has twice as many); also the
/// most SQEs a lane keeps in flight.
pub const RING_ENTRIES: u32 = 256;
/// Requests waiting in front of a lane at most (its bounded queue).
pub const LANE_QUEUE: usize = 1024;
/// Resubmissions of one operation after `-EAGAIN`, `-EINTR` or a cancelled round (never for
/// progress: a round that wrote bytes does not count) before it fails.
pub const MAX_RETRIES: u32 = 16;

/// `IOPRIO_PRIO_VALUE(IOPRIO_CLASS_BE, 7)` (`linux/ioprio.h`): the background lane's writes.
const BACKGROUND_IOPRIO: u16 = (2 << 13) | 7;
/// The eventfd read's `user_data`.
const WAKE: u64 = u64::MAX;

/// Which lane a request goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaneKind {
    /// Journal batches and journal syncs, at normal I/O priority.
    Critical,
    /// Data-file writes, syncs, `fallocate` and `sync_file_range`, at I/O priority BE 7.
    Background,
}

/// Counters of one lane, since it started. Each is a count of events.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(not(any(test, feature = "testing")), allow(dead_code))] // read by tests only
#[non_exhaustive]
pub struct LaneStats {
    /// Operations answered (successfully or not).
    pub ops: u64,
    /// SQEs submitted (a linked write + sync is two).
    pub sqes: u64,
    /// Writes the kernel completed short, whose rest was resubmitted.
    pub short_writes: u64,
    /// Syncs redone because they were cancelled (`-ECANCELED`, e.g. linked behind a short write).
    pub syncs_redone: u64,
    /// Writes redone with plain `pwritev` after `-ECANCELED`.
    pub plain_redos: u64,
    /// Rounds resubmitted after `-EAGAIN` or `-EINTR` in a CQE.
    pub retries: u64,
    /// `io_uring_enter` calls interrupted by a signal (`EINTR`) and retried.
    pub enter_interrupted: u64,
    /// Times a request waited for room in the submission queue or the in-flight limit.
    pub sq_full: u64,
    /// `io_uring_enter` calls (submissions and waits; a lane's thread also enters to sleep).
    pub enters: u64,
}

/// How [`UringEnv::with_config`] builds its lanes.
#[derive(Debug, Clone)]
pub struct UringConfig {
    /// Submission queue entries per ring (rounded up to a power of two by the kernel); at
    /// least 2 (a linked write + sync). Default 256 (`RING_ENTRIES`).
    pub entries: u32,
    /// Faults both lanes inject (tests).
    pub faults: Option<Arc<RingFaults>>,
    /// Make setup fail with this errno, as `io_uring_setup` does under seccomp (`EPERM`) or a
    /// low `ulimit -l` (`ENOMEM`) (tests of the fallback).
    pub setup_error: Option<i32>,
}

impl Default for UringConfig {
    fn default() -> UringConfig {
        UringConfig {
            entries: RING_ENTRIES,
            faults: None,
            setup_error: None,
        }
    }
}

/// Fills `out` with the iovecs of `bufs` (empty slices left out); returns their bytes.
fn iovecs(bufs: &[IoSlice<'_>], out: &mut Vec<libc::iovec>) -> u64 {
    out.clear();
    out.extend(bufs.iter().filter(|b| !b.is_empty()).map(|b| libc::iovec {
        iov_base: b.as_ptr() as *mut libc::c_void,
        iov_len: b.len(),
    }));
    out.iter().map(|v| v.iov_len as u64).sum()
}

/// The two lanes of one [`UringEnv`], its id (for the threads' inline rings) and config.
struct Lanes {
    id: u64,
    cfg: UringConfig,
    critical: Lane,
    background: Lane,
}

/// The io_uring storage environment: [`DefaultEnv`] for namespace operations, reads and
/// lengths; the critical and background rings (module docs) for journal batches and data-file
/// writes, syncs and allocation. Clones share the lanes.
#[derive(Clone)]
pub struct UringEnv {
    inner: DefaultEnv,
    lanes: Arc<Lanes>,
}

impl std::fmt::Debug for UringEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringEnv").finish_non_exhaustive()
    }
}

impl UringEnv {
    /// Sets up both rings (256 submission queue entries each) and starts their threads.
    ///
    /// Errors: `io_uring_setup`'s (ENOSYS without io_uring, EPERM under seccomp or a
    /// container's policy, ENOMEM under a low `ulimit -l`), `Unsupported` when the kernel lacks
    /// an opcode used, or a failure to create the eventfd or spawn a thread.
    pub fn new() -> io::Result<UringEnv> {
        UringEnv::start(UringConfig::default())
    }

    /// As [`UringEnv::new`] with `cfg` (ring size, injected faults, a forced setup error).
    /// Only with the cargo feature `testing` (tests of the lanes).
    ///
    /// Errors: as [`UringEnv::new`]; `cfg.setup_error` when set.
    #[cfg(any(test, feature = "testing"))]
    pub fn with_config(cfg: UringConfig) -> io::Result<UringEnv> {
        UringEnv::start(cfg)
    }

    /// Sets up both rings as `cfg` says and starts their threads ([`UringEnv::new`]).
    fn start(cfg: UringConfig) -> io::Result<UringEnv> {
        Ok(UringEnv {
            inner: DefaultEnv::new(),
            lanes: Arc::new(Lanes {
                id: {
                    static NEXT: AtomicU64 = AtomicU64::new(1);
                    NEXT.fetch_add(1, Ordering::Relaxed)
                },
                critical: Lane::start(LaneKind::Critical, &cfg)?,
                background: Lane::start(LaneKind::Background, &cfg)?,
                cfg,
            }),
        })
    }

    /// The counters of one lane. Only with the cargo feature `testing`.
    #[cfg(any(test, feature = "testing"))]
    pub fn lane_stats(&self, lane: LaneKind) -> LaneStats {
        match lane {
            LaneKind::Critical => self.lanes.critical.stats(),
            LaneKind::Background => self.lanes.background.stats(),
        }
    }
}

impl StorageEnv for UringEnv {
    fn open(&self, path: &Path, mode: OpenMode) -> EnvResult<Arc<dyn EnvFile>> {
        let inner = self.inner.open(path, mode)?;
        let journal = matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("journal") | Some("zeroed")
        );
        Ok(Arc::new(UringFile {
            inner,
            lanes: self.lanes.clone(),
            journal,
        }))
    }
    fn exists(&self, path: &Path) -> bool {
        self.inner.exists(path)
    }
    fn create_dir(&self, path: &Path) -> EnvResult<()> {
        self.inner.create_dir(path)
    }
    fn sync_dir(&self, path: &Path) -> EnvResult<()> {
        self.inner.sync_dir(path)
    }
    fn list_dir(&self, path: &Path) -> EnvResult<Vec<String>> {
        self.inner.list_dir(path)
    }
    fn link(&self, from: &Path, to: &Path) -> EnvResult<()> {
        self.inner.link(from, to)
    }
    fn rename(&self, from: &Path, to: &Path) -> EnvResult<()> {
        self.inner.rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> EnvResult<()> {
        self.inner.remove_file(path)
    }
    fn remove_dir_all(&self, path: &Path) -> EnvResult<()> {
        self.inner.remove_dir_all(path)
    }
}

/// A file of a [`UringEnv`]: a [`DefaultEnv`] file whose writes, syncs and allocations go
/// through the lane of its role (module docs).
pub struct UringFile {
    inner: Arc<dyn EnvFile>,
    lanes: Arc<Lanes>,
    journal: bool,
}

impl std::fmt::Debug for UringFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringFile")
            .field("path", &self.inner.path())
            .field("journal", &self.journal)
            .finish()
    }
}

impl UringFile {
    fn lane(&self) -> &Lane {
        if self.journal {
            &self.lanes.critical
        } else {
            &self.lanes.background
        }
    }

    fn call(&self, lane: &Lane, offset: u64, work: Work) -> EnvResult<()> {
        super::executor_guard::check_blocking("io_uring (lane)", self.inner.path());
        debug_assert!(
            lane.kind == LaneKind::Critical || !self.journal,
            "journal file on the background lane"
        );
        lane.call(self.inner.raw_fd(), offset, work)
            .map_err(|(op, e)| EnvError::new(op, self.inner.path(), e))
    }

    /// A critical-lane operation on the calling thread's own ring (`Lane::call_inline`).
    fn inline(&self, offset: u64, work: Work) -> EnvResult<()> {
        super::executor_guard::check_blocking("io_uring (inline ring)", self.inner.path());
        self.lanes
            .critical
            .call_inline(&self.lanes, self.inner.raw_fd(), offset, work)
            .map_err(|(op, e)| EnvError::new(op, self.inner.path(), e))
    }

    fn write(&self, bufs: &[IoSlice<'_>], offset: u64, sync: bool, lane: &Lane) -> EnvResult<()> {
        // The calling thread's iovec buffer, reused (no allocation per write); it lives until
        // the lane answered.
        IOVECS.with(|cell| {
            let mut iov = cell.borrow_mut();
            let total = iovecs(bufs, &mut iov);
            if total == 0 {
                return if sync {
                    self.call(lane, 0, Work::Sync)
                } else {
                    Ok(())
                };
            }
            let work = Work::Write {
                iov: iov.as_ptr(),
                n: iov.len(),
                total,
                sync,
            };
            if lane.kind == LaneKind::Critical {
                self.inline(offset, work)
            } else {
                self.call(lane, offset, work)
            }
        })
    }
}

impl EnvFile for UringFile {
    fn path(&self) -> &Path {
        self.inner.path()
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> EnvResult<()> {
        self.inner.read_exact_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> EnvResult<()> {
        self.inner.write_all_at(buf, offset)
    }
    fn write_vectored_all_at(&self, bufs: &[IoSlice<'_>], offset: u64) -> EnvResult<()> {
        self.inner.write_vectored_all_at(bufs, offset)
    }
    fn write_runs(&self, runs: &[super::Run<'_>], mode: super::WriteMode) -> EnvResult<()> {
        if mode != super::WriteMode::IoRing {
            return self.inner.write_runs(runs, mode);
        }
        // Every run's iovecs in the thread's buffer first (it must not grow once requests
        // point into it), then one request per run, all in the ring at once.
        IOVECS.with(|cell| {
            let mut iov = cell.borrow_mut();
            iov.clear();
            let mut spans = Vec::with_capacity(runs.len());
            for (offset, bufs) in runs {
                let start = iov.len();
                let mut total = 0u64;
                for b in bufs.iter().filter(|b| !b.is_empty()) {
                    iov.push(libc::iovec {
                        iov_base: b.as_ptr() as *mut libc::c_void,
                        iov_len: b.len(),
                    });
                    total += b.len() as u64;
                }
                if total > 0 {
                    spans.push((*offset, start, iov.len() - start, total));
                }
            }
            super::executor_guard::check_blocking("io_uring writev (io_ring)", self.inner.path());
            let fd = self.inner.raw_fd();
            let base = iov.as_ptr();
            let works = spans.into_iter().map(|(offset, start, n, total)| {
                let work = Work::Write {
                    // In bounds: `start + n <= iov.len()`.
                    iov: base.wrapping_add(start),
                    n,
                    total,
                    sync: false,
                };
                (fd, offset, work)
            });
            self.lanes
                .background
                .call_many(works)
                .map_err(|(op, e)| EnvError::new(op, self.inner.path(), e))
        })
    }
    fn write_vectored_and_sync(
        &self,
        bufs: &[IoSlice<'_>],
        offset: u64,
        io: JournalIo,
    ) -> EnvResult<()> {
        match io {
            JournalIo::Ring => self.write(bufs, offset, true, self.lane()),
            // `pwritev` and `fdatasync` on this thread: no ring, no io-wq worker.
            JournalIo::Syscalls | JournalIo::Auto => {
                self.inner.write_vectored_and_sync(bufs, offset, io)
            }
        }
    }
    fn sync_data(&self) -> EnvResult<()> {
        if self.journal {
            return self.inline(0, Work::Sync);
        }
        self.call(self.lane(), 0, Work::Sync)
    }
    fn allocate(&self, offset: u64, len: u64) -> EnvResult<()> {
        self.call(self.lane(), offset, Work::Fallocate { mode: 0, len })
    }
    fn punch_hole(&self, offset: u64, len: u64) -> EnvResult<()> {
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        self.call(self.lane(), offset, Work::Fallocate { mode, len })
            .map_err(|mut e| {
                e.op = "fallocate(PUNCH_HOLE)";
                e
            })
    }
    fn write_back(&self, offset: u64, len: u64, wait: bool) -> EnvResult<()> {
        let flags = super::write_back_flags(wait);
        // Bounded: one request per 2 GiB piece (the SQE's length is 32 bits).
        let mut at = offset;
        let end = offset + len;
        while at < end {
            let n = (end - at).min(1 << 31);
            let work = Work::SyncRange {
                len: n as u32,
                flags,
            };
            self.call(self.lane(), at, work)?;
            at += n;
        }
        Ok(())
    }
    fn set_len(&self, len: u64) -> EnvResult<()> {
        self.inner.set_len(len)
    }
    fn len(&self) -> EnvResult<u64> {
        self.inner.len()
    }
    fn allocated_bytes(&self) -> EnvResult<u64> {
        self.inner.allocated_bytes()
    }
    fn raw_fd(&self) -> RawFd {
        self.inner.raw_fd()
    }
    fn write_zeros_uncached(&self, offset: u64, len: u64) -> EnvResult<()> {
        self.inner.write_zeros_uncached(offset, len)
    }
}
