//! The flusher actor: one per executor, for the storages whose actors live there.
//!
//! Messages in ([`FlusherMsg`], bounded flume mailbox of 1,024): `Add(storage)` when a storage
//! actor is placed on this executor, `Remove(id)` when it is dropped, `Stop { reply }` from the
//! engine. Messages out: flush jobs to the background I/O lane, whose threads run at low I/O
//! priority (`ioprio_set(IOPRIO_CLASS_BE, 7)`).
//!
//! State owned: the list of storages of this executor. Every tick it asks each storage whether
//! a flush is due ([`crate::Storage::flush_due`]: scratch size, age, or records in a journal
//! file that is no longer current, which bounds journal retention) and runs the due flushes one
//! at a time on the lane. A flush also punches holes and releases journal files.
//!
//! Failure: a failed flush poisons its storage (the core does it) and is logged; the flusher
//! carries on with the others.

use std::time::Duration;

use super::io_lane::IoLane;
use crate::Storage;

/// The flusher's API.
pub(crate) enum FlusherMsg {
    Add(Storage),
    Remove(u64),
    Stop { reply: flume::Sender<()> },
}

/// The flusher's loop.
pub(crate) async fn run(rx: flume::Receiver<FlusherMsg>, lane: IoLane, tick: Duration) {
    let mut storages: Vec<Storage> = Vec::new();
    loop {
        // Bounded: the mailbox holds at most 1,024 messages.
        while let Ok(m) = rx.try_recv() {
            match m {
                FlusherMsg::Add(s) => storages.push(s),
                FlusherMsg::Remove(id) => storages.retain(|s| s.storage_id() != id),
                FlusherMsg::Stop { reply } => {
                    let _ = reply.send(());
                    return;
                }
            }
        }
        for s in &storages {
            if s.flush_due() && !s.is_poisoned() {
                let st = s.clone();
                if let Err(e) = lane.run(move || st.flush()).await {
                    tracing::warn!(storage = %s.path().display(), error = %e, "flush failed");
                }
            }
        }
        glommio::timer::sleep(tick).await;
    }
}
