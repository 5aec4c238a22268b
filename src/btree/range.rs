//! [`Range`]: the public ordered iterator of a snapshot or a write transaction, the tree's
//! cursor ([`TreeRange`]) with a buffered storage's entries merged over it.

use std::ops::Bound;

use crate::buffer::{buffer_range, LayerItem, MergeNewer};
use crate::error::Result;

use super::cursor::{Source, TreeRange};

/// Entries newer than the tree, in key order within the range (tombstones included).
type Layer<'a> = Box<dyn DoubleEndedIterator<Item = LayerItem<'a>> + Send + Sync + 'a>;

/// An ordered iterator over the entries whose keys fall in a range, as `(key, value)` slices
/// borrowed from the snapshot or the write transaction (no copy).
///
/// A `DoubleEndedIterator`: `.next()` walks forwards from the lower bound, `.next_back()` (and
/// `.rev()`) backwards from the upper bound, each a cursor of its own (a stack of the nodes from
/// the root to its leaf); the two stop where they meet, so every entry is yielded once. Each
/// step reads at most one new leaf and the branches above it: O(1) amortized, O(depth) at worst;
/// nothing is collected. The back cursor descends on the first `next_back`. In a storage with
/// a write buffer ([`crate::Options::write_buffer_bytes`]) the buffered entries of the range
/// are merged in as the cursor goes (a buffered delete hides the tree's entry).
///
/// Errors: corruption met while stepping comes as one `Err` item, after which the iterator ends
/// (from both ends).
pub struct Range<'a> {
    inner: Inner<'a>,
}

enum Inner<'a> {
    /// No buffered entry in the range's source: the tree's cursor alone.
    Tree(TreeRange<'a>),
    /// The buffered entries merged over the tree's.
    Merged(MergeNewer<'a, Layer<'a>, Layer<'a>>),
}

impl std::fmt::Debug for Range<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            Inner::Tree(t) => t.fmt(f),
            Inner::Merged(_) => f.write_str("Range(merged with the write buffer)"),
        }
    }
}

impl<'a> Range<'a> {
    /// An iterator over `[start, end]` of `src`, its front end positioned (one descent from
    /// the root). Errors: corruption met on that descent.
    pub(crate) fn new(src: Source<'a>, start: Bound<&[u8]>, end: Bound<&[u8]>) -> Result<Self> {
        let tree = TreeRange::new(src, start, end)?;
        let layer: Option<Layer<'a>> = match src {
            Source::Snapshot(state) if !state.buffer.is_empty() => {
                Some(Box::new(buffer_range(&state.buffer, start, end)))
            }
            Source::Snapshot(_) => None,
            Source::Txn(txn) => txn.buffered_layer(start, end),
        };
        let inner = match layer {
            None => Inner::Tree(tree),
            Some(layer) => {
                let tree: Layer<'a> = Box::new(tree.map(|r| r.map(|(k, v)| (k, Some(v)))));
                Inner::Merged(MergeNewer::new(layer, tree))
            }
        };
        Ok(Range { inner })
    }

    /// An iterator over the keys starting with `prefix`.
    pub(crate) fn prefix(src: Source<'a>, prefix: &[u8]) -> Result<Self> {
        match super::prefix_end(prefix) {
            Some(e) => Range::new(src, Bound::Included(prefix), Bound::Excluded(&e)),
            None => Range::new(src, Bound::Included(prefix), Bound::Unbounded),
        }
    }

    /// The next entry from one end, skipping buffered deletes (each is skipped once).
    fn step(&mut self, front: bool) -> Option<Result<(&'a [u8], &'a [u8])>> {
        match &mut self.inner {
            Inner::Tree(t) => {
                if front {
                    t.next()
                } else {
                    t.next_back()
                }
            }
            Inner::Merged(m) => loop {
                let item = if front { m.next() } else { m.next_back() };
                match item? {
                    Ok((k, Some(v))) => return Some(Ok((k, v))),
                    Ok((_, None)) => continue,
                    Err(e) => return Some(Err(e)),
                }
            },
        }
    }
}

impl<'a> Iterator for Range<'a> {
    type Item = Result<(&'a [u8], &'a [u8])>;

    fn next(&mut self) -> Option<Self::Item> {
        self.step(true)
    }
}

impl DoubleEndedIterator for Range<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.step(false)
    }
}

impl std::iter::FusedIterator for Range<'_> {}
