//! Power-loss crash suite: a deterministic, seeded workload (small and overflow values, deletes,
//! many commits, explicit flushes, a close and reopen in the middle, journal rotations) is run
//! under a `PowerLossEnv` that crashes at every durable operation (`fdatasync` / directory
//! `fsync`) in turn, once right *after* it completes (`crash_after`) and once right *before* it
//! is issued (so the writes it would have made durable are still pending and the crash mode
//! decides which of them reach the disk). Crash modes (DropUnsynced, KeepPrefix, KeepSubset,
//! TornSectors) and `lose_unsynced_entries` rotate over the crash points.
//!
//! After each crash the directory is reopened with the default environment and must hold exactly
//! the state after the last acknowledged commit, or the state after the one commit that was in
//! flight (never a partial transaction, never an older state), and `check()` must be clean; the
//! recovered storage must also accept and keep a new commit.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use omnibus::env::testing::{CrashMode, HookedEnv, OpKind, PowerLossEnv};
use omnibus::env::{default_env, StorageEnv};
use omnibus::{FlushMode, Options, Prezero, Storage};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

#[path = "common/model.rs"]
mod model;
use model::{content, diff, Model};

/// The workloads; every durable operation of each is a crash point, crashed after and before it,
/// with and without losing unsynced directory entries (both at odd k, alternating at even k).
const WORKLOADS: [Workload; 7] = [
    Workload {
        seed: 0x5EED_0001,
        ..PLAIN
    },
    Workload {
        seed: 0x5EED_0002,
        inline_flush: true,
        ..PLAIN
    },
    Workload {
        seed: 0x5EED_0003,
        bulk: true,
        ..PLAIN
    },
    Workload {
        seed: 0x5EED_0004,
        inline_flush: true,
        whole_file_prezero: true,
        ..PLAIN
    },
    Workload {
        seed: 0x5EED_0005,
        flush_on_close: false,
        ..PLAIN
    },
    Workload {
        seed: 0x5EED_0006,
        inline_flush: true,
        bulk: true,
        ..PLAIN
    },
    Workload {
        seed: 0x5EED_0007,
        pool: true,
        flush_on_close: false,
        ..PLAIN
    },
];
const PLAIN: Workload = Workload {
    seed: 0,
    inline_flush: false,
    bulk: false,
    whole_file_prezero: false,
    flush_on_close: true,
    pool: false,
};
/// Write transactions per workload (the storage is closed and reopened half way).
const TXNS: usize = 36;
const MIN_CRASH_POINTS: usize = 1000;

#[derive(Debug, Clone, Copy)]
struct Workload {
    seed: u64,
    /// `FlushMode::Inline` with a small scratch threshold (flushes inside commits) instead of
    /// `Manual` with explicit `flush()` calls.
    inline_flush: bool,
    /// A transaction of a few MiB of overflow values (a journal file of its own), later deleted,
    /// so the flush punches free 1 MiB runs.
    bulk: bool,
    whole_file_prezero: bool,
    /// `Options::flush_on_close`: with `false` the reopen half way replays the journal.
    flush_on_close: bool,
    /// A pool of pre-zeroed journal files (`journal_pool_files: 1`) with recycling of released
    /// files. Its background thread makes the count of durable operations vary from run to
    /// run, so a crash point past the end of a shorter run is skipped, not failed.
    pool: bool,
}

const MODES: [CrashMode; 4] = [
    CrashMode::DropUnsynced,
    CrashMode::KeepPrefix,
    CrashMode::KeepSubset,
    CrashMode::TornSectors,
];

fn workload_opts(env: Arc<dyn StorageEnv>, w: Workload) -> Options {
    Options {
        env,
        flush_mode: if w.inline_flush {
            FlushMode::Inline
        } else {
            FlushMode::Manual
        },
        flush_scratch_bytes: 160 << 10,
        journal_prezero: if w.whole_file_prezero {
            Prezero::WholeFile
        } else {
            Prezero::Ahead(64 << 10)
        },
        journal_file_size: 64 << 10,
        flush_on_close: w.flush_on_close,
        journal_pool_files: if w.pool { 1 } else { 0 },
        ..Options::default()
    }
}

fn recovery_opts() -> Options {
    Options {
        flush_mode: FlushMode::Manual,
        ..Options::default()
    }
}

/// What the workload saw: the model after the last acknowledged commit, and the model the
/// commit in flight would produce (set just before `commit()`, cleared when it returns `Ok`).
#[derive(Default)]
struct Outcome {
    acked: Model,
    inflight: Option<Model>,
    commits: u64,
    error: Option<String>,
}

fn key(i: u32) -> Vec<u8> {
    format!("key-{i:05}").into_bytes()
}

fn value(rng: &mut SmallRng) -> Vec<u8> {
    let len = match rng.random_range(0..100) {
        0..65 => rng.random_range(0..64),
        65..90 => rng.random_range(64..1500),
        _ => rng.random_range(2500..20_000), // overflow pages
    };
    let a: u8 = rng.random();
    let b: u8 = rng.random_range(1..=255);
    (0..len)
        .map(|i| a.wrapping_add((i as u8).wrapping_mul(b)))
        .collect()
}

fn run_workload(env: Arc<dyn StorageEnv>, path: &Path, w: Workload) -> Outcome {
    let mut out = Outcome::default();
    if let Err(e) = workload(env, path, w, &mut out) {
        out.error = Some(e.to_string());
    }
    out
}

/// Commits `model` through `w`, keeping `out` up to date.
fn commit(w: omnibus::WriteTransaction, model: Model, out: &mut Outcome) -> omnibus::Result<()> {
    out.inflight = Some(model.clone());
    w.commit()?;
    out.acked = model;
    out.inflight = None;
    out.commits += 1;
    Ok(())
}

/// Stops at the first error (the env is dead after a crash).
fn workload(
    env: Arc<dyn StorageEnv>,
    path: &Path,
    wl: Workload,
    out: &mut Outcome,
) -> omnibus::Result<()> {
    let mut rng = SmallRng::seed_from_u64(wl.seed);
    let mut s = Storage::open(path, workload_opts(env.clone(), wl))?;
    for t in 0..TXNS {
        if t == TXNS / 2 {
            s.close()?;
            s = Storage::open(path, workload_opts(env.clone(), wl))?;
        }
        if wl.bulk && t == TXNS / 3 {
            // About 3 MiB of two-page overflow values in one commit, flushed, then deleted in
            // two commits and flushed again: whole free 1 MiB runs get punched.
            let mut model = out.acked.clone();
            let mut w = s.begin_write()?;
            for i in 0..180u32 {
                let k = format!("bulk-{i:04}").into_bytes();
                let v: Vec<u8> = (0..9000u32)
                    .map(|j| (i as u8) ^ (j as u8).wrapping_mul(31))
                    .collect();
                w.put(&k, &v)?;
                model.insert(k, v);
            }
            commit(w, model, out)?;
            s.flush()?;
            for half in 0..2u32 {
                let mut model = out.acked.clone();
                let mut w = s.begin_write()?;
                for i in (half..180).step_by(2) {
                    let k = format!("bulk-{i:04}").into_bytes();
                    assert!(w.delete(&k)?, "bulk key present");
                    model.remove(&k);
                }
                commit(w, model, out)?;
            }
            s.flush()?;
        }
        let mut model = out.acked.clone();
        let mut w = s.begin_write()?;
        let ops = if rng.random_bool(0.15) {
            rng.random_range(20..80)
        } else {
            rng.random_range(1..8)
        };
        for _ in 0..ops {
            if !model.is_empty() && rng.random_bool(0.25) {
                let i = rng.random_range(0..model.len());
                let k = model.keys().nth(i).cloned().expect("index in range");
                assert!(w.delete(&k)?, "delete of a present key");
                model.remove(&k);
            } else {
                let k = key(rng.random_range(0..400));
                let v = value(&mut rng);
                w.put(&k, &v)?;
                model.insert(k, v);
            }
        }
        if rng.random_bool(0.05) {
            w.abort();
            continue;
        }
        commit(w, model, out)?;
        if !wl.inline_flush && rng.random_bool(0.2) {
            s.flush()?;
        }
    }
    s.close()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum When {
    /// `crash_after(k)`: right after the k-th durable operation completes.
    After,
    /// Right before the k-th durable operation is issued (its writes still pending).
    Before,
}

#[derive(Debug, Clone, Copy)]
struct Point {
    workload: Workload,
    k: u64,
    when: When,
    mode: CrashMode,
    lose_unsynced_entries: bool,
    seed: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Recovered {
    Acked,
    InFlight,
    /// A pool workload ended before the crash point (see [`Workload::pool`]).
    Skipped,
}

/// Operations seen by the hook of [`hooked`].
#[derive(Default)]
struct Counts {
    durable: AtomicU64,
    journal_files: AtomicU64,
    punches: AtomicU64,
    renames: AtomicU64,
}

/// An env over `pl` that counts durable operations, journal files made and holes punched
/// through a hook (and, with `crash_before`, crashes `pl` just before the k-th durable
/// operation is issued).
fn hooked(
    pl: &PowerLossEnv,
    crash_before: Option<(u64, CrashMode, bool, u64)>,
) -> (HookedEnv, Arc<Counts>) {
    let h = HookedEnv::new(Arc::new(pl.clone()));
    let counts = Arc::new(Counts::default());
    let (c, pl2) = (counts.clone(), pl.clone());
    h.set_hook(Box::new(move |op| {
        match op.kind {
            OpKind::SyncData | OpKind::SyncDir => {
                if op.kind == OpKind::SyncDir && op.path.ends_with("Journals") {
                    c.journal_files.fetch_add(1, Ordering::SeqCst);
                }
                let n = c.durable.fetch_add(1, Ordering::SeqCst) + 1;
                if let Some((k, mode, lose, seed)) = crash_before {
                    if n == k {
                        pl2.crash(mode, lose, seed)
                            .expect("writing out the crash state");
                    }
                }
            }
            OpKind::PunchHole => {
                c.punches.fetch_add(1, Ordering::SeqCst);
            }
            OpKind::Rename => {
                c.renames.fetch_add(1, Ordering::SeqCst);
            }
            _ => {}
        }
        None
    }));
    (h, counts)
}

/// Runs the workload without a crash: the number of durable operations, and a check that a
/// clean run ends where the model says and exercises what it is meant to.
fn reference(base: &Path, w: Workload) -> u64 {
    let dir = tempfile::tempdir_in(base).unwrap();
    let pl = PowerLossEnv::new(default_env(), dir.path());
    let (h, counts) = hooked(&pl, None);
    let path = dir.path().join("s");
    let out = run_workload(Arc::new(h), &path, w);
    assert_eq!(out.error, None, "{w:?} fails without a crash");
    assert!(
        out.commits >= TXNS as u64 / 2,
        "{w:?} committed only {}",
        out.commits
    );
    let n = pl.durable_ops();
    if !w.pool {
        assert_eq!(
            counts.durable.load(Ordering::SeqCst),
            n,
            "hook and power-loss env count durable operations alike"
        );
    }
    assert!(
        counts.journal_files.load(Ordering::SeqCst) >= 4,
        "{w:?}: too few journal rotations"
    );
    if w.bulk {
        assert!(
            counts.punches.load(Ordering::SeqCst) > 0,
            "{w:?}: no hole punched"
        );
    }
    if w.pool {
        assert!(
            counts.renames.load(Ordering::SeqCst) > 0,
            "{w:?}: no journal file taken from the pool"
        );
    }
    let s = Storage::open(&path, recovery_opts()).unwrap();
    let got = content(&s).unwrap();
    assert!(got == out.acked, "clean run: {}", diff(&out.acked, &got));
    n
}

fn run_point(base: &Path, p: Point) -> Result<Recovered, String> {
    let dir = tempfile::tempdir_in(base).map_err(|e| e.to_string())?;
    let pl = PowerLossEnv::new(default_env(), dir.path());
    let env: Arc<dyn StorageEnv> = match p.when {
        When::After => {
            pl.crash_after(p.k, p.mode, p.lose_unsynced_entries, p.seed)
                .map_err(|e| e.to_string())?;
            Arc::new(pl.clone())
        }
        When::Before => {
            Arc::new(hooked(&pl, Some((p.k, p.mode, p.lose_unsynced_entries, p.seed))).0)
        }
    };
    let path = dir.path().join("s");
    let out = run_workload(env, &path, p.workload);
    if !pl.is_crashed() && p.workload.pool {
        return Ok(Recovered::Skipped);
    }
    if !pl.is_crashed() {
        return Err(format!(
            "the crash never fired (workload error: {:?})",
            out.error
        ));
    }
    let s = Storage::open(&path, recovery_opts())
        .map_err(|e| format!("reopen after the crash failed: {e}"))?;
    let got = content(&s)?;
    let recovered = if got == out.acked {
        Recovered::Acked
    } else if out.inflight.as_ref() == Some(&got) {
        Recovered::InFlight
    } else {
        let vs_inflight = out
            .inflight
            .as_ref()
            .map(|m| diff(m, &got))
            .unwrap_or_else(|| "none".into());
        return Err(format!(
            "recovered content is neither the last acknowledged commit ({}, after {} commits) nor the one in flight ({vs_inflight}); workload error: {:?}",
            diff(&out.acked, &got),
            out.commits,
            out.error
        ));
    };
    let report = s.check().map_err(|e| e.to_string())?;
    if !report.is_ok() {
        return Err(format!("check() after recovery: {:?}", report.problems));
    }
    // The recovered storage takes new commits and keeps them.
    let mut w = s.begin_write().map_err(|e| e.to_string())?;
    w.put(b"after-crash", b"ok").map_err(|e| e.to_string())?;
    w.commit()
        .map_err(|e| format!("commit after recovery: {e}"))?;
    drop(s);
    let s = Storage::open(&path, recovery_opts()).map_err(|e| format!("second reopen: {e}"))?;
    let mut want = got;
    want.insert(b"after-crash".to_vec(), b"ok".to_vec());
    let again = content(&s)?;
    if again != want {
        return Err(format!(
            "commit after recovery not kept: {}",
            diff(&want, &again)
        ));
    }
    Ok(recovered)
}

/// A directory for the many short-lived storages: tmpfs when there is one (the real `fdatasync`s
/// of the recovery opens are then free), else the default temporary directory.
fn scratch_base() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(d) = tempfile::Builder::new()
            .prefix("omnibus-crash")
            .tempdir_in(shm)
        {
            return d;
        }
    }
    tempfile::tempdir().unwrap()
}

#[test]
fn crash_at_every_durable_operation() {
    let start = Instant::now();
    let base = scratch_base();
    let mut points = Vec::new();
    let mut ops = Vec::new();
    for (wi, &w) in WORKLOADS.iter().enumerate() {
        let n = reference(base.path(), w);
        ops.push(n);
        for k in 1..=n {
            for (vi, when) in [When::After, When::Before].into_iter().enumerate() {
                // Both entry-loss settings at odd k, one (alternating) at even k.
                let loses: &[bool] = if k % 2 == 1 {
                    &[true, false]
                } else if k % 4 == 0 {
                    &[true]
                } else {
                    &[false]
                };
                for &lose_unsynced_entries in loses {
                    // Rotate the mode over the points so that every mode meets crash points of
                    // every kind (commits, flushes, rotations, open, close).
                    let mode =
                        MODES[(k as usize + wi + vi * 2 + lose_unsynced_entries as usize) % 4];
                    let seed = w.seed
                        ^ (k << 20)
                        ^ ((vi as u64) << 40)
                        ^ ((lose_unsynced_entries as u64) << 41);
                    points.push(Point {
                        workload: w,
                        k,
                        when,
                        mode,
                        lose_unsynced_entries,
                        seed,
                    });
                }
            }
        }
    }
    let next = AtomicUsize::new(0);
    let failures: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let tally: Mutex<BTreeMap<String, usize>> = Mutex::new(BTreeMap::new());
    let (acked, inflight, skipped) = (
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    );
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, 4);
    std::thread::scope(|sc| {
        for _ in 0..threads {
            sc.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(&p) = points.get(i) else { return };
                match run_point(base.path(), p) {
                    Ok(r) => {
                        match r {
                            Recovered::Acked => acked.fetch_add(1, Ordering::SeqCst),
                            Recovered::InFlight => inflight.fetch_add(1, Ordering::SeqCst),
                            Recovered::Skipped => {
                                skipped.fetch_add(1, Ordering::SeqCst);
                                continue;
                            }
                        };
                        let key = format!("{:?}/lose={}", p.mode, p.lose_unsynced_entries);
                        *tally.lock().unwrap().entry(key).or_default() += 1;
                    }
                    Err(e) => failures.lock().unwrap().push(format!("{p:?}: {e}")),
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    let tally = tally.into_inner().unwrap();
    let (acked, inflight, skipped) = (
        acked.into_inner(),
        inflight.into_inner(),
        skipped.into_inner(),
    );
    let tested = acked + inflight;
    println!(
        "durable operations per workload: {ops:?}; crash points tested: {tested} ({} recovered the last acknowledged commit, {} the commit in flight, {skipped} skipped) in {:.1?}; per mode: {tally:?}",
        acked,
        inflight,
        start.elapsed()
    );
    assert!(
        failures.is_empty(),
        "{} of {} crash points failed; first ones:\n{}",
        failures.len(),
        points.len(),
        failures
            .iter()
            .take(10)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(tested >= MIN_CRASH_POINTS, "only {tested} crash points");
    assert!(
        skipped * 10 <= points.len(),
        "{skipped} of {} crash points skipped",
        points.len()
    );
    assert_eq!(
        tally.len(),
        8,
        "every crash mode with and without losing unsynced entries: {tally:?}"
    );
    assert!(inflight > 0, "no crash point left the in-flight commit on disk: the crash points miss the window between a journal write and its sync");
    assert!(acked > 0);
}

// Regression (found by `crash_at_every_durable_operation`): journal replay did not drop older
// scratch images that start inside a newer multi-page run. A commit frees page q (a one-page
// node or free-space page written since the last flush), a later commit reuses q as the second
// page of a two-page overflow run starting at q-1; the normal commit path drops freed pages
// from the scratch table, but replay does not know what each commit freed, so after a crash
// the scratch table held both the run at q-1 and the stale image at q, and the first flush
// (which writes in page order) wrote the stale page over the run's second half: "page
// checksum mismatch" on the overflow value after recovery. Fixed in `recover` (src/storage.rs).
#[test]
fn replay_drops_stale_images_inside_a_newer_run() {
    let dir = tempfile::tempdir().unwrap();
    let pl = PowerLossEnv::new(default_env(), dir.path());
    let path = dir.path().join("s");
    let opts = Options {
        env: Arc::new(pl.clone()),
        flush_mode: FlushMode::Manual,
        ..Options::default()
    };
    let s = Storage::open(&path, opts).unwrap();
    let mut model = Model::new();
    for i in 0..60u32 {
        let mut w = s.begin_write().unwrap();
        if i % 3 == 0 {
            // A two-page overflow run, allocated first: from the pages the commits before freed.
            let k = format!("big-{}", i % 4).into_bytes();
            let v: Vec<u8> = (0..9000u32)
                .map(|j| (i as u8).wrapping_add(j as u8))
                .collect();
            w.put(&k, &v).unwrap();
            model.insert(k, v);
        }
        let k = format!("small-{}", i % 7).into_bytes();
        let v = format!("value-{i}").into_bytes();
        w.put(&k, &v).unwrap();
        model.insert(k, v);
        w.commit().unwrap();
    }
    // Power loss with nothing flushed since the storage was created: all is in the journal.
    pl.crash(CrashMode::DropUnsynced, true, 0).unwrap();
    drop(s);
    let s = Storage::open(&path, recovery_opts()).unwrap();
    let report = s.check().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    let got = content(&s).unwrap();
    assert!(got == model, "{}", diff(&model, &got));
}

// Regression (found by `crash_at_every_durable_operation`, a crash before the first durable
// operation): creating a storage writes header pages 0 and 1 and then syncs the data file. A
// power loss before that sync may keep any part of the two writes (page 0 only, a torn sector,
// ...), and the next open refused the directory for good ("data.pages is 8192 bytes, shorter
// than its two header pages", or "both header pages fail their checksum") although nothing had
// ever been committed. Open now recognises what only a crashed creation leaves (at most two
// pages, each slot zeros or an omnibus header page, even a damaged one, and no journal file) and
// creates the storage again; the same bytes next to a journal file are still an error.
#[test]
fn open_recreates_a_storage_whose_creation_crashed() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good");
    Storage::open(&good, recovery_opts())
        .unwrap()
        .close()
        .unwrap();
    let header = std::fs::read(good.join("data.pages")).unwrap()[..16384].to_vec();
    let journal = std::fs::read_dir(good.join("Journals"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    // Page 0 with a bad checksum (bytes 104.. of a header page are zeros, so a tear at a 4 KiB
    // or 512-byte sector leaves a whole page: damage inside the first sector is a bad checksum).
    let mut damaged = vec![0u8; 16384];
    damaged[..8192].copy_from_slice(&header[..8192]);
    damaged[60] ^= 0x40;
    let cases: [(&str, Vec<u8>); 5] = [
        ("first sector of page 0", header[..4096].to_vec()),
        ("page 0 only", header[..8192].to_vec()),
        ("page 0 and a sector of page 1", header[..12288].to_vec()),
        ("page 0 damaged, page 1 zeros", damaged.clone()),
        ("zeros", vec![0u8; 16384]),
    ];
    for (i, (what, bytes)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("crashed-{i}"));
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("data.pages"), bytes).unwrap();
        if i % 2 == 0 {
            std::fs::create_dir(path.join("Journals")).unwrap();
        }
        let s = Storage::open(&path, recovery_opts()).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(s.begin_read().unwrap().len(), 0, "{what}");
        let mut w = s.begin_write().unwrap();
        w.put(b"k", b"v").unwrap();
        w.commit().unwrap();
        drop(s);
        let s = Storage::open(&path, recovery_opts()).unwrap();
        assert_eq!(
            s.begin_read().unwrap().get(b"k").unwrap(),
            Some(&b"v"[..]),
            "{what}"
        );
        assert!(s.check().unwrap().is_ok(), "{what}");
    }
    // A journal file means the header pages were durable once: damage, not a crashed creation.
    let path = dir.path().join("damaged");
    std::fs::create_dir_all(path.join("Journals")).unwrap();
    std::fs::write(path.join("data.pages"), &damaged).unwrap();
    std::fs::copy(
        &journal,
        path.join("Journals").join(journal.file_name().unwrap()),
    )
    .unwrap();
    match Storage::open(&path, recovery_opts()) {
        Err(e) => assert!(e.is_corruption(), "{e}"),
        Ok(_) => panic!("a damaged header page next to a journal file opened"),
    }
}
