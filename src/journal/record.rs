//! Journal records: a 48-byte checksummed header and a checksummed body.
//!
//! ```text
//! 0       4      5         6        8             16            24        32          40         44          48
//! | magic | kind | version | unused | journal no  | storage id  | txn id  | body len  | body crc | header crc |
//! ```
//! `magic` is `"OMJR"`, `header crc` is the crc32 of bytes `0..44`, `body len >= 1`. A run of
//! zero bytes has the wrong magic and a wrong header checksum, so a pre-zeroed tail always reads
//! as the end of the journal (design.md invariant I8). `journal no` is the number of the file the
//! record was written to, so records left in a recycled file are never taken for new ones.
//!
//! Commit body (kind 1):
//! ```text
//! root u64 | freedir u64 | next_page u64 | entries u64 | images u32 |
//! images × one of:
//!   page number u64 | run pages u32              | run pages × 8192 bytes of sealed image
//!   page number u64 | 0x8000_0001 u32 | a u16 | b u16 | bytes 0..a | bytes b..8192
//!   page number u64 | 0x8000_0002 u32 | base page u64 | n u16 | n × (offset u16 | len u16 | bytes)
//! ```
//! The second form is a whole single page whose bytes `a..b` are zeros (the free middle of a
//! leaf or branch page, the unused tail of a bitmap page): still a full image, with the zeros
//! left out. The third is a page diff (design.md invariant I9): the page is the image of `base page`
//! (the page it was copied from, as of the transaction before this one) with the `n` byte
//! ranges replaced. Its base is a committed page that this transaction frees and that stays
//! unwritten until a durable header passes this transaction (the allocator defers its reuse),
//! so recovery finds it intact in the scratch table it is rebuilding or in the data file, and a
//! torn flush of the new page is repaired from base + diff. Recovery rebuilds each page and
//! checks its own checksum, which also catches a wrong base. A free-space bitmap page, updated
//! in place, is a diff whose `base page` is its own number: the base is its version as of the
//! transaction before, and the ranges cover every byte that changed since (see
//! `storage::recover` for why its torn data-file copy is still a good start).
//! Padding body (kind 2): zeros, written so that a batch ends on a 4 KiB boundary. A padding
//! record's `txn id` field holds the file's *durable length* when its batch was written: every
//! byte below it was a record or a zero, written and synced (the zeroed end of a pre-zeroed
//! file); 0 when unknown (files written before this field, or without pre-zeroing). No power
//! loss makes a file shorter than that, so recovery takes a file shorter than a length recorded
//! in it for a file that was cut (see `recovery`).
//! Link body (kind 3): storage id u64 | UTF-8 path of the storage directory relative to the root.
//! Logical body (kind 5): a buffered storage's commit as its operations in key order,
//! `count u32 | count × (op u8 | key len u16 | key | [value len u32 | value])`, op 1 a put (with
//! its value), 2 a delete (see [`logical_record`]; design.md 3.9).
//! Group body (kind 7): `count u32 | count × (storage id u64 | txn id u64 | body len u64 | kind
//! u8 | 7 zero bytes) | the count bodies back to back`, each body a commit (1), logical (5) or
//! apply step (6) body of its storage (see [`group_record`]; design.md 3.11). The record header's
//! storage id and txn id are 0: the parts carry theirs.
//! Start body (kind 4): journal number u64 of the file started | its durable length u64 when it
//! was started (its synced zeros; 0 without pre-zeroing). Written into the previous file, storage
//! id = the journal's owner, txn id 0, as a batch of its own synced before any batch of the new
//! file: the statement outside the new file that it exists and how long it is at least (a cut
//! that removes a file's first batch leaves no padding record in it to say so).

use super::diff::{
    apply_ranges, diff_len, diff_ranges, longest_zero_run, WrittenRanges, MAX_DIFF_RANGES, MIN_TRIM,
};
use crate::page::{rd_u32, rd_u64, wr_u32, wr_u64, PAGE_SIZE};

/// Bytes of a record header.
pub const RECORD_HEADER_LEN: usize = 48;
/// `"OMJR"` little-endian.
pub const MAGIC: u32 = u32::from_le_bytes(*b"OMJR");
/// Record format version.
pub const VERSION: u8 = 1;
/// Alignment of every batch (bytes).
pub const BATCH_ALIGN: u64 = 4096;

/// What a record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RecordKind {
    /// A committed transaction of one storage: its page images and tree roots.
    Commit = 1,
    /// Filler up to a 4 KiB boundary.
    Padding = 2,
    /// "Storage S has a hard link to this journal file" (shared journal).
    Link = 3,
    /// "The journal's next file was started, with this durable length": written into the
    /// previous file when the journal moves to a new one, before any batch of the new file
    /// (see [`start_body`]).
    Start = 4,
    /// A buffered storage's committed transaction as its operations (puts and deletes), not
    /// pages (see [`logical_record`]).
    Logical = 5,
    /// A buffered storage's apply step: the page commit of part of its buffer, and every entry
    /// still buffered after it (see [`step_record`]).
    Step = 6,
    /// A group transaction: the commit records (kinds 1, 5, 6) of several storages of a
    /// database under one checksum, so that every storage recovers its part exactly when the
    /// whole group is in the journal (see [`group_record`]).
    Group = 7,
}

impl RecordKind {
    /// True for the kinds that are a storage's committed transaction (page, logical or apply
    /// step): they carry its txn id, in one contiguous sequence per storage.
    pub fn is_commit(self) -> bool {
        matches!(
            self,
            RecordKind::Commit | RecordKind::Logical | RecordKind::Step
        )
    }
}

/// A decoded record header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    /// What the body holds.
    pub kind: RecordKind,
    /// Number of the journal file the record was written to.
    pub journal_no: u64,
    /// The storage the record belongs to.
    pub storage_id: u64,
    /// The storage's transaction id (0 for links); for padding, the durable length of the file
    /// when the batch was written (see [`RecordHeader::durable_len`]).
    pub txn_id: u64,
    /// Body bytes.
    pub body_len: u64,
    /// crc32 of the body.
    pub body_crc: u32,
}

impl RecordHeader {
    /// Encodes the header, computing its checksum.
    pub fn encode(&self) -> [u8; RECORD_HEADER_LEN] {
        let mut b = [0u8; RECORD_HEADER_LEN];
        wr_u32(&mut b, 0, MAGIC);
        b[4] = self.kind as u8;
        b[5] = VERSION;
        wr_u64(&mut b, 8, self.journal_no);
        wr_u64(&mut b, 16, self.storage_id);
        wr_u64(&mut b, 24, self.txn_id);
        wr_u64(&mut b, 32, self.body_len);
        wr_u32(&mut b, 40, self.body_crc);
        let c = crc32fast::hash(&b[..44]);
        wr_u32(&mut b, 44, c);
        b
    }

    /// For a padding record: the bytes of its file that were durable (records or zeros,
    /// written and synced) when its batch was written, so that no power loss can have made the
    /// file shorter; 0 when unknown (another kind, or a file written before this field).
    pub fn durable_len(&self) -> u64 {
        match self.kind {
            RecordKind::Padding => self.txn_id,
            _ => 0,
        }
    }

    /// The first txn id a commit record holds: an apply step's pages, one below its own txn
    /// id (3.10); the txn id for every other kind.
    pub fn first_txn(&self) -> u64 {
        match self.kind {
            RecordKind::Step => self.txn_id.saturating_sub(1),
            _ => self.txn_id,
        }
    }

    /// Decodes and checks a header; `None` means "end of journal" (zeros, torn or foreign).
    pub fn decode(b: &[u8]) -> Option<RecordHeader> {
        if b.len() < RECORD_HEADER_LEN || rd_u32(b, 0)? != MAGIC || b[5] != VERSION {
            return None;
        }
        if rd_u32(b, 44)? != crc32fast::hash(&b[..44]) {
            return None;
        }
        let kind = match b[4] {
            1 => RecordKind::Commit,
            2 => RecordKind::Padding,
            3 => RecordKind::Link,
            4 => RecordKind::Start,
            5 => RecordKind::Logical,
            6 => RecordKind::Step,
            7 => RecordKind::Group,
            _ => return None,
        };
        let body_len = rd_u64(b, 32)?;
        if body_len == 0 {
            return None;
        }
        Some(RecordHeader {
            kind,
            journal_no: rd_u64(b, 8)?,
            storage_id: rd_u64(b, 16)?,
            txn_id: rd_u64(b, 24)?,
            body_len,
            body_crc: rd_u32(b, 40)?,
        })
    }
}

/// Operation byte of a put in a logical record.
const OP_PUT: u8 = 1;
/// Operation byte of a delete in a logical record.
const OP_DELETE: u8 = 2;

/// Builds the logical record (kind 5) of buffered commit `txn_id`: its operations in key order,
/// each a key and a value, or a key and `None` for a delete. Body:
/// `count u32 | count × (op u8 | key len u16 | key | [value len u32 | value])`, op 1 a put
/// (with its value), 2 a delete (without). The body's crc32 is in the record header.
pub fn logical_record<'a, I>(storage_id: u64, txn_id: u64, ops: I) -> OutRecord
where
    I: IntoIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
    I::IntoIter: Clone,
{
    let ops = ops.into_iter();
    let (mut count, mut len) = (0usize, 4usize);
    for (k, v) in ops.clone() {
        count += 1;
        len += 3 + k.len() + v.map_or(0, |v| 4 + v.len());
    }
    let mut b = Vec::with_capacity(len);
    b.extend_from_slice(&(count as u32).to_le_bytes());
    for (k, v) in ops {
        b.push(if v.is_some() { OP_PUT } else { OP_DELETE });
        b.extend_from_slice(&(k.len() as u16).to_le_bytes());
        b.extend_from_slice(k);
        if let Some(v) = v {
            b.extend_from_slice(&(v.len() as u32).to_le_bytes());
            b.extend_from_slice(v);
        }
    }
    debug_assert_eq!(b.len(), len);
    OutRecord::new(
        RecordKind::Logical,
        storage_id,
        txn_id,
        vec![Part::Owned(b)],
    )
}

/// Builds the record (kind 6) of an apply step of a buffered storage from `commit`, the page
/// record (kind 1) of transaction `t` that applied part of the buffer, and `carried`, every
/// entry still buffered after it, in key order (as [`logical_record`]'s operations). Body:
/// `commit body len u64 | commit body | logical body of carried`; the record's txn id is
/// `t + 1`. A step takes two txn ids, its pages `t` and the carried buffer `t + 1`, so that a
/// flush of its pages, which records `t` in the header, still leaves the record to replay for
/// the buffer (design.md 3.10).
pub fn step_record<'a, I>(commit: OutRecord, carried: I) -> OutRecord
where
    I: IntoIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
    I::IntoIter: Clone,
{
    debug_assert_eq!(commit.kind, RecordKind::Commit);
    let logical = logical_record(commit.storage_id, commit.txn_id + 1, carried);
    let mut parts = Vec::with_capacity(commit.parts.len() + 2);
    parts.push(Part::Owned(commit.body_len.to_le_bytes().to_vec()));
    parts.extend(commit.parts);
    parts.extend(logical.parts);
    let mut r = OutRecord::new(
        RecordKind::Step,
        commit.storage_id,
        commit.txn_id + 1,
        parts,
    );
    r.pages = commit.pages;
    r.page_diffs = commit.page_diffs;
    r
}

/// Splits the body of an apply step's record ([`step_record`]) into its commit body and the
/// logical body of its carried entries; `None` when the commit length runs past the body.
pub fn split_step(body: &[u8]) -> Option<(&[u8], &[u8])> {
    let n = usize::try_from(rd_u64(body, 0)?).ok()?;
    let end = n.checked_add(8)?;
    Some((body.get(8..end)?, body.get(end..)?))
}

/// Bytes of one part's entry in a group record's table.
pub const GROUP_ENTRY_LEN: usize = 32;

/// Builds the record (kind 7) of a group transaction from the commit records of its storages
/// (kinds 1, 5 or 6; at least two, each of a different storage), in the order given. Body:
/// `count u32 | count × (storage id u64 | txn id u64 | body len u64 | kind u8 | 7 zero bytes)`,
/// then the parts' bodies back to back in the same order. The record header's storage id and
/// txn id are 0. One body checksum covers every part: a torn group record fails it as a whole,
/// so every storage of the group reaches the same verdict from its own name of the file
/// (design.md 3.11, invariant I14). The checksum is combined from the parts' own (no byte of
/// a body is hashed twice); their page images are still written without a copy.
pub fn group_record(parts: Vec<OutRecord>) -> OutRecord {
    debug_assert!(parts.len() >= 2);
    debug_assert!(parts.iter().all(|r| r.kind.is_commit()));
    let mut table = Vec::with_capacity(4 + parts.len() * GROUP_ENTRY_LEN);
    table.extend_from_slice(&(parts.len() as u32).to_le_bytes());
    for r in &parts {
        table.extend_from_slice(&r.storage_id.to_le_bytes());
        table.extend_from_slice(&r.txn_id.to_le_bytes());
        table.extend_from_slice(&r.body_len.to_le_bytes());
        table.push(r.kind as u8);
        table.extend_from_slice(&[0u8; 7]);
    }
    let mut crc = crc32fast::Hasher::new();
    crc.update(&table);
    let mut body_len = table.len() as u64;
    let mut members = Vec::with_capacity(parts.len());
    let mut out_parts: Vec<Part> =
        Vec::with_capacity(1 + parts.iter().map(|r| r.parts.len()).sum::<usize>());
    out_parts.push(Part::Owned(table));
    let (mut pages, mut page_diffs, mut started) = (0u32, 0u32, None);
    for r in parts {
        crc.combine(&crc32fast::Hasher::new_with_initial_len(
            r.body_crc, r.body_len,
        ));
        body_len += r.body_len;
        members.push((r.storage_id, r.txn_id));
        pages = pages.saturating_add(r.pages);
        page_diffs = page_diffs.saturating_add(r.page_diffs);
        started = match (started, r.started) {
            (Some(a), Some(b)) => Some(std::cmp::min(a, b)),
            (a, b) => a.or(b),
        };
        out_parts.extend(r.parts);
    }
    OutRecord {
        kind: RecordKind::Group,
        storage_id: 0,
        txn_id: 0,
        parts: out_parts,
        body_crc: crc.finalize(),
        body_len,
        pages,
        page_diffs,
        started,
        members,
    }
}

/// One storage's part of a decoded group record ([`decode_group`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupPart<'b> {
    /// The part's record kind: [`RecordKind::Commit`], [`RecordKind::Logical`] or
    /// [`RecordKind::Step`].
    pub kind: RecordKind,
    /// The storage the part belongs to.
    pub storage_id: u64,
    /// The storage's txn id (an apply step's second one, as in its own record).
    pub txn_id: u64,
    /// The part's body, as that kind's own record would hold it.
    pub body: &'b [u8],
}

/// Decodes a group record's body ([`group_record`]); `None` when it is malformed: fewer than
/// two parts, a table or a body that runs past the record, bytes after the last body, a part
/// kind other than 1, 5 or 6, non-zero padding in an entry, an empty body, a storage id of 0
/// or one that appears twice.
pub fn decode_group(body: &[u8]) -> Option<Vec<GroupPart<'_>>> {
    let n = rd_u32(body, 0)? as usize;
    if n < 2 {
        return None;
    }
    let table_end = n.checked_mul(GROUP_ENTRY_LEN)?.checked_add(4)?;
    if table_end > body.len() {
        return None;
    }
    let mut parts: Vec<GroupPart<'_>> = Vec::with_capacity(n);
    let mut at = table_end;
    for i in 0..n {
        let e = 4 + i * GROUP_ENTRY_LEN;
        let storage_id = rd_u64(body, e)?;
        let txn_id = rd_u64(body, e + 8)?;
        let len = usize::try_from(rd_u64(body, e + 16)?).ok()?;
        let kind = match body[e + 24] {
            1 => RecordKind::Commit,
            5 => RecordKind::Logical,
            6 => RecordKind::Step,
            _ => return None,
        };
        if body[e + 25..e + GROUP_ENTRY_LEN].iter().any(|&b| b != 0)
            || len == 0
            || storage_id == 0
            || parts.iter().any(|p| p.storage_id == storage_id)
        {
            return None;
        }
        let end = at.checked_add(len)?;
        parts.push(GroupPart {
            kind,
            storage_id,
            txn_id,
            body: body.get(at..end)?,
        });
        at = end;
    }
    (at == body.len()).then_some(parts)
}

/// A decoded logical record's operations: key, and value or `None` for a delete.
pub type LogicalOps<'b> = Vec<(&'b [u8], Option<&'b [u8]>)>;

/// Decodes a logical record's body ([`logical_record`]); `None` when it is malformed: a
/// truncated or trailing byte, an unknown operation, an empty key or one over
/// [`crate::MAX_KEY_LEN`] bytes, a value over [`crate::MAX_VALUE_LEN`] bytes, or keys out of
/// strictly increasing order.
pub fn decode_logical(body: &[u8]) -> Option<LogicalOps<'_>> {
    let n = rd_u32(body, 0)? as usize;
    let mut at = 4usize;
    // Each operation takes at least 4 bytes: the count cannot ask for more than the body has.
    let mut ops = Vec::with_capacity(n.min(body.len() / 4));
    for _ in 0..n {
        let op = *body.get(at)?;
        let klen = u16::from_le_bytes(body.get(at + 1..at + 3)?.try_into().ok()?) as usize;
        at += 3;
        let key = body.get(at..at.checked_add(klen)?)?;
        at += klen;
        if key.is_empty() || key.len() > crate::MAX_KEY_LEN {
            return None;
        }
        if ops.last().is_some_and(|(k, _): &(&[u8], _)| *k >= key) {
            return None;
        }
        let value = match op {
            OP_PUT => {
                let vlen = rd_u32(body, at)? as usize;
                at += 4;
                if vlen > crate::MAX_VALUE_LEN {
                    return None;
                }
                let v = body.get(at..at.checked_add(vlen)?)?;
                at += vlen;
                Some(v)
            }
            OP_DELETE => None,
            _ => return None,
        };
        ops.push((key, value));
    }
    (at == body.len()).then_some(ops)
}

/// Bytes of a start record's body (kind 4).
pub const START_BODY_LEN: usize = 16;

/// The body of a start record: journal file `no` was started with `len` durable bytes.
pub fn start_body(no: u64, len: u64) -> Vec<u8> {
    let mut b = vec![0u8; START_BODY_LEN];
    wr_u64(&mut b, 0, no);
    wr_u64(&mut b, 8, len);
    b
}

/// Decodes a start record's body: `(journal number, durable length)`; `None` when it is not
/// exactly [`START_BODY_LEN`] bytes.
pub fn decode_start(body: &[u8]) -> Option<(u64, u64)> {
    if body.len() != START_BODY_LEN {
        return None;
    }
    Some((rd_u64(body, 0)?, rd_u64(body, 8)?))
}

/// The fixed part of a commit body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitMeta {
    /// B+tree root after the transaction.
    pub root: u64,
    /// Free-space map directory page after the transaction.
    pub freedir: u64,
    /// High-water page count after the transaction.
    pub next_page: u64,
    /// Keys in the tree after the transaction.
    pub entries: u64,
}

const COMMIT_FIXED: usize = 8 * 4 + 4;
/// Run-pages flag of a single page stored without its longest run of zeros.
const TRIMMED: u32 = 0x8000_0000;
/// Run-pages value of a single page stored as a diff of a base page.
const DIFF: u32 = 0x8000_0002;
/// One piece of a record body: a shared page image (written by `pwritev` without copying), bytes
/// owned by the record (headers of diffs, trimmed pages), or zeros (padding).
#[derive(Debug, Clone)]
pub enum Part {
    /// A sealed page image shared with the scratch table.
    Shared(crate::page::SharedImage),
    /// Bytes built for this record.
    Owned(Vec<u8>),
    /// This many zero bytes (at most [`MAX_ZERO_PART`]).
    Zeros(usize),
}

/// Most bytes a [`Part::Zeros`] stands for (a padding record's body is under two batch
/// alignments).
pub const MAX_ZERO_PART: usize = 2 * BATCH_ALIGN as usize;
static ZERO_PART: [u8; MAX_ZERO_PART] = [0u8; MAX_ZERO_PART];

impl std::ops::Deref for Part {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Part::Shared(a) => a,
            Part::Owned(v) => v,
            Part::Zeros(n) => &ZERO_PART[..(*n).min(MAX_ZERO_PART)],
        }
    }
}

impl From<Vec<u8>> for Part {
    fn from(v: Vec<u8>) -> Part {
        Part::Owned(v)
    }
}

impl From<crate::page::SharedImage> for Part {
    fn from(a: crate::page::SharedImage) -> Part {
        Part::Shared(a)
    }
}

/// A record ready to be written: header fields except the journal number, and body parts.
/// The body is kept as parts so page images are written by `pwritev` without copying.
#[derive(Debug, Clone)]
pub struct OutRecord {
    /// Record kind.
    pub kind: RecordKind,
    /// Storage id.
    pub storage_id: u64,
    /// Transaction id.
    pub txn_id: u64,
    /// Body parts written back to back.
    pub parts: Vec<Part>,
    /// crc32 of the concatenated parts.
    pub body_crc: u32,
    /// Total body length.
    pub body_len: u64,
    /// Page images in a commit record, and how many of them are diffs (0 for other kinds).
    pub pages: u32,
    /// See `pages`.
    pub page_diffs: u32,
    /// When its commit started (`WriteTransaction::prepare`), for the journal's commit latency
    /// histogram (`crate::metrics`); `None` for records that are no commit's.
    pub started: Option<std::time::Instant>,
    /// A group record's parts as `(storage id, txn id)`, in body order; empty for every other
    /// kind (see [`OutRecord::commits`]).
    pub members: Vec<(u64, u64)>,
}

impl OutRecord {
    /// The `(storage id, txn id)` of every storage commit this record holds: a group record's
    /// parts, or the record's own storage and txn id for any other kind.
    pub fn commits(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let own = (self.kind != RecordKind::Group).then_some((self.storage_id, self.txn_id));
        own.into_iter().chain(self.members.iter().copied())
    }

    /// A record whose body is `parts`.
    pub fn new(kind: RecordKind, storage_id: u64, txn_id: u64, parts: Vec<Part>) -> OutRecord {
        let mut h = crc32fast::Hasher::new();
        let mut len = 0u64;
        for p in &parts {
            h.update(p);
            len += p.len() as u64;
        }
        OutRecord {
            kind,
            storage_id,
            txn_id,
            parts,
            body_crc: h.finalize(),
            body_len: len,
            pages: 0,
            page_diffs: 0,
            started: None,
            members: Vec::new(),
        }
    }

    /// Bytes on disk (header + body).
    pub fn total_len(&self) -> u64 {
        RECORD_HEADER_LEN as u64 + self.body_len
    }

    /// The header for journal file `journal_no`.
    pub fn header(&self, journal_no: u64) -> [u8; RECORD_HEADER_LEN] {
        RecordHeader {
            kind: self.kind,
            journal_no,
            storage_id: self.storage_id,
            txn_id: self.txn_id,
            body_len: self.body_len,
            body_crc: self.body_crc,
        }
        .encode()
    }
}

/// The committed page a dirty page was copied from (and the transaction freed): the base of
/// its page diff.
#[derive(Debug, Clone, Copy)]
pub struct DiffBase<'b> {
    /// The base's page number.
    pub page: u64,
    /// The base's image (8 KiB).
    pub image: &'b [u8],
    /// The diff's ranges when the writer tracked its edits (in-place edits only): the header
    /// and the byte ranges written since the page was copied, as [`super::diff::written_ranges`] makes
    /// them from the tracked writes; `None` to compare the page with the base.
    pub written: Option<WrittenRanges>,
}

/// Builds a commit record from its meta and sealed page images `(page number, image)`.
/// `base_of(p)` names the page that page `p` was copied from, when the transaction freed it
/// (see the module doc): the page is then journaled as a diff against it when that is smaller
/// than its (trimmed) full image. The diff's ranges are the tracked written ranges when the
/// base has them, else found by comparing the page with the base ([`diff_ranges`]).
pub fn commit_record<'b>(
    storage_id: u64,
    txn_id: u64,
    meta: CommitMeta,
    images: &[(u64, crate::page::SharedImage)],
    base_of: impl Fn(u64) -> Option<DiffBase<'b>>,
) -> OutRecord {
    // Everything but whole page images goes into one owned buffer (one allocation for a
    // commit of diffs); a whole image is a shared part of its own.
    let mut parts: Vec<Part> = Vec::with_capacity(3);
    let mut cur: Vec<u8> = Vec::with_capacity(4096);
    cur.extend_from_slice(&meta.root.to_le_bytes());
    cur.extend_from_slice(&meta.freedir.to_le_bytes());
    cur.extend_from_slice(&meta.next_page.to_le_bytes());
    cur.extend_from_slice(&meta.entries.to_le_bytes());
    cur.extend_from_slice(&(images.len() as u32).to_le_bytes());
    let mut page_diffs = 0u32;
    for (p, img) in images {
        debug_assert!(
            crate::page::verify_checksum(img),
            "unsealed image for page {p}"
        );
        let (tracked, compared);
        let diff = match base_of(*p) {
            Some(b) if img.len() == PAGE_SIZE && b.image.len() == PAGE_SIZE => {
                let ranges: &[(usize, usize)] = match b.written {
                    Some(w) => {
                        tracked = w.expand();
                        &tracked
                    }
                    None => {
                        compared = diff_ranges(b.image, img);
                        &compared
                    }
                };
                // Tracked ranges must cover every changed byte: checked in debug builds (the
                // test suite) by rebuilding the page from its base.
                debug_assert!(
                    {
                        let mut rebuilt = b.image.to_vec();
                        for &(s, e) in ranges {
                            rebuilt[s..e].copy_from_slice(&img[s..e]);
                        }
                        rebuilt[..] == img[..]
                    },
                    "page {p}: diff ranges {ranges:?} miss a change"
                );
                Some((b.page, ranges))
            }
            _ => None,
        };
        // The zero-run scan only when a diff is missing or not obviously smaller.
        let (a, b) = match &diff {
            Some((_, r)) if diff_len(r) <= PAGE_SIZE / 8 => (0, 0),
            _ if img.len() == PAGE_SIZE => longest_zero_run(img),
            _ => (0, 0),
        };
        let full_len = img.len() - if b - a >= MIN_TRIM { b - a - 4 } else { 0 };
        let diff = diff.filter(|(_, r)| r.len() <= MAX_DIFF_RANGES && diff_len(r) < full_len);
        if let Some((bp, ranges)) = diff {
            cur.extend_from_slice(&p.to_le_bytes());
            cur.extend_from_slice(&DIFF.to_le_bytes());
            cur.extend_from_slice(&bp.to_le_bytes());
            cur.extend_from_slice(&(ranges.len() as u16).to_le_bytes());
            for &(s, e) in ranges {
                cur.extend_from_slice(&(s as u16).to_le_bytes());
                cur.extend_from_slice(&((e - s) as u16).to_le_bytes());
                cur.extend_from_slice(&img[s..e]);
            }
            page_diffs += 1;
            continue;
        }
        if b - a >= MIN_TRIM {
            cur.extend_from_slice(&p.to_le_bytes());
            cur.extend_from_slice(&(TRIMMED | 1).to_le_bytes());
            cur.extend_from_slice(&(a as u16).to_le_bytes());
            cur.extend_from_slice(&(b as u16).to_le_bytes());
            cur.extend_from_slice(&img[..a]);
            cur.extend_from_slice(&img[b..]);
            continue;
        }
        cur.extend_from_slice(&p.to_le_bytes());
        cur.extend_from_slice(&((img.len() / PAGE_SIZE) as u32).to_le_bytes());
        parts.push(Part::Owned(std::mem::take(&mut cur)));
        parts.push(Part::Shared(img.clone()));
    }
    if !cur.is_empty() {
        parts.push(Part::Owned(cur));
    }
    let mut rec = OutRecord::new(RecordKind::Commit, storage_id, txn_id, parts);
    rec.pages = images.len() as u32;
    rec.page_diffs = page_diffs;
    rec
}

/// One page of a decoded commit body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PageRecord<'a> {
    /// The whole image (a page or an overflow run), borrowed from the body or rebuilt from a
    /// trimmed page.
    Full(std::borrow::Cow<'a, [u8]>),
    /// The image of page `base` with `ranges` `(offset, bytes)` replaced.
    Diff {
        /// The page this one was copied from.
        base: u64,
        /// Replaced byte ranges, in offset order.
        ranges: Vec<(usize, &'a [u8])>,
    },
}

impl PageRecord<'_> {
    /// The page's image, reading the base of a diff with `base_image`. `None` when a diff does
    /// not fit its base (a base that is not one page, or a range past the page's end).
    pub fn rebuild<'s>(
        self,
        base_image: impl FnOnce(u64) -> Option<&'s [u8]>,
    ) -> Option<std::borrow::Cow<'s, [u8]>>
    where
        Self: 's,
    {
        match self {
            PageRecord::Full(img) => Some(img),
            PageRecord::Diff { base, ranges } => {
                let mut img = base_image(base)?.to_vec();
                if img.len() != PAGE_SIZE {
                    return None;
                }
                apply_ranges(&mut img, &ranges)?;
                Some(std::borrow::Cow::Owned(img))
            }
        }
    }
}

/// A commit body decoded: its meta and `(page number, page record)` pairs.
pub type DecodedCommit<'a> = (CommitMeta, Vec<(u64, PageRecord<'a>)>);

/// A decoded commit body: meta and `(page number, page record)` pairs, borrowed from the body
/// or rebuilt (trimmed pages). `None` when the body is malformed: cut short or too long, a
/// bad run-pages field, a tree state out of range ([`crate::page::tree_state_in_range`]), or
/// a page (or the run it starts) outside `2..next_page` (a transaction writes only pages it
/// allocated, all below its high-water mark; the header pages are never journaled).
pub fn decode_commit(body: &[u8]) -> Option<DecodedCommit<'_>> {
    let meta = CommitMeta {
        root: rd_u64(body, 0)?,
        freedir: rd_u64(body, 8)?,
        next_page: rd_u64(body, 16)?,
        entries: rd_u64(body, 24)?,
    };
    if !crate::page::tree_state_in_range(meta.root, meta.freedir, meta.next_page) {
        return None;
    }
    // Pages `p..p + run` of an image must lie in `2..next_page`.
    let in_range = |p: u64, run: u64| {
        p >= 2
            && p.checked_add(run.max(1))
                .is_some_and(|e| e <= meta.next_page)
    };
    let n = rd_u32(body, 32)? as usize;
    let mut at = COMMIT_FIXED;
    let mut images = Vec::with_capacity(n.min(1 << 16));
    for _ in 0..n {
        let p = rd_u64(body, at)?;
        let run = rd_u32(body, at + 8)?;
        at += 12;
        if run == DIFF {
            let base = rd_u64(body, at)?;
            let n = crate::page::rd_u16(body, at + 8)? as usize;
            at += 10;
            let mut ranges = Vec::with_capacity(n);
            for _ in 0..n {
                let off = crate::page::rd_u16(body, at)? as usize;
                let len = crate::page::rd_u16(body, at + 2)? as usize;
                at += 4;
                ranges.push((off, body.get(at..at.checked_add(len)?)?));
                at += len;
            }
            if !in_range(p, 1) {
                return None;
            }
            images.push((p, PageRecord::Diff { base, ranges }));
            continue;
        }
        if run & TRIMMED != 0 {
            if run != TRIMMED | 1 {
                return None;
            }
            let a = crate::page::rd_u16(body, at)? as usize;
            let b = crate::page::rd_u16(body, at + 2)? as usize;
            at += 4;
            if a > b || b > PAGE_SIZE {
                return None;
            }
            let tail = PAGE_SIZE - b;
            let mut img = vec![0u8; PAGE_SIZE];
            img[..a].copy_from_slice(body.get(at..at.checked_add(a)?)?);
            at += a;
            img[b..].copy_from_slice(body.get(at..at.checked_add(tail)?)?);
            at += tail;
            if !in_range(p, 1) {
                return None;
            }
            images.push((p, PageRecord::Full(std::borrow::Cow::Owned(img))));
            continue;
        }
        let len = (run as usize).checked_mul(PAGE_SIZE)?;
        let img = body.get(at..at.checked_add(len)?)?;
        at += len;
        if !in_range(p, run as u64) {
            return None;
        }
        images.push((p, PageRecord::Full(std::borrow::Cow::Borrowed(img))));
    }
    if at != body.len() {
        return None;
    }
    Some((meta, images))
}

/// `"OMJMARK1"` little-endian: the first 8 bytes of a durable mark's body (see [`mark_record`]).
pub const MARK_MAGIC: u64 = u64::from_le_bytes(*b"OMJMARK1");

/// Bytes of a durable mark's body: the mark is one padding record filling a 4 KiB batch.
pub const MARK_BODY_LEN: usize = BATCH_ALIGN as usize - RECORD_HEADER_LEN;

/// The durable mark written at `end`, the write position after the journal's last batch, when
/// the journal went idle (docs/design.md 3.12): a padding record (kind 2) of one 4 KiB batch whose
/// body is `MARK_MAGIC u64 | end u64 | zeros` and whose txn id is `durable`, the file's durable
/// length, as any padding's. It says "every batch of this file below `end` was written and
/// synced": a damaged record below it is corruption, not a torn tail. A reader that predates
/// marks skips it as the padding it is.
pub fn mark_record(end: u64, durable: u64) -> OutRecord {
    let mut head = vec![0u8; 16];
    wr_u64(&mut head, 0, MARK_MAGIC);
    wr_u64(&mut head, 8, end);
    OutRecord::new(
        RecordKind::Padding,
        0,
        durable,
        vec![Part::Owned(head), Part::Zeros(MARK_BODY_LEN - 16)],
    )
}

/// The end a durable mark states (bytes of its file: every batch below it was synced), when
/// `h` and `body` are a mark's ([`mark_record`]); `None` for every other record, plain padding
/// included.
pub fn mark_end(h: &RecordHeader, body: &[u8]) -> Option<u64> {
    if h.kind != RecordKind::Padding || rd_u64(body, 0)? != MARK_MAGIC {
        return None;
    }
    rd_u64(body, 8)
}

/// A padding record that, written at `pos`, ends exactly on the next 4 KiB boundary (or the
/// one after when the gap is too small for a header and one byte), recording `durable`, the
/// file's durable length before its batch (bytes; see [`RecordHeader::durable_len`]). `None`
/// when `pos` is on a boundary already.
pub fn padding_for(pos: u64, durable: u64) -> Option<OutRecord> {
    let rem = pos % BATCH_ALIGN;
    if rem == 0 {
        return None;
    }
    let mut gap = BATCH_ALIGN - rem;
    if gap < RECORD_HEADER_LEN as u64 + 1 {
        gap += BATCH_ALIGN;
    }
    let body = (gap - RECORD_HEADER_LEN as u64) as usize;
    debug_assert!(body <= MAX_ZERO_PART);
    Some(OutRecord::new(
        RecordKind::Padding,
        0,
        durable,
        vec![Part::Zeros(body)],
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_records_roundtrip() {
        let r = OutRecord::new(
            RecordKind::Start,
            9,
            0,
            vec![start_body(17, 4 << 20).into()],
        );
        let h = RecordHeader::decode(&r.header(16)).unwrap();
        assert_eq!(
            (h.kind, h.journal_no, h.storage_id),
            (RecordKind::Start, 16, 9)
        );
        assert_eq!(h.durable_len(), 0);
        assert_eq!(decode_start(&start_body(17, 4 << 20)), Some((17, 4 << 20)));
        assert_eq!(decode_start(&[0; 15]), None);
        assert_eq!(decode_start(&[0; 17]), None);
    }

    #[test]
    fn marks_roundtrip_and_plain_padding_is_no_mark() {
        let m = mark_record(40960, 4 << 20);
        assert_eq!(m.total_len(), BATCH_ALIGN);
        let h = RecordHeader::decode(&m.header(3)).unwrap();
        assert_eq!((h.kind, h.durable_len()), (RecordKind::Padding, 4 << 20));
        let body: Vec<u8> = m.parts.iter().flat_map(|p| p.iter().copied()).collect();
        assert_eq!(crc32fast::hash(&body), h.body_crc);
        assert_eq!(mark_end(&h, &body), Some(40960));
        let pad = padding_for(100, 0).unwrap();
        let ph = RecordHeader::decode(&pad.header(3)).unwrap();
        assert_eq!(mark_end(&ph, &vec![0u8; pad.body_len as usize]), None);
        assert_eq!(mark_end(&ph, &[1, 2]), None);
    }

    #[test]
    fn zeros_never_decode() {
        for len in [0usize, 1, 47, 48, 4096] {
            assert!(RecordHeader::decode(&vec![0u8; len]).is_none());
        }
    }

    #[test]
    fn header_roundtrip_and_flip() {
        let h = RecordHeader {
            kind: RecordKind::Commit,
            journal_no: 7,
            storage_id: 42,
            txn_id: 9,
            body_len: 100,
            body_crc: 5,
        };
        let mut b = h.encode();
        assert_eq!(RecordHeader::decode(&b), Some(h));
        b[20] ^= 0x10;
        assert_eq!(RecordHeader::decode(&b), None);
    }

    /// A leaf of one entry `key` -> `value` encoded as page 7 of txn 3, and the meta of a
    /// commit with it as the root (20 pages, one entry).
    fn one_leaf(key: &[u8], value: &[u8]) -> (Box<[u8]>, CommitMeta) {
        use crate::page::node::{LeafEntry, Node, Val};
        let leaf = Node::Leaf(vec![LeafEntry {
            key: key.to_vec(),
            val: Val::Inline(value.to_vec()),
        }])
        .encode(7, 3);
        let meta = CommitMeta {
            root: 7,
            freedir: 0,
            next_page: 20,
            entries: 1,
        };
        (leaf, meta)
    }

    #[test]
    fn trimmed_images_roundtrip() {
        let (leaf, meta) = one_leaf(b"k", b"v");
        let full = crate::page::node::encode_overflow(&[9u8; 20_000], 9, 3);
        let rec = commit_record(
            1,
            3,
            meta,
            &[
                (7, crate::page::Image::from_boxed(leaf.clone())),
                (9, crate::page::Image::from_boxed(full.clone())),
            ],
            |_| None,
        );
        assert!(
            rec.body_len < (PAGE_SIZE as u64) * 4,
            "the leaf's free middle was not left out"
        );
        let body: Vec<u8> = rec.parts.iter().flat_map(|p| p.iter().copied()).collect();
        let (m, imgs) = decode_commit(&body).unwrap();
        assert_eq!(m, meta);
        let full_of = |r: &PageRecord<'_>| match r {
            PageRecord::Full(img) => img.to_vec(),
            PageRecord::Diff { .. } => panic!("expected a full image"),
        };
        assert_eq!(full_of(&imgs[0].1), &leaf[..]);
        assert_eq!(full_of(&imgs[1].1), &full[..]);
        assert!(decode_commit(&body[..body.len() - 1]).is_none());
    }

    #[test]
    fn step_records_hold_a_commit_and_the_carried_entries() {
        let (leaf, meta) = one_leaf(b"a", b"1");
        let commit = commit_record(
            1,
            3,
            meta,
            &[(7, crate::page::Image::from_boxed(leaf))],
            |_| None,
        );
        let pages = commit.pages;
        let carried: Vec<(&[u8], Option<&[u8]>)> = vec![(b"b", Some(b"2")), (b"c", None)];
        let rec = step_record(commit, carried.iter().copied());
        assert_eq!(
            (rec.kind, rec.txn_id, rec.pages),
            (RecordKind::Step, 4, pages)
        );
        assert!(rec.kind.is_commit());
        let h = RecordHeader::decode(&rec.header(1)).unwrap();
        assert_eq!(h.kind, RecordKind::Step);
        let body: Vec<u8> = rec.parts.iter().flat_map(|p| p.iter().copied()).collect();
        assert_eq!(crc32fast::hash(&body), rec.body_crc);
        let (c, l) = split_step(&body).unwrap();
        assert_eq!(decode_commit(c).unwrap().0, meta);
        assert_eq!(decode_logical(l).unwrap(), carried);
        // A commit length past the body does not split.
        let mut bad = body.clone();
        bad[..8].copy_from_slice(&(body.len() as u64).to_le_bytes());
        assert!(split_step(&bad).is_none());
        assert!(split_step(&body[..7]).is_none());
    }

    #[test]
    fn page_diff_roundtrip_is_small_and_needs_its_base() {
        use crate::page::node::{LeafEntry, Node, Val};
        let entry = |i: u32| LeafEntry {
            key: format!("key{i:05}").into_bytes(),
            val: Val::Inline(vec![i as u8; 40]),
        };
        let old = Node::Leaf((0..60).map(|i| entry(i * 2)).collect());
        let base = old.encode(7, 3);
        let mut es = match old {
            Node::Leaf(es) => es,
            _ => unreachable!(),
        };
        es.insert(30, entry(59));
        let new = Node::Leaf(es).encode_on(&base, 12, 4);
        let meta = CommitMeta {
            root: 12,
            freedir: 0,
            next_page: 20,
            entries: 61,
        };
        let rec = commit_record(
            1,
            4,
            meta,
            &[(12, crate::page::Image::from_boxed(new.clone()))],
            |p| {
                (p == 12).then_some(DiffBase {
                    page: 7,
                    image: &base[..],
                    written: None,
                })
            },
        );
        assert!(
            rec.body_len < 400,
            "a one-cell insert journaled {} bytes",
            rec.body_len
        );
        let body: Vec<u8> = rec.parts.iter().flat_map(|p| p.iter().copied()).collect();
        let (_, mut imgs) = decode_commit(&body).unwrap();
        let (p, r) = imgs.pop().unwrap();
        assert_eq!(p, 12);
        assert!(matches!(r, PageRecord::Diff { base: 7, .. }));
        let rebuilt = r
            .clone()
            .rebuild(|b| (b == 7).then_some(&base[..]))
            .unwrap();
        assert_eq!(&*rebuilt, &new[..]);
        // A wrong base rebuilds a page whose checksum fails.
        let other = Node::Leaf(vec![entry(1)]).encode(7, 3);
        let wrong = r.clone().rebuild(|_| Some(&other[..])).unwrap();
        assert!(!crate::page::verify_checksum(&wrong));
        // A missing base, or one that is not a page, rebuilds nothing.
        assert!(r.clone().rebuild(|_| None).is_none());
        assert!(r.rebuild(|_| Some(&other[..100])).is_none());
    }

    #[test]
    fn commit_bodies_out_of_range_do_not_decode() {
        // Regression (found by the `recovery` fuzz target): a commit record whose
        // checksums hold but whose tree state is absurd was replayed as it was. Its
        // `next_page` of about 2^60 then sized `check`'s page bitmaps (the process died out of
        // memory: `rust_oom` in `btree::check`), and would have sized the data file; a page
        // number near 2^64 overflowed `p + run` in the replay. The decoder now refuses them,
        // and recovery reports the record as a malformed commit record (`Error::Corruption`).
        let body = |meta: CommitMeta, pages: &[(u64, u32)]| {
            let mut b = Vec::new();
            for v in [meta.root, meta.freedir, meta.next_page, meta.entries] {
                b.extend_from_slice(&v.to_le_bytes());
            }
            b.extend_from_slice(&(pages.len() as u32).to_le_bytes());
            for &(p, run) in pages {
                b.extend_from_slice(&p.to_le_bytes());
                b.extend_from_slice(&run.to_le_bytes());
                b.resize(b.len() + run as usize * PAGE_SIZE, 7);
            }
            b
        };
        let meta = |root, freedir, next_page| CommitMeta {
            root,
            freedir,
            next_page,
            entries: 1,
        };
        assert!(decode_commit(&body(meta(5, 0, 10), &[(5, 1), (6, 2)])).is_some());
        assert!(decode_commit(&body(meta(0, 0, 2), &[])).is_some());
        for (m, pages) in [
            (meta(5, 0, 1 << 60), vec![(5, 1)]),
            (meta(5, 0, crate::page::MAX_PAGES + 1), vec![]),
            (meta(5, 0, 1), vec![]),
            (meta(10, 0, 10), vec![]),
            (meta(5, 1, 10), vec![]),
            (meta(5, 0, 10), vec![(u64::MAX, 1)]),
            (meta(5, 0, 10), vec![(9, 2)]),
            (meta(5, 0, 10), vec![(1, 1)]),
        ] {
            assert!(decode_commit(&body(m, &pages)).is_none(), "{m:?} {pages:?}");
        }
    }

    #[test]
    fn padding_reaches_boundary() {
        for pos in [1u64, 100, 4000, 4048, 4095, 8191] {
            let p = padding_for(pos, 1 << 20).unwrap();
            assert_eq!((pos + p.total_len()) % BATCH_ALIGN, 0, "pos {pos}");
            let h = RecordHeader::decode(&p.header(7)).unwrap();
            assert_eq!(h.durable_len(), 1 << 20);
        }
        assert!(padding_for(8192, 0).is_none());
    }

    #[test]
    fn group_records_roundtrip_with_one_checksum() {
        let a = OutRecord::new(
            RecordKind::Logical,
            7,
            3,
            vec![vec![1u8, 2, 3].into(), vec![4u8; 100].into()],
        );
        let b = OutRecord::new(RecordKind::Commit, 9, 12, vec![vec![5u8; 40].into()]);
        let g = group_record(vec![a, b]);
        assert_eq!(g.members, vec![(7, 3), (9, 12)]);
        assert_eq!(g.commits().collect::<Vec<_>>(), vec![(7, 3), (9, 12)]);
        let body: Vec<u8> = g.parts.iter().flat_map(|p| p.iter().copied()).collect();
        assert_eq!(body.len() as u64, g.body_len);
        // The combined checksum is the body's own.
        assert_eq!(crc32fast::hash(&body), g.body_crc);
        let parts = decode_group(&body).unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(
            (parts[0].kind, parts[0].storage_id, parts[0].txn_id),
            (RecordKind::Logical, 7, 3)
        );
        assert_eq!(parts[0].body.len(), 103);
        assert_eq!(parts[1].body, &[5u8; 40][..]);
        // Malformed: a byte more, a byte less, a duplicate storage, one part only.
        let mut long = body.clone();
        long.push(0);
        assert!(decode_group(&long).is_none());
        assert!(decode_group(&body[..body.len() - 1]).is_none());
        let mut dup = body.clone();
        dup[4 + GROUP_ENTRY_LEN..4 + GROUP_ENTRY_LEN + 8].copy_from_slice(&7u64.to_le_bytes());
        assert!(decode_group(&dup).is_none());
        let mut one = body.clone();
        one[0] = 1;
        assert!(decode_group(&one).is_none());
        let h = RecordHeader::decode(&g.header(5)).unwrap();
        assert_eq!((h.kind, h.storage_id, h.txn_id), (RecordKind::Group, 0, 0));
    }
}
