//! Building or reconciling an index from a snapshot of the documents (design.md 10.3): the
//! expected entries in bounded memory passes, diffed against the index storage, the difference
//! written in bounded batches.

use super::batch::{call_map, storage_failure, write_ops, Ops};
use super::definition::{MapFn, INDEX_APPLIED_KEY};
use super::progress::BuildProgress;
use super::IndexActor;
use crate::actor_interface::{IndexFailure, ReadTransaction, Result};
use crate::actors::index_key;
use std::cmp::Ordering;
use std::ops::Bound;

/// Documents a build scans per job on the background I/O pool.
pub(super) const SCAN_CHUNK: usize = 4096;

/// Entries a build writes per transaction at most.
pub(super) const DIFF_BATCH: usize = 16_384;

/// The expected entries of one reconcile pass: keys at or above `lo` and below `cutoff`, in one
/// buffer of at most `budget` bytes (keys plus 16 bytes each).
pub(super) struct Expected {
    pub(super) arena: Vec<u8>,
    pub(super) spans: Vec<(usize, u32)>,
    pub(super) lo: Option<Vec<u8>>,
    pub(super) cutoff: Option<Vec<u8>>,
    pub(super) budget: usize,
    /// Count terms skipped for their length (first pass only: later passes see them again).
    pub(super) count_skipped: bool,
    pub(super) skipped: u64,
}

impl Expected {
    pub(super) fn new(budget: usize, lo: Option<Vec<u8>>, count_skipped: bool) -> Expected {
        Expected {
            arena: Vec::new(),
            spans: Vec::new(),
            lo,
            cutoff: None,
            budget,
            count_skipped,
            skipped: 0,
        }
    }

    pub(super) fn key(&self, s: (usize, u32)) -> &[u8] {
        &self.arena[s.0..s.0 + s.1 as usize]
    }

    pub(super) fn add(&mut self, term: &[u8], doc: &[u8]) {
        let Some(len) = index_key::entry_len(term, doc) else {
            self.skipped += u64::from(self.count_skipped);
            return;
        };
        let start = self.arena.len();
        index_key::push_entry_key(&mut self.arena, term, doc);
        let k = &self.arena[start..];
        if self.lo.as_deref().is_some_and(|lo| k < lo)
            || self.cutoff.as_deref().is_some_and(|c| k >= c)
        {
            self.arena.truncate(start);
            return;
        }
        self.spans.push((start, len as u32));
        if self.arena.len() + self.spans.len() * 16 > self.budget && self.spans.len() > 1 {
            self.shrink();
        }
    }

    pub(super) fn sort_dedup(&mut self) {
        let arena = &self.arena;
        let key = |s: &(usize, u32)| &arena[s.0..s.0 + s.1 as usize];
        self.spans.sort_unstable_by(|a, b| key(a).cmp(key(b)));
        self.spans.dedup_by(|a, b| key(a) == key(b));
    }

    /// Keeps the smaller half of the keys; the first one dropped becomes the cutoff.
    pub(super) fn shrink(&mut self) {
        self.sort_dedup();
        if self.spans.len() < 2 {
            return;
        }
        let keep = self.spans.len() / 2;
        self.cutoff = Some(self.key(self.spans[keep]).to_vec());
        let mut arena = Vec::with_capacity(self.arena.len() / 2 + 1);
        let mut spans = Vec::with_capacity(keep);
        for s in &self.spans[..keep] {
            let start = arena.len();
            arena.extend_from_slice(self.key(*s));
            spans.push((start, s.1));
        }
        self.arena = arena;
        self.spans = spans;
    }
}

/// Scans up to `max_docs` documents after `after`, adding their entries to `exp`. Returns the
/// documents scanned and whether the snapshot ended.
pub(super) fn scan_chunk(
    root: &ReadTransaction,
    map: &MapFn,
    exp: &mut Expected,
    after: &mut Option<Vec<u8>>,
    max_docs: usize,
) -> std::result::Result<(u64, bool), IndexFailure> {
    let prev = after.take();
    let start = match prev.as_deref() {
        Some(k) => Bound::Excluded(k),
        None => Bound::Unbounded,
    };
    let mut n = 0usize;
    let mut last: Option<&[u8]> = None;
    for item in root
        .range((start, Bound::Unbounded))
        .map_err(storage_failure)?
    {
        let (k, v) = item.map_err(storage_failure)?;
        for t in call_map(map, k, v)? {
            exp.add(&t, k);
        }
        n += 1;
        last = Some(k);
        if n >= max_docs {
            break;
        }
    }
    *after = last.map(<[u8]>::to_vec).or(prev);
    Ok((n as u64, n < max_docs))
}

/// Where a diff stopped: the next expected key, and the last index key consumed.
#[derive(Default)]
pub(super) struct DiffPos {
    pub(super) e: usize,
    pub(super) after: Option<Vec<u8>>,
}

/// Diffs the expected keys against the index's entries in the pass's range, from `pos`, adding
/// up to `max_ops` operations to `ops`. Returns whether the range is done.
pub(super) fn diff_chunk(
    index: &ReadTransaction,
    exp: &Expected,
    pos: &mut DiffPos,
    max_ops: usize,
    ops: &mut Ops,
) -> Result<bool> {
    let start = match (&pos.after, &exp.lo) {
        (Some(k), _) => Bound::Excluded(k.as_slice()),
        (None, Some(lo)) => Bound::Included(lo.as_slice()),
        (None, None) => Bound::Unbounded,
    };
    let end = match &exp.cutoff {
        Some(c) => Bound::Excluded(c.as_slice()),
        None => Bound::Unbounded,
    };
    let mut it = index.range((start, end))?;
    let mut cur = it.next().transpose()?;
    let mut consumed: Option<&[u8]> = None;
    let done = loop {
        if ops.len() >= max_ops {
            break false;
        }
        let e = exp.spans.get(pos.e).map(|s| exp.key(*s));
        let Some((ik, iv)) = cur else {
            match e {
                None => break true,
                Some(e) => {
                    ops.push_key(e, true);
                    pos.e += 1;
                    continue;
                }
            }
        };
        match e.map_or(Ordering::Greater, |e| e.cmp(ik)) {
            Ordering::Less => {
                if let Some(e) = e {
                    ops.push_key(e, true);
                }
                pos.e += 1;
            }
            Ordering::Equal => {
                if !iv.is_empty() {
                    ops.push_key(ik, true);
                }
                pos.e += 1;
                consumed = Some(ik);
                cur = it.next().transpose()?;
            }
            Ordering::Greater => {
                if ik != INDEX_APPLIED_KEY {
                    ops.push_key(ik, false);
                }
                consumed = Some(ik);
                cur = it.next().transpose()?;
            }
        }
    };
    if let Some(k) = consumed {
        pos.after = Some(k.to_vec());
    }
    Ok(done)
}

/// Makes the index equal to what the map function gives for the documents of `root`, then
/// records `root`'s txn. Returns false when abandoned (shutdown, drop).
pub(super) async fn reconcile(
    a: &IndexActor,
    root: ReadTransaction,
) -> std::result::Result<bool, IndexFailure> {
    let (def, shared, branch, pool, slots) = (&a.def, &a.shared, &a.branch, &a.pool, &a.slots);
    let abandoned = || shared.abandon.load(std::sync::atomic::Ordering::Acquire);
    shared.reconcile_started();
    let total = root.len();
    shared.set_build(
        BuildProgress {
            pass: 1,
            scanned: 0,
            total,
        },
        0,
    );
    // A slot bounds the expected-entry buffers held at once; an empty snapshot needs none.
    let _slot = match total {
        0 => None,
        _ => match slots.acquire().await {
            Some(s) => Some(s),
            None => return Ok(false),
        },
    };
    let root_txn = root.txn_id();
    let mut lo: Option<Vec<u8>> = None;
    let mut pass = 0u32;
    loop {
        pass += 1;
        // Phase 1: the expected entries of this pass's key range.
        let mut exp = Expected::new(def.reconcile_memory, lo.take(), pass == 1);
        let mut after: Option<Vec<u8>> = None;
        let mut scanned = 0u64;
        loop {
            if abandoned() {
                return Ok(false);
            }
            let (snap, map) = (root.clone(), def.map.clone());
            let (mut e, a) = (exp, after);
            let (e, a, r) = pool
                .run(move || {
                    let mut a = a;
                    let r = scan_chunk(&snap, &*map, &mut e, &mut a, SCAN_CHUNK);
                    if matches!(r, Ok((_, true))) {
                        e.sort_dedup();
                    }
                    Ok((e, a, r))
                })
                .await
                .map_err(storage_failure)?;
            (exp, after) = (e, a);
            let (n, done) = r?;
            scanned += n;
            let skipped = std::mem::take(&mut exp.skipped);
            shared.set_build(
                BuildProgress {
                    pass,
                    scanned,
                    total,
                },
                skipped,
            );
            if done {
                break;
            }
        }
        // Phase 2: the difference, written in bounded batches.
        let index = branch.storage.begin_read().map_err(storage_failure)?;
        let mut pos = DiffPos::default();
        loop {
            if abandoned() {
                return Ok(false);
            }
            let (snap, e, p) = (index.clone(), exp, pos);
            let (e, p, ops, done) = pool
                .run(move || {
                    let mut p = p;
                    let mut ops = Ops::default();
                    let done = diff_chunk(&snap, &e, &mut p, DIFF_BATCH, &mut ops)?;
                    Ok((e, p, ops, done))
                })
                .await
                .map_err(storage_failure)?;
            (exp, pos) = (e, p);
            if !ops.is_empty() {
                write_ops(branch, ops, None, a.batch_pages)
                    .await
                    .map_err(storage_failure)?;
            }
            if done {
                break;
            }
        }
        match exp.cutoff.take() {
            Some(c) => lo = Some(c),
            None => break,
        }
    }
    drop(root);
    write_ops(branch, Ops::default(), Some(root_txn), a.batch_pages)
        .await
        .map_err(storage_failure)?;
    Ok(true)
}
