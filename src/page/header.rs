//! Header pages 0 and 1: written alternately by the flush; the newest valid one wins (as
//! LMDB's meta pages).
//!
//! ```text
//! 0   page header (kind 1, page number 0 or 1)          32
//! 32  magic "OMNIBUS\0"                                  8
//! 40  format version u32 | page size u32                8
//! 48  sequence u64 (higher = newer)                      8
//! 56  storage id u64                                     8
//! 64  flushed txn id u64                                 8
//! 72  root page u64 (0 = empty tree)                     8
//! 80  free-space map directory page u64 (0 = none)       8
//! 88  next page u64 (high-water mark)                    8
//! 96  entries u64 (keys in the tree)                     8
//! 104 journal started: file number u64 (0 = none)        8
//! 112 journal started: its durable length u64            8
//! 120 zeros to 8192 (covered by the checksum)
//! ```

use std::path::Path;

use super::{
    rd_u32, rd_u64, seal, verify_checksum, wr_u32, wr_u64, zeroed, PageHeader, PageKind, PAGE_SIZE,
};
use crate::error::{Error, Result};

/// `OMNIBUS\0`.
pub const MAGIC: [u8; 8] = *b"OMNIBUS\0";
/// The on-disk format this build writes. 2: free-space bitmap pages are journaled as diffs of
/// their own previous version (docs/design.md 3.2), which a version 1 build would rebuild on
/// the data file's copy only when that copy is intact, and report a torn one as corruption.
/// 3: values of up to 10,912 bytes that do not fit their leaf are packed into value page runs
/// (kind 7) named by leaf cells of flag 2 (docs/design.md 2.7), which a version 2 build would
/// report as malformed leaves.
pub const FORMAT_VERSION: u32 = 3;
/// The oldest format this build reads. A version 1 or 2 storage opened for writing has both
/// header pages rewritten at version 3 before its first commit (its journal, written by an
/// older build, holds nothing this build reads differently).
pub const MIN_FORMAT_VERSION: u32 = 1;

/// The decoded content of a header page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Higher is newer.
    pub sequence: u64,
    /// Random id of the storage, carried by each of its journal records.
    pub storage_id: u64,
    /// Every transaction up to this one is in the data file.
    pub flushed_txn: u64,
    /// B+tree root of the flushed state.
    pub root: u64,
    /// Free-space map directory of the flushed state.
    pub freedir: u64,
    /// High-water page count of the flushed state.
    pub next_page: u64,
    /// Keys in the flushed state.
    pub entries: u64,
    /// The *start statement* of the journal this storage owns (docs/design.md, 3.8): every
    /// journal file numbered this or higher that the journal started before this header was
    /// written must exist in the storage's `Journals/`; 0 = no statement (a storage that owns
    /// no journal: a branch of a database; a cleanly closed one, whose closing flush flushed
    /// everything; or a header written before this field, whose bytes were zeros).
    pub journal_started: u64,
    /// The length in bytes that file [`Header::journal_started`] has at least (its synced
    /// zeros when it was started; 0 without pre-zeroing).
    pub journal_started_len: u64,
}

impl Header {
    /// Encodes into a sealed page image for slot `slot` (0 or 1).
    pub fn encode(&self, slot: u64) -> Box<[u8]> {
        let mut p = zeroed(1);
        PageHeader {
            kind: PageKind::Header,
            count: 0,
            page_number: slot,
            txn_id: self.flushed_txn,
            run_pages: 1,
            aux: 0,
        }
        .write(&mut p);
        p[32..40].copy_from_slice(&MAGIC);
        wr_u32(&mut p, 40, FORMAT_VERSION);
        wr_u32(&mut p, 44, PAGE_SIZE as u32);
        wr_u64(&mut p, 48, self.sequence);
        wr_u64(&mut p, 56, self.storage_id);
        wr_u64(&mut p, 64, self.flushed_txn);
        wr_u64(&mut p, 72, self.root);
        wr_u64(&mut p, 80, self.freedir);
        wr_u64(&mut p, 88, self.next_page);
        wr_u64(&mut p, 96, self.entries);
        wr_u64(&mut p, 104, self.journal_started);
        wr_u64(&mut p, 112, self.journal_started_len);
        seal(&mut p);
        p
    }
}

/// What one header slot holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Slot {
    /// A valid header.
    Valid(Header),
    /// Magic and checksum fine, but another format version.
    OtherVersion(u32),
    /// Omnibus magic but a bad checksum or page size (torn or damaged), or a tree state out of
    /// range (`next_page` above `MAX_PAGES` (2^32), a root or free-space directory at or past
    /// `next_page`).
    Damaged,
    /// No omnibus magic.
    Foreign,
}

/// Decodes one slot.
pub fn decode(page: &[u8], slot: u64) -> Slot {
    if page.get(32..40) != Some(&MAGIC[..]) {
        return Slot::Foreign;
    }
    if !verify_checksum(page) {
        return Slot::Damaged;
    }
    let Some(version) = rd_u32(page, 40) else {
        return Slot::Damaged;
    };
    if !(MIN_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
        return Slot::OtherVersion(version);
    }
    let h = PageHeader::read(page);
    if h.map(|h| (h.kind, h.page_number)) != Some((PageKind::Header, slot))
        || rd_u32(page, 44) != Some(PAGE_SIZE as u32)
    {
        return Slot::Damaged;
    }
    let f = |at| rd_u64(page, at).unwrap_or(0);
    let h = Header {
        sequence: f(48),
        storage_id: f(56),
        flushed_txn: f(64),
        root: f(72),
        freedir: f(80),
        next_page: f(88),
        entries: f(96),
        journal_started: f(104),
        journal_started_len: f(112),
    };
    // A checksum that holds over a tree state out of range: written by something else, or
    // damage that kept the checksum; trusting it would size the file and `check` from it.
    if !super::tree_state_in_range(h.root, h.freedir, h.next_page) {
        return Slot::Damaged;
    }
    Slot::Valid(h)
}

/// The format version a header page states (bytes 40..44), whether or not it is valid.
pub fn version_of(page: &[u8]) -> Option<u32> {
    rd_u32(page, 40)
}

/// Picks the newest valid header of the two slots, or the error that explains why none is.
/// Returns the header and the slot it came from.
pub fn choose(p0: &[u8], p1: &[u8], path: &Path) -> Result<(Header, u64)> {
    let s = [decode(p0, 0), decode(p1, 1)];
    let best = s
        .iter()
        .enumerate()
        .filter_map(|(i, s)| match s {
            Slot::Valid(h) => Some((*h, i as u64)),
            _ => None,
        })
        .max_by_key(|(h, _)| h.sequence);
    if let Some(b) = best {
        return Ok(b);
    }
    if let Some(v) = s.iter().find_map(|s| match s {
        Slot::OtherVersion(v) => Some(*v),
        _ => None,
    }) {
        return Err(Error::FormatVersion {
            path: path.to_path_buf(),
            found: v,
            expected: FORMAT_VERSION,
        });
    }
    if s.contains(&Slot::Damaged) {
        return Err(Error::corruption(
            path,
            Some(0),
            None,
            "both header pages fail their checksum",
        ));
    }
    Err(Error::NotAStorage {
        path: path.to_path_buf(),
        reason: "the data file has no omnibus header".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(seq: u64) -> Header {
        Header {
            sequence: seq,
            storage_id: 1,
            flushed_txn: seq,
            root: 0,
            freedir: 0,
            next_page: 2,
            entries: 0,
            journal_started: 0,
            journal_started_len: 0,
        }
    }

    #[test]
    fn the_start_statement_roundtrips_and_old_headers_read_as_none() {
        let with = Header {
            journal_started: 17,
            journal_started_len: 4 << 20,
            ..h(5)
        };
        assert_eq!(decode(&with.encode(0), 0), Slot::Valid(with));
        // A header written before the field: zeros there, no statement.
        match decode(&h(5).encode(1), 1) {
            Slot::Valid(o) => assert_eq!((o.journal_started, o.journal_started_len), (0, 0)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_header_out_of_range_is_damaged() {
        // Regression (found by the `recovery` fuzz target): a header page whose
        // checksum holds over an absurd tree state (written by something else, or damage that
        // kept the checksum) was taken as valid; its `next_page` sizes the data file at open
        // and `check`'s page bitmaps (out of memory for 2^60), and `next_page * 8192`
        // overflowed. Such a slot is now damaged, so the other slot is used.
        let p = Path::new("d");
        let good = h(3).encode(0);
        for (root, freedir, next_page) in [
            (0, 0, 1u64 << 60),
            (0, 0, super::super::MAX_PAGES + 1),
            (0, 0, 1),
            (7, 0, 7),
            (0, 9, 5),
        ] {
            let bad = Header {
                root,
                freedir,
                next_page,
                ..h(4)
            }
            .encode(1);
            assert_eq!(
                decode(&bad, 1),
                Slot::Damaged,
                "{root} {freedir} {next_page}"
            );
            assert_eq!(choose(&good, &bad, p).unwrap().0.sequence, 3);
        }
        let edge = Header {
            root: 2,
            freedir: super::super::MAX_PAGES - 1,
            next_page: super::super::MAX_PAGES,
            ..h(4)
        };
        assert_eq!(decode(&edge.encode(1), 1), Slot::Valid(edge));
    }

    #[test]
    fn newest_valid_wins_and_torn_falls_back() {
        let p = Path::new("d");
        let a = h(3).encode(0);
        let mut b = h(4).encode(1);
        assert_eq!(choose(&a, &b, p).unwrap().0.sequence, 4);
        b[4000] ^= 1;
        assert_eq!(choose(&a, &b, p).unwrap().0.sequence, 3);
        let mut a2 = a.clone();
        a2[100] ^= 1;
        assert!(choose(&a2, &b, p).unwrap_err().is_corruption());
        let z = zeroed(1);
        assert!(matches!(choose(&z, &z, p), Err(Error::NotAStorage { .. })));
        let mut v = h(1).encode(0);
        wr_u32(&mut v, 40, 99);
        seal(&mut v);
        assert!(matches!(
            choose(&v, &z, p),
            Err(Error::FormatVersion { found: 99, .. })
        ));
    }
}
