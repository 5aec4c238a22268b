//! Journal replay at open (design.md 6, step 7): a storage's own records after its durable
//! header, in txn order across files, rebuilt into the scratch table, and the start statements
//! checked (design.md 3.8).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use crate::env::{OpenMode, StorageEnv};
use crate::error::{Error, Result};
use crate::journal::diff::apply_ranges;
use crate::journal::record::{
    decode_commit, decode_logical, decode_start, split_step, PageRecord, RecordKind,
    RECORD_HEADER_LEN,
};
use crate::journal::recovery;
use crate::page::header::Header;
use crate::page::{self, PAGE_SIZE};
use crate::state::{ScratchPage, State};

/// What [`recover`] read.
pub(crate) struct Recovered {
    /// Per journal file, the highest txn id of each storage in it.
    pub files: BTreeMap<u64, HashMap<u64, u64>>,
    /// `(journal number, offset)` where the records taken end: the end of the valid records of
    /// the newest file scanned, or the cut when one was given in that file. A reader's next
    /// catch-up starts there.
    pub end: (u64, u64),
    /// This storage's records replayed into the state.
    pub records: u64,
}

/// Replays the commit records of the storage of header `hdr` after `state.flushed_txn` into
/// the scratch table (design.md invariant I7) and returns, per journal file, the highest txn id of
/// each storage. The files are those of `dir` and, where `dir` lacks their number, `borrowed`
/// ones. Then checks the journal's start statements (`check_started`). `cut`: `(file,
/// offset)` of a database's one point (design.md 6.5): files numbered above it are not read,
/// and records at or past the offset in it are left out. `from`: `(file, offset)` where an
/// earlier replay into `state` ended (a read-only storage's catch-up under the same durable
/// header, design.md 6.5): files numbered below it are not read, that file is read from the
/// offset, records at or below `state.txn_id` are skipped, and the start statements, checked
/// by that earlier replay, are not checked again.
pub(super) fn recover(
    env: &dyn StorageEnv,
    dir: &Path,
    borrowed: &[(u64, PathBuf)],
    hdr: &Header,
    state: &mut State,
    cut: Option<(u64, u64)>,
    from: Option<(u64, u64)>,
) -> Result<Recovered> {
    let storage_id = hdr.storage_id;
    // INFO, once per open: the records of this storage replayed (after its durable header)
    // and their bytes (headers included), and the whole recovery's time (every file scanned,
    // deferred diffs applied, start statements checked), recorded at its end.
    let span = tracing::info_span!(
        "recover",
        storage = %dir.display(),
        files = tracing::field::Empty,
        records = tracing::field::Empty,
        bytes = tracing::field::Empty,
        us = tracing::field::Empty,
    );
    let _in = span.enter();
    let started = std::time::Instant::now();
    let (mut replayed, mut replayed_bytes) = (0u64, 0u64);
    let mut files = BTreeMap::new();
    // Journal number -> (path, length) of every file scanned, and the start records this
    // storage's own journal wrote: (file started, its durable length).
    let mut lens: BTreeMap<u64, (PathBuf, u64)> = BTreeMap::new();
    let mut starts: Vec<(u64, u64)> = Vec::new();
    let data_path = state.path().to_path_buf();
    let mut list = recovery::list(env, dir)?;
    for (no, path) in borrowed {
        if !list.iter().any(|(n, _)| n == no) {
            tracing::info!(file = %path.display(), storage = %dir.display(), "reading a journal file through another name: the storage's own is missing");
            list.push((*no, path.clone()));
        }
    }
    list.sort();
    if let Some((file, _)) = cut {
        list.retain(|(no, _)| *no <= file);
    }
    if let Some((file, _)) = from {
        list.retain(|(no, _)| *no >= file);
    }
    if let Some((file, _)) = from.filter(|(f, _)| *f != 0) {
        if !list.iter().any(|(no, _)| *no == file) {
            // Released since (only after a flush, which moved the header): the caller reads
            // everything again.
            return Err(Error::InvalidOptions(format!(
                "journal file {file} is gone: the catch-up reads the journal again"
            )));
        }
    }
    let base_txn = state.txn_id;
    let mut end_at = from.unwrap_or((0, 0));
    // Free-space bitmap pages journaled as diffs of their own previous version (design.md 3.2)
    // whose chain starts at the data file's copy (no replayed record holds the page): page ->
    // its diffs `(txn, ranges)` in order. That copy may be torn by a flush whose header never
    // became durable: a mix of the header's version and a later one, each byte from one of
    // them. Applying every diff since the header to it still gives the exact page: a byte some
    // later transaction changed is set by the last diff that covers it (a diff covers every
    // byte its transaction changed), and a byte none changed is equal in every version since
    // the header. So the chain is applied once, at the end, to the copy as it is, and only the
    // result's checksum is checked (a damaged copy, not a torn one, still fails there).
    let mut deferred: HashMap<u64, Vec<(u64, OwnedRanges)>> = HashMap::new();
    for (no, path) in list {
        let mut per: HashMap<u64, u64> = HashMap::new();
        let known = [(storage_id, state.txn_id)];
        let start = from.filter(|(f, _)| *f == no).map_or(0, |(_, o)| o);
        let end = recovery::scan_from(env, &path, no, &known, start, |h, body, offset| {
            if cut.is_some_and(|(file, at)| no == file && offset >= at) {
                return Ok(());
            }
            if h.kind == RecordKind::Start && h.storage_id == storage_id {
                // A start record this storage's journal wrote (another owner's, in a shared
                // file hard-linked into a branch, says nothing about this directory).
                match decode_start(body) {
                    Some(s) => starts.push(s),
                    None => {
                        return Err(Error::corruption(
                            &path,
                            None,
                            Some(offset),
                            "malformed journal start record",
                        ))
                    }
                }
            }
            if !h.kind.is_commit() {
                return Ok(());
            }
            let m = per.entry(h.storage_id).or_insert(0);
            *m = (*m).max(h.txn_id);
            if h.storage_id != storage_id {
                return Ok(());
            }
            if h.txn_id <= state.flushed_txn || (from.is_some() && h.txn_id <= base_txn) {
                return Ok(());
            }
            replayed += 1;
            replayed_bytes += (RECORD_HEADER_LEN + body.len()) as u64;
            let bad = |what: String| Error::corruption(&path, None, Some(offset), what);
            // An apply step takes two txn ids: its pages `txn - 1`, then the entries it left
            // buffered `txn` (design.md 3.10). Its pages may be flushed already (a flush records
            // the page txn): then only the buffer is replayed.
            let (page_txn, body, carried) = if h.kind == RecordKind::Step {
                let malformed = || bad("malformed apply step record".into());
                let (commit, logical) = split_step(body).ok_or_else(malformed)?;
                let carried = decode_logical(logical).ok_or_else(malformed)?;
                (
                    h.txn_id.checked_sub(1).ok_or_else(malformed)?,
                    commit,
                    Some(carried),
                )
            } else {
                (h.txn_id, body, None)
            };
            let pages = h.kind != RecordKind::Logical && page_txn > state.flushed_txn;
            let first = if pages { page_txn } else { h.txn_id };
            if first != state.txn_id + 1 {
                return Err(bad(format!(
                    "journal txn ids are not contiguous: expected {}, found {}",
                    state.txn_id + 1,
                    first
                )));
            }
            if h.kind == RecordKind::Logical {
                // A buffered commit: its operations go back into the buffer (design.md 16).
                let ops =
                    decode_logical(body).ok_or_else(|| bad("malformed logical record".into()))?;
                put_buffered(state, &ops);
                state.txn_id = h.txn_id;
                return Ok(());
            }
            if pages {
                replay_pages(state, &mut deferred, page_txn, body, &data_path, &bad)?;
            }
            if let Some(carried) = carried {
                // The buffer after the step: exactly the entries it carried, over a tree that
                // holds the rest (the sweep starts again at the first key).
                state.buffer = Default::default();
                state.buffer_bytes = 0;
                state.buffer_since = None;
                state.sweep = None;
                if !carried.is_empty() {
                    put_buffered(state, &carried);
                    state.sweep = Some(crate::buffer::Sweep { from: None });
                }
            }
            state.txn_id = h.txn_id;
            Ok(())
        })?;
        files.insert(no, per);
        let taken = match cut {
            Some((file, at)) if file == no => end.offset.min(at),
            _ => end.offset,
        };
        end_at = (no, taken.max(start));
        lens.insert(no, (path, end.len));
    }
    // The deferred chains, on the data file's copies (see `deferred` above).
    let mut pending: Vec<_> = deferred.into_iter().collect();
    pending.sort_unstable_by_key(|(p, _)| *p);
    for (p, diffs) in pending {
        let bad = |what: &str| Error::corruption(&data_path, Some(p), None, what);
        let base = state
            .mapping
            .span(p, 1)
            .ok_or_else(|| bad("the base of a free-space page diff is beyond the data file"))?;
        let mut page_img = base.to_vec();
        let mut txn = state.flushed_txn;
        // Bounded by the records replayed.
        for (t, ranges) in diffs {
            apply_ranges(&mut page_img, &ranges)
                .ok_or_else(|| bad("a page diff does not fit its page"))?;
            txn = t;
        }
        page::check_image(&page_img, p, &data_path)?;
        put_scratch(state, p, txn, crate::page::Image::copy_from(&page_img));
    }
    if from.is_none() {
        check_started(
            env,
            dir,
            borrowed,
            &lens,
            (hdr.journal_started, hdr.journal_started_len),
            &starts,
        )?;
    }
    span.record("files", files.len() as u64);
    span.record("records", replayed);
    span.record("bytes", replayed_bytes);
    span.record(
        "us",
        u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
    );
    // The event that closes the span, at DEBUG: INFO stays quiet for an open with nothing to
    // replay (the `replayed journal` event says when there was).
    tracing::debug!("recovered");
    Ok(Recovered {
        files,
        end: end_at,
        records: replayed,
    })
}

/// Replays the page commit `txn` of body `body` (a commit body, kind 1's or an apply step's)
/// into `state`: its page images into the scratch table (free-space page diffs whose chain
/// starts at the data file's copy into `deferred`), its tree into the state, and an empty
/// buffer (a page commit holds every buffered entry before it, invariant I13; an apply step
/// then puts back what it carried). `bad` builds the error for a malformed record.
fn replay_pages(
    state: &mut State,
    deferred: &mut HashMap<u64, Vec<(u64, OwnedRanges)>>,
    txn: u64,
    body: &[u8],
    data_path: &Path,
    bad: &dyn Fn(String) -> Error,
) -> Result<()> {
    let (meta, images) =
        decode_commit(body).ok_or_else(|| bad("malformed commit record".into()))?;
    state.buffer = Default::default();
    state.buffer_bytes = 0;
    state.buffer_since = None;
    state.sweep = None;
    for (p, rec) in images {
        match &rec {
            PageRecord::Diff { base, ranges }
                if *base == p && (deferred.contains_key(&p) || !state.scratch.contains_key(&p)) =>
            {
                let owned = ranges.iter().map(|(o, b)| (*o, b.to_vec())).collect();
                deferred.entry(p).or_default().push((txn, owned));
                continue;
            }
            // A full image: whatever was deferred for the page is superseded.
            PageRecord::Full(_) => {
                deferred.remove(&p);
            }
            PageRecord::Diff { .. } => {}
        }
        let scratch = &state.scratch;
        // A diff's base: its latest replayed image, else the data file as of the header
        // (intact: its reuse waited for a durable header past this transaction).
        let mapping = &state.mapping;
        let mut base_err = None;
        let img = rec
            .rebuild(|b| match scratch.get(&b) {
                Some(sp) => Some(&sp.image[..]),
                None => match mapping.page(b, false) {
                    Ok((img, _)) => Some(img),
                    Err(e) => {
                        base_err = Some(format!("its base page {b}: {e}"));
                        None
                    }
                },
            })
            .ok_or_else(|| {
                let why = base_err
                    .take()
                    .unwrap_or_else(|| "it does not fit its base".into());
                bad(format!("page {p} is journaled as a page diff, and {why}"))
            })?;
        page::check_image(&img, p, data_path)?;
        let image = crate::page::Image::copy_from(&img);
        let run = (image.len() / PAGE_SIZE) as u64;
        deferred.retain(|q, _| !(p + 1..p + run).contains(q));
        put_scratch(state, p, txn, image);
    }
    state.txn_id = txn;
    state.tree_txn = txn;
    state.root = meta.root;
    state.freedir = meta.freedir;
    state.next_page = meta.next_page;
    state.entries = meta.entries;
    state.len_delta = Default::default();
    Ok(())
}

/// Puts the replayed image of page `p` (written by `txn`) into `state`'s scratch table, with
/// its byte count. Replay does not know the pages each commit freed (`publish_commit` drops
/// them from the scratch table): an older image that starts inside this run was freed since,
/// and must go, or the flush (in page order) writes it over the run.
fn put_scratch(state: &mut State, p: u64, txn: u64, image: crate::page::SharedImage) {
    let run = (image.len() / PAGE_SIZE) as u64;
    let inside: Vec<u64> = state
        .scratch
        .folded()
        .range(p + 1..p + run)
        .map(|(q, _)| q)
        .collect();
    for q in inside {
        if let Some(old) = state.scratch.remove(&q) {
            state.scratch_bytes -= old.image.len() as u64;
        }
    }
    state.scratch_bytes += image.len() as u64;
    if let Some(old) = state.scratch.insert(p, ScratchPage { txn, image }) {
        state.scratch_bytes -= old.image.len() as u64;
    }
}

/// Puts the operations of a replayed logical record into `state`'s write buffer, newest last.
fn put_buffered(state: &mut State, ops: &[(&[u8], Option<&[u8]>)]) {
    // The count the state cached (a catch-up replays onto a state a reader counted) no longer
    // holds: it is counted again when wanted.
    state.len_delta = Default::default();
    let delta = state.buffer.push_unsorted(ops.to_vec());
    state.buffer_bytes = state.buffer_bytes.saturating_add_signed(delta);
    state
        .buffer_since
        .get_or_insert_with(std::time::Instant::now);
}

/// The `(offset, bytes)` ranges of a page diff, owned (kept past their record's body).
type OwnedRanges = Vec<(usize, Vec<u8>)>;

/// Checks the start statements of the journal a storage owns (docs/design.md, 3.8 and
/// section 6): `header` is its header's `(file, length)` (file 0: none), `starts` the
/// `(file, length)` of the start records its journal wrote into the files scanned, `files` the
/// path and length of every journal file scanned (own names and borrowed ones). Every file
/// numbered at or above the header's must exist when a statement names it, and be at least as
/// long as stated: the header's length for its own file (newer than any start record about it),
/// the longest start record's for later ones. Statements about files below the header's are
/// ignored: those files may have been released since. A stated file that was not scanned is
/// looked up again in `dir` (then among `borrowed`) before it is called missing
/// ([`stated_file`]).
///
/// Errors: [`Error::Corruption`] naming the missing or short file. A power loss cannot cause
/// either: a statement is made only after its file's creation, zeros and directory entry are
/// synced, and a file at or above the durable statement is never released. The I/O error of
/// looking a file up again, other than its absence.
fn check_started(
    env: &dyn StorageEnv,
    dir: &Path,
    borrowed: &[(u64, PathBuf)],
    files: &BTreeMap<u64, (PathBuf, u64)>,
    header: (u64, u64),
    starts: &[(u64, u64)],
) -> Result<()> {
    let (first, first_len) = header;
    if first == 0 {
        return Ok(());
    }
    let mut stated: BTreeMap<u64, u64> = BTreeMap::new();
    stated.insert(first, first_len);
    for &(no, len) in starts.iter().filter(|(no, _)| *no > first) {
        let l = stated.entry(no).or_insert(0);
        *l = (*l).max(len);
    }
    for (no, len) in stated {
        match stated_file(env, dir, borrowed, files, no)? {
            None => {
                return Err(Error::corruption(
                    dir.join(crate::journal::file_name(no)),
                    None,
                    None,
                    format!(
                        "the journal file is missing (every name of it deleted): it was started \
                         with {len} durable bytes, and unflushed commits in it are lost"
                    ),
                ))
            }
            Some((path, have)) if have < len => {
                return Err(Error::corruption(
                    path,
                    None,
                    Some(have),
                    format!(
                        "the journal file was cut short: it is {have} bytes, but it was started \
                         with {len} durable bytes; records in it may be lost"
                    ),
                ))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// The path and length of journal file `no` for [`check_started`]: as scanned (`files`), else
/// looked up again by name, in `dir` first, then among `borrowed` names; `None` when no name of
/// it exists now.
///
/// Why again: the files scanned were listed once, before the scan. Beside a live writer (a
/// read-only open in another process, design.md 6.5) the writer may start the next file after
/// that listing and write its start record into a file the reader then scans: the statement is
/// read, the file was never listed. The record is written only once the new file's name and
/// zeros are durable, so a file that truly lost every name is still missing when looked up
/// again, and is reported as before.
///
/// Errors: the I/O error of opening a name that exists, or of reading its length.
fn stated_file(
    env: &dyn StorageEnv,
    dir: &Path,
    borrowed: &[(u64, PathBuf)],
    files: &BTreeMap<u64, (PathBuf, u64)>,
    no: u64,
) -> Result<Option<(PathBuf, u64)>> {
    if let Some((path, len)) = files.get(&no) {
        return Ok(Some((path.clone(), *len)));
    }
    let names = std::iter::once(dir.join(crate::journal::file_name(no))).chain(
        borrowed
            .iter()
            .filter(|(n, _)| *n == no)
            .map(|(_, p)| p.clone()),
    );
    for path in names {
        match env.open(&path, OpenMode::ReadOnly) {
            Ok(f) => {
                let len = f.len()?;
                tracing::debug!(file = %path.display(), "a stated journal file started after the listing");
                return Ok(Some((path, len)));
            }
            Err(e) if e.source.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(None)
}
