//! The io_uring storage environment: journal batches through a ring of the thread that writes
//! them (one per writing thread), everything else through one global ring per *lane*, each owned
//! by one dedicated thread (RavenDB Voron 7.1's global ring: one ring per lane for all files,
//! rather than one per file, so the kernel's io-wq workers are shared).
//!
//! - The **critical lane** carries the journal: a batch is one `IORING_OP_WRITEV` linked
//!   (`IOSQE_IO_LINK`) to one `IORING_OP_FSYNC` with `IORING_FSYNC_DATASYNC`, and the journal
//!   files' other syncs. These run on a ring owned by the thread that writes the batch (the
//!   shared journal's writer thread, a separate journal's lane thread, or a standalone
//!   storage's group-commit leader: one ring per thread, created on first use), which submits
//!   and waits itself: a hand-off to a lane thread cost two thread wake-ups each way
//!   (`Lane::call_inline`, docs/BENCHMARKS.md). The lane's own thread
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
//! fail, so each case above is tested (`tests/ring_faults.rs`).

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use io_uring::{opcode, squeue, types, IoUring};

use super::{DefaultEnv, EnvError, EnvFile, EnvResult, OpenMode, StorageEnv, IOV_MAX_SLICES};

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
}

/// What a [`RingFault`] applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingOp {
    /// `IORING_OP_WRITEV`.
    Write,
    /// `IORING_OP_FSYNC` (datasync).
    Sync,
    /// `IORING_OP_FALLOCATE`.
    Fallocate,
    /// `IORING_OP_SYNC_FILE_RANGE`.
    SyncRange,
}

/// A fault a lane's thread injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(any(test, feature = "testing")), allow(dead_code))] // read by tests only
pub enum RingFault {
    /// Submit only half of the write's remaining bytes (the kernel then really writes half) and
    /// report the sync linked behind it as `-ECANCELED`, as the kernel does after a short
    /// linked write.
    ShortWrite,
    /// Report this errno as the CQE's result (the operation itself ran: redoing it is what the
    /// engine must do for `EAGAIN`/`ECANCELED`, and what it must never do for a sync's `EIO`).
    Errno(i32),
    /// Panic on the lane's thread before submitting the operation (the thread dies).
    Panic,
}

/// One injection rule: the `skip + 1`-th matching operation and the `times - 1` after it
/// (`times == u32::MAX`: every one) get `fault`.
#[derive(Debug, Clone, Copy)]
pub struct RingFaultRule {
    /// The lane it applies to (`None`: both).
    pub lane: Option<LaneKind>,
    /// The operation kind it applies to.
    pub op: RingOp,
    /// The fault.
    pub fault: RingFault,
    /// Matching operations passed over first.
    pub skip: u32,
    /// Matching operations faulted after that (`u32::MAX`: all).
    pub times: u32,
}

/// Faults a lane injects, shared with the test that set them. Submissions and completions
/// consult the rules in order; the first rule that matches and has faults left applies.
#[derive(Debug, Default)]
pub struct RingFaults {
    rules: Mutex<Vec<RingFaultRule>>,
    injected: AtomicU64,
}

#[cfg_attr(not(any(test, feature = "testing")), allow(dead_code))] // read by tests only
impl RingFaults {
    /// No rules yet.
    pub fn new() -> Arc<RingFaults> {
        Arc::new(RingFaults::default())
    }

    /// Adds a rule.
    pub fn add(&self, rule: RingFaultRule) {
        self.rules
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(rule);
    }

    /// Removes every rule.
    pub fn clear(&self) {
        self.rules.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Faults injected so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    /// The fault for the next operation of kind `op`, consuming one use of the rule.
    fn take(&self, lane: LaneKind, op: RingOp, at_submit: bool) -> Option<RingFault> {
        let mut rules = self.rules.lock().unwrap_or_else(|e| e.into_inner());
        for r in rules.iter_mut() {
            let submit_kind = matches!(r.fault, RingFault::ShortWrite | RingFault::Panic);
            if r.op != op
                || r.lane.is_some_and(|l| l != lane)
                || submit_kind != at_submit
                || r.times == 0
            {
                continue;
            }
            if r.skip > 0 {
                r.skip -= 1;
                return None;
            }
            if r.times != u32::MAX {
                r.times -= 1;
            }
            self.injected.fetch_add(1, Ordering::Relaxed);
            return Some(r.fault);
        }
        None
    }
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

/// The error a lane answers with: the operation (as the io_uring opcode or plain call) and the
/// OS error; the file turns it into an [`EnvError`] with its path.
type LaneResult = Result<(), (&'static str, io::Error)>;

/// What a request asks the ring to do.
enum Work {
    /// Write `iov` (the caller's buffers, back to back) at the offset; with `sync`, then make
    /// it durable (`fdatasync`).
    Write {
        iov: *const libc::iovec,
        n: usize,
        total: u64,
        sync: bool,
    },
    /// `fdatasync`.
    Sync,
    /// `fallocate(mode, offset, len)`.
    Fallocate { mode: i32, len: u64 },
    /// `sync_file_range(offset, len, flags)`.
    SyncRange { len: u32, flags: u32 },
}

/// One operation handed to a lane.
struct Request {
    fd: RawFd,
    offset: u64,
    work: Work,
    reply: Reply,
}

impl Work {
    /// The iovecs of a write (empty for other work).
    fn iov(&self) -> &[libc::iovec] {
        match self {
            // SAFETY: `iov..iov + n` is the caller's iovec array, alive while it waits for
            // this request (see `Request`'s Send note).
            Work::Write { iov, n, .. } => unsafe { std::slice::from_raw_parts(*iov, *n) },
            _ => &[],
        }
    }
}

/// Where a caller waits for its answer: one per thread, reused by every call of that thread
/// (no allocation per operation).
#[derive(Default)]
struct ReplySlot {
    state: Mutex<SlotState>,
    ready: std::sync::Condvar,
}

/// Answers still due to the caller, and the first error among those received.
#[derive(Default)]
struct SlotState {
    pending: usize,
    first_error: Option<(&'static str, io::Error)>,
}

thread_local! {
    static REPLY_SLOT: Arc<ReplySlot> = Arc::new(ReplySlot::default());
    static IOVECS: std::cell::RefCell<Vec<libc::iovec>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The lane's side of a [`ReplySlot`]: answers once; dropped unanswered (the lane's thread died,
/// the queue was dropped) it answers "lane gone", so no caller waits forever.
struct Reply {
    slot: Arc<ReplySlot>,
    sent: bool,
}

impl Reply {
    fn send(mut self, r: LaneResult) {
        self.put(r);
    }

    fn put(&mut self, r: LaneResult) {
        let mut g = self.slot.state.lock().unwrap_or_else(|e| e.into_inner());
        g.pending = g.pending.saturating_sub(1);
        if let Err(e) = r {
            g.first_error.get_or_insert(e);
        }
        if g.pending == 0 {
            self.slot.ready.notify_one();
        }
        self.sent = true;
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        if !self.sent {
            self.put(Err(closed()));
        }
    }
}

// SAFETY: the raw pointers in `Work::Write::iov` point into buffers of the caller, which blocks
// in `Lane::call` until the lane answered this request, and the lane answers only after the
// kernel completed every SQE reading them (or, when its thread dies, after it reaped every SQE
// still in flight). The lane thread only passes them to the kernel and to `pwritev`.
unsafe impl Send for Request {}

/// An operation in flight on the lane's thread.
struct Active {
    req: Request,
    /// Bytes of a write completed so far.
    done: u64,
    /// The sync of this operation completed successfully after the whole write.
    synced: bool,
    retries: u32,
    /// The current round: SQEs not yet completed, and what the completed ones returned.
    outstanding: u8,
    write_res: Option<i32>,
    sync_res: Option<i32>,
    /// The bytes this round's write was asked to write.
    round_len: u64,
    /// The iovecs of this round's write (kept alive while in flight).
    round_iov: Vec<libc::iovec>,
    /// The fault shim shortened this round's write: report its linked sync as cancelled.
    shortened: bool,
}

/// A lane: its queue, its thread, its counters.
struct Lane {
    kind: LaneKind,
    tx: Mutex<Option<flume::Sender<Request>>>,
    wake: Arc<OwnedFd>,
    shared: Arc<LaneShared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

#[derive(Default)]
struct LaneShared {
    dead: AtomicBool,
    ops: AtomicU64,
    sqes: AtomicU64,
    short_writes: AtomicU64,
    syncs_redone: AtomicU64,
    plain_redos: AtomicU64,
    retries: AtomicU64,
    enter_interrupted: AtomicU64,
    sq_full: AtomicU64,
}

fn wake_fd(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to an eventfd we own; an eventfd write only fails
    // when its counter would overflow, and the counter is reset by every read of the lane.
    let _ = unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

fn closed() -> (&'static str, io::Error) {
    (
        "io_uring lane",
        io::Error::new(
            io::ErrorKind::BrokenPipe,
            "the io_uring lane's thread is gone (it panicked or the environment was dropped)",
        ),
    )
}

impl Lane {
    fn start(kind: LaneKind, cfg: &UringConfig) -> io::Result<Lane> {
        if let Some(code) = cfg.setup_error {
            return Err(io::Error::from_raw_os_error(code));
        }
        let (tx, rx) = flume::bounded::<Request>(LANE_QUEUE);
        let shared = Arc::new(LaneShared::default());
        let name = match kind {
            LaneKind::Critical => "omnibus-ring-critical",
            LaneKind::Background => "omnibus-ring-background",
        };
        let mut thread = RingThread::new(kind, cfg, shared.clone(), rx)?;
        let wake = thread.wake.clone();
        let handle = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                // Process-directed signals (SIGTERM, SIGINT...) belong to the application's
                // threads, not to a lane started before it set up its handling (a thread that
                // does not block them may receive them and die with the default action).
                // Regression: `omnibus bench shop`'s SIGTERM cleanup lost to the lanes.
                block_signals();
                if kind == LaneKind::Background {
                    if let Err(e) = super::set_thread_io_priority(7) {
                        tracing::warn!(error = %e, "ioprio_set failed; the background ring runs at normal I/O priority");
                    }
                }
                thread.run_guarded();
            })?;
        Ok(Lane {
            kind,
            tx: Mutex::new(Some(tx)),
            wake,
            shared,
            thread: Mutex::new(Some(handle)),
        })
    }

    /// Runs one request on the calling thread's own ring of this lane (created on first use,
    /// one per thread and environment): the caller submits and waits in `io_uring_enter`
    /// itself, with the same rounds and fault handling as the lane's thread, and no hand-off.
    /// The critical lane's journal batches go this way: the journal writer's thread (or the
    /// group-commit leader) is the one thread that owns the ring it writes through. Measured
    /// here: a hand-off to the lane's thread cost about 90 µs per serial commit (two thread
    /// wake-ups each way on a 2-core VM); driving the ring inline costs what pwritev +
    /// fdatasync costs (docs/BENCHMARKS.md).
    fn call_inline(&self, env: &Lanes, fd: RawFd, offset: u64, work: Work) -> LaneResult {
        if self.shared.dead.load(Ordering::Acquire) {
            return Err(closed());
        }
        let slot = REPLY_SLOT.with(Arc::clone);
        *slot.state.lock().unwrap_or_else(|e| e.into_inner()) = SlotState {
            pending: 1,
            first_error: None,
        };
        let req = Request {
            fd,
            offset,
            work,
            reply: Reply {
                slot: slot.clone(),
                sent: false,
            },
        };
        INLINE_RINGS.with(|rings| -> LaneResult {
            let mut rings = rings.borrow_mut();
            let rt = match rings.entry(env.id) {
                std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => {
                    let (_tx, rx) = flume::bounded(1);
                    let rt = RingThread::new(self.kind, &env.cfg, self.shared.clone(), rx)
                        .map_err(|e| ("io_uring_setup", e))?;
                    v.insert(rt)
                }
            };
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rt.drive(req)));
            if r.is_err() {
                // As a lane thread's death: reap, answer, and refuse later calls.
                self.shared.dead.store(true, Ordering::Release);
                rt.die();
                rings.remove(&env.id);
            }
            Ok(())
        })?;
        let mut g = slot.state.lock().unwrap_or_else(|e| e.into_inner());
        debug_assert_eq!(g.pending, 0, "an inline ring call returned unanswered");
        match g.first_error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Runs one request and waits for its answer (on the calling thread's [`ReplySlot`]).
    fn call(&self, fd: RawFd, offset: u64, work: Work) -> LaneResult {
        self.call_many(std::iter::once((fd, offset, work)))
    }

    /// Submits every request of `works` (they run concurrently in the ring), then waits for
    /// all of them; returns the first error, if any.
    fn call_many(&self, works: impl Iterator<Item = (RawFd, u64, Work)>) -> LaneResult {
        let slot = REPLY_SLOT.with(Arc::clone);
        *slot.state.lock().unwrap_or_else(|e| e.into_inner()) = SlotState::default();
        let mut submit_error = None;
        for (fd, offset, work) in works {
            slot.state.lock().unwrap_or_else(|e| e.into_inner()).pending += 1;
            let req = Request {
                fd,
                offset,
                work,
                reply: Reply {
                    slot: slot.clone(),
                    sent: false,
                },
            };
            // A refused request's `Reply` answers (with "lane gone") as it is dropped.
            if let Err(e) = self.submit(req) {
                submit_error = Some(e);
                break;
            }
        }
        let mut g = slot.state.lock().unwrap_or_else(|e| e.into_inner());
        // Bounded: the lane answers every request exactly once (`Reply`'s drop included).
        while g.pending > 0 {
            g = slot.ready.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        match (submit_error, g.first_error.take()) {
            (_, Some(e)) | (Some(e), None) => Err(e),
            (None, None) => Ok(()),
        }
    }

    fn submit(&self, req: Request) -> LaneResult {
        if self.shared.dead.load(Ordering::Acquire) {
            return Err(closed());
        }
        let tx = self
            .tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(closed)?;
        tx.send(req).map_err(|_| closed())?;
        wake_fd(&self.wake);
        Ok(())
    }

    #[cfg_attr(not(any(test, feature = "testing")), allow(dead_code))] // read by tests only
    fn stats(&self) -> LaneStats {
        let s = &self.shared;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        LaneStats {
            ops: g(&s.ops),
            sqes: g(&s.sqes),
            short_writes: g(&s.short_writes),
            syncs_redone: g(&s.syncs_redone),
            plain_redos: g(&s.plain_redos),
            retries: g(&s.retries),
            enter_interrupted: g(&s.enter_interrupted),
            sq_full: g(&s.sq_full),
        }
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        drop(self.tx.lock().unwrap_or_else(|e| e.into_inner()).take());
        wake_fd(&self.wake);
        if let Some(h) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = h.join();
        }
    }
}

/// Blocks every blockable signal in the calling thread (a lane thread).
fn block_signals() {
    // SAFETY: sigfillset/pthread_sigmask on a local, zeroed sigset_t, changing only this
    // thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Fails unless the kernel supports every opcode the lanes use.
fn check_opcodes(ring: &IoUring) -> io::Result<()> {
    let mut probe = io_uring::Probe::new();
    ring.submitter().register_probe(&mut probe)?;
    for (code, name) in [
        (opcode::Writev::CODE, "IORING_OP_WRITEV"),
        (opcode::Fsync::CODE, "IORING_OP_FSYNC"),
        (opcode::Fallocate::CODE, "IORING_OP_FALLOCATE"),
        (opcode::SyncFileRange::CODE, "IORING_OP_SYNC_FILE_RANGE"),
        (opcode::Read::CODE, "IORING_OP_READ"),
    ] {
        if !probe.is_supported(code) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("the kernel's io_uring lacks {name}"),
            ));
        }
    }
    Ok(())
}

/// The state a lane's thread owns.
struct RingThread {
    kind: LaneKind,
    ring: IoUring,
    rx: flume::Receiver<Request>,
    wake: Arc<OwnedFd>,
    /// The eventfd read's buffer (heap: its address must not move while the read is in flight).
    wake_buf: Box<u64>,
    wake_armed: bool,
    shared: Arc<LaneShared>,
    faults: Option<Arc<RingFaults>>,
    /// Requests received, not started yet (arrival order).
    backlog: VecDeque<Request>,
    slots: Vec<Option<Active>>,
    free: Vec<usize>,
    /// SQEs submitted and not completed (the eventfd read included).
    in_flight: usize,
    limit: usize,
    ioprio: u16,
    /// Reused buffers: the SQEs of a round, the CQEs of a reap.
    sqe_buf: Vec<squeue::Entry>,
    cqes: Vec<(u64, i32)>,
}

// SAFETY: the thread state moves once, into the lane's thread, before any request exists; the
// raw pointers it later holds (iovecs into callers' buffers) follow `Request`'s rule.
unsafe impl Send for RingThread {}

thread_local! {
    /// The calling thread's own rings, by environment id (`Lane::call_inline`).
    static INLINE_RINGS: std::cell::RefCell<std::collections::HashMap<u64, RingThread>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

fn ud(slot: usize, sync: bool) -> u64 {
    ((slot as u64) << 1) | sync as u64
}

impl RingThread {
    /// A ring of `cfg.entries` SQEs for `kind`, with its eventfd, counting into `shared`.
    fn new(
        kind: LaneKind,
        cfg: &UringConfig,
        shared: Arc<LaneShared>,
        rx: flume::Receiver<Request>,
    ) -> io::Result<RingThread> {
        if let Some(code) = cfg.setup_error {
            return Err(io::Error::from_raw_os_error(code));
        }
        let entries = cfg.entries.max(2);
        let ring: IoUring = IoUring::builder().build(entries)?;
        check_opcodes(&ring)?;
        // SAFETY: eventfd(2) with valid flags returns a new descriptor we own, or -1.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `efd` is a fresh descriptor owned by nobody else.
        let wake = Arc::new(unsafe { OwnedFd::from_raw_fd(efd) });
        Ok(RingThread {
            kind,
            ring,
            rx,
            wake,
            wake_buf: Box::new(0u64),
            wake_armed: false,
            shared,
            faults: cfg.faults.clone(),
            backlog: VecDeque::new(),
            slots: Vec::new(),
            free: Vec::new(),
            in_flight: 0,
            limit: entries as usize,
            ioprio: if kind == LaneKind::Background {
                BACKGROUND_IOPRIO
            } else {
                0
            },
            sqe_buf: Vec::with_capacity(2),
            cqes: Vec::new(),
        })
    }

    /// `io_uring_enter`: submits what is queued and, with `want > 0`, waits for that many
    /// completions. A signal (`EINTR`) is counted and retried by the caller's loop; `EBUSY`
    /// (completions not reaped yet) returns to be reaped; any other error is a broken ring and
    /// panics (the lane's death: every waiter gets an error).
    fn enter(&mut self, want: usize) {
        let r = if want == 0 {
            self.ring.submit()
        } else {
            self.ring.submit_and_wait(want)
        };
        match r {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {
                self.shared
                    .enter_interrupted
                    .fetch_add(1, Ordering::Relaxed);
            }
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
            Err(e) => panic!("io_uring_enter failed: {e}"),
        }
    }

    /// Runs `req` to its answer on the calling thread (an inline ring: no eventfd read armed).
    fn drive(&mut self, req: Request) {
        self.backlog.push_back(req);
        self.start_backlog();
        // Bounded: every pass reaps at least one completion (or retries an interrupted
        // enter), and every operation ends within its bounded rounds.
        while !self.backlog.is_empty() || self.slots.iter().any(Option::is_some) {
            self.enter(1);
            self.reap();
            self.start_backlog();
        }
    }

    fn run_guarded(&mut self) {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run()));
        if r.is_err() {
            self.shared.dead.store(true, Ordering::Release);
            tracing::error!("an io_uring lane's thread panicked; every waiter gets an error");
            self.die();
        }
    }

    /// After a panic: wait for every SQE still in the kernel (callers' buffers), then answer
    /// everyone with an error (dropping a reply sender answers its caller with "lane gone").
    fn die(&mut self) {
        // The eventfd read completes only when the eventfd is written.
        wake_fd(&self.wake);
        // Bounded: each pass reaps at least one completion or fails; give up after many
        // interruptions.
        let mut interrupts = 0u32;
        while self.in_flight > 0 {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) && interrupts < 10_000 => {
                    interrupts += 1;
                    continue;
                }
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
                Err(e) => {
                    // The kernel may still read the callers' buffers: returning to them now
                    // could write freed memory into a file. Stop the process instead.
                    tracing::error!(error = %e, "cannot reap an io_uring lane after its thread panicked");
                    std::process::abort();
                }
            }
            let n = self.ring.completion().count();
            self.in_flight = self.in_flight.saturating_sub(n);
        }
        for s in self.slots.iter_mut() {
            if let Some(a) = s.take() {
                a.req.reply.send(Err(closed()));
            }
        }
        for r in self.backlog.drain(..) {
            r.reply.send(Err(closed()));
        }
        while let Ok(r) = self.rx.try_recv() {
            r.reply.send(Err(closed()));
        }
    }

    fn run(&mut self) {
        let mut open = true;
        loop {
            if open && !self.wake_armed {
                self.arm_wake();
            }
            if open {
                // Bounded by LANE_QUEUE.
                loop {
                    match self.rx.try_recv() {
                        Ok(r) => self.backlog.push_back(r),
                        Err(flume::TryRecvError::Empty) => break,
                        Err(flume::TryRecvError::Disconnected) => {
                            open = false;
                            break;
                        }
                    }
                }
            }
            self.start_backlog();
            if !open && self.backlog.is_empty() && self.slots.iter().all(Option::is_none) {
                if self.wake_armed {
                    // The eventfd read is the last SQE: complete it, then nothing is in flight.
                    wake_fd(&self.wake);
                } else {
                    return;
                }
            }
            self.enter(1);
            self.reap();
        }
    }

    fn arm_wake(&mut self) {
        let buf: *mut u64 = &mut *self.wake_buf;
        let e = opcode::Read::new(types::Fd(self.wake.as_raw_fd()), buf.cast(), 8)
            .build()
            .user_data(WAKE);
        if self.push(&[e]) {
            self.wake_armed = true;
            // Count only the engine's SQEs.
            self.shared.sqes.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Pushes entries together (a linked pair stays whole), submitting first when the queue
    /// lacks room. False when they cannot go in now (in-flight limit).
    fn push(&mut self, entries: &[squeue::Entry]) -> bool {
        if self.in_flight + entries.len() > self.limit + 1 {
            self.shared.sq_full.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        // Bounded: at most two attempts; a submit empties the submission queue.
        for attempt in 0..2 {
            let room = {
                let sq = self.ring.submission();
                sq.capacity() - sq.len()
            };
            if room >= entries.len() {
                // SAFETY: every pointer in these entries (iovecs, the eventfd buffer) lives in
                // `self` (an `Active`'s round_iov and the caller's buffers it points to, or
                // `wake_buf`) until the entry's completion is reaped.
                let r = unsafe { self.ring.submission().push_multiple(entries) };
                if r.is_ok() {
                    self.in_flight += entries.len();
                    self.shared
                        .sqes
                        .fetch_add(entries.len() as u64, Ordering::Relaxed);
                    return true;
                }
            }
            if attempt == 0 {
                self.shared.sq_full.fetch_add(1, Ordering::Relaxed);
                self.enter(0);
            }
        }
        false
    }

    /// Starts backlog requests in order while there is room.
    fn start_backlog(&mut self) {
        // Bounded by the backlog's length.
        while let Some(req) = self.backlog.pop_front() {
            let slot = match self.free.pop() {
                Some(s) => s,
                None => {
                    self.slots.push(None);
                    self.slots.len() - 1
                }
            };
            self.slots[slot] = Some(Active {
                req,
                done: 0,
                synced: false,
                retries: 0,
                outstanding: 0,
                write_res: None,
                sync_res: None,
                round_len: 0,
                round_iov: Vec::new(),
                shortened: false,
            });
            if !self.start_round(slot) {
                // No room: put it back at the front and wait for completions.
                if let Some(a) = self.slots[slot].take() {
                    self.backlog.push_front(a.req);
                }
                self.free.push(slot);
                return;
            }
        }
    }

    /// Submits the SQEs the operation in `slot` needs next. False when there was no room
    /// (nothing submitted).
    fn start_round(&mut self, slot: usize) -> bool {
        let Some(a) = self.slots[slot].as_mut() else {
            return true;
        };
        a.write_res = None;
        a.sync_res = None;
        a.shortened = false;
        let fd = types::Fd(a.req.fd);
        let mut entries = std::mem::take(&mut self.sqe_buf);
        entries.clear();
        let op_kind;
        match &a.req.work {
            Work::Write {
                iov,
                n,
                total,
                sync,
            } => {
                if a.done < *total {
                    op_kind = RingOp::Write;
                    let fault = self
                        .faults
                        .as_ref()
                        .and_then(|f| f.take(self.kind, RingOp::Write, true));
                    if fault == Some(RingFault::Panic) {
                        panic!("injected: io_uring lane thread panics");
                    }
                    // The first round of an ordinary write points the SQE at the caller's
                    // iovecs; a rest, a long list or a shortened round gets its own.
                    let (ptr, count) = if a.done == 0 && *n <= IOV_MAX_SLICES && fault.is_none() {
                        a.round_len = *total;
                        (*iov, *n)
                    } else {
                        a.round_iov = rest_of(a.req.work.iov(), a.done, IOV_MAX_SLICES);
                        a.round_len = a.round_iov.iter().map(|v| v.iov_len as u64).sum();
                        if fault == Some(RingFault::ShortWrite) {
                            // `round_len` stays what the round asked for, so the kernel's
                            // answer reads as the short write it is.
                            a.round_iov = truncate_iov(&a.round_iov, a.round_len / 2);
                            a.shortened = true;
                        }
                        (a.round_iov.as_ptr(), a.round_iov.len())
                    };
                    let covers_rest = a.done + a.round_len == *total;
                    let w = opcode::Writev::new(fd, ptr, count as u32)
                        .offset(a.req.offset + a.done)
                        .ioprio(self.ioprio)
                        .build()
                        .user_data(ud(slot, false));
                    // Link the sync only behind a write that ends the operation's bytes (a
                    // shortened one included: the kernel cancels it, as after a real short
                    // write).
                    if *sync && covers_rest {
                        entries.push(w.flags(squeue::Flags::IO_LINK));
                        entries.push(fsync(fd, slot));
                    } else {
                        entries.push(w);
                    }
                } else {
                    op_kind = RingOp::Sync;
                    entries.push(fsync(fd, slot));
                }
            }
            Work::Sync => {
                op_kind = RingOp::Sync;
                entries.push(fsync(fd, slot));
            }
            Work::Fallocate { mode, len } => {
                op_kind = RingOp::Fallocate;
                entries.push(
                    opcode::Fallocate::new(fd, *len)
                        .offset(a.req.offset)
                        .mode(*mode)
                        .build()
                        .user_data(ud(slot, false)),
                );
            }
            Work::SyncRange { len, flags } => {
                op_kind = RingOp::SyncRange;
                entries.push(
                    opcode::SyncFileRange::new(fd, *len)
                        .offset(a.req.offset)
                        .flags(*flags)
                        .build()
                        .user_data(ud(slot, false)),
                );
            }
        }
        if op_kind != RingOp::Write {
            if let Some(f) = &self.faults {
                if let Some(RingFault::Panic) = f.take(self.kind, op_kind, true) {
                    panic!("injected: io_uring lane thread panics");
                }
            }
        }
        let n = entries.len() as u8;
        let pushed = self.push(&entries);
        self.sqe_buf = entries;
        if !pushed {
            return false;
        }
        if let Some(a) = self.slots[slot].as_mut() {
            a.outstanding = n;
        }
        true
    }

    fn reap(&mut self) {
        let mut done = std::mem::take(&mut self.cqes);
        done.clear();
        done.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
        for &(data, res) in &done {
            self.in_flight = self.in_flight.saturating_sub(1);
            if data == WAKE {
                self.wake_armed = false;
                continue;
            }
            let slot = (data >> 1) as usize;
            let is_sync = data & 1 == 1;
            let faults = self.faults.clone();
            let Some(a) = self.slots.get_mut(slot).and_then(Option::as_mut) else {
                continue;
            };
            let mut res = res;
            if is_sync && a.shortened {
                res = -libc::ECANCELED;
            }
            if let Some(f) = &faults {
                let kind = if is_sync {
                    RingOp::Sync
                } else {
                    match a.req.work {
                        Work::Write { .. } => RingOp::Write,
                        Work::Sync => RingOp::Sync,
                        Work::Fallocate { .. } => RingOp::Fallocate,
                        Work::SyncRange { .. } => RingOp::SyncRange,
                    }
                };
                if let Some(RingFault::Errno(code)) = f.take(self.kind, kind, false) {
                    res = -code;
                }
            }
            if is_sync {
                a.sync_res = Some(res);
            } else {
                a.write_res = Some(res);
            }
            a.outstanding = a.outstanding.saturating_sub(1);
            if a.outstanding == 0 {
                self.finish_round(slot);
            }
        }
        self.cqes = done;
    }

    /// Every CQE of the round in `slot` is in: answer, or start the next round.
    fn finish_round(&mut self, slot: usize) {
        let Some(a) = self.slots[slot].as_mut() else {
            return;
        };
        let sh = &self.shared;
        let is_write = matches!(a.req.work, Work::Write { .. });
        let total = work_total(&a.req.work);
        let op_name = match a.req.work {
            Work::Write { .. } => "io_uring writev",
            Work::Sync => "io_uring fsync(DATASYNC)",
            Work::Fallocate { .. } => "io_uring fallocate",
            Work::SyncRange { .. } => "io_uring sync_file_range",
        };
        let mut failure: Option<(&'static str, io::Error)> = None;
        let mut retry: Option<i32> = None;
        // A sync of this round counts only when the ring itself completed the rest of the
        // write in the same round (or the round had no write): a sync linked behind a short,
        // cancelled or redone write covers nothing of what came after it.
        let mut ring_wrote_rest = !(is_write && a.write_res.is_some());
        let mut finished = false;
        if let Some(res) = a.write_res {
            match res {
                n if n > 0 && is_write => {
                    a.done += n as u64;
                    if (n as u64) < a.round_len {
                        sh.short_writes.fetch_add(1, Ordering::Relaxed);
                    } else if a.done >= total {
                        ring_wrote_rest = true;
                    }
                }
                n if n >= 0 && !is_write => finished = true,
                0 => {
                    failure = Some((
                        op_name,
                        io::Error::new(io::ErrorKind::WriteZero, "writev wrote 0 bytes"),
                    ))
                }
                e if e == -libc::EAGAIN || e == -libc::EINTR => retry = Some(-e),
                e if e == -libc::ECANCELED && is_write => {
                    // Redo the write with plain pwritev; the sync follows in the next round.
                    sh.plain_redos.fetch_add(1, Ordering::Relaxed);
                    let rest = rest_of(a.req.work.iov(), a.done, usize::MAX);
                    match plain_pwritev(a.req.fd, &rest, a.req.offset + a.done) {
                        Ok(()) => a.done = total,
                        Err(e) => failure = Some(("pwritev", e)),
                    }
                }
                e if e == -libc::ECANCELED => retry = Some(-e),
                e => failure = Some((op_name, io::Error::from_raw_os_error(-e))),
            }
        }
        if let Some(res) = a.sync_res {
            match res {
                0 if ring_wrote_rest && a.done >= total => a.synced = true,
                0 => {}
                e if e == -libc::ECANCELED => {
                    sh.syncs_redone.fetch_add(1, Ordering::Relaxed);
                }
                e if e == -libc::EAGAIN || e == -libc::EINTR => retry = retry.or(Some(-e)),
                // Never retried into success (fsyncgate, design.md invariant I2).
                e => failure = Some(("io_uring fsync(DATASYNC)", io::Error::from_raw_os_error(-e))),
            }
        }
        if let (Some(code), None) = (retry, &failure) {
            a.retries += 1;
            sh.retries.fetch_add(1, Ordering::Relaxed);
            if a.retries > MAX_RETRIES {
                let e = io::Error::from_raw_os_error(code);
                failure = Some((
                    op_name,
                    io::Error::new(e.kind(), format!("{e} after {MAX_RETRIES} resubmissions")),
                ));
            }
        }
        let complete = failure.is_none()
            && match &a.req.work {
                Work::Write { sync, .. } => a.done >= total && (!*sync || a.synced),
                Work::Sync => a.synced,
                Work::Fallocate { .. } | Work::SyncRange { .. } => finished,
            };
        if failure.is_some() || complete {
            if let Some(a) = self.slots[slot].take() {
                self.free.push(slot);
                sh.ops.fetch_add(1, Ordering::Relaxed);
                a.req.reply.send(match failure {
                    Some(f) => Err(f),
                    None => Ok(()),
                });
            }
            return;
        }
        if !self.start_round(slot) {
            self.pending_rounds_push(slot);
        }
    }

    fn pending_rounds_push(&mut self, slot: usize) {
        // Rare (the in-flight limit is reached by other operations): wait for one completion
        // and try again. Bounded: every completion frees room.
        let mut tries = 0u32;
        while !self.start_round(slot) {
            tries += 1;
            self.enter(1);
            assert!(tries < 1_000_000, "io_uring lane cannot make room");
            self.reap();
        }
    }
}

fn work_total(w: &Work) -> u64 {
    match w {
        Work::Write { total, .. } => *total,
        _ => 0,
    }
}

fn fsync(fd: types::Fd, slot: usize) -> squeue::Entry {
    opcode::Fsync::new(fd)
        .flags(types::FsyncFlags::DATASYNC)
        .build()
        .user_data(ud(slot, true))
}

/// The iovecs covering bytes `skip..` of `iov`, at most `max` of them.
fn rest_of(iov: &[libc::iovec], mut skip: u64, max: usize) -> Vec<libc::iovec> {
    let mut out = Vec::with_capacity(iov.len().min(max));
    for v in iov {
        if out.len() == max {
            break;
        }
        let len = v.iov_len as u64;
        if skip >= len {
            skip -= len;
            continue;
        }
        out.push(libc::iovec {
            // SAFETY (pointer arithmetic only): `skip < iov_len`, so the result stays inside
            // the caller's buffer.
            iov_base: unsafe { v.iov_base.cast::<u8>().add(skip as usize) }.cast(),
            iov_len: (len - skip) as usize,
        });
        skip = 0;
    }
    out
}

/// The first `keep` bytes of `iov`.
fn truncate_iov(iov: &[libc::iovec], mut keep: u64) -> Vec<libc::iovec> {
    let mut out = Vec::new();
    for v in iov {
        if keep == 0 {
            break;
        }
        let n = (v.iov_len as u64).min(keep);
        out.push(libc::iovec {
            iov_base: v.iov_base,
            iov_len: n as usize,
        });
        keep -= n;
    }
    out
}

/// Writes all of `iov` at `offset` with plain `pwritev` (the redo of a cancelled ring write).
fn plain_pwritev(fd: RawFd, iov: &[libc::iovec], offset: u64) -> io::Result<()> {
    let total: u64 = iov.iter().map(|v| v.iov_len as u64).sum();
    let mut done = 0u64;
    // Bounded: each pass writes at least one byte or fails; EINTR retries at most 1,000 times.
    let mut interrupts = 0;
    while done < total {
        let rest = rest_of(iov, done, IOV_MAX_SLICES);
        // SAFETY: the iovecs point into the caller's buffers, alive while it waits for this
        // operation (see `Request`'s Send note).
        let n = unsafe {
            libc::pwritev(
                fd,
                rest.as_ptr(),
                rest.len() as libc::c_int,
                (offset + done) as libc::off_t,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) && interrupts < 1000 {
                interrupts += 1;
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "pwritev wrote 0 bytes",
            ));
        }
        done += n as u64;
    }
    Ok(())
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
    fn write_vectored_and_sync(&self, bufs: &[IoSlice<'_>], offset: u64) -> EnvResult<()> {
        self.write(bufs, offset, true, self.lane())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn env_with(faults: Option<Arc<RingFaults>>, entries: u32) -> UringEnv {
        UringEnv::with_config(UringConfig {
            entries,
            faults,
            setup_error: None,
        })
        .expect("io_uring setup")
    }

    fn journal_file(env: &UringEnv, dir: &Path) -> Arc<dyn EnvFile> {
        env.open(&dir.join("1.journal"), OpenMode::Create).unwrap()
    }

    fn read_all(f: &dyn EnvFile) -> Vec<u8> {
        let mut buf = vec![0u8; f.len().unwrap() as usize];
        f.read_exact_at(&mut buf, 0).unwrap();
        buf
    }

    #[test]
    fn linked_write_and_sync_writes_every_byte() {
        let dir = tempfile::tempdir().unwrap();
        let env = env_with(None, 8);
        let f = journal_file(&env, dir.path());
        let a = vec![1u8; 5000];
        let b = vec![2u8; 3000];
        f.write_vectored_and_sync(&[IoSlice::new(&a), IoSlice::new(&b)], 100)
            .unwrap();
        let got = read_all(&*f);
        assert_eq!(got.len(), 8100);
        assert!(got[..100].iter().all(|&x| x == 0));
        assert!(got[100..5100].iter().all(|&x| x == 1));
        assert!(got[5100..].iter().all(|&x| x == 2));
        let s = env.lane_stats(LaneKind::Critical);
        assert_eq!(s.ops, 1);
        assert_eq!(s.sqes, 2, "one linked write + sync");
    }

    #[test]
    fn short_write_resubmits_the_rest_and_redoes_the_cancelled_sync() {
        let dir = tempfile::tempdir().unwrap();
        let faults = RingFaults::new();
        faults.add(RingFaultRule {
            lane: None,
            op: RingOp::Write,
            fault: RingFault::ShortWrite,
            skip: 0,
            times: 2,
        });
        let env = env_with(Some(faults.clone()), 8);
        let f = journal_file(&env, dir.path());
        let data: Vec<u8> = (0..40_000u32).map(|i| (i % 251) as u8).collect();
        f.write_vectored_and_sync(&[IoSlice::new(&data)], 0)
            .unwrap();
        assert_eq!(read_all(&*f), data);
        let s = env.lane_stats(LaneKind::Critical);
        assert_eq!(s.short_writes, 2);
        assert_eq!(
            s.syncs_redone, 2,
            "each linked sync behind a short write is redone"
        );
        assert_eq!(faults.injected(), 2);
    }

    #[test]
    fn eagain_retries_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let faults = RingFaults::new();
        faults.add(RingFaultRule {
            lane: None,
            op: RingOp::Write,
            fault: RingFault::Errno(libc::EAGAIN),
            skip: 0,
            times: u32::MAX,
        });
        let env = env_with(Some(faults), 8);
        let f = env
            .open(&dir.path().join("data.pages"), OpenMode::Create)
            .unwrap();
        let page = [7u8; 4096];
        let run = [IoSlice::new(&page)];
        let e = f
            .write_runs(&[(0, &run[..])], crate::env::WriteMode::IoRing)
            .unwrap_err();
        assert_eq!(e.raw_os_error(), None, "a message-carrying error: {e}");
        assert!(e.to_string().contains("resubmissions"), "{e}");
        let s = env.lane_stats(LaneKind::Background);
        assert_eq!(s.retries, u64::from(MAX_RETRIES) + 1);
    }

    #[test]
    fn failed_sync_is_not_retried() {
        let dir = tempfile::tempdir().unwrap();
        let faults = RingFaults::new();
        faults.add(RingFaultRule {
            lane: None,
            op: RingOp::Sync,
            fault: RingFault::Errno(libc::EIO),
            skip: 0,
            times: 1,
        });
        let env = env_with(Some(faults), 8);
        let f = journal_file(&env, dir.path());
        let e = f
            .write_vectored_and_sync(&[IoSlice::new(&[1u8; 512])], 0)
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
        assert_eq!(env.lane_stats(LaneKind::Critical).retries, 0);
    }

    #[test]
    fn a_tiny_ring_keeps_every_request() {
        let dir = tempfile::tempdir().unwrap();
        let env = env_with(None, 2);
        let f = env
            .open(&dir.path().join("data.pages"), OpenMode::Create)
            .unwrap();
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let f = f.clone();
                s.spawn(move || {
                    for i in 0..32u64 {
                        let off = (t * 32 + i) * 4096;
                        let page = [(t * 32 + i) as u8; 4096];
                        let run = [IoSlice::new(&page)];
                        f.write_runs(&[(off, &run[..])], crate::env::WriteMode::IoRing)
                            .unwrap();
                    }
                });
            }
        });
        f.sync_data().unwrap();
        let got = read_all(&*f);
        for k in 0..256usize {
            assert!(got[k * 4096..(k + 1) * 4096].iter().all(|&x| x == k as u8));
        }
    }

    #[test]
    fn allocate_and_punch_through_the_ring() {
        let dir = tempfile::tempdir().unwrap();
        let env = env_with(None, 8);
        let f = env
            .open(&dir.path().join("data.pages"), OpenMode::Create)
            .unwrap();
        f.allocate(0, 4 << 20).unwrap();
        assert_eq!(f.len().unwrap(), 4 << 20);
        assert!(f.allocated_bytes().unwrap() >= 4 << 20);
        f.punch_hole(1 << 20, 1 << 20).unwrap();
        assert!(f.allocated_bytes().unwrap() < 4 << 20);
        f.write_back(0, 4 << 20, false).unwrap();
        f.write_back(0, 4 << 20, true).unwrap();
    }

    #[test]
    fn a_dead_lane_answers_errors_and_never_hangs() {
        let dir = tempfile::tempdir().unwrap();
        let faults = RingFaults::new();
        faults.add(RingFaultRule {
            lane: None,
            op: RingOp::Write,
            fault: RingFault::Panic,
            skip: 1,
            times: 1,
        });
        let env = env_with(Some(faults), 8);
        let f = journal_file(&env, dir.path());
        f.write_vectored_and_sync(&[IoSlice::new(&[1u8; 512])], 0)
            .unwrap();
        assert!(f
            .write_vectored_and_sync(&[IoSlice::new(&[2u8; 512])], 512)
            .is_err());
        assert!(f
            .write_vectored_and_sync(&[IoSlice::new(&[3u8; 512])], 1024)
            .is_err());
        assert!(f.sync_data().is_err());
    }

    #[test]
    fn setup_error_is_reported() {
        let e = UringEnv::with_config(UringConfig {
            setup_error: Some(libc::EPERM),
            ..UringConfig::default()
        })
        .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM));
    }
}
