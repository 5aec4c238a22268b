//! Deleting one key in a write transaction: the descent, and merging an underfull node with a
//! sibling when both fit in one page (`delete`).

use super::*;

impl WriteTransaction {
    fn delete_at(&mut self, page: u64, key: &[u8], depth: usize) -> Result<(u64, Option<Val>)> {
        if depth > crate::btree::MAX_DEPTH {
            return Err(self.corrupt(page, "tree deeper than 32 levels"));
        }
        let p = self.cow(page)?;
        self.leaf_in_page_form(p)?;
        // Fast path: a dirty page in page form is edited in place (no decode). A branch whose
        // child became underfull falls through to the node path, which merges, with the
        // child's answer.
        let mut child_done: Option<(usize, u64, Option<Val>)> = None;
        if self.pages.contains_key(&p) {
            let (img, h) = self.node_page(p)?;
            if h.kind == PageKind::Leaf {
                let orphan = self.orphaned_run(p, key)?;
                return match page::node::leaf_delete_in_place(self.page_mut(p)?, key) {
                    Ok((old, touched)) => {
                        self.touch(p, touched);
                        if let Some(b) = orphan {
                            self.free_value_run(b)?;
                        }
                        Ok((p, old))
                    }
                    Err(_) => Err(self.corrupt(p, "malformed leaf page")),
                };
            }
            let bv = page::node::BranchView::new(img, &h);
            let (i, c) = bv
                .child_index(key)
                .and_then(|i| Some((i, bv.child(i)?)))
                .ok_or_else(|| self.corrupt(p, "malformed branch page"))?;
            let keys = bv.keys();
            let (nc, old) = self.delete_at(c, key, depth + 1)?;
            if keys == 0 || self.node_size(nc)? >= UNDERFULL {
                let touched = page::node::branch_set_child(self.page_mut(p)?, i, nc)
                    .map_err(|_| self.corrupt(p, "malformed branch page"))?;
                self.touch(p, touched);
                return Ok((p, old));
            }
            child_done = Some((i, nc, old));
        }
        let mut node = self.take_node(p)?;
        let r = (|| -> Result<Option<Val>> {
            match (&mut node, child_done) {
                (Node::Branch { keys, children }, Some((i, nc, old))) => {
                    if i >= children.len() {
                        return Err(self.corrupt(p, "malformed branch page"));
                    }
                    children[i] = nc;
                    let l = if i > 0 { i - 1 } else { i };
                    self.try_merge(keys, children, l)?;
                    Ok(old)
                }
                (Node::Leaf(_), Some(_)) => Err(self.corrupt(p, "internal: branch became a leaf")),
                (Node::Leaf(es), None) => {
                    match es.binary_search_by(|e| e.key.as_slice().cmp(key)) {
                        Ok(i) => {
                            let old = es.remove(i).val;
                            self.free_removed_runs(
                                std::iter::once(&old),
                                es.iter().map(|e| &e.val),
                            )?;
                            Ok(Some(old))
                        }
                        Err(_) => Ok(None),
                    }
                }
                (Node::Branch { keys, children }, None) => {
                    let i = keys.partition_point(|k| k.as_slice() <= key);
                    let (nc, old) = self.delete_at(children[i], key, depth + 1)?;
                    children[i] = nc;
                    if self.node_size(nc)? < UNDERFULL && children.len() > 1 {
                        let l = if i > 0 { i - 1 } else { i };
                        self.try_merge(keys, children, l)?;
                    }
                    Ok(old)
                }
            }
        })();
        self.nodes.insert(p, node);
        Ok((p, r?))
    }

    /// Merges children `l` and `l + 1` of a branch when they fit in one page together.
    pub(super) fn try_merge(
        &mut self,
        keys: &mut Vec<Vec<u8>>,
        children: &mut Vec<u64>,
        l: usize,
    ) -> Result<()> {
        let (lp, rp) = (children[l], children[l + 1]);
        let left = self.read_node(lp)?;
        let right = self.read_node(rp)?;
        let merged = match (left, right) {
            (Node::Leaf(mut a), Node::Leaf(b)) => {
                a.extend(b);
                Node::Leaf(a)
            }
            (
                Node::Branch {
                    keys: mut ak,
                    children: mut ac,
                },
                Node::Branch {
                    keys: bk,
                    children: bc,
                },
            ) => {
                ak.push(keys[l].clone());
                ak.extend(bk);
                ac.extend(bc);
                Node::Branch {
                    keys: ak,
                    children: ac,
                }
            }
            _ => return Err(self.corrupt(lp, "siblings of different kinds")),
        };
        if !merged.fits() {
            return Ok(());
        }
        let nl = self.cow(lp)?;
        self.forget_page(nl);
        self.nodes.insert(nl, merged);
        self.nodes.remove(&rp);
        self.forget_page(rp);
        self.free(rp, 1)?;
        children[l] = nl;
        keys.remove(l);
        children.remove(l + 1);
        Ok(())
    }

    // ---- public operations ------------------------------------------------------------------

    /// Removes `key`; returns whether it was present.
    ///
    /// Errors: [`Error::EmptyKey`], [`Error::KeyTooLarge`]; corruption or I/O reading a page.
    pub fn delete(&mut self, key: impl AsRef<[u8]>) -> Result<bool> {
        let key = key.as_ref();
        check_key(key)?;
        self.guard()?;
        if self.get(key)?.is_none() {
            return Ok(false);
        }
        if self.delete_logical(key) {
            return Ok(true);
        }
        let r = self.delete_inner(key);
        self.fail(r)
    }

    pub(super) fn delete_inner(&mut self, key: &[u8]) -> Result<bool> {
        self.changed = true;
        let (nr, old) = self.delete_at(self.root, key, 0)?;
        self.root = nr;
        let Some(old) = old else { return Ok(false) };
        self.free_value(&old)?;
        self.entries -= 1;
        // Collapse the root: a branch with one child, or an empty leaf (either form).
        if self.pages.contains_key(&self.root) {
            let (_, h) = self.node_page(self.root)?;
            if h.kind == PageKind::Leaf && h.count == 0 {
                let r = self.root;
                self.forget_page(r);
                self.free(r, 1)?;
                self.root = 0;
                return Ok(true);
            }
        }
        for _ in 0..crate::btree::MAX_DEPTH {
            match self.nodes.get(&self.root) {
                Some(Node::Branch { keys, children }) if keys.is_empty() => {
                    let only = children[0];
                    let r = self.root;
                    self.nodes.remove(&r);
                    self.free(r, 1)?;
                    self.root = only;
                }
                Some(Node::Leaf(es)) if es.is_empty() => {
                    let r = self.root;
                    self.nodes.remove(&r);
                    self.free(r, 1)?;
                    self.root = 0;
                    break;
                }
                _ => break,
            }
        }
        Ok(true)
    }
}
