//! The reader pool: one reader task per executor, all pulling from one shared bounded flume
//! mailbox ([`MAILBOX`] messages) and answering from a fresh snapshot of the storage named in
//! each request (a range read names the snapshot it reads: a stream's chunks all come from one);
//! and [`snapshot_multi_get`], the lookups of every actor-side multi-get.
//!
//! Which reads come here: every range read of a [`super::StorageHandle`]; its point reads
//! (`get`, `multi_get`) only with [`super::ReadPath::Pool`]. By default
//! ([`super::ReadPath::Caller`]) a handle's point read never sends a message: it loads the
//! storage's last published state (one atomic load of an `ArcSwap`, no lock) and reads it on
//! the caller's thread, as LMDB readers do. A hop through the pool costs two cross-thread
//! hand-offs (a send that wakes a reader's executor, a one-shot reply that wakes the caller),
//! about 12 µs a get against 0.3 µs on the caller (docs/BENCHMARKS.md, "Reader path").
//!
//! Messages in ([`ReadMsg`]): `Get`, `Range`, `MultiGet` from [`super::StorageHandle`]s, `Stop`
//! from the engine (one per reader). Messages out: each request's result on its one-shot reply.
//! State owned: none (snapshots are taken per request, or come with a range request, and are
//! dropped after it: a reader never pins old pages for longer than one request). Invariant: reads take no lock (a snapshot is one
//! atomic load), and a read sees every commit acknowledged before it was sent (the storage
//! actor publishes a commit before answering its writers). Queue bound: [`MAILBOX`] requests,
//! then senders wait; the last reader to end closes it (`mailbox.rs`: reads queued after the
//! pool's stops answer [`crate::Error::Closed`]). Failure: a corrupt page answers that request with
//! [`crate::Error::Corruption`]; a panic in a read is caught and answered as an error.

use std::ops::Bound;

use super::mailbox::{self, Closed};
use crate::actor_interface::{self, Error, ReadTransaction, Result, Storage};

/// Capacity of the shared reader mailbox (messages).
pub const MAILBOX: usize = 4096;

/// Owned `(key, value)` pairs answered by a range read.
pub(crate) type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// The reader pool's API.
pub(crate) enum ReadMsg {
    /// A point read; `cold`: a read whose pages may not be in memory (one that a caller's
    /// thread met a page not known resident for, with [`super::ReadPath::Caller`], or any
    /// with [`super::ReadPath::Pool`]), so the reader probes the map's residency bits after
    /// answering (`actor_interface::probe_residency`): a map read only through the pool
    /// then also turns its read-around off while the page cache evicts its pages (without, on
    /// a disk whose read-ahead is 8 MiB, each cold fault of a pool read under a memory limit
    /// read 8 MiB around its page).
    Get {
        storage: Storage,
        key: Vec<u8>,
        cold: bool,
        reply: flume::Sender<Result<Option<Vec<u8>>>>,
    },
    /// Up to `limit` entries of `start..end` in `snap` (backward when `reverse`), ending with
    /// the one that reaches `max_bytes` of keys and values.
    Range {
        snap: ReadTransaction,
        start: Bound<Vec<u8>>,
        end: Bound<Vec<u8>>,
        limit: usize,
        max_bytes: usize,
        reverse: bool,
        reply: flume::Sender<Result<Entries>>,
    },
    /// Point reads of many keys from one snapshot; `cold` as for `Get`.
    MultiGet {
        storage: Storage,
        keys: Vec<Vec<u8>>,
        cold: bool,
        reply: flume::Sender<Result<Vec<Option<Vec<u8>>>>>,
    },
    Stop,
}

/// The values of `keys` in `snap`, in the caller's order (duplicates allowed; `None` for an
/// absent key), each value copied out: [`ReadTransaction::multi_get`] (design.md 15: the
/// B+tree walked level by level for all keys, the pages of a level missing from the page cache
/// read together through the calling thread's ring).
///
/// The one place every actor-side multi-get goes through (the handles' `multi_get` on either
/// [`super::ReadPath`], and the pool's `MultiGet`). It blocks its thread while missing pages
/// are read, as a `get`'s page fault does.
///
/// Errors: [`Error::Corruption`] naming a damaged page; [`Error::Io`] when reading a page
/// failed; the other keys' values are dropped.
pub(crate) fn snapshot_multi_get<K: AsRef<[u8]>>(
    snap: &ReadTransaction,
    keys: &[K],
) -> Result<Vec<Option<Vec<u8>>>> {
    Ok(snap
        .multi_get(keys)?
        .into_iter()
        .map(|v| v.map(<[u8]>::to_vec))
        .collect())
}

/// The entries of `start..end` in `snap` (from the end backward when `reverse`): at most
/// `limit`, and none past the one that brings the keys' and values' bytes to `max_bytes`.
/// The reader pool's one range read.
pub(crate) fn read_chunk(
    snap: &ReadTransaction,
    start: &Bound<Vec<u8>>,
    end: &Bound<Vec<u8>>,
    limit: usize,
    max_bytes: usize,
    reverse: bool,
) -> Result<Entries> {
    let b = (
        start.as_ref().map(|v| v.as_slice()),
        end.as_ref().map(|v| v.as_slice()),
    );
    let range = snap.range(b)?;
    if reverse {
        take_chunk(range.rev(), limit, max_bytes)
    } else {
        take_chunk(range, limit, max_bytes)
    }
}

/// The first entries of `it`, copied out, as [`read_chunk`] bounds them.
fn take_chunk<'a>(
    it: impl Iterator<Item = Result<(&'a [u8], &'a [u8])>>,
    limit: usize,
    max_bytes: usize,
) -> Result<Entries> {
    let mut out = Vec::new();
    let mut bytes = 0;
    for kv in it {
        if out.len() >= limit || bytes >= max_bytes {
            break;
        }
        let (k, v) = kv?;
        bytes += k.len() + v.len();
        out.push((k.to_vec(), v.to_vec()));
    }
    Ok(out)
}

/// Runs the read `f`, answering a panic in it as [`Error::Poisoned`] ("a reader panicked")
/// instead of unwinding into the reader task or the caller.
pub(crate) fn guarded<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| {
        Err(Error::Poisoned {
            cause: "a reader panicked".into(),
        })
    })
}

/// After answering a read that a caller's thread sent here because a page on its path was not
/// known to be in memory: looks for pages of the storage's map that left the page cache while
/// their residency bits were set (`Mapping::probe_residency`: one `mincore` of 16 pages at
/// most, nothing while the map already counts as evicting; it also asks for refresh passes
/// over the map). The caller's thread is not held
/// up: its answer is sent first. Without it, after a cold start the page cache filled and
/// evicted pages whose bits were still set, and callers' threads faulted them back in (tokio
/// workers blocked 1 to 55 ms per fault, `cargo bench --bench cold_reads`) until a refresh
/// pass, seconds later on a large map, found the eviction.
fn probe(storage: &Storage) {
    let _ = guarded(|| Ok(actor_interface::probe_residency(storage)));
}

/// A reader's place in the pool, held by its loop: the last reader to end (stopped, or its
/// task dropped with its executor) closes the shared mailbox (`mailbox.rs`), so reads queued
/// after the pool's stops answer `Closed` instead of waiting for ever.
pub(crate) struct Reader {
    pub rx: flume::Receiver<ReadMsg>,
    /// Readers not ended yet, shared by the pool.
    pub live: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    pub closed: Closed,
}

impl Drop for Reader {
    fn drop(&mut self) {
        if self.live.fetch_sub(1, std::sync::atomic::Ordering::SeqCst) == 1 {
            mailbox::close(&self.closed, &self.rx);
        }
    }
}

/// A reader's loop.
pub(crate) async fn run(reader: Reader) {
    let rx = &reader.rx;
    while let Ok(m) = rx.recv_async().await {
        match m {
            ReadMsg::Get {
                storage,
                key,
                cold,
                reply,
            } => {
                let r = guarded(|| Ok(storage.begin_read()?.get(&key)?.map(|v| v.to_vec())));
                let _ = reply.send(r);
                if cold {
                    probe(&storage);
                }
            }
            ReadMsg::Range {
                snap,
                start,
                end,
                limit,
                max_bytes,
                reverse,
                reply,
            } => {
                let r = guarded(|| read_chunk(&snap, &start, &end, limit, max_bytes, reverse));
                drop(snap);
                let _ = reply.send(r);
            }
            ReadMsg::MultiGet {
                storage,
                keys,
                cold,
                reply,
            } => {
                let r = guarded(|| snapshot_multi_get(&storage.begin_read()?, &keys));
                let _ = reply.send(r);
                if cold {
                    probe(&storage);
                }
            }
            ReadMsg::Stop => return,
        }
        glommio::yield_if_needed().await;
    }
}
