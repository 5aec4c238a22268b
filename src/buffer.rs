//! The write buffer of a buffered storage ([`crate::Options::write_buffer_bytes`]): committed
//! entries not yet applied to the B+tree, and the merge that lets every read see them over the
//! tree (design.md section 16).
//!
//! A buffered commit journals its operations as one logical record (design.md 3.9) and adds
//! them here instead of copying leaves; an *apply* (an ordinary page transaction) later moves
//! all of them into the tree at once, so a leaf is written once for the many entries pending
//! on it rather than once per entry. The buffer is a persistent ordered map (`imbl::OrdMap`)
//! inside the published [`crate::state::State`]: a snapshot holds the buffer as of its own
//! transaction, so reads see exactly the commits up to theirs (invariant I13), and an apply
//! never changes what an older snapshot sees.

use std::cmp::Ordering;
use std::ops::Bound;
use std::sync::Arc;

use crate::error::Result;

/// Bytes of write buffers of the process ([`live_buffer_bytes`]).
static LIVE_BUFFER_BYTES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Bytes the write buffers of every open storage of the process count for now (each entry its
/// key, its value and 64 bytes, as [`crate::StorageStats::buffer_bytes`]): the sibling of
/// [`crate::live_image_bytes`], and held with it under the actor runtime's memory budget. A
/// storage counts its current buffer from open to close; an older snapshot that still holds a
/// buffer already applied is not counted (its entries share the current buffer's nodes or are
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

/// One buffered entry: the newest committed operation on its key, newer than the tree.
#[derive(Debug, Clone)]
pub(crate) struct BufEntry {
    /// The value put; `None` for a delete (a tombstone hiding the tree's entry).
    pub value: Option<Arc<[u8]>>,
}

/// Buffered entries by key.
pub(crate) type Buffer = imbl::OrdMap<BufKey, BufEntry>;

/// Where the apply steps of a buffered storage stand ([`crate::Storage::set_apply_step_pages`],
/// design.md section 16): the tree holds part of what was buffered before its last page
/// commit, and the rest is still buffered.
#[derive(Debug, Clone)]
pub(crate) struct Sweep {
    /// The key the next step applies from (`None`: the first key).
    pub from: Option<BufKey>,
}

/// Longest key a [`BufKey`] holds inline.
const INLINE_KEY: usize = 46;

/// A buffered key: held inline when at most [`INLINE_KEY`] bytes (index entries, most
/// document ids), else shared on the heap. A lookup compares the key with about
/// log2(entries) keys of the map's nodes: inline, each comparison reads the node itself instead
/// of following a pointer to a heap allocation (a cache miss each, at a few hundred thousand
/// entries: lookups took twice as long as the tree's own).
#[derive(Clone)]
pub(crate) enum BufKey {
    /// A short key: its length and bytes.
    Inline(u8, [u8; INLINE_KEY]),
    /// A longer one.
    Heap(Arc<[u8]>),
}

impl From<&[u8]> for BufKey {
    fn from(k: &[u8]) -> BufKey {
        if k.len() <= INLINE_KEY {
            let mut b = [0u8; INLINE_KEY];
            b[..k.len()].copy_from_slice(k);
            BufKey::Inline(k.len() as u8, b)
        } else {
            BufKey::Heap(Arc::from(k))
        }
    }
}

impl AsRef<[u8]> for BufKey {
    fn as_ref(&self) -> &[u8] {
        match self {
            BufKey::Inline(n, b) => &b[..*n as usize],
            BufKey::Heap(a) => a,
        }
    }
}

impl std::borrow::Borrow<[u8]> for BufKey {
    fn borrow(&self) -> &[u8] {
        self.as_ref()
    }
}

impl PartialEq for BufKey {
    fn eq(&self, o: &BufKey) -> bool {
        self.as_ref() == o.as_ref()
    }
}

impl Eq for BufKey {}

impl PartialOrd for BufKey {
    fn partial_cmp(&self, o: &BufKey) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for BufKey {
    /// The bytes' order, as `[u8]`'s (so that lookups by `&[u8]` agree).
    fn cmp(&self, o: &BufKey) -> Ordering {
        self.as_ref().cmp(o.as_ref())
    }
}

impl std::fmt::Debug for BufKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BufKey({:?})", self.as_ref())
    }
}

/// Bytes an entry of key `k` and value `v` counts for in the buffer's size (its key and value,
/// and a fixed 64 bytes for the map's node slot, the reference counts and the txn id).
pub(crate) fn entry_bytes(key_len: usize, value_len: usize) -> u64 {
    (key_len + value_len + 64) as u64
}

/// An item of a merge input: a key and its value, `None` for a tombstone.
pub(crate) type LayerItem<'a> = Result<(&'a [u8], Option<&'a [u8]>)>;

/// Two sorted, double-ended streams of `(key, value or tombstone)` merged into one: on equal
/// keys the newer stream's item is yielded and the older one's dropped. Used twice: a write
/// transaction's own changes over the committed buffer, and buffered entries over the tree.
/// The first error of either stream is yielded once and ends the merge.
pub(crate) struct MergeNewer<'a, A, B> {
    newer: A,
    older: B,
    /// Items taken from a stream's front (`.0`) or back (`.1`) end and not yielded yet: each
    /// end of the merge looks at the next item of both streams.
    newer_peek: (Option<LayerItem<'a>>, Option<LayerItem<'a>>),
    older_peek: (Option<LayerItem<'a>>, Option<LayerItem<'a>>),
    done: bool,
}

impl<'a, A, B> MergeNewer<'a, A, B>
where
    A: DoubleEndedIterator<Item = LayerItem<'a>>,
    B: DoubleEndedIterator<Item = LayerItem<'a>>,
{
    /// Merges `newer` over `older`; both must be sorted by key, without repeated keys.
    pub fn new(newer: A, older: B) -> Self {
        MergeNewer {
            newer,
            older,
            newer_peek: (None, None),
            older_peek: (None, None),
            done: false,
        }
    }

    /// The next item of one end: `front` picks the smaller key, the back end the larger.
    fn step(&mut self, front: bool) -> Option<LayerItem<'a>> {
        if self.done {
            return None;
        }
        let n = take_end(&mut self.newer, &mut self.newer_peek, front);
        let o = take_end(&mut self.older, &mut self.older_peek, front);
        let (n, o) = match (n, o) {
            (None, None) => return None,
            (Some(Err(e)), o) => {
                self.put_back(None, o, front);
                self.done = true;
                return Some(Err(e));
            }
            (n, Some(Err(e))) => {
                self.put_back(n, None, front);
                self.done = true;
                return Some(Err(e));
            }
            (Some(Ok(n)), None) => return Some(Ok(n)),
            (None, Some(Ok(o))) => return Some(Ok(o)),
            (Some(Ok(n)), Some(Ok(o))) => (n, o),
        };
        let order = n.0.cmp(o.0);
        let newer_first = if front {
            order != Ordering::Greater
        } else {
            order != Ordering::Less
        };
        if order == Ordering::Equal {
            // The same key in both: the newer stream's item, the older one dropped.
            return Some(Ok(n));
        }
        if newer_first {
            self.put_back(None, Some(Ok(o)), front);
            Some(Ok(n))
        } else {
            self.put_back(Some(Ok(n)), None, front);
            Some(Ok(o))
        }
    }

    fn put_back(&mut self, n: Option<LayerItem<'a>>, o: Option<LayerItem<'a>>, front: bool) {
        let (np, op) = if front {
            (&mut self.newer_peek.0, &mut self.older_peek.0)
        } else {
            (&mut self.newer_peek.1, &mut self.older_peek.1)
        };
        if n.is_some() {
            *np = n;
        }
        if o.is_some() {
            *op = o;
        }
    }
}

/// The next item at one end of a stream: the one peeked at that end, else the stream's own,
/// else the one peeked at the other end (the stream's last item, taken by the other end).
fn take_end<'a, I: DoubleEndedIterator<Item = LayerItem<'a>>>(
    it: &mut I,
    peek: &mut (Option<LayerItem<'a>>, Option<LayerItem<'a>>),
    front: bool,
) -> Option<LayerItem<'a>> {
    if front {
        peek.0
            .take()
            .or_else(|| it.next())
            .or_else(|| peek.1.take())
    } else {
        peek.1
            .take()
            .or_else(|| it.next_back())
            .or_else(|| peek.0.take())
    }
}

impl<'a, A, B> Iterator for MergeNewer<'a, A, B>
where
    A: DoubleEndedIterator<Item = LayerItem<'a>>,
    B: DoubleEndedIterator<Item = LayerItem<'a>>,
{
    type Item = LayerItem<'a>;
    fn next(&mut self) -> Option<LayerItem<'a>> {
        self.step(true)
    }
}

impl<'a, A, B> DoubleEndedIterator for MergeNewer<'a, A, B>
where
    A: DoubleEndedIterator<Item = LayerItem<'a>>,
    B: DoubleEndedIterator<Item = LayerItem<'a>>,
{
    fn next_back(&mut self) -> Option<LayerItem<'a>> {
        self.step(false)
    }
}

/// Puts operation `value` (`None`: a delete) on `key` into `buffer`, replacing the key's older
/// one, and keeps `bytes` ([`entry_bytes`] of every entry) up to date.
pub(crate) fn put_entry(
    buffer: &mut Buffer,
    bytes: &mut u64,
    key: BufKey,
    value: Option<Arc<[u8]>>,
) {
    let len = key.as_ref().len();
    *bytes += entry_bytes(len, value.as_ref().map_or(0, |v| v.len()));
    if let Some(old) = buffer.insert(key, BufEntry { value }) {
        *bytes -= entry_bytes(len, old.value.as_ref().map_or(0, |v| v.len()));
    }
}

/// True when no key lies within `(start, end)`: its start is past its end. `BTreeMap::range`
/// and imbl's `range` panic on such bounds; every range call of the crate selects nothing.
pub(crate) fn range_is_empty(start: Bound<&[u8]>, end: Bound<&[u8]>) -> bool {
    match (start, end) {
        (Bound::Included(s), Bound::Included(e)) => s > e,
        (Bound::Included(s) | Bound::Excluded(s), Bound::Excluded(e))
        | (Bound::Excluded(s), Bound::Included(e)) => s >= e,
        _ => false,
    }
}

/// The buffered entries of `buffer` within `(start, end)`, as merge items.
pub(crate) fn buffer_range<'a>(
    buffer: &'a Buffer,
    start: Bound<&[u8]>,
    end: Bound<&[u8]>,
) -> impl DoubleEndedIterator<Item = LayerItem<'a>> + Send + Sync + 'a {
    let range = if range_is_empty(start, end) {
        None
    } else {
        Some(buffer.range::<_, [u8]>((start, end)))
    };
    range
        .into_iter()
        .flatten()
        .map(|(k, e)| Ok((k.as_ref(), e.value.as_deref())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn items(m: &BTreeMap<Vec<u8>, Option<Vec<u8>>>) -> Vec<LayerItem<'_>> {
        m.iter().map(|(k, v)| Ok((&k[..], v.as_deref()))).collect()
    }

    /// Merging from the front, the back, or both ends alternately yields exactly the newer
    /// stream's items over the older one's, each once, in order.
    #[test]
    fn merge_newer_matches_a_map_union_from_both_ends() {
        let mut x = 7u64;
        let mut rnd = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
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
            let own = |v: Vec<LayerItem<'_>>| -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
                v.into_iter()
                    .map(|r| {
                        let (k, v) = r.unwrap();
                        (k.to_vec(), v.map(<[u8]>::to_vec))
                    })
                    .collect()
            };
            let m = || MergeNewer::new(items(&newer).into_iter(), items(&older).into_iter());
            assert_eq!(own(m().collect()), expect);
            let mut back = own(m().rev().collect());
            back.reverse();
            assert_eq!(back, expect);
            // Alternating ends: the front's items in order, then the back's reversed.
            let mut it = m();
            let (mut f, mut b) = (Vec::new(), Vec::new());
            loop {
                let front = rnd(2) == 0;
                let Some(item) = (if front { it.next() } else { it.next_back() }) else {
                    break;
                };
                let (k, v) = item.unwrap();
                let o = (k.to_vec(), v.map(<[u8]>::to_vec));
                if front {
                    f.push(o);
                } else {
                    b.push(o);
                }
            }
            b.reverse();
            f.extend(b);
            assert_eq!(f, expect);
        }
    }
}
