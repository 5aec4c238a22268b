//! The journal writer, the one writer of a journal while the engine runs. In shared mode one
//! per database, on a thread of its own (`omnibus-journal-writer`); in separate mode one actor
//! per storage, on that storage's executor, handing each batch to the journal I/O pool
//! (`io_pool.rs`, threads `omnibus-journal-io-N`). Either way the batch's write and sync go
//! through the storage environment, on io_uring through the writing thread's own ring of the
//! critical lane (`env/uring.rs`).
//!
//! Messages in ([`JournalMsg`], bounded flume mailbox of [`MAILBOX`] messages):
//! `Commit { record, reply }` from storage actors; `Stop { reply }` from the engine.
//! Messages out: the journal number (or the error) on each commit's one-shot reply.
//!
//! State owned: nothing but the mailbox; the [`Journal`] (files, positions, links) is written
//! only by this writer (its thread, or the batch job the actor hands to the journal I/O pool,
//! one batch at a time), so it is the only code that writes and syncs the journal while the
//! engine runs.
//!
//! Loop: wait for a commit, then take every commit already queued (up to [`MAX_BATCH`] records
//! or 64 MiB), write them as one batch (one `pwritev`, one `fdatasync`), and answer each.
//! Commits arriving meanwhile queue up for the next batch (group commit).
//! Invariant: no reply before the batch's `fdatasync` returned (design.md invariant I1), except
//! for a batch whose every commit is [`Durability::Eventual`]: it is queued in the journal
//! ([`Journal::write_records`]: no I/O) and answered at once; the journal writes it, in order,
//! before the next batch's records, or its sync thread does within `eventual_sync_ms`.
//!
//! Why a thread in shared mode: the shared journal's batches are the critical path of every
//! storage of the database. As an actor, the writer had to be scheduled on an executor between
//! two batches, behind storage actors building transactions (a task runs until it yields, and
//! building a large index batch takes milliseconds); its thread waits on the mailbox alone, so
//! the next batch starts as soon as the previous sync returned.
//!
//! Failure: a failed batch answers each of its commits with the error and poisons the journal;
//! later commits get [`crate::Error::Poisoned`]. A panic while writing a batch is caught,
//! answered as an error and poisons the journal. A full mailbox makes storage actors wait.

use std::sync::Arc;

use super::io_pool::IoPool;
use crate::actor_interface::{self, Durability, Error, Journal, OutRecord, Result};

/// Mailbox capacity (messages).
pub const MAILBOX: usize = 4096;
/// Records per batch at most.
pub const MAX_BATCH: usize = 4096;
const MAX_BATCH_BYTES: u64 = 64 << 20;

/// The journal-writer actor's API.
pub(crate) enum JournalMsg {
    /// Make `record` durable; answer with the journal number it went to (`Eventual`: queue it
    /// and answer 0 once queued).
    Commit {
        record: OutRecord,
        durability: Durability,
        reply: flume::Sender<Result<u64>>,
    },
    /// Answer and exit (sent after every storage actor using this journal stopped).
    Stop { reply: flume::Sender<()> },
}

/// Sends `record` to the journal writer behind `port` and waits until it is durable (with
/// [`Durability::Eventual`]: until it is queued in the journal).
pub(crate) async fn write(
    port: &flume::Sender<JournalMsg>,
    record: OutRecord,
    durability: Durability,
) -> Result<u64> {
    let (tx, rx) = flume::bounded(1);
    port.send_async(JournalMsg::Commit {
        record,
        durability,
        reply: tx,
    })
    .await
    .map_err(|_| Error::Closed)?;
    rx.recv_async().await.map_err(|_| Error::Closed)?
}

/// One batch taken from the mailbox.
struct Batch {
    records: Vec<OutRecord>,
    replies: Vec<flume::Sender<Result<u64>>>,
    stop: Option<flume::Sender<()>>,
    /// `Eventual` when every record of the batch is.
    durability: Durability,
}

/// Takes `first` and every message already queued behind it, up to [`MAX_BATCH`] records or
/// [`MAX_BATCH_BYTES`], stopping at a `Stop`.
fn take_batch(first: JournalMsg, rx: &flume::Receiver<JournalMsg>) -> Batch {
    let mut b = Batch {
        records: Vec::new(),
        replies: Vec::new(),
        stop: None,
        durability: Durability::Eventual,
    };
    let mut bytes = 0u64;
    let mut next = Some(first);
    // Bounded by MAX_BATCH and MAX_BATCH_BYTES.
    while let Some(m) = next.take() {
        match m {
            JournalMsg::Commit {
                record,
                durability,
                reply,
            } => {
                bytes += actor_interface::record_len(&record);
                if durability == Durability::Immediate {
                    b.durability = Durability::Immediate;
                }
                b.records.push(record);
                b.replies.push(reply);
            }
            JournalMsg::Stop { reply } => {
                b.stop = Some(reply);
                break;
            }
        }
        if b.records.len() < MAX_BATCH && bytes < MAX_BATCH_BYTES {
            next = rx.try_recv().ok();
        }
    }
    b
}

/// Writes `records` as one batch (queues them, when `durability` is `Eventual`), a panic
/// answered as an error (the journal is poisoned).
fn write_batch(journal: &Journal, records: Vec<OutRecord>, durability: Durability) -> Result<u64> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        actor_interface::write_records(journal, records, durability)
    }))
    .unwrap_or_else(|_| {
        let cause = "the journal writer panicked while writing a batch".to_string();
        actor_interface::poison_journal(journal, cause.clone());
        Err(Error::Poisoned { cause })
    })
}

/// The actor's loop (separate mode): each batch runs on the journal I/O pool.
pub(crate) async fn run(journal: Arc<Journal>, rx: flume::Receiver<JournalMsg>, pool: IoPool) {
    while let Ok(first) = rx.recv_async().await {
        let b = take_batch(first, &rx);
        if !b.records.is_empty() {
            let j = journal.clone();
            let (records, durability) = (b.records, b.durability);
            let r = pool.run(move || write_batch(&j, records, durability)).await;
            for reply in b.replies {
                let _ = reply.send(r.clone());
            }
        }
        if let Some(reply) = b.stop {
            release(journal, &pool).await;
            let _ = reply.send(());
            return;
        }
    }
    release(journal, &pool).await;
}

/// Drops the actor's reference to `journal` on `pool`: once its storage is dropped it is the
/// last one, and `Journal`'s drop waits for a background zero write and `fdatasync` in flight.
async fn release(journal: Arc<Journal>, pool: &IoPool) {
    let _ = pool
        .run(move || {
            drop(journal);
            Ok(())
        })
        .await;
}

/// Starts the writer's own thread (shared mode): it blocks on the mailbox, writes and syncs
/// each batch itself, and exits after answering a `Stop` or when every sender is gone.
pub(crate) fn start_thread(
    journal: Arc<Journal>,
    rx: flume::Receiver<JournalMsg>,
) -> Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("omnibus-journal-writer".into())
        .spawn(move || {
            while let Ok(first) = rx.recv() {
                let b = take_batch(first, &rx);
                if !b.records.is_empty() {
                    let r = write_batch(&journal, b.records, b.durability);
                    for reply in b.replies {
                        let _ = reply.send(r.clone());
                    }
                }
                if let Some(reply) = b.stop {
                    let _ = reply.send(());
                    return;
                }
            }
        })
        .map_err(|e| Error::Io {
            op: "spawn thread",
            path: "omnibus-journal-writer".into(),
            source: e,
        })
}
