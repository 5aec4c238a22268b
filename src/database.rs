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
use crate::error::{Error, GroupError, Result};
use crate::flush::open_storage;
use crate::group::GroupTransaction;
use crate::journal::record::RecordKind;
use crate::journal::{recovery, Journal, JournalConfig, JournalStats};
use crate::layout::{DATA_FILE, INDEXES_DIR, JOURNALS_DIR};
use crate::options::{JournalMode, Options};
use crate::storage::{
    classify_data_file, init_files, lock, read_header, take_lock, Binding, DataFile, Storage,
};
use crate::storage::{writer_live, OnePoint};

const DROPPED_PREFIX: &str = ".dropped-";

/// Checks a storage name: 1..=255 bytes of UTF-8, no `/`, `\` or NUL, not `.` or `..`, and not
/// starting with `.dropped-` (reserved). Public as [`Database::validate_storage_name`].
fn validate_storage_name(name: &str) -> Result<()> {
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
    /// Released journal files reused through the pool instead of deleted
    /// ([`JournalStats::files_recycled`]).
    pub journal_files_recycled: u64,
    /// Bytes of zeros written into journal files ahead of their records: whole new pool files,
    /// windows ahead of the write position and inline zeroing (the sum of
    /// [`JournalStats::pool_zero_bytes`], `background_zero_bytes` and `inline_zero_bytes`; a
    /// file created on the commit path because the pool was empty counts in `files_created`).
    pub journal_zero_bytes: u64,
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
        self.journal_files_recycled += j.files_recycled;
        self.journal_zero_bytes +=
            j.pool_zero_bytes + j.background_zero_bytes + j.inline_zero_bytes;
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
    /// Held shared by each group transaction from its journal write until every storage of it
    /// has published its part, and exclusively by a backup while it takes its states at one
    /// point of the journal: a backup never copies part of a group (an eventual group is
    /// published before it is durable, one storage after another).
    groups: Arc<std::sync::RwLock<()>>,
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
        let lock_path = path.as_ref().join(crate::layout::LOCK_FILE);
        let lock_existed = lock_path.exists();
        let read_only = opts.read_only;
        // INFO: opening and recovering (the root, then every branch) is not steady state.
        let _span = tracing::info_span!("open database", path = %path.as_ref().display()).entered();
        let r = Database::open_inner(path.as_ref(), opts);
        if r.is_err() && !lock_existed && !read_only {
            // A refused open creates nothing: leave the directory as it was.
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
            let names = env.list_dir(&path)?;
            if let Some(e) = crate::storage::unfinished_backup(&path, &names) {
                return Err(e);
            }
            if let Some(e) = crate::storage::missing_data_file_is_damage(&*env, &path, &data_path)?
            {
                return Err(e);
            }
            if let Some(n) = names
                .iter()
                .find(|n| !["LOCK", JOURNALS_DIR, INDEXES_DIR].contains(&n.as_str()))
            {
                return Err(Error::NotAStorage {
                    path,
                    reason: format!("no {DATA_FILE}, and the directory holds other files ({n})"),
                });
            }
            if !opts.create || opts.read_only {
                return Err(Error::NotAStorage {
                    path,
                    reason: format!("no {DATA_FILE}"),
                });
            }
        }
        if !env.exists(&indexes) {
            if !fresh {
                // Nothing is added to a directory before its data file is known to be a
                // storage's (regression: a refused open of a directory holding someone else's
                // `data.pages` left an `Indexes/` directory in it), and a read-only open says
                // what is wrong with a data file that is no storage's before anything else.
                let data = env.open(&data_path, OpenMode::ReadOnly)?;
                let len = data.len()?;
                let class =
                    classify_data_file(&*env, &path, &*data, len, opts.read_only, opts.create)?;
                if class == DataFile::Existing {
                    crate::storage::read_header_or_damage(
                        &*env,
                        &*data,
                        &data_path,
                        &path.join(JOURNALS_DIR),
                    )?;
                }
            }
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
                // The same classification as `Storage::open` (this path creates the root itself).
                let journals = path.join(JOURNALS_DIR);
                // A new root, or one whose creation crashed before anything was committed.
                if classify_data_file(&*env, &path, &*data, len, false, opts.create)?
                    == DataFile::Create
                {
                    init_files(&*env, &path, &*data, created)?;
                }
                let (hdr, _) =
                    crate::storage::read_header_or_damage(&*env, &*data, &data_path, &journals)?;
                drop(data);
                // Names of journal files lost while another name of the file holds records not
                // flushed yet: linked back before anything is recovered, flushed or released.
                let files = survey(&*env, &path, hdr.storage_id, &names)?;
                let missing = missing_names(&*env, &path, &files, &hdr, &names);
                relink(&*env, &path, &missing)?;
                // Every link made by earlier opens becomes durable now (design.md invariant I5).
                let mut first_no = max_journal_no(&*env, &path.join(JOURNALS_DIR))?;
                for n in &names {
                    let j = indexes.join(n).join(JOURNALS_DIR);
                    if env.exists(&j) {
                        env.sync_dir(&j)?;
                        first_no = first_no.max(max_journal_no(&*env, &j)?);
                    }
                }
                let cfg = JournalConfig {
                    pool_files: opts.journal_pool_files.max(1),
                    ..JournalConfig::of(&opts)
                };
                // Never below the header's start statement: the journal opens before the root
                // recovers, and a new file that took the number of a stated file whose every
                // name was deleted would pass the statement's check in its place (a read-write
                // open then dropped every unflushed commit silently).
                first_no = first_no.max(hdr.journal_started);
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
                    match open_branch(&opts, &path, &n, Some(&journal), dev, Vec::new(), None) {
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
            _ if opts.journal_mode == JournalMode::Shared && lock_file.slot().is_some() => {
                // Read-only beside a writer that may be live: every storage at one point of
                // the shared journal, tried again while the writer moves under it.
                let (root, branches, d) =
                    read_at_one_point(&*env, &path, &opts, names, dev, lock_file)?;
                damaged = d;
                (root, None, branches)
            }
            _ => {
                // Read-only, a shared journal's files may be reached through another name where
                // a storage's own is missing (nothing is repaired: nothing is written).
                let mut borrowed = match opts.journal_mode {
                    JournalMode::Shared => borrowed_names(&*env, &path, &names)?,
                    JournalMode::Separate => BTreeMap::new(),
                };
                let root = open_storage(
                    &path,
                    opts.clone(),
                    Binding::Own {
                        lock: Some(lock_file),
                        borrowed: borrowed.remove(&None).unwrap_or_default(),
                        at: None,
                    },
                )?;
                let mut branches = BTreeMap::new();
                for n in names {
                    let b = borrowed.remove(&Some(n.clone())).unwrap_or_default();
                    match open_branch(&opts, &path, &n, None, dev, b, None) {
                        Ok(s) => {
                            branches.insert(n, s);
                        }
                        // Read-only, a branch this user cannot read (EACCES, a failing device)
                        // is left out as a damaged one is: the documents and the other indexes
                        // stay readable (regression: `scan` of the root failed on an index's
                        // unreadable data file). Read-write, it fails the open.
                        Err(e) if is_damage(&e) || (opts.read_only && is_io(&e)) => {
                            damaged.insert(n, e);
                        }
                        Err(e) => return Err(e),
                    }
                }
                (root, None, branches)
            }
        };
        // A branch an index keeps shows its entries only, opened with the engine or without
        // (design.md 10.1): its applied record is in no public view.
        for s in branches.values() {
            s.hide_if_index();
        }
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
                groups: Arc::default(),
            }),
        })
    }

    /// The shared journal (shared mode), for the actor runtime's journal writer.
    pub(crate) fn shared_journal(&self) -> Option<Arc<Journal>> {
        self.inner.journal.clone()
    }

    /// Checks a branch storage name as [`Database::create_storage`] and
    /// [`Database::storage`] do, without opening anything: 1 to 255 bytes of UTF-8, no `/`,
    /// `\` or NUL, not `.` or `..`, and not starting with `.dropped-` (reserved for storages
    /// being dropped).
    ///
    /// Errors: [`Error::InvalidStorageName`] with the reason.
    pub fn validate_storage_name(name: &str) -> Result<()> {
        validate_storage_name(name)
    }

    /// True when the directory `path` holds a database: a root storage's data file and an
    /// `Indexes/` directory (what [`Database::open`] makes), rather than a plain storage made by
    /// [`Storage::open`] (see [`Storage::exists`]) or nothing. Reads directory entries only.
    pub fn exists(path: impl AsRef<Path>) -> bool {
        let p = path.as_ref();
        p.join(DATA_FILE).is_file() && p.join(INDEXES_DIR).is_dir()
    }

    /// The branch storages of the database in directory `path` as its `Indexes/` directory
    /// holds them, sorted by name: each name and its directory (which opens standalone with
    /// [`Storage::open`]). Nothing is opened or written: leftovers of dropped storages and
    /// directories of creations that crashed before their data file was durable are skipped.
    /// For tools that look at each storage on its own when the database as a whole does not
    /// open (`omnibus check`). Empty when there is no `Indexes/` directory.
    ///
    /// Errors: [`Error::Io`] when `Indexes/` exists but cannot be listed.
    pub fn branch_dirs(path: impl AsRef<Path>) -> Result<Vec<(String, PathBuf)>> {
        let indexes = path.as_ref().join(INDEXES_DIR);
        let env = crate::env::DefaultEnv::new();
        if !env.exists(&indexes) {
            return Ok(Vec::new());
        }
        Ok(branch_names(&env, &indexes, true)?
            .into_iter()
            .map(|n| {
                let dir = indexes.join(&n);
                (n, dir)
            })
            .collect())
    }

    /// The database directory.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The root storage (documents).
    pub fn root(&self) -> Storage {
        self.inner.root.clone()
    }

    /// The existing branch storage `name` (`Indexes/<name>/`). A name that is not there is an
    /// error, not a new empty storage (a typo must not silently create one): create storages
    /// with [`Database::create_storage`].
    ///
    /// Errors: [`Error::StorageNotFound`] when the database has no storage `name`;
    /// [`Error::InvalidStorageName`]; [`Error::Closed`]; for a damaged branch the error it failed
    /// to open with ([`Database::damaged`]).
    pub fn storage(&self, name: &str) -> Result<Storage> {
        validate_storage_name(name)?;
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if let Some(e) = self.inner.damaged.get(name) {
            return Err(e.clone());
        }
        match lock(&self.inner.branches).get(name) {
            Some(s) => Ok(s.clone()),
            None => Err(Error::StorageNotFound {
                name: name.to_string(),
                path: self.inner.path.join(INDEXES_DIR).join(name),
            }),
        }
    }

    /// The branch storage `name` (`Indexes/<name>/`): created when missing (durably: its header
    /// pages, its directory and `Indexes/` are synced before this returns), the existing one
    /// otherwise.
    ///
    /// Errors: [`Error::InvalidStorageName`]; [`Error::Closed`]; [`Error::ReadOnly`] on a
    /// read-only database when the storage is missing; [`Error::CrossDevice`]; for a damaged
    /// branch the error it failed to open with; errors of creating a storage (I/O with the
    /// operation and path).
    pub fn create_storage(&self, name: &str) -> Result<Storage> {
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
            Vec::new(),
            None,
        )?;
        map.insert(name.to_string(), s.clone());
        Ok(s)
    }

    /// Begins a group transaction over `storages` (the root and any branches of this database,
    /// each at most once): one transaction whose writes to every storage commit as one atomic
    /// unit through the shared journal ([`GroupTransaction::commit`]; docs/design.md 3.11).
    /// The storages' writers are taken in lock order, the root first and then branches by
    /// name, whatever the order given, waiting for each as [`Storage::begin_write`] does: two
    /// groups, or a group and single-storage writers, never wait for each other in a circle as
    /// long as no thread holding a write transaction asks for another writer (that thread
    /// would wait for itself, as a second [`Storage::begin_write`] would).
    /// [`Database::try_begin_group`] never waits.
    ///
    /// Root writes made through a group are ordinary root commits (they take root txn ids), as
    /// those of [`Storage::begin_write`] on [`Database::root`]: the actor runtime's indexes
    /// find them as a gap in the txn ids they are fed and reconcile (docs/design.md 10.2).
    ///
    /// Errors: [`GroupError::SeparateJournals`] in [`JournalMode::Separate`];
    /// [`GroupError::TooManyStorages`] past [`crate::MAX_GROUP_STORAGES`];
    /// [`GroupError::NotInDatabase`] for a storage that is not one of this database's open
    /// storages; [`GroupError::Duplicate`] for a storage named twice; [`Error::Closed`];
    /// [`Error::ReadOnly`]; [`Error::Poisoned`]; [`Error::DatabaseDamaged`]. After an error no
    /// writer is held.
    pub fn begin_group(&self, storages: &[&Storage]) -> Result<GroupTransaction> {
        self.group(storages, true)
    }

    /// The group lock ([`GroupTransaction`]'s `publishing`): shared by groups from their
    /// journal write to their last publication, exclusive for a backup's cut.
    pub(crate) fn group_lock(&self) -> Arc<std::sync::RwLock<()>> {
        self.inner.groups.clone()
    }

    /// [`Database::begin_group`] without waiting: a storage with a write transaction open (a
    /// [`Storage::begin_write`], or another group) fails the call with
    /// [`Error::WriteInProgress`] and the writers taken so far are released.
    ///
    /// Errors: as [`Database::begin_group`], and [`Error::WriteInProgress`].
    pub fn try_begin_group(&self, storages: &[&Storage]) -> Result<GroupTransaction> {
        self.group(storages, false)
    }

    fn group(&self, storages: &[&Storage], wait: bool) -> Result<GroupTransaction> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        // Read-only first: a read-only database has no journal open, whatever its mode.
        if self.inner.opts.read_only {
            return Err(Error::ReadOnly);
        }
        let Some(journal) = &self.inner.journal else {
            return Err(GroupError::SeparateJournals.into());
        };
        if storages.len() > crate::MAX_GROUP_STORAGES {
            return Err(GroupError::TooManyStorages {
                count: storages.len(),
                max: crate::MAX_GROUP_STORAGES,
            }
            .into());
        }
        // Each storage's place in the lock order: `None` for the root, its name for a branch.
        let mut named: Vec<(Option<String>, Storage)> = Vec::with_capacity(storages.len());
        {
            let branches = lock(&self.inner.branches);
            for s in storages {
                // The root, or one of this database's open branches: the same storage, not
                // another opened at the same path.
                let key = if Arc::ptr_eq(&s.inner, &self.inner.root.inner) {
                    None
                } else {
                    match branches
                        .iter()
                        .find(|(_, b)| Arc::ptr_eq(&b.inner, &s.inner))
                    {
                        Some((n, _)) => Some(n.clone()),
                        None => {
                            return Err(GroupError::NotInDatabase {
                                path: s.path().to_path_buf(),
                            }
                            .into())
                        }
                    }
                };
                if named.iter().any(|(_, t)| Arc::ptr_eq(&t.inner, &s.inner)) {
                    return Err(GroupError::Duplicate {
                        path: s.path().to_path_buf(),
                    }
                    .into());
                }
                named.push((key, (*s).clone()));
            }
        }
        named.sort_by(|a, b| a.0.cmp(&b.0));
        GroupTransaction::begin(
            journal.clone(),
            self.inner.groups.clone(),
            named.into_iter().map(|(_, s)| s).collect(),
            wait,
        )
    }

    /// The branch storages that failed to open because they are damaged, with the error each
    /// gave ([`Error::Corruption`] or [`Error::NotAStorage`]: a truncated or foreign data file,
    /// both header pages bad, a journal whose txn ids are not contiguous...), in name order. A
    /// read-only open also leaves out, and lists here, a branch it cannot read ([`Error::Io`],
    /// e.g. `EACCES`), so that the other storages can be read; a read-write open fails then.
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
        // Out of the journal before its directory goes: a record of it still queued (an
        // eventual commit) is then written without a hard link into its `Journals/` (the
        // writer skips storages it does not know), instead of a link into a renamed directory
        // failing and poisoning the journal for every storage.
        if let Some(j) = &self.inner.journal {
            j.unregister(s.storage_id());
        }
        let env = &self.inner.opts.env;
        let indexes = self.inner.path.join(INDEXES_DIR);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let tomb = indexes.join(format!("{DROPPED_PREFIX}{nanos}"));
        env.rename(&indexes.join(name), &tomb)?;
        env.sync_dir(&indexes)?;
        drop(s);
        if let Err(e) = env.remove_dir_all(&tomb) {
            tracing::warn!(error = %e, "removing a dropped storage failed; it is removed at the next open");
        }
        Ok(())
    }

    /// Writes a standalone copy of the whole database into `dest` (a new directory, or an
    /// empty one) while writers go on: the root as `dest`, each branch as
    /// `dest/Indexes/<name>`, each copied as [`Storage::backup`] copies a storage (from one
    /// snapshot, verified page by page, no journal needed). The copy opens with
    /// [`Database::open`] and every storage in it passes [`Storage::check`].
    ///
    /// *Consistent* means: the copy holds a prefix of the shared journal's order. The
    /// snapshots of all storages are taken at one point of it, while no batch is being written
    /// (under the journal's I/O lock), each storage's snapshot being the state of its last
    /// durable commit (waiting, under that lock, for a commit whose batch is durable to be
    /// published). So a commit is in the copy exactly when its batch was durable by then; a
    /// commit of one storage made after a commit of another returned (an index entry written
    /// after its document) is in the copy only if that earlier one is too. In
    /// [`JournalMode::Separate`] storages share no order: each storage's copy is consistent on
    /// its own, and the snapshots are taken branches first, then the root (so an index copied
    /// is never ahead of the documents it was fed from). Damaged branches
    /// ([`Database::damaged`]) are not copied.
    ///
    /// Errors: [`Error::DestinationInsideSource`] (a destination inside the database's directory);
    /// [`Error::DestinationNotEmpty`]; [`Error::Closed`]; [`Error::Corruption`] for a
    /// damaged page; I/O errors with the operation and path (`ENOSPC`:
    /// [`Error::is_no_space`]); an `Io` error with `TimedOut` when a durable commit was not
    /// published within 10 s (a stalled committer). On any error, everything the backup wrote is
    /// removed again. Storages with buffered entries are copied with them, as
    /// [`Storage::backup`] copies them: no writer is taken, so a read-only database backs up
    /// beside a writer in another process whatever its storages buffer.
    pub fn backup(&self, dest: impl AsRef<Path>) -> Result<crate::backup::BackupReport> {
        self.backup_at_one_point(dest.as_ref())
    }

    /// [`Database::backup`] for the actor runtime, which never takes a storage's writer (its
    /// actors hold them): the same copy, which takes no writer either.
    pub(crate) fn backup_without_writers(
        &self,
        dest: &Path,
    ) -> Result<crate::backup::BackupReport> {
        self.backup_at_one_point(dest)
    }

    /// [`Database::backup`]: the states of every storage at one point of the shared journal
    /// (or each its own, with separate journals), copied with their buffered entries
    /// (`backup::write_copy`), taking no writer.
    fn backup_at_one_point(&self, dest: &Path) -> Result<crate::backup::BackupReport> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        crate::backup::check_outside(&self.inner.path, dest)?;
        let branches: Vec<(String, Storage)> = lock(&self.inner.branches)
            .iter()
            .map(|(n, s)| (n.clone(), s.clone()))
            .collect();
        let root = &self.inner.root;
        let take = |durable: Option<&dyn Fn(u64) -> u64>| -> Result<_> {
            let mut states = Vec::with_capacity(branches.len());
            for (n, s) in &branches {
                states.push((n.clone(), published_state(s, durable)?));
            }
            Ok((published_state(root, durable)?, states))
        };
        let (root_state, states) = match &self.inner.journal {
            Some(j) => {
                // No group between its journal write and its last storage's publication.
                let _groups = self.inner.groups.write().unwrap_or_else(|e| e.into_inner());
                j.at_one_point(|d| take(Some(d)))?
            }
            None => take(None)?,
        };
        crate::backup::backup_database(&self.inner.opts.env, &root_state, &states, dest)
    }

    /// A read-only database reads the state committed when it was opened, every storage at one
    /// point of the shared journal (design.md 6.5); this moves every storage to one newer point
    /// and returns the root's txn id now read. Each storage reads only the journal records
    /// after those it replayed before while its durable header did not move
    /// ([`Storage::catch_up`]'s cost), else loads again from its header; the new states are
    /// published only once every storage has read its own at the point, so after it returns
    /// every snapshot taken reads one point: never one part of a group transaction without the
    /// others. A thread taking snapshots while another catches up may get one storage before
    /// and another after the move, as across any two calls. Storages created or dropped by the
    /// writer since the open are not added or removed (open the database again). Snapshots
    /// taken before keep their states. On a writable database, or one with separate journals
    /// (no group transactions), it catches each storage up on its own (a writable one is
    /// always current).
    ///
    /// Errors: [`Error::Closed`]; as a read-only [`Database::open`]: a storage's read fails
    /// (damage), or a writer moved the headers under every one of 50 points (then nothing was
    /// published: the states are those before the call).
    pub fn catch_up(&self) -> Result<u64> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        let root = &self.inner.root;
        let mut all: Vec<(String, Storage)> = lock(&self.inner.branches)
            .iter()
            .map(|(n, s)| (n.clone(), s.clone()))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        if !root.inner.in_database.load(Ordering::Acquire) {
            for (_, s) in &all {
                s.catch_up()?;
                s.hide_if_index();
            }
            return root.catch_up();
        }
        let env = &*self.inner.opts.env;
        let path = &self.inner.path;
        // One catch-up at a time per storage, in a fixed order (the root, then by name).
        let _held: Vec<_> = std::iter::once(root)
            .chain(all.iter().map(|(_, s)| s))
            .map(Storage::publish_lock)
            .collect();
        let names: Vec<String> = all.iter().map(|(n, _)| n.clone()).collect();
        let mut attempt = 0;
        let read = loop {
            attempt += 1;
            let r = (|| -> Result<_> {
                let root_seq = header_sequence(env, path);
                let seqs: Vec<Option<u64>> = names
                    .iter()
                    .map(|n| header_sequence(env, &path.join(INDEXES_DIR).join(n)))
                    .collect();
                let borrowed = borrowed_names(env, path, &names)?;
                let (file, offset) = journal_point(env, path, &borrowed)?;
                let at = |sequence| OnePoint {
                    file,
                    offset,
                    sequence,
                };
                let names_of =
                    |storage: Option<String>| borrowed.get(&storage).map_or(&[][..], |v| &v[..]);
                let root_next = root.read_newer(Some(at(root_seq)), names_of(None))?;
                let mut next = Vec::with_capacity(all.len());
                for ((name, s), seq) in all.iter().zip(seqs) {
                    next.push(s.read_newer(Some(at(seq)), names_of(Some(name.clone())))?);
                }
                Ok((root_next, next))
            })();
            match r {
                Ok(read) => break read,
                Err(e)
                    if attempt < ONE_POINT_ATTEMPTS
                        && (matches!(e, Error::AlreadyOpen { .. })
                            || writer_live(path)
                            || e.is_short_read()) =>
                {
                    tracing::debug!(path = %path.display(), attempt, error = %e, "catching a read-only database up beside a live writer: a new point");
                    std::thread::sleep(std::time::Duration::from_millis(1 + u64::from(attempt)));
                }
                Err(e) => return Err(e),
            }
        };
        let (root_next, next) = read;
        for ((_, s), n) in all.iter().zip(next) {
            s.publish_caught_up(n);
            s.hide_if_index();
        }
        Ok(root.publish_caught_up(root_next))
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

    /// Latency histograms and counters since open, in memory (see [`crate::Metrics`]): the
    /// journal's commits and batches (every storage's own journal summed in
    /// [`crate::JournalMode::Separate`]) and the flushes of the root and every open branch
    /// (a dropped branch's leave with it). Takes a few short locks; no I/O.
    pub fn metrics(&self) -> crate::Metrics {
        let branches: Vec<Storage> = lock(&self.inner.branches).values().cloned().collect();
        let mut g = crate::metrics::Gather::default();
        match &self.inner.journal {
            Some(j) => j.gather_metrics(&mut g),
            None => {
                self.inner.root.inner.journal.gather_metrics(&mut g);
                for s in &branches {
                    s.inner.journal.gather_metrics(&mut g);
                }
            }
        }
        self.inner.root.inner.gather_flush_metrics(&mut g);
        for s in &branches {
            s.inner.gather_flush_metrics(&mut g);
        }
        g.finish()
    }

    /// Flushes every storage (branches first, then the root) and returns the sum of their
    /// reports (counters summed): `flushed_txn` is the root's;
    /// `limited_by_snapshot` the root's, else the first limited branch's.
    ///
    /// Errors: the first storage's flush error (the storages after it are not flushed).
    pub fn flush(&self) -> Result<crate::storage::FlushReport> {
        self.flush_each(Storage::flush)
    }

    /// Compacts every storage of the database ([`Storage::compact`]: moves the pages in use
    /// toward the start of each data file, then shrinks it), the root first, then each branch in
    /// name order. Returns each storage's report, by name (`""` for the root): pages moved,
    /// passes, data file and on-disk bytes before and after.
    ///
    /// Errors: the first storage's compaction error ([`Error::ReadOnly`], [`Error::Poisoned`],
    /// a flush's or commit's error; see [`Storage::compact`]); the storages after it are not
    /// compacted. [`Error::Closed`] after [`Database::close`].
    pub fn compact(&self) -> Result<Vec<(String, crate::storage::CompactReport)>> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        let mut branches: Vec<(String, Storage)> = lock(&self.inner.branches)
            .iter()
            .map(|(n, s)| (n.clone(), s.clone()))
            .collect();
        branches.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out = Vec::with_capacity(branches.len() + 1);
        let root = &self.inner.root;
        let before = root.begin_read()?.txn_id();
        // Indexes in step with the documents (applied record == the root's txn) stay in step:
        // compaction's commits change no document.
        let in_step: Vec<&Storage> = branches
            .iter()
            .filter(|(_, s)| applied_record(s) == Some(before))
            .map(|(_, s)| s)
            .collect();
        let (report, commits) = root.compact_counting()?;
        let after = root.begin_read()?.txn_id();
        // Only when every root commit since was compaction's (no document written meanwhile
        // through another handle of this process).
        if commits > 0 && after == before + commits {
            for s in in_step {
                advance_applied_record(s, before, after)?;
            }
        }
        out.push((String::new(), report));
        for (name, s) in branches {
            let r = s.compact()?;
            out.push((name, r));
        }
        Ok(out)
    }

    /// [`Database::flush`] without applying write buffers (`Storage::flush_pages` of each
    /// storage): what the actor engine may do while the storages' actors hold their writers.
    pub(crate) fn flush_pages(&self) -> Result<crate::storage::FlushReport> {
        self.flush_each(Storage::flush_pages)
    }

    /// `flush` of every storage (branches first, then the root), the reports summed.
    fn flush_each(
        &self,
        flush: impl Fn(&Storage) -> Result<crate::storage::FlushReport>,
    ) -> Result<crate::storage::FlushReport> {
        let branches: Vec<Storage> = lock(&self.inner.branches).values().cloned().collect();
        let mut reports = Vec::with_capacity(branches.len());
        for s in &branches {
            reports.push(flush(s)?);
        }
        let mut sum = flush(&self.inner.root)?;
        for r in &reports {
            sum.add(r);
        }
        Ok(sum)
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

/// The root txn an index storage's applied record names (design.md 10.1), read as the index
/// runtime reads it; `None` for a storage that holds none (or a read that fails).
fn applied_record(s: &Storage) -> Option<u64> {
    let r = s.begin_read().ok()?;
    let v = r.get_reserved(crate::txn::RESERVED_KEY).ok()??;
    crate::txn::decode_index_record(v)
}

/// Moves index storage `s`'s applied record from root txn `from` to `to` (root commits that
/// changed no document: compaction's), in one commit of `s`, when it still names `from`.
fn advance_applied_record(s: &Storage, from: u64, to: u64) -> Result<()> {
    let mut w = s.begin_write()?;
    let now = w
        .get(crate::txn::RESERVED_KEY)?
        .and_then(|v| crate::txn::decode_index_record(&v));
    if now == Some(from) {
        w.put(crate::txn::RESERVED_KEY, crate::txn::index_record(to))?;
        w.commit()?;
    }
    Ok(())
}

/// The state of `s` to back up: its current state, once it includes every commit `durable`
/// says is durable (a committer publishes right after its batch's `fdatasync`; it is waited
/// for, up to 10 s).
fn published_state(
    s: &Storage,
    durable: Option<&dyn Fn(u64) -> u64>,
) -> Result<Arc<crate::state::State>> {
    let want = durable.map_or(0, |d| d(s.storage_id()));
    let t0 = std::time::Instant::now();
    // Bounded by the 10 s limit.
    loop {
        let st = s.inner.current.load_full();
        if st.txn_id >= want {
            return Ok(st);
        }
        if let Some(cause) = s.inner.poisoned() {
            return Err(Error::Poisoned { cause });
        }
        if t0.elapsed() > std::time::Duration::from_secs(10) {
            return Err(io_err(
                "backup: waiting for a durable commit to be published",
                s.path(),
                std::io::Error::from(std::io::ErrorKind::TimedOut),
            ));
        }
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
}

/// Errors that mean a branch storage itself is damaged (the database opens without it), as
/// opposed to errors of the environment or the caller (which fail the open).
/// Whether `e` is an I/O error (the storage's files could not be read), not damage.
fn is_io(e: &Error) -> bool {
    matches!(e, Error::Io { .. })
}

fn is_damage(e: &Error) -> bool {
    matches!(
        e,
        Error::Corruption(_) | Error::NotAStorage { .. } | Error::FormatVersion { .. }
    )
}

/// Opens branch `name` of the database at `root`: bound to the shared `journal`, else to its
/// own (separate mode, read-only), reading `borrowed` journal files its `Journals/` lacks.
fn open_branch(
    opts: &Options,
    root: &Path,
    name: &str,
    journal: Option<&Arc<Journal>>,
    dev: u64,
    borrowed: Vec<(u64, PathBuf)>,
    at: Option<OnePoint>,
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
        None => Binding::Own {
            lock: None,
            borrowed,
            at,
        },
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
/// and later). Regression: a branch directory bind-mounted from the
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

/// Branch directory names under `Indexes/`: those with a data file or a `Journals/` directory
/// (creation makes the data file durable before it creates `Journals/`, so a branch with
/// `Journals/` and no data file lost it: its open reports the damage). A directory with
/// neither is what a creation that crashed before its data file was durable leaves; it is no
/// storage yet, and [`Database::create_storage`] finishes creating it. Removes leftovers of dropped
/// storages (unless `read_only`: a read-only open writes nothing, and skips them).
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
        let dir = indexes.join(&n);
        if validate_storage_name(&n).is_ok()
            && (env.exists(&dir.join(DATA_FILE)) || env.exists(&dir.join(JOURNALS_DIR)))
        {
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

/// A journal file of the database, as [`survey`] found it.
struct Surveyed {
    /// A name of the file: the root's when it has one, else a branch's link.
    path: PathBuf,
    /// The root's `Journals/` holds it.
    in_root: bool,
    /// The storage directories its link records name, relative to the root
    /// (`Indexes/<name>`), each with the storage id the link was made for.
    linked: Vec<(String, u64)>,
    /// The highest txn id of the root's commit records in it (0: none).
    root_max: u64,
}

/// Reads the database's journal files for the repairs at open: every file in the root's
/// `Journals/` (its link records name the branches hard-linked to it), and every file in a
/// branch's `Journals/` (of `names`) that the root's lacks (whether it holds commits of the
/// root, `root_id`). Keyed by journal number: in a shared journal one number is one file.
///
/// Errors: I/O errors listing or reading; [`Error::Corruption`] of a file the root holds (its
/// recovery would fail the same way). A damaged file only a branch holds is surveyed up to the
/// damage: that branch's own open reports it.
fn survey(
    env: &dyn StorageEnv,
    root: &Path,
    root_id: u64,
    names: &[String],
) -> Result<BTreeMap<u64, Surveyed>> {
    let mut out: BTreeMap<u64, Surveyed> = BTreeMap::new();
    let dirs = std::iter::once(root.join(JOURNALS_DIR)).chain(
        names
            .iter()
            .map(|n| root.join(INDEXES_DIR).join(n).join(JOURNALS_DIR)),
    );
    for (i, dir) in dirs.enumerate() {
        let in_root = i == 0;
        if !env.exists(&dir) {
            continue;
        }
        for (no, file) in recovery::list(env, &dir)? {
            if out.contains_key(&no) {
                continue;
            }
            let mut s = Surveyed {
                path: file.clone(),
                in_root,
                linked: Vec::new(),
                root_max: 0,
            };
            let r = recovery::scan(env, &file, no, &[], |h, body, _| {
                match h.kind {
                    RecordKind::Link => {
                        // The body: the branch's storage id (8 bytes, little-endian), then its
                        // path relative to the root.
                        let sid = body
                            .get(..8)
                            .and_then(|b| b.try_into().ok())
                            .map(u64::from_le_bytes);
                        let rel = body.get(8..).and_then(|b| std::str::from_utf8(b).ok());
                        if let (Some(sid), Some(rel)) = (sid, rel) {
                            s.linked.push((rel.to_string(), sid));
                        }
                    }
                    k if k.is_commit() && h.storage_id == root_id => {
                        s.root_max = s.root_max.max(h.txn_id);
                    }
                    _ => {}
                }
                Ok(())
            });
            match r {
                Ok(_) => {}
                Err(Error::Corruption(_)) if !in_root => {}
                Err(e) => return Err(e),
            }
            s.linked.sort();
            s.linked.dedup();
            out.insert(no, s);
        }
    }
    Ok(out)
}

/// A name of a journal file that a storage's `Journals/` lacks although the file holds its
/// records (design.md invariant I7): re-created by a read-write open, read through by a read-only
/// one.
struct Missing {
    /// The journal number.
    no: u64,
    /// An existing name of the file.
    from: PathBuf,
    /// The storage: `None` for the root, else the branch's name.
    storage: Option<String>,
}

/// The names the surveyed `files` show missing: a branch link that a link record names (the
/// branch had a record in the file; its link stood in for a directory fsync), and the root's
/// name of a file that holds root commits above the root's flushed txn, or whose number is at
/// or above the start statement of the root's header `hdr` (the root's name of a shared journal
/// file is removed only once the root flushed every record it has in it, and never at or above
/// its durable start statement: docs/design.md 3.8; so such a file lost its name to damage: a
/// deleted file, not a crash).
fn missing_names(
    env: &dyn StorageEnv,
    root: &Path,
    files: &BTreeMap<u64, Surveyed>,
    hdr: &crate::page::header::Header,
    names: &[String],
) -> Vec<Missing> {
    let flushed = hdr.flushed_txn;
    let stated = |no: u64| hdr.journal_started != 0 && no >= hdr.journal_started;
    let mut out = Vec::new();
    // The storage id in each branch's data file header (`None`: none readable).
    let mut ids: BTreeMap<String, Option<u64>> = BTreeMap::new();
    for (no, f) in files {
        // A stated file: only one the shared journal wrote (it holds link records), not a
        // branch's own file from a session opened standalone.
        if !f.in_root && (f.root_max > flushed || (stated(*no) && !f.linked.is_empty())) {
            out.push(Missing {
                no: *no,
                from: f.path.clone(),
                storage: None,
            });
        }
        for (rel, sid) in &f.linked {
            let Some(name) = rel.strip_prefix(&format!("{INDEXES_DIR}/")) else {
                continue;
            };
            if !names.iter().any(|n| n == name) {
                continue;
            }
            // Regression (offline crash run, round 2 of `database_crash`): a branch dropped and
            // created again under the same name, the crash during the new creation (its header
            // not yet durable, no `Journals/`: an unfinished creation). The old incarnation's
            // link record still named `Indexes/<name>`, so the open linked the old file into a
            // re-created `Journals/`, and the unfinished branch then read as damaged ("the data
            // file is empty, but Journals holds journal files"). A link record is repaired only
            // into the storage it was made for: the same storage id in the branch's header.
            let current = ids.entry(name.to_string()).or_insert_with(|| {
                let data_path = root.join(INDEXES_DIR).join(name).join(DATA_FILE);
                env.open(&data_path, OpenMode::ReadOnly)
                    .map_err(Error::from)
                    .and_then(|d| read_header(&*d, &data_path))
                    .ok()
                    .map(|(h, _)| h.storage_id)
            });
            if *current != Some(*sid) {
                continue;
            }
            let bdir = root.join(INDEXES_DIR).join(name).join(JOURNALS_DIR);
            // A branch whose whole `Journals/` is gone gets it back with its links (read-only,
            // its open fails instead: a storage without `Journals/` is no storage).
            if env.exists(&bdir.join(crate::journal::file_name(*no))) {
                continue;
            }
            out.push(Missing {
                no: *no,
                from: f.path.clone(),
                storage: Some(name.to_string()),
            });
        }
    }
    out
}

/// Journal files (number, another name of the file) each storage must read through, keyed by
/// storage: `None` for the root, else the branch's name.
type Borrowed = BTreeMap<Option<String>, Vec<(u64, PathBuf)>>;

/// Read-only: the journal files each storage of the database at `root` (the root: `None`;
/// branches `names`) must read through another name, its own being missing. Nothing is
/// written. A root whose header cannot be read is not surveyed (its open reports why).
fn borrowed_names(env: &dyn StorageEnv, root: &Path, names: &[String]) -> Result<Borrowed> {
    let data_path = root.join(DATA_FILE);
    let hdr = env
        .open(&data_path, OpenMode::ReadOnly)
        .map_err(Error::from)
        .and_then(|d| read_header(&*d, &data_path));
    let Ok((hdr, _)) = hdr else {
        return Ok(BTreeMap::new());
    };
    let files = survey(env, root, hdr.storage_id, names)?;
    let mut out = Borrowed::new();
    for m in missing_names(env, root, &files, &hdr, names) {
        out.entry(m.storage).or_default().push((m.no, m.from));
    }
    Ok(out)
}

/// Read-write: re-creates every `missing` name as a hard link to the same file (design.md invariant I7), then syncs each directory it linked into, before any storage recovers.
fn relink(env: &dyn StorageEnv, root: &Path, missing: &[Missing]) -> Result<()> {
    let mut synced: Vec<PathBuf> = Vec::new();
    for m in missing {
        let dir = match &m.storage {
            None => root.join(JOURNALS_DIR),
            Some(name) => root.join(INDEXES_DIR).join(name).join(JOURNALS_DIR),
        };
        if !env.exists(&dir) {
            // A branch's `Journals/` deleted: the branch would otherwise re-create it empty.
            env.create_dir(&dir)?;
            if let Some(parent) = dir.parent() {
                env.sync_dir(parent)?;
            }
        }
        let target = dir.join(crate::journal::file_name(m.no));
        match &m.storage {
            None => {
                tracing::warn!(link = %target.display(), from = %m.from.display(), "the root's name of a journal file holding unflushed root commits is missing: linking it back")
            }
            Some(_) => {
                tracing::info!(link = %target.display(), "re-creating a journal link from its link record")
            }
        }
        env.link(&m.from, &target)?;
        if !synced.contains(&dir) {
            synced.push(dir);
        }
    }
    for dir in synced {
        env.sync_dir(&dir)?;
    }
    Ok(())
}

/// The durable header's sequence of the storage in `dir`, when it reads.
fn header_sequence(env: &dyn StorageEnv, dir: &Path) -> Option<u64> {
    let data_path = dir.join(DATA_FILE);
    let data = env.open(&data_path, OpenMode::ReadOnly).ok()?;
    read_header(&*data, &data_path)
        .ok()
        .map(|(h, _)| h.sequence)
}

/// A read-only database's point of the shared journal (design.md 6.5): `(file, offset)`, the
/// end of the valid records of its newest file, the root's or one it reads through a branch's
/// name (its own deleted); `(0, 0)` without any.
fn journal_point(env: &dyn StorageEnv, path: &Path, borrowed: &Borrowed) -> Result<(u64, u64)> {
    let newest = recovery::list(env, &path.join(JOURNALS_DIR))?
        .into_iter()
        .chain(borrowed.values().flatten().cloned())
        .max_by_key(|(no, _)| *no);
    Ok(match newest {
        Some((no, file)) => {
            let end = recovery::scan(env, &file, no, &[], |_, _, _| Ok(()))?;
            (no, end.offset)
        }
        None => (0, 0),
    })
}

/// The storages of a read-only database open: the root, the branches that opened, and those
/// left out as damaged.
type ReadOnlyParts = (Storage, BTreeMap<String, Storage>, BTreeMap<String, Error>);

/// Attempts of [`read_at_one_point`] before it gives up.
const ONE_POINT_ATTEMPTS: u32 = 50;

/// Opens every storage of a read-only database at one point of its shared journal (design.md
/// 6.5), so that a writer in another process committing meanwhile never shows a reader one part
/// of a group transaction without the others (invariant I14): first every storage's header
/// sequence, then the point (the end of the valid records of the root's newest journal file),
/// then each storage replays up to the point and checks that its header is still the one read
/// first (a header written after the point could cover records past it). While a writer is
/// live, an attempt that fails, or leaves a branch out as damaged, is made again from a new
/// point (a flush moved a header, or released a journal file that was being read), up to
/// [`ONE_POINT_ATTEMPTS`]; the last attempt's outcome is returned.
///
/// Errors: as a read-only [`Database::open`].
fn read_at_one_point(
    env: &dyn StorageEnv,
    path: &Path,
    opts: &Options,
    names: Vec<String>,
    dev: u64,
    lock_file: crate::storage::Lock,
) -> Result<ReadOnlyParts> {
    let sequence = |dir: &Path| header_sequence(env, dir);
    let mut lock = Some(lock_file);
    let mut names = Some(names);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let last = attempt >= ONE_POINT_ATTEMPTS;
        let lock_file = match lock.take() {
            Some(l) => l,
            None => take_lock(path, true)?,
        };
        let names = match names.take() {
            Some(n) => n,
            None => branch_names(env, &path.join(INDEXES_DIR), true)?,
        };
        let r = (|| -> Result<ReadOnlyParts> {
            let root_seq = sequence(path);
            let seqs: BTreeMap<&String, Option<u64>> = names
                .iter()
                .map(|n| (n, sequence(&path.join(INDEXES_DIR).join(n))))
                .collect();
            let mut borrowed = borrowed_names(env, path, &names)?;
            let point = journal_point(env, path, &borrowed)?;
            let at = |sequence| OnePoint {
                file: point.0,
                offset: point.1,
                sequence,
            };
            let root = open_storage(
                path,
                opts.clone(),
                Binding::Own {
                    lock: Some(lock_file),
                    borrowed: borrowed.remove(&None).unwrap_or_default(),
                    at: Some(at(root_seq)),
                },
            )?;
            root.inner.in_database.store(true, Ordering::Release);
            let mut branches = BTreeMap::new();
            let mut damaged = BTreeMap::new();
            for n in &names {
                let b = borrowed.remove(&Some(n.clone())).unwrap_or_default();
                let seq = seqs.get(n).copied().flatten();
                match open_branch(opts, path, n, None, dev, b, Some(at(seq))) {
                    Ok(s) => {
                        s.inner.in_database.store(true, Ordering::Release);
                        branches.insert(n.clone(), s);
                    }
                    Err(e) if is_damage(&e) || is_io(&e) => {
                        damaged.insert(n.clone(), e);
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok((root, branches, damaged))
        })();
        // A journal file read short: a writer process created or emptied it meanwhile, and
        // may have exited already (a short `omnibus put`): the point is taken again.
        let again = !last
            && match &r {
                Ok((_, _, damaged)) => {
                    !damaged.is_empty()
                        && (writer_live(path) || damaged.values().any(Error::is_short_read))
                }
                Err(Error::AlreadyOpen { .. }) => true,
                Err(e) => writer_live(path) || e.is_short_read(),
            };
        if !again {
            return r;
        }
        if let Err(e) = &r {
            tracing::debug!(path = %path.display(), attempt, error = %e, "reading a database beside a live writer: trying again");
        }
        drop(r);
        std::thread::sleep(std::time::Duration::from_millis(1 + u64::from(attempt)));
    }
}
