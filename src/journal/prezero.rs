//! Pre-zeroing of the journal tail (Dolt's trick): the file is written with zeros ahead of the
//! write position so a commit overwrites allocated, already synced blocks and its `fdatasync`
//! has no file-size or extent metadata to flush:
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
//!   inline as the fallback (counted in [`super::JournalStats::inline_zeroings`]; those zeros are
//!   covered by the batch's `fdatasync`). A rotation stops the claimed range after its chunk
//!   in flight, waits for it and resets the control for the new file; dropping the journal
//!   does the same and closes the control, so the thread never writes into a file after it is
//!   released, renamed into the pool, or the journal is gone.
//!
//! This module holds the batch writer's side (`Journal::ensure_zeroed`, called by every batch
//! with the `io` lock held), each journal's zeroing control (`ZeroCtl`: the zeroed end of the
//! current file and the range claimed) and the process's pre-zeroing service (`queue_zeroing`,
//! `run_zero_service`). Whole pre-zeroed files are the pool's (`pool.rs`).
//!
//! Failures: a failed background `fdatasync` poisons the journal (the next batch returns that
//! error; design.md invariant I2). A failed background zero *write* (or open) published nothing:
//! background zeroing stops for that file and commits zero inline, so the commit that needs the
//! room gets the error itself (ENOSPC on a full disk, as [`crate::Error::is_no_space`]).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};

use super::lock;
use super::record::BATCH_ALIGN;
use super::Io;
use super::Journal;
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

/// Writes zeros over `[from, to)` of `file` (nothing when `to <= from`).
pub(super) fn write_zeros(file: &dyn EnvFile, from: u64, to: u64) -> Result<()> {
    Ok(crate::env::write_zeros(
        file,
        from,
        to.saturating_sub(from),
    )?)
}

impl Journal {
    /// Makes sure `[pos, end)` is pre-zeroed before the batch writes it, and keeps zeros ahead:
    /// with [`Prezero::Ahead`] by asking the background for the next window (see the module
    /// doc), zeroing inline only when the background has not got far enough; with
    /// [`Prezero::WholeFile`] inline (a file shorter than a batch needs).
    pub(super) fn ensure_zeroed(&self, io: &mut Io, end: u64) -> Result<()> {
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
}

// ---- the zeroing control and the background service ([`Prezero::Ahead`]) ---------------------

/// Name of the process's pre-zeroing thread.
const PREZERO_THREAD: &str = "omnibus-prezero";

/// Bytes the background zeroes and `fdatasync`s at a time, publishing each synced chunk: a
/// batch's `fdatasync` that runs meanwhile also writes back the file's dirty zeros (and commits
/// their block allocation), so few dirty zeros at a time keep that cost small for the commits
/// that overlap, and each chunk is usable as soon as it is synced.
const ZERO_CHUNK: u64 = 256 << 10;

/// Most journals queued for the pre-zeroing thread at once (design.md invariant I10). Each journal
/// is queued at most once; a request that finds the queue full is queued again by its writer's
/// next batch, and a writer that catches up meanwhile zeroes inline.
const MAX_ZERO_QUEUE: usize = 4096;

/// One journal's zeroed end and its background pre-zeroing: shared (as `Arc`, queued as `Weak`)
/// with the pre-zeroing thread. Its own lock, never the `io` lock held during batches: the
/// thread takes no other lock of the journal.
pub(super) struct ZeroCtl {
    /// The environment the thread opens the journal file through (its own descriptor).
    env: Arc<dyn StorageEnv>,
    /// Bytes zeroed per background request (the [`Prezero::Ahead`] window, 4 KiB-aligned;
    /// 0 for the other modes, which never request).
    pub(super) window: u64,
    /// The background zeroes no further than this (bytes: the configured journal file size).
    cap: u64,
    pub(super) state: Mutex<ZeroState>,
    /// Signalled whenever `busy` is cleared.
    cv: Condvar,
    /// Bytes of zeros the background wrote and synced for this journal.
    pub(super) bytes: AtomicU64,
    /// `fdatasync` calls the background made for this journal.
    pub(super) fdatasyncs: AtomicU64,
}

/// The part of a [`ZeroCtl`] under its lock.
#[derive(Default)]
pub(super) struct ZeroState {
    /// The current journal file (the background opens it again by this path).
    path: PathBuf,
    /// Bytes `[0, zeroed_end)` of the current file are records or zeros and allocated; the
    /// writer writes only below it. The background publishes a chunk only after its
    /// `fdatasync`; the writer's inline fallback zeros are synced by that batch's `fdatasync`.
    pub(super) zeroed_end: u64,
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
    pub(super) failed: Option<Error>,
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
    /// The control of a new journal: no file yet, nothing zeroed.
    pub(super) fn new(env: Arc<dyn StorageEnv>, prezero: Prezero, file_size: u64) -> ZeroCtl {
        ZeroCtl {
            env,
            // A window is at most one journal file (a larger one would zero every file that far).
            window: match prezero {
                Prezero::Ahead(a) => {
                    a.min(file_size).max(BATCH_ALIGN).div_ceil(BATCH_ALIGN) * BATCH_ALIGN
                }
                Prezero::WholeFile | Prezero::Off => 0,
            },
            cap: file_size,
            state: Mutex::new(ZeroState::default()),
            cv: Condvar::new(),
            bytes: AtomicU64::new(0),
            fdatasyncs: AtomicU64::new(0),
        }
    }

    /// Waits until no range is claimed. Bounded: the background stops after the chunk in
    /// flight once `stop` or `closed` is set (and a range is at most one window).
    fn wait_idle<'a>(&'a self, mut st: MutexGuard<'a, ZeroState>) -> MutexGuard<'a, ZeroState> {
        while st.busy.is_some() {
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st
    }

    /// Before a rotation: the background may be zeroing the current file; lets it finish, and
    /// no new range starts until [`ZeroCtl::start_file`] names the new file (only the writer,
    /// which is rotating, requests one).
    pub(super) fn pause(&self) {
        let mut st = lock(&self.state);
        st.requested = false;
        st.stop = true;
        let mut st = self.wait_idle(st);
        st.stop = false;
    }

    /// Makes `path` the current file, zeroed (and synced) up to `zeroed`.
    pub(super) fn start_file(&self, path: PathBuf, zeroed: u64) {
        let mut st = lock(&self.state);
        st.path = path;
        st.zeroed_end = zeroed;
        st.requested = false;
        st.off = false;
    }

    /// When the journal is dropped: no background zeroing of its file after this; waits out a
    /// range in flight.
    pub(super) fn close(&self) {
        let mut st = lock(&self.state);
        st.closed = true;
        st.requested = false;
        drop(self.wait_idle(st));
    }

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
