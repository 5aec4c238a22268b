//! The flush: writing committed pages from the scratch table into the data file (DESIGN
//! section 6 and invariant 4).
//!
//! 1. Target: the oldest live snapshot's state, or the current one (all published states are
//!    durable). The flush holds that state, so no page it writes can be reused meanwhile.
//! 2. Its scratch pages not yet flushed, in page order, adjacent ones merged into one
//!    `pwritev` (at most 1,024 slices and 64 MiB a call).
//! 3. `fdatasync` the data file; write the alternate header page; `fdatasync` again.
//! 4. Publish a state without the flushed scratch entries (and a new map if the file grew).
//! 5. Punch every aligned 1 MiB run that the target's free-space map marks wholly free
//!    (DESIGN invariant 12: the durable header now records them free, no snapshot reads them).
//! 6. Delete journal files that hold nothing unflushed.
//!
//! Any failed write or sync poisons the storage (DESIGN invariant 2).

use std::io::IoSlice;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::freespace::{free_runs, RUN_PAGES};
use crate::page::header::Header;
use crate::page::PAGE_SIZE;
use crate::state::{Mapping, State};
use crate::storage::{for_each_bitmap, lock, Inner};

/// Bytes per `pwritev` call at most.
const MAX_WRITE: u64 = 64 << 20;

/// What one flush did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlushOutcome {
    /// Transaction id the data file and header now reach.
    pub flushed_txn: u64,
    /// Pages written.
    pub pages_written: u64,
    /// Runs punched by this flush.
    pub runs_punched: u64,
    /// Journal files deleted.
    pub journals_deleted: u64,
}

/// Flushes `inner` up to the oldest live snapshot. See the module doc.
pub(crate) fn flush(inner: &Inner) -> Result<FlushOutcome> {
    let mut fs = lock(&inner.flush_state);
    if let Some(cause) = inner.poisoned() {
        return Err(Error::Poisoned { cause });
    }
    let cur = inner.current.load_full();
    let target: Arc<State> = match inner.registry.oldest_live() {
        Some(s) if s.txn_id < cur.txn_id => s,
        _ => cur.clone(),
    };
    drop(cur);
    let mut out = FlushOutcome {
        flushed_txn: target.txn_id,
        ..Default::default()
    };
    let already = inner.current.load().flushed_txn;
    if target.txn_id > already {
        let r = write_pages(inner, &target, already).and_then(|n| {
            out.pages_written = n;
            inner.data.sync_data()?;
            let slot = 1 - fs.header_slot;
            let h = Header {
                sequence: fs.header_seq + 1,
                storage_id: inner.storage_id,
                flushed_txn: target.txn_id,
                root: target.root,
                freedir: target.freedir,
                next_page: target.next_page,
                entries: target.entries,
            };
            let img = h.encode(slot);
            debug_assert!(crate::page::verify_checksum(&img));
            inner.data.write_all_at(&img, slot * PAGE_SIZE as u64)?;
            inner.data.sync_data()?;
            fs.header_seq += 1;
            fs.header_slot = slot;
            Ok(())
        });
        if let Err(e) = r {
            inner.poison(&e);
            return Err(e);
        }
        let len = inner.file_len.load(Ordering::Acquire);
        let mapping = if len > inner.current.load().mapping.len() {
            Some(Arc::new(Mapping::new(
                &inner.data,
                len,
                inner.data_path.clone(),
            )?))
        } else {
            None
        };
        inner.publish_flush(target.txn_id, mapping);
        inner.flushes.fetch_add(1, Ordering::Relaxed);
    }
    if fs.punching && target.txn_id <= inner.current.load().flushed_txn {
        out.runs_punched = punch(inner, &mut fs, &target)?;
    }
    let flushed = inner.current.load().flushed_txn;
    out.journals_deleted = inner.journal.release(inner.storage_id, flushed)?.len() as u64;
    Ok(out)
}

/// Writes the target's unflushed scratch pages (txn > `already`), merging adjacent ones.
fn write_pages(inner: &Inner, target: &State, already: u64) -> Result<u64> {
    let mut written = 0u64;
    let mut run: Vec<IoSlice<'_>> = Vec::new();
    let mut run_start = 0u64;
    let mut run_end = 0u64;
    let mut run_bytes = 0u64;
    for (p, sp) in target.scratch.iter() {
        if sp.txn <= already {
            continue;
        }
        let pages = (sp.image.len() / PAGE_SIZE) as u64;
        debug_assert!(
            crate::page::verify_checksum(&sp.image),
            "scratch page {p} unsealed"
        );
        if run.is_empty()
            || *p != run_end
            || run.len() >= crate::env::IOV_MAX_SLICES
            || run_bytes >= MAX_WRITE
        {
            if !run.is_empty() {
                inner
                    .data
                    .write_vectored_all_at(&run, run_start * PAGE_SIZE as u64)?;
                run.clear();
            }
            run_start = *p;
            run_end = *p;
            run_bytes = 0;
        }
        run.push(IoSlice::new(&sp.image));
        run_end += pages;
        run_bytes += sp.image.len() as u64;
        written += pages;
    }
    if !run.is_empty() {
        inner
            .data
            .write_vectored_all_at(&run, run_start * PAGE_SIZE as u64)?;
    }
    Ok(written)
}

/// Punches the aligned 1 MiB runs wholly free in `target`'s map and not punched yet.
fn punch(inner: &Inner, fs: &mut crate::storage::FlushState, target: &State) -> Result<u64> {
    let mut runs = Vec::new();
    for_each_bitmap(target, |idx, words| {
        runs.extend(free_runs(idx, words, target.next_page))
    })?;
    let now: std::collections::BTreeSet<u64> = runs.into_iter().collect();
    fs.punched.retain(|r| now.contains(r));
    let mut n = 0;
    for r in now {
        if fs.punched.contains(&r) {
            continue;
        }
        let off = r * RUN_PAGES * PAGE_SIZE as u64;
        match inner.data.punch_hole(off, RUN_PAGES * PAGE_SIZE as u64) {
            Ok(()) => {
                fs.punched.insert(r);
                n += 1;
            }
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                tracing::warn!(path = %inner.data_path.display(), "file system cannot punch holes; free space stays allocated");
                fs.punching = false;
                break;
            }
            Err(e) => {
                let e: Error = e.into();
                inner.poison(&e);
                return Err(e);
            }
        }
    }
    inner.holes_punched.fetch_add(n, Ordering::Relaxed);
    Ok(n)
}
