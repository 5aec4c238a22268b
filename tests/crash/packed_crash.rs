//! Power-loss crash suite over values of 2 to 8 KiB (packed into value page runs, several to a
//! run, runs copied at every put and shared by the cells of one leaf): puts, overwrites,
//! deletes, range deletes, flushes and compaction, with a close and reopen half way. The
//! simulated disk is snapshotted just before and right after every durable operation; each
//! snapshot is a crash point in every crash mode, with and without losing unsynced directory
//! entries. Every distinct state must reopen to the last acknowledged commit or the one in
//! flight (never part of one), with `check()` clean.

use std::path::Path;
use std::sync::{Arc, Mutex};

use omnibus::env::StorageEnv;
use omnibus::{FlushMode, Options, Prezero, Storage};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::common::model::{content, diff, Model};
use crate::common::points::{scratch_base, verify_snaps, Recording, Tally};

/// Write transactions in the workload (closed and reopened half way).
const TXNS: usize = 60;

#[derive(Default)]
struct Outcome {
    acked: Arc<Model>,
    inflight: Option<Arc<Model>>,
    error: Option<String>,
}

struct Expect {
    acked: Arc<Model>,
    inflight: Option<Arc<Model>>,
}

fn opts(env: Arc<dyn StorageEnv>) -> Options {
    Options {
        env,
        flush_mode: FlushMode::Manual,
        journal_prezero: Prezero::Ahead(16 << 10),
        journal_file_size: 256 << 10,
        ..Options::default()
    }
}

fn value(rng: &mut SmallRng) -> Vec<u8> {
    let len = rng.random_range(2048..=8192);
    let a: u8 = rng.random();
    (0..len).map(|i| a.wrapping_add((i % 251) as u8)).collect()
}

fn commit(w: omnibus::WriteTransaction, model: Model, out: &Mutex<Outcome>) -> omnibus::Result<()> {
    let model = Arc::new(model);
    out.lock().unwrap().inflight = Some(model.clone());
    w.commit()?;
    let mut o = out.lock().unwrap();
    o.acked = model;
    o.inflight = None;
    Ok(())
}

fn workload(env: Arc<dyn StorageEnv>, path: &Path, out: &Mutex<Outcome>) -> omnibus::Result<()> {
    let mut rng = SmallRng::seed_from_u64(0x9ac_4ed);
    let mut s = Storage::open(path, opts(env.clone()))?;
    for t in 0..TXNS {
        if t == TXNS / 2 {
            s.close()?;
            s = Storage::open(path, opts(env.clone()))?;
        }
        let mut model = (*out.lock().unwrap().acked).clone();
        let mut w = s.begin_write()?;
        let ops = if t < 3 { 40 } else { rng.random_range(1..6) };
        for _ in 0..ops {
            let at = rng.random_range(0..120);
            let k = format!("key-{at:04}").into_bytes();
            match rng.random_range(0..20) {
                0..=14 => {
                    let v = value(&mut rng);
                    w.put(&k, &v)?;
                    model.insert(k, v);
                }
                15..=18 => {
                    assert_eq!(w.delete(&k)?, model.remove(&k).is_some());
                }
                _ => {
                    let end = format!("key-{:04}", at + rng.random_range(1..6)).into_bytes();
                    let (a, b) = (k, end);
                    w.delete_range(a.as_slice()..b.as_slice())?;
                    let gone: Vec<_> = model.range(a..b).map(|e| e.0.clone()).collect();
                    for g in gone {
                        model.remove(&g);
                    }
                }
            }
        }
        commit(w, model, out)?;
        match t % 7 {
            3 => {
                s.flush()?;
            }
            5 => {
                s.compact()?;
            }
            _ => {}
        }
    }
    s.close()
}

fn verify(dir: &Path, expects: &[&Expect], _index: usize) -> Result<bool, String> {
    let s = Storage::open(dir.join("s"), Options::default())
        .map_err(|e| format!("reopen after the crash failed: {e}"))?;
    let got = content(&s)?;
    let mut inflight = false;
    for e in expects {
        if got == *e.acked {
        } else if e.inflight.as_deref() == Some(&got) {
            inflight = true;
        } else {
            return Err(format!(
                "recovered content is neither the last acknowledged commit ({}) nor the one in flight",
                diff(&e.acked, &got)
            ));
        }
    }
    let report = s.check().map_err(|e| e.to_string())?;
    if !report.is_ok() {
        return Err(format!("check() after recovery: {:?}", report.problems));
    }
    Ok(inflight)
}

#[test]
fn mid_size_values_survive_a_crash_at_every_durable_operation() {
    let base = scratch_base("omnibus-packed-crash");
    let dir = tempfile::tempdir_in(base.path()).unwrap();
    let rec = Recording::new(dir.path());
    let out = Arc::new(Mutex::new(Outcome::default()));
    let o = out.clone();
    let snaps = rec.record(move || {
        let o = o.lock().unwrap();
        Expect {
            acked: o.acked.clone(),
            inflight: o.inflight.clone(),
        }
    });
    let path = dir.path().join("s");
    if let Err(e) = workload(rec.env.clone(), &path, &out) {
        out.lock().unwrap().error = Some(e.to_string());
    }
    rec.stop();
    let o = out.lock().unwrap();
    assert_eq!(o.error, None, "the workload fails without a crash");
    let s = Storage::open(&path, Options::default()).unwrap();
    let got = content(&s).unwrap();
    assert!(got == *o.acked, "clean run: {}", diff(&o.acked, &got));
    assert!(
        o.acked.len() > 30,
        "the workload keeps {} keys",
        o.acked.len()
    );
    let report = s.check().unwrap();
    assert!(
        report.is_ok(),
        "check after the clean run: {:?}",
        report.problems
    );
    drop(s);
    let snaps = std::mem::take(&mut *snaps.lock().unwrap());
    let mut tally = Tally::default();
    tally.add(verify_snaps(base.path(), 0x9ac_4ed, &snaps, 1, verify));
    println!(
        "crash points: {} leaving {} distinct states ({} recovered the commit in flight)",
        tally.points, tally.states, tally.inflight
    );
    tally.assert_clean(400, &["journal batch", "data file sync (flush)"]);
}
