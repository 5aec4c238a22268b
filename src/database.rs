//! [`Database`]: one root storage (documents) and many branch storages (indexes) whose commits
//! share one write-ahead journal.
//!
//! ```text
//! <db>/                     the root storage
//!   LOCK  data.pages  Journals/0000000000000015.journal
//!   Indexes/<name>/         a branch storage (opens standalone too)
//!     data.pages  Journals/0000000000000015.journal   hard link to the root's file
//! ```
//! In [`JournalMode::Shared`] one [`Journal`] in the root's `Journals/` takes the commits of
//! every storage: commits that arrive while a batch is written join the next one (one
//! `pwritev`, one `fdatasync`). The first record of a branch in a journal file hard-links the
//! file into the branch's `Journals/` and writes a link record in the same batch instead of
//! fsyncing the branch directory. Opening the database re-creates any link a link record names
//! that is missing, fsyncs every branch's `Journals/` once, then each storage recovers from its
//! own directory. [`JournalMode::Separate`] gives every storage its own journal and its own
//! `fdatasync`: the baseline the benchmarks compare against.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::env::{OpenMode, StorageEnv};
use crate::error::{Error, Result};
use crate::flush::open_storage;
use crate::journal::record::RecordKind;
use crate::journal::{recovery, Journal, JournalConfig, JournalStats};
use crate::options::{JournalMode, Options};
use crate::storage::{
    init_files, lock, read_header, take_lock, Binding, Storage, DATA_FILE, JOURNALS_DIR,
};

pub use crate::storage::INDEXES_DIR;
const DROPPED_PREFIX: &str = ".dropped-";

/// Checks a storage name: 1..=255 bytes of UTF-8, no `/`, `\` or NUL, not `.` or `..`, and not
/// starting with `.dropped-` (reserved).
pub fn validate_storage_name(name: &str) -> Result<()> {
    let bad = |reason| {
        Err(Error::InvalidStorageName {
            name: name.to_string(),
            reason,
        })
    };
    if name.is_empty() {
        return bad("empty");
    }
    if name.len() > 255 {
        return bad("longer than 255 bytes");
    }
    if name == "." || name == ".." {
        return bad("`.` and `..` are not names");
    }
    if name.contains(['/', '\\', '\0']) {
        return bad("contains `/`, `\\` or NUL");
    }
    if name.starts_with(DROPPED_PREFIX) {
        return bad("names starting with `.dropped-` are reserved");
    }
    Ok(())
}

/// Counters of a database's journal(s) since open. In separate mode, the sums over every
/// storage's own journal.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DatabaseStats {
    /// Commit records acknowledged.
    pub commits: u64,
    /// Batches written (one vectored write and one `fdatasync` each).
    pub batches: u64,
    /// Commits per batch (group commit factor).
    pub commits_per_batch: f64,
    /// Bytes written per batch (records, link records and padding).
    pub bytes_per_batch: f64,
    /// Bytes written to journals.
    pub journal_bytes: u64,
    /// `fdatasync` calls on journal files.
    pub journal_fdatasyncs: u64,
    /// `fsync` calls on journal directories.
    pub dir_fsyncs: u64,
    /// Hard links made into branch storages.
    pub links_made: u64,
    /// Journal files still held by some storage directory.
    pub journal_files_live: u64,
    /// Pre-zeroed journal files ready in the pool.
    pub prezeroed_ready: u64,
    /// Open storages (root included).
    pub storages: u64,
}

impl DatabaseStats {
    fn add(&mut self, j: &JournalStats) {
        self.commits += j.commits;
        self.batches += j.batches;
        self.journal_bytes += j.bytes;
        self.journal_fdatasyncs += j.fdatasyncs;
        self.dir_fsyncs += j.dir_syncs;
        self.links_made += j.links_made;
        self.journal_files_live += j.files_live;
        self.prezeroed_ready += j.pool_ready;
    }
}

struct DbInner {
    path: PathBuf,
    opts: Options,
    root: Storage,
    journal: Option<Arc<Journal>>,
    branches: Mutex<BTreeMap<String, Storage>>,
    /// Branch storages that failed to open as damaged, with why.
    damaged: BTreeMap<String, Error>,
    dev: u64,
    closed: AtomicBool,
}

/// A database: a root storage and its branch storages, sharing one journal by default.
/// Cheap to clone, `Send + Sync`.
#[derive(Clone)]
pub struct Database {
    inner: Arc<DbInner>,
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Database({})", self.inner.path.display())
    }
}

fn io_err(op: &'static str, path: &Path, e: std::io::Error) -> Error {
    Error::Io {
        op,
        path: path.to_path_buf(),
        source: e,
    }
}

impl Database {
    /// Opens the database in directory `path` (the root storage), creating it when missing,
    /// recovering the root first (re-creating missing links from link records), then every
    /// branch storage under `Indexes/`.
    ///
    /// Errors: as [`Storage::open`]; [`Error::CrossDevice`] when a branch directory is on
    /// another file system than the root in shared mode (hard links cannot cross it).
    pub fn open(path: impl AsRef<Path>, opts: Options) -> Result<Database> {
        let lock_path = path.as_ref().join(crate::storage::LOCK_FILE);
        let lock_existed = lock_path.exists();
        let read_only = opts.read_only;
        // INFO: opening and recovering (the root, then every branch) is not steady state.
        let _span = tracing::info_span!("open database", path = %path.as_ref().display()).entered();
        let r = Database::open_inner(path.as_ref(), opts);
        if matches!(r, Err(Error::NotAStorage { .. })) && !lock_existed && !read_only {
            // Leave a directory that is not a database as it was.
            let _ = std::fs::remove_file(&lock_path);
        }
        r
    }

    fn open_inner(path: &Path, opts: Options) -> Result<Database> {
        opts.validate()?;
        // Every operation retries EINTR/EAGAIN a bounded number of times (`env::retry`).
        let mut opts = opts;
        opts.env = crate::env::retry::wrap(opts.env);
        let env = opts.env.clone();
        let path = path.to_path_buf();
        let mut created = false;
        if !env.exists(&path) {
            if !opts.create || opts.read_only {
                return Err(Error::NotAStorage {
                    path,
                    reason: "the directory does not exist".into(),
                });
            }
            env.create_dir(&path)?;
            created = true;
        }
        let lock_file = take_lock(&path, opts.read_only)?;
        let indexes = path.join(INDEXES_DIR);
        let data_path = path.join(DATA_FILE);
        let fresh = !env.exists(&data_path);
        if fresh {
            if let Some(e) = crate::storage::missing_data_file_is_damage(&*env, &path, &data_path)?
            {
                return Err(e);
            }
            let names = env.list_dir(&path)?;
            if let Some(n) = names
                .iter()
                .find(|n| !["LOCK", JOURNALS_DIR, INDEXES_DIR].contains(&n.as_str()))
            {
                return Err(Error::NotAStorage {
                    path,
                    reason: format!("no {DATA_FILE}, and the directory holds other files ({n})"),
                });
            }
        }
        if !env.exists(&indexes) {
            if opts.read_only {
                return Err(Error::NotAStorage {
                    path,
                    reason: "no Indexes directory".into(),
                });
            }
            env.create_dir(&indexes)?;
            env.sync_dir(&indexes)?;
            env.sync_dir(&path)?;
        }
        let names = branch_names(&*env, &indexes, opts.read_only)?;
        let dev = std::fs::metadata(&path)
            .map_err(|e| io_err("stat", &path, e))?
            .dev();
        let mut damaged = BTreeMap::new();
        let (root, journal, branches) = match opts.journal_mode {
            JournalMode::Shared if !opts.read_only => {
                let data = env.open(&data_path, OpenMode::Create)?;
                let len = data.len()?;
                // The same rule as `Storage::open` (this path creates the root itself).
                let journals = path.join(JOURNALS_DIR);
                if len == 0 && crate::storage::journal_files_exist(&*env, &journals)? {
                    return Err(crate::storage::damaged_data_file(
                        &data_path,
                        &journals,
                        "the data file is empty",
                    ));
                }
                // A new root, or one whose creation crashed before anything was committed.
                if len == 0
                    || crate::storage::unfinished_creation(
                        &*env,
                        &*data,
                        len,
                        &path.join(JOURNALS_DIR),
                    )?
                {
                    init_files(&*env, &path, &*data, created)?;
                }
                let (hdr, _) = read_header(&*data, &data_path)?;
                drop(data);
                relink(&*env, &path)?;
                // Every link made in earlier sessions becomes durable now (DESIGN invariant 5).
                let mut first_no = max_journal_no(&*env, &path.join(JOURNALS_DIR))?;
                for n in &names {
                    let j = indexes.join(n).join(JOURNALS_DIR);
                    if env.exists(&j) {
                        env.sync_dir(&j)?;
                        first_no = first_no.max(max_journal_no(&*env, &j)?);
                    }
                }
                let cfg = JournalConfig {
                    file_size: opts.journal_file_size,
                    prezero: opts.journal_prezero,
                    pool_files: opts.journal_pool_files.max(1),
                };
                let journal = Journal::open(env.clone(), hdr.storage_id, &path, first_no + 1, cfg)?;
                let root = open_storage(
                    &path,
                    opts.clone(),
                    Binding::Shared {
                        journal: journal.clone(),
                        rel: String::new(),
                        lock: Some(lock_file),
                    },
                )?;
                let mut branches = BTreeMap::new();
                for n in names {
                    match open_branch(&opts, &path, &n, Some(&journal), dev) {
                        Ok(s) => {
                            branches.insert(n, s);
                        }
                        Err(e) if is_damage(&e) => {
                            damaged.insert(n, e);
                        }
                        Err(e) => return Err(e),
                    }
                }
                (root, Some(journal), branches)
            }
            _ => {
                let root = open_storage(
                    &path,
                    opts.clone(),
                    Binding::Own {
                        lock: Some(lock_file),
                    },
                )?;
                let mut branches = BTreeMap::new();
                for n in names {
                    match open_branch(&opts, &path, &n, None, dev) {
                        Ok(s) => {
                            branches.insert(n, s);
                        }
                        Err(e) if is_damage(&e) => {
                            damaged.insert(n, e);
                        }
                        Err(e) => return Err(e),
                    }
                }
                (root, None, branches)
            }
        };
        if !damaged.is_empty() {
            let names: Vec<String> = damaged.keys().cloned().collect();
            for (n, e) in &damaged {
                tracing::info!(storage = %n, error = %e, "damaged storage: the others open; it is left out (Database::damaged)");
            }
            if !opts.write_with_damaged_storages {
                root.inner.refuse_writes(names.clone());
                for s in branches.values() {
                    s.inner.refuse_writes(names.clone());
                }
            }
        }
        Ok(Database {
            inner: Arc::new(DbInner {
                path,
                opts,
                root,
                journal,
                branches: Mutex::new(branches),
                damaged,
                dev,
                closed: AtomicBool::new(false),
            }),
        })
    }

    /// The shared journal (shared mode), for the actor runtime's journal writer.
    pub(crate) fn shared_journal(&self) -> Option<Arc<Journal>> {
        self.inner.journal.clone()
    }

    /// The database directory.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The root storage (documents).
    pub fn root(&self) -> Storage {
        self.inner.root.clone()
    }

    /// The branch storage `name` (`Indexes/<name>/`), created when missing.
    ///
    /// Errors: [`Error::InvalidStorageName`]; [`Error::Closed`]; [`Error::CrossDevice`];
    /// errors of opening a storage.
    pub fn storage(&self, name: &str) -> Result<Storage> {
        validate_storage_name(name)?;
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if let Some(e) = self.inner.damaged.get(name) {
            return Err(e.clone());
        }
        let mut map = lock(&self.inner.branches);
        if let Some(s) = map.get(name) {
            return Ok(s.clone());
        }
        if self.inner.opts.read_only {
            return Err(Error::ReadOnly);
        }
        let s = open_branch(
            &self.inner.opts,
            &self.inner.path,
            name,
            self.inner.journal.as_ref(),
            self.inner.dev,
        )?;
        map.insert(name.to_string(), s.clone());
        Ok(s)
    }

    /// The branch storages that failed to open because they are damaged, with the error each
    /// gave ([`Error::Corruption`] or [`Error::NotAStorage`]: a truncated or foreign data file,
    /// both header pages bad, a journal whose txn ids are not contiguous...), in name order.
    /// The rest of the database opened; [`Database::storage`] returns that error for these
    /// names, and until they are repaired or dropped every write fails with
    /// [`Error::DatabaseDamaged`] unless [`Options::write_with_damaged_storages`] is set.
    pub fn damaged(&self) -> Vec<(String, Error)> {
        self.inner
            .damaged
            .iter()
            .map(|(n, e)| (n.clone(), e.clone()))
            .collect()
    }

    /// Names of the branch storages that opened, sorted (damaged ones: [`Database::damaged`]).
    pub fn storages(&self) -> Vec<String> {
        lock(&self.inner.branches).keys().cloned().collect()
    }

    /// Removes branch storage `name` for good: when this returns, the removal is durable and
    /// the storage never comes back after a crash. Handles to it fail with [`Error::Closed`].
    ///
    /// Errors: [`Error::InvalidStorageName`]; [`Error::NotAStorage`] when there is no such
    /// storage; I/O errors of the rename or directory sync.
    pub fn drop_storage(&self, name: &str) -> Result<()> {
        validate_storage_name(name)?;
        if self.inner.opts.read_only {
            return Err(Error::ReadOnly);
        }
        let mut map = lock(&self.inner.branches);
        let Some(s) = map.remove(name) else {
            return Err(Error::NotAStorage {
                path: self.inner.path.join(INDEXES_DIR).join(name),
                reason: "no such storage".into(),
            });
        };
        s.close_for_drop();
        let env = &self.inner.opts.env;
        let indexes = self.inner.path.join(INDEXES_DIR);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let tomb = indexes.join(format!("{DROPPED_PREFIX}{nanos}"));
        env.rename(&indexes.join(name), &tomb)?;
        env.sync_dir(&indexes)?;
        if let Some(j) = &self.inner.journal {
            j.unregister(s.storage_id());
        }
        drop(s);
        if let Err(e) = env.remove_dir_all(&tomb) {
            tracing::warn!(error = %e, "removing a dropped storage failed; it is removed at the next open");
        }
        Ok(())
    }

    /// Counters of the journal(s): commits, batches, group-commit factor, fdatasyncs, links.
    pub fn stats(&self) -> DatabaseStats {
        let branches = lock(&self.inner.branches);
        let mut st = DatabaseStats {
            storages: branches.len() as u64 + 1,
            ..Default::default()
        };
        match &self.inner.journal {
            Some(j) => st.add(&j.stats()),
            None => {
                st.add(&self.inner.root.journal().stats());
                for s in branches.values() {
                    st.add(&s.journal().stats());
                }
            }
        }
        if st.batches > 0 {
            st.commits_per_batch = st.commits as f64 / st.batches as f64;
            st.bytes_per_batch = st.journal_bytes as f64 / st.batches as f64;
        }
        st
    }

    /// Flushes every storage.
    pub fn flush(&self) -> Result<()> {
        let branches: Vec<Storage> = lock(&self.inner.branches).values().cloned().collect();
        for s in branches {
            s.flush()?;
        }
        self.inner.root.flush()
    }

    /// Flushes and closes every storage; later calls fail with [`Error::Closed`]. Returns the
    /// first error met (every storage is closed regardless).
    pub fn close(self) -> Result<()> {
        self.inner.closed.store(true, Ordering::Release);
        let branches: Vec<Storage> = std::mem::take(&mut *lock(&self.inner.branches))
            .into_values()
            .collect();
        let mut first = Ok(());
        for s in branches {
            if let Err(e) = s.close() {
                first = first.and(Err(e));
            }
        }
        let r = self.inner.root.clone().close();
        first.and(r)
    }
}

/// Errors that mean a branch storage itself is damaged (the database opens without it), as
/// opposed to errors of the environment or the caller (which fail the open).
fn is_damage(e: &Error) -> bool {
    matches!(
        e,
        Error::Corruption(_) | Error::NotAStorage { .. } | Error::FormatVersion { .. }
    )
}

fn open_branch(
    opts: &Options,
    root: &Path,
    name: &str,
    journal: Option<&Arc<Journal>>,
    dev: u64,
) -> Result<Storage> {
    let dir = root.join(INDEXES_DIR).join(name);
    if journal.is_some() {
        if let Ok(m) = std::fs::metadata(&dir) {
            if m.dev() != dev || !same_mount(root, &dir) {
                return Err(Error::CrossDevice { path: dir });
            }
        }
    }
    let binding = match journal {
        Some(j) => Binding::Shared {
            journal: j.clone(),
            rel: format!("{INDEXES_DIR}/{name}"),
            lock: None,
        },
        None => Binding::Own { lock: None },
    };
    let s = open_storage(&dir, opts.clone(), binding)?;
    if journal.is_some() {
        let m = std::fs::metadata(&dir).map_err(|e| io_err("stat", &dir, e))?;
        if m.dev() != dev || !same_mount(root, &dir) {
            return Err(Error::CrossDevice { path: dir });
        }
    }
    Ok(s)
}

/// False when `a` and `b` are known to lie on different mounts (`statx` mount ids, Linux 5.8
/// and later). Regression (issue 12, fault kinds): a branch directory bind-mounted from the
/// root's own file system has the root's device number, so the device check let it open; the
/// first commit's hard link into it then failed with `EXDEV` (links never cross mounts, even of
/// one file system), failing the batch and poisoning the whole database. `true` when either
/// mount id is unknown (the device check still applies, and a link's `EXDEV` still surfaces
/// as [`Error::CrossDevice`]).
fn same_mount(a: &Path, b: &Path) -> bool {
    use rustix::fs::{statx, AtFlags, StatxFlags, CWD};
    let id = |p: &Path| {
        statx(CWD, p, AtFlags::empty(), StatxFlags::MNT_ID)
            .ok()
            .filter(|x| StatxFlags::from_bits_retain(x.stx_mask).contains(StatxFlags::MNT_ID))
            .map(|x| x.stx_mnt_id)
    };
    match (id(a), id(b)) {
        (Some(x), Some(y)) => x == y,
        _ => true,
    }
}

/// Branch directory names under `Indexes/`; removes leftovers of dropped storages (unless
/// `read_only`: a read-only open writes nothing, and skips them).
fn branch_names(env: &dyn StorageEnv, indexes: &Path, read_only: bool) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for n in env.list_dir(indexes)? {
        if n.starts_with(DROPPED_PREFIX) {
            if read_only {
                continue;
            }
            if let Err(e) = env.remove_dir_all(&indexes.join(&n)) {
                tracing::warn!(error = %e, "removing a dropped storage failed");
            }
            continue;
        }
        if validate_storage_name(&n).is_ok() && env.exists(&indexes.join(&n).join(DATA_FILE)) {
            out.push(n);
        }
    }
    out.sort();
    Ok(out)
}

fn max_journal_no(env: &dyn StorageEnv, dir: &Path) -> Result<u64> {
    if !env.exists(dir) {
        return Ok(0);
    }
    Ok(recovery::list(env, dir)?
        .last()
        .map(|(n, _)| *n)
        .unwrap_or(0))
}

/// Re-creates every branch link that a link record in the root's journal files names and that
/// is missing (DESIGN invariant 7), then syncs the directories it linked into.
fn relink(env: &dyn StorageEnv, root: &Path) -> Result<()> {
    let dir = root.join(JOURNALS_DIR);
    if !env.exists(&dir) {
        return Ok(());
    }
    for (no, file) in recovery::list(env, &dir)? {
        let mut wanted: Vec<String> = Vec::new();
        recovery::scan(env, &file, no, &[], |h, body, _| {
            if h.kind == RecordKind::Link {
                if let Some(rel) = body.get(8..).and_then(|b| std::str::from_utf8(b).ok()) {
                    wanted.push(rel.to_string());
                }
            }
            Ok(())
        })?;
        wanted.sort();
        wanted.dedup();
        for rel in wanted {
            let Some(name) = rel.strip_prefix(&format!("{INDEXES_DIR}/")) else {
                continue;
            };
            if validate_storage_name(name).is_err() {
                continue;
            }
            let bdir = root.join(INDEXES_DIR).join(name).join(JOURNALS_DIR);
            let target = bdir.join(crate::journal::file_name(no));
            if !env.exists(&bdir) || env.exists(&target) {
                continue;
            }
            tracing::info!(link = %target.display(), "re-creating a journal link from its link record");
            env.link(&file, &target)?;
            env.sync_dir(&bdir)?;
        }
    }
    Ok(())
}
