//! Inserting into the B+tree in a write transaction: the descent, in-place edits of a dirty
//! copy while they fit, node splits, full leaves re-packed, and `put`.

use super::*;

impl WriteTransaction {
    /// Splits an overfull node in two, the right half going to a new page. `append`: the node
    /// is the rightmost at its level and the insert that overfilled it went to its end (sorted
    /// inserts): the right half gets only the last entry (a branch: its last key), so the left
    /// node stays full instead of half empty (as LMDB and redb do).
    fn split(&mut self, node: &mut Node, append: bool) -> Result<(Vec<u8>, u64)> {
        let (sep, right) = match node {
            Node::Leaf(es) => {
                if es.len() < 2 {
                    return Err(
                        self.corrupt(0, "internal: splitting a leaf of fewer than 2 entries")
                    );
                }
                let at = if append {
                    es.len() - 1
                } else {
                    page::node::leaf_split_point(
                        es.iter().map(page::node::leaf_entry_size),
                        es.len(),
                    )
                };
                let right = es.split_off(at);
                (right[0].key.clone(), Node::Leaf(right))
            }
            Node::Branch { keys, children } => {
                let total: usize = keys.iter().map(|k| page::node::branch_key_size(k)).sum();
                let mut acc = 0;
                if keys.len() < 3 {
                    return Err(
                        self.corrupt(0, "internal: splitting a branch of fewer than 3 keys")
                    );
                }
                let mut m = keys.len() / 2;
                if append {
                    m = keys.len() - 2;
                } else {
                    for (i, k) in keys.iter().enumerate() {
                        acc += page::node::branch_key_size(k);
                        if acc >= total / 2 {
                            m = i.clamp(1, keys.len() - 2);
                            break;
                        }
                    }
                }
                let rkeys = keys.split_off(m + 1);
                let sep = keys
                    .pop()
                    .ok_or_else(|| self.corrupt(0, "internal: empty split"))?;
                let rchildren = children.split_off(m + 1);
                (
                    sep,
                    Node::Branch {
                        keys: rkeys,
                        children: rchildren,
                    },
                )
            }
        };
        if !(node.fits() && right.fits()) {
            // An append split whose last entry is the big one: split by size instead.
            debug_assert!(append, "split halves must fit");
            match (&mut *node, right) {
                (Node::Leaf(es), Node::Leaf(r)) => es.extend(r),
                (
                    Node::Branch { keys, children },
                    Node::Branch {
                        keys: rk,
                        children: rc,
                    },
                ) => {
                    keys.push(sep);
                    keys.extend(rk);
                    children.extend(rc);
                }
                _ => return Err(self.corrupt(0, "internal: split of mixed kinds")),
            }
            return self.split(node, false);
        }
        let r = self.alloc(1)?;
        self.park(r, right)?;
        Ok((sep, r))
    }

    #[allow(clippy::type_complexity)]
    /// `rightmost`: `page` is the last node of its level (every step of the descent took the
    /// last child), where sorted inserts append.
    /// `packed`: the value's bytes when it is packed (`val` is then a placeholder reference of
    /// its cell's size, placed at the leaf: `write/packed.rs`).
    fn insert_at(
        &mut self,
        page: u64,
        key: &[u8],
        val: Val,
        packed: Option<&[u8]>,
        depth: usize,
        rightmost: bool,
    ) -> Result<(u64, Option<(Vec<u8>, u64)>, Option<Val>)> {
        if depth > crate::btree::MAX_DEPTH {
            return Err(self.corrupt(page, "tree deeper than 32 levels"));
        }
        let p = self.cow(page)?;
        self.leaf_in_page_form(p)?;
        let mut val = Some(val);
        let mut old = None;
        // Fast path: a dirty page in page form is edited in place. A branch whose child split
        // falls through to the node path with the child's answer.
        let mut child_done: Option<(usize, u64, Option<(Vec<u8>, u64)>)> = None;
        if self.pages.contains_key(&p) {
            let (img, h) = self.node_page(p)?;
            if h.kind == PageKind::Leaf {
                let Some(v) = val.take() else {
                    return Err(self.corrupt(p, "internal: value missing"));
                };
                return self.put_into_leaf(p, key, v, packed, rightmost);
            } else {
                let bv = page::node::BranchView::new(img, &h);
                let (i, c) = bv
                    .child_index(key)
                    .and_then(|i| Some((i, bv.child(i)?)))
                    .ok_or_else(|| self.corrupt(p, "malformed branch page"))?;
                let Some(v) = val.take() else {
                    return Err(self.corrupt(p, "internal: value missing"));
                };
                let last = i == bv.keys();
                let (nc, split, o) =
                    self.insert_at(c, key, v, packed, depth + 1, rightmost && last)?;
                let edit = match &split {
                    None => page::node::branch_set_child(self.page_mut(p)?, i, nc),
                    Some((sep, right)) => {
                        page::node::branch_insert_in_place(self.page_mut(p)?, i, nc, sep, *right)
                    }
                };
                match edit {
                    Ok(touched) => {
                        self.touch(p, touched);
                        return Ok((p, None, o));
                    }
                    Err(page::node::EditError::NoRoom) => {}
                    Err(page::node::EditError::Malformed) => {
                        return Err(self.corrupt(p, "malformed branch page"))
                    }
                }
                old = o;
                child_done = Some((i, nc, split));
            }
        }
        let mut node = self.take_node(p)?;
        // The node path's insert lands at the node's end (an append, when rightmost).
        let mut at_end = false;
        let r = (|| -> Result<()> {
            match (&mut node, child_done) {
                (Node::Branch { keys, children }, Some((i, nc, split))) => {
                    if i >= children.len() {
                        return Err(self.corrupt(p, "malformed branch page"));
                    }
                    children[i] = nc;
                    if let Some((sep, right)) = split {
                        at_end = i == keys.len();
                        keys.insert(i, sep);
                        children.insert(i + 1, right);
                    }
                }
                (_, Some(_)) => return Err(self.corrupt(p, "internal: branch became a leaf")),
                (Node::Leaf(es), None) => {
                    let val = val
                        .take()
                        .ok_or_else(|| self.corrupt(p, "internal: value missing"))?;
                    if packed.is_some() {
                        // Leaves are page form here (`leaf_in_page_form`).
                        return Err(self.corrupt(p, "internal: packed put into a decoded leaf"));
                    }
                    match es.binary_search_by(|e| e.key.as_slice().cmp(key)) {
                        Ok(i) => old = Some(std::mem::replace(&mut es[i].val, val)),
                        Err(i) => {
                            at_end = i == es.len();
                            es.insert(
                                i,
                                LeafEntry {
                                    key: key.to_vec(),
                                    val,
                                },
                            )
                        }
                    }
                }
                (Node::Branch { keys, children }, None) => {
                    let val = val
                        .take()
                        .ok_or_else(|| self.corrupt(p, "internal: value missing"))?;
                    let i = keys.partition_point(|k| k.as_slice() <= key);
                    let last = i == keys.len();
                    let (nc, split, o) = self.insert_at(
                        children[i],
                        key,
                        val,
                        packed,
                        depth + 1,
                        rightmost && last,
                    )?;
                    children[i] = nc;
                    old = o;
                    if let Some((sep, right)) = split {
                        at_end = i == keys.len();
                        keys.insert(i, sep);
                        children.insert(i + 1, right);
                    }
                }
            }
            Ok(())
        })();
        let split = match r {
            Ok(()) if !node.fits() => Some(self.split(&mut node, rightmost && at_end)),
            Ok(()) => None,
            Err(e) => Some(Err(e)),
        };
        let split = split.transpose()?;
        self.park(p, node)?;
        Ok((p, split, old))
    }

    /// Puts `key` with `v` into dirty leaf `p` (page form): in place while the cell fits the
    /// free gap, else as a new rightmost leaf (an append to the full rightmost leaf: sorted
    /// inserts; the new key starts a new leaf and this one stays full), else re-packed or
    /// split in page form (`put_full_leaf`). A split leaves no value page run named by both
    /// halves (`separate_runs`); a packed value (`packed`, `v` its placeholder) is then
    /// placed in a run of the leaf that holds the key; a run the old value was last in is
    /// freed. Returns what `insert_at` returns.
    #[allow(clippy::type_complexity)]
    fn put_into_leaf(
        &mut self,
        p: u64,
        key: &[u8],
        v: Val,
        packed: Option<&[u8]>,
        rightmost: bool,
    ) -> Result<(u64, Option<(Vec<u8>, u64)>, Option<Val>)> {
        let orphan = self.orphaned_run(p, key)?;
        let out = match page::node::leaf_put_in_place(self.page_mut(p)?, key, &v) {
            Ok((o, touched)) => {
                self.touch(p, touched);
                (p, None, o)
            }
            Err(page::node::EditError::NoRoom) if rightmost && self.after_last(p, key)? => {
                let r = self.alloc(1)?;
                self.park(
                    r,
                    Node::Leaf(vec![LeafEntry {
                        key: key.to_vec(),
                        val: v,
                    }]),
                )?;
                (p, Some((key.to_vec(), r)), None)
            }
            // Re-packed or split in page form: no decode.
            Err(page::node::EditError::NoRoom) => self.put_full_leaf(p, key, &v)?,
            Err(page::node::EditError::Malformed) => {
                return Err(self.corrupt(p, "malformed leaf page"))
            }
        };
        if let Some((sep, r)) = &out.1 {
            self.separate_runs(p, *r)?;
            if let Some(bytes) = packed {
                let t = if key >= sep.as_slice() { *r } else { p };
                self.place_packed(t, key, bytes)?;
            }
        } else if let Some(bytes) = packed {
            self.place_packed(p, key, bytes)?;
        }
        if let Some(b) = orphan {
            self.free_value_run(b)?;
        }
        Ok(out)
    }

    /// Packs `bytes`, the value of `key`, into a value page run of dirty leaf `t` (page form)
    /// and points the key's cell (a placeholder of the same size) at it.
    fn place_packed(&mut self, t: u64, key: &[u8], bytes: &[u8]) -> Result<()> {
        let Val::Packed { page: run, off, .. } = self.pack_into_leaf(t, key, bytes)? else {
            return Err(self.corrupt(t, "internal: packed value not packed"));
        };
        let (img, h) = self.node_page(t)?;
        let Some(Ok(i)) = page::node::LeafView::new(img, &h).search(key) else {
            return Err(self.corrupt(t, "internal: packed key missing from its leaf"));
        };
        let r = page::node::leaf_repoint(self.page_mut(t)?, i, run, off)
            .ok_or_else(|| self.corrupt(t, "malformed leaf cell"))?;
        self.touch(t, [r, 0..0, 0..0]);
        Ok(())
    }

    /// Puts `key` into dirty leaf `p` (in page form) whose free gap has no room for it, without
    /// decoding the leaf ([`page::node::LeafCells`]): when the live cells and the new one fit
    /// a page, the leaf is laid out again (re-packed: the free space scattered between cells
    /// joins the gap) and keeps every entry; otherwise it splits at the decoded path's split
    /// point (`split`, not an append: the right-edge append was handled by the caller) into
    /// itself and a new right page, whose first key is the separator. Either way the pages are
    /// laid out as `park` would lay out the decoded node: the left one on its base (small
    /// journal diff), the new right one packed. Returns what `insert_at` returns.
    #[allow(clippy::type_complexity)]
    fn put_full_leaf(
        &mut self,
        p: u64,
        key: &[u8],
        val: &Val,
    ) -> Result<(u64, Option<(Vec<u8>, u64)>, Option<Val>)> {
        let mut cells = std::mem::take(&mut self.leaf_cells);
        let r = self.put_full_leaf_with(&mut cells, p, key, val);
        self.leaf_cells = cells;
        r
    }

    #[allow(clippy::type_complexity)]
    fn put_full_leaf_with(
        &mut self,
        cells: &mut page::node::LeafCells,
        p: u64,
        key: &[u8],
        val: &Val,
    ) -> Result<(u64, Option<(Vec<u8>, u64)>, Option<Val>)> {
        let Some(src) = self.pages.get(&p).cloned() else {
            return Err(self.corrupt(p, "internal: dirty leaf missing"));
        };
        let old = cells
            .load(&src, key, val)
            .map_err(|_| self.corrupt(p, "malformed leaf page"))?;
        let state = self.base.clone();
        let base = match self.bases.get(&p) {
            Some(&b) => Some(state.page(b)?.0),
            None => None,
        };
        let n = cells.len();
        let fits = |c: &page::node::LeafCells, r: std::ops::Range<usize>| {
            c.body_size(r).is_some_and(|b| b <= page::BODY_LEN)
        };
        if fits(cells, 0..n) {
            let img = self.lay_out(cells, 0..n, &src, key, val, base, p)?;
            drop(src);
            self.replace_page(p, img);
            return Ok((p, None, old));
        }
        let at = cells.split_point();
        if n < 2 || !fits(cells, 0..at) || !fits(cells, at..n) {
            // Only a malformed page (a cell over the inline limit) gets here.
            return Err(self.corrupt(p, "malformed leaf page: split halves do not fit"));
        }
        let sep = cells
            .key(at, &src, key)
            .ok_or_else(|| self.corrupt(p, "malformed leaf page"))?
            .to_vec();
        let r = self.alloc(1)?;
        let right = self.lay_out(cells, at..n, &src, key, val, None, r)?;
        self.touched.remove(&r);
        self.pages.insert(r, right);
        let left = self.lay_out(cells, 0..at, &src, key, val, base, p)?;
        drop(src);
        self.replace_page(p, left);
        Ok((p, Some((sep, r)), old))
    }

    /// Lays `cells[range]` out as leaf page `p` ([`page::node::LeafCells::write`]) in a page
    /// buffer (the spare one when there is one): on `base` when given and the cells fit
    /// around its kept cells, else packed.
    #[allow(clippy::too_many_arguments)]
    fn lay_out(
        &mut self,
        cells: &mut page::node::LeafCells,
        range: std::ops::Range<usize>,
        src: &[u8],
        key: &[u8],
        val: &Val,
        base: Option<&[u8]>,
        p: u64,
    ) -> Result<crate::page::SharedImage> {
        let mut image = match self.spare.take() {
            Some(img) => img,
            None => page::zeroed_shared(1),
        };
        let Some(img) = image.get_mut() else {
            return Err(self.corrupt(p, "internal: new page image shared"));
        };
        let txn = self.txn_id;
        let on_base = match base {
            Some(b) if b.len() == PAGE_SIZE => {
                img.copy_from_slice(b);
                cells.write(range.clone(), src, key, val, img, Some(b), p, txn)
            }
            _ => Ok(false),
        };
        let placed = match on_base {
            Ok(true) => Ok(true),
            Ok(false) => {
                img.fill(0);
                cells.write(range, src, key, val, img, None, p, txn)
            }
            Err(e) => Err(e),
        };
        match placed {
            Ok(true) => Ok(image),
            Ok(false) => Err(self.corrupt(p, "internal: leaf cells do not fit a page")),
            Err(_) => Err(self.corrupt(p, "malformed leaf page")),
        }
    }

    /// Replaces dirty page `p`'s image with `img`, laid out anew (the commit diffs it with its
    /// base: no record of the ranges written); the old image, when no snapshot shares it,
    /// becomes the spare page buffer.
    fn replace_page(&mut self, p: u64, img: crate::page::SharedImage) {
        self.touched.remove(&p);
        if let Some(mut old) = self.pages.insert(p, img) {
            if old.get_mut().is_some() {
                self.spare = Some(old);
            }
        }
    }

    /// True when `key` sorts after every key of dirty leaf `p` (in page form).
    fn after_last(&self, p: u64, key: &[u8]) -> Result<bool> {
        let (img, h) = self.node_page(p)?;
        if h.kind != PageKind::Leaf || h.count == 0 {
            return Ok(false);
        }
        let v = page::node::LeafView::new(img, &h);
        let last = v
            .key(h.count as usize - 1)
            .ok_or_else(|| self.corrupt(p, "malformed leaf page"))?;
        Ok(last < key)
    }

    /// Puts dirty node `p` back: a leaf as a page image (laid out on its base when it has one,
    /// so its diff stays small), so the next puts into it take the in-place fast path; a branch
    /// stays decoded (its next edits are child pointer updates).
    pub(super) fn park(&mut self, p: u64, node: Node) -> Result<()> {
        if !matches!(node, Node::Leaf(_)) || !node.fits() {
            self.nodes.insert(p, node);
            return Ok(());
        }
        // Laid out on its base in one page buffer (sealed at commit, like every page-form
        // image): one allocation and one copy of the base.
        let base = self.base.clone();
        let base_img = match self.bases.get(&p) {
            Some(&b) => Some(base.page(b)?.0),
            None => None,
        };
        let mut image: crate::page::SharedImage = match base_img {
            Some(b) if b.len() == PAGE_SIZE => page::Image::copy_from(b),
            _ => page::zeroed_shared(1),
        };
        let Some(img) = image.get_mut() else {
            return Err(self.corrupt(p, "internal: new page image shared"));
        };
        node.encode_unsealed_into(img, base_img, p, self.txn_id);
        // Re-encoded: no record of what changed, the commit diffs it.
        self.touched.remove(&p);
        self.pages.insert(p, image);
        Ok(())
    }

    /// Inserts or replaces `key` with `value`.
    ///
    /// Errors: [`Error::EmptyKey`], [`Error::KeyTooLarge`] (over 1,024 bytes),
    /// [`Error::ValueTooLarge`] (over [`crate::MAX_VALUE_LEN`] bytes), all before anything is
    /// changed; [`Error::Corruption`] or an I/O error reading a page (the transaction must then
    /// be aborted).
    pub fn put(&mut self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<()> {
        let (key, value) = (key.as_ref(), value.as_ref());
        check_put(key, value)?;
        self.guard()?;
        if self.put_logical(key, value) {
            return Ok(());
        }
        let r = self.put_inner(key, value);
        self.fail(r)
    }

    pub(super) fn put_inner(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        self.changed = true;
        let packed = (self.inner.opts.pack_values && page::node::packs(key.len(), value.len()))
            .then_some(value);
        let val = if fits_inline(key.len(), value.len()) {
            Val::Inline(value.to_vec())
        } else if packed.is_some() {
            // Placed in a value page run of the leaf the key lands in (`put_into_leaf`).
            Val::Packed {
                page: 0,
                off: 0,
                len: value.len() as u64,
            }
        } else {
            let n = page::overflow_run_pages(value.len()) as u64;
            let p = self.alloc(n)?;
            self.overflow.insert(p, value.to_vec());
            Val::Overflow {
                page: p,
                len: value.len() as u64,
            }
        };
        let root = if self.root == 0 {
            let p = self.alloc(1)?;
            self.nodes.insert(p, Node::Leaf(Vec::new()));
            p
        } else {
            self.root
        };
        let (nr, split, old) = self.insert_at(root, key, val, packed, 0, true)?;
        self.root = match split {
            Some((sep, right)) => {
                let r = self.alloc(1)?;
                self.nodes.insert(
                    r,
                    Node::Branch {
                        keys: vec![sep],
                        children: vec![nr, right],
                    },
                );
                r
            }
            None => nr,
        };
        match old {
            Some(v) => self.free_value(&v)?,
            None => self.entries += 1,
        }
        Ok(())
    }
}
