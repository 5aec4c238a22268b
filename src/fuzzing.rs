//! Entry points for the cargo-fuzz targets in `fuzz/` (cargo feature `fuzzing`, off by
//! default; not part of the public API, hidden from the docs).
//!
//! The decoders of the on-disk formats (journal records, pages, header pages) are internal;
//! these thin wrappers run them over arbitrary bytes with only public types in their
//! signatures, so the fuzz crate keeps building whatever the decoders' visibility. Each one
//! decodes, and where the bytes decode, checks a round trip (encode what was decoded and
//! decode it again). Bad bytes must give a typed [`Error::Corruption`] (or the decoder's
//! documented "not a record" answer), never a panic and never an allocation sized by a length
//! read from the bytes: a panic in these functions is a bug in a decoder, which is what the
//! fuzzer looks for. `docs/TESTING.md` says how to run the targets.

use std::path::Path;

use crate::error::{Error, Result};
use crate::journal::record::{
    commit_record, decode_commit, CommitMeta, PageRecord, RecordHeader, RecordKind,
    RECORD_HEADER_LEN,
};
use crate::page::node::{leaf_put_in_place, BranchView, LeafEntry, LeafView, Node, Val};
use crate::page::{self, header, PageHeader, PageKind, PAGE_SIZE};

/// Bytes of a journal record header (48).
pub const JOURNAL_RECORD_HEADER_LEN: usize = RECORD_HEADER_LEN;

/// What [`journal_record`] found in its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecordSummary {
    /// The first 48 bytes are a valid record header (magic, version, kind, checksum).
    pub header_valid: bool,
    /// Page images in the commit body decoded from the bytes after the header.
    pub pages: usize,
}

fn corrupt(what: &str) -> Error {
    Error::corruption("<fuzz input>", None, None, what)
}

/// Decodes `bytes` as a journal record: the first 48 bytes as a record header (checked for a
/// round trip when valid), and the rest as a commit body, whatever the header says (the
/// header's checksum would otherwise keep a fuzzer from ever reaching the body decoder). Every
/// page diff in the body is rebuilt on a base page made of the body's own bytes, and every
/// rebuilt image is checked as a page ([`page::check_image`]). A body that decodes is
/// re-encoded ([`commit_record`], full images) and decoded again: the images must match.
///
/// Errors: [`Error::Corruption`] when the body is not a well-formed commit body (then
/// `header_valid` is lost with it: the summary is only for bodies that decode).
pub fn journal_record(bytes: &[u8]) -> Result<RecordSummary> {
    let mut summary = RecordSummary::default();
    if let Some(h) = RecordHeader::decode(bytes) {
        summary.header_valid = true;
        let again = RecordHeader::decode(&h.encode());
        assert_eq!(
            again,
            Some(h),
            "a decoded record header does not round-trip"
        );
    }
    let body = bytes.get(RECORD_HEADER_LEN..).unwrap_or(&[]);
    let (meta, images) = decode_commit(body).ok_or_else(|| corrupt("malformed commit body"))?;
    summary.pages = images.len();
    // A base page for diffs: the body's first 8 KiB, zero-padded.
    let mut base = vec![0u8; PAGE_SIZE];
    let n = body.len().min(PAGE_SIZE);
    base[..n].copy_from_slice(&body[..n]);
    let mut full: Vec<(u64, crate::page::SharedImage)> = Vec::new();
    for (p, rec) in images {
        let is_full = matches!(rec, PageRecord::Full(_));
        let Some(img) = rec.rebuild(|b| (b % 2 == 0).then_some(&base[..])) else {
            continue;
        };
        let _ = page::check_image(&img, p, Path::new("<fuzz input>"));
        if is_full && !img.is_empty() && img.len() % PAGE_SIZE == 0 {
            let mut sealed = img.to_vec();
            page::seal(&mut sealed);
            full.push((p, page::Image::from_boxed(sealed.into_boxed_slice())));
        }
    }
    // Round trip of the full images (trimmed or not, as the encoder decides).
    let rec = commit_record(1, 1, meta, &full, |_| None);
    let enc: Vec<u8> = rec.parts.iter().flat_map(|p| p.iter().copied()).collect();
    assert_eq!(enc.len() as u64, rec.body_len, "body length");
    let (meta2, images2) = decode_commit(&enc).expect("an encoded commit body decodes");
    assert_eq!(meta2, meta, "commit meta does not round-trip");
    assert_eq!(images2.len(), full.len(), "image count does not round-trip");
    for ((p, img), (p2, rec2)) in full.iter().zip(images2) {
        assert_eq!(*p, p2, "page number does not round-trip");
        match rec2 {
            PageRecord::Full(img2) => assert!(img2[..] == img[..], "page {p}: image differs"),
            PageRecord::Diff { .. } => {
                panic!("page {p}: encoded without a base, decoded as a diff")
            }
        }
    }
    Ok(summary)
}

/// Encodes a journal record as the writer does: a valid 48-byte header of `kind` (1 commit,
/// 2 padding, 3 link, 4 start, 5 logical, 6 apply step, 7 group; any other byte is taken as
/// padding) for journal file `journal_no`, then
/// `body`. Used to build journal files whose checksums hold.
pub fn encode_record(
    kind: u8,
    journal_no: u64,
    storage_id: u64,
    txn_id: u64,
    body: &[u8],
) -> Vec<u8> {
    let kind = match kind {
        1 => RecordKind::Commit,
        3 => RecordKind::Link,
        4 => RecordKind::Start,
        5 => RecordKind::Logical,
        6 => RecordKind::Step,
        7 => RecordKind::Group,
        _ => RecordKind::Padding,
    };
    let h = RecordHeader {
        kind,
        journal_no,
        storage_id,
        txn_id,
        body_len: body.len() as u64,
        body_crc: crc32fast::hash(body),
    };
    let mut out = h.encode().to_vec();
    out.extend_from_slice(body);
    out
}

/// A commit body with the given tree state and full page images `(page number, image)`, each
/// image sealed here after its page header is set to `page number` (so it passes
/// [`page::check_image`] when its kind byte is valid). An image whose length is not a multiple
/// of 8 KiB is zero-padded to the next one.
pub fn commit_body(
    root: u64,
    freedir: u64,
    next_page: u64,
    entries: u64,
    images: &[(u64, Vec<u8>)],
) -> Vec<u8> {
    let meta = CommitMeta {
        root,
        freedir,
        next_page,
        entries,
    };
    let sealed: Vec<(u64, crate::page::SharedImage)> = images
        .iter()
        .map(|(p, img)| {
            let mut v = img.clone();
            v.resize(img.len().div_ceil(PAGE_SIZE).max(1) * PAGE_SIZE, 0);
            v[8..16].copy_from_slice(&p.to_le_bytes());
            let run = (v.len() / PAGE_SIZE) as u32;
            v[24..28].copy_from_slice(&run.to_le_bytes());
            page::seal(&mut v);
            (*p, page::Image::from_boxed(v.into_boxed_slice()))
        })
        .collect();
    let rec = commit_record(1, 1, meta, &sealed, |_| None);
    rec.parts.iter().flat_map(|p| p.iter().copied()).collect()
}

/// Decodes `bytes` (zero-padded or cut to one page, or to the run its header claims when that
/// fits) as a data-file page: the page check, the node decoders and views of leaf and branch
/// pages, and the header-page decoder. When `seal` is true the checksum is first made to hold,
/// so the decoders behind the check are reached. A node that decodes is re-encoded and decoded
/// again (equal), and an insert made in place on the re-encoded image must decode as the same
/// insert made on the node.
///
/// Errors: [`Error::Corruption`] from the page check (bad checksum, length, kind or number).
pub fn page(bytes: &[u8], seal: bool) -> Result<()> {
    let mut img = vec![0u8; PAGE_SIZE];
    let n = bytes.len().min(PAGE_SIZE);
    img[..n].copy_from_slice(&bytes[..n]);
    let claimed = PageHeader::read(&img).map(|h| h.page_number).unwrap_or(0);
    if seal {
        page::seal(&mut img);
    }
    // Decoders behind the checksum, whether or not it holds (a reader of the map trusts a
    // verified page; a fuzzer cannot forge the checksum).
    if let Some(h) = PageHeader::read(&img) {
        views(&img, &h);
        if let Some(node) = Node::decode(&img, &h) {
            node_round_trip(&node, bytes);
        }
    }
    let _ = header::decode(&img, claimed);
    page::check_image(&img, claimed, Path::new("<fuzz input>")).map(|_| ())
}

/// Walks a leaf or branch page through its zero-copy views (what readers use).
fn views(img: &[u8], h: &PageHeader) {
    match h.kind {
        PageKind::Leaf => {
            let v = LeafView::new(img, h);
            for i in 0..v.len().min(64) {
                let _ = v.cell(i);
            }
            let _ = v.search(b"m");
        }
        PageKind::Branch => {
            let v = BranchView::new(img, h);
            for i in 0..=v.keys().min(64) {
                let _ = v.child(i);
                let _ = v.key(i);
            }
            let _ = v.child_index(b"m");
        }
        _ => {}
    }
}

/// Encode/decode round trip of a decoded node, and an in-place insert on its clean image.
fn node_round_trip(node: &Node, bytes: &[u8]) {
    let img = node.encode(5, 2);
    let h = page::check_image(&img, 5, Path::new("<fuzz input>"))
        .expect("an encoded node passes the page check");
    let again = Node::decode(&img, &h).expect("an encoded node decodes");
    assert_eq!(&again, node, "node does not round-trip");
    let Node::Leaf(es) = node else { return };
    // In-place insert only on a well-formed leaf (keys in strictly increasing order): on
    // unsorted keys a binary search has no defined answer.
    if !es.windows(2).all(|w| w[0].key < w[1].key) {
        return;
    }
    let key: Vec<u8> = bytes.iter().rev().take(8).copied().collect();
    if key.is_empty() {
        return;
    }
    let val = Val::Inline(bytes.iter().take(16).copied().collect());
    let mut edited = img.to_vec();
    if leaf_put_in_place(&mut edited, &key, &val).is_ok() {
        let mut want = es.clone();
        match want.binary_search_by(|e| e.key[..].cmp(&key[..])) {
            Ok(i) => want[i].val = val,
            Err(i) => want.insert(i, LeafEntry { key, val }),
        }
        let h = PageHeader::read(&edited).expect("an edited leaf has a header");
        let got = Node::decode(&edited, &h).expect("an edited leaf decodes");
        assert_eq!(
            got,
            Node::Leaf(want),
            "in-place insert differs from the node's"
        );
    }
}

/// The header-page decoder over two slots: slot 0's first 128 bytes are `bytes[..128]`, slot
/// 1's are `bytes[128..256]`, the rest of each page zeros (a header's fields end at byte 104;
/// later bytes matter only to the checksum). With `seal`, each slot's checksum is first made to
/// hold. Picks the newest valid header as an open does, and checks that a valid header
/// round-trips. Returns the chosen header's sequence and slot.
///
/// Errors: as an open of a data file with these two pages: [`Error::FormatVersion`],
/// [`Error::Corruption`] (both slots damaged), [`Error::NotAStorage`] (no omnibus header).
pub fn header_pages(bytes: &[u8], seal: bool) -> Result<(u64, u64)> {
    const SLOT_BYTES: usize = 128;
    let mut slots = [vec![0u8; PAGE_SIZE], vec![0u8; PAGE_SIZE]];
    for (i, slot) in slots.iter_mut().enumerate() {
        let part = bytes.get(i * SLOT_BYTES..).unwrap_or(&[]);
        let n = part.len().min(SLOT_BYTES);
        slot[..n].copy_from_slice(&part[..n]);
        if seal {
            page::seal(slot);
        }
        if let header::Slot::Valid(h) = header::decode(slot, i as u64) {
            let enc = h.encode(i as u64);
            assert_eq!(
                header::decode(&enc, i as u64),
                header::Slot::Valid(h),
                "header does not round-trip"
            );
        }
    }
    let (h, slot) = header::choose(&slots[0], &slots[1], Path::new("<fuzz input>"))?;
    Ok((h.sequence, slot))
}

/// The page kinds' byte values, for building pages: (header, branch, leaf, overflow, free-space
/// directory, free-space bitmap, value page run).
pub const PAGE_KINDS: [u8; 7] = [
    PageKind::Header as u8,
    PageKind::Branch as u8,
    PageKind::Leaf as u8,
    PageKind::Overflow as u8,
    PageKind::FreeDir as u8,
    PageKind::FreeBitmap as u8,
    PageKind::Values as u8,
];

/// A sealed leaf page image for page `page_number` holding `entries` (inline values), or
/// `None` when they do not fit one page, are not in strictly increasing key order, or a key is
/// empty or over 1,024 bytes. For fuzz targets that build journal records of real pages.
pub fn leaf_page(page_number: u64, txn_id: u64, entries: &[(Vec<u8>, Vec<u8>)]) -> Option<Vec<u8>> {
    if !entries.windows(2).all(|w| w[0].0 < w[1].0)
        || entries
            .iter()
            .any(|(k, _)| k.is_empty() || k.len() > crate::MAX_KEY_LEN)
    {
        return None;
    }
    let node = Node::Leaf(
        entries
            .iter()
            .map(|(k, v)| LeafEntry {
                key: k.clone(),
                val: Val::Inline(v.clone()),
            })
            .collect(),
    );
    node.fits()
        .then(|| node.encode(page_number, txn_id).to_vec())
}

/// The file name of journal file `no` in a storage's `Journals/` directory.
pub fn journal_file_name(no: u64) -> String {
    crate::journal::file_name(no)
}
