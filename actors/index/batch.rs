//! Building an index batch: map a document change's old and new value, turn the difference
//! into sorted deletes and puts of entry keys, and write them through the index storage's actor
//! (in bounded transactions).

use super::definition::{applied_record, MapFn, INDEX_APPLIED_KEY};
use crate::actor_interface::{self, Error, IndexFailure, Result};
use crate::actors::index_key;
use crate::actors::messages::{ApplyJob, DocumentChange, StorageMsg};
use crate::actors::storage::StorageHandle;
use crate::actors::update::panic_message;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

/// Runs the map function, turning a panic into [`IndexFailure::MapPanicked`].
pub(crate) fn call_map(
    map: &MapFn,
    key: &[u8],
    value: &[u8],
) -> std::result::Result<Vec<Vec<u8>>, IndexFailure> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| map(key, value))).map_err(|p| {
        IndexFailure::MapPanicked {
            key: key.to_vec(),
            message: panic_message(&*p),
        }
    })
}

pub(super) fn storage_failure(e: Error) -> IndexFailure {
    IndexFailure::Storage(Box::new(e))
}

/// One put or delete of a batch: its key is `arena[start..start + len]`; `prefix` is the key's
/// first 8 bytes, big-endian, zero-padded (sorting compares it before the bytes).
#[derive(Clone, Copy)]
pub(super) struct Op {
    pub(super) prefix: u64,
    pub(super) start: usize,
    pub(super) len: u32,
    pub(super) put: bool,
}

/// The first 8 bytes of `key` as a big-endian number, zero-padded: ordered as the keys are,
/// except that keys equal in it need a byte comparison.
pub(super) fn key_prefix(key: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = key.len().min(8);
    b[..n].copy_from_slice(&key[..n]);
    u64::from_be_bytes(b)
}

/// A batch of index operations, keys in one buffer.
#[derive(Default)]
pub(super) struct Ops {
    pub(super) arena: Vec<u8>,
    pub(super) ops: Vec<Op>,
}

impl Ops {
    pub(super) fn with_capacity(bytes: usize, ops: usize) -> Ops {
        Ops {
            arena: Vec::with_capacity(bytes),
            ops: Vec::with_capacity(ops),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.ops.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    pub(super) fn key(&self, o: &Op) -> &[u8] {
        &self.arena[o.start..o.start + o.len as usize]
    }

    /// Adds the entry of `term` for document `doc` (`index_key.rs`); false (nothing added)
    /// when its key would pass [`crate::MAX_KEY_LEN`].
    pub(super) fn push_entry(&mut self, term: &[u8], doc: &[u8], put: bool) -> bool {
        let Some(len) = index_key::entry_len(term, doc) else {
            return false;
        };
        let start = self.arena.len();
        index_key::push_entry_key(&mut self.arena, term, doc);
        self.ops.push(Op {
            prefix: key_prefix(&self.arena[start..]),
            start,
            len: len as u32,
            put,
        });
        true
    }

    pub(super) fn push_key(&mut self, key: &[u8], put: bool) {
        let start = self.arena.len();
        self.arena.extend_from_slice(key);
        self.ops.push(Op {
            prefix: key_prefix(key),
            start,
            len: key.len() as u32,
            put,
        });
    }

    /// Sorts the operations by key, keeping only the last operation of each key (the state a
    /// key ends in after applying them in order).
    pub(super) fn settle(&mut self) {
        let arena = &self.arena;
        let key = |o: &Op| &arena[o.start..o.start + o.len as usize];
        // Operations on one key stay in their order: `start` grows with each push. Unstable
        // (no buffer), and most comparisons end at the 8-byte prefix.
        self.ops.sort_unstable_by(|a, b| {
            a.prefix
                .cmp(&b.prefix)
                .then_with(|| key(a).cmp(key(b)))
                .then(a.start.cmp(&b.start))
        });
        let n = self.ops.len();
        let mut out = 0;
        for i in 0..n {
            if i + 1 < n && key(&self.ops[i]) == key(&self.ops[i + 1]) {
                continue;
            }
            self.ops[out] = self.ops[i];
            out += 1;
        }
        self.ops.truncate(out);
    }
}

pub(super) fn contains(list: &[Vec<u8>], sorted: bool, t: &[u8]) -> bool {
    if sorted {
        list.binary_search_by(|x| x.as_slice().cmp(t)).is_ok()
    } else {
        list.iter().any(|x| x == t)
    }
}

/// Adds the operations of one document change: deletes for the terms it lost, puts for the
/// ones it gained. Returns the terms skipped for their length.
pub(super) fn diff_change(
    map: &MapFn,
    c: &DocumentChange,
    ops: &mut Ops,
) -> std::result::Result<u64, IndexFailure> {
    let mut old = match &c.old {
        Some(v) => call_map(map, &c.key, v)?,
        None => Vec::new(),
    };
    let mut new = match &c.new {
        Some(v) => call_map(map, &c.key, v)?,
        None => Vec::new(),
    };
    let sorted = old.len() > 8 && new.len() > 8;
    if sorted {
        old.sort_unstable();
        new.sort_unstable();
    }
    let mut skipped = 0;
    for t in &old {
        if !contains(&new, sorted, t) {
            ops.push_entry(t, &c.key, false);
        }
    }
    for t in &new {
        if !contains(&old, sorted, t) && !ops.push_entry(t, &c.key, true) {
            skipped += 1;
        }
    }
    Ok(skipped)
}

/// Writes `ops` (and, with `applied`, the applied record) through the index storage's actor;
/// returns once durable, with the number of pages its transactions copied or created (tree
/// pages, not free-space bitmaps).
///
/// One transaction, unless it copies `max_pages` pages or more (a batch of entries scattered
/// over a large index copies most of its leaves, and every copy is a page image held until
/// flushed: [`crate::live_image_bytes`]), or, in a buffered index, holds operations of a
/// quarter of its write buffer's size: then the transaction commits what it applied so far
/// and the next one goes on from there, so no single transaction holds more than about
/// `max_pages` dirty pages nor overfills the buffer. Each transaction but the last deletes the applied record (the
/// entries it commits belong to root commits past the record): a crash between them leaves an
/// index with no record, which the next definition reconciles. The last one writes `applied`.
pub(super) async fn write_ops(
    branch: &StorageHandle,
    ops: Ops,
    applied: Option<u64>,
    max_pages: usize,
) -> Result<usize> {
    let ops = Arc::new(ops);
    let mut from = 0;
    let mut pages = 0;
    // A buffered index's transaction holds at most a quarter of its buffer in operations: each
    // commit then leaves the buffer within about 1.25 times its size (it applies a step when
    // over), and the actor paces on the memory budget between them.
    let max_logical = branch.storage.write_buffer_bytes() / 4;
    // Bounded: every turn applies at least one operation (or ends).
    loop {
        let progress = Arc::new((AtomicUsize::new(0), AtomicUsize::new(0)));
        let seen = progress.clone();
        let job_ops = ops.clone();
        let job: ApplyJob = Box::new(move |w| {
            let mut next = from;
            for o in &job_ops.ops[from..] {
                let k = job_ops.key(o);
                if o.put {
                    w.put(k, b"")?;
                } else {
                    w.delete(k)?;
                }
                next += 1;
                let full = actor_interface::dirty_pages(w) >= max_pages
                    || (max_logical > 0 && actor_interface::logical_bytes(w) >= max_logical);
                if full && next < job_ops.ops.len() {
                    break;
                }
            }
            if next < job_ops.ops.len() {
                if applied.is_some() {
                    w.delete(INDEX_APPLIED_KEY)?;
                }
            } else if let Some(t) = applied {
                w.put(INDEX_APPLIED_KEY, applied_record(t))?;
            }
            seen.0.store(next, std::sync::atomic::Ordering::Relaxed);
            seen.1.store(
                actor_interface::dirty_pages(w),
                std::sync::atomic::Ordering::Relaxed,
            );
            Ok(())
        });
        let (tx, rx) = flume::bounded(1);
        branch
            .tx
            .ask(StorageMsg::Apply { job, reply: tx }, rx)
            .await??;
        let next = progress.0.load(std::sync::atomic::Ordering::Relaxed);
        pages += progress.1.load(std::sync::atomic::Ordering::Relaxed);
        if next >= ops.ops.len() || next <= from {
            return Ok(pages);
        }
        from = next;
    }
}
