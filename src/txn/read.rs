//! The read transaction: a snapshot of one committed state.

use std::ops::Bound;
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
///
/// A snapshot of an index storage that the actor runtime keeps (design.md 10.1) leaves out the
/// index's applied record, the key `0x00`: `len`, `get`, `multi_get`, `contains_key`, `range`,
/// `iter`, `prefix`, `first` and `last` show the index's entries only.
#[derive(Clone)]
pub struct ReadTransaction {
    state: Arc<State>,
    /// The storage is an engine-kept index: [`RESERVED_KEY`] is left out of every view.
    hide_reserved: bool,
}

/// The key an index storage keeps its applied record at (`0x00`, the smallest key there is);
/// left out of the snapshots of a storage marked as an index (`Storage::hide_reserved_key`).
pub(crate) const RESERVED_KEY: &[u8] = &[0];

/// The first 8 bytes of an index's applied record at [`RESERVED_KEY`] (design.md 10.1); the next
/// 8 are the root txn id the index has applied, little-endian.
pub(crate) const INDEX_RECORD_MAGIC: &[u8; 8] = b"omniIDX2";

/// The applied record's magic before index terms were escaped (read as no record by the index
/// runtime, which reconciles such an index; still the engine's key, never an entry).
pub(crate) const INDEX_RECORD_MAGIC_V1: &[u8; 8] = b"omniIDX1";

/// The applied record of root txn `txn`: 16 bytes, [`INDEX_RECORD_MAGIC`] then `txn` (u64 LE).
pub(crate) fn index_record(txn: u64) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..8].copy_from_slice(INDEX_RECORD_MAGIC);
    v[8..].copy_from_slice(&txn.to_le_bytes());
    v
}

/// The root txn of an applied record of the current version; `None` for any other value.
pub(crate) fn decode_index_record(v: &[u8]) -> Option<u64> {
    if v.len() != 16 || &v[..8] != INDEX_RECORD_MAGIC {
        return None;
    }
    Some(u64::from_le_bytes(v[8..16].try_into().ok()?))
}

/// True when `v`, the value at [`RESERVED_KEY`] of a branch storage, is an index's applied
/// record of either version: the storage is an index, its key `0x00` the engine's.
pub(crate) fn is_index_record(v: &[u8]) -> bool {
    v.len() == 16 && (&v[..8] == INDEX_RECORD_MAGIC || &v[..8] == INDEX_RECORD_MAGIC_V1)
}

impl std::fmt::Debug for ReadTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReadTransaction(txn {})", self.state.txn_id)
    }
}

impl ReadTransaction {
    pub(crate) fn new(state: Arc<State>, hide_reserved: bool) -> ReadTransaction {
        ReadTransaction {
            state,
            hide_reserved,
        }
    }

    /// True when `key` is the hidden applied record of an index storage.
    fn hidden(&self, key: &[u8]) -> bool {
        self.hide_reserved && key == RESERVED_KEY
    }

    /// `start`, moved past [`RESERVED_KEY`] when that key is hidden and `start` admits it (it is
    /// the smallest key, so a range holds it exactly when its start admits it).
    fn visible_start<'k>(&self, start: Bound<&'k [u8]>) -> Bound<&'k [u8]> {
        let admits = match start {
            Bound::Unbounded => true,
            Bound::Included(k) => k <= RESERVED_KEY,
            Bound::Excluded(k) => k < RESERVED_KEY,
        };
        if self.hide_reserved && admits {
            Bound::Excluded(RESERVED_KEY)
        } else {
            start
        }
    }

    /// The value of `key` whether hidden or not: the index runtime's read of its applied record.
    pub(crate) fn get_reserved(&self, key: &[u8]) -> Result<Option<&[u8]>> {
        if let Some(v) = self.state.buffer.get(key) {
            return Ok(v);
        }
        btree::get(&self.state, key)
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
    /// An index storage's applied record is not counted (one lookup of it per call).
    pub fn len(&self) -> u64 {
        let hidden = self.hide_reserved && matches!(self.get_reserved(RESERVED_KEY), Ok(Some(_)));
        self.state.len().saturating_sub(u64::from(hidden))
    }

    /// True when the snapshot holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The value of `key`, borrowed from the snapshot.
    ///
    /// Errors: [`crate::Error::Corruption`] when a page on the path fails its checksum or is
    /// malformed. A key that could never be stored (empty, over 1,024 bytes) is simply absent.
    pub fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<&[u8]>> {
        let key = key.as_ref();
        if self.hidden(key) {
            return Ok(None);
        }
        self.get_reserved(key)
    }

    /// [`ReadTransaction::get`], when it can answer without a page fault: every page on the
    /// key's path is in memory (a page of the scratch table, or one of the map known to be in
    /// the page cache: read since the last residency refresh, or found there by it); `None`
    /// otherwise, having touched no page that is not. The actors' handles read this way on the
    /// caller's thread and send the rest to their reader pool.
    pub(crate) fn get_if_resident(&self, key: &[u8]) -> Option<Result<Option<&[u8]>>> {
        if self.hidden(key) {
            return Some(Ok(None));
        }
        if let Some(v) = self.state.buffer.get(key) {
            return Some(Ok(v));
        }
        btree::get_if_resident(&self.state, key)
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
        let mut found = self.multi_get_all(keys)?;
        if self.hide_reserved {
            for (v, k) in found.iter_mut().zip(keys) {
                if self.hidden(k.as_ref()) {
                    *v = None;
                }
            }
        }
        Ok(found)
    }

    /// [`ReadTransaction::multi_get`] with nothing hidden.
    fn multi_get_all<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<Vec<Option<&[u8]>>> {
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
        Range::new(
            self.source(),
            self.visible_start(bounds.start_key()),
            bounds.end_key(),
        )
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
        let p = prefix.as_ref();
        if self.hide_reserved && RESERVED_KEY.starts_with(p) {
            // The prefix admits the hidden key (it is empty or the key itself).
            let end = crate::btree::prefix_end(p);
            let end = end.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
            return Range::new(self.source(), Bound::Excluded(RESERVED_KEY), end);
        }
        Range::prefix(self.source(), p)
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

#[cfg(test)]
mod tests {
    use crate::{Options, Storage};

    /// Evicts the pages of `span` (part of this process's read-only map) from the page cache.
    fn page_out(span: &[u8]) {
        // SAFETY: `span` is page aligned and lies within a live read-only mapping; the advice
        // changes no byte of it (a later read faults the same bytes back in from the file).
        let r = unsafe {
            libc::madvise(
                span.as_ptr() as *mut libc::c_void,
                span.len(),
                libc::MADV_PAGEOUT,
            )
        };
        assert_eq!(
            r,
            0,
            "madvise(MADV_PAGEOUT): {}",
            std::io::Error::last_os_error()
        );
    }

    fn key(i: u32) -> Vec<u8> {
        format!("key-{i:05}").into_bytes()
    }

    /// Pins the calling thread to the CPU it runs on. A page a thread faults in waits in that
    /// CPU's batch of pages not yet on the kernel's LRU lists, and `MADV_PAGEOUT` drains only
    /// the batch of the CPU it runs on: a test thread that moved to the other CPU between a
    /// read and [`page_out`] left the pages it had just read in memory, and a check that they
    /// were evicted failed now and then.
    fn pin_to_this_cpu() {
        let mut set = rustix::thread::CpuSet::new();
        set.set(rustix::thread::sched_getcpu());
        rustix::thread::sched_setaffinity(None, &set).expect("sched_setaffinity");
    }

    /// A storage of 3,000 keys of 200 B at `path`, written, closed and opened again: its pages
    /// are in the file only (no scratch table), none known resident. The calling thread is
    /// pinned to its CPU ([`pin_to_this_cpu`]), so that [`page_out`] evicts what it read.
    fn reopened(path: &std::path::Path) -> Storage {
        pin_to_this_cpu();
        {
            let s = Storage::open(path, Options::default()).unwrap();
            let mut w = s.begin_write().unwrap();
            for i in 0..3000 {
                w.put(key(i), vec![b'v'; 200]).unwrap();
            }
            w.commit().unwrap();
        }
        Storage::open(path, Options::default()).unwrap()
    }

    #[test]
    fn reads_if_resident_trust_only_pages_known_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let s = reopened(&dir.path().join("s"));
        let r = s.begin_read().unwrap();
        assert!(r.get_if_resident(&key(7)).is_none());
        assert_eq!(r.get(key(7)).unwrap(), Some(&[b'v'; 200][..]));
        // Its path was just read: known resident now.
        assert_eq!(
            r.get_if_resident(&key(7)).unwrap().unwrap(),
            Some(&[b'v'; 200][..])
        );
        // The whole file paged out: a refresh learns it, and the read is refused again.
        let state = r.state_for_tests();
        let pages = state.mapping.len() / crate::page::PAGE_SIZE as u64;
        page_out(state.mapping.span(0, pages).unwrap());
        s.refresh_residency();
        assert!(r.get_if_resident(&key(7)).is_none());
        // Read back in by someone else (a plain read), a refresh finds it.
        let span = state.mapping.span(0, pages).unwrap();
        let sum: u64 = span.iter().step_by(4096).map(|b| u64::from(*b)).sum();
        assert!(sum > 0);
        s.refresh_residency();
        assert_eq!(
            r.get_if_resident(&key(7)).unwrap().unwrap(),
            Some(&[b'v'; 200][..])
        );
        // A key that is absent is answered without a fault too.
        assert_eq!(r.get_if_resident(&key(99_999)).unwrap().unwrap(), None);
    }

    /// The number of pages of `state`'s map and the whole map's bytes (nothing touched).
    fn whole_map(state: &crate::state::State) -> (u64, &[u8]) {
        let pages = state.mapping.len() / crate::page::PAGE_SIZE as u64;
        (pages, state.mapping.span(0, pages).unwrap())
    }

    /// Pages of `span` the kernel holds in memory (`mincore`).
    fn resident_pages(span: &[u8]) -> usize {
        crate::env::page_reads::resident_units(span, crate::page::PAGE_SIZE)
            .unwrap()
            .iter()
            .filter(|r| **r)
            .count()
    }

    /// Residency bits that went stale (pages evicted after they were read, before a refresh
    /// saw it) made a read "if resident" fault the page back in on the caller's thread.
    #[test]
    fn reads_if_resident_ask_the_kernel_while_the_file_is_evicted() {
        let dir = tempfile::tempdir().unwrap();
        let s = reopened(&dir.path().join("s"));
        let r = s.begin_read().unwrap();
        let state = r.state_for_tests();
        let (_, span) = whole_map(state);
        let resident = || resident_pages(span);
        // Read, then a whole refresh pass with nothing evicted: the bits are trusted.
        assert_eq!(r.get(key(7)).unwrap(), Some(&[b'v'; 200][..]));
        assert!(r.get_if_resident(&key(7)).is_some());
        s.refresh_residency();
        assert!(!state.mapping.evicting());
        assert!(!random_advice(span));
        // Evicted under a refresh: the map counts as evicting, and reads no neighbours in
        // around a fault. (A pass runs only when reads "if resident" were made since the last
        // one began.)
        assert!(r.get_if_resident(&key(7)).is_some());
        page_out(span);
        s.refresh_residency();
        assert!(state.mapping.evicting());
        assert!(random_advice(span));
        // Read again (bits set), then evicted with no refresh since: the bits are stale, and
        // the read "if resident" must ask the kernel instead of faulting the pages back in.
        assert_eq!(r.get(key(7)).unwrap(), Some(&[b'v'; 200][..]));
        page_out(span);
        let before = resident();
        assert!(r.get_if_resident(&key(7)).is_none());
        assert_eq!(resident(), before, "a page was read back in by the check");
        // Back in memory, a whole pass with no eviction ends the evicting state.
        assert_eq!(r.get(key(7)).unwrap(), Some(&[b'v'; 200][..]));
        let sum: u64 = span.iter().step_by(4096).map(|b| u64::from(*b)).sum();
        assert!(sum > 0);
        s.refresh_residency();
        assert!(
            state.mapping.evicting(),
            "the pass that found the eviction still counts"
        );
        assert!(r.get_if_resident(&key(8)).is_some());
        s.refresh_residency();
        assert!(!state.mapping.evicting());
        assert!(!random_advice(span));
        assert!(r.get_if_resident(&key(7)).is_some());
    }

    /// Pages read, then evicted before a refresh reached them, kept their bits: until a refresh
    /// pass (seconds on a large map) came by, a read on a caller's thread trusted them and
    /// faulted them back in. A probe (the reader pool runs one after each read a caller sent
    /// it) finds the eviction at once.
    #[test]
    fn a_probe_finds_pages_evicted_since_they_were_read() {
        let dir = tempfile::tempdir().unwrap();
        let s = reopened(&dir.path().join("s"));
        let r = s.begin_read().unwrap();
        let state = r.state_for_tests();
        let (pages, span) = whole_map(state);
        let resident = || resident_pages(span);
        assert_eq!(r.get(key(7)).unwrap(), Some(&[b'v'; 200][..]));
        assert!(r.get_if_resident(&key(7)).is_some());
        // Nothing evicted: a probe finds nothing, and the map is not evicting.
        assert!(!s.probe_residency());
        assert!(!state.mapping.evicting());
        page_out(span);
        // One probe looks at up to PROBE_SCAN words: this map has fewer.
        assert!(pages < crate::state::PROBE_SCAN_PAGES);
        assert!(s.probe_residency());
        assert!(state.mapping.evicting());
        assert!(random_advice(span));
        // The read "if resident" now asks the kernel instead of faulting the path back in.
        let before = resident();
        assert!(r.get_if_resident(&key(7)).is_none());
        assert_eq!(
            resident(),
            before,
            "a page was read back in on the caller's thread"
        );
        // While evicting, a probe does nothing (callers check each page themselves).
        assert!(!s.probe_residency());
    }

    /// A map read only through the reader pool never had refresh passes (they started only
    /// for maps read "if resident"), so its eviction was never found and its read-around
    /// stayed on under a memory limit: a probe now asks for them.
    #[test]
    fn a_probe_asks_for_refresh_passes() {
        let dir = tempfile::tempdir().unwrap();
        let s = reopened(&dir.path().join("s"));
        let r = s.begin_read().unwrap();
        let state = r.state_for_tests();
        let (_, span) = whole_map(state);
        assert_eq!(r.get(key(7)).unwrap(), Some(&[b'v'; 200][..]));
        assert!(!s.probe_residency(), "nothing evicted yet");
        page_out(span);
        s.refresh_residency();
        assert!(state.mapping.evicting(), "no refresh pass ran");
        assert!(random_advice(span));
    }

    /// A host's proactive reclaim paging out pages that a refresh had found in the page cache
    /// and no reader of the map touched kept the map counting as evicting, so that every warm
    /// read on a caller's thread asked the kernel about each page of its path: such evictions
    /// now only clear the pages' bits; an eviction of a page read through the map still counts.
    #[test]
    fn evictions_of_pages_no_reader_touched_leave_the_map_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let s = reopened(&dir.path().join("s"));
        let r = s.begin_read().unwrap();
        let state = r.state_for_tests();
        let (pages, span) = whole_map(state);
        // The file in the page cache, read by someone else (bytes touched, not through the
        // map's reads): a refresh marks every page resident, none read.
        let touch = || {
            span.iter()
                .step_by(4096)
                .map(|b| u64::from(*b))
                .sum::<u64>()
        };
        assert!(touch() > 0);
        // A read "if resident" of a page past the map: refreshes are wanted, nothing is read.
        let want = || assert!(state.mapping.page_if_resident(pages + 1).is_none());
        want();
        s.refresh_residency();
        assert!(!state.mapping.evicting());
        // Paged out with nobody reading: the bits go, the map stays trusted.
        page_out(span);
        want();
        s.refresh_residency();
        assert!(
            !state.mapping.evicting(),
            "pages no reader touched made the map evicting"
        );
        assert!(!random_advice(span));
        let before = resident_pages(span);
        assert!(r.get_if_resident(&key(7)).is_none());
        assert_eq!(resident_pages(span), before, "a cold page was faulted in");
        // A page read through the map and then evicted still counts.
        assert_eq!(r.get(key(7)).unwrap(), Some(&[b'v'; 200][..]));
        assert!(r.get_if_resident(&key(7)).is_some());
        page_out(span);
        want();
        s.refresh_residency();
        assert!(state.mapping.evicting());
        assert!(random_advice(span));
    }

    /// Whether the mapping holding `span` is advised `MADV_RANDOM` (its `VmFlags` in
    /// `/proc/self/smaps` has `rr`).
    fn random_advice(span: &[u8]) -> bool {
        let addr = span.as_ptr() as usize;
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            let first = line.split_whitespace().next().unwrap_or("");
            if let Some((a, b)) = first.split_once('-') {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                {
                    inside = a <= addr && addr < b;
                    continue;
                }
            }
            if inside {
                if let Some(flags) = line.strip_prefix("VmFlags:") {
                    return flags.split_whitespace().any(|f| f == "rr");
                }
            }
        }
        panic!("no mapping holds the span in /proc/self/smaps");
    }
}
