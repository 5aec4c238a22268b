//! The copy-on-write B+tree, read side: point lookups, ordered double-ended range cursors
//! (`cursor.rs`, over a snapshot or a write transaction's own tree) and the structural check,
//! over one immutable `State` (a snapshot). The write side (copy-on-write updates,
//! splits, merges) is in `txn/write.rs`.
//!
//! Readers work on page bytes directly ([`LeafView`], [`BranchView`]): keys and values are
//! returned as slices of the map or of scratch pages, without copying.

mod cursor;

pub(crate) use cursor::{before_start, past_end, NodeRef, Source};
pub use cursor::{KeyRange, Range};

use crate::error::{Corruption, Error, Result};
use crate::page::node::{BranchView, LeafView, ValRef};
use crate::page::{PageHeader, PageKind, HEADER_LEN};
use crate::state::State;

/// Bound on tree depth: a tree deeper than this is corrupt (fan-out >= 4 gives 4^32 leaves).
pub const MAX_DEPTH: usize = 32;

fn corrupt(state: &State, page: u64, what: &str) -> Error {
    Error::corruption(state.path(), Some(page), None, what)
}

/// Resolves a value reference to its bytes (overflow runs read in place).
pub(crate) fn value<'a>(state: &'a State, v: ValRef<'a>) -> Result<&'a [u8]> {
    match v {
        ValRef::Inline(b) => Ok(b),
        ValRef::Overflow { page, len } => {
            let (img, h) = state.page(page)?;
            if h.kind != PageKind::Overflow {
                return Err(corrupt(state, page, "expected an overflow page"));
            }
            img.get(HEADER_LEN..HEADER_LEN + len as usize)
                .ok_or_else(|| corrupt(state, page, "overflow run shorter than its value"))
        }
    }
}

/// Looks `key` up in the tree of `state`.
pub(crate) fn get<'a>(state: &'a State, key: &[u8]) -> Result<Option<&'a [u8]>> {
    let mut p = state.root;
    if p == 0 {
        return Ok(None);
    }
    for _ in 0..MAX_DEPTH {
        let (img, h) = state.page(p)?;
        match h.kind {
            PageKind::Branch => {
                let v = BranchView::new(img, &h);
                p = v
                    .child_index(key)
                    .and_then(|i| v.child(i))
                    .ok_or_else(|| corrupt(state, p, "malformed branch page"))?;
            }
            PageKind::Leaf => {
                let v = LeafView::new(img, &h);
                return match v.search(key) {
                    None => Err(corrupt(state, p, "malformed leaf page")),
                    Some(Err(_)) => Ok(None),
                    Some(Ok(i)) => {
                        let (_, val) = v
                            .cell(i)
                            .ok_or_else(|| corrupt(state, p, "malformed leaf cell"))?;
                        value(state, val).map(Some)
                    }
                };
            }
            _ => return Err(corrupt(state, p, "expected a branch or leaf page")),
        }
    }
    Err(corrupt(state, p, "tree deeper than 32 levels"))
}

/// What [`crate::Storage::check`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckReport {
    /// Transaction id of the checked snapshot.
    pub txn_id: u64,
    /// Pages whose checksum was verified (an overflow run counts its pages).
    pub pages_checked: u64,
    /// Pages reachable from the root and the free-space map (header pages included).
    pub pages_in_use: u64,
    /// Pages the free-space map marks free.
    pub pages_free: u64,
    /// Keys found in the leaves.
    pub entries: u64,
    /// Levels of the tree (0 = empty).
    pub depth: u32,
    /// Every problem found: checksums, key order, structure, free-space map disagreements.
    pub problems: Vec<Corruption>,
}

impl CheckReport {
    /// True when no problem was found.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

struct Checker<'a> {
    state: &'a State,
    report: CheckReport,
    used: Vec<u64>,
    leaf_depth: Option<u32>,
}

impl<'a> Checker<'a> {
    fn problem(&mut self, page: u64, what: impl Into<String>) {
        if self.report.problems.len() < 1000 {
            self.report.problems.push(Corruption {
                file: self.state.path().to_path_buf(),
                page: Some(page),
                offset: None,
                what: what.into(),
            });
        }
    }

    fn mark(&mut self, start: u64, n: u64) {
        for p in start..start.saturating_add(n) {
            if p >= self.state.next_page {
                self.problem(
                    p,
                    format!(
                        "page in use at or beyond next page {}",
                        self.state.next_page
                    ),
                );
                return;
            }
            let (w, b) = ((p / 64) as usize, p % 64);
            if self.used[w] & (1 << b) != 0 {
                self.problem(p, "page reachable twice");
            }
            self.used[w] |= 1 << b;
        }
    }

    fn page(&mut self, p: u64) -> Option<(&'a [u8], PageHeader)> {
        let state: &'a State = self.state;
        match state.page_verified(p) {
            Ok((img, h)) => {
                self.report.pages_checked += h.run_pages as u64;
                Some((img, h))
            }
            Err(Error::Corruption(c)) => {
                if self.report.problems.len() < 1000 {
                    self.report.problems.push(c);
                }
                None
            }
            Err(e) => {
                self.problem(p, format!("unreadable: {e}"));
                None
            }
        }
    }

    fn node(&mut self, p: u64, lo: Option<&[u8]>, hi: Option<&[u8]>, depth: u32) {
        if depth as usize > MAX_DEPTH {
            self.problem(p, "tree deeper than 32 levels");
            return;
        }
        let state = self.state;
        let Some((img, h)) = self.page(p) else { return };
        self.mark(p, 1);
        let in_bounds = |k: &[u8]| lo.is_none_or(|l| k >= l) && hi.is_none_or(|h| k < h);
        match h.kind {
            PageKind::Leaf => {
                if let Some(d) = self.leaf_depth {
                    if d != depth {
                        self.problem(p, format!("leaf at depth {depth}, others at {d}"));
                    }
                } else {
                    self.leaf_depth = Some(depth);
                    self.report.depth = depth;
                }
                let v = LeafView::new(img, &h);
                let mut prev: Option<&[u8]> = None;
                for i in 0..v.len() {
                    let Some((k, val)) = v.cell(i) else {
                        self.problem(p, format!("malformed leaf cell {i}"));
                        return;
                    };
                    if prev.is_some_and(|q| q >= k) {
                        self.problem(p, format!("keys out of order at cell {i}"));
                    }
                    if !in_bounds(k) {
                        self.problem(p, format!("key at cell {i} outside its parent's range"));
                    }
                    if k.is_empty() || k.len() > crate::MAX_KEY_LEN {
                        self.problem(p, format!("key length {} at cell {i}", k.len()));
                    }
                    prev = Some(k);
                    self.report.entries += 1;
                    if let ValRef::Overflow { page, len } = val {
                        if let Some((_, oh)) = self.page(page) {
                            if oh.kind != PageKind::Overflow {
                                self.problem(page, "expected an overflow page");
                            } else if (oh.run_pages as u64)
                                < crate::page::overflow_run_pages(len as usize) as u64
                            {
                                self.problem(page, "overflow run shorter than its value");
                            } else {
                                self.mark(page, oh.run_pages as u64);
                            }
                        }
                    }
                }
                let _ = state;
            }
            PageKind::Branch => {
                let v = BranchView::new(img, &h);
                let mut keys = Vec::with_capacity(v.keys());
                for i in 0..v.keys() {
                    match v.key(i) {
                        Some(k) => keys.push(k),
                        None => {
                            self.problem(p, format!("malformed branch key {i}"));
                            return;
                        }
                    }
                }
                if keys.windows(2).any(|w| w[0] >= w[1]) {
                    self.problem(p, "separator keys out of order");
                }
                if keys.iter().any(|k| !in_bounds(k)) {
                    self.problem(p, "separator outside its parent's range");
                }
                for i in 0..=keys.len() {
                    let Some(c) = v.child(i) else {
                        self.problem(p, format!("malformed child {i}"));
                        return;
                    };
                    let clo = if i == 0 { lo } else { Some(keys[i - 1]) };
                    let chi = if i == keys.len() { hi } else { Some(keys[i]) };
                    self.node(c, clo, chi, depth + 1);
                }
            }
            _ => self.problem(p, "expected a branch or leaf page"),
        }
    }
}

/// Checks the snapshot `state`: page checksums, key order and bounds, equal leaf depth,
/// overflow runs, and that every page below `next_page` is either in use or marked free in
/// the free-space map, never both and never neither.
pub(crate) fn check(state: &State) -> CheckReport {
    let words = (state.next_page as usize).div_ceil(64) + 1;
    let mut c = Checker {
        state,
        report: CheckReport {
            txn_id: state.txn_id,
            ..Default::default()
        },
        used: vec![0; words],
        leaf_depth: None,
    };
    c.mark(0, 2.min(state.next_page));
    if state.root != 0 {
        c.node(state.root, None, None, 1);
    }
    if c.report.entries != state.entries {
        let (e, s) = (c.report.entries, state.entries);
        c.problem(state.root, format!("{e} keys in the leaves, {s} recorded"));
    }
    let mut free = vec![0u64; words];
    if state.freedir != 0 {
        if let Some((img, h)) = c.page(state.freedir) {
            c.mark(state.freedir, 1);
            if h.kind != PageKind::FreeDir {
                c.problem(state.freedir, "expected a free-space directory page");
            } else {
                let n = h.count as usize;
                let pages: Vec<u64> = (0..n)
                    .filter_map(|i| crate::page::rd_u64(img, HEADER_LEN + 8 * i))
                    .collect();
                for (idx, bp) in pages.into_iter().enumerate() {
                    let Some((bimg, bh)) = c.page(bp) else {
                        continue;
                    };
                    c.mark(bp, 1);
                    if bh.kind != PageKind::FreeBitmap {
                        c.problem(bp, "expected a free-space bitmap page");
                        continue;
                    }
                    let base = idx as u64 * crate::freespace::BITS_PER_BITMAP;
                    for w in 0..crate::freespace::WORDS {
                        let bits = crate::page::rd_u64(bimg, HEADER_LEN + 8 * w).unwrap_or(0);
                        for b in 0..64u64 {
                            let p = base + w as u64 * 64 + b;
                            if bits & (1 << b) != 0 && p < state.next_page {
                                free[(p / 64) as usize] |= 1 << b;
                            }
                        }
                    }
                }
            }
        }
    }
    for p in 0..state.next_page {
        let (w, b) = ((p / 64) as usize, p % 64);
        let used = c.used[w] & (1 << b) != 0;
        let is_free = free[w] & (1 << b) != 0;
        match (used, is_free) {
            (true, true) => c.problem(p, "page in use but marked free"),
            (false, false) => c.problem(p, "page neither in use nor free (leaked)"),
            (true, false) => c.report.pages_in_use += 1,
            (false, true) => c.report.pages_free += 1,
        }
    }
    c.report
}
