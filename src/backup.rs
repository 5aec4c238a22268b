//! Online backup: a standalone copy of one snapshot of a storage, written while writers go on.
//!
//! The copy is a fresh storage directory built from the snapshot's *pages*, not from its
//! files: the snapshot's committed pages may still be in the scratch table (journaled, not yet
//! flushed), and its free-space map pages are updated in place by later commits, so neither the
//! data file nor the journal can be copied as they are. Instead (design.md, section 12):
//!
//! 1. Walk the tree reachable from the snapshot's root (branch, leaf and overflow pages), read
//!    each page through the snapshot (the scratch table first, then the map) and verify its
//!    checksum. A live snapshot's pages are never overwritten or reused (design.md invariants I3
//!    and 4), so this reads exactly the snapshot while commits and flushes continue.
//! 2. Write them at their own page numbers into a new `data.pages` (pages between them stay
//!    holes: the file is sparse), then a new free-space map after the highest tree page: a
//!    directory page and the bitmap pages covering the file, every page that is not a tree,
//!    map or header page marked free.
//! 3. `fdatasync`, then write both header pages (sequence 1 and 2, the same state: the
//!    snapshot's root, entries and txn id as flushed txn, the new map, a fresh random storage
//!    id) and `fdatasync` again; create an empty `Journals/` and sync the directories.
//!
//! 4. A marker file (`backup-in-progress`) is made durable in the destination before anything
//!    else and removed last; each data file is written as `data.pages.partial` and renamed once
//!    complete; a database's root goes last. A backup stopped anywhere (a kill, a power loss)
//!    leaves a destination that every open refuses as an unfinished backup, never a copy with a
//!    storage missing or empty.
//!
//! The copy needs no journal and opens standalone. Its storage id is new, so journal records
//! of the original can never be replayed into it (were its `data.pages` ever put beside the
//! original's `Journals/`). An error removes everything the backup wrote.

use std::io::IoSlice;
use std::path::Path;
use std::sync::Arc;

use crate::env::{EnvFile, OpenMode, StorageEnv};
use crate::error::{Error, Result};
use crate::freespace::{BITS_PER_BITMAP, DIR_CAPACITY};
use crate::layout::{BACKUP_MARKER, DATA_FILE, JOURNALS_DIR, PARTIAL_DATA_FILE};
use crate::page::header::Header;
use crate::page::node::{BranchView, LeafView, ValRef};
use crate::page::{self, PageHeader, PageKind, HEADER_LEN, PAGE_SIZE};
use crate::state::State;

/// What a backup wrote ([`crate::Storage::backup`], [`crate::Database::backup`]). For a
/// database, the sums over its storages, and the root's txn id.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BackupReport {
    /// The transaction id of the snapshot copied (the root's, for a database).
    pub txn_id: u64,
    /// Storages copied (1 for a storage; the root and every branch for a database).
    pub storages: u64,
    /// Keys copied that a snapshot of the copy shows: an index storage's applied record (its
    /// key `0x00`, the engine's, design.md 10.1) is copied but not counted, so a database of
    /// `n` documents and one index of one term each reports `2 n`.
    pub entries: u64,
    /// Pages (8 KiB) written: tree and overflow pages, the new free-space map and the two
    /// header pages.
    pub pages_written: u64,
    /// Length of the copies' data files in bytes (sparse: the free pages are holes).
    pub data_file_bytes: u64,
}

impl BackupReport {
    fn add(&mut self, o: &BackupReport) {
        self.storages += o.storages;
        self.entries += o.entries;
        self.pages_written += o.pages_written;
        self.data_file_bytes += o.data_file_bytes;
    }
}

/// Refuses a backup destination inside the directory it copies: a copy there would be read
/// back as part of the source (under `Indexes/`, as a branch of the database). Both paths are
/// compared after resolving symlinks (the destination's longest existing ancestor; the rest
/// appended as given).
///
/// Errors: [`Error::DestinationInsideSource`].
pub(crate) fn check_outside(source: &Path, dest: &Path) -> Result<()> {
    let Ok(src) = std::fs::canonicalize(source) else {
        return Ok(());
    };
    let dest_abs = if dest.is_absolute() {
        dest.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_default().join(dest)
    };
    let mut base = dest_abs.as_path();
    let mut rest = Vec::new();
    // Bounded by the number of components of the path.
    let resolved = loop {
        if let Ok(c) = std::fs::canonicalize(base) {
            break Some(c);
        }
        match (base.file_name(), base.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name.to_os_string());
                base = parent;
            }
            _ => break None,
        }
    };
    let Some(mut full) = resolved else {
        return Ok(());
    };
    for name in rest.iter().rev() {
        full.push(name);
    }
    if full.starts_with(&src) {
        return Err(Error::DestinationInsideSource {
            path: dest.to_path_buf(),
            source_dir: source.to_path_buf(),
        });
    }
    Ok(())
}

/// What the backup created, removed again if it fails.
pub(crate) struct Cleanup<'a> {
    env: &'a dyn StorageEnv,
    dest: &'a Path,
    created_dir: bool,
    armed: bool,
}

impl<'a> Cleanup<'a> {
    /// Checks `dest` (missing, or an empty directory) and creates it when missing.
    ///
    /// Errors: [`Error::DestinationNotEmpty`] for anything else there; I/O errors.
    pub(crate) fn prepare(env: &'a dyn StorageEnv, dest: &'a Path) -> Result<Cleanup<'a>> {
        let mut created_dir = false;
        if env.exists(dest) || std::fs::symlink_metadata(dest).is_ok() {
            let is_dir = std::fs::metadata(dest).map(|m| m.is_dir()).unwrap_or(false);
            if !is_dir || !env.list_dir(dest)?.is_empty() {
                return Err(Error::DestinationNotEmpty {
                    path: dest.to_path_buf(),
                });
            }
        } else {
            env.create_dir(dest)?;
            created_dir = true;
        }
        let cleanup = Cleanup {
            env,
            dest,
            created_dir,
            armed: true,
        };
        // The marker first, durable before anything else is written (and before a directory
        // the backup created is durable in its parent, so that directory is never found
        // without it): until `done` removes it, the destination opens as nothing (an
        // unfinished backup), whatever a kill or a power loss left there.
        env.open(&dest.join(BACKUP_MARKER), OpenMode::Create)?;
        env.sync_dir(dest)?;
        if created_dir {
            if let Some(parent) = dest.parent().filter(|p| !p.as_os_str().is_empty()) {
                env.sync_dir(parent)?;
            }
        }
        Ok(cleanup)
    }

    /// The backup succeeded (every copy's data file is in place and durable): remove the
    /// marker and make the directory entries durable.
    pub(crate) fn done(mut self) -> Result<()> {
        self.env.remove_file(&self.dest.join(BACKUP_MARKER))?;
        self.env.sync_dir(self.dest)?;
        self.armed = false;
        Ok(())
    }
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let r = if self.created_dir {
            self.env.remove_dir_all(self.dest)
        } else {
            // The directory was there and empty: empty it again.
            self.env.list_dir(self.dest).and_then(|names| {
                for n in names {
                    let p = self.dest.join(&n);
                    if p.is_dir() {
                        self.env.remove_dir_all(&p)?;
                    } else {
                        self.env.remove_file(&p)?;
                    }
                }
                Ok(())
            })
        };
        if let Err(e) = r {
            tracing::warn!(path = %self.dest.display(), error = %e, "removing a failed backup's partial copy failed");
        }
    }
}

/// Collects the tree of `state` (pages reachable from its root) as `(page, run pages)`,
/// checking every page's checksum, in page order.
fn tree_pages(state: &State) -> Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    if state.root == 0 {
        return Ok(out);
    }
    let bad = |p: u64, what: &str| Error::corruption(state.path(), Some(p), None, what);
    // Depth-first; each stack entry is (page, depth). Bounded by the tree's pages and depth.
    let mut stack = vec![(state.root, 0usize)];
    while let Some((p, depth)) = stack.pop() {
        if depth > crate::btree::MAX_DEPTH {
            return Err(bad(p, "tree deeper than 32 levels"));
        }
        let (img, h) = state.page_verified(p)?;
        match h.kind {
            PageKind::Branch => {
                let v = BranchView::new(img, &h);
                for i in 0..=v.keys() {
                    let c = v.child(i).ok_or_else(|| bad(p, "malformed branch page"))?;
                    stack.push((c, depth + 1));
                }
                out.push((p, 1));
            }
            PageKind::Leaf => {
                let v = LeafView::new(img, &h);
                let mut runs: Vec<u64> = Vec::new();
                for i in 0..v.len() {
                    let (_, val) = v.cell(i).ok_or_else(|| bad(p, "malformed leaf cell"))?;
                    if let ValRef::Overflow { page: o, .. } = val {
                        let (_, oh) = state.page_verified(o)?;
                        if oh.kind != PageKind::Overflow {
                            return Err(bad(o, "expected an overflow page"));
                        }
                        out.push((o, oh.run_pages.max(1) as u64));
                    }
                    // A value page run is named by this leaf alone, maybe by several cells.
                    if let ValRef::Packed { page: o, .. } = val {
                        if !runs.contains(&o) {
                            let (_, oh) = state.page_verified(o)?;
                            if oh.kind != PageKind::Values {
                                return Err(bad(o, "expected a value page"));
                            }
                            runs.push(o);
                            out.push((o, oh.run_pages.max(1) as u64));
                        }
                    }
                }
                out.push((p, 1));
            }
            _ => return Err(bad(p, "expected a branch or leaf page")),
        }
    }
    out.sort_unstable();
    for w in out.windows(2) {
        if w[0].0 + w[0].1 > w[1].0 {
            return Err(bad(
                w[1].0,
                "page reachable twice or inside an overflow run",
            ));
        }
    }
    Ok(out)
}

/// Writes a standalone copy of `state` into the (existing, empty) directory `dir`, through
/// `env`: see the module doc.
/// `state`'s keys less an index's applied record, when `index` (a storage whose snapshots hide
/// it) and the state holds one: the keys a snapshot of it shows.
fn visible_entries(state: &State, index: bool) -> Result<u64> {
    // The buffer first: it holds the newest operation on a key (design.md 16).
    let record = index
        && match state.buffer.get(crate::txn::RESERVED_KEY) {
            Some(op) => op.is_some_and(crate::txn::is_index_record),
            None => crate::btree::get(state, crate::txn::RESERVED_KEY)?
                .is_some_and(crate::txn::is_index_record),
        };
    Ok(state.len().saturating_sub(u64::from(record)))
}

/// Writes the copy of `state` into `dir`; `index`: the storage is an index (its applied record
/// is not counted in the report's entries).
pub(crate) fn write_copy(
    env: &Arc<dyn StorageEnv>,
    state: &State,
    dir: &Path,
    index: bool,
) -> Result<BackupReport> {
    let tree = tree_pages(state)?;
    // The map goes after the highest tree page: a directory page, then the bitmaps covering
    // every page of the new file (themselves included).
    let tree_end = tree.last().map_or(2, |(p, n)| (p + n).max(2));
    let mut bitmaps = 1u64;
    while (tree_end + 1 + bitmaps).div_ceil(BITS_PER_BITMAP) > bitmaps {
        bitmaps += 1;
    }
    if bitmaps as usize > DIR_CAPACITY {
        return Err(Error::InvalidOptions(format!(
            "a backup of {tree_end} pages exceeds the free-space map's reach"
        )));
    }
    let dir_page = tree_end;
    let next_page = tree_end + 1 + bitmaps;
    let txn = state.txn_id;
    // A state with a write buffer (design.md 16): its tree is copied as the txn before the
    // state's, and the buffered entries follow in the copy's journal as one logical record of
    // the state's txn, which the copy's open replays into its buffer. No writer is needed.
    let buffered = !state.buffer.is_empty();
    let tree_txn = if buffered { txn - 1 } else { txn };
    let storage_id = crate::layout::random_id();

    // Free bits: every page from 2 to the map that is not a tree page.
    let mut words = vec![0u64; bitmaps as usize * crate::freespace::WORDS];
    let mut set_free = |from: u64, to: u64| {
        for q in from..to {
            words[(q / 64) as usize] |= 1 << (q % 64);
        }
    };
    let mut at = 2u64;
    for &(p, n) in &tree {
        set_free(at, p);
        at = p + n;
    }
    set_free(at, tree_end);
    let mut map_pages: Vec<Box<[u8]>> = Vec::with_capacity(1 + bitmaps as usize);
    let mut d = page::zeroed(1);
    PageHeader {
        kind: PageKind::FreeDir,
        count: bitmaps as u16,
        page_number: dir_page,
        txn_id: txn,
        run_pages: 1,
        aux: 0,
    }
    .write(&mut d);
    for i in 0..bitmaps {
        page::wr_u64(&mut d, HEADER_LEN + 8 * i as usize, dir_page + 1 + i);
    }
    page::seal(&mut d);
    map_pages.push(d);
    for (i, ws) in words.chunks(crate::freespace::WORDS).enumerate() {
        let mut b = page::zeroed(1);
        PageHeader {
            kind: PageKind::FreeBitmap,
            count: 0,
            page_number: dir_page + 1 + i as u64,
            txn_id: txn,
            run_pages: 1,
            aux: i as u32,
        }
        .write(&mut b);
        for (w, v) in ws.iter().enumerate() {
            page::wr_u64(&mut b, HEADER_LEN + 8 * w, *v);
        }
        page::seal(&mut b);
        map_pages.push(b);
    }

    // Written under a temporary name, renamed once whole and durable: a copy cut short by a
    // kill has no data file and never opens as a storage (an empty one, created again).
    let data_path = dir.join(PARTIAL_DATA_FILE);
    let data = env.open(&data_path, OpenMode::Create)?;
    data.set_len(next_page * PAGE_SIZE as u64)?;
    // Tree pages as runs of adjacent pages (at most 1,024 slices a write).
    let mut written = 0u64;
    let mut run: Vec<IoSlice<'_>> = Vec::new();
    let mut run_start = 0u64;
    let mut run_end = 0u64;
    let write_run = |data: &Arc<dyn EnvFile>, start: u64, run: &mut Vec<IoSlice<'_>>| {
        let r = if run.is_empty() {
            Ok(())
        } else {
            data.write_vectored_all_at(run, start * PAGE_SIZE as u64)
        };
        run.clear();
        r
    };
    for &(p, n) in &tree {
        if p != run_end || run.len() >= crate::env::IOV_MAX_SLICES {
            write_run(&data, run_start, &mut run)?;
            run_start = p;
        }
        let (img, _) = state.page(p)?;
        run.push(IoSlice::new(img));
        run_end = p + n;
        written += n;
    }
    write_run(&data, run_start, &mut run)?;
    for (i, img) in map_pages.iter().enumerate() {
        data.write_all_at(img, (dir_page + i as u64) * PAGE_SIZE as u64)?;
    }
    written += map_pages.len() as u64;
    data.sync_data()?;
    let h = Header {
        sequence: 1,
        storage_id,
        flushed_txn: tree_txn,
        root: state.root,
        freedir: dir_page,
        next_page,
        entries: state.entries,
        // No journal file stated: the copy's `Journals/` is empty, or holds the buffered
        // entries' one file, which its open reads as a new storage's first file.
        journal_started: 0,
        journal_started_len: 0,
    };
    data.write_all_at(&h.encode(0), 0)?;
    data.write_all_at(&Header { sequence: 2, ..h }.encode(1), PAGE_SIZE as u64)?;
    data.sync_data()?;
    written += 2;
    let journals = dir.join(JOURNALS_DIR);
    env.create_dir(&journals)?;
    env.sync_dir(&journals)?;
    if buffered {
        // Before the data file is in place: a copy cut short here never opens without them.
        write_buffer_record(env, dir, storage_id, state)?;
    }
    env.rename(&data_path, &dir.join(DATA_FILE))?;
    env.sync_dir(dir)?;
    Ok(BackupReport {
        txn_id: txn,
        storages: 1,
        entries: visible_entries(state, index)?,
        pages_written: written,
        data_file_bytes: next_page * PAGE_SIZE as u64,
    })
}

/// Writes `state`'s buffered entries into a new journal in `dir/Journals` as one synced
/// logical record (design.md 3.9) of txn `state.txn_id` for storage `storage_id`: each key once,
/// with its newest operation (a delete stays a delete: the copied tree may hold the key).
fn write_buffer_record(
    env: &Arc<dyn StorageEnv>,
    dir: &Path,
    storage_id: u64,
    state: &State,
) -> Result<()> {
    let cfg = crate::journal::JournalConfig {
        file_size: 1 << 20,
        prezero: crate::journal::Prezero::Ahead(1 << 20),
        pool_files: 0,
        eventual_sync: std::time::Duration::from_millis(100),
        io: crate::JournalIo::Syscalls,
        mark_idle: std::time::Duration::ZERO,
    };
    let journal = crate::journal::Journal::open(env.clone(), storage_id, dir, 1, cfg)?;
    journal.register(storage_id, dir, "", &Default::default());
    let entries: Vec<crate::buffer::Entry<'_>> = state.buffer.iter().collect();
    let record =
        crate::journal::record::logical_record(storage_id, state.txn_id, entries.iter().copied());
    journal.commit_with(record, crate::options::Durability::Immediate)?;
    Ok(())
}

/// Backs up `state` of one storage into `dest` (missing, or an empty directory); `index`: the
/// storage is an index (its applied record is not counted).
pub(crate) fn backup_storage(
    env: &Arc<dyn StorageEnv>,
    state: &State,
    dest: &Path,
    index: bool,
) -> Result<BackupReport> {
    let cleanup = Cleanup::prepare(&**env, dest)?;
    let r = write_copy(env, state, dest, index)?;
    cleanup.done()?;
    Ok(r)
}

/// Backs up a database's snapshots: each `(name, state)` of `branches` into
/// `dest/Indexes/<name>`, then `root` into `dest`. The root's data file is the last one put
/// in place: until it is, the copy is no database (its root has no data file, and the marker
/// says why), so a kill never leaves a copy that opens with a branch missing.
pub(crate) fn backup_database(
    env: &Arc<dyn StorageEnv>,
    root: &State,
    branches: &[(String, Arc<State>)],
    dest: &Path,
) -> Result<BackupReport> {
    let cleanup = Cleanup::prepare(&**env, dest)?;
    let indexes = dest.join(crate::layout::INDEXES_DIR);
    env.create_dir(&indexes)?;
    let mut report = BackupReport::default();
    for (name, state) in branches {
        let dir = indexes.join(name);
        env.create_dir(&dir)?;
        // A branch holding an applied record is an index (design.md 10.1).
        let r = write_copy(env, state, &dir, true)?;
        report.add(&r);
    }
    env.sync_dir(&indexes)?;
    let r = write_copy(env, root, dest, false)?;
    report.add(&r);
    report.txn_id = r.txn_id;
    cleanup.done()?;
    Ok(report)
}
