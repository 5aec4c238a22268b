//! One ring and the thread that drives it ([`RingThread`]): setup and the opcode probe, the
//! event loop of a lane's thread (one `IORING_OP_READ` of the lane's eventfd always armed, so
//! it sleeps only in `io_uring_enter`), the inline drive of a calling thread's own ring,
//! submission under the in-flight limit, and the cleanup after the thread panicked; and the
//! state they keep: each operation in flight ([`Active`]) and what a lane's rings share
//! ([`LaneShared`]: its dead flag and counters). What each operation submits and how each
//! completion is handled is in `rounds.rs`.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use io_uring::{opcode, squeue, types, IoUring};

use super::faults::RingFaults;
use super::request::{closed, wake_fd, Request};
use super::{LaneKind, UringConfig, BACKGROUND_IOPRIO, WAKE};

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

/// What a lane's thread and the calling threads' own rings of that lane share: whether the
/// lane is dead, and its counters ([`LaneStats`]).
#[derive(Default)]
pub(super) struct LaneShared {
    pub(super) dead: AtomicBool,
    pub(super) ops: AtomicU64,
    pub(super) sqes: AtomicU64,
    pub(super) short_writes: AtomicU64,
    pub(super) syncs_redone: AtomicU64,
    pub(super) plain_redos: AtomicU64,
    pub(super) retries: AtomicU64,
    pub(super) enter_interrupted: AtomicU64,
    pub(super) sq_full: AtomicU64,
    pub(super) enters: AtomicU64,
}

/// An operation in flight on the lane's thread.
pub(super) struct Active {
    pub(super) req: Request,
    /// Bytes of a write completed so far.
    pub(super) done: u64,
    /// The sync of this operation completed successfully after the whole write.
    pub(super) synced: bool,
    pub(super) retries: u32,
    /// The current round: SQEs not yet completed, and what the completed ones returned.
    pub(super) outstanding: u8,
    pub(super) write_res: Option<i32>,
    pub(super) sync_res: Option<i32>,
    /// The bytes this round's write was asked to write.
    pub(super) round_len: u64,
    /// The iovecs of this round's write (kept alive while in flight).
    pub(super) round_iov: Vec<libc::iovec>,
    /// The fault shim shortened this round's write: report its linked sync as cancelled.
    pub(super) shortened: bool,
}

/// The state a lane's thread owns.
pub(super) struct RingThread {
    pub(super) kind: LaneKind,
    pub(super) ring: IoUring,
    pub(super) rx: flume::Receiver<Request>,
    pub(super) wake: Arc<OwnedFd>,
    /// The eventfd read's buffer (heap: its address must not move while the read is in flight).
    pub(super) wake_buf: Box<u64>,
    pub(super) wake_armed: bool,
    pub(super) shared: Arc<LaneShared>,
    pub(super) faults: Option<Arc<RingFaults>>,
    /// Requests received, not started yet (arrival order).
    pub(super) backlog: VecDeque<Request>,
    pub(super) slots: Vec<Option<Active>>,
    pub(super) free: Vec<usize>,
    /// SQEs submitted and not completed (the eventfd read included).
    pub(super) in_flight: usize,
    pub(super) limit: usize,
    pub(super) ioprio: u16,
    /// Reused buffers: the SQEs of a round, the CQEs of a reap.
    pub(super) sqe_buf: Vec<squeue::Entry>,
    pub(super) cqes: Vec<(u64, i32)>,
}

// SAFETY: the thread state moves once, into the lane's thread, before any request exists; the
// raw pointers it later holds (iovecs into callers' buffers) follow `Request`'s rule.
unsafe impl Send for RingThread {}

/// A completion's `user_data`: the operation's slot, and whether it is the sync.
pub(super) fn ud(slot: usize, sync: bool) -> u64 {
    ((slot as u64) << 1) | sync as u64
}

impl RingThread {
    /// A ring of `cfg.entries` SQEs for `kind`, with its eventfd, counting into `shared`.
    pub(super) fn new(
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
    pub(super) fn enter(&mut self, want: usize) {
        self.shared.enters.fetch_add(1, Ordering::Relaxed);
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
    pub(super) fn drive(&mut self, req: Request) {
        self.backlog.push_back(req);
        self.start_backlog();
        // Bounded: every pass reaps at least one completion (or retries an interrupted
        // enter), and every operation ends within its bounded rounds. Every SQE in flight here
        // is this request's, and each gives exactly one CQE (a cancelled link too): one enter
        // waits for the whole round (a linked write + sync is one system call, not two).
        while !self.backlog.is_empty() || self.slots.iter().any(Option::is_some) {
            self.enter(self.in_flight.max(1));
            self.reap();
            self.start_backlog();
        }
    }

    pub(super) fn run_guarded(&mut self) {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run()));
        if r.is_err() {
            self.shared.dead.store(true, Ordering::Release);
            tracing::error!("an io_uring lane's thread panicked; every waiter gets an error");
            self.die();
        }
    }

    /// After a panic: wait for every SQE still in the kernel (callers' buffers), then answer
    /// everyone with an error (dropping a reply sender answers its caller with "lane gone").
    pub(super) fn die(&mut self) {
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
    pub(super) fn push(&mut self, entries: &[squeue::Entry]) -> bool {
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
}
