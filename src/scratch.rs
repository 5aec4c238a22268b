//! The scratch table: page number -> the latest committed, unflushed image of that page, as a
//! persistent value that every [`crate::state::State`] holds (a snapshot reads the table of its
//! state while commits build newer ones).
//!
//! Shape: a persistent ordered map ([`PageMap`], the *base*) plus a short chain of the most
//! recent commits' changes (*recent*: newest first, each link one commit's puts and removals).
//! A commit adds one link (its few pages: no copy of anything shared); once the chain holds
//! [`MAX_DEPTH`] commits or [`MAX_CHANGES`] changes, the next commit folds it into a new base.
//!
//! Why: updating a persistent map copies the path to each changed key, and copying one of its
//! leaves clones every value in it, each an image reference count in another 8 KiB allocation
//! (a cache miss each), then as many decrements when the older version is dropped. With
//! one-put commits into an ordered map of 64 entries a node (`imbl::OrdMap`, before) that was a
//! third of a serial commit's CPU (a leaf, two branches and a bitmap page removed and
//! inserted, each on its own path; docs/BENCHMARKS.md, serial commits). Folding a chain of
//! commits copies each path once for all of them, and the base is a radix trie of page
//! numbers ([`PageMap`]: 16 slots a node, no key compared or stored), whose copied leaf clones
//! at most 16 references.
//!
//! Lookups: a 256-bit mask of every page the chain holds answers "not in the chain" for most
//! pages with one test, then the links are searched newest first (the first entry for a page
//! decides: an image, or `None` for a page removed since), then the base.

use std::sync::Arc;

/// A page image in the scratch table: written by `txn`, `image.len()` is a multiple of 8 KiB.
/// Stored inline in the table (cloning it is one reference-count increment).
#[derive(Debug, Clone)]
pub(crate) struct ScratchPage {
    pub txn: u64,
    pub image: crate::page::SharedImage,
}

/// Commits held in the chain at most before the next commit folds it into the base.
const MAX_DEPTH: u32 = 8;
/// Changes held in the chain at most (a large commit folds at once).
const MAX_CHANGES: usize = 64;

/// The ordered persistent map the base is.
pub(crate) type Base = PageMap;

/// Page number -> latest committed, unflushed image (module docs). Cloning is two reference
/// counts.
#[derive(Debug, Clone, Default)]
pub(crate) struct Scratch {
    base: Base,
    recent: Option<Arc<Recent>>,
    /// Pages in the table (base and chain merged).
    len: usize,
}

/// One commit's changes, and the older commits' chain.
#[derive(Debug)]
struct Recent {
    /// Page -> its image (`None`: removed), in the order applied (a later entry for the same
    /// page wins).
    changes: Vec<(u64, Option<ScratchPage>)>,
    older: Option<Arc<Recent>>,
    /// Commits in the chain from this one down.
    depth: u32,
    /// Changes in the chain from this one down.
    total: usize,
    /// Bit `bit(p)` set for every page of the chain from this one down.
    mask: [u64; 4],
}

/// The mask bit of page `p` (Fibonacci hashing into 256 bits).
fn bit(p: u64) -> (usize, u64) {
    let h = p.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56;
    ((h >> 6) as usize, 1u64 << (h & 63))
}

impl Recent {
    /// The chain's entry for `p`: `Some(Some(image))`, `Some(None)` when removed, `None` when
    /// the chain says nothing of it.
    fn find(&self, p: u64) -> Option<Option<&ScratchPage>> {
        let (w, b) = bit(p);
        if self.mask[w] & b == 0 {
            return None;
        }
        let mut link = Some(self);
        // Bounded by MAX_DEPTH links (a longer chain is folded).
        while let Some(r) = link {
            if let Some((_, sp)) = r.changes.iter().rev().find(|(q, _)| *q == p) {
                return Some(sp.as_ref());
            }
            link = r.older.as_deref();
        }
        None
    }
}

impl Scratch {
    /// An empty table.
    pub fn new() -> Scratch {
        Scratch::default()
    }

    /// The image of page `p`, if the table holds one.
    pub fn get(&self, p: &u64) -> Option<&ScratchPage> {
        if let Some(found) = self.recent.as_ref().and_then(|r| r.find(*p)) {
            return found;
        }
        self.base.get(p)
    }

    /// Whether the table holds page `p`.
    pub fn contains_key(&self, p: &u64) -> bool {
        self.get(p).is_some()
    }

    /// Pages in the table.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the table holds no page.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The table as one ordered map (the chain applied to the base; no copy when the chain is
    /// empty): for the flush's walk in page order and for ranges.
    pub fn folded(&self) -> Base {
        let mut base = self.base.clone();
        if let Some(r) = &self.recent {
            apply(&mut base, r);
        }
        base
    }

    /// The table holding exactly `base`'s pages (no chain).
    pub fn from_base(base: Base) -> Scratch {
        Scratch {
            len: base.len(),
            base,
            recent: None,
        }
    }

    /// Folds the chain into the base (the table's content is unchanged).
    fn fold(&mut self) {
        if let Some(r) = self.recent.take() {
            apply(&mut self.base, &r);
        }
    }

    /// Puts `sp` as page `p`'s image; returns the image it replaces.
    pub fn insert(&mut self, p: u64, sp: ScratchPage) -> Option<ScratchPage> {
        self.fold();
        let old = self.base.insert(p, sp);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    /// Removes page `p`; returns its image.
    pub fn remove(&mut self, p: &u64) -> Option<ScratchPage> {
        self.fold();
        let old = self.base.remove(p);
        if old.is_some() {
            self.len -= 1;
        }
        old
    }

    /// The table after one commit: the pages of `removed` taken out (those it holds), then
    /// `added` put in, in order. Returns it with the bytes of images it gained (negative when
    /// it lost more). Costs one link of the chain (no copy of the base), or a fold of the chain
    /// when it is full.
    pub fn with_commit(
        &self,
        removed: impl IntoIterator<Item = u64>,
        added: impl IntoIterator<Item = (u64, ScratchPage)>,
    ) -> (Scratch, i64) {
        let (removed, added) = (removed.into_iter(), added.into_iter());
        let mut changes = Changes {
            list: Vec::with_capacity(removed.size_hint().0 + added.size_hint().0),
            index: None,
        };
        let mut bytes = 0i64;
        let mut len = self.len;
        // The page's image length before this change: this commit's earlier changes first.
        let before = |changes: &Changes, p: u64| -> Option<u64> {
            match changes.latest(p) {
                Some(sp) => sp.map(|sp| sp.image.len() as u64),
                None => self.get(&p).map(|sp| sp.image.len() as u64),
            }
        };
        for p in removed {
            if let Some(old) = before(&changes, p) {
                bytes -= old as i64;
                len -= 1;
                changes.push(p, None);
            }
        }
        for (p, sp) in added {
            match before(&changes, p) {
                Some(old) => bytes -= old as i64,
                None => len += 1,
            }
            bytes += sp.image.len() as u64 as i64;
            changes.push(p, Some(sp));
        }
        let changes = changes.list;
        if changes.is_empty() {
            return (self.clone(), 0);
        }
        let (depth, total, mut mask) = match &self.recent {
            Some(r) => (r.depth, r.total, r.mask),
            None => (0, 0, [0; 4]),
        };
        for (p, _) in &changes {
            let (w, b) = bit(*p);
            mask[w] |= b;
        }
        let link = Arc::new(Recent {
            total: total + changes.len(),
            changes,
            older: self.recent.clone(),
            depth: depth + 1,
            mask,
        });
        let mut next = Scratch {
            base: self.base.clone(),
            recent: Some(link),
            len,
        };
        if depth + 1 >= MAX_DEPTH || next.recent.as_ref().is_some_and(|r| r.total > MAX_CHANGES) {
            next.fold();
        }
        (next, bytes)
    }
}

/// One commit's changes in order, and, once they are many, an index of each page's latest one.
///
/// Regression: every change looked for the page's earlier change in this commit by a linear
/// scan of the list, so a commit of k pages cost O(k^2) (9% of a compaction's profile at 29,000
/// pages moved; docs/BENCHMARKS.md, `compact`).
#[derive(Default)]
struct Changes {
    list: Vec<(u64, Option<ScratchPage>)>,
    /// Page -> position of its latest entry in `list`; built once `list` passes
    /// [`Changes::INDEX_FROM`] entries (a small commit scans and allocates nothing more).
    index: Option<std::collections::HashMap<u64, usize>>,
}

impl Changes {
    /// Entries from which the index is kept (a scan of fewer is cheaper than hashing).
    const INDEX_FROM: usize = 32;

    /// The latest change of page `p` in this commit: `Some(None)` removed, `Some(Some(_))`
    /// put, `None` unchanged so far.
    fn latest(&self, p: u64) -> Option<Option<&ScratchPage>> {
        let at = match &self.index {
            Some(ix) => ix.get(&p).copied(),
            None => self.list.iter().rposition(|(q, _)| *q == p),
        };
        at.map(|i| self.list[i].1.as_ref())
    }

    fn push(&mut self, p: u64, sp: Option<ScratchPage>) {
        self.list.push((p, sp));
        let last = self.list.len() - 1;
        match &mut self.index {
            Some(ix) => {
                ix.insert(p, last);
            }
            None if self.list.len() > Self::INDEX_FROM => {
                let ix = self
                    .list
                    .iter()
                    .enumerate()
                    .map(|(i, (q, _))| (*q, i))
                    .collect();
                self.index = Some(ix);
            }
            None => {}
        }
    }
}

/// Applies `r`'s chain to `base`: each page's newest entry only, in page order (a branch page
/// copied by one commit of the chain and freed by the next never reaches the base). The
/// base's nodes copied by the first change under them are its own for the next ones, which
/// edit them in place.
fn apply(base: &mut Base, r: &Recent) {
    let mut net: Vec<(u64, &Option<ScratchPage>)> = Vec::with_capacity(r.total);
    let mut link = Some(r);
    // Bounded by MAX_DEPTH links; newest first, so a stable sort keeps each page's newest
    // entry first among its equals.
    while let Some(l) = link {
        net.extend(l.changes.iter().rev().map(|(p, sp)| (*p, sp)));
        link = l.older.as_deref();
    }
    net.sort_by_key(|(p, _)| *p);
    net.dedup_by_key(|(p, _)| *p);
    for (p, sp) in net {
        match sp {
            Some(sp) => {
                base.insert(p, sp.clone());
            }
            // Copies nothing when the base does not hold the page.
            None => {
                base.remove(&p);
            }
        }
    }
}

/// Bits of a page number each level of a [`PageMap`] takes (16 slots a node).
const BITS: u32 = 4;
/// Slots in a node of a [`PageMap`].
const FAN: usize = 1 << BITS;

/// A persistent map from page number to [`ScratchPage`], specialised to page numbers: a radix
/// trie of 16 slots a node, as high as the largest page needs (`height` levels of branches
/// over the leaves). Cloning is one reference count; an insert or removal copies the nodes on
/// the page's path that another clone shares (a leaf's copy clones at most 16 image
/// references, a branch's 16 node references), and edits in place the nodes it already owns.
/// No key is stored or compared: a page's path is the digits of its number.
#[derive(Clone, Default)]
pub(crate) struct PageMap {
    root: Option<Arc<Node>>,
    /// Levels of branches above the leaves: the root covers pages below 16^(height + 1).
    height: u32,
    len: usize,
}

// A branch takes a leaf's size (392 bytes, not 136): branches are about a sixteenth of the
// nodes, and one node type keeps the walk a single `match` per level.
#[allow(clippy::large_enum_variant)]
#[derive(Clone)]
enum Node {
    Leaf([Option<ScratchPage>; FAN]),
    Branch([Option<Arc<Node>>; FAN]),
}

/// The slot of page `p` in a node whose slots are `1 << shift` pages apart.
fn digit(p: u64, shift: u32) -> usize {
    ((p >> shift) as usize) & (FAN - 1)
}

impl Node {
    fn empty_at(shift: u32) -> Node {
        if shift == 0 {
            Node::Leaf(Default::default())
        } else {
            Node::Branch(Default::default())
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Node::Leaf(e) => e.iter().all(Option::is_none),
            Node::Branch(c) => c.iter().all(Option::is_none),
        }
    }
}

impl std::fmt::Debug for PageMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PageMap({} pages)", self.len)
    }
}

impl PageMap {
    /// Pages in the map.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the root covers page `p`.
    fn covers(&self, p: u64) -> bool {
        let bits = BITS * (self.height + 1);
        bits >= 64 || p >> bits == 0
    }

    /// The image of page `p`, if the map holds one.
    pub fn get(&self, p: &u64) -> Option<&ScratchPage> {
        let p = *p;
        if !self.covers(p) {
            return None;
        }
        let mut node = self.root.as_deref()?;
        let mut shift = BITS * self.height;
        // Bounded by the height (at most 16 levels).
        loop {
            match node {
                Node::Branch(c) => {
                    node = c[digit(p, shift)].as_deref()?;
                    shift -= BITS;
                }
                Node::Leaf(e) => return e[digit(p, 0)].as_ref(),
            }
        }
    }

    /// Whether the map holds page `p`.
    pub fn contains_key(&self, p: &u64) -> bool {
        self.get(p).is_some()
    }

    /// Puts `sp` as page `p`'s image; returns the image it replaces.
    pub fn insert(&mut self, p: u64, sp: ScratchPage) -> Option<ScratchPage> {
        if self.root.is_none() {
            self.height = 0;
        }
        while self.root.is_some() && !self.covers(p) {
            let mut c: [Option<Arc<Node>>; FAN] = Default::default();
            c[0] = self.root.take();
            self.root = Some(Arc::new(Node::Branch(c)));
            self.height += 1;
        }
        if self.root.is_none() {
            while !self.covers(p) {
                self.height += 1;
            }
        }
        let mut shift = BITS * self.height;
        let mut slot = self
            .root
            .get_or_insert_with(|| Arc::new(Node::empty_at(shift)));
        // Bounded by the height.
        let old = loop {
            match Arc::make_mut(slot) {
                Node::Branch(c) => {
                    let d = digit(p, shift);
                    shift -= BITS;
                    slot = c[d].get_or_insert_with(|| Arc::new(Node::empty_at(shift)));
                }
                Node::Leaf(e) => break e[digit(p, 0)].replace(sp),
            }
        };
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    /// Removes page `p`; returns its image. Copies nothing when the map does not hold it.
    pub fn remove(&mut self, p: &u64) -> Option<ScratchPage> {
        if !self.contains_key(p) {
            return None;
        }
        let root = self.root.as_mut()?;
        let old = remove_in(root, *p, BITS * self.height);
        if old.is_some() {
            self.len -= 1;
        }
        if self.root.as_ref().is_some_and(|r| r.is_empty()) {
            self.root = None;
            self.height = 0;
        }
        old
    }

    /// The pages in order, with their images.
    pub fn iter(&self) -> Iter<'_> {
        self.range(0..u64::MAX)
    }

    /// The images in page order.
    pub fn values(&self) -> impl Iterator<Item = &ScratchPage> {
        self.iter().map(|(_, sp)| sp)
    }

    /// The pages in `r` in order, with their images.
    pub fn range(&self, r: std::ops::Range<u64>) -> Iter<'_> {
        let mut it = Iter {
            stack: Vec::new(),
            start: r.start,
            end: r.end,
        };
        if let Some(root) = self.root.as_deref() {
            if r.start < r.end && self.covers(r.start) {
                let shift = BITS * self.height;
                it.stack.push(Frame {
                    node: root,
                    next: digit(r.start, shift),
                    base: 0,
                    shift,
                });
            }
        }
        it
    }
}

/// Removes page `p` below `node` (whose slots are `1 << shift` pages apart), dropping the
/// nodes it leaves empty.
fn remove_in(node: &mut Arc<Node>, p: u64, shift: u32) -> Option<ScratchPage> {
    match Arc::make_mut(node) {
        Node::Leaf(e) => e[digit(p, 0)].take(),
        Node::Branch(c) => {
            let slot = &mut c[digit(p, shift)];
            let child = slot.as_mut()?;
            let old = remove_in(child, p, shift - BITS);
            if child.is_empty() {
                *slot = None;
            }
            old
        }
    }
}

/// A node being walked by an [`Iter`]: its next slot, its first page and the pages between its
/// slots (`1 << shift`).
struct Frame<'a> {
    node: &'a Node,
    next: usize,
    base: u64,
    shift: u32,
}

/// The pages of a [`PageMap`] from `start` (inclusive) to `end` (exclusive), in order.
pub(crate) struct Iter<'a> {
    stack: Vec<Frame<'a>>,
    start: u64,
    end: u64,
}

impl<'a> Iterator for Iter<'a> {
    type Item = (u64, &'a ScratchPage);

    fn next(&mut self) -> Option<(u64, &'a ScratchPage)> {
        // Bounded: each turn moves past one slot or pops one node.
        loop {
            let f = self.stack.last_mut()?;
            if f.next >= FAN {
                self.stack.pop();
                continue;
            }
            let i = f.next;
            f.next += 1;
            let first = f.base + ((i as u64) << f.shift);
            if first >= self.end {
                self.stack.clear();
                return None;
            }
            match f.node {
                Node::Leaf(e) => {
                    if let Some(sp) = &e[i] {
                        return Some((first, sp));
                    }
                }
                Node::Branch(c) => {
                    if let Some(child) = c[i].as_deref() {
                        let shift = f.shift - BITS;
                        // The child holding `start` starts at its digit; the later ones at 0.
                        let next = if self.start > first {
                            digit(self.start, shift)
                        } else {
                            0
                        };
                        self.stack.push(Frame {
                            node: child,
                            next,
                            base: first,
                            shift,
                        });
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};
    use std::collections::BTreeMap;

    fn page(txn: u64, pages: usize) -> ScratchPage {
        let mut img = vec![0u8; pages * crate::page::PAGE_SIZE];
        img[..8].copy_from_slice(&txn.to_le_bytes());
        ScratchPage {
            txn,
            image: crate::page::Image::copy_from(&img),
        }
    }

    fn same(s: &Scratch, m: &BTreeMap<u64, u64>) {
        assert_eq!(s.len(), m.len());
        let f = s.folded();
        let got: Vec<(u64, u64)> = f.iter().map(|(p, sp)| (p, sp.txn)).collect();
        let want: Vec<(u64, u64)> = m.iter().map(|(p, t)| (*p, *t)).collect();
        assert_eq!(got, want);
        for p in 0..200u64 {
            assert_eq!(s.get(&p).map(|sp| sp.txn), m.get(&p).copied(), "page {p}");
        }
    }

    /// Random commits (removals and puts, pages overlapping), folds and direct inserts and
    /// removals, against a `BTreeMap`; every older version kept unchanged (snapshots).
    #[test]
    fn commits_and_snapshots_match_a_model() {
        let mut rng = SmallRng::seed_from_u64(7);
        let mut s = Scratch::new();
        let mut m: BTreeMap<u64, u64> = BTreeMap::new();
        let mut bytes = 0i64;
        let mut kept: Vec<(Scratch, BTreeMap<u64, u64>)> = Vec::new();
        for txn in 1..2_000u64 {
            if rng.random_range(0..50) == 0 {
                // A direct change (as replay and the flush make).
                let p = rng.random_range(0..200);
                if rng.random() {
                    s.insert(p, page(txn, 1));
                    m.insert(p, txn);
                } else {
                    s.remove(&p);
                    m.remove(&p);
                }
                bytes = m.len() as i64 * crate::page::PAGE_SIZE as i64;
            } else {
                let removed: Vec<u64> = (0..rng.random_range(0..5))
                    .map(|_| rng.random_range(0..200))
                    .collect();
                let n = if rng.random_range(0..30) == 0 { 80 } else { 4 };
                let added: Vec<u64> = (0..rng.random_range(0..n))
                    .map(|_| rng.random_range(0..200))
                    .collect();
                let (next, gained) =
                    s.with_commit(removed.clone(), added.iter().map(|p| (*p, page(txn, 1))));
                for p in &removed {
                    m.remove(p);
                }
                for p in &added {
                    m.insert(*p, txn);
                }
                bytes += gained;
                assert_eq!(bytes, m.len() as i64 * crate::page::PAGE_SIZE as i64);
                s = next;
            }
            same(&s, &m);
            if txn % 97 == 0 {
                kept.push((s.clone(), m.clone()));
            }
        }
        for (s, m) in &kept {
            same(s, m);
        }
    }

    /// Random inserts and removals of pages near 0 and far apart (the trie grows and empties),
    /// against a `BTreeMap`: lookups, order, ranges from every kind of bound, and every clone
    /// kept unchanged by the later edits of another.
    #[test]
    fn page_map_matches_a_model() {
        let mut rng = SmallRng::seed_from_u64(11);
        let mut m = PageMap::default();
        let mut model: BTreeMap<u64, u64> = BTreeMap::new();
        let mut kept: Vec<(PageMap, BTreeMap<u64, u64>)> = Vec::new();
        let pick = |rng: &mut SmallRng| -> u64 {
            match rng.random_range(0..10) {
                0 => rng.random_range(0..u64::MAX / 2),
                1 => rng.random_range(0..1 << 20),
                _ => rng.random_range(0..300),
            }
        };
        for txn in 1..3_000u64 {
            let p = pick(&mut rng);
            if rng.random_range(0..3) == 0 {
                assert_eq!(m.remove(&p).map(|sp| sp.txn), model.remove(&p));
            } else {
                let old = m.insert(p, page(txn, 1)).map(|sp| sp.txn);
                assert_eq!(old, model.insert(p, txn));
            }
            assert_eq!(m.len(), model.len());
            if txn % 101 == 0 {
                kept.push((m.clone(), model.clone()));
            }
            if txn % 500 == 0 {
                // Empty it now and then (the root goes, the height starts again).
                for q in model.keys().copied().collect::<Vec<_>>() {
                    assert!(m.remove(&q).is_some());
                    model.remove(&q);
                }
                assert_eq!((m.len(), m.iter().count()), (0, 0));
            }
        }
        kept.push((m, model));
        for (m, model) in &kept {
            let got: Vec<(u64, u64)> = m.iter().map(|(p, sp)| (p, sp.txn)).collect();
            let want: Vec<(u64, u64)> = model.iter().map(|(p, t)| (*p, *t)).collect();
            assert_eq!(got, want);
            for (p, t) in model {
                assert_eq!(m.get(p).map(|sp| sp.txn), Some(*t));
            }
            for _ in 0..200 {
                let (a, b) = (pick(&mut rng), pick(&mut rng));
                let (a, b) = (a.min(b), a.max(b) + rng.random_range(0..3));
                assert!(!m.contains_key(&a) || model.contains_key(&a));
                let got: Vec<u64> = m.range(a..b).map(|(p, _)| p).collect();
                let want: Vec<u64> = model.range(a..b).map(|(p, _)| *p).collect();
                assert_eq!(got, want, "range {a}..{b}");
            }
        }
    }

    #[test]
    fn the_chain_is_bounded() {
        let mut s = Scratch::new();
        for txn in 1..100u64 {
            s = s.with_commit([txn - 1], [(txn, page(txn, 1))]).0;
            let depth = s.recent.as_ref().map_or(0, |r| r.depth);
            assert!(depth < MAX_DEPTH, "depth {depth}");
        }
        assert_eq!(s.len(), 1);
        assert_eq!(s.get(&99).map(|sp| sp.txn), Some(99));
    }
}
