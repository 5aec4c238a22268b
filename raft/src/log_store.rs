//! A raft group's log on one omnibus branch storage: openraft's `RaftLogStorage`.
//!
//! Keys of the log storage (values are JSON of openraft's serde types):
//!
//! | key | value |
//! |---|---|
//! | `v` | the last saved `Vote` |
//! | `p` | the last purged `LogId` |
//! | `g` | the state machine's storage generation (decimal, see [`crate::state_machine`]) |
//! | `e` + index as 8 bytes big-endian | the `Entry` at that index |
//!
//! Big-endian indexes sort entries by index, so a range of indexes is one key range and the
//! last entry is the range's last key. Every write goes through the storage's actor
//! ([`StorageHandle::write`]): votes and appends with [`Durability::Immediate`], answered only
//! once the journal batch holding them is covered by `fdatasync`; the actors of all groups of
//! a database hand their commits to one journal writer, which is what lets the groups share
//! one `fdatasync` per batch. Reads go through a snapshot on the caller's thread
//! ([`StorageHandle::snapshot`]): every acknowledged write is published before it is
//! answered, so a read after an append sees it (openraft requires that of `append`).

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};

use omnibus::actors::{StorageHandle, WriteBatch};
use omnibus::Durability;
use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{AnyError, Entry, LogId, OptionalSend, RaftLogReader, StorageIOError, Vote};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::{NodeId, StorageError, TypeConfig};

const VOTE: &[u8] = b"v";
const PURGED: &[u8] = b"p";
/// Key of the state machine's storage generation in the log storage.
pub(crate) const SM_GENERATION: &[u8] = b"g";
const ENTRY: u8 = b'e';
/// Deletes per write batch when truncating or purging (bounds one transaction's size).
const DELETES_PER_BATCH: usize = 4096;

/// The key of the entry at `index`: `e` then the index big-endian.
fn entry_key(index: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(9);
    k.push(ENTRY);
    k.extend_from_slice(&index.to_be_bytes());
    k
}

/// The first key after every entry key.
fn entries_end() -> Vec<u8> {
    vec![ENTRY + 1]
}

pub(crate) fn any(e: &(impl std::error::Error + 'static)) -> AnyError {
    AnyError::new(e)
}

/// The log of one raft group, over its branch storage. Cheap to clone (a clone is the log
/// reader openraft's replication tasks use).
#[derive(Clone)]
pub struct LogStore {
    handle: StorageHandle,
}

impl std::fmt::Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LogStore({})", self.handle.name())
    }
}

impl LogStore {
    /// The log over `handle`'s storage (an empty storage is an empty log).
    pub fn new(handle: StorageHandle) -> LogStore {
        LogStore { handle }
    }

    /// The storage handle under this log.
    pub fn handle(&self) -> &StorageHandle {
        &self.handle
    }

    /// Reads and decodes the JSON value of `key`; `err` builds the error of a failed read or
    /// decode.
    pub(crate) fn read_json<T: DeserializeOwned>(
        &self,
        key: &[u8],
        err: fn(AnyError) -> StorageIOError<NodeId>,
    ) -> Result<Option<T>, StorageError> {
        let snap = self.handle.snapshot().map_err(|e| err(any(&e)))?;
        match snap.get(key).map_err(|e| err(any(&e)))? {
            None => Ok(None),
            Some(bytes) => Ok(Some(
                serde_json::from_slice(bytes).map_err(|e| err(any(&e)))?,
            )),
        }
    }

    /// Writes `key` = JSON of `value` with `durability`.
    pub(crate) async fn write_json<T: Serialize>(
        &self,
        key: &[u8],
        value: &T,
        durability: Durability,
        err: fn(AnyError) -> StorageIOError<NodeId>,
    ) -> Result<(), StorageError> {
        let bytes = serde_json::to_vec(value).map_err(|e| err(any(&e)))?;
        let mut b = WriteBatch::new();
        b.put(key, bytes).set_durability(durability);
        self.handle.write(b).await.map_err(|e| err(any(&e)).into())
    }

    /// Deletes every entry key in `[from, to)`, in batches of [`DELETES_PER_BATCH`]; `first`
    /// is put in the first batch (atomically with its deletes).
    async fn delete_entries(
        &self,
        from: Vec<u8>,
        to: Vec<u8>,
        mut first: Option<(Vec<u8>, Vec<u8>)>,
        durability: Durability,
    ) -> Result<(), StorageError> {
        let err = StorageIOError::write_logs;
        let mut start = from;
        loop {
            let keys: Vec<Vec<u8>> = {
                let snap = self.handle.snapshot().map_err(|e| err(any(&e)))?;
                let mut keys = Vec::new();
                for item in snap
                    .range(start.as_slice()..to.as_slice())
                    .map_err(|e| err(any(&e)))?
                {
                    let (k, _) = item.map_err(|e| err(any(&e)))?;
                    keys.push(k.to_vec());
                    if keys.len() == DELETES_PER_BATCH {
                        break;
                    }
                }
                keys
            };
            let done = keys.len() < DELETES_PER_BATCH;
            let mut b = WriteBatch::new();
            b.set_durability(durability);
            if let Some((k, v)) = first.take() {
                b.put(k, v);
            }
            if let Some(last) = keys.last() {
                start = last.clone();
                start.push(0);
            }
            for k in keys {
                b.delete(k);
            }
            if !b.is_empty() {
                self.handle.write(b).await.map_err(|e| err(any(&e)))?;
            }
            if done {
                return Ok(());
            }
        }
    }
}

fn decode_entry(bytes: &[u8]) -> Result<Entry<TypeConfig>, StorageError> {
    serde_json::from_slice(bytes).map_err(|e| StorageIOError::read_logs(any(&e)).into())
}

fn owned_bound(b: Bound<&u64>, unbounded: Vec<u8>, after: bool) -> Bound<Vec<u8>> {
    match b {
        Bound::Included(i) => Bound::Included(entry_key(*i)),
        Bound::Excluded(i) => Bound::Excluded(entry_key(*i)),
        Bound::Unbounded if after => Bound::Excluded(unbounded),
        Bound::Unbounded => Bound::Included(unbounded),
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError> {
        let err = StorageIOError::read_logs;
        let start = owned_bound(range.start_bound(), vec![ENTRY], false);
        let end = owned_bound(range.end_bound(), entries_end(), true);
        let snap = self.handle.snapshot().map_err(|e| err(any(&e)))?;
        let bounds = (
            start.as_ref().map(|k| k.as_slice()),
            end.as_ref().map(|k| k.as_slice()),
        );
        let mut out = Vec::new();
        for item in snap.range(bounds).map_err(|e| err(any(&e)))? {
            let (_, v) = item.map_err(|e| err(any(&e)))?;
            out.push(decode_entry(v)?);
        }
        Ok(out)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let err = StorageIOError::read_logs;
        let last_purged_log_id: Option<LogId<NodeId>> = self.read_json(PURGED, err)?;
        let snap = self.handle.snapshot().map_err(|e| err(any(&e)))?;
        let first = [ENTRY];
        let end = entries_end();
        let last = snap
            .range(first.as_slice()..end.as_slice())
            .map_err(|e| err(any(&e)))?
            .next_back()
            .transpose()
            .map_err(|e| err(any(&e)))?;
        let last_log_id = match last {
            Some((_, v)) => Some(decode_entry(v)?.log_id),
            None => last_purged_log_id,
        };
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> LogStore {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        self.write_json(
            VOTE,
            vote,
            Durability::Immediate,
            StorageIOError::write_vote,
        )
        .await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        self.read_json(VOTE, StorageIOError::read_vote)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let err = StorageIOError::write_logs;
        let mut b = WriteBatch::new();
        b.set_durability(Durability::Immediate);
        for entry in entries {
            let v = serde_json::to_vec(&entry).map_err(|e| err(any(&e)))?;
            b.put(entry_key(entry.log_id.index), v);
        }
        if b.is_empty() {
            callback.log_io_completed(Ok(()));
            return Ok(());
        }
        // Answered once the batch's transaction is durable (journal record covered by an
        // fdatasync) and published: the entries are readable and persisted together.
        match self.handle.write(b).await {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(err(any(&e)).into())
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError> {
        self.delete_entries(
            entry_key(log_id.index),
            entries_end(),
            None,
            Durability::Immediate,
        )
        .await
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError> {
        let err = StorageIOError::write_logs;
        let purged = serde_json::to_vec(&log_id).map_err(|e| err(any(&e)))?;
        let to = match log_id.index.checked_add(1) {
            Some(i) => entry_key(i),
            None => entries_end(),
        };
        // The purged id and the first deletes are one transaction; later batches only
        // delete entries below it, which no reader asks for any more. A purge need not be
        // durable at once: a crash before it leaves entries that the next purge deletes.
        self.delete_entries(
            vec![ENTRY],
            to,
            Some((PURGED.to_vec(), purged)),
            Durability::Eventual,
        )
        .await
    }
}
