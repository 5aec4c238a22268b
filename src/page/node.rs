//! B+tree node layouts: zero-copy views for readers and a decoded form for the writer.
//!
//! Leaf page (kind 3), `count` = cells:
//! ```text
//! 32: slot[0..count] u16 offsets of cells, in key order
//! ... free ...
//! cells, packed toward the end of the page:
//!   key_len u16 | flags u8 (0 inline, 1 overflow, 2 packed) | value_len u32
//!   | [overflow page u64 | packed: value page u64, offset u32] | key | [value]
//! ```
//! Branch page (kind 2), `count` = keys, `count + 1` children:
//! ```text
//! 32: leftmost child u64
//! 40: slot[0..count] u16 offsets of cells
//! cells: key_len u16 | child u64 | key
//! ```
//! Child `i + 1` holds the keys `>= key[i]`; the leftmost child the keys `< key[0]`.

use super::{rd_u16, rd_u32, rd_u64, wr_u16, wr_u32, wr_u64, PageHeader, PageKind};
use super::{BODY_LEN, HEADER_LEN, PAGE_SIZE};

/// Largest leaf cell stored inline (bytes, slot included: 4 of them always fit in one page).
pub const MAX_INLINE_CELL: usize = BODY_LEN / 4;
const LEAF_CELL_FIXED: usize = 2 + 1 + 4;
/// Bytes of a packed value's reference in its cell: value page u64, offset u32.
const PACKED_REF: usize = 8 + 4;
const BRANCH_CELL_FIXED: usize = 2 + 8;
const BRANCH_BODY_START: usize = HEADER_LEN + 8;

const _: () = assert!(MAX_INLINE_CELL * 4 <= BODY_LEN);
const _: () = assert!((BRANCH_CELL_FIXED + 2 + crate::MAX_KEY_LEN) * 4 <= BODY_LEN - 8);

/// A leaf value as stored: inline bytes, a reference to an overflow run, or a reference to a
/// value packed in a value page run shared with other values of the same leaf.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Val {
    /// The value bytes, in the leaf.
    Inline(Vec<u8>),
    /// The value lives in the overflow run starting at `page` (`len` bytes after its header).
    Overflow {
        /// First page of the run.
        page: u64,
        /// Value length in bytes.
        len: u64,
    },
    /// The value lives at byte `off` of the value page run starting at `page` (kind 7).
    Packed {
        /// First page of the value page run.
        page: u64,
        /// Byte offset of the value from the start of the run (at least the header's 32).
        off: u32,
        /// Value length in bytes.
        len: u64,
    },
}

impl Val {
    /// Bytes the value takes in its leaf cell after the fixed part (the key excluded).
    pub fn cell_bytes(&self) -> usize {
        match self {
            Val::Inline(v) => v.len(),
            Val::Overflow { .. } => 8,
            Val::Packed { .. } => PACKED_REF,
        }
    }

    /// The value as stored outside the leaf, without its inline bytes: what a writer frees.
    fn stub(v: ValRef<'_>) -> Val {
        match v {
            ValRef::Inline(_) => Val::Inline(Vec::new()),
            other => other.to_val(),
        }
    }
}

/// A leaf value as seen by a reader, borrowed from the page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValRef<'a> {
    /// Inline bytes.
    Inline(&'a [u8]),
    /// Overflow run `page`, `len` bytes.
    Overflow {
        /// First page of the run.
        page: u64,
        /// Value length in bytes.
        len: u64,
    },
    /// `len` bytes at byte `off` of value page run `page`.
    Packed {
        /// First page of the value page run.
        page: u64,
        /// Byte offset of the value from the start of the run.
        off: u32,
        /// Value length in bytes.
        len: u64,
    },
}

impl ValRef<'_> {
    /// The owned form.
    pub fn to_val(self) -> Val {
        match self {
            ValRef::Inline(b) => Val::Inline(b.to_vec()),
            ValRef::Overflow { page, len } => Val::Overflow { page, len },
            ValRef::Packed { page, off, len } => Val::Packed { page, off, len },
        }
    }
}

/// True when a key/value pair is stored inline in the leaf.
pub fn fits_inline(key_len: usize, value_len: usize) -> bool {
    2 + LEAF_CELL_FIXED + key_len + value_len <= MAX_INLINE_CELL
}

/// Most pages in one value page run (kind 7): 32 KiB.
pub const MAX_VALUE_RUN_PAGES: usize = 4;

/// Value bytes one value page run holds at most (its pages less the 32-byte header).
pub const VALUE_RUN_BODY: usize = MAX_VALUE_RUN_PAGES * PAGE_SIZE - HEADER_LEN;

/// Largest value packed into a value page run (bytes): three always fit one run. A value not
/// inline and at most this long is packed; a longer one takes an overflow run of its own.
pub const MAX_PACKED_VALUE: usize = VALUE_RUN_BODY / 3;

/// True when a key/value pair's value is packed into a value page run of its leaf (not inline,
/// at most [`MAX_PACKED_VALUE`] bytes).
pub fn packs(key_len: usize, value_len: usize) -> bool {
    !fits_inline(key_len, value_len) && value_len <= MAX_PACKED_VALUE
}

/// The packed cells of leaf image `page`: (cell index, value page, offset, length), in cell
/// order; `None` when the page is malformed.
pub fn leaf_packed_cells(page: &[u8]) -> Option<Vec<(usize, u64, u32, u64)>> {
    let h = PageHeader::read(page)?;
    if h.kind != PageKind::Leaf {
        return None;
    }
    let v = LeafView::new(page, &h);
    let mut out = Vec::new();
    for i in 0..v.len() {
        if let (_, ValRef::Packed { page, off, len }) = v.cell(i)? {
            out.push((i, page, off, len));
        }
    }
    Some(out)
}

/// Points packed cell `i` of a dirty leaf image at byte `off` of value page run `run` (the
/// value moved: same length, same cell size); returns the bytes written, or `None` when cell
/// `i` is not a packed cell of the page.
pub fn leaf_repoint(
    page: &mut [u8],
    i: usize,
    run: u64,
    off: u32,
) -> Option<std::ops::Range<usize>> {
    let h = PageHeader::read(page)?;
    if h.kind != PageKind::Leaf || i >= h.count as usize {
        return None;
    }
    let at = rd_u16(page, HEADER_LEN + 2 * i)? as usize;
    if *page.get(at + 2)? != 2 || at + LEAF_CELL_FIXED + PACKED_REF > page.len() {
        return None;
    }
    let f = at + LEAF_CELL_FIXED;
    wr_u64(page, f, run);
    wr_u32(page, f + 8, off);
    Some(f..f + PACKED_REF)
}

/// Builds a sealed value page run (kind 7) at `page_number` holding `body` right after its
/// header (values at the offsets their cells name, from 32 on).
pub fn encode_values(body: &[u8], page_number: u64, txn_id: u64) -> Box<[u8]> {
    encode_run(PageKind::Values, body, page_number, txn_id)
}

/// A sealed run of `kind` at `page_number`: its header, then `body`, then zeros to the last
/// of the pages `body` needs.
fn encode_run(kind: PageKind, body: &[u8], page_number: u64, txn_id: u64) -> Box<[u8]> {
    let pages = super::overflow_run_pages(body.len());
    let mut p = super::zeroed(pages);
    PageHeader {
        kind,
        count: 0,
        page_number,
        txn_id,
        run_pages: pages as u32,
        aux: 0,
    }
    .write(&mut p);
    p[HEADER_LEN..HEADER_LEN + body.len()].copy_from_slice(body);
    super::seal(&mut p);
    p
}

/// Zero-copy view of a leaf page. Accessors return `None` on malformed content.
#[derive(Clone, Copy)]
pub struct LeafView<'a> {
    page: &'a [u8],
    count: usize,
}

impl<'a> LeafView<'a> {
    /// Views `page` (header already checked to be a leaf).
    pub fn new(page: &'a [u8], h: &PageHeader) -> LeafView<'a> {
        LeafView {
            page,
            count: h.count as usize,
        }
    }

    /// Cells in the page.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Key and value of cell `i`.
    pub fn cell(&self, i: usize) -> Option<(&'a [u8], ValRef<'a>)> {
        if i >= self.count {
            return None;
        }
        let off = rd_u16(self.page, HEADER_LEN + 2 * i)? as usize;
        let klen = rd_u16(self.page, off)? as usize;
        let flags = *self.page.get(off + 2)?;
        let vlen = rd_u32(self.page, off + 3)? as usize;
        let mut at = off + LEAF_CELL_FIXED;
        let val = match flags {
            0 => {
                let kend = at.checked_add(klen)?;
                let v = self.page.get(kend..kend.checked_add(vlen)?)?;
                ValRef::Inline(v)
            }
            1 => {
                let p = rd_u64(self.page, at)?;
                at += 8;
                ValRef::Overflow {
                    page: p,
                    len: vlen as u64,
                }
            }
            2 => {
                let p = rd_u64(self.page, at)?;
                let off = rd_u32(self.page, at + 8)?;
                at += PACKED_REF;
                ValRef::Packed {
                    page: p,
                    off,
                    len: vlen as u64,
                }
            }
            _ => return None,
        };
        let key = self.page.get(at..at.checked_add(klen)?)?;
        Some((key, val))
    }

    /// Key of cell `i`.
    pub fn key(&self, i: usize) -> Option<&'a [u8]> {
        self.cell(i).map(|c| c.0)
    }

    /// Binary search: `Ok(Ok(i))` found at `i`, `Ok(Err(i))` insertion point.
    pub fn search(&self, key: &[u8]) -> Option<Result<usize, usize>> {
        let (mut lo, mut hi) = (0usize, self.count);
        while lo < hi {
            let mid = (lo + hi) / 2;
            match self.key(mid)?.cmp(key) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(Ok(mid)),
            }
        }
        Some(Err(lo))
    }
}

/// Zero-copy view of a branch page.
#[derive(Clone, Copy)]
pub struct BranchView<'a> {
    page: &'a [u8],
    count: usize,
}

impl<'a> BranchView<'a> {
    /// Views `page` (header already checked to be a branch).
    pub fn new(page: &'a [u8], h: &PageHeader) -> BranchView<'a> {
        BranchView {
            page,
            count: h.count as usize,
        }
    }

    /// Keys in the page (children = keys + 1).
    pub fn keys(&self) -> usize {
        self.count
    }

    /// Child `i` (0 = leftmost).
    pub fn child(&self, i: usize) -> Option<u64> {
        if i == 0 {
            return rd_u64(self.page, HEADER_LEN);
        }
        let off = rd_u16(self.page, BRANCH_BODY_START + 2 * (i - 1))? as usize;
        rd_u64(self.page, off + 2)
    }

    /// Key `i` (separator before child `i + 1`).
    pub fn key(&self, i: usize) -> Option<&'a [u8]> {
        if i >= self.count {
            return None;
        }
        let off = rd_u16(self.page, BRANCH_BODY_START + 2 * i)? as usize;
        let klen = rd_u16(self.page, off)? as usize;
        let at = off + BRANCH_CELL_FIXED;
        self.page.get(at..at.checked_add(klen)?)
    }

    /// Index of the child whose key range holds `key`.
    pub fn child_index(&self, key: &[u8]) -> Option<usize> {
        // Number of separators <= key.
        let (mut lo, mut hi) = (0usize, self.count);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.key(mid)? <= key {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        Some(lo)
    }
}

/// One decoded leaf entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafEntry {
    /// The key.
    pub key: Vec<u8>,
    /// The value.
    pub val: Val,
}

/// A decoded B+tree node, owned by a write transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    /// Leaf entries in key order.
    Leaf(Vec<LeafEntry>),
    /// Separators and children (`children.len() == keys.len() + 1`).
    Branch {
        /// Separator keys in order.
        keys: Vec<Vec<u8>>,
        /// Child page numbers.
        children: Vec<u64>,
    },
}

/// Bytes one leaf entry takes in a page (slot included).
pub fn leaf_entry_size(e: &LeafEntry) -> usize {
    2 + LEAF_CELL_FIXED + e.key.len() + e.val.cell_bytes()
}

/// Bytes one branch key takes (slot included).
pub fn branch_key_size(k: &[u8]) -> usize {
    2 + BRANCH_CELL_FIXED + k.len()
}

impl Node {
    /// Bytes the node needs in a page body (at most [`BODY_LEN`] to fit).
    pub fn body_size(&self) -> usize {
        match self {
            Node::Leaf(es) => es.iter().map(leaf_entry_size).sum(),
            Node::Branch { keys, .. } => 8 + keys.iter().map(|k| branch_key_size(k)).sum::<usize>(),
        }
    }

    /// True when the node fits in one page.
    pub fn fits(&self) -> bool {
        self.body_size() <= BODY_LEN
    }

    /// Decodes a checked leaf or branch page; `None` when it is malformed (cells out of
    /// bounds, keys empty or over 1,024 bytes, or a node that would not fit a page again).
    pub fn decode(page: &[u8], h: &PageHeader) -> Option<Node> {
        let n = Node::decode_unchecked(page, h)?;
        let keys_ok = match &n {
            Node::Leaf(es) => es
                .iter()
                .all(|e| !e.key.is_empty() && e.key.len() <= crate::MAX_KEY_LEN),
            Node::Branch { keys, .. } => keys
                .iter()
                .all(|k| !k.is_empty() && k.len() <= crate::MAX_KEY_LEN),
        };
        (keys_ok && n.fits()).then_some(n)
    }

    fn decode_unchecked(page: &[u8], h: &PageHeader) -> Option<Node> {
        match h.kind {
            PageKind::Leaf => {
                let v = LeafView::new(page, h);
                let mut es = Vec::with_capacity(v.len());
                for i in 0..v.len() {
                    let (k, val) = v.cell(i)?;
                    es.push(LeafEntry {
                        key: k.to_vec(),
                        val: val.to_val(),
                    });
                }
                Some(Node::Leaf(es))
            }
            PageKind::Branch => {
                let v = BranchView::new(page, h);
                let mut keys = Vec::with_capacity(v.keys());
                let mut children = Vec::with_capacity(v.keys() + 1);
                children.push(v.child(0)?);
                for i in 0..v.keys() {
                    keys.push(v.key(i)?.to_vec());
                    children.push(v.child(i + 1)?);
                }
                Some(Node::Branch { keys, children })
            }
            _ => None,
        }
    }

    /// Encodes into a fresh page image for `page_number`, written by `txn_id`, sealed: cells
    /// packed toward the end of the page in key order.
    ///
    /// Panics if the node does not fit (the writer splits before encoding: an invariant).
    pub fn encode(&self, page_number: u64, txn_id: u64) -> Box<[u8]> {
        assert!(
            self.fits(),
            "node of {} bytes does not fit a page",
            self.body_size()
        );
        let mut p = super::zeroed(1);
        let placed = self.place(&mut p, None, page_number, txn_id);
        debug_assert!(placed, "a node that fits always packs into an empty page");
        super::seal(&mut p);
        p
    }

    /// Encodes the node as an edit of `base`, the image of the page it was copied from
    /// (same kind): every cell whose key is in `base` with a cell of the same size keeps its
    /// offset, new cells take the free gap below the lowest kept cell, and the slot array is
    /// rewritten. So the image differs from `base` only in the header, the slots from the first
    /// changed position on, and the new or changed cells: the journal stores that difference
    /// (`journal::record`, page diffs) instead of 8 KiB. Cells of removed entries stay behind
    /// as unreferenced bytes until the page is next packed.
    ///
    /// Falls back to [`Node::encode`] (packed) when the gap is too small or `base` is not a
    /// node page of the same kind. Panics if the node does not fit (as `encode`).
    pub fn encode_on(&self, base: &[u8], page_number: u64, txn_id: u64) -> Box<[u8]> {
        let mut p: Box<[u8]> = base.into();
        if base.len() == PAGE_SIZE && self.place(&mut p, Some(base), page_number, txn_id) {
            super::seal(&mut p);
            return p;
        }
        self.encode(page_number, txn_id)
    }

    /// [`Node::encode_on`] into `p`, a page that holds a copy of `base` (or zeros, when
    /// `base` is `None`), without sealing it (the writer seals at commit): no allocation.
    /// Panics if the node does not fit (as `encode`).
    pub fn encode_unsealed_into(
        &self,
        p: &mut [u8],
        base: Option<&[u8]>,
        page_number: u64,
        txn_id: u64,
    ) {
        assert!(
            self.fits() && p.len() == PAGE_SIZE,
            "node of {} bytes does not fit a page",
            self.body_size()
        );
        if let Some(b) = base {
            if b.len() == PAGE_SIZE && self.place(p, Some(b), page_number, txn_id) {
                return;
            }
            p.fill(0);
        }
        let placed = self.place(p, None, page_number, txn_id);
        debug_assert!(placed, "a node that fits always packs into an empty page");
    }

    /// Lays the node out in `p` (a zeroed page, or a copy of `base`) and writes its header
    /// (not the checksum). Returns false, with `p` partly written, when the cells do not fit around the
    /// cells kept from `base`.
    fn place(&self, p: &mut [u8], base: Option<&[u8]>, page_number: u64, txn_id: u64) -> bool {
        let base_h = base.and_then(PageHeader::read);
        let (kind, count, slots_at) = match self {
            Node::Leaf(es) => (PageKind::Leaf, es.len(), HEADER_LEN),
            Node::Branch { keys, .. } => (PageKind::Branch, keys.len(), BRANCH_BODY_START),
        };
        let base = match (base, base_h) {
            (Some(b), Some(h)) if h.kind == kind => Some((b, h)),
            (Some(_), _) => return false,
            _ => None,
        };
        // Offsets of the cells kept from `base` (same key, same cell size), in entry order.
        let mut offs: Vec<Option<usize>> = vec![None; count];
        let mut low = PAGE_SIZE;
        if let Some((b, h)) = base {
            let mut j = 0;
            let base_count = h.count as usize;
            for (i, off) in offs.iter_mut().enumerate() {
                let (key, size) = self.cell_shape(i);
                // Both sides are in key order: a merge walk, bounded by the two counts.
                while j < base_count {
                    let Some((bk, bsize, boff)) = base_cell(b, &h, j) else {
                        return false;
                    };
                    match bk.cmp(key) {
                        std::cmp::Ordering::Less => j += 1,
                        std::cmp::Ordering::Equal => {
                            if bsize == size {
                                *off = Some(boff);
                                low = low.min(boff);
                            }
                            j += 1;
                            break;
                        }
                        std::cmp::Ordering::Greater => break,
                    }
                }
            }
        }
        let slot_end = slots_at + 2 * count;
        let mut end = low;
        for (i, off) in offs.iter_mut().enumerate() {
            if off.is_none() {
                let size = self.cell_shape(i).1;
                if end < slot_end + size {
                    return false;
                }
                end -= size;
                *off = Some(end);
            }
        }
        if end < slot_end {
            return false;
        }
        for (i, off) in offs.iter().enumerate() {
            let Some(off) = *off else { return false };
            debug_assert!(off >= slot_end && off + self.cell_shape(i).1 <= PAGE_SIZE);
            wr_u16(p, slots_at + 2 * i, off as u16);
            self.write_cell(p, i, off);
        }
        if let Node::Branch { children, .. } = self {
            wr_u64(p, HEADER_LEN, children[0]);
        }
        PageHeader {
            kind,
            count: count as u16,
            page_number,
            txn_id,
            run_pages: 1,
            aux: 0,
        }
        .write(p);
        true
    }

    /// Key and cell size (bytes, slot excluded) of entry `i`.
    fn cell_shape(&self, i: usize) -> (&[u8], usize) {
        match self {
            Node::Leaf(es) => {
                let e = &es[i];
                (&e.key, leaf_entry_size(e) - 2)
            }
            Node::Branch { keys, .. } => (&keys[i], branch_key_size(&keys[i]) - 2),
        }
    }

    /// Writes the cell of entry `i` at byte `off`.
    fn write_cell(&self, p: &mut [u8], i: usize, off: usize) {
        match self {
            Node::Leaf(es) => write_leaf_cell(p, off, &es[i].key, &es[i].val),
            Node::Branch { keys, children } => {
                let k = &keys[i];
                wr_u16(p, off, k.len() as u16);
                wr_u64(p, off + 2, children[i + 1]);
                p[off + BRANCH_CELL_FIXED..off + BRANCH_CELL_FIXED + k.len()].copy_from_slice(k);
            }
        }
    }
}

/// Why an in-place edit of a page image did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EditError {
    /// The cell does not fit in the page's free gap: decode the page and edit the node.
    NoRoom,
    /// The page is malformed.
    Malformed,
}

/// Bytes of page body a checked leaf or branch page's live cells take (slots included, as
/// [`Node::body_size`]); `None` when malformed.
pub fn page_body_size(page: &[u8], h: &PageHeader) -> Option<usize> {
    let mut total = if h.kind == PageKind::Branch { 8 } else { 0 };
    for j in 0..h.count as usize {
        total += 2 + base_cell(page, h, j)?.1;
    }
    Some(total)
}

/// Lowest cell offset of a leaf or branch page (the end of its free gap).
fn lowest_cell(page: &[u8], slots_at: usize, count: usize) -> Option<usize> {
    let mut low = PAGE_SIZE;
    for j in 0..count {
        low = low.min(rd_u16(page, slots_at + 2 * j)? as usize);
    }
    Some(low)
}

/// Byte ranges of a page image that one in-place edit wrote (some may be empty): the edit's
/// journal diff is these ranges plus the page header, found without comparing the page with
/// its base.
pub type Touched = [std::ops::Range<usize>; 3];

/// Inserts or replaces `key` with `val` in a dirty leaf image without decoding it (the
/// writer's fast path): a same-size replacement is written over the old cell, anything else
/// takes the free gap below the lowest cell, and the slot array shifts by one slot. The header
/// count is updated; the checksum is not (the image is sealed at commit). Returns the old value
/// (`Val::Inline` of no bytes for an inline one: only overflow values need freeing) and the
/// byte ranges written besides the header.
pub fn leaf_put_in_place(
    page: &mut [u8],
    key: &[u8],
    val: &Val,
) -> Result<(Option<Val>, Touched), EditError> {
    let h = PageHeader::read(page).ok_or(EditError::Malformed)?;
    if h.kind != PageKind::Leaf {
        return Err(EditError::Malformed);
    }
    let count = h.count as usize;
    let view = LeafView::new(page, &h);
    let found = view.search(key).ok_or(EditError::Malformed)?;
    let size = LEAF_CELL_FIXED + key.len() + val.cell_bytes();
    let low = lowest_cell(page, HEADER_LEN, count).ok_or(EditError::Malformed)?;
    let (old, off, i, slots) = match found {
        Ok(i) => {
            let (_, v) = view.cell(i).ok_or(EditError::Malformed)?;
            let (_, old_size, old_off) = base_cell(page, &h, i).ok_or(EditError::Malformed)?;
            let old = Val::stub(v);
            let off = if old_size == size {
                old_off
            } else if low >= HEADER_LEN + 2 * count + size {
                low - size
            } else {
                return Err(EditError::NoRoom);
            };
            (
                Some(old),
                off,
                i,
                HEADER_LEN + 2 * i..HEADER_LEN + 2 * i + 2,
            )
        }
        Err(i) => {
            if low < HEADER_LEN + 2 * (count + 1) + size {
                return Err(EditError::NoRoom);
            }
            let slots = HEADER_LEN + 2 * i..HEADER_LEN + 2 * count;
            page.copy_within(slots, HEADER_LEN + 2 * i + 2);
            wr_u16(page, 6, (count + 1) as u16);
            (
                None,
                low - size,
                i,
                HEADER_LEN + 2 * i..HEADER_LEN + 2 * (count + 1),
            )
        }
    };
    wr_u16(page, HEADER_LEN + 2 * i, off as u16);
    write_leaf_cell(page, off, key, val);
    // The count lives in the header, which every diff carries.
    Ok((old, [slots, off..off + size, 0..0]))
}

/// Removes `key` from a dirty leaf image without decoding it (the writer's fast path for
/// deletes): its slot leaves the slot array (the slots after it shift down one) and its cell
/// and the vacated last slot are zeroed, so a cell at the bottom of the gap widens the free
/// gap's zero run; a cell elsewhere leaves a zeroed hole that a later re-pack reclaims
/// ([`LeafCells`]), as a replacement of another size does. The header count is updated; the
/// checksum is not (the image is sealed at commit). Returns the old value (`Val::Inline` of no
/// bytes for an inline one: only overflow values need freeing) and the byte ranges written
/// besides the header, or `None` for the value when the key is absent (nothing written).
pub fn leaf_delete_in_place(
    page: &mut [u8],
    key: &[u8],
) -> Result<(Option<Val>, Touched), EditError> {
    let h = PageHeader::read(page).ok_or(EditError::Malformed)?;
    if h.kind != PageKind::Leaf {
        return Err(EditError::Malformed);
    }
    let count = h.count as usize;
    let view = LeafView::new(page, &h);
    let Ok(i) = view.search(key).ok_or(EditError::Malformed)? else {
        return Ok((None, [0..0, 0..0, 0..0]));
    };
    let (_, v) = view.cell(i).ok_or(EditError::Malformed)?;
    let old = Val::stub(v);
    let (_, size, off) = base_cell(page, &h, i).ok_or(EditError::Malformed)?;
    if off + size > PAGE_SIZE || HEADER_LEN + 2 * count > PAGE_SIZE {
        return Err(EditError::Malformed);
    }
    let slots = HEADER_LEN + 2 * i..HEADER_LEN + 2 * count;
    page.copy_within(
        HEADER_LEN + 2 * (i + 1)..HEADER_LEN + 2 * count,
        HEADER_LEN + 2 * i,
    );
    page[HEADER_LEN + 2 * (count - 1)..HEADER_LEN + 2 * count].fill(0);
    page[off..off + size].fill(0);
    wr_u16(page, 6, (count - 1) as u16);
    Ok((Some(old), [slots, off..off + size, 0..0]))
}

/// Where the leaf split rule puts the first entry of the right half, for `n >= 2` entries of
/// the given sizes in key order (bytes with the slot, as [`leaf_entry_size`]): the entry after
/// the first one at which half of all bytes is reached, clamped to `1..n` so neither half is
/// empty. Both the decoded path (`WriteTransaction::split`) and the page-form path
/// ([`LeafCells::split_point`]) use it, so both build the same tree. For `n < 2`, returns `n`.
pub fn leaf_split_point(sizes: impl Iterator<Item = usize> + Clone, n: usize) -> usize {
    if n < 2 {
        return n;
    }
    let total: usize = sizes.clone().sum();
    let mut acc = 0;
    for (i, s) in sizes.enumerate() {
        acc += s;
        if acc >= total / 2 {
            return (i + 1).clamp(1, n - 1);
        }
    }
    n - 1
}

/// One cell of a leaf being laid out again ([`LeafCells`]): its offset in the source image
/// (0 for the new cell, which is not in the source), its size in bytes (slot excluded), and the
/// offset chosen for it in the destination (0 until chosen).
#[derive(Debug, Clone, Copy)]
struct CellAt {
    src: u16,
    size: u16,
    dst: u16,
}

/// The cells of a leaf page that has no room in its free gap for a put, with the put applied,
/// read from the page's cell table without decoding the entries (no allocation per entry): the
/// writer re-packs such a leaf ([`LeafCells::write`] of every cell) when they fit one page, and
/// splits it (two `write`s, around [`LeafCells::split_point`]) when they do not. Cells are
/// copied byte for byte from the source image; only the new cell is encoded.
///
/// One `LeafCells` is scratch reused by a write transaction: [`LeafCells::load`] clears it, and
/// its table keeps its capacity (at most one entry per cell a page can hold, about 800).
#[derive(Debug, Default)]
pub struct LeafCells {
    cells: Vec<CellAt>,
    /// Bytes of page body the cells take, slots included.
    total: usize,
    /// Size of the new cell (slot excluded).
    new_size: usize,
}

impl LeafCells {
    /// Reads the cell table of leaf image `page` with `key` put to `val`: the new cell goes in
    /// at its key's position, or replaces the cell with the same key. Returns the replaced
    /// value as [`leaf_put_in_place`] does (`Val::Inline` of no bytes for an inline one: only
    /// overflow values need freeing), or `None` for an insert.
    ///
    /// Errors: [`EditError::Malformed`] when `page` is not a leaf, a cell lies outside the page
    /// or over the slot array, or a key is empty or over [`crate::MAX_KEY_LEN`] bytes (what
    /// [`Node::decode`] rejects), or its slot array passes the end of the page.
    pub fn load(&mut self, page: &[u8], key: &[u8], val: &Val) -> Result<Option<Val>, EditError> {
        self.cells.clear();
        self.total = 0;
        let h = PageHeader::read(page).ok_or(EditError::Malformed)?;
        let count = h.count as usize;
        if h.kind != PageKind::Leaf
            || page.len() != PAGE_SIZE
            || HEADER_LEN + 2 * count > PAGE_SIZE
            || key.is_empty()
            || key.len() > crate::MAX_KEY_LEN
        {
            return Err(EditError::Malformed);
        }
        let found = LeafView::new(page, &h)
            .search(key)
            .ok_or(EditError::Malformed)?;
        self.new_size = LEAF_CELL_FIXED + key.len() + val.cell_bytes();
        if self.new_size > BODY_LEN - 2 {
            return Err(EditError::Malformed);
        }
        let new = CellAt {
            src: 0,
            size: self.new_size as u16,
            dst: 0,
        };
        let mut old = None;
        self.cells.reserve(count + 1);
        let slot_end = HEADER_LEN + 2 * count;
        for j in 0..count {
            let (k, size, off) = base_cell(page, &h, j).ok_or(EditError::Malformed)?;
            if k.is_empty() || k.len() > crate::MAX_KEY_LEN || off < slot_end {
                return Err(EditError::Malformed);
            }
            match found {
                Ok(i) if i == j => {
                    let (_, v) = LeafView::new(page, &h)
                        .cell(j)
                        .ok_or(EditError::Malformed)?;
                    old = Some(Val::stub(v));
                    self.cells.push(new);
                    self.total += 2 + self.new_size;
                    continue;
                }
                Err(i) if i == j => {
                    self.cells.push(new);
                    self.total += 2 + self.new_size;
                }
                _ => {}
            }
            self.cells.push(CellAt {
                src: off as u16,
                size: size as u16,
                dst: 0,
            });
            self.total += 2 + size;
        }
        if found == Err(count) {
            self.cells.push(new);
            self.total += 2 + self.new_size;
        }
        Ok(old)
    }

    /// Cells loaded (the page's, with the put applied).
    pub fn len(&self) -> usize {
        self.cells.len()
    }

    /// Bytes of page body the cells `range` take, slots included (as [`Node::body_size`]);
    /// `None` when `range` is out of bounds.
    pub fn body_size(&self, range: std::ops::Range<usize>) -> Option<usize> {
        if range.start == 0 && range.end == self.cells.len() {
            return Some(self.total);
        }
        Some(
            self.cells
                .get(range)?
                .iter()
                .map(|c| 2 + c.size as usize)
                .sum(),
        )
    }

    /// The first cell of the right half of a split, by [`leaf_split_point`] (today's rule: half
    /// the bytes on each side).
    pub fn split_point(&self) -> usize {
        leaf_split_point(
            self.cells.iter().map(|c| 2 + c.size as usize),
            self.cells.len(),
        )
    }

    /// The key of cell `i`: read from `src` (the image the cells were loaded from), or `key`
    /// for the new cell. `None` when `i` is out of bounds or `src` is malformed there.
    pub fn key<'a>(&self, i: usize, src: &'a [u8], key: &'a [u8]) -> Option<&'a [u8]> {
        let c = self.cells.get(i)?;
        if c.src == 0 {
            return Some(key);
        }
        cell_key(src, c.src as usize)
    }

    /// Lays cells `range` out as a leaf page `page_number` written by `txn_id` into `dst`, as
    /// [`Node::encode_unsealed_into`] would lay out the decoded entries: `dst` holds a copy of
    /// `base` (the image the page was copied from, for a small journal diff) or zeros when
    /// `base` is `None`; every cell whose key is in `base` with a cell of the same size takes
    /// that cell's offset, the others are packed below the lowest of those, in key order. Cell
    /// bytes are copied from `src` (the image the cells were loaded from); the new cell is
    /// encoded from `key` and `val`. The header is written, the checksum is not (the writer
    /// seals at commit).
    ///
    /// Returns `Ok(false)`, with `dst` partly written, when the cells do not fit around the cells
    /// kept from `base` (or `base` is not a leaf): zero `dst` and lay them out again without a
    /// base, which always fits when [`LeafCells::body_size`] of `range` is at most
    /// [`BODY_LEN`]. Errors: [`EditError::Malformed`] when `range` is out of bounds, `src`,
    /// `dst` or `base` is not a page, a cell of `src` or `base` is malformed, or the cells do not
    /// fit a page.
    #[allow(clippy::too_many_arguments)]
    pub fn write(
        &mut self,
        range: std::ops::Range<usize>,
        src: &[u8],
        key: &[u8],
        val: &Val,
        dst: &mut [u8],
        base: Option<&[u8]>,
        page_number: u64,
        txn_id: u64,
    ) -> Result<bool, EditError> {
        if src.len() != PAGE_SIZE || dst.len() != PAGE_SIZE {
            return Err(EditError::Malformed);
        }
        if self.body_size(range.clone()).ok_or(EditError::Malformed)? > BODY_LEN {
            return Err(EditError::Malformed);
        }
        let cells = &mut self.cells[range];
        let count = cells.len();
        let mut low = PAGE_SIZE;
        for c in cells.iter_mut() {
            c.dst = 0;
        }
        if let Some(b) = base {
            let Some(bh) = PageHeader::read(b).filter(|h| h.kind == PageKind::Leaf) else {
                return Ok(false);
            };
            if b.len() != PAGE_SIZE {
                return Ok(false);
            }
            // Both sides are in key order: a merge walk, bounded by the two counts (as
            // `Node::place`).
            let mut j = 0;
            let base_count = bh.count as usize;
            for c in cells.iter_mut() {
                let k = if c.src == 0 {
                    key
                } else {
                    cell_key(src, c.src as usize).ok_or(EditError::Malformed)?
                };
                while j < base_count {
                    let (bk, bsize, boff) = base_cell(b, &bh, j).ok_or(EditError::Malformed)?;
                    match bk.cmp(k) {
                        std::cmp::Ordering::Less => j += 1,
                        std::cmp::Ordering::Equal => {
                            if bsize == c.size as usize {
                                c.dst = boff as u16;
                                low = low.min(boff);
                            }
                            j += 1;
                            break;
                        }
                        std::cmp::Ordering::Greater => break,
                    }
                }
            }
        }
        let slot_end = HEADER_LEN + 2 * count;
        let mut end = low;
        for c in cells.iter_mut().filter(|c| c.dst == 0) {
            let size = c.size as usize;
            if end < slot_end + size {
                return Ok(false);
            }
            end -= size;
            c.dst = end as u16;
        }
        if end < slot_end {
            return Ok(false);
        }
        for (i, c) in cells.iter().enumerate() {
            let (d, size) = (c.dst as usize, c.size as usize);
            if d < slot_end || d + size > PAGE_SIZE {
                return Err(EditError::Malformed);
            }
            wr_u16(dst, HEADER_LEN + 2 * i, c.dst);
            if c.src == 0 {
                write_leaf_cell(dst, d, key, val);
            } else {
                let s = c.src as usize;
                let from = src.get(s..s + size).ok_or(EditError::Malformed)?;
                dst[d..d + size].copy_from_slice(from);
            }
        }
        PageHeader {
            kind: PageKind::Leaf,
            count: count as u16,
            page_number,
            txn_id,
            run_pages: 1,
            aux: 0,
        }
        .write(dst);
        Ok(true)
    }
}

/// The key of the leaf cell at byte `off` of `page`; `None` when it does not lie in the page.
fn cell_key(page: &[u8], off: usize) -> Option<&[u8]> {
    let klen = rd_u16(page, off)? as usize;
    let at = match *page.get(off + 2)? {
        0 => off + LEAF_CELL_FIXED,
        1 => off + LEAF_CELL_FIXED + 8,
        2 => off + LEAF_CELL_FIXED + PACKED_REF,
        _ => return None,
    };
    page.get(at..at.checked_add(klen)?)
}

/// Sets child `i` (0 = leftmost) of a dirty branch image in place; returns the bytes written.
pub fn branch_set_child(page: &mut [u8], i: usize, child: u64) -> Result<Touched, EditError> {
    let h = PageHeader::read(page).ok_or(EditError::Malformed)?;
    if h.kind != PageKind::Branch || i > h.count as usize {
        return Err(EditError::Malformed);
    }
    let at = if i == 0 {
        HEADER_LEN
    } else {
        rd_u16(page, BRANCH_BODY_START + 2 * (i - 1)).ok_or(EditError::Malformed)? as usize + 2
    };
    if at + 8 > PAGE_SIZE {
        return Err(EditError::Malformed);
    }
    wr_u64(page, at, child);
    Ok([at..at + 8, 0..0, 0..0])
}

/// Inserts separator `sep` with right child `right` after child `i` of a dirty branch image,
/// and sets child `i` to `left` (a child that split into `left` and `right`), without decoding
/// the page (the writer's fast path for a split below): the new cell takes the free gap below
/// the lowest cell and the slot array shifts by one slot. Returns the byte ranges written
/// besides the header, or [`EditError::NoRoom`] when the cell does not fit.
pub fn branch_insert_in_place(
    page: &mut [u8],
    i: usize,
    left: u64,
    sep: &[u8],
    right: u64,
) -> Result<Touched, EditError> {
    let h = PageHeader::read(page).ok_or(EditError::Malformed)?;
    let count = h.count as usize;
    if h.kind != PageKind::Branch || i > count || sep.len() > u16::MAX as usize {
        return Err(EditError::Malformed);
    }
    let size = BRANCH_CELL_FIXED + sep.len();
    let low = lowest_cell(page, BRANCH_BODY_START, count).ok_or(EditError::Malformed)?;
    if low < BRANCH_BODY_START + 2 * (count + 1) + size {
        return Err(EditError::NoRoom);
    }
    // Child `i` is the leftmost child or sits in the cell of slot `i - 1`: the slot shift
    // below (slots `i..`) does not move it.
    let [child, _, _] = branch_set_child(page, i, left)?;
    let slots = BRANCH_BODY_START + 2 * i..BRANCH_BODY_START + 2 * count;
    page.copy_within(slots, BRANCH_BODY_START + 2 * i + 2);
    let off = low - size;
    wr_u16(page, BRANCH_BODY_START + 2 * i, off as u16);
    wr_u16(page, off, sep.len() as u16);
    wr_u64(page, off + 2, right);
    page[off + BRANCH_CELL_FIXED..off + size].copy_from_slice(sep);
    wr_u16(page, 6, (count + 1) as u16);
    Ok([
        child,
        BRANCH_BODY_START + 2 * i..BRANCH_BODY_START + 2 * (count + 1),
        off..off + size,
    ])
}

/// Writes a leaf cell for `key` and `val` at byte `off`.
fn write_leaf_cell(p: &mut [u8], off: usize, key: &[u8], val: &Val) {
    wr_u16(p, off, key.len() as u16);
    let mut at = off + LEAF_CELL_FIXED;
    match val {
        Val::Inline(v) => {
            p[off + 2] = 0;
            wr_u32(p, off + 3, v.len() as u32);
            p[at..at + key.len()].copy_from_slice(key);
            at += key.len();
            p[at..at + v.len()].copy_from_slice(v);
        }
        Val::Overflow { page, len } => {
            p[off + 2] = 1;
            wr_u32(p, off + 3, *len as u32);
            wr_u64(p, at, *page);
            at += 8;
            p[at..at + key.len()].copy_from_slice(key);
        }
        Val::Packed {
            page,
            off: voff,
            len,
        } => {
            p[off + 2] = 2;
            wr_u32(p, off + 3, *len as u32);
            wr_u64(p, at, *page);
            wr_u32(p, at + 8, *voff);
            at += PACKED_REF;
            p[at..at + key.len()].copy_from_slice(key);
        }
    }
}

/// Key, cell size (bytes, slot excluded) and offset of cell `j` of a base page; `None` when
/// the page is malformed there.
fn base_cell<'a>(page: &'a [u8], h: &PageHeader, j: usize) -> Option<(&'a [u8], usize, usize)> {
    match h.kind {
        PageKind::Leaf => {
            let off = rd_u16(page, HEADER_LEN + 2 * j)? as usize;
            let (k, v) = LeafView::new(page, h).cell(j)?;
            let vbytes = match v {
                ValRef::Inline(b) => b.len(),
                ValRef::Overflow { .. } => 8,
                ValRef::Packed { .. } => PACKED_REF,
            };
            Some((k, LEAF_CELL_FIXED + k.len() + vbytes, off))
        }
        PageKind::Branch => {
            let off = rd_u16(page, BRANCH_BODY_START + 2 * j)? as usize;
            let k = BranchView::new(page, h).key(j)?;
            Some((k, BRANCH_CELL_FIXED + k.len(), off))
        }
        _ => None,
    }
}

/// Builds a sealed overflow run holding `value` at `page_number`.
pub fn encode_overflow(value: &[u8], page_number: u64, txn_id: u64) -> Box<[u8]> {
    encode_run(PageKind::Overflow, value, page_number, txn_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaf_delete_in_place_matches_the_decoded_delete_and_reports_its_bytes() {
        let mut es: Vec<LeafEntry> = (0..60u32)
            .map(|i| LeafEntry {
                key: format!("key{i:04}").into_bytes(),
                val: if i % 9 == 0 {
                    Val::Overflow {
                        page: 200 + i as u64,
                        len: 50_000,
                    }
                } else {
                    Val::Inline(vec![i as u8; (i % 13) as usize])
                },
            })
            .collect();
        let mut img = Node::Leaf(es.clone()).encode(7, 3);
        // Bounded: 60 entries, a third of them deleted, first, middle and last among them.
        for i in [
            0u32, 59, 30, 9, 31, 45, 1, 58, 27, 18, 44, 2, 3, 50, 36, 40, 12, 21, 22, 54,
        ] {
            let key = format!("key{i:04}").into_bytes();
            let before = img.clone();
            let (old, touched) = leaf_delete_in_place(&mut img, &key).unwrap();
            let j = es.iter().position(|e| e.key == key).unwrap();
            let gone = es.remove(j);
            let want = match gone.val {
                Val::Inline(_) => Val::Inline(Vec::new()),
                v => v,
            };
            assert_eq!(old, Some(want));
            // Every changed byte is in the header or a reported range (the journal diff).
            for (b, (x, y)) in before.iter().zip(img.iter()).enumerate() {
                if x != y {
                    assert!(
                        b < HEADER_LEN || touched.iter().any(|r| r.contains(&b)),
                        "byte {b} changed outside {touched:?}"
                    );
                }
            }
            let h = PageHeader::read(&img).unwrap();
            assert_eq!(Node::decode(&img, &h).unwrap(), Node::Leaf(es.clone()));
        }
        // An absent key: nothing written.
        let before = img.clone();
        let (old, touched) = leaf_delete_in_place(&mut img, b"key0000").unwrap();
        assert!(old.is_none() && touched.iter().all(|r| r.is_empty()));
        assert_eq!(before, img);
        // The live size the writer's underfull check reads agrees with the decoded node's.
        let h = PageHeader::read(&img).unwrap();
        assert_eq!(
            page_body_size(&img, &h).unwrap(),
            Node::Leaf(es).body_size()
        );
    }

    #[test]
    fn leaf_roundtrip_and_search() {
        let es: Vec<LeafEntry> = (0..50u32)
            .map(|i| LeafEntry {
                key: format!("key{i:04}").into_bytes(),
                val: if i % 7 == 0 {
                    Val::Overflow {
                        page: 100 + i as u64,
                        len: 99_999,
                    }
                } else {
                    Val::Inline(vec![i as u8; i as usize])
                },
            })
            .collect();
        let n = Node::Leaf(es.clone());
        let img = n.encode(5, 2);
        let h = super::super::check_image(&img, 5, std::path::Path::new("t")).unwrap();
        assert_eq!(Node::decode(&img, &h).unwrap(), n);
        let v = LeafView::new(&img, &h);
        assert_eq!(v.search(b"key0010"), Some(Ok(10)));
        assert_eq!(v.search(b"key00105"), Some(Err(11)));
        assert_eq!(
            v.cell(14).unwrap().1,
            ValRef::Overflow {
                page: 114,
                len: 99_999
            }
        );
    }

    /// A xorshift generator for the randomized tests below (deterministic).
    fn rng(mut seed: u64) -> impl FnMut(u64) -> u64 {
        move |m: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % m
        }
    }

    /// What the writer does in page form with a put that found no room in the free gap
    /// (`WriteTransaction::put_full_leaf`): the re-packed page, or the split's left page,
    /// separator and right page. Pages laid out on `base` when it has room, else packed.
    #[allow(clippy::type_complexity)]
    fn page_form_put(
        cells: &mut LeafCells,
        img: &[u8],
        base: &[u8],
        key: &[u8],
        val: &Val,
    ) -> (Option<Val>, Vec<u8>, Option<(Vec<u8>, Vec<u8>)>) {
        let old = cells.load(img, key, val).unwrap();
        let n = cells.len();
        let lay = |cells: &mut LeafCells, r: std::ops::Range<usize>, base: Option<&[u8]>, pn| {
            let mut dst = match base {
                Some(b) => b.to_vec(),
                None => vec![0u8; PAGE_SIZE],
            };
            if !cells
                .write(r.clone(), img, key, val, &mut dst, base, pn, 3)
                .unwrap()
            {
                dst.fill(0);
                assert!(cells
                    .write(r, img, key, val, &mut dst, None, pn, 3)
                    .unwrap());
            }
            dst
        };
        if cells.body_size(0..n).unwrap() <= BODY_LEN {
            return (old, lay(cells, 0..n, Some(base), 9), None);
        }
        let at = cells.split_point();
        let sep = cells.key(at, img, key).unwrap().to_vec();
        let right = lay(cells, at..n, None, 12);
        let left = lay(cells, 0..at, Some(base), 9);
        (old, left, Some((sep, right)))
    }

    /// The same put on the decoded node (the writer's node path: `insert_at`, `split`, `park`).
    #[allow(clippy::type_complexity)]
    fn decoded_put(
        img: &[u8],
        base: &[u8],
        key: &[u8],
        val: &Val,
    ) -> (Option<Val>, Vec<u8>, Option<(Vec<u8>, Vec<u8>)>) {
        let h = PageHeader::read(img).unwrap();
        let Some(Node::Leaf(mut es)) = Node::decode(img, &h) else {
            panic!("not a leaf")
        };
        let mut old = None;
        match es.binary_search_by(|e| e.key.as_slice().cmp(key)) {
            Ok(i) => old = Some(std::mem::replace(&mut es[i].val, val.clone())),
            Err(i) => es.insert(
                i,
                LeafEntry {
                    key: key.to_vec(),
                    val: val.clone(),
                },
            ),
        }
        let old = old.map(|v| match v {
            Val::Inline(_) => Val::Inline(Vec::new()),
            o => o,
        });
        let lay = |n: &Node, base: Option<&[u8]>, pn| {
            let mut dst = match base {
                Some(b) => b.to_vec(),
                None => vec![0u8; PAGE_SIZE],
            };
            n.encode_unsealed_into(&mut dst, base, pn, 3);
            dst
        };
        let node = Node::Leaf(es.clone());
        if node.fits() {
            return (old, lay(&node, Some(base), 9), None);
        }
        let at = leaf_split_point(es.iter().map(leaf_entry_size), es.len());
        let right = es.split_off(at);
        let sep = right[0].key.clone();
        let right = lay(&Node::Leaf(right), None, 12);
        (old, lay(&Node::Leaf(es), Some(base), 9), Some((sep, right)))
    }

    /// Every key of leaf image `img` in order, and its free gap (bytes between the slot array
    /// and the lowest cell).
    fn keys_and_gap(img: &[u8]) -> (Vec<Vec<u8>>, usize) {
        let h = PageHeader::read(img).unwrap();
        assert_eq!(h.kind, PageKind::Leaf);
        let Some(Node::Leaf(es)) = Node::decode(img, &h) else {
            panic!("leaf does not decode")
        };
        let keys: Vec<Vec<u8>> = es.into_iter().map(|e| e.key).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "keys out of order");
        let low = lowest_cell(img, HEADER_LEN, h.count as usize).unwrap();
        (keys, low - HEADER_LEN - 2 * h.count as usize)
    }

    #[test]
    fn leaf_cells_match_the_decoded_path() {
        // Full leaves of random-sized entries (some overflow), edited in place after their copy
        // from a base (so their free space is scattered and their cells are not in key order
        // of offset), then a put at every position and a replacement of a few keys: the page
        // form must give the decoded path's images byte for byte (re-packed page, or both
        // halves of a split, the left one laid out on the base), the same separator and the
        // same old value.
        let mut rnd = rng(0x9e37_79b9_7f4a_7c15);
        let mut cells = LeafCells::default();
        let (mut repacked, mut split) = (0, 0);
        for round in 0..30 {
            let mut es: Vec<LeafEntry> = Vec::new();
            let mut k = 0u64;
            let entry = |k: u64, rnd: &mut dyn FnMut(u64) -> u64| LeafEntry {
                key: format!("k{k:08}").into_bytes(),
                val: if rnd(9) == 0 {
                    Val::Overflow {
                        page: 7 + k,
                        len: 50_000,
                    }
                } else {
                    Val::Inline(vec![round as u8; rnd(200) as usize])
                },
            };
            // A base page about two-thirds full, then in-place puts until the gap is full.
            while Node::Leaf(es.clone()).body_size() < BODY_LEN * 2 / 3 {
                k += 4 + rnd(50);
                es.push(entry(k, &mut rnd));
            }
            let base = Node::Leaf(es.clone()).encode(9, 1).to_vec();
            let mut img = base.clone();
            for _ in 0..1000 {
                let e = if rnd(4) == 0 {
                    // A replacement of a different size leaves its old cell behind.
                    let mut e = es[rnd(es.len() as u64) as usize].clone();
                    e.val = Val::Inline(vec![1; rnd(150) as usize]);
                    e
                } else {
                    entry(rnd(k + 60), &mut rnd)
                };
                if leaf_put_in_place(&mut img, &e.key, &e.val).is_err() {
                    break;
                }
            }
            let h = PageHeader::read(&img).unwrap();
            let Some(Node::Leaf(now)) = Node::decode(&img, &h) else {
                panic!("round {round}: the edited leaf does not decode")
            };
            let mut puts: Vec<Vec<u8>> = vec![b"a".to_vec(), b"z".to_vec()];
            for e in &now {
                let mut kk = e.key.clone();
                kk.push(b'5');
                puts.push(kk);
            }
            for i in (0..now.len()).step_by(5) {
                puts.push(now[i].key.clone());
            }
            for key in puts {
                let val = match rnd(10) {
                    0 => Val::Overflow {
                        page: 99,
                        len: 9_000,
                    },
                    1 => Val::Inline(vec![
                        0xee;
                        MAX_INLINE_CELL - 2 - LEAF_CELL_FIXED - key.len()
                    ]),
                    _ => Val::Inline(vec![0xee; 40 + rnd(300) as usize]),
                };
                let want = decoded_put(&img, &base, &key, &val);
                let got = page_form_put(&mut cells, &img, &base, &key, &val);
                assert_eq!(got.0, want.0, "round {round}: old value");
                assert!(
                    got.1 == want.1,
                    "round {round}: left or re-packed page differs"
                );
                match (&got.2, &want.2) {
                    (None, None) => repacked += 1,
                    (Some((gs, gr)), Some((ws, wr))) => {
                        assert_eq!(gs, ws, "round {round}: separator");
                        assert!(gr == wr, "round {round}: right page differs");
                        assert_eq!(&keys_and_gap(gr).0[0], gs);
                        assert!(keys_and_gap(&got.1).0.last().unwrap() < gs);
                        split += 1;
                    }
                    _ => panic!("round {round}: split in one path only"),
                }
            }
        }
        assert!(
            repacked > 100 && split > 100,
            "{repacked} re-packed, {split} split"
        );
    }

    #[test]
    fn repack_joins_the_scattered_free_space() {
        // A leaf whose free gap is full but whose live cells leave room (cells of replaced
        // values left behind): re-packed without a base, every key is there in order and the
        // gap is the whole free space of the page.
        let es: Vec<LeafEntry> = (0..30u32)
            .map(|i| LeafEntry {
                key: format!("key{i:04}").into_bytes(),
                val: Val::Inline(vec![i as u8; 100]),
            })
            .collect();
        let mut img = Node::Leaf(es.clone()).encode(5, 1).to_vec();
        // Replacements of a different size (each one a cell of one byte more than the last)
        // until the gap is full; bounded: each takes at least 108 bytes of the gap.
        let mut i = 0;
        while leaf_put_in_place(&mut img, &es[i % 30].key, &Val::Inline(vec![7; 101 + i])).is_ok() {
            i += 1;
            assert!(i < 100);
        }
        let key = b"key0015a".to_vec();
        let val = Val::Inline(vec![9; 200]);
        let mut cells = LeafCells::default();
        assert_eq!(cells.load(&img, &key, &val), Ok(None));
        assert_eq!(cells.len(), 31);
        let size = cells.body_size(0..31).unwrap();
        assert!(size <= BODY_LEN);
        let mut dst = vec![0u8; PAGE_SIZE];
        assert_eq!(
            cells.write(0..31, &img, &key, &val, &mut dst, None, 5, 2),
            Ok(true)
        );
        let (keys, gap) = keys_and_gap(&dst);
        let mut want: Vec<Vec<u8>> = es.iter().map(|e| e.key.clone()).collect();
        want.insert(16, key.clone());
        assert_eq!(keys, want);
        assert_eq!(gap, BODY_LEN - size, "free space accounted");
        let h = PageHeader::read(&dst).unwrap();
        assert_eq!((h.page_number, h.txn_id, h.count), (5, 2, 31));
        let v = LeafView::new(&dst, &h);
        assert_eq!(v.cell(16).unwrap().1, ValRef::Inline(&[9; 200]));
        // A replacement reports the old value: inline as no bytes, overflow as the run.
        assert_eq!(
            cells.load(&img, b"key0003", &val),
            Ok(Some(Val::Inline(Vec::new())))
        );
        assert_eq!(cells.len(), 30);
    }

    #[test]
    fn split_of_a_leaf_with_one_huge_value() {
        // Small entries around one value of the largest inline size, the new key at each
        // place: both halves fit, every key is in one of them in order, and the separator is
        // the right half's first key.
        let huge = MAX_INLINE_CELL - 2 - LEAF_CELL_FIXED - 8;
        for at in [0usize, 1, 20, 38, 39] {
            let es: Vec<LeafEntry> = (0..40u32)
                .map(|i| LeafEntry {
                    key: format!("key{i:04}").into_bytes(),
                    val: Val::Inline(vec![1; if i as usize == at { huge } else { 140 }]),
                })
                .collect();
            let img = Node::Leaf(es.clone()).encode(5, 1).to_vec();
            let mut cells = LeafCells::default();
            for key in [b"a".to_vec(), b"key0020a".to_vec(), b"z".to_vec()] {
                let val = Val::Inline(vec![2; 400]);
                let (old, left, right) = page_form_put(&mut cells, &img, &img, &key, &val);
                assert_eq!(old, None);
                let Some((sep, right)) = right else {
                    panic!("no split")
                };
                let (lk, _) = keys_and_gap(&left);
                let (rk, _) = keys_and_gap(&right);
                assert_eq!(rk[0], sep);
                assert!(lk.last().unwrap() < &sep);
                let mut want: Vec<Vec<u8>> = es.iter().map(|e| e.key.clone()).collect();
                want.push(key.clone());
                want.sort();
                assert_eq!([lk, rk].concat(), want, "huge value at {at}, key {key:?}");
            }
        }
    }

    #[test]
    fn leaf_cells_reject_malformed_pages() {
        let mut cells = LeafCells::default();
        let v = Val::Inline(vec![1; 10]);
        let mut img = vec![0xFFu8; PAGE_SIZE];
        img[4] = PageKind::Leaf as u8;
        assert_eq!(cells.load(&img, b"k", &v), Err(EditError::Malformed));
        // A branch is not a leaf.
        let b = Node::Branch {
            keys: vec![b"b".to_vec()],
            children: vec![1, 2],
        }
        .encode(3, 1);
        assert_eq!(cells.load(&b, b"k", &v), Err(EditError::Malformed));
        // A cell pointing into the slot array.
        let mut l = Node::Leaf(vec![LeafEntry {
            key: b"k".to_vec(),
            val: Val::Inline(vec![]),
        }])
        .encode(3, 1)
        .to_vec();
        wr_u16(&mut l, HEADER_LEN, HEADER_LEN as u16);
        assert_eq!(cells.load(&l, b"j", &v), Err(EditError::Malformed));
        // Random damage never panics.
        let mut rnd = rng(7);
        let good = Node::Leaf(
            (0..60u32)
                .map(|i| LeafEntry {
                    key: format!("key{i:04}").into_bytes(),
                    val: Val::Inline(vec![3; 90]),
                })
                .collect(),
        )
        .encode(3, 1)
        .to_vec();
        for _ in 0..2000 {
            let mut img = good.clone();
            for _ in 0..4 {
                let at = rnd(PAGE_SIZE as u64 - 32) as usize + 6;
                img[at] = rnd(256) as u8;
            }
            if cells.load(&img, b"key0030a", &v).is_ok() {
                let n = cells.len();
                let mut dst = vec![0u8; PAGE_SIZE];
                let _ = cells.write(0..n / 2, &img, b"key0030a", &v, &mut dst, Some(&good), 3, 1);
                let _ = cells.write(n / 2..n, &img, b"key0030a", &v, &mut dst, None, 3, 1);
            }
        }
    }

    #[test]
    fn branch_insert_in_place_matches_the_decoded_edit() {
        // A split of child i into (left, right) with separator sep: in place on the image, and
        // on the decoded node; both must decode alike, and the touched ranges (plus the header)
        // must cover every changed byte. Then fill the page until the edit reports NoRoom.
        let keys: Vec<Vec<u8>> = (0..40u32)
            .map(|k| format!("k{:05}", k * 10).into_bytes())
            .collect();
        let children: Vec<u64> = (0..41u64).map(|c| 1000 + c).collect();
        for i in [0usize, 1, 17, 39, 40] {
            let mut n = Node::Branch {
                keys: keys.clone(),
                children: children.clone(),
            };
            let base = n.encode(9, 1);
            let mut img = base.clone();
            let sep = if i == 0 {
                b"j".to_vec()
            } else {
                let mut k = keys[i - 1].clone();
                k.push(b'5');
                k
            };
            let touched = branch_insert_in_place(&mut img, i, 7, &sep, 8).unwrap();
            if let Node::Branch { keys, children } = &mut n {
                children[i] = 7;
                keys.insert(i, sep.clone());
                children.insert(i + 1, 8);
            }
            let h = PageHeader::read(&img).unwrap();
            assert_eq!(Node::decode(&img, &h).unwrap(), n, "child {i}");
            let mut rebuilt = base.clone();
            for r in std::iter::once(0..HEADER_LEN).chain(touched) {
                rebuilt[r.clone()].copy_from_slice(&img[r]);
            }
            assert_eq!(rebuilt, img, "child {i}: touched ranges miss a change");
        }
        let mut img = Node::Branch {
            keys: keys.clone(),
            children: children.clone(),
        }
        .encode(9, 1);
        let mut added = 0;
        // Bounded: each turn adds a ~1 KiB key until the page is full.
        loop {
            let sep = vec![b'z'; 1000 + added];
            match branch_insert_in_place(&mut img, 40 + added, 5, &sep, 6) {
                Ok(_) => added += 1,
                Err(e) => {
                    assert_eq!(e, EditError::NoRoom);
                    break;
                }
            }
            assert!(added < 10);
        }
        assert!(added >= 5, "{added} keys of ~1 KiB fit");
        let h = PageHeader::read(&img).unwrap();
        assert!(Node::decode(&img, &h).is_some());
    }

    #[test]
    fn branch_roundtrip_and_child_index() {
        let n = Node::Branch {
            keys: vec![b"b".to_vec(), b"d".to_vec()],
            children: vec![10, 11, 12],
        };
        let img = n.encode(3, 1);
        let h = super::super::check_image(&img, 3, std::path::Path::new("t")).unwrap();
        assert_eq!(Node::decode(&img, &h).unwrap(), n);
        let v = BranchView::new(&img, &h);
        assert_eq!(v.child_index(b"a"), Some(0));
        assert_eq!(v.child_index(b"b"), Some(1));
        assert_eq!(v.child_index(b"c"), Some(1));
        assert_eq!(v.child_index(b"z"), Some(2));
        assert_eq!(v.child(2), Some(12));
    }

    #[test]
    fn garbage_leaf_never_panics() {
        let mut img = vec![0xFFu8; PAGE_SIZE];
        img[4] = PageKind::Leaf as u8;
        let h = PageHeader::read(&img).unwrap();
        let v = LeafView::new(&img, &h);
        for i in 0..v.len().min(100) {
            let _ = v.cell(i);
        }
        assert!(v.search(b"k").is_none());
    }
}
