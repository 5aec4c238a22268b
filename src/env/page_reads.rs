//! MultiGet's reads of data-file pages that are not in memory ([`crate::btree::multi_get`],
//! design.md section 15).
//!
//! A snapshot reads the data file through its read-only map, so a page that is not in the page
//! cache costs a page fault that waits for the disk alone (queue depth 1). MultiGet walks the
//! tree one level at a time for all its keys; for the pages of one level it asks which are
//! resident ([`is_resident`]: `mincore` on the map) and reads all the others at once
//! ([`read_pages`]): one io_uring submission of `IORING_OP_READ`s on a small ring owned by the
//! calling thread, waited for on that thread. The images read are checked (checksum, kind,
//! number) by the caller, and the map then finds the pages in the page cache.
//!
//! # Why these choices (measured, docs/BENCHMARKS.md "MultiGet")
//! - **Residency by `mincore`, not `preadv2(RWF_NOWAIT)`:** on this machine (KVM, kernel 6.18)
//!   `mincore` of one 8 KiB page costs about 0.49 µs, `preadv2(RWF_NOWAIT)` of it about 0.93 µs
//!   (it copies the page), a touch of a mapped page 0.1 µs. A resident page is then read
//!   through the map, as a `get` reads it. `mincore` reports the page cache of a file mapping
//!   only to a caller that owns the file or may write it (Linux 5.2); for anyone else it
//!   reports every page resident, and MultiGet reads as `get` does (never wrong, only slower).
//! - **A ring per calling thread, not a lane or the storage environment:** a hand-off to a lane
//!   thread costs two thread wake-ups each way (about 90 µs on this 2-core VM,
//!   `Lane::call_inline`); reads need no ordering with writes and no I/O priority, and the
//!   thread that waits for the reads is the one that needs them, so it submits and waits
//!   itself. The reads bypass [`crate::env::StorageEnv`] as the map does (they read the same
//!   real file through its `raw_fd`); the map and these reads are the only reads that do.
//! - **Only while pages miss ([`ReadHints`]):** when the checks of a file keep finding every
//!   page resident (a warm cache), asking costs more than the reads it saves; after
//!   [`WARM_STREAK`] resident pages in a row MultiGet checks only [`SAMPLE_PAGES`] pages of one
//!   level in [`SAMPLE_EVERY`], until a check finds a miss again. The first levels after a
//!   warm cache went cold are then read as `get` reads them (page faults), at most
//!   [`SAMPLE_EVERY`] levels.
//!
//! # Every result handled ([`on_result`])
//! A read completes in full, or: short (`0 < res < len`: the rest is read at `offset + res`);
//! `0` (the file ends before the page: [`crate::Error::Corruption`] "page beyond the end of the
//! data file", never a short page); `-EAGAIN`, `-EINTR`, `-ECANCELED` (resubmitted, at most
//! [`MAX_RETRIES`] times, then the error); `-EOPNOTSUPP` or `-EINVAL` (the file system cannot
//! read this file through io_uring: `pread` from then on for this file, said once by a
//! `tracing` warning); any other error, e.g. `-EIO` ([`crate::Error::Io`] `"io_uring read"`
//! with the path). Where no ring can be set up, or `OMNIBUS_IO_URING=0`, misses are read with
//! `pread` on the calling thread, one after the other.

use std::cell::RefCell;
use std::io;
use std::os::fd::{BorrowedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use io_uring::{opcode, types, IoUring};

use crate::error::{Error, Result};
use crate::page::PAGE_SIZE;

/// Resident pages in a row after which MultiGet stops checking every level of a file.
pub const WARM_STREAK: u32 = 256;
/// While a file's pages keep being resident, one level in this many is still sampled.
pub const SAMPLE_EVERY: u32 = 32;
/// Pages of a sampled level checked (a miss among them makes every level checked again).
pub const SAMPLE_PAGES: usize = 4;
/// Entries of a thread's read ring: the most reads in flight at once.
pub const READ_RING_ENTRIES: u32 = 64;
/// Resubmissions of one read after `-EAGAIN`, `-EINTR` or `-ECANCELED` before it fails.
pub const MAX_RETRIES: u32 = 8;

/// What MultiGet learned about one data file (one per map, [`crate::state::Mapping`]):
/// relaxed atomics, a hint shared by every snapshot reading the map.
#[derive(Debug, Default)]
pub struct ReadHints {
    /// Pages the last checks found resident in a row (saturating).
    resident_streak: AtomicU32,
    /// Levels passed over unchecked while the streak lasts.
    unchecked: AtomicU32,
    /// The ring refused to read this file (`EOPNOTSUPP`/`EINVAL`): misses are read with `pread`.
    ring_off: AtomicBool,
}

impl ReadHints {
    /// How many pages of the next level to check for residency (`usize::MAX`: all): all,
    /// but while the last [`WARM_STREAK`] pages checked were resident, [`SAMPLE_PAGES`] of one
    /// level in [`SAMPLE_EVERY`] and none of the others.
    pub fn pages_to_check(&self) -> usize {
        if self.resident_streak.load(Ordering::Relaxed) < WARM_STREAK {
            return usize::MAX;
        }
        if self.unchecked.fetch_add(1, Ordering::Relaxed) % SAMPLE_EVERY == SAMPLE_EVERY - 1 {
            SAMPLE_PAGES
        } else {
            0
        }
    }

    /// Records a check: `resident` pages were in memory, and `missed` says whether any was not.
    pub fn record(&self, resident: u32, missed: bool) {
        if missed {
            self.resident_streak.store(0, Ordering::Relaxed);
        } else {
            let s = self.resident_streak.load(Ordering::Relaxed);
            self.resident_streak
                .store(s.saturating_add(resident), Ordering::Relaxed);
        }
    }

    /// True when reads of this file go through `pread` (the ring refused it).
    pub fn ring_off(&self) -> bool {
        self.ring_off.load(Ordering::Relaxed)
    }
}

/// The OS page size (`sysconf(_SC_PAGESIZE)`), the unit of `mincore`.
fn os_page() -> usize {
    static SIZE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *SIZE.get_or_init(|| {
        // SAFETY: sysconf reads a constant of the system and touches no memory of ours.
        let s = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(s).ok().filter(|s| *s > 0).unwrap_or(4096)
    })
}

/// `mincore` of `span` into `out`, one byte per OS page of it: false when `span` is not OS-page
/// aligned, `out` is too short, or the call failed. The one call of `mincore` for aligned
/// spans ([`resident_mask`], [`resident_units`], [`all_resident`]); the bytes of `span` are not
/// touched.
fn mincore(span: &[u8], out: &mut [u8]) -> bool {
    let ps = os_page();
    if !(span.as_ptr() as usize).is_multiple_of(ps) || out.len() < span.len().div_ceil(ps) {
        return false;
    }
    // SAFETY: `span` is OS-page aligned and part of a live mapping (a `&[u8]` of the caller's
    // map, which outlives this call); `out` has a byte for each OS page of it, as mincore
    // writes; mincore reads nothing through the address.
    let r = unsafe {
        libc::mincore(
            span.as_ptr() as *mut libc::c_void,
            span.len(),
            out.as_mut_ptr(),
        )
    };
    r == 0
}

/// The OS pages of `span` and the OS pages per `unit`-byte piece, when `span` is non-empty and
/// OS-page aligned and `unit` a non-zero multiple of the OS page.
fn pieces(span: &[u8], unit: usize) -> Option<(usize, usize)> {
    let ps = os_page();
    if span.is_empty()
        || unit == 0
        || !unit.is_multiple_of(ps)
        || !(span.as_ptr() as usize).is_multiple_of(ps)
    {
        return None;
    }
    Some((span.len().div_ceil(ps), unit / ps))
}

/// True when every OS page of `span` (bytes of the read-only map of a data file) is in the
/// page cache (`mincore`). The bytes are not touched. A failed `mincore` answers false (the
/// span is then read, which is never wrong).
pub fn is_resident(span: &[u8]) -> bool {
    if span.is_empty() {
        return true;
    }
    let ps = os_page();
    let addr = span.as_ptr() as usize;
    let start = addr - addr % ps;
    let len = addr + span.len() - start;
    let n = len.div_ceil(ps);
    let mut small = [0u8; 8];
    let mut big = Vec::new();
    let vec: &mut [u8] = if n <= small.len() {
        &mut small[..n]
    } else {
        big.resize(n, 0);
        &mut big
    };
    // SAFETY: `start..start + len` lies within the pages of `span`, which is part of a live
    // mapping (the caller's map outlives this call); `vec` has one byte per OS page of that
    // range, as mincore writes; mincore reads nothing through the address.
    let r = unsafe { libc::mincore(start as *mut libc::c_void, len, vec.as_mut_ptr()) };
    r == 0 && vec.iter().all(|b| b & 1 == 1)
}

/// [`resident_units`] for a short span, with no allocation (a reader pool's probe after each
/// read): bit `i` set when the span's `unit`-byte piece `i` is wholly in the page cache. `None`
/// when the span is longer than 64 pieces or 512 OS pages, misaligned, or `mincore` failed.
pub fn resident_mask(span: &[u8], unit: usize) -> Option<u64> {
    let (n, per) = pieces(span, unit)?;
    let mut vec = [0u8; 512];
    if n > vec.len() || n.div_ceil(per) > 64 || !mincore(span, &mut vec) {
        return None;
    }
    Some(vec[..n].chunks(per).enumerate().fold(0, |m, (i, c)| {
        m | (u64::from(c.iter().all(|b| b & 1 == 1)) << i)
    }))
}

/// OS pages one `mincore` call of [`resident_units`] asks about, at most (16 MiB on 4 KiB
/// pages, the kernel's own step inside one call), with a `sched_yield` between two calls: a
/// kernel built without preemption (`PREEMPT_NONE`, the benchmarks' machine's) gives the CPU
/// to a waiting thread only when the caller returns to user space, and the fair scheduler lets
/// even a nice 19 thread finish its slice before a woken one runs; a call over pages this
/// process has not mapped looks each up in the page cache (about 0.3 ms per 4,096 of them
/// there): one call over a 256 MiB refresh window kept a CPU for 3 to 8 ms.
const MINCORE_STEP: usize = 4096;

/// Which `unit`-byte pieces of `span` (a whole read-only map, page aligned; `unit` a multiple of
/// the OS page) are wholly in the page cache: one `mincore` per [`MINCORE_STEP`] OS pages of
/// the span (a yield of the CPU between two), then one bool per piece. `None` when a `mincore` failed (the caller then keeps
/// what it knew).
pub fn resident_units(span: &[u8], unit: usize) -> Option<Vec<bool>> {
    let (n, per) = pieces(span, unit)?;
    let mut vec = vec![0u8; n];
    let step = MINCORE_STEP * os_page();
    for (i, (part, out)) in span
        .chunks(step)
        .zip(vec.chunks_mut(MINCORE_STEP))
        .enumerate()
    {
        if i > 0 {
            // A thread waiting for this CPU goes first.
            std::thread::yield_now();
        }
        if !mincore(part, out) {
            return None;
        }
    }
    Some(
        vec.chunks(per)
            .map(|c| c.iter().all(|b| b & 1 == 1))
            .collect(),
    )
}

/// Whether every OS page of `span` is in the page cache now (`mincore(2)`, in calls of at most
/// 64 OS pages into a buffer on the stack: no allocation). `None` when the span is empty or not
/// page aligned, or `mincore` fails.
pub fn all_resident(span: &[u8]) -> Option<bool> {
    pieces(span, os_page())?;
    let mut vec = [0u8; 64];
    for chunk in span.chunks(64 * os_page()) {
        if !mincore(chunk, &mut vec) {
            return None;
        }
        if vec[..chunk.len().div_ceil(os_page())]
            .iter()
            .any(|b| b & 1 == 0)
        {
            return Some(false);
        }
    }
    Some(true)
}

/// One page, or overflow run, to read from a data file: `pages` pages from `page`.
#[derive(Debug)]
pub struct PageRead {
    /// The first page.
    pub page: u64,
    /// The image read, `pages * 8 KiB` bytes once [`read_pages`] returned `Ok`.
    pub buf: Vec<u8>,
    done: usize,
    retries: u32,
}

impl PageRead {
    /// A read of `pages` pages from `page` into a new zeroed buffer.
    pub fn new(page: u64, pages: usize) -> PageRead {
        PageRead {
            page,
            buf: vec![0u8; pages * PAGE_SIZE],
            done: 0,
            retries: 0,
        }
    }

    fn offset(&self) -> u64 {
        self.page * PAGE_SIZE as u64 + self.done as u64
    }
}

/// What to do after one read completed with `res` (a CQE's result or a `pread`'s return).
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// The whole read is done.
    Done,
    /// Read the rest (a short read), or the same again (`EAGAIN`, `EINTR`, `ECANCELED`).
    Again,
    /// The file ends before the page does.
    Eof,
    /// The ring cannot read this file (`EOPNOTSUPP`, `EINVAL`): use `pread`.
    Unsupported,
    /// The read failed with this OS error (retries exhausted included).
    Failed(i32),
}

/// Applies one result `res` to `r`: bytes read advance it; negative values are `-errno`.
pub fn on_result(r: &mut PageRead, res: i32) -> Next {
    if res > 0 {
        r.done = (r.done + res as usize).min(r.buf.len());
        return if r.done == r.buf.len() {
            Next::Done
        } else {
            Next::Again
        };
    }
    if res == 0 {
        return if r.done == r.buf.len() {
            Next::Done
        } else {
            Next::Eof
        };
    }
    match -res {
        libc::EAGAIN | libc::EINTR | libc::ECANCELED => {
            r.retries += 1;
            if r.retries > MAX_RETRIES {
                Next::Failed(-res)
            } else {
                Next::Again
            }
        }
        libc::EOPNOTSUPP | libc::EINVAL => Next::Unsupported,
        e => Next::Failed(e),
    }
}

fn eof_error(path: &Path, page: u64) -> Error {
    Error::corruption(
        path,
        Some(page),
        None,
        "page beyond the end of the data file",
    )
}

/// The calling thread's read ring.
enum Ring {
    Untried,
    Ready(Box<IoUring>),
    Unavailable,
}

thread_local! {
    static RING: RefCell<Ring> = const { RefCell::new(Ring::Untried) };
}

#[cfg(test)]
thread_local! {
    /// Results that replace the next CQEs' (tests of every case of [`on_result`] through the
    /// real ring).
    pub(crate) static FAKE_RESULTS: RefCell<std::collections::VecDeque<i32>> =
        const { RefCell::new(std::collections::VecDeque::new()) };
}

#[cfg(test)]
thread_local! {
    /// Pages (or runs) [`read_pages`] was asked to read on this thread, and its calls.
    pub(crate) static READS: std::cell::Cell<(usize, usize)> = const { std::cell::Cell::new((0, 0)) };
}

/// Makes this thread's reads go through `pread`, as when no ring can be set up (tests).
#[cfg(test)]
pub(crate) fn no_ring_on_this_thread() {
    RING.with(|r| *r.borrow_mut() = Ring::Unavailable);
}

fn ring_disabled_by_env() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(super::io_uring_disabled_by_env)
}

/// Reads every entry of `reads` in full from `fd` (the data file at `path`): through the
/// calling thread's ring, all at once, else with `pread` one after the other.
///
/// Errors: [`crate::Error::Io`] (`"io_uring read"` or `"pread"`, with `path`) for a failed
/// read; [`crate::Error::Corruption`] naming the page when the file ends before it.
pub fn read_pages(fd: RawFd, path: &Path, hints: &ReadHints, reads: &mut [PageRead]) -> Result<()> {
    #[cfg(test)]
    READS.with(|c| c.set((c.get().0 + reads.len(), c.get().1 + 1)));
    if !hints.ring_off() && !ring_disabled_by_env() {
        let rest = RING.with(|slot| -> Result<Option<Vec<usize>>> {
            let mut slot = slot.borrow_mut();
            if let Ring::Untried = *slot {
                *slot = match IoUring::new(READ_RING_ENTRIES) {
                    Ok(r) => Ring::Ready(Box::new(r)),
                    Err(e) => {
                        static WARNED: AtomicBool = AtomicBool::new(false);
                        if !WARNED.swap(true, Ordering::Relaxed) {
                            tracing::warn!(error = %e, "io_uring unavailable for MultiGet's reads; reading misses with pread");
                        }
                        Ring::Unavailable
                    }
                };
            }
            let Ring::Ready(ring) = &mut *slot else {
                return Ok(None);
            };
            match ring_read(ring, fd, path, reads) {
                Ok(r) => r.map(Some),
                Err(RingBroken(e)) => {
                    // Reads may still be in flight into `reads`' buffers: they are leaked, as
                    // is the ring, so the kernel never writes into freed memory.
                    for r in reads.iter_mut() {
                        std::mem::forget(std::mem::take(&mut r.buf));
                    }
                    if let Ring::Ready(ring) = std::mem::replace(&mut *slot, Ring::Unavailable) {
                        std::mem::forget(ring);
                    }
                    Err(Error::Io {
                        op: "io_uring_enter",
                        path: path.to_path_buf(),
                        source: e,
                    })
                }
            }
        })?;
        match rest {
            Some(rest) if rest.is_empty() => return Ok(()),
            Some(rest) => {
                if !hints.ring_off.swap(true, Ordering::Relaxed) {
                    tracing::warn!(path = %path.display(), "io_uring cannot read this data file (EOPNOTSUPP or EINVAL); MultiGet reads it with pread");
                }
                for i in rest {
                    if let Some(r) = reads.get_mut(i) {
                        pread_all(fd, path, r)?;
                    }
                }
                return Ok(());
            }
            None => {}
        }
    }
    for r in reads.iter_mut() {
        pread_all(fd, path, r)?;
    }
    Ok(())
}

/// `io_uring_enter` failed with reads in flight: their buffers must never be freed.
struct RingBroken(io::Error);

/// Drives `reads` through `ring` until each is done or failed. Returns the indices of the
/// reads the ring refused (`Unsupported`, to be read with `pread`); the first failure as the
/// error, after every read in flight completed.
fn ring_read(
    ring: &mut IoUring,
    fd: RawFd,
    path: &Path,
    reads: &mut [PageRead],
) -> std::result::Result<Result<Vec<usize>>, RingBroken> {
    let mut queue: std::collections::VecDeque<usize> = (0..reads.len()).collect();
    let mut unsupported = Vec::new();
    let mut first_error: Option<Error> = None;
    let mut in_flight = 0usize;
    let mut interrupted = 0u32;
    // Bounded: every turn waits for a completion, and each completion finishes a read,
    // advances it by at least one byte, or uses one of its MAX_RETRIES; an interrupted
    // `io_uring_enter` is retried at most 1,000 times in a row.
    loop {
        while first_error.is_none() && in_flight < READ_RING_ENTRIES as usize {
            let Some(i) = queue.pop_front() else { break };
            let r = &mut reads[i];
            let left = r.buf.len() - r.done;
            // SAFETY: `done < buf.len()` (a read is queued only while incomplete), so the
            // pointer is inside the buffer.
            let ptr = unsafe { r.buf.as_mut_ptr().add(r.done) };
            let sqe = opcode::Read::new(types::Fd(fd), ptr, left.min(u32::MAX as usize) as u32)
                .offset(r.offset())
                .build()
                .user_data(i as u64);
            // SAFETY: the buffer `ptr..ptr + left` belongs to `reads[i]`, which outlives this
            // function; it is neither read nor freed until its completion is reaped below (and
            // leaked by the caller when the ring breaks with reads in flight).
            if unsafe { ring.submission().push(&sqe) }.is_err() {
                queue.push_front(i);
                break;
            }
            in_flight += 1;
        }
        if in_flight == 0 {
            break;
        }
        match ring.submit_and_wait(1) {
            Ok(_) => interrupted = 0,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
                ) && interrupted < 1000 =>
            {
                interrupted += 1;
            }
            Err(e) => return Err(RingBroken(e)),
        }
        let done: Vec<(usize, i32)> = ring
            .completion()
            .map(|c| (c.user_data() as usize, c.result()))
            .collect();
        for (i, res) in done {
            in_flight -= 1;
            #[cfg(test)]
            let res = FAKE_RESULTS
                .with(|f| f.borrow_mut().pop_front())
                .unwrap_or(res);
            let Some(r) = reads.get_mut(i) else { continue };
            match on_result(r, res) {
                Next::Done => {}
                Next::Again => queue.push_back(i),
                Next::Eof => {
                    first_error.get_or_insert_with(|| eof_error(path, r.page));
                }
                Next::Unsupported => unsupported.push(i),
                Next::Failed(e) => {
                    first_error.get_or_insert_with(|| Error::Io {
                        op: "io_uring read",
                        path: path.to_path_buf(),
                        source: io::Error::from_raw_os_error(e),
                    });
                }
            }
        }
    }
    Ok(match first_error {
        Some(e) => Err(e),
        None => Ok(unsupported),
    })
}

/// Reads all of `r` with `pread` on `fd`.
///
/// Errors: as [`read_pages`], with `"pread"`.
fn pread_all(fd: RawFd, path: &Path, r: &mut PageRead) -> Result<()> {
    // SAFETY: `fd` is the data file's descriptor, open while the map (and so the caller's
    // snapshot) holds the file.
    let bfd = unsafe { BorrowedFd::borrow_raw(fd) };
    // Bounded: each turn finishes, advances by at least one byte, or uses one of MAX_RETRIES.
    loop {
        let off = r.offset();
        let res = match rustix::io::pread(bfd, &mut r.buf[r.done..], off) {
            Ok(n) => n.min(i32::MAX as usize) as i32,
            Err(e) => -e.raw_os_error(),
        };
        match on_result(r, res) {
            Next::Done => return Ok(()),
            Next::Again => {}
            Next::Eof => return Err(eof_error(path, r.page)),
            Next::Unsupported | Next::Failed(_) => {
                return Err(Error::Io {
                    op: "pread",
                    path: path.to_path_buf(),
                    source: io::Error::from_raw_os_error(-res),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    fn page_bytes(p: u64) -> Vec<u8> {
        (0..PAGE_SIZE).map(|i| (p as usize * 7 + i) as u8).collect()
    }

    /// A file of `pages` pages, page `p` filled with `page_bytes(p)`.
    fn file(pages: u64) -> (tempfile::TempDir, std::fs::File, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data.pages");
        let mut all = Vec::new();
        for p in 0..pages {
            all.extend(page_bytes(p));
        }
        std::fs::write(&path, &all).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        (dir, f, path)
    }

    fn fake(results: &[i32]) {
        FAKE_RESULTS.with(|f| f.borrow_mut().extend(results.iter().copied()));
    }

    fn fakes_left() -> usize {
        FAKE_RESULTS.with(|f| f.borrow().len())
    }

    #[test]
    fn every_result_is_classified() {
        let mut r = PageRead::new(3, 1);
        assert_eq!(on_result(&mut r, 100), Next::Again, "short: read the rest");
        assert_eq!(r.offset(), 3 * PAGE_SIZE as u64 + 100);
        assert_eq!(on_result(&mut r, -libc::EAGAIN), Next::Again);
        assert_eq!(on_result(&mut r, -libc::EINTR), Next::Again);
        assert_eq!(on_result(&mut r, -libc::ECANCELED), Next::Again);
        assert_eq!(
            on_result(&mut r, 0),
            Next::Eof,
            "0 mid-page: never a short page"
        );
        assert_eq!(on_result(&mut r, -libc::EOPNOTSUPP), Next::Unsupported);
        assert_eq!(on_result(&mut r, -libc::EINVAL), Next::Unsupported);
        assert_eq!(on_result(&mut r, -libc::EIO), Next::Failed(libc::EIO));
        assert_eq!(on_result(&mut r, (PAGE_SIZE - 100) as i32), Next::Done);
        let mut r = PageRead::new(0, 1);
        for _ in 0..MAX_RETRIES {
            assert_eq!(on_result(&mut r, -libc::EAGAIN), Next::Again);
        }
        assert_eq!(
            on_result(&mut r, -libc::EAGAIN),
            Next::Failed(libc::EAGAIN),
            "retries are bounded"
        );
    }

    fn read(
        f: &std::fs::File,
        path: &Path,
        hints: &ReadHints,
        pages: &[u64],
    ) -> Result<Vec<PageRead>> {
        let mut reads: Vec<PageRead> = pages.iter().map(|&p| PageRead::new(p, 1)).collect();
        read_pages(f.as_raw_fd(), path, hints, &mut reads)?;
        Ok(reads)
    }

    #[test]
    fn ring_reads_every_page_and_the_rest_of_short_ones() {
        if ring_disabled_by_env() {
            return;
        }
        let (_d, f, path) = file(100);
        let hints = ReadHints::default();
        let pages: Vec<u64> = (0..100).rev().step_by(3).collect();
        // A short read, EAGAIN and ECANCELED: each is redone, every byte arrives.
        fake(&[100, -libc::EAGAIN, -libc::ECANCELED]);
        let reads = read(&f, &path, &hints, &pages).unwrap();
        assert_eq!(fakes_left(), 0);
        for r in &reads {
            assert_eq!(r.buf, page_bytes(r.page), "page {}", r.page);
        }
        assert!(!hints.ring_off());
    }

    #[test]
    fn ring_errors_are_typed_with_the_path() {
        if ring_disabled_by_env() {
            return;
        }
        let (_d, f, path) = file(10);
        let hints = ReadHints::default();
        fake(&[-libc::EIO]);
        match read(&f, &path, &hints, &[1, 2, 3]) {
            Err(Error::Io {
                op,
                path: p,
                source,
            }) => {
                assert_eq!(op, "io_uring read");
                assert_eq!(p, path);
                assert_eq!(source.raw_os_error(), Some(libc::EIO));
            }
            other => panic!("expected EIO, got {other:?}"),
        }
        // 0 bytes in the middle of a page: the file ends there, corruption naming the page.
        fake(&[0]);
        match read(&f, &path, &hints, &[4]) {
            Err(Error::Corruption(c)) => {
                assert_eq!(c.page, Some(4));
                assert!(c.what.contains("beyond the end"), "{}", c.what);
            }
            other => panic!("expected corruption, got {other:?}"),
        }
        // A real read past the end of the file (the kernel answers 0).
        match read(&f, &path, &hints, &[2, 10]) {
            Err(Error::Corruption(c)) => assert_eq!(c.page, Some(10)),
            other => panic!("expected corruption, got {other:?}"),
        }
        FAKE_RESULTS.with(|f| f.borrow_mut().clear());
    }

    #[test]
    fn unsupported_turns_the_ring_off_for_the_file() {
        if ring_disabled_by_env() {
            return;
        }
        let (_d, f, path) = file(10);
        let hints = ReadHints::default();
        fake(&[-libc::EOPNOTSUPP]);
        let reads = read(&f, &path, &hints, &[5, 6, 7]).unwrap();
        assert!(hints.ring_off(), "EOPNOTSUPP turns the ring off");
        for r in &reads {
            assert_eq!(r.buf, page_bytes(r.page));
        }
        // Later reads use pread: injected ring results are not consumed.
        fake(&[-libc::EIO]);
        let reads = read(&f, &path, &hints, &[8, 9]).unwrap();
        assert_eq!(fakes_left(), 1);
        assert_eq!(reads[1].buf, page_bytes(9));
        FAKE_RESULTS.with(|f| f.borrow_mut().clear());
        match read(&f, &path, &hints, &[10]) {
            Err(Error::Corruption(c)) => assert_eq!(c.page, Some(10)),
            other => panic!("pread past the end: expected corruption, got {other:?}"),
        }
    }

    #[test]
    fn residency_follows_the_page_cache() {
        let (_d, f, _path) = file(64);
        // SAFETY: a read-only private map of a file this test owns and does not change.
        let map = unsafe { memmap2::Mmap::map(&f) }.unwrap();
        // A fresh map of pages just dropped from the page cache: nothing resident (a file
        // system that keeps no page cache of its own, as tmpfs, keeps them: skip there).
        // SAFETY: posix_fadvise only advises the kernel about the descriptor's pages.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if is_resident(&map[..PAGE_SIZE]) {
            return;
        }
        let hints = ReadHints::default();
        let reads = read(&f, _path.as_path(), &hints, &[3]).unwrap();
        assert_eq!(reads[0].buf, page_bytes(3));
        assert!(
            is_resident(&map[3 * PAGE_SIZE..4 * PAGE_SIZE]),
            "read pages are cached"
        );
    }

    /// Residency asked in steps of `MINCORE_STEP` OS pages answers for each piece where it
    /// lies, past the first step too.
    #[test]
    fn residency_of_a_span_longer_than_one_step() {
        let pages = (MINCORE_STEP * os_page() / PAGE_SIZE) as u64 + 40;
        let (_d, f, path) = file(pages);
        // SAFETY: a read-only private map of a file this test owns and does not change.
        let map = unsafe { memmap2::Mmap::map(&f) }.unwrap();
        // SAFETY: posix_fadvise only advises the kernel about the descriptor's pages.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if is_resident(&map[..PAGE_SIZE]) {
            return; // a file system that keeps no page cache of its own (tmpfs)
        }
        // No read-ahead: the pages read, and no neighbour, come into the page cache.
        // SAFETY: as above.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
        let hot = [3, pages - 30, pages - 1];
        let reads = read(&f, path.as_path(), &ReadHints::default(), &hot).unwrap();
        assert_eq!(reads.len(), hot.len());
        let units = resident_units(&map, PAGE_SIZE).unwrap();
        assert_eq!(units.len() as u64, pages);
        let found: Vec<u64> = (0..pages).filter(|p| units[*p as usize]).collect();
        assert_eq!(found, hot, "the pages read, and only those");
        // The same answer without an allocation for a short span.
        assert_eq!(
            resident_mask(&map[..8 * PAGE_SIZE], PAGE_SIZE),
            Some(1 << 3)
        );
        assert_eq!(resident_mask(&map, PAGE_SIZE), None, "longer than 64 pages");
    }

    #[test]
    fn hints_stop_checking_a_warm_file_and_sample_it() {
        let h = ReadHints::default();
        assert_eq!(h.pages_to_check(), usize::MAX);
        h.record(WARM_STREAK, false);
        let checked: Vec<usize> = (0..SAMPLE_EVERY * 4)
            .map(|_| h.pages_to_check())
            .filter(|&n| n > 0)
            .collect();
        assert_eq!(
            checked,
            vec![SAMPLE_PAGES; 4],
            "one level in SAMPLE_EVERY is sampled"
        );
        h.record(1, true);
        assert_eq!(
            h.pages_to_check(),
            usize::MAX,
            "a miss checks every level again"
        );
    }
}
