//! The copy-on-write B+tree, read side: point lookups, ordered double-ended range cursors
//! (`cursor.rs`, over a snapshot or a write transaction's own tree) and the structural check,
//! over one immutable `State` (a snapshot). The write side (copy-on-write updates,
//! splits, merges) is in `txn/write.rs`.
//!
//! Readers work on page bytes directly ([`LeafView`], [`BranchView`]): keys and values are
//! returned as slices of the map or of scratch pages, without copying.

mod cursor;
pub(crate) mod leaves;
mod multi;
mod range;

pub(crate) use cursor::prefix_end;
pub use cursor::KeyRange;
pub(crate) use cursor::{before_start, past_end, NodeRef, Source};
pub(crate) use multi::multi_get;
pub use range::Range;

use crate::error::{Corruption, Error, Result};
use crate::page::node::{BranchView, LeafView, ValRef};
use crate::page::{PageHeader, PageKind, HEADER_LEN};
use crate::state::State;

/// Bound on tree depth: a tree deeper than this is corrupt (fan-out >= 4 gives 4^32 leaves).
pub const MAX_DEPTH: usize = 32;

fn corrupt(state: &State, page: u64, what: &str) -> Error {
    Error::corruption(state.path(), Some(page), None, what)
}

/// Resolves a value reference to its bytes (overflow runs read in place).
pub(crate) fn value<'a>(state: &'a State, v: ValRef<'a>) -> Result<&'a [u8]> {
    value_via(state, v, &|p| Some(state.page(p)))
        .unwrap_or_else(|| Err(corrupt(state, state.root, "page not read")))
}

/// [`value`], reading the overflow run with `page` (`None`: not read).
fn value_via<'a>(
    state: &'a State,
    v: ValRef<'a>,
    page: &impl Fn(u64) -> Option<Result<(&'a [u8], PageHeader)>>,
) -> Option<Result<&'a [u8]>> {
    Some(match v {
        ValRef::Inline(b) => Ok(b),
        ValRef::Overflow { page: o, len } => match page(o)? {
            Err(e) => Err(e),
            Ok((img, h)) if h.kind == PageKind::Overflow => img
                .get(HEADER_LEN..HEADER_LEN + len as usize)
                .ok_or_else(|| corrupt(state, o, "overflow run shorter than its value")),
            Ok(_) => Err(corrupt(state, o, "expected an overflow page")),
        },
        ValRef::Packed { page: o, off, len } => match page(o)? {
            Err(e) => Err(e),
            Ok((img, h)) if h.kind == PageKind::Values => packed_slice(img, off, len)
                .ok_or_else(|| corrupt(state, o, "value page run shorter than its value")),
            Ok(_) => Err(corrupt(state, o, "expected a value page")),
        },
    })
}

/// The `len` bytes at byte `off` of value page run image `img`; `None` when they do not lie in
/// its body.
pub(crate) fn packed_slice(img: &[u8], off: u32, len: u64) -> Option<&[u8]> {
    let off = off as usize;
    if off < HEADER_LEN {
        return None;
    }
    img.get(off..off.checked_add(usize::try_from(len).ok()?)?)
}

/// Looks `key` up in the tree of `state`.
pub(crate) fn get<'a>(state: &'a State, key: &[u8]) -> Result<Option<&'a [u8]>> {
    get_via(state, key, |p| Some(state.page(p)))
        .unwrap_or_else(|| Err(corrupt(state, state.root, "page not read")))
}

/// [`get`], when every page it needs is known to be in memory ([`State::page_if_resident`]):
/// `None`, with nothing read past the first page that is not, otherwise. So an async caller can
/// read on its own thread without a page fault, and send the others elsewhere.
pub(crate) fn get_if_resident<'a>(
    state: &'a State,
    key: &[u8],
) -> Option<Result<Option<&'a [u8]>>> {
    get_via(state, key, |p| state.page_if_resident(p))
}

/// The lookup of [`get`], reading each page with `page` (`None`: stop, answering `None`).
fn get_via<'a>(
    state: &'a State,
    key: &[u8],
    page: impl Fn(u64) -> Option<Result<(&'a [u8], PageHeader)>>,
) -> Option<Result<Option<&'a [u8]>>> {
    let mut p = state.root;
    if p == 0 {
        return Some(Ok(None));
    }
    for _ in 0..MAX_DEPTH {
        let (img, h) = match page(p)? {
            Ok(x) => x,
            Err(e) => return Some(Err(e)),
        };
        match h.kind {
            PageKind::Branch => {
                let v = BranchView::new(img, &h);
                match v.child_index(key).and_then(|i| v.child(i)) {
                    Some(c) => p = c,
                    None => return Some(Err(corrupt(state, p, "malformed branch page"))),
                }
            }
            PageKind::Leaf => {
                let v = LeafView::new(img, &h);
                return Some(match v.search(key) {
                    None => Err(corrupt(state, p, "malformed leaf page")),
                    Some(Err(_)) => Ok(None),
                    Some(Ok(i)) => match v.cell(i) {
                        None => Err(corrupt(state, p, "malformed leaf cell")),
                        Some((_, val)) => value_via(state, val, &page)?.map(Some),
                    },
                });
            }
            _ => return Some(Err(corrupt(state, p, "expected a branch or leaf page"))),
        }
    }
    Some(Err(corrupt(state, p, "tree deeper than 32 levels")))
}

/// What [`crate::Storage::check`] found.
///
/// Causes, not cascades: a damaged page (bad checksum, bad header, wrong kind) is one entry of
/// [`CheckReport::problems`], and the pages the check could not reach because of it are counted
/// once in [`CheckReport::hidden`], not reported as leaks. A page that is neither reachable nor
/// free while no damage hides anything is a leak, reported as one problem per run of
/// consecutive leaked pages.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckReport {
    /// Transaction id of the checked snapshot.
    pub txn_id: u64,
    /// Pages whose checksum was verified (an overflow run counts its pages).
    pub pages_checked: u64,
    /// Pages reachable from the root and the free-space map (header pages included; a damaged
    /// page or overflow run that a checked page points to counts as in use).
    pub pages_in_use: u64,
    /// Pages the free-space map marks free.
    pub pages_free: u64,
    /// Keys found in the leaves.
    pub entries: u64,
    /// Levels of the tree (0 = empty).
    pub depth: u32,
    /// The causes found: each damaged page once (checksum, header, kind; problems of one page
    /// are joined into one entry), key order and structure errors, free-space map
    /// disagreements, and runs of leaked pages. At most 1,000 entries.
    pub problems: Vec<Corruption>,
    /// What the damaged pages among `problems` hid: `None` when no page was damaged.
    pub hidden: Option<HiddenPages>,
    /// Header slots (0 or 1) that do not decode as a valid header while their twin does:
    /// damaged, or torn by a crash during a flush's header write (a legal crash state, so not
    /// a problem: nothing is lost, the twin holds the same header, and the first flush of a
    /// read-write open rewrites the slot from it). Filled by [`crate::Storage::check`].
    pub header_slots_damaged: Vec<u64>,
    /// False when the free-space map and the header slots were not checked: a read-only
    /// storage beside a live writer in another process, which updates the map's pages and the
    /// header in place (design.md 6.5). Then `pages_free` is 0, and pages neither reachable nor
    /// checked are not reported as leaked.
    pub free_space_checked: bool,
}

impl CheckReport {
    /// True when no problem was found.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// The pages a check could not verify because of damaged pages (one summary instead of one
/// "leaked page" line per page below the damage).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HiddenPages {
    /// Damaged pages or overflow runs that a checked page points to (each one is a problem of
    /// the report), plus a damaged free-space directory or bitmap page.
    pub damaged: u64,
    /// Pages not verified because of the damage: the damaged pages and runs themselves, the
    /// pages below a damaged branch or leaf (not reached: neither in use nor free as far as the
    /// check can tell), and unreached pages whose free-space bitmap page is damaged. A real
    /// leak among them cannot be told apart from them until the damage is repaired.
    pub pages: u64,
    /// Lowest page number among `pages`.
    pub first: u64,
    /// Highest page number among `pages`.
    pub last: u64,
    /// Keys recorded in the state but not counted in the leaves (below the damage).
    pub entries_not_counted: u64,
}

impl std::fmt::Display for HiddenPages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = |n: u64| if n == 1 { "" } else { "s" };
        write!(
            f,
            "{} page{} not verified because of {} damaged page{} (pages {}..={}: the damaged pages and those reachable only through them, not leaks)",
            self.pages,
            s(self.pages),
            self.damaged,
            s(self.damaged),
            self.first,
            self.last
        )?;
        if self.entries_not_counted > 0 {
            write!(
                f,
                "; {} recorded key{} not counted",
                self.entries_not_counted,
                s(self.entries_not_counted)
            )?;
        }
        Ok(())
    }
}

/// Most problems one report lists.
const MAX_PROBLEMS: usize = 1000;

/// Most descriptions joined into one page's problem (the rest are counted).
const MAX_PARTS: usize = 3;

/// Consecutive page numbers, collected as `(first, last)` runs.
#[derive(Default)]
struct Runs(Vec<(u64, u64)>);

impl Runs {
    fn add(&mut self, p: u64) {
        match self.0.last_mut() {
            Some((_, last)) if *last + 1 == p => *last = p,
            _ => self.0.push((p, p)),
        }
    }
}

struct Checker<'a> {
    state: &'a State,
    report: CheckReport,
    used: Vec<u64>,
    leaf_depth: Option<u32>,
    /// Descriptions joined into the last problem, and how many more were left out.
    parts: usize,
    more: usize,
    /// Damaged pages or runs: (first page, pages).
    damaged: Vec<(u64, u64)>,
    /// A damaged branch or leaf hid its subtree: unreached pages are not leaks.
    subtree_hidden: bool,
    /// Page ranges `[start, end)` whose free-space bits are unknown (damaged map pages).
    free_unknown: Vec<(u64, u64)>,
}

impl<'a> Checker<'a> {
    /// Records a problem; one page's problems in a row are joined into one entry.
    fn push(&mut self, c: Corruption) {
        if let Some(last) = self.report.problems.last_mut() {
            if c.page.is_some() && last.page == c.page && last.file == c.file {
                if self.parts < MAX_PARTS {
                    last.what.push_str("; ");
                    last.what.push_str(&c.what);
                    self.parts += 1;
                } else {
                    self.more += 1;
                    let base = last.what.split(" (and ").next().unwrap_or("").to_string();
                    last.what = format!("{base} (and {} more)", self.more);
                }
                return;
            }
        }
        if self.report.problems.len() < MAX_PROBLEMS {
            self.report.problems.push(c);
            self.parts = 1;
            self.more = 0;
        }
    }

    fn problem(&mut self, page: u64, what: impl Into<String>) {
        self.push(Corruption {
            file: self.state.path().to_path_buf(),
            page: Some(page),
            offset: None,
            what: what.into(),
        });
    }

    /// Records a damaged page or run of `pages` pages starting at `p`: one problem, its pages
    /// counted in use (something points to them), and, with `hides_subtree`, every unreached
    /// page counted as hidden rather than leaked.
    fn damage(&mut self, c: Corruption, p: u64, pages: u64, hides_subtree: bool) {
        self.push(c);
        self.damaged.push((p, pages));
        for q in p..p.saturating_add(pages).min(self.state.next_page) {
            self.used[(q / 64) as usize] |= 1 << (q % 64);
        }
        self.subtree_hidden |= hides_subtree;
    }

    fn mark(&mut self, start: u64, n: u64) {
        for p in start..start.saturating_add(n) {
            if p >= self.state.next_page {
                self.problem(
                    p,
                    format!(
                        "page in use at or beyond next page {}",
                        self.state.next_page
                    ),
                );
                return;
            }
            let (w, b) = ((p / 64) as usize, p % 64);
            if self.used[w] & (1 << b) != 0 {
                self.problem(p, "page reachable twice");
            }
            self.used[w] |= 1 << b;
        }
    }

    /// Reads and verifies page `p`; the damage, if any, as a `Corruption` for the caller to
    /// record with what the page would have held.
    fn page(&mut self, p: u64) -> std::result::Result<(&'a [u8], PageHeader), Corruption> {
        let state: &'a State = self.state;
        match state.page_verified(p) {
            Ok((img, h)) => {
                self.report.pages_checked += h.run_pages as u64;
                Ok((img, h))
            }
            Err(Error::Corruption(c)) => Err(c),
            Err(e) => Err(Corruption {
                file: state.path().to_path_buf(),
                page: Some(p),
                offset: None,
                what: format!("unreadable: {e}"),
            }),
        }
    }

    /// Checks the value page runs one leaf's packed values name (`(run, offset, length)`):
    /// each run is a value page run, marked once (a run another leaf names too is reachable
    /// twice: invariant I17), and its values lie in its body without overlapping.
    fn value_runs(&mut self, packed: &mut [(u64, u32, u64)]) {
        packed.sort_unstable();
        let mut at = 0;
        while at < packed.len() {
            let run = packed[at].0;
            let end = packed[at..].partition_point(|v| v.0 == run) + at;
            let values = &packed[at..end];
            at = end;
            match self.page(run) {
                Err(c) => {
                    let want = values
                        .iter()
                        .map(|v| (v.1 as usize + v.2 as usize).div_ceil(crate::page::PAGE_SIZE))
                        .max()
                        .unwrap_or(1) as u64;
                    self.damage(c, run, want, false);
                }
                Ok((_, h)) if h.kind != PageKind::Values => {
                    let c = self.corruption(run, "expected a value page");
                    self.damage(c, run, 1, true);
                }
                Ok((_, h)) => {
                    let len = h.run_pages as u64 * crate::page::PAGE_SIZE as u64;
                    let mut prev_end = HEADER_LEN as u64;
                    for &(_, off, vlen) in values {
                        let (s, e) = (off as u64, off as u64 + vlen);
                        if s < prev_end || e > len {
                            let what = if e > len {
                                "value page run shorter than its value"
                            } else {
                                "packed values overlap"
                            };
                            self.problem(run, what);
                            break;
                        }
                        prev_end = e;
                    }
                    self.mark(run, h.run_pages as u64);
                }
            }
        }
    }

    fn node(&mut self, p: u64, lo: Option<&[u8]>, hi: Option<&[u8]>, depth: u32) {
        if depth as usize > MAX_DEPTH {
            self.problem(p, "tree deeper than 32 levels");
            return;
        }
        let (img, h) = match self.page(p) {
            Ok(x) => x,
            Err(c) => return self.damage(c, p, 1, true),
        };
        self.mark(p, 1);
        let in_bounds = |k: &[u8]| lo.is_none_or(|l| k >= l) && hi.is_none_or(|h| k < h);
        match h.kind {
            PageKind::Leaf => {
                if let Some(d) = self.leaf_depth {
                    if d != depth {
                        self.problem(p, format!("leaf at depth {depth}, others at {d}"));
                    }
                } else {
                    self.leaf_depth = Some(depth);
                    self.report.depth = depth;
                }
                let v = LeafView::new(img, &h);
                let mut prev: Option<&[u8]> = None;
                let mut overflow = Vec::new();
                let mut packed: Vec<(u64, u32, u64)> = Vec::new();
                for i in 0..v.len() {
                    let Some((k, val)) = v.cell(i) else {
                        self.problem(p, format!("malformed leaf cell {i}"));
                        // The cells after it (and their overflow runs) are not reached.
                        self.subtree_hidden = true;
                        break;
                    };
                    if prev.is_some_and(|q| q >= k) {
                        self.problem(p, format!("keys out of order at cell {i}"));
                    }
                    if !in_bounds(k) {
                        self.problem(p, format!("key at cell {i} outside its parent's range"));
                    }
                    if k.is_empty() || k.len() > crate::MAX_KEY_LEN {
                        self.problem(p, format!("key length {} at cell {i}", k.len()));
                    }
                    prev = Some(k);
                    self.report.entries += 1;
                    match val {
                        ValRef::Overflow { page, len } => overflow.push((page, len)),
                        ValRef::Packed { page, off, len } => packed.push((page, off, len)),
                        ValRef::Inline(_) => {}
                    }
                }
                // Overflow runs after the leaf's own problems: a page's problems stay one entry.
                for (page, len) in overflow {
                    let want = crate::page::overflow_run_pages(len as usize) as u64;
                    match self.page(page) {
                        Err(c) => self.damage(c, page, want, false),
                        Ok((_, oh)) if oh.kind != PageKind::Overflow => {
                            let c = self.corruption(page, "expected an overflow page");
                            self.damage(c, page, 1, true);
                        }
                        Ok((_, oh)) if (oh.run_pages as u64) < want => {
                            let c = self.corruption(page, "overflow run shorter than its value");
                            self.damage(c, page, oh.run_pages as u64, true);
                        }
                        Ok((_, oh)) => self.mark(page, oh.run_pages as u64),
                    }
                }
                self.value_runs(&mut packed);
            }
            PageKind::Branch => {
                let v = BranchView::new(img, &h);
                let mut keys = Vec::with_capacity(v.keys());
                for i in 0..v.keys() {
                    match v.key(i) {
                        Some(k) => keys.push(k),
                        None => {
                            let c = self.corruption(p, format!("malformed branch key {i}"));
                            return self.damage(c, p, 0, true);
                        }
                    }
                }
                if keys.windows(2).any(|w| w[0] >= w[1]) {
                    self.problem(p, "separator keys out of order");
                }
                if keys.iter().any(|k| !in_bounds(k)) {
                    self.problem(p, "separator outside its parent's range");
                }
                for i in 0..=keys.len() {
                    let Some(c) = v.child(i) else {
                        let c = self.corruption(p, format!("malformed child {i}"));
                        return self.damage(c, p, 0, true);
                    };
                    let clo = if i == 0 { lo } else { Some(keys[i - 1]) };
                    let chi = if i == keys.len() { hi } else { Some(keys[i]) };
                    self.node(c, clo, chi, depth + 1);
                }
            }
            _ => {
                let c = self.corruption(p, "expected a branch or leaf page");
                self.damage(c, p, 0, true);
            }
        }
    }

    fn corruption(&self, page: u64, what: impl Into<String>) -> Corruption {
        Corruption {
            file: self.state.path().to_path_buf(),
            page: Some(page),
            offset: None,
            what: what.into(),
        }
    }

    /// Reads the free-space map into `free` (one bit per page); pages whose bits cannot be
    /// read (a damaged directory or bitmap page) go to `free_unknown`.
    fn free_map(&mut self, free: &mut [u64]) {
        let state = self.state;
        if state.freedir == 0 {
            return;
        }
        let everything = (0, state.next_page);
        let (img, h) = match self.page(state.freedir) {
            Ok(x) => x,
            Err(c) => {
                self.free_unknown.push(everything);
                return self.damage(c, state.freedir, 1, false);
            }
        };
        self.mark(state.freedir, 1);
        if h.kind != PageKind::FreeDir {
            self.free_unknown.push(everything);
            let c = self.corruption(state.freedir, "expected a free-space directory page");
            return self.damage(c, state.freedir, 0, false);
        }
        let n = h.count as usize;
        let pages: Vec<u64> = (0..n)
            .filter_map(|i| crate::page::rd_u64(img, HEADER_LEN + 8 * i))
            .collect();
        for (idx, bp) in pages.into_iter().enumerate() {
            let base = idx as u64 * crate::freespace::BITS_PER_BITMAP;
            let covered = (base, base.saturating_add(crate::freespace::BITS_PER_BITMAP));
            let (bimg, bh) = match self.page(bp) {
                Ok(x) => x,
                Err(c) => {
                    self.free_unknown.push(covered);
                    self.damage(c, bp, 1, false);
                    continue;
                }
            };
            self.mark(bp, 1);
            if bh.kind != PageKind::FreeBitmap {
                self.free_unknown.push(covered);
                let c = self.corruption(bp, "expected a free-space bitmap page");
                self.damage(c, bp, 0, false);
                continue;
            }
            for w in 0..crate::freespace::WORDS {
                let first = base + w as u64 * 64;
                if first >= state.next_page {
                    break;
                }
                let bits = crate::page::rd_u64(bimg, HEADER_LEN + 8 * w).unwrap_or(0);
                free[(first / 64) as usize] |=
                    crate::freespace::free_bits_below(first, bits, state.next_page);
            }
        }
    }
}

/// Checks the snapshot `state`: page checksums, key order and bounds, equal leaf depth,
/// overflow runs, and that every page below `next_page` is either in use or marked free in
/// the free-space map, never both and never neither.
///
/// Causes, not cascades: a damaged page is one problem; the pages it hides (its subtree, the
/// pages of a damaged overflow run, the pages a damaged free-space page covers) are summed up
/// in [`CheckReport::hidden`] instead of being reported as leaked, and the recorded key count
/// is not compared with the leaves. Without damage, unreached pages that are not free are
/// leaks, one problem per run of consecutive pages. Memory: two bits per page of the file.
pub(crate) fn check(state: &State, free_space: bool) -> CheckReport {
    let words = (state.next_page as usize).div_ceil(64) + 1;
    let mut c = Checker {
        state,
        report: CheckReport {
            txn_id: state.txn_id,
            free_space_checked: free_space,
            ..Default::default()
        },
        used: vec![0; words],
        leaf_depth: None,
        parts: 0,
        more: 0,
        damaged: Vec::new(),
        subtree_hidden: false,
        free_unknown: Vec::new(),
    };
    c.mark(0, 2.min(state.next_page));
    if state.root != 0 {
        c.node(state.root, None, None, 1);
    }
    let mut free = vec![0u64; words];
    if free_space {
        c.free_map(&mut free);
    }
    let mut hidden = Runs::default();
    let mut leaked = Runs::default();
    let mut marked_free = Runs::default();
    for p in 0..state.next_page {
        let (w, b) = ((p / 64) as usize, p % 64);
        let used = c.used[w] & (1 << b) != 0;
        let is_free = free[w] & (1 << b) != 0;
        match (used, is_free) {
            (true, true) => marked_free.add(p),
            (false, false) if !free_space => {}
            (false, false) => {
                if c.subtree_hidden || c.free_unknown.iter().any(|&(a, e)| p >= a && p < e) {
                    hidden.add(p);
                } else {
                    leaked.add(p);
                }
            }
            (true, false) => c.report.pages_in_use += 1,
            (false, true) => c.report.pages_free += 1,
        }
    }
    let span = |a: u64, b: u64| {
        if a == b {
            String::new()
        } else {
            format!(" (pages {a}..={b}, {} pages)", b - a + 1)
        }
    };
    for (a, b) in marked_free.0 {
        c.problem(a, format!("page in use but marked free{}", span(a, b)));
    }
    for (a, b) in leaked.0 {
        c.problem(
            a,
            format!("page neither in use nor free (leaked){}", span(a, b)),
        );
    }
    if c.damaged.is_empty() {
        if c.report.entries != state.entries {
            let (e, s) = (c.report.entries, state.entries);
            c.problem(state.root, format!("{e} keys in the leaves, {s} recorded"));
        }
    } else {
        let mut h = HiddenPages {
            damaged: c.damaged.len() as u64,
            first: u64::MAX,
            entries_not_counted: state.entries.saturating_sub(c.report.entries),
            ..Default::default()
        };
        let runs = c.damaged.iter().map(|&(p, n)| (p, p + n.max(1) - 1));
        for (a, b) in runs.chain(hidden.0.iter().copied()) {
            h.pages += b - a + 1;
            h.first = h.first.min(a);
            h.last = h.last.max(b);
        }
        c.report.hidden = Some(h);
    }
    c.report
}
