//! [`PowerLossEnv`]: keeps, for every file and directory under a root, what a power loss could
//! leave of it, and writes such a state out on [`PowerLossEnv::crash`].
//!
//! The model (docs/design.md, section 9, "Assumptions about the media"):
//! - every inode has a *live* state, the real file (what reads and the engine's read-only maps
//!   see), and a *durable* state, an in-memory image of its bytes and length;
//! - writes, `set_len`, `allocate` and `punch_hole` change the real file and are appended, in
//!   order, to the inode's list of pending changes; `sync_data` through any handle of the inode
//!   applies them to the durable image;
//! - creates, hard links, unlinks, renames and new directories change the live namespace;
//!   `sync_dir(d)` makes the current entries of `d` durable (a rename is durable in each of its
//!   two directories when that directory is synced);
//! - a crash deletes everything under the root and writes out the durable namespace (or the
//!   live one) with, for each inode, its durable image plus some of its pending changes, chosen
//!   by a [`CrashMode`] and a seed.
//!
//! Instead of crashing, a test may also take a [`CrashSnapshot`] of the model (at any time with
//! [`PowerLossEnv::snapshot`], or at every durable operation, just before it is issued and right
//! after it completes, through a [`DurableObserver`]) and write out, later and as often as it
//! likes, the state a crash at that moment would leave ([`CrashSnapshot::state`],
//! [`CrashState::write_to`]): one run of a workload then gives every crash point of the run.
//! The snapshot shares the file images with the model (pages and pending writes are
//! reference-counted), so taking one costs a copy of the namespace and the page tables only.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::fs;
use std::hash::{Hash, Hasher};
use std::io::{self, IoSlice};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::env::{EnvError, EnvFile, EnvResult, JournalIo, OpenMode, StorageEnv};

/// Size in bytes of a disk sector as the power-loss model tears writes: 4 KiB, aligned to file
/// offsets.
pub const SECTOR_SIZE: u64 = 4096;

/// `SECTOR_SIZE` as a `usize`.
const SECTOR: usize = SECTOR_SIZE as usize;

/// The root directory's inode number in the model.
const ROOT: u64 = 0;

/// What a crash keeps of the changes not yet made durable by `sync_data`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CrashMode {
    /// Every file holds exactly its durable image: all unsynced changes are lost.
    DropUnsynced,
    /// Every file holds its durable image plus a prefix (chosen by the seed, possibly empty or
    /// complete) of its pending changes, in the order they were made.
    KeepPrefix,
    /// Every file holds its durable image plus any subset (chosen by the seed) of its pending
    /// changes, applied in their original order: the disk reordered the writes.
    KeepSubset,
    /// Every pending write and punched hole is split at 4 KiB file-offset boundaries
    /// ([`SECTOR_SIZE`]) and each piece is kept or dropped independently; each length change
    /// (`set_len`, `allocate`, a write past the end) is kept or dropped independently. Dropped
    /// sectors keep their durable bytes; kept sectors past a dropped length change are cut off.
    TornSectors,
}

/// A crash armed by [`PowerLossEnv::crash_after`].
#[derive(Debug, Clone, Copy)]
struct Armed {
    after: u64,
    mode: CrashMode,
    lose_unsynced_entries: bool,
    seed: u64,
}

/// A file's bytes and length: 4 KiB pages, missing pages read as zeros.
#[derive(Debug, Clone, Default)]
struct Image {
    /// Length in bytes.
    len: u64,
    /// Page index (offset / 4096) to the page's 4,096 bytes, shared with the snapshots taken
    /// before the page last changed (copied on write).
    pages: BTreeMap<u64, Arc<[u8; SECTOR]>>,
}

impl Image {
    /// Writes `data` at `offset`, extending the length to cover it.
    fn write(&mut self, offset: u64, data: &[u8]) {
        let end = offset.saturating_add(data.len() as u64);
        let mut pos = offset;
        let mut rest = data;
        while !rest.is_empty() && pos < end {
            let idx = pos / SECTOR_SIZE;
            let in_page = (pos % SECTOR_SIZE) as usize;
            let n = rest.len().min(SECTOR - in_page);
            let page = Arc::make_mut(
                self.pages
                    .entry(idx)
                    .or_insert_with(|| Arc::new([0u8; SECTOR])),
            );
            page[in_page..in_page + n].copy_from_slice(&rest[..n]);
            rest = &rest[n..];
            pos = pos.saturating_add(n as u64);
        }
        self.len = self.len.max(end);
    }

    /// Writes the part of `data` that lies below the current length; the length is unchanged.
    fn write_clipped(&mut self, offset: u64, data: &[u8]) {
        if offset >= self.len {
            return;
        }
        let keep = ((self.len - offset).min(data.len() as u64)) as usize;
        self.write(offset, &data[..keep]);
    }

    /// Zeros `offset..offset+len`, clipped to the length; the length is unchanged.
    fn zero(&mut self, offset: u64, len: u64) {
        let end = offset.saturating_add(len).min(self.len);
        let mut pos = offset;
        while pos < end {
            let idx = pos / SECTOR_SIZE;
            let page_start = idx * SECTOR_SIZE;
            let from = (pos - page_start) as usize;
            let to = ((end - page_start).min(SECTOR_SIZE)) as usize;
            if from == 0 && to == SECTOR {
                self.pages.remove(&idx);
            } else if let Some(page) = self.pages.get_mut(&idx) {
                Arc::make_mut(page)[from..to].fill(0);
            }
            pos = page_start + to as u64;
        }
    }

    /// Sets the length; bytes past a shrunk length are dropped (read as zeros if it grows back).
    fn set_len(&mut self, len: u64) {
        if len < self.len {
            let first_dropped = len.div_ceil(SECTOR_SIZE);
            self.pages.retain(|&idx, _| idx < first_dropped);
            if !len.is_multiple_of(SECTOR_SIZE) {
                if let Some(page) = self.pages.get_mut(&(len / SECTOR_SIZE)) {
                    Arc::make_mut(page)[(len % SECTOR_SIZE) as usize..].fill(0);
                }
            }
        }
        self.len = len;
    }

    /// Applies one change in full.
    fn apply(&mut self, change: &Change) {
        match change {
            Change::Write { offset, data } => self.write(*offset, data),
            Change::SetLen(len) => self.set_len(*len),
            Change::Allocate { offset, len } => {
                self.len = self.len.max(offset.saturating_add(*len));
            }
            Change::PunchHole { offset, len } => self.zero(*offset, *len),
        }
    }

    /// Applies one change torn at sector boundaries: each sector piece and the length change
    /// kept or dropped by `rng`.
    fn apply_torn(&mut self, change: &Change, rng: &mut SmallRng) {
        match change {
            Change::Write { offset, data } => {
                let end = offset.saturating_add(data.len() as u64);
                let keep_len = end <= self.len || rng.random_bool(0.5);
                for (off, piece) in sector_pieces(*offset, data.len() as u64) {
                    if rng.random_bool(0.5) {
                        let from = (off - offset) as usize;
                        let bytes = &data[from..from + piece as usize];
                        if keep_len {
                            self.write(off, bytes);
                        } else {
                            self.write_clipped(off, bytes);
                        }
                    }
                }
                if keep_len {
                    self.len = self.len.max(end);
                }
            }
            Change::PunchHole { offset, len } => {
                for (off, piece) in sector_pieces(*offset, *len) {
                    if rng.random_bool(0.5) {
                        self.zero(off, piece);
                    }
                }
            }
            Change::SetLen(_) | Change::Allocate { .. } => {
                if rng.random_bool(0.5) {
                    self.apply(change);
                }
            }
        }
    }
}

/// `offset..offset+len` cut at 4 KiB file-offset boundaries, as `(offset, len)` pieces.
fn sector_pieces(offset: u64, len: u64) -> Vec<(u64, u64)> {
    let end = offset.saturating_add(len);
    let mut out = Vec::new();
    let mut pos = offset;
    while pos < end {
        let next = ((pos / SECTOR_SIZE).saturating_add(1))
            .saturating_mul(SECTOR_SIZE)
            .min(end);
        out.push((pos, next - pos));
        pos = next;
    }
    out
}

/// One unsynced change to a file (a write's bytes shared with the snapshots).
#[derive(Debug, Clone)]
enum Change {
    Write { offset: u64, data: Arc<[u8]> },
    SetLen(u64),
    Allocate { offset: u64, len: u64 },
    PunchHole { offset: u64, len: u64 },
}

/// A regular file's inode.
#[derive(Debug, Default, Clone)]
struct FileNode {
    durable: Image,
    pending: Vec<Change>,
    /// Open handles (they keep an unlinked inode alive).
    open: usize,
}

/// A directory's inode.
#[derive(Debug, Default, Clone)]
struct DirNode {
    live: BTreeMap<OsString, u64>,
    durable: BTreeMap<OsString, u64>,
}

#[derive(Debug, Clone)]
enum Node {
    File(FileNode),
    Dir(DirNode),
}

/// Everything the env knows, under one mutex.
#[derive(Debug)]
struct Model {
    crashed: bool,
    next_id: u64,
    nodes: HashMap<u64, Node>,
    durable_ops: u64,
    armed: Option<Armed>,
    /// Collect unreachable inodes when there are more nodes than this.
    gc_threshold: usize,
}

impl Model {
    fn new() -> Model {
        let mut nodes = HashMap::new();
        nodes.insert(ROOT, Node::Dir(DirNode::default()));
        Model {
            crashed: false,
            next_id: ROOT + 1,
            nodes,
            durable_ops: 0,
            armed: None,
            gc_threshold: 1024,
        }
    }

    fn add(&mut self, node: Node) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.nodes.insert(id, node);
        id
    }

    fn dir(&self, id: u64) -> Option<&DirNode> {
        match self.nodes.get(&id) {
            Some(Node::Dir(d)) => Some(d),
            _ => None,
        }
    }

    fn dir_mut(&mut self, id: u64) -> Option<&mut DirNode> {
        match self.nodes.get_mut(&id) {
            Some(Node::Dir(d)) => Some(d),
            _ => None,
        }
    }

    fn file_mut(&mut self, id: u64) -> Option<&mut FileNode> {
        match self.nodes.get_mut(&id) {
            Some(Node::File(f)) => Some(f),
            _ => None,
        }
    }

    /// The inode `comps` names in the live namespace.
    fn lookup(&self, comps: &[OsString]) -> Option<u64> {
        let mut id = ROOT;
        for c in comps {
            id = *self.dir(id)?.live.get(c)?;
        }
        Some(id)
    }

    /// Removes `name` from the live entries of directory `dir`.
    fn unlink(&mut self, dir: u64, name: &OsString) -> Option<u64> {
        self.dir_mut(dir)?.live.remove(name)
    }

    /// Empties the live entries of `id` and of every directory under it.
    fn clear_live_tree(&mut self, id: u64) {
        let mut stack = vec![id];
        let mut seen = HashSet::new();
        while let Some(d) = stack.pop() {
            if !seen.insert(d) {
                continue;
            }
            if let Some(dir) = self.dir_mut(d) {
                let children = std::mem::take(&mut dir.live);
                stack.extend(children.into_values());
            }
        }
    }

    /// Drops inodes no entry (live or durable) and no open handle refers to, when there are
    /// many.
    fn maybe_gc(&mut self) {
        if self.nodes.len() <= self.gc_threshold {
            return;
        }
        let mut keep: HashSet<u64> = HashSet::new();
        let mut stack = vec![ROOT];
        for (&id, node) in &self.nodes {
            if let Node::File(f) = node {
                if f.open > 0 {
                    stack.push(id);
                }
            }
        }
        while let Some(id) = stack.pop() {
            if !keep.insert(id) {
                continue;
            }
            if let Some(d) = self.dir(id) {
                stack.extend(d.live.values().copied());
                stack.extend(d.durable.values().copied());
            }
        }
        self.nodes.retain(|id, _| keep.contains(id));
        self.gc_threshold = (self.nodes.len() * 2).max(1024);
    }
}

/// One entry of the namespace a crash writes out.
#[derive(Debug)]
enum PlanEntry {
    Dir(PathBuf),
    File(PathBuf, u64),
}

/// State shared by the env and its files.
#[derive(Debug)]
struct Shared {
    inner: Arc<dyn StorageEnv>,
    /// The root, absolute and lexically normalized.
    root: PathBuf,
    /// The root with symbolic links resolved, when it differs from `root`.
    root_canonical: Option<PathBuf>,
    real_sync: AtomicBool,
    model: Mutex<Model>,
    observer: ObserverSlot,
}

fn eio(op: &'static str, path: &Path) -> EnvError {
    EnvError::new(op, path, io::Error::from_raw_os_error(libc::EIO))
}

fn errno(op: &'static str, path: &Path, code: i32) -> EnvError {
    EnvError::new(op, path, io::Error::from_raw_os_error(code))
}

/// `path` made absolute (against the current directory) and with `.` and `..` resolved
/// lexically.
fn normalize(path: &Path) -> PathBuf {
    let abs = if path.is_relative() {
        match std::env::current_dir() {
            Ok(cwd) => cwd.join(path),
            Err(_) => path.to_path_buf(),
        }
    } else {
        path.to_path_buf()
    };
    let mut out = PathBuf::new();
    for c in abs.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Model> {
        self.model.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The components of `path` below the root, or `None` when `path` is not under the root.
    fn rel(&self, path: &Path) -> Option<Vec<OsString>> {
        let p = normalize(path);
        let rest = p.strip_prefix(&self.root).ok().or_else(|| {
            self.root_canonical
                .as_ref()
                .and_then(|r| p.strip_prefix(r).ok())
        })?;
        Some(
            rest.components()
                .map(|c| c.as_os_str().to_os_string())
                .collect(),
        )
    }

    fn real_path(&self, comps: &[OsString]) -> PathBuf {
        let mut p = self.root.clone();
        for c in comps {
            p.push(c);
        }
        p
    }

    /// The inode `comps` names; an entry the model lacks but the real file system has (made
    /// behind the env's back) is read in as durable.
    fn resolve_or_adopt(&self, m: &mut Model, comps: &[OsString]) -> EnvResult<Option<u64>> {
        let mut id = ROOT;
        for (i, c) in comps.iter().enumerate() {
            let Some(dir) = m.dir(id) else {
                return Ok(None);
            };
            if let Some(&child) = dir.live.get(c) {
                id = child;
                continue;
            }
            let real = self.real_path(&comps[..=i]);
            if fs::symlink_metadata(&real).is_err() {
                return Ok(None);
            }
            let mut inodes = HashMap::new();
            match scan(m, &real, &mut inodes)? {
                Some(child) => {
                    if let Some(d) = m.dir_mut(id) {
                        d.live.insert(c.clone(), child);
                        d.durable.insert(c.clone(), child);
                    }
                    id = child;
                }
                None => return Ok(None),
            }
        }
        Ok(Some(id))
    }

    /// Counts a successful durable operation on `path`, tells the observer, and fires an armed
    /// crash.
    fn durable_op_done(&self, m: &mut Model, path: &Path, dir: bool) -> EnvResult<()> {
        m.durable_ops += 1;
        self.observe(m, DurableStep::After, m.durable_ops, path, dir);
        if let Some(a) = m.armed {
            if m.durable_ops >= a.after {
                m.armed = None;
                return self.crash_locked(m, a.mode, a.lose_unsynced_entries, a.seed);
            }
        }
        Ok(())
    }

    /// Writes out the crash state; the env is dead afterwards, even when this fails.
    fn crash_locked(
        &self,
        m: &mut Model,
        mode: CrashMode,
        lose_unsynced_entries: bool,
        seed: u64,
    ) -> EnvResult<()> {
        if m.crashed {
            return Err(eio("crash", &self.root));
        }
        m.crashed = true;
        m.armed = None;
        crash_state(&m.nodes, mode, lose_unsynced_entries, seed).write_to(&self.root)
    }

    /// Calls the durable observer, if any, on `path`'s durable operation number `n`.
    fn observe(&self, m: &Model, step: DurableStep, n: u64, path: &Path, dir: bool) {
        let obs = self
            .observer
            .0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(obs) = obs {
            obs(&DurableEvent {
                step,
                n,
                path,
                dir,
                nodes: &m.nodes,
            });
        }
    }
}

/// The directory `id` in `nodes`.
fn dir_of(nodes: &HashMap<u64, Node>, id: u64) -> Option<&DirNode> {
    match nodes.get(&id) {
        Some(Node::Dir(d)) => Some(d),
        _ => None,
    }
}

/// What a crash now leaves of the model's `nodes`: the durable namespace (with
/// `lose_unsynced_entries`) or the live one, each file's durable image plus the pending changes
/// `mode` and `seed` keep.
fn crash_state(
    nodes: &HashMap<u64, Node>,
    mode: CrashMode,
    lose_unsynced_entries: bool,
    seed: u64,
) -> CrashState {
    // The namespace to write out, depth first, names in order (deterministic for a seed).
    let mut plan = Vec::new();
    let mut seen_dirs = HashSet::new();
    seen_dirs.insert(ROOT);
    let mut stack = vec![(ROOT, PathBuf::new())];
    while let Some((id, rel)) = stack.pop() {
        let Some(dir) = dir_of(nodes, id) else {
            continue;
        };
        let entries = if lose_unsynced_entries {
            &dir.durable
        } else {
            &dir.live
        };
        let mut subdirs = Vec::new();
        for (name, &child) in entries {
            let path = rel.join(name);
            match nodes.get(&child) {
                Some(Node::Dir(_)) if seen_dirs.insert(child) => {
                    plan.push(PlanEntry::Dir(path.clone()));
                    subdirs.push((child, path));
                }
                Some(Node::Dir(_)) => {}
                Some(Node::File(_)) => plan.push(PlanEntry::File(path, child)),
                None => {}
            }
        }
        stack.extend(subdirs.into_iter().rev());
    }

    // Each inode's content after the crash.
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut images: HashMap<u64, Image> = HashMap::new();
    for e in &plan {
        let PlanEntry::File(_, id) = e else { continue };
        if images.contains_key(id) {
            continue;
        }
        let Some(Node::File(f)) = nodes.get(id) else {
            continue;
        };
        let mut img = f.durable.clone();
        match mode {
            CrashMode::DropUnsynced => {}
            CrashMode::KeepPrefix => {
                let k = rng.random_range(0..=f.pending.len());
                for c in &f.pending[..k] {
                    img.apply(c);
                }
            }
            CrashMode::KeepSubset => {
                for c in &f.pending {
                    if rng.random_bool(0.5) {
                        img.apply(c);
                    }
                }
            }
            CrashMode::TornSectors => {
                for c in &f.pending {
                    img.apply_torn(c, &mut rng);
                }
            }
        }
        images.insert(*id, img);
    }
    CrashState { plan, images }
}

/// The non-zero part of each page of `img` that lies below its length, in page order (what a
/// crash writes; the rest reads as zeros).
fn written_pages(img: &Image) -> impl Iterator<Item = (u64, &[u8])> {
    img.pages.iter().filter_map(|(&idx, page)| {
        let off = idx.saturating_mul(SECTOR_SIZE);
        if off >= img.len {
            return None;
        }
        let n = (img.len - off).min(SECTOR_SIZE) as usize;
        let bytes = &page[..n];
        (!bytes.iter().all(|&b| b == 0)).then_some((off, bytes))
    })
}

/// The files and directories a power loss leaves under a root, computed from a model
/// ([`CrashSnapshot::state`]) and not yet written ([`CrashState::write_to`]).
#[derive(Debug)]
pub struct CrashState {
    /// Directories and file entries, relative to the root, parents first.
    plan: Vec<PlanEntry>,
    /// Each file inode's bytes.
    images: HashMap<u64, Image>,
}

impl CrashState {
    /// A 64-bit hash of the state: equal states (same names, same hard-link structure, same
    /// lengths and bytes, zeros and holes alike) hash alike, so a test can verify each distinct
    /// state once.
    pub fn fingerprint(&self) -> u64 {
        let mut h = std::hash::DefaultHasher::new();
        // Fixed seeds (hex digits of pi): a state hashes alike in every run.
        let pages = ahash::RandomState::with_seeds(
            0x243f_6a88_85a3_08d3,
            0x1319_8a2e_0370_7344,
            0xa409_3822_299f_31d0,
            0x082e_fa98_ec4e_6c89,
        );
        let mut first: HashMap<u64, usize> = HashMap::new();
        for e in &self.plan {
            match e {
                PlanEntry::Dir(rel) => {
                    0u8.hash(&mut h);
                    rel.hash(&mut h);
                }
                PlanEntry::File(rel, id) => {
                    1u8.hash(&mut h);
                    rel.hash(&mut h);
                    let n = first.len();
                    if let Some(&i) = first.get(id) {
                        // A hard link to the i-th file written.
                        2u8.hash(&mut h);
                        i.hash(&mut h);
                        continue;
                    }
                    first.insert(*id, n);
                    3u8.hash(&mut h);
                    match self.images.get(id) {
                        Some(img) => {
                            img.len.hash(&mut h);
                            for (off, bytes) in written_pages(img) {
                                off.hash(&mut h);
                                // The page's bytes through ahash (16 bytes a step) rather than
                                // SipHash (one a step): suites fingerprint thousands of states.
                                pages.hash_one(bytes).hash(&mut h);
                            }
                        }
                        None => u64::MAX.hash(&mut h),
                    }
                }
            }
        }
        h.finish()
    }

    /// Deletes everything under `root` (creating it when missing) and writes the state there:
    /// directories, files (holes where the bytes are zeros), hard links as hard links.
    ///
    /// # Errors
    /// The real file system's error when deleting or writing fails (`root` is then in an
    /// unspecified state).
    pub fn write_to(&self, root: &Path) -> EnvResult<()> {
        match fs::read_dir(root) {
            Ok(rd) => {
                for entry in rd {
                    let entry = entry.map_err(|e| EnvError::new("readdir", root, e))?;
                    let p = entry.path();
                    let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
                    let r = if is_dir {
                        fs::remove_dir_all(&p)
                    } else {
                        fs::remove_file(&p)
                    };
                    r.map_err(|e| EnvError::new("crash: remove", &p, e))?;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir_all(root).map_err(|e| EnvError::new("crash: mkdir", root, e))?;
            }
            Err(e) => return Err(EnvError::new("readdir", root, e)),
        }
        let mut first_path: HashMap<u64, PathBuf> = HashMap::new();
        for e in &self.plan {
            match e {
                PlanEntry::Dir(rel) => {
                    let p = root.join(rel);
                    fs::create_dir(&p).map_err(|e| EnvError::new("crash: mkdir", &p, e))?;
                }
                PlanEntry::File(rel, id) => {
                    let p = root.join(rel);
                    if let Some(first) = first_path.get(id) {
                        fs::hard_link(first, &p)
                            .map_err(|e| EnvError::new("crash: link", &p, e))?;
                        continue;
                    }
                    let file = fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(&p)
                        .map_err(|e| EnvError::new("crash: create", &p, e))?;
                    if let Some(img) = self.images.get(id) {
                        file.set_len(img.len)
                            .map_err(|e| EnvError::new("crash: ftruncate", &p, e))?;
                        for (off, bytes) in written_pages(img) {
                            file.write_all_at(bytes, off)
                                .map_err(|e| EnvError::new("crash: pwrite", &p, e))?;
                        }
                    }
                    first_path.insert(*id, p);
                }
            }
        }
        Ok(())
    }
}

/// A copy of a [`PowerLossEnv`]'s model at one moment ([`PowerLossEnv::snapshot`],
/// [`DurableEvent::snapshot`]): every crash that moment allows can be computed from it, any
/// number of times, while the env goes on. Cheap to clone (shared).
#[derive(Debug, Clone)]
pub struct CrashSnapshot {
    nodes: Arc<HashMap<u64, Node>>,
}

impl CrashSnapshot {
    /// What a crash at the snapshot's moment leaves with `mode`, `seed` and
    /// `lose_unsynced_entries`: exactly what [`PowerLossEnv::crash`] with the same arguments
    /// would have written then.
    pub fn state(&self, mode: CrashMode, lose_unsynced_entries: bool, seed: u64) -> CrashState {
        crash_state(&self.nodes, mode, lose_unsynced_entries, seed)
    }
}

/// When a [`DurableObserver`] is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DurableStep {
    /// Just before the durable operation takes effect: for `write_vectored_and_sync`, its write
    /// is already pending (a crash may keep any part of it), for `sync_data` and `sync_dir`
    /// everything before it is pending.
    Before,
    /// Right after it completed, before the caller sees its result (as
    /// [`PowerLossEnv::crash_after`] fires).
    After,
}

/// A durable operation (`sync_data`, `write_vectored_and_sync` or `sync_dir`) of a
/// [`PowerLossEnv`], as a [`DurableObserver`] sees it.
#[derive(Debug)]
pub struct DurableEvent<'a> {
    /// Before or after the operation.
    pub step: DurableStep,
    /// The operation's number, 1-based, as [`PowerLossEnv::durable_ops`] counts: the count is
    /// `n - 1` before it and `n` after.
    pub n: u64,
    /// The file synced, or the directory.
    pub path: &'a Path,
    /// True for `sync_dir`.
    pub dir: bool,
    nodes: &'a HashMap<u64, Node>,
}

impl DurableEvent<'_> {
    /// The model at this moment (see [`CrashSnapshot`]).
    pub fn snapshot(&self) -> CrashSnapshot {
        CrashSnapshot {
            nodes: Arc::new(self.nodes.clone()),
        }
    }
}

/// Called by a [`PowerLossEnv`] just before and right after each durable operation
/// ([`PowerLossEnv::set_durable_observer`]), on the thread issuing it, with the env's model
/// locked: it must not call into the env (that deadlocks); it may take its own locks, as long as
/// no thread holds them while calling into the env.
pub type DurableObserver = Arc<dyn Fn(&DurableEvent<'_>) + Send + Sync>;

/// The observer slot of [`Shared`].
#[derive(Default)]
struct ObserverSlot(RwLock<Option<DurableObserver>>);

impl std::fmt::Debug for ObserverSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = self.0.read().map(|o| o.is_some()).unwrap_or(false);
        write!(f, "ObserverSlot({})", if set { "set" } else { "none" })
    }
}

/// Reads the real file or directory `path` into the model as durable (its entries both live
/// and durable, its bytes the durable image). `inodes` maps real inode numbers to model
/// inodes, so hard links stay links. `None` for what is neither a file nor a directory.
fn scan(
    m: &mut Model,
    path: &Path,
    inodes: &mut HashMap<(u64, u64), u64>,
) -> EnvResult<Option<u64>> {
    let meta = fs::symlink_metadata(path).map_err(|e| EnvError::new("stat", path, e))?;
    if meta.is_dir() {
        let id = m.add(Node::Dir(DirNode::default()));
        scan_dir_into(m, id, path, inodes)?;
        Ok(Some(id))
    } else if meta.is_file() {
        let key = (meta.dev(), meta.ino());
        if let Some(&id) = inodes.get(&key) {
            return Ok(Some(id));
        }
        let data = fs::read(path).map_err(|e| EnvError::new("read", path, e))?;
        let mut img = Image::default();
        for (i, chunk) in data.chunks(SECTOR).enumerate() {
            if chunk.iter().any(|&b| b != 0) {
                img.write(i as u64 * SECTOR_SIZE, chunk);
            }
        }
        img.len = data.len() as u64;
        let id = m.add(Node::File(FileNode {
            durable: img,
            pending: Vec::new(),
            open: 0,
        }));
        inodes.insert(key, id);
        Ok(Some(id))
    } else {
        Ok(None)
    }
}

/// Reads the entries of the real directory `path` into model directory `id` (see [`scan`]).
fn scan_dir_into(
    m: &mut Model,
    id: u64,
    path: &Path,
    inodes: &mut HashMap<(u64, u64), u64>,
) -> EnvResult<()> {
    let rd = fs::read_dir(path).map_err(|e| EnvError::new("readdir", path, e))?;
    let mut names = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|e| EnvError::new("readdir", path, e))?;
        names.push(entry.file_name());
    }
    names.sort();
    for name in names {
        if let Some(child) = scan(m, &path.join(&name), inodes)? {
            if let Some(d) = m.dir_mut(id) {
                d.live.insert(name.clone(), child);
                d.durable.insert(name, child);
            }
        }
    }
    Ok(())
}

/// A storage environment that simulates power loss (see the module docs of
/// [`crate::env::testing`]).
///
/// Wraps an inner environment (normally [`crate::env::DefaultEnv`]) that does the real I/O, and
/// models, for every file and directory under `root`, what is durable. [`PowerLossEnv::crash`]
/// (or a crash armed with [`PowerLossEnv::crash_after`]) replaces the files under `root` by what
/// a power loss may leave; the env is then dead: every later operation through it or a file
/// opened from it fails with `EIO`. Open a new env on the same root to "reboot".
///
/// Paths outside `root` pass through to the inner env untracked (a crash leaves them alone).
/// Symbolic links and special files under `root` are not tracked and a crash deletes them.
/// Cheap to clone (the clones share the model).
#[derive(Debug, Clone)]
pub struct PowerLossEnv {
    shared: Arc<Shared>,
}

impl PowerLossEnv {
    /// A power-loss env over `inner`, tracking everything under `root` (a directory, which need
    /// not exist yet). What exists under `root` now counts as durable and is read into memory.
    ///
    /// Never fails: when `root` cannot be read, the env starts dead (every operation fails with
    /// `EIO`); use [`PowerLossEnv::try_new`] to get the error instead.
    pub fn new(inner: Arc<dyn StorageEnv>, root: &Path) -> PowerLossEnv {
        match PowerLossEnv::try_new(inner.clone(), root) {
            Ok(env) => env,
            Err(_) => {
                let env = PowerLossEnv::build(inner, root);
                env.shared.lock().crashed = true;
                env
            }
        }
    }

    /// As [`PowerLossEnv::new`], but an error reading what exists under `root` (`stat`,
    /// `readdir`, `read`) is returned.
    pub fn try_new(inner: Arc<dyn StorageEnv>, root: &Path) -> EnvResult<PowerLossEnv> {
        let env = PowerLossEnv::build(inner, root);
        {
            let sh = &env.shared;
            let mut m = sh.lock();
            match fs::symlink_metadata(&sh.root) {
                Ok(meta) if meta.is_dir() => {
                    let mut inodes = HashMap::new();
                    scan_dir_into(&mut m, ROOT, &sh.root, &mut inodes)?;
                }
                Ok(_) => {
                    return Err(errno("open dir", &sh.root, libc::ENOTDIR));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(EnvError::new("stat", &sh.root, e)),
            }
        }
        Ok(env)
    }

    fn build(inner: Arc<dyn StorageEnv>, root: &Path) -> PowerLossEnv {
        let norm = normalize(root);
        let canonical = fs::canonicalize(&norm).ok().filter(|c| *c != norm);
        PowerLossEnv {
            shared: Arc::new(Shared {
                inner,
                root: norm,
                root_canonical: canonical,
                real_sync: AtomicBool::new(false),
                model: Mutex::new(Model::new()),
                observer: ObserverSlot::default(),
            }),
        }
    }

    /// With `on`, `sync_data` and `sync_dir` also call the inner env's (real `fdatasync` /
    /// directory `fsync`); off by default, since durability is simulated. When a real
    /// `sync_data` fails, the file's pending changes are dropped from the model (they never
    /// become durable, though reads still show them: "fsyncgate") and the error is returned.
    /// The setting is shared with the env's clones.
    pub fn with_real_sync(self, on: bool) -> PowerLossEnv {
        self.shared.real_sync.store(on, Ordering::Relaxed);
        self
    }

    /// The root directory tracked (absolute, lexically normalized).
    pub fn root(&self) -> &Path {
        &self.shared.root
    }

    /// Simulates a power loss now: deletes everything under the root and writes out the
    /// durable namespace (with `lose_unsynced_entries`) or the live one (without), each file
    /// holding its durable image plus the unsynced changes `mode` and `seed` keep. Hard links
    /// are written as hard links. The same model, mode and seed give the same result.
    ///
    /// The env is dead afterwards (every operation fails with `EIO`), even when this fails.
    ///
    /// # Errors
    /// `EIO` when the env already crashed; the real file system's error when deleting or
    /// writing the files fails (the root is then in an unspecified state).
    pub fn crash(&self, mode: CrashMode, lose_unsynced_entries: bool, seed: u64) -> EnvResult<()> {
        let mut m = self.shared.lock();
        self.shared
            .crash_locked(&mut m, mode, lose_unsynced_entries, seed)
    }

    /// Arms a crash (as [`PowerLossEnv::crash`]) right after the `n`-th durable operation
    /// (successful `sync_data` or `sync_dir`, counted from construction, 1-based) completes:
    /// that operation returns `Ok` (or the crash's error) and every later one fails with
    /// `EIO`. Replaces a crash armed earlier. When `n <= durable_ops()`, crashes now.
    ///
    /// # Errors
    /// Only when crashing now: as [`PowerLossEnv::crash`].
    pub fn crash_after(
        &self,
        n: u64,
        mode: CrashMode,
        lose_unsynced_entries: bool,
        seed: u64,
    ) -> EnvResult<()> {
        let mut m = self.shared.lock();
        if m.crashed {
            return Err(eio("crash", &self.shared.root));
        }
        if n <= m.durable_ops {
            return self
                .shared
                .crash_locked(&mut m, mode, lose_unsynced_entries, seed);
        }
        m.armed = Some(Armed {
            after: n,
            mode,
            lose_unsynced_entries,
            seed,
        });
        Ok(())
    }

    /// The number of successful durable operations (`sync_data` and `sync_dir` calls) since
    /// construction.
    pub fn durable_ops(&self) -> u64 {
        self.shared.lock().durable_ops
    }

    /// True once the env crashed (by [`PowerLossEnv::crash`] or an armed crash).
    pub fn is_crashed(&self) -> bool {
        self.shared.lock().crashed
    }

    /// A copy of the model now, from which the state any crash at this moment leaves can be
    /// written out later ([`CrashSnapshot::state`]), while the env goes on. Cheap: file pages
    /// and pending writes are shared, not copied.
    pub fn snapshot(&self) -> CrashSnapshot {
        CrashSnapshot {
            nodes: Arc::new(self.shared.lock().nodes.clone()),
        }
    }

    /// Installs (or with `None` removes) the observer called just before and right after each
    /// durable operation (see [`DurableObserver`] for what it may do). Shared with the env's
    /// clones; replaces an earlier observer.
    pub fn set_durable_observer(&self, observer: Option<DurableObserver>) {
        *self
            .shared
            .observer
            .0
            .write()
            .unwrap_or_else(|e| e.into_inner()) = observer;
    }
}

impl StorageEnv for PowerLossEnv {
    fn open(&self, path: &Path, mode: OpenMode) -> EnvResult<Arc<dyn EnvFile>> {
        let sh = &self.shared;
        let mut m = sh.lock();
        if m.crashed {
            return Err(eio("open", path));
        }
        let Some(comps) = sh.rel(path) else {
            let inner = sh.inner.open(path, mode)?;
            return Ok(Arc::new(PowerLossFile {
                shared: sh.clone(),
                inner,
                inode: None,
            }));
        };
        let existing = if comps.is_empty() {
            None
        } else {
            sh.resolve_or_adopt(&mut m, &comps)?
        };
        let inner = sh.inner.open(path, mode)?;
        let inode = match existing {
            Some(id) => match m.file_mut(id) {
                Some(f) => {
                    f.open += 1;
                    Some(id)
                }
                None => None,
            },
            None => match comps.split_last() {
                Some((name, parent)) => match sh.resolve_or_adopt(&mut m, parent)? {
                    Some(pid) if m.dir(pid).is_some() => {
                        let id = m.add(Node::File(FileNode {
                            open: 1,
                            ..FileNode::default()
                        }));
                        if let Some(d) = m.dir_mut(pid) {
                            d.live.insert(name.clone(), id);
                        }
                        Some(id)
                    }
                    _ => None,
                },
                None => None,
            },
        };
        Ok(Arc::new(PowerLossFile {
            shared: sh.clone(),
            inner,
            inode,
        }))
    }

    fn exists(&self, path: &Path) -> bool {
        let m = self.shared.lock();
        !m.crashed && self.shared.inner.exists(path)
    }

    fn create_dir(&self, path: &Path) -> EnvResult<()> {
        let sh = &self.shared;
        let mut m = sh.lock();
        if m.crashed {
            return Err(eio("mkdir", path));
        }
        let Some(comps) = sh.rel(path) else {
            return sh.inner.create_dir(path);
        };
        let existing = if comps.is_empty() {
            Some(ROOT)
        } else {
            sh.resolve_or_adopt(&mut m, &comps)?
        };
        sh.inner.create_dir(path)?;
        if existing.is_none() {
            if let Some((name, parent)) = comps.split_last() {
                if let Some(pid) = sh.resolve_or_adopt(&mut m, parent)? {
                    if m.dir(pid).is_some() {
                        let id = m.add(Node::Dir(DirNode::default()));
                        if let Some(d) = m.dir_mut(pid) {
                            d.live.insert(name.clone(), id);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn sync_dir(&self, path: &Path) -> EnvResult<()> {
        let sh = &self.shared;
        let mut m = sh.lock();
        if m.crashed {
            return Err(eio("fsync dir", path));
        }
        let target = match sh.rel(path) {
            Some(comps) => match sh.resolve_or_adopt(&mut m, &comps)? {
                Some(id) if m.dir(id).is_some() => Some(id),
                Some(_) => return Err(errno("fsync dir", path, libc::ENOTDIR)),
                None => return Err(errno("open dir", path, libc::ENOENT)),
            },
            None => None,
        };
        if target.is_none() && !sh.real_sync.load(Ordering::Relaxed) && !path.is_dir() {
            return Err(errno("open dir", path, libc::ENOENT));
        }
        sh.observe(&m, DurableStep::Before, m.durable_ops + 1, path, true);
        if sh.real_sync.load(Ordering::Relaxed) {
            sh.inner.sync_dir(path)?;
        }
        if let Some(d) = target.and_then(|id| m.dir_mut(id)) {
            d.durable = d.live.clone();
        }
        m.maybe_gc();
        sh.durable_op_done(&mut m, path, true)
    }

    fn list_dir(&self, path: &Path) -> EnvResult<Vec<String>> {
        if self.shared.lock().crashed {
            return Err(eio("readdir", path));
        }
        self.shared.inner.list_dir(path)
    }

    fn link(&self, from: &Path, to: &Path) -> EnvResult<()> {
        let sh = &self.shared;
        let mut m = sh.lock();
        if m.crashed {
            return Err(eio("link", to));
        }
        let src = match sh.rel(from) {
            Some(c) if !c.is_empty() => sh.resolve_or_adopt(&mut m, &c)?,
            _ => None,
        };
        let dst = sh.rel(to);
        let dst_parent = match &dst {
            Some(c) if !c.is_empty() => sh.resolve_or_adopt(&mut m, &c[..c.len() - 1])?,
            _ => None,
        };
        sh.inner.link(from, to)?;
        if let (Some(dst), Some(pid)) = (dst, dst_parent) {
            let Some(name) = dst.last() else {
                return Ok(());
            };
            match src {
                Some(id) => {
                    if let Some(d) = m.dir_mut(pid) {
                        d.live.insert(name.clone(), id);
                    }
                }
                // Linked from outside the root: read the new entry in as durable.
                None => {
                    sh.resolve_or_adopt(&mut m, &dst)?;
                }
            }
        }
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> EnvResult<()> {
        let sh = &self.shared;
        let mut m = sh.lock();
        if m.crashed {
            return Err(eio("rename", to));
        }
        let src_comps = sh.rel(from).filter(|c| !c.is_empty());
        let dst_comps = sh.rel(to).filter(|c| !c.is_empty());
        let src = match &src_comps {
            Some(c) => sh.resolve_or_adopt(&mut m, c)?,
            None => None,
        };
        let src_parent = match &src_comps {
            Some(c) => sh.resolve_or_adopt(&mut m, &c[..c.len() - 1])?,
            None => None,
        };
        let dst_parent = match &dst_comps {
            Some(c) => {
                // Read in a replaced entry that exists only on disk, so the model knows it.
                sh.resolve_or_adopt(&mut m, c)?;
                sh.resolve_or_adopt(&mut m, &c[..c.len() - 1])?
            }
            None => None,
        };
        sh.inner.rename(from, to)?;
        if src.is_some() && src == dst_comps.as_ref().and_then(|c| m.lookup(c)) {
            // Two names of one inode: rename does nothing.
            return Ok(());
        }
        if let (Some(c), Some(pid)) = (&src_comps, src_parent) {
            if let Some(name) = c.last() {
                m.unlink(pid, name);
            }
        }
        if let (Some(c), Some(pid)) = (&dst_comps, dst_parent) {
            if let Some(name) = c.last() {
                match src {
                    Some(id) => {
                        if let Some(d) = m.dir_mut(pid) {
                            d.live.insert(name.clone(), id);
                        }
                    }
                    None => {
                        m.unlink(pid, name);
                        sh.resolve_or_adopt(&mut m, c)?;
                    }
                }
            }
        }
        m.maybe_gc();
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> EnvResult<()> {
        let sh = &self.shared;
        let mut m = sh.lock();
        if m.crashed {
            return Err(eio("unlink", path));
        }
        let comps = sh.rel(path).filter(|c| !c.is_empty());
        let parent = match &comps {
            Some(c) => {
                sh.resolve_or_adopt(&mut m, c)?;
                sh.resolve_or_adopt(&mut m, &c[..c.len() - 1])?
            }
            None => None,
        };
        sh.inner.remove_file(path)?;
        if let (Some(c), Some(pid)) = (&comps, parent) {
            if let Some(name) = c.last() {
                m.unlink(pid, name);
            }
        }
        m.maybe_gc();
        Ok(())
    }

    fn remove_dir_all(&self, path: &Path) -> EnvResult<()> {
        let sh = &self.shared;
        let mut m = sh.lock();
        if m.crashed {
            return Err(eio("rmdir", path));
        }
        let comps = sh.rel(path);
        let target = match &comps {
            Some(c) => sh.resolve_or_adopt(&mut m, c)?,
            None => None,
        };
        sh.inner.remove_dir_all(path)?;
        if let Some(id) = target {
            m.clear_live_tree(id);
            if let Some(c) = &comps {
                if let Some((name, parent)) = c.split_last() {
                    if let Some(pid) = m.lookup(parent) {
                        m.unlink(pid, name);
                    }
                }
            }
        }
        m.maybe_gc();
        Ok(())
    }
}

/// The bytes of `bufs`, one after the other, shared.
fn concat(bufs: &[IoSlice<'_>]) -> Arc<[u8]> {
    let mut v = Vec::with_capacity(bufs.iter().map(|b| b.len()).sum());
    for b in bufs {
        v.extend_from_slice(b);
    }
    Arc::from(v)
}

/// A file opened through a [`PowerLossEnv`]: I/O goes to the real file, changes are recorded
/// as pending on the file's inode.
#[derive(Debug)]
pub struct PowerLossFile {
    shared: Arc<Shared>,
    inner: Arc<dyn EnvFile>,
    /// The model inode; `None` for files outside the root.
    inode: Option<u64>,
}

impl PowerLossFile {
    /// Runs `op` on the real file under the model lock and, when it succeeds, records `change`.
    fn change(
        &self,
        name: &'static str,
        change: impl FnOnce() -> Change,
        op: impl FnOnce(&dyn EnvFile) -> EnvResult<()>,
    ) -> EnvResult<()> {
        let mut m = self.shared.lock();
        if m.crashed {
            return Err(eio(name, self.inner.path()));
        }
        op(&*self.inner)?;
        if let Some(f) = self.inode.and_then(|id| m.file_mut(id)) {
            f.pending.push(change());
        }
        Ok(())
    }

    fn check(&self, name: &'static str) -> EnvResult<()> {
        if self.shared.lock().crashed {
            return Err(eio(name, self.inner.path()));
        }
        Ok(())
    }
}

impl Drop for PowerLossFile {
    fn drop(&mut self) {
        if let Some(id) = self.inode {
            let mut m = self.shared.lock();
            if let Some(f) = m.file_mut(id) {
                f.open = f.open.saturating_sub(1);
            }
        }
    }
}

impl EnvFile for PowerLossFile {
    fn path(&self) -> &Path {
        self.inner.path()
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> EnvResult<()> {
        self.check("pread")?;
        self.inner.read_exact_at(buf, offset)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> EnvResult<()> {
        self.change(
            "pwrite",
            || Change::Write {
                offset,
                data: Arc::from(buf),
            },
            |f| f.write_all_at(buf, offset),
        )
    }

    fn write_vectored_all_at(&self, bufs: &[IoSlice<'_>], offset: u64) -> EnvResult<()> {
        self.change(
            "pwritev",
            || Change::Write {
                offset,
                data: concat(bufs),
            },
            |f| f.write_vectored_all_at(bufs, offset),
        )
    }

    fn sync_data(&self) -> EnvResult<()> {
        let sh = &self.shared;
        let mut m = sh.lock();
        if m.crashed {
            return Err(eio("fdatasync", self.inner.path()));
        }
        sh.observe(
            &m,
            DurableStep::Before,
            m.durable_ops + 1,
            self.inner.path(),
            false,
        );
        if sh.real_sync.load(Ordering::Relaxed) {
            if let Err(e) = self.inner.sync_data() {
                if let Some(f) = self.inode.and_then(|id| m.file_mut(id)) {
                    f.pending.clear();
                }
                return Err(e);
            }
        }
        if let Some(f) = self.inode.and_then(|id| m.file_mut(id)) {
            for c in std::mem::take(&mut f.pending) {
                f.durable.apply(&c);
            }
        }
        sh.durable_op_done(&mut m, self.inner.path(), false)
    }

    fn write_vectored_and_sync(
        &self,
        bufs: &[IoSlice<'_>],
        offset: u64,
        io: JournalIo,
    ) -> EnvResult<()> {
        // The write and the sync as two changes of the model, under one lock; the real file
        // gets the inner environment's combined operation (on io_uring, the path `io` says).
        let sh = &self.shared;
        let mut m = sh.lock();
        if m.crashed {
            return Err(eio("pwritev", self.inner.path()));
        }
        let real = if sh.real_sync.load(Ordering::Relaxed) {
            self.inner.write_vectored_and_sync(bufs, offset, io)
        } else {
            crate::env::write_vectored_chunks(&*self.inner, bufs, offset)
        };
        if let Err(e) = real {
            if let Some(f) = self.inode.and_then(|id| m.file_mut(id)) {
                f.pending.clear();
            }
            return Err(e);
        }
        if let Some(f) = self.inode.and_then(|id| m.file_mut(id)) {
            f.pending.push(Change::Write {
                offset,
                data: concat(bufs),
            });
        }
        // The write is issued, its sync not done: a crash now may keep any part of it.
        sh.observe(
            &m,
            DurableStep::Before,
            m.durable_ops + 1,
            self.inner.path(),
            false,
        );
        if let Some(f) = self.inode.and_then(|id| m.file_mut(id)) {
            for c in std::mem::take(&mut f.pending) {
                f.durable.apply(&c);
            }
        }
        sh.durable_op_done(&mut m, self.inner.path(), false)
    }

    fn write_runs(
        &self,
        runs: &[crate::env::Run<'_>],
        mode: crate::env::WriteMode,
    ) -> EnvResult<()> {
        // Each run is one write of the model; the real file gets the inner environment's
        // write mode (a map, the io_uring lane).
        let mut m = self.shared.lock();
        if m.crashed {
            return Err(eio("write_runs", self.inner.path()));
        }
        self.inner.write_runs(runs, mode)?;
        if let Some(f) = self.inode.and_then(|id| m.file_mut(id)) {
            for (offset, bufs) in runs {
                f.pending.push(Change::Write {
                    offset: *offset,
                    data: concat(bufs),
                });
            }
        }
        Ok(())
    }

    fn allocate(&self, offset: u64, len: u64) -> EnvResult<()> {
        self.change(
            "fallocate",
            || Change::Allocate { offset, len },
            |f| f.allocate(offset, len),
        )
    }

    fn punch_hole(&self, offset: u64, len: u64) -> EnvResult<()> {
        self.change(
            "fallocate(PUNCH_HOLE)",
            || Change::PunchHole { offset, len },
            |f| f.punch_hole(offset, len),
        )
    }

    fn set_len(&self, len: u64) -> EnvResult<()> {
        self.change("ftruncate", || Change::SetLen(len), |f| f.set_len(len))
    }

    fn len(&self) -> EnvResult<u64> {
        self.check("fstat")?;
        self.inner.len()
    }

    fn allocated_bytes(&self) -> EnvResult<u64> {
        self.check("fstat")?;
        self.inner.allocated_bytes()
    }

    fn raw_fd(&self) -> std::os::fd::RawFd {
        self.inner.raw_fd()
    }
}

/// Everything under `root`: each path with its bytes (`None` for a directory) and the
/// index of the first path of its inode (hard links share it). Two directories compare equal
/// when they hold the same names, bytes and hard-link structure: what a crash left, against
/// what a snapshot writes ([`CrashState::write_to`]). Test helper: panics on I/O errors.
pub fn dir_tree(
    root: &Path,
) -> std::collections::BTreeMap<std::path::PathBuf, (Option<Vec<u8>>, usize)> {
    use std::collections::HashMap;
    use std::os::unix::fs::MetadataExt;
    use std::path::PathBuf;
    type Entries = Vec<(PathBuf, Option<Vec<u8>>, (u64, u64))>;
    fn walk(root: &Path, dir: &Path, out: &mut Entries) {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        for p in names {
            let meta = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            if meta.is_dir() {
                out.push((rel, None, (0, 0)));
                walk(root, &p, out);
            } else {
                out.push((
                    rel,
                    Some(std::fs::read(&p).unwrap()),
                    (meta.dev(), meta.ino()),
                ));
            }
        }
    }
    let mut v = Vec::new();
    walk(root, root, &mut v);
    let mut first: HashMap<(u64, u64), usize> = HashMap::new();
    v.into_iter()
        .enumerate()
        .map(|(i, (p, bytes, ino))| {
            let idx = if bytes.is_some() {
                *first.entry(ino).or_insert(i)
            } else {
                i
            };
            (p, (bytes, idx))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::testing::{Fault, HookedEnv, OpKind};
    use crate::env::DefaultEnv;

    fn setup() -> (tempfile::TempDir, PathBuf, PowerLossEnv) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("db");
        fs::create_dir(&root).unwrap();
        let env = PowerLossEnv::new(Arc::new(DefaultEnv::new()), &root);
        (dir, root, env)
    }

    fn is_eio<T: std::fmt::Debug>(r: EnvResult<T>) -> bool {
        matches!(r, Err(e) if e.raw_os_error() == Some(libc::EIO))
    }

    /// Creates `name` under `root` holding `data`, synced and with its entry synced.
    fn durable_file(env: &PowerLossEnv, root: &Path, name: &str, data: &[u8]) {
        let f = env.open(&root.join(name), OpenMode::Create).unwrap();
        f.write_all_at(data, 0).unwrap();
        f.sync_data().unwrap();
        env.sync_dir(root).unwrap();
    }

    const MODES: [CrashMode; 4] = [
        CrashMode::DropUnsynced,
        CrashMode::KeepPrefix,
        CrashMode::KeepSubset,
        CrashMode::TornSectors,
    ];

    #[test]
    fn unsynced_write_lost_under_drop_unsynced() {
        let (_d, root, env) = setup();
        durable_file(&env, &root, "f", b"hello");
        let f = env.open(&root.join("f"), OpenMode::Existing).unwrap();
        f.write_all_at(b"HELLO world", 0).unwrap();
        f.set_len(3).unwrap();
        env.crash(CrashMode::DropUnsynced, false, 7).unwrap();
        assert_eq!(fs::read(root.join("f")).unwrap(), b"hello");
    }

    #[test]
    fn synced_write_kept_in_every_mode() {
        for mode in MODES {
            for lose in [false, true] {
                let (_d, root, env) = setup();
                durable_file(&env, &root, "f", b"hello");
                let f = env.open(&root.join("f"), OpenMode::Existing).unwrap();
                f.write_vectored_all_at(&[IoSlice::new(b"ab"), IoSlice::new(b"cd")], 5)
                    .unwrap();
                f.sync_data().unwrap();
                env.crash(mode, lose, 3).unwrap();
                assert_eq!(fs::read(root.join("f")).unwrap(), b"helloabcd", "{mode:?}");
            }
        }
    }

    #[test]
    fn unsynced_directory_entry_lost_only_with_lose_unsynced_entries() {
        for lose in [true, false] {
            let (_d, root, env) = setup();
            env.create_dir(&root.join("sub")).unwrap();
            let f = env.open(&root.join("sub/f"), OpenMode::CreateNew).unwrap();
            f.write_all_at(b"data", 0).unwrap();
            f.sync_data().unwrap();
            env.crash(CrashMode::DropUnsynced, lose, 0).unwrap();
            if lose {
                assert!(!root.join("sub").exists());
            } else {
                assert_eq!(fs::read(root.join("sub/f")).unwrap(), b"data");
            }
        }
        // The directory synced but not the root: the directory's entry is lost, so is the file.
        let (_d, root, env) = setup();
        env.create_dir(&root.join("sub")).unwrap();
        durable_file(&env, &root.join("sub"), "f", b"x");
        env.crash(CrashMode::DropUnsynced, true, 0).unwrap();
        assert!(!root.join("sub").exists());
    }

    #[test]
    fn hard_link_synced_in_one_directory() {
        let (_d, root, env) = setup();
        env.create_dir(&root.join("a")).unwrap();
        env.create_dir(&root.join("b")).unwrap();
        env.sync_dir(&root).unwrap();
        let f = env.open(&root.join("a/f"), OpenMode::Create).unwrap();
        f.write_all_at(b"linked", 0).unwrap();
        f.sync_data().unwrap();
        env.link(&root.join("a/f"), &root.join("b/g")).unwrap();
        env.sync_dir(&root.join("b")).unwrap();
        env.crash(CrashMode::DropUnsynced, true, 0).unwrap();
        assert!(!root.join("a/f").exists());
        assert_eq!(fs::read(root.join("b/g")).unwrap(), b"linked");

        // Synced in both: both names survive, as one inode.
        let (_d, root, env) = setup();
        env.create_dir(&root.join("a")).unwrap();
        env.create_dir(&root.join("b")).unwrap();
        env.sync_dir(&root).unwrap();
        durable_file(&env, &root.join("a"), "f", b"both");
        env.link(&root.join("a/f"), &root.join("b/g")).unwrap();
        env.sync_dir(&root.join("b")).unwrap();
        let g = env.open(&root.join("b/g"), OpenMode::Existing).unwrap();
        g.write_all_at(b"BOTH", 0).unwrap();
        g.sync_data().unwrap();
        env.crash(CrashMode::DropUnsynced, true, 0).unwrap();
        assert_eq!(fs::read(root.join("a/f")).unwrap(), b"BOTH");
        let ino = |p: &Path| fs::metadata(p).unwrap().ino();
        assert_eq!(ino(&root.join("a/f")), ino(&root.join("b/g")));
    }

    #[test]
    fn rename_is_atomic() {
        for seed in 0..8 {
            for mode in MODES {
                for lose in [true, false] {
                    for sync_dir in [false, true] {
                        let (_d, root, env) = setup();
                        durable_file(&env, &root, "cur", b"old");
                        let t = env.open(&root.join("tmp"), OpenMode::CreateNew).unwrap();
                        t.write_all_at(b"new!", 0).unwrap();
                        t.sync_data().unwrap();
                        env.rename(&root.join("tmp"), &root.join("cur")).unwrap();
                        if sync_dir {
                            env.sync_dir(&root).unwrap();
                        }
                        env.crash(mode, lose, seed).unwrap();
                        let got = fs::read(root.join("cur")).unwrap();
                        assert!(got == b"old" || got == b"new!", "{got:?}");
                        if sync_dir || !lose {
                            assert_eq!(got, b"new!");
                            assert!(!root.join("tmp").exists());
                        } else {
                            assert_eq!(got, b"old");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn unsynced_unlink_comes_back_with_durable_content() {
        let (_d, root, env) = setup();
        durable_file(&env, &root, "f", b"keep");
        let f = env.open(&root.join("f"), OpenMode::Existing).unwrap();
        env.remove_file(&root.join("f")).unwrap();
        f.write_all_at(b"lost", 0).unwrap();
        env.crash(CrashMode::DropUnsynced, true, 0).unwrap();
        assert_eq!(fs::read(root.join("f")).unwrap(), b"keep");
    }

    #[test]
    fn torn_sectors_mix_old_and_new_sectors() {
        let sectors = 8;
        let mut mixed = false;
        for seed in 0..16 {
            let (_d, root, env) = setup();
            durable_file(&env, &root, "f", &vec![0u8; sectors * SECTOR]);
            let f = env.open(&root.join("f"), OpenMode::Existing).unwrap();
            f.write_all_at(&vec![0xAB; sectors * SECTOR], 0).unwrap();
            env.crash(CrashMode::TornSectors, true, seed).unwrap();
            let got = fs::read(root.join("f")).unwrap();
            assert_eq!(got.len(), sectors * SECTOR);
            let mut new = 0;
            for s in got.chunks(SECTOR) {
                assert!(s.iter().all(|&b| b == s[0]), "a sector is torn inside");
                if s[0] == 0xAB {
                    new += 1;
                }
            }
            mixed |= new > 0 && new < sectors;
        }
        assert!(mixed, "no seed kept some sectors and dropped others");
    }

    #[test]
    fn keep_prefix_keeps_a_prefix_and_keep_subset_any_subset() {
        let mut prefixes = HashSet::new();
        let mut subsets = HashSet::new();
        for seed in 0..40 {
            for mode in [CrashMode::KeepPrefix, CrashMode::KeepSubset] {
                let (_d, root, env) = setup();
                durable_file(&env, &root, "f", b"....");
                let f = env.open(&root.join("f"), OpenMode::Existing).unwrap();
                for i in 0..4u8 {
                    f.write_all_at(&[b'0' + i], u64::from(i)).unwrap();
                }
                env.crash(mode, true, seed).unwrap();
                let got = fs::read(root.join("f")).unwrap();
                let kept: Vec<bool> = got.iter().map(|&b| b != b'.').collect();
                if mode == CrashMode::KeepPrefix {
                    let k = kept.iter().take_while(|&&k| k).count();
                    assert!(kept[k..].iter().all(|&k| !k), "not a prefix: {got:?}");
                    prefixes.insert(k);
                } else {
                    subsets.insert(kept);
                }
            }
        }
        assert!(prefixes.len() >= 3, "{prefixes:?}");
        assert!(subsets.len() > 5, "{}", subsets.len());
    }

    #[test]
    fn lengths_holes_and_allocations() {
        let (_d, root, env) = setup();
        durable_file(&env, &root, "f", &vec![9u8; 3 * SECTOR]);
        let f = env.open(&root.join("f"), OpenMode::Existing).unwrap();
        f.set_len(100).unwrap();
        f.allocate(0, 5 * SECTOR_SIZE).unwrap();
        f.sync_data().unwrap();
        match f.punch_hole(10, 20) {
            Ok(()) => {}
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP)),
        }
        f.sync_data().unwrap();
        f.set_len(1).unwrap(); // unsynced
        env.crash(CrashMode::DropUnsynced, true, 0).unwrap();
        let got = fs::read(root.join("f")).unwrap();
        assert_eq!(got.len(), 5 * SECTOR);
        assert!(got[..10].iter().all(|&b| b == 9));
        assert!(got[30..100].iter().all(|&b| b == 9));
        assert!(got[100..].iter().all(|&b| b == 0));
    }

    #[test]
    fn operations_after_crash_fail_with_eio() {
        let (_d, root, env) = setup();
        durable_file(&env, &root, "f", b"x");
        let f = env.open(&root.join("f"), OpenMode::Existing).unwrap();
        env.crash(CrashMode::DropUnsynced, true, 0).unwrap();
        assert!(env.is_crashed());
        let mut b = [0u8; 1];
        assert!(is_eio(f.read_exact_at(&mut b, 0)));
        assert!(is_eio(f.write_all_at(b"y", 0)));
        assert!(is_eio(f.sync_data()));
        assert!(is_eio(f.set_len(0)));
        assert!(is_eio(f.len()));
        assert!(is_eio(env.open(&root.join("f"), OpenMode::Existing)));
        assert!(is_eio(env.create_dir(&root.join("d"))));
        assert!(is_eio(env.sync_dir(&root)));
        assert!(is_eio(env.list_dir(&root)));
        assert!(is_eio(env.rename(&root.join("f"), &root.join("g"))));
        assert!(is_eio(env.remove_file(&root.join("f"))));
        assert!(is_eio(env.crash(CrashMode::DropUnsynced, true, 0)));
        assert!(!env.exists(&root.join("f")));
        // The real files are untouched by the dead env.
        assert_eq!(fs::read(root.join("f")).unwrap(), b"x");
    }

    /// A run of changes of every kind: durable files, pending writes, a hole, a length change,
    /// a new file, a hard link, a rename and an unlink, none of them synced.
    fn busy(env: &PowerLossEnv, root: &Path) -> Arc<dyn EnvFile> {
        durable_file(env, root, "a", &[1u8; 20000]);
        durable_file(env, root, "gone", b"old");
        let f = env.open(&root.join("a"), OpenMode::Existing).unwrap();
        f.write_all_at(&[2u8; 9000], 3000).unwrap();
        f.punch_hole(12288, 4096).unwrap();
        f.set_len(18000).unwrap();
        f.write_all_at(&[3u8; 100], 17950).unwrap();
        let g = env.open(&root.join("b"), OpenMode::Create).unwrap();
        g.write_all_at(b"new file", 0).unwrap();
        env.link(&root.join("a"), &root.join("c")).unwrap();
        env.rename(&root.join("b"), &root.join("d")).unwrap();
        env.remove_file(&root.join("gone")).unwrap();
        f
    }

    /// A snapshot's state, written out after the env went on, is exactly what a crash at the
    /// snapshot's moment writes (same mode, seed and entry loss), in every mode; equal states
    /// fingerprint alike, and different ones (almost always) not.
    #[test]
    fn snapshot_state_is_what_the_crash_writes() {
        let mut prints = HashSet::new();
        for (i, &mode) in MODES.iter().enumerate() {
            for lose in [false, true] {
                for seed in [i as u64, 100 + i as u64] {
                    let (_d, root, env) = setup();
                    let f = busy(&env, &root);
                    let snap = env.snapshot();
                    // The env goes on after the snapshot.
                    f.write_all_at(&[4u8; 5000], 0).unwrap();
                    f.sync_data().unwrap();
                    env.sync_dir(&root).unwrap();
                    let state = snap.state(mode, lose, seed);
                    assert_eq!(
                        state.fingerprint(),
                        snap.state(mode, lose, seed).fingerprint()
                    );
                    prints.insert(state.fingerprint());
                    let out = _d.path().join("out");
                    state.write_to(&out).unwrap();

                    let (_d2, root2, env2) = setup();
                    let _f2 = busy(&env2, &root2);
                    env2.crash(mode, lose, seed).unwrap();
                    assert_eq!(
                        dir_tree(&out),
                        dir_tree(&root2),
                        "{mode:?} lose={lose} seed={seed}"
                    );
                    // Writing over an existing directory replaces what is there.
                    fs::write(out.join("stray"), b"x").unwrap();
                    state.write_to(&out).unwrap();
                    assert_eq!(dir_tree(&out), dir_tree(&root2));
                }
            }
        }
        assert!(prints.len() > 8, "only {} distinct states", prints.len());
    }

    /// The observer sees every durable operation twice, before and after, numbered as
    /// `durable_ops` counts, with its path; the snapshot after the n-th is what `crash_after(n)`
    /// writes, and the one before a `write_vectored_and_sync` holds its write as pending.
    #[test]
    fn durable_observer_sees_each_operation_before_and_after() {
        type Seen = Vec<(DurableStep, u64, PathBuf, bool, CrashSnapshot)>;
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let script = |env: &PowerLossEnv, root: &Path| {
            let f = env.open(&root.join("f"), OpenMode::Create).unwrap();
            f.write_all_at(b"one", 0).unwrap();
            f.sync_data()?; // 1
            env.sync_dir(root)?; // 2
            f.write_vectored_and_sync(
                &[IoSlice::new(b"tw"), IoSlice::new(b"o")],
                0,
                JournalIo::Syscalls,
            )?; // 3
            f.write_all_at(b"three", 0)?;
            f.sync_data() // 4
        };
        let (_d, root, env) = setup();
        let s2 = seen.clone();
        env.set_durable_observer(Some(Arc::new(move |e: &DurableEvent<'_>| {
            s2.lock()
                .unwrap()
                .push((e.step, e.n, e.path.to_path_buf(), e.dir, e.snapshot()))
        })));
        script(&env, &root).unwrap();
        env.set_durable_observer(None);
        env.sync_dir(&root).unwrap();
        let seen = seen.lock().unwrap();
        let steps: Vec<_> = seen
            .iter()
            .map(|(s, n, p, d, _)| (*s, *n, p.file_name().unwrap().to_owned(), *d))
            .collect();
        let f = OsString::from("f");
        let r = root.file_name().unwrap().to_owned();
        use DurableStep::{After, Before};
        assert_eq!(
            steps,
            vec![
                (Before, 1, f.clone(), false),
                (After, 1, f.clone(), false),
                (Before, 2, r.clone(), true),
                (After, 2, r, true),
                (Before, 3, f.clone(), false),
                (After, 3, f.clone(), false),
                (Before, 4, f.clone(), false),
                (After, 4, f, false),
            ]
        );
        for (step, n, _, _, snap) in seen.iter() {
            if *step == After {
                let (_d2, root2, env2) = setup();
                env2.crash_after(*n, CrashMode::KeepSubset, false, 9)
                    .unwrap();
                let _ = script(&env2, &root2);
                assert!(env2.is_crashed());
                let out = _d2.path().join("out");
                snap.state(CrashMode::KeepSubset, false, 9)
                    .write_to(&out)
                    .unwrap();
                assert_eq!(dir_tree(&out), dir_tree(&root2), "after {n}");
            }
        }
        // Before the 3rd: "one" durable, "two" pending (kept by KeepPrefix when it keeps all).
        let before3 = &seen[4].4;
        let out = _d.path().join("b3");
        before3
            .state(CrashMode::DropUnsynced, true, 0)
            .write_to(&out)
            .unwrap();
        assert_eq!(fs::read(out.join("f")).unwrap(), b"one");
        let kept: HashSet<Vec<u8>> = (0..32)
            .map(|seed| {
                before3
                    .state(CrashMode::KeepPrefix, true, seed)
                    .write_to(&out)
                    .unwrap();
                fs::read(out.join("f")).unwrap()
            })
            .collect();
        assert_eq!(kept, HashSet::from([b"one".to_vec(), b"two".to_vec()]));
    }

    #[test]
    fn crash_after_fires_right_after_the_nth_durable_op() {
        let (_d, root, env) = setup();
        env.crash_after(3, CrashMode::DropUnsynced, true, 0)
            .unwrap();
        let f = env.open(&root.join("f"), OpenMode::Create).unwrap();
        f.write_all_at(b"one", 0).unwrap();
        f.sync_data().unwrap(); // 1
        env.sync_dir(&root).unwrap(); // 2
        assert!(!env.is_crashed());
        assert_eq!(env.durable_ops(), 2);
        f.write_all_at(b"two", 0).unwrap();
        f.sync_data().unwrap(); // 3: completes, then the crash
        assert!(env.is_crashed());
        assert_eq!(env.durable_ops(), 3);
        assert!(is_eio(f.sync_data()));
        assert_eq!(fs::read(root.join("f")).unwrap(), b"two");

        // Arming at or below the count crashes now.
        let (_d, root, env) = setup();
        env.sync_dir(&root).unwrap();
        env.crash_after(1, CrashMode::DropUnsynced, true, 0)
            .unwrap();
        assert!(env.is_crashed());
    }

    #[test]
    fn existing_files_and_links_count_as_durable() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("db");
        fs::create_dir_all(root.join("s")).unwrap();
        fs::write(root.join("s/a"), b"pre").unwrap();
        fs::hard_link(root.join("s/a"), root.join("b")).unwrap();
        let env = PowerLossEnv::try_new(Arc::new(DefaultEnv::new()), &root).unwrap();
        let f = env.open(&root.join("b"), OpenMode::Existing).unwrap();
        f.write_all_at(b"PRE", 0).unwrap();
        f.sync_data().unwrap();
        env.crash(CrashMode::DropUnsynced, true, 0).unwrap();
        assert_eq!(fs::read(root.join("s/a")).unwrap(), b"PRE");
        let ino = |p: &Path| fs::metadata(p).unwrap().ino();
        assert_eq!(ino(&root.join("s/a")), ino(&root.join("b")));
    }

    #[test]
    fn missing_root_and_unnormalized_paths() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("db");
        let env = PowerLossEnv::new(Arc::new(DefaultEnv::new()), &root);
        env.create_dir(&root).unwrap();
        env.create_dir(&root.join("x")).unwrap();
        durable_file(&env, &root.join("x/../x/."), "f", b"norm");
        env.sync_dir(&root.join("./")).unwrap();
        env.crash(CrashMode::DropUnsynced, true, 0).unwrap();
        assert_eq!(fs::read(root.join("x/f")).unwrap(), b"norm");
    }

    #[test]
    fn remove_dir_all_is_pending_until_the_parent_is_synced() {
        let (_d, root, env) = setup();
        env.create_dir(&root.join("d")).unwrap();
        env.sync_dir(&root).unwrap();
        durable_file(&env, &root.join("d"), "f", b"in d");
        env.remove_dir_all(&root.join("d")).unwrap();
        env.crash(CrashMode::DropUnsynced, true, 0).unwrap();
        assert_eq!(fs::read(root.join("d/f")).unwrap(), b"in d");

        let (_d, root, env) = setup();
        env.create_dir(&root.join("d")).unwrap();
        env.sync_dir(&root).unwrap();
        env.remove_dir_all(&root.join("d")).unwrap();
        env.sync_dir(&root).unwrap();
        env.crash(CrashMode::DropUnsynced, true, 0).unwrap();
        assert!(!root.join("d").exists());
    }

    #[test]
    fn unreachable_inodes_are_collected() {
        let (_d, root, env) = setup();
        for i in 0..1500 {
            let p = root.join(format!("f{i}"));
            drop(env.open(&p, OpenMode::CreateNew).unwrap());
            env.remove_file(&p).unwrap();
        }
        env.sync_dir(&root).unwrap();
        assert!(env.shared.lock().nodes.len() <= 1025);
    }

    #[test]
    fn failed_real_sync_drops_pending_changes() {
        let (_d, root, _) = setup();
        let hooked = Arc::new(HookedEnv::new(Arc::new(DefaultEnv::new())));
        let env = PowerLossEnv::new(hooked.clone(), &root).with_real_sync(true);
        durable_file(&env, &root, "f", b"aaaa");
        let f = env.open(&root.join("f"), OpenMode::Existing).unwrap();
        f.write_all_at(b"bbbb", 0).unwrap();
        hooked.fail(OpKind::SyncData, 1, Fault::Eio);
        assert!(is_eio(f.sync_data()));
        f.sync_data().unwrap();
        env.crash(CrashMode::KeepPrefix, true, 1).unwrap();
        assert_eq!(fs::read(root.join("f")).unwrap(), b"aaaa");
    }

    /// Two descriptors of one file (the journal writer's and the background pre-zeroer's):
    /// `fdatasync` of either makes the writes of both durable, and a write through one that no
    /// sync covered is lost at a crash; closing one descriptor loses nothing.
    #[test]
    fn second_descriptor_of_a_file_shares_its_inode() {
        let (_d, root, env) = setup();
        let a = env.open(&root.join("f"), OpenMode::CreateNew).unwrap();
        a.write_all_at(b"hello", 0).unwrap();
        a.sync_data().unwrap();
        env.sync_dir(&root).unwrap();
        // Opened again by a new name (as a pool file renamed into place is).
        env.rename(&root.join("f"), &root.join("g")).unwrap();
        env.sync_dir(&root).unwrap();
        let b = env.open(&root.join("g"), OpenMode::Existing).unwrap();
        a.write_all_at(b"HE", 0).unwrap();
        b.write_all_at(&[7u8; 4096], 4096).unwrap();
        b.sync_data().unwrap();
        drop(b);
        a.write_all_at(b"lost", 0).unwrap();
        env.crash(CrashMode::DropUnsynced, true, 1).unwrap();
        let mut want = b"HEllo".to_vec();
        want.resize(4096, 0);
        want.extend_from_slice(&[7u8; 4096]);
        assert_eq!(fs::read(root.join("g")).unwrap(), want);
        assert!(!root.join("f").exists());

        // A failed real sync through one descriptor drops the other's unsynced writes too.
        let (_d, root, _) = setup();
        let hooked = Arc::new(HookedEnv::new(Arc::new(DefaultEnv::new())));
        let env = PowerLossEnv::new(hooked.clone(), &root).with_real_sync(true);
        durable_file(&env, &root, "f", b"aaaa");
        let a = env.open(&root.join("f"), OpenMode::Existing).unwrap();
        let b = env.open(&root.join("f"), OpenMode::Existing).unwrap();
        a.write_all_at(b"bb", 0).unwrap();
        hooked.fail(OpKind::SyncData, 1, Fault::Eio);
        assert!(is_eio(b.sync_data()));
        a.sync_data().unwrap();
        env.crash(CrashMode::KeepSubset, true, 2).unwrap();
        assert_eq!(fs::read(root.join("f")).unwrap(), b"aaaa");
    }

    #[test]
    fn concurrent_writers() {
        let (_d, root, env) = setup();
        std::thread::scope(|s| {
            for t in 0..4u8 {
                let env = env.clone();
                let root = root.clone();
                s.spawn(move || {
                    let f = env
                        .open(&root.join(format!("t{t}")), OpenMode::Create)
                        .unwrap();
                    for i in 0..50u64 {
                        f.write_all_at(&[t; 100], i * 100).unwrap();
                        f.sync_data().unwrap();
                    }
                });
            }
        });
        env.sync_dir(&root).unwrap();
        assert_eq!(env.durable_ops(), 201);
        env.crash(CrashMode::TornSectors, true, 5).unwrap();
        for t in 0..4u8 {
            assert_eq!(fs::read(root.join(format!("t{t}"))).unwrap(), vec![t; 5000]);
        }
    }

    #[test]
    fn image_set_len_and_zero() {
        let mut img = Image::default();
        img.write(4090, &[1u8; 20]);
        assert_eq!(img.len, 4110);
        img.set_len(4095);
        img.set_len(5000);
        img.zero(4091, 2);
        let page0 = &img.pages[&0];
        assert_eq!(&page0[4089..4096], &[0, 1, 0, 0, 1, 1, 0]);
        assert!(img.pages.get(&1).is_none_or(|p| p.iter().all(|&b| b == 0)));
        assert_eq!(
            sector_pieces(4000, 5000),
            vec![(4000, 96), (4096, 4096), (8192, 808)]
        );
    }
}
