//! The engine's metrics ([`Engine::metrics`], [`DatabaseHandle::metrics`]): each database's
//! core [`Metrics`], the depths of its actors' mailboxes (storage, journal writer and index
//! actors), the reader pool's mailbox and the memory budget.

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use super::{DatabaseHandle, Engine};
use crate::actor_interface::{live_buffer_bytes, live_image_bytes, Metrics};

/// A database's metrics under the engine ([`DatabaseHandle::metrics`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DatabaseMetrics {
    /// The database's directory (its root storage).
    pub path: PathBuf,
    /// The core's histograms and counters since the database was opened
    /// ([`crate::Database::metrics`]).
    pub metrics: Metrics,
    /// Requests queued now in the mailboxes of the database's storage actors (root, branches
    /// and indexes' storages with a handle), summed: a gauge.
    pub storage_mailbox_depth: u64,
    /// The deepest of those mailboxes now.
    pub storage_mailbox_max: u64,
    /// Messages queued now for the shared journal writer's thread (0 with separate journals,
    /// whose writer actors are not counted): a gauge.
    pub journal_writer_mailbox_depth: u64,
    /// Root commits queued now in the mailboxes of the database's index actors, summed (each
    /// index has its own, [`super::EngineOptions::index_queue_capacity`] commits at most): a
    /// gauge. How far behind the indexes are in time is in [`crate::actors::IndexStats`].
    pub index_mailbox_depth: u64,
    /// The deepest of those mailboxes now.
    pub index_mailbox_max: u64,
}

/// The engine's metrics ([`Engine::metrics`]): every open database's, and the memory budget.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EngineMetrics {
    /// Each database the engine serves, in the order they were opened.
    pub databases: Vec<DatabaseMetrics>,
    /// Bytes of page images held by the process now ([`crate::live_image_bytes`]), what the
    /// memory budget holds: a gauge.
    pub live_image_bytes: u64,
    /// Bytes of write buffers held by the process now ([`crate::live_buffer_bytes`]): a gauge.
    pub live_buffer_bytes: u64,
    /// The memory budget ([`super::EngineOptions::memory_budget_bytes`]), in bytes.
    pub memory_budget_bytes: u64,
    /// Transactions started over the budget since the engine started
    /// ([`Engine::memory_budget_overruns`]).
    pub memory_budget_overruns: u64,
    /// Requests queued now in the reader pool's shared mailbox (range reads, and point reads
    /// sent to the pool; 4,096 at most, then senders wait): a gauge.
    pub reader_mailbox_depth: u64,
}

impl Engine {
    /// Metrics of every open database and of the memory budget (see [`EngineMetrics`]): a
    /// snapshot taken with a few short locks, no message to any actor, no I/O.
    pub fn metrics(&self) -> EngineMetrics {
        let dbs: Vec<DatabaseHandle> = self
            .inner
            .databases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        EngineMetrics {
            databases: dbs.iter().map(DatabaseHandle::metrics).collect(),
            live_image_bytes: live_image_bytes(),
            live_buffer_bytes: live_buffer_bytes(),
            memory_budget_bytes: self.inner.opts.memory_budget_bytes,
            memory_budget_overruns: self.inner.pressure(0).overruns.load(Ordering::Relaxed),
            reader_mailbox_depth: self.inner.readers.len() as u64,
        }
    }
}

impl DatabaseHandle {
    /// This database's metrics (see [`DatabaseMetrics`]): a snapshot taken with a few short
    /// locks, no message to any actor, no I/O.
    pub fn metrics(&self) -> DatabaseMetrics {
        let (depth, max) = {
            let handles = self.inner.handles.lock().unwrap_or_else(|e| e.into_inner());
            depths(
                std::iter::once(&self.inner.root)
                    .chain(handles.values())
                    .map(|h| h.tx.len()),
            )
        };
        let (index_depth, index_max) = depths(
            self.inner
                .indexes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .map(|e| e.port.len()),
        );
        DatabaseMetrics {
            path: self.inner.db.path().to_path_buf(),
            metrics: self.inner.db.metrics(),
            storage_mailbox_depth: depth,
            storage_mailbox_max: max,
            journal_writer_mailbox_depth: self.inner.journal.as_ref().map_or(0, |j| j.len() as u64),
            index_mailbox_depth: index_depth,
            index_mailbox_max: index_max,
        }
    }
}

/// The sum and the largest of some mailboxes' depths.
fn depths(lens: impl Iterator<Item = usize>) -> (u64, u64) {
    lens.fold((0, 0), |(sum, max), n| (sum + n as u64, max.max(n as u64)))
}
