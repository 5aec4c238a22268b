//! A point in a journal's order: what a database backup takes its snapshots at.

use super::Journal;
use crate::storage::lock;

impl Journal {
    /// Runs `f` while no batch is being written (the journal's I/O lock is held, which a batch
    /// holds from its write to its `fdatasync`): every record of this journal is either durable
    /// already or not written yet, and stays so until `f` returns. `f` gets `durable(id)`: the
    /// highest txn id of storage `id` in a durable batch of a journal file still held (0 when
    /// none: every earlier commit of it is flushed). `f` must not commit to this journal (it
    /// would wait for the lock `f` runs under).
    pub(crate) fn at_one_point<R>(&self, f: impl FnOnce(&dyn Fn(u64) -> u64) -> R) -> R {
        let io = lock(&self.io);
        let durable = |id: u64| {
            io.entries
                .values()
                .filter_map(|m| m.get(&id))
                .copied()
                .max()
                .unwrap_or(0)
        };
        f(&durable)
    }
}
