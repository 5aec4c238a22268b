//! What a caller hands a lane and where it waits for the answer: the [`Work`] of one
//! operation (a write of the caller's `iovec`s, a sync, an `fallocate`, a `sync_file_range`),
//! the [`Request`] carrying it, and the per-thread [`ReplySlot`] the caller blocks on until the
//! lane answers through its [`Reply`] (answered "lane gone" when dropped unanswered). Also the
//! calling thread's reused `iovec` buffer and the eventfd write that wakes a lane.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};

/// The error a lane answers with: the operation (as the io_uring opcode or plain call) and the
/// OS error; the file turns it into an [`EnvError`](crate::env::EnvError) with its path.
pub(super) type LaneResult = Result<(), (&'static str, io::Error)>;

/// What a request asks the ring to do.
pub(super) enum Work {
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
pub(super) struct Request {
    pub(super) fd: RawFd,
    pub(super) offset: u64,
    pub(super) work: Work,
    pub(super) reply: Reply,
}

impl Request {
    /// A request whose answer goes to `slot` (not sent yet).
    pub(super) fn new(fd: RawFd, offset: u64, work: Work, slot: &Arc<ReplySlot>) -> Request {
        Request {
            fd,
            offset,
            work,
            reply: Reply {
                slot: slot.clone(),
                sent: false,
            },
        }
    }
}

impl Work {
    /// The iovecs of a write (empty for other work).
    pub(super) fn iov(&self) -> &[libc::iovec] {
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
pub(super) struct ReplySlot {
    pub(super) state: Mutex<SlotState>,
    pub(super) ready: std::sync::Condvar,
}

/// Answers still due to the caller, the first error among those received, and whether the
/// caller sleeps on the slot's condition variable (a lane's thread answers a waiting caller; a
/// thread driving its own ring answers itself and needs no wake-up, which would cost a `futex`
/// system call per journal batch).
#[derive(Default)]
pub(super) struct SlotState {
    pub(super) pending: usize,
    pub(super) first_error: Option<(&'static str, io::Error)>,
    pub(super) waiting: bool,
}

thread_local! {
    pub(super) static REPLY_SLOT: Arc<ReplySlot> = Arc::new(ReplySlot::default());
    pub(super) static IOVECS: std::cell::RefCell<Vec<libc::iovec>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The lane's side of a [`ReplySlot`]: answers once; dropped unanswered (the lane's thread died,
/// the queue was dropped) it answers "lane gone", so no caller waits forever.
pub(super) struct Reply {
    pub(super) slot: Arc<ReplySlot>,
    pub(super) sent: bool,
}

impl Reply {
    pub(super) fn send(mut self, r: LaneResult) {
        self.put(r);
    }

    fn put(&mut self, r: LaneResult) {
        let mut g = self.slot.state.lock().unwrap_or_else(|e| e.into_inner());
        g.pending = g.pending.saturating_sub(1);
        if let Err(e) = r {
            g.first_error.get_or_insert(e);
        }
        if g.pending == 0 && g.waiting {
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

/// Wakes the lane whose eventfd `fd` is (its ring always holds a read of it).
pub(super) fn wake_fd(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to an eventfd we own; an eventfd write only fails
    // when its counter would overflow, and the counter is reset by every read of the lane.
    let _ = unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

/// The answer of a lane whose thread is gone.
pub(super) fn closed() -> (&'static str, io::Error) {
    (
        "io_uring lane",
        io::Error::new(
            io::ErrorKind::BrokenPipe,
            "the io_uring lane's thread is gone (it panicked or the environment was dropped)",
        ),
    )
}
