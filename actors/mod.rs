//! The actor runtime: per-core glommio executors, a storage actor per storage that merges
//! requests into transactions, a journal writer per database (in shared mode a thread of its
//! own, in separate mode an actor per storage whose batches run on the journal I/O pool),
//! low-priority flusher actors, a reader pool, and async + blocking handles usable from tokio,
//! glommio and plain threads.
//!
//! ```text
//! client ──put──▶ storage actor ──Commit──▶ journal writer thread (shared mode)
//!   ▲              (one txn per             group commit: pwritev + fdatasync per batch
//!   └── reply ◀──── drained mailbox) ◀── durable ◀──┘
//! client ──get/multi_get──▶ snapshot on the client's own thread (ReadPath::Caller, default)
//! client ──range (and get with ReadPath::Pool)──▶ reader pool (shared mailbox, snapshots)
//! flusher (per executor) ──flush──▶ background I/O pool (ioprio BE 7)
//! root actor ──Arc<changes> per durable commit──▶ index actor (per index) ──Apply──▶ its storage actor
//! ```
//! Every mailbox is a bounded flume channel. The core (`src/`) never imports this module, and this
//! module reaches the core only through `crate::actor_interface` (its one interface to it).
//!
//! Executors never block on the disk: an executor runs many actors, and a task that waits for
//! an `fdatasync` or an `fallocate` stalls all of them. Every call that may wait for the disk
//! runs on an I/O pool (`io_pool.rs`) or the shared journal writer's thread: journal batches;
//! the `fallocate` of a commit that grows the data file (the storage actor grows the file on
//! the journal I/O pool before it prepares the commit); flushes; opening, creating and dropping
//! storages; index builds' scans; the flusher's poll, whose `Storage::flush_due` takes the
//! journal's lock that a batch holds across its sync; and a separate journal's writer actor's
//! last reference to its journal (`Journal`'s drop waits for a background zero write). The
//! engine marks each executor thread (`env::mark_executor_thread`); the default
//! environment counts every blocking call made on a marked thread and panics in debug builds
//! (`omnibus::testing::executor_guard::blocking_calls_on_executors` with the `testing` feature), and
//! `tests/actors/executor_never_blocks.rs` checks a whole workload. What no check sees: page faults
//! of the read-only map (readers on executors may wait for a page to come in: the pool's, and
//! callers' point reads made from an executor) and waits for a lock held across I/O.

mod blocking;
mod commit;
mod coop;
mod engine;
mod flusher;
mod index;
mod index_check;
mod index_key;
mod io_pool;
mod journal_writer;
mod mailbox;
mod messages;
mod placement;
mod range_stream;
mod reader_pool;
mod storage;
mod update;

pub use engine::metrics::{DatabaseMetrics, EngineMetrics};
pub use engine::{DatabaseHandle, Engine, EngineOptions, MEMLOCK_PER_EXECUTOR};
pub use index::{
    index_applied_txn, BuildProgress, IndexDefinition, IndexMode, IndexState, IndexStats, LagStats,
    MapFn, INDEX_APPLIED_KEY,
};
pub use index_check::{check_index, IndexCheckReport};
pub use index_key::{
    decode_index_entry, index_entry_key, index_term_prefix, index_terms_starting_with,
};
pub use messages::{ReadPath, WriteBatch, WriteOp};
pub use placement::allowed_cpus;
pub use range_stream::{RangeIter, RangeStream, CHUNK_BYTES, CHUNK_ENTRIES};
pub use storage::{cold_reads, StorageHandle};
pub use update::UpdateTransaction;
