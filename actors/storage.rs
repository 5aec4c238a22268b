//! The storage actor and [`StorageHandle`], the way applications talk to a storage.
//!
//! One actor per storage, living on one executor (placed by a stable hash of the storage
//! name: crc32 modulo the executor count). Messages in ([`StorageMsg`], bounded flume mailbox
//! of [`crate::actors::EngineOptions::mailbox_capacity`] messages): `Write { batch, reply }`
//! from handles, `Apply { job, reply }` from the index actor of an index storage (a job run in
//! the write transaction), `AddFeed { port, reply }` (root storage only) from
//! `DatabaseHandle::define_index`, `Stop { reply }` from the engine. Messages out: a `Commit` to
//! the journal writer per transaction; each request's result on its one-shot reply; for the
//! root storage with indexes, one shared `Arc` of the transaction's document changes to each
//! index actor's feed (see `index.rs`).
//!
//! State owned: the storage's write side (its single write transaction); no other thread
//! writes this storage while the engine runs (shared-nothing). The root's actor also owns the
//! list of index feeds.
//!
//! Loop: wait for a request (with a write buffer, at most until the buffer's oldest entry is
//! `Options::flush_max_age` old: then the actor runs a transaction of its own that applies it,
//! so an idle buffered storage pins no journal file for long), take every request already
//! queued (up to
//! [`crate::actors::EngineOptions::max_requests_per_txn`]), apply them all in one write
//! transaction, grow the data file on the journal I/O pool when the transaction needs more
//! pages than it holds (a blocking `fallocate`: never on the executor; it happens once per
//! 1/8 of the file's size, 1 to 64 MiB), prepare the commit, send its record to the journal
//! writer, and once it is durable publish the new state and answer every request. On the
//! root, when any index is defined, each put and delete first reads the document's old value
//! inside the transaction; once the commit is durable, its changes (txn id, key, old value,
//! new value) go to every index feed, then the root's acknowledged txn id is stored, then the
//! requests are answered.
//! `AddFeed` and `Stop` are handled between transactions; at `Stop` the actor closes its
//! mailbox (`mailbox.rs`): requests queued after the stop are dropped unanswered, and their
//! askers, like later ones, get [`Error::Closed`]. Invariant: no request is answered,
//! and no state published, before its transaction is durable (a transaction made only of
//! [`Durability::Eventual`] batches: before its record is queued in the journal, which writes
//! it in order before any later record); no change is fed before that either, and every root
//! commit acknowledged after an `AddFeed` is fed to that port. An index fed an eventual root
//! commit that a crash then loses is ahead of the root after recovery: its applied txn is not
//! the root's, so the next definition reconciles it (`index.rs`).
//!
//! Pacing: while the process's page images ([`crate::live_image_bytes`]: scratch tables,
//! older ones still held, commits in flight, dirty pages of transactions in progress) and
//! write buffers ([`crate::live_buffer_bytes`]) exceed
//! the engine's memory budget ([`crate::actors::EngineOptions::memory_budget_bytes`]), the
//! actor waits before each transaction, 1 s at most (`flusher::PACE_MAX`; a wait that runs out
//! counts in [`crate::actors::Engine::memory_budget_overruns`]), while the flushers free the
//! largest scratch tables; requests queue meanwhile (bounded mailbox, so callers feel it) and
//! merge into the next transaction. An index batch is paced between its transactions too (see
//! `index.rs`: a batch past 1/16 of the budget in dirty pages commits in several).
//!
//! Failure: a panic while building a transaction or an I/O failure poisons the database; every
//! request of that transaction and every later one gets an error ([`Error::Poisoned`]).
//! A full mailbox makes callers wait (back-pressure, design.md invariant I10); so does a full index
//! feed (the root waits before answering its writers). A feed whose index actor is gone is
//! dropped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::blocking;
use super::commit::{self, poison_on_panic, CommitLinks, Member};
use super::coop;
use super::io_pool::IoPool;
use super::journal_writer::JournalMsg;
use super::mailbox::{self, Closed, Mailbox};
use super::messages::owned;
use super::messages::{
    ApplyJob, DocumentChange, GroupBatch, IndexMsg, ReadPath, RootCommit, RootFeed, StorageMsg,
    SyncIndex, UpdateJob, WriteBatch, WriteOp,
};
use super::range_stream::{RangeIter, RangeStream};
use super::reader_pool::{guarded, snapshot_multi_get, ReadMsg};
use super::update::{self, delete_op, delete_range_op, put_op, UpdateTransaction};

use crate::actor_interface::{
    self, CheckReport, Durability, Error, FlushReport, KeyRange, ReadTransaction, Result, Storage,
    StorageStats, MAX_GROUP_STORAGES,
};

/// A queued request's payload, in the order of the mailbox.
enum Payload {
    Write(WriteBatch),
    Apply(ApplyJob),
    /// A group write led by this (root) actor: its own batch and the branches' batches.
    Group(WriteBatch, Vec<GroupBatch>),
}

/// Where a request's answer goes.
enum Reply {
    Write(flume::Sender<Result<Vec<bool>>>),
    Apply(flume::Sender<Result<()>>),
}

impl Reply {
    fn answer(self, r: Result<Vec<bool>>) {
        match self {
            Reply::Write(tx) => {
                let _ = tx.send(r);
            }
            Reply::Apply(tx) => {
                let _ = tx.send(r.map(|_| ()));
            }
        }
    }
}

/// What a storage actor is connected to, besides its storage and mailbox.
pub(crate) struct Links {
    /// The journal writer its commits go to.
    pub journal: flume::Sender<JournalMsg>,
    /// The journal I/O pool, which grows its data file (normal I/O priority: growth is on the
    /// commit path).
    pub journal_io: IoPool,
    /// Requests merged into one transaction at most.
    pub max_requests: usize,
    /// Set for a database's root storage: its commits are fed to the index actors registered
    /// with [`StorageMsg::AddFeed`].
    pub feed: Option<Arc<RootFeed>>,
    /// The engine's memory budget, paced on before each transaction (see `flusher.rs`).
    pub pressure: super::flusher::Pressure,
    /// The database's group lock, for a database's root with a shared journal: the root's
    /// actor leads the database's groups (`commit.rs`).
    pub group_lock: Option<Arc<std::sync::RwLock<()>>>,
    /// The closed mark of this actor's mailbox, shared with its handles (`mailbox.rs`).
    pub closed: Closed,
}

/// Most bytes of keys and values one transaction of a group-leading actor merges from its
/// queued requests before it commits what it has: keeps the merged group under
/// [`crate::MAX_GROUP_BYTES`] unless one request alone passes it.
const GROUP_MERGE_BYTES: usize = 16 << 20;

/// Bytes of keys and values of `batch`.
fn batch_bytes(batch: &WriteBatch) -> usize {
    batch
        .ops
        .iter()
        .map(|op| match op {
            WriteOp::Put(k, v) => k.len() + v.len(),
            WriteOp::Delete(k) => k.len(),
            WriteOp::DeleteRange(..) => 0,
        })
        .sum()
}

/// The actor's loop.
pub(crate) async fn run(storage: Storage, rx: flume::Receiver<StorageMsg>, links: Links) {
    let Links {
        journal,
        journal_io,
        max_requests,
        feed,
        pressure,
        group_lock,
        closed,
    } = links;
    let links = CommitLinks {
        journal,
        journal_io,
        group_lock,
    };
    // The index actors' feeds (root storage only). Owned by this actor: no lock.
    let mut ports: Vec<flume::Sender<IndexMsg>> = Vec::new();
    // The synchronous indexes (root storage only): every commit carries their parts.
    let mut sync: Vec<SyncIndex> = Vec::new();
    // Set when applying an aged buffer failed: the storage is poisoned, and only requests
    // (answered with the error) wake the actor from then on.
    let mut aged_failed = false;
    // A request taken from the mailbox while gathering others that runs alone (an update, a
    // group part) or must wait for the next transaction: it comes next.
    let mut pending: Option<StorageMsg> = None;
    loop {
        let first = match pending.take() {
            Some(m) => Some(m),
            None => {
                let due = actor_interface::buffer_due_in(&storage).filter(|_| !aged_failed);
                let Some(first) = next_message(&rx, due).await else {
                    return;
                };
                first
            }
        };
        let aged = first.is_none();
        let first = first.unwrap_or_else(aged_apply);
        // Over the memory budget: let the flushes catch up (requests queue and merge meanwhile).
        // Not for a group's part: its leader paced for the whole group, and the part (its
        // write buffer's apply deferred) adds little.
        if !matches!(first, StorageMsg::GroupPart(_)) {
            super::flusher::pace(&pressure).await;
        }
        let mut payloads = Vec::new();
        let mut replies = Vec::new();
        let mut control = None;
        let mut update = None;
        let mut part = None;
        let mut group_bytes = 0usize;
        let mut members: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
        let mut next = Some(first);
        // Bounded by max_requests.
        while let Some(m) = next.take() {
            match m {
                StorageMsg::Write { batch, reply } => {
                    // Counted on a database's root only: the one actor that leads groups.
                    if feed.is_some() {
                        group_bytes += batch_bytes(&batch);
                    }
                    payloads.push(Payload::Write(batch));
                    replies.push(Reply::Write(reply));
                }
                StorageMsg::Apply { job, reply } => {
                    payloads.push(Payload::Apply(job));
                    replies.push(Reply::Apply(reply));
                }
                StorageMsg::Group { root, parts, reply } => {
                    // A group of at most `MAX_GROUP_STORAGES`: the root, the synchronous
                    // indexes and the branches of every merged request.
                    let new = parts.iter().filter(|p| !members.contains(&p.name)).count();
                    if !payloads.is_empty()
                        && 1 + sync.len() + members.len() + new > MAX_GROUP_STORAGES
                    {
                        pending = Some(StorageMsg::Group { root, parts, reply });
                        break;
                    }
                    members.extend(parts.iter().map(|p| p.name.clone()));
                    group_bytes += batch_bytes(&root);
                    group_bytes += parts.iter().map(|p| batch_bytes(&p.batch)).sum::<usize>();
                    payloads.push(Payload::Group(root, parts));
                    replies.push(Reply::Apply(reply));
                }
                // An update, or a part of a group, runs in a transaction of its own.
                StorageMsg::Update { job } if payloads.is_empty() => {
                    update = Some(job);
                    break;
                }
                StorageMsg::GroupPart(p) if payloads.is_empty() => {
                    part = Some(p);
                    break;
                }
                m @ (StorageMsg::Update { .. } | StorageMsg::GroupPart(_)) => {
                    pending = Some(m);
                    break;
                }
                m => {
                    control = Some(m);
                    break;
                }
            }
            // A group-leading root merges requests up to a byte bound (its group record has
            // a size limit), any storage up to `max_requests`.
            let merge_more = payloads.len() < max_requests
                && (sync.is_empty() && !payloads.iter().any(|p| matches!(p, Payload::Group(..)))
                    || group_bytes < GROUP_MERGE_BYTES);
            if merge_more {
                next = rx.try_recv().ok();
            }
        }
        if !payloads.is_empty() {
            let capture = feed.is_some() && (!ports.is_empty() || !sync.is_empty());
            match apply(&storage, payloads, &links, capture, &sync).await {
                Ok((per, committed)) => {
                    published(&feed, &mut ports, &sync, capture, committed).await;
                    for (reply, r) in replies.into_iter().zip(per) {
                        reply.answer(Ok(r));
                    }
                }
                Err(e) => {
                    aged_failed |= aged;
                    drop_poisoned(&mut sync, &e);
                    for reply in replies {
                        reply.answer(Err(e.clone()));
                    }
                }
            }
        }
        if let Some(job) = update {
            let capture = feed.is_some() && (!ports.is_empty() || !sync.is_empty());
            let (committed, answer) = run_update(&storage, job, &links, capture, &sync).await;
            match committed {
                Ok(committed) => {
                    published(&feed, &mut ports, &sync, capture, committed).await;
                    answer(Ok(()));
                }
                Err(e) => {
                    drop_poisoned(&mut sync, &e);
                    answer(Err(e))
                }
            }
        }
        if let Some(p) = part {
            commit::member(&storage, p, &links).await;
            // The part left its write buffer as it was: when it is over its size or aged, the
            // next transaction applies it (paced on the memory budget as any other).
            if pending.is_none() && actor_interface::buffer_over(&storage) {
                pending = Some(aged_apply());
            }
        }
        match control {
            Some(StorageMsg::Stop { reply }) => {
                // What was queued after the stop is never carried out: its askers answer
                // `Closed` now, and later ones at once (`mailbox.rs`), instead of waiting for
                // ever on a mailbox the handles keep alive.
                let dropped = mailbox::close(&closed, &rx);
                if dropped > 0 {
                    tracing::debug!(
                        dropped,
                        "requests queued after the storage actor's stop answered closed"
                    );
                }
                let _ = reply.send(());
                return;
            }
            Some(StorageMsg::AddFeed { port, reply }) => {
                // Between transactions: every earlier commit is published and was fed.
                let snap = storage.begin_read();
                if snap.is_ok() {
                    ports.push(port);
                }
                let _ = reply.send(snap);
            }
            Some(StorageMsg::AddSync { port, index, reply }) => {
                let r = add_sync(&storage, &mut ports, port, &index).await;
                if r.is_ok() {
                    sync.retain(|s| s.name != index.name);
                    sync.push(index);
                }
                let _ = reply.send(r);
            }
            Some(StorageMsg::DropSync { name, reply }) => {
                sync.retain(|s| s.name != name);
                let _ = reply.send(());
            }
            _ => {}
        }
    }
}

/// Stops keeping a synchronous index whose part failed with `e` (its map function panicked:
/// it is poisoned, and later commits go on without it).
fn drop_poisoned(sync: &mut Vec<SyncIndex>, e: &Error) {
    if let Error::IndexPoisoned { index, .. } = e {
        sync.retain(|s| s.name != *index);
    }
}

/// Turns the index fed through `port` synchronous, between two transactions of the root: the
/// port is dropped from the feed, its actor applies what was fed and exits (answering the
/// `Stop`), and the index's applied record must then be the root's last commit.
async fn add_sync(
    storage: &Storage,
    ports: &mut Vec<flume::Sender<IndexMsg>>,
    port: flume::Sender<IndexMsg>,
    index: &SyncIndex,
) -> Result<()> {
    ports.retain(|p| !p.same_channel(&port));
    let (tx, rx) = flume::bounded(1);
    port.send_async(IndexMsg::Stop { reply: tx })
        .await
        .map_err(|_| Error::Closed)?;
    rx.recv_async().await.map_err(|_| Error::Closed)?;
    let root = storage.begin_read()?.txn_id();
    let applied = (index.current)()?;
    if applied != Some(root) {
        return Err(Error::InvalidOptions(format!(
            "index {:?} applied root txn {applied:?} when made synchronous, the root is at {root}: define it again",
            index.name
        )));
    }
    (index.applied)(root, 0);
    Ok(())
}

/// Shortest wait before applying an aged write buffer: bounds how often an actor wakes for it.
const AGED_APPLY_MIN_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// The next request, waiting at most `due` (the time until the write buffer is aged, at least
/// [`AGED_APPLY_MIN_WAIT`]) when there is one: `Some(None)` when that wait ran out first, `None`
/// when every sender is gone. A request that arrives as the wait ends stays in the mailbox
/// (flume's receive is cancel-safe).
async fn next_message(
    rx: &flume::Receiver<StorageMsg>,
    due: Option<std::time::Duration>,
) -> Option<Option<StorageMsg>> {
    let recv = async { rx.recv_async().await.ok().map(Some) };
    match due {
        None => recv.await,
        Some(d) => {
            let aged = async {
                glommio::timer::sleep(d.max(AGED_APPLY_MIN_WAIT)).await;
                Some(None)
            };
            futures_lite::future::or(recv, aged).await
        }
    }
}

/// The request the actor gives itself when its write buffer is aged and no request came (its
/// reply goes nowhere; a failure poisons the storage as any other).
fn aged_apply() -> StorageMsg {
    apply_buffer_request(flume::bounded(1).0)
}

/// A request for a transaction that moves the storage's write buffer into its tree (nothing
/// to commit when the buffer is empty), answered on `reply`.
fn apply_buffer_request(reply: flume::Sender<Result<()>>) -> StorageMsg {
    StorageMsg::Apply {
        job: Box::new(actor_interface::apply_write_buffer),
        reply,
    }
}

/// Sends one root commit's changes, shared, to every index actor; a port whose actor is gone
/// (poisoned, stopped) is dropped. Waits while an index's feed is full (back-pressure).
async fn feed_indexes(
    ports: &mut Vec<flume::Sender<IndexMsg>>,
    txn: u64,
    changes: Vec<DocumentChange>,
) {
    let commit = Arc::new(RootCommit {
        txn,
        acked: Instant::now(),
        changes,
    });
    let mut i = 0;
    while i < ports.len() {
        if ports[i]
            .send_async(IndexMsg::Commit(commit.clone()))
            .await
            .is_err()
        {
            ports.swap_remove(i);
        } else {
            i += 1;
        }
    }
}

/// What follows a durable commit before its requests are answered: on a database's root, each
/// synchronous index records it as applied, its document changes go to every index feed (when
/// `capture`d), then its txn id is stored as acknowledged.
async fn published(
    feed: &Option<Arc<RootFeed>>,
    ports: &mut Vec<flume::Sender<IndexMsg>>,
    sync: &[SyncIndex],
    capture: bool,
    committed: Option<(u64, Vec<DocumentChange>)>,
) {
    if let (Some(f), Some((txn, changes))) = (feed, committed) {
        for s in sync {
            (s.applied)(txn, changes.len());
        }
        if capture && !ports.is_empty() {
            feed_indexes(ports, txn, changes).await;
        }
        f.acked_txn.store(txn, Ordering::Release);
    }
}

/// One transaction's per-request results, and `(txn id, document changes)` when it committed.
type Applied = (Vec<Vec<bool>>, Option<(u64, Vec<DocumentChange>)>);

/// Applies every request in one write transaction and commits it through the journal writer
/// (`commit.rs`), with the branches' batches of group requests and the synchronous indexes'
/// parts as one group. With `capture`, each put and delete of this storage also records the
/// document's old and new value (read inside the transaction), for the indexes.
async fn apply(
    storage: &Storage,
    payloads: Vec<Payload>,
    links: &CommitLinks,
    capture: bool,
    sync: &[SyncIndex],
) -> Result<Applied> {
    // Eventual only when every request is an eventual write batch (index jobs are immediate).
    let eventual = payloads.iter().all(|p| match p {
        Payload::Write(b) | Payload::Group(b, _) => b.durability == Durability::Eventual,
        Payload::Apply(_) => false,
    });
    // The branches' batches of the group requests, merged per branch in request order.
    let mut branches: std::collections::BTreeMap<
        String,
        (flume::Sender<StorageMsg>, Vec<WriteBatch>),
    > = std::collections::BTreeMap::new();
    let (w, per, changes) = poison_on_panic(storage, || {
        let mut w = storage.try_begin_write()?;
        if eventual {
            w.set_durability(Durability::Eventual);
        }
        let mut per = Vec::with_capacity(payloads.len());
        let mut changes = Vec::new();
        for p in payloads {
            match p {
                Payload::Write(b) => {
                    let ch = if capture { Some(&mut changes) } else { None };
                    per.push(write_ops(&mut w, ch, b)?);
                }
                Payload::Apply(job) => {
                    job(&mut w)?;
                    per.push(Vec::new());
                }
                Payload::Group(root, parts) => {
                    let ch = if capture { Some(&mut changes) } else { None };
                    write_ops(&mut w, ch, root)?;
                    for g in parts {
                        branches
                            .entry(g.name)
                            .or_insert_with(|| (g.tx, Vec::new()))
                            .1
                            .push(g.batch);
                    }
                    per.push(Vec::new());
                }
            }
        }
        Ok((w, per, changes))
    })?;
    let members = branches
        .into_values()
        .map(|(tx, batches)| Member {
            tx,
            job: Box::new(move |w| {
                for b in batches {
                    write_ops(w, None, b)?;
                }
                Ok(())
            }),
        })
        .collect();
    let txn = commit::commit_txn(storage, w, members, sync, &changes, links).await?;
    Ok((per, txn.map(|txn| (txn, changes))))
}

/// Applies `batch`'s operations to `w` in order (recording document changes into `changes`):
/// one bool per operation (`Delete`: whether the key was there; `DeleteRange`: whether any
/// key was removed; `Put`: true).
fn write_ops(
    w: &mut crate::actor_interface::WriteTransaction,
    mut changes: Option<&mut Vec<DocumentChange>>,
    batch: WriteBatch,
) -> Result<Vec<bool>> {
    let mut r = Vec::with_capacity(batch.len());
    for op in batch.ops {
        let ch = changes.as_deref_mut();
        r.push(match op {
            WriteOp::Put(k, v) => put_op(w, ch, &k, &v).map(|()| true)?,
            WriteOp::Delete(k) => delete_op(w, ch, &k)?,
            WriteOp::DeleteRange(a, b) => delete_range_op(w, ch, &(a, b))? > 0,
        });
    }
    Ok(r)
}

/// Runs an update closure's `job` in a write transaction of its own and commits it when the
/// closure returned `Ok` (with the synchronous indexes' parts, as `apply`): `(txn id, document
/// changes)` once durable (`None`: nothing changed or abandoned), and the job's answer, to be
/// called once the commit is published (with the commit's error, when it failed). A panic
/// from inside the engine poisons the storage.
async fn run_update(
    storage: &Storage,
    job: UpdateJob,
    links: &CommitLinks,
    capture: bool,
    sync: &[SyncIndex],
) -> (Committed, Box<dyn FnOnce(Result<()>) + Send>) {
    let mut changes = Vec::new();
    let mut w = match storage.try_begin_write() {
        Ok(w) => w,
        Err(e) => return (Ok(None), job(Err(e)).answer),
    };
    let run = job(Ok((&mut w, capture.then_some(&mut changes))));
    if run.poison {
        actor_interface::poison_storage(storage, "the engine panicked inside an update closure");
        let e = Error::Poisoned {
            cause: "the engine panicked inside an update closure".into(),
        };
        return (Err(e), run.answer);
    }
    if !run.commit {
        // Abandoned: the transaction's writes are dropped with it.
        drop(w);
        return (Ok(None), run.answer);
    }
    let committed = commit::commit_txn(storage, w, Vec::new(), sync, &changes, links)
        .await
        .map(|txn| txn.map(|txn| (txn, changes)));
    (committed, run.answer)
}

/// A durable update's `(txn id, document changes)` (`None`: no commit), or the failure.
type Committed = Result<Option<(u64, Vec<DocumentChange>)>>;

/// Point reads of handles with [`ReadPath::Caller`] that met a page not known to be in memory
/// and went to the reader pool ([`cold_reads`]).
static COLD_READS: AtomicU64 = AtomicU64::new(0);

/// How many point reads (`get`, `multi_get`) of handles with [`ReadPath::Caller`] met a page
/// not known to be in memory and were sent to the reader pool instead of reading it on the
/// caller's thread, in this process since it started (all engines together).
pub fn cold_reads() -> u64 {
    COLD_READS.load(Ordering::Relaxed)
}

/// A handle to a storage served by actors. `Clone + Send + Sync`; cheap to clone.
///
/// Writes go to the storage's actor and return once durable. Point reads (`get`,
/// `multi_get`) run on the caller's thread from a snapshot by default, or go to the reader
/// pool ([`ReadPath`], [`crate::actors::EngineOptions::reads`]); range reads go to the reader
/// pool; [`StorageHandle::snapshot`] gives the caller a snapshot of its own. The async methods
/// work from tokio, glommio or any executor; the `blocking_` twins from plain threads (not from
/// inside an async task: they block it).
///
/// A handle does not keep the engine running: once the last [`crate::actors::Engine`] clone is
/// dropped (or shut down), its calls fail with [`Error::Closed`]. The `blocking_` twins refuse
/// with [`Error::BlockingOnExecutor`] on the engine's executor threads (in an update closure).
///
/// From plain threads:
///
/// ```
/// use omnibus::actors::{Engine, EngineOptions};
/// use omnibus::Options;
///
/// # fn main() -> omnibus::Result<()> {
/// let dir = std::env::temp_dir().join(format!("omnibus-doc-threads-{}", std::process::id()));
/// let engine = Engine::start(EngineOptions::default())?;
/// let db = engine.blocking_open_database(&dir, Options::default())?;
/// let counts = db.blocking_create_storage("counts")?;
/// let threads: Vec<_> = (0..4)
///     .map(|t| {
///         let counts = counts.clone();
///         std::thread::spawn(move || counts.blocking_put(format!("t{t}"), vec![t as u8]))
///     })
///     .collect();
/// for t in threads {
///     t.join().expect("a writer thread")?;
/// }
/// let keys: Vec<Vec<u8>> = counts
///     .blocking_range::<&[u8], _>(..)?
///     .map(|e| e.map(|(k, _)| k))
///     .collect::<omnibus::Result<_>>()?;
/// assert_eq!(keys, [b"t0", b"t1", b"t2", b"t3"]);
/// drop((counts, db));
/// engine.shutdown()?;
/// std::fs::remove_dir_all(&dir).ok();
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct StorageHandle {
    pub(crate) name: String,
    pub(crate) storage: Storage,
    /// The storage actor's mailbox (closed at the actor's `Stop`, `mailbox.rs`).
    pub(crate) tx: Mailbox<StorageMsg>,
    /// The reader pool's mailbox (closed once the pool has ended).
    pub(crate) readers: Mailbox<ReadMsg>,
    /// The engine's background I/O pool (flushes and checks asked through the handle).
    pub(crate) background: IoPool,
    /// Where `get` and `multi_get` run (the engine's [`ReadPath`]).
    pub(crate) reads: ReadPath,
    /// Set while the storage is a defined index's (shared by every clone): its writes through
    /// the handle are refused.
    pub(crate) indexed: Arc<std::sync::atomic::AtomicBool>,
}

impl std::fmt::Debug for StorageHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StorageHandle({:?})", self.name)
    }
}

impl StorageHandle {
    /// The storage's name (empty for a root).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The storage's counters ([`crate::Storage::stats`]): entries, pages, journal, write
    /// buffer, last committed and flushed txn. Reads shared state only; never blocks.
    pub fn stats(&self) -> StorageStats {
        self.storage.stats()
    }

    /// Bytes a flush would give back now ([`crate::Storage::unflushed_bytes`]; two atomic
    /// loads).
    pub fn unflushed_bytes(&self) -> u64 {
        self.storage.unflushed_bytes()
    }

    /// Bytes of committed page images held in memory until a flush
    /// ([`crate::Storage::scratch_bytes`]; one atomic load).
    pub fn scratch_bytes(&self) -> u64 {
        self.storage.scratch_bytes()
    }

    /// The storage's write-buffer size in bytes (0: none; under the engine only index storages
    /// are buffered, [`crate::actors::IndexDefinition::write_buffer_bytes`]).
    pub fn write_buffer_bytes(&self) -> u64 {
        self.storage.write_buffer_bytes()
    }

    /// Writes the storage's committed pages to its data file now ([`crate::Storage::flush`],
    /// without applying a write buffer: its actor does), on the engine's background I/O pool.
    ///
    /// Errors: an I/O error writing or syncing the data file (the storage is then poisoned);
    /// [`Error::Poisoned`]; [`Error::Closed`] after shutdown.
    ///
    /// Cancel safety: the flush is handed to the pool at the first poll; dropped after that,
    /// it still runs to its end (or its error), and only the report is lost.
    pub async fn flush(&self) -> Result<FlushReport> {
        let s = self.storage.clone();
        self.background
            .run(move || actor_interface::flush_pages(&s))
            .await
    }

    /// Blocking [`StorageHandle::flush`].
    pub fn blocking_flush(&self) -> Result<FlushReport> {
        blocking::wait("StorageHandle::blocking_flush", self.flush())
    }

    /// Checks the storage's last published commit whole ([`crate::Storage::check`]: every
    /// page's checksum and the tree's order and links, the free-space map), on the engine's
    /// background I/O pool, while writes go on.
    ///
    /// Errors: as [`crate::Storage::check`]; [`Error::Closed`] after shutdown.
    ///
    /// Cancel safety: dropping the future changes nothing (a check running on the pool goes
    /// on to its end, its report dropped).
    pub async fn check(&self) -> Result<CheckReport> {
        let s = self.storage.clone();
        self.background.run(move || s.check()).await
    }

    /// Blocking [`StorageHandle::check`].
    pub fn blocking_check(&self) -> Result<CheckReport> {
        blocking::wait("StorageHandle::blocking_check", self.check())
    }

    /// [`Error::InvalidOptions`] when this storage is a defined index's: its index writes it.
    fn writable(&self) -> Result<()> {
        if self.indexed.load(Ordering::Acquire) {
            return Err(Error::InvalidOptions(format!(
                "storage {:?} is an index: its index writes it",
                self.name
            )));
        }
        Ok(())
    }

    async fn send_write(&self, batch: WriteBatch) -> Result<Vec<bool>> {
        self.writable()?;
        batch.validate()?;
        let (tx, rx) = flume::bounded(1);
        self.tx
            .ask(StorageMsg::Write { batch, reply: tx }, rx)
            .await?
    }

    /// Inserts or replaces `key`; returns once durable. Errors: the limits of
    /// [`crate::WriteTransaction::put`] (before anything is sent), [`Error::InvalidOptions`] for
    /// a defined index's storage (its index writes it; reads are fine), [`Error::Poisoned`],
    /// [`Error::Closed`] after shutdown, I/O errors of the commit.
    ///
    /// Cancel safety: the request is sent at the future's first poll, unless the actor's
    /// mailbox is full (then at a later poll). Dropped before it was sent, nothing happens;
    /// dropped after, the write still commits (or fails) and the outcome is lost: the caller
    /// cannot tell which. A later read sees the write once any later request to this storage
    /// has been answered (the actor serves its mailbox in order). The same holds for every
    /// write method of the handle ([`StorageHandle::delete`], [`StorageHandle::write`],
    /// [`StorageHandle::update`], [`StorageHandle::compare_and_swap`]).
    pub async fn put(&self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Result<()> {
        let mut b = WriteBatch::new();
        b.put(key, value);
        self.send_write(b).await.map(|_| ())
    }

    /// Removes `key`; returns whether it was present, once durable.
    ///
    /// Errors and cancel safety: as [`StorageHandle::put`].
    pub async fn delete(&self, key: impl Into<Vec<u8>>) -> Result<bool> {
        let mut b = WriteBatch::new();
        b.delete(key);
        Ok(self.send_write(b).await?.first().copied().unwrap_or(false))
    }

    /// Applies `batch` atomically; returns once durable (once queued in the journal for an
    /// eventual batch: [`WriteBatch::set_durability`]).
    ///
    /// Errors and cancel safety: as [`StorageHandle::put`].
    pub async fn write(&self, batch: WriteBatch) -> Result<()> {
        self.send_write(batch).await.map(|_| ())
    }

    /// Runs `f` in a write transaction of its own on the storage's actor (on its executor, as
    /// the actor's other transactions) and commits it when `f` returns `Ok`: read-modify-write
    /// with no other writer in between, as a closure given to LMDB's or redb's single writer.
    /// Returns `f`'s value once the commit is durable. When `f` returns `Err`, nothing of it
    /// commits and that error is returned. Reads in `f` see its own writes.
    ///
    /// `E` is the caller's error type: anything an [`Error`] converts into (`omnibus::Error`
    /// itself, `anyhow::Error`, an application enum with a `From<omnibus::Error>`), so `?`
    /// works on the transaction's calls inside `f` and the caller can abort with an error of
    /// its own.
    ///
    /// On a database's root with indexes, every write in `f` reaches the indexes as a write
    /// batch's does. Each update is its own transaction (other queued requests are not merged
    /// into it): a commit and a journal sync per call, so prefer [`StorageHandle::write`] for
    /// plain writes. `f` runs on an executor thread: keep it short, never block in it.
    ///
    /// Errors (converted into `E`): [`Error::UpdatePanicked`] when `f` panicked (nothing
    /// committed; the storage stays writable); [`Error::Poisoned`], [`Error::Closed`], I/O
    /// errors of the commit, as for [`StorageHandle::put`]. Cancel safety: as
    /// [`StorageHandle::put`]: once sent, `f` runs and its transaction commits even when the
    /// future is dropped.
    pub async fn update<T, E, F>(&self, f: F) -> std::result::Result<T, E>
    where
        F: FnOnce(&mut UpdateTransaction<'_>) -> std::result::Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<Error> + Send + 'static,
    {
        self.writable().map_err(E::from)?;
        let (tx, rx) = flume::bounded(1);
        let job = update::job(f, tx);
        self.tx
            .ask(StorageMsg::Update { job }, rx)
            .await
            .map_err(E::from)?
    }

    /// Sets `key` to `new` (`None`: removes it) if its value is `expected` now (`None`: the key
    /// is absent), atomically, through [`StorageHandle::update`]. Returns `Ok(Ok(()))` once the
    /// swap is durable, `Ok(Err(current))` with the value found (nothing written) when it was
    /// not `expected`.
    ///
    /// Errors: as [`StorageHandle::update`], and the limits of
    /// [`crate::WriteTransaction::put`] for `key` and `new`. Cancel safety: as
    /// [`StorageHandle::put`].
    pub async fn compare_and_swap(
        &self,
        key: impl Into<Vec<u8>>,
        expected: Option<&[u8]>,
        new: Option<Vec<u8>>,
    ) -> Result<std::result::Result<(), Option<Vec<u8>>>> {
        let key = key.into();
        actor_interface::check_put(&key, new.as_deref().unwrap_or_default())?;
        let expected = expected.map(|e| e.to_vec());
        self.update(move |t| {
            let current = t.get(&key)?;
            if current != expected {
                return Ok(Err(current));
            }
            match new {
                Some(v) => t.put(&key, v)?,
                None => {
                    t.delete(&key)?;
                }
            }
            Ok(Ok(()))
        })
        .await
    }

    /// The value of `key` in the storage's last published commit (every write acknowledged
    /// before the call is seen). With [`ReadPath::Caller`] (the default) it is read on the
    /// caller's thread from a snapshot when every page on its path is known to be in memory,
    /// with no message and nothing awaited (the future is ready at its first poll, except once
    /// every 128 such reads, or 10 µs of them made less than 1 ms apart, on a thread:
    /// `coop::BUDGET`, `coop::SLICE`, `coop::IDLE`; then it returns `Pending` once, waking
    /// itself, so that a loop of gets never starves the other tasks or the timers of the
    /// caller's runtime), and by the reader pool otherwise (a cold page never faults on the
    /// caller's thread); with [`ReadPath::CallerAlways`] always on the caller's thread; with
    /// [`ReadPath::Pool`] always by the reader pool.
    ///
    /// Errors: [`Error::Corruption`] when a page on the path fails its checksum or is
    /// malformed; [`Error::Closed`] after shutdown (the storage is closed, or the pool gone).
    ///
    /// Cancel safety: dropping the future at any point changes nothing (a read sent to the
    /// pool is still served, its answer dropped). The same holds for
    /// [`StorageHandle::range`] and [`StorageHandle::multi_get`].
    pub async fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>> {
        let key = key.as_ref();
        if self.reads != ReadPath::Pool {
            // Gives the runtime back now and then (`coop.rs`): a loop of ready gets would
            // otherwise starve every other task of this thread.
            coop::consume(1).await;
            if self.reads == ReadPath::CallerAlways {
                return self.get_here(key);
            }
            if let Some(r) = self.get_resident_here(key).transpose() {
                return r;
            }
            COLD_READS.fetch_add(1, Ordering::Relaxed);
        }
        let (tx, rx) = flume::bounded(1);
        let m = ReadMsg::Get {
            storage: self.storage.clone(),
            key: key.to_vec(),
            cold: true,
            reply: tx,
        };
        let r = self.readers.ask(m, rx).await?;
        // The task waited for the pool: its thread ran other work meanwhile.
        coop::reset();
        r
    }

    /// Up to `limit` entries with keys in `bounds`, in key order, read by the reader pool
    /// from a snapshot of the storage's last published commit, in one `Vec` (for a range of
    /// any size, [`StorageHandle::range_stream`]). `bounds` is ordinary range syntax over byte
    /// strings or a `(Bound, Bound)` pair, as for [`crate::ReadTransaction::range`]
    /// ([`KeyRange`]).
    ///
    /// Errors: as [`crate::ReadTransaction::range`]; [`Error::Closed`] when the runtime is gone.
    /// Cancel safety: as [`StorageHandle::get`].
    pub async fn range<K, R: KeyRange<K>>(
        &self,
        bounds: R,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let (tx, rx) = flume::bounded(1);
        let m = ReadMsg::Range {
            snap: self.storage.begin_read()?,
            start: owned(bounds.start_key()),
            end: owned(bounds.end_key()),
            limit,
            max_bytes: usize::MAX,
            reverse: false,
            reply: tx,
        };
        self.readers.ask(m, rx).await?
    }

    /// Every entry with a key in `bounds` (as for [`StorageHandle::range`]), in key order, as a
    /// [`futures_lite::Stream`] (the `futures` crate's `Stream` trait): read by the reader pool
    /// from one snapshot taken now and held by the stream, a chunk of at most 256 entries or
    /// 256 KiB at a time, the next one read ahead while the caller consumes the last: bounded
    /// memory for a range of any size, and the caller's thread never touches a page
    /// ([`RangeStream`]).
    ///
    /// Errors: [`Error::Closed`] when the storage is closed (now); later errors are items of the
    /// stream (see [`RangeStream`]). Cancel safety: dropping the stream releases its snapshot
    /// and drops the chunk in flight (the pool lets go of that chunk's copy of the snapshot
    /// once it has read it); nothing else happens.
    pub fn range_stream<K, R: KeyRange<K>>(&self, bounds: R) -> Result<RangeStream> {
        self.stream(bounds, false)
    }

    /// [`StorageHandle::range_stream`] in descending key order.
    pub fn range_stream_rev<K, R: KeyRange<K>>(&self, bounds: R) -> Result<RangeStream> {
        self.stream(bounds, true)
    }

    fn stream<K, R: KeyRange<K>>(&self, bounds: R, reverse: bool) -> Result<RangeStream> {
        Ok(RangeStream::new(
            self.storage.begin_read()?,
            self.readers.clone(),
            owned(bounds.start_key()),
            owned(bounds.end_key()),
            reverse,
        ))
    }

    /// The values of `keys`, in the caller's order (duplicates allowed), all from one snapshot
    /// of the storage's last published commit: `None` for a key that is absent. Where it runs
    /// is [`ReadPath`], as for [`StorageHandle::get`]; the lookups themselves are the reader
    /// pool's `snapshot_multi_get`, i.e. `ReadTransaction::multi_get` (the tree walked level
    /// by level for all keys, page-cache misses read together through the calling thread's ring).
    ///
    /// Errors: as [`StorageHandle::get`]; nothing is returned for the other keys when one
    /// lookup fails. Cancel safety: as [`StorageHandle::get`].
    pub async fn multi_get<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<Vec<Option<Vec<u8>>>> {
        if self.reads != ReadPath::Pool {
            coop::consume(keys.len()).await;
            if self.reads == ReadPath::CallerAlways {
                return self.multi_get_here(keys);
            }
            // On the caller's thread only when no key's path can fault: the pool's multi_get
            // reads the cold pages of all the keys together.
            if let Some(r) = self.multi_get_resident_here(keys).transpose() {
                return r;
            }
            COLD_READS.fetch_add(1, Ordering::Relaxed);
        }
        let (tx, rx) = flume::bounded(1);
        let m = ReadMsg::MultiGet {
            storage: self.storage.clone(),
            keys: keys.iter().map(|k| k.as_ref().to_vec()).collect(),
            cold: true,
            reply: tx,
        };
        let r = self.readers.ask(m, rx).await?;
        coop::reset();
        r
    }

    /// Blocking [`StorageHandle::put`].
    pub fn blocking_put(&self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Result<()> {
        blocking::wait("StorageHandle::blocking_put", self.put(key, value))
    }

    /// Blocking [`StorageHandle::delete`].
    pub fn blocking_delete(&self, key: impl Into<Vec<u8>>) -> Result<bool> {
        blocking::wait("StorageHandle::blocking_delete", self.delete(key))
    }

    /// Blocking [`StorageHandle::write`].
    pub fn blocking_write(&self, batch: WriteBatch) -> Result<()> {
        blocking::wait("StorageHandle::blocking_write", self.write(batch))
    }

    /// Blocking [`StorageHandle::update`].
    pub fn blocking_update<T, E, F>(&self, f: F) -> std::result::Result<T, E>
    where
        F: FnOnce(&mut UpdateTransaction<'_>) -> std::result::Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<Error> + Send + 'static,
    {
        blocking::wait("StorageHandle::blocking_update", self.update(f))
    }

    /// Blocking [`StorageHandle::compare_and_swap`].
    pub fn blocking_compare_and_swap(
        &self,
        key: impl Into<Vec<u8>>,
        expected: Option<&[u8]>,
        new: Option<Vec<u8>>,
    ) -> Result<std::result::Result<(), Option<Vec<u8>>>> {
        blocking::wait(
            "StorageHandle::blocking_compare_and_swap",
            self.compare_and_swap(key, expected, new),
        )
    }

    /// Blocking [`StorageHandle::get`]: with [`ReadPath::Caller`] or [`ReadPath::CallerAlways`]
    /// the read runs right here, page faults included, with no channel; with
    /// [`ReadPath::Pool`] it waits for the reader pool ([`Error::BlockingOnExecutor`] on an
    /// engine executor thread).
    pub fn blocking_get(&self, key: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>> {
        if self.reads != ReadPath::Pool {
            return self.get_here(key.as_ref());
        }
        blocking::wait("StorageHandle::blocking_get", self.get(key))
    }

    /// Every entry with a key in `bounds`, in key order, as a blocking `Iterator` over
    /// [`StorageHandle::range_stream`] (one snapshot, read ahead in chunks by the reader pool;
    /// `.take(n)` for the first `n`). Errors: as [`StorageHandle::range_stream`].
    pub fn blocking_range<K, R: KeyRange<K>>(&self, bounds: R) -> Result<RangeIter> {
        blocking::wait("StorageHandle::blocking_range", async {
            Ok(RangeIter::new(self.range_stream(bounds)?))
        })
    }

    /// [`StorageHandle::blocking_range`] in descending key order.
    pub fn blocking_range_rev<K, R: KeyRange<K>>(&self, bounds: R) -> Result<RangeIter> {
        blocking::wait("StorageHandle::blocking_range_rev", async {
            Ok(RangeIter::new(self.range_stream_rev(bounds)?))
        })
    }

    /// Blocking [`StorageHandle::multi_get`].
    pub fn blocking_multi_get<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<Vec<Option<Vec<u8>>>> {
        if self.reads != ReadPath::Pool {
            return self.multi_get_here(keys);
        }
        blocking::wait("StorageHandle::blocking_multi_get", self.multi_get(keys))
    }

    /// A get on the caller's thread ([`ReadPath::Caller`]); a reader's panic is answered as an
    /// error, as the pool answers it.
    fn get_here(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        guarded(|| Ok(self.storage.begin_read()?.get(key)?.map(|v| v.to_vec())))
    }

    /// A multi_get on the caller's thread ([`ReadPath::CallerAlways`]), as [`Self::get_here`].
    fn multi_get_here<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<Vec<Option<Vec<u8>>>> {
        guarded(|| snapshot_multi_get(&self.storage.begin_read()?, keys))
    }

    /// A get on the caller's thread when no page on its path can fault ([`ReadPath::Caller`]):
    /// `Ok(None)` when some page is not known to be in memory (nothing was read from it).
    fn get_resident_here(&self, key: &[u8]) -> Result<Option<Option<Vec<u8>>>> {
        guarded(|| {
            let snap = self.storage.begin_read()?;
            actor_interface::get_if_resident(&snap, key)
                .map(|r| r.map(|v| v.map(<[u8]>::to_vec)))
                .transpose()
        })
    }

    /// [`Self::get_resident_here`] for every key of a multi_get, from one snapshot: `Ok(None)`
    /// as soon as one key's path is not known to be in memory.
    fn multi_get_resident_here<K: AsRef<[u8]>>(
        &self,
        keys: &[K],
    ) -> Result<Option<Vec<Option<Vec<u8>>>>> {
        guarded(|| {
            let snap = self.storage.begin_read()?;
            let mut out = Vec::with_capacity(keys.len());
            for k in keys {
                match actor_interface::get_if_resident(&snap, k.as_ref()) {
                    Some(r) => out.push(r?.map(<[u8]>::to_vec)),
                    None => return Ok(None),
                }
            }
            Ok(Some(out))
        })
    }

    /// Requests queued in the storage actor's mailbox now (at most
    /// [`crate::actors::EngineOptions::mailbox_capacity`]), for tests of back-pressure.
    #[cfg(feature = "testing")]
    pub fn mailbox_len(&self) -> usize {
        self.tx.len()
    }

    /// A snapshot read on the caller's own thread, with no hand-off: the fastest read path.
    pub fn snapshot(&self) -> Result<ReadTransaction> {
        self.storage.begin_read()
    }
}
