//! The lanes' own threads (`omnibus-ring-critical`, `omnibus-ring-background`): [`Lane`] starts
//! one, queues requests to it and waits for their answers ([`Lane::call`], [`Lane::call_many`]);
//! and the calling thread's own rings ([`Lane::call_inline`]), which the critical lane's journal
//! batches go through without a hand-off.

use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::request::{closed, wake_fd, LaneResult, Request, SlotState, Work, REPLY_SLOT};
use super::ring::{LaneShared, RingThread};
use super::{LaneKind, LaneStats, Lanes, UringConfig, LANE_QUEUE};

/// A lane: its queue, its thread, its counters.
pub(super) struct Lane {
    pub(super) kind: LaneKind,
    tx: Mutex<Option<flume::Sender<Request>>>,
    wake: Arc<OwnedFd>,
    shared: Arc<LaneShared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Lane {
    pub(super) fn start(kind: LaneKind, cfg: &UringConfig) -> io::Result<Lane> {
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
                    if let Err(e) = crate::env::set_thread_io_priority(7) {
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
    pub(super) fn call_inline(
        &self,
        env: &Lanes,
        fd: RawFd,
        offset: u64,
        work: Work,
    ) -> LaneResult {
        if self.shared.dead.load(Ordering::Acquire) {
            return Err(closed());
        }
        let slot = REPLY_SLOT.with(Arc::clone);
        *slot.state.lock().unwrap_or_else(|e| e.into_inner()) = SlotState {
            pending: 1,
            first_error: None,
            waiting: false,
        };
        let req = Request::new(fd, offset, work, &slot);
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
    pub(super) fn call(&self, fd: RawFd, offset: u64, work: Work) -> LaneResult {
        self.call_many(std::iter::once((fd, offset, work)))
    }

    /// Submits every request of `works` (they run concurrently in the ring), then waits for
    /// all of them; returns the first error, if any.
    pub(super) fn call_many(&self, works: impl Iterator<Item = (RawFd, u64, Work)>) -> LaneResult {
        let slot = REPLY_SLOT.with(Arc::clone);
        *slot.state.lock().unwrap_or_else(|e| e.into_inner()) = SlotState::default();
        let mut submit_error = None;
        for (fd, offset, work) in works {
            slot.state.lock().unwrap_or_else(|e| e.into_inner()).pending += 1;
            let req = Request::new(fd, offset, work, &slot);
            // A refused request's `Reply` answers (with "lane gone") as it is dropped.
            if let Err(e) = self.submit(req) {
                submit_error = Some(e);
                break;
            }
        }
        let mut g = slot.state.lock().unwrap_or_else(|e| e.into_inner());
        // Bounded: the lane answers every request exactly once (`Reply`'s drop included).
        while g.pending > 0 {
            g.waiting = true;
            g = slot.ready.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        g.waiting = false;
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
    pub(super) fn stats(&self) -> LaneStats {
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
            enters: g(&s.enters),
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

thread_local! {
    /// The calling thread's own rings, by environment id (`Lane::call_inline`).
    static INLINE_RINGS: std::cell::RefCell<std::collections::HashMap<u64, RingThread>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}
