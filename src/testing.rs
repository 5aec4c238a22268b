//! Internals that tests inspect (cargo feature `testing`, off by default; not a stable API).
//!
//! The integration tests in `tests/` damage files on purpose, read journal files back and count
//! what the engine did; they need a few internals that a library user never does. They are
//! re-exported here, and only here, so that the public API stays what `docs/ARCHITECTURE.md`
//! lists ("Public surface"). The test storage environments (power loss, fault injection,
//! recording, io_uring lane faults) are in [`crate::env::testing`], behind the same feature.
//!
//! `cargo test` turns the feature on through omnibus's dev-dependency on itself
//! (`Cargo.toml`); a library user gets none of this.

/// Page layout (docs/design.md, section 2): the 32-byte common page header, checksums, views of
/// branch pages, and the two header pages.
pub mod page {
    pub use crate::page::node::BranchView;
    pub use crate::page::{
        seal, verify_checksum, PageHeader, PageKind, BODY_LEN, HEADER_LEN, PAGE_SIZE,
    };

    /// Header pages 0 and 1 (docs/design.md, section 2.2): decoding a slot, choosing the newest
    /// valid one.
    pub mod header {
        pub use crate::page::header::{choose, decode, Header, Slot, FORMAT_VERSION, MAGIC};
    }
}

/// The journal's records (docs/design.md, section 3) and the scan that recovery reads them
/// with.
pub mod journal {
    pub use crate::journal::record::{RecordHeader, RecordKind, BATCH_ALIGN, RECORD_HEADER_LEN};
    pub use crate::journal::{file_name, parse_file_name};

    /// Reading a storage's `Journals/` back: the journal files in a directory and the scan of
    /// one file's records.
    pub mod recovery {
        pub use crate::journal::recovery::{list, scan, ScanEnd};
    }
}

/// Names in a storage's directory (docs/design.md, section 1): the data file, the lock file,
/// the journal directory and a database's directory of branch storages.
pub mod layout {
    pub use crate::layout::{
        BACKUP_MARKER, DATA_FILE, INDEXES_DIR, JOURNALS_DIR, LOCK_FILE, PARTIAL_DATA_FILE,
    };
}

/// The check behind "executors never block on the disk": blocking calls the default storage
/// environment saw on threads the actor runtime marked as executors.
pub mod executor_guard {
    pub use crate::env::executor_guard::{
        blocking_calls_on_executors, first_blocking_call_on_executor,
    };
}

/// Runs a background apply of `storage`'s write buffer (docs/design.md 16.1) on the calling
/// thread, as the flush service does, calling `between` once the frozen entries are in the tree
/// and before the apply publishes: write transactions `between` begins are logical-only (or
/// take the writer back), so a test decides exactly what commits while an apply runs.
/// `Ok(true)` when the apply was published.
///
/// Errors: as [`crate::WriteTransaction::commit`].
pub fn apply_in_background(
    storage: &crate::Storage,
    between: &mut dyn FnMut(),
) -> crate::Result<bool> {
    crate::txn::apply_in_background_with(&storage.inner, between)
}
