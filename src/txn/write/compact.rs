//! Compaction's part of the write transaction (`Storage::compact`, design.md section 13):
//! moving pages at or above a limit into free pages below it (ordinary copy-on-write: a moved
//! page is a new page of this commit, its old number is freed as any copied page's is), and
//! lowering `next_page` over the free tail.

use crate::error::Result;
use crate::page::node::{Node, Val};
use crate::page::{self, PageKind};

use super::WriteTransaction;

/// Free pages below the limit kept in hand before each move: enough to copy every ancestor of a
/// moved page (a path is at most 32 pages) and a few bitmap pages.
const RESERVE: u64 = 40;

impl WriteTransaction {
    /// True when this transaction can allocate at least `need` free pages below `limit` now
    /// (its own freed pages and the writer's reusable extents). Costs at most `need` extents of
    /// each (`Extents::pages_below_up_to`): called before every page moved, it must not grow
    /// with the free-space map (design.md 13).
    fn free_below(&self, limit: u64, need: u64) -> bool {
        let own = self.local_free.pages_below_up_to(limit, need);
        let w = self.writer.as_ref().map_or(0, |w| {
            w.alloc
                .reusable
                .pages_below_up_to(limit, need.saturating_sub(own))
        });
        own + w >= need
    }

    /// True when a run of `n` pages can be allocated below `limit` with [`RESERVE`] to spare.
    fn room_below(&self, n: u64, limit: u64) -> bool {
        let fits = |e: &crate::freespace::Extents| e.iter().any(|(s, l)| l >= n && s + n <= limit);
        let first_fit_low = if self.local_free.iter().any(|(_, l)| l >= n) {
            fits(&self.local_free)
        } else {
            self.writer.as_ref().is_some_and(|w| {
                // `Extents::take` is first fit, lowest address: the first extent that fits must
                // lie below the limit.
                w.alloc
                    .reusable
                    .iter()
                    .find(|(_, l)| *l >= n)
                    .is_some_and(|(s, _)| s + n <= limit)
            })
        };
        first_fit_low && self.free_below(limit, n + RESERVE)
    }

    /// Where compaction should move pages from: pages in use (not free in the map) plus some
    /// slack for the ancestors of moved pages. Pages at or above the returned limit are moved
    /// below it; `None` when the file has nothing to gain (the limit is not below next page).
    pub(crate) fn compaction_limit(&self) -> Option<u64> {
        let w = self.writer.as_ref()?;
        let free = w.alloc.reusable.pages() + w.alloc.pending_pages;
        let used = self.next_page.saturating_sub(free).max(2);
        let limit = used + RESERVE + used / 32;
        (limit < self.next_page).then_some(limit)
    }

    /// Moves every tree page, overflow run and free-space map page at or above `limit` to a
    /// free page below it, as far as free pages below it allow (keeping [`RESERVE`]), copying
    /// the ancestors of moved pages as any change does. Returns the pages moved (0: nothing to
    /// move, or no room: the transaction is then unchanged).
    ///
    /// Errors: corruption reading a page (the transaction is then failed).
    pub(crate) fn relocate_above(&mut self, limit: u64) -> Result<u64> {
        self.guard()?;
        // Moves are page changes: a buffered storage's entries go into the tree first.
        self.apply_buffered()?;
        let r = self.relocate_all(limit);
        self.fail(r)
    }

    fn relocate_all(&mut self, limit: u64) -> Result<u64> {
        self.load_fsm()?;
        let mut moved = 0;
        if self.root != 0 {
            let root = self.root;
            self.root = self.relocate(root, limit, 0, &mut moved)?;
        }
        // The free-space map's pages keep their numbers for life, except here: a bitmap or the
        // directory above the limit gets a new page (journaled whole), and its old page is
        // freed like a copied tree page.
        for idx in 0..self.dir.len() {
            if self.dir[idx] < limit || !self.room_below(1, limit) {
                continue;
            }
            self.bitmap(idx)?;
            let new = self.alloc(1)?;
            let old = std::mem::replace(&mut self.dir[idx], new);
            if let Some(e) = self.bitmaps.get_mut(&idx) {
                // Not a copy of the committed page at its own number any more: sealed whole.
                e.1 = None;
            }
            self.touch_dir()?;
            self.free(old, 1)?;
            moved += 1;
        }
        if self.dir_page >= limit && self.room_below(1, limit) {
            let old = self.dir_page;
            self.dir_page = self.alloc(1)?;
            self.dir_dirty = true;
            self.free(old, 1)?;
            moved += 1;
        }
        if moved > 0 {
            self.changed = true;
        }
        Ok(moved)
    }

    /// Moves what is at or above `limit` in the subtree of node `p`; returns the subtree's
    /// (possibly new) page.
    fn relocate(&mut self, p: u64, limit: u64, depth: usize, moved: &mut u64) -> Result<u64> {
        if depth > crate::btree::MAX_DEPTH {
            return Err(self.corrupt(p, "tree deeper than 32 levels"));
        }
        let node = self.read_node(p)?;
        match node {
            Node::Branch { keys, mut children } => {
                let mut changed = false;
                for c in children.iter_mut() {
                    let nc = self.relocate(*c, limit, depth + 1, moved)?;
                    if nc != *c {
                        *c = nc;
                        changed = true;
                    }
                }
                let dirty = self.nodes.contains_key(&p) || self.pages.contains_key(&p);
                if !changed && (p < limit || dirty || !self.room_below(1, limit)) {
                    return Ok(p);
                }
                let np = self.cow(p)?;
                if np != p && p >= limit {
                    *moved += 1;
                }
                let _ = self.take_node(np)?;
                self.nodes.insert(np, Node::Branch { keys, children });
                Ok(np)
            }
            Node::Leaf(mut entries) => {
                let mut runs = false;
                for e in entries.iter_mut() {
                    let Val::Overflow { page: o, len } = e.val else {
                        continue;
                    };
                    let n = page::overflow_run_pages(len as usize) as u64;
                    if o < limit || self.overflow.contains_key(&o) || !self.room_below(n, limit) {
                        continue;
                    }
                    let (img, h) = self.base.page(o)?;
                    if h.kind != PageKind::Overflow {
                        return Err(self.corrupt(o, "expected an overflow page"));
                    }
                    let value = img
                        .get(page::HEADER_LEN..page::HEADER_LEN + len as usize)
                        .ok_or_else(|| self.corrupt(o, "overflow run shorter than its value"))?
                        .to_vec();
                    let q = self.alloc(n)?;
                    self.overflow.insert(q, value);
                    self.free(o, n)?;
                    e.val = Val::Overflow { page: q, len };
                    *moved += n;
                    runs = true;
                }
                // Value page runs: each moved once, every cell naming it pointed at the copy.
                let mut named: Vec<u64> = Vec::new();
                for e in &entries {
                    if let Val::Packed { page: b, .. } = e.val {
                        if !named.contains(&b) {
                            named.push(b);
                        }
                    }
                }
                for b in named {
                    if b < limit || self.values.contains_key(&b) {
                        continue;
                    }
                    let (img, h) = self.base.page(b)?;
                    if h.kind != PageKind::Values {
                        return Err(self.corrupt(b, "expected a value page"));
                    }
                    let n = u64::from(h.run_pages.max(1));
                    if !self.room_below(n, limit) {
                        continue;
                    }
                    let body = img[page::HEADER_LEN..].to_vec();
                    let q = self.alloc(n)?;
                    self.values.insert(q, body);
                    self.free(b, n)?;
                    for e in entries.iter_mut() {
                        if let Val::Packed { page, .. } = &mut e.val {
                            if *page == b {
                                *page = q;
                            }
                        }
                    }
                    *moved += n;
                    runs = true;
                }
                let dirty = self.nodes.contains_key(&p) || self.pages.contains_key(&p);
                if !runs && (p < limit || dirty || !self.room_below(1, limit)) {
                    return Ok(p);
                }
                let np = self.cow(p)?;
                if np != p && p >= limit {
                    *moved += 1;
                }
                if runs {
                    let _ = self.take_node(np)?;
                    self.park(np, Node::Leaf(entries))?;
                }
                Ok(np)
            }
        }
    }

    /// Lowers `next_page` over the free tail of the data file: the free pages at the end that
    /// the writer may reuse now (no snapshot reads them, a durable header has passed the
    /// transaction that freed them). Their bits are cleared (bits at or above next page are
    /// always 0). Returns the new next page, or `None` when there is no such tail.
    pub(crate) fn shrink_tail(&mut self) -> Result<Option<u64>> {
        self.guard()?;
        self.apply_buffered()?;
        self.load_fsm()?;
        let Some(w) = self.writer.as_mut() else {
            return Ok(None);
        };
        let Some(start) = w.alloc.reusable.tail_start(self.next_page) else {
            return Ok(None);
        };
        // Pages freed but not reusable yet (a snapshot or a journal record may still need them)
        // stay below the new end.
        let held = w
            .alloc
            .pending
            .iter()
            .flat_map(|(_, runs)| runs.iter())
            .chain(w.alloc.early.iter().flat_map(|(_, _, runs)| runs.iter()))
            .map(|(s, l)| s + l)
            .max()
            .unwrap_or(0);
        let end = start.max(held).max(2);
        if end >= self.next_page {
            return Ok(None);
        }
        let n = w.alloc.reusable.remove_from(end);
        // Given back to the writer if this transaction is dropped without commit.
        self.taken.push((end, n));
        let r = self.set_bits(end, n, false);
        self.fail(r)?;
        self.next_page = end;
        self.changed = true;
        Ok(Some(end))
    }
}
