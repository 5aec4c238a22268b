//! The `LOCK` file's `flock`: exclusive for a read-write open, shared for read-only ones (as
//! LMDB's lock file serves its readers; design.md 6.2).

use std::fs::File;
use std::path::Path;

use crate::error::{Error, Result};
use crate::layout::{BACKUP_MARKER, DATA_FILE, LOCK_FILE};

use super::damage::unfinished_backup;

/// The `flock` an open storage holds on its `LOCK` file, released when dropped. `None`: a
/// read-only open where `LOCK` could not be opened (missing, not readable, on read-only media
/// without one), which proceeds without a lock (design.md 6.2).
#[derive(Debug)]
pub(crate) struct Lock(#[allow(dead_code)] Option<File>);

/// Holder of a LOCK that a read-write opener holds, for [`Error::AlreadyOpen`].
const HELD_BY_WRITER: &str = "a read-write opener";
/// Holder of a LOCK that read-only openers hold, for [`Error::AlreadyOpen`].
const HELD_BY_READERS: &str = "read-only openers";

/// Takes the `flock` of `<dir>/LOCK`, non-blocking. A read-write open creates the file and takes
/// it exclusively; a read-only open never creates or writes it, opens it for reading and takes it
/// shared, so that any number of read-only openers (in any process) coexist while no read-write
/// opener can, and none of them can while a read-write opener holds it. Where `LOCK` cannot be
/// opened for reading (missing, `EACCES`, `EROFS`), a read-only open proceeds without a lock.
///
/// Errors: [`Error::AlreadyOpen`] naming the holder's mode when the lock is held in a mode that
/// excludes this open; an I/O error opening or locking the file.
pub(crate) fn take_lock(dir: &Path, read_only: bool) -> Result<Lock> {
    use rustix::fs::FlockOperation as Op;
    let lock_path = dir.join(LOCK_FILE);
    if read_only && !lock_path.exists() && !dir.join(DATA_FILE).exists() {
        // The one name that matters here: this open lists nothing else.
        let names: Vec<String> = if dir.join(BACKUP_MARKER).exists() {
            vec![BACKUP_MARKER.to_string()]
        } else {
            Vec::new()
        };
        return Err(
            unfinished_backup(dir, &names).unwrap_or_else(|| Error::NotAStorage {
                path: dir.to_path_buf(),
                reason: format!("no {DATA_FILE}"),
            }),
        );
    }
    let opened = if read_only {
        std::fs::File::open(&lock_path)
    } else {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
    };
    let lock_file = match opened {
        Ok(f) => f,
        Err(e) if read_only && lock_unavailable(&e) => {
            tracing::debug!(path = %lock_path.display(), error = %e, "read-only open without a lock");
            return Ok(Lock(None));
        }
        Err(e) => return Err(env_err("open", &lock_path, e)),
    };
    let op = if read_only {
        Op::NonBlockingLockShared
    } else {
        Op::NonBlockingLockExclusive
    };
    match rustix::fs::flock(&lock_file, op) {
        Ok(()) => Ok(Lock(Some(lock_file))),
        Err(rustix::io::Errno::WOULDBLOCK) => {
            // A shared lock fails only against an exclusive one. An exclusive one fails against
            // either: a shared lock taken (and dropped) on this file tells which.
            let holder =
                if read_only || rustix::fs::flock(&lock_file, Op::NonBlockingLockShared).is_err() {
                    HELD_BY_WRITER
                } else {
                    HELD_BY_READERS
                };
            Err(Error::AlreadyOpen {
                path: dir.to_path_buf(),
                holder: holder.to_string(),
            })
        }
        Err(e)
            if read_only
                && matches!(e, rustix::io::Errno::NOLCK | rustix::io::Errno::OPNOTSUPP) =>
        {
            tracing::debug!(path = %lock_path.display(), error = %e, "read-only open without a lock (flock unsupported)");
            Ok(Lock(None))
        }
        Err(e) => Err(env_err(
            "flock",
            &lock_path,
            std::io::Error::from_raw_os_error(e.raw_os_error()),
        )),
    }
}

/// True when a read-only open may go on without `LOCK`: it is missing, or cannot be opened for
/// reading (no permission, or read-only media that never had one).
fn lock_unavailable(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOENT | libc::EACCES | libc::EPERM | libc::EROFS)
    )
}

fn env_err(op: &'static str, path: &Path, e: std::io::Error) -> Error {
    Error::Io {
        op,
        path: path.to_path_buf(),
        source: e,
    }
}
