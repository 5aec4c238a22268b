//! [`Engine`]: the per-core glommio executors and the actors on them, and
//! [`DatabaseHandle`], a database served by actors.
//!
//! `Engine::start` raises the soft `RLIMIT_MEMLOCK` toward the hard limit (glommio refuses to
//! start under 512 KiB; each executor pins 192 KiB of registered buffers, `MEMLOCK_PER_EXECUTOR`), starts one `LocalExecutor` pinned to each chosen CPU,
//! marks its thread as an executor (a blocking disk call there is a bug: counted, and a panic
//! in debug builds), and on each a reader task and a flusher actor. The CPUs are those the
//! calling thread may run on (`sched_getaffinity`: `taskset`, a container's cpuset), one
//! executor per allowed CPU by default; fewer executors are spread over NUMA nodes, then over
//! physical cores before hyperthread siblings, more wrap around the allowed CPUs, and an
//! explicit CPU outside them is `Error::InvalidOptions` (`placement.rs`). Storage actors and journal
//! writers are spawned onto executors as databases and storages are opened: a database's root
//! actor (and its journal writer in separate mode) into the executor's `omnibus-documents` task
//! queue, every other actor into glommio's default queue (see [`Queue`] and [`PREEMPT_TIMER`]:
//! a document commit never waits behind the index batches queued on its executor).
//! `Engine::shutdown`
//! stops the storage actors (each finishes its queued requests), then the journal writers,
//! flushers and readers, closes the databases (flushing them) and joins the executor threads;
//! errors are returned, not lost. Dropping an `Engine` shuts it down.
//!
//! Indexes ([`DatabaseHandle::define_index`]) are index actors (`index.rs`) fed by the root's
//! storage actor. Shutdown abandons the builds in progress, stops the root's actor first (its
//! last commits are fed), then the index actors (each applies what is queued and records its
//! applied txn, so a clean reopen needs no reconcile), then the other storage actors.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use glommio::{LocalExecutorBuilder, Placement};

use super::blocking;
use super::flusher::{self, FlusherMsg};
use super::index::{
    self, BuildSlots, IndexActor, IndexDefinition, IndexMode, IndexShared, IndexStats,
};
use super::index_check::{check_index, IndexCheckReport};
use super::io_pool::{CpuPriority, IoPool};
use super::journal_writer::{self, JournalMsg};
use super::mailbox::{Closed, Mailbox};
use super::messages::{GroupBatch, IndexMsg, ReadPath, RootFeed, StorageMsg, WriteBatch};
use super::placement;
use super::reader_pool::{self, ReadMsg};
use super::storage::{self as storage_actor, StorageHandle};

use crate::actor_interface::{
    self, BackupReport, Database, DatabaseStats, Durability, Error, FlushMode, FlushReport,
    GroupError, Journal, Options, ReadTransaction, Result, Storage, MAX_GROUP_STORAGES, PAGE_SIZE,
};

/// Locked memory one executor pins (bytes): its glommio I/O buffer (64 KiB, glommio's
/// minimum) registered with each of its three rings (main, latency, poll), as
/// glommio 0.9's `Reactor::new` does. Measured as `VmPin` in `/proc/self/status`: 192 KiB per
/// executor (30 MiB with glommio's default 10 MiB buffer, which the engine never uses: its file
/// I/O goes through the storage environment and the I/O pools).
pub const MEMLOCK_PER_EXECUTOR: u64 = 3 * GLOMMIO_IO_MEMORY as u64;

/// The I/O buffer each executor gives glommio (bytes): glommio's minimum, 64 KiB (its default
/// is 10 MiB, for its DMA file API, which the engine does not use).
const GLOMMIO_IO_MEMORY: usize = 64 << 10;

/// The soft `RLIMIT_MEMLOCK` under which glommio 0.9 refuses to start an executor (bytes; its
/// `Reactor::new` check), whatever the number of executors.
const GLOMMIO_MIN_MEMLOCK: u64 = 512 << 10;

/// How the engine is laid out. A count of 0 where one is needed (`executors: Some(0)`,
/// `mailbox_capacity`, `max_requests_per_txn`, `index_queue_capacity`) makes
/// [`Engine::start`] fail with [`Error::InvalidOptions`].
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Executors to start, each pinned to one of the CPUs this process may use (the affinity
    /// of the thread calling [`Engine::start`]: `taskset`, a container's cpuset). Default: one
    /// per allowed CPU. Fewer are spread over NUMA nodes first, then over physical cores
    /// before hyperthread siblings (from sysfs; without it, the allowed CPUs in increasing
    /// order); more wrap around, executor `i` on the `i % n`-th of the `n` allowed CPUs in that
    /// order, so executors share CPUs. Ignored when `cpus` is set.
    pub executors: Option<usize>,
    /// Explicit CPUs, one executor pinned to each, in order (a CPU may be named twice: its
    /// executors share it). Every one must be a CPU this process may use, else
    /// [`Engine::start`] returns [`Error::InvalidOptions`] naming it and the allowed list.
    pub cpus: Option<Vec<usize>>,
    /// Capacity of each storage actor's mailbox (requests). Default 1,024.
    pub mailbox_capacity: usize,
    /// Requests merged into one transaction at most. Default 1,024.
    pub max_requests_per_txn: usize,
    /// Threads of the journal I/O pool (`omnibus-journal-io-N`): the batches of separate-mode
    /// journals, which use them concurrently, and the `fallocate` of commits that grow their
    /// data file. Default 16. A shared journal's writer has a thread of its own
    /// (`omnibus-journal-writer`). The field is named after the pool's old name; it does not
    /// size the io_uring environment's critical lane ([`crate::env::UringEnv`]), which is one
    /// ring per process.
    pub critical_lane_threads: usize,
    /// Threads of the background I/O pool (`omnibus-flush-io-N`): flushes, opening storages,
    /// index builds, checks and backups, at low I/O priority. Default: four per executor (each
    /// flusher runs up to four flushes at once). Named after the pool's old name, as
    /// [`EngineOptions::critical_lane_threads`].
    pub background_lane_threads: Option<usize>,
    /// How often flushers look for due flushes. Default 50 ms.
    pub flush_tick: Duration,
    /// Bytes of page images in memory ([`crate::live_image_bytes`]: scratch tables, current
    /// and still held by snapshots or flushes, commits in flight, and the dirty pages of
    /// transactions in progress) that the engine holds itself to. Two rules hold it:
    /// - flushes: each executor's flusher keeps its storages' scratch tables within an even
    ///   share of the budget, and while the page images exceed the whole budget it flushes its
    ///   largest scratch tables first, at least the excess;
    /// - pacing: while the page images exceed the budget, every storage actor waits (up to 1 s,
    ///   [`Engine::memory_budget_overruns`] counts the waits that ran out) before its next
    ///   transaction; requests queue and merge meanwhile. An index batch is also committed in
    ///   several transactions when one would copy more than 1/16 of the budget.
    ///
    /// The count is process-wide: engines in one process pace on their page images together.
    /// Default 512 MiB. Each storage's own threshold (`Options::flush_scratch_bytes`) still
    /// applies.
    pub memory_budget_bytes: u64,
    /// Capacity of each index actor's feed, in root commits (each one shared by every index).
    /// When an index's feed is full the root's actor waits before answering its writers.
    /// Default 256.
    pub index_queue_capacity: usize,
    /// Where [`StorageHandle::get`] and [`StorageHandle::multi_get`] run. Default
    /// [`ReadPath::Caller`] (about 0.3 µs a get, no message; see [`ReadPath`]).
    pub reads: ReadPath,
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
            memory_budget_bytes: 512 << 20,
            index_queue_capacity: 256,
            reads: ReadPath::Caller,
        }
    }
}

type Spawn = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()>>> + Send>;

/// Which glommio task queue of its executor an actor runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Queue {
    /// glommio's default queue: branch storages (indexes), index actors, flushers, readers.
    Default,
    /// The root storage's actor (and its journal writer in separate mode): the documents'
    /// commits, which every writer of the database waits on.
    Documents,
}

/// How long an executor runs task queues before it looks at I/O and at wakes from other
/// threads (glommio's preempt timer, default 100 ms). A journal batch's reply comes from
/// another thread, so a busy executor saw it only after this long; 5 ms bounds that wait.
/// The switch costs one `io_uring_enter` (a few µs), 200 times a second at most.
const PREEMPT_TIMER: Duration = Duration::from_millis(5);

/// The CPU priority of the thread that refreshes the maps' residency bits (nice 19, the
/// lowest): a refresh of a map whose pages this process has not mapped costs up to a few ms of
/// CPU (`mincore` looks each page up in the page cache), and at the default priority it kept
/// an application's tokio worker from its CPU for that long (`cargo bench --bench
/// cold_reads`). Not `SCHED_IDLE`: under an application that keeps every CPU busy a refresh
/// pass would never end (and a map that counts as evicting never stops).
const RESIDENCY_CPU: CpuPriority = CpuPriority::Lowest;

/// How often the keepalive thread (`omnibus-keepalive`) wakes every executor from outside.
///
/// Why: glommio 0.9 can park an executor that has work or a timer due, and sleep until some
/// other event arrives. Seen four times in `bench shop`'s separate mode on this 2-core VM:
/// both executors asleep in `io_uring_enter` (no CPU, no I/O) for 12 minutes, 167 s and 9
/// minutes, with the flushers' tick timers pending, until something outside woke them: a
/// debugger's attach, or (on the build before this thread) `SIGSTOP` + `SIGCONT`,
/// after which the run finished within seconds. glommio 0.9 sleeps
/// on its main ring with the latency ring (where timers live) linked to it, the design its
/// maintainers replaced to fix such hangs (glommio PR 552, not in 0.9); the community fork
/// also fixed a park with a runnable task queue (glommio/glommio PR 53). A foreign wake
/// writes the executor's eventfd, which wakes that sleep reliably, and the executor's next
/// turn fires due timers and runs ready queues: a lost wake-up costs at most this long. It
/// costs an idle engine 10 wake-ups a second per executor; a busy executor is not asleep, so
/// a poke is a `try_send`.
const KEEPALIVE: Duration = Duration::from_millis(100);

/// The keepalive thread: every [`KEEPALIVE`], one poke to each executor's keepalive task (a
/// bounded(1) channel: a poke not taken yet is not doubled). Ends once `stop` is set or every
/// executor's task is gone.
fn start_keepalive(pokes: Vec<flume::Sender<()>>, stop: Arc<std::sync::atomic::AtomicBool>) {
    let spawned = std::thread::Builder::new()
        .name("omnibus-keepalive".into())
        .spawn(move || {
            // Bounded: ends when stopped or when no executor is left.
            while !stop.load(Ordering::Acquire) {
                std::thread::sleep(KEEPALIVE);
                let mut alive = false;
                for p in &pokes {
                    match p.try_send(()) {
                        Ok(()) | Err(flume::TrySendError::Full(())) => alive = true,
                        Err(flume::TrySendError::Disconnected(())) => {}
                    }
                }
                if !alive {
                    break;
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the executor keepalive thread: an executor that misses a wake-up may sleep until its next event");
    }
}

struct Executor {
    spawn: flume::Sender<(Queue, Spawn)>,
    flusher: flume::Sender<FlusherMsg>,
    /// The engine's memory budget (the same for every executor).
    pressure: flusher::Pressure,
    handle: Option<glommio::ExecutorJoinHandle<()>>,
}

struct EngineInner {
    executors: Mutex<Vec<Executor>>,
    n: usize,
    /// The CPU each executor is pinned to, in executor order.
    cpus: Vec<usize>,
    /// Each executor's thread id, as its thread reported it.
    thread_ids: Vec<i32>,
    opts: EngineOptions,
    /// The reader pool's shared mailbox (closed by the last reader to end, `mailbox.rs`).
    readers: Mailbox<ReadMsg>,
    journal_io: IoPool,
    background_io: IoPool,
    /// The residency refreshes' thread (`omnibus-residency-0`, CPU priority [`RESIDENCY_CPU`]).
    residency: IoPool,
    databases: Mutex<Vec<DatabaseHandle>>,
    down: std::sync::atomic::AtomicBool,
    /// Stops the keepalive thread (set by shutdown).
    keepalive_stop: Arc<std::sync::atomic::AtomicBool>,
    /// Pokes the executors' keepalive tasks took (see [`KEEPALIVE`]).
    keepalive_wakes: Arc<AtomicU64>,
    /// The index storages with a write buffer, and the size each asked for
    /// ([`IndexDefinition::write_buffer_bytes`]): together they get two thirds of the memory
    /// budget ([`EngineInner::share_buffers`]).
    buffered: Mutex<Vec<(Storage, u64)>>,
}

/// Each of `n` buffered index storages' share of the memory budget `budget` for its write
/// buffer: two thirds of the budget split evenly (the last third is for page images, which
/// the buffers' apply steps of 1/16 of the budget each keep small); 0 (no buffer) when that is
/// under [`MIN_BUFFER_SHARE`], so the buffers never hold more than the two thirds. Measured
/// (docs/BENCHMARKS.md, "Buffered indexes in `bench shop`"): with 100 scattered indexes a
/// leaf is written once per as many entries as the buffers hold against the trees' leaves,
/// so the share is what sets the bytes written per entry.
fn buffer_share(budget: u64, n: usize) -> u64 {
    let share = budget / 3 * 2 / n.max(1) as u64;
    if share < MIN_BUFFER_SHARE {
        0
    } else {
        share
    }
}

/// The smallest write buffer the engine gives an index (64 KiB, about 600 entries of 40
/// bytes): a smaller one would be applied at nearly every index batch, copying its leaves as
/// an unbuffered batch does, plus the buffer's own work.
const MIN_BUFFER_SHARE: u64 = 64 << 10;

/// Most pages one transaction of an index batch copies (1/16 of the memory budget, at least
/// 64 pages): with many indexes written at once, no single batch holds a large part of the
/// budget in dirty pages.
fn index_batch_pages(budget: u64) -> usize {
    usize::try_from(budget / 16 / PAGE_SIZE as u64)
        .unwrap_or(usize::MAX)
        .max(64)
}

/// The actor runtime. Cheap to clone; the last clone dropped shuts it down.
///
/// The engine runs its own glommio executors (one per CPU the process may use, by default);
/// an application on any runtime talks to it through [`DatabaseHandle`]s and
/// [`StorageHandle`]s, which are `Send + Sync + Clone`. From tokio:
///
/// ```
/// use omnibus::actors::{Engine, EngineOptions};
/// use omnibus::{Error, Options};
///
/// # fn main() -> omnibus::Result<()> {
/// let dir = std::env::temp_dir().join(format!("omnibus-doc-tokio-{}", std::process::id()));
/// let engine = Engine::start(EngineOptions::default())?;
/// let rt = tokio::runtime::Runtime::new().expect("tokio");
/// rt.block_on(async {
///     let db = engine.open_database(&dir, Options::default()).await?;
///     let users = db.create_storage("users").await?;
///     users.put("alice", "admin").await?; // returns once durable
///     // On this worker when the pages are in memory, else on the engine's readers.
///     assert_eq!(users.get("alice").await?.as_deref(), Some(&b"admin"[..]));
///     // Read-modify-write on the storage's actor, no other writer in between.
///     let logins = users
///         .update(|t| {
///             let n = t.get("alice/logins")?.map_or(0, |v| v.len()) + 1;
///             t.put("alice/logins", vec![b'*'; n])?;
///             Ok::<usize, Error>(n)
///         })
///         .await?;
///     assert_eq!(logins, 1);
///     Ok::<(), Error>(())
/// })?;
/// engine.shutdown()?; // from a plain thread: it joins the executors
/// std::fs::remove_dir_all(&dir).ok();
/// # Ok(())
/// # }
/// ```
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
    /// The root actor's acknowledged txn, shared with it.
    feed: Arc<RootFeed>,
    /// The defined indexes, by name.
    indexes: Mutex<BTreeMap<String, IndexEntry>>,
    /// Build slots of this database's indexes (one per executor).
    slots: BuildSlots,
}

/// A defined index: its progress, a port to stop its actor, its storage.
struct IndexEntry {
    shared: Arc<IndexShared>,
    /// Its storage handle's flag refusing writes through the handle.
    indexed: Arc<std::sync::atomic::AtomicBool>,
    port: flume::Sender<IndexMsg>,
    storage: Storage,
    /// The definition (its map function, for `check_indexes`).
    def: IndexDefinition,
}

/// A database served by the engine's actors. Cheap to clone, `Send + Sync`. It does not keep
/// the engine running: once the last [`Engine`] clone is dropped (or shut down), its calls
/// fail with [`Error::Closed`].
///
/// Cancel safety (what dropping an async method's future before it is ready means): each
/// method says it. In short, work a method has handed to the engine's background I/O pool or
/// to an actor goes on to its end and only its answer is lost; waits and reads change nothing.
///
/// From an application's own glommio executor (the engine's executors are its own; the
/// application's tasks await the handles as any other future):
///
/// ```
/// use glommio::LocalExecutorBuilder;
/// use omnibus::actors::{Engine, EngineOptions, WriteBatch};
/// use omnibus::Options;
///
/// # fn main() -> omnibus::Result<()> {
/// let dir = std::env::temp_dir().join(format!("omnibus-doc-glommio-{}", std::process::id()));
/// let engine = Engine::start(EngineOptions::default())?;
/// let db = engine.blocking_open_database(&dir, Options::default())?;
/// let app = LocalExecutorBuilder::default()
///     .spawn(move || async move {
///         let orders = db.create_storage("orders").await?;
///         let mut batch = WriteBatch::new();
///         batch.put("o1", "3 apples").put("o2", "1 pear");
///         orders.write(batch).await?; // applied whole, once durable
///         let all = orders.range(.., 10).await?;
///         assert_eq!(all.len(), 2);
///         Ok::<(), omnibus::Error>(())
///     })
///     .expect("an executor");
/// app.join().expect("the executor's thread")?;
/// engine.shutdown()?;
/// std::fs::remove_dir_all(&dir).ok();
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct DatabaseHandle {
    inner: Arc<DbInner>,
}

impl std::fmt::Debug for DatabaseHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DatabaseHandle({})", self.inner.db.path().display())
    }
}

/// [`Engine::metrics`] and [`DatabaseHandle::metrics`].
pub(super) mod metrics;
mod query;

/// Raises the soft `RLIMIT_MEMLOCK` toward the hard limit to cover `executors` executors.
///
/// glommio refuses to start an executor while the soft limit is under
/// [`GLOMMIO_MIN_MEMLOCK`] (its `Reactor::new` check); above that, each executor registers its
/// [`GLOMMIO_IO_MEMORY`] buffer with its three rings, and where the limit does not cover that,
/// glommio skips the registration with a warning and runs the same (the engine does no I/O
/// through glommio's registered buffers). So only a limit under the minimum is an error.
fn ensure_memlock(executors: usize) -> Result<()> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let want = memlock_wanted(executors);
    let cur = getrlimit(Resource::Memlock);
    let soft = cur.current.unwrap_or(u64::MAX);
    let hard = cur.maximum.unwrap_or(u64::MAX);
    if soft >= want {
        return Ok(());
    }
    // Raise the soft limit to the hard one (the most this process may lock).
    let raised = hard > soft
        && setrlimit(
            Resource::Memlock,
            Rlimit {
                current: cur.maximum,
                maximum: cur.maximum,
            },
        )
        .is_ok();
    let soft = if raised { hard } else { soft };
    if soft >= GLOMMIO_MIN_MEMLOCK {
        if soft < want {
            tracing::debug!(
                soft_kib = soft >> 10,
                want_kib = want >> 10,
                "RLIMIT_MEMLOCK covers glommio's minimum but not every executor's registered buffers; glommio skips registering them"
            );
        }
        return Ok(());
    }
    Err(Error::ResourceLimit(format!(
        "glommio needs at least {} KiB of locked memory (RLIMIT_MEMLOCK) to start an executor, but the limit is {} KiB (hard {} KiB): \
         raise it with `ulimit -l {}` (as root, or in /etc/security/limits.conf, or LimitMEMLOCK= for a systemd service)",
        GLOMMIO_MIN_MEMLOCK >> 10,
        soft >> 10,
        hard >> 10,
        want >> 10
    )))
}

/// Locked memory that covers `executors` executors in full: glommio's minimum plus each
/// executor's registered buffers (bytes).
fn memlock_wanted(executors: usize) -> u64 {
    GLOMMIO_MIN_MEMLOCK + MEMLOCK_PER_EXECUTOR * executors as u64
}

fn stable_hash(name: &str) -> usize {
    crc32fast::hash(name.as_bytes()) as usize
}

impl Engine {
    /// Starts the executors and their reader and flusher actors.
    ///
    /// Executors are placed on the CPUs the calling thread may run on (its `sched_getaffinity`
    /// mask), as [`EngineOptions::executors`] and [`EngineOptions::cpus`] say.
    ///
    /// Errors: [`Error::ResourceLimit`] when the locked-memory limit cannot be raised enough
    /// (the message says how much is needed and how to grant it); [`Error::InvalidOptions`] for
    /// an empty CPU set or a CPU of [`EngineOptions::cpus`] outside the calling thread's
    /// affinity (the message names it and the allowed CPUs), and for a count of 0 where at
    /// least one is needed (`executors: Some(0)`, `mailbox_capacity`, `max_requests_per_txn`,
    /// `index_queue_capacity`); I/O errors reading the affinity or starting threads.
    pub fn start(opts: EngineOptions) -> Result<Engine> {
        for (name, n) in [
            ("executors", opts.executors.unwrap_or(1)),
            ("mailbox_capacity", opts.mailbox_capacity),
            ("max_requests_per_txn", opts.max_requests_per_txn),
            ("index_queue_capacity", opts.index_queue_capacity),
        ] {
            if n == 0 {
                return Err(Error::InvalidOptions(format!(
                    "EngineOptions::{name} is 0: at least 1"
                )));
            }
        }
        let allowed = placement::allowed_cpus()?;
        let topology = placement::read_topology(Path::new("/sys"), &allowed);
        let cpus = placement::choose(
            opts.cpus.as_deref(),
            opts.executors,
            &allowed,
            topology.as_deref(),
        )?;
        ensure_memlock(cpus.len())?;
        // glommio's executors run on io_uring and panic on their own thread where it cannot be
        // set up (seccomp, containers, kernel.io_uring_disabled): say so here instead.
        // Regression: with io_uring blocked, `ingest` and `bench shop`
        // panicked on the executor threads and then waited forever.
        if let Err(e) = io_uring::IoUring::new(2) {
            return Err(Error::ResourceLimit(format!(
                "the actor runtime needs io_uring (its glommio executors run on it) and io_uring_setup failed: {e}; the core API (Storage, Database) works without it, from plain threads"
            )));
        }
        let journal_io = IoPool::start(
            "omnibus-journal-io",
            opts.critical_lane_threads,
            false,
            CpuPriority::Normal,
        )?;
        let background_io = IoPool::start(
            "omnibus-flush-io",
            opts.background_lane_threads.unwrap_or(4 * cpus.len()),
            true,
            CpuPriority::Normal,
        )?;
        // One thread at the lowest CPU priority for the flushers' residency refreshes.
        let residency = IoPool::start("omnibus-residency", 1, true, RESIDENCY_CPU)?;
        let (rtx, rrx) = flume::bounded::<ReadMsg>(reader_pool::MAILBOX);
        let readers_closed = Closed::default();
        let readers_live = Arc::new(std::sync::atomic::AtomicUsize::new(cpus.len()));
        // Each executor says it runs, with its thread id; one that dies first (a glommio panic)
        // drops its sender.
        let (up_tx, up_rx) = flume::bounded::<(usize, i32)>(cpus.len());
        let mut executors = Vec::new();
        let mut pokes = Vec::new();
        let keepalive_wakes = Arc::new(AtomicU64::new(0));
        // One memory budget for the whole engine (see `flusher.rs`).
        let budget: flusher::Pressure = Arc::new(flusher::Budget::new(opts.memory_budget_bytes));
        for (i, cpu) in cpus.iter().enumerate() {
            let (stx, srx) = flume::bounded::<(Queue, Spawn)>(1024);
            let (ftx, frx) = flume::bounded::<FlusherMsg>(1024);
            let reader = reader_pool::Reader {
                rx: rrx.clone(),
                live: readers_live.clone(),
                closed: readers_closed.clone(),
            };
            let pool = background_io.clone();
            let refresher = residency.clone();
            let tick = opts.flush_tick;
            let share = opts.memory_budget_bytes / cpus.len() as u64;
            let pressure = budget.clone();
            let flag = budget.clone();
            let up = up_tx.clone();
            let (poke_tx, poke_rx) = flume::bounded::<()>(1);
            pokes.push(poke_tx);
            let woken = keepalive_wakes.clone();
            let handle = LocalExecutorBuilder::new(Placement::Fixed(*cpu))
                .name(&format!("omnibus-exec-{i}"))
                .io_memory(GLOMMIO_IO_MEMORY)
                .preempt_timer(PREEMPT_TIMER)
                .spawn(move || async move {
                    let _ = up.send((i, rustix::thread::gettid().as_raw_nonzero().get()));
                    drop(up);
                    // Any blocking disk call on this thread is a bug (checked by the core's
                    // default environment).
                    actor_interface::mark_executor_thread();
                    glommio::spawn_local(async move {
                        // Each poke is a foreign wake of this executor (see KEEPALIVE).
                        while poke_rx.recv_async().await.is_ok() {
                            woken.fetch_add(1, Ordering::Relaxed);
                        }
                    })
                    .detach();
                    glommio::spawn_local(reader_pool::run(reader)).detach();
                    glommio::spawn_local(flusher::run(frx, pool, refresher, tick, share, flag)).detach();
                    // The documents' queue: picked before the default queue whenever it has a
                    // task (it uses little CPU, so its virtual runtime stays the lowest), so a
                    // root commit never waits behind every queued index batch, only behind
                    // the task running when it woke.
                    // `Latency::NotImportant`: with `Matters`, glommio puts the queue's timers
                    // (the storage actor's pacing sleeps) on its latency ring, and a separate-
                    // mode `bench shop` run hung for 12 minutes with both executors asleep
                    // until a debugger's attach woke them (a lost wake-up).
                    let documents = glommio::executor().create_task_queue(
                        glommio::Shares::Static(1000),
                        glommio::Latency::NotImportant,
                        "omnibus-documents",
                    );
                    while let Ok((queue, job)) = srx.recv_async().await {
                        match queue {
                            Queue::Documents => {
                                match glommio::spawn_local_into(job(), documents) {
                                    Ok(t) => {
                                        t.detach();
                                    }
                                    // Not expected (the handle is this executor's own queue,
                                    // never removed). The actor's future is dropped with its
                                    // mailbox, so its callers get `Error::Closed`, not a hang.
                                    Err(e) => tracing::error!(error = %e, "cannot spawn an actor in the documents' task queue"),
                                }
                            }
                            Queue::Default => {
                                glommio::spawn_local(job()).detach();
                            }
                        }
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
                pressure,
                handle: Some(handle),
            });
        }
        drop(up_tx);
        let mut thread_ids = vec![0; executors.len()];
        for _ in 0..executors.len() {
            // Bounded: every executor either reports or drops its sender (its thread ended).
            if let Ok((i, tid)) = up_rx.recv_timeout(std::time::Duration::from_secs(30)) {
                thread_ids[i] = tid;
            } else {
                return Err(Error::ResourceLimit(
                    "an executor thread failed to start (glommio panicked: see stderr); the actor runtime cannot run here".into(),
                ));
            }
        }
        let keepalive_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        start_keepalive(pokes, keepalive_stop.clone());
        Ok(Engine {
            inner: Arc::new(EngineInner {
                keepalive_stop,
                keepalive_wakes,
                n: executors.len(),
                executors: Mutex::new(executors),
                cpus,
                thread_ids,
                opts,
                readers: Mailbox::new(rtx, readers_closed),
                journal_io,
                background_io,
                residency,
                databases: Mutex::new(Vec::new()),
                buffered: Mutex::new(Vec::new()),
                down: std::sync::atomic::AtomicBool::new(false),
            }),
        })
    }

    /// Executors running.
    pub fn executors(&self) -> usize {
        self.inner.n
    }

    /// The CPU each executor is pinned to, in executor order (executor `i` is the thread named
    /// `omnibus-exec-i-…`). See [`EngineOptions::cpus`] for how they are chosen.
    pub fn executor_cpus(&self) -> &[usize] {
        &self.inner.cpus
    }

    /// Each executor's Linux thread id (`gettid`, as the thread reported it when it started),
    /// in executor order: `/proc/self/task/<id>/` describes the thread (its name, its
    /// `Cpus_allowed_list`).
    pub fn executor_thread_ids(&self) -> &[i32] {
        &self.inner.thread_ids
    }

    /// Transactions of this engine's storages that started over the memory budget
    /// ([`EngineOptions::memory_budget_bytes`], compared with [`crate::live_image_bytes`]) after
    /// their storage actor had waited the longest pacing wait (1 s) for the flushes: non-zero
    /// means the budget could not be held (a snapshot held for long keeps flushes from freeing
    /// page images; transactions in progress hold their dirty pages). Each one also logs a
    /// warning (at most one per 10 s).
    pub fn memory_budget_overruns(&self) -> u64 {
        self.inner
            .pressure(0)
            .overruns
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Times an executor took a poke from the keepalive thread, which wakes every executor
    /// every 100 ms from outside so that a wake-up glommio 0.9 loses costs at most that long
    /// (see `KEEPALIVE` in `actors/engine.rs`). Grows by about 10 a second per executor while
    /// the engine runs.
    pub fn executor_keepalive_wakes(&self) -> u64 {
        self.inner.keepalive_wakes.load(Ordering::Relaxed)
    }

    /// Opens (or creates) the database at `path` and starts its actors. The storages are opened
    /// with [`FlushMode::Manual`]: the engine's flushers drive flushes.
    ///
    /// Errors: [`Error::InvalidOptions`] for `Options::write_buffer_bytes` other than 0 and
    /// its default (which the engine takes as none: the root and plain branches open without a
    /// buffer): under the engine the root and plain branches are not buffered (an apply outside a documents
    /// commit would make every index reconcile at the next open), only index storages, each by
    /// its [`IndexDefinition::write_buffer_bytes`]; a database written with buffers through
    /// the library opens, and its storages' first commits apply what the journal put back.
    /// The open's own errors.
    ///
    /// Cancel safety: the open (recovery included) is handed to the engine's background I/O
    /// pool at the future's first poll. Dropped before that, nothing happens; dropped after,
    /// the open still runs to its end and the database it opened is closed again when its
    /// lost answer is dropped: until then another open of the path gets
    /// [`Error::AlreadyOpen`].
    pub async fn open_database(
        &self,
        path: impl AsRef<Path>,
        opts: Options,
    ) -> Result<DatabaseHandle> {
        let asked = opts.write_buffer_bytes;
        if asked != 0 && asked != Options::default().write_buffer_bytes {
            return Err(Error::InvalidOptions(
                "write_buffer_bytes: under the engine only index storages are buffered \
                 (IndexDefinition::write_buffer_bytes); open with write_buffer_bytes: 0 or \
                 the default, or through Database::open"
                    .into(),
            ));
        }
        let p = path.as_ref().to_path_buf();
        let o = Options {
            flush_mode: FlushMode::Manual,
            write_buffer_bytes: 0,
            ..opts
        };
        let db = self
            .inner
            .background_io
            .run(move || {
                let db = Database::open(&p, o)?;
                // Branches left as indexes by an earlier open hide their applied records (a
                // damaged branch is left as the open left it: reported by `damaged`).
                for name in db.storages() {
                    if let Ok(s) = db.storage(&name) {
                        let _ = index_marked(s);
                    }
                }
                Ok(db)
            })
            .await?;
        self.inner.attach(db)
    }

    /// Blocking [`Engine::open_database`].
    pub fn blocking_open_database(
        &self,
        path: impl AsRef<Path>,
        opts: Options,
    ) -> Result<DatabaseHandle> {
        blocking::wait(
            "Engine::blocking_open_database",
            self.open_database(path, opts),
        )
    }

    /// Drains every mailbox, stops every actor, flushes and closes every database, and joins
    /// the executors. Returns the first error met (all work is stopped regardless). A closed
    /// database's handles answer [`Error::Closed`]; its storages' `LOCK` files stay held until
    /// the last [`DatabaseHandle`] and [`StorageHandle`] clone of it is dropped (another opener,
    /// in this process or another, gets [`Error::AlreadyOpen`] until then).
    pub fn shutdown(self) -> Result<()> {
        self.inner.shutdown()
    }
}

impl EngineInner {
    /// Adds (`Some(bytes)`) or removes (`None`) `storage` among the buffered index storages and
    /// sets every one's write buffer to the smaller of what it asked for and an equal share
    /// of two thirds of the memory budget ([`buffer_share`]: none when that share is under 64
    /// KiB), applied in steps of at most an index batch's pages ([`index_batch_pages`],
    /// [`Storage::set_apply_step_pages`]); a removed one gets none (its next commit, if any,
    /// applies what it buffered).
    fn share_buffers(&self, storage: &Storage, bytes: Option<u64>) {
        let mut b = self.buffered.lock().unwrap_or_else(|e| e.into_inner());
        b.retain(|(s, _)| s.storage_id() != storage.storage_id());
        match bytes {
            Some(n) if n > 0 => b.push((storage.clone(), n)),
            _ => storage.set_write_buffer_bytes(0),
        }
        let share = buffer_share(self.opts.memory_budget_bytes, b.len());
        let step = index_batch_pages(self.opts.memory_budget_bytes) as u64;
        for (s, asked) in b.iter() {
            s.set_write_buffer_bytes((*asked).min(share));
            // An apply copies at most what an index batch's transaction may.
            s.set_apply_step_pages(step);
        }
    }

    fn spawn_on(&self, exec: usize, job: Spawn) -> Result<()> {
        self.spawn_in(exec, Queue::Default, job)
    }

    fn spawn_in(&self, exec: usize, queue: Queue, job: Spawn) -> Result<()> {
        let ex = self.executors.lock().unwrap_or_else(|e| e.into_inner());
        let e = ex.get(exec % self.n.max(1)).ok_or(Error::Closed)?;
        e.spawn.send((queue, job)).map_err(|_| Error::Closed)
    }

    fn pressure(&self, exec: usize) -> flusher::Pressure {
        let ex = self.executors.lock().unwrap_or_else(|e| e.into_inner());
        ex.get(exec % self.n.max(1))
            .map(|e| e.pressure.clone())
            .unwrap_or_default()
    }

    fn flusher(&self, exec: usize) -> Option<flume::Sender<FlusherMsg>> {
        let ex = self.executors.lock().unwrap_or_else(|e| e.into_inner());
        ex.get(exec % self.n.max(1)).map(|e| e.flusher.clone())
    }

    fn spawn_journal_writer(
        &self,
        journal: Arc<Journal>,
        exec: usize,
        queue: Queue,
    ) -> Result<flume::Sender<JournalMsg>> {
        let (tx, rx) = flume::bounded(journal_writer::MAILBOX);
        let pool = self.journal_io.clone();
        self.spawn_in(
            exec,
            queue,
            Box::new(move || Box::pin(journal_writer::run(journal, rx, pool))),
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
        feed: Option<Arc<RootFeed>>,
        group_lock: Option<Arc<std::sync::RwLock<()>>>,
    ) -> Result<StorageHandle> {
        let exec = stable_hash(name) % self.n.max(1);
        // A database's root (the storage with the change feed) runs in the documents' queue.
        let queue = if feed.is_some() {
            Queue::Documents
        } else {
            Queue::Default
        };
        let journal = match shared {
            Some(j) => j.clone(),
            None => {
                let w = self.spawn_journal_writer(
                    actor_interface::storage_journal(&storage).clone(),
                    exec,
                    queue,
                )?;
                writers
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(w.clone());
                w
            }
        };
        let (tx, rx) = flume::bounded::<StorageMsg>(self.opts.mailbox_capacity.max(1));
        let closed = Closed::default();
        let s = storage.clone();
        let links = storage_actor::Links {
            closed: closed.clone(),
            journal,
            journal_io: self.journal_io.clone(),
            max_requests: self.opts.max_requests_per_txn.max(1),
            feed,
            pressure: self.pressure(exec),
            group_lock,
        };
        self.spawn_in(
            exec,
            queue,
            Box::new(move || Box::pin(storage_actor::run(s, rx, links))),
        )?;
        if let Some(f) = self.flusher(exec) {
            let _ = f.send(FlusherMsg::Add(storage.clone()));
        }
        Ok(StorageHandle {
            name: name.to_string(),
            storage,
            tx: Mailbox::new(tx, closed),
            readers: self.readers.clone(),
            background: self.background_io.clone(),
            reads: self.opts.reads,
            indexed: Arc::default(),
        })
    }

    fn attach(self: &Arc<Self>, db: Database) -> Result<DatabaseHandle> {
        if self.down.load(std::sync::atomic::Ordering::Acquire) {
            return Err(Error::Closed);
        }
        let writers = Mutex::new(Vec::new());
        let journal = match actor_interface::shared_journal(&db) {
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
        let feed = Arc::new(RootFeed {
            acked_txn: AtomicU64::new(db.root().begin_read()?.txn_id()),
        });
        let root = self.make_handle(
            "",
            db.root(),
            journal.as_ref(),
            &writers,
            Some(feed.clone()),
            journal.is_some().then(|| actor_interface::group_lock(&db)),
        )?;
        let mut handles = HashMap::new();
        for name in db.storages() {
            let s = db.storage(&name)?;
            handles.insert(
                name.clone(),
                self.make_handle(&name, s, journal.as_ref(), &writers, None, None)?,
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
                feed,
                indexes: Mutex::new(BTreeMap::new()),
                slots: BuildSlots::new(self.n),
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
        // The keepalive thread goes on until every executor has stopped: shutdown waits on the
        // executors' actors (each answers what is queued, then stops), and a wake-up lost
        // there would otherwise hang it for good.
        let mut first: Result<()> = Ok(());
        let dbs = std::mem::take(&mut *self.databases.lock().unwrap_or_else(|e| e.into_inner()));
        for db in &dbs {
            // Builds in progress stop (they would hold up the root's last commits); the next
            // definition reconciles.
            let indexes: Vec<(Arc<IndexShared>, flume::Sender<IndexMsg>)> = db
                .inner
                .indexes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .map(|e| (e.shared.clone(), e.port.clone()))
                .collect();
            for (s, _) in &indexes {
                s.abandon.store(true, Ordering::Release);
            }
            let stop = |h: &StorageHandle| {
                let (tx, rx) = flume::bounded(1);
                if h.tx.sender().send(StorageMsg::Stop { reply: tx }).is_ok() {
                    let _ = rx.recv();
                }
            };
            // The root first: it answers what is queued, feeding the indexes.
            stop(&db.inner.root);
            // Then the indexes: each applies what is queued and records its applied txn (an
            // actor that has ended answers no `Stop` sent after it did).
            for (shared, port) in &indexes {
                let (tx, rx) = flume::bounded(1);
                if port.send(IndexMsg::Stop { reply: tx }).is_ok() && !shared.exited() {
                    let _ = rx.recv();
                }
            }
            // Then the other storage actors: each answers what is queued, then stops.
            // (The buffered index storages are let go with them: the database's close below
            // applies their buffers, now that no actor writes them.)
            let handles: Vec<StorageHandle> = db
                .inner
                .handles
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .cloned()
                .collect();
            for h in &handles {
                stop(h);
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
            let _ = self.readers.sender().send(ReadMsg::Stop);
        }
        // Every actor has stopped: the index storages' buffers are the databases' to apply.
        self.buffered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
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
        self.keepalive_stop.store(true, Ordering::Release);
        self.journal_io.stop();
        self.background_io.stop();
        self.residency.stop();
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
    /// The core database under the engine, for tests that write around the engine on purpose
    /// (feature `testing`): a write transaction taken through it makes the storage's actor fail
    /// its requests with [`Error::WriteInProgress`], and root writes made so skip the index feed.
    #[cfg(feature = "testing")]
    pub fn core_database_for_tests(&self) -> &Database {
        &self.inner.db
    }

    /// Writes every committed page of every storage of the database to its data file (as
    /// [`Database::flush`], branches first, then the root; the counters of the reports summed,
    /// `flushed_txn` the root's: 0 when the root had nothing to flush), on the
    /// engine's background I/O pool; write buffers stay buffered (their actors apply them).
    /// The engine's flushers do this on their own when due; this is for a caller that wants it
    /// now (before a copy of the files, a measurement).
    ///
    /// Errors: the first storage's flush error (the storage is then poisoned); [`Error::Closed`]
    /// after shutdown.
    ///
    /// Cancel safety: the flush is handed to the pool at the first poll; dropped after that,
    /// it still runs to its end (or its error), and only the report is lost.
    pub async fn flush(&self) -> Result<FlushReport> {
        let engine = self.inner.engine.upgrade().ok_or(Error::Closed)?;
        let db = self.inner.db.clone();
        engine
            .background_io
            .run(move || actor_interface::flush_database_pages(&db))
            .await
    }

    /// Blocking [`DatabaseHandle::flush`].
    pub fn blocking_flush(&self) -> Result<FlushReport> {
        blocking::wait("DatabaseHandle::blocking_flush", self.flush())
    }

    /// The root storage's handle.
    pub fn root(&self) -> StorageHandle {
        self.inner.root.clone()
    }

    /// The handle of the existing branch storage `name`; its actor is placed on the executor
    /// given by a stable hash of the name.
    ///
    /// Errors: [`Error::StorageNotFound`] when the database has no storage `name` (create it
    /// with [`DatabaseHandle::create_storage`]); the other errors of [`Database::storage`];
    /// [`Error::Closed`] after shutdown.
    ///
    /// Cancel safety: dropping the future changes nothing (the storage is open in the database
    /// already; the next call makes its handle).
    pub async fn storage(&self, name: &str) -> Result<StorageHandle> {
        if let Some(h) = self.cached(name) {
            // Ready without awaiting: charged to the thread's budget as a get is (`coop.rs`).
            super::coop::consume(1).await;
            return Ok(h);
        }
        let engine = self.inner.engine.upgrade().ok_or(Error::Closed)?;
        let db = self.inner.db.clone();
        let n = name.to_string();
        let s = engine
            .background_io
            .run(move || index_marked(db.storage(&n)?))
            .await?;
        self.install(&engine, name, s)
    }

    /// Blocking [`DatabaseHandle::storage`].
    pub fn blocking_storage(&self, name: &str) -> Result<StorageHandle> {
        blocking::wait("DatabaseHandle::blocking_storage", self.storage(name))
    }

    /// The handle of branch storage `name`, created when missing (on the background I/O pool:
    /// creating a storage syncs files and directories); its actor is placed as
    /// [`DatabaseHandle::storage`] places it.
    ///
    /// Errors: as [`Database::create_storage`]; [`Error::Closed`] after shutdown.
    ///
    /// Cancel safety: the creation is handed to the pool at the first poll; dropped after
    /// that, the storage is still created (durably), and the next `storage` or
    /// `create_storage` call returns its handle.
    pub async fn create_storage(&self, name: &str) -> Result<StorageHandle> {
        if let Some(h) = self.cached(name) {
            return Ok(h);
        }
        let engine = self.inner.engine.upgrade().ok_or(Error::Closed)?;
        let db = self.inner.db.clone();
        let n = name.to_string();
        let s = engine
            .background_io
            .run(move || index_marked(db.create_storage(&n)?))
            .await?;
        self.install(&engine, name, s)
    }

    /// Blocking [`DatabaseHandle::create_storage`].
    pub fn blocking_create_storage(&self, name: &str) -> Result<StorageHandle> {
        blocking::wait(
            "DatabaseHandle::blocking_create_storage",
            self.create_storage(name),
        )
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
        let h = engine.make_handle(
            name,
            s,
            self.inner.journal.as_ref(),
            &self.inner.writers,
            None,
            None,
        )?;
        map.insert(name.to_string(), h.clone());
        Ok(h)
    }

    /// Drops branch storage `name` for good (see [`Database::drop_storage`]): its index actor
    /// (if it is an index) and its storage actor finish the queued work and stop first.
    ///
    /// Errors: those of [`Database::drop_storage`] ([`Error::NotAStorage`] when there is no
    /// such storage); [`Error::Closed`] after shutdown.
    ///
    /// Cancel safety: dropped partway, the drop may have stopped the storage's actors (its
    /// index undefined, its handles answering [`Error::Closed`]) and left the storage in the
    /// database: [`DatabaseHandle::storage`] then gives a working handle again, and calling
    /// `drop_storage` again finishes the drop. Once the pool has the removal, it completes.
    pub async fn drop_storage(&self, name: &str) -> Result<()> {
        let engine = self.inner.engine.upgrade().ok_or(Error::Closed)?;
        self.stop_index(name).await;
        let h = self
            .inner
            .handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        if let Some(h) = h {
            let (tx, rx) = flume::bounded(1);
            let _ = h.tx.ask(StorageMsg::Stop { reply: tx }, rx).await;
            if let Some(f) = engine.flusher(stable_hash(name) % engine.n.max(1)) {
                let _ = f
                    .send_async(FlusherMsg::Remove(h.storage.storage_id()))
                    .await;
            }
        }
        let db = self.inner.db.clone();
        let n = name.to_string();
        engine.background_io.run(move || db.drop_storage(&n)).await
    }

    /// Names of the branch storages.
    pub fn storages(&self) -> Vec<String> {
        self.inner.db.storages()
    }

    /// Writes a batch to each of several storages of this database (the root and any
    /// branches, each at most once) as one atomic group: after any crash every storage shows
    /// its batch or none does, as a [`Database::begin_group`] commit (docs/design.md 3.11).
    /// Returns once the group is durable (queued, when every batch is
    /// [`Durability::Eventual`]) and visible in every storage. The root's actor leads the
    /// group: each branch's actor prepares its batch in a transaction of its own, in
    /// parallel, and the root's actor writes one journal record of every part
    /// (docs/ARCHITECTURE.md, `actors/commit.rs`); root documents changed by the group reach
    /// the indexes as any root write does. Queued groups and root writes merge into one group
    /// (at most 16 MiB of keys and values from several requests).
    ///
    /// What it does not give: one snapshot across storages (each publishes its part in turn,
    /// as a core group), a per-operation result (use [`StorageHandle::write`] for one storage).
    ///
    /// Cancel safety: as [`StorageHandle::put`]: sent to the root's actor at the first poll
    /// (a later one while its mailbox is full); dropped before that, nothing is written;
    /// dropped after, the group commits (or fails) all the same and only the answer is lost.
    ///
    /// Errors: [`GroupError::SeparateJournals`] in separate-journal mode;
    /// [`GroupError::TooManyStorages`] past [`crate::MAX_GROUP_STORAGES`] storages (the
    /// synchronous indexes counted when the root is written);
    /// [`GroupError::NotInDatabase`] for a handle of another database (or engine);
    /// [`GroupError::Duplicate`] for a storage named twice; [`Error::InvalidOptions`] for an
    /// index storage (its index writes it); a batch's key or value errors
    /// ([`WriteBatch::validate`]); [`GroupError::TooLarge`] past 64 MiB of journal record;
    /// I/O errors (the database is then poisoned); [`Error::Closed`] after shutdown or when a
    /// member storage was dropped meanwhile; [`Error::IndexPoisoned`] when a synchronous
    /// index's map function panicked on a document of this or of another request merged with it
    /// (retry). After an error nothing of the group is visible.
    pub async fn write<'a>(
        &self,
        batches: impl IntoIterator<Item = (&'a StorageHandle, WriteBatch)>,
    ) -> Result<()> {
        let batches: Vec<(&StorageHandle, WriteBatch)> = batches.into_iter().collect();
        if self.inner.journal.is_none() {
            return Err(GroupError::SeparateJournals.into());
        }
        // A group that writes the root holds each synchronous index's part too.
        let with_root = batches
            .iter()
            .any(|(h, _)| h.tx.same_channel(&self.inner.root.tx));
        let count = batches.len()
            + if with_root {
                self.synchronous_indexes(None)
            } else {
                0
            };
        if count > MAX_GROUP_STORAGES {
            return Err(GroupError::TooManyStorages {
                count,
                max: MAX_GROUP_STORAGES,
            }
            .into());
        }
        let eventual = !batches.is_empty()
            && batches
                .iter()
                .all(|(_, b)| b.durability() == Durability::Eventual);
        let mut root = WriteBatch::new();
        root.set_durability(if eventual {
            Durability::Eventual
        } else {
            Durability::Immediate
        });
        let mut root_seen = false;
        let mut parts: Vec<GroupBatch> = Vec::with_capacity(batches.len());
        {
            let handles = self.inner.handles.lock().unwrap_or_else(|e| e.into_inner());
            let indexes = self.inner.indexes.lock().unwrap_or_else(|e| e.into_inner());
            for (h, b) in batches {
                b.validate()?;
                let duplicate = || -> Error {
                    GroupError::Duplicate {
                        path: h.storage.path().to_path_buf(),
                    }
                    .into()
                };
                if h.tx.same_channel(&self.inner.root.tx) {
                    if root_seen {
                        return Err(duplicate());
                    }
                    root_seen = true;
                    root.ops = b.ops;
                    continue;
                }
                let ours = handles
                    .get(&h.name)
                    .is_some_and(|o| o.tx.same_channel(&h.tx));
                if !ours {
                    return Err(GroupError::NotInDatabase {
                        path: h.storage.path().to_path_buf(),
                    }
                    .into());
                }
                if indexes.contains_key(&h.name) {
                    return Err(Error::InvalidOptions(format!(
                        "storage {:?} is an index: its index writes it",
                        h.name
                    )));
                }
                if parts.iter().any(|p| p.name == h.name) {
                    return Err(duplicate());
                }
                parts.push(GroupBatch {
                    name: h.name.clone(),
                    tx: h.tx.sender().clone(),
                    batch: b,
                });
            }
        }
        let (tx, rx) = flume::bounded(1);
        self.inner
            .root
            .tx
            .ask(
                StorageMsg::Group {
                    root,
                    parts,
                    reply: tx,
                },
                rx,
            )
            .await?
    }

    /// Blocking [`DatabaseHandle::write`].
    pub fn blocking_write<'a>(
        &self,
        batches: impl IntoIterator<Item = (&'a StorageHandle, WriteBatch)>,
    ) -> Result<()> {
        blocking::wait("DatabaseHandle::blocking_write", self.write(batches))
    }

    /// The database's journal counters.
    pub fn stats(&self) -> DatabaseStats {
        self.inner.db.stats()
    }

    /// Defines index `def` over the root storage's documents, and returns once it is
    /// registered: its branch storage (named [`IndexDefinition::name`]) is created when
    /// missing, and its actor builds it in the background, then keeps it current from the root's
    /// change feed (see `index.rs`). Use [`DatabaseHandle::wait_for_indexes`] to wait until it
    /// is built and current, [`DatabaseHandle::index_stats`] for its progress.
    ///
    /// Each process defines its indexes after opening the database (the map function is code):
    /// an index whose applied record equals the root's last txn resumes without a rebuild; one
    /// behind it (a crash, writes to the root outside the engine) or built with
    /// [`IndexDefinition::rebuild`] is reconciled with the documents first. Defining a name
    /// that is already defined replaces that index (its actor applies what is queued, or
    /// abandons its build, and stops first). Existing entries of the storage that the map
    /// function does not give are deleted. Writes through the root's [`StorageHandle`] reach
    /// indexes through the feed; writes through the core [`Database`] do not, but they take
    /// root txn ids: an index reconciles when it sees a gap in the txn ids fed to it, or at its
    /// next definition.
    ///
    /// Errors: [`Error::InvalidStorageName`]; the errors of creating or opening the branch
    /// storage; [`Error::InvalidOptions`] when another caller defines the same name at the same
    /// time; [`Error::Closed`] after shutdown. A failure of the build itself poisons the index
    /// ([`Error::IndexPoisoned`] from `wait_for_indexes`), it is not returned here, except for
    /// a [`crate::actors::IndexMode::Synchronous`] index, which is returned once built: then
    /// also [`GroupError::SeparateJournals`] in separate-journal mode,
    /// [`GroupError::TooManyStorages`] past 255 synchronous indexes (each root commit is a group
    /// of the root and every one of them), and [`Error::InvalidOptions`] when the root was
    /// written outside the engine while it was being turned synchronous (define it again).
    ///
    /// Cancel safety: an asynchronous index is registered in the poll that returns `Ok`, so a
    /// future dropped before it is ready leaves the index undefined (its branch storage may
    /// have been created; a feed the root was given meanwhile is dropped at the root's next
    /// commit). A [`crate::actors::IndexMode::Synchronous`] index dropped while it waits for
    /// its build stays defined as an asynchronous index (fed, not part of the root's
    /// commits). Either way, defining it again gives the definition asked for.
    pub async fn define_index(&self, def: IndexDefinition) -> Result<()> {
        Database::validate_storage_name(&def.name)?;
        let branch = self.create_storage(&def.name).await?;
        self.stop_index(&def.name).await;
        let engine = self.inner.engine.upgrade().ok_or(Error::Closed)?;
        let (port, rx) = flume::bounded(engine.opts.index_queue_capacity.max(1));
        let (tx, reply) = flume::bounded(1);
        let snapshot = self
            .inner
            .root
            .tx
            .ask(
                StorageMsg::AddFeed {
                    port: port.clone(),
                    reply: tx,
                },
                reply,
            )
            .await??;
        let sync = def.mode == IndexMode::Synchronous;
        if sync && self.inner.journal.is_none() {
            return Err(GroupError::SeparateJournals.into());
        }
        // Every root commit is a group of the root and each synchronous index.
        let synchronous = self.synchronous_indexes(Some(&def.name));
        if sync && 1 + synchronous + 1 > MAX_GROUP_STORAGES {
            return Err(GroupError::TooManyStorages {
                count: 1 + synchronous + 1,
                max: MAX_GROUP_STORAGES,
            }
            .into());
        }
        let name = def.name.clone();
        let shared = self.start_index(
            &engine,
            def.clone(),
            branch.clone(),
            port.clone(),
            rx,
            snapshot,
        )?;
        if sync {
            // Built (or caught up) from the feed first; then the root's actor stops feeding it
            // and carries its part in every commit.
            let made = async {
                self.wait_for_index(&name).await?;
                let (tx, reply) = flume::bounded(1);
                self.inner
                    .root
                    .tx
                    .ask(
                        StorageMsg::AddSync {
                            port,
                            index: index::sync_index(&def, shared, &branch),
                            reply: tx,
                        },
                        reply,
                    )
                    .await?
            }
            .await;
            if let Err(e) = made {
                self.stop_index(&name).await;
                return Err(e);
            }
        }
        Ok(())
    }

    /// Blocking [`DatabaseHandle::define_index`].
    pub fn blocking_define_index(&self, def: IndexDefinition) -> Result<()> {
        blocking::wait(
            "DatabaseHandle::blocking_define_index",
            self.define_index(def),
        )
    }

    fn start_index(
        &self,
        engine: &EngineInner,
        def: IndexDefinition,
        branch: StorageHandle,
        port: flume::Sender<IndexMsg>,
        rx: flume::Receiver<IndexMsg>,
        snapshot: ReadTransaction,
    ) -> Result<Arc<IndexShared>> {
        // A value at the reserved key that is not an applied record counts as none: reconcile.
        let applied = index::read_applied(&branch.storage.begin_read()?)?;
        actor_interface::hide_index_record(&branch.storage);
        let shared = Arc::new(IndexShared::new(&def.name, applied.unwrap_or(0)));
        let name = def.name.clone();
        let storage = branch.storage.clone();
        let indexed = branch.indexed.clone();
        let kept = def.clone();
        let actor = IndexActor {
            def,
            shared: shared.clone(),
            rx,
            snapshot: Some(snapshot),
            applied,
            branch,
            root: self.inner.root.storage.clone(),
            pool: engine.background_io.clone(),
            slots: self.inner.slots.clone(),
            feed: self.inner.feed.clone(),
            batch_pages: index_batch_pages(engine.opts.memory_budget_bytes),
        };
        let mut indexes = self.inner.indexes.lock().unwrap_or_else(|e| e.into_inner());
        if indexes.contains_key(&name) {
            // Another caller defined it meanwhile; this definition's feed ends with `actor`.
            return Err(Error::InvalidOptions(format!(
                "index {name:?} was defined concurrently by another caller"
            )));
        }
        engine.spawn_on(
            stable_hash(&name) % engine.n.max(1),
            Box::new(move || Box::pin(index::run(actor))),
        )?;
        engine.share_buffers(&storage, Some(kept.write_buffer_bytes));
        indexed.store(true, Ordering::Release);
        indexes.insert(
            name,
            IndexEntry {
                shared: shared.clone(),
                indexed: indexed.clone(),
                port,
                storage,
                def: kept,
            },
        );
        Ok(shared)
    }

    /// Synchronous indexes defined (`but` left out).
    fn synchronous_indexes(&self, but: Option<&str>) -> usize {
        self.inner
            .indexes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(n, e)| e.def.mode == IndexMode::Synchronous && Some(n.as_str()) != but)
            .count()
    }

    /// Unregisters index `name`; a build in progress stops (a later definition reconciles).
    fn take_index(&self, name: &str) -> Option<IndexEntry> {
        let e = self
            .inner
            .indexes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name)?;
        e.shared.abandon.store(true, Ordering::Release);
        e.indexed.store(false, Ordering::Release);
        if let Some(engine) = self.inner.engine.upgrade() {
            engine.share_buffers(&e.storage, None);
        }
        Some(e)
    }

    /// Stops index `name`'s actor and unregisters it: a current index applies what is queued
    /// and records its applied txn first; a build in progress is abandoned.
    async fn stop_index(&self, name: &str) {
        if let Some(e) = self.take_index(name) {
            if e.def.mode == IndexMode::Synchronous {
                // No later root commit carries its part once this is answered.
                let (tx, rx) = flume::bounded(1);
                let msg = StorageMsg::DropSync {
                    name: name.to_string(),
                    reply: tx,
                };
                let _ = self.inner.root.tx.ask(msg, rx).await;
            }
            let (tx, rx) = flume::bounded(1);
            // An actor that has ended answers no `Stop` sent after it did (see `index::run`).
            if e.port
                .send_async(IndexMsg::Stop { reply: tx })
                .await
                .is_ok()
                && !e.shared.exited()
            {
                let _ = rx.recv_async().await;
            }
        }
    }

    fn index_list(&self) -> Vec<Arc<IndexShared>> {
        self.inner
            .indexes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|e| e.shared.clone())
            .collect()
    }

    /// Waiters for every index (or only the one named `only`) to reach the root's acknowledged
    /// txn (none for those there).
    fn index_waiters(&self, only: Option<&str>) -> Result<Vec<flume::Receiver<Result<()>>>> {
        let target = self.inner.feed.acked_txn.load(Ordering::Acquire);
        let mut waits = Vec::new();
        let mut found = false;
        for s in self.index_list() {
            if only.is_some_and(|n| n != s.name) {
                continue;
            }
            found = true;
            if let Some(w) = s.waiter(target)? {
                waits.push(w);
            }
        }
        if let (Some(n), false) = (only, found) {
            return Err(Error::InvalidOptions(format!(
                "no index named {n:?} is defined"
            )));
        }
        Ok(waits)
    }

    /// Returns once every defined index has applied every root commit acknowledged before the
    /// call (and finished its build): a document put or deleted through the root's handle
    /// before the call is in every index's storage after it.
    ///
    /// Errors: [`Error::IndexPoisoned`] when an index is poisoned (at once, or when it fails
    /// while waited for); [`Error::Closed`] when an index stops first (shutdown, dropped).
    ///
    /// Cancel safety: dropping the future changes nothing.
    pub async fn wait_for_indexes(&self) -> Result<()> {
        // Ready at once when every index is current (or none is defined): charged as a get.
        super::coop::consume(1).await;
        for w in self.index_waiters(None)? {
            w.recv_async().await.map_err(|_| Error::Closed)??;
        }
        Ok(())
    }

    /// Blocking [`DatabaseHandle::wait_for_indexes`].
    pub fn blocking_wait_for_indexes(&self) -> Result<()> {
        blocking::wait(
            "DatabaseHandle::blocking_wait_for_indexes",
            self.wait_for_indexes(),
        )
    }

    /// [`DatabaseHandle::wait_for_indexes`] for the index `name` alone: waits for a healthy
    /// index while another one is poisoned. Errors: as `wait_for_indexes` for that index, and
    /// [`Error::InvalidOptions`] when no index of that name is defined. Cancel safety: dropping
    /// the future changes nothing.
    pub async fn wait_for_index(&self, name: &str) -> Result<()> {
        // Ready at once when every index is current (or none is defined): charged as a get.
        super::coop::consume(1).await;
        for w in self.index_waiters(Some(name))? {
            w.recv_async().await.map_err(|_| Error::Closed)??;
        }
        Ok(())
    }

    /// Blocking [`DatabaseHandle::wait_for_index`].
    pub fn blocking_wait_for_index(&self, name: &str) -> Result<()> {
        blocking::wait(
            "DatabaseHandle::blocking_wait_for_index",
            self.wait_for_index(name),
        )
    }

    /// Progress and counters of every defined index, by name. No I/O beyond reading each index
    /// storage's applied record from a snapshot, and its count of entries: for a buffered index
    /// (the default) the first call counts the buffered entries against the tree (one lookup
    /// each, tens of milliseconds for hundreds of thousands), after which the index's commits
    /// keep the count as they go (one lookup per entry, `crate::Storage` `len`).
    pub fn index_stats(&self) -> Vec<IndexStats> {
        let root_txn = self.inner.feed.acked_txn.load(Ordering::Acquire);
        let entries: Vec<(Arc<IndexShared>, Storage)> = self
            .inner
            .indexes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|e| (e.shared.clone(), e.storage.clone()))
            .collect();
        entries
            .into_iter()
            .map(|(s, st)| {
                let n = st.begin_read().map(|r| index::entries(&r)).unwrap_or(0);
                s.stats(root_txn, n)
            })
            .collect()
    }

    /// Cross-checks every defined index against the documents ([`check_index`]): entries
    /// missing for a document, entries naming no document, entries a changed document no
    /// longer gives; counts and up to `max_examples` entry keys of each kind, one report per
    /// index, by name.
    ///
    /// Each index is checked on a pair of snapshots of one moment: it waits for the index
    /// ([`DatabaseHandle::wait_for_index`]), reads the txn the index actor has applied, takes
    /// the index's snapshot and then the documents'; when the documents' txn is the applied one,
    /// the pair is in step ([`IndexCheckReport::in_step`]). Under concurrent root writes it
    /// tries up to 5 times; a report not in step holds differences that may be unapplied
    /// changes. The check itself runs on the background I/O pool, walking both storages in key
    /// order with point lookups (bounded memory: see [`check_index`]).
    ///
    /// Errors: the first index that fails: [`Error::IndexPoisoned`] (poisoned index, or its map
    /// function panics during the check), [`Error::Closed`], read errors of either storage
    /// ([`Error::Corruption`]).
    ///
    /// Cancel safety: dropping the future changes nothing (a check running on the pool goes
    /// on to its end, its report dropped).
    pub async fn check_indexes(&self, max_examples: usize) -> Result<Vec<IndexCheckReport>> {
        let engine = self.inner.engine.upgrade().ok_or(Error::Closed)?;
        let list: Vec<(Arc<IndexShared>, Storage, IndexDefinition)> = self
            .inner
            .indexes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|e| (e.shared.clone(), e.storage.clone(), e.def.clone()))
            .collect();
        let mut out = Vec::with_capacity(list.len());
        for (shared, storage, def) in list {
            let mut tries = 0;
            let (index, docs, in_step) = loop {
                tries += 1;
                self.wait_for_index(&def.name).await?;
                let applied = shared.applied_if_current();
                let index = storage.begin_read()?;
                let docs = self.inner.root.storage.begin_read()?;
                let in_step = applied == Some(docs.txn_id());
                if in_step || tries >= 5 {
                    break (index, docs, in_step);
                }
            };
            let mut r = engine
                .background_io
                .run(move || check_index(&docs, &index, &def, max_examples))
                .await?;
            r.in_step = in_step;
            out.push(r);
        }
        Ok(out)
    }

    /// Blocking [`DatabaseHandle::check_indexes`].
    pub fn blocking_check_indexes(&self, max_examples: usize) -> Result<Vec<IndexCheckReport>> {
        blocking::wait(
            "DatabaseHandle::blocking_check_indexes",
            self.check_indexes(max_examples),
        )
    }

    /// An online backup of the whole database into `dest` while writers go on: every
    /// storage's snapshot at one point of the shared journal's order, copied on the background
    /// I/O pool (executors never wait for it). See [`Database::backup`] for what the copy is
    /// and what "consistent" means; the copy opens standalone and passes `check`.
    ///
    /// Errors: those of [`Database::backup`] ([`Error::DestinationNotEmpty`],
    /// [`Error::DestinationInsideSource`], [`Error::Closed`], [`Error::Corruption`], I/O errors
    /// with the operation and path, `ENOSPC` among them: the partial copy is removed).
    ///
    /// Cancel safety: the copy is handed to the pool at the first poll; dropped after that, it
    /// still runs to its end, and only the report is lost: the destination is then a whole
    /// backup, or (when the copy failed) one that every open refuses, as for any backup.
    pub async fn backup(&self, dest: impl AsRef<std::path::Path>) -> Result<BackupReport> {
        let engine = self.inner.engine.upgrade().ok_or(Error::Closed)?;
        // No actor takes part: the copy takes no writer, and each storage's buffered entries
        // go into its copy's journal (`Database::backup`).
        let db = self.inner.db.clone();
        let dest = dest.as_ref().to_path_buf();
        engine
            .background_io
            .run(move || actor_interface::backup_without_writers(&db, &dest))
            .await
    }

    /// Blocking [`DatabaseHandle::backup`].
    pub fn blocking_backup(&self, dest: impl AsRef<std::path::Path>) -> Result<BackupReport> {
        blocking::wait("DatabaseHandle::blocking_backup", self.backup(dest))
    }

    /// Names of the defined indexes.
    pub fn indexes(&self) -> Vec<String> {
        self.inner
            .indexes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect()
    }
}

/// `s`, marked as an index storage when it holds an index's applied record (an index defined
/// in an earlier open, or by another process): its snapshots then leave the record out of
/// every view, as those of an index defined now (design.md 10.1). Reads a page: run off the
/// executors.
fn index_marked(s: Storage) -> Result<Storage> {
    if index::read_applied(&s.begin_read()?)?.is_some() {
        actor_interface::hide_index_record(&s);
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The buffered indexes' shares never add up to more than two thirds of the budget, and a
    /// share under 64 KiB is none at all.
    #[test]
    fn buffer_shares_stay_within_two_thirds_of_the_budget() {
        for budget in [1u64 << 20, 4 << 20, 8 << 20, 512 << 20, 16 << 30] {
            for n in [1usize, 2, 16, 50, 100, 2048, 10_000] {
                let share = buffer_share(budget, n);
                assert!(share * n as u64 <= budget / 3 * 2, "{budget} {n}: {share}");
                assert!(
                    share == 0 || share >= MIN_BUFFER_SHARE,
                    "{budget} {n}: {share}"
                );
            }
        }
        assert_eq!(buffer_share(512 << 20, 100), (512 << 20) / 3 * 2 / 100);
        assert_eq!(buffer_share(1 << 20, 50), 0, "13 KiB each: none");
        assert_eq!(buffer_share(4 << 20, 42), 66_576, "just over 64 KiB each");
        assert_eq!(buffer_share(4 << 20, 43), 0, "just under 64 KiB each");
    }
}
