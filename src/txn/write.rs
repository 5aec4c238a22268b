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
// transaction's maps, showed in one-put commit profiles. The seeds are a constant of a
// zero-sized hasher builder, so a map is its table alone (32 bytes, not 64): the transaction,
// moved by value from `begin_write` to its commit, and the maps the writer keeps between
// transactions ([`TxnMaps`]) are half as much to copy.
type HashMap<K, V> = std::collections::HashMap<K, V, FixedSeeds>;

/// ahash under the transaction maps' fixed seeds, as a zero-sized `BuildHasher`.
#[derive(Debug, Clone, Copy, Default)]
struct FixedSeeds;

impl std::hash::BuildHasher for FixedSeeds {
    type Hasher = ahash::AHasher;
    fn build_hasher(&self) -> ahash::AHasher {
        const SEEDS: ahash::RandomState = ahash::RandomState::with_seeds(
            0x243f_6a88_85a3_08d3,
            0x1319_8a2e_0370_7344,
            0xa409_3822_299f_31d0,
            0x082e_fa98_ec4e_6c89,
        );
        SEEDS.build_hasher()
    }
}

/// An empty transaction map (no allocation until the first insert).
fn map<K, V>() -> HashMap<K, V> {
    HashMap::with_hasher(FixedSeeds)
}
use std::sync::atomic::Ordering;
use std::sync::Arc;

use std::ops::Bound;

use crate::btree::{before_start, past_end, KeyRange, NodeRef, Range, Source};
use crate::error::{Error, Result};
use crate::freespace::{self, Extents, BITS_PER_BITMAP, DIR_CAPACITY};
use crate::journal::record::{commit_record, CommitMeta, DiffBase, OutRecord};
use crate::options::Durability;
use crate::page::node::{encode_overflow, encode_values, fits_inline, LeafEntry, Node, Val};
use crate::page::{self, PageHeader, PageKind, HEADER_LEN, PAGE_SIZE};
use crate::state::State;
use crate::storage::{Inner, WriterState};

// `WriteTransaction`'s methods by concern, one file each (`write/`): allocation, insertion
// and splits, deletion and merges, range deletion, reads, commit, and compaction's moves and
// the shrink of the free tail (`Storage::compact`).
mod alloc;
mod background;
mod commit;
mod compact;
mod delete;
mod insert;
mod logical;
mod packed;
mod range_delete;
mod reads;

pub(crate) use background::apply_in_background;
#[cfg(feature = "testing")]
pub(crate) use background::apply_in_background_with;
pub(crate) use commit::PreparedCommit;
pub(crate) use logical::{LogicalOps, StepCarry};

/// A map kept between transactions keeps its table only while it holds at most this many
/// entries (a large transaction's tables are freed rather than cleared at every later commit).
const KEPT_MAP_CAPACITY: usize = 256;

/// A write transaction's page maps, kept with the storage's writer between transactions,
/// emptied, their tables kept (up to [`KEPT_MAP_CAPACITY`] entries): a small commit then
/// allocates none of them afresh (each was one or two allocations and rehashes a commit).
#[derive(Debug)]
pub(crate) struct TxnMaps {
    nodes: HashMap<u64, Node>,
    pages: HashMap<u64, crate::page::SharedImage>,
    bases: HashMap<u64, u64>,
    touched: HashMap<u64, Touches>,
    overflow: HashMap<u64, Vec<u8>>,
    values: HashMap<u64, Vec<u8>>,
    bitmaps: HashMap<usize, (crate::page::SharedImage, Option<Touches>)>,
    allocated: HashMap<u64, u64>,
    /// The free-space directory's bitmap pages (refilled by `load_fsm`).
    dir: Vec<u64>,
    /// Reusable runs taken by the transaction.
    taken: Vec<(u64, u64)>,
}

impl Default for TxnMaps {
    fn default() -> TxnMaps {
        TxnMaps {
            nodes: map(),
            pages: map(),
            bases: map(),
            touched: map(),
            overflow: map(),
            values: map(),
            bitmaps: map(),
            allocated: map(),
            dir: Vec::new(),
            taken: Vec::new(),
        }
    }
}

/// `m` emptied, or a new empty map when its table is larger than is kept.
fn emptied<K, V>(mut m: HashMap<K, V>) -> HashMap<K, V> {
    if m.capacity() > KEPT_MAP_CAPACITY {
        return map();
    }
    m.clear();
    m
}

/// `v` emptied, or a new empty `Vec` when it holds more than a kept map's table.
fn emptied_vec<T>(mut v: Vec<T>) -> Vec<T> {
    if v.capacity() > KEPT_MAP_CAPACITY {
        return Vec::new();
    }
    v.clear();
    v
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
    writer: Option<Box<WriterState>>,
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
    /// Value page runs written by this transaction: their bodies (the bytes after the
    /// header), by first page (`write/packed.rs`).
    values: HashMap<u64, Vec<u8>>,
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
    /// In a storage with a write buffer, while the transaction only puts and deletes: its
    /// operations by key (`None`: delete), journaled as one logical record at commit
    /// (`write/logical.rs`). `None` for a page transaction.
    logical: Option<std::collections::BTreeMap<Vec<u8>, Option<Vec<u8>>>>,
    /// Whether the commit applies the buffer was settled already (`write/logical.rs`,
    /// `apply_if_due`).
    apply_settled: bool,
    /// After an apply step (`write/logical.rs`): the entries it leaves buffered.
    step: Option<StepCarry>,
    /// Bytes the operations in `logical` count for in the buffer.
    logical_len: u64,
    /// Begun *logical-only* while a background apply holds the writer's state (design.md
    /// 16.1): `writer` is `None` until the transaction needs the tree and takes the state
    /// back (`reclaim`); it holds the storage's one logical-only place until it ends.
    logical_only: bool,
    /// A background apply's transaction (`write/background.rs`).
    background: bool,
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
        mut writer: Box<WriterState>,
        base: Arc<State>,
    ) -> WriteTransaction {
        let freed = writer.alloc.run_list();
        // A storage opened without a buffer may still have one, put back from the journal at
        // open: its first commit applies it (write/logical.rs, `must_apply`).
        let logical = inner
            .buffer_limit
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
            || !base.buffer.is_empty();
        let maps = std::mem::take(&mut writer.maps);
        WriteTransaction::from_parts(inner, Some(writer), base, maps, freed, logical)
    }

    /// A logical-only write transaction (design.md 16.1): begun while a background apply holds
    /// the writer's state, it buffers its operations; it takes the state back
    /// ([`WriteTransaction::reclaim`]) before anything that writes the tree.
    pub(crate) fn new_logical(inner: Arc<Inner>, base: Arc<State>) -> WriteTransaction {
        let maps = TxnMaps::default();
        WriteTransaction::from_parts(inner, None, base, maps, Vec::new(), true)
    }

    /// A transaction on `base` with the writer's state `writer` (`None`: logical-only), the
    /// page maps `maps` and the allocator's list of freed runs `freed`; `logical`: it keeps its
    /// operations by key (a buffered storage).
    fn from_parts(
        inner: Arc<Inner>,
        writer: Option<Box<WriterState>>,
        base: Arc<State>,
        maps: TxnMaps,
        freed: Vec<(u64, u64)>,
        logical: bool,
    ) -> WriteTransaction {
        let logical_only = writer.is_none();
        WriteTransaction {
            txn_id: base.txn_id + 1,
            root: base.root,
            entries: base.entries,
            next_page: base.next_page,
            dir_page: base.freedir,
            inner,
            writer,
            base,
            nodes: maps.nodes,
            pages: maps.pages,
            bases: maps.bases,
            touched: maps.touched,
            overflow: maps.overflow,
            values: maps.values,
            leaf_cells: page::node::LeafCells::default(),
            spare: None,
            fsm_loaded: false,
            dir_dirty: false,
            dir: maps.dir,
            bitmaps: maps.bitmaps,
            taken: maps.taken,
            local_free: Extents::default(),
            allocated: maps.allocated,
            freed,
            failed: None,
            changed: false,
            durability: Durability::Immediate,
            logical: (logical || logical_only).then(std::collections::BTreeMap::new),
            apply_settled: false,
            step: None,
            logical_len: 0,
            logical_only,
            background: false,
        }
    }

    /// Takes the writer's state back from the background apply, in a logical-only transaction
    /// about to write the tree (a no-op otherwise): the apply gives up, having published
    /// nothing, so this transaction's base is still the storage's state.
    fn reclaim(&mut self) {
        if self.writer.is_none() && self.logical_only {
            self.writer = Some(self.inner.reclaim_writer());
            self.logical_only = false;
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

    /// Keys in the storage as this transaction sees it (its own changes included). In a
    /// storage with a write buffer, while the transaction only puts and deletes, this looks up
    /// each key it changed; if a lookup fails (a damaged page), the count leaves all of the
    /// transaction's changes out, and the commit reports the damage.
    pub fn len(&self) -> u64 {
        match &self.logical {
            None => self.entries,
            Some(_) => {
                let delta = self.logical_delta().unwrap_or(0);
                (self.base.len() as i64 + delta).max(0) as u64
            }
        }
    }

    /// True when the storage is empty as this transaction sees it.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
        match self.pages.get_mut(&p).and_then(|i| i.get_mut()) {
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

    /// Frees an overflow value's run. A packed value's run is freed by the leaf edit that
    /// removed its last cell (`write/packed.rs`): nothing here.
    fn free_value(&mut self, v: &Val) -> Result<()> {
        if let Val::Overflow { page, len } = v {
            let n = page::overflow_run_pages(*len as usize) as u64;
            self.overflow.remove(page);
            self.free(*page, n)?;
        }
        Ok(())
    }
}

impl WriteTransaction {
    /// Hands the transaction's page maps, emptied, to the writer `w` for the next transaction
    /// ([`TxnMaps`]).
    fn keep_maps(&mut self, w: &mut WriterState) {
        w.maps = TxnMaps {
            nodes: emptied(std::mem::replace(&mut self.nodes, map())),
            pages: emptied(std::mem::replace(&mut self.pages, map())),
            bases: emptied(std::mem::replace(&mut self.bases, map())),
            touched: emptied(std::mem::replace(&mut self.touched, map())),
            overflow: emptied(std::mem::replace(&mut self.overflow, map())),
            values: emptied(std::mem::replace(&mut self.values, map())),
            bitmaps: emptied(std::mem::replace(&mut self.bitmaps, map())),
            allocated: emptied(std::mem::replace(&mut self.allocated, map())),
            dir: emptied_vec(std::mem::take(&mut self.dir)),
            taken: emptied_vec(std::mem::take(&mut self.taken)),
        };
    }
}

impl Drop for WriteTransaction {
    fn drop(&mut self) {
        if let Some(mut w) = self.writer.take() {
            for (s, l) in self.taken.drain(..) {
                w.alloc.reusable.insert(s, l);
            }
            self.keep_maps(&mut w);
            self.inner.return_writer(w);
        } else if std::mem::take(&mut self.logical_only) {
            self.inner.return_logical();
        }
    }
}
