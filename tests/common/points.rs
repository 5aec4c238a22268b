//! Shared by the power-loss crash suites: crash points taken from one run of a workload.
//!
//! A workload runs once under a `PowerLossEnv` whose durable observer snapshots the model just
//! before and right after every durable operation, together with what the workload expects of a
//! crash at that moment (its acknowledged and in-flight commits). Each snapshot gives eight
//! crash points (the four crash modes, with and without losing unsynced directory entries);
//! points whose on-disk states are equal (the same fingerprint) are verified once, against the
//! expectations of all of them. So a crash point costs one write-out and one recovery, not a
//! replay of the workload.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::path::Path;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use omnibus::env::testing::{
    CrashMode, CrashSnapshot, DurableEvent, DurableStep, HookedEnv, OpInfo, OpKind, PowerLossEnv,
};
use omnibus::env::{default_env, StorageEnv};

/// The crash modes, in the order points rotate over them.
pub const MODES: [CrashMode; 4] = [
    CrashMode::DropUnsynced,
    CrashMode::KeepPrefix,
    CrashMode::KeepSubset,
    CrashMode::TornSectors,
];

/// One snapshot: the model at one durable operation and what a crash there must recover to.
pub struct Snap<E> {
    pub snap: CrashSnapshot,
    /// The kind of operation (e.g. "journal batch", "hole punch"), for the coverage tally.
    pub what: &'static str,
    pub step: DurableStep,
    /// The durable operation's number in the run.
    pub n: u64,
    pub expect: E,
}

/// What verifying the points of a run found.
#[derive(Debug, Default)]
pub struct Tally {
    /// Crash points checked (snapshots times modes times entry-loss settings times rounds).
    pub points: usize,
    /// Distinct on-disk states among them, each recovered and checked once.
    pub states: usize,
    /// States where some storage recovered the commit that was in flight.
    pub inflight: usize,
    /// Points per operation kind, crash mode and entry-loss setting.
    pub by_kind: BTreeMap<(&'static str, String), usize>,
    /// Points per crash mode and entry-loss setting.
    pub by_mode: BTreeMap<String, usize>,
    pub failures: Vec<String>,
}

impl Tally {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: Tally) {
        self.points += other.points;
        self.states += other.states;
        self.inflight += other.inflight;
        for (k, v) in other.by_kind {
            *self.by_kind.entry(k).or_default() += v;
        }
        for (k, v) in other.by_mode {
            *self.by_mode.entry(k).or_default() += v;
        }
        self.failures.extend(other.failures);
    }

    /// The operation kinds that met every crash mode with and without losing unsynced entries.
    pub fn kinds_in_every_mode(&self) -> Vec<&'static str> {
        let mut per: BTreeMap<&'static str, usize> = BTreeMap::new();
        for (what, _) in self.by_kind.keys() {
            *per.entry(what).or_default() += 1;
        }
        per.into_iter()
            .filter(|(_, n)| *n == 2 * MODES.len())
            .map(|(w, _)| w)
            .collect()
    }

    /// One progress line for an offline run (`OMNIBUS_CRASH_POINTS` above the CI default), so a
    /// run cut short still says how far it got.
    pub fn progress(&self, round: impl std::fmt::Display, start: std::time::Instant) {
        eprintln!(
            "round {round}: {} points, {} distinct states checked, {} failed, {:.1?}",
            self.points,
            self.states,
            self.failures.len(),
            start.elapsed()
        );
    }

    /// The suite's verdict: no failed state, at least `target` distinct states, every kind of
    /// `kinds` met by every crash mode with and without entry loss, and some state that kept
    /// the commit in flight (else the points miss the window between a journal write and its
    /// sync).
    pub fn assert_clean(&self, target: usize, kinds: &[&str]) {
        assert!(
            self.failures.is_empty(),
            "{} crash states failed; first ones:\n{}",
            self.failures.len(),
            self.failures
                .iter()
                .take(10)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n")
        );
        assert!(
            self.states >= target,
            "only {} distinct crash states, want {target}",
            self.states
        );
        let covered = self.kinds_in_every_mode();
        for kind in kinds {
            assert!(
                covered.contains(kind),
                "{kind}: not met by every crash mode with and without entry loss: {:?}",
                self.by_kind
            );
        }
        assert!(
            self.inflight > 0,
            "no crash point left a commit in flight on disk: the crash points miss the window \
             between a journal write and its sync"
        );
    }
}

/// The number of crash points a suite must check: `OMNIBUS_CRASH_POINTS` (the total over the
/// two power-loss suites, for an offline run) split between them, or `default`.
pub fn target(default: usize) -> usize {
    std::env::var("OMNIBUS_CRASH_POINTS")
        .ok()
        .and_then(|v| v.trim().replace('_', "").parse::<usize>().ok())
        .map_or(default, |n| (n / 2).max(default))
}

/// The threads that verify states: up to 4.
pub fn threads() -> usize {
    std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, 4)
}

/// One crash point of a snapshot: `combo` 0..8 picks the mode and the entry-loss setting.
fn combo(salt: u64, s: &Snap<impl Sized>, combo: usize, round: u64) -> (CrashMode, bool, u64) {
    let mode = MODES[combo % 4];
    let lose = combo >= 4;
    let mut h = std::hash::DefaultHasher::new();
    (salt, s.n, s.step == DurableStep::Before, combo, round).hash(&mut h);
    (mode, lose, h.finish())
}

/// Verifies every crash point of `snaps` (eight per snapshot and round, `rounds` rounds with
/// other seeds): groups the points by the fingerprint of the state they leave, writes each
/// distinct state to a fresh directory under `base` and calls `verify(dir, expectations,
/// index)` with the expectations of every point that leaves it (`index` counts the states, for
/// checks done only at some of them). `verify` returns whether a commit in flight was
/// recovered.
pub fn verify_snaps<E: Sync>(
    base: &Path,
    salt: u64,
    snaps: &[Snap<E>],
    rounds: u64,
    verify: impl Fn(&Path, &[&E], usize) -> Result<bool, String> + Sync,
) -> Tally {
    let per_snap = 8 * rounds as usize;
    let total = snaps.len() * per_snap;
    // Fingerprint every point, on a few threads.
    let next = AtomicUsize::new(0);
    let prints: Mutex<Vec<(u64, usize)>> = Mutex::new(Vec::with_capacity(total));
    std::thread::scope(|sc| {
        for _ in 0..threads() {
            sc.spawn(|| {
                let mut mine = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        break;
                    }
                    let s = &snaps[i / per_snap];
                    let c = i % per_snap;
                    let (mode, lose, seed) = combo(salt, s, c % 8, (c / 8) as u64);
                    mine.push((s.snap.state(mode, lose, seed).fingerprint(), i));
                }
                prints.lock().unwrap().extend(mine);
            });
        }
    });
    let mut groups: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (fp, i) in prints.into_inner().unwrap() {
        groups.entry(fp).or_default().push(i);
    }
    let groups: Vec<Vec<usize>> = groups.into_values().collect();

    let mut tally = Tally {
        points: total,
        states: groups.len(),
        ..Tally::default()
    };
    for i in 0..total {
        let s = &snaps[i / per_snap];
        let (mode, lose, _) = combo(salt, s, i % per_snap % 8, 0);
        let m = format!("{mode:?}/lose={lose}");
        *tally.by_kind.entry((s.what, m.clone())).or_default() += 1;
        *tally.by_mode.entry(m).or_default() += 1;
    }
    let next = AtomicUsize::new(0);
    let found = Mutex::new((0usize, Vec::new()));
    std::thread::scope(|sc| {
        for _ in 0..threads() {
            sc.spawn(|| loop {
                let g = next.fetch_add(1, Ordering::Relaxed);
                let Some(members) = groups.get(g) else { return };
                let i = members[0];
                let s = &snaps[i / per_snap];
                let c = i % per_snap;
                let (mode, lose, seed) = combo(salt, s, c % 8, (c / 8) as u64);
                let expect: Vec<&E> = members.iter().map(|&j| &snaps[j / per_snap].expect).collect();
                let r = tempfile::tempdir_in(base)
                    .map_err(|e| e.to_string())
                    .and_then(|dir| {
                        s.snap
                            .state(mode, lose, seed)
                            .write_to(dir.path())
                            .map_err(|e| format!("writing the crash state: {e}"))?;
                        verify(dir.path(), &expect, g)
                    });
                let mut f = found.lock().unwrap();
                match r {
                    Ok(inflight) => f.0 += inflight as usize,
                    Err(e) => f.1.push(format!(
                        "{}, {} durable operation {}, {mode:?}, lose={lose}, seed {seed:#x} ({} points share the state): {e}",
                        s.what,
                        if s.step == DurableStep::Before { "before" } else { "after" },
                        s.n,
                        members.len()
                    )),
                }
            });
        }
    });
    let (inflight, failures) = found.into_inner().unwrap();
    tally.inflight = inflight;
    tally.failures = failures;
    tally
}

/// A directory for the many short-lived crash states: tmpfs when there is one (the real
/// `fdatasync`s of the recovery opens are then free), else the default temporary directory.
pub fn scratch_base(prefix: &str) -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(d) = tempfile::Builder::new().prefix(prefix).tempdir_in(shm) {
            return d;
        }
    }
    tempfile::tempdir().unwrap()
}

/// Changes since the last sync of their file or directory, seen by [`Tracker::hook`].
const PUNCHED: u8 = 1;
const JOURNAL_CREATED: u8 = 2;
const JOURNAL_REMOVED: u8 = 4;
const JOURNAL_RENAMED: u8 = 8;

/// Names the kind of each durable operation from its path and the changes waiting for it
/// (holes punched in a data file, new, renamed and removed journal files), which a
/// `HookedEnv` hook reports to [`Tracker::hook`].
#[derive(Default)]
pub struct Tracker {
    data: AtomicU8,
    journals: AtomicU8,
    /// Syncs of a `Journals/` after a new journal file (created or from the pool).
    pub rotations: AtomicUsize,
}

fn is_journal(p: &Path) -> bool {
    p.extension().is_some_and(|e| e == "journal")
}

impl Tracker {
    /// To be called by a `HookedEnv` hook (above the power-loss env) on every operation.
    pub fn hook(&self, op: &OpInfo<'_>) {
        let in_journals = op
            .to
            .unwrap_or(op.path)
            .parent()
            .is_some_and(|d| d.ends_with("Journals"));
        match op.kind {
            OpKind::PunchHole => {
                self.data.fetch_or(PUNCHED, Ordering::SeqCst);
            }
            OpKind::Open if is_journal(op.path) && !op.path.exists() => {
                self.journals.fetch_or(JOURNAL_CREATED, Ordering::SeqCst);
            }
            OpKind::Remove if in_journals => {
                self.journals.fetch_or(JOURNAL_REMOVED, Ordering::SeqCst);
            }
            OpKind::Rename if in_journals => {
                self.journals.fetch_or(JOURNAL_RENAMED, Ordering::SeqCst);
            }
            _ => {}
        }
    }

    /// The kind of `e` (call from the durable observer, at both steps).
    pub fn what(&self, e: &DurableEvent<'_>) -> &'static str {
        let name = e.path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let j = self.journals.load(Ordering::SeqCst);
        let d = self.data.load(Ordering::SeqCst);
        let what = if e.dir {
            let branch = e
                .path
                .parent()
                .and_then(Path::parent)
                .is_some_and(|p| p.ends_with("Indexes"));
            if name == "Indexes" {
                "Indexes directory (branch creation or drop)"
            } else if name != "Journals" {
                "storage directory (creation)"
            } else if branch {
                "branch journal directory (links)"
            } else if j & JOURNAL_CREATED != 0 {
                "journal directory: new file (rotation)"
            } else if j & JOURNAL_RENAMED != 0 {
                "journal directory: file from the pool"
            } else if j & JOURNAL_REMOVED != 0 {
                "journal unlink not yet durable"
            } else {
                "journal directory: nothing new"
            }
        } else if name == "data.pages" && d & PUNCHED != 0 {
            "data file sync with holes punched"
        } else if j & JOURNAL_REMOVED != 0 {
            // An unlink is made durable by the next sync of `Journals/` (a rotation's).
            "journal unlink not yet durable"
        } else if is_journal(e.path) {
            "journal batch"
        } else if name == "data.pages" {
            "data file sync (flush)"
        } else {
            "other file sync"
        };
        if e.step == DurableStep::After {
            if e.dir && name == "Journals" {
                let was = self.journals.swap(0, Ordering::SeqCst);
                if was & (JOURNAL_CREATED | JOURNAL_RENAMED) != 0 {
                    self.rotations.fetch_add(1, Ordering::SeqCst);
                }
            } else if name == "data.pages" {
                self.data.store(0, Ordering::SeqCst);
            }
        }
        what
    }
}

/// A power-loss environment over a directory, seen through a hooked one whose operations a
/// [`Tracker`] names: the environment a crash suite runs its workload in, once.
pub struct Recording {
    pub pl: PowerLossEnv,
    /// The environment to open storages with (the power-loss one, hooked).
    pub env: Arc<dyn StorageEnv>,
    pub tracker: Arc<Tracker>,
}

impl Recording {
    pub fn new(dir: &Path) -> Recording {
        let pl = PowerLossEnv::new(default_env(), dir);
        let tracker = Arc::new(Tracker::default());
        let h = HookedEnv::new(Arc::new(pl.clone()));
        let t = tracker.clone();
        h.set_hook(Box::new(move |op| {
            t.hook(op);
            None
        }));
        Recording {
            pl,
            env: Arc::new(h),
            tracker,
        }
    }

    /// From now on, snapshots the simulated disk before and after every durable operation,
    /// each with what `expect` says a crash there must recover to; the snapshots gather in the
    /// returned list until [`Recording::stop`].
    pub fn record<E: Send + 'static>(
        &self,
        expect: impl Fn() -> E + Send + Sync + 'static,
    ) -> Arc<Mutex<Vec<Snap<E>>>> {
        let snaps: Arc<Mutex<Vec<Snap<E>>>> = Arc::default();
        let (sn, t) = (snaps.clone(), self.tracker.clone());
        self.pl
            .set_durable_observer(Some(Arc::new(move |e: &DurableEvent<'_>| {
                let what = t.what(e);
                let expect = expect();
                sn.lock().unwrap().push(Snap {
                    snap: e.snapshot(),
                    what,
                    step: e.step,
                    n: e.n,
                    expect,
                });
            })));
        snaps
    }

    /// Stops the snapshots [`Recording::record`] takes.
    pub fn stop(&self) {
        self.pl.set_durable_observer(None);
    }
}
