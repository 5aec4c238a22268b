//! [`Range`]: the public ordered iterator of a snapshot or a write transaction, the tree's
//! cursor ([`TreeRange`]) with a buffered storage's entries merged over it.

use std::ops::Bound;

use crate::buffer::{Entry, Layer, MergeNewer, Merged};
use crate::error::{Error, Result};

use super::cursor::{Source, TreeRange};

/// The tree's entries as merge entries. The first error waits in `err` for the [`Range`] to
/// yield it (the cursor ends after an error, from both ends).
struct TreeEntries<'a> {
    tree: TreeRange<'a>,
    err: Option<Error>,
}

impl<'a> TreeEntries<'a> {
    fn item(&mut self, item: Option<Result<(&'a [u8], &'a [u8])>>) -> Option<Entry<'a>> {
        match item? {
            Ok((k, v)) => Some((k, Some(v))),
            Err(e) => {
                self.err = Some(e);
                None
            }
        }
    }
}

impl<'a> Iterator for TreeEntries<'a> {
    type Item = Entry<'a>;
    fn next(&mut self) -> Option<Entry<'a>> {
        let item = self.tree.next();
        self.item(item)
    }
}

impl DoubleEndedIterator for TreeEntries<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        let item = self.tree.next_back();
        self.item(item)
    }
}

/// Entries of `L` merged over the tree's, with the tree's first error.
struct Over<'a, L> {
    merge: MergeNewer<'a, L, TreeEntries<'a>>,
    /// An error was yielded: the iterator has ended.
    done: bool,
}

impl<'a, L: DoubleEndedIterator<Item = Entry<'a>>> Over<'a, L> {
    fn new(layer: L, tree: TreeRange<'a>) -> Self {
        let tree = TreeEntries { tree, err: None };
        Over {
            merge: MergeNewer::new(layer, tree),
            done: false,
        }
    }

    /// The next entry from one end, skipping buffered deletes (each is skipped once), or the
    /// tree's error (an entry merged past it is dropped: the iterator ends there). Out of
    /// line: a tree-only range's `next` stays small.
    #[inline(never)]
    fn step(&mut self, front: bool) -> Option<Result<(&'a [u8], &'a [u8])>> {
        // Bounded: every turn takes an entry from a finite stream.
        while !self.done {
            let item = if front {
                self.merge.next()
            } else {
                self.merge.next_back()
            };
            if let Some(e) = self.merge.older_mut().err.take() {
                self.done = true;
                return Some(Err(e));
            }
            match item? {
                (k, Some(v)) => return Some(Ok((k, v))),
                (_, None) => continue,
            }
        }
        None
    }
}

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
    /// A snapshot's buffered entries merged over its tree's.
    Buffered(Over<'a, Merged<'a>>),
    /// A write transaction's own operations and buffered entries merged over its tree's.
    Txn(Over<'a, Layer<'a>>),
}

impl std::fmt::Debug for Range<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            Inner::Tree(t) => t.fmt(f),
            Inner::Buffered(_) | Inner::Txn(_) => {
                f.write_str("Range(merged with the write buffer)")
            }
        }
    }
}

impl<'a> Range<'a> {
    /// An iterator over `[start, end]` of `src`, its front end positioned (one descent from
    /// the root). Errors: corruption met on that descent.
    pub(crate) fn new(src: Source<'a>, start: Bound<&[u8]>, end: Bound<&[u8]>) -> Result<Self> {
        let tree = TreeRange::new(src, start, end)?;
        let inner = match src {
            Source::Snapshot(state) if !state.buffer.is_empty() => {
                Inner::Buffered(Over::new(state.buffer.range(start, end), tree))
            }
            Source::Snapshot(_) => Inner::Tree(tree),
            Source::Txn(txn) => match txn.buffered_layer(start, end) {
                Some(layer) => Inner::Txn(Over::new(layer, tree)),
                None => Inner::Tree(tree),
            },
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
}

impl<'a> Iterator for Range<'a> {
    type Item = Result<(&'a [u8], &'a [u8])>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        // The tree alone (no buffered entry in the range) is the common case: kept one call
        // deep (behind a shared step function, a tree-only scan measured slower).
        match &mut self.inner {
            Inner::Tree(t) => t.next(),
            Inner::Buffered(m) => m.step(true),
            Inner::Txn(m) => m.step(true),
        }
    }
}

impl DoubleEndedIterator for Range<'_> {
    #[inline]
    fn next_back(&mut self) -> Option<Self::Item> {
        match &mut self.inner {
            Inner::Tree(t) => t.next_back(),
            Inner::Buffered(m) => m.step(false),
            Inner::Txn(m) => m.step(false),
        }
    }
}

impl std::iter::FusedIterator for Range<'_> {}
