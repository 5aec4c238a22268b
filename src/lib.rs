//! # omnibus
//!
//! An embedded, transactional key-value storage engine for Linux: ordered byte keys and values
//! in *storages* (copy-on-write B+trees of 8 KiB pages with single-writer ACID transactions and
//! lock-free snapshots), grouped into a *database* whose storages share one write-ahead journal.
//!
//! ## Database
//!
//! A [`Database`] is a directory holding a root storage (the documents) and any number of
//! branch storages (indexes, often 100 or more) under `Indexes/`. [`Database::open`] opens or
//! creates it and recovers every storage; [`Database::root`], [`Database::create_storage`] and
//! [`Database::storage`] hand out [`Storage`] handles (cheap to clone, `Send + Sync`). Each
//! storage has one [`WriteTransaction`] at a time ([`Storage::begin_write`]) and any number of
//! [`ReadTransaction`] snapshots ([`Storage::begin_read`]); reads are point gets, ordered
//! [`Range`]s (ordinary range syntax over byte strings, double-ended) and prefixes. The commits
//! of all storages that arrive while a journal batch is being written go into the next batch:
//! one write and one `fdatasync` for all of them. A [`Storage`] also opens on its own
//! ([`Storage::open`]: one directory, its own journal). [`Options`] says how (read-only or
//! not, flush thresholds and [`FlushMode`], [`JournalMode`], [`WriteMode`], the eventual-sync
//! interval, the storage environment; durability is chosen per transaction,
//! [`WriteTransaction::set_durability`]); [`Storage::flush`], [`Storage::backup`], [`Storage::compact`] and
//! [`Storage::check`] are the maintenance calls, each with its report.
//!
//! ## Embedding: threads, tokio, glommio
//!
//! - **Threads**: use the types above directly. Every call is synchronous; commits block the
//!   calling thread until durable; handles are `Send + Sync`.
//! - **The actor runtime** ([`actors`]): [`actors::Engine::start`] runs glommio executors pinned
//!   one per CPU the process may use; [`actors::DatabaseHandle`] and [`actors::StorageHandle`]
//!   send requests to a storage actor per storage, which merges the requests queued at one
//!   moment into one transaction (a [`actors::WriteBatch`] is always applied whole). Every
//!   handle method has an
//!   async form, usable from tokio, glommio or any executor (the futures are `Send`), and a
//!   `blocking_` form for plain threads; blocking disk calls run on I/O pool threads, never on
//!   an executor. The actors also keep engine indexes ([`actors::IndexDefinition`]): a branch
//!   storage fed from the root's durable commits, built from existing documents and caught up
//!   after a crash. `examples/tokio_app.rs`, `examples/glommio_app.rs` and
//!   `examples/indexes.rs` show each.
//!
//! ## Guarantees
//!
//! **Durability.** A commit returns `Ok` only once its journal record, and everything before it
//! in that journal, is covered by a successful `fdatasync` (on io_uring one linked `WRITEV` +
//! `FSYNC`): it then survives a process crash, a kernel crash and a power loss, as long as the
//! disk honours cache flushes. A commit made with [`Durability::Eventual`] returns once queued
//! and becomes durable with the next batch or within [`Options::eventual_sync_ms`]; a crash may
//! lose the last eventual commits, never part of one and never one before an acknowledged
//! immediate commit. A failed write or sync is never retried into success: the storage (with a
//! shared journal, every storage of the database) is *poisoned* and refuses writes with
//! [`Error::Poisoned`] until it is reopened, which recovers from what really reached the disk.
//!
//! **Atomicity.** A transaction is all or nothing: after a crash a storage holds exactly the
//! state after its last acknowledged commit, or after the one commit in flight, never part of a
//! transaction and never an older state. Commits reach a journal in commit order, so a crash
//! keeps a prefix of them. A [`WriteTransaction`] is per storage: after a crash each storage
//! is at its own last commit. A [`GroupTransaction`] ([`Database::begin_group`]) spans several
//! storages of a database with the shared journal: one journal record holds every storage's
//! part, and after a crash every storage of the group shows it or none does (no snapshot spans
//! storages, though: each publishes its part in turn). A commit that returned an error may or
//! may not be there after reopening.
//!
//! **Snapshots.** A [`ReadTransaction`] is one committed state (an `Arc` of it: no lock, no
//! copy) and stays that state whatever commits, flushes, backups or compactions run meanwhile;
//! reads inside a [`WriteTransaction`] see its own uncommitted writes.
//!
//! **Damage model.** Every page and journal record is checksummed. Damage found on open or read
//! is [`Error::Corruption`] naming the file and page or offset, never a panic and never repaired
//! silently; pages torn by a crash during a flush are repaired from the journal, and one damaged
//! header page of the two loses nothing. A damaged record in the last batch of a journal cannot
//! be told from a torn batch and ends the journal there (as RocksDB's point-in-time recovery);
//! one followed by later synced commits is reported. [`Storage::check`] lists every problem by
//! cause. `docs/design.md`, section 14, is the full model (and its known gaps).
//!
//! ## Example
//!
//! ```
//! use omnibus::{Database, Durability, Options};
//! # fn main() -> omnibus::Result<()> {
//! # let dir = std::env::temp_dir().join(format!("omnibus-doc-{}", std::process::id()));
//! let db = Database::open(&dir, Options::default())?;
//! let users = db.root();
//! let by_city = db.create_storage("users_by_city")?;
//!
//! // Two storages, two transactions; their commits share the journal's batches.
//! let mut w = users.begin_write()?;
//! w.put(b"user/1", br#"{"name":"Ada","city":"London"}"#)?;
//! w.commit()?; // durable: covered by fdatasync
//! let mut w = by_city.begin_write()?;
//! w.set_durability(Durability::Eventual); // acknowledged once queued
//! w.put(b"London/user/1", b"")?;
//! w.commit()?;
//!
//! let r = by_city.begin_read()?;
//! let keys: Vec<&[u8]> = r
//!     .prefix(b"London/")?
//!     .map(|kv| kv.map(|(k, _)| k))
//!     .collect::<omnibus::Result<_>>()?;
//! assert_eq!(keys, [&b"London/user/1"[..]]);
//!
//! // Closing flushes; the lock goes with the last handle.
//! drop((r, users, by_city));
//! db.close()?;
//!
//! // Reopening recovers both storages.
//! let db = Database::open(&dir, Options::default())?;
//! assert_eq!(db.storages(), ["users_by_city"]);
//! assert!(db.root().begin_read()?.get(b"user/1")?.is_some());
//! # db.close()?;
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok(()) }
//! ```
//!
//! ## Modules and features
//!
//! Everything above is at the crate root, plus:
//! - [`env`](mod@env): storage environments, the layer every file operation goes through:
//!   [`env::StorageEnv`] and [`env::EnvFile`] to implement your own, [`env::DefaultEnv`]
//!   (`pwritev` + `fdatasync`), [`env::UringEnv`] (io_uring lanes) and [`env::default_env`],
//!   which picks one per process.
//! - [`actors`] (feature `actors`, on by default): the actor runtime, its handles, write
//!   batches and index definitions.
//!
//! Cargo features: `actors` (default) builds the actor runtime ([`actors`]) and its dependencies
//! (glommio, futures-lite, hdrhistogram); with `default-features = false` the core engine builds
//! without them. No feature pulls a command-line dependency: the `omnibus` command line is its
//! own package, `omnibus-cli` (`cli/`). `testing` (off) adds the test storage
//! environments (`env::testing`: power loss, fault injection, recording) and `omnibus::testing`
//! (internals tests inspect; not a stable API); omnibus's own `cargo test` turns it on.
//! `fuzzing` (off) adds the decoder entry points for `fuzz/`.
//!
//! Observability: [`Storage::metrics`] and [`Database::metrics`] return a [`Metrics`] snapshot
//! (latency and size histograms of commits, journal batches and flushes, counters, the journal
//! queue's depth; in memory, since open), [`actors::Engine::metrics`] adds the mailboxes and the
//! memory budget; journal batches, flushes, write-buffer applies and recoveries are `tracing`
//! spans with their sizes and durations as fields. The library installs no subscriber.
//!
//! Limits: keys of 1 to [`MAX_KEY_LEN`] bytes, values up to [`MAX_VALUE_LEN`] bytes. Errors are
//! one [`Error`] enum (`#[non_exhaustive]`, `Clone`); I/O errors carry the operation and path.
//! `docs/ARCHITECTURE.md` has the code map and invariants, `docs/design.md` the on-disk format
//! and protocols.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]
// A type reachable through a public signature must be nameable (re-exported): no internal type
// leaks into the public API unnoticed.
#![warn(unnameable_types)]

// The core's interface to the actor runtime: compiled in every build, so that the core keeps
// its hooks checked; unused without the `actors` feature.
#[cfg_attr(not(feature = "actors"), allow(dead_code, unused_imports))]
mod actor_interface;
mod backup;
mod btree;
mod buffer;
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
mod group;
mod journal;
mod journal_io;
mod layout;
mod metrics;
mod options;
mod page;
mod probe;
mod scratch;
mod state;
mod storage;
#[cfg(feature = "testing")]
pub mod testing;
mod txn;
mod write_mode;

#[cfg(feature = "actors")]
#[path = "../actors/mod.rs"]
pub mod actors;

pub use backup::BackupReport;
pub use btree::{CheckReport, HiddenPages, KeyRange, Range};
pub use buffer::live_buffer_bytes;
pub use database::{Database, DatabaseStats};
pub use env::{JournalIo, WriteMode};
pub use error::{Corruption, Error, GroupError, IndexFailure, Result};
pub use group::{GroupTransaction, MAX_GROUP_BYTES, MAX_GROUP_STORAGES};
pub use journal::{JournalStats, Prezero};
pub use metrics::{HistogramSummary, Metrics};
pub use options::{Durability, FlushMode, JournalMode, Options, DEFAULT_WRITE_BUFFER_BYTES};
pub use page::{live_image_bytes, peak_image_bytes, reset_peak_image_bytes};
pub use storage::{CompactReport, FlushReport, ReaderInfo, Storage, StorageStats};
pub use txn::{ReadTransaction, WriteTransaction};

/// Largest key in bytes (keys are 1..=1,024 bytes).
pub const MAX_KEY_LEN: usize = 1024;
/// Largest value in bytes: 128 MiB (values over about 2 KiB go to overflow pages).
pub const MAX_VALUE_LEN: usize = 128 << 20;
/// Page size in bytes.
pub const PAGE_SIZE: usize = page::PAGE_SIZE;
