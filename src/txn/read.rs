//! The read transaction: a snapshot of one committed state.

use std::sync::Arc;

use crate::btree::{self, KeyRange, Range, Source};
use crate::error::Result;
use crate::state::State;

/// A consistent, lock-free view of one committed state of a storage.
///
/// Creating one is an atomic load of the current state record and never blocks; while it lives,
/// the pages and the map it reads stay valid (the writer does not reuse pages it can read, and
/// the flush does not overwrite them). Keys and values are returned as slices into the map or
/// into scratch pages: no copy. `Send + Sync`, cheap to clone.
#[derive(Clone)]
pub struct ReadTransaction {
    state: Arc<State>,
}

impl std::fmt::Debug for ReadTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReadTransaction(txn {})", self.state.txn_id)
    }
}

impl ReadTransaction {
    pub(crate) fn new(state: Arc<State>) -> ReadTransaction {
        ReadTransaction { state }
    }

    /// The id of the last transaction this snapshot sees.
    pub fn txn_id(&self) -> u64 {
        self.state.txn_id
    }

    /// Keys in the snapshot. In a storage with a write buffer whose buffer holds entries, the
    /// first call on a snapshot looks up every buffered key in the tree (to tell new keys from
    /// replaced ones) and keeps the count: commits do not count their keys as they buffer them.
    /// If a lookup fails (a damaged page), the count leaves the buffered entries out, and reads
    /// of the damaged keys report the damage.
    pub fn len(&self) -> u64 {
        self.state.len()
    }

    /// True when the snapshot holds no key.
    pub fn is_empty(&self) -> bool {
        self.state.len() == 0
    }

    /// The value of `key`, borrowed from the snapshot.
    ///
    /// Errors: [`crate::Error::Corruption`] when a page on the path fails its checksum or is
    /// malformed. A key that could never be stored (empty, over 1,024 bytes) is simply absent.
    pub fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<&[u8]>> {
        let key = key.as_ref();
        if let Some(v) = self.state.buffer.get(key) {
            return Ok(v);
        }
        btree::get(&self.state, key)
    }

    /// The values of `keys`, in their order (duplicates answered each), each equal to what
    /// [`ReadTransaction::get`] returns for it, borrowed from the snapshot.
    ///
    /// Faster than one `get` per key when pages are not in the page cache: the tree is walked
    /// one level at a time for all keys, and the pages of a level that are not resident are
    /// read together, in one io_uring submission on the calling thread (`pread` where io_uring
    /// is unavailable or `OMNIBUS_IO_URING=0`), instead of one page fault at a time. Pages in
    /// memory are read as `get` reads them. Blocks the calling thread while pages are read,
    /// as a `get`'s page faults do. See design.md section 15.
    ///
    /// Errors: [`crate::Error::Corruption`] when a page on some key's path fails its checksum
    /// or is malformed (the page is named); [`crate::Error::Io`] (`"io_uring read"` or
    /// `"pread"`, with the data file's path) when reading a page failed, e.g. `EIO`.
    pub fn multi_get<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<Vec<Option<&[u8]>>> {
        let buffer = &self.state.buffer;
        if buffer.is_empty() {
            return btree::multi_get(&self.state, keys);
        }
        // Buffered keys are answered from the buffer (one lookup each); the others from the
        // tree, together.
        let buffered: Vec<Option<Option<&[u8]>>> =
            keys.iter().map(|k| buffer.get(k.as_ref())).collect();
        let in_tree: Vec<&[u8]> = keys
            .iter()
            .zip(&buffered)
            .filter(|(_, b)| b.is_none())
            .map(|(k, _)| k.as_ref())
            .collect();
        let mut from_tree = btree::multi_get(&self.state, &in_tree)?.into_iter();
        Ok(buffered
            .into_iter()
            .map(|b| b.unwrap_or_else(|| from_tree.next().flatten()))
            .collect())
    }

    /// True when `key` is present.
    pub fn contains_key(&self, key: impl AsRef<[u8]>) -> Result<bool> {
        Ok(self.get(key)?.is_some())
    }

    /// The entries whose keys fall in `bounds`, in key order, as `(key, value)` slices borrowed
    /// from the snapshot.
    ///
    /// `bounds` is ordinary range syntax over byte strings ([`KeyRange`]):
    /// `r.range(&b"a"[..]..&b"b"[..])`, `r.range(b"k".as_slice()..)`, `r.range(..)` (or
    /// `r.range::<&[u8], _>(..)`), `a..=b`, `..b`, or a `(Bound<&[u8]>, Bound<&[u8]>)` pair;
    /// `Vec<u8>`, `&str` and `&[u8; N]` bounds work too. An empty or inverted range yields
    /// nothing.
    ///
    /// The iterator is double-ended: `.rev()` walks backwards from the upper bound with a
    /// cursor of its own (nothing is collected). Cost: one descent from the root now (and one
    /// more on the first `next_back`), then O(1) amortized per entry.
    ///
    /// Errors: [`crate::Error::Corruption`] met while descending to the first key; later ones
    /// come as one `Err` item, after which the iterator ends.
    pub fn range<K, R: KeyRange<K>>(&self, bounds: R) -> Result<Range<'_>> {
        Range::new(self.source(), bounds.start_key(), bounds.end_key())
    }

    /// Every entry, in key order (double-ended, as [`ReadTransaction::range`]).
    ///
    /// Errors: as [`ReadTransaction::range`].
    pub fn iter(&self) -> Result<Range<'_>> {
        self.range(..)
    }

    /// The entries whose keys start with `prefix`, in key order (double-ended, as
    /// [`ReadTransaction::range`]); an empty prefix selects every entry.
    ///
    /// Errors: as [`ReadTransaction::range`].
    pub fn prefix(&self, prefix: impl AsRef<[u8]>) -> Result<Range<'_>> {
        Range::prefix(self.source(), prefix.as_ref())
    }

    /// The entry with the smallest key, or `None` when the snapshot is empty. Cost: one
    /// descent from the root.
    ///
    /// Errors: [`crate::Error::Corruption`] when a page on the path fails its checksum or is
    /// malformed.
    pub fn first(&self) -> Result<Option<(&[u8], &[u8])>> {
        self.iter()?.next().transpose()
    }

    /// The entry with the largest key, or `None` when the snapshot is empty. Cost: one
    /// descent from the root (and the one `iter` makes to the first key).
    ///
    /// Errors: as [`ReadTransaction::first`].
    pub fn last(&self) -> Result<Option<(&[u8], &[u8])>> {
        self.iter()?.next_back().transpose()
    }

    /// The state record (unit tests).
    #[cfg(test)]
    pub(crate) fn state_for_tests(&self) -> &State {
        &self.state
    }

    fn source(&self) -> Source<'_> {
        Source::Snapshot(&self.state)
    }
}
