//! Group transactions against single-storage commits, side by side in one run: a database of a
//! root and 20 branches (each preloaded with 20,000 keys), one writer thread. For k storages
//! (the root and k - 1 branches) one *round* writes one put (16-byte key, 100-byte value) into
//! each of them, either as one group transaction (`Database::begin_group`, one commit) or as k
//! single-storage commits one after another. Prints, per k, process CPU per round (user +
//! system, `getrusage`), wall time per round, the commits' `fdatasync`s per round (journal
//! batches: one write and one sync each), every journal `fdatasync` per round (with those of
//! journal rotations) and journal bytes per round of both ways, and the ratio group / singles. The two ways alternate in blocks of rounds
//! (`--blocks` pairs), so load changes on the machine hit both alike.
//!
//! `cargo bench --bench groups -- [--rounds N] [--blocks B] [--ks 2,4,8,21] [--dir D]`
//! (`OMNIBUS_BENCH_QUICK=1`: 200 rounds, 2 blocks).

#[path = "common/mod.rs"]
mod common;
use common::{cpu_now, key, value};

use std::path::PathBuf;
use std::time::{Duration, Instant};

use omnibus::{Database, FlushMode, Options, Storage};

const BRANCHES: usize = 20;
const PRELOAD: u64 = 20_000;

struct Args {
    rounds: u64,
    blocks: u64,
    ks: Vec<usize>,
    dir: PathBuf,
}

fn args() -> Args {
    let quick = std::env::var("OMNIBUS_BENCH_QUICK").is_ok();
    let mut a = Args {
        rounds: if quick { 200 } else { 1000 },
        blocks: if quick { 2 } else { 4 },
        ks: vec![2, 4, 8, 21],
        dir: PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("target")
            .join("bench-tmp"),
    };
    let v: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < v.len() {
        let next = v.get(i + 1).cloned().unwrap_or_default();
        match v[i].as_str() {
            "--rounds" => a.rounds = next.parse().expect("--rounds"),
            "--blocks" => a.blocks = next.parse().expect("--blocks"),
            "--ks" => {
                a.ks = next
                    .split(',')
                    .map(|k| k.parse().expect("--ks"))
                    .filter(|&k| (1..=BRANCHES + 1).contains(&k))
                    .collect()
            }
            "--dir" => a.dir = PathBuf::from(next),
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    a
}

#[derive(Default, Clone, Copy)]
struct Tally {
    rounds: u64,
    cpu: Duration,
    wall: Duration,
    /// Journal batches: one write and one `fdatasync` each (the commit's own).
    batches: u64,
    /// Every `fdatasync` of the journal, rotations' (a new file's zeros, its start record) and
    /// zeroing's too.
    syncs: u64,
    bytes: u64,
}

impl Tally {
    fn per_round(&self, d: Duration) -> f64 {
        d.as_secs_f64() * 1e6 / self.rounds.max(1) as f64
    }
}

/// Runs `rounds` rounds over `ss` one way, from key number `next` on; adds to `t`.
fn run(db: &Database, ss: &[&Storage], group: bool, rounds: u64, next: &mut u64, t: &mut Tally) {
    let before = db.stats();
    let (c0, w0) = (cpu_now(), Instant::now());
    for _ in 0..rounds {
        let n = *next;
        *next += 1;
        if group {
            let mut g = db.begin_group(ss).expect("begin_group");
            for s in ss {
                g.put(s, key(n), value(n)).expect("put");
            }
            g.commit().expect("group commit");
        } else {
            for s in ss {
                let mut w = s.begin_write().expect("begin_write");
                w.put(key(n), value(n)).expect("put");
                w.commit().expect("commit");
            }
        }
    }
    t.cpu += cpu_now() - c0;
    t.wall += w0.elapsed();
    let after = db.stats();
    t.rounds += rounds;
    t.batches += after.batches - before.batches;
    t.syncs += after.journal_fdatasyncs - before.journal_fdatasyncs;
    t.bytes += after.journal_bytes - before.journal_bytes;
}

fn main() {
    let a = args();
    let path = a.dir.join("groups");
    let _ = std::fs::remove_dir_all(&path);
    std::fs::create_dir_all(&a.dir).expect("bench dir");
    let opts = Options {
        // Flushes between blocks only: both ways pay the same ones.
        flush_mode: FlushMode::Manual,
        ..Options::default()
    };
    let db = Database::open(&path, opts).expect("open");
    let mut ss = vec![db.root()];
    for b in 0..BRANCHES {
        ss.push(db.create_storage(&format!("b{b:02}")).expect("branch"));
    }
    for s in &ss {
        let mut w = s.begin_write().expect("preload");
        for i in 0..PRELOAD {
            w.put(key(1 << 40 | i), value(i)).expect("preload put");
        }
        w.commit().expect("preload commit");
    }
    db.flush().expect("flush");
    println!(
        "groups bench: root + {BRANCHES} branches, {PRELOAD} keys each; one writer; {} rounds x {} blocks per way and k; journal I/O {}",
        a.rounds,
        a.blocks,
        db.root().journal_io().0.name()
    );
    println!(
        "\n| k | way | CPU µs/round | wall µs/round | batch fdatasyncs/round | all journal fdatasyncs/round | journal bytes/round |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut next = 0u64;
    let mut summary = Vec::new();
    for &k in &a.ks {
        let members: Vec<&Storage> = ss.iter().take(k).collect();
        let (mut g, mut s) = (Tally::default(), Tally::default());
        for b in 0..a.blocks {
            // Alternate which way goes first.
            let order = if b % 2 == 0 {
                [true, false]
            } else {
                [false, true]
            };
            for way in order {
                let t = if way { &mut g } else { &mut s };
                run(&db, &members, way, a.rounds, &mut next, t);
                db.flush().expect("flush");
            }
        }
        for (name, t) in [("group", &g), (&*format!("{k} singles"), &s)] {
            println!(
                "| {k} | {name} | {:.1} | {:.1} | {:.2} | {:.2} | {:.0} |",
                t.per_round(t.cpu),
                t.per_round(t.wall),
                t.batches as f64 / t.rounds as f64,
                t.syncs as f64 / t.rounds as f64,
                t.bytes as f64 / t.rounds as f64
            );
        }
        let ratio = g.cpu.as_secs_f64() / s.cpu.as_secs_f64();
        println!(
            "| {k} | **group / singles** | **{ratio:.2}x** | {:.2}x | {:.2}x | {:.2}x | {:.2}x |",
            g.wall.as_secs_f64() / s.wall.as_secs_f64(),
            g.batches as f64 / s.batches.max(1) as f64,
            g.syncs as f64 / s.syncs.max(1) as f64,
            g.bytes as f64 / s.bytes.max(1) as f64
        );
        summary.push((k, ratio, g.batches as f64 / g.rounds as f64));
    }
    println!();
    for (k, ratio, syncs) in summary {
        println!(
            "k = {k}: group CPU {ratio:.2}x of {k} single commits (target <= 1.2x: {}); {syncs:.2} batch fdatasyncs per group (target 1: {})",
            if ratio <= 1.2 { "met" } else { "NOT met" },
            if (syncs - 1.0).abs() < 1e-9 { "met" } else { "NOT met" }
        );
    }
    drop(ss);
    db.close().expect("close");
    let _ = std::fs::remove_dir_all(&path);
}
