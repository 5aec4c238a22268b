//! Free space: the persistent free-space map and the writer's in-memory allocator.
//!
//! The map is pages committed with every transaction, like the B+tree, but updated in place
//! (see `txn/write.rs`): a directory page (kind 5) lists bitmap pages (kind 6); each bitmap page
//! holds one bit per page for 65,280 pages (8,160 bytes × 8), 1 = free. Pages at or above the state's `next_page` are not in use
//! yet and have no meaningful bit. Because the map travels in the same journal records as the
//! tree, recovery needs no extra step and a crash never leaks or double-allocates a page.
//!
//! The writer keeps, in memory, the extents it may hand out now ([`Allocator::reusable`]) and
//! the pages freed by recent transactions that an older snapshot may still read
//! ([`Allocator::pending`]): a page freed by txn `t` is reused only once no snapshot older than
//! `t` lives (as LMDB's free list).

use std::collections::{BTreeMap, VecDeque};

use crate::page::{BODY_LEN, HEADER_LEN};

/// Pages one bitmap page covers.
pub const BITS_PER_BITMAP: u64 = (BODY_LEN * 8) as u64;
/// Bitmap pages one directory page lists (so the map covers 1,020 × 65,280 pages ≈ 508 GiB).
pub const DIR_CAPACITY: usize = BODY_LEN / 8;
/// u64 words in a bitmap page.
pub const WORDS: usize = BODY_LEN / 8;
/// Pages in one aligned 1 MiB run (the hole-punching unit).
pub const RUN_PAGES: u64 = 128;

const _: () = assert!(BITS_PER_BITMAP.is_multiple_of(RUN_PAGES));
const _: () = assert!(WORDS * 8 + HEADER_LEN == crate::page::PAGE_SIZE);

/// Extents of pages: start -> length, non-overlapping, coalesced.
#[derive(Debug, Default, Clone)]
pub(crate) struct Extents {
    map: BTreeMap<u64, u64>,
    pages: u64,
}

impl Extents {
    /// Pages held.
    pub fn pages(&self) -> u64 {
        self.pages
    }

    /// Free pages held below `limit`, counted up to `need` at most: the extents are summed from
    /// the lowest and the count stops once it reaches `need`, so a call costs at most `need`
    /// extents (each holds at least one page), however many the map holds. Compaction asks
    /// this before every page it moves (regression: summing every extent below the limit made a
    /// compaction's CPU time per page grow with the map's extents, one per free page when free
    /// and used pages alternate).
    pub fn pages_below_up_to(&self, limit: u64, need: u64) -> u64 {
        let mut n = 0;
        // Bounded: at most `need` turns, each adds at least one page.
        for (&s, &l) in self.map.range(..limit) {
            if n >= need {
                break;
            }
            n += l.min(limit - s);
        }
        n.min(need)
    }

    /// The last extent, when it ends exactly at `end`: its start.
    pub fn tail_start(&self, end: u64) -> Option<u64> {
        let (&s, &l) = self.map.iter().next_back()?;
        (s + l == end).then_some(s)
    }

    /// Removes every page at or above `from` (the caller knows they are all held: the tail
    /// extent). Returns the pages removed.
    pub fn remove_from(&mut self, from: u64) -> u64 {
        let mut removed = 0;
        let at: Vec<(u64, u64)> = self
            .map
            .range(..)
            .filter(|(&s, &l)| s + l > from)
            .map(|(&s, &l)| (s, l))
            .collect();
        for (s, l) in at {
            self.map.remove(&s);
            let keep = from.saturating_sub(s);
            if keep > 0 {
                self.map.insert(s, keep);
            }
            removed += l - keep;
        }
        self.pages -= removed;
        removed
    }

    /// Adds `start..start+len` (must not overlap anything held).
    pub fn insert(&mut self, mut start: u64, mut len: u64) {
        if len == 0 {
            return;
        }
        debug_assert!(
            !self.overlaps(start, len),
            "double free of pages {start}+{len}"
        );
        self.pages += len;
        if let Some((&ps, &pl)) = self.map.range(..start).next_back() {
            if ps + pl == start {
                self.map.remove(&ps);
                start = ps;
                len += pl;
            }
        }
        if let Some(&nl) = self.map.get(&(start + len)) {
            self.map.remove(&(start + len));
            len += nl;
        }
        self.map.insert(start, len);
    }

    fn overlaps(&self, start: u64, len: u64) -> bool {
        if let Some((&ps, &pl)) = self.map.range(..start + len).next_back() {
            return ps + pl > start;
        }
        false
    }

    /// Takes the first run of `n` contiguous pages (first fit, lowest address).
    pub fn take(&mut self, n: u64) -> Option<u64> {
        let (&s, &l) = self.map.iter().find(|(_, &l)| l >= n)?;
        self.map.remove(&s);
        if l > n {
            self.map.insert(s + n, l - n);
        }
        self.pages -= n;
        Some(s)
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.map.iter().map(|(&s, &l)| (s, l))
    }
}

/// The writer's allocator state, carried from transaction to transaction.
#[derive(Debug, Default)]
pub(crate) struct Allocator {
    /// Free pages no snapshot can read: handed out first, lowest address first.
    pub reusable: Extents,
    /// Pages freed by transaction `t`, waiting for every snapshot older than `t` to end.
    pub pending: VecDeque<(u64, Vec<(u64, u64)>)>,
    pub pending_pages: u64,
    /// Pages freed by transaction `t` whose freed versions were written by transactions
    /// `>= a` (the entry's second field) above every flush target started at the time: they
    /// never reached the data file, so no recovery reads them from there, and they wait only for
    /// the snapshots older than `t` (and for no flush to have targeted `a` or later, else they
    /// join `pending`). See `release_early`.
    pub early: VecDeque<EarlyFreed>,
    /// Emptied run lists of released entries, reused for the next commits' freed pages (at
    /// most [`SPARE_RUN_LISTS`]), so a commit allocates none in the steady state.
    spare: Vec<Vec<(u64, u64)>>,
}

/// Pages of `Allocator::early`: (txn that freed them, oldest txn that wrote their freed
/// versions, runs).
pub(crate) type EarlyFreed = (u64, u64, Vec<(u64, u64)>);

/// Emptied run lists the allocator keeps for reuse.
const SPARE_RUN_LISTS: usize = 16;

impl Allocator {
    /// Builds the allocator from the free bits of a committed map (no snapshot is older).
    pub fn from_bitmaps<'a>(
        bitmaps: impl Iterator<Item = (usize, &'a [u64])>,
        next_page: u64,
    ) -> Allocator {
        let mut a = Allocator::default();
        for (idx, words) in bitmaps {
            let base = idx as u64 * BITS_PER_BITMAP;
            let mut run: Option<(u64, u64)> = None;
            for (w, &bits) in words.iter().enumerate() {
                let first = base + w as u64 * 64;
                let mut bits = free_bits_below(first, bits, next_page);
                // One step per run of set bits in the word, not one per bit: a storage's open
                // reads every bitmap word (65,280 pages each).
                while bits != 0 {
                    let b = bits.trailing_zeros() as u64;
                    let ones = (bits >> b).trailing_ones() as u64;
                    let start = first + b;
                    match &mut run {
                        Some((s, l)) if *s + *l == start => *l += ones,
                        _ => {
                            if let Some((s, l)) = run.replace((start, ones)) {
                                a.reusable.insert(s, l);
                            }
                        }
                    }
                    bits = if b + ones >= 64 {
                        0
                    } else {
                        bits & (!0u64 << (b + ones))
                    };
                }
            }
            if let Some((s, l)) = run {
                a.reusable.insert(s, l);
            }
        }
        a
    }

    /// Releases the `early` entries of every transaction `t <= oldest_live`: to `reusable`
    /// when no flush has targeted their oldest writer `a` or later (`flush_started < a`), else
    /// to `pending`, where they wait for a durable header as usual. Returns the pages made
    /// reusable.
    ///
    /// Why this is safe (design.md 4.4): such a page P was written by `a` and freed by `t`; its
    /// version in `t`'s diff base comes, at recovery, either from replaying `a` (a header below
    /// `a`) or not at all (a header at or past `t`). A header in `[a, t)` would need P's version
    /// in the data file, where a later flush could already have written P's next use; but the
    /// header only reaches a flush target, no flush target so far is `>= a`, and every later
    /// one is at least the oldest live snapshot, `>= t` once this runs.
    pub fn release_early(&mut self, oldest_live: u64, flush_started: u64) -> u64 {
        let mut released = 0;
        while let Some((t, _, _)) = self.early.front() {
            if *t > oldest_live {
                break;
            }
            let Some((t, a, runs)) = self.early.pop_front() else {
                break;
            };
            if flush_started < a {
                for &(s, l) in &runs {
                    self.pending_pages -= l;
                    released += l;
                    self.reusable.insert(s, l);
                }
                self.recycle(runs);
            } else {
                // Out of txn order in `pending` only delays a release, never hastens one.
                self.pending.push_back((t, runs));
            }
        }
        released
    }

    /// An empty run list, recycled when one is spare.
    pub fn run_list(&mut self) -> Vec<(u64, u64)> {
        self.spare.pop().unwrap_or_default()
    }

    /// Keeps `runs`' buffer for [`Allocator::run_list`] (when fewer than 16 are spare).
    pub fn recycle(&mut self, mut runs: Vec<(u64, u64)>) {
        if self.spare.len() < SPARE_RUN_LISTS {
            runs.clear();
            self.spare.push(runs);
        }
    }

    /// Moves to `reusable` the pages of every transaction `<= oldest_live` (the oldest txn id a
    /// snapshot reads: pages freed by `t <= oldest_live` are unreachable from it).
    pub fn release(&mut self, oldest_live: u64) {
        while let Some((t, _)) = self.pending.front() {
            if *t > oldest_live {
                break;
            }
            if let Some((_, runs)) = self.pending.pop_front() {
                for &(s, l) in &runs {
                    self.pending_pages -= l;
                    self.reusable.insert(s, l);
                }
                self.recycle(runs);
            }
        }
    }
}

/// Reads bit `p` (relative to its bitmap) of `words`.
#[cfg(test)]
pub(crate) fn bit(words: &[u64], p: u64) -> bool {
    let i = (p % BITS_PER_BITMAP) as usize;
    words
        .get(i / 64)
        .map(|w| w & (1 << (i % 64)) != 0)
        .unwrap_or(false)
}

/// Sets bit `p` of `words` to `free`.
#[cfg(test)]
pub(crate) fn set_bit(words: &mut [u64], p: u64, free: bool) {
    let i = (p % BITS_PER_BITMAP) as usize;
    if free {
        words[i / 64] |= 1 << (i % 64);
    } else {
        words[i / 64] &= !(1 << (i % 64));
    }
}

/// The bits of one bitmap word whose first page is `first` (a multiple of 64), less those of
/// pages at or above `next_page`, which have no meaningful bit.
pub(crate) fn free_bits_below(first: u64, bits: u64, next_page: u64) -> u64 {
    match next_page.saturating_sub(first) {
        0 => 0,
        n if n < 64 => bits & ((1u64 << n) - 1),
        _ => bits,
    }
}

/// Sets bit `p` (relative to its bitmap) of a bitmap page body `body` (bytes after the page
/// header) to `free`. The same bit as [`set_bit`] on the body read as little-endian words:
/// bit `i` is bit `i % 8` of byte `i / 8`.
pub(crate) fn set_bit_in_body(body: &mut [u8], p: u64, free: bool) {
    let i = (p % BITS_PER_BITMAP) as usize;
    if free {
        body[i / 8] |= 1 << (i % 8);
    } else {
        body[i / 8] &= !(1 << (i % 8));
    }
}

/// Indexes (within the file) of aligned 1 MiB runs wholly free in `words` of bitmap `idx`,
/// below `next_page`.
pub(crate) fn free_runs(idx: usize, words: &[u64], next_page: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let per = (RUN_PAGES / 64) as usize;
    for (r, chunk) in words.chunks(per).enumerate() {
        let first = idx as u64 * BITS_PER_BITMAP + r as u64 * RUN_PAGES;
        if first + RUN_PAGES <= next_page
            && chunk.len() == per
            && chunk.iter().all(|&w| w == u64::MAX)
        {
            out.push(first / RUN_PAGES);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_below_up_to_counts_below_the_limit_and_stops_at_need() {
        let mut e = Extents::default();
        // Free pages alternating with used ones: one extent per page, and a run across 100.
        for p in (10..60).step_by(2) {
            e.insert(p, 1);
        }
        e.insert(95, 10);
        let below = |limit, need| e.pages_below_up_to(limit, need);
        assert_eq!(below(100, 1000), 25 + 5);
        assert_eq!(below(11, 1000), 1);
        assert_eq!(below(10, 1000), 0);
        assert_eq!(below(100, 7), 7);
        assert_eq!(below(100, 0), 0);
        assert_eq!(below(200, 40), 35);
    }

    #[test]
    fn extents_coalesce_and_first_fit() {
        let mut e = Extents::default();
        e.insert(10, 2);
        e.insert(14, 2);
        e.insert(12, 2);
        assert_eq!(e.iter().collect::<Vec<_>>(), vec![(10, 6)]);
        e.insert(30, 10);
        assert_eq!(e.take(8), Some(30));
        assert_eq!(e.take(1), Some(10));
        assert_eq!(e.pages(), 5 + 2);
        assert_eq!(e.take(100), None);
    }

    #[test]
    fn release_waits_for_old_snapshots() {
        let mut a = Allocator::default();
        a.pending.push_back((5, vec![(100, 1)]));
        a.pending.push_back((7, vec![(200, 2)]));
        a.pending_pages = 3;
        a.release(4);
        assert_eq!(a.reusable.pages(), 0);
        a.release(6);
        assert_eq!(a.reusable.pages(), 1);
        a.release(100);
        assert_eq!(a.reusable.pages(), 3);
    }

    #[test]
    fn body_bits_are_little_endian_word_bits() {
        let mut words = vec![0u64; WORDS];
        let mut body = vec![0u8; WORDS * 8];
        for (p, free) in [
            (0u64, true),
            (7, true),
            (8, true),
            (63, true),
            (64, true),
            (65_279, true),
            (8, false),
        ] {
            set_bit(&mut words, p, free);
            set_bit_in_body(&mut body, p, free);
        }
        let from_body: Vec<u64> = body
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(from_body, words);
        assert!(bit(&words, 7) && !bit(&words, 8) && bit(&words, 65_279));
    }

    #[test]
    fn bitmap_scan_and_runs() {
        let mut words = vec![0u64; WORDS];
        for p in 128..256 {
            set_bit(&mut words, p, true);
        }
        set_bit(&mut words, 300, true);
        assert!(bit(&words, 300));
        let a = Allocator::from_bitmaps(std::iter::once((0usize, &words[..])), 1000);
        assert_eq!(
            a.reusable.iter().collect::<Vec<_>>(),
            vec![(128, 128), (300, 1)]
        );
        assert_eq!(free_runs(0, &words, 1000), vec![1]);
        assert_eq!(free_runs(0, &words, 200), Vec::<u64>::new());
    }

    /// The word-at-a-time scan finds exactly the runs a bit-by-bit scan finds: runs that cross
    /// words, whole words of ones, single bits, and a `next_page` inside a word.
    #[test]
    fn bitmap_runs_match_a_bit_by_bit_scan() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..200 {
            let mut words = vec![0u64; WORDS];
            for w in words.iter_mut().take(40) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *w = match x % 4 {
                    0 => 0,
                    1 => !0,
                    2 => x,
                    _ => x & (x >> 3),
                };
            }
            let next_page = 1 + (round * 13) % (40 * 64);
            let mut expect = Vec::new();
            let mut run: Option<(u64, u64)> = None;
            for p in 0..40 * 64 {
                if p < next_page && bit(&words, p) {
                    match &mut run {
                        Some((_, l)) => *l += 1,
                        None => run = Some((p, 1)),
                    }
                } else if let Some(r) = run.take() {
                    expect.push(r);
                }
            }
            expect.extend(run);
            let a = Allocator::from_bitmaps(std::iter::once((0usize, &words[..])), next_page);
            let got: Vec<(u64, u64)> = a.reusable.iter().collect();
            assert_eq!(got, expect, "round {round}, next_page {next_page}");
        }
    }
}
