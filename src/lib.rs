//! # omnibus
//!
//! An embedded, transactional key-value storage engine for Linux. A *storage* is a directory
//! with its own single-writer ACID transactions over a copy-on-write B+tree of 8 KiB pages,
//! read through a read-only `mmap` with lock-free snapshots, and made durable by a
//! write-ahead journal of page images (full, or diffs against the page a copy came from) with
//! group commit.
//!
//! ```no_run
//! use omnibus::{Options, Storage};
//! # fn main() -> omnibus::Result<()> {
//! let s = Storage::open("/tmp/example.omnibus", Options::default())?;
//! let mut w = s.begin_write()?;
//! w.put(b"hello", b"world")?;
//! w.commit()?; // durable: the journal record is covered by fdatasync
//! let r = s.begin_read()?;
//! assert_eq!(r.get(b"hello")?, Some(&b"world"[..]));
//! # Ok(()) }
//! ```
//!
//! See `docs/ARCHITECTURE.md` for the code map and invariants, `docs/design.md` for the
//! on-disk format and protocols.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]
// A type reachable through a public signature must be nameable (re-exported): no internal type
// leaks into the public API unnoticed.
#![warn(unnameable_types)]

mod backup;
mod btree;
mod database;
pub mod env;
mod error;
mod flush;
mod freespace;
/// Decoder entry points for the cargo-fuzz targets in `fuzz/` (cargo feature `fuzzing`, off by
/// default). Not a stable API.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod journal;
mod options;
mod page;
mod state;
mod storage;
#[cfg(feature = "testing")]
pub mod testing;
mod txn;
mod write_mode;

#[path = "../actors/mod.rs"]
pub mod actors;

pub use backup::BackupReport;
pub use btree::{CheckReport, HiddenPages, KeyRange, Range};
pub use database::{Database, DatabaseStats};
pub use env::WriteMode;
pub use error::{Corruption, Error, IndexFailure, Result};
pub use flush::FlushReport;
pub use journal::{JournalStats, Prezero};
pub use options::{Durability, FlushMode, JournalMode, Options};
pub use storage::{CompactReport, Storage, StorageStats};
pub use txn::{ReadTransaction, WriteTransaction};

/// Largest key in bytes (keys are 1..=1,024 bytes).
pub const MAX_KEY_LEN: usize = 1024;
/// Largest value in bytes: 128 MiB (values over about 2 KiB go to overflow pages).
pub const MAX_VALUE_LEN: usize = 128 << 20;
/// Page size in bytes.
pub const PAGE_SIZE: usize = page::PAGE_SIZE;
