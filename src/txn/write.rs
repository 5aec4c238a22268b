//! The write transaction: copy-on-write updates of the B+tree and the free-space map.
//!
//! A committed page is never modified in place: the first change to a page in a transaction
//! allocates a new page, copies the old image into it and frees the old number (it stays
//! readable by older snapshots until they end). The copy is edited in place while the edit fits
//! (`leaf_put_in_place`, `branch_insert_in_place`); an edit that needs more decodes it into a
//! [`Node`]. Splits happen when a node outgrows a page; a node below a
//! quarter page is merged with a sibling when both fit in one page. Commit encodes every dirty
//! node, overflow run and free-space page into sealed images, hands one journal record to the
//! journal writer, and publishes the new state once the record is durable.

// The transaction's page maps are hashed with ahash under fixed seeds: keys are page numbers
// the writer made, not attacker input, and SipHash, like drawing random seeds for each of a
// transaction's maps, showed in one-put commit profiles.
type HashMap<K, V> = std::collections::HashMap<K, V, ahash::RandomState>;

/// An empty transaction map (no allocation until the first insert).
fn map<K, V>() -> HashMap<K, V> {
    HashMap::with_hasher(ahash::RandomState::with_seeds(
        0x243f_6a88_85a3_08d3,
        0x1319_8a2e_0370_7344,
        0xa409_3822_299f_31d0,
        0x082e_fa98_ec4e_6c89,
    ))
}
use std::sync::atomic::Ordering;
use std::sync::Arc;

use std::ops::Bound;

use crate::btree::{before_start, past_end, KeyRange, NodeRef, Range, Source};
use crate::error::{Error, Result};
use crate::freespace::{self, Extents, BITS_PER_BITMAP, DIR_CAPACITY};
use crate::journal::record::{commit_record, CommitMeta, DiffBase, OutRecord};
use crate::options::Durability;
use crate::page::node::{encode_overflow, fits_inline, LeafEntry, Node, Val};
use crate::page::{self, PageHeader, PageKind, HEADER_LEN, PAGE_SIZE};
use crate::state::State;
use crate::storage::{Inner, WriterState};

// Compaction's moves and the shrink of the free tail (`Storage::compact`): methods of
// `WriteTransaction` in their own file.
#[path = "compact.rs"]
mod compact;

/// What a range deletion did to a subtree.
enum Cut {
    /// Nothing in it was in the range: not copied.
    Untouched,
    /// Some entries were removed: the subtree's root is now this (dirty) page.
    Changed(u64),
    /// Every entry was removed: its pages are freed.
    Emptied,
}

/// Below this many body bytes a node is merged with a sibling when both fit in one page.
const UNDERFULL: usize = page::BODY_LEN / 4;

/// Most written ranges tracked for one dirty page; past it the page is diffed at commit.
const MAX_TOUCHED: usize = 12;

/// The byte ranges `(start, end)` in-place edits wrote to one dirty page, stored inline (no
/// allocation per page).
#[derive(Debug, Default, Clone, Copy)]
struct Touches {
    ranges: [(u16, u16); MAX_TOUCHED],
    len: usize,
}

impl Touches {
    fn as_slice(&self) -> &[(u16, u16)] {
        &self.ranges[..self.len.min(MAX_TOUCHED)]
    }
}

/// The single write transaction of a storage. Changes are private until [`commit`] returns;
/// dropping the transaction, or [`abort`], discards them.
///
/// [`commit`]: WriteTransaction::commit
/// [`abort`]: WriteTransaction::abort
pub struct WriteTransaction {
    inner: Arc<Inner>,
    writer: Option<WriterState>,
    base: Arc<State>,
    txn_id: u64,
    root: u64,
    entries: u64,
    next_page: u64,
    nodes: HashMap<u64, Node>,
    /// Dirty node pages still in page form, edited in place (the fast path: no decode). A
    /// dirty page number is in `nodes` or in `pages`, never both.
    pages: HashMap<u64, crate::page::SharedImage>,
    /// Dirty page -> the committed page it was copied from (its diff base in the journal).
    bases: HashMap<u64, u64>,
    /// Dirty pages in `pages` edited only in place since their copy from the base: the byte
    /// ranges written (besides the header), so the commit journals them as the page's diff
    /// without comparing it with its base. A page that went through the decoded `Node` (or
    /// collected more than [`MAX_TOUCHED`] ranges) has no entry and is diffed.
    touched: HashMap<u64, Touches>,
    overflow: HashMap<u64, Vec<u8>>,
    /// Scratch for leaves re-packed or split in page form (`put_full_leaf`): reused, so no
    /// allocation per split.
    leaf_cells: page::node::LeafCells,
    /// A page buffer freed by `put_full_leaf` (the image a leaf had before it was laid out
    /// anew), reused for the next one.
    spare: Option<crate::page::SharedImage>,
    // Free-space map.
    fsm_loaded: bool,
    dir_page: u64,
    dir_dirty: bool,
    dir: Vec<u64>,
    /// Dirty bitmap pages by index: page images edited in place (sealed at commit).
    /// With each, for one copied from a committed bitmap page, the byte ranges its bit flips
    /// wrote (sealed from the base's checksum at commit, and journaled as a diff of that base).
    bitmaps: HashMap<usize, (crate::page::SharedImage, Option<Touches>)>,
    // Allocation bookkeeping.
    taken: Vec<(u64, u64)>,
    local_free: Extents,
    allocated: HashMap<u64, u64>,
    freed: Vec<(u64, u64)>,
    failed: Option<String>,
    changed: bool,
    /// When the commit is acknowledged ([`WriteTransaction::set_durability`]).
    durability: Durability,
}

impl std::fmt::Debug for WriteTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WriteTransaction(txn {})", self.txn_id)
    }
}

fn check_key(key: &[u8]) -> Result<()> {
    if key.is_empty() {
        return Err(Error::EmptyKey);
    }
    if key.len() > crate::MAX_KEY_LEN {
        return Err(Error::KeyTooLarge {
            len: key.len(),
            max: crate::MAX_KEY_LEN,
        });
    }
    Ok(())
}

/// Checks a key and a value against the limits, as `put` does before writing anything.
pub(crate) fn check_put(key: &[u8], value: &[u8]) -> Result<()> {
    check_key(key)?;
    if value.len() > crate::MAX_VALUE_LEN {
        return Err(Error::ValueTooLarge {
            len: value.len(),
            max: crate::MAX_VALUE_LEN,
        });
    }
    Ok(())
}

impl WriteTransaction {
    pub(crate) fn new(
        inner: Arc<Inner>,
        mut writer: WriterState,
        base: Arc<State>,
    ) -> WriteTransaction {
        let freed = writer.alloc.run_list();
        WriteTransaction {
            txn_id: base.txn_id + 1,
            root: base.root,
            entries: base.entries,
            next_page: base.next_page,
            dir_page: base.freedir,
            inner,
            writer: Some(writer),
            base,
            nodes: map(),
            pages: map(),
            bases: map(),
            touched: map(),
            overflow: map(),
            leaf_cells: page::node::LeafCells::default(),
            spare: None,
            fsm_loaded: false,
            dir_dirty: false,
            dir: Vec::new(),
            bitmaps: map(),
            taken: Vec::new(),
            local_free: Extents::default(),
            allocated: map(),
            freed,
            failed: None,
            changed: false,
            durability: Durability::Immediate,
        }
    }

    /// Sets when [`WriteTransaction::commit`] returns: [`Durability::Immediate`] (the default)
    /// once the journal record is covered by `fdatasync`; [`Durability::Eventual`] once it is
    /// queued for the journal (durable with the next batch or within
    /// [`crate::Options::eventual_sync_ms`]; a crash may lose it, and the eventual commits
    /// just before it, never part of it). Either way the commit is visible to new snapshots
    /// when `commit` returns. See docs/design.md, section 4.2.
    pub fn set_durability(&mut self, durability: Durability) {
        self.durability = durability;
    }

    /// The durability the commit will have ([`WriteTransaction::set_durability`]).
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// The id this transaction commits as (last committed + 1).
    pub fn txn_id(&self) -> u64 {
        self.txn_id
    }

    /// Keys in the tree as this transaction sees it.
    pub fn len(&self) -> u64 {
        self.entries
    }

    /// True when the tree is empty as this transaction sees it.
    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    fn corrupt(&self, page: u64, what: &str) -> Error {
        Error::corruption(self.base.path(), Some(page), None, what)
    }

    fn guard(&self) -> Result<()> {
        match &self.failed {
            Some(cause) => Err(Error::Poisoned {
                cause: format!("this transaction failed earlier: {cause}"),
            }),
            None => Ok(()),
        }
    }

    fn fail<T>(&mut self, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            if self.failed.is_none() {
                self.failed = Some(e.to_string());
            }
        }
        r
    }

    // ---- allocation -------------------------------------------------------------------------

    fn alloc(&mut self, n: u64) -> Result<u64> {
        let p = if let Some(p) = self.local_free.take(n) {
            self.set_bits(p, n, false)?;
            p
        } else if let Some(p) = self.writer.as_mut().and_then(|w| w.alloc.reusable.take(n)) {
            self.taken.push((p, n));
            self.set_bits(p, n, false)?;
            p
        } else {
            let p = self.next_page;
            self.next_page += n;
            p
        };
        self.allocated.insert(p, n);
        self.bases.remove(&p);
        self.forget_page(p);
        Ok(p)
    }

    fn free(&mut self, p: u64, n: u64) -> Result<()> {
        self.set_bits(p, n, true)?;
        if self.allocated.remove(&p).is_some() {
            self.local_free.insert(p, n);
        } else {
            self.freed.push((p, n));
        }
        Ok(())
    }

    fn set_bits(&mut self, p: u64, n: u64, free: bool) -> Result<()> {
        for q in p..p + n {
            let idx = (q / BITS_PER_BITMAP) as usize;
            self.bitmap(idx)?;
            if let Some((image, touched)) = self.bitmaps.get_mut(&idx) {
                if let Some(img) = Arc::get_mut(image) {
                    freespace::set_bit_in_body(&mut img[HEADER_LEN..], q, free);
                }
                let at = (HEADER_LEN + (q % BITS_PER_BITMAP) as usize / 8) as u16;
                if let Some(t) = touched {
                    if t.as_slice().last() != Some(&(at, at + 1)) {
                        if t.len >= MAX_TOUCHED {
                            *touched = None;
                        } else {
                            t.ranges[t.len] = (at, at + 1);
                            t.len += 1;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn load_fsm(&mut self) -> Result<()> {
        if self.fsm_loaded {
            return Ok(());
        }
        self.fsm_loaded = true;
        if self.base.freedir != 0 {
            let base = self.base.clone();
            let (img, h) = base.page(self.base.freedir)?;
            if h.kind != PageKind::FreeDir || h.count as usize > DIR_CAPACITY {
                return Err(self.corrupt(self.base.freedir, "bad free-space directory page"));
            }
            for i in 0..h.count as usize {
                let p = page::rd_u64(img, HEADER_LEN + 8 * i).ok_or_else(|| {
                    self.corrupt(self.base.freedir, "bad free-space directory page")
                })?;
                self.dir.push(p);
            }
        }
        Ok(())
    }

    /// Marks the directory page changed (a bitmap was added), allocating it the first time.
    fn touch_dir(&mut self) -> Result<()> {
        if self.dir_dirty {
            return Ok(());
        }
        self.dir_dirty = true;
        if self.dir_page == 0 {
            self.dir_page = self.alloc(1)?;
        }
        Ok(())
    }

    /// Makes bitmap `idx` dirty in this transaction, creating bitmaps up to it.
    ///
    /// Free-space pages are updated in place (same page number), unlike tree pages: no
    /// snapshot reads them (only the writer, `check` and the flush, which see the current or
    /// the flushed state), and recovery rebuilds them from the journal's full images before
    /// reading them. So a commit journals one bitmap page, not a bitmap page plus a directory
    /// page plus the cascade of freeing and allocating their old copies.
    fn bitmap(&mut self, idx: usize) -> Result<()> {
        self.load_fsm()?;
        if self.bitmaps.contains_key(&idx) {
            return Ok(());
        }
        if idx >= DIR_CAPACITY {
            return Err(Error::InvalidOptions(format!(
                "data file would exceed {} pages, the free-space map's reach",
                DIR_CAPACITY as u64 * BITS_PER_BITMAP
            )));
        }
        if idx < self.dir.len() {
            let base = self.base.clone();
            let p = self.dir[idx];
            let (img, h) = base.page(p)?;
            if h.kind != PageKind::FreeBitmap {
                return Err(self.corrupt(p, "expected a free-space bitmap page"));
            }
            if img.len() != PAGE_SIZE {
                return Err(self.corrupt(p, "free-space bitmap page of a bad length"));
            }
            self.bitmaps
                .insert(idx, (page::Image::copy_from(img), Some(Touches::default())));
        } else {
            // Bounded by DIR_CAPACITY: each turn adds one bitmap.
            while self.dir.len() <= idx {
                let i = self.dir.len();
                self.dir.push(0);
                self.bitmaps.insert(i, (page::zeroed_shared(1), None));
                self.touch_dir()?;
                let new = self.alloc(1)?;
                self.dir[i] = new;
            }
        }
        Ok(())
    }

    // ---- nodes ------------------------------------------------------------------------------

    /// The image of node page `p` as this transaction sees it (a dirty page or the base), with
    /// its header checked to be a leaf or branch. Not for pages in `nodes`.
    fn node_page(&self, p: u64) -> Result<(&[u8], PageHeader)> {
        let (img, h) = match self.pages.get(&p) {
            Some(img) => (
                &img[..],
                PageHeader::read(img).ok_or_else(|| self.corrupt(p, "bad dirty page"))?,
            ),
            None => self.base.page(p)?,
        };
        if !matches!(h.kind, PageKind::Leaf | PageKind::Branch) {
            return Err(self.corrupt(p, "expected a branch or leaf page"));
        }
        Ok((img, h))
    }

    fn read_node(&self, p: u64) -> Result<Node> {
        if let Some(n) = self.nodes.get(&p) {
            return Ok(n.clone());
        }
        let (img, h) = self.node_page(p)?;
        Node::decode(img, &h).ok_or_else(|| self.corrupt(p, "malformed node page"))
    }

    /// Returns the page number of a private (dirty) copy of node `p`: a copy of its image,
    /// edited in place until an edit needs the decoded [`Node`].
    fn cow(&mut self, p: u64) -> Result<u64> {
        if self.nodes.contains_key(&p) || self.pages.contains_key(&p) {
            return Ok(p);
        }
        // No decode here: in-place edits are bounds-checked, and a page that reaches the node
        // path is decoded (and validated) then.
        let (img, _) = self.node_page(p)?;
        let image = page::Image::copy_from(img);
        let new = self.alloc(1)?;
        self.pages.insert(new, image);
        self.touched.insert(new, Touches::default());
        self.bases.insert(new, p);
        self.free(p, 1)?;
        Ok(new)
    }

    /// Removes dirty node `p` from the transaction's maps, decoding it if in page form.
    fn take_node(&mut self, p: u64) -> Result<Node> {
        if let Some(n) = self.nodes.remove(&p) {
            return Ok(n);
        }
        let node = self.read_node(p);
        if self.forget_page(p).is_none() {
            return Err(self.corrupt(p, "internal: dirty node missing"));
        }
        node
    }

    /// Drops dirty page `p`'s page-form image (and what was tracked of its edits).
    fn forget_page(&mut self, p: u64) -> Option<crate::page::SharedImage> {
        self.touched.remove(&p);
        self.pages.remove(&p)
    }

    /// Records the ranges an in-place edit wrote to dirty page `p` (see `touched`).
    fn touch(&mut self, p: u64, ranges: page::node::Touched) {
        if let Some(t) = self.touched.get_mut(&p) {
            for r in ranges.into_iter().filter(|r| !r.is_empty()) {
                if t.len >= MAX_TOUCHED || r.end > PAGE_SIZE {
                    self.touched.remove(&p);
                    return;
                }
                t.ranges[t.len] = (r.start as u16, r.end as u16);
                t.len += 1;
            }
        }
    }

    /// The unique image of dirty page `p`, to edit in place.
    fn page_mut(&mut self, p: u64) -> Result<&mut [u8]> {
        match self.pages.get_mut(&p).and_then(Arc::get_mut) {
            Some(img) => Ok(img),
            None => Err(Error::corruption(
                self.base.path(),
                Some(p),
                None,
                "internal: dirty page missing or shared",
            )),
        }
    }

    fn node_size(&self, p: u64) -> Result<usize> {
        if let Some(n) = self.nodes.get(&p) {
            return Ok(n.body_size());
        }
        let (img, h) = self.node_page(p)?;
        page::node::page_body_size(img, &h).ok_or_else(|| self.corrupt(p, "malformed node page"))
    }

    fn free_value(&mut self, v: &Val) -> Result<()> {
        if let Val::Overflow { page, len } = v {
            let n = page::overflow_run_pages(*len as usize) as u64;
            self.overflow.remove(page);
            self.free(*page, n)?;
        }
        Ok(())
    }

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
    fn insert_at(
        &mut self,
        page: u64,
        key: &[u8],
        val: Val,
        depth: usize,
        rightmost: bool,
    ) -> Result<(u64, Option<(Vec<u8>, u64)>, Option<Val>)> {
        if depth > crate::btree::MAX_DEPTH {
            return Err(self.corrupt(page, "tree deeper than 32 levels"));
        }
        let p = self.cow(page)?;
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
                match page::node::leaf_put_in_place(self.page_mut(p)?, key, &v) {
                    Ok((o, touched)) => {
                        self.touch(p, touched);
                        return Ok((p, None, o));
                    }
                    Err(page::node::EditError::NoRoom)
                        if rightmost && self.after_last(p, key)? =>
                    {
                        // An append to the full rightmost leaf (sorted inserts): the new key
                        // starts a new rightmost leaf; this one stays as it is, full.
                        let r = self.alloc(1)?;
                        self.park(
                            r,
                            Node::Leaf(vec![LeafEntry {
                                key: key.to_vec(),
                                val: v,
                            }]),
                        )?;
                        return Ok((p, Some((key.to_vec(), r)), None));
                    }
                    Err(page::node::EditError::NoRoom) => {
                        // Re-packed or split in page form: no decode.
                        return self.put_full_leaf(p, key, &v);
                    }
                    Err(page::node::EditError::Malformed) => {
                        return Err(self.corrupt(p, "malformed leaf page"))
                    }
                }
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
                let (nc, split, o) = self.insert_at(c, key, v, depth + 1, rightmost && last)?;
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
                    let (nc, split, o) =
                        self.insert_at(children[i], key, val, depth + 1, rightmost && last)?;
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
        let Some(img) = Arc::get_mut(&mut image) else {
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
            if Arc::get_mut(&mut old).is_some() {
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
    fn park(&mut self, p: u64, node: Node) -> Result<()> {
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
        let Some(img) = Arc::get_mut(&mut image) else {
            return Err(self.corrupt(p, "internal: new page image shared"));
        };
        node.encode_unsealed_into(img, base_img, p, self.txn_id);
        // Re-encoded: no record of what changed, the commit diffs it.
        self.touched.remove(&p);
        self.pages.insert(p, image);
        Ok(())
    }

    fn delete_at(&mut self, page: u64, key: &[u8], depth: usize) -> Result<(u64, Option<Val>)> {
        if depth > crate::btree::MAX_DEPTH {
            return Err(self.corrupt(page, "tree deeper than 32 levels"));
        }
        let p = self.cow(page)?;
        // Fast path: a dirty page in page form is edited in place (no decode). A branch whose
        // child became underfull falls through to the node path, which merges, with the
        // child's answer.
        let mut child_done: Option<(usize, u64, Option<Val>)> = None;
        if self.pages.contains_key(&p) {
            let (img, h) = self.node_page(p)?;
            if h.kind == PageKind::Leaf {
                return match page::node::leaf_delete_in_place(self.page_mut(p)?, key) {
                    Ok((old, touched)) => {
                        self.touch(p, touched);
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
                        Ok(i) => Ok(Some(es.remove(i).val)),
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
    fn try_merge(
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
        let r = self.put_inner(key, value);
        self.fail(r)
    }

    fn put_inner(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        self.changed = true;
        let val = if fits_inline(key.len(), value.len()) {
            Val::Inline(value.to_vec())
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
        let (nr, split, old) = self.insert_at(root, key, val, 0, true)?;
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
        let r = self.delete_inner(key);
        self.fail(r)
    }

    fn delete_inner(&mut self, key: &[u8]) -> Result<bool> {
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
    /// Errors: [`Error::Poisoned`] when an earlier operation of this transaction failed;
    /// [`Error::Corruption`] or an I/O error reading a page (the transaction then fails: every
    /// later operation returns [`Error::Poisoned`], and it must be dropped).
    pub fn delete_range<K, R: KeyRange<K>>(&mut self, bounds: R) -> Result<u64> {
        self.guard()?;
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
                        .filter(|e| matches!(e.val, Val::Overflow { .. }))
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
                    if let page::node::ValRef::Overflow { .. } = val {
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

    /// Reads `key` as this transaction sees it (its own changes included), copied out.
    pub fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>> {
        let key = key.as_ref();
        check_key(key)?;
        self.guard()?;
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
    /// Errors: as [`WriteTransaction::get`] for the first key that fails (`EmptyKey` and
    /// `KeyTooLarge` included, before anything is read for later keys).
    pub fn multi_get<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<Vec<Option<Vec<u8>>>> {
        keys.iter().map(|k| self.get(k)).collect()
    }

    fn value(&self, v: &Val) -> Result<Vec<u8>> {
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

    /// Makes every change durable and visible: returns once the journal record is covered by a
    /// successful `fdatasync` (design.md invariant I1); new snapshots then see the changes. With
    /// [`Durability::Eventual`] ([`WriteTransaction::set_durability`]) it returns once the
    /// record is queued for the journal, visible but not yet durable; a later failure to write
    /// it poisons the storage and names it in the cause.
    ///
    /// Errors: an I/O error writing or syncing the journal (the storage is then poisoned: every
    /// later write fails with [`Error::Poisoned`] until reopened); `ENOSPC` growing the data file
    /// (nothing is lost and the storage stays usable); [`Error::Poisoned`] when an earlier
    /// failure poisoned it. After an error nothing of this transaction is visible.
    pub fn commit(self) -> Result<()> {
        // DEBUG, per commit: a disabled span is a static interest check (nothing formatted
        // or allocated); the journal batch event below nests in it.
        let _span = tracing::debug_span!("commit", txn = self.txn_id).entered();
        let Some(mut prepared) = self.prepare()? else {
            return Ok(());
        };
        let record = prepared.take_record();
        let r = prepared
            .journal()
            .commit_with(record, prepared.durability());
        prepared.finish(r)
    }

    /// Tree pages this transaction has copied or created so far (dirty leaves and branches, in
    /// page or node form; free-space bitmap pages not counted).
    pub(crate) fn dirty_pages(&self) -> usize {
        self.pages.len() + self.nodes.len()
    }

    /// The data file length, in pages, that this transaction's commit needs when the file is
    /// shorter than that now (`None` when it fits): [`WriteTransaction::prepare`] would grow the
    /// file with a blocking `fallocate`. The actor runtime grows it first on an I/O lane with
    /// [`crate::Storage::grow_data_file`], so that no executor waits for the disk. Cheap (one
    /// atomic load).
    pub(crate) fn data_file_growth(&self) -> Option<u64> {
        let need = self.next_page * PAGE_SIZE as u64;
        (need > self.inner.file_len.load(Ordering::Acquire)).then_some(self.next_page)
    }

    /// The first half of [`WriteTransaction::commit`]: encodes every dirty page into a sealed
    /// image, grows the data file, and builds the journal record, without writing it. Returns
    /// `None` when the transaction changed nothing. The actor runtime sends the record to its
    /// journal-writer actor and calls [`PreparedCommit::finish`] with the outcome.
    ///
    /// Errors: as `commit` before the journal write (`ENOSPC` growing the data file loses
    /// nothing and does not poison).
    pub(crate) fn prepare(mut self) -> Result<Option<PreparedCommit>> {
        self.guard()?;
        self.inner.check_writable()?;
        if !self.changed {
            return Ok(None);
        }
        self.load_fsm()?;
        let txn = self.txn_id;
        let base_state = self.base.clone();
        // Dirty page -> its diff base, for the nodes copied from a committed page (with the
        // ranges written since, for a page edited only in place).
        let touched = std::mem::replace(&mut self.touched, map());
        let mut bitmap_touched: Vec<(u64, Touches)> = Vec::new();
        let mut bases: HashMap<u64, DiffBase<'_>> = map();
        bases.reserve(self.bases.len());
        let mut images: Vec<(u64, crate::page::SharedImage)> =
            Vec::with_capacity(self.nodes.len() + self.bitmaps.len() + 1);
        for (&p, node) in &self.nodes {
            let image = match self.bases.get(&p) {
                Some(&b) => {
                    let (base_img, _) = base_state.page(b)?;
                    bases.insert(
                        p,
                        DiffBase {
                            page: b,
                            image: base_img,
                            written: None,
                        },
                    );
                    node.encode_on(base_img, p, txn)
                }
                None => node.encode(p, txn),
            };
            images.push((p, page::Image::from_boxed(image)));
        }
        for (p, mut image) in std::mem::replace(&mut self.pages, map()) {
            // A page copied from a committed page is journaled as a diff against it; a new
            // page (a split's right half, a new root leaf) has no base.
            let mut seal_base = None;
            if let Some(&b) = self.bases.get(&p) {
                let (base_img, _) = base_state.page(b)?;
                let written = touched.get(&p).map(Touches::as_slice);
                bases.insert(
                    p,
                    DiffBase {
                        page: b,
                        image: base_img,
                        written,
                    },
                );
                // Edited only in place: it differs from its (checked) base only in the
                // header and the written ranges, so its checksum follows from the base's.
                if let Some(w) = written {
                    seal_base = Some((base_img, crate::journal::diff::written_ranges(w)));
                }
            }
            let Some(img) = Arc::get_mut(&mut image) else {
                return Err(self.corrupt(p, "internal: dirty page shared"));
            };
            let h = PageHeader::read(img).ok_or_else(|| self.corrupt(p, "bad dirty page"))?;
            PageHeader {
                page_number: p,
                txn_id: txn,
                run_pages: 1,
                aux: 0,
                ..h
            }
            .write(img);
            match seal_base {
                Some((b, ranges)) if page::seal_from_base(img, b, &ranges) => {}
                _ => page::seal(img),
            }
            images.push((p, image));
        }
        for (&p, value) in &self.overflow {
            images.push((p, page::Image::from_boxed(encode_overflow(value, p, txn))));
        }
        for (idx, (mut image, touched)) in std::mem::replace(&mut self.bitmaps, map()) {
            let p = self.dir[idx];
            // A bitmap copied from the committed one: sealed from its checksum.
            let seal_base = match touched {
                Some(t) => {
                    bitmap_touched.push((p, t));
                    Some((
                        base_state.page(p)?.0,
                        crate::journal::diff::written_ranges(t.as_slice()),
                    ))
                }
                None => None,
            };
            let Some(img) = Arc::get_mut(&mut image) else {
                return Err(self.corrupt(p, "internal: dirty bitmap page shared"));
            };
            PageHeader {
                kind: PageKind::FreeBitmap,
                count: 0,
                page_number: p,
                txn_id: txn,
                run_pages: 1,
                aux: idx as u32,
            }
            .write(img);
            match seal_base {
                Some((b, ranges)) if page::seal_from_base(img, b, &ranges) => {}
                _ => page::seal(img),
            }
            images.push((p, image));
        }
        // A bitmap copied from the committed one is journaled as a diff of that version of
        // itself (the same page number): its bit flips. Recovery takes the base from the
        // images it replayed, else from the data file, which a flush whose header never became
        // durable may have torn; such a flush wrote a map record first (`flush::flush`), whose
        // image of the page replaces the data file's (docs/design.md 3.2 and 3.5).
        for (p, t) in &bitmap_touched {
            bases.insert(
                *p,
                DiffBase {
                    page: *p,
                    image: base_state.page(*p)?.0,
                    written: Some(t.as_slice()),
                },
            );
        }
        if self.dir_dirty {
            let mut img = page::zeroed(1);
            PageHeader {
                kind: PageKind::FreeDir,
                count: self.dir.len() as u16,
                page_number: self.dir_page,
                txn_id: txn,
                run_pages: 1,
                aux: 0,
            }
            .write(&mut img);
            for (i, v) in self.dir.iter().enumerate() {
                page::wr_u64(&mut img, HEADER_LEN + 8 * i, *v);
            }
            page::seal(&mut img);
            images.push((self.dir_page, page::Image::from_boxed(img)));
        }
        images.sort_unstable_by_key(|(p, _)| *p);
        debug_assert!(images
            .iter()
            .all(|(p, img)| *p >= 2 && (*p + (img.len() / PAGE_SIZE) as u64) <= self.next_page));
        let meta = CommitMeta {
            root: self.root,
            freedir: self.dir_page,
            next_page: self.next_page,
            entries: self.entries,
        };
        // Grow the data file before anything is journaled: ENOSPC here loses nothing.
        self.inner.ensure_data_len(self.next_page)?;
        let record = commit_record(self.inner.storage_id, txn, meta, &images, |p| {
            bases.get(&p).copied()
        });
        drop(bases);
        let journaled = (record.pages as u64, record.page_diffs as u64);
        tracing::trace!(
            storage = self.inner.storage_id,
            txn,
            pages = record.pages,
            page_diffs = record.page_diffs,
            record_bytes = record.total_len(),
            "commit prepared"
        );
        Ok(Some(PreparedCommit {
            journaled,
            txn: self,
            record: Some(record),
            meta,
            images,
        }))
    }

    /// Discards every change (the same as dropping the transaction).
    pub fn abort(self) {}
}

/// A write transaction whose journal record is built and not yet durable. It still holds the
/// storage's writer: no other write transaction starts until [`PreparedCommit::finish`] (or
/// drop, which aborts).
pub(crate) struct PreparedCommit {
    txn: WriteTransaction,
    record: Option<OutRecord>,
    meta: CommitMeta,
    images: Vec<(u64, crate::page::SharedImage)>,
    /// Page images in the record, and how many are diffs.
    journaled: (u64, u64),
}

impl std::fmt::Debug for PreparedCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PreparedCommit(txn {})", self.txn.txn_id)
    }
}

impl PreparedCommit {
    /// The transaction id.
    pub fn txn_id(&self) -> u64 {
        self.txn.txn_id
    }

    /// The journal record to write (once; later calls return an empty padding-free record).
    pub fn take_record(&mut self) -> OutRecord {
        self.record.take().unwrap_or_else(|| {
            OutRecord::new(
                crate::journal::record::RecordKind::Padding,
                0,
                0,
                vec![crate::journal::record::Part::Zeros(1)],
            )
        })
    }

    /// The transaction's durability ([`WriteTransaction::set_durability`]): how the record is
    /// to be handed to the journal ([`crate::journal::Journal::commit_with`]).
    pub fn durability(&self) -> Durability {
        self.txn.durability
    }

    /// The journal the record belongs in.
    pub fn journal(&self) -> Arc<crate::journal::Journal> {
        self.txn.inner.journal.clone()
    }

    /// Completes the commit with the journal's answer: on `Ok` (the record is durable) the
    /// new state is published and the writer released; on `Err` the storage is poisoned and
    /// the error returned (nothing of the transaction becomes visible).
    pub fn finish(mut self, written: Result<u64>) -> Result<()> {
        if let Err(e) = written {
            self.txn.inner.poison(&e);
            return Err(e);
        }
        let t = &mut self.txn;
        let mut writer = t.writer.take().ok_or(Error::Closed)?;
        t.inner
            .pages_journaled
            .fetch_add(self.journaled.0, Ordering::Relaxed);
        t.inner
            .pages_journaled_as_diffs
            .fetch_add(self.journaled.1, Ordering::Relaxed);
        for (s, l) in t.local_free.iter() {
            writer.alloc.reusable.insert(s, l);
        }
        let allocated: u64 = t.allocated.values().sum();
        t.inner
            .allocated_unflushed
            .fetch_add(allocated, Ordering::Relaxed);
        let freed = std::mem::take(&mut t.freed);
        let freed_pages: u64 = freed.iter().map(|(_, l)| l).sum();
        // Single pages whose freed version exists only in the scratch table (written by a txn
        // above every flush target started so far) wait only for snapshots (`release_early`).
        let started = t.inner.flush_started.load(Ordering::Acquire);
        let (mut early, mut normal) = (writer.alloc.run_list(), writer.alloc.run_list());
        let mut oldest_writer = u64::MAX;
        for &(s, l) in &freed {
            match t.base.scratch.get(&s) {
                Some(sp) if l == 1 && sp.txn > started => {
                    oldest_writer = oldest_writer.min(sp.txn);
                    early.push((s, l));
                }
                _ => normal.push((s, l)),
            }
        }
        writer.alloc.pending_pages += freed_pages;
        t.inner
            .freed_unflushed
            .fetch_add(freed_pages, Ordering::Relaxed);
        t.inner.publish_commit(
            t.txn_id,
            self.meta,
            std::mem::take(&mut self.images),
            &freed,
        );
        if normal.is_empty() {
            writer.alloc.recycle(normal);
        } else {
            writer.alloc.pending.push_back((t.txn_id, normal));
        }
        if early.is_empty() {
            writer.alloc.recycle(early);
        } else {
            writer
                .alloc
                .early
                .push_back((t.txn_id, oldest_writer, early));
        }
        writer.alloc.recycle(freed);
        t.taken.clear();
        t.inner.return_writer(writer);
        t.inner.after_commit();
        Ok(())
    }
}

impl Drop for WriteTransaction {
    fn drop(&mut self) {
        if let Some(mut w) = self.writer.take() {
            for (s, l) in self.taken.drain(..) {
                w.alloc.reusable.insert(s, l);
            }
            self.inner.return_writer(w);
        }
    }
}
