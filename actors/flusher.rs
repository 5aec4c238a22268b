//! The flusher actor: one per executor, for the storages whose actors live there.
//!
//! Messages in ([`FlusherMsg`], bounded flume mailbox of 1,024): `Add(storage)` when a storage
//! actor is placed on this executor, `Remove(id)` when it is dropped, `Stop { reply }` from the
//! engine. Messages out: flush jobs to the background I/O pool, whose threads run at low I/O
//! priority (`ioprio_set(IOPRIO_CLASS_BE, 7)`).
//!
//! State owned: the list of storages of this executor, and this executor's share of the
//! engine's budget for scratch tables ([`crate::actors::EngineOptions::memory_budget_bytes`]
//! divided by the executors); the engine's [`Budget`] is shared by every flusher and storage
//! actor. Every tick it asks each storage, in one job on the pool (asking takes the journal's
//! lock, which a batch holds across its `fdatasync`), whether a flush is due
//! ([`crate::Storage::flush_due`]: scratch plus freed pages over the storage's threshold, age,
//! or records in a journal file that is no longer current, which bounds journal retention) and
//! runs the due flushes on the pool, up to four at a time; then, while the storages' scratch
//! tables ([`crate::Storage::scratch_bytes`]: committed pages held in memory until a flush) add
//! up to more than its share, it flushes the largest first. So a database of 100+ storages
//! holds one memory budget instead of 64 MiB of scratch per storage.
//!
//! What is counted: the scratch tables are not all the memory page images take. Images
//! superseded by a later commit stay alive while a flush in progress, a snapshot, or any older
//! state holds them; commits in flight hold theirs; a write transaction holds its dirty pages
//! (an index batch over scattered terms copies most of its tree). A 600 s `bench shop`
//! grew to 3.97 GB of anonymous memory under a 512 MiB budget that way. So the budget is held
//! on [`crate::live_image_bytes`], every page image alive in the process ([`crate::page::Image`],
//! counted from creation to the drop of its last holder), plus the write buffers of the
//! buffered index storages ([`crate::live_buffer_bytes`], which the engine caps together at
//! two thirds of the budget): while they exceed the budget, the
//! flusher frees the excess and 1/8 of the budget more from its scratch tables, largest first, and looks again
//! every [`OVER_BUDGET_TICK`]; and the storage actors wait before each transaction
//! ([`pace`], [`PACE_MAX`] at most: a snapshot held for long must slow writers, never stop
//! them; a wait that runs out is counted in [`Budget::overruns`] and logged), so writers are
//! paced to what the flushes can write. A flush also punches holes and releases journal files.
//!
//! Each tick also queues a residency refresh of its storages' maps on the engine's residency
//! thread (CPU nice 19, `io_pool.rs`), one at a time per flusher.
//!
//! Failure: a failed flush poisons its storage (the core does it) and is logged; the flusher
//! carries on with the others.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::io_pool::IoPool;
use crate::actor_interface::{self, live_buffer_bytes, live_image_bytes, Storage};

/// The flusher's API.
pub(crate) enum FlusherMsg {
    Add(Storage),
    Remove(u64),
    Stop { reply: flume::Sender<()> },
}

/// Indexes of `storages` to flush so that their scratch bytes fit `budget`: the storages in
/// `due` first, then the largest of the rest until the sum of what is left is within budget.
/// Pure, so the policy is tested without files.
pub(crate) fn pick(bytes: &[u64], due: &[bool], budget: u64) -> Vec<usize> {
    let mut out: Vec<usize> = (0..bytes.len()).filter(|&i| due[i]).collect();
    let mut left: u64 = (0..bytes.len())
        .filter(|&i| !due[i])
        .map(|i| bytes[i])
        .sum();
    if left <= budget {
        return out;
    }
    let mut rest: Vec<usize> = (0..bytes.len())
        .filter(|&i| !due[i] && bytes[i] > 0)
        .collect();
    rest.sort_unstable_by_key(|&i| std::cmp::Reverse(bytes[i]));
    // Bounded: each storage is picked at most once.
    for i in rest {
        if left <= budget {
            break;
        }
        left -= bytes[i];
        out.push(i);
    }
    out
}

/// Flushes one flusher runs at the same time (on the background I/O pool): a flush spends most of
/// its time in `fdatasync`s, which this kind of disk serves in parallel.
const FLUSH_CONCURRENCY: usize = 4;

/// The engine's memory budget, shared by its flushers and storage actors (one per engine).
#[derive(Debug)]
pub(crate) struct Budget {
    /// [`crate::actors::EngineOptions::memory_budget_bytes`]: the most bytes of page images
    /// ([`crate::live_image_bytes`]) the engine's writers start transactions over.
    pub bytes: u64,
    /// Transactions that started after waiting [`PACE_MAX`] with the budget still exceeded
    /// (a held snapshot, or transactions in progress, kept the flushes from freeing enough).
    pub overruns: std::sync::atomic::AtomicU64,
}

impl Default for Budget {
    /// No budget (never paces): what an actor gets when its engine is gone.
    fn default() -> Budget {
        Budget::new(u64::MAX)
    }
}

impl Budget {
    /// A budget of `bytes` bytes of page images.
    pub fn new(bytes: u64) -> Budget {
        Budget {
            bytes,
            overruns: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Bytes of page images and write buffers over the budget now (0 when within it).
    pub fn excess(&self) -> u64 {
        (live_image_bytes() + live_buffer_bytes()).saturating_sub(self.bytes)
    }
}

/// The engine's budget as its actors hold it.
pub(crate) type Pressure = std::sync::Arc<Budget>;

/// Longest a storage actor waits before a transaction while the process's page images
/// ([`crate::live_image_bytes`]) exceed the engine's budget. Bounded so that a snapshot held
/// for long (which keeps a flush from freeing the images it reads) slows writers down but
/// never stops them; a wait that ends over budget counts in [`Budget::overruns`] and logs a
/// warning (at most one per [`WARN_EVERY`]).
pub(crate) const PACE_MAX: Duration = Duration::from_millis(1000);

/// Step of that wait.
const PACE_STEP: Duration = Duration::from_millis(2);

/// How often, at most, pacing warns that the budget could not be held.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// When pacing last warned, in ms since [`warn_epoch`] (0: never).
static LAST_WARN_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn warn_epoch() -> std::time::Instant {
    static E: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *E.get_or_init(std::time::Instant::now)
}

/// Waits while the process's page images exceed `budget`, [`PACE_MAX`] at most (bounded:
/// never a stall for good, even when a held snapshot keeps the flushes from giving anything
/// back). Meanwhile the flushers flush the largest scratch tables first, and requests queue
/// and merge into the next transaction.
pub(crate) async fn pace(budget: &Budget) {
    let mut waited = Duration::ZERO;
    // Bounded: PACE_MAX / PACE_STEP turns.
    while budget.excess() > 0 {
        if waited >= PACE_MAX {
            budget
                .overruns
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let now = warn_epoch().elapsed().as_millis() as u64 + 1;
            let last = LAST_WARN_MS.load(std::sync::atomic::Ordering::Relaxed);
            if (last == 0 || now.saturating_sub(last) >= WARN_EVERY.as_millis() as u64)
                && LAST_WARN_MS
                    .compare_exchange(
                        last,
                        now,
                        std::sync::atomic::Ordering::Relaxed,
                        std::sync::atomic::Ordering::Relaxed,
                    )
                    .is_ok()
            {
                tracing::warn!(
                    page_image_bytes = live_image_bytes(),
                    write_buffer_bytes = live_buffer_bytes(),
                    budget = budget.bytes,
                    "memory budget not held: a transaction starts over it after {} ms \
                     (a snapshot held for long, or large transactions in progress)",
                    PACE_MAX.as_millis()
                );
            }
            return;
        }
        glommio::timer::sleep(PACE_STEP).await;
        waited += PACE_STEP;
    }
}

/// The page residency that handles' reads on their callers' threads trust: a `mincore` over
/// the next window of each of `live`'s maps read that way since its pass began, queued on the
/// engine's residency thread (CPU nice 19) unless this flusher's last refresh is still
/// running (`busy`), so refreshes never pile up behind a starved thread.
fn refresh(live: &[Storage], residency: &IoPool, busy: &Arc<AtomicBool>) {
    if live.is_empty() || busy.swap(true, Ordering::AcqRel) {
        return;
    }
    let (live, done) = (live.to_vec(), busy.clone());
    let queued = residency.try_spawn(move || {
        live.iter().for_each(actor_interface::refresh_residency);
        done.store(false, Ordering::Release);
    });
    if !queued {
        busy.store(false, Ordering::Release);
    }
}

/// The scratch bytes of each of `live` and whether a flush is due, asked on `pool`:
/// [`Storage::flush_due`] takes the journal's lock, which a batch holds across its `pwritev`
/// and `fdatasync`, so asking here would hold up this executor for a sync. A closed pool
/// (shutdown) answers nothing due.
async fn poll(live: Vec<Storage>, pool: &IoPool) -> (Vec<Storage>, Vec<u64>, Vec<bool>) {
    pool.run(move || {
        let scratch = live.iter().map(Storage::scratch_bytes).collect();
        let due = live.iter().map(Storage::flush_due).collect();
        Ok((live, scratch, due))
    })
    .await
    .unwrap_or_default()
}

/// The flusher's loop; `share` is this executor's share of the engine's budget for scratch
/// tables, `budget` the engine's whole budget for page images.
pub(crate) async fn run(
    rx: flume::Receiver<FlusherMsg>,
    pool: IoPool,
    residency: IoPool,
    tick: Duration,
    share: u64,
    budget: Pressure,
) {
    let mut storages: Vec<Storage> = Vec::new();
    let refreshing = Arc::new(AtomicBool::new(false));
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
        let live: Vec<Storage> = storages
            .iter()
            .filter(|s| !s.is_poisoned())
            .cloned()
            .collect();
        refresh(&live, &residency, &refreshing);
        let (live, scratch, due) = poll(live, &pool).await;
        // Over the whole budget: free the excess and 1/8 of the budget more from this
        // executor's scratch tables (the images they hold are freed once no snapshot holds
        // them), so that the writers waiting can start several transactions before the count
        // reaches the budget again, instead of one per round of flushes.
        let sum: u64 = scratch.iter().sum();
        let target = match budget.excess() {
            0 => share,
            x => share.min(sum.saturating_sub(x.saturating_add(budget.bytes / HEADROOM))),
        };
        let picked = pick(&scratch, &due, target);
        let flushed = !picked.is_empty();
        // Bounded: FLUSH_CONCURRENCY flushes in flight at a time, each storage once.
        for group in picked.chunks(FLUSH_CONCURRENCY) {
            let tasks: Vec<_> = group
                .iter()
                .map(|&i| {
                    let (st, pool) = (live[i].clone(), pool.clone());
                    glommio::spawn_local(async move {
                        let path = st.path().to_path_buf();
                        let flush = move || actor_interface::flush_pages(&st);
                        if let Err(e) = pool.run(flush).await {
                            tracing::warn!(storage = %path.display(), error = %e, "flush failed");
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await;
            }
        }
        // Still over budget after flushing: look again soon (writers are waiting).
        if flushed && budget.excess() > 0 {
            glommio::timer::sleep(OVER_BUDGET_TICK.min(tick)).await;
        } else {
            glommio::timer::sleep(tick).await;
        }
    }
}

/// Over budget, a flusher frees the excess plus `1 / HEADROOM` of the budget.
const HEADROOM: u64 = 8;

/// The flusher's tick while the engine is over its budget after a round of flushes.
const OVER_BUDGET_TICK: Duration = Duration::from_millis(5);

#[cfg(test)]
mod tests {
    use super::pick;

    #[test]
    fn due_storages_are_flushed_whatever_the_budget() {
        assert_eq!(pick(&[5, 0, 7], &[true, false, true], u64::MAX), vec![0, 2]);
    }

    #[test]
    fn over_budget_the_largest_go_first_until_the_rest_fits() {
        // 10 + 40 + 30 + 20 = 100 over a budget of 35: flush 40 (60 left), then 30 (30 left).
        assert_eq!(pick(&[10, 40, 30, 20], &[false; 4], 35), vec![1, 2]);
        // Within budget: nothing.
        assert!(pick(&[10, 40, 30, 20], &[false; 4], 100).is_empty());
        // A due storage does not count against the budget.
        assert_eq!(
            pick(&[10, 40, 30, 20], &[false, true, false, false], 35),
            vec![1, 2]
        );
        assert_eq!(
            pick(&[10, 40, 30, 20], &[false, true, false, false], 60),
            vec![1]
        );
    }
}
