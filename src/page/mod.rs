//! Pages: the 8 KiB unit of the data file and of journal page images.
//!
//! Every page starts with a 32-byte [`PageHeader`]; the first 4 bytes are a crc32 (crc32fast,
//! IEEE polynomial) of everything after them: bytes `4..8192` for a page, `4..run_pages*8192`
//! for an overflow run (one header for the whole run, so a large value is contiguous on disk and
//! can be returned without copying). Layouts of each kind are in `docs/design.md`.
//!
//! All decoding is bounds-checked and returns [`Error::Corruption`]: no file content panics.

use std::path::Path;

use crate::error::{Error, Result};

pub mod header;
pub mod node;

/// Bytes in a page.
pub const PAGE_SIZE: usize = 8192;
/// Bytes of the common page header.
pub const HEADER_LEN: usize = 32;
/// Bytes available after the header.
pub const BODY_LEN: usize = PAGE_SIZE - HEADER_LEN;

/// Most pages a data file may hold (2^32 pages: 32 TiB): every page number and page count
/// read from a header page or a journal record is checked against it, so damaged or forged
/// bytes that keep their checksum cannot make an open grow the file, or `check` size its
/// page bitmaps, past it (and `pages * 8192` never overflows).
pub const MAX_PAGES: u64 = 1 << 32;

/// True when a tree state read from disk is in range: `next_page` (the high-water page count)
/// in `2..=MAX_PAGES`, and `root` and `freedir` each 0 (none) or a page in `2..next_page`.
pub fn tree_state_in_range(root: u64, freedir: u64, next_page: u64) -> bool {
    let page_ok = |p: u64| p == 0 || (2..next_page).contains(&p);
    (2..=MAX_PAGES).contains(&next_page) && page_ok(root) && page_ok(freedir)
}

const _: () = assert!(PAGE_SIZE.is_power_of_two());
const _: () = assert!(BODY_LEN == 8160);

/// What a page holds (byte 4 of the header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum PageKind {
    /// Header page (page 0 or 1).
    Header = 1,
    /// B+tree branch (interior) page.
    Branch = 2,
    /// B+tree leaf page.
    Leaf = 3,
    /// First page of an overflow run holding one large value.
    Overflow = 4,
    /// Free-space map directory: the page numbers of the bitmap pages.
    FreeDir = 5,
    /// Free-space map bitmap: one bit per page, 1 = free.
    FreeBitmap = 6,
    /// First page of a value page run: values of 2 to 10 KiB of one leaf, packed.
    Values = 7,
}

impl PageKind {
    /// Decodes byte 4 of a page header.
    pub fn from_u8(b: u8) -> Option<PageKind> {
        Some(match b {
            1 => PageKind::Header,
            2 => PageKind::Branch,
            3 => PageKind::Leaf,
            4 => PageKind::Overflow,
            5 => PageKind::FreeDir,
            6 => PageKind::FreeBitmap,
            7 => PageKind::Values,
            _ => return None,
        })
    }
}

/// The common 32-byte page header.
///
/// ```text
/// 0      4     5       6       8              16        24          28     32
/// | crc32 | kind | flags | count | page number  | txn id  | run pages | aux  |
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageHeader {
    /// What the page holds.
    pub kind: PageKind,
    /// Entries in the page (leaf cells, branch keys, directory entries).
    pub count: u16,
    /// The page's own number (detects misdirected writes).
    pub page_number: u64,
    /// The transaction that wrote this image.
    pub txn_id: u64,
    /// Pages covered by this header and checksum (1, or the length of an overflow run).
    pub run_pages: u32,
    /// Kind-specific (unused = 0).
    pub aux: u32,
}

/// Little-endian field readers that never panic: `None` when out of bounds.
pub(crate) fn rd_u16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
pub(crate) fn rd_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
pub(crate) fn rd_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}
pub(crate) fn wr_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn wr_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
pub(crate) fn wr_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

impl PageHeader {
    /// Writes the header fields (not the checksum) into `page[4..32]`.
    pub fn write(&self, page: &mut [u8]) {
        page[4] = self.kind as u8;
        page[5] = 0;
        wr_u16(page, 6, self.count);
        wr_u64(page, 8, self.page_number);
        wr_u64(page, 16, self.txn_id);
        wr_u32(page, 24, self.run_pages);
        wr_u32(page, 28, self.aux);
    }

    /// Reads the header fields of `page` without checking the checksum.
    pub fn read(page: &[u8]) -> Option<PageHeader> {
        Some(PageHeader {
            kind: PageKind::from_u8(*page.get(4)?)?,
            count: rd_u16(page, 6)?,
            page_number: rd_u64(page, 8)?,
            txn_id: rd_u64(page, 16)?,
            run_pages: rd_u32(page, 24)?,
            aux: rd_u32(page, 28)?,
        })
    }
}

/// crc32 of `image[4..]`.
pub fn compute_checksum(image: &[u8]) -> u32 {
    crc32fast::hash(&image[4..])
}

/// Stores the checksum of `image` (a page or an overflow run) in its first 4 bytes.
pub fn seal(image: &mut [u8]) {
    let c = compute_checksum(image);
    wr_u32(image, 0, c);
    debug_assert!(verify_checksum(image));
}

/// CRC-32 (reflected, polynomial 0xEDB88320) of `x^(8k)` for `k` in `0..=PAGE_SIZE`: shifting
/// a checksum's linear part past `k` zero bytes is one multiplication by `X8[k]`.
fn x8_table() -> &'static [u32] {
    static T: std::sync::OnceLock<Box<[u32]>> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        let mut t = vec![0u32; PAGE_SIZE + 1];
        t[0] = 1 << 31; // x^0
        for k in 1..t.len() {
            t[k] = mul_mod_p(t[k - 1], 1 << 23); // times x^8
        }
        t.into_boxed_slice()
    })
}

/// Builds the table [`seal_from_base`] uses (32 KiB, once per process).
pub fn init_seal_tables() {
    x8_table();
}

/// The reflected CRC-32 polynomial (0x04C11DB7 bit-reversed, without its `x^32` term).
const POLY: u32 = 0xEDB8_8320;

/// The byte-at-a-time table of the reflected CRC-32: `BYTE_CRC[b]` is the register after byte
/// `b` from zero.
const BYTE_CRC: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut b = 0;
    while b < 256 {
        let mut v = b as u32;
        let mut k = 0;
        while k < 8 {
            v = times_x(v);
            k += 1;
        }
        t[b] = v;
        b += 1;
    }
    t
};

/// Ranges up to this many bytes have their CRC delta computed a byte at a time (most of a
/// commit's written ranges are a few bytes: a slot, a count, a child pointer); longer ones by
/// `crc32fast`, whose setup costs more than such a range.
const SHORT_RANGE: usize = 64;

/// `v * x mod P` in the reflected representation (bit 31 is the coefficient of `x^0`).
const fn times_x(v: u32) -> u32 {
    (v >> 1) ^ (POLY & (v & 1).wrapping_neg())
}

/// `j * x^4 mod P` for the 16 values `j` of the four lowest bits (the coefficients of `x^28`
/// to `x^31`): `p * x^4 mod P` is `(p >> 4) ^ TIMES_X4[p & 15]`.
const TIMES_X4: [u32; 16] = {
    let mut t = [0u32; 16];
    let mut j = 0;
    while j < 16 {
        t[j] = times_x(times_x(times_x(times_x(j as u32))));
        j += 1;
    }
    t
};

/// `a * b mod P` in the reflected CRC-32 representation (as zlib's `multmodp`), four bits of
/// `a` a step: the 16 multiples of `b` by a polynomial of degree below 4, then Horner's rule
/// over `a`'s eight nibbles from the highest degree (its lowest bits) down, one `x^4` step
/// (a shift and one lookup) between them. About a tenth of the bit-at-a-time loop's work.
fn mul_mod_p(a: u32, b: u32) -> u32 {
    // t[j]: j's bits 3, 2, 1, 0 are the coefficients of x^0, x^1, x^2, x^3.
    let b1 = times_x(b);
    let b2 = times_x(b1);
    let b3 = times_x(b2);
    let mut t = [0u32; 16];
    for (j, e) in t.iter_mut().enumerate() {
        let bit = |k: usize, v: u32| v & ((j as u32 >> k) & 1).wrapping_neg();
        *e = bit(3, b) ^ bit(2, b1) ^ bit(1, b2) ^ bit(0, b3);
    }
    // Nibble n (coefficients x^(4n) to x^(4n+3)) is bits 31-4n down to 28-4n.
    let mut p = t[(a & 15) as usize];
    for n in (0..7).rev() {
        p = (p >> 4) ^ TIMES_X4[(p & 15) as usize] ^ t[((a >> (28 - 4 * n)) & 15) as usize];
    }
    p
}

/// Seals `image`, a single page that differs from `base` (a single page whose stored checksum
/// is its true one: verified or sealed) only inside `ranges` (`(start, end)` byte ranges,
/// sorted and disjoint), from `base`'s checksum instead of hashing 8 KiB. A CRC is linear:
/// for equal lengths `crc(new) = crc(base) ^ L(base ^ new)` where `L` is the CRC without its
/// initial value and final inversion, and the XOR of the two pages is zero outside the ranges,
/// so each range contributes `L(its XOR)` shifted past the bytes after it. Returns false (and
/// seals nothing) when a length or a range is out of bounds: the caller seals in full.
pub fn seal_from_base(image: &mut [u8], base: &[u8], ranges: &[(usize, usize)]) -> bool {
    if image.len() != PAGE_SIZE || base.len() != PAGE_SIZE {
        return false;
    }
    let (Some(base_crc), x8) = (rd_u32(base, 0), x8_table()) else {
        return false;
    };
    let mut crc = base_crc;
    let mut buf = [0u8; 256];
    let mut last_end = 4;
    for &(a, b) in ranges {
        // The checksum covers bytes 4.. (its own field is not part of the message).
        let a = a.max(4);
        if b <= a {
            continue;
        }
        if b > PAGE_SIZE || a < last_end {
            return false;
        }
        last_end = b;
        // L(delta) of the range: a CRC register started at zero, not inverted at the end.
        if b - a <= SHORT_RANGE {
            let mut reg = 0u32;
            for (x, y) in image[a..b].iter().zip(&base[a..b]) {
                reg = BYTE_CRC[((reg ^ (x ^ y) as u32) & 0xff) as usize] ^ (reg >> 8);
            }
            crc ^= mul_mod_p(x8[PAGE_SIZE - b], reg);
            continue;
        }
        let mut h = crc32fast::Hasher::new_with_initial(u32::MAX);
        for (ci, cb) in image[a..b]
            .chunks(buf.len())
            .zip(base[a..b].chunks(buf.len()))
        {
            let n = ci.len();
            for ((o, x), y) in buf[..n].iter_mut().zip(ci).zip(cb) {
                *o = x ^ y;
            }
            h.update(&buf[..n]);
        }
        let linear = !h.finalize();
        crc ^= mul_mod_p(x8[PAGE_SIZE - b], linear);
    }
    wr_u32(image, 0, crc);
    debug_assert!(verify_checksum(image), "incremental checksum differs");
    true
}

/// True when the stored checksum matches the content.
pub fn verify_checksum(image: &[u8]) -> bool {
    image.len() >= HEADER_LEN && rd_u32(image, 0) == Some(compute_checksum(image))
}

/// Checks an image read from `file` that should be page `page_number`: checksum, kind known,
/// own number, and length (`run_pages * 8192`). Returns its header.
pub fn check_image(image: &[u8], page_number: u64, file: &Path) -> Result<PageHeader> {
    let bad = |what: &str| Err(Error::corruption(file, Some(page_number), None, what));
    if image.len() < PAGE_SIZE || !image.len().is_multiple_of(PAGE_SIZE) {
        return bad("page image has a bad length");
    }
    if !verify_checksum(image) {
        return bad("page checksum mismatch");
    }
    let Some(h) = PageHeader::read(image) else {
        return bad("unknown page kind");
    };
    if h.page_number != page_number {
        return bad(&format!("page claims to be page {}", h.page_number));
    }
    if h.run_pages as usize * PAGE_SIZE != image.len() {
        return bad("page run length does not match its header");
    }
    Ok(h)
}

/// A zeroed, page-aligned-length buffer of `pages` pages.
pub fn zeroed(pages: usize) -> Box<[u8]> {
    vec![0u8; pages * PAGE_SIZE].into_boxed_slice()
}

/// A zero-filled shared image of `pages` pages, written in place (`Arc::from` of a boxed page
/// would allocate twice and copy; an exact-length iterator collects into one allocation).
/// Counted in [`live_image_bytes`] while alive.
pub fn zeroed_shared(pages: usize) -> SharedImage {
    if pages == 1 {
        if let Some(mut spare) = spare_page() {
            if let Some(img) = spare.get_mut() {
                img.0.fill(0);
                return spare;
            }
        }
    }
    Image::track(std::iter::repeat_n(0u8, pages * PAGE_SIZE).collect())
}

/// A page image held in memory (one page, or an overflow run: a multiple of 8 KiB) whose bytes
/// are counted, process-wide, from its creation until the last [`SharedImage`] holding it is
/// dropped: [`live_image_bytes`]. Every image the engine keeps in memory is one: the dirty
/// pages of a write transaction, the page images of a commit on their way to the journal, and
/// the images of every scratch table, current or still held by a snapshot or a flush. So the
/// count is what the engine's page images really cost the heap (the scratch tables
/// alone miss superseded images still held and the transactions in progress).
///
/// The counter costs one relaxed atomic add (and one `fetch_max` for the peak) when an image
/// is created and one relaxed atomic subtract when it is freed: per page, never per key.
/// Dereferences to its bytes.
#[repr(transparent)]
pub struct Image([u8]);

/// A shared, counted page image: cloning is one reference-count increment, and the bytes are
/// uncounted with the last clone. A one-page image's buffer then becomes a spare of the
/// dropping thread (at most [`SPARE_PAGES`] a thread), which the next one-page image made on
/// that thread reuses (`Image::copy_from`, `Image::from_boxed`, [`zeroed_shared`]): a serial
/// commit makes and frees a few 8 KiB images, and each `malloc` of one after a `free` that
/// had given the heap's top back to the kernel faulted its pages in again.
pub struct SharedImage(std::mem::ManuallyDrop<std::sync::Arc<Image>>);

/// One-page buffers kept per thread for the next images (512 KiB at most a thread).
pub const SPARE_PAGES: usize = 64;

/// The spare one-page buffers of a thread: uncounted in [`live_image_bytes`] while here, and
/// counted again when freed (their `Image`'s drop uncounts them).
struct Spares(Vec<std::sync::Arc<Image>>);

impl Drop for Spares {
    fn drop(&mut self) {
        let n = (self.0.len() * PAGE_SIZE) as u64;
        LIVE_IMAGE_BYTES.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }
}

thread_local! {
    static SPARES: std::cell::RefCell<Spares> = const { std::cell::RefCell::new(Spares(Vec::new())) };
}

/// A spare one-page buffer of this thread, if it has one, counted again as an image (so that
/// however it is dropped, the count stays right).
fn spare_page() -> Option<SharedImage> {
    SPARES
        .try_with(|s| s.try_borrow_mut().ok().and_then(|mut s| s.0.pop()))
        .ok()
        .flatten()
        .map(Image::recount)
}

impl SharedImage {
    /// The image's bytes to edit, when no other clone shares them (as `Arc::get_mut`).
    pub fn get_mut(&mut self) -> Option<&mut Image> {
        std::sync::Arc::get_mut(&mut self.0)
    }
}

impl Clone for SharedImage {
    fn clone(&self) -> SharedImage {
        SharedImage(std::mem::ManuallyDrop::new(std::sync::Arc::clone(&self.0)))
    }
}

impl std::ops::Deref for SharedImage {
    type Target = Image;
    fn deref(&self) -> &Image {
        &self.0
    }
}

impl AsRef<[u8]> for SharedImage {
    fn as_ref(&self) -> &[u8] {
        &self.0 .0
    }
}

impl std::fmt::Debug for SharedImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self.0).fmt(f)
    }
}

impl Drop for SharedImage {
    fn drop(&mut self) {
        // SAFETY: the field is taken once, here, and `self` is not used after.
        let mut arc = unsafe { std::mem::ManuallyDrop::take(&mut self.0) };
        // No `Weak` of an image is ever made: a strong count of 1 is the last clone (checked
        // again by `get_mut`, which also fails when another thread holds a clone).
        if arc.0.len() != PAGE_SIZE
            || std::sync::Arc::strong_count(&arc) != 1
            || std::sync::Arc::get_mut(&mut arc).is_none()
        {
            return;
        }
        // Not kept (the thread's spares full, or gone at its exit): `arc` is freed with the
        // closure.
        let _ = SPARES.try_with(move |s| {
            if let Ok(mut s) = s.try_borrow_mut() {
                if s.0.len() < SPARE_PAGES {
                    LIVE_IMAGE_BYTES
                        .fetch_sub(PAGE_SIZE as u64, std::sync::atomic::Ordering::Relaxed);
                    s.0.push(arc);
                }
            }
        });
    }
}

/// Bytes of [`Image`]s alive in this process.
static LIVE_IMAGE_BYTES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// Highest value [`LIVE_IMAGE_BYTES`] reached since the process started or
/// [`reset_peak_image_bytes`].
static PEAK_IMAGE_BYTES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Bytes of page images (`page::Image`) alive in this process now: dirty pages of write
/// transactions in progress, commits in flight, and scratch tables (current ones and older ones
/// a snapshot or a flush still holds), of every storage of every engine in the process. One
/// relaxed atomic load.
pub fn live_image_bytes() -> u64 {
    LIVE_IMAGE_BYTES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Highest [`live_image_bytes`] seen since the process started or the last
/// [`reset_peak_image_bytes`].
pub fn peak_image_bytes() -> u64 {
    PEAK_IMAGE_BYTES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Starts a new peak for [`peak_image_bytes`] at the current live count (e.g. after a
/// benchmark's warm-up).
pub fn reset_peak_image_bytes() {
    PEAK_IMAGE_BYTES.store(live_image_bytes(), std::sync::atomic::Ordering::Relaxed);
}

impl Image {
    /// A counted copy of `bytes` (one allocation, as `Arc::<[u8]>::from`).
    pub fn copy_from(bytes: &[u8]) -> SharedImage {
        if let Some(img) = Image::spare_copy(bytes) {
            return img;
        }
        Image::track(std::sync::Arc::from(bytes))
    }

    /// A counted image of `bytes` (moved into a shared allocation, as `Arc::<[u8]>::from`).
    pub fn from_boxed(bytes: Box<[u8]>) -> SharedImage {
        if let Some(img) = Image::spare_copy(&bytes) {
            return img;
        }
        Image::track(std::sync::Arc::from(bytes))
    }

    /// A copy of one page `bytes` in a spare buffer of this thread, when it has one.
    fn spare_copy(bytes: &[u8]) -> Option<SharedImage> {
        if bytes.len() != PAGE_SIZE {
            return None;
        }
        let mut spare = spare_page()?;
        spare.get_mut()?.0.copy_from_slice(bytes);
        Some(spare)
    }

    /// Counts a spare buffer again, as an image.
    fn recount(spare: std::sync::Arc<Image>) -> SharedImage {
        use std::sync::atomic::Ordering::Relaxed;
        let n = spare.0.len() as u64;
        let now = LIVE_IMAGE_BYTES.fetch_add(n, Relaxed) + n;
        PEAK_IMAGE_BYTES.fetch_max(now, Relaxed);
        SharedImage(std::mem::ManuallyDrop::new(spare))
    }

    /// Counts `bytes` and gives them the [`Image`] type (no copy, no allocation).
    fn track(bytes: std::sync::Arc<[u8]>) -> SharedImage {
        use std::sync::atomic::Ordering::Relaxed;
        let n = bytes.len() as u64;
        let now = LIVE_IMAGE_BYTES.fetch_add(n, Relaxed) + n;
        PEAK_IMAGE_BYTES.fetch_max(now, Relaxed);
        let raw = std::sync::Arc::into_raw(bytes) as *const Image;
        // SAFETY: `Image` is `#[repr(transparent)]` over `[u8]`, so `ArcInner<Image>` and
        // `ArcInner<[u8]>` have the same layout and the fat pointer's length metadata means the
        // same; `raw` comes from `Arc::into_raw` of an `Arc<[u8]>` and is consumed once, here
        // (the cast `Arc::from_raw` documents for types of the same size and alignment; std
        // does the same from `Arc<OsStr>` to `Arc<Path>`).
        let image = unsafe { std::sync::Arc::from_raw(raw) };
        SharedImage(std::mem::ManuallyDrop::new(image))
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        LIVE_IMAGE_BYTES.fetch_sub(self.0.len() as u64, std::sync::atomic::Ordering::Relaxed);
    }
}

impl std::ops::Deref for Image {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl std::ops::DerefMut for Image {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

impl AsRef<[u8]> for Image {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for Image {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Image({} bytes)", self.0.len())
    }
}

/// Pages needed for an overflow run holding `value_len` bytes after the header.
pub fn overflow_run_pages(value_len: usize) -> usize {
    (HEADER_LEN + value_len).div_ceil(PAGE_SIZE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spares() -> usize {
        SPARES.with(|s| s.borrow().0.len())
    }

    /// A one-page image's buffer is kept by the thread that drops its last clone and reused by
    /// the next one-page image made there, holding the new bytes; a clone still held keeps it.
    #[test]
    fn a_freed_page_buffer_is_reused_on_its_thread() {
        let n = spares();
        let a = Image::copy_from(&[1u8; PAGE_SIZE]);
        let held = a.clone();
        drop(a);
        assert_eq!(spares(), n, "a clone still holds the image");
        assert!(held.iter().all(|&b| b == 1));
        let at = held.as_ptr();
        drop(held);
        assert_eq!(spares(), n + 1);
        let c = Image::from_boxed(vec![3u8; PAGE_SIZE].into_boxed_slice());
        assert_eq!((c.as_ptr(), spares()), (at, n));
        assert!(c.iter().all(|&b| b == 3));
        drop(c);
        let z = zeroed_shared(1);
        assert_eq!(z.as_ptr(), at);
        assert!(z.iter().all(|&b| b == 0));
        // Runs are not kept.
        drop(zeroed_shared(2));
        assert_eq!(spares(), n);
    }

    #[test]
    fn seal_from_base_matches_a_full_seal() {
        let mut base = zeroed(1);
        for (i, b) in base.iter_mut().enumerate() {
            *b = (i * 7 + i / 300) as u8;
        }
        seal(&mut base);
        let cases: &[&[(usize, usize)]] = &[
            &[(0, 32)],
            &[(0, 32), (40, 44), (8000, 8192)],
            &[(0, 8192)],
            &[(2, 3)],
            &[(100, 101), (4000, 4600), (8191, 8192)],
            // Both sides of the byte-at-a-time limit (SHORT_RANGE).
            &[(200, 264), (300, 365), (7000, 7063)],
        ];
        for ranges in cases {
            let mut img = base.clone();
            for &(a, b) in ranges.iter() {
                for (i, x) in img[a.max(4)..b.max(4)].iter_mut().enumerate() {
                    *x ^= (i as u8).wrapping_mul(31).wrapping_add(1);
                }
            }
            let mut full = img.clone();
            seal(&mut full);
            assert!(seal_from_base(&mut img, &base, ranges), "{ranges:?}");
            assert_eq!(img, full, "{ranges:?}");
        }
        let mut img = base.clone();
        assert!(!seal_from_base(&mut img, &base, &[(10, 20), (15, 30)]));
        assert!(!seal_from_base(&mut img, &base, &[(10, 8193)]));
    }

    /// The bit-at-a-time product (zlib's `multmodp`), the reference for `mul_mod_p`.
    fn mul_bitwise(a: u32, mut b: u32) -> u32 {
        let mut p = 0u32;
        for i in (0..32).rev() {
            if a & (1 << i) != 0 {
                p ^= b;
            }
            b = times_x(b);
        }
        p
    }

    #[test]
    fn nibble_products_match_the_bitwise_product() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u32
        };
        let edges = [0u32, 1, 1 << 31, u32::MAX, POLY, 0x8000_0001, 0xF];
        for &a in &edges {
            for &b in &edges {
                assert_eq!(mul_mod_p(a, b), mul_bitwise(a, b), "{a:#x} * {b:#x}");
            }
        }
        for _ in 0..10_000 {
            let (a, b) = (next(), next());
            assert_eq!(mul_mod_p(a, b), mul_bitwise(a, b), "{a:#x} * {b:#x}");
        }
        // x^0 (bit 31) is the unit.
        assert_eq!(mul_mod_p(1 << 31, 0x1234_5678), 0x1234_5678);
    }

    #[test]
    fn seal_then_verify_and_detect_flip() {
        let mut p = zeroed(1);
        PageHeader {
            kind: PageKind::Leaf,
            count: 3,
            page_number: 9,
            txn_id: 4,
            run_pages: 1,
            aux: 0,
        }
        .write(&mut p);
        seal(&mut p);
        assert!(check_image(&p, 9, Path::new("x")).is_ok());
        assert!(check_image(&p, 8, Path::new("x")).is_err());
        p[5000] ^= 1;
        assert!(check_image(&p, 9, Path::new("x"))
            .unwrap_err()
            .is_corruption());
    }

    #[test]
    fn zero_page_is_never_valid() {
        let p = zeroed(1);
        assert!(!verify_checksum(&p));
    }
}
