//! What an index's actor shares with the engine: its state, build progress, lag and counters
//! ([`crate::actors::IndexStats`]), the waiters of `wait_for_indexes`, and the build slots.

use super::definition::INDEX_APPLIED_KEY;
use crate::actor_interface::{Error, IndexFailure, ReadTransaction, Result};
use crate::actors::messages::RootCommit;
use hdrhistogram::Histogram;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// What an index is doing.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum IndexState {
    /// Building or reconciling from a snapshot of the documents ([`crate::actors::IndexStats::build`] has the
    /// progress); live changes wait in its queue.
    Building,
    /// Following the change feed (possibly [`crate::actors::IndexStats::lag_txns`] behind).
    Current,
    /// Stopped by a failure ([`Error::IndexPoisoned`]); define it again to rebuild it.
    Poisoned(Error),
    /// Stopped by the engine's shutdown or by dropping its storage.
    Stopped,
}

/// Progress of a build or reconcile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuildProgress {
    /// Pass over the documents, from 1 (more than one when the expected entries do not fit in
    /// [`crate::actors::IndexDefinition::reconcile_memory`]).
    pub pass: u32,
    /// Documents scanned in this pass.
    pub scanned: u64,
    /// Documents in the snapshot being indexed.
    pub total: u64,
}

/// Lag from a root commit's acknowledgement to the durable commit of the index batch that
/// applied it, one sample per document change, since the index was defined (milliseconds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LagStats {
    /// Document changes measured.
    pub samples: u64,
    /// Median, milliseconds.
    pub p50_ms: f64,
    /// 99th percentile, milliseconds.
    pub p99_ms: f64,
    /// Largest, milliseconds.
    pub max_ms: f64,
}

/// Counters and state of one index ([`crate::actors::DatabaseHandle::index_stats`]).
#[derive(Debug, Clone)]
pub struct IndexStats {
    /// The index's name (its branch storage).
    pub name: String,
    /// Building, current, poisoned (with the error) or stopped.
    pub state: IndexState,
    /// The root txn id the index has applied up to.
    pub applied_txn: u64,
    /// The last root txn id acknowledged through the engine, when the stats were taken.
    pub root_txn: u64,
    /// Root transactions not yet applied: `root_txn - applied_txn` (0 when ahead).
    pub lag_txns: u64,
    /// Milliseconds since the oldest root commit not yet applied was acknowledged, or since
    /// the build started while building; 0 when current.
    pub lag_ms: f64,
    /// Entries in the index storage (the applied record excluded).
    pub entries: u64,
    /// Progress of the build or reconcile in progress.
    pub build: Option<BuildProgress>,
    /// Builds or reconciles from a snapshot of the documents this definition has run: 0 when it
    /// resumed from its applied record and saw no commit made outside the engine.
    pub reconciles: u32,
    /// Passes over the documents of the last build or reconcile (0 without one; more than 1
    /// when its expected entries did not fit in [`crate::actors::IndexDefinition::reconcile_memory`]).
    pub build_passes: u32,
    /// Index transactions committed from the feed since the definition.
    pub batches: u64,
    /// Document changes applied from the feed since the definition.
    pub changes: u64,
    /// Terms left out because their key would pass [`crate::MAX_KEY_LEN`] bytes.
    pub skipped_terms: u64,
    /// Most root transactions the index was behind when it started a batch.
    pub max_lag_txns: u64,
    /// Lag of the applied changes.
    pub apply_lag: LagStats,
    /// True for a synchronous index kept by the root's commits
    /// ([`crate::actors::IndexMode::Synchronous`]): never behind the root.
    pub synchronous: bool,
}

/// A pool of build slots (one per executor), shared by the indexes of a database.
#[derive(Clone)]
pub(crate) struct BuildSlots {
    pub(super) tx: flume::Sender<()>,
    pub(super) rx: flume::Receiver<()>,
}

pub(super) struct Slot(flume::Sender<()>);

impl Drop for Slot {
    fn drop(&mut self) {
        let _ = self.0.try_send(());
    }
}

impl BuildSlots {
    pub fn new(n: usize) -> BuildSlots {
        let (tx, rx) = flume::bounded(n.max(1));
        for _ in 0..n.max(1) {
            let _ = tx.try_send(());
        }
        BuildSlots { tx, rx }
    }

    pub(super) async fn acquire(&self) -> Option<Slot> {
        self.rx.recv_async().await.ok()?;
        Some(Slot(self.tx.clone()))
    }
}

pub(super) enum Phase {
    Building { since: Instant },
    Current,
    Poisoned(Error),
    Stopped,
}

pub(super) struct Progress {
    pub(super) phase: Phase,
    pub(super) applied: u64,
    pub(super) build: Option<BuildProgress>,
    pub(super) reconciles: u32,
    pub(super) build_passes: u32,
    pub(super) batches: u64,
    pub(super) changes: u64,
    pub(super) skipped_terms: u64,
    pub(super) max_lag_txns: u64,
    /// When the oldest commit of the batch being applied was acknowledged.
    pub(super) pending_since: Option<Instant>,
    /// Microseconds from acknowledgement to the index commit, per document change.
    pub(super) lag_us: Histogram<u64>,
    /// `wait_for_indexes` callers: (target txn, answer).
    pub(super) waiters: Vec<(u64, flume::Sender<Result<()>>)>,
    /// Kept synchronously by the root's commits.
    pub(super) synchronous: bool,
}

/// An index's progress, shared by its actor and the database handle.
pub(crate) struct IndexShared {
    pub name: String,
    /// Set by shutdown and by dropping the storage: a build in progress stops.
    pub abandon: AtomicBool,
    pub(super) progress: Mutex<Progress>,
}

impl IndexShared {
    pub fn new(name: &str, applied: u64) -> IndexShared {
        IndexShared {
            name: name.to_string(),
            abandon: AtomicBool::new(false),
            progress: Mutex::new(Progress {
                phase: Phase::Building {
                    since: Instant::now(),
                },
                applied,
                build: None,
                reconciles: 0,
                build_passes: 0,
                batches: 0,
                changes: 0,
                skipped_terms: 0,
                max_lag_txns: 0,
                pending_since: None,
                lag_us: Histogram::new(3).expect("3 significant digits is valid"),
                waiters: Vec::new(),
                synchronous: false,
            }),
        }
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The root txn applied up to, when the index is current (following the feed, not building,
    /// poisoned or stopped): every root commit up to it is in the index storage's snapshots
    /// taken from now on.
    pub fn applied_if_current(&self) -> Option<u64> {
        let p = self.lock();
        matches!(p.phase, Phase::Current).then_some(p.applied)
    }

    /// Registers a wait for `target`: `Ok(None)` when already applied, a receiver answered once
    /// it is (or with the poison error); the poison error at once when poisoned.
    pub fn waiter(&self, target: u64) -> Result<Option<flume::Receiver<Result<()>>>> {
        let mut p = self.lock();
        if let Phase::Poisoned(e) = &p.phase {
            return Err(e.clone());
        }
        if p.applied >= target && !matches!(p.phase, Phase::Building { .. }) {
            return Ok(None);
        }
        if matches!(p.phase, Phase::Stopped) {
            return Err(Error::Closed);
        }
        let (tx, rx) = flume::bounded(1);
        p.waiters.push((target, tx));
        Ok(Some(rx))
    }

    /// True while a `wait_for_indexes` caller waits on this index.
    pub(super) fn has_waiters(&self) -> bool {
        !self.lock().waiters.is_empty()
    }

    pub(super) fn notify(p: &mut Progress) {
        let applied = p.applied;
        p.waiters.retain(|(t, tx)| {
            if *t <= applied {
                let _ = tx.send(Ok(()));
                false
            } else {
                true
            }
        });
    }

    pub(super) fn set_build(&self, b: BuildProgress, skipped: u64) {
        let mut p = self.lock();
        if !matches!(p.phase, Phase::Building { .. }) {
            p.phase = Phase::Building {
                since: Instant::now(),
            };
        }
        p.build = Some(b);
        p.build_passes = b.pass;
        p.skipped_terms += skipped;
    }

    pub(super) fn reconcile_started(&self) {
        self.lock().reconciles += 1;
    }

    pub(super) fn set_current(&self, applied: u64) {
        let mut p = self.lock();
        p.phase = Phase::Current;
        p.build = None;
        p.applied = applied;
        Self::notify(&mut p);
    }

    pub(super) fn batch_started(&self, oldest: Instant, behind: u64) {
        let mut p = self.lock();
        p.pending_since = Some(oldest);
        p.max_lag_txns = p.max_lag_txns.max(behind);
    }

    pub(super) fn batch_applied(
        &self,
        applied: u64,
        commits: &[Arc<RootCommit>],
        skipped: u64,
        wrote: bool,
    ) {
        let now = Instant::now();
        let mut p = self.lock();
        p.applied = applied;
        p.batches += u64::from(wrote);
        p.skipped_terms += skipped;
        for c in commits {
            let n = c.changes.len() as u64;
            p.changes += n;
            let us = now.saturating_duration_since(c.acked).as_micros() as u64;
            let _ = p.lag_us.record_n(us, n.max(1));
        }
        p.pending_since = None;
        Self::notify(&mut p);
    }

    /// A synchronous index's root commit `applied`, with `changes` document changes, is
    /// published: the index is current at it (no lag).
    pub(super) fn synchronous_applied(&self, applied: u64, changes: usize) {
        let mut p = self.lock();
        p.phase = Phase::Current;
        p.synchronous = true;
        p.build = None;
        p.applied = applied;
        if changes > 0 {
            p.batches += 1;
            p.changes += changes as u64;
            let _ = p.lag_us.record_n(0, changes as u64);
        }
        Self::notify(&mut p);
    }

    /// Adds `n` to the terms skipped for their length.
    pub(super) fn add_skipped(&self, n: u64) {
        if n > 0 {
            self.lock().skipped_terms += n;
        }
    }

    /// Poisons a synchronous index with `cause`; the error its root commit fails with.
    pub(super) fn poison_synchronous(&self, cause: IndexFailure) -> Error {
        self.poison_index(cause);
        match &self.lock().phase {
            Phase::Poisoned(e) => e.clone(),
            _ => Error::Poisoned {
                cause: format!("index {:?} failed", self.name),
            },
        }
    }

    /// Poisons the index with `cause`; answers every waiter with the error.
    pub(super) fn poison_index(&self, cause: IndexFailure) {
        let e = Error::IndexPoisoned {
            index: self.name.clone(),
            cause,
        };
        tracing::error!(index = %self.name, error = %e, "index poisoned");
        let mut p = self.lock();
        for (_, tx) in p.waiters.drain(..) {
            let _ = tx.send(Err(e.clone()));
        }
        p.build = None;
        p.phase = Phase::Poisoned(e);
    }

    /// The actor exited: waiters not yet answered get [`Error::Closed`].
    /// True once the actor has ended (stopped, abandoned or poisoned): it reads no more of its
    /// mailbox after answering what was in it (`index::run`), so a `Stop` sent now would wait
    /// for good.
    pub(crate) fn exited(&self) -> bool {
        matches!(self.lock().phase, Phase::Stopped | Phase::Poisoned(_))
    }

    pub(super) fn stopped(&self) {
        let mut p = self.lock();
        if p.synchronous {
            // Its actor stopped when the root's actor took it over: it is current.
            return;
        }
        if !matches!(p.phase, Phase::Poisoned(_)) {
            p.phase = Phase::Stopped;
        }
        p.build = None;
        p.waiters.clear();
    }

    pub fn stats(&self, root_txn: u64, entries: u64) -> IndexStats {
        let p = self.lock();
        let lag_txns = root_txn.saturating_sub(p.applied);
        let ms = |t: Instant| t.elapsed().as_secs_f64() * 1000.0;
        let (state, lag_ms) = match &p.phase {
            Phase::Building { since } => (IndexState::Building, ms(*since)),
            Phase::Current => (
                IndexState::Current,
                match (lag_txns, p.pending_since) {
                    (0, _) | (_, None) => 0.0,
                    (_, Some(t)) => ms(t),
                },
            ),
            Phase::Poisoned(e) => (IndexState::Poisoned(e.clone()), 0.0),
            Phase::Stopped => (IndexState::Stopped, 0.0),
        };
        let h = &p.lag_us;
        let q = |x: f64| h.value_at_quantile(x) as f64 / 1000.0;
        IndexStats {
            name: self.name.clone(),
            state,
            applied_txn: p.applied,
            root_txn,
            lag_txns,
            lag_ms,
            entries,
            build: p.build,
            reconciles: p.reconciles,
            build_passes: p.build_passes,
            batches: p.batches,
            changes: p.changes,
            skipped_terms: p.skipped_terms,
            max_lag_txns: p.max_lag_txns,
            apply_lag: LagStats {
                samples: h.len(),
                p50_ms: q(0.5),
                p99_ms: q(0.99),
                max_ms: h.max() as f64 / 1000.0,
            },
            synchronous: p.synchronous,
        }
    }
}

/// Entries in an index storage's snapshot, the applied record excluded.
pub(crate) fn entries(index: &ReadTransaction) -> u64 {
    let marker = matches!(index.get(INDEX_APPLIED_KEY), Ok(Some(_)));
    index.len().saturating_sub(u64::from(marker))
}
