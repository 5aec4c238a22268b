//! The index actor: one per defined index, keeping a branch storage current from the change
//! feed of the root storage (the documents), as RavenDB's indexes.
//!
//! An index is an [`crate::actors::IndexDefinition`]: a name (its branch storage) and a map function giving
//! the *terms* of a document (`Fn(document key, document value) -> Vec<term>`). Its storage
//! holds one entry per (term, document): key `escape(term) ++ 0x00 ++ document key`
//! (`index_key.rs`: the escaped term holds no 0x00, so no term's entries are another's), empty
//! value, plus
//! one reserved entry, [`INDEX_APPLIED_KEY`] (the single byte `0x00`, which no entry can be:
//! document keys are at least one byte, so every entry key is at least two bytes long), whose
//! value records the root txn id the index has applied up to ([`index_applied_txn`]). That
//! record is written in the same transaction as the entries it covers.
//!
//! Messages in ([`IndexMsg`], one bounded flume mailbox per index of
//! [`crate::actors::EngineOptions::index_queue_capacity`] root commits): `Commit(Arc<RootCommit>)`
//! from the root's storage actor, once per durable root transaction that has any index (one
//! `Arc` shared by every index: one queue hop per root transaction, not per document), holding
//! each changed document's key, old value and new value; `Stop { reply }` from the engine.
//! Messages out: one [`StorageMsg::Apply`] job per batch to the index storage's own storage
//! actor (same executor: both are placed by the same hash of the name), which runs it in its
//! write transaction; jobs for the build's scans and diffs to the background I/O pool.
//!
//! State owned: the index's pending batch, the applied txn, and its shared progress
//! ([`IndexShared`]: state, counters, lag histogram, and the waiters of
//! `DatabaseHandle::wait_for_indexes`). It never writes the index storage itself: the storage
//! actor stays its only writer.
//!
//! Loop: first catch up. The root actor answered the registration with a snapshot of its last
//! commit (txn `R`; every later commit comes through the mailbox). If the index's applied record
//! is not `R` (a new index, a crash between a root commit and the index's, writes to the root
//! that bypassed the engine), *reconcile*: scan the snapshot, map every document, and diff the
//! expected entries against the index's entries, writing the difference in bounded batches, then
//! record `R`. The expected entries are held sorted in one buffer of at most
//! [`crate::actors::IndexDefinition::reconcile_memory`] bytes: when they do not fit, a pass keeps the smallest
//! keys and diffs only that key range, and the next pass starts where it stopped (each pass
//! rescans the snapshot). Meanwhile live commits wait in the mailbox. Then follow the feed: wait
//! for a commit, take every commit already queued (up to [`crate::actors::IndexDefinition::max_batch_changes`]
//! document changes), skip those at or below the applied txn, map each change's old and new
//! value, keep the terms that left (delete) and came (put), sort the keys (keeping the last
//! operation of a key), and apply them and the applied record as one transaction (several when
//! the batch copies more pages than 1/16 of the engine's memory budget, 64 at least: each
//! transaction but the last commits a key range of the sorted batch and deletes the applied
//! record, so a crash between them leaves no record and the next definition reconciles; the last
//! one writes the record). Keys are built
//! in one buffer per batch: no allocation per entry. A batch that changes no entry writes
//! nothing (the record catches up with the next batch that does, or at stop). If the txn ids of
//! the commits are not consecutive from the applied one, the root was committed outside the
//! engine (the core `Database`): reconcile from a fresh root snapshot first (every commit up to
//! it is in it, every later one comes through the mailbox). Between two batches the actor
//! rests: [`crate::actors::IndexDefinition::min_batch_interval`] at first, doubled after a batch whose
//! transaction copied more than one page per 4 entries and halved after one that copied fewer
//! than one per 8, within [`crate::actors::IndexDefinition::max_batch_interval`] (so a large index with
//! scattered terms gets larger batches, each copied leaf serving more entries); a mailbox half
//! full, a `wait_for_indexes` caller or the index's stop (shutdown, a dropped index) cuts the
//! rest short.
//!
//! Invariants: the applied record and the entries it covers commit together (a batch split in
//! several transactions has no record until its last one), and every root
//! commit after the applied one reaches the mailbox in txn order, so a durable index state with
//! record `A` holds exactly the entries the map function gives for the root's documents at txn
//! `A`; after a crash the root is at `R >= A` for immediate root commits (an index is fed only
//! acknowledged root commits), while a crash that loses acknowledged `Durability::Eventual` root
//! commits can leave `R < A` (the index applied commits the root lost): either way the applied
//! record differs from `R` and reconciling from `R` fixes it whatever the index holds (a reconcile interrupted by a crash
//! left the record at `A`, so the next definition reconciles again). `wait_for_indexes` returns
//! only once the index's applied txn reaches every root commit acknowledged before the call. A
//! stored index entry never has a key over [`crate::MAX_KEY_LEN`]: longer ones are skipped and
//! counted ([`crate::actors::IndexStats::skipped_terms`]).
//!
//! Queue bounds: the mailbox holds at most `index_queue_capacity` root commits; when it is full
//! the root's storage actor waits before answering its writers (back-pressure on the documents,
//! design.md invariant I10). So while an index builds, the documents accept that many commits and
//! then wait for the build. At most one build per executor runs at a time (a shared pool of
//! slots), so builds hold at most that many expected-entry buffers.
//!
//! Failure: a map function that panics (caught with `catch_unwind`) or a failed read or write
//! poisons this index only ([`Error::IndexPoisoned`] with an [`IndexFailure`]): its actor
//! stops, the root drops its feed, `wait_for_indexes` and [`crate::actors::IndexStats::state`] report the
//! error, and nothing of the failed batch is written. An actor that ends (stopped, abandoned,
//! poisoned) marks it in its shared progress, then answers every `Stop` left in its mailbox; a
//! `Stop` sent after the mark is not waited for. Defining the index again starts a new
//! actor, which reconciles. A clean shutdown lets every index apply what is queued and record
//! its applied txn, so the next definition needs no reconcile; a build in progress at shutdown
//! is abandoned (the next definition reconciles).

use batch::{diff_change, storage_failure, write_ops, Ops};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::io_pool::IoPool;
use super::messages::{IndexMsg, RootCommit, RootFeed};
use super::storage::StorageHandle;
use crate::actor_interface::{IndexFailure, ReadTransaction, Storage};

mod batch;
mod definition;
mod progress;
mod reconcile;
mod sync;

pub(crate) use batch::call_map;
pub(crate) use definition::read_applied;
pub use definition::{index_applied_txn, IndexDefinition, IndexMode, MapFn, INDEX_APPLIED_KEY};
pub(crate) use progress::{entries, BuildSlots, IndexShared};
pub use progress::{BuildProgress, IndexState, IndexStats, LagStats};
use reconcile::reconcile;
pub(crate) use sync::sync_index;

/// How often an index resting between batches looks at its mailbox and its waiters.
const ACCUMULATE_POLL: Duration = Duration::from_millis(2);

/// Pages copied per entry above which an index's next rest doubles, and below which it halves
/// (see `IndexDefinition::min_batch_interval`): as fractions, 1/4 and 1/8.
const REST_GROW_ABOVE: (usize, usize) = (1, 4);

const REST_SHRINK_BELOW: (usize, usize) = (1, 8);

/// Everything an index actor starts with.
pub(crate) struct IndexActor {
    pub def: IndexDefinition,
    pub shared: Arc<IndexShared>,
    pub rx: flume::Receiver<IndexMsg>,
    /// The root's snapshot when the feed was registered (taken at start: a snapshot held
    /// pins the root's pages and holds back its flushes).
    pub snapshot: Option<ReadTransaction>,
    /// The index's applied record when it was defined.
    pub applied: Option<u64>,
    /// The index storage's handle (its storage actor writes it).
    pub branch: StorageHandle,
    /// The root storage (for a fresh snapshot when its txn ids show a gap).
    pub root: Storage,
    /// The background I/O pool: the build's scans and diffs run there.
    pub pool: IoPool,
    pub slots: BuildSlots,
    pub feed: Arc<RootFeed>,
    /// Most pages one transaction of an index batch copies before the batch goes on in another
    /// transaction (see `write_ops`): 1/16 of the engine's memory budget.
    pub batch_pages: usize,
}

/// The index actor's loop: catch up, then follow the feed until stopped.
pub(crate) async fn run(mut a: IndexActor) {
    let Some(snapshot) = a.snapshot.take() else {
        a.shared.stopped();
        answer_stops(&a.rx);
        return;
    };
    let root_txn = snapshot.txn_id();
    let result = if a.def.rebuild || a.applied != Some(root_txn) {
        // INFO: a catch-up (build or reconcile) happens at definition, not in steady state.
        let span = tracing::info_span!("index catch-up", index = %a.shared.name, applied = ?a.applied, to = root_txn);
        let t = Instant::now();
        let r = tracing::Instrument::instrument(reconcile(&a, snapshot), span.clone()).await;
        if let Ok(true) = r {
            span.in_scope(|| {
                tracing::info!(
                    ms = t.elapsed().as_millis() as u64,
                    "index caught up with the documents"
                )
            });
        }
        r
    } else {
        drop(snapshot);
        Ok(true)
    };
    let result = match result {
        Ok(true) => {
            a.shared.set_current(root_txn);
            follow(&a, root_txn).await
        }
        other => other,
    };
    match result {
        Ok(_) => a.shared.stopped(),
        Err(f) => a.shared.poison_index(f),
    }
    answer_stops(&a.rx);
}

/// Answers every `Stop` left in the mailbox of an actor that has ended (marked so in its
/// shared progress first): a `Stop` sent before the mark is in the mailbox now (its sender
/// waits for the answer), one sent after sees the mark and does not wait
/// (`IndexShared::exited`). An actor that ended on an abandoned build used to leave its
/// mailbox unread, and a redefinition or drop of the index waited for good.
fn answer_stops(rx: &flume::Receiver<IndexMsg>) {
    // Ends once the mailbox is empty (the feed keeps sending until the receiver is dropped,
    // one root commit at a time).
    while let Ok(m) = rx.try_recv() {
        if let IndexMsg::Stop { reply } = m {
            let _ = reply.send(());
        }
    }
}

/// True when the txn ids of `commits` (all above `applied`) are not `applied + 1, + 2, ...`:
/// the root was committed outside the engine in between, and those changes never reached the
/// feed.
fn has_gap(applied: u64, commits: &[Arc<RootCommit>]) -> bool {
    let mut next = applied + 1;
    for c in commits {
        if c.txn != next {
            return true;
        }
        next = c.txn + 1;
    }
    false
}

/// Follows the feed from `applied` until stopped. Returns false when abandoned.
async fn follow(a: &IndexActor, mut applied: u64) -> std::result::Result<bool, IndexFailure> {
    let (def, shared, rx) = (&a.def, &a.shared, &a.rx);
    // The applied txn of the last record written (batches that change no entry write none).
    let mut durable = applied;
    let mut last_start: Option<Instant> = None;
    // The rest before the next batch: adapts between the definition's bounds (see
    // `IndexDefinition::min_batch_interval`).
    let mut rest = def.min_batch_interval;
    let (mut cap_bytes, mut cap_ops) = (0usize, 0usize);
    let half_full = rx.capacity().unwrap_or(1).div_ceil(2);
    loop {
        let first = rx.recv_async().await.ok();
        if let (Some(t), Some(IndexMsg::Commit(_))) = (last_start, &first) {
            // Accumulate until the interval since the last batch has passed, unless the
            // mailbox is half full (the root must not wait for an index that is only resting),
            // a `wait_for_indexes` caller waits, or the index is being stopped (shutdown, a
            // dropped index: its `Stop` waits behind these commits). Bounded: ends at the
            // deadline.
            let deadline = t + rest;
            loop {
                let now = Instant::now();
                if now >= deadline
                    || rx.len() + 1 >= half_full
                    || shared.has_waiters()
                    || shared.abandon.load(std::sync::atomic::Ordering::Acquire)
                {
                    break;
                }
                glommio::timer::sleep((deadline - now).min(ACCUMULATE_POLL)).await;
            }
        }
        last_start = Some(Instant::now());
        let mut commits: Vec<Arc<RootCommit>> = Vec::new();
        let mut stop = None;
        let mut changes = 0usize;
        let mut next = first;
        let ended = next.is_none();
        // Bounded by max_batch_changes (at least one commit).
        while let Some(m) = next.take() {
            match m {
                IndexMsg::Commit(c) => {
                    changes += c.changes.len().max(1);
                    commits.push(c);
                }
                IndexMsg::Stop { reply } => {
                    stop = Some(reply);
                    break;
                }
            }
            if changes < def.max_batch_changes {
                next = rx.try_recv().ok();
            }
        }
        commits.retain(|c| c.txn > applied);
        while has_gap(applied, &commits) {
            // Every commit up to a fresh snapshot is in it, and every later one is fed.
            tracing::warn!(
                index = %shared.name,
                "the root was committed outside the engine: reconciling the index"
            );
            let snap = a.root.begin_read().map_err(storage_failure)?;
            let txn = snap.txn_id();
            if !reconcile(a, snap).await? {
                return Ok(false);
            }
            (applied, durable) = (txn, txn);
            shared.set_current(txn);
            commits.retain(|c| c.txn > applied);
        }
        if let (Some(first), Some(last)) = (commits.first(), commits.last()) {
            let last_txn = last.txn;
            let behind = a
                .feed
                .acked_txn
                .load(std::sync::atomic::Ordering::Acquire)
                .saturating_sub(applied);
            shared.batch_started(first.acked, behind);
            let mut ops = Ops::with_capacity(cap_bytes, cap_ops);
            let mut skipped = 0;
            for c in &commits {
                for ch in &c.changes {
                    skipped += diff_change(&*def.map, ch, &mut ops)?;
                }
            }
            ops.settle();
            let wrote = !ops.is_empty();
            if wrote {
                (cap_bytes, cap_ops) = (ops.arena.len(), ops.ops.len());
                let entries = ops.len();
                let pages = write_ops(&a.branch, ops, Some(last_txn), a.batch_pages)
                    .await
                    .map_err(storage_failure)?;
                rest = next_rest(def, rest, pages, entries);
                durable = last_txn;
            }
            tracing::debug!(
                index = %shared.name,
                commits = commits.len(),
                to = last_txn,
                wrote,
                "index batch"
            );
            applied = last_txn;
            shared.batch_applied(applied, &commits, skipped, wrote);
        }
        if stop.is_some() || ended {
            if durable < applied {
                write_ops(&a.branch, Ops::default(), Some(applied), a.batch_pages)
                    .await
                    .map_err(storage_failure)?;
            }
            if let Some(reply) = stop {
                let _ = reply.send(());
            }
            return Ok(true);
        }
        glommio::yield_if_needed().await;
    }
}

/// The rest before an index's next batch, after one whose transaction wrote `entries` entries
/// and copied `pages` pages: doubled (up to the maximum) above [`REST_GROW_ABOVE`] pages per
/// entry, halved (down to the minimum) below [`REST_SHRINK_BELOW`], else kept.
fn next_rest(def: &IndexDefinition, rest: Duration, pages: usize, entries: usize) -> Duration {
    let (min, max) = (def.min_batch_interval, def.max_rest());
    let above = |(n, d): (usize, usize)| pages.saturating_mul(d) > entries.saturating_mul(n);
    let next = if above(REST_GROW_ABOVE) {
        rest.saturating_mul(2)
            .max(min.max(Duration::from_millis(1)))
    } else if !above(REST_SHRINK_BELOW) {
        rest / 2
    } else {
        rest
    };
    next.clamp(min, max)
}

#[cfg(test)]
mod tests {
    use super::batch::*;
    use super::definition::*;
    use super::reconcile::*;
    use super::*;
    use crate::actor_interface::MAX_KEY_LEN;
    use crate::actors::messages::DocumentChange;

    #[test]
    fn the_rest_doubles_when_batches_copy_many_pages_per_entry_and_halves_when_few() {
        let ms = Duration::from_millis;
        let def = IndexDefinition::new("i", |_: &[u8], _: &[u8]| Vec::new());
        // Default bounds: 250 ms .. 4 x 250 ms.
        assert_eq!(def.max_rest(), ms(1000));
        // 300 pages for 1,000 entries (> 1/4): doubles, then stops at the maximum.
        assert_eq!(next_rest(&def, ms(250), 300, 1000), ms(500));
        assert_eq!(next_rest(&def, ms(500), 300, 1000), ms(1000));
        assert_eq!(next_rest(&def, ms(1000), 300, 1000), ms(1000));
        // Between 1/8 and 1/4: kept.
        assert_eq!(next_rest(&def, ms(500), 200, 1000), ms(500));
        // 100 pages for 1,000 entries (< 1/8): halves, down to the minimum.
        assert_eq!(next_rest(&def, ms(1000), 100, 1000), ms(500));
        assert_eq!(next_rest(&def, ms(250), 100, 1000), ms(250));
        // Explicit bounds; a maximum under the minimum counts as the minimum.
        let def = def.min_batch_interval(ms(10)).max_batch_interval(ms(25));
        assert_eq!(next_rest(&def, ms(20), 5, 1), ms(25));
        let def = def.max_batch_interval(ms(1));
        assert_eq!(def.max_rest(), ms(10));
        assert_eq!(next_rest(&def, ms(10), 5, 1), ms(10));
        // A zero minimum still grows (from 1 ms) when batches are costly.
        let def = IndexDefinition::new("i", |_: &[u8], _: &[u8]| Vec::new())
            .min_batch_interval(Duration::ZERO)
            .max_batch_interval(ms(8));
        assert_eq!(next_rest(&def, Duration::ZERO, 5, 1), ms(1));
        assert_eq!(next_rest(&def, ms(4), 5, 1), ms(8));
        assert_eq!(next_rest(&def, ms(1), 0, 100), Duration::ZERO + ms(1) / 2);
    }

    fn keys(o: &Ops) -> Vec<(Vec<u8>, bool)> {
        o.ops.iter().map(|x| (o.key(x).to_vec(), x.put)).collect()
    }

    #[test]
    fn settle_keeps_the_last_operation_of_each_key_in_key_order() {
        let mut o = Ops::default();
        o.push_key(b"b", true);
        o.push_key(b"a", true);
        o.push_key(b"b", false);
        o.push_key(b"c", false);
        o.push_key(b"a", false);
        o.push_key(b"a", true);
        o.settle();
        assert_eq!(
            keys(&o),
            vec![
                (b"a".to_vec(), true),
                (b"b".to_vec(), false),
                (b"c".to_vec(), false)
            ]
        );
    }

    #[test]
    fn settle_matches_a_model_for_keys_sharing_their_8_byte_prefix() {
        // Keys of 0..12 bytes over a 2-letter alphabet: many share the first 8 bytes, are
        // prefixes of one another, or differ only by a trailing 0x00 (zero padding).
        let mut x = 0x1234_5678_9abc_def0u64;
        let mut model = std::collections::BTreeMap::new();
        let mut o = Ops::default();
        for _ in 0..5000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 13) as usize;
            let key: Vec<u8> = (0..len)
                .map(|i| [0u8, b'a'][((x >> (i + 8)) & 1) as usize])
                .collect();
            let put = (x >> 40) & 1 == 1;
            o.push_key(&key, put);
            model.insert(key, put);
        }
        o.settle();
        assert_eq!(keys(&o), model.into_iter().collect::<Vec<_>>());
    }

    #[test]
    fn a_change_deletes_lost_terms_and_puts_gained_ones() {
        let map: Arc<MapFn> =
            Arc::new(|_k: &[u8], v: &[u8]| v.split(|b| *b == b',').map(<[u8]>::to_vec).collect());
        let c = DocumentChange {
            key: b"d1".to_vec(),
            old: Some(b"x,y".to_vec()),
            new: Some(b"y,z".to_vec()),
        };
        let mut o = Ops::default();
        assert_eq!(diff_change(&*map, &c, &mut o).unwrap(), 0);
        assert_eq!(
            keys(&o),
            vec![(b"x\0d1".to_vec(), false), (b"z\0d1".to_vec(), true)]
        );
        // A term whose key passes the key limit is skipped and counted.
        let long = DocumentChange {
            key: b"d2".to_vec(),
            old: None,
            new: Some(vec![b'q'; MAX_KEY_LEN]),
        };
        let mut o = Ops::default();
        assert_eq!(diff_change(&*map, &long, &mut o).unwrap(), 1);
        assert!(o.is_empty());
    }

    #[test]
    fn a_panicking_map_is_a_typed_failure() {
        let map: Arc<MapFn> = Arc::new(|_k: &[u8], _v: &[u8]| panic!("bad document"));
        match call_map(&*map, b"k", b"v") {
            Err(IndexFailure::MapPanicked { key, message }) => {
                assert_eq!(key, b"k");
                assert_eq!(message, "bad document");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn expected_entries_shrink_to_the_smallest_keys_under_the_budget() {
        let mut e = Expected::new(4096, None, true);
        for i in (0..2000u32).rev() {
            e.add(format!("{i:06}").as_bytes(), b"d");
        }
        e.sort_dedup();
        let cutoff = e.cutoff.clone().expect("over budget: a cutoff");
        assert!(e.arena.len() + e.spans.len() * 16 <= 4096 + 64);
        // Every kept key is below the cutoff, and every key below the cutoff was kept.
        let kept: Vec<Vec<u8>> = e.spans.iter().map(|s| e.key(*s).to_vec()).collect();
        let want: Vec<Vec<u8>> = (0..2000u32)
            .map(|i| {
                let mut k = format!("{i:06}").into_bytes();
                k.extend_from_slice(b"\0d");
                k
            })
            .filter(|k| k.as_slice() < cutoff.as_slice())
            .collect();
        assert_eq!(kept, want);
        assert!(!kept.is_empty());
    }

    #[test]
    fn applied_records_round_trip_and_foreign_values_are_not_records() {
        assert_eq!(decode_applied(&applied_record(42)), Some(42));
        assert_eq!(decode_applied(b"x"), None);
        assert_eq!(decode_applied(&[0u8; 16]), None);
    }
}
