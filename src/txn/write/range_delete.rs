//! Range deletion in a write transaction (`delete_range`, `clear`): subtrees wholly inside
//! the range are freed without being read, the edges are cut.

use super::*;

impl WriteTransaction {
    /// Removes every entry whose key falls in `bounds` (range syntax as for
    /// [`WriteTransaction::range`]); returns how many were removed.
    ///
    /// Cost: the nodes on the two boundary paths (from the root to the leaves holding the
    /// bounds) are copied and trimmed once, with no descent per key; every subtree wholly
    /// inside the range is freed as a whole: its pages are read (to count its entries and free
    /// their overflow runs) but not copied, and nothing of it goes into the journal record
    /// except free-space map bits. Underfull nodes left on the boundary paths are merged with
    /// a sibling where they fit, as [`WriteTransaction::delete`] does.
    ///
    /// In a storage with a write buffer it first applies the buffer and the transaction's own
    /// operations to the tree: the transaction then commits as a page transaction.
    ///
    /// Errors: [`Error::Poisoned`] when an earlier operation of this transaction failed;
    /// [`Error::Corruption`] or an I/O error reading a page (the transaction then fails: every
    /// later operation returns [`Error::Poisoned`], and it must be dropped).
    pub fn delete_range<K, R: KeyRange<K>>(&mut self, bounds: R) -> Result<u64> {
        self.guard()?;
        // A buffer holds no range: its entries go into the tree first (write/logical.rs).
        self.apply_buffered()?;
        if self.root == 0 {
            return Ok(0);
        }
        let r = self.delete_range_inner(bounds.start_key(), bounds.end_key());
        self.fail(r)
    }

    /// Removes every entry; returns how many there were. Frees the whole tree (as
    /// [`WriteTransaction::delete_range`] over `..`).
    ///
    /// Errors: as [`WriteTransaction::delete_range`].
    pub fn clear(&mut self) -> Result<u64> {
        self.delete_range(..)
    }

    fn delete_range_inner(&mut self, start: Bound<&[u8]>, end: Bound<&[u8]>) -> Result<u64> {
        let mut deleted = 0;
        let root = self.root;
        match self.cut(root, None, None, start, end, 0, &mut deleted)? {
            Cut::Untouched => return Ok(0),
            Cut::Changed(r) => self.root = r,
            Cut::Emptied => self.root = 0,
        }
        self.changed = true;
        self.entries = self.entries.saturating_sub(deleted);
        // Collapse the root: a branch with one child.
        for _ in 0..crate::btree::MAX_DEPTH {
            match self.nodes.get(&self.root) {
                Some(Node::Branch { keys, children }) if keys.is_empty() => {
                    let only = children[0];
                    let r = self.root;
                    self.drop_node(r)?;
                    self.root = only;
                }
                _ => break,
            }
        }
        Ok(deleted)
    }

    /// Deletes the keys of `[start, end]` from the subtree at `p`, whose keys lie in
    /// `[lo, hi)` (`None`: unbounded), adding the count to `deleted`.
    #[allow(clippy::too_many_arguments)]
    fn cut(
        &mut self,
        p: u64,
        lo: Option<&[u8]>,
        hi: Option<&[u8]>,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        depth: usize,
        deleted: &mut u64,
    ) -> Result<Cut> {
        if depth > crate::btree::MAX_DEPTH {
            return Err(self.corrupt(p, "tree deeper than 32 levels"));
        }
        match self.read_node(p)? {
            Node::Leaf(mut es) => {
                let a = es.partition_point(|e| before_start(&e.key, start));
                let b = es.partition_point(|e| !past_end(&e.key, end));
                if a >= b {
                    return Ok(Cut::Untouched);
                }
                for e in &es[a..b] {
                    self.free_value(&e.val)?;
                }
                let kept = es[..a].iter().chain(&es[b..]).map(|e| &e.val);
                self.free_removed_runs(es[a..b].iter().map(|e| &e.val), kept)?;
                *deleted += (b - a) as u64;
                if a == 0 && b == es.len() {
                    self.drop_node(p)?;
                    return Ok(Cut::Emptied);
                }
                let np = self.cow(p)?;
                self.nodes.remove(&np);
                self.forget_page(np);
                es.drain(a..b);
                self.park(np, Node::Leaf(es))?;
                Ok(Cut::Changed(np))
            }
            Node::Branch {
                mut keys,
                mut children,
            } => {
                if children.len() != keys.len() + 1 {
                    return Err(self.corrupt(p, "malformed branch page"));
                }
                // Children before `first` hold only keys below the range.
                let first = match start {
                    Bound::Unbounded => 0,
                    Bound::Included(s) | Bound::Excluded(s) => {
                        keys.partition_point(|k| k.as_slice() <= s)
                    }
                };
                let mut outcomes: Vec<(usize, Cut)> = Vec::new();
                for i in first..children.len() {
                    let clo = if i == 0 {
                        lo
                    } else {
                        Some(keys[i - 1].as_slice())
                    };
                    let chi = if i == keys.len() {
                        hi
                    } else {
                        Some(keys[i].as_slice())
                    };
                    if clo.is_some_and(|l| past_end(l, end)) {
                        break;
                    }
                    let inside_start = match (start, clo) {
                        (Bound::Unbounded, _) => true,
                        (_, None) => false,
                        (Bound::Included(s), Some(l)) => l >= s,
                        (Bound::Excluded(s), Some(l)) => l > s,
                    };
                    // Keys of the child are < chi; chi <= e puts them all below (or at) e.
                    let inside_end = match (end, chi) {
                        (Bound::Unbounded, _) => true,
                        (_, None) => false,
                        (Bound::Included(e) | Bound::Excluded(e), Some(h)) => h <= e,
                    };
                    let c = children[i];
                    let outcome = if inside_start && inside_end {
                        *deleted += self.free_subtree(c, depth + 1)?;
                        Cut::Emptied
                    } else {
                        self.cut(c, clo, chi, start, end, depth + 1, deleted)?
                    };
                    if !matches!(outcome, Cut::Untouched) {
                        outcomes.push((i, outcome));
                    }
                }
                if outcomes.is_empty() {
                    return Ok(Cut::Untouched);
                }
                let np = self.cow(p)?;
                self.nodes.remove(&np);
                self.forget_page(np);
                let mut changed = Vec::new();
                for &(i, ref o) in &outcomes {
                    if let Cut::Changed(c) = o {
                        children[i] = *c;
                    }
                }
                // Remove the emptied children (from the right, so indices hold) and one
                // separator next to each.
                for &(i, ref o) in outcomes.iter().rev() {
                    if matches!(o, Cut::Emptied) {
                        children.remove(i);
                        if !keys.is_empty() {
                            keys.remove(i.saturating_sub(1));
                        }
                    }
                }
                for &(i, ref o) in &outcomes {
                    if matches!(o, Cut::Changed(_)) {
                        let gone = outcomes
                            .iter()
                            .filter(|(j, o)| *j < i && matches!(o, Cut::Emptied))
                            .count();
                        changed.push(i - gone);
                    }
                }
                if children.is_empty() {
                    self.drop_node(np)?;
                    return Ok(Cut::Emptied);
                }
                // Merge the trimmed children with a sibling where they fit (right first, so
                // the left one's index holds).
                for &j in changed.iter().rev() {
                    if children.len() > 1
                        && j < children.len()
                        && self.node_size(children[j])? < UNDERFULL
                    {
                        self.try_merge(&mut keys, &mut children, j.saturating_sub(1))?;
                    }
                }
                self.nodes.insert(np, Node::Branch { keys, children });
                Ok(Cut::Changed(np))
            }
        }
    }

    /// Frees the whole subtree at `p` (its pages and overflow runs, none of them copied);
    /// returns the entries it held.
    fn free_subtree(&mut self, p: u64, depth: usize) -> Result<u64> {
        if depth > crate::btree::MAX_DEPTH {
            return Err(self.corrupt(p, "tree deeper than 32 levels"));
        }
        let mut values = Vec::new();
        let mut kids = Vec::new();
        let mut n = 0u64;
        match self.tree_node(p)? {
            NodeRef::Leaf(es) => {
                n = es.len() as u64;
                values.extend(
                    es.iter()
                        .filter(|e| matches!(e.val, Val::Overflow { .. } | Val::Packed { .. }))
                        .map(|e| e.val.clone()),
                );
            }
            NodeRef::Branch(_, children) => kids.extend_from_slice(children),
            NodeRef::LeafPage(v) => {
                n = v.len() as u64;
                for i in 0..v.len() {
                    let (_, val) = v
                        .cell(i)
                        .ok_or_else(|| self.corrupt(p, "malformed leaf cell"))?;
                    if let page::node::ValRef::Overflow { .. } | page::node::ValRef::Packed { .. } =
                        val
                    {
                        values.push(val.to_val());
                    }
                }
            }
            NodeRef::BranchPage(v) => {
                for i in 0..=v.keys() {
                    kids.push(
                        v.child(i)
                            .ok_or_else(|| self.corrupt(p, "malformed branch page"))?,
                    );
                }
            }
        }
        for c in kids {
            n += self.free_subtree(c, depth + 1)?;
        }
        for v in &values {
            self.free_value(v)?;
        }
        // A leaf's value page runs are named by it alone: each is freed once.
        self.free_removed_runs(values.iter(), std::iter::empty())?;
        self.drop_node(p)?;
        Ok(n)
    }

    /// Removes node page `p` from the tree and frees it: a dirty page leaves the transaction's
    /// maps; a page of the base is freed for reuse once no snapshot can read it.
    fn drop_node(&mut self, p: u64) -> Result<()> {
        self.nodes.remove(&p);
        self.forget_page(p);
        self.bases.remove(&p);
        self.free(p, 1)
    }
}

/// What a range deletion did to a subtree.
enum Cut {
    /// Nothing in it was in the range: not copied.
    Untouched,
    /// Some entries were removed: the subtree's root is now this (dirty) page.
    Changed(u64),
    /// Every entry was removed: its pages are freed.
    Emptied,
}
