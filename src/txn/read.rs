//! The read transaction: a snapshot of one committed state.

use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use crate::btree::{self, Range};
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

    /// Keys in the snapshot.
    pub fn len(&self) -> u64 {
        self.state.entries
    }

    /// True when the snapshot holds no key.
    pub fn is_empty(&self) -> bool {
        self.state.entries == 0
    }

    /// The value of `key`, borrowed from the snapshot.
    ///
    /// Errors: [`crate::Error::Corruption`] when a page on the path fails its checksum or is
    /// malformed. A key that could never be stored (empty, over 1,024 bytes) is simply absent.
    pub fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<&[u8]>> {
        btree::get(&self.state, key.as_ref())
    }

    /// True when `key` is present.
    pub fn contains_key(&self, key: impl AsRef<[u8]>) -> Result<bool> {
        Ok(self.get(key)?.is_some())
    }

    /// The entries whose keys fall in `bounds`, in key order, as `(key, value)` slices.
    ///
    /// `bounds` is any `RangeBounds<[u8]>`: `..`, or `(Bound<&[u8]>, Bound<&[u8]>)`. Use
    /// [`ReadTransaction::prefix`] for a prefix scan. Errors: corruption met while descending
    /// to the first key; later ones come as `Err` items, after which the iterator ends.
    pub fn range<'a>(&'a self, bounds: impl RangeBounds<[u8]>) -> Result<Range<'a>> {
        Range::new(&self.state, bounds.start_bound(), bounds.end_bound())
    }

    /// Every entry, in key order.
    pub fn iter(&self) -> Result<Range<'_>> {
        self.range(..)
    }

    /// The entries whose keys start with `prefix`, in key order.
    pub fn prefix<'a>(
        &'a self,
        prefix: &[u8],
    ) -> Result<impl Iterator<Item = Result<(&'a [u8], &'a [u8])>> + 'a> {
        let end = prefix_end(prefix);
        let r = match &end {
            Some(e) => Range::new(
                &self.state,
                Bound::Included(prefix),
                Bound::Excluded(e.as_slice()),
            )?,
            None => Range::new(&self.state, Bound::Included(prefix), Bound::Unbounded)?,
        };
        Ok(r)
    }
}

/// The smallest key greater than every key starting with `prefix` (None: no such key).
pub(crate) fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut e = prefix.to_vec();
    while let Some(last) = e.pop() {
        if last < 0xFF {
            e.push(last + 1);
            return Some(e);
        }
    }
    None
}
