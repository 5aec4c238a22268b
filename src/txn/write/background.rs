//! The background apply of a write buffer (design.md 16.1): the flush service writes a full or
//! aged buffer into the tree on its own thread while the application goes on committing.
//!
//! The apply borrows the writer's state (`Inner::lend_writer`) and freezes the buffer's runs of
//! that moment (`Buffer::freeze`): commits made meanwhile are *logical-only* transactions that
//! add runs above the frozen ones and never merge with them. Once the frozen entries are in the
//! tree, the apply waits until no logical-only transaction is open (`Inner::begin_finishing`)
//! and commits as the next txn: its pages, and, when commits came meanwhile, their entries
//! carried in the same record as an apply step's are (record kind 6, design.md 3.10), so a
//! replay rebuilds exactly that buffer (invariant I13). A logical-only transaction that needs
//! the tree (a range delete, a compaction move) takes the writer's state back
//! (`Inner::reclaim_writer`): the apply then gives up at its next check, having published
//! nothing, and the buffer thaws.

use super::*;
use crate::buffer::RunBuilder;

/// Entries the apply writes between two checks for a logical-only transaction that wants the
/// writer's state back: bounds that transaction's wait to a few hundred microseconds.
const CHECK_EVERY: usize = 64;

/// Applies `inner`'s write buffer in the background, on the calling thread, while other
/// threads go on committing (module docs). Returns `Ok(false)` without doing anything when a
/// write transaction or another apply holds the writer, the buffer is empty, or a logical-only
/// transaction took the writer back (the apply gave up); `Ok(true)` once the apply is
/// published. The apply's commit is eventual: the next synced commit, or the journal's own
/// sync within [`crate::Options::eventual_sync_ms`], makes it durable.
///
/// Errors: as [`WriteTransaction::commit`] (the storage is poisoned by a failed journal write;
/// the buffer then stays as it was).
pub(crate) fn apply_in_background(inner: &Arc<Inner>) -> Result<bool> {
    apply_in_background_with(inner, &mut || {})
}

/// [`apply_in_background`], calling `between` once the frozen entries are in the tree and the
/// apply's pages sealed, before it waits to publish (`crate::testing::apply_in_background`:
/// a test's commits then run while the apply holds the writer's state).
pub(crate) fn apply_in_background_with(
    inner: &Arc<Inner>,
    between: &mut dyn FnMut(),
) -> Result<bool> {
    let Some(writer) = inner.lend_writer() else {
        return Ok(false);
    };
    if inner.current.load().buffer.is_empty() {
        inner.return_writer(writer);
        return Ok(false);
    }
    let base = inner.freeze_buffer();
    let mut t = WriteTransaction::new(inner.clone(), writer, base.clone());
    t.background = true;
    t.apply_settled = true;
    t.logical = None;
    t.changed = true;
    t.set_durability(Durability::Eventual);
    let prepared = match write_frozen(&mut t, &base) {
        // Sealed and encoded now, while commits go on: only the record's txn id waits.
        Ok(true) => t.prepare(),
        // Given up: nothing published; the writer's state goes back with the transaction.
        Ok(false) => Ok(None),
        Err(e) => Err(e),
    };
    let mut prepared = match prepared {
        Ok(Some(p)) => p,
        other => {
            inner.thaw_buffer();
            return other.map(|_| false);
        }
    };
    between();
    if !inner.begin_finishing() {
        inner.thaw_buffer();
        drop(prepared);
        return Ok(false);
    }
    let r = publish(inner, &mut prepared);
    let r = prepared.finish(r);
    if r.is_err() {
        inner.thaw_buffer();
    }
    r.map(|()| true)
}

/// Writes every entry of `base`'s (frozen) buffer into the tree, in an `apply write buffer`
/// span (`background`: true) whose entries, pages and duration are recorded once every entry
/// is in (an apply that gives up records none). `Ok(false)` when a logical-only transaction
/// asked for the writer's state back.
fn write_frozen(t: &mut WriteTransaction, base: &State) -> Result<bool> {
    let span = logical::apply_span(t.inner.storage_id, false, true);
    let _in = span.enter();
    let started = (!span.is_disabled()).then(std::time::Instant::now);
    let mut entries = 0u64;
    for (i, (k, v)) in base.buffer.iter().enumerate() {
        if i % CHECK_EVERY == 0
            && t.inner
                .apply_cancel
                .load(std::sync::atomic::Ordering::Acquire)
        {
            return Ok(false);
        }
        let r = t.apply_entry(k, v);
        t.fail(r)?;
        entries += 1;
    }
    if let Some(started) = started {
        logical::record_apply(&span, entries, t.dirty_pages(), started);
    }
    Ok(true)
}

/// Stamps the prepared apply as the storage's next txn, no logical-only transaction being open
/// (`Inner::begin_finishing`), with the entries committed since it began carried, if any, and
/// hands its record to the journal (eventual: queued, not waited for). Returns the journal's
/// answer for [`PreparedCommit::finish`].
fn publish(inner: &Arc<Inner>, prepared: &mut PreparedCommit) -> Result<u64> {
    let cur = inner.current.load_full();
    let newer = cur.buffer.newer_than_frozen();
    let step = (!newer.is_empty()).then(|| {
        let mut carried = RunBuilder::default();
        for e in newer.iter() {
            carried.push(e);
        }
        let carried = carried.finish();
        StepCarry {
            buffer_bytes: carried.entry_bytes(),
            carried: Arc::new(carried),
            // The record journals every entry carried: none pins an older journal file.
            buffer_since: std::time::Instant::now(),
            sweep: crate::buffer::Sweep { from: None },
        }
    });
    prepared.restamp(cur.txn_id + 1, step);
    let record = prepared.take_record();
    inner.journal.commit_with(record, Durability::Eventual)
}
