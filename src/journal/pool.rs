//! The pool of pre-zeroed journal files (as Voron's zeroed journal pool): whole files of the
//! configured journal size, zeroed and synced in the background by one pool thread per journal
//! (`omnibus-journal-pool`, I/O priority best effort 7) as `<number>.zeroed` in the journal
//! directory, so a rotation renames a ready file into place instead of zeroing one on the commit
//! path. The next file is prepared only once the current one is half full (a short session
//! writes no whole file of zeros). Files left over from an earlier open are taken into the
//! pool at open, and released files of this session go back to it (`files.rs` decides when a
//! file may be recycled).
//!
//! The pool thread writes and syncs only `.zeroed` files that are not journal files yet; it
//! stops (and is joined) when the journal is dropped.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use super::lock;
use super::Journal;
use crate::env::{OpenMode, StorageEnv};
use crate::error::{Error, Result};

/// Suffix of the pre-zeroed files in the pool.
pub(super) const POOL_SUFFIX: &str = ".zeroed";

/// Pre-zeroed journal files prepared in the background.
pub(super) struct Pool {
    /// Files ready to become journal files, oldest first.
    ready: Mutex<VecDeque<PathBuf>>,
    /// Wakes the pool thread (a file was taken, it is wanted, or the journal is dropped).
    pub(super) cv: Condvar,
    stop: AtomicBool,
    /// Set once the current file is half full: only then is the next file prepared, so a short
    /// session (a command-line lookup) never writes a whole journal file of zeros.
    pub(super) wanted: AtomicBool,
    /// Files to keep ready (the journal's `pool_files`; 0 = no pool).
    pub(super) target: usize,
    /// Bytes of zeros written into new pool files since open.
    pub(super) zero_bytes: AtomicU64,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Pool {
    /// An empty pool that keeps `target` files ready once started.
    pub(super) fn new(target: usize) -> Pool {
        Pool {
            ready: Mutex::new(Default::default()),
            cv: Condvar::new(),
            stop: AtomicBool::new(false),
            wanted: AtomicBool::new(false),
            target,
            zero_bytes: AtomicU64::new(0),
            thread: Mutex::new(None),
        }
    }

    /// At open: leftover pool files in `dir` from an earlier open, `file_size` bytes long,
    /// are ready to use (when this journal keeps a pool); others are removed.
    pub(super) fn adopt_leftovers(
        &self,
        env: &dyn StorageEnv,
        dir: &Path,
        file_size: u64,
    ) -> Result<()> {
        for name in env.list_dir(dir)? {
            if name.ends_with(POOL_SUFFIX) {
                let p = dir.join(&name);
                let ok = env
                    .open(&p, OpenMode::Existing)
                    .and_then(|f| f.len())
                    .map(|l| l == file_size)
                    .unwrap_or(false);
                if ok && self.target > 0 {
                    lock(&self.ready).push_back(p);
                } else {
                    let _ = env.remove_file(&p);
                }
            }
        }
        Ok(())
    }

    /// Takes the oldest ready file, if any (and wakes the thread to prepare another).
    pub(super) fn take(&self) -> Option<PathBuf> {
        let p = lock(&self.ready).pop_front();
        if p.is_some() {
            self.cv.notify_all();
        }
        p
    }

    /// Adds a ready file (a recycled one).
    pub(super) fn put(&self, p: PathBuf) {
        lock(&self.ready).push_back(p);
    }

    /// Files ready now.
    pub(super) fn ready_len(&self) -> usize {
        lock(&self.ready).len()
    }

    /// Stops the pool thread and waits for it (a file in preparation is finished first).
    pub(super) fn stop(&self) {
        {
            let _g = lock(&self.ready);
            self.stop.store(true, Ordering::Release);
        }
        self.cv.notify_all();
        if let Some(h) = lock(&self.thread).take() {
            let _ = h.join();
        }
    }
}

/// The pool thread: keeps `target` whole pre-zeroed files ready (`<number>.zeroed`, synced).
pub(super) fn start_pool(j: &Arc<Journal>) {
    let pool = j.pool.clone();
    let env = j.env.clone();
    let dir = j.dir.clone();
    let size = j.file_size;
    let mut k = j.current_no() * 1000;
    let h = std::thread::Builder::new()
        .name("omnibus-journal-pool".into())
        .spawn(move || {
            if let Err(e) = crate::env::set_thread_io_priority(7) {
                tracing::debug!(error = %e, "ioprio_set failed for the journal pool thread");
            }
            pool_loop(&pool, &*env, &dir, size, &mut k)
        });
    if let Ok(h) = h {
        *lock(&j.pool.thread) = Some(h);
    }
}

fn pool_loop(pool: &Pool, env: &dyn StorageEnv, dir: &Path, size: u64, k: &mut u64) {
    loop {
        if pool.stop.load(Ordering::Acquire) {
            return;
        }
        let g = lock(&pool.ready);
        if g.len() < pool.target && pool.wanted.load(Ordering::Acquire) {
            drop(g);
            *k += 1;
            let p = dir.join(format!("pool-{k:016}{POOL_SUFFIX}"));
            let r = env
                .open(&p, OpenMode::CreateNew)
                .map_err(Error::from)
                .and_then(|f| {
                    // A new file: nothing of it is cached, so the zeros can bypass the cache.
                    f.write_zeros_uncached(0, size)?;
                    f.sync_data()?;
                    Ok(())
                });
            match r {
                Ok(()) => {
                    pool.zero_bytes.fetch_add(size, Ordering::Relaxed);
                    lock(&pool.ready).push_back(p)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "preparing a pre-zeroed journal file failed");
                    let _ = env.remove_file(&p);
                    return;
                }
            }
            continue;
        }
        // Checked under the lock the stopper notifies with: a stop is never missed.
        if pool.stop.load(Ordering::Acquire) {
            return;
        }
        let _ = pool
            .cv
            .wait_timeout(g, std::time::Duration::from_millis(200));
    }
}
