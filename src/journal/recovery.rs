//! Reading journal files back: the scan every open runs (design.md invariant I7).
//!
//! A file is read record by record from offset 0. The first record whose header does not
//! decode (zeros, torn, another file's number) or whose body fails its checksum ends that
//! file: no record after it in that file is replayed. Padding records are skipped.
//!
//! A damaged record followed by later *synced* batches is corruption, not a torn tail, and is
//! reported: when the scan stops, the next 4 MiB of the file (256 KiB when it stopped on
//! zeros, the normal end of a pre-zeroed file) are searched at 4 KiB batch starts for valid
//! records. A batch holds at most one record of a storage (its
//! writer is held until the commit is published), and a batch is written only after the one
//! before it was synced; so a valid record of storage S whose first txn id is `t + 2` or more
//! (an apply step's is one below its txn id, design.md 3.10), where `t` is S's last good
//! record before the stop, proves that the batch holding `t + 1` (the damaged
//! region) was synced: [`Error::Corruption`]. A torn last batch never shows such a gap. When
//! the damaged record's header is intact, a valid record after the padding that ends its batch
//! is such proof too (it starts a later batch), and the search also covers the 4 MiB after the
//! record's claimed end. So is a *durable mark* past the stop (design.md 3.12: a padding record
//! the journal writes once idle, stating that every batch of the file below it was synced): it
//! makes damage to a journal's last batch corruption too, once the journal went idle after it.
//!
//! A file *cut short* (truncated, or copied short) is corruption too: each batch's padding
//! record holds the file's durable length when the batch was written (its synced, pre-zeroed
//! end), and a power loss never makes a file shorter than what was synced; so a file shorter
//! than a length recorded in it was cut, and the batches after the cut are lost. The check
//! needs one whole batch before the cut (with padding), and finds a cut below the zeroed end
//! that batch saw: any cut of a whole pre-zeroed file (a database's pool files,
//! [`crate::Prezero::WholeFile`]), a cut within the window zeroed ahead with
//! [`crate::Prezero::Ahead`]; nothing with [`crate::Prezero::Off`] (each batch grows the file).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use std::collections::HashMap;

use super::record::{
    decode_group, mark_end, RecordHeader, RecordKind, BATCH_ALIGN, RECORD_HEADER_LEN,
};
use crate::env::{EnvFile, OpenMode, StorageEnv};
use crate::error::{Error, Result};

/// Journal files in `dir`, sorted by number. Other names are ignored.
pub fn list(env: &dyn StorageEnv, dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut v: Vec<(u64, PathBuf)> = env
        .list_dir(dir)?
        .into_iter()
        .filter_map(|n| super::parse_file_name(&n).map(|no| (no, dir.join(n))))
        .collect();
    v.sort();
    Ok(v)
}

/// Where and why the scan of one file stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanEnd {
    /// Byte offset of the first byte not taken as a record.
    pub offset: u64,
    /// Records read (padding included).
    pub records: u64,
    /// The file's length in bytes when it was scanned.
    pub len: u64,
}

/// Reads the records of journal file `no` at `path` in order and calls `f(header, body)` for
/// each record but padding; a group record (kind 7) is given as its parts, each with the header
/// it would have as a record of its own ([`for_each_part`]), all at the group's offset. `f` may stop the scan early by returning an error. `known`:
/// `(storage, txn)` pairs already known to be durable before this file (the txn a storage's
/// recovery reached in its earlier files), so that damage to a storage's first record in this
/// file is told from a torn tail too.
pub fn scan(
    env: &dyn StorageEnv,
    path: &Path,
    no: u64,
    known: &[(u64, u64)],
    f: impl FnMut(&RecordHeader, &[u8], u64) -> Result<()>,
) -> Result<ScanEnd> {
    scan_from(env, path, no, known, 0, f)
}

/// [`scan`] from byte `from` of the file, the end of the records an earlier scan of it took (a
/// reader's catch-up reads only what was written since); `from` 0 is the whole file.
pub fn scan_from(
    env: &dyn StorageEnv,
    path: &Path,
    no: u64,
    known: &[(u64, u64)],
    from: u64,
    mut f: impl FnMut(&RecordHeader, &[u8], u64) -> Result<()>,
) -> Result<ScanEnd> {
    // Reading only: read-only opens on read-only media scan with it too.
    let file: Arc<dyn EnvFile> = env.open(path, OpenMode::ReadOnly)?;
    let len = file.len()?;
    let mut records = 0u64;
    // Last good txn id of each storage, for the damage check after the stop.
    let mut last: HashMap<u64, u64> = known.iter().copied().collect();
    // The longest durable length a batch recorded, and where that batch's padding is.
    let mut durable = (0u64, 0u64);
    let pos = read_records(&*file, len, no, from, |h, body, at| {
        records += 1;
        if h.durable_len() > durable.0 {
            durable = (h.durable_len(), at);
        }
        if h.kind == RecordKind::Padding {
            return Ok(());
        }
        // A group record (whole: its one checksum passed) is read as its parts, each a
        // storage's own commit record; a malformed one is corruption, never skipped.
        let malformed = || Error::corruption(path, None, Some(at), "malformed group record");
        for_each_part(h, body, |h, body| {
            if h.kind.is_commit() {
                let t = last.entry(h.storage_id).or_insert(0);
                *t = (*t).max(h.txn_id);
            }
            f(h, body, at)
        })
        .unwrap_or_else(|| Err(malformed()))
    })?;
    if len < durable.0 {
        // Beside a live writer (a reader in another process) the file grows while it is read:
        // the background zeroes ahead past `len`, and a batch written after that, still below
        // `len`, records the new zeroed end. Every byte below a recorded durable length was in
        // the file before its batch was written, so the file's length now, after the batch was
        // read, tells a file that grew from one that was cut.
        let now = file.len()?;
        if now < durable.0 {
            // A power loss never shortens what was synced: the file was cut (truncated, or
            // copied short), and whatever batches were after the cut are lost.
            return Err(Error::corruption(
                path,
                None,
                Some(now),
                format!(
                    "the journal file was cut short: it is {now} bytes, but the batch whose \
                     padding is at offset {} was written when {} bytes of it were durable; \
                     records after offset {pos} may be lost",
                    durable.1, durable.0
                ),
            ));
        }
    }
    let mut hbuf = [0u8; RECORD_HEADER_LEN];
    if pos + RECORD_HEADER_LEN as u64 <= len && file.read_exact_at(&mut hbuf, pos).is_ok() {
        // Zeros are the normal end of a pre-zeroed file: look only a little way past them (a
        // zeroed record header followed by later batches); anything else, further.
        let window = if hbuf.iter().all(|&b| b == 0) {
            ZERO_LOOKAHEAD
        } else {
            LOOKAHEAD
        };
        check_nothing_synced_after(&*file, len, no, pos, pos, window, &last, path)?;
        // A record whose header is intact but whose body fails its checksum: the batch after
        // it starts after its claimed end, which may be far past the window (a large value).
        if let Some(h) = RecordHeader::decode(&hbuf).filter(|h| h.journal_no == no) {
            let end = pos
                .saturating_add(RECORD_HEADER_LEN as u64)
                .saturating_add(h.body_len);
            if end < len {
                // A damaged padding record (a mark's, or the end of a batch) ends its batch:
                // whatever valid record follows it is a later batch.
                let batch_end = (h.kind == RecordKind::Padding).then_some(end);
                check_no_later_batch(&*file, len, no, pos, end, batch_end, path)?;
                if end > pos.saturating_add(window) {
                    check_nothing_synced_after(&*file, len, no, pos, end, LOOKAHEAD, &last, path)?;
                }
            }
        }
    }
    Ok(ScanEnd {
        offset: pos,
        records,
        len,
    })
}

/// After a scan stopped at `stop` on a record whose header is intact and whose body ends at
/// `end`: reads the records that follow it in its batch up to the batch's padding record; a
/// valid record after that padding starts a later batch, which the writer issued only after the
/// damaged batch's `fdatasync` returned, so the damage hit a synced batch: corruption, whatever
/// the txn ids (a shared journal's storages may each have one commit after the damage).
#[allow(clippy::too_many_arguments)]
fn check_no_later_batch(
    file: &dyn EnvFile,
    len: u64,
    no: u64,
    stop: u64,
    end: u64,
    batch_end: Option<u64>,
    path: &Path,
) -> Result<()> {
    let mut padding_end: Option<u64> = batch_end;
    // Bounded by the file, and stops at the first record of a later batch (the error).
    read_records(file, len, no, end, |h, body, at| {
        let later = padding_end.is_some_and(|e| at >= e);
        if let Some(marked) = mark_end(h, body).filter(|&m| m > stop) {
            // A durable mark (design.md 3.12) is a batch of its own, written after the batches
            // below it were synced.
            return Err(marked_after(path, stop, at, marked));
        }
        if h.kind == RecordKind::Padding {
            padding_end.get_or_insert(at + RECORD_HEADER_LEN as u64 + h.body_len);
        } else if later {
            return Err(synced_after(
                path,
                stop,
                format!(
                    "a later batch at offset {at} holds txn {} of storage {:#x}",
                    h.txn_id, h.storage_id
                ),
            ));
        }
        Ok(())
    })?;
    Ok(())
}

/// The corruption error for a damaged record at `stop` below a durable mark at `at` that states
/// every batch below `marked` synced.
fn marked_after(path: &Path, stop: u64, at: u64, marked: u64) -> Error {
    Error::corruption(
        path,
        None,
        Some(stop),
        format!(
            "a damaged journal record lies in a batch known durable: the durable mark at offset \
             {at} states every batch below offset {marked} written and synced"
        ),
    )
}

/// The corruption error for a damaged record at `stop` that later synced commits follow.
fn synced_after(path: &Path, stop: u64, detail: String) -> Error {
    Error::corruption(
        path,
        None,
        Some(stop),
        format!("a damaged journal record is followed by synced commits: {detail}"),
    )
}

/// Calls `f(header, body)` for the record `h` with body `body`, or, for a group record
/// (design.md 3.11), once for each of its parts with the header that part would have as a
/// record of its own (its kind, storage id, txn id and body length; the group's journal
/// number). `None` when a group record's body is malformed.
pub fn for_each_part(
    h: &RecordHeader,
    body: &[u8],
    mut f: impl FnMut(&RecordHeader, &[u8]) -> Result<()>,
) -> Option<Result<()>> {
    if h.kind != RecordKind::Group {
        return Some(f(h, body));
    }
    let parts = decode_group(body)?;
    for p in parts {
        let ph = RecordHeader {
            kind: p.kind,
            journal_no: h.journal_no,
            storage_id: p.storage_id,
            txn_id: p.txn_id,
            body_len: p.body.len() as u64,
            body_crc: 0,
        };
        if let Err(e) = f(&ph, p.body) {
            return Some(Err(e));
        }
    }
    Some(Ok(()))
}

/// Reads valid records from `pos` on, calling `f(header, body, offset)` for each (padding
/// too), and returns the offset of the first byte not taken as a record.
fn read_records(
    file: &dyn EnvFile,
    len: u64,
    no: u64,
    mut pos: u64,
    mut f: impl FnMut(&RecordHeader, &[u8], u64) -> Result<()>,
) -> Result<u64> {
    let mut hbuf = [0u8; RECORD_HEADER_LEN];
    let mut body = Vec::new();
    // Bounded: every turn advances `pos` by at least one header, and `pos` never passes `len`.
    while pos + RECORD_HEADER_LEN as u64 <= len {
        file.read_exact_at(&mut hbuf, pos)?;
        let Some(h) = RecordHeader::decode(&hbuf) else {
            break;
        };
        let body_at = pos + RECORD_HEADER_LEN as u64;
        if h.journal_no != no || h.body_len > len - body_at {
            break;
        }
        body.resize(h.body_len as usize, 0);
        file.read_exact_at(&mut body, body_at)?;
        if crc32fast::hash(&body) != h.body_crc {
            break;
        }
        f(&h, &body, pos)?;
        pos = body_at + h.body_len;
    }
    Ok(pos)
}

/// How far past a damaged record the scan looks for later synced batches (bytes). The batch
/// after a damaged one starts within that batch's length of it; bounding the search keeps an
/// open cheap when the stop is the end of a recycled file's new records (the stale records
/// after it carry another journal number and are never taken).
const LOOKAHEAD: u64 = 4 << 20;

/// The same past a stop on zeros (bytes): the normal end of every journal file, so kept short.
const ZERO_LOOKAHEAD: u64 = 256 << 10;

/// After a scan stopped at `stop`: searches the `window` bytes of the file from `from` on, at
/// 4 KiB batch starts, for a valid commit record of a storage whose txn id skips past the one
/// after its last good record (see the module doc); that is corruption of a synced batch.
#[allow(clippy::too_many_arguments)]
fn check_nothing_synced_after(
    file: &dyn EnvFile,
    len: u64,
    no: u64,
    stop: u64,
    from: u64,
    window: u64,
    last: &HashMap<u64, u64>,
    path: &Path,
) -> Result<()> {
    let first = from.div_ceil(BATCH_ALIGN) * BATCH_ALIGN;
    let limit = len.min(from.saturating_add(window));
    if first + RECORD_HEADER_LEN as u64 > limit {
        return Ok(());
    }
    // The window in one read: a batch start is only worth a closer look when it holds a header
    // that decodes for this file.
    let mut buf = vec![0u8; (limit - first) as usize];
    file.read_exact_at(&mut buf, first)?;
    let decodes_here = |at: u64| {
        let i = (at - first) as usize;
        buf.get(i..i + RECORD_HEADER_LEN)
            .and_then(RecordHeader::decode)
            .is_some_and(|h| h.journal_no == no)
    };
    let mut at = first;
    // Bounded: `at` grows by at least one 4 KiB block a turn and stops at `limit`; a record that
    // proves the damage ends the search with the error.
    while at + RECORD_HEADER_LEN as u64 <= limit {
        if !decodes_here(at) {
            at += BATCH_ALIGN;
            continue;
        }
        let end = read_records(file, len, no, at, |h, body, mark_at| {
            // A durable mark past the stop states the damaged batch synced (design.md 3.12).
            if let Some(marked) = mark_end(h, body).filter(|&m| m > stop) {
                return Err(marked_after(path, stop, mark_at, marked));
            }
            // A group's parts count as their storages' records; a malformed group proves
            // nothing.
            for_each_part(h, body, |h, _| match last.get(&h.storage_id) {
                // An apply step holds two txn ids: its first must skip past `t + 1`.
                Some(&t) if h.kind.is_commit() && h.first_txn() >= t.saturating_add(2) => {
                    Err(synced_after(
                        path,
                        stop,
                        format!(
                            "storage {:#x} has txn {t} before it and txn {} after it",
                            h.storage_id, h.txn_id
                        ),
                    ))
                }
                _ => Ok(()),
            })
            .unwrap_or(Ok(()))
        })?;
        at = (end.max(at) / BATCH_ALIGN + 1) * BATCH_ALIGN;
    }
    Ok(())
}
