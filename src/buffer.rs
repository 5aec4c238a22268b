//! The write buffer of a buffered storage ([`crate::Options::write_buffer_bytes`]): committed
//! entries not yet applied to the B+tree, and the merge that lets every read see them over the
//! tree (design.md section 16).
//!
//! A buffered commit journals its operations as one logical record (design.md 3.9) and adds
//! them here instead of copying leaves; an *apply* (an ordinary page transaction) later moves
//! them into the tree, so a leaf is written once for the many entries pending on it rather
//! than once per entry.
//!
//! The buffer is a short list of immutable sorted *runs*, shared by reference count, inside
//! the published [`crate::state::State`]: a commit adds its operations (already sorted) as a
//! new run, and runs of similar size are merged, newest over oldest, as a binary counter
//! carries, so that each run is at least [`MERGE_RATIO`] times the size of the next newer one
//! (the logarithmic method of Bentley and Saxe, as an LSM-tree's in-memory levels). A commit
//! therefore copies no older entry unless it merges runs, and an entry is copied about
//! log(entries / commit size) times in all, sequentially; a lookup searches each run, newest
//! first. A snapshot holds the runs as of its own transaction, so reads see exactly the
//! commits up to theirs (invariant I13), and an apply never changes what an older snapshot
//! sees.

use std::cmp::Ordering;
use std::ops::Bound;
use std::sync::Arc;

mod bloom;
use bloom::{key_hash, Bloom};

/// Bytes of write buffers of the process ([`live_buffer_bytes`]).
static LIVE_BUFFER_BYTES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Bytes the write buffers of every open storage of the process count for now (each entry its
/// key, its value and 16 bytes, as [`crate::StorageStats::buffer_bytes`]): the sibling of
/// [`crate::live_image_bytes`], and held with it under the actor runtime's memory budget. A
/// storage counts its current buffer from open to close; an older snapshot that still holds a
/// buffer already applied is not counted (its runs are shared with the current buffer or are
/// about to be freed). One relaxed atomic load.
pub fn live_buffer_bytes() -> u64 {
    LIVE_BUFFER_BYTES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Moves the process count of buffered bytes from `old` to `new` (a storage's buffer changed
/// size, was opened or closed).
pub(crate) fn account(old: u64, new: u64) {
    use std::sync::atomic::Ordering::Relaxed;
    if new >= old {
        LIVE_BUFFER_BYTES.fetch_add(new - old, Relaxed);
    } else {
        LIVE_BUFFER_BYTES.fetch_sub(old - new, Relaxed);
    }
}

/// One buffered operation as read from a run: the key, and the value put or `None` for a
/// delete (a tombstone hiding the tree's entry).
pub(crate) type Entry<'a> = (&'a [u8], Option<&'a [u8]>);

/// How much larger than the next newer run each run is kept: a new run is merged into the one
/// before it while that one holds at most this many times its entries. With 4 the buffer holds
/// at most log4(entries / smallest commit) + 1 runs (10 for a million one-key commits), and an
/// entry is copied about twice per level it passes.
pub(crate) const MERGE_RATIO: usize = 4;

/// Runs of at least this many entries get a [`Bloom`] filter: a smaller one is searched in a
/// few cache lines anyway.
const BLOOM_MIN: usize = 256;

/// Where one entry of a [`Run`] lies in the run's bytes: its key at `at`, `klen` bytes, then
/// its value, `vlen - 1` bytes (`vlen` 0: a tombstone, no value).
#[derive(Clone, Copy)]
struct Slot {
    at: u64,
    vlen: u32,
    klen: u16,
}

/// Bytes a run spends per entry besides its key and value: its [`Slot`].
const SLOT_BYTES: usize = std::mem::size_of::<Slot>();

/// One run of a [`Buffer`]: entries strictly increasing by key, their keys and values back to
/// back in one allocation with a 16-byte slot each (an index entry of a 30-byte key takes 46
/// bytes; as a pair of an inline key and a shared value it took about 96), and, for a large
/// run, a filter of its keys, built by the first lookup that reaches the run (a storage that
/// only writes, an index, never builds one). Immutable once built ([`RunBuilder`]).
pub(crate) struct Run {
    bytes: Box<[u8]>,
    slots: Box<[Slot]>,
    bloom: std::sync::OnceLock<Bloom>,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Run({} entries, {} bytes)", self.len(), self.bytes.len())
    }
}

impl Run {
    /// Entries in the run.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// True when the run holds no entry.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The key of entry `i` (`i < len`).
    fn key(&self, i: usize) -> &[u8] {
        let s = self.slots[i];
        let at = s.at as usize;
        &self.bytes[at..at + s.klen as usize]
    }

    /// Entry `i` (`i < len`).
    pub fn entry(&self, i: usize) -> Entry<'_> {
        let s = self.slots[i];
        let at = s.at as usize;
        let k_end = at + s.klen as usize;
        let v = (s.vlen > 0).then(|| &self.bytes[k_end..k_end + s.vlen as usize - 1]);
        (&self.bytes[at..k_end], v)
    }

    /// Every entry, in key order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = Entry<'_>> + ExactSizeIterator + Clone {
        (0..self.len()).map(|i| self.entry(i))
    }

    /// [`entry_bytes`] of every entry together.
    pub fn entry_bytes(&self) -> u64 {
        (self.bytes.len() + SLOT_BYTES * self.slots.len()) as u64
    }

    /// The first index whose key is not below `key` (`inclusive`) or not at or below it.
    fn lower(&self, key: &[u8], inclusive: bool) -> usize {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            let k = self.key(mid);
            if k < key || (!inclusive && k == key) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// The value of `key` in this run (`Some(None)`: a tombstone).
    fn find(&self, key: &[u8]) -> Option<Option<&[u8]>> {
        let i = self.lower(key, true);
        (i < self.len() && self.key(i) == key).then(|| self.entry(i).1)
    }

    /// False when the run cannot hold a key of hash `h` ([`key_hash`]); asked of runs of
    /// [`BLOOM_MIN`] entries or more, the first ask building the filter.
    fn may_contain(&self, h: u64) -> bool {
        self.bloom
            .get_or_init(|| {
                let keys = (0..self.len()).map(|i| key_hash(self.key(i)));
                Bloom::new(self.len(), keys)
            })
            .may_contain(h)
    }
}

/// Builds a [`Run`] from entries pushed in strictly increasing key order.
#[derive(Default)]
pub(crate) struct RunBuilder {
    bytes: Vec<u8>,
    slots: Vec<Slot>,
}

impl RunBuilder {
    /// A builder with room for `entries` entries of `bytes` key and value bytes together.
    pub fn with_capacity(entries: usize, bytes: usize) -> RunBuilder {
        RunBuilder {
            bytes: Vec::with_capacity(bytes),
            slots: Vec::with_capacity(entries),
        }
    }

    /// Appends `(key, value)`, whose key must be above every key pushed before: keys of at most
    /// [`crate::MAX_KEY_LEN`] bytes and values of at most [`crate::MAX_VALUE_LEN`], as every
    /// operation a transaction or a journal record holds.
    pub fn push(&mut self, (k, v): Entry<'_>) {
        debug_assert!(self.slots.last().is_none_or(|_| self.last_key() < k));
        let at = self.bytes.len() as u64;
        self.bytes.extend_from_slice(k);
        if let Some(v) = v {
            self.bytes.extend_from_slice(v);
        }
        self.slots.push(Slot {
            at,
            // A value's length + 1 (0: a tombstone); values fit u32 (MAX_VALUE_LEN).
            vlen: v.map_or(0, |v| u32::try_from(v.len()).unwrap_or(u32::MAX - 1) + 1),
            klen: u16::try_from(k.len()).unwrap_or(u16::MAX),
        });
    }

    fn last_key(&self) -> &[u8] {
        self.slots.last().map_or(&[][..], |s| {
            let at = s.at as usize;
            &self.bytes[at..at + s.klen as usize]
        })
    }

    /// The run of the entries pushed.
    pub fn finish(self) -> Run {
        Run {
            bytes: self.bytes.into_boxed_slice(),
            slots: self.slots.into_boxed_slice(),
            bloom: std::sync::OnceLock::new(),
        }
    }
}

impl Default for Run {
    /// A run of no entries.
    fn default() -> Run {
        RunBuilder::default().finish()
    }
}

impl<'a> FromIterator<Entry<'a>> for Run {
    /// The run of `entries`, which must be strictly increasing by key.
    fn from_iter<I: IntoIterator<Item = Entry<'a>>>(entries: I) -> Run {
        let mut b = RunBuilder::default();
        for e in entries {
            b.push(e);
        }
        b.finish()
    }
}

/// Buffered entries: sorted runs, oldest first, each strictly increasing by key; on a key held
/// by several runs the newest run's entry is the buffer's. Cloning shares the runs.
#[derive(Clone, Default)]
pub(crate) struct Buffer {
    runs: Vec<Arc<Run>>,
    /// Entries in all runs together (a key in two runs counts twice until they merge).
    held: usize,
    /// The oldest runs that a background apply is writing into the tree (design.md 16.1):
    /// [`Buffer::push_run`] never merges a newer run into them, so that what was committed
    /// after the apply began stays apart ([`Buffer::newer_than_frozen`]).
    frozen: usize,
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sizes: Vec<usize> = self.runs.iter().map(|r| r.len()).collect();
        write!(f, "Buffer(runs {sizes:?})")
    }
}

impl Buffer {
    /// A buffer of one run, shared.
    pub fn from_run(run: Arc<Run>) -> Buffer {
        if run.is_empty() {
            return Buffer::default();
        }
        Buffer {
            held: run.len(),
            runs: vec![run],
            frozen: 0,
        }
    }

    /// This buffer with every run it holds now frozen: a background apply writes them into
    /// the tree while later commits add runs of their own above them.
    pub fn freeze(&self) -> Buffer {
        Buffer {
            frozen: self.runs.len(),
            ..self.clone()
        }
    }

    /// This buffer with no run frozen (a background apply gave up).
    pub fn thawed(&self) -> Buffer {
        Buffer {
            frozen: 0,
            ..self.clone()
        }
    }

    /// Runs frozen by a background apply ([`Buffer::freeze`]).
    pub fn frozen_runs(&self) -> usize {
        self.frozen
    }

    /// The runs above the frozen ones: what was committed since a background apply began.
    pub fn newer_than_frozen(&self) -> Buffer {
        let runs = self.runs[self.frozen.min(self.runs.len())..].to_vec();
        Buffer {
            held: runs.iter().map(|r| r.len()).sum(),
            runs,
            frozen: 0,
        }
    }

    /// True when no entry is buffered.
    pub fn is_empty(&self) -> bool {
        self.held == 0
    }

    /// Entries held: each key once per run that holds it (the runs merge keys as they merge).
    pub fn len(&self) -> usize {
        self.held
    }

    /// The newest operation on `key`, if buffered (`Some(None)`: a delete): one binary search
    /// per run, newest run first, skipping a run whose keys' range or filter rules the key out.
    pub fn get(&self, key: &[u8]) -> Option<Option<&[u8]>> {
        // Hashed once, and only if a run has a filter to ask.
        let mut h = None;
        self.runs.iter().rev().find_map(|run| {
            let n = run.len();
            if n == 0 || key < run.key(0) || key > run.key(n - 1) {
                return None;
            }
            if n >= BLOOM_MIN && !run.may_contain(*h.get_or_insert_with(|| key_hash(key))) {
                return None;
            }
            run.find(key)
        })
    }

    /// Adds the operations of one commit, newer than every entry held (a caller whose entries
    /// may not be in order, a journal record being replayed, uses [`Buffer::push_unsorted`]).
    /// Returns the change of [`entry_bytes`] over the entries held: the new entries' bytes,
    /// less those of older entries a merge of runs dropped.
    pub fn push_run(&mut self, run: Run) -> i64 {
        if run.is_empty() {
            return 0;
        }
        let mut delta = run.entry_bytes() as i64;
        self.held += run.len();
        self.runs.push(Arc::new(run));
        // Bounded: every merge removes a run. Frozen runs never merge.
        while self.runs.len() >= self.frozen + 2 {
            let n = self.runs.len();
            if self.runs[n - 2].len() > MERGE_RATIO * self.runs[n - 1].len() {
                break;
            }
            let (Some(newer), Some(older)) = (self.runs.pop(), self.runs.pop()) else {
                unreachable!("two runs are held");
            };
            let (merged, shadowed) = merge_runs(&older, &newer);
            self.held -= older.len() + newer.len() - merged.len();
            delta -= shadowed as i64;
            self.runs.push(Arc::new(merged));
        }
        delta
    }

    /// [`Buffer::push_run`] of operations in any order, the last of a repeated key winning.
    pub fn push_unsorted(&mut self, mut entries: Vec<Entry<'_>>) -> i64 {
        if !entries.windows(2).all(|w| w[0].0 < w[1].0) {
            // A stable sort keeps a repeated key's operations in order: keep the last of each.
            entries.sort_by(|a, b| a.0.cmp(b.0));
            let mut out: Vec<Entry<'_>> = Vec::with_capacity(entries.len());
            for e in entries {
                match out.last_mut() {
                    Some(l) if l.0 == e.0 => *l = e,
                    _ => out.push(e),
                }
            }
            entries = out;
        }
        self.push_run(entries.into_iter().collect())
    }

    /// The buffer's entries within `(start, end)`, each key once with its newest operation, in
    /// key order from either end. `start` past `end` selects nothing.
    pub fn range(&self, start: Bound<&[u8]>, end: Bound<&[u8]>) -> Merged<'_> {
        if range_is_empty(start, end) {
            return Merged { runs: Vec::new() };
        }
        let runs = self
            .runs
            .iter()
            .map(|run| {
                let lo = match start {
                    Bound::Unbounded => 0,
                    Bound::Included(s) => run.lower(s, true),
                    Bound::Excluded(s) => run.lower(s, false),
                };
                let hi = match end {
                    Bound::Unbounded => run.len(),
                    Bound::Included(e) => run.lower(e, false),
                    Bound::Excluded(e) => run.lower(e, true),
                };
                (&**run, lo, hi.max(lo))
            })
            .filter(|(_, lo, hi)| lo < hi)
            .collect::<Vec<_>>();
        debug_assert!(runs.len() < 64, "runs grow by MERGE_RATIO");
        Merged { runs }
    }

    /// Every entry, each key once with its newest operation, in key order.
    pub fn iter(&self) -> Merged<'_> {
        self.range(Bound::Unbounded, Bound::Unbounded)
    }
}

/// `newer` merged over `older` (both strictly increasing): one entry per key, `newer`'s where
/// both hold it; and the bytes ([`entry_bytes`]) of the entries of `older` so dropped. Copies
/// each entry's bytes once, with no per-entry allocation.
pub(crate) fn merge_runs(older: &Run, newer: &Run) -> (Run, u64) {
    let mut out = RunBuilder::with_capacity(
        older.len() + newer.len(),
        older.bytes.len() + newer.bytes.len(),
    );
    let (mut i, mut j, mut shadowed) = (0, 0, 0);
    // Bounded: every turn moves `i`, `j` or both forward.
    while i < older.len() && j < newer.len() {
        match older.key(i).cmp(newer.key(j)) {
            Ordering::Less => {
                out.push(older.entry(i));
                i += 1;
            }
            Ordering::Greater => {
                out.push(newer.entry(j));
                j += 1;
            }
            Ordering::Equal => {
                let (k, v) = older.entry(i);
                shadowed += entry_bytes(k.len(), v.map_or(0, <[u8]>::len));
                out.push(newer.entry(j));
                i += 1;
                j += 1;
            }
        }
    }
    for e in (i..older.len()).map(|i| older.entry(i)) {
        out.push(e);
    }
    for e in (j..newer.len()).map(|j| newer.entry(j)) {
        out.push(e);
    }
    (out.finish(), shadowed)
}

/// The runs of a [`Buffer`] within a range merged into one stream: each key once, with the
/// newest run's operation, from either end. Each step compares the ends of every run left
/// (at most [`Buffer::runs`]).
pub(crate) struct Merged<'a> {
    /// Each run's part not yet yielded, `[lo, hi)`, oldest run first.
    runs: Vec<(&'a Run, usize, usize)>,
}

impl<'a> Merged<'a> {
    /// The next entry from the front (`front`) or the back: the smallest (largest) key at that
    /// end of any run, with the newest run's operation, and that key taken off every run (a
    /// run holding the key holds it at that end, the others being past it).
    fn take(&mut self, front: bool) -> Option<Entry<'a>> {
        if let [(run, lo, hi)] = &mut self.runs[..] {
            // One run: its entries as they are.
            if *lo >= *hi {
                return None;
            }
            let i = if front {
                *lo += 1;
                *lo - 1
            } else {
                *hi -= 1;
                *hi
            };
            return Some(run.entry(i));
        }
        let mut best: Option<Entry<'a>> = None;
        // The runs holding `best`'s key at this end, as bits by position (fewer than 64 runs:
        // each run holds over `MERGE_RATIO` times the entries of the next).
        let mut holders = 0u64;
        for (i, &(run, lo, hi)) in self.runs.iter().enumerate() {
            if lo >= hi {
                continue;
            }
            let e = run.entry(if front { lo } else { hi - 1 });
            match best.map(|b| e.0.cmp(b.0)) {
                // Later runs are newer: on an equal key the later one wins.
                Some(Ordering::Equal) => {
                    best = Some(e);
                    holders |= 1 << i;
                }
                Some(o) if (o == Ordering::Less) != front => {}
                _ => {
                    best = Some(e);
                    holders = 1 << i;
                }
            }
        }
        let best = best?;
        // Bounded: one turn per bit set.
        while holders != 0 {
            let i = holders.trailing_zeros() as usize;
            holders &= holders - 1;
            let (_, lo, hi) = &mut self.runs[i];
            if front {
                *lo += 1;
            } else {
                *hi -= 1;
            }
        }
        Some(best)
    }
}

impl<'a> Iterator for Merged<'a> {
    type Item = Entry<'a>;
    fn next(&mut self) -> Option<Self::Item> {
        self.take(true)
    }
}

impl DoubleEndedIterator for Merged<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.take(false)
    }
}

/// Where the apply steps of a buffered storage stand ([`crate::Storage::set_apply_step_pages`],
/// design.md section 16): the tree holds part of what was buffered before its last page
/// commit, and the rest is still buffered.
#[derive(Debug, Clone)]
pub(crate) struct Sweep {
    /// Among leaves with as many pending entries, the next step takes those from this key on
    /// first (`None`: from the first key).
    pub from: Option<Box<[u8]>>,
}

/// Bytes an entry of key `k` and value `v` counts for in the buffer's size: its key and value,
/// and its 16-byte slot in a run ([`Run`]).
pub(crate) fn entry_bytes(key_len: usize, value_len: usize) -> u64 {
    (key_len + value_len + SLOT_BYTES) as u64
}

/// A write transaction's entries newer than the tree (its own operations over the buffer), in
/// key order within a range (tombstones included).
pub(crate) type Layer<'a> = Box<dyn DoubleEndedIterator<Item = Entry<'a>> + Send + Sync + 'a>;

/// Two sorted, double-ended streams of entries merged into one: on equal keys the newer
/// stream's entry is yielded and the older one's dropped. Used twice: a write transaction's own
/// changes over the committed buffer, and buffered entries over the tree (whose errors the
/// caller keeps beside the stream: `btree::range`). Each end keeps the next entry of both
/// streams that it has looked at, so every entry is taken from its stream once, and each entry
/// yielded costs one key comparison.
pub(crate) struct MergeNewer<'a, A, B> {
    newer: A,
    older: B,
    /// Entries taken from a stream's front (`[0]`) or back (`[1]`) end and not yielded yet.
    newer_peek: [Option<Entry<'a>>; 2],
    older_peek: [Option<Entry<'a>>; 2],
}

impl<'a, A, B> MergeNewer<'a, A, B>
where
    A: DoubleEndedIterator<Item = Entry<'a>>,
    B: DoubleEndedIterator<Item = Entry<'a>>,
{
    /// Merges `newer` over `older`; both must be sorted by key, without repeated keys.
    pub fn new(newer: A, older: B) -> Self {
        MergeNewer {
            newer,
            older,
            newer_peek: [None, None],
            older_peek: [None, None],
        }
    }

    /// The older stream (the caller's way to its error slot, if it keeps one).
    pub fn older_mut(&mut self) -> &mut B {
        &mut self.older
    }

    /// The next entry of one end: `front` picks the smaller key, the back end the larger.
    fn step(&mut self, front: bool) -> Option<Entry<'a>> {
        let end = usize::from(!front);
        fill(&mut self.newer, &mut self.newer_peek, front);
        fill(&mut self.older, &mut self.older_peek, front);
        match (self.newer_peek[end], self.older_peek[end]) {
            (None, None) => None,
            (Some(_), None) => self.newer_peek[end].take(),
            (None, Some(_)) => self.older_peek[end].take(),
            (Some(n), Some(o)) => {
                let order = n.0.cmp(o.0);
                if order == Ordering::Equal {
                    // The same key in both: the newer stream's entry, the older one dropped.
                    self.newer_peek[end] = None;
                    self.older_peek[end] = None;
                    Some(n)
                } else if (order == Ordering::Less) == front {
                    self.newer_peek[end] = None;
                    Some(n)
                } else {
                    self.older_peek[end] = None;
                    Some(o)
                }
            }
        }
    }
}

/// Makes sure one end of a stream has its next entry peeked, if any is left: the stream's own
/// from that end, else the one peeked at the other end (the stream's last entry, taken by the
/// other end).
fn fill<'a, I: DoubleEndedIterator<Item = Entry<'a>>>(
    it: &mut I,
    peek: &mut [Option<Entry<'a>>; 2],
    front: bool,
) {
    let (end, other) = if front { (0, 1) } else { (1, 0) };
    if peek[end].is_none() {
        peek[end] = if front { it.next() } else { it.next_back() }.or_else(|| peek[other].take());
    }
}

impl<'a, A, B> Iterator for MergeNewer<'a, A, B>
where
    A: DoubleEndedIterator<Item = Entry<'a>>,
    B: DoubleEndedIterator<Item = Entry<'a>>,
{
    type Item = Entry<'a>;
    fn next(&mut self) -> Option<Entry<'a>> {
        self.step(true)
    }
}

impl<'a, A, B> DoubleEndedIterator for MergeNewer<'a, A, B>
where
    A: DoubleEndedIterator<Item = Entry<'a>>,
    B: DoubleEndedIterator<Item = Entry<'a>>,
{
    fn next_back(&mut self) -> Option<Entry<'a>> {
        self.step(false)
    }
}

/// True when no key lies within `(start, end)`: its start is past its end. `BTreeMap::range`
/// panics on such bounds; every range call of the crate selects nothing.
pub(crate) fn range_is_empty(start: Bound<&[u8]>, end: Bound<&[u8]>) -> bool {
    match (start, end) {
        (Bound::Included(s), Bound::Included(e)) => s > e,
        (Bound::Included(s) | Bound::Excluded(s), Bound::Excluded(e))
        | (Bound::Excluded(s), Bound::Included(e)) => s >= e,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn items(m: &BTreeMap<Vec<u8>, Option<Vec<u8>>>) -> Vec<Entry<'_>> {
        m.iter().map(|(k, v)| (&k[..], v.as_deref())).collect()
    }

    type Owned = (Vec<u8>, Option<Vec<u8>>);

    /// A xorshift generator from `seed`: each call a number below its argument.
    fn xorshift(mut x: u64) -> impl FnMut(u64) -> u64 {
        move |n| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        }
    }

    /// Every item of `it`, taken from a random end each time (`rnd`): the front's items in
    /// order, then the back's reversed, which must be the iterator's order.
    fn from_both_ends<I: DoubleEndedIterator<Item = Owned>>(
        mut it: I,
        rnd: &mut impl FnMut(u64) -> u64,
    ) -> Vec<Owned> {
        let (mut f, mut b) = (Vec::new(), Vec::new());
        loop {
            let front = rnd(2) == 0;
            let Some(o) = (if front { it.next() } else { it.next_back() }) else {
                break;
            };
            if front {
                f.push(o);
            } else {
                b.push(o);
            }
        }
        b.reverse();
        f.extend(b);
        f
    }

    /// Commits of random sizes pushed as runs read back, by `get` and by `range` from either
    /// end, exactly as a map of the newest operation per key; the runs keep their sizes
    /// apart by [`MERGE_RATIO`] (so few are held) and the bytes returned add up to what the
    /// runs hold.
    #[test]
    fn runs_read_as_the_newest_operation_per_key() {
        let mut rnd = xorshift(11);
        for round in 0..40 {
            let mut b = Buffer::default();
            let mut model: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
            let mut bytes = 0i64;
            let keys = 1 + rnd(if round % 2 == 0 { 50 } else { 3000 });
            for _ in 0..rnd(200) {
                let mut ops: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
                let most = if rnd(4) == 0 { 400 } else { 8 };
                for _ in 0..1 + rnd(most) {
                    let k = format!("k{:05}", rnd(keys)).into_bytes();
                    let v = (rnd(4) > 0).then(|| vec![rnd(256) as u8; rnd(30) as usize]);
                    ops.insert(k, v);
                }
                let run: Run = ops.iter().map(|(k, v)| (&k[..], v.as_deref())).collect();
                model.extend(ops);
                bytes += b.push_run(run);
                let sizes: Vec<usize> = b.runs.iter().map(|r| r.len()).collect();
                assert!(
                    sizes.windows(2).all(|w| w[0] > MERGE_RATIO * w[1]),
                    "{sizes:?}"
                );
            }
            let held: u64 = b
                .runs
                .iter()
                .flat_map(|r| r.iter())
                .map(|(k, v)| entry_bytes(k.len(), v.map_or(0, <[u8]>::len)))
                .sum();
            assert_eq!(bytes, held as i64);
            assert_eq!(b.len(), b.runs.iter().map(|r| r.len()).sum::<usize>());
            for i in 0..keys + 5 {
                let k = format!("k{i:05}").into_bytes();
                assert_eq!(
                    b.get(&k).map(|v| v.map(<[u8]>::to_vec)),
                    model.get(&k).cloned(),
                    "{k:?}"
                );
            }
            let lo = format!("k{:05}", rnd(keys)).into_bytes();
            let hi = format!("k{:05}", rnd(keys)).into_bytes();
            let own = |it: &mut dyn Iterator<Item = Entry<'_>>| -> Vec<Owned> {
                it.map(|(k, v)| (k.to_vec(), v.map(<[u8]>::to_vec)))
                    .collect()
            };
            let bounds = (Bound::Included(&lo[..]), Bound::Excluded(&hi[..]));
            let expect: Vec<_> = if lo < hi {
                model
                    .range::<[u8], _>(bounds)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            } else {
                Vec::new()
            };
            assert_eq!(own(&mut b.range(bounds.0, bounds.1)), expect);
            let mut back = own(&mut b.range(bounds.0, bounds.1).rev());
            back.reverse();
            assert_eq!(back, expect);
            let all: Vec<_> = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            let it = b.iter().map(|(k, v)| (k.to_vec(), v.map(<[u8]>::to_vec)));
            assert_eq!(from_both_ends(it, &mut rnd), all);
        }
    }

    /// Merging from the front, the back, or both ends alternately yields exactly the newer
    /// stream's items over the older one's, each once, in order.
    #[test]
    fn merge_newer_matches_a_map_union_from_both_ends() {
        let mut rnd = xorshift(7);
        for _ in 0..300 {
            let mut newer = BTreeMap::new();
            let mut older = BTreeMap::new();
            for _ in 0..rnd(12) {
                let v = (rnd(3) > 0).then(|| vec![1, rnd(9) as u8]);
                newer.insert(vec![rnd(20) as u8], v);
            }
            for _ in 0..rnd(12) {
                let v = (rnd(3) > 0).then(|| vec![2, rnd(9) as u8]);
                older.insert(vec![rnd(20) as u8], v);
            }
            let mut expect = older.clone();
            expect.extend(newer.clone());
            let expect: Vec<(Vec<u8>, Option<Vec<u8>>)> = expect.into_iter().collect();
            let own = |v: Vec<Entry<'_>>| -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
                v.into_iter()
                    .map(|(k, v)| (k.to_vec(), v.map(<[u8]>::to_vec)))
                    .collect()
            };
            let m = || MergeNewer::new(items(&newer).into_iter(), items(&older).into_iter());
            assert_eq!(own(m().collect()), expect);
            let mut back = own(m().rev().collect());
            back.reverse();
            assert_eq!(back, expect);
            let it = m().map(|(k, v)| (k.to_vec(), v.map(<[u8]>::to_vec)));
            assert_eq!(from_both_ends(it, &mut rnd), expect);
        }
    }
}
