//! The reader pool: one reader task per executor, all pulling from one shared bounded flume
//! mailbox ([`MAILBOX`] messages) and answering from a fresh snapshot of the storage named in
//! each request.
//!
//! Messages in ([`ReadMsg`]): `Get`, `Range`, `MultiGet` from [`super::StorageHandle`]s, `Stop`
//! from the engine (one per reader). Messages out: each request's result on its one-shot reply.
//! State owned: none (snapshots are taken per request and dropped after it: a reader never pins
//! old pages for longer than one request). Invariant: reads take no lock (a snapshot is one
//! atomic load). Failure: a corrupt page answers that request with [`crate::Error::Corruption`];
//! a panic in a read is caught and answered as an error.

use std::ops::Bound;

use crate::error::{Error, Result};
use crate::Storage;

/// Capacity of the shared reader mailbox (messages).
pub const MAILBOX: usize = 4096;

/// Owned `(key, value)` pairs answered by a range read.
pub(crate) type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// The reader pool's API.
pub(crate) enum ReadMsg {
    Get {
        storage: Storage,
        key: Vec<u8>,
        reply: flume::Sender<Result<Option<Vec<u8>>>>,
    },
    Range {
        storage: Storage,
        start: Bound<Vec<u8>>,
        end: Bound<Vec<u8>>,
        limit: usize,
        reply: flume::Sender<Result<Entries>>,
    },
    MultiGet {
        storage: Storage,
        keys: Vec<Vec<u8>>,
        reply: flume::Sender<Result<Vec<Option<Vec<u8>>>>>,
    },
    Stop,
}

fn guarded<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| {
        Err(Error::Poisoned {
            cause: "a reader panicked".into(),
        })
    })
}

/// A reader's loop.
pub(crate) async fn run(rx: flume::Receiver<ReadMsg>) {
    while let Ok(m) = rx.recv_async().await {
        match m {
            ReadMsg::Get {
                storage,
                key,
                reply,
            } => {
                let r = guarded(|| Ok(storage.begin_read()?.get(&key)?.map(|v| v.to_vec())));
                let _ = reply.send(r);
            }
            ReadMsg::Range {
                storage,
                start,
                end,
                limit,
                reply,
            } => {
                let r = guarded(|| {
                    let snap = storage.begin_read()?;
                    let b = (
                        start.as_ref().map(|v| v.as_slice()),
                        end.as_ref().map(|v| v.as_slice()),
                    );
                    let mut out = Vec::new();
                    for kv in snap.range(b)?.take(limit) {
                        let (k, v) = kv?;
                        out.push((k.to_vec(), v.to_vec()));
                    }
                    Ok(out)
                });
                let _ = reply.send(r);
            }
            ReadMsg::MultiGet {
                storage,
                keys,
                reply,
            } => {
                let r = guarded(|| {
                    let snap = storage.begin_read()?;
                    keys.iter()
                        .map(|k| Ok(snap.get(k)?.map(|v| v.to_vec())))
                        .collect()
                });
                let _ = reply.send(r);
            }
            ReadMsg::Stop => return,
        }
        glommio::yield_if_needed().await;
    }
}
