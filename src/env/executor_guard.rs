//! The check behind "executors never block on the disk": a thread-local flag marking the
//! threads that run async tasks (the actor runtime's glommio executors), and a check that every
//! blocking call of [`DefaultEnv`](super::DefaultEnv) makes first.
//!
//! An executor thread runs many tasks (storage actors, index actors, a flusher, a reader);
//! a task that waits for the disk holds up all of them for as long as the disk takes (an
//! `fdatasync` or `fallocate` is milliseconds). So the actor runtime marks each executor thread
//! it starts ([`mark_executor_thread`]) and hands every call that may wait for the disk to a
//! thread of an I/O pool. The core knows nothing of executors (it never imports the actors or
//! glommio): it only keeps the flag and checks it.
//!
//! A blocking call made on a marked thread is a *violation*: it is counted
//! ([`blocking_calls_on_executors`], in every build; the first one is described by
//! [`first_blocking_call_on_executor`]) and, in debug builds (`debug_assertions`), panics with
//! the operation's name, path and thread, so a regression fails the test suite. What is checked, in
//! [`DefaultEnv`](super::DefaultEnv): opening and creating files, writes (`pwrite`, `pwritev`,
//! `O_DIRECT` zero writes), `fdatasync`, `fallocate` (growth and `PUNCH_HOLE`), `ftruncate`,
//! `pread`, and the directory operations (`mkdir`, `readdir`, `stat` of a path, `fsync` of a
//! directory, `link`, `rename`, `unlink`, removing a tree). Not checked: `fstat` of an open
//! file (`EnvFile::len`, `EnvFile::allocated_bytes`: its inode is in memory, no disk wait),
//! and page faults through the read-only map, which no code can see (a read of a page that is
//! not cached waits for the disk on whatever thread touches it; readers on executors accept
//! that, as every `mmap` engine does).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

thread_local! {
    /// True on a thread marked with [`mark_executor_thread`].
    static ON_EXECUTOR: Cell<bool> = const { Cell::new(false) };
}

/// Blocking calls made on executor threads since the process started.
static VIOLATIONS: AtomicU64 = AtomicU64::new(0);

/// The first violation: operation, path and thread.
static FIRST: Mutex<Option<String>> = Mutex::new(None);

/// Marks the calling thread as an executor (a thread running async tasks that must never wait
/// for the disk) for the rest of its life. The actor runtime calls it first thing on each
/// executor thread it starts (crate-internal: applications cannot mark their own threads).
/// Cannot fail.
pub fn mark_executor_thread() {
    ON_EXECUTOR.with(|f| f.set(true));
}

/// True when the calling thread was marked with [`mark_executor_thread`].
pub fn on_executor() -> bool {
    ON_EXECUTOR.with(Cell::get)
}

/// Blocking calls of the default environment made on executor threads since the process
/// started (a count; 0 unless an executor blocked on the disk). Counted in every build.
#[cfg(any(test, feature = "testing"))]
pub fn blocking_calls_on_executors() -> u64 {
    VIOLATIONS.load(Ordering::Relaxed)
}

/// The first blocking call made on an executor thread (operation, path and thread name), or
/// `None` when there was none.
#[cfg(any(test, feature = "testing"))]
pub fn first_blocking_call_on_executor() -> Option<String> {
    FIRST.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Called by every blocking call of the default environment before it is made: on an executor
/// thread it counts the violation and, in debug builds, panics naming `op` and `path`.
pub(crate) fn check_blocking(op: &'static str, path: &std::path::Path) {
    if !on_executor() {
        return;
    }
    VIOLATIONS.fetch_add(1, Ordering::Relaxed);
    let what = format!(
        "{op} {} on an executor thread ({})",
        path.display(),
        std::thread::current().name().unwrap_or("unnamed")
    );
    FIRST
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(|| what.clone());
    if cfg!(debug_assertions) {
        panic!("{what}: executors must never block on the disk");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::{DefaultEnv, OpenMode, StorageEnv};

    #[test]
    fn a_blocking_call_on_a_marked_thread_is_caught() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let env = DefaultEnv::new();
        let f = env.open(&path, OpenMode::Create).unwrap();
        // Unmarked: no violation.
        let before = blocking_calls_on_executors();
        f.allocate(0, 1 << 20).unwrap();
        assert!(!on_executor());
        let r = std::thread::scope(|s| {
            s.spawn(|| {
                mark_executor_thread();
                assert!(on_executor());
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    f.allocate(1 << 20, 1 << 20)
                }))
            })
            .join()
            .unwrap()
        });
        // Other tests of this binary mark no thread, so the count moved by exactly one.
        assert_eq!(blocking_calls_on_executors(), before + 1);
        let first = first_blocking_call_on_executor().unwrap();
        assert!(first.starts_with("fallocate "), "{first}");
        if cfg!(debug_assertions) {
            let msg = r.expect_err("the check panics in debug builds");
            let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
            assert!(
                msg.contains("fallocate") && msg.contains("executor"),
                "{msg}"
            );
        } else {
            r.expect("release builds only count").unwrap();
        }
        // The marked thread is gone; this one was never marked.
        assert!(!on_executor());
    }
}
