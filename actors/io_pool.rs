//! I/O pools: plain threads that run the blocking disk calls (`pwritev`, `fdatasync`,
//! `fallocate`, flushes, opening files, directory syncs) so that no executor ever waits for the
//! disk (checked in debug builds: see `mod.rs`). The engine starts two:
//!
//! - The *journal I/O pool* (threads `omnibus-journal-io-N`, sized by
//!   [`crate::actors::EngineOptions::critical_lane_threads`], normal I/O priority) runs what a
//!   commit waits for: the batches of the journal-writer actors of separate journals (and each
//!   such actor's last reference to its journal), and the `fallocate` of a commit that grows
//!   its data file. The shared journal's writer does not use it: it has a thread of its own
//!   (`journal_writer.rs`).
//! - The *background I/O pool* (threads `omnibus-flush-io-N`, sized by
//!   [`crate::actors::EngineOptions::background_lane_threads`]) runs flushes and the other
//!   blocking housekeeping (opening, creating and dropping storages, index builds' scans, the
//!   flushers' polls, checks and backups) at low I/O priority: `ioprio_set(IOPRIO_CLASS_BE, 7)`
//!   on each of its threads.
//! - The *residency thread* (`omnibus-residency-0`, a pool of one) runs the flushers'
//!   residency refreshes (`Storage::refresh_residency`, a `mincore` over 256 MiB of a map, up
//!   to a few ms of CPU on pages the process has not mapped) at CPU nice 19, asking the kernel
//!   in steps of 16 MiB with a `sched_yield` between them (`env/page_reads.rs`), so that this
//!   bookkeeping takes a CPU from the application's threads for a step at most (a tokio
//!   worker woken by its timer waited up to 6 ms for one call over 256 MiB) and still makes
//!   progress on a machine they keep busy (in the `SCHED_IDLE` class a refresh pass never
//!   ended while two tokio workers kept both CPUs busy).
//!
//! Not to be confused with the io_uring environment's *lanes* (`env/uring.rs`: the critical and
//! the background lane, each a ring owned by one thread), which lie beneath this interface:
//! where io_uring is available, a job's writes and syncs on a pool thread go through them.
//!
//! Why threads and not glommio's file API: the core (`src/`) is synchronous and goes through
//! the `StorageEnv` trait (default, power-loss, hooked environments), which glommio's DMA files
//! cannot wrap; a thread pool keeps one code path for tests and production.
//!
//! Messages in: boxed jobs, over one bounded flume channel per pool (capacity 1,024: a full pool
//! makes the submitting actor wait: back-pressure). Out: each job's result on its own
//! one-shot channel. Failure: a panicking job is caught and answered as an error.

use std::sync::Arc;

use crate::actor_interface::{Error, Result};

type Job = Box<dyn FnOnce() + Send>;

/// A pool of threads running blocking jobs. Clones share the pool.
#[derive(Clone)]
pub(crate) struct IoPool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    tx: std::sync::Mutex<Option<flume::Sender<Job>>>,
    threads: std::sync::Mutex<Vec<std::thread::JoinHandle<()>>>,
}

use crate::actor_interface::set_thread_io_priority as set_io_priority;
use crate::actor_interface::set_thread_nice;

/// The CPU priority of an [`IoPool`]'s threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CpuPriority {
    /// The process's own.
    Normal,
    /// The lowest nice value, 19.
    Lowest,
}

fn wrap<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
    rtx: flume::Sender<Result<T>>,
) -> Job {
    Box::new(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| {
            Err(Error::Poisoned {
                cause: "a job on an I/O pool panicked".into(),
            })
        });
        let _ = rtx.send(r);
    })
}

impl IoPool {
    /// Starts `threads` threads named `name-N`; `low_priority` puts them in I/O class BE 7,
    /// `cpu` sets their CPU priority.
    pub fn start(
        name: &str,
        threads: usize,
        low_priority: bool,
        cpu: CpuPriority,
    ) -> Result<IoPool> {
        let (tx, rx) = flume::bounded::<Job>(1024);
        let mut hs = Vec::new();
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            let h = std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || {
                    if low_priority {
                        if let Err(e) = set_io_priority(7) {
                            tracing::warn!(error = %e, "ioprio_set failed; flushes run at normal I/O priority");
                        }
                    }
                    if cpu == CpuPriority::Lowest {
                        if let Err(e) = set_thread_nice(19) {
                            tracing::warn!(error = %e, "setpriority failed; the pool runs at the process's CPU nice value");
                        }
                    }
                    while let Ok(job) = rx.recv() {
                        job();
                    }
                })
                .map_err(|e| Error::Io { op: "spawn thread", path: name.into(), source: e })?;
            hs.push(h);
        }
        Ok(IoPool {
            inner: Arc::new(PoolInner {
                tx: std::sync::Mutex::new(Some(tx)),
                threads: std::sync::Mutex::new(hs),
            }),
        })
    }

    fn sender(&self) -> Result<flume::Sender<Job>> {
        self.inner
            .tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or(Error::Closed)
    }

    /// Runs `f` on the pool and returns its result; waits (asynchronously) while the pool's
    /// queue is full. Errors: [`Error::Closed`] when the pool is stopped; a panic in `f`
    /// becomes [`Error::Poisoned`].
    pub async fn run<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T> + Send + 'static,
    {
        let (rtx, rrx) = flume::bounded::<Result<T>>(1);
        let tx = self.sender()?;
        tx.send_async(wrap(f, rtx))
            .await
            .map_err(|_| Error::Closed)?;
        drop(tx);
        rrx.recv_async().await.map_err(|_| Error::Closed)?
    }

    /// Queues `f` on the pool without waiting for it; `false` (and `f` dropped, not run) when
    /// the queue is full or the pool stopped. A panic in `f` is caught.
    pub fn try_spawn(&self, f: impl FnOnce() + Send + 'static) -> bool {
        let Ok(tx) = self.sender() else {
            return false;
        };
        let job: Job = Box::new(move || {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        });
        tx.try_send(job).is_ok()
    }

    /// Stops the pool for every clone: queued jobs finish, then the threads exit and are joined.
    pub fn stop(&self) {
        drop(
            self.inner
                .tx
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
        let hs = std::mem::take(&mut *self.inner.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for h in hs {
            let _ = h.join();
        }
    }
}
