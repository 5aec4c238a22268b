//! The actor runtime: per-core glommio executors, a storage actor per storage that merges
//! requests into transactions, a journal writer per database (the critical lane: in shared
//! mode a thread of its own, in separate mode an actor per storage over the critical I/O lane),
//! low-priority flusher actors, a reader pool, and async + blocking handles usable from tokio,
//! glommio and plain threads.
//!
//! ```text
//! client ──put──▶ storage actor ──Commit──▶ journal writer thread (shared mode)
//!   ▲              (one txn per             group commit: pwritev + fdatasync per batch
//!   └── reply ◀──── drained mailbox) ◀── durable ◀──┘
//! client ──get──▶ reader pool (shared mailbox, snapshots)
//! flusher (per executor) ──flush──▶ background I/O lane (ioprio BE 7)
//! root actor ──Arc<changes> per durable commit──▶ index actor (per index) ──Apply──▶ its storage actor
//! ```
//! Every mailbox is a bounded flume channel. The core (`src/`) never imports this module.

mod engine;
mod flusher;
mod index;
mod io_lane;
mod journal_writer;
mod reader_pool;
mod storage;

pub use engine::{DatabaseHandle, Engine, EngineOptions, MEMLOCK_PER_EXECUTOR};
pub use index::{
    index_applied_txn, BuildProgress, IndexDefinition, IndexState, IndexStats, LagStats, MapFn,
    INDEX_APPLIED_KEY,
};
pub use storage::{StorageHandle, WriteBatch, WriteOp};
