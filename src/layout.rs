//! What a storage directory holds, by name (docs/design.md, section 1), and the random ids a
//! new storage or copy gets. A leaf of the crate: it names no other module, so the storage and
//! the backup (which both lay out directories) depend on it and not on each other.

/// Name of the data file in a storage directory.
pub const DATA_FILE: &str = "data.pages";
/// Name of the lock file in a storage directory.
pub const LOCK_FILE: &str = "LOCK";
/// Name of the journal directory in a storage directory.
pub const JOURNALS_DIR: &str = "Journals";
/// Name of the directory of the branch storages in a database's root storage directory.
pub const INDEXES_DIR: &str = "Indexes";
/// A file a backup creates in its destination first and removes last (design.md 12): a
/// directory holding it and no data file is an unfinished backup, never opened as a storage.
pub const BACKUP_MARKER: &str = "backup-in-progress";
/// The name a backup writes a copy's data file under, renamed to [`DATA_FILE`] once the copy
/// is complete and durable.
pub const PARTIAL_DATA_FILE: &str = "data.pages.partial";

/// A random non-zero 64-bit id: a new storage's `storage_id` (the journal tells storages'
/// records apart by it) and a backup copy's.
pub(crate) fn random_id() -> u64 {
    use rand::RngCore;
    let mut id = 0;
    while id == 0 {
        id = rand::rng().next_u64();
    }
    id
}
