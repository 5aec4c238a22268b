//! [`Engine`]: the per-core glommio executors and the actors on them, and
//! [`DatabaseHandle`], a database served by actors.
//!
//! `Engine::start` raises the soft `RLIMIT_MEMLOCK` toward the hard limit (glommio locks about
//! 512 KiB per executor for its rings), starts one `LocalExecutor` pinned to each chosen CPU,
//! and on each a reader task and a flusher actor. Storage actors and journal writers are spawned
//! onto executors as databases and storages are opened. `Engine::shutdown` stops the storage
//! actors (each finishes its queued requests), then the journal writers, flushers and readers,
//! closes the databases (flushing them) and joins the executor threads; errors are returned, not
//! lost. Dropping an `Engine` shuts it down.

use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use glommio::{LocalExecutorBuilder, Placement};

use super::flusher::{self, FlusherMsg};
use super::io_lane::IoLane;
use super::journal_writer::{self, JournalMsg};
use super::reader_pool::{self, ReadMsg};
use super::storage::{self as storage_actor, StorageHandle, StorageMsg};
use crate::error::{Error, Result};
use crate::options::FlushMode;
use crate::{Database, Options, Storage};

/// Locked memory glommio needs per executor (bytes).
pub const MEMLOCK_PER_EXECUTOR: u64 = 512 << 10;

/// How the engine is laid out.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Executors to start, pinned to CPUs 0..n. Default: every online CPU. Ignored when `cpus`
    /// is set.
    pub executors: Option<usize>,
    /// Explicit CPUs, one executor pinned to each.
    pub cpus: Option<Vec<usize>>,
    /// Capacity of each storage actor's mailbox (requests). Default 1,024.
    pub mailbox_capacity: usize,
    /// Requests merged into one transaction at most. Default 1,024.
    pub max_requests_per_txn: usize,
    /// Threads of the critical I/O lane (journal batches of separate-mode journals, which use
    /// them concurrently). Default 16. A shared journal's writer has a thread of its own.
    pub critical_lane_threads: usize,
    /// Threads of the background I/O lane (flushes, opening storages), low I/O priority.
    /// Default: one per executor.
    pub background_lane_threads: Option<usize>,
    /// How often flushers look for due flushes. Default 50 ms.
    pub flush_tick: Duration,
    /// Bytes that every storage of the engine together may hold unflushed: scratch pages in
    /// memory plus pages freed since their storage's last flush (data file space only a flush
    /// makes reusable). Split evenly between the executors' flushers; over its share, a flusher
    /// flushes its largest storages first. Default 256 MiB. Each storage's own threshold
    /// (`Options::flush_scratch_bytes`) still applies.
    pub memory_budget_bytes: u64,
}

impl Default for EngineOptions {
    fn default() -> EngineOptions {
        EngineOptions {
            executors: None,
            cpus: None,
            mailbox_capacity: 1024,
            max_requests_per_txn: 1024,
            critical_lane_threads: 16,
            background_lane_threads: None,
            flush_tick: Duration::from_millis(50),
            memory_budget_bytes: 256 << 20,
        }
    }
}

type Spawn = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()>>> + Send>;

struct Executor {
    spawn: flume::Sender<Spawn>,
    flusher: flume::Sender<FlusherMsg>,
    handle: Option<glommio::ExecutorJoinHandle<()>>,
}

struct EngineInner {
    executors: Mutex<Vec<Executor>>,
    n: usize,
    opts: EngineOptions,
    readers: flume::Sender<ReadMsg>,
    critical: IoLane,
    background: IoLane,
    databases: Mutex<Vec<DatabaseHandle>>,
    down: std::sync::atomic::AtomicBool,
}

/// The actor runtime. Cheap to clone; the last clone dropped shuts it down.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<EngineInner>,
}

struct DbInner {
    db: Database,
    engine: std::sync::Weak<EngineInner>,
    journal: Option<flume::Sender<JournalMsg>>,
    /// The shared journal writer's thread (shared mode), joined at shutdown.
    journal_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    handles: Mutex<HashMap<String, StorageHandle>>,
    writers: Mutex<Vec<flume::Sender<JournalMsg>>>,
    root: StorageHandle,
}

/// A database served by the engine's actors. Cheap to clone, `Send + Sync`.
#[derive(Clone)]
pub struct DatabaseHandle {
    inner: Arc<DbInner>,
}

fn online_cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Raises the soft `RLIMIT_MEMLOCK` toward the hard limit to cover `executors` executors.
fn ensure_memlock(executors: usize) -> Result<()> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let need = MEMLOCK_PER_EXECUTOR * executors as u64 + (1 << 20);
    let cur = getrlimit(Resource::Memlock);
    let soft = cur.current.unwrap_or(u64::MAX);
    let hard = cur.maximum.unwrap_or(u64::MAX);
    if soft >= need {
        return Ok(());
    }
    if hard >= need {
        // Raise the soft limit to the hard one (the most this process may lock).
        if setrlimit(
            Resource::Memlock,
            Rlimit {
                current: cur.maximum,
                maximum: cur.maximum,
            },
        )
        .is_ok()
        {
            return Ok(());
        }
    }
    Err(Error::ResourceLimit(format!(
        "glommio needs {} KiB of locked memory for {executors} executors (512 KiB each, plus 1 MiB), but RLIMIT_MEMLOCK is {} KiB (hard {} KiB): \
         raise it with `ulimit -l {}` (as root, or in /etc/security/limits.conf, or LimitMEMLOCK= for a systemd service), or start fewer executors",
        need >> 10,
        soft >> 10,
        hard >> 10,
        need >> 10
    )))
}

fn stable_hash(name: &str) -> usize {
    crc32fast::hash(name.as_bytes()) as usize
}

impl Engine {
    /// Starts the executors and their reader and flusher actors.
    ///
    /// Errors: [`Error::ResourceLimit`] when the locked-memory limit cannot be raised enough
    /// (the message says how much is needed and how to grant it); [`Error::InvalidOptions`] for
    /// an empty CPU set or a journal executor out of range; I/O errors starting threads.
    pub fn start(opts: EngineOptions) -> Result<Engine> {
        let cpus: Vec<usize> = match &opts.cpus {
            Some(c) if c.is_empty() => return Err(Error::InvalidOptions("empty CPU set".into())),
            Some(c) => c.clone(),
            None => (0..opts.executors.unwrap_or_else(online_cpus).max(1))
                .map(|i| i % online_cpus())
                .collect(),
        };
        ensure_memlock(cpus.len())?;
        let critical = IoLane::start("omnibus-journal-io", opts.critical_lane_threads, false)?;
        let background = IoLane::start(
            "omnibus-flush-io",
            opts.background_lane_threads.unwrap_or(cpus.len()),
            true,
        )?;
        let (rtx, rrx) = flume::bounded::<ReadMsg>(reader_pool::MAILBOX);
        let mut executors = Vec::new();
        for (i, cpu) in cpus.iter().enumerate() {
            let (stx, srx) = flume::bounded::<Spawn>(1024);
            let (ftx, frx) = flume::bounded::<FlusherMsg>(1024);
            let readers = rrx.clone();
            let lane = background.clone();
            let tick = opts.flush_tick;
            let budget = opts.memory_budget_bytes / cpus.len() as u64;
            let handle = LocalExecutorBuilder::new(Placement::Fixed(*cpu))
                .name(&format!("omnibus-exec-{i}"))
                .spawn(move || async move {
                    glommio::spawn_local(reader_pool::run(readers)).detach();
                    glommio::spawn_local(flusher::run(frx, lane, tick, budget)).detach();
                    while let Ok(job) = srx.recv_async().await {
                        glommio::spawn_local(job()).detach();
                    }
                })
                .map_err(|e| Error::Io {
                    op: "start executor",
                    path: format!("cpu {cpu}").into(),
                    source: std::io::Error::other(e.to_string()),
                })?;
            executors.push(Executor {
                spawn: stx,
                flusher: ftx,
                handle: Some(handle),
            });
        }
        Ok(Engine {
            inner: Arc::new(EngineInner {
                n: executors.len(),
                executors: Mutex::new(executors),
                opts,
                readers: rtx,
                critical,
                background,
                databases: Mutex::new(Vec::new()),
                down: std::sync::atomic::AtomicBool::new(false),
            }),
        })
    }

    /// Executors running.
    pub fn executors(&self) -> usize {
        self.inner.n
    }

    /// Opens (or creates) the database at `path` and starts its actors. The storages are opened
    /// with [`FlushMode::Manual`]: the engine's flushers drive flushes.
    pub async fn open_database(
        &self,
        path: impl AsRef<Path>,
        opts: Options,
    ) -> Result<DatabaseHandle> {
        let p = path.as_ref().to_path_buf();
        let o = Options {
            flush_mode: FlushMode::Manual,
            ..opts
        };
        let db = self
            .inner
            .background
            .run(move || Database::open(&p, o))
            .await?;
        self.inner.attach(db)
    }

    /// Blocking [`Engine::open_database`].
    pub fn blocking_open_database(
        &self,
        path: impl AsRef<Path>,
        opts: Options,
    ) -> Result<DatabaseHandle> {
        let p = path.as_ref().to_path_buf();
        let o = Options {
            flush_mode: FlushMode::Manual,
            ..opts
        };
        let db = self
            .inner
            .background
            .run_blocking(move || Database::open(&p, o))?;
        self.inner.attach(db)
    }

    /// Drains every mailbox, stops every actor, flushes and closes every database, and joins
    /// the executors. Returns the first error met (all work is stopped regardless).
    pub fn shutdown(self) -> Result<()> {
        self.inner.shutdown()
    }
}

impl EngineInner {
    fn spawn_on(&self, exec: usize, job: Spawn) -> Result<()> {
        let ex = self.executors.lock().unwrap_or_else(|e| e.into_inner());
        let e = ex.get(exec % self.n.max(1)).ok_or(Error::Closed)?;
        e.spawn.send(job).map_err(|_| Error::Closed)
    }

    fn flusher(&self, exec: usize) -> Option<flume::Sender<FlusherMsg>> {
        let ex = self.executors.lock().unwrap_or_else(|e| e.into_inner());
        ex.get(exec % self.n.max(1)).map(|e| e.flusher.clone())
    }

    fn spawn_journal_writer(
        &self,
        journal: Arc<crate::journal::Journal>,
        exec: usize,
    ) -> Result<flume::Sender<JournalMsg>> {
        let (tx, rx) = flume::bounded(journal_writer::MAILBOX);
        let lane = self.critical.clone();
        self.spawn_on(
            exec,
            Box::new(move || Box::pin(journal_writer::run(journal, rx, lane))),
        )?;
        Ok(tx)
    }

    /// Places a storage actor (and, in separate mode, its journal writer) for `storage`.
    fn make_handle(
        &self,
        name: &str,
        storage: Storage,
        shared: Option<&flume::Sender<JournalMsg>>,
        writers: &Mutex<Vec<flume::Sender<JournalMsg>>>,
    ) -> Result<StorageHandle> {
        let exec = stable_hash(name) % self.n.max(1);
        let journal = match shared {
            Some(j) => j.clone(),
            None => {
                let w = self.spawn_journal_writer(storage.journal().clone(), exec)?;
                writers
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(w.clone());
                w
            }
        };
        let (tx, rx) = flume::bounded::<StorageMsg>(self.opts.mailbox_capacity.max(1));
        let s = storage.clone();
        let max = self.opts.max_requests_per_txn.max(1);
        self.spawn_on(
            exec,
            Box::new(move || Box::pin(storage_actor::run(s, rx, journal, max))),
        )?;
        if let Some(f) = self.flusher(exec) {
            let _ = f.send(FlusherMsg::Add(storage.clone()));
        }
        Ok(StorageHandle {
            name: name.to_string(),
            storage,
            tx,
            readers: self.readers.clone(),
        })
    }

    fn attach(self: &Arc<Self>, db: Database) -> Result<DatabaseHandle> {
        if self.down.load(std::sync::atomic::Ordering::Acquire) {
            return Err(Error::Closed);
        }
        let writers = Mutex::new(Vec::new());
        let journal = match db.shared_journal() {
            Some(j) => {
                let (tx, rx) = flume::bounded(journal_writer::MAILBOX);
                let t = journal_writer::start_thread(j, rx)?;
                Some((tx, t))
            }
            None => None,
        };
        let (journal, journal_thread) = match journal {
            Some((tx, t)) => (Some(tx), Some(t)),
            None => (None, None),
        };
        let root = self.make_handle("", db.root(), journal.as_ref(), &writers)?;
        let mut handles = HashMap::new();
        for name in db.storages() {
            let s = db.storage(&name)?;
            handles.insert(
                name.clone(),
                self.make_handle(&name, s, journal.as_ref(), &writers)?,
            );
        }
        let h = DatabaseHandle {
            inner: Arc::new(DbInner {
                db,
                engine: Arc::downgrade(self),
                journal,
                journal_thread: Mutex::new(journal_thread),
                handles: Mutex::new(handles),
                writers,
                root,
            }),
        };
        self.databases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(h.clone());
        Ok(h)
    }

    fn shutdown(&self) -> Result<()> {
        if self.down.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return Ok(());
        }
        let mut first: Result<()> = Ok(());
        let dbs = std::mem::take(&mut *self.databases.lock().unwrap_or_else(|e| e.into_inner()));
        for db in &dbs {
            // Storage actors first: each answers what is queued, then stops.
            let mut handles: Vec<StorageHandle> = db
                .inner
                .handles
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .cloned()
                .collect();
            handles.push(db.inner.root.clone());
            for h in &handles {
                let (tx, rx) = flume::bounded(1);
                if h.tx.send(StorageMsg::Stop { reply: tx }).is_ok() {
                    let _ = rx.recv();
                }
            }
            let mut writers: Vec<flume::Sender<JournalMsg>> =
                std::mem::take(&mut *db.inner.writers.lock().unwrap_or_else(|e| e.into_inner()));
            writers.extend(db.inner.journal.iter().cloned());
            for w in writers {
                let (tx, rx) = flume::bounded(1);
                if w.send(JournalMsg::Stop { reply: tx }).is_ok() {
                    let _ = rx.recv();
                }
            }
            let t = db
                .inner
                .journal_thread
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            if let Some(t) = t {
                if t.join().is_err() {
                    first = first.and(Err(Error::Poisoned {
                        cause: "the journal writer thread panicked".into(),
                    }));
                }
            }
        }
        let mut ex = std::mem::take(&mut *self.executors.lock().unwrap_or_else(|e| e.into_inner()));
        for e in &ex {
            let (tx, rx) = flume::bounded(1);
            if e.flusher.send(FlusherMsg::Stop { reply: tx }).is_ok() {
                let _ = rx.recv();
            }
            let _ = self.readers.send(ReadMsg::Stop);
        }
        for db in dbs {
            if let Err(e) = db.inner.db.clone().close() {
                first = first.and(Err(e));
            }
        }
        for e in &mut ex {
            let (dead, _) = flume::bounded(1);
            e.spawn = dead;
        }
        for e in &mut ex {
            if let Some(h) = e.handle.take() {
                if h.join().is_err() {
                    first = first.and(Err(Error::Poisoned {
                        cause: "an executor panicked".into(),
                    }));
                }
            }
        }
        self.critical.stop();
        self.background.stop();
        first
    }
}

impl Drop for EngineInner {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::warn!(error = %e, "engine shutdown on drop");
        }
    }
}

impl DatabaseHandle {
    /// The core database (stats, flush, close are best done through the engine).
    pub fn database(&self) -> &Database {
        &self.inner.db
    }

    /// The root storage's handle.
    pub fn root(&self) -> StorageHandle {
        self.inner.root.clone()
    }

    /// The handle of branch storage `name`, created when missing; its actor is placed on the
    /// executor given by a stable hash of the name.
    pub async fn storage(&self, name: &str) -> Result<StorageHandle> {
        if let Some(h) = self.cached(name) {
            return Ok(h);
        }
        let engine = self.inner.engine.upgrade().ok_or(Error::Closed)?;
        let db = self.inner.db.clone();
        let n = name.to_string();
        let s = engine.background.run(move || db.storage(&n)).await?;
        self.install(&engine, name, s)
    }

    /// Blocking [`DatabaseHandle::storage`].
    pub fn blocking_storage(&self, name: &str) -> Result<StorageHandle> {
        if let Some(h) = self.cached(name) {
            return Ok(h);
        }
        let engine = self.inner.engine.upgrade().ok_or(Error::Closed)?;
        let db = self.inner.db.clone();
        let n = name.to_string();
        let s = engine.background.run_blocking(move || db.storage(&n))?;
        self.install(&engine, name, s)
    }

    fn cached(&self, name: &str) -> Option<StorageHandle> {
        self.inner
            .handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    fn install(&self, engine: &EngineInner, name: &str, s: Storage) -> Result<StorageHandle> {
        let mut map = self.inner.handles.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = map.get(name) {
            return Ok(h.clone());
        }
        let h = engine.make_handle(name, s, self.inner.journal.as_ref(), &self.inner.writers)?;
        map.insert(name.to_string(), h.clone());
        Ok(h)
    }

    /// Drops branch storage `name` for good (see [`Database::drop_storage`]): its actor
    /// finishes the queued requests and stops first.
    pub async fn drop_storage(&self, name: &str) -> Result<()> {
        let engine = self.inner.engine.upgrade().ok_or(Error::Closed)?;
        let h = self
            .inner
            .handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        if let Some(h) = h {
            let (tx, rx) = flume::bounded(1);
            if h.tx
                .send_async(StorageMsg::Stop { reply: tx })
                .await
                .is_ok()
            {
                let _ = rx.recv_async().await;
            }
            if let Some(f) = engine.flusher(stable_hash(name) % engine.n.max(1)) {
                let _ = f
                    .send_async(FlusherMsg::Remove(h.storage.storage_id()))
                    .await;
            }
        }
        let db = self.inner.db.clone();
        let n = name.to_string();
        engine.background.run(move || db.drop_storage(&n)).await
    }

    /// Names of the branch storages.
    pub fn storages(&self) -> Vec<String> {
        self.inner.db.storages()
    }

    /// The database's journal counters.
    pub fn stats(&self) -> crate::DatabaseStats {
        self.inner.db.stats()
    }
}
