//! The `LOCK` file: a read-write open's exclusive `flock`, and the reader table in its bytes
//! (`readers.rs`), where read-only opens in any process take a slot instead of a lock, as
//! LMDB's lock file serves its readers (design.md 6.2, 6.5). Where `LOCK` cannot be written
//! (read-only media, no permission), a read-only open takes a shared `flock` instead, which
//! excludes writers as before the table existed.

use std::fs::File;
use std::path::Path;

use crate::error::{Error, Result};
use crate::layout::{BACKUP_MARKER, DATA_FILE, LOCK_FILE};

use super::damage::unfinished_backup;
use super::readers::{ReaderSlot, ReaderTable};

/// What an open storage holds of its `LOCK` file, released when dropped: a read-write open's
/// `flock` and the reader table (`table`, whose open file holds the `flock`); a read-only
/// open's reader slot (`slot`, with the table), or, where the table cannot be written, a shared
/// `flock` (`file`); or nothing, a read-only open where `LOCK` could not be opened (missing,
/// not readable, on read-only media without one), which proceeds without a lock (design.md
/// 6.2).
#[derive(Debug, Default)]
pub(crate) struct Lock {
    /// A read-only open's slot in the reader table (dropped first: it frees the slot).
    slot: Option<ReaderSlot>,
    /// The reader table (a read-write open's `flock` is on its file).
    table: Option<std::sync::Arc<ReaderTable>>,
    /// A read-only open's shared `flock`, where the table could not be opened for writing.
    #[allow(dead_code)]
    file: Option<File>,
}

impl Lock {
    /// A read-only open's reader slot, when it has one.
    pub fn slot(&self) -> Option<&ReaderSlot> {
        self.slot.as_ref()
    }

    /// The reader table, when this open has it (a read-write open, or a read-only one with a
    /// slot).
    pub fn table(&self) -> Option<&ReaderTable> {
        self.table.as_deref()
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        // A read-write open's close: its pid leaves the table before its `flock` is released
        // (the table's file closes after this), so a later writer's pid is never cleared.
        if self.slot.is_none() {
            if let Some(t) = &self.table {
                t.clear_writer();
            }
        }
    }
}

/// Holder of a LOCK that a read-write opener holds, for [`Error::AlreadyOpen`].
const HELD_BY_WRITER: &str = "a read-write opener";
/// Holder of a LOCK that read-only openers hold, for [`Error::AlreadyOpen`].
const HELD_BY_READERS: &str = "read-only openers";

/// Takes `<dir>/LOCK`. A read-write open creates the file, takes its `flock` exclusively
/// (non-blocking), opens the reader table, marks itself the live writer and clears the slots of
/// dead readers. A read-only open never creates the file: it opens it read-write and claims a
/// reader slot (any number of readers, in any process, beside one writer or none); where the
/// file cannot be opened for writing (`EACCES`, `EROFS`) it opens it for reading and takes its
/// `flock` shared (excluding writers, as before the table existed), and where it cannot be
/// opened at all (missing), it proceeds without a lock.
///
/// Errors: [`Error::AlreadyOpen`] naming the holder's mode when the `flock` is held in a mode
/// that excludes this open; [`Error::TooManyReaders`] when every reader slot is live;
/// [`Error::Corruption`] when `LOCK` holds something other than a reader table; an I/O error
/// opening or locking the file.
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
    if read_only {
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&lock_path)
        {
            Ok(f) => match ReaderTable::open(f, &lock_path) {
                Ok(table) => {
                    let table = std::sync::Arc::new(table);
                    let slot = table.claim()?;
                    return Ok(Lock {
                        slot: Some(slot),
                        table: Some(table),
                        file: None,
                    });
                }
                Err(e) if no_range_locks(&e) => {
                    tracing::debug!(path = %lock_path.display(), error = %e, "no byte-range locks on LOCK: a shared flock instead of a reader slot");
                }
                Err(e) => return Err(e),
            },
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) if lock_unavailable(&e) => {
                tracing::debug!(path = %lock_path.display(), error = %e, "LOCK is not writable: a shared flock instead of a reader slot");
            }
            Err(e) => return Err(env_err("open", &lock_path, e)),
        }
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
            return Ok(Lock::default());
        }
        Err(e) => return Err(env_err("open", &lock_path, e)),
    };
    let op = if read_only {
        Op::NonBlockingLockShared
    } else {
        Op::NonBlockingLockExclusive
    };
    match rustix::fs::flock(&lock_file, op) {
        Ok(()) if read_only => Ok(Lock {
            slot: None,
            table: None,
            file: Some(lock_file),
        }),
        Ok(()) => {
            let dup = lock_file
                .try_clone()
                .map_err(|e| env_err("dup", &lock_path, e))?;
            let table = match ReaderTable::open(dup, &lock_path) {
                Ok(t) => t,
                Err(e) if no_range_locks(&e) => {
                    // Without the table, readers take the shared flock and wait for no writer.
                    tracing::debug!(path = %lock_path.display(), error = %e, "no byte-range locks on LOCK: no reader table");
                    return Ok(Lock {
                        slot: None,
                        table: None,
                        file: Some(lock_file),
                    });
                }
                Err(e) => return Err(e),
            };
            drop(lock_file);
            table.mark_writer()?;
            let cleared = table.sweep()?;
            if cleared > 0 {
                tracing::info!(path = %lock_path.display(), cleared, "cleared the reader slots of dead processes");
            }
            Ok(Lock {
                slot: None,
                table: Some(std::sync::Arc::new(table)),
                file: None,
            })
        }
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
            Ok(Lock::default())
        }
        Err(e) => Err(env_err(
            "flock",
            &lock_path,
            std::io::Error::from_raw_os_error(e.raw_os_error()),
        )),
    }
}

/// True when `e` says the file system has no open-file-description byte-range locks (some FUSE
/// and network file systems): the reader table cannot be used there.
fn no_range_locks(e: &Error) -> bool {
    matches!(
        e,
        Error::Io { source, .. } if matches!(
            source.raw_os_error(),
            Some(libc::ENOLCK | libc::EOPNOTSUPP | libc::EINVAL | libc::ENOSYS)
        )
    )
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

/// True when a read-write opener holds the storage in `dir` now (its lock in the reader
/// table, `readers.rs`); false where `LOCK` cannot be opened for writing or holds no table.
pub(crate) fn writer_live(dir: &Path) -> bool {
    let lock_path = dir.join(LOCK_FILE);
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&lock_path)
        .ok()
        .and_then(|f| ReaderTable::open(f, &lock_path).ok())
        .is_some_and(|t| t.writer_live())
}
