//! Reads inside a write transaction: they see its own uncommitted writes (`get`,
//! `multi_get`, `range`, `iter`, `prefix`, `first`, `last`), and the tree access the B+tree
//! readers use (`tree_node`, `tree_overflow`).

use super::*;

impl WriteTransaction {
    /// Reads `key` as this transaction sees it (its own changes included), copied out. A key
    /// that could never be stored (empty, over [`crate::MAX_KEY_LEN`] bytes) is simply absent,
    /// as for [`crate::ReadTransaction::get`].
    ///
    /// Errors: [`Error::Corruption`] when a page on the path fails its checksum or is
    /// malformed; I/O reading a page; [`Error::Poisoned`] when this transaction failed
    /// earlier.
    pub fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>> {
        let key = key.as_ref();
        self.guard()?;
        if check_key(key).is_err() {
            return Ok(None);
        }
        if let Some(v) = self.buffered(key) {
            return Ok(v);
        }
        let mut p = self.root;
        if p == 0 {
            return Ok(None);
        }
        for _ in 0..=crate::btree::MAX_DEPTH {
            let node = match self.nodes.get(&p) {
                Some(n) => n,
                None => {
                    // A page image (dirty in page form, or the base snapshot's): read it
                    // without decoding the whole page.
                    let (img, h) = self.node_page(p)?;
                    if h.kind == PageKind::Leaf || h.kind == PageKind::Branch {
                        if h.kind == PageKind::Leaf {
                            let v = crate::page::node::LeafView::new(img, &h);
                            return match v.search(key) {
                                None => Err(self.corrupt(p, "malformed leaf page")),
                                Some(Err(_)) => Ok(None),
                                Some(Ok(i)) => {
                                    let (_, val) = v
                                        .cell(i)
                                        .ok_or_else(|| self.corrupt(p, "malformed leaf cell"))?;
                                    Ok(Some(self.value(&val.to_val())?))
                                }
                            };
                        }
                        let v = crate::page::node::BranchView::new(img, &h);
                        p = v
                            .child_index(key)
                            .and_then(|i| v.child(i))
                            .ok_or_else(|| self.corrupt(p, "malformed branch page"))?;
                        continue;
                    }
                    return Err(self.corrupt(p, "expected a branch or leaf page"));
                }
            };
            match node {
                Node::Leaf(es) => {
                    return match es.binary_search_by(|e| e.key.as_slice().cmp(key)) {
                        Ok(i) => Ok(Some(self.value(&es[i].val)?)),
                        Err(_) => Ok(None),
                    };
                }
                Node::Branch { keys, children } => {
                    p = children[keys.partition_point(|k| k.as_slice() <= key)];
                }
            }
        }
        Err(self.corrupt(p, "tree deeper than 32 levels"))
    }

    /// The values of `keys` as this transaction sees them (its own changes included), copied
    /// out, in their order (duplicates answered each): [`WriteTransaction::get`] for each key.
    /// Unlike [`crate::ReadTransaction::multi_get`] it does not read missing pages together:
    /// the writer's pages are mostly in memory (its own copies, and the pages of the paths it
    /// changes).
    ///
    /// Errors: as [`WriteTransaction::get`] for the first key that fails (before anything is
    /// read for later keys).
    pub fn multi_get<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<Vec<Option<Vec<u8>>>> {
        keys.iter().map(|k| self.get(k)).collect()
    }

    pub(super) fn value(&self, v: &Val) -> Result<Vec<u8>> {
        match v {
            Val::Inline(b) => Ok(b.clone()),
            Val::Overflow { page, len } => {
                if let Some(b) = self.overflow.get(page) {
                    return Ok(b.clone());
                }
                let vr = crate::page::node::ValRef::Overflow {
                    page: *page,
                    len: *len,
                };
                Ok(crate::btree::value(&self.base, vr)?.to_vec())
            }
            Val::Packed { page, off, len } => Ok(self.tree_packed(*page, *off, *len)?.to_vec()),
        }
    }

    // ---- ordered reads ----------------------------------------------------------------------

    /// The entries whose keys fall in `bounds`, in key order, as this transaction sees them
    /// (its own uncommitted puts and deletes included), as `(key, value)` slices borrowed from
    /// the transaction: while the iterator lives the transaction cannot be changed.
    ///
    /// `bounds` is ordinary range syntax over byte strings, as for
    /// [`crate::ReadTransaction::range`] ([`KeyRange`]): `&b"a"[..]..&b"b"[..]`,
    /// `b"k".as_slice()..`, `..`, `(Bound, Bound)` pairs. The iterator is double-ended
    /// (`.rev()` walks backwards without collecting). It reads dirty nodes where the
    /// transaction changed the tree and the base snapshot's pages elsewhere. Cost: one descent
    /// now (one more on the first `next_back`), then O(1) amortized per entry.
    ///
    /// Errors: [`Error::Poisoned`] when an earlier operation of this transaction failed;
    /// [`Error::Corruption`] met on the first descent; later ones come as one `Err` item, after
    /// which the iterator ends.
    pub fn range<K, R: KeyRange<K>>(&self, bounds: R) -> Result<Range<'_>> {
        self.guard()?;
        Range::new(Source::Txn(self), bounds.start_key(), bounds.end_key())
    }

    /// Every entry as this transaction sees it, in key order (as [`WriteTransaction::range`]).
    ///
    /// Errors: as [`WriteTransaction::range`].
    pub fn iter(&self) -> Result<Range<'_>> {
        self.range(..)
    }

    /// The entries whose keys start with `prefix`, as this transaction sees them (as
    /// [`WriteTransaction::range`]); an empty prefix selects every entry.
    ///
    /// Errors: as [`WriteTransaction::range`].
    pub fn prefix(&self, prefix: impl AsRef<[u8]>) -> Result<Range<'_>> {
        self.guard()?;
        Range::prefix(Source::Txn(self), prefix.as_ref())
    }

    /// The entry with the smallest key as this transaction sees it, copied out (as
    /// [`WriteTransaction::get`]), or `None` when the tree is empty. Cost: one descent.
    ///
    /// Errors: as [`WriteTransaction::range`].
    pub fn first(&self) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        let kv = self.iter()?.next().transpose()?;
        Ok(kv.map(|(k, v)| (k.to_vec(), v.to_vec())))
    }

    /// The entry with the largest key as this transaction sees it, copied out, or `None` when
    /// the tree is empty. Cost: two descents (the front and back ends of the cursor).
    ///
    /// Errors: as [`WriteTransaction::range`].
    pub fn last(&self) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        let kv = self.iter()?.next_back().transpose()?;
        Ok(kv.map(|(k, v)| (k.to_vec(), v.to_vec())))
    }

    /// The root page of the tree as this transaction sees it (0: empty), for cursors.
    pub(crate) fn tree_root(&self) -> u64 {
        self.root
    }

    /// The data file's path, for cursors' corruption reports.
    pub(crate) fn tree_path(&self) -> &std::path::Path {
        self.base.path()
    }

    /// Node `p` as this transaction sees it, for cursors: a dirty decoded node, a dirty page
    /// image, or the base snapshot's page.
    pub(crate) fn tree_node(&self, p: u64) -> Result<NodeRef<'_>> {
        match self.nodes.get(&p) {
            Some(Node::Leaf(es)) => Ok(NodeRef::Leaf(es)),
            Some(Node::Branch { keys, children }) => Ok(NodeRef::Branch(keys, children)),
            None => {
                let (img, h) = self.node_page(p)?;
                NodeRef::of_page(img, &h)
                    .ok_or_else(|| self.corrupt(p, "expected a branch or leaf page"))
            }
        }
    }

    /// The bytes of the overflow value at run `page` (`len` bytes) as this transaction sees
    /// it: written by this transaction, or in the base snapshot.
    pub(crate) fn tree_overflow(&self, page: u64, len: u64) -> Result<&[u8]> {
        match self.overflow.get(&page) {
            Some(b) => Ok(b),
            None => crate::btree::value(
                &self.base,
                crate::page::node::ValRef::Overflow { page, len },
            ),
        }
    }

    /// The bytes of the packed value at byte `off` of value page run `page` (`len` bytes) as
    /// this transaction sees it: in a run written by this transaction, or in the base snapshot.
    pub(crate) fn tree_packed(&self, page: u64, off: u32, len: u64) -> Result<&[u8]> {
        match self.values.get(&page) {
            Some(body) => (off as usize)
                .checked_sub(HEADER_LEN)
                .and_then(|o| body.get(o..o.checked_add(len as usize)?))
                .ok_or_else(|| self.corrupt(page, "internal: packed value outside its run")),
            None => crate::btree::value(
                &self.base,
                crate::page::node::ValRef::Packed { page, off, len },
            ),
        }
    }
}
