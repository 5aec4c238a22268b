//! Errors: one public [`Error`] that every layer's error converts into.
//!
//! Layers keep their own `#[non_exhaustive]` enums where they have more than one way to fail
//! ([`crate::env::EnvError`] for file operations, [`Corruption`] for decoding); the engine returns
//! only [`Error`]. I/O errors always carry the operation (`"fdatasync"`, `"pwritev"`, ...) and the
//! path they concern.

use std::io;
use std::path::PathBuf;

use crate::env::EnvError;

/// Result of every fallible public call: `std::result::Result<T, omnibus::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Where and what: a checksum, structure or ordering violation found in a file.
///
/// `page` is set for data-file pages (page number; byte offset is `page * 8192`), `offset` for
/// journal records (byte offset of the record in the journal file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corruption {
    /// The file that holds the damaged bytes.
    pub file: PathBuf,
    /// Page number in the data file, when the damage is in a page.
    pub page: Option<u64>,
    /// Byte offset in the file, when the damage is not page-aligned (journal records).
    pub offset: Option<u64>,
    /// What is wrong, in words ("checksum mismatch", "keys out of order", ...).
    pub what: String,
}

impl std::fmt::Display for Corruption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(p) = self.page {
            write!(f, " page {p}")?;
        }
        if let Some(o) = self.offset {
            write!(f, " offset {o}")?;
        }
        write!(f, ": {}", self.what)
    }
}

/// Every error omnibus returns. New variants may be added in minor releases.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A key of 0 bytes was given; keys are 1..=[`crate::MAX_KEY_LEN`] bytes.
    #[error("key is empty: keys are 1..={max} bytes", max = crate::MAX_KEY_LEN)]
    EmptyKey,
    /// A key longer than [`crate::MAX_KEY_LEN`] (1,024) bytes. Nothing was written.
    #[error("key is {len} bytes: the limit is {max} bytes")]
    KeyTooLarge {
        /// Length of the rejected key in bytes.
        len: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// A value longer than [`crate::MAX_VALUE_LEN`] bytes. Nothing was written.
    #[error("value is {len} bytes: the limit is {max} bytes")]
    ValueTooLarge {
        /// Length of the rejected value in bytes.
        len: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// The directory exists but is not an omnibus storage (no data file and not empty, or a data
    /// file whose header pages do not carry the omnibus magic).
    #[error("{path}: not an omnibus storage: {reason}")]
    NotAStorage {
        /// The directory or file that was opened.
        path: PathBuf,
        /// Why it was rejected.
        reason: String,
    },
    /// The storage was written by an incompatible format version.
    #[error(
        "{path}: format version {found} is not supported (this build reads version {expected})"
    )]
    FormatVersion {
        /// The data file.
        path: PathBuf,
        /// Version found in the header page.
        found: u32,
        /// Version this build reads and writes.
        expected: u32,
    },
    /// A checksum, structure or ordering violation.
    #[error("corruption: {0}")]
    Corruption(Corruption),
    /// The storage (or database) is already open, in this process or another one, in a mode
    /// that excludes this open: its `LOCK` file is held with `flock`, exclusively by a
    /// read-write opener (which excludes another read-write opener; read-only openers read
    /// beside it through the reader table), or shared by read-only openers that could not
    /// write `LOCK` (which exclude a read-write open only). Also what a read-only open beside a
    /// writer returns when the writer moved the durable state under each of its 50 attempts.
    #[error("{path}: already open (its LOCK file is held by {holder})")]
    AlreadyOpen {
        /// The storage directory.
        path: PathBuf,
        /// Who holds it, in words: `"a read-write opener"` or `"read-only openers"`.
        holder: String,
    },
    /// Every slot of the storage's reader table (its `LOCK` file, 127 slots) is held by a live
    /// read-only opener: a read-only open fails until one of them closes. Slots of readers
    /// that died are free again.
    #[error("{path}: every one of its {slots} reader slots is held by a live reader")]
    TooManyReaders {
        /// The `LOCK` file.
        path: PathBuf,
        /// Slots in the table.
        slots: usize,
    },
    /// An earlier write or sync of the journal or data file failed; the storage refuses writes
    /// until it is closed and reopened (fail-stop: a failed fsync is never retried into success).
    #[error("poisoned by an earlier I/O failure ({cause}): close and reopen to recover")]
    Poisoned {
        /// The first failure, in words.
        cause: String,
    },
    /// A write was attempted on a storage opened with [`crate::Options::read_only`].
    #[error("storage is open read-only")]
    ReadOnly,
    /// A write was attempted on a database that opened with damaged storages
    /// ([`crate::Database::damaged`]) without [`crate::Options::write_with_damaged_storages`]:
    /// writes could leave the damaged indexes behind the documents for good.
    #[error("writes refused: the database has damaged storages ({}); repair or drop them, or open with Options::write_with_damaged_storages", storages.join(", "))]
    DatabaseDamaged {
        /// The damaged storages' names.
        storages: Vec<String>,
    },
    /// [`crate::Database::storage`] was asked for a branch storage the database does not have
    /// (create it with [`crate::Database::create_storage`]).
    #[error("{path}: no storage {name:?} in this database (create_storage creates one)")]
    StorageNotFound {
        /// The name asked for.
        name: String,
        /// Where it would be (`<db>/Indexes/<name>`).
        path: PathBuf,
    },
    /// A backup's destination ([`crate::Storage::backup`], [`crate::Database::backup`]) exists
    /// and is not an empty directory: a backup never writes over or beside other files.
    #[error("{path}: backup destination exists and is not an empty directory")]
    DestinationNotEmpty {
        /// The destination directory.
        path: PathBuf,
    },
    /// [`crate::Storage::backup`] or [`crate::Database::backup`] was given a destination inside
    /// the directory it copies (a copy under `Indexes/` would become a branch of the source).
    #[error("{path}: backup destination is inside the directory it copies ({source_dir})")]
    DestinationInsideSource {
        /// The destination directory.
        path: PathBuf,
        /// The storage's or database's directory.
        source_dir: PathBuf,
    },
    /// The storage was closed.
    #[error("storage is closed")]
    Closed,
    /// The closure of an actor handle's `update` (or `compare_and_swap`) panicked: its
    /// transaction was abandoned, nothing of it committed; the storage is not poisoned unless
    /// the panic came from inside the engine's own code (then [`Error::Poisoned`]).
    #[error("the update closure panicked: {message}")]
    UpdatePanicked {
        /// The panic's message (empty when it was not a string).
        message: String,
    },
    /// A `blocking_` call of an actor handle was made on one of the engine's executor threads
    /// (inside an update closure or an index's map function): it would wait for work that
    /// this very thread (or the executor it stops) must do, for ever. Nothing was sent. Use the
    /// `UpdateTransaction` given to the closure for the storage it updates; other storages'
    /// writes belong after the update returns.
    #[error("{call}: a blocking call on one of the engine's executor threads would wait on that executor for ever")]
    BlockingOnExecutor {
        /// The call refused, as `StorageHandle::blocking_put`.
        call: &'static str,
    },
    /// [`crate::Storage::try_begin_write`] found another write transaction open.
    #[error("another write transaction is open on this storage")]
    WriteInProgress,
    /// An option is out of its documented range.
    #[error("invalid options: {0}")]
    InvalidOptions(String),
    /// A storage name is not 1..=255 bytes of UTF-8 without `/`, `\`, NUL, or is `.` / `..`.
    #[error("invalid storage name {name:?}: {reason}")]
    InvalidStorageName {
        /// The rejected name.
        name: String,
        /// The rule it breaks.
        reason: &'static str,
    },
    /// A branch storage directory is on another file system than the root, so journal files
    /// cannot be hard-linked into it (use [`crate::JournalMode::Separate`], or move it).
    #[error("{path}: on another file system than the database root: shared journal files cannot be hard-linked there")]
    CrossDevice {
        /// The branch directory.
        path: PathBuf,
    },
    /// An operating-system limit is too low for what was asked (locked memory for executors);
    /// the message says how much is needed and how to grant it.
    #[error("{0}")]
    ResourceLimit(String),
    /// An index stopped following the documents: its map function panicked on a document, or
    /// reading the documents or writing the index storage failed. Only that index is affected
    /// (the documents and the other indexes keep working); it is returned by
    /// `DatabaseHandle::wait_for_indexes` and shown in `DatabaseHandle::index_stats` (the
    /// `actors` module) until the index is defined again.
    #[error("index {index:?} is poisoned: {cause}")]
    IndexPoisoned {
        /// The index (its branch storage's name).
        index: String,
        /// What stopped it.
        cause: IndexFailure,
    },
    /// A read-write open found the file system full where it needs new space: opening starts
    /// a new journal file (recovery never writes after an older file's last batch, which a
    /// crash may have torn) and pre-zeroes its first bytes. Nothing was changed (the new file is
    /// removed again). Free at least `needed` bytes on the file system of `path` and open again;
    /// a read-only open ([`crate::Options::read_only`]) needs no space, so reads and backups
    /// work meanwhile. [`Error::is_no_space`] is true.
    #[error("{path}: the file system is full: {what} needs {needed} bytes free ({available} available); free space and open again (a read-only open needs none)")]
    NoSpace {
        /// The file that could not be written.
        path: PathBuf,
        /// What needed the space, in words.
        what: &'static str,
        /// Bytes needed at least.
        needed: u64,
        /// Bytes available to this user on that file system when it failed (`statvfs`).
        available: u64,
    },
    /// A group transaction ([`crate::Database::begin_group`]) was refused: see [`GroupError`]
    /// for why. Nothing of the group was written.
    #[error("group transaction: {0}")]
    Group(#[from] GroupError),
    /// A file operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// The operation (`"open"`, `"pwritev"`, `"fdatasync"`, `"fallocate"`, ...).
        op: &'static str,
        /// The file or directory it concerned.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
}

/// Why a group transaction ([`crate::Database::begin_group`], [`crate::GroupTransaction`]) was
/// refused ([`Error::Group`]). Nothing of the group was written when one is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GroupError {
    /// More storages than [`crate::MAX_GROUP_STORAGES`] (256) were named in one group.
    #[error("{count} storages in one group: the limit is {max}")]
    TooManyStorages {
        /// Storages named.
        count: usize,
        /// The limit ([`crate::MAX_GROUP_STORAGES`]).
        max: usize,
    },
    /// At commit, the group's journal record (every storage's part: its page images or
    /// operations) would pass [`crate::MAX_GROUP_BYTES`] (64 MiB). The group was aborted:
    /// nothing of it is written, every storage stays usable. Split the work into smaller groups.
    #[error("the group's journal record would be {bytes} bytes: the limit is {max} bytes")]
    TooLarge {
        /// Bytes the record would take (headers included).
        bytes: u64,
        /// The limit in bytes ([`crate::MAX_GROUP_BYTES`]).
        max: u64,
    },
    /// The database keeps a journal per storage ([`crate::JournalMode::Separate`]): nothing
    /// can make one commit atomic across storages there. Open it with
    /// [`crate::JournalMode::Shared`] (the default).
    #[error("the database has a journal per storage (JournalMode::Separate): groups need the shared journal")]
    SeparateJournals,
    /// A storage named in the group is not an open storage of this database (another
    /// database's, one opened on its own with [`crate::Storage::open`], or a dropped branch).
    #[error("{path}: not an open storage of this database")]
    NotInDatabase {
        /// The storage's directory.
        path: PathBuf,
    },
    /// The same storage was named twice in one group.
    #[error("{path}: named twice in one group")]
    Duplicate {
        /// The storage's directory.
        path: PathBuf,
    },
    /// A read or write of the group named a storage that is not one of the group's.
    #[error("{path}: not a storage of this group")]
    NotInGroup {
        /// The storage's directory.
        path: PathBuf,
    },
}

/// Why an index stopped following the documents ([`Error::IndexPoisoned`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum IndexFailure {
    /// The index's map function panicked on the document with key `key`; `message` is the
    /// panic's message (empty when it was not a string).
    MapPanicked {
        /// The document's key.
        key: Vec<u8>,
        /// The panic message.
        message: String,
    },
    /// Reading the documents or writing the index storage failed with `0`.
    Storage(Box<Error>),
}

impl std::fmt::Display for IndexFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IndexFailure::MapPanicked { key, message } => write!(
                f,
                "the map function panicked on document {:?}: {message}",
                String::from_utf8_lossy(key)
            ),
            IndexFailure::Storage(e) => write!(f, "{e}"),
        }
    }
}

impl Error {
    /// A file read short (`UnexpectedEof`): beside a writer process, one it created or emptied
    /// while it was read; a read-only open takes its point again (design.md 6.5).
    pub(crate) fn is_short_read(&self) -> bool {
        matches!(self, Error::Io { source, .. } if source.kind() == io::ErrorKind::UnexpectedEof)
    }

    /// True when this is an I/O error with `ENOSPC` (the file system is full), or
    /// [`Error::Poisoned`] by one (a later commit after a batch failed on a full disk: free
    /// space, then close and reopen). Regression: the poisoned commits after a
    /// full disk said `false`, so a program could not tell a full disk from a broken one.
    pub fn is_no_space(&self) -> bool {
        match self {
            Error::Io { source, .. } => source.raw_os_error() == Some(libc::ENOSPC),
            Error::NoSpace { .. } => true,
            // The cause is the failed operation's error as displayed, whose OS error std
            // prints as "(os error N)".
            Error::Poisoned { cause } => cause.contains(&format!("(os error {})", libc::ENOSPC)),
            _ => false,
        }
    }

    /// True for errors that mean the files are damaged ([`Error::Corruption`]).
    pub fn is_corruption(&self) -> bool {
        matches!(self, Error::Corruption(_))
    }

    pub(crate) fn corruption(
        file: impl Into<PathBuf>,
        page: Option<u64>,
        offset: Option<u64>,
        what: impl Into<String>,
    ) -> Error {
        Error::Corruption(Corruption {
            file: file.into(),
            page,
            offset,
            what: what.into(),
        })
    }
}

impl From<EnvError> for Error {
    fn from(e: EnvError) -> Error {
        Error::Io {
            op: e.op,
            path: e.path,
            source: e.source,
        }
    }
}

impl Clone for Error {
    /// Errors are cloned to answer every waiter of a failed group commit; the `io::Error` is
    /// rebuilt from its OS code (or kind and message).
    fn clone(&self) -> Error {
        match self {
            Error::EmptyKey => Error::EmptyKey,
            Error::KeyTooLarge { len, max } => Error::KeyTooLarge {
                len: *len,
                max: *max,
            },
            Error::ValueTooLarge { len, max } => Error::ValueTooLarge {
                len: *len,
                max: *max,
            },
            Error::NotAStorage { path, reason } => Error::NotAStorage {
                path: path.clone(),
                reason: reason.clone(),
            },
            Error::FormatVersion {
                path,
                found,
                expected,
            } => Error::FormatVersion {
                path: path.clone(),
                found: *found,
                expected: *expected,
            },
            Error::Corruption(c) => Error::Corruption(c.clone()),
            Error::AlreadyOpen { path, holder } => Error::AlreadyOpen {
                path: path.clone(),
                holder: holder.clone(),
            },
            Error::TooManyReaders { path, slots } => Error::TooManyReaders {
                path: path.clone(),
                slots: *slots,
            },
            Error::Poisoned { cause } => Error::Poisoned {
                cause: cause.clone(),
            },
            Error::ReadOnly => Error::ReadOnly,
            Error::DatabaseDamaged { storages } => Error::DatabaseDamaged {
                storages: storages.clone(),
            },
            Error::Closed => Error::Closed,
            Error::StorageNotFound { name, path } => Error::StorageNotFound {
                name: name.clone(),
                path: path.clone(),
            },
            Error::DestinationNotEmpty { path } => {
                Error::DestinationNotEmpty { path: path.clone() }
            }
            Error::DestinationInsideSource { path, source_dir } => Error::DestinationInsideSource {
                path: path.clone(),
                source_dir: source_dir.clone(),
            },
            Error::WriteInProgress => Error::WriteInProgress,
            Error::BlockingOnExecutor { call } => Error::BlockingOnExecutor { call },
            Error::UpdatePanicked { message } => Error::UpdatePanicked {
                message: message.clone(),
            },
            Error::InvalidOptions(s) => Error::InvalidOptions(s.clone()),
            Error::InvalidStorageName { name, reason } => Error::InvalidStorageName {
                name: name.clone(),
                reason,
            },
            Error::CrossDevice { path } => Error::CrossDevice { path: path.clone() },
            Error::NoSpace {
                path,
                what,
                needed,
                available,
            } => Error::NoSpace {
                path: path.clone(),
                what,
                needed: *needed,
                available: *available,
            },
            Error::ResourceLimit(s) => Error::ResourceLimit(s.clone()),
            Error::IndexPoisoned { index, cause } => Error::IndexPoisoned {
                index: index.clone(),
                cause: cause.clone(),
            },
            Error::Group(g) => Error::Group(g.clone()),
            Error::Io { op, path, source } => Error::Io {
                op,
                path: path.clone(),
                source: clone_io(source),
            },
        }
    }
}

pub(crate) fn clone_io(e: &io::Error) -> io::Error {
    match e.raw_os_error() {
        Some(code) => io::Error::from_raw_os_error(code),
        None => io::Error::new(e.kind(), e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_space_is_seen_through_poisoning() {
        let e = Error::Io {
            op: "pwritev",
            path: "/x/Journals/1.journal".into(),
            source: io::Error::from_raw_os_error(libc::ENOSPC),
        };
        assert!(e.is_no_space());
        let p = Error::Poisoned {
            cause: e.to_string(),
        };
        assert!(p.is_no_space(), "{p}");
        let eio = Error::Poisoned {
            cause: Error::Io {
                op: "fdatasync",
                path: "/x".into(),
                source: io::Error::from_raw_os_error(libc::EIO),
            }
            .to_string(),
        };
        assert!(!eio.is_no_space());
    }
}
