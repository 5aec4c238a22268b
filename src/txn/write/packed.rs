//! Values packed into value page runs (kind 7, docs/design.md 2.7): a value too long for its
//! leaf and at most [`page::node::MAX_PACKED_VALUE`] bytes shares a run of up to
//! [`page::node::MAX_VALUE_RUN_PAGES`] pages with other values of the same leaf. Every run is
//! referenced by the cells of exactly one leaf (invariant I17), so whether a run still holds a
//! live value is known from that leaf alone: no reference counts, no back pointers.
//!
//! A put adds the value to a run this transaction wrote, or gives it a run of its own, or,
//! once the leaf's committed runs with room fill three quarters of a run together with it,
//! merges them and the value into one new run (so a value is copied a few times at most, not
//! at every put into its leaf). A removed value frees its run when no other cell of the leaf names
//! it. A leaf split moves the right half's values out of every run the left half also names.

use super::*;
use crate::page::node::{leaf_packed_cells, leaf_repoint, LeafView, ValRef, VALUE_RUN_BODY};

/// Live bytes (the new value's included) at which committed runs of a leaf are merged into one
/// run with a new value: three quarters of the largest run's body.
const MERGE_FILL: usize = VALUE_RUN_BODY * 3 / 4;

impl WriteTransaction {
    /// Pages of value page run `b` as this transaction sees it.
    fn value_run_pages(&self, b: u64) -> Result<u64> {
        if let Some(body) = self.values.get(&b) {
            return Ok(page::overflow_run_pages(body.len()) as u64);
        }
        let (_, h) = self.base.page(b)?;
        if h.kind != PageKind::Values {
            return Err(self.corrupt(b, "expected a value page"));
        }
        Ok(u64::from(h.run_pages.max(1)))
    }

    /// Frees value page run `b` (no cell names it any more).
    pub(super) fn free_value_run(&mut self, b: u64) -> Result<()> {
        let n = self.value_run_pages(b)?;
        self.values.remove(&b);
        self.free(b, n)
    }

    /// Makes dirty leaf `p` page form when it is held decoded (a merge leaves a decoded leaf):
    /// the packed-value edits work on the image.
    pub(super) fn leaf_in_page_form(&mut self, p: u64) -> Result<()> {
        if matches!(self.nodes.get(&p), Some(Node::Leaf(_))) {
            if let Some(node) = self.nodes.remove(&p) {
                self.park(p, node)?;
            }
        }
        Ok(())
    }

    /// Before the cell of `key` in dirty leaf `p` (page form) is replaced or removed: the
    /// value page run its packed value lies in, when no other cell of the leaf names that run
    /// (the caller frees it after the edit); `None` otherwise.
    pub(super) fn orphaned_run(&self, p: u64, key: &[u8]) -> Result<Option<u64>> {
        let (img, h) = self.node_page(p)?;
        if h.kind != PageKind::Leaf {
            return Ok(None);
        }
        let v = LeafView::new(img, &h);
        let Ok(i) = v
            .search(key)
            .ok_or_else(|| self.corrupt(p, "malformed leaf page"))?
        else {
            return Ok(None);
        };
        let Some((_, ValRef::Packed { page: b, .. })) = v.cell(i) else {
            return Ok(None);
        };
        for j in (0..v.len()).filter(|&j| j != i) {
            match v.cell(j) {
                Some((_, ValRef::Packed { page, .. })) if page == b => return Ok(None),
                Some(_) => {}
                None => return Err(self.corrupt(p, "malformed leaf cell")),
            }
        }
        Ok(Some(b))
    }

    /// Packs `value` (the new value of `key`) into a value page run of dirty leaf `p` (page
    /// form); `key`'s own old value is not counted as live. The value joins the fullest run
    /// this transaction wrote that has room (rewritten in memory: the journal gets its final
    /// image once); else, when the leaf's committed runs that have room, fewest live bytes
    /// first, fill three quarters of a run together with it ([`MERGE_FILL`]), their live
    /// values and the new one are copied, back to back (dead bytes dropped), to one new run
    /// and those runs are freed; else the value takes a new run of its own. Cells moved are
    /// pointed at their new place. Returns the value's reference, for the cell the caller
    /// writes.
    pub(super) fn pack_into_leaf(&mut self, p: u64, key: &[u8], value: &[u8]) -> Result<Val> {
        let (img, h) = self.node_page(p)?;
        let cells = leaf_packed_cells(img).ok_or_else(|| self.corrupt(p, "malformed leaf page"))?;
        let own = match LeafView::new(img, &h).search(key) {
            Some(Ok(i)) => Some(i),
            Some(Err(_)) => None,
            None => return Err(self.corrupt(p, "malformed leaf page")),
        };
        // Live bytes per run the leaf names (a leaf names few runs: a short list).
        let mut runs: Vec<(u64, usize)> = Vec::new();
        for &(i, b, _, len) in &cells {
            if Some(i) == own {
                continue;
            }
            match runs.iter_mut().find(|r| r.0 == b) {
                Some(r) => r.1 += len as usize,
                None => runs.push((b, len as usize)),
            }
        }
        let len = value.len();
        // A run this transaction wrote, with room: joining it costs the journal nothing but its
        // final image.
        let dirty = runs
            .iter()
            .filter(|r| self.values.contains_key(&r.0) && r.1 + len <= VALUE_RUN_BODY)
            .max_by_key(|r| r.1)
            .map(|r| r.0);
        let chosen: Vec<u64> = match dirty {
            Some(b) => vec![b],
            None => {
                // Committed runs with room, fewest live bytes first, merged with the value once
                // together they fill three quarters of a run: until then the value takes a run
                // of its own (no committed run copied for it).
                let mut open: Vec<(u64, usize)> = runs
                    .iter()
                    .filter(|r| r.1 + len <= VALUE_RUN_BODY)
                    .copied()
                    .collect();
                open.sort_unstable_by_key(|r| (r.1, r.0));
                let (mut total, mut set) = (len, Vec::new());
                for (b, live) in open {
                    if total + live <= VALUE_RUN_BODY {
                        total += live;
                        set.push(b);
                    }
                }
                if total >= MERGE_FILL {
                    set
                } else {
                    Vec::new()
                }
            }
        };
        if chosen.is_empty() {
            let q = self.alloc(page::overflow_run_pages(len) as u64)?;
            self.values.insert(q, value.to_vec());
            return Ok(Val::Packed {
                page: q,
                off: HEADER_LEN as u32,
                len: len as u64,
            });
        }
        let mut body = Vec::with_capacity(VALUE_RUN_BODY);
        let mut moves = Vec::new();
        for &(i, rb, off, vlen) in &cells {
            if !chosen.contains(&rb) || Some(i) == own {
                continue;
            }
            moves.push((i, (HEADER_LEN + body.len()) as u32));
            body.extend_from_slice(self.tree_packed(rb, off, vlen)?);
        }
        let voff = (HEADER_LEN + body.len()) as u32;
        body.extend_from_slice(value);
        let pages = page::overflow_run_pages(body.len()) as u64;
        let q = match chosen[..] {
            [b] if self.values.contains_key(&b) && self.value_run_pages(b)? == pages => b,
            _ => {
                let q = self.alloc(pages)?;
                for &b in &chosen {
                    self.free_value_run(b)?;
                }
                q
            }
        };
        self.values.insert(q, body);
        for (i, off) in moves {
            let r = leaf_repoint(self.page_mut(p)?, i, q, off)
                .ok_or_else(|| self.corrupt(p, "malformed leaf cell"))?;
            self.touch(p, [r, 0..0, 0..0]);
        }
        Ok(Val::Packed {
            page: q,
            off: voff,
            len: len as u64,
        })
    }

    /// After leaf `l` split into `l` and its new right sibling `r` (both dirty, page form):
    /// the right half's values lying in runs the left half also names are copied to new runs
    /// (packed together), so every run is named by one leaf again. The left half's runs keep
    /// the moved values' bytes, dead, until they are next copied. (Moving, for each run, the
    /// half with fewer of its bytes instead left dead bytes on both sides: more merges later,
    /// more journal bytes in all.)
    pub(super) fn separate_runs(&mut self, l: u64, r: u64) -> Result<()> {
        let (limg, _) = self.node_page(l)?;
        let left: Vec<u64> = leaf_packed_cells(limg)
            .ok_or_else(|| self.corrupt(l, "malformed leaf page"))?
            .into_iter()
            .map(|c| c.1)
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        let (rimg, _) = self.node_page(r)?;
        let shared: Vec<(usize, u64, u32, u64)> = leaf_packed_cells(rimg)
            .ok_or_else(|| self.corrupt(r, "malformed leaf page"))?
            .into_iter()
            .filter(|c| left.contains(&c.1))
            .collect();
        self.move_to_new_runs(r, &shared)
    }

    /// Copies the values of `cells` (packed cells of dirty leaf `p`: index, run, offset,
    /// length) back to back into new runs and points the cells at them.
    fn move_to_new_runs(&mut self, p: u64, cells: &[(usize, u64, u32, u64)]) -> Result<()> {
        let mut bodies: Vec<Vec<u8>> = Vec::new();
        let mut moves = Vec::with_capacity(cells.len());
        for &(i, b, off, len) in cells {
            let bytes = self.tree_packed(b, off, len)?;
            let n = bodies.len();
            match bodies.last_mut() {
                Some(body) if body.len() + bytes.len() <= VALUE_RUN_BODY => {
                    moves.push((i, n - 1, (HEADER_LEN + body.len()) as u32));
                    body.extend_from_slice(bytes);
                }
                _ => {
                    moves.push((i, n, HEADER_LEN as u32));
                    bodies.push(bytes.to_vec());
                }
            }
        }
        let mut runs = Vec::with_capacity(bodies.len());
        for body in bodies {
            let q = self.alloc(page::overflow_run_pages(body.len()) as u64)?;
            self.values.insert(q, body);
            runs.push(q);
        }
        for (i, k, off) in moves {
            let rg = leaf_repoint(self.page_mut(p)?, i, runs[k], off)
                .ok_or_else(|| self.corrupt(p, "malformed leaf cell"))?;
            self.touch(p, [rg, 0..0, 0..0]);
        }
        Ok(())
    }

    /// Frees the value page runs named by `removed` that no value of `kept` names (values of
    /// one leaf: some removed, the rest kept).
    pub(super) fn free_removed_runs<'v>(
        &mut self,
        removed: impl Iterator<Item = &'v Val>,
        kept: impl Iterator<Item = &'v Val> + Clone,
    ) -> Result<()> {
        let mut gone: Vec<u64> = Vec::new();
        for v in removed {
            if let Val::Packed { page, .. } = v {
                if !gone.contains(page) {
                    gone.push(*page);
                }
            }
        }
        for b in gone {
            let named = kept
                .clone()
                .any(|v| matches!(v, Val::Packed { page, .. } if *page == b));
            if !named {
                self.free_value_run(b)?;
            }
        }
        Ok(())
    }
}
