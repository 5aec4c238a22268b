//! A buffered storage's write transaction (design.md section 16): while it only puts and
//! deletes, its operations are kept by key and journaled at commit as one logical record,
//! and the tree is not touched. An operation the buffer cannot hold (a range delete, a
//! compaction move), or a commit that would take the buffer past its size or age, first
//! *applies*: every buffered entry and the transaction's own operations go into the tree, and
//! the transaction commits as an ordinary page transaction (invariant I13: a page commit of a
//! buffered storage holds every buffered entry committed before it). With
//! [`crate::Storage::set_apply_step_pages`], an apply that a commit must make is a *step*: it
//! applies the entries of the leaves with the most pending first until the transaction has
//! copied that many pages, and its commit carries the entries left over (record kind 6, I13's
//! "in its tree or in the entries it carries").

use std::collections::BTreeMap;

use super::*;
use crate::buffer::{Entry, Layer, MergeNewer};

/// Operations from which a transaction of a buffered storage writes the tree directly (with
/// the buffer) instead of buffering: about as many as a commit needs to fill the leaves it
/// touches by itself (measured: sorted loads of 10,000 keys a commit ran at 0.65x of an
/// unbuffered storage when buffered; a synced batch of 1,000 random keys runs 1.35x faster
/// buffered).
const DIRECT_OPS: usize = 4096;

/// The operations of a logical commit, in key order, as the run it adds to the buffer.
pub(crate) type LogicalOps = crate::buffer::Run;

/// Bytes an operation on `key` counts for in the buffer ([`crate::buffer::entry_bytes`]).
fn op_bytes(key: &[u8], value: Option<&[u8]>) -> u64 {
    crate::buffer::entry_bytes(key.len(), value.map_or(0, <[u8]>::len))
}

/// What an apply step leaves buffered, published with its commit (`Inner::publish_commit`).
#[derive(Debug, Clone)]
pub(crate) struct StepCarry {
    /// The entries still buffered, in key order, as its record carries them: the next state's
    /// buffer, as one run.
    pub carried: Arc<crate::buffer::Run>,
    /// Bytes `carried` counts for in the buffer.
    pub buffer_bytes: u64,
    /// Since when `buffer` pins the journal: the step itself, whose record holds every entry.
    pub buffer_since: std::time::Instant,
    /// Where the next step's ties among equally loaded leaves start.
    pub sweep: crate::buffer::Sweep,
}

/// A transaction's operations merged over the committed buffer: every pending entry once, in
/// key order, the transaction's own where both hold a key.
fn pending<'a>(
    ops: &'a BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    buffer: &'a crate::buffer::Buffer,
) -> impl Iterator<Item = Entry<'a>> + 'a {
    let own = ops.iter().map(|(k, v)| (&k[..], v.as_deref()));
    MergeNewer::new(own, buffer.iter())
}

impl WriteTransaction {
    /// The logical operation on `key` as this transaction sees it, if the transaction or the
    /// buffer holds one: `Some(None)` for a delete. `None` in a page transaction.
    pub(super) fn buffered(&self, key: &[u8]) -> Option<Option<Vec<u8>>> {
        let ops = self.logical.as_ref()?;
        if let Some(v) = ops.get(key) {
            return Some(v.clone());
        }
        self.base.buffer.get(key).map(|v| v.map(<[u8]>::to_vec))
    }

    /// Records a put while the transaction is logical; `false` in a page transaction.
    pub(super) fn put_logical(&mut self, key: &[u8], value: &[u8]) -> bool {
        let Some(ops) = &mut self.logical else {
            return false;
        };
        let old = ops.insert(key.to_vec(), Some(value.to_vec()));
        self.logical_len += op_bytes(key, Some(value));
        self.logical_len -= old.map_or(0, |o| op_bytes(key, o.as_deref()));
        self.changed = true;
        true
    }

    /// Records a delete of a key known to be present while the transaction is logical;
    /// `false` in a page transaction.
    pub(super) fn delete_logical(&mut self, key: &[u8]) -> bool {
        let Some(ops) = &mut self.logical else {
            return false;
        };
        let old = ops.insert(key.to_vec(), None);
        self.logical_len += op_bytes(key, None);
        self.logical_len -= old.map_or(0, |o| op_bytes(key, o.as_deref()));
        self.changed = true;
        true
    }

    /// The buffered entries within `(start, end)` as this transaction sees them (its own
    /// operations over the committed buffer), for [`crate::Range`]; `None` when there are none
    /// to merge (a page transaction, or nothing buffered).
    pub(crate) fn buffered_layer<'a>(
        &'a self,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
    ) -> Option<Layer<'a>> {
        let ops = self.logical.as_ref()?;
        if ops.is_empty() && self.base.buffer.is_empty() {
            return None;
        }
        let own: Layer<'a> = if crate::buffer::range_is_empty(start, end) {
            Box::new(std::iter::empty())
        } else {
            Box::new(
                ops.range::<[u8], _>((start, end))
                    .map(|(k, v)| (&k[..], v.as_deref())),
            )
        };
        Some(Box::new(MergeNewer::new(
            own,
            self.base.buffer.range(start, end),
        )))
    }

    /// Keys this logical transaction adds to the committed count (negative: removes): one
    /// lookup of the committed state per key it changed. 0 in a page transaction.
    ///
    /// Errors: [`Error::Corruption`] from a tree lookup.
    pub(crate) fn logical_delta(&self) -> Result<i64> {
        let Some(ops) = &self.logical else {
            return Ok(0);
        };
        self.base
            .net_count(ops.iter().map(|(k, v)| (&k[..], v.is_some())), true)
    }

    /// Whether committing now must apply the buffer: it would hold more than
    /// [`crate::Storage::write_buffer_bytes`], its oldest entry is older than
    /// [`crate::Options::flush_max_age`] (so an active storage never pins old journal files), or
    /// the transaction itself has [`DIRECT_OPS`] operations or more (it fills leaves by itself:
    /// buffering would only copy its entries once more).
    pub(super) fn must_apply(&self) -> bool {
        self.must_apply_as().is_some()
    }

    /// Whether the buffer holds this transaction's operations within its size.
    fn fits_buffer(&self) -> bool {
        self.base.buffer_bytes + self.logical_bytes()
            <= self
                .inner
                .buffer_limit
                .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Bytes this logical transaction's operations count for in the buffer (0 in a page
    /// transaction).
    pub(crate) fn logical_bytes(&self) -> u64 {
        if self.logical.is_some() {
            self.logical_len
        } else {
            0
        }
    }

    /// Whether committing now must apply the buffer ([`WriteTransaction::must_apply`]), and if
    /// so whether directly (`Some(true)`: the whole buffer with this transaction's operations,
    /// a large transaction) or as due (`Some(false)`: a step where the storage applies in
    /// steps). In a storage that applies in steps, a transaction of [`DIRECT_OPS`] operations
    /// or more is buffered too, and applied in steps like the rest: its keys are taken to be
    /// scattered (an index batch), where buffering is what spares the leaves, and a whole
    /// apply would copy as many pages as the leaves they land on in one transaction.
    fn must_apply_as(&self) -> Option<bool> {
        let ops = self.logical.as_ref()?;
        // Logical-only (no writer's state): the background apply holding it takes the buffer.
        self.writer.as_ref()?;
        if ops.len() >= DIRECT_OPS && self.step_pages().is_none() {
            return Some(true);
        }
        if self.inner.applies_in_background() {
            // The flush service applies a full or aged buffer off this thread (design.md
            // 16.1); the writer applies it only past twice its size (no apply came in time).
            let limit = self
                .inner
                .buffer_limit
                .load(std::sync::atomic::Ordering::Relaxed);
            let held = self.base.buffer_bytes + self.logical_bytes();
            return (held > limit.saturating_mul(2)).then_some(false);
        }
        (!self.fits_buffer() || self.base.buffer_aged(self.inner.opts.flush_max_age))
            .then_some(false)
    }

    /// The pages of an apply step when the storage applies in steps now: set
    /// ([`crate::Storage::set_apply_step_pages`]), with a buffer (a size of 0 turns buffering
    /// off: the next commit applies it whole).
    fn step_pages(&self) -> Option<usize> {
        use std::sync::atomic::Ordering::Relaxed;
        let cap = self.inner.apply_step_pages.load(Relaxed);
        let on = cap > 0 && self.inner.buffer_limit.load(Relaxed) > 0;
        on.then(|| usize::try_from(cap).unwrap_or(usize::MAX))
    }

    /// Applies the buffer now if committing must apply it ([`WriteTransaction::must_apply`]), and
    /// settles that: [`WriteTransaction::prepare`] then does not ask again, so the pages the
    /// commit needs are known before it (the actor runtime grows the data file off its
    /// executors first).
    ///
    /// Errors: as [`WriteTransaction::apply_buffered`].
    pub(crate) fn apply_if_due(&mut self) -> Result<()> {
        if self.apply_settled {
            return Ok(());
        }
        self.apply_settled = true;
        if self.changed && self.must_apply() {
            self.apply_due()?;
        }
        Ok(())
    }

    /// Settles that this transaction's commit applies no write buffer, whatever
    /// [`WriteTransaction::must_apply`] says (its operations are buffered, or written to the
    /// tree in a page transaction, as they are): for a part of a group, whose record must stay
    /// small; the storage then applies its buffer in a transaction of its own.
    pub(crate) fn defer_apply(&mut self) {
        self.apply_settled = true;
    }

    /// The apply that [`WriteTransaction::must_apply`] asks for: a step when the storage
    /// applies in steps ([`crate::Storage::set_apply_step_pages`]) and the transaction is not
    /// one to write the tree directly; else the whole buffer.
    ///
    /// Errors: as [`WriteTransaction::apply_buffered`].
    pub(super) fn apply_due(&mut self) -> Result<()> {
        if let (Some(false), Some(cap)) = (self.must_apply_as(), self.step_pages()) {
            // Only aged, not full: a step of no pages, whose record journals the buffer anew so
            // that it pins no older journal file, and whose entries keep gathering per leaf.
            let cap = if self.fits_buffer() { 0 } else { cap };
            let r = self.apply_step(cap);
            return self.fail(r);
        }
        self.apply_buffered()
    }

    /// Applies the buffer now, whether or not committing must: one step
    /// ([`WriteTransaction::apply_step`] of the storage's step pages) where the storage applies
    /// in steps, else the whole buffer. So a storage actor that applies
    /// the aged buffer of an idle storage drains it a step at a time, each bounded in pages
    /// (the whole buffer at once copied as many pages as the leaves it lands on: 100 idle
    /// index storages, each with a full buffer, took the page images to 2 GiB against a
    /// 512 MiB budget).
    ///
    /// Errors: as [`WriteTransaction::apply_buffered`].
    pub(crate) fn apply_buffer_now(&mut self) -> Result<()> {
        match self.step_pages() {
            Some(cap) => {
                let r = self.apply_step(cap);
                self.fail(r)
            }
            None => self.apply_buffered(),
        }
    }

    /// An apply step: turns this logical transaction into a page transaction that applies
    /// part of the buffered entries and its own operations, leaf by leaf, the leaves with the
    /// most pending entries first (as PerconaFT flushes its heaviest child), until it has
    /// copied `cap` pages (none with `cap` 0) and what is left fits the buffer's size, and
    /// keeps the rest for its commit to carry ([`StepCarry`]). A leaf here is one of the
    /// committed tree's ([`crate::btree::leaves::leaf_runs`]); among leaves with as many
    /// entries, those from where the last step's last leaf ended come first, wrapping around
    /// at the last key (a sweep), so a storage whose keys spread evenly still has every leaf
    /// written in turn. A step that reaches every entry is a whole apply. Made at the commit,
    /// once the transaction's operations are done: the transaction's reads see the tree only
    /// afterwards.
    fn apply_step(&mut self, cap: usize) -> Result<()> {
        use crate::buffer::{RunBuilder, Sweep};
        self.reclaim();
        // What the buffer would hold without the step (an upper bound: an operation on a key
        // already buffered counts twice): a step goes on past `cap` pages until what is left
        // is within the buffer's size, so the buffer never grows past it by more than one
        // transaction's operations, however small the steps.
        let limit = self
            .inner
            .buffer_limit
            .load(std::sync::atomic::Ordering::Relaxed);
        let mut left = self.base.buffer_bytes + self.logical_bytes();
        let Some(ops) = self.logical.take() else {
            return Ok(());
        };
        let base = self.base.clone();
        let pending: Vec<Entry<'_>> = pending(&ops, &base.buffer).collect();
        if pending.is_empty() {
            return Ok(());
        }
        self.changed = true;
        let runs = crate::btree::leaves::leaf_runs(&base, pending.iter().map(|e| e.0))?;
        // Each leaf's entries: `pending[starts[g]..starts[g + 1]]`.
        let mut starts = Vec::with_capacity(runs.len() + 1);
        starts.push(0usize);
        for n in &runs {
            starts.push(starts[starts.len() - 1] + *n as usize);
        }
        let from: Option<&[u8]> = base.sweep.as_ref().and_then(|s| s.from.as_deref());
        let mut order: Vec<usize> = (0..runs.len()).collect();
        order.sort_unstable_by_key(|&g| {
            let before_sweep = from.is_some_and(|f| pending[starts[g]].0 < f);
            (std::cmp::Reverse(runs[g]), before_sweep, g)
        });
        let mut taken = vec![false; runs.len()];
        let mut last: Option<usize> = None;
        let span = apply_span(self.inner.storage_id, true, false);
        let _in = span.enter();
        let started = (!span.is_disabled()).then(std::time::Instant::now);
        let mut entries = 0u64;
        for g in order {
            if (last.is_some() || cap == 0) && self.dirty_pages() >= cap && left <= limit {
                break;
            }
            for &(k, v) in &pending[starts[g]..starts[g + 1]] {
                left = left.saturating_sub(op_bytes(k, v));
                self.apply_entry(k, v)?;
                entries += 1;
            }
            taken[g] = true;
            last = Some(g);
        }
        if let Some(t) = started {
            record_apply(&span, entries, self.dirty_pages(), t);
        }
        if taken.iter().all(|&t| t) {
            // Every entry in one step: a whole apply (its commit empties the buffer).
            return Ok(());
        }
        let mut carried = RunBuilder::default();
        for e in (0..runs.len())
            .filter(|&g| !taken[g])
            .flat_map(|g| &pending[starts[g]..starts[g + 1]])
        {
            carried.push(*e);
        }
        let carried = carried.finish();
        let bytes = carried.entry_bytes();
        // The next step's ties start after the last leaf this one applied (where this one's
        // started when it applied none), or again at the first key past the last leaf. The
        // step's record journals every entry it leaves, so none of them pins an older journal
        // file: the buffer's age starts again now.
        let next_from = match last {
            None => from.map(Box::from),
            Some(g) => pending.get(starts[g + 1]).map(|e| Box::from(e.0)),
        };
        self.step = Some(StepCarry {
            carried: Arc::new(carried),
            buffer_bytes: bytes,
            buffer_since: std::time::Instant::now(),
            sweep: Sweep { from: next_from },
        });
        Ok(())
    }

    /// Turns a logical transaction into a page transaction: every buffered entry of the base
    /// state, then this transaction's own operations over them, in key order, are applied to
    /// the tree. A no-op in a page transaction. Its commit then empties the buffer.
    ///
    /// Errors: as [`WriteTransaction::put`] and [`WriteTransaction::delete`] on the tree; the
    /// transaction is then failed.
    pub(crate) fn apply_buffered(&mut self) -> Result<()> {
        if self.logical.is_none() {
            return Ok(());
        }
        self.reclaim();
        let Some(ops) = self.logical.take() else {
            return Ok(());
        };
        let base = self.base.clone();
        if !base.buffer.is_empty() {
            // The commit publishes a state with an empty buffer, even if nothing else changed.
            self.changed = true;
        }
        let span = apply_span(self.inner.storage_id, false, false);
        let _in = span.enter();
        let started = (!span.is_disabled()).then(std::time::Instant::now);
        let mut entries = 0u64;
        let r = pending(&ops, &base.buffer).try_for_each(|(k, v)| {
            entries += 1;
            self.apply_entry(k, v)
        });
        if let Some(t) = started {
            record_apply(&span, entries, self.dirty_pages(), t);
        }
        self.fail(r)
    }

    /// Writes one pending entry into the tree: a put, or the delete of a key the tree holds.
    pub(super) fn apply_entry(&mut self, k: &[u8], v: Option<&[u8]>) -> Result<()> {
        match v {
            Some(v) => self.put_inner(k, v),
            None if self.get(k)?.is_some() => self.delete_inner(k).map(drop),
            None => Ok(()),
        }
    }

    /// The operations of a logical commit, in key order, for its record and the buffer; `None`
    /// in a page transaction.
    pub(super) fn take_logical(&mut self) -> Option<LogicalOps> {
        let ops = self.logical.take()?;
        Some(ops.iter().map(|(k, v)| (&k[..], v.as_deref())).collect())
    }
}

/// The span of a write-buffer apply (DEBUG: disabled, it costs one interest check; an apply
/// runs at most once per buffer's worth of commits): `step` for an apply step, `background`
/// for the flush service's apply beside commits (`background.rs`), `entries`, `pages` and `us`
/// recorded at its end by [`record_apply`].
pub(super) fn apply_span(storage: u64, step: bool, background: bool) -> tracing::Span {
    tracing::debug_span!(
        "apply write buffer",
        storage,
        step,
        background,
        entries = tracing::field::Empty,
        pages = tracing::field::Empty,
        us = tracing::field::Empty,
    )
}

/// Records an apply's entries applied, tree pages the transaction has copied and duration.
pub(super) fn record_apply(
    span: &tracing::Span,
    entries: u64,
    pages: usize,
    started: std::time::Instant,
) {
    span.record("entries", entries);
    span.record("pages", pages as u64);
    span.record(
        "us",
        u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
    );
    // The event that closes the span (the command line prints events, with their spans'
    // fields).
    span.in_scope(|| tracing::debug!("write buffer applied"));
}

#[cfg(test)]
mod tests {
    use crate::{FlushMode, Options, Storage};

    fn one_put(s: &Storage, i: u32) {
        let mut w = s.begin_write().unwrap();
        w.put(format!("k{:06}", (i * 7919) % 3000), [b'v'; 40])
            .unwrap();
        w.commit().unwrap();
    }

    /// A buffered storage (1 MiB) whose tree holds 20,000 keys `k{2i:08}` (at most a few
    /// hundred a leaf), flushed, applying in steps of 4 pages.
    fn stepping_storage(dir: &std::path::Path) -> Storage {
        let o = Options {
            write_buffer_bytes: 1 << 20,
            flush_mode: FlushMode::Manual,
            ..Options::default()
        };
        let s = Storage::open(dir.join("s"), o).unwrap();
        let mut w = s.begin_write().unwrap();
        for i in 0..20_000u32 {
            w.put(format!("k{:08}", i * 2), [b'v'; 10]).unwrap();
        }
        w.commit().unwrap();
        s.flush().unwrap();
        s.set_apply_step_pages(4);
        s
    }

    /// A step applies the leaf with the most pending entries first: with entries spread one
    /// per leaf from the first key on and many pending on one leaf at the last key, a step of
    /// a few pages applies the crowded leaf and leaves the spread entries buffered (a step in
    /// key order applied the spread ones, one leaf copy each, and kept the crowded leaf).
    #[test]
    fn a_step_applies_the_leaf_with_the_most_pending_entries_first() {
        let dir = tempfile::tempdir().unwrap();
        let s = stepping_storage(dir.path());
        // 50 entries, each in a leaf of its own (400 stored keys apart).
        for i in 0..50u32 {
            let mut w = s.begin_write().unwrap();
            w.put(format!("k{:08}", i * 800 + 1), [b'n'; 10]).unwrap();
            w.commit().unwrap();
        }
        // 200 entries between the last two stored keys: one leaf.
        for c in 0..20u32 {
            let mut w = s.begin_write().unwrap();
            for j in 0..10 {
                w.put(format!("k00039996a{:04}", c * 10 + j), [b'h'; 10])
                    .unwrap();
            }
            w.commit().unwrap();
        }
        let before = s.stats();
        assert_eq!(before.apply_steps, 0, "{before:?}");
        assert_eq!(before.buffer_entries, 250, "{before:?}");
        // The buffer is full past here: the next commit takes a step.
        s.set_write_buffer_bytes(before.buffer_bytes - 1);
        let mut w = s.begin_write().unwrap();
        w.put("k00039996b", [b'h'; 10]).unwrap();
        w.commit().unwrap();
        let after = s.stats();
        assert_eq!(after.apply_steps, 1, "{after:?}");
        assert!(
            (45..=50).contains(&after.buffer_entries),
            "the crowded leaf applied, the spread entries still buffered: {after:?}"
        );
        let r = s.begin_read().unwrap();
        assert_eq!(r.len(), 20_000 + 251);
        assert_eq!(r.get("k00039996a0150").unwrap(), Some(&[b'h'; 10][..]));
        assert_eq!(r.get("k00000801").unwrap(), Some(&[b'n'; 10][..]));
    }

    /// Applying the buffer of an idle storage that applies in steps takes one step, bounded
    /// in pages, not the whole buffer (which copied a page per leaf the buffer reached: an
    /// engine's idle indexes so took their page images far past the memory budget).
    #[test]
    fn applying_an_idle_buffer_takes_one_step() {
        let dir = tempfile::tempdir().unwrap();
        let s = stepping_storage(dir.path());
        // 100 entries spread over the tree's leaves: far from full.
        let mut w = s.begin_write().unwrap();
        for i in 0..100u32 {
            w.put(format!("k{:08}", i * 400 + 1), b"n").unwrap();
        }
        w.commit().unwrap();
        let before = s.stats();
        let mut w = s.begin_write().unwrap();
        w.apply_buffer_now().unwrap();
        w.commit().unwrap();
        let after = s.stats();
        assert_eq!(after.apply_steps, before.apply_steps + 1, "{after:?}");
        assert!(
            (90..100).contains(&after.buffer_entries),
            "a few leaves applied, the rest still buffered: {after:?}"
        );
        assert!(
            after.pages_journaled - before.pages_journaled < 20,
            "{before:?} {after:?}"
        );
        assert_eq!(s.begin_read().unwrap().len(), 20_100);
    }

    /// A commit that must apply takes a step only while steps are on: with none set it applies
    /// the whole buffer, and a buffer turned off at run time is applied whole by the next
    /// commit, not carried.
    #[test]
    fn steps_off_and_a_buffer_turned_off_apply_the_whole_buffer() {
        let dir = tempfile::tempdir().unwrap();
        let o = Options {
            write_buffer_bytes: 16 << 10,
            flush_mode: FlushMode::Manual,
            ..Options::default()
        };
        let s = Storage::open(dir.path().join("s"), o).unwrap();
        let mut w = s.begin_write().unwrap();
        for i in 0..3000u32 {
            w.put(format!("k{i:06}"), b"v").unwrap();
        }
        w.commit().unwrap();
        s.flush().unwrap();
        let before = s.stats();
        for i in 0..400 {
            one_put(&s, i);
        }
        let st = s.stats();
        assert_eq!(st.apply_steps, before.apply_steps, "{st:?}");
        assert!(
            st.pages_journaled > before.pages_journaled,
            "the full buffer was applied: {st:?}"
        );
        s.set_apply_step_pages(1);
        for i in 400..800 {
            one_put(&s, i);
        }
        let st = s.stats();
        assert!(st.apply_steps > before.apply_steps, "{st:?}");
        assert!(st.buffer_entries > 0, "{st:?}");
        s.set_write_buffer_bytes(0);
        one_put(&s, 800);
        assert_eq!(s.stats().buffer_entries, 0, "{:?}", s.stats());
        assert_eq!(s.begin_read().unwrap().len(), 3000);
    }
}
