//! The messages and payloads the actors exchange, in one place: what a handle sends a storage
//! actor ([`StorageMsg`], carrying a [`WriteBatch`] of [`WriteOp`]s or an [`ApplyJob`]), what
//! the root's storage actor feeds the index actors ([`IndexMsg`] with an `Arc` of a
//! [`RootCommit`] and its [`DocumentChange`]s; [`RootFeed`] is its shared counter), and where
//! point reads run ([`ReadPath`]). Every actor file depends on this one and this one on none of
//! them, so the actors import no circle (engine -> index -> storage -> engine once did).

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use std::ops::Bound;

use crate::actor_interface::{
    self, Durability, Error, IndexFailure, KeyRange, OutRecord, ReadTransaction, Result,
    WriteTransaction,
};

/// Where the actors' handles run point reads ([`crate::actors::StorageHandle::get`],
/// [`crate::actors::StorageHandle::multi_get`] and their `blocking_` twins). Range reads always go to the
/// reader pool.
///
/// Either way a read sees the storage's last published commit: every write acknowledged to
/// any caller before the read began (the storage actor publishes a commit before it answers
/// its writers), and nothing that is not yet durable (or, for an eventual batch, queued in the
/// journal).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ReadPath {
    /// On the caller's thread when it cannot fault, else the reader pool. The read takes a
    /// snapshot of the storage's last published commit (one atomic load of its `ArcSwap`d
    /// state, no lock, no message) and walks it on the caller's thread as long as every page
    /// on the key's path is known to be in memory (the scratch table, or a page of the map read
    /// since the last residency refresh or found in the page cache by it: one `mincore` over
    /// 256 MiB of the map per flusher tick, 50 ms, for storages read this way): about 0.3 µs
    /// a get, as
    /// LMDB readers. At the first page not known resident it stops, touching nothing, and sends
    /// the read to the reader pool (about 12 µs more, docs/BENCHMARKS.md), so a cold page is
    /// read on an executor's reader, never by a tokio worker or a glommio task of the
    /// application. A page evicted between two refreshes can still fault on the caller once.
    /// [`crate::actors::cold_reads`] counts the reads sent on. The `blocking_` twins read on
    /// the calling thread in any case (a plain thread may block). The default.
    #[default]
    Caller,
    /// On the caller's thread always, page faults included (a page not in the page cache
    /// blocks the caller, an async task's executor thread with it, as with
    /// [`crate::actors::StorageHandle::snapshot`]): for data known to fit in memory, saving
    /// the residency check.
    CallerAlways,
    /// Sent to the reader pool (one reader task per executor, one shared bounded mailbox), one
    /// one-shot reply channel per request: the caller's thread never touches a page, at the
    /// cost of two cross-thread hand-offs per read.
    Pool,
}

/// An owned copy of a range bound.
pub(crate) fn owned(b: Bound<&[u8]>) -> Bound<Vec<u8>> {
    b.map(|k| k.to_vec())
}

/// One operation of a [`WriteBatch`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WriteOp {
    /// Insert or replace.
    Put(Vec<u8>, Vec<u8>),
    /// Remove (absent keys are fine).
    Delete(Vec<u8>),
    /// Remove every key in the range (lower bound, upper bound), as
    /// [`crate::WriteTransaction::delete_range`].
    DeleteRange(Bound<Vec<u8>>, Bound<Vec<u8>>),
}

/// Operations applied atomically, in order, by [`crate::actors::StorageHandle::write`], with a
/// [`Durability`] ([`WriteBatch::set_durability`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteBatch {
    pub(crate) ops: Vec<WriteOp>,
    pub(crate) durability: Durability,
}

impl WriteBatch {
    /// An empty batch.
    pub fn new() -> WriteBatch {
        WriteBatch::default()
    }

    /// Adds a put.
    pub fn put(&mut self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> &mut WriteBatch {
        self.ops.push(WriteOp::Put(key.into(), value.into()));
        self
    }

    /// Adds a delete.
    pub fn delete(&mut self, key: impl Into<Vec<u8>>) -> &mut WriteBatch {
        self.ops.push(WriteOp::Delete(key.into()));
        self
    }

    /// Adds a range delete: every key in `bounds` (range syntax as for
    /// [`crate::ReadTransaction::range`]: `a..b`, `a..`, `..`, `(Bound, Bound)` pairs) is
    /// removed when the batch applies, after the batch's earlier operations and before its
    /// later ones. Cost: as [`crate::WriteTransaction::delete_range`] (whole subtrees freed
    /// without being copied), except on a database's root with indexes, where each removed
    /// document is read first so that its index entries go too. Its result in
    /// [`crate::actors::StorageHandle::write`]'s terms: whether any key was removed.
    pub fn delete_range<K, R: KeyRange<K>>(&mut self, bounds: R) -> &mut WriteBatch {
        self.ops.push(WriteOp::DeleteRange(
            owned(bounds.start_key()),
            owned(bounds.end_key()),
        ));
        self
    }

    /// Sets when [`crate::actors::StorageHandle::write`] answers: [`Durability::Immediate`] (the default)
    /// once the batch's transaction is durable, [`Durability::Eventual`] once its journal
    /// record is queued (durable with the next journal batch or within
    /// [`crate::Options::eventual_sync_ms`]; a crash may lose it, never part of it). The
    /// storage actor merges queued requests into one transaction: it is eventual only when
    /// every request merged into it is an eventual batch (an immediate request in it makes the
    /// eventual ones durable before anyone is answered).
    pub fn set_durability(&mut self, durability: Durability) -> &mut WriteBatch {
        self.durability = durability;
        self
    }

    /// The batch's durability ([`WriteBatch::set_durability`]).
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// Operations in the batch.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// True when the batch has no operation.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The operations.
    pub fn ops(&self) -> &[WriteOp] {
        &self.ops
    }

    /// Checks every key and value against the limits (the same errors as
    /// [`crate::WriteTransaction::put`]), so a bad batch fails before it reaches the actor.
    pub fn validate(&self) -> Result<()> {
        for op in &self.ops {
            match op {
                WriteOp::Put(k, v) => actor_interface::check_put(k, v)?,
                WriteOp::Delete(k) => actor_interface::check_put(k, &[])?,
                // Any bytes bound a range; an empty or inverted one removes nothing.
                WriteOp::DeleteRange(..) => {}
            }
        }
        Ok(())
    }
}

/// A job run inside a storage actor's write transaction (engine-internal: the index actors
/// write their storages this way, so that a storage's write side stays with its actor).
pub(crate) type ApplyJob = Box<dyn FnOnce(&mut WriteTransaction) -> Result<()> + Send>;

/// What an update closure's run left for the storage actor (`update.rs`): whether to commit
/// its transaction, whether the engine panicked inside it (poison the storage), and how to
/// answer once the commit is durable or failed.
pub(crate) struct UpdateRun {
    pub commit: bool,
    pub poison: bool,
    pub answer: Box<dyn FnOnce(Result<()>) + Send>,
}

/// An update closure, its types erased (`update::job`): run in a write transaction of its own
/// with the root's change list for the index feed, if any; given the error instead when no
/// transaction could begin (it then only answers with it).
pub(crate) type UpdateJob = Box<
    dyn FnOnce(Result<(&mut WriteTransaction, Option<&mut Vec<DocumentChange>>)>) -> UpdateRun
        + Send,
>;

/// The storage actor's API.
pub(crate) enum StorageMsg {
    /// Apply `batch` atomically; answer with one bool per operation (`Delete`: whether the key
    /// was present; `Put`: true) once durable.
    Write {
        batch: WriteBatch,
        reply: flume::Sender<Result<Vec<bool>>>,
    },
    /// Run `job` in the next write transaction (merged with the other queued requests); answer
    /// once durable. An error from `job` fails the whole transaction.
    Apply {
        job: ApplyJob,
        reply: flume::Sender<Result<()>>,
    },
    /// Run `job` in a write transaction of its own (never merged with other requests, so that
    /// its abandonment touches no one else's writes); commit when it says so; it answers.
    Update { job: UpdateJob },
    /// Root storage only: send every later commit's document changes to `port`, and answer
    /// with a snapshot of the last commit before it (every earlier commit is published, and
    /// every later one will be sent: an index built from the snapshot and fed from the port
    /// misses nothing).
    AddFeed {
        port: flume::Sender<IndexMsg>,
        reply: flume::Sender<Result<ReadTransaction>>,
    },
    /// Root storage only: commit `root` and every branch's batch of `parts` as one group (the
    /// root's actor leads every group of its database: `commit.rs`); answer once durable and
    /// published in every storage. Merged with the other queued requests.
    Group {
        root: WriteBatch,
        parts: Vec<GroupBatch>,
        reply: flume::Sender<Result<()>>,
    },
    /// A branch's part of a group its root's actor leads: run `job` in a write transaction of
    /// its own, prepare it, send its record on `ready` (`None`: nothing changed), then wait for
    /// the group's journal write on `decision` and publish (answering `done`); a `decision`
    /// channel closed before it answers means the group was given up: nothing is published.
    GroupPart(GroupPart),
    /// Root storage only: stop feeding `port` and keep the index it fed synchronously from now
    /// on: its actor applies what was fed and exits, the index's applied record is checked
    /// against the root's last commit, and every later root commit carries the index's part.
    AddSync {
        port: flume::Sender<IndexMsg>,
        index: SyncIndex,
        reply: flume::Sender<Result<()>>,
    },
    /// Root storage only: stop keeping the synchronous index `name` (dropped, redefined,
    /// shut down); answer once no later commit carries its part.
    DropSync {
        name: String,
        reply: flume::Sender<()>,
    },
    /// Finish the queued requests, answer, exit.
    Stop { reply: flume::Sender<()> },
}

/// One branch's batch of a group write ([`StorageMsg::Group`]).
pub(crate) struct GroupBatch {
    /// The branch's name (the group's lock order, and the merge of several requests' parts).
    pub name: String,
    /// The branch's storage actor.
    pub tx: flume::Sender<StorageMsg>,
    pub batch: WriteBatch,
}

/// A branch's part of a group ([`StorageMsg::GroupPart`]).
pub(crate) struct GroupPart {
    pub job: ApplyJob,
    pub durability: Durability,
    pub ready: flume::Sender<Result<Option<OutRecord>>>,
    pub decision: flume::Receiver<Result<u64>>,
    pub done: flume::Sender<Result<()>>,
}

/// A synchronous index as the root's actor keeps it: built by the engine from the index's
/// definition, so that the storage actor needs nothing of the index module.
pub(crate) struct SyncIndex {
    pub name: String,
    /// The index storage's actor.
    pub tx: flume::Sender<StorageMsg>,
    /// The index's part of root commit `txn` with `changes`: its entries' puts and deletes and
    /// its applied record; a map function's panic is the index's failure.
    #[allow(clippy::type_complexity)]
    pub part:
        Box<dyn Fn(&[DocumentChange], u64) -> std::result::Result<ApplyJob, IndexFailure> + Send>,
    /// Records that root commit `txn`, with this many document changes, is published in the
    /// index (its progress, its waiters).
    pub applied: Box<dyn Fn(u64, usize) + Send>,
    /// The applied record in the index storage's last commit.
    pub current: Box<dyn Fn() -> Result<Option<u64>> + Send>,
    /// Poisons the index with a failure of its part; the error to answer the writers with.
    pub poison: Box<dyn Fn(IndexFailure) -> Error + Send>,
}

/// One document's change in a root transaction.
#[derive(Debug)]
pub(crate) struct DocumentChange {
    pub key: Vec<u8>,
    /// The value before the transaction (`None`: absent).
    pub old: Option<Vec<u8>>,
    /// The value after it (`None`: deleted).
    pub new: Option<Vec<u8>>,
}

/// A durable root transaction's document changes, shared by every index's feed.
#[derive(Debug)]
pub(crate) struct RootCommit {
    pub txn: u64,
    /// When it was durable and published.
    pub acked: Instant,
    pub changes: Vec<DocumentChange>,
}

/// The root storage actor's side of the feed, shared with the database handle.
#[derive(Debug)]
pub(crate) struct RootFeed {
    /// The last root txn id acknowledged through the engine; stored after its changes were sent
    /// to every index and before its writers are answered.
    pub acked_txn: AtomicU64,
}

/// The index actor's API.
pub(crate) enum IndexMsg {
    /// A durable root commit.
    Commit(Arc<RootCommit>),
    /// Apply everything queued before it, record the applied txn, answer, exit.
    Stop { reply: flume::Sender<()> },
}
