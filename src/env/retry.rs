//! [`RetryEnv`]: the engine's bounded retry of operations that did not run (`EINTR`, `EAGAIN`).
//!
//! Every storage and database wraps the environment it is given in a [`RetryEnv`] once
//! ([`wrap`]), so the retry is the engine's policy, not each environment's: a user's
//! environment, a FUSE or NFS mount whose calls a signal can interrupt, or a test environment
//! injecting `EINTR`/`EAGAIN` ([`crate::env::testing::Fault::Eintr`]) all get it.
//!
//! Policy: an operation failing with `EINTR` (a signal arrived before it completed) or `EAGAIN`
//! (the resource was momentarily unavailable) is called again, at most [`MAX_RETRIES`] times;
//! after that its last error is returned (and handled like any other: a failed write or sync
//! poisons). Every other error is returned at once. This holds for syncs too: design.md invariant I2
//! forbids retrying a *failed* `fdatasync` into success, because the kernel may have dropped the
//! dirty pages it could not write; `EINTR`/`EAGAIN` say the call did not complete its work, and
//! a writeback failure stays reported to the next `fdatasync` of every descriptor open at the
//! time (the kernel's per-file error sequence), so a retried sync cannot hide it. The io_uring
//! lanes apply the same rule to their completions ([`crate::env::uring`]).
//!
//! Retrying is safe for every operation because each is positional or idempotent when it did
//! not run: a positional write or read writes or reads the same bytes again; `create_dir` is
//! `Ok` when the directory exists; a `link` the journal makes treats `EEXIST` as done.

use std::io::IoSlice;
use std::path::Path;
use std::sync::Arc;

use super::{EnvFile, EnvResult, JournalIo, OpenMode, Run, StorageEnv, WriteMode};

/// Calls of one operation after its first, when each fails with `EINTR` or `EAGAIN` (the same
/// bound as the io_uring lanes' resubmissions).
pub const MAX_RETRIES: u32 = 16;

/// True for the errors that say the call did not run to completion and may simply be made
/// again: `EINTR`, `EAGAIN`.
fn transient(e: &super::EnvError) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EAGAIN))
}

/// Calls `op` until it succeeds, fails with an error other than `EINTR`/`EAGAIN`, or has been
/// retried [`MAX_RETRIES`] times.
fn retry<T>(mut op: impl FnMut() -> EnvResult<T>) -> EnvResult<T> {
    let mut tries = 0;
    // Bounded: at most MAX_RETRIES + 1 calls.
    loop {
        match op() {
            Err(e) if transient(&e) && tries < MAX_RETRIES => {
                tries += 1;
                tracing::debug!(error = %e, tries, "retrying an interrupted file operation");
            }
            r => return r,
        }
    }
}

/// Wraps `env` in a [`RetryEnv`], unless it is one already.
pub fn wrap(env: Arc<dyn StorageEnv>) -> Arc<dyn StorageEnv> {
    if env.retry_inner().is_some() {
        return env;
    }
    Arc::new(RetryEnv { inner: env })
}

/// A storage environment retrying, a bounded number of times, the operations of an inner one
/// that fail with `EINTR` or `EAGAIN` (see the module documentation). `exists`, `len`,
/// `allocated_bytes`, `raw_fd` and `write_back` (not a durability operation) pass through.
#[derive(Debug)]
pub struct RetryEnv {
    inner: Arc<dyn StorageEnv>,
}

impl StorageEnv for RetryEnv {
    fn open(&self, path: &Path, mode: OpenMode) -> EnvResult<Arc<dyn EnvFile>> {
        let inner = retry(|| self.inner.open(path, mode))?;
        Ok(Arc::new(RetryFile { inner }))
    }
    fn exists(&self, path: &Path) -> bool {
        self.inner.exists(path)
    }
    fn create_dir(&self, path: &Path) -> EnvResult<()> {
        retry(|| self.inner.create_dir(path))
    }
    fn sync_dir(&self, path: &Path) -> EnvResult<()> {
        retry(|| self.inner.sync_dir(path))
    }
    fn list_dir(&self, path: &Path) -> EnvResult<Vec<String>> {
        retry(|| self.inner.list_dir(path))
    }
    fn link(&self, from: &Path, to: &Path) -> EnvResult<()> {
        retry(|| self.inner.link(from, to))
    }
    fn rename(&self, from: &Path, to: &Path) -> EnvResult<()> {
        retry(|| self.inner.rename(from, to))
    }
    fn remove_file(&self, path: &Path) -> EnvResult<()> {
        retry(|| self.inner.remove_file(path))
    }
    fn remove_dir_all(&self, path: &Path) -> EnvResult<()> {
        retry(|| self.inner.remove_dir_all(path))
    }
    fn retry_inner(&self) -> Option<&Arc<dyn StorageEnv>> {
        Some(&self.inner)
    }
}

/// A file opened through a [`RetryEnv`].
#[derive(Debug)]
struct RetryFile {
    inner: Arc<dyn EnvFile>,
}

impl EnvFile for RetryFile {
    fn path(&self) -> &Path {
        self.inner.path()
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> EnvResult<()> {
        retry(|| self.inner.read_exact_at(buf, offset))
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> EnvResult<()> {
        retry(|| self.inner.write_all_at(buf, offset))
    }
    fn write_vectored_all_at(&self, bufs: &[IoSlice<'_>], offset: u64) -> EnvResult<()> {
        retry(|| self.inner.write_vectored_all_at(bufs, offset))
    }
    fn sync_data(&self) -> EnvResult<()> {
        retry(|| self.inner.sync_data())
    }
    fn write_vectored_and_sync(
        &self,
        bufs: &[IoSlice<'_>],
        offset: u64,
        io: JournalIo,
    ) -> EnvResult<()> {
        retry(|| self.inner.write_vectored_and_sync(bufs, offset, io))
    }
    fn write_runs(&self, runs: &[Run<'_>], mode: WriteMode) -> EnvResult<()> {
        retry(|| self.inner.write_runs(runs, mode))
    }
    fn write_back(&self, offset: u64, len: u64, wait: bool) -> EnvResult<()> {
        self.inner.write_back(offset, len, wait)
    }
    fn allocate(&self, offset: u64, len: u64) -> EnvResult<()> {
        retry(|| self.inner.allocate(offset, len))
    }
    fn punch_hole(&self, offset: u64, len: u64) -> EnvResult<()> {
        retry(|| self.inner.punch_hole(offset, len))
    }
    fn set_len(&self, len: u64) -> EnvResult<()> {
        retry(|| self.inner.set_len(len))
    }
    fn len(&self) -> EnvResult<u64> {
        self.inner.len()
    }
    fn allocated_bytes(&self) -> EnvResult<u64> {
        self.inner.allocated_bytes()
    }
    fn raw_fd(&self) -> std::os::fd::RawFd {
        self.inner.raw_fd()
    }
    fn write_zeros_uncached(&self, offset: u64, len: u64) -> EnvResult<()> {
        retry(|| self.inner.write_zeros_uncached(offset, len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::testing::{Fault, HookedEnv, OpKind};
    use crate::env::DefaultEnv;

    #[test]
    fn eintr_and_eagain_are_retried_a_bounded_number_of_times() {
        let d = tempfile::tempdir().unwrap();
        let hooked = HookedEnv::new(Arc::new(DefaultEnv::new()));
        let env = wrap(Arc::new(hooked.clone()));
        // Wrapping twice adds nothing.
        let again = wrap(env.clone());
        assert!(Arc::ptr_eq(&env, &again));
        let f = env.open(&d.path().join("f"), OpenMode::Create).unwrap();
        for n in 1..=MAX_RETRIES as u64 {
            hooked.fail(OpKind::Write, n, Fault::Eintr);
        }
        f.write_all_at(b"x", 0).unwrap();
        assert_eq!(hooked.count(OpKind::Write), MAX_RETRIES as u64 + 1);
        hooked.fail_always(OpKind::SyncData, "", Fault::Eagain);
        let e = f.sync_data().unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EAGAIN));
        assert_eq!(hooked.count(OpKind::SyncData), MAX_RETRIES as u64 + 1);
        // Any other error is returned at once.
        hooked.clear();
        hooked.fail(OpKind::SyncData, 1, Fault::Eio);
        assert_eq!(f.sync_data().unwrap_err().raw_os_error(), Some(libc::EIO));
        assert_eq!(hooked.count(OpKind::SyncData), 1);
    }
}
