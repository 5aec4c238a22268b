//! Eventual commits under power loss: a seeded workload mixes `Durability::Eventual` and
//! `Durability::Immediate` commits (small and overflow values, deletes, explicit flushes, journal
//! rotations, a close and reopen) under a `PowerLossEnv` that crashes after, and just before,
//! every durable operation in turn, rotating the crash modes.
//!
//! After each crash the storage must reopen holding the state after some commit `i` of the commit
//! order (a prefix: never part of a transaction, never a later commit without an earlier one),
//! with `i` at least the last commit acknowledged as immediate or covered by a successful flush
//! (an immediate commit makes every eventual commit before it durable), and `check()` clean. At
//! least one crash point must lose acknowledged eventual commits: otherwise eventual commits
//! were not acknowledged before they were durable and the test would prove nothing.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use omnibus::env::testing::{CrashMode, HookedEnv, OpKind, PowerLossEnv};
use omnibus::env::{default_env, StorageEnv};
use omnibus::{Durability, FlushMode, Options, Prezero, Storage};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::common::model;
use model::{content, diff, Model};

const SEED: u64 = 0xD0_0AB1E;
const TXNS: usize = 40;

const MODES: [CrashMode; 4] = [
    CrashMode::DropUnsynced,
    CrashMode::KeepPrefix,
    CrashMode::KeepSubset,
    CrashMode::TornSectors,
];

fn opts(env: Arc<dyn StorageEnv>) -> Options {
    Options {
        env,
        flush_mode: FlushMode::Manual,
        journal_prezero: Prezero::Ahead(64 << 10),
        journal_file_size: 64 << 10,
        // Far beyond the test's run: eventual records wait for a later batch, a flush or the
        // close, so the durable operations are the same in every run.
        eventual_sync_ms: 60_000,
        ..Options::default()
    }
}

/// What the workload saw: the state after each commit started (index 0: empty), and the
/// index of the last state known durable when the crash came (an acknowledged immediate
/// commit, a successful flush or close).
#[derive(Default)]
struct Outcome {
    states: Vec<Model>,
    durable: usize,
    /// States whose commit returned `Ok`.
    acked: usize,
    error: Option<String>,
}

fn value(rng: &mut SmallRng) -> Vec<u8> {
    let len = match rng.random_range(0..100) {
        0..70 => rng.random_range(0..64),
        70..92 => rng.random_range(64..1500),
        _ => rng.random_range(2500..20_000),
    };
    let a: u8 = rng.random();
    (0..len).map(|i| a.wrapping_add(i as u8)).collect()
}

fn workload(env: Arc<dyn StorageEnv>, path: &Path, out: &mut Outcome) -> omnibus::Result<()> {
    let mut rng = SmallRng::seed_from_u64(SEED);
    out.states.push(Model::new());
    let mut s = Storage::open(path, opts(env.clone()))?;
    for t in 0..TXNS {
        if t == TXNS / 2 {
            s.close()?;
            out.durable = out.acked;
            s = Storage::open(path, opts(env.clone()))?;
        }
        let mut model = out.states[out.acked].clone();
        let mut w = s.begin_write()?;
        let immediate = rng.random_bool(0.25);
        if !immediate {
            w.set_durability(Durability::Eventual);
        }
        for _ in 0..rng.random_range(1..6) {
            if !model.is_empty() && rng.random_bool(0.25) {
                let i = rng.random_range(0..model.len());
                let k = model.keys().nth(i).cloned().expect("index in range");
                assert!(w.delete(&k)?, "delete of a present key");
                model.remove(&k);
            } else {
                let k = format!("key-{:04}", rng.random_range(0..300)).into_bytes();
                let v = value(&mut rng);
                w.put(&k, &v)?;
                model.insert(k, v);
            }
        }
        out.states.truncate(out.acked + 1);
        out.states.push(model);
        w.commit()?;
        out.acked += 1;
        if immediate {
            out.durable = out.acked;
        }
        if rng.random_bool(0.1) {
            s.flush()?;
            out.durable = out.acked;
        }
    }
    s.close()?;
    out.durable = out.acked;
    Ok(())
}

fn run(env: Arc<dyn StorageEnv>, path: &Path) -> Outcome {
    let mut out = Outcome::default();
    if let Err(e) = workload(env, path, &mut out) {
        out.error = Some(e.to_string());
    }
    out
}

/// An env over `pl` counting durable operations and, with `crash_before`, crashing `pl` just
/// before the k-th is issued.
fn hooked(pl: &PowerLossEnv, crash_before: Option<(u64, CrashMode, u64)>) -> Arc<HookedEnv> {
    let h = HookedEnv::new(Arc::new(pl.clone()));
    let n = Arc::new(AtomicU64::new(0));
    let pl2 = pl.clone();
    h.set_hook(Box::new(move |op| {
        if matches!(op.kind, OpKind::SyncData | OpKind::SyncDir) {
            let k = n.fetch_add(1, Ordering::SeqCst) + 1;
            if let Some((at, mode, seed)) = crash_before {
                if k == at {
                    pl2.crash(mode, false, seed)
                        .expect("writing out the crash state");
                }
            }
        }
        None
    }));
    Arc::new(h)
}

/// The index of the recovered state: the first state at or after `out.durable` it equals.
fn check_point(
    base: &Path,
    k: u64,
    before: bool,
    mode: CrashMode,
) -> Result<(usize, usize), String> {
    let dir = tempfile::tempdir_in(base).map_err(|e| e.to_string())?;
    let pl = PowerLossEnv::new(default_env(), dir.path());
    let seed = k * 2 + before as u64;
    let env: Arc<dyn StorageEnv> = if before {
        hooked(&pl, Some((k, mode, seed)))
    } else {
        pl.crash_after(k, mode, false, seed)
            .map_err(|e| e.to_string())?;
        Arc::new(pl.clone())
    };
    let path = dir.path().join("s");
    let out = run(env, &path);
    if !pl.is_crashed() {
        return Err(format!(
            "the crash never fired (workload error {:?})",
            out.error
        ));
    }
    let s = Storage::open(&path, opts(default_env()))
        .map_err(|e| format!("reopen after the crash failed: {e}"))?;
    let got = content(&s)?;
    let Some(i) = (out.durable..out.states.len()).find(|&i| out.states[i] == got) else {
        return Err(format!(
            "recovered state is no commit at or after the last durable one ({} of {} states, {} acknowledged): vs durable {}; vs last {}",
            out.durable,
            out.states.len(),
            out.acked,
            diff(&out.states[out.durable], &got),
            diff(out.states.last().expect("the empty state"), &got),
        ));
    };
    let report = s.check().map_err(|e| e.to_string())?;
    if !report.is_ok() {
        return Err(format!("check() after recovery: {:?}", report.problems));
    }
    Ok((i, out.acked))
}

#[test]
fn a_crash_keeps_a_prefix_with_every_immediate_commit() {
    let base = tempfile::tempdir().unwrap();
    // The reference run: its durable operations are the crash points.
    let dir = tempfile::tempdir_in(base.path()).unwrap();
    let pl = PowerLossEnv::new(default_env(), dir.path());
    let path = dir.path().join("s");
    let out = run(Arc::new(pl.clone()), &path);
    assert_eq!(out.error, None, "the workload fails without a crash");
    assert_eq!(out.acked, TXNS);
    let n = pl.durable_ops();
    {
        let s = Storage::open(&path, opts(default_env())).unwrap();
        let got = content(&s).unwrap();
        assert!(
            got == out.states[TXNS],
            "clean run: {}",
            diff(&out.states[TXNS], &got)
        );
        let stats = s.stats();
        assert!(
            stats.journal.eventual_commits == 0,
            "a fresh open has queued nothing"
        );
    }
    let mut failures = Vec::new();
    let mut lost_eventual = 0;
    for k in 1..=n {
        for before in [false, true] {
            let mode = MODES[(k as usize * 2 + before as usize) % MODES.len()];
            match check_point(base.path(), k, before, mode) {
                Ok((i, acked)) => {
                    if i < acked {
                        lost_eventual += 1;
                    }
                }
                Err(e) => failures.push(format!("k={k} before={before} {mode:?}: {e}")),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} crash points failed:\n{}",
        failures.len(),
        2 * n,
        failures.join("\n")
    );
    assert!(
        lost_eventual > 0,
        "no crash point lost an acknowledged eventual commit: they were durable when acknowledged"
    );
}
