//! Ordered, double-ended cursors over the B+tree, and the key bounds they take.
//!
//! One cursor type, [`TreeRange`], reads two kinds of tree through [`Source`]: a committed snapshot
//! (`State`, pages only) and a write transaction's private tree (dirty decoded nodes, dirty page
//! images, and the base snapshot's pages below them). Either way a cursor is a stack of
//! `(node, index)` levels from the root to a leaf; moving past the end of a leaf pops to the
//! nearest ancestor with a sibling in that direction and descends to that sibling's extreme leaf,
//! so a step costs O(1) amortized and O(depth) at worst, forwards or backwards. Nothing is
//! collected: the front and back ends are two independent stacks that stop when they meet.

use std::ops::{Bound, RangeBounds};

use crate::error::{Error, Result};
use crate::page::node::{BranchView, LeafEntry, LeafView, Val, ValRef};
use crate::page::PageKind;
use crate::state::State;
use crate::txn::WriteTransaction;

use super::MAX_DEPTH;

/// Key bounds a `range` accepts: ordinary Rust range syntax over anything that is
/// `AsRef<[u8]>` (`&[u8]`, `Vec<u8>`, `&str`, `&[u8; N]`, ...), and `(Bound<K>, Bound<K>)`
/// pairs.
///
/// `K` is the type the bounds are made of; it is inferred from the range expression, so
/// `r.range(&b"a"[..]..&b"b"[..])`, `r.range(b"k".as_slice()..)`, `r.range(..)`,
/// `r.range::<&[u8], _>(..)` and `r.range((Bound::Excluded(a), Bound::Unbounded))` all compile.
/// (Unlike `std::ops::RangeBounds<[u8]>`, which a `Range<&[u8]>` does not implement, and
/// `RangeBounds<K>` with `K` inferred, for which a `(Bound<&[u8]>, Bound<&[u8]>)` pair is
/// ambiguous.) An empty or inverted range (`b..a`) selects nothing; it never panics.
pub trait KeyRange<K> {
    /// The lower bound, as bytes.
    fn start_key(&self) -> Bound<&[u8]>;
    /// The upper bound, as bytes.
    fn end_key(&self) -> Bound<&[u8]>;
}

macro_rules! key_range_via_range_bounds {
    ($($t:ty),*) => {$(
        impl<K: AsRef<[u8]>> KeyRange<K> for $t {
            fn start_key(&self) -> Bound<&[u8]> {
                RangeBounds::start_bound(self).map(AsRef::as_ref)
            }
            fn end_key(&self) -> Bound<&[u8]> {
                RangeBounds::end_bound(self).map(AsRef::as_ref)
            }
        }
    )*};
}

key_range_via_range_bounds!(
    std::ops::Range<K>,
    std::ops::RangeInclusive<K>,
    std::ops::RangeFrom<K>,
    std::ops::RangeTo<K>,
    std::ops::RangeToInclusive<K>,
    (Bound<K>, Bound<K>)
);

/// `..`: every key. Implemented for `&[u8]` only, so that `range(..)` needs no annotation.
impl KeyRange<&[u8]> for std::ops::RangeFull {
    fn start_key(&self) -> Bound<&[u8]> {
        Bound::Unbounded
    }
    fn end_key(&self) -> Bound<&[u8]> {
        Bound::Unbounded
    }
}

/// Where a cursor reads the tree from.
#[derive(Clone, Copy)]
pub(crate) enum Source<'a> {
    /// A committed snapshot: every node is a page of the map or of scratch.
    Snapshot(&'a State),
    /// A write transaction's tree, its uncommitted changes included.
    Txn(&'a WriteTransaction),
}

/// One node as a cursor sees it: a page view, or a write transaction's decoded node.
#[derive(Clone, Copy)]
pub(crate) enum NodeRef<'a> {
    /// A leaf page.
    LeafPage(LeafView<'a>),
    /// A branch page.
    BranchPage(BranchView<'a>),
    /// A decoded leaf (dirty, in a write transaction).
    Leaf(&'a [LeafEntry]),
    /// A decoded branch: separators and children (dirty, in a write transaction).
    Branch(&'a [Vec<u8>], &'a [u64]),
}

/// A leaf cell's value before its overflow run, if any, is resolved.
#[derive(Clone, Copy)]
pub(crate) enum CellVal<'a> {
    /// From a page.
    Ref(ValRef<'a>),
    /// From a decoded leaf.
    Val(&'a Val),
}

impl<'a> NodeRef<'a> {
    /// A node view of page image `img` with header `h` (a leaf or a branch).
    pub(crate) fn of_page(img: &'a [u8], h: &crate::page::PageHeader) -> Option<NodeRef<'a>> {
        match h.kind {
            PageKind::Leaf => Some(NodeRef::LeafPage(LeafView::new(img, h))),
            PageKind::Branch => Some(NodeRef::BranchPage(BranchView::new(img, h))),
            _ => None,
        }
    }

    fn is_leaf(&self) -> bool {
        matches!(self, NodeRef::LeafPage(_) | NodeRef::Leaf(_))
    }

    /// Cells of a leaf, separator keys of a branch.
    fn len(&self) -> usize {
        match self {
            NodeRef::LeafPage(v) => v.len(),
            NodeRef::BranchPage(v) => v.keys(),
            NodeRef::Leaf(es) => es.len(),
            NodeRef::Branch(keys, _) => keys.len(),
        }
    }

    fn child(&self, i: usize) -> Option<u64> {
        match self {
            NodeRef::BranchPage(v) => v.child(i),
            NodeRef::Branch(_, children) => children.get(i).copied(),
            _ => None,
        }
    }

    /// The index of the child whose key range holds `key` (separators `<= key`).
    fn child_index(&self, key: &[u8]) -> Option<usize> {
        match self {
            NodeRef::BranchPage(v) => v.child_index(key),
            NodeRef::Branch(keys, _) => Some(keys.partition_point(|k| k.as_slice() <= key)),
            _ => None,
        }
    }

    /// Binary search of a leaf: `Ok(i)` found at `i`, `Err(i)` the insertion point.
    fn search(&self, key: &[u8]) -> Option<std::result::Result<usize, usize>> {
        match self {
            NodeRef::LeafPage(v) => v.search(key),
            NodeRef::Leaf(es) => Some(es.binary_search_by(|e| e.key.as_slice().cmp(key))),
            _ => None,
        }
    }

    #[inline]
    fn cell(&self, i: usize) -> Option<(&'a [u8], CellVal<'a>)> {
        match self {
            NodeRef::LeafPage(v) => v.cell(i).map(|(k, v)| (k, CellVal::Ref(v))),
            NodeRef::Leaf(es) => es.get(i).map(|e| (e.key.as_slice(), CellVal::Val(&e.val))),
            _ => None,
        }
    }
}

impl<'a> Source<'a> {
    fn root(self) -> u64 {
        match self {
            Source::Snapshot(s) => s.root,
            Source::Txn(t) => t.tree_root(),
        }
    }

    fn corrupt(self, page: u64, what: &str) -> Error {
        let path = match self {
            Source::Snapshot(s) => s.path(),
            Source::Txn(t) => t.tree_path(),
        };
        Error::corruption(path, Some(page), None, what)
    }

    fn node(self, p: u64) -> Result<NodeRef<'a>> {
        match self {
            Source::Snapshot(s) => {
                let (img, h) = s.page(p)?;
                NodeRef::of_page(img, &h)
                    .ok_or_else(|| self.corrupt(p, "expected a branch or leaf page"))
            }
            Source::Txn(t) => t.tree_node(p),
        }
    }

    fn value(self, v: CellVal<'a>) -> Result<&'a [u8]> {
        match (self, v) {
            (_, CellVal::Ref(ValRef::Inline(b))) => Ok(b),
            (_, CellVal::Val(Val::Inline(b))) => Ok(b),
            (Source::Snapshot(s), CellVal::Ref(r)) => super::value(s, r),
            (Source::Snapshot(s), CellVal::Val(&Val::Overflow { page, len })) => {
                super::value(s, ValRef::Overflow { page, len })
            }
            (Source::Snapshot(s), CellVal::Val(&Val::Packed { page, off, len })) => {
                super::value(s, ValRef::Packed { page, off, len })
            }
            (Source::Txn(t), CellVal::Ref(ValRef::Overflow { page, len }))
            | (Source::Txn(t), CellVal::Val(&Val::Overflow { page, len })) => {
                t.tree_overflow(page, len)
            }
            (Source::Txn(t), CellVal::Ref(ValRef::Packed { page, off, len }))
            | (Source::Txn(t), CellVal::Val(&Val::Packed { page, off, len })) => {
                t.tree_packed(page, off, len)
            }
        }
    }
}

/// One level of a cursor: a node and the position in it. In a branch, `i` is the child the
/// cursor is under. In a leaf, the front cursor's `i` is the next cell to yield; the back
/// cursor's `i` is the number of cells still to yield (the next is `i - 1`).
#[derive(Clone, Copy)]
struct Level<'a> {
    node: NodeRef<'a>,
    page: u64,
    i: usize,
}

fn as_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(k) => Bound::Included(k.as_slice()),
        Bound::Excluded(k) => Bound::Excluded(k.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

/// True when `key` sorts after the upper bound `end`.
pub(crate) fn past_end(key: &[u8], end: Bound<&[u8]>) -> bool {
    match end {
        Bound::Unbounded => false,
        Bound::Included(e) => key > e,
        Bound::Excluded(e) => key >= e,
    }
}

/// True when `key` sorts before the lower bound `start`.
pub(crate) fn before_start(key: &[u8], start: Bound<&[u8]>) -> bool {
    match start {
        Bound::Unbounded => false,
        Bound::Included(s) => key < s,
        Bound::Excluded(s) => key <= s,
    }
}

/// An ordered cursor over the entries of a tree whose keys fall in a range, as `(key, value)`
/// slices borrowed from the snapshot or the write transaction (no copy).
///
/// A `DoubleEndedIterator`: `.next()` walks forwards from the lower bound, `.next_back()` (and
/// `.rev()`) backwards from the upper bound, each a cursor of its own (a stack of the nodes from
/// the root to its leaf); the two stop where they meet, so every entry is yielded once. Each
/// step reads at most one new leaf and the branches above it: O(1) amortized, O(depth) at worst;
/// nothing is buffered. The back cursor descends on the first `next_back`.
///
/// Errors: corruption met while stepping comes as one `Err` item, after which the iterator ends
/// (from both ends).
pub(crate) struct TreeRange<'a> {
    src: Source<'a>,
    start: Bound<Vec<u8>>,
    end: Bound<Vec<u8>>,
    front: Vec<Level<'a>>,
    back: Vec<Level<'a>>,
    back_started: bool,
    /// The last keys yielded from each end: the other end stops before them.
    front_last: Option<&'a [u8]>,
    back_last: Option<&'a [u8]>,
    done: bool,
}

impl std::fmt::Debug for TreeRange<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Range")
            .field("start", &self.start)
            .field("end", &self.end)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl<'a> TreeRange<'a> {
    /// A cursor over `[start, end]` of `src`, its front end positioned (one descent from the
    /// root). Errors: corruption met on that descent.
    pub(crate) fn new(
        src: Source<'a>,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
    ) -> Result<TreeRange<'a>> {
        let mut r = TreeRange {
            src,
            start: start.map(<[u8]>::to_vec),
            end: end.map(<[u8]>::to_vec),
            front: Vec::new(),
            back: Vec::new(),
            back_started: false,
            front_last: None,
            back_last: None,
            done: src.root() == 0,
        };
        if !r.done {
            let mut front = Vec::new();
            seek(src, &mut front, as_ref(&r.start), true)?;
            r.front = front;
        }
        Ok(r)
    }

    fn step_front(&mut self) -> Result<Option<(&'a [u8], &'a [u8])>> {
        loop {
            let Some(l) = self.front.last_mut() else {
                return Ok(None);
            };
            if l.i < l.node.len() {
                let (k, v) = l
                    .node
                    .cell(l.i)
                    .ok_or_else(|| self.src.corrupt(l.page, "malformed leaf cell"))?;
                l.i += 1;
                if past_end(k, as_ref(&self.end)) || self.back_last.is_some_and(|b| k >= b) {
                    return Ok(None);
                }
                let v = self.src.value(v)?;
                self.front_last = Some(k);
                return Ok(Some((k, v)));
            }
            if !next_leaf(self.src, &mut self.front, true)? {
                return Ok(None);
            }
        }
    }

    fn step_back(&mut self) -> Result<Option<(&'a [u8], &'a [u8])>> {
        if !self.back_started {
            self.back_started = true;
            let mut back = Vec::new();
            seek(self.src, &mut back, as_ref(&self.end), false)?;
            self.back = back;
        }
        loop {
            let Some(l) = self.back.last_mut() else {
                return Ok(None);
            };
            if l.i > 0 {
                let (k, v) = l
                    .node
                    .cell(l.i - 1)
                    .ok_or_else(|| self.src.corrupt(l.page, "malformed leaf cell"))?;
                l.i -= 1;
                if before_start(k, as_ref(&self.start)) || self.front_last.is_some_and(|f| k <= f) {
                    return Ok(None);
                }
                let v = self.src.value(v)?;
                self.back_last = Some(k);
                return Ok(Some((k, v)));
            }
            if !next_leaf(self.src, &mut self.back, false)? {
                return Ok(None);
            }
        }
    }

    fn finish(
        &mut self,
        r: Result<Option<(&'a [u8], &'a [u8])>>,
    ) -> Option<<Self as Iterator>::Item> {
        match r {
            Ok(Some(kv)) => Some(Ok(kv)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// Positions a cursor: descends from the root towards `bound` (the lower bound going
/// forwards, the upper bound going backwards), leaving `stack` at a leaf.
fn seek<'a>(
    src: Source<'a>,
    stack: &mut Vec<Level<'a>>,
    bound: Bound<&[u8]>,
    forward: bool,
) -> Result<()> {
    stack.clear();
    let mut p = src.root();
    if p == 0 {
        return Ok(());
    }
    loop {
        if stack.len() >= MAX_DEPTH {
            return Err(src.corrupt(p, "tree deeper than 32 levels"));
        }
        let node = src.node(p)?;
        if node.is_leaf() {
            let i = match bound {
                Bound::Unbounded if forward => 0,
                Bound::Unbounded => node.len(),
                Bound::Included(k) | Bound::Excluded(k) => {
                    let s = node
                        .search(k)
                        .ok_or_else(|| src.corrupt(p, "malformed leaf page"))?;
                    match (s, matches!(bound, Bound::Included(_)), forward) {
                        // Forwards: the first key >= (or >) the bound.
                        (Ok(i), false, true) => i + 1,
                        // Backwards: the count of keys <= (or <) the bound.
                        (Ok(i), true, false) => i + 1,
                        (Ok(i) | Err(i), _, _) => i,
                    }
                }
            };
            stack.push(Level { node, page: p, i });
            return Ok(());
        }
        let i = match bound {
            Bound::Unbounded if forward => 0,
            Bound::Unbounded => node.len(),
            Bound::Included(k) | Bound::Excluded(k) => node
                .child_index(k)
                .ok_or_else(|| src.corrupt(p, "malformed branch page"))?,
        };
        let c = node
            .child(i)
            .ok_or_else(|| src.corrupt(p, "malformed branch page"))?;
        stack.push(Level { node, page: p, i });
        p = c;
    }
}

/// Moves a cursor to the next leaf in its direction: pops the exhausted levels, steps to the
/// sibling child, and descends to its first (forwards) or last (backwards) leaf. Returns false
/// at the end of the tree.
fn next_leaf<'a>(src: Source<'a>, stack: &mut Vec<Level<'a>>, forward: bool) -> Result<bool> {
    stack.pop();
    let mut p = loop {
        let Some(top) = stack.last_mut() else {
            return Ok(false);
        };
        let more = if forward {
            top.i < top.node.len()
        } else {
            top.i > 0
        };
        if more {
            if forward {
                top.i += 1;
            } else {
                top.i -= 1;
            }
            break top
                .node
                .child(top.i)
                .ok_or_else(|| src.corrupt(top.page, "malformed branch page"))?;
        }
        stack.pop();
    };
    loop {
        if stack.len() >= MAX_DEPTH {
            return Err(src.corrupt(p, "tree deeper than 32 levels"));
        }
        let node = src.node(p)?;
        let i = if forward { 0 } else { node.len() };
        stack.push(Level { node, page: p, i });
        if node.is_leaf() {
            return Ok(true);
        }
        p = node
            .child(i)
            .ok_or_else(|| src.corrupt(p, "malformed branch page"))?;
    }
}

impl<'a> Iterator for TreeRange<'a> {
    type Item = Result<(&'a [u8], &'a [u8])>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let r = self.step_front();
        self.finish(r)
    }
}

impl DoubleEndedIterator for TreeRange<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let r = self.step_back();
        self.finish(r)
    }
}

impl std::iter::FusedIterator for TreeRange<'_> {}

/// The smallest key greater than every key starting with `prefix` (None: no such key).
pub(crate) fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut e = prefix.to_vec();
    while let Some(last) = e.pop() {
        if last < 0xFF {
            e.push(last + 1);
            return Some(e);
        }
    }
    None
}
