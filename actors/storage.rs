//! The storage actor and [`StorageHandle`], the way applications talk to a storage.
//!
//! One actor per storage, living on one executor (placed by a stable hash of the storage
//! name: crc32 modulo the executor count). Messages in ([`StorageMsg`], bounded flume mailbox
//! of [`crate::actors::EngineOptions::mailbox_capacity`] messages): `Write { batch, reply }`
//! from handles, `Stop { reply }` from the engine. Messages out: a `Commit` to the journal
//! writer per transaction; each request's result on its one-shot reply.
//!
//! State owned: the storage's write side (its single write transaction); no other thread
//! writes this storage while the engine runs (shared-nothing).
//!
//! Loop: wait for a request, take every request already queued (up to
//! [`crate::actors::EngineOptions::max_requests_per_txn`]), apply them all in one write
//! transaction, prepare the commit, send its record to the journal writer, and once it is
//! durable publish the new state and answer every request. Invariant: no request is answered,
//! and no state published, before its transaction is durable.
//!
//! Failure: a panic while building a transaction or an I/O failure poisons the database; every
//! request of that transaction and every later one gets an error ([`Error::Poisoned`]).
//! A full mailbox makes callers wait (back-pressure, DESIGN invariant 10).

use std::ops::{Bound, RangeBounds};

use super::journal_writer::{self, JournalMsg};
use super::reader_pool::ReadMsg;
use crate::error::{Error, Result};
use crate::txn::ReadTransaction;
use crate::Storage;

/// One operation of a [`WriteBatch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOp {
    /// Insert or replace.
    Put(Vec<u8>, Vec<u8>),
    /// Remove (absent keys are fine).
    Delete(Vec<u8>),
}

/// Operations applied atomically, in order, by [`StorageHandle::write`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteBatch {
    ops: Vec<WriteOp>,
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
                WriteOp::Put(k, v) => crate::txn::check_put(k, v)?,
                WriteOp::Delete(k) => crate::txn::check_put(k, &[])?,
            }
        }
        Ok(())
    }
}

/// The storage actor's API.
pub(crate) enum StorageMsg {
    /// Apply `batch` atomically; answer with one bool per operation (`Delete`: whether the key
    /// was present; `Put`: true) once durable.
    Write {
        batch: WriteBatch,
        reply: flume::Sender<Result<Vec<bool>>>,
    },
    /// Finish the queued requests, answer, exit.
    Stop { reply: flume::Sender<()> },
}

/// The actor's loop.
pub(crate) async fn run(
    storage: Storage,
    rx: flume::Receiver<StorageMsg>,
    journal: flume::Sender<JournalMsg>,
    max_requests: usize,
) {
    loop {
        let Ok(first) = rx.recv_async().await else {
            return;
        };
        let mut batches = Vec::new();
        let mut replies = Vec::new();
        let mut stop = None;
        let mut next = Some(first);
        // Bounded by max_requests.
        while let Some(m) = next.take() {
            match m {
                StorageMsg::Write { batch, reply } => {
                    batches.push(batch);
                    replies.push(reply);
                }
                StorageMsg::Stop { reply } => {
                    stop = Some(reply);
                    break;
                }
            }
            if batches.len() < max_requests {
                next = rx.try_recv().ok();
            }
        }
        if !batches.is_empty() {
            let results = apply(&storage, &batches, &journal).await;
            match results {
                Ok(per) => {
                    for (reply, r) in replies.into_iter().zip(per) {
                        let _ = reply.send(Ok(r));
                    }
                }
                Err(e) => {
                    for reply in replies {
                        let _ = reply.send(Err(e.clone()));
                    }
                }
            }
        }
        if let Some(reply) = stop {
            let _ = reply.send(());
            return;
        }
    }
}

/// Applies every batch in one write transaction and commits it through the journal writer.
async fn apply(
    storage: &Storage,
    batches: &[WriteBatch],
    journal: &flume::Sender<JournalMsg>,
) -> Result<Vec<Vec<bool>>> {
    let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Result<_> {
        let mut w = storage.try_begin_write()?;
        let mut per = Vec::with_capacity(batches.len());
        for b in batches {
            let mut r = Vec::with_capacity(b.len());
            for op in b.ops() {
                match op {
                    WriteOp::Put(k, v) => {
                        w.put(k, v)?;
                        r.push(true);
                    }
                    WriteOp::Delete(k) => r.push(w.delete(k)?),
                }
            }
            per.push(r);
        }
        Ok((w.prepare()?, per))
    }));
    let (prepared, per) = match built {
        Ok(r) => r?,
        Err(_) => {
            storage.poison("a storage actor panicked while building a transaction");
            return Err(Error::Poisoned {
                cause: "a storage actor panicked".into(),
            });
        }
    };
    let Some(mut p) = prepared else {
        return Ok(per);
    };
    let record = p.take_record();
    let written = journal_writer::write(journal, record).await;
    p.finish(written)?;
    Ok(per)
}

/// A handle to a storage served by actors. `Clone + Send + Sync`; cheap to clone.
///
/// Writes go to the storage's actor and return once durable; reads go to the reader pool, or
/// run on the caller's thread through [`StorageHandle::snapshot`]. The async methods work from
/// tokio, glommio or any executor; the `blocking_` twins from plain threads (not from inside an
/// async task: they block it).
#[derive(Clone)]
pub struct StorageHandle {
    pub(crate) name: String,
    pub(crate) storage: Storage,
    pub(crate) tx: flume::Sender<StorageMsg>,
    pub(crate) readers: flume::Sender<ReadMsg>,
}

impl std::fmt::Debug for StorageHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StorageHandle({:?})", self.name)
    }
}

fn owned(b: Bound<&[u8]>) -> Bound<Vec<u8>> {
    b.map(|k| k.to_vec())
}

impl StorageHandle {
    /// The storage's name (empty for a root).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The core storage (for stats, check, flush).
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    async fn send_write(&self, batch: WriteBatch) -> Result<Vec<bool>> {
        batch.validate()?;
        let (tx, rx) = flume::bounded(1);
        self.tx
            .send_async(StorageMsg::Write { batch, reply: tx })
            .await
            .map_err(|_| Error::Closed)?;
        rx.recv_async().await.map_err(|_| Error::Closed)?
    }

    fn blocking_send_write(&self, batch: WriteBatch) -> Result<Vec<bool>> {
        batch.validate()?;
        let (tx, rx) = flume::bounded(1);
        self.tx
            .send(StorageMsg::Write { batch, reply: tx })
            .map_err(|_| Error::Closed)?;
        rx.recv().map_err(|_| Error::Closed)?
    }

    /// Inserts or replaces `key`; returns once durable. Errors: the limits of
    /// [`crate::WriteTransaction::put`] (before anything is sent), [`Error::Poisoned`],
    /// [`Error::Closed`] after shutdown, I/O errors of the commit.
    pub async fn put(&self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Result<()> {
        let mut b = WriteBatch::new();
        b.put(key, value);
        self.send_write(b).await.map(|_| ())
    }

    /// Removes `key`; returns whether it was present, once durable.
    pub async fn delete(&self, key: impl Into<Vec<u8>>) -> Result<bool> {
        let mut b = WriteBatch::new();
        b.delete(key);
        Ok(self.send_write(b).await?.first().copied().unwrap_or(false))
    }

    /// Applies `batch` atomically; returns once durable.
    pub async fn write(&self, batch: WriteBatch) -> Result<()> {
        self.send_write(batch).await.map(|_| ())
    }

    /// The value of `key`, read by the reader pool from a snapshot.
    pub async fn get(&self, key: impl Into<Vec<u8>>) -> Result<Option<Vec<u8>>> {
        let (tx, rx) = flume::bounded(1);
        let m = ReadMsg::Get {
            storage: self.storage.clone(),
            key: key.into(),
            reply: tx,
        };
        self.readers
            .send_async(m)
            .await
            .map_err(|_| Error::Closed)?;
        rx.recv_async().await.map_err(|_| Error::Closed)?
    }

    /// Up to `limit` entries with keys in `bounds`, in key order, read by the reader pool.
    pub async fn range(
        &self,
        bounds: impl RangeBounds<[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let (tx, rx) = flume::bounded(1);
        let m = ReadMsg::Range {
            storage: self.storage.clone(),
            start: owned(bounds.start_bound()),
            end: owned(bounds.end_bound()),
            limit,
            reply: tx,
        };
        self.readers
            .send_async(m)
            .await
            .map_err(|_| Error::Closed)?;
        rx.recv_async().await.map_err(|_| Error::Closed)?
    }

    /// The values of `keys`, from one snapshot, read by the reader pool.
    pub async fn multi_get(&self, keys: Vec<Vec<u8>>) -> Result<Vec<Option<Vec<u8>>>> {
        let (tx, rx) = flume::bounded(1);
        let m = ReadMsg::MultiGet {
            storage: self.storage.clone(),
            keys,
            reply: tx,
        };
        self.readers
            .send_async(m)
            .await
            .map_err(|_| Error::Closed)?;
        rx.recv_async().await.map_err(|_| Error::Closed)?
    }

    /// Blocking [`StorageHandle::put`].
    pub fn blocking_put(&self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Result<()> {
        let mut b = WriteBatch::new();
        b.put(key, value);
        self.blocking_send_write(b).map(|_| ())
    }

    /// Blocking [`StorageHandle::delete`].
    pub fn blocking_delete(&self, key: impl Into<Vec<u8>>) -> Result<bool> {
        let mut b = WriteBatch::new();
        b.delete(key);
        Ok(self
            .blocking_send_write(b)?
            .first()
            .copied()
            .unwrap_or(false))
    }

    /// Blocking [`StorageHandle::write`].
    pub fn blocking_write(&self, batch: WriteBatch) -> Result<()> {
        self.blocking_send_write(batch).map(|_| ())
    }

    /// Blocking [`StorageHandle::get`].
    pub fn blocking_get(&self, key: impl Into<Vec<u8>>) -> Result<Option<Vec<u8>>> {
        let (tx, rx) = flume::bounded(1);
        self.readers
            .send(ReadMsg::Get {
                storage: self.storage.clone(),
                key: key.into(),
                reply: tx,
            })
            .map_err(|_| Error::Closed)?;
        rx.recv().map_err(|_| Error::Closed)?
    }

    /// Blocking [`StorageHandle::range`].
    pub fn blocking_range(
        &self,
        bounds: impl RangeBounds<[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let (tx, rx) = flume::bounded(1);
        let m = ReadMsg::Range {
            storage: self.storage.clone(),
            start: owned(bounds.start_bound()),
            end: owned(bounds.end_bound()),
            limit,
            reply: tx,
        };
        self.readers.send(m).map_err(|_| Error::Closed)?;
        rx.recv().map_err(|_| Error::Closed)?
    }

    /// Blocking [`StorageHandle::multi_get`].
    pub fn blocking_multi_get(&self, keys: Vec<Vec<u8>>) -> Result<Vec<Option<Vec<u8>>>> {
        let (tx, rx) = flume::bounded(1);
        self.readers
            .send(ReadMsg::MultiGet {
                storage: self.storage.clone(),
                keys,
                reply: tx,
            })
            .map_err(|_| Error::Closed)?;
        rx.recv().map_err(|_| Error::Closed)?
    }

    /// A snapshot read on the caller's own thread, with no hand-off: the fastest read path.
    pub fn snapshot(&self) -> Result<ReadTransaction> {
        self.storage.begin_read()
    }
}
