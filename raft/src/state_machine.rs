//! A raft group's key-value state machine on omnibus: openraft's `RaftStateMachine`.
//!
//! The state lives in one branch storage per *generation*, `raft-sm-<group>-<generation>`;
//! the current generation's number is the key `g` of the group's log storage (absent: 0).
//! Keys of a generation's storage:
//!
//! | key | value |
//! |---|---|
//! | `m:applied` | JSON of the last applied `LogId` |
//! | `m:membership` | JSON of the last applied `StoredMembership` |
//! | `k` + user key | the user value |
//!
//! **Apply** writes one write batch per call (every entry's puts and deletes, the applied log
//! id, the membership) with [`Durability::Immediate`]: the state machine is durable when
//! `apply` returns, so a restart never re-applies what openraft was told was applied.
//!
//! **Snapshot build** takes a read snapshot of the generation's storage and streams its user
//! entries into a file (`<id>.snap`, written to `.tmp`, synced, renamed), one record at a
//! time: the state is never held in memory. The file is made current by rewriting
//! `current.json` (the `SnapshotMeta` and the file name; written to a temporary file, synced,
//! renamed, directory synced); the previous file is removed after.
//!
//! **Snapshot install** copies the received data into its own `.snap` file, streams it into a
//! fresh generation's storage in bounded write batches (eventual durability, the last one with
//! the applied id and membership immediate), checks the file's checksum, then stores the new
//! generation number in the log storage (immediate: the switch is one durable write), drops
//! the old generation's storage and makes the file current. A crash before the switch leaves
//! the old generation current (the half-built one is dropped when the group opens again); a
//! crash after it leaves the new one current, whatever `current.json` says.
//!
//! Snapshot file layout (little-endian): a sequence of records `key_len: u32, value_len: u32,
//! key, value`, then a trailer `u32::MAX` (where a key length would be), `count: u64` (records),
//! `crc: u32` (CRC-32 (`crc32fast`, IEEE) of every byte before the trailer).

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use omnibus::actors::{DatabaseHandle, StorageHandle, WriteBatch};
use omnibus::Durability;
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, SnapshotMeta,
    StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use crate::log_store::{any, LogStore, SM_GENERATION};
use crate::{GroupId, NodeId, Response, StorageError, TypeConfig};

const APPLIED: &[u8] = b"m:applied";
const MEMBERSHIP: &[u8] = b"m:membership";
const USER: u8 = b'k';
/// Records per write batch while installing a snapshot.
const INSTALL_BATCH_RECORDS: usize = 1024;
/// Bytes (keys and values) per write batch while installing a snapshot.
const INSTALL_BATCH_BYTES: usize = 4 << 20;
/// The trailer's mark where a key length would be.
const TRAILER: u32 = u32::MAX;

/// The name of `group`'s state-machine storage of `generation`.
pub fn storage_name(group: GroupId, generation: u64) -> String {
    format!("raft-sm-{group}-{generation}")
}

fn user_key(key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.push(USER);
    k.extend_from_slice(key);
    k
}

type Membership = StoredMembership<NodeId, BasicNode>;
type Meta = SnapshotMeta<NodeId, BasicNode>;

/// `current.json`: the current snapshot.
#[derive(Serialize, Deserialize)]
struct Current {
    meta: Meta,
    file: String,
}

struct Shared {
    db: DatabaseHandle,
    group: GroupId,
    log: LogStore,
    /// `<node dir>/snapshots/<group>`.
    dir: PathBuf,
    /// The current generation's storage (replaced by an install).
    data: RwLock<StorageHandle>,
    /// Held while `current.json` is read or replaced.
    current: Mutex<()>,
}

impl Shared {
    fn data(&self) -> StorageHandle {
        self.data.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The state machine of one raft group. Owned by the group's raft instance; read the state
/// through a [`KvReader`] ([`StateMachine::reader`]).
pub struct StateMachine {
    shared: Arc<Shared>,
    generation: u64,
}

/// Reads a group's key-value state from the current generation (local, not linearizable).
#[derive(Clone)]
pub struct KvReader {
    shared: Arc<Shared>,
}

impl KvReader {
    /// The value of `key` in this node's state machine. Errors: the storage's read errors
    /// ([`omnibus::Error`]).
    pub fn get(&self, key: &str) -> omnibus::Result<Option<String>> {
        let snap = self.shared.data().snapshot()?;
        Ok(snap
            .get(user_key(key.as_bytes()))?
            .map(|v| String::from_utf8_lossy(v).into_owned()))
    }

    /// The number of user keys in this node's state machine.
    pub fn len(&self) -> omnibus::Result<u64> {
        let snap = self.shared.data().snapshot()?;
        let mut n = 0;
        for item in snap.prefix([USER])? {
            item?;
            n += 1;
        }
        Ok(n)
    }

    /// True when the state machine holds no user key.
    pub fn is_empty(&self) -> omnibus::Result<bool> {
        Ok(self.len()? == 0)
    }
}

fn read_meta<T: serde::de::DeserializeOwned>(
    snap: &omnibus::ReadTransaction,
    key: &[u8],
) -> Result<Option<T>, StorageError> {
    let err = StorageIOError::read_state_machine;
    match snap.get(key).map_err(|e| err(any(&e)))? {
        None => Ok(None),
        Some(v) => Ok(Some(serde_json::from_slice(v).map_err(|e| err(any(&e)))?)),
    }
}

fn applied_of(
    snap: &omnibus::ReadTransaction,
) -> Result<(Option<LogId<NodeId>>, Membership), StorageError> {
    Ok((
        read_meta(snap, APPLIED)?,
        read_meta(snap, MEMBERSHIP)?.unwrap_or_default(),
    ))
}

fn io_err(op: &str, path: &Path, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{op} {}: {e}", path.display()))
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err("fsync directory", dir, e))
}

/// Makes `file` (in `dir`) the current snapshot with `meta`, unless the current one is newer;
/// removes the file it replaces. Blocking; call under `Shared::current`.
fn publish(dir: &Path, meta: &Meta, file: &str) -> std::io::Result<()> {
    let path = dir.join("current.json");
    let old: Option<Current> = match std::fs::read(&path) {
        Ok(b) => serde_json::from_slice(&b).ok(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io_err("read", &path, e)),
    };
    if let Some(old) = &old {
        if old.meta.last_log_id > meta.last_log_id {
            // A newer snapshot is current already: this one is not needed.
            let _ = std::fs::remove_file(dir.join(file));
            return Ok(());
        }
    }
    let tmp = dir.join("current.json.tmp");
    let bytes = serde_json::to_vec(&Current {
        meta: meta.clone(),
        file: file.to_string(),
    })
    .map_err(std::io::Error::other)?;
    let mut f = std::fs::File::create(&tmp).map_err(|e| io_err("create", &tmp, e))?;
    f.write_all(&bytes).map_err(|e| io_err("write", &tmp, e))?;
    f.sync_all().map_err(|e| io_err("fsync", &tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| io_err("rename", &tmp, e))?;
    sync_dir(dir)?;
    if let Some(old) = old {
        if old.file != file {
            let _ = std::fs::remove_file(dir.join(old.file));
        }
    }
    Ok(())
}

/// A unique snapshot id: the last applied index and the time in nanoseconds.
fn snapshot_id(last: Option<LogId<NodeId>>) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{}-{nanos}", last.map(|l| l.index).unwrap_or(0))
}

/// Streams the user entries of `snap` into `path` (snapshot file layout), synced. Blocking.
fn write_snapshot_file(snap: &omnibus::ReadTransaction, path: &Path) -> Result<u64, StorageError> {
    let err = |e: std::io::Error| -> StorageError {
        StorageIOError::write_snapshot(None, any(&e)).into()
    };
    let f = std::fs::File::create(path).map_err(|e| err(io_err("create", path, e)))?;
    let mut w = BufWriter::with_capacity(1 << 20, f);
    let mut crc = crc32fast::Hasher::new();
    let mut count = 0u64;
    let mut put = |w: &mut BufWriter<std::fs::File>, b: &[u8]| -> std::io::Result<()> {
        crc.update(b);
        w.write_all(b)
    };
    for item in snap
        .prefix([USER])
        .map_err(|e| StorageIOError::read_state_machine(any(&e)))?
    {
        let (k, v) = item.map_err(|e| StorageIOError::read_state_machine(any(&e)))?;
        let k = &k[1..];
        // Keys are at most MAX_KEY_LEN and values MAX_VALUE_LEN, both below u32::MAX.
        let (kl, vl) = (k.len() as u32, v.len() as u32);
        put(&mut w, &kl.to_le_bytes()).map_err(|e| err(io_err("write", path, e)))?;
        put(&mut w, &vl.to_le_bytes()).map_err(|e| err(io_err("write", path, e)))?;
        put(&mut w, k).map_err(|e| err(io_err("write", path, e)))?;
        put(&mut w, v).map_err(|e| err(io_err("write", path, e)))?;
        count += 1;
    }
    let sum = crc.finalize();
    w.write_all(&TRAILER.to_le_bytes())
        .and_then(|_| w.write_all(&count.to_le_bytes()))
        .and_then(|_| w.write_all(&sum.to_le_bytes()))
        .and_then(|_| w.flush())
        .map_err(|e| err(io_err("write", path, e)))?;
    let f = w
        .into_inner()
        .map_err(|e| err(io_err("write", path, e.into_error())))?;
    f.sync_all().map_err(|e| err(io_err("fsync", path, e)))?;
    Ok(count)
}

impl StateMachine {
    /// Opens `group`'s state machine in `db`: the generation named by `log`'s key `g` (created
    /// empty when missing); storages of other generations (an install cut short) are dropped.
    /// Snapshots live in `snapshots/<group>` under `snapshot_root`.
    ///
    /// Errors: the errors of [`DatabaseHandle::create_storage`] and
    /// [`DatabaseHandle::drop_storage`], a generation key that does not decode, and I/O errors
    /// creating the snapshot directory, all as openraft's `StorageError`.
    pub async fn open(
        db: DatabaseHandle,
        group: GroupId,
        log: LogStore,
        snapshot_root: &Path,
    ) -> Result<StateMachine, StorageError> {
        let err = StorageIOError::read_state_machine;
        let generation: u64 = log.read_json(SM_GENERATION, err)?.unwrap_or(0);
        let current = storage_name(group, generation);
        let data = db
            .create_storage(&current)
            .await
            .map_err(|e| err(any(&e)))?;
        let prefix = format!("raft-sm-{group}-");
        for name in db.storages() {
            if name != current && name.starts_with(&prefix) {
                db.drop_storage(&name).await.map_err(|e| err(any(&e)))?;
            }
        }
        let dir = snapshot_root.join(group.to_string());
        std::fs::create_dir_all(&dir).map_err(|e| err(any(&io_err("create", &dir, e))))?;
        // Leftovers of a build or install cut short.
        if let Ok(rd) = std::fs::read_dir(&dir) {
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().ends_with(".tmp") {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        Ok(StateMachine {
            shared: Arc::new(Shared {
                db,
                group,
                log,
                dir,
                data: RwLock::new(data),
                current: Mutex::new(()),
            }),
            generation,
        })
    }

    /// A reader of this state machine's key-value state.
    pub fn reader(&self) -> KvReader {
        KvReader {
            shared: self.shared.clone(),
        }
    }

    /// The current generation (incremented by every snapshot install).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    async fn load_generation(
        &self,
        data: &StorageHandle,
        meta: &Meta,
        path: &Path,
    ) -> Result<(), StorageError> {
        let rerr = |e: std::io::Error| -> StorageError {
            StorageIOError::read_snapshot(Some(meta.signature()), any(&e)).into()
        };
        let werr = StorageIOError::write_state_machine;
        let f = tokio::fs::File::open(path)
            .await
            .map_err(|e| rerr(io_err("open", path, e)))?;
        let mut r = tokio::io::BufReader::with_capacity(1 << 20, f);
        let mut crc = crc32fast::Hasher::new();
        let mut count = 0u64;
        let mut batch = WriteBatch::new();
        let mut bytes = 0usize;
        batch.set_durability(Durability::Eventual);
        loop {
            let kl = r
                .read_u32_le()
                .await
                .map_err(|e| rerr(io_err("read", path, e)))?;
            if kl == TRAILER {
                let n = r
                    .read_u64_le()
                    .await
                    .map_err(|e| rerr(io_err("read", path, e)))?;
                let sum = r
                    .read_u32_le()
                    .await
                    .map_err(|e| rerr(io_err("read", path, e)))?;
                if n != count || sum != crc.finalize() {
                    return Err(rerr(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!(
                            "snapshot {}: trailer says {n} records, read {count}; checksum mismatch or short file",
                            path.display()
                        ),
                    )));
                }
                break;
            }
            let vl = r
                .read_u32_le()
                .await
                .map_err(|e| rerr(io_err("read", path, e)))?;
            if kl as usize > omnibus::MAX_KEY_LEN - 1 || vl as usize > omnibus::MAX_VALUE_LEN {
                return Err(rerr(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "snapshot {}: record {count} has key length {kl}, value length {vl}",
                        path.display()
                    ),
                )));
            }
            let mut k = vec![0u8; kl as usize];
            let mut v = vec![0u8; vl as usize];
            r.read_exact(&mut k)
                .await
                .map_err(|e| rerr(io_err("read", path, e)))?;
            r.read_exact(&mut v)
                .await
                .map_err(|e| rerr(io_err("read", path, e)))?;
            crc.update(&kl.to_le_bytes());
            crc.update(&vl.to_le_bytes());
            crc.update(&k);
            crc.update(&v);
            count += 1;
            bytes += k.len() + v.len();
            batch.put(user_key(&k), v);
            if batch.len() >= INSTALL_BATCH_RECORDS || bytes >= INSTALL_BATCH_BYTES {
                let full = std::mem::take(&mut batch);
                batch.set_durability(Durability::Eventual);
                bytes = 0;
                data.write(full).await.map_err(|e| werr(any(&e)))?;
            }
        }
        let applied = serde_json::to_vec(&meta.last_log_id).map_err(|e| werr(any(&e)))?;
        let membership = serde_json::to_vec(&meta.last_membership).map_err(|e| werr(any(&e)))?;
        batch.put(APPLIED, applied);
        batch.put(MEMBERSHIP, membership);
        // Immediate: durable with every eventual batch before it (the journal is in order).
        batch.set_durability(Durability::Immediate);
        data.write(batch).await.map_err(|e| werr(any(&e)))?;
        Ok(())
    }
}

/// Builds snapshots of one group's state machine from a read snapshot.
pub struct SnapshotBuilder {
    shared: Arc<Shared>,
    data: StorageHandle,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let snap = self
            .data
            .snapshot()
            .map_err(|e| StorageIOError::read_state_machine(any(&e)))?;
        let shared = self.shared.clone();
        let built =
            tokio::task::spawn_blocking(move || -> Result<(Meta, PathBuf), StorageError> {
                let (last_log_id, last_membership) = applied_of(&snap)?;
                let id = snapshot_id(last_log_id);
                let file = format!("{id}.snap");
                let tmp = shared.dir.join(format!("{file}.tmp"));
                write_snapshot_file(&snap, &tmp)?;
                drop(snap);
                let path = shared.dir.join(&file);
                let meta = Meta {
                    last_log_id,
                    last_membership,
                    snapshot_id: id,
                };
                let werr = |e: std::io::Error| -> StorageError {
                    StorageIOError::write_snapshot(Some(meta.signature()), any(&e)).into()
                };
                std::fs::rename(&tmp, &path).map_err(|e| werr(io_err("rename", &tmp, e)))?;
                let _g = shared.current.lock().unwrap_or_else(|e| e.into_inner());
                publish(&shared.dir, &meta, &file).map_err(werr)?;
                Ok((meta, path))
            })
            .await
            .map_err(|e| StorageIOError::write_snapshot(None, any(&e)))??;
        let (meta, path) = built;
        let f = tokio::fs::File::open(&path).await.map_err(|e| {
            StorageIOError::read_snapshot(Some(meta.signature()), any(&io_err("open", &path, e)))
        })?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(f),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId<NodeId>>, Membership), StorageError> {
        let snap = self
            .shared
            .data()
            .snapshot()
            .map_err(|e| StorageIOError::read_state_machine(any(&e)))?;
        applied_of(&snap)
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let err = StorageIOError::write_state_machine;
        let mut batch = WriteBatch::new();
        batch.set_durability(Durability::Immediate);
        let mut out = Vec::new();
        let mut last = None;
        let mut membership = None;
        for entry in entries {
            match entry.payload {
                EntryPayload::Blank => {}
                EntryPayload::Normal(crate::Request::Set { key, value }) => {
                    batch.put(user_key(key.as_bytes()), value);
                }
                EntryPayload::Normal(crate::Request::Delete { key }) => {
                    batch.delete(user_key(key.as_bytes()));
                }
                EntryPayload::Membership(m) => {
                    membership = Some(Membership::new(Some(entry.log_id), m));
                }
            }
            out.push(Response {
                index: entry.log_id.index,
            });
            last = Some(entry.log_id);
        }
        let Some(last) = last else {
            return Ok(out);
        };
        batch.put(
            APPLIED,
            serde_json::to_vec(&Some(last)).map_err(|e| err(any(&e)))?,
        );
        if let Some(m) = membership {
            batch.put(
                MEMBERSHIP,
                serde_json::to_vec(&m).map_err(|e| err(any(&e)))?,
            );
        }
        // A bad key (too long) is refused before anything is written, and fails the group:
        // the entry is committed, so skipping it would make replicas diverge.
        self.shared
            .data()
            .write(batch)
            .await
            .map_err(|e| StorageIOError::apply(last, any(&e)))?;
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        SnapshotBuilder {
            shared: self.shared.clone(),
            data: self.shared.data(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<tokio::fs::File>, StorageError> {
        let path = self
            .shared
            .dir
            .join(format!("recv-{}.tmp", snapshot_id(None)));
        let err = |e: std::io::Error| -> StorageError {
            StorageIOError::write_snapshot(None, any(&e)).into()
        };
        let f = tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .await
            .map_err(|e| err(io_err("create", &path, e)))?;
        // Unlinked at once: the open file is all that is needed, and nothing leaks on a crash.
        tokio::fs::remove_file(&path)
            .await
            .map_err(|e| err(io_err("unlink", &path, e)))?;
        Ok(Box::new(f))
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        snapshot: Box<tokio::fs::File>,
    ) -> Result<(), StorageError> {
        let werr = |e: std::io::Error| -> StorageError {
            StorageIOError::write_snapshot(Some(meta.signature()), any(&e)).into()
        };
        // 1. Our own copy of the data, synced.
        let file = format!("{}.snap", meta.snapshot_id);
        let path = self.shared.dir.join(&file);
        let tmp = self.shared.dir.join(format!("{file}.tmp"));
        let mut src = *snapshot;
        src.seek(std::io::SeekFrom::Start(0))
            .await
            .map_err(|e| werr(io_err("seek", &tmp, e)))?;
        let mut dst = tokio::fs::File::create(&tmp)
            .await
            .map_err(|e| werr(io_err("create", &tmp, e)))?;
        tokio::io::copy(&mut src, &mut dst)
            .await
            .map_err(|e| werr(io_err("copy into", &tmp, e)))?;
        dst.sync_all()
            .await
            .map_err(|e| werr(io_err("fsync", &tmp, e)))?;
        drop(dst);
        tokio::fs::rename(&tmp, &path)
            .await
            .map_err(|e| werr(io_err("rename", &tmp, e)))?;

        // 2. A fresh generation, filled from the file.
        let sh = &self.shared;
        let serr = StorageIOError::write_state_machine;
        let generation = self.generation + 1;
        let name = storage_name(sh.group, generation);
        if sh.db.storages().contains(&name) {
            sh.db.drop_storage(&name).await.map_err(|e| serr(any(&e)))?;
        }
        let data = sh
            .db
            .create_storage(&name)
            .await
            .map_err(|e| serr(any(&e)))?;
        if let Err(e) = self.load_generation(&data, meta, &path).await {
            let _ = sh.db.drop_storage(&name).await;
            let _ = tokio::fs::remove_file(&path).await;
            return Err(e);
        }

        // 3. The switch: one durable write.
        sh.log
            .write_json(SM_GENERATION, &generation, Durability::Immediate, serr)
            .await?;
        let old = {
            let mut cur = sh.data.write().unwrap_or_else(|e| e.into_inner());
            std::mem::replace(&mut *cur, data)
        };
        let old_name = storage_name(sh.group, self.generation);
        self.generation = generation;
        drop(old);
        if let Err(e) = sh.db.drop_storage(&old_name).await {
            // Dropped when the group opens again.
            tracing::warn!(group = sh.group, storage = %old_name, error = %e, "dropping the replaced state machine failed");
        }

        // 4. The file becomes the current snapshot.
        let shared = self.shared.clone();
        let meta2 = meta.clone();
        tokio::task::spawn_blocking(move || {
            let _g = shared.current.lock().unwrap_or_else(|e| e.into_inner());
            publish(&shared.dir, &meta2, &file)
        })
        .await
        .map_err(|e| werr(std::io::Error::other(e)))?
        .map_err(werr)?;
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let rerr = |e: std::io::Error| -> StorageError {
            StorageIOError::read_snapshot(None, any(&e)).into()
        };
        let path = self.shared.dir.join("current.json");
        // The file is opened under the lock: a publish cannot remove it in between.
        let (cur, f) = {
            let _g = self
                .shared
                .current
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let cur: Current = match std::fs::read(&path) {
                Ok(b) => serde_json::from_slice(&b).map_err(|e| rerr(std::io::Error::other(e)))?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(rerr(io_err("read", &path, e))),
            };
            let data = self.shared.dir.join(&cur.file);
            let f = std::fs::File::open(&data).map_err(|e| rerr(io_err("open", &data, e)))?;
            (cur, f)
        };
        Ok(Some(Snapshot {
            meta: cur.meta,
            snapshot: Box::new(tokio::fs::File::from_std(f)),
        }))
    }
}
