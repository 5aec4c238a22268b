//! Index queries as calls ([`DatabaseHandle::query`] and its kin): the document keys of a term,
//! of a range of terms, their count, and the documents themselves, read from an index's storage
//! without the caller knowing its key layout (`index_key.rs`: `escape(term) ++ 0x00 ++ document
//! key`). The index's applied record (the key `0x00`, [`crate::actors::INDEX_APPLIED_KEY`]) is
//! never an answer: every entry is decoded, and a key that does not decode as an entry is
//! skipped.
//!
//! Reads: one snapshot of the index storage, taken at the call, read by the reader pool in
//! chunks (a [`RangeStream`]): the caller's thread never touches a page, memory is one chunk
//! plus the answer. An index follows the root's change feed: it answers for the documents it
//! has applied, which may lag the root's last commits; call
//! [`DatabaseHandle::wait_for_index`] first to read every document acknowledged before.

use std::ops::Bound;

use futures_lite::StreamExt;

use super::super::blocking;
use super::super::index::read_applied;
use super::super::index_key::{decode_index_entry, index_term_prefix};
use super::super::range_stream::RangeStream;
use super::DatabaseHandle;
use crate::actor_interface::{Error, Result};

impl DatabaseHandle {
    /// A stream over the entries of index `index` with keys in `start..end`: a defined index's
    /// storage, else a branch storage of that name holding an index's applied record (an index
    /// left on disk that this process has not defined, read as it is).
    async fn index_stream(
        &self,
        index: &str,
        start: Bound<Vec<u8>>,
        end: Bound<Vec<u8>>,
    ) -> Result<RangeStream> {
        let defined = {
            let map = self.inner.indexes.lock().unwrap_or_else(|e| e.into_inner());
            map.get(index).map(|e| e.storage.clone())
        };
        let snap = match defined {
            Some(storage) => storage.begin_read()?,
            None => {
                let no_index =
                    || Error::InvalidOptions(format!("no index named {index:?} is defined"));
                let engine = self.inner.engine.upgrade().ok_or(Error::Closed)?;
                let (db, n) = (self.inner.db.clone(), index.to_string());
                // Opening a branch reads and syncs files: on the background I/O pool.
                let storage = match engine.background_io.run(move || db.storage(&n)).await {
                    Ok(s) => s,
                    Err(Error::StorageNotFound { .. } | Error::InvalidStorageName { .. }) => {
                        return Err(no_index())
                    }
                    Err(e) => return Err(e),
                };
                let snap = storage.begin_read()?;
                if read_applied(&snap)?.is_none() {
                    return Err(no_index());
                }
                snap
            }
        };
        Ok(RangeStream::new(
            snap,
            self.inner.root.readers.clone(),
            start,
            end,
            false,
        ))
    }

    /// Calls `each(term, document key)` for every entry of `index` in `start..end` (keys), in
    /// key order, until it returns `false`.
    async fn each_entry(
        &self,
        index: &str,
        start: Bound<Vec<u8>>,
        end: Bound<Vec<u8>>,
        mut each: impl FnMut(Vec<u8>, &[u8]) -> bool,
    ) -> Result<()> {
        let mut s = self.index_stream(index, start, end).await?;
        while let Some(item) = s.next().await {
            let (key, _) = item?;
            // The applied record (and any key that is not an entry) is no answer.
            if let Some((term, doc)) = decode_index_entry(&key) {
                if !each(term, doc) {
                    break;
                }
            }
        }
        Ok(())
    }

    /// The keys of the documents that have term `term` in index `index`, in key order, from one
    /// snapshot of the index taken now (what the index has applied: see the module docs and
    /// [`DatabaseHandle::wait_for_index`]). The whole answer is held in memory; for a term of
    /// very many documents use [`DatabaseHandle::query_terms`] with a limit, continuing from the
    /// last answer.
    ///
    /// An index on disk that this process has not defined (with
    /// [`DatabaseHandle::define_index`]) is read as it is: it follows no change feed until it
    /// is defined, so it may lag the documents by more than a defined one.
    ///
    /// Errors: [`Error::InvalidOptions`] when `index` is neither an index defined on this
    /// handle's database nor a branch storage holding an index's applied record;
    /// [`Error::Corruption`] of an index page; [`Error::Closed`] after shutdown.
    /// Cancel safety: dropping the future drops the chunk in flight; nothing else happens.
    pub async fn query(&self, index: &str, term: impl AsRef<[u8]>) -> Result<Vec<Vec<u8>>> {
        let (start, end) = term_bounds(term.as_ref());
        let mut out = Vec::new();
        self.each_entry(index, start, end, |_, doc| {
            out.push(doc.to_vec());
            true
        })
        .await?;
        Ok(out)
    }

    /// How many documents have term `term` in index `index` (as [`DatabaseHandle::query`]
    /// would list them, without holding them). Reads every entry of the term: linear in the
    /// count.
    ///
    /// Errors and cancel safety: as [`DatabaseHandle::query`].
    pub async fn query_count(&self, index: &str, term: impl AsRef<[u8]>) -> Result<u64> {
        let (start, end) = term_bounds(term.as_ref());
        let mut n = 0u64;
        self.each_entry(index, start, end, |_, _| {
            n += 1;
            true
        })
        .await?;
        Ok(n)
    }

    /// The documents that have term `term` in index `index`: the keys as
    /// [`DatabaseHandle::query`] lists them, then their values read from the root storage
    /// with one [`crate::actors::StorageHandle::multi_get`], as `(document key, document)` in
    /// key order. A key whose document the root no longer holds (deleted after the index's
    /// snapshot, the index not yet caught up) is left out.
    ///
    /// Errors and cancel safety: as [`DatabaseHandle::query`], and those of the root's
    /// `multi_get`.
    pub async fn query_documents(
        &self,
        index: &str,
        term: impl AsRef<[u8]>,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let keys = self.query(index, term).await?;
        let values = self.inner.root.multi_get(&keys).await?;
        Ok(keys
            .into_iter()
            .zip(values)
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect())
    }

    /// The entries of index `index` whose terms lie in `start..end` (bounds on terms, in the
    /// index's term order: bytewise), as `(term, document key)` in term then key order, at
    /// most `limit` of them. To go on after a full answer, call again with
    /// `start = Bound::Excluded(last term)` to skip the rest of that term, or keep the term
    /// and filter the keys already seen.
    ///
    /// Errors and cancel safety: as [`DatabaseHandle::query`].
    pub async fn query_terms(
        &self,
        index: &str,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let (start, end) = terms_bounds(start, end);
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        self.each_entry(index, start, end, |term, doc| {
            out.push((term, doc.to_vec()));
            out.len() < limit
        })
        .await?;
        Ok(out)
    }

    /// Blocking [`DatabaseHandle::query`].
    pub fn blocking_query(&self, index: &str, term: impl AsRef<[u8]>) -> Result<Vec<Vec<u8>>> {
        blocking::wait("DatabaseHandle::blocking_query", self.query(index, term))
    }

    /// Blocking [`DatabaseHandle::query_count`].
    pub fn blocking_query_count(&self, index: &str, term: impl AsRef<[u8]>) -> Result<u64> {
        blocking::wait(
            "DatabaseHandle::blocking_query_count",
            self.query_count(index, term),
        )
    }

    /// Blocking [`DatabaseHandle::query_documents`].
    pub fn blocking_query_documents(
        &self,
        index: &str,
        term: impl AsRef<[u8]>,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        blocking::wait(
            "DatabaseHandle::blocking_query_documents",
            self.query_documents(index, term),
        )
    }

    /// Blocking [`DatabaseHandle::query_terms`].
    pub fn blocking_query_terms(
        &self,
        index: &str,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        blocking::wait(
            "DatabaseHandle::blocking_query_terms",
            self.query_terms(index, start, end, limit),
        )
    }
}

/// The keys of every entry of term `term`: `[prefix, prefix with its last byte + 1)`, where
/// the prefix `escape(term) ++ 0x00` ends in 0x00 (so the bound is the prefix with 0x01 last).
fn term_bounds(term: &[u8]) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let start = index_term_prefix(term);
    let mut end = start.clone();
    if let Some(last) = end.last_mut() {
        *last = 1;
    }
    (Bound::Included(start), Bound::Excluded(end))
}

/// The keys of the entries whose terms lie in `start..end`: a term's entries are the keys from
/// its prefix (`escape(term) ++ 0x00`) up to that prefix with 0x01 last, and the escape keeps
/// the order of terms (`index_key.rs`), so bounds on terms are bounds on those keys.
fn terms_bounds(start: Bound<&[u8]>, end: Bound<&[u8]>) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let start = match start {
        Bound::Included(t) => term_bounds(t).0,
        Bound::Excluded(t) => match term_bounds(t).1 {
            Bound::Excluded(k) => Bound::Included(k),
            other => other,
        },
        Bound::Unbounded => Bound::Unbounded,
    };
    let end = match end {
        Bound::Included(t) => term_bounds(t).1,
        Bound::Excluded(t) => Bound::Excluded(index_term_prefix(t)),
        Bound::Unbounded => Bound::Unbounded,
    };
    (start, end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::actors::index_key::index_entry_key;
    use std::ops::RangeBounds;

    fn within(k: &[u8], b: &(Bound<Vec<u8>>, Bound<Vec<u8>>)) -> bool {
        (match &b.0 {
            Bound::Included(s) => k >= &s[..],
            Bound::Excluded(s) => k > &s[..],
            Bound::Unbounded => true,
        }) && (match &b.1 {
            Bound::Included(e) => k <= &e[..],
            Bound::Excluded(e) => k < &e[..],
            Bound::Unbounded => true,
        })
    }

    #[test]
    fn term_bounds_hold_exactly_the_terms_entries() {
        let terms: [&[u8]; 7] = [b"", b"a", b"a\0", b"a\x01", b"ab", b"b", b"\xff"];
        for t in terms {
            let b = term_bounds(t);
            for u in terms {
                for doc in [&b"d"[..], b"\0", b"\xff\xff"] {
                    let k = index_entry_key(u, doc);
                    assert_eq!(within(&k, &b), t == u, "term {t:?}, entry of {u:?}");
                }
            }
            // The applied record (the key 0x00) decodes as no entry whatever the bounds.
            assert!(decode_index_entry(&[0]).is_none());
        }
    }

    #[test]
    fn terms_bounds_hold_the_terms_in_the_range() {
        let terms: [&[u8]; 6] = [b"", b"a", b"a\0", b"ab", b"b", b"c"];
        type Bounds<'a> = (Bound<&'a [u8]>, Bound<&'a [u8]>);
        let cases: [Bounds; 5] = [
            (Bound::Included(b"a"), Bound::Included(b"ab")),
            (Bound::Excluded(b"a"), Bound::Excluded(b"b")),
            (Bound::Unbounded, Bound::Excluded(b"a\0")),
            (Bound::Excluded(b""), Bound::Unbounded),
            (Bound::Included(b"b"), Bound::Included(b"b")),
        ];
        for (s, e) in cases {
            let b = terms_bounds(s, e);
            for u in terms {
                let want = (s, e).contains(&u);
                let k = index_entry_key(u, b"doc");
                assert_eq!(within(&k, &b), want, "{s:?}..{e:?} and term {u:?}");
            }
        }
    }
}
