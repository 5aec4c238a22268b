//! The actor runtime's whole interface to the core: every item of the crate that `actors/` may
//! name, and nothing else.
//!
//! Two kinds of item:
//! - **the public API the actors build on**, re-exported (`Storage`, `Database`, the
//!   transactions, `Error`, the limits, ...): what any embedder of the core may use too;
//! - **hooks**: the crate-private functions and methods the actors need and an embedder does not
//!   get, each one a free function here (a method is wrapped, `prepare(txn)` for
//!   `txn.prepare()`), so that this file lists them all. They split a commit into the steps an
//!   actor runs apart ([`prepare`], the journal write, [`finish`]), grow a data file off the
//!   executor, reach and feed a journal from a journal writer, poison after a panic, and set
//!   up the runtime's threads.
//!
//! The rule: a file under `actors/` names the crate only as `crate::actors::...` and
//! `crate::actor_interface::...`, and calls no crate-private function or method of the core
//! except through this module. `tests/core/layering.rs` checks both on the source text
//! (`actors_name_the_core_only_through_the_actor_interface`,
//! `actors_call_crate_private_functions_only_through_the_actor_interface`). A new need of the
//! actors is a new item here, with its one-line purpose.

use std::sync::Arc;

// The public API the actors build on.

/// The process's write buffers in bytes, held under the same budget.
pub(crate) use crate::live_buffer_bytes;
/// The process's page images in bytes, held under the engine's memory budget.
pub(crate) use crate::live_image_bytes;
/// What a database backup through a handle reports.
pub(crate) use crate::BackupReport;
/// What a storage check through a handle reports.
pub(crate) use crate::CheckReport;
/// Where damage was found (an index's unreadable applied record).
pub(crate) use crate::Corruption;
/// Opens a database of storages sharing one journal; the engine attaches it.
pub(crate) use crate::Database;
/// The journal counters a database handle reports.
pub(crate) use crate::DatabaseStats;
/// When a write batch is answered: once durable, or once queued.
pub(crate) use crate::Durability;
/// The one error type every actor answers with.
pub(crate) use crate::Error;
/// A storage's flush mode (the engine's flushers flush `Manual` storages).
pub(crate) use crate::FlushMode;
/// What a flush through a handle reports.
pub(crate) use crate::FlushReport;
/// Why a group write through the actors was refused.
pub(crate) use crate::GroupError;
/// Why an index is poisoned.
pub(crate) use crate::IndexFailure;
/// The bounds of a range read sent to the reader pool.
pub(crate) use crate::KeyRange;
/// The core's metrics of a database, in the engine's metrics.
pub(crate) use crate::Metrics;
/// How the engine opens its databases.
pub(crate) use crate::Options;
/// The iterator of a range read inside an update closure's transaction.
pub(crate) use crate::Range;
/// A snapshot: the reads of handles, the reader pool and the index actors.
pub(crate) use crate::ReadTransaction;
/// The result type of every actor call.
pub(crate) use crate::Result;
/// A storage handle: what every actor writes, reads and flushes.
pub(crate) use crate::Storage;
/// A storage's counters, through its handle.
pub(crate) use crate::StorageStats;
/// The transaction a storage actor merges its requests into.
pub(crate) use crate::WriteTransaction;
/// Most storages in one group write through the actors.
pub(crate) use crate::MAX_GROUP_STORAGES;
/// The longest key: index entries longer than it are skipped.
pub(crate) use crate::MAX_KEY_LEN;
/// The page size, sizing index batches in pages.
pub(crate) use crate::PAGE_SIZE;

// Hooks: a commit in steps, on a storage actor.

/// Backs up `db` into `dest` without taking any storage's writer (its actors hold them): each
/// actor applied its write buffer just before; a storage that buffered again since is copied as
/// of its last page commit.
#[inline]
pub(crate) fn backup_without_writers(
    db: &Database,
    dest: &std::path::Path,
) -> Result<BackupReport> {
    db.backup_without_writers(dest)
}

/// The journal record of a prepared commit, sent to the journal writer.
pub(crate) use crate::journal::record::OutRecord;
/// A write transaction whose journal record is built and not yet durable ([`prepare`]).
pub(crate) use crate::txn::PreparedCommit;

/// An index's applied record (design.md 10.1): its first version's magic, its encoding and
/// decoding.
pub(crate) use crate::txn::{decode_index_record, index_record, INDEX_RECORD_MAGIC_V1};

/// Checks a key and value against `WriteTransaction::put`'s limits (a write batch's check).
pub(crate) use crate::txn::check_put;

/// Tree pages `txn` has copied or created so far (an index batch commits past a limit).
#[inline]
pub(crate) fn dirty_pages(txn: &WriteTransaction) -> usize {
    txn.dirty_pages()
}

/// Bytes the operations of `txn` count for in its storage's write buffer while it is a logical
/// transaction (0 otherwise): an index batch splits its transactions by it.
#[inline]
pub(crate) fn logical_bytes(txn: &WriteTransaction) -> u64 {
    txn.logical_bytes()
}

/// The data file length in pages that `txn`'s commit needs, when the file is shorter now;
/// first applies a write buffer that the commit must apply (so its pages count).
#[inline]
pub(crate) fn data_file_growth(txn: &mut WriteTransaction) -> Result<Option<u64>> {
    txn.apply_if_due()?;
    Ok(txn.data_file_growth())
}

/// Grows `storage`'s data file to hold `pages` pages (a blocking `fallocate`: on an I/O pool).
#[inline]
pub(crate) fn grow_data_file(storage: &Storage, pages: u64) -> Result<()> {
    storage.grow_data_file(pages)
}

/// The first half of a commit: seals `txn`'s pages and builds its record (`None`: no change).
#[inline]
pub(crate) fn prepare(txn: WriteTransaction) -> Result<Option<PreparedCommit>> {
    txn.prepare()
}

/// The txn id of a prepared commit (what the root's change feed is keyed by).
#[inline]
pub(crate) fn prepared_txn_id(prepared: &PreparedCommit) -> u64 {
    prepared.txn_id()
}

/// Takes a prepared commit's journal record (once).
#[inline]
pub(crate) fn take_record(prepared: &mut PreparedCommit) -> OutRecord {
    prepared.take_record()
}

/// The one journal record of a group's prepared parts (a group record for two or more, with its
/// size limit), as the core's group commit builds it.
pub(crate) use crate::group::group_commit_record;

/// The database's group lock, held shared by a group from its journal write until its last
/// part is published (a backup's cut takes it exclusively).
#[inline]
pub(crate) fn group_lock(db: &Database) -> Arc<std::sync::RwLock<()>> {
    db.group_lock()
}

/// The second half of a commit: publishes it once `written` says durable, else poisons.
#[inline]
pub(crate) fn finish(prepared: PreparedCommit, written: Result<u64>) -> Result<()> {
    prepared.finish(written)
}

/// Flushes `storage`'s pages without applying its write buffer: the engine's flushers run on
/// the background I/O pool, and only the storage's own actor may take its writer (the actor's
/// commits apply the buffer when it is full or aged).
#[inline]
pub(crate) fn flush_pages(storage: &Storage) -> Result<crate::storage::FlushReport> {
    storage.flush_pages()
}

/// How long until `storage`'s write buffer is aged (`None`: empty, zero: aged now): its actor
/// then applies it, so an idle storage pins no journal file for long.
#[inline]
pub(crate) fn buffer_due_in(storage: &Storage) -> Option<std::time::Duration> {
    storage.inner.buffer_due_in()
}

/// Whether `storage`'s next commit would have to apply its write buffer (over its size, or
/// aged): a group part that deferred its apply then commits one of its own.
#[inline]
pub(crate) fn buffer_over(storage: &Storage) -> bool {
    storage.inner.buffer_over()
}

/// Makes `txn`'s commit apply no write buffer (a group part, whose record must stay small).
#[inline]
pub(crate) fn defer_buffer_apply(txn: &mut WriteTransaction) {
    txn.defer_apply()
}

/// Moves the write buffer of `txn`'s storage into the tree within `txn`: one apply step where
/// the storage applies in steps (an idle storage's aged buffer), the whole buffer where steps
/// are off or paused (a backup's copy of pages).
#[inline]
pub(crate) fn apply_write_buffer(txn: &mut WriteTransaction) -> Result<()> {
    txn.apply_buffer_now()
}

/// Flushes the pages of every storage of `db` without applying write buffers (branches first,
/// then the root; reports summed): a database handle's flush, on the background I/O pool.
#[inline]
pub(crate) fn flush_database_pages(db: &Database) -> Result<FlushReport> {
    db.flush_pages()
}

/// A snapshot's get when no page on its path can fault (`None`: some page is not known to be in
/// memory): a handle's read on the caller's thread.
#[inline]
pub(crate) fn get_if_resident<'a>(
    snap: &'a ReadTransaction,
    key: &[u8],
) -> Option<Result<Option<&'a [u8]>>> {
    snap.get_if_resident(key)
}

/// Refreshes `storage`'s page residency bits (a flusher's tick, on its I/O pool).
#[inline]
pub(crate) fn refresh_residency(storage: &Storage) {
    storage.refresh_residency()
}

/// Probes `storage`'s page residency bits for an eviction (a reader, after a read that a
/// caller's thread sent it for a page not known resident).
#[inline]
pub(crate) fn probe_residency(storage: &Storage) -> bool {
    storage.probe_residency()
}

/// Poisons `storage` and its journal (a storage actor panicked while writing it).
#[inline]
pub(crate) fn poison_storage(storage: &Storage, cause: &str) {
    storage.poison(cause)
}

// Hooks: the journal writer.

/// A journal: the shared one of a database, or a storage's own.
pub(crate) use crate::journal::Journal;

/// A database's shared journal (`None` with separate journals), for its writer thread.
#[inline]
pub(crate) fn shared_journal(db: &Database) -> Option<Arc<Journal>> {
    db.shared_journal()
}

/// The journal `storage` commits to, for a separate journal's writer actor.
#[inline]
pub(crate) fn storage_journal(storage: &Storage) -> &Arc<Journal> {
    storage.journal()
}

/// Writes and syncs `records` as one batch of `journal` (queues them, when all are eventual).
#[inline]
pub(crate) fn write_records(
    journal: &Journal,
    records: Vec<OutRecord>,
    durability: Durability,
) -> Result<u64> {
    journal.write_records(records, durability)
}

/// Poisons `journal` (its writer panicked while writing a batch).
#[inline]
pub(crate) fn poison_journal(journal: &Journal, cause: String) {
    journal.poison(cause)
}

/// A record's bytes on disk, header and body (a journal writer's batch is capped in bytes).
#[inline]
pub(crate) fn record_len(record: &OutRecord) -> u64 {
    record.total_len()
}

// Hooks: the runtime's threads.

/// Marks the calling thread as an executor: a blocking disk call on it is then a bug, counted.
pub(crate) use crate::env::mark_executor_thread;
/// Whether the calling thread is an executor (a handle's blocking call there is refused).
pub(crate) use crate::env::on_executor;
/// Puts the calling thread in I/O class best effort at a level (the background I/O pool: 7).
pub(crate) use crate::env::set_thread_io_priority;
/// Sets the calling thread's CPU nice value (the residency refresh's thread: 19).
pub(crate) use crate::env::set_thread_nice;

/// Marks `storage` as an index storage: its snapshots leave the applied record out of every
/// view (design.md 10.1).
pub(crate) fn hide_index_record(storage: &Storage) {
    storage.hide_reserved_key();
}

/// The value at `key` of `snapshot`, an index's applied record included (the index runtime's
/// own read of it).
pub(crate) fn get_index_record<'a>(
    snapshot: &'a ReadTransaction,
    key: &[u8],
) -> Result<Option<&'a [u8]>> {
    snapshot.get_reserved(key)
}
