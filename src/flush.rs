//! The flush: writing committed pages from the scratch table into the data file (design.md
//! section 5 and invariant I4).
//!
//! 1. Target: the oldest live snapshot's state, or the current one (all published states are
//!    durable). The flush holds that state, so no page it writes can be reused meanwhile.
//! 2. Its scratch pages not yet flushed, in page order, adjacent ones merged into one
//!    `pwritev` (at most 1,024 slices and 64 MiB a call).
//! 3. `fdatasync` the data file; write the alternate header page; `fdatasync` again.
//! 4. Publish a state without the flushed scratch entries (and a new map if the file grew).
//! 5. Punch the aligned 1 MiB runs that the target's free-space map marks wholly free
//!    (design.md invariant I12: the durable header now records them free, no snapshot reads them),
//!    except the lowest ones that the next commits are expected to reuse (at most 1/32 of
//!    the pages in use; none when the storage is closing, see [`punch_slack_runs`]).
//! 6. Delete journal files that hold nothing unflushed.
//!
//! Any failed write or sync poisons the storage (design.md invariant I2).
//!
//! Background flushes ([`crate::FlushMode::Background`]) run on one flush-service thread per
//! process (`omnibus-flush`, I/O priority best-effort 7) that serves every such storage, not a
//! thread per storage: a database of 100+ storages costs one thread, and no per-storage thread
//! sits in the way of the writers (each extra thread that reads the state pointer makes every
//! commit's pointer swap slower: arc-swap's store walks every thread's debt slots).
//!
//! This module builds on `storage.rs`, never the other way: a storage calls the flush through
//! the `FlushHooks` it was opened with, which this module supplies from [`Storage::open`]
//! and `open_storage` (a storage's open ends with the flush of what recovery replayed).

use std::io::IoSlice;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::freespace::{free_runs, RUN_PAGES};
use crate::options::{FlushMode, Options};
use crate::page::header::Header;
use crate::page::PAGE_SIZE;
use crate::state::{Mapping, State};
use crate::storage::{for_each_bitmap, lock, Binding, FlushHooks, FlushReport, Inner, Storage};

/// The lowest wholly free 1 MiB runs a flush leaves unpunched ("punch slack"): the writer
/// allocates the lowest free pages first, and the next commits will allocate about as many
/// pages as the last flushed ones did (`reuse_slack`: copy-on-write frees and reallocates every
/// page a transaction changes), so punching those runs would only make the next commits write
/// into holes again (block allocation, discards). The slack is capped at 1/32 of the pages in
/// use ([`SLACK_DIVISOR`]): a storage whose few live pages were rewritten many times between
/// two flushes (2,000 keys over 287 commits: 110 pages in use, 6,161 free), or that was loaded
/// and then half deleted between two flushes, allocated far more than it will reuse, and
/// keeping all of that unpunched kept the whole file on disk. A closing storage keeps no slack:
/// no commit follows.
pub(crate) fn punch_slack_runs(reuse_slack: u64, used_pages: u64, closing: bool) -> u64 {
    if closing {
        return 0;
    }
    reuse_slack.min(used_pages / SLACK_DIVISOR) / RUN_PAGES
}

/// The punch slack is at most the pages in use divided by this: after a 50% delete (as many
/// pages free as in use) at least 1 - 1/32 = 97% of the free aligned runs are punched.
const SLACK_DIVISOR: u64 = 32;

/// Bytes per `pwritev` call at most.
const MAX_WRITE: u64 = 64 << 20;
/// Bytes of runs a flush writes, and then waits to see written back (`sync_file_range` with
/// `WAIT_AFTER`), before the next chunk: the device never holds more than one chunk of a flush
/// ahead of a journal `fdatasync` (1 MiB: about 1.5 ms at this machine's 700 MiB/s).
const CHUNK_BYTES: u64 = 1 << 20;
/// The chunk while the journal is idle: writeback is started, not waited for.
const IDLE_CHUNK_BYTES: u64 = 16 << 20;
/// While the journal is busy (a batch in flight, or one ended within [`JOURNAL_QUIET`]), a flush
/// waits before its next chunk, up to this many times the last chunk's time (so a flush keeps
/// at least a twentieth of its speed under a steady stream of commits) and at most
/// [`MAX_YIELD`]. Measured with the doubling naps of [`yield_while`] (docs/BENCHMARKS.md):
/// 9 gave serial commits 0.83-0.87x of their idle rate on the io_uring path, 14 gave
/// 0.87-0.88x, 19 gave 0.94-0.97x: the device time a flush chunk holds delays the journal's
/// next `fdatasync`.
const YIELD_FACTOR: u32 = 19;
/// How recently a journal batch must have ended for the journal to count as busy.
const JOURNAL_QUIET: Duration = Duration::from_millis(1);
/// The longest a flush waits before one chunk.
const MAX_YIELD: Duration = Duration::from_millis(50);

/// The first nap of [`yield_to_journal`]; each later one is twice as long (up to the budget).
const FIRST_NAP: Duration = Duration::from_micros(200);

/// Waits (bounded, see [`YIELD_FACTOR`]) while the journal is busy. Returns the time waited.
fn yield_to_journal(last_chunk: Duration) -> Duration {
    let budget = (last_chunk * YIELD_FACTOR).min(MAX_YIELD);
    let t0 = Instant::now();
    yield_while(
        budget,
        || crate::journal::activity::busy_within(JOURNAL_QUIET),
        || t0.elapsed(),
        std::thread::sleep,
    );
    t0.elapsed()
}

/// Sleeps while `busy()` and the `budget` is not spent (`elapsed()` since the start), in naps
/// that start at [`FIRST_NAP`] and double, each cut to what is left of the budget. Returns the
/// number of naps.
///
/// Why doubling: under a steady stream of serial commits the journal stays busy for the whole
/// budget (about 30 ms), and a flush that rechecked every 200 µs woke up 5,000 times a second.
/// On this 2-core VM those wake-ups cost the committing threads more than the disk the flush
/// gave up: serial commits ran at 0.73-0.85x of idle during a flush, with 20-50 µs more
/// process CPU per commit; with doubling naps (at most 8 per pause: 200 µs doubled up to
/// [`MAX_YIELD`]) 0.94-0.98x at the same flush speed (docs/BENCHMARKS.md). A journal that goes
/// quiet mid-nap costs the flush at most the time it had already waited, plus 200 µs.
fn yield_while(
    budget: Duration,
    mut busy: impl FnMut() -> bool,
    elapsed: impl Fn() -> Duration,
    mut sleep: impl FnMut(Duration),
) -> u32 {
    let mut nap = FIRST_NAP;
    let mut naps = 0;
    // Bounded: each nap is at least FIRST_NAP (or the rest of the budget), and ends the loop
    // once the budget is spent.
    while busy() {
        let left = budget.saturating_sub(elapsed());
        if left.is_zero() {
            break;
        }
        sleep(nap.min(left));
        naps += 1;
        nap = nap.saturating_mul(2);
    }
    naps
}

// ---- opening: a storage's flush entry points ------------------------------------------------

/// The flush as every storage calls it (see [`FlushHooks`]).
static HOOKS: FlushHooks = FlushHooks {
    opened,
    flush,
    signal: signal_service,
};

impl Storage {
    /// Opens the storage in directory `path`, creating it when it is missing or empty (unless
    /// [`Options::create`] is false), and recovers every commit the journal holds.
    ///
    /// A read-only open ([`Options::read_only`]) succeeds beside a live writer in another
    /// process: it takes a slot in the storage's reader table and reads one committed state
    /// (design.md 6.5; [`Storage::catch_up`] reads a newer one).
    ///
    /// Errors: [`Error::AlreadyOpen`] when another read-write opener (handle or process) holds
    /// it, or a read-write open while read-only openers that could not write `LOCK` hold its
    /// shared `flock`; [`Error::TooManyReaders`] for a read-only open when every reader slot
    /// is live;
    /// [`Error::NotAStorage`] for a non-empty directory without a data file, or a data file
    /// without the omnibus header; [`Error::FormatVersion`]; [`Error::Corruption`] when both
    /// header pages are damaged or the journal's txn ids are not contiguous;
    /// [`Error::InvalidOptions`]; I/O errors with the operation and path.
    pub fn open(path: impl AsRef<Path>, opts: Options) -> Result<Storage> {
        open_storage(
            path.as_ref(),
            opts,
            Binding::Own {
                lock: None,
                borrowed: Vec::new(),
                at: None,
            },
        )
    }
}

/// Opens the storage in `path`, bound to a journal as `binding` says, with this module's flush
/// (as [`Storage::open`] does for a standalone storage).
pub(crate) fn open_storage(path: &Path, opts: Options, binding: Binding) -> Result<Storage> {
    Storage::open_with(path, opts, binding, &HOOKS)
}

/// [`FlushHooks::opened`]: once a writable storage is recovered, writes what was replayed to
/// the data file and drops journal files fully flushed, makes both header slots hold the newest
/// header, and joins the flush service when the storage flushes in the background.
fn opened(inner: &Arc<Inner>) -> Result<()> {
    flush(inner)?;
    mirror_header(inner)?;
    if inner.opts.flush_mode == FlushMode::Background {
        let tick = (inner.opts.flush_max_age / 4)
            .clamp(Duration::from_millis(10), Duration::from_millis(200));
        let membership = Membership::join(inner, tick);
        *lock(&inner.flusher) = Some(Box::new(move || membership.leave()));
    }
    Ok(())
}

// ---- the flush ------------------------------------------------------------------------------

/// Flushes `inner` up to the oldest live snapshot. See the module doc.
pub(crate) fn flush(inner: &Inner) -> Result<FlushReport> {
    // DEBUG (a flush runs every few seconds in steady state); the fields after the target
    // are recorded once known, `us` at the end. Its events (punching) nest in it.
    let span = tracing::debug_span!(
        "flush",
        path = %inner.data_path.display(),
        txn = tracing::field::Empty,
        pages = tracing::field::Empty,
        bytes = tracing::field::Empty,
        write_mode = tracing::field::Empty,
        us = tracing::field::Empty,
    );
    let _in = span.enter();
    let started = Instant::now();
    let mut fs = lock(&inner.flush_state);
    if let Some(cause) = inner.poisoned() {
        return Err(Error::Poisoned { cause });
    }
    let cur = inner.current.load_full();
    let target: Arc<State> = match inner.registry.oldest_live() {
        Some(s) if s.txn_id < cur.txn_id => s,
        _ => cur.clone(),
    };
    let mut out = FlushReport {
        flushed_txn: target.tree_txn,
        ..Default::default()
    };
    if target.txn_id < cur.txn_id {
        // A snapshot holds the flush back: what it keeps in the scratch table.
        out.limited_by_snapshot = Some(target.txn_id);
        for sp in cur
            .scratch
            .folded()
            .values()
            .filter(|sp| sp.txn > target.txn_id)
        {
            out.pages_held_back += (sp.image.len() / PAGE_SIZE) as u64;
            out.bytes_held_back += sp.image.len() as u64;
        }
    }
    drop(cur);
    // The header records the target's last page commit: a buffered storage's logical commits
    // after it are in the journal only, and stay there (design.md section 16).
    let flush_txn = target.tree_txn;
    let already = inner.current.load().flushed_txn;
    let closing = inner.closing.load(Ordering::Acquire);
    if flush_txn > already {
        // From now on a page written at or below the target may reach the data file: it can
        // no longer be reused before a durable header passes the txn that freed it.
        inner.flush_started.fetch_max(flush_txn, Ordering::AcqRel);
        // Pages freed up to here become reusable once this flush's header is durable.
        inner.freed_unflushed.store(0, Ordering::Relaxed);
        fs.reuse_slack = inner.allocated_unflushed.swap(0, Ordering::Relaxed);
        // Eventual commits up to the target reach the journal first: a header never gets
        // ahead of the journal's durable order (docs/design.md, section 4.2).
        let r = inner
            .journal
            .sync_queued()
            .and_then(|()| write_pages(inner, &target, already))
            .and_then(|n| {
                out.pages_written = n;
                out.bytes_written = n * PAGE_SIZE as u64;
                inner.data.sync_data()?;
                let stated = start_statement(inner, flush_txn, closing);
                let h = Header {
                    sequence: fs.header_seq,
                    storage_id: inner.storage_id,
                    flushed_txn: flush_txn,
                    root: target.root,
                    freedir: target.freedir,
                    next_page: target.next_page,
                    entries: target.entries,
                    journal_started: stated.0,
                    journal_started_len: stated.1,
                };
                // The older slot first, then the other: once the flush is done both slots hold
                // this header, so one damaged header page loses nothing (its twin is identical).
                // Journal files and freed pages are released only after both writes, so while the
                // flush runs the older header stays a complete fallback.
                for _ in 0..2 {
                    write_header(inner, &mut fs, h)?;
                }
                if inner.journal.owner() == inner.storage_id {
                    inner.journal.note_statement(stated);
                }
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
                inner.map_end.clone(),
            )?))
        } else {
            None
        };
        inner.publish_flush(flush_txn, mapping);
        inner.flushes.fetch_add(1, Ordering::Relaxed);
        inner
            .pages_flushed
            .fetch_add(out.pages_written, Ordering::Relaxed);
        let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        inner.flush_recorders.flush_us.record(us);
        inner.flush_recorders.flush_pages.record(out.pages_written);
        if !span.is_disabled() {
            span.record("txn", flush_txn);
            span.record("pages", out.pages_written);
            span.record("bytes", out.pages_written * PAGE_SIZE as u64);
            span.record(
                "write_mode",
                if out.pages_written > 0 {
                    inner.write_mode().0.name()
                } else {
                    "none"
                },
            );
            span.record("us", us);
            // The event that closes the span (the command line prints events, with their
            // spans' fields).
            tracing::debug!("flushed");
        }
    } else if !inner.opts.read_only {
        // Nothing to write, but the journal's start statement moved (a new session's first
        // file, a file started or let go since): a header with the new one, both slots.
        let stated = start_statement(inner, already, closing);
        if stated != (fs.header.journal_started, fs.header.journal_started_len) {
            let h = Header {
                journal_started: stated.0,
                journal_started_len: stated.1,
                ..fs.header
            };
            let r = (0..2).try_for_each(|_| write_header(inner, &mut fs, h));
            if let Err(e) = r {
                inner.poison(&e);
                return Err(e);
            }
        }
        if inner.journal.owner() == inner.storage_id {
            // Durable now, or already.
            inner.journal.note_statement(stated);
        }
    }
    // A reader in another process older than the target may read pages the target has free
    // (invariant I16): no punching until it moves on or closes. Dead readers' slots go first.
    if let Some(t) = inner.lock_file.table().filter(|_| !inner.opts.read_only) {
        if t.oldest().is_some() {
            if let Err(e) = t.sweep() {
                tracing::warn!(path = %inner.path.display(), error = %e, "clearing dead readers' slots failed");
            }
        }
    }
    if fs.punching
        && target.tree_txn <= inner.current.load().flushed_txn
        && inner.other_readers().is_none_or(|r| r >= target.txn_id)
    {
        out.runs_punched = punch(inner, &mut fs, &target)?;
    }
    let flushed = inner.current.load().flushed_txn;
    out.flushed_txn = flushed;
    out.journals_deleted = inner.journal.release(inner.storage_id, flushed)?.len() as u64;
    inner.journal.note_flushed(inner.storage_id, flushed);
    if closing {
        // The file grows in steps (up to 64 MiB past `next_page`); a closed storage keeps none.
        inner.trim_tail();
    }
    Ok(out)
}

/// The start statement (docs/design.md 3.8) the next header of `inner` carries once it has
/// flushed up to `flushed`: the journal's, when the storage owns its journal (a standalone
/// storage, a database's root, any storage in separate-journal mode); none for a branch of a
/// shared journal, whose files the root's statement covers.
fn start_statement(inner: &Inner, flushed: u64, closing: bool) -> (u64, u64) {
    if inner.journal.owner() == inner.storage_id {
        inner.journal.start_statement(flushed, closing)
    } else {
        (0, 0)
    }
}

/// Writes `h` (with the next sequence number) into the slot that does not hold the newest
/// header, then `fdatasync`s. Errors are the caller's to poison on.
fn write_header(inner: &Inner, fs: &mut crate::storage::FlushState, h: Header) -> Result<()> {
    let slot = 1 - fs.header_slot;
    let h = Header {
        sequence: fs.header_seq + 1,
        ..h
    };
    let img = h.encode(slot);
    debug_assert!(crate::page::verify_checksum(&img));
    // With the storage's write mode, as the pages it commits (io_ring: the background lane).
    let page = [IoSlice::new(&img)];
    inner.data.write_runs(
        &[(slot * PAGE_SIZE as u64, &page[..])],
        inner.write_mode().0,
    )?;
    inner.data.sync_data()?;
    fs.header_seq += 1;
    fs.header_slot = slot;
    fs.header = h;
    Ok(())
}

/// Makes the other header slot a copy of the newest header if it is not one already (damaged,
/// torn, or older: a database written before both slots were kept equal, or a crash between
/// a flush's two header writes). Called when a storage is opened for writing, after its first
/// flush. A damaged slot is logged. Errors poison the storage.
fn mirror_header(inner: &Inner) -> Result<()> {
    use crate::page::header::{decode, Slot};
    let mut fs = lock(&inner.flush_state);
    let cur = fs.header_slot;
    let pages = crate::storage::read_header_pages(&*inner.data, &inner.data_path)?;
    let Slot::Valid(newest) = decode(&pages[cur as usize], cur) else {
        return Err(Error::corruption(
            &*inner.data_path,
            Some(cur),
            None,
            "the header page in use no longer decodes",
        ));
    };
    let same = |o: &Header| {
        Header {
            sequence: newest.sequence,
            ..*o
        } == newest
    };
    // A storage written by a format 1 build: both slots get the current version before the
    // first commit (which may journal what a format 1 build does not read the same way).
    let older = pages.iter().any(|p| {
        crate::page::header::version_of(p).is_some_and(|v| v < crate::page::header::FORMAT_VERSION)
    });
    if older {
        tracing::info!(path = %inner.data_path.display(), to = crate::page::header::FORMAT_VERSION, "upgrading the data file's format version");
        for _ in 0..2 {
            if let Err(e) = write_header(inner, &mut fs, newest) {
                inner.poison(&e);
                return Err(e);
            }
        }
        return Ok(());
    }
    match decode(&pages[1 - cur as usize], 1 - cur) {
        Slot::Valid(o) if same(&o) => return Ok(()),
        Slot::Valid(_) => {}
        other => tracing::warn!(
            path = %inner.data_path.display(),
            slot = 1 - cur,
            state = ?other,
            "a header page was damaged or torn: rewriting it from its twin"
        ),
    }
    if let Err(e) = write_header(inner, &mut fs, newest) {
        inner.poison(&e);
        return Err(e);
    }
    Ok(())
}

/// Writes the target's unflushed scratch pages (txn > `already`), merging adjacent ones.
fn write_pages(inner: &Inner, target: &State, already: u64) -> Result<u64> {
    let mode = inner.write_mode().0;
    let mut written = 0u64;
    // Runs of adjacent pages as (first page, page images), written a chunk at a time with the
    // storage's write mode. While the journal is idle a chunk is IDLE_CHUNK_BYTES and its
    // writeback is only started, up to IDLE_CHUNK_BYTES * 2 queued on the device; while the
    // journal is busy a chunk is CHUNK_BYTES, preceded by a bounded pause and waited for on
    // the device: the flush yields the disk to commits (see `yield_to_journal`). Either way
    // the final fdatasync finds little left to write.
    let mut runs: Vec<(u64, Vec<IoSlice<'_>>)> = Vec::new();
    let mut run_end = 0u64;
    let mut run_bytes = 0u64;
    let mut chunk_bytes = 0u64;
    let mut last_chunk = Duration::ZERO;
    // Bytes whose writeback was started but not waited for: (lowest offset, highest end).
    let mut queued: Option<(u64, u64)> = None;
    let mut flush_chunk = |runs: &mut Vec<(u64, Vec<IoSlice<'_>>)>| -> Result<()> {
        if runs.is_empty() {
            return Ok(());
        }
        let busy = crate::journal::activity::busy_within(JOURNAL_QUIET);
        if busy {
            // Drain what idle chunks queued, then give the journal its turn.
            if let Some((lo, hi)) = queued.take() {
                inner.data.write_back(lo, hi - lo, true)?;
            }
            yield_to_journal(last_chunk);
        }
        let t0 = Instant::now();
        let refs: Vec<crate::env::Run<'_>> = runs
            .iter()
            .map(|(p, s)| (p * PAGE_SIZE as u64, &s[..]))
            .collect();
        inner.data.write_runs(&refs, mode)?;
        let lo = refs.iter().map(|r| r.0).min().unwrap_or(0);
        let hi = refs
            .iter()
            .map(|(o, s)| o + s.iter().map(|b| b.len() as u64).sum::<u64>())
            .max()
            .unwrap_or(lo);
        if busy {
            inner.data.write_back(lo, hi - lo, true)?;
        } else {
            inner.data.write_back(lo, hi - lo, false)?;
            let (qlo, qhi) = queued.map_or((lo, hi), |(a, b)| (a.min(lo), b.max(hi)));
            queued = Some((qlo, qhi));
            if qhi - qlo > 2 * IDLE_CHUNK_BYTES {
                // Keep at most about two idle chunks queued on the device.
                inner.data.write_back(qlo, qhi - qlo, true)?;
                queued = None;
            }
        }
        last_chunk = t0.elapsed();
        runs.clear();
        Ok(())
    };
    let scratch = target.scratch.folded();
    for (p, sp) in scratch.iter() {
        if sp.txn <= already {
            continue;
        }
        let pages = (sp.image.len() / PAGE_SIZE) as u64;
        debug_assert!(
            crate::page::verify_checksum(&sp.image),
            "scratch page {p} unsealed"
        );
        let new_run = match runs.last() {
            None => true,
            Some((_, r)) => {
                p != run_end || r.len() >= crate::env::IOV_MAX_SLICES || run_bytes >= MAX_WRITE
            }
        };
        if new_run {
            let limit = if crate::journal::activity::busy_within(JOURNAL_QUIET) {
                CHUNK_BYTES
            } else {
                IDLE_CHUNK_BYTES
            };
            if chunk_bytes >= limit {
                flush_chunk(&mut runs)?;
                chunk_bytes = 0;
            }
            runs.push((p, Vec::new()));
            run_end = p;
            run_bytes = 0;
        }
        if let Some((_, r)) = runs.last_mut() {
            r.push(IoSlice::new(&sp.image));
        }
        run_end += pages;
        run_bytes += sp.image.len() as u64;
        chunk_bytes += sp.image.len() as u64;
        written += pages;
    }
    flush_chunk(&mut runs)?;
    Ok(written)
}

/// Punches the aligned 1 MiB runs wholly free in `target`'s map and not punched yet.
fn punch(inner: &Inner, fs: &mut crate::storage::FlushState, target: &State) -> Result<u64> {
    let mut runs = Vec::new();
    let mut free_pages = 0u64;
    for_each_bitmap(target, |idx, words| {
        free_pages += words.iter().map(|w| u64::from(w.count_ones())).sum::<u64>();
        runs.extend(free_runs(idx, words, target.next_page))
    })?;
    let now: std::collections::BTreeSet<u64> = runs.into_iter().collect();
    fs.punched.retain(|r| now.contains(r));
    let used_pages = target.next_page.saturating_sub(free_pages);
    let keep = punch_slack_runs(
        fs.reuse_slack,
        used_pages,
        inner.closing.load(Ordering::Acquire),
    );
    let mut n = 0;
    for (i, r) in now.into_iter().enumerate() {
        if (i as u64) < keep || fs.punched.contains(&r) {
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
    if n > 0 {
        tracing::debug!(path = %inner.data_path.display(), runs = n, bytes = n * RUN_PAGES * PAGE_SIZE as u64, "punched free runs");
    }
    Ok(n)
}

// ---- the flush service ----------------------------------------------------------------------

/// The process's background flush service: the storages it watches, and its wake-ups.
struct Service {
    state: Mutex<ServiceState>,
    /// Wakes the service thread (a commit crossed a threshold, or a member joined).
    wake: Condvar,
    /// Signalled each time the service finishes with a member (for [`Membership::leave`]).
    idle: Condvar,
}

#[derive(Default)]
struct ServiceState {
    members: Vec<(u64, Weak<Inner>, Duration)>,
    next_key: u64,
    signaled: bool,
    /// The member being looked at now.
    busy: Option<u64>,
    thread: Option<std::thread::ThreadId>,
}

/// Most storages the service looks at per wake-up before it rechecks its signal (bounds the
/// loop; the rest wait for the next round).
const MAX_MEMBERS_PER_ROUND: usize = 1 << 16;

fn service() -> &'static Service {
    static SERVICE: OnceLock<Service> = OnceLock::new();
    SERVICE.get_or_init(|| Service {
        state: Mutex::new(ServiceState::default()),
        wake: Condvar::new(),
        idle: Condvar::new(),
    })
}

/// Wakes the flush service: some storage crossed a flush threshold.
fn signal_service() {
    let svc = service();
    lock(&svc.state).signaled = true;
    svc.wake.notify_one();
}

/// A storage's place in the flush service; [`Membership::leave`] ends it.
#[derive(Debug)]
struct Membership {
    key: u64,
}

impl Membership {
    /// Adds `inner` (held weakly) to the service, which looks at it every `tick` and on
    /// signals, and starts the service thread the first time.
    fn join(inner: &Arc<Inner>, tick: Duration) -> Membership {
        let svc = service();
        let mut st = lock(&svc.state);
        let key = st.next_key;
        st.next_key += 1;
        st.members.push((key, Arc::downgrade(inner), tick));
        if st.thread.is_none() {
            let spawned = std::thread::Builder::new()
                .name("omnibus-flush".into())
                .spawn(run_service);
            match spawned {
                Ok(h) => st.thread = Some(h.thread().id()),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start the flush thread: flushes happen on close and flush() only")
                }
            }
        }
        drop(st);
        svc.wake.notify_one();
        Membership { key }
    }

    /// Leaves the service; returns once the service no longer flushes or holds the storage
    /// (unless called on the service thread itself).
    fn leave(self) {
        let svc = service();
        let mut st = lock(&svc.state);
        st.members.retain(|(k, _, _)| *k != self.key);
        let on_service = st.thread == Some(std::thread::current().id());
        // Bounded: the service clears `busy` after one flush of this member.
        while !on_service && st.busy == Some(self.key) {
            st = svc.idle.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }
}

fn run_service() {
    if let Err(e) = crate::env::set_thread_io_priority(7) {
        tracing::debug!(error = %e, "ioprio_set failed for the flush thread");
    }
    let svc = service();
    loop {
        let members: Vec<(u64, Weak<Inner>)> = {
            let mut st = lock(&svc.state);
            if !st.signaled {
                let tick = st.members.iter().map(|m| m.2).min();
                st = match tick {
                    Some(t) => svc
                        .wake
                        .wait_timeout(st, t)
                        .map(|(g, _)| g)
                        .unwrap_or_else(|e| e.into_inner().0),
                    None => svc.wake.wait(st).unwrap_or_else(|e| e.into_inner()),
                };
            }
            st.signaled = false;
            st.members
                .iter()
                .take(MAX_MEMBERS_PER_ROUND)
                .map(|(k, w, _)| (*k, w.clone()))
                .collect()
        };
        for (key, weak) in members {
            {
                let mut st = lock(&svc.state);
                if !st.members.iter().any(|(k, _, _)| *k == key) {
                    continue;
                }
                st.busy = Some(key);
            }
            if let Some(inner) = weak.upgrade() {
                let live = !inner.closed.load(Ordering::Acquire) && inner.poisoned().is_none();
                let aged = live && inner.buffer_aged();
                // A storage whose record pins a journal file that is no longer current gets
                // flushed; its buffered entries are applied first, else their records keep
                // the file (a flush records the tree's txn only).
                let pins = live && inner.journal.pins_old_file(inner.storage_id);
                let pinned_buffer = pins && !inner.current.load().buffer.is_empty();
                if live
                    && (inner.wants_background_apply()
                        || (pinned_buffer && inner.applies_in_background()))
                {
                    // Off the committing threads: they go on committing meanwhile (design.md
                    // 16.1).
                    if let Err(e) = crate::txn::apply_in_background(&inner) {
                        tracing::warn!(path = %inner.path.display(), error = %e, "applying the write buffer failed");
                    }
                } else if aged || pinned_buffer {
                    if let Err(e) = inner.apply_buffer(false) {
                        tracing::warn!(path = %inner.path.display(), error = %e, "applying the write buffer failed");
                    }
                }
                if live && (aged || inner.needs_flush() || pins) {
                    if let Err(e) = flush(&inner) {
                        tracing::warn!(path = %inner.path.display(), error = %e, "background flush failed");
                    }
                }
            }
            lock(&svc.state).busy = None;
            svc.idle.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// Runs `yield_while` on a fake clock that the fake sleep advances; `busy_for` is how many
    /// `busy()` checks answer true. Returns (naps, time slept).
    fn simulate(budget: Duration, busy_for: u32) -> (u32, Duration) {
        let clock = Cell::new(Duration::ZERO);
        let checks = Cell::new(0u32);
        let naps = yield_while(
            budget,
            || {
                checks.set(checks.get() + 1);
                checks.get() <= busy_for
            },
            || clock.get(),
            |d| clock.set(clock.get() + d),
        );
        (naps, clock.get())
    }

    #[test]
    fn a_busy_journal_costs_a_few_doubling_naps_and_exactly_the_budget() {
        // The longest pause: 200 µs doubled 7 times is 25.6 ms, the 8th nap is cut to the
        // rest of 50 ms. Polling every 200 µs (the first version) took 250 wake-ups.
        let (naps, slept) = simulate(MAX_YIELD, u32::MAX);
        assert_eq!(slept, MAX_YIELD);
        assert_eq!(naps, 8);
        // A typical pause: 19 x a 1.6 ms chunk.
        let (naps, slept) = simulate(Duration::from_micros(30_400), u32::MAX);
        assert_eq!(slept, Duration::from_micros(30_400));
        assert_eq!(naps, 8);
    }

    #[test]
    fn a_quiet_journal_ends_the_pause_at_the_next_check() {
        assert_eq!(simulate(MAX_YIELD, 0), (0, Duration::ZERO));
        // Busy for three checks: naps of 200, 400 and 800 µs.
        assert_eq!(simulate(MAX_YIELD, 3), (3, Duration::from_micros(1_400)));
        assert_eq!(simulate(Duration::ZERO, u32::MAX), (0, Duration::ZERO));
    }
}
