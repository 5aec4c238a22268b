//! The journal-writer actor: the critical lane. One per database in shared mode (on the
//! executor [`crate::actors::EngineOptions::journal_executor`] names), one per storage in
//! separate mode (on that storage's executor).
//!
//! Messages in ([`JournalMsg`], bounded flume mailbox of [`MAILBOX`] messages):
//! `Commit { record, reply }` from storage actors; `Stop { reply }` from the engine.
//! Messages out: the journal number (or the error) on each commit's one-shot reply.
//!
//! State owned: nothing but the mailbox; the [`Journal`] (files, positions, links) is written
//! only from the batch job this actor hands to the critical I/O lane, one batch at a time, so
//! this actor is the only code that writes and syncs the journal while the engine runs.
//!
//! Loop: wait for a commit, then take every commit already queued (up to [`MAX_BATCH`] records
//! or 64 MiB), write them as one batch (one `pwritev`, one `fdatasync`) on the I/O lane, and
//! answer each. Commits arriving meanwhile queue up for the next batch (group commit).
//! Invariant: no reply before the batch's `fdatasync` returned (DESIGN invariant 1).
//!
//! Failure: a failed batch answers each of its commits with the error and poisons the journal;
//! later commits get [`crate::Error::Poisoned`]. A full mailbox makes storage actors wait.

use std::sync::Arc;

use super::io_lane::IoLane;
use crate::error::Result;
use crate::journal::record::OutRecord;
use crate::journal::Journal;

/// Mailbox capacity (messages).
pub const MAILBOX: usize = 4096;
/// Records per batch at most.
pub const MAX_BATCH: usize = 4096;
const MAX_BATCH_BYTES: u64 = 64 << 20;

/// The journal-writer actor's API.
pub(crate) enum JournalMsg {
    /// Make `record` durable; answer with the journal number it went to.
    Commit {
        record: OutRecord,
        reply: flume::Sender<Result<u64>>,
    },
    /// Answer and exit (sent after every storage actor using this journal stopped).
    Stop { reply: flume::Sender<()> },
}

/// Sends `record` to the journal writer behind `port` and waits until it is durable.
pub(crate) async fn write(port: &flume::Sender<JournalMsg>, record: OutRecord) -> Result<u64> {
    let (tx, rx) = flume::bounded(1);
    port.send_async(JournalMsg::Commit { record, reply: tx })
        .await
        .map_err(|_| crate::Error::Closed)?;
    rx.recv_async().await.map_err(|_| crate::Error::Closed)?
}

/// The actor's loop.
pub(crate) async fn run(journal: Arc<Journal>, rx: flume::Receiver<JournalMsg>, lane: IoLane) {
    loop {
        let Ok(first) = rx.recv_async().await else {
            return;
        };
        let mut records = Vec::new();
        let mut replies = Vec::new();
        let mut stop = None;
        let mut bytes = 0u64;
        let mut next = Some(first);
        // Bounded by MAX_BATCH and MAX_BATCH_BYTES.
        while let Some(m) = next.take() {
            match m {
                JournalMsg::Commit { record, reply } => {
                    bytes += record.total_len();
                    records.push(record);
                    replies.push(reply);
                }
                JournalMsg::Stop { reply } => {
                    stop = Some(reply);
                    break;
                }
            }
            if records.len() < MAX_BATCH && bytes < MAX_BATCH_BYTES {
                next = rx.try_recv().ok();
            }
        }
        if !records.is_empty() {
            let j = journal.clone();
            let r = lane.run(move || j.write_records(records)).await;
            for reply in replies {
                let _ = reply.send(r.clone());
            }
        }
        if let Some(reply) = stop {
            let _ = reply.send(());
            return;
        }
    }
}
