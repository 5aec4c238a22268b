//! The state record: the immutable view a reader needs, published with one atomic pointer swap.
//!
//! A [`State`] holds the root page, the transaction id, the free-space map's directory page, the
//! high-water page count, the scratch table (pages committed to the journal but not yet flushed)
//! and the read-only map of the data file. Readers `load_full()` it from an `ArcSwap` (no lock)
//! and keep it alive for as long as their snapshot lives; an old map and old scratch pages are
//! freed when the last `Arc<State>` that holds them is dropped (design.md invariant I3).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use memmap2::{Mmap, MmapOptions};

use crate::env::EnvFile;
use crate::error::{Error, Result};
use crate::page::{check_image, PageHeader, PAGE_SIZE};

/// Scratch table: page number -> latest committed, unflushed image (`scratch.rs`).
pub(crate) use crate::scratch::{Scratch, ScratchPage};

/// A page's bit in [`Mapping`]'s bitmap: its checksum was verified.
const VERIFIED: u64 = 1;
/// A page's bit in [`Mapping`]'s bitmap: known to be in the page cache.
const RESIDENT: u64 = 2;
/// A page's bit in [`Mapping`]'s bitmap: read through this map since it last came into the
/// page cache (set with [`RESIDENT`] by a read, cleared only when the page is found gone).
const READ: u64 = 4;
/// Bits per page in [`Mapping`]'s bitmap ([`VERIFIED`], [`RESIDENT`], [`READ`], one unused).
const BITS_PER_PAGE: u64 = 4;
/// Pages per word of [`Mapping`]'s bitmap.
const PAGES_PER_WORD: u64 = 64 / BITS_PER_PAGE;
/// The [`RESIDENT`] bits of all the pages of a word.
const RESIDENT_ALL: u64 = 0x2222_2222_2222_2222;
/// The [`READ`] bits of all the pages of a word.
const READ_ALL: u64 = 0x4444_4444_4444_4444;

/// A read-only map of the data file, with bits per page: its checksum was verified, it is known
/// to be in the page cache, and it was read through this map since it came there.
pub(crate) struct Mapping {
    map: Option<Mmap>,
    /// The storage's end of file for readers (shared by all its mappings): lowered before the
    /// closing flush cuts the file's free tail, so no read touches a byte past the file's end.
    end: Arc<AtomicU64>,
    len: u64,
    /// [`BITS_PER_PAGE`] bits per page, [`PAGES_PER_WORD`] pages a word (one load answers all
    /// for a read): [`VERIFIED`]; [`RESIDENT`]: read through the map since the last
    /// [`Mapping::refresh_residency`], or found in the page cache by it, what
    /// [`Mapping::page_if_resident`] trusts so that an async caller's read never faults on a
    /// page known cold; and [`READ`]: read through the map while in the page cache, so that
    /// its eviction says the cache is losing pages this map's readers use.
    bits: Box<[AtomicU64]>,
    /// Set by a [`Mapping::page_if_resident`] since the last refresh pass began: the bits are
    /// in use.
    residency_wanted: AtomicBool,
    /// The page the next refresh window starts at (0: a new pass).
    refresh_cursor: AtomicU64,
    /// The word of the bitmap the next [`Mapping::probe_residency`] starts at.
    probe_cursor: AtomicU64,
    /// Pages this map's readers use were found evicted in the current or the last whole
    /// refresh pass: by a refresh (a page with its [`READ`] bit), by a probe or by a check of
    /// [`Mapping::page_if_resident`] (any page known resident). The bits may be stale, so
    /// `page_if_resident` asks the kernel (`mincore`) before it touches a page, and the map's
    /// read-around is off ([`Mapping::set_evicting`]). Cleared by a whole pass that finds no
    /// such eviction. Pages a refresh found resident that no reader of this map touched (a
    /// file's pages cached by earlier processes, neighbours read around a fault) may be paged
    /// out by the host's proactive reclaim for as long as they stay idle: their evictions lose
    /// their bits without making the map evicting, else a warm reader would pay a `mincore`
    /// per page for as long as that reclaim goes on.
    evicting: AtomicBool,
    /// An eviction was found since the current refresh pass began.
    pass_evicted: AtomicBool,
    path: Arc<PathBuf>,
    /// The data file, for [`crate::btree::multi_get`]'s reads of pages not in memory (its
    /// `raw_fd` is the real file, as the map's).
    file: Arc<dyn EnvFile>,
    /// What MultiGet learned about this file: whether its pages are usually resident, and
    /// whether the ring can read it.
    pub(crate) read_hints: crate::env::page_reads::ReadHints,
}

impl std::fmt::Debug for Mapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mapping({} bytes)", self.len)
    }
}

impl Mapping {
    /// Maps the first `len` bytes of `file` read-only.
    /// `end` is the storage's shared end of file for readers ([`crate::storage::Inner`]'s
    /// `map_end`): pages at or past it are refused, never touched.
    pub fn new(
        file: &Arc<dyn EnvFile>,
        len: u64,
        path: Arc<PathBuf>,
        end: Arc<AtomicU64>,
    ) -> Result<Mapping> {
        let map = if len == 0 {
            None
        } else {
            // SAFETY: the map is read-only and covers bytes below the file's length; the data
            // file is cut only (a) by a closing storage's `Inner::trim_tail`, which first lowers
            // `end`, below which every read stays (`page`), and (b) by compaction, only above the
            // next page of every live state (no snapshot can reach a page there:
            // `Storage::compact`); the only writer (the flush, of this process or, for a
            // read-only storage, of a writer in another one) never writes a page that a live
            // snapshot can read from the map (design.md invariants I3, I4, I12 and I16: the
            // reader table holds another process's pages back as a snapshot does; free-space
            // pages, which a flush writes in place, are read from the map beside a live writer
            // only by the open's replay, which checks the page it rebuilds from one and tries
            // again on a mismatch), so no reader
            // observes bytes changing, or vanishing, under a `&[u8]` it holds.
            let m = unsafe { MmapOptions::new().len(len as usize).map(file.raw_fd()) }.map_err(
                |e| Error::Io {
                    op: "mmap",
                    path: path.to_path_buf(),
                    source: e,
                },
            )?;
            Some(m)
        };
        let pages = (len as usize).div_ceil(PAGE_SIZE);
        let bits = (0..(pages as u64).div_ceil(PAGES_PER_WORD))
            .map(|_| AtomicU64::new(0))
            .collect();
        Ok(Mapping {
            map,
            end,
            len,
            bits,
            residency_wanted: AtomicBool::new(false),
            refresh_cursor: AtomicU64::new(0),
            probe_cursor: AtomicU64::new(0),
            evicting: AtomicBool::new(false),
            pass_evicted: AtomicBool::new(false),
            path,
            file: file.clone(),
            read_hints: Default::default(),
        })
    }

    /// Bytes mapped.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// The mapped bytes of pages `p..p + pages`, when all of them lie below the readers' end
    /// of file; the bytes are not touched (no page fault), so the span can be asked about
    /// (`mincore`) before it is read.
    pub fn span(&self, p: u64, pages: u64) -> Option<&[u8]> {
        let map = self.map.as_ref()?;
        let start = usize::try_from(p).ok()?.checked_mul(PAGE_SIZE)?;
        let len = usize::try_from(pages).ok()?.checked_mul(PAGE_SIZE)?;
        let stop = start.checked_add(len)?;
        if stop as u64 > self.end.load(Ordering::Acquire) {
            return None;
        }
        map.get(start..stop)
    }

    /// The data file this maps.
    pub fn file(&self) -> &Arc<dyn EnvFile> {
        &self.file
    }

    /// The data file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Page `p`'s word of the bitmap and the shift of its bits in it.
    fn slot(&self, p: u64) -> Option<(&AtomicU64, u32)> {
        let w = self.bits.get(usize::try_from(p / PAGES_PER_WORD).ok()?)?;
        Some((w, ((p % PAGES_PER_WORD) * BITS_PER_PAGE) as u32))
    }

    /// Page `p`'s bits ([`VERIFIED`], [`RESIDENT`], [`READ`]); none for a page past the map.
    fn page_bits(&self, p: u64) -> u64 {
        self.slot(p).map_or(0, |(w, sh)| {
            (w.load(Ordering::Relaxed) >> sh) & (VERIFIED | RESIDENT | READ)
        })
    }

    /// Sets `flags` among page `p`'s bits.
    fn set_bits(&self, p: u64, flags: u64) {
        if let Some((w, sh)) = self.slot(p) {
            w.fetch_or(flags << sh, Ordering::Relaxed);
        }
    }

    /// Records that page `p`'s checksum was verified (on an image read from the file, which
    /// holds the same bytes as the map while a snapshot can reach the page).
    pub fn mark_verified(&self, p: u64) {
        self.set_bits(p, VERIFIED);
    }

    /// Whether page `p`'s residency bit is set.
    fn known_resident(&self, p: u64) -> bool {
        self.page_bits(p) & RESIDENT != 0
    }

    /// Sets the residency and read bits of pages `p..p + pages` (they were just read through
    /// the map).
    fn mark_resident(&self, p: u64, pages: u64) {
        for q in p..p.saturating_add(pages) {
            // A load first: the bits are set on all but a page's first read.
            if self.page_bits(q) & (RESIDENT | READ) != RESIDENT | READ {
                self.set_bits(q, RESIDENT | READ);
            }
        }
    }

    /// Page `p` and its run as [`Mapping::page`] reads them, when every page of it is known to
    /// be in the page cache (read through the map since the last
    /// [`Mapping::refresh_residency`] or found there by it): `None` otherwise, without touching
    /// the map past page `p`'s header. While the page cache evicts this file's pages (see
    /// [`Mapping::evicting`]) the bits are only a first filter: every page of the run is also
    /// asked about (`mincore`, one call a run) before it is touched, and one found evicted loses
    /// its bit; otherwise a page evicted since it was last known resident still faults (the bits
    /// are as fresh as the last refresh).
    pub fn page_if_resident(&self, p: u64) -> Option<Result<(&[u8], PageHeader)>> {
        // The bits are in use: the next refresh must run (a load first, so that readers on
        // many threads do not all write one cache line).
        if !self.residency_wanted.load(Ordering::Relaxed) {
            self.residency_wanted.store(true, Ordering::Relaxed);
        }
        if !self.known_resident(p) {
            return None;
        }
        let verify = self.evicting.load(Ordering::Relaxed);
        if verify && !self.still_resident(p, 1) {
            return None;
        }
        // The rest of the run must be known resident too. A page read before (checksum
        // verified) is read by `page` no further than its header, so its run is checked after;
        // the first read of a page verifies the checksum of the whole run, so its run length
        // comes from the header (page `p`, in memory) and is checked before. A page with no
        // readable header is left to `page`, which reports it.
        let run_ok = |pages: u64| {
            pages <= 1
                || ((1..pages).all(|i| self.known_resident(p + i))
                    && (!verify || self.still_resident(p + 1, pages - 1)))
        };
        if self.page_bits(p) & VERIFIED == 0 {
            let pages = self
                .span(p, 1)
                .and_then(PageHeader::read)
                .map_or(1, |h| u64::from(h.run_pages.max(1)));
            if !run_ok(pages) {
                return None;
            }
            return Some(self.page(p, false));
        }
        let r = self.page(p, false);
        if let Ok((img, _)) = &r {
            if !run_ok((img.len() / PAGE_SIZE) as u64) {
                return None;
            }
        }
        Some(r)
    }

    /// Whether pages `p..p + pages` are all in the page cache now (`mincore`); those that are
    /// not lose their residency bit, and the map counts as evicting. A span past the readers'
    /// end, or a failed `mincore`, answers `true`: [`Mapping::page`] reports the first, and the
    /// bits are trusted as before on the second.
    fn still_resident(&self, p: u64, pages: u64) -> bool {
        let Some(span) = self.span(p, pages) else {
            return true;
        };
        if crate::env::page_reads::all_resident(span) != Some(false) {
            return true;
        }
        // Some page of the run is gone: the run's bits are cleared (a page still resident gets
        // its bit back at its next read through the map, or at the next refresh).
        for q in p..p.saturating_add(pages) {
            if let Some((w, sh)) = self.slot(q) {
                w.fetch_and(!((RESIDENT | READ) << sh), Ordering::Relaxed);
            }
        }
        self.set_evicting(true);
        self.pass_evicted.store(true, Ordering::Relaxed);
        false
    }

    /// Sets [`Mapping::evicting`]; on a change, switches the map's read-around: off
    /// (`MADV_RANDOM`) while the page cache evicts this file, back on (`MADV_NORMAL`) after. A
    /// fault then reads its own page only, as LMDB's `MDB_NORDAHEAD` advises for a database
    /// larger than the memory left: random point reads do not fill the cache with neighbours
    /// that are evicted unread, and a caller's thread never finds a neighbour "resident"
    /// (`mincore` counts a page from the moment its read starts) and waits for a read-around it
    /// did not start. Range scans over cold pages read a page per fault meanwhile. An advice
    /// that fails changes nothing but speed, and is not an error.
    fn set_evicting(&self, evicting: bool) {
        if self.evicting.swap(evicting, Ordering::Relaxed) != evicting {
            if let Some(map) = &self.map {
                let advice = if evicting {
                    memmap2::Advice::Random
                } else {
                    memmap2::Advice::Normal
                };
                if let Err(e) = map.advise(advice) {
                    tracing::debug!(path = %self.path.display(), error = %e, "madvise of the data file's map");
                }
            }
        }
    }

    /// Sets the residency bits of the next [`RESIDENCY_WINDOW`] pages from the page cache (one
    /// `mincore` over them), in passes over the whole map: a pass starts only when
    /// [`Mapping::page_if_resident`] was used since the last one began (else nothing: no cost
    /// for a storage nobody reads that way). Pages evicted since lose their bits, and the map
    /// counts as evicting when one of them had been read through it ([`READ`]); pages read in
    /// by anyone gain their residency bit. Each call costs about 0.1 ms (256 MiB of map); a
    /// pass over `n` GiB takes `4n` calls.
    pub fn refresh_residency(&self) {
        let Some(map) = &self.map else {
            return;
        };
        let start = self.refresh_cursor.load(Ordering::Relaxed);
        if start == 0 && !self.residency_wanted.swap(false, Ordering::Relaxed) {
            return;
        }
        let end_page = (self.end.load(Ordering::Acquire) as usize).min(map.len()) / PAGE_SIZE;
        // Windows start on a word of the bitmap, so that each updates whole words.
        let per = PAGES_PER_WORD as usize;
        let start = (start as usize).min(end_page) / per * per;
        let stop = (start + RESIDENCY_WINDOW).min(end_page);
        let next = if stop >= end_page { 0 } else { stop };
        self.refresh_cursor.store(next as u64, Ordering::Relaxed);
        if stop <= start {
            return;
        }
        let span = &map[start * PAGE_SIZE..stop * PAGE_SIZE];
        let Some(units) = crate::env::page_reads::resident_units(span, PAGE_SIZE) else {
            return;
        };
        for (i, chunk) in units.chunks(per).enumerate() {
            let found = resident_bits(chunk);
            if let Some(w) = self.bits.get(start / per + i) {
                // The residency bits replaced, the verified ones kept, the read bits of pages
                // gone cleared.
                let old = w
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                        Some((old & !(RESIDENT_ALL | READ_ALL)) | found | (old & (found << 1)))
                    })
                    .unwrap_or_else(|old| old);
                if (old & READ_ALL) >> 1 & !found != 0 {
                    // A page read through the map was evicted.
                    self.set_evicting(true);
                    self.pass_evicted.store(true, Ordering::Relaxed);
                }
            }
        }
        if next == 0 {
            // A whole pass ended: its verdict on eviction stands until the next one ends.
            let evicted = self.pass_evicted.swap(false, Ordering::Relaxed);
            self.set_evicting(evicted);
        }
    }

    /// Looks for pages evicted while their residency bits were set, a few at a time, between
    /// refreshes: the first word of the bitmap with pages known resident, among the next
    /// [`PROBE_SCAN`] words from a cursor of its own, is asked
    /// about (one `mincore` of its 16 pages, 128 KiB of map); pages found gone lose their bits
    /// and the map counts as evicting ([`Mapping::set_evicting`]), whether or not they were
    /// read through the map: a probe runs only after reads the reader pool answers (callers'
    /// reads that found pages not in memory, or every read with the pool as the read path),
    /// and at a cold start the neighbours read around a fault (which `mincore` then counts
    /// resident, and a refresh marks) leave the cache before the pages read do, so a caller
    /// must not trust them. Nothing is done while the map
    /// already counts as evicting (every read on a caller's thread then asks the kernel
    /// itself). Returns whether it found an eviction.
    ///
    /// Why: a refresh pass over a large map takes seconds (16 ticks of 50 ms for 4 GiB), and
    /// until it reaches a page that went out of the page cache, its bit is trusted and a read
    /// on a caller's thread faults it back in. The reader pool probes after each read that a
    /// caller's thread sent it for a page not known resident: that is when the cache holds less
    /// than the readers want, and the probe runs on the reader's thread, never the caller's.
    pub fn probe_residency(&self) -> bool {
        // A map the reader pool probes is read: refresh passes keep its bits and its
        // evicting state (a map read only through the pool never had one, so it never left
        // the read-around on that a disk's 8 MiB read-ahead makes cost 8 MiB per cold fault).
        if !self.residency_wanted.load(Ordering::Relaxed) {
            self.residency_wanted.store(true, Ordering::Relaxed);
        }
        if self.evicting.load(Ordering::Relaxed) || self.map.is_none() {
            return false;
        }
        let words = self.bits.len() as u64;
        if words == 0 {
            return false;
        }
        let first = self.probe_cursor.fetch_add(PROBE_SCAN, Ordering::Relaxed) % words;
        for i in 0..PROBE_SCAN.min(words) {
            let word = (first + i) % words;
            let Some(w) = self.bits.get(word as usize) else {
                continue;
            };
            let known = w.load(Ordering::Relaxed) & RESIDENT_ALL;
            if known == 0 {
                continue;
            }
            // The word's pages below the readers' end of file (the last word may be partial).
            let p = word * PAGES_PER_WORD;
            let end_page = self.end.load(Ordering::Acquire) / PAGE_SIZE as u64;
            let pages = PAGES_PER_WORD.min(end_page.saturating_sub(p));
            let Some(span) = self.span(p, pages).filter(|_| pages > 0) else {
                return false;
            };
            let Some(mask) = crate::env::page_reads::resident_mask(span, PAGE_SIZE) else {
                return false;
            };
            let found = (0..pages).fold(0u64, |w, b| {
                w | ((((mask >> b) & 1) * RESIDENT) << (BITS_PER_PAGE * b))
            });
            let gone = known & !found;
            if gone == 0 {
                return false;
            }
            w.fetch_and(!(gone | gone << 1), Ordering::Relaxed);
            self.set_evicting(true);
            self.pass_evicted.store(true, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// Whether pages known resident were found evicted in the current or the last whole refresh
    /// pass (then [`Mapping::page_if_resident`] asks the kernel before touching a page).
    #[cfg(test)]
    pub fn evicting(&self) -> bool {
        self.evicting.load(Ordering::Relaxed)
    }

    /// Page `p` and the run it starts, checked (checksum verified the first time it is read).
    pub fn page(&self, p: u64, force_verify: bool) -> Result<(&[u8], PageHeader)> {
        let bad = |what: &str| Err(Error::corruption(&*self.path, Some(p), None, what));
        let Some(map) = &self.map else {
            return bad("page beyond the end of the data file");
        };
        let Some(start) = (p as usize)
            .checked_mul(PAGE_SIZE)
            .filter(|s| s.checked_add(PAGE_SIZE).is_some())
        else {
            return bad("page number beyond any file");
        };
        let end = self.end.load(Ordering::Acquire);
        let Some(first) = map
            .get(start..start + PAGE_SIZE)
            .filter(|_| (start + PAGE_SIZE) as u64 <= end)
        else {
            return bad("page beyond the end of the data file");
        };
        let Some(h) = PageHeader::read(first) else {
            return bad("unknown page kind (unwritten or overwritten page)");
        };
        let run = (h.run_pages.max(1) as usize).saturating_mul(PAGE_SIZE);
        if start.saturating_add(run) as u64 > end {
            return bad("page beyond the end of the data file");
        }
        let Some(image) = map.get(start..start.saturating_add(run)) else {
            return bad("page run beyond the end of the data file");
        };
        // One load for both bits.
        let bits = self.page_bits(p);
        if bits & VERIFIED == 0 || force_verify {
            let h = check_image(image, p, &self.path)?;
            self.set_bits(p, VERIFIED | RESIDENT | READ);
            // The checksum read the whole run.
            self.mark_resident(p + 1, (image.len() / PAGE_SIZE) as u64 - 1);
            return Ok((image, h));
        }
        if bits & (RESIDENT | READ) != RESIDENT | READ {
            // The header was read: its page is in memory now.
            self.set_bits(p, RESIDENT | READ);
        }
        Ok((image, h))
    }
}

/// A word of [`Mapping`]'s bitmap with the [`RESIDENT`] bits of the pages `mincore` found in
/// memory (`resident[b]` for the word's page `b`), no other bit.
fn resident_bits(resident: &[bool]) -> u64 {
    resident.iter().enumerate().fold(0u64, |w, (b, r)| {
        w | (u64::from(*r) * RESIDENT) << (BITS_PER_PAGE * b as u64)
    })
}

/// Pages whose residency one [`Mapping::refresh_residency`] call asks the page cache about
/// (32,768: 256 MiB of map, one `mincore` of 65,536 bytes on 4 KiB pages).
pub(crate) const RESIDENCY_WINDOW: usize = 32_768;

/// Words of the residency bitmap ([`PAGES_PER_WORD`] pages each) one
/// [`Mapping::probe_residency`] looks at, at most, to find one with pages to check: 2,048
/// pages, 16 MiB of map, so that a reader pool
/// answering thousands of cold reads a second sweeps a 4 GiB map in a fraction of a second
/// while each probe asks the kernel about 16 pages at most.
const PROBE_SCAN: u64 = 128;

/// Pages of the map one [`Mapping::probe_residency`] looks over, at most.
#[cfg(test)]
pub(crate) const PROBE_SCAN_PAGES: u64 = PROBE_SCAN * PAGES_PER_WORD;

/// Everything a snapshot reads. Immutable once published.
#[derive(Debug, Clone)]
pub(crate) struct State {
    /// Last committed transaction in this state.
    pub txn_id: u64,
    /// B+tree root page (0 = empty tree).
    pub root: u64,
    /// Free-space map directory page (0 = no map yet).
    pub freedir: u64,
    /// Pages below this number are in use by the file (allocated, free or punched).
    pub next_page: u64,
    /// Keys in the tree (buffered entries not counted: see [`State::len`]).
    pub entries: u64,
    /// The last transaction that changed the tree's pages: `txn_id` itself, except in a
    /// buffered storage after logical commits (design.md section 16). A flush of this state
    /// records this txn in its header: the buffered commits after it are in the journal only.
    pub tree_txn: u64,
    /// Buffered entries, newer than the tree (empty for a storage without a write buffer).
    pub buffer: crate::buffer::Buffer,
    /// Bytes the buffer counts for ([`crate::buffer::entry_bytes`] of each entry).
    pub buffer_bytes: u64,
    /// Keys the buffer adds to the tree's `entries` (negative: removes), once counted: by the
    /// first [`State::len`] of this state (one tree lookup per buffered entry), or by the
    /// logical commit that published it, from its base's count (one lookup per key it
    /// changed) once [`State::len_wanted`] is set. So a buffered commit looks nothing up to
    /// count until someone asks the storage for its count.
    pub len_delta: std::sync::OnceLock<i64>,
    /// Set, for every state of the storage, by the first [`State::len`] that had to count:
    /// from then on logical commits keep the count as they commit (so a storage whose count
    /// is read often, its stats by a monitor, does not pay one lookup per buffered entry at
    /// each read).
    pub len_wanted: Arc<std::sync::atomic::AtomicBool>,
    /// Since when the buffer pins the journal (`None`: the buffer is empty): when its oldest
    /// entry was committed, or the last apply step, whose record holds every entry it left.
    pub buffer_since: Option<Instant>,
    /// Where the apply steps stand, when the last page commit was a step that left entries
    /// buffered (`None`: the tree holds every entry buffered before its last page commit).
    pub sweep: Option<crate::buffer::Sweep>,
    /// Last transaction whose pages are in the data file and recorded by a durable header.
    pub flushed_txn: u64,
    /// Unflushed page images.
    pub scratch: Scratch,
    /// Bytes of images in `scratch`.
    pub scratch_bytes: u64,
    /// When the oldest unflushed commit in `scratch` was published.
    pub dirty_since: Option<Instant>,
    /// Read-only map of the data file.
    pub mapping: Arc<Mapping>,
}

impl State {
    /// Resolves page `p`: the scratch table first, then the map.
    pub fn page(&self, p: u64) -> Result<(&[u8], PageHeader)> {
        if let Some(sp) = self.scratch.get(&p) {
            let h = PageHeader::read(&sp.image)
                .ok_or_else(|| Error::corruption(self.path(), Some(p), None, "bad scratch page"))?;
            return Ok((&sp.image, h));
        }
        self.mapping.page(p, false)
    }

    /// [`State::page`], when reading it cannot fault: a page of the scratch table, or one of
    /// the map known to be in the page cache ([`Mapping::page_if_resident`]); `None` otherwise.
    pub fn page_if_resident(&self, p: u64) -> Option<Result<(&[u8], PageHeader)>> {
        if let Some(sp) = self.scratch.get(&p) {
            return Some(
                PageHeader::read(&sp.image)
                    .map(|h| (&sp.image[..], h))
                    .ok_or_else(|| {
                        Error::corruption(self.path(), Some(p), None, "bad scratch page")
                    }),
            );
        }
        self.mapping.page_if_resident(p)
    }

    /// Like [`State::page`] but always verifies the checksum (used by `check`).
    pub fn page_verified(&self, p: u64) -> Result<(&[u8], PageHeader)> {
        if let Some(sp) = self.scratch.get(&p) {
            let h = check_image(&sp.image, p, self.path())?;
            return Ok((&sp.image, h));
        }
        self.mapping.page(p, true)
    }

    pub fn path(&self) -> &Path {
        &self.mapping.path
    }

    /// How long until the buffer's oldest entry is `max_age` old (zero once it is; `None` with
    /// an empty buffer).
    pub fn buffer_due_in(&self, max_age: std::time::Duration) -> Option<std::time::Duration> {
        self.buffer_since
            .map(|t| max_age.saturating_sub(t.elapsed()))
    }

    /// True when the buffer's oldest entry is `max_age` old or older.
    pub fn buffer_aged(&self, max_age: std::time::Duration) -> bool {
        self.buffer_due_in(max_age).is_some_and(|d| d.is_zero())
    }

    /// Keys visible in this state: the tree's, and the buffered entries' net count, counted at
    /// the first call ([`State::count_buffer_delta`]) and kept. If a tree lookup fails (a
    /// damaged page) the buffered entries are left out of the count, uncached.
    pub fn len(&self) -> u64 {
        let delta = match self.len_delta.get() {
            Some(d) => *d,
            None => {
                self.len_wanted
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                match self.count_buffer_delta() {
                    Ok(d) => *self.len_delta.get_or_init(|| d),
                    Err(_) => 0,
                }
            }
        };
        (self.entries as i64).saturating_add(delta).max(0) as u64
    }

    /// The buffered entries' net count over the tree, by looking each one up in the tree:
    /// +1 for a put of a key the tree lacks, -1 for a delete of a key it has.
    ///
    /// Errors: [`Error::Corruption`] from a tree lookup.
    pub fn count_buffer_delta(&self) -> Result<i64> {
        let entries = self.buffer.iter().map(|(k, v)| (k, v.is_some()));
        self.net_count(entries, false)
    }

    /// The keys `ops` add to this state's count (negative: remove): +1 for each `(key, true)`
    /// (a put) of a key absent before, -1 for each `(key, false)` (a delete) of a key present
    /// before, "before" being the tree, or with `buffer` the buffer over the tree. One lookup
    /// per key.
    ///
    /// Errors: [`Error::Corruption`] from a tree lookup.
    pub fn net_count<'a>(
        &self,
        ops: impl Iterator<Item = (&'a [u8], bool)>,
        buffer: bool,
    ) -> Result<i64> {
        let mut n = 0i64;
        for (k, put) in ops {
            let before = match buffer.then(|| self.buffer.get(k)).flatten() {
                Some(v) => v.is_some(),
                None => crate::btree::get(self, k)?.is_some(),
            };
            n += put as i64 - before as i64;
        }
        Ok(n)
    }
}

/// Published states that may still have readers: their ids tell the writer which freed pages
/// can be reused and the flush how far it may go.
#[derive(Default)]
pub(crate) struct SnapshotRegistry {
    states: std::sync::Mutex<Vec<Weak<State>>>,
}

impl SnapshotRegistry {
    /// Records a newly published state.
    pub fn register(&self, s: &Arc<State>) {
        let mut v = self.states.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|w| w.strong_count() > 0);
        v.push(Arc::downgrade(s));
    }

    /// The oldest state some reader (or the current-state pointer) still holds.
    pub fn oldest_live(&self) -> Option<Arc<State>> {
        let mut v = self.states.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|w| w.strong_count() > 0);
        v.iter()
            .filter_map(|w| w.upgrade())
            .min_by_key(|s| s.txn_id)
    }
}
