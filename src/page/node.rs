//! B+tree node layouts: zero-copy views for readers and a decoded form for the writer.
//!
//! Leaf page (kind 3), `count` = cells:
//! ```text
//! 32: slot[0..count] u16 offsets of cells, in key order
//! ... free ...
//! cells, packed toward the end of the page:
//!   key_len u16 | flags u8 (0 inline, 1 overflow) | value_len u32 | [overflow page u64] | key | [value]
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
const BRANCH_CELL_FIXED: usize = 2 + 8;
const BRANCH_BODY_START: usize = HEADER_LEN + 8;

const _: () = assert!(MAX_INLINE_CELL * 4 <= BODY_LEN);
const _: () = assert!((BRANCH_CELL_FIXED + 2 + crate::MAX_KEY_LEN) * 4 <= BODY_LEN - 8);

/// A leaf value as stored: inline bytes or a reference to an overflow run.
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
}

impl ValRef<'_> {
    /// The owned form.
    pub fn to_val(self) -> Val {
        match self {
            ValRef::Inline(b) => Val::Inline(b.to_vec()),
            ValRef::Overflow { page, len } => Val::Overflow { page, len },
        }
    }
}

/// True when a key/value pair is stored inline in the leaf.
pub fn fits_inline(key_len: usize, value_len: usize) -> bool {
    2 + LEAF_CELL_FIXED + key_len + value_len <= MAX_INLINE_CELL
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

    /// True when the leaf has no cells.
    pub fn is_empty(&self) -> bool {
        self.count == 0
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
    2 + LEAF_CELL_FIXED
        + e.key.len()
        + match &e.val {
            Val::Inline(v) => v.len(),
            Val::Overflow { .. } => 8,
        }
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

    /// Encodes into a fresh page image for `page_number`, written by `txn_id`, sealed.
    ///
    /// Panics if the node does not fit (the writer splits before encoding: an invariant).
    pub fn encode(&self, page_number: u64, txn_id: u64) -> Box<[u8]> {
        assert!(
            self.fits(),
            "node of {} bytes does not fit a page",
            self.body_size()
        );
        let mut p = super::zeroed(1);
        let mut end = PAGE_SIZE;
        let (kind, count) = match self {
            Node::Leaf(es) => {
                for (i, e) in es.iter().enumerate() {
                    let vbytes = match &e.val {
                        Val::Inline(v) => v.len(),
                        Val::Overflow { .. } => 8,
                    };
                    let size = LEAF_CELL_FIXED + e.key.len() + vbytes;
                    end -= size;
                    wr_u16(&mut p, HEADER_LEN + 2 * i, end as u16);
                    wr_u16(&mut p, end, e.key.len() as u16);
                    let mut at = end + LEAF_CELL_FIXED;
                    match &e.val {
                        Val::Inline(v) => {
                            p[end + 2] = 0;
                            wr_u32(&mut p, end + 3, v.len() as u32);
                            p[at..at + e.key.len()].copy_from_slice(&e.key);
                            at += e.key.len();
                            p[at..at + v.len()].copy_from_slice(v);
                        }
                        Val::Overflow { page, len } => {
                            p[end + 2] = 1;
                            wr_u32(&mut p, end + 3, *len as u32);
                            wr_u64(&mut p, at, *page);
                            at += 8;
                            p[at..at + e.key.len()].copy_from_slice(&e.key);
                        }
                    }
                }
                (PageKind::Leaf, es.len())
            }
            Node::Branch { keys, children } => {
                debug_assert_eq!(children.len(), keys.len() + 1);
                wr_u64(&mut p, HEADER_LEN, children[0]);
                for (i, k) in keys.iter().enumerate() {
                    end -= BRANCH_CELL_FIXED + k.len();
                    wr_u16(&mut p, BRANCH_BODY_START + 2 * i, end as u16);
                    wr_u16(&mut p, end, k.len() as u16);
                    wr_u64(&mut p, end + 2, children[i + 1]);
                    p[end + BRANCH_CELL_FIXED..end + BRANCH_CELL_FIXED + k.len()]
                        .copy_from_slice(k);
                }
                (PageKind::Branch, keys.len())
            }
        };
        PageHeader {
            kind,
            count: count as u16,
            page_number,
            txn_id,
            run_pages: 1,
            aux: 0,
        }
        .write(&mut p);
        super::seal(&mut p);
        p
    }
}

/// Builds a sealed overflow run holding `value` at `page_number`.
pub fn encode_overflow(value: &[u8], page_number: u64, txn_id: u64) -> Box<[u8]> {
    let pages = super::overflow_run_pages(value.len());
    let mut p = super::zeroed(pages);
    PageHeader {
        kind: PageKind::Overflow,
        count: 0,
        page_number,
        txn_id,
        run_pages: pages as u32,
        aux: 0,
    }
    .write(&mut p);
    p[HEADER_LEN..HEADER_LEN + value.len()].copy_from_slice(value);
    super::seal(&mut p);
    p
}

#[cfg(test)]
mod tests {
    use super::*;

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
