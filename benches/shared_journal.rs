//! Shared vs separate journals, side by side in one run: 1 root + 100 branch storages, 64 writer
//! threads each committing one small put (16-byte key, 100-byte value) to a random storage,
//! for a fixed time per mode. Prints commits/s, commit latency p50/p99/p99.9/max, fdatasyncs per
//! commit and directory fsyncs per second, with the ratios; then a single writer's commit p50
//! with the pre-zeroed tail (4 MiB ahead, whole pre-zeroed files) vs plain appends.
//!
//! Last, the journal's I/O paths (`Options::journal_io`): io_uring's critical lane vs
//! `pwritev` + `fdatasync` on the writer's thread, at 1 and T writers: commits/s, p50, p99 and
//! process CPU per commit. (The first runs use the default, `JournalIo::Auto`.)
//!
//! `cargo bench --bench shared_journal -- [--seconds S] [--branches N] [--threads T] [--dir D]`
//! (`OMNIBUS_BENCH_QUICK=1`: 2 s per mode, 20 branches, 16 threads).

#[path = "common/mod.rs"]
mod common;
use common::cpu_now;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use omnibus::{Database, JournalIo, JournalMode, Options, Prezero, Storage};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

struct Args {
    seconds: f64,
    branches: usize,
    threads: usize,
    dir: PathBuf,
}

fn args() -> Args {
    let quick = std::env::var("OMNIBUS_BENCH_QUICK").is_ok();
    let mut a = Args {
        seconds: if quick { 2.0 } else { 10.0 },
        branches: if quick { 20 } else { 100 },
        threads: if quick { 16 } else { 64 },
        dir: PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("target")
            .join("bench-tmp"),
    };
    let v: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < v.len() {
        let next = v.get(i + 1).cloned().unwrap_or_default();
        match v[i].as_str() {
            "--seconds" => a.seconds = next.parse().expect("--seconds"),
            "--branches" => a.branches = next.parse().expect("--branches"),
            "--threads" => a.threads = next.parse().expect("--threads"),
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

struct Run {
    commits: u64,
    secs: f64,
    hist: Histogram<u64>,
    fdatasyncs: u64,
    dir_fsyncs: u64,
    batches: u64,
    cpu: Duration,
}

fn run_mode(a: &Args, mode: JournalMode) -> Run {
    run_with(a, mode, JournalIo::Auto, a.threads)
}

fn run_with(a: &Args, mode: JournalMode, journal_io: JournalIo, threads: usize) -> Run {
    std::fs::create_dir_all(&a.dir).unwrap();
    let tmp = tempfile::tempdir_in(&a.dir).unwrap();
    let opts = Options {
        journal_mode: mode,
        journal_io,
        ..Options::default()
    };
    let db = Database::open(tmp.path().join("db"), opts).unwrap();
    let mut storages = vec![db.root()];
    for i in 0..a.branches {
        storages.push(db.create_storage(&format!("Users_By_{i:03}")).unwrap());
    }
    let before = db.stats();
    let stop = Arc::new(AtomicBool::new(false));
    let storages = Arc::new(storages);
    let start = Instant::now();
    let cpu0 = cpu_now();
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let (stop, storages) = (stop.clone(), storages.clone());
            std::thread::spawn(move || {
                let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
                let mut rng = SmallRng::seed_from_u64(t as u64);
                let mut n = 0u64;
                let value = [0x5au8; 100];
                while !stop.load(Ordering::Relaxed) {
                    let s = &storages[rng.random_range(0..storages.len())];
                    let key: [u8; 16] = rng.random();
                    let t0 = Instant::now();
                    let mut w = s.begin_write().unwrap();
                    w.put(key, value).unwrap();
                    w.commit().unwrap();
                    h.saturating_record(t0.elapsed().as_micros() as u64);
                    n += 1;
                }
                (n, h)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(a.seconds));
    stop.store(true, Ordering::Relaxed);
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
    let mut commits = 0;
    for h in hs {
        let (n, th) = h.join().unwrap();
        commits += n;
        hist.add(th).unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu_now() - cpu0;
    let after = db.stats();
    drop(storages);
    db.close().unwrap();
    Run {
        commits,
        secs,
        hist,
        fdatasyncs: after.journal_fdatasyncs - before.journal_fdatasyncs,
        dir_fsyncs: after.dir_fsyncs - before.dir_fsyncs,
        batches: after.batches - before.batches,
        cpu,
    }
}

/// The journal's I/O paths side by side ([`JournalIo`]): io_uring's critical lane (one linked
/// WRITEV + FSYNC(DATASYNC) per batch) vs `pwritev` + `fdatasync` on the writer's thread,
/// shared mode, at 1 and at `a.threads` writers, each pair alternated twice.
fn io_paths(a: &Args) {
    println!();
    println!(
        "journal I/O path, shared mode ({:.0} s per run, each pair twice):",
        a.seconds / 2.0
    );
    println!(
        "{:<8} {:>8} {:>11} {:>9} {:>9} {:>14}",
        "path", "writers", "commits/s", "p50 µs", "p99 µs", "CPU µs/commit"
    );
    let short = Args {
        seconds: a.seconds / 2.0,
        branches: a.branches,
        threads: a.threads,
        dir: a.dir.clone(),
    };
    for threads in [1, a.threads] {
        let mut sum = [(0f64, 0f64, 0f64, 0f64); 2];
        for _ in 0..2 {
            for (i, path) in [JournalIo::Ring, JournalIo::Syscalls]
                .into_iter()
                .enumerate()
            {
                let r = run_with(&short, JournalMode::Shared, path, threads);
                let row = (
                    r.commits as f64 / r.secs,
                    r.hist.value_at_quantile(0.5) as f64,
                    r.hist.value_at_quantile(0.99) as f64,
                    r.cpu.as_secs_f64() * 1e6 / r.commits.max(1) as f64,
                );
                println!(
                    "{:<8} {:>8} {:>11.0} {:>9.0} {:>9.0} {:>14.1}",
                    ["ring", "syscalls"][i],
                    threads,
                    row.0,
                    row.1,
                    row.2,
                    row.3
                );
                sum[i].0 += row.0;
                sum[i].1 += row.1;
                sum[i].2 += row.2;
                sum[i].3 += row.3;
            }
        }
        println!(
            "ratio ring/syscalls at {threads} writers: commits/s {:.2}x, p50 {:.2}x, p99 {:.2}x, CPU/commit {:.2}x",
            sum[0].0 / sum[1].0,
            sum[0].1 / sum[1].1.max(1.0),
            sum[0].2 / sum[1].2.max(1.0),
            sum[0].3 / sum[1].3.max(1e-9),
        );
    }
}

fn single_writer_p50(a: &Args, prezero: Prezero, pool: usize) -> (f64, f64) {
    std::fs::create_dir_all(&a.dir).unwrap();
    let tmp = tempfile::tempdir_in(&a.dir).unwrap();
    let opts = Options {
        journal_prezero: prezero,
        journal_pool_files: pool,
        journal_file_size: 64 << 20,
        ..Options::default()
    };
    let s = Storage::open(tmp.path().join("s"), opts).unwrap();
    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
    let n = if std::env::var("OMNIBUS_BENCH_QUICK").is_ok() {
        300
    } else {
        3000
    };
    let start = Instant::now();
    for i in 0..n as u64 {
        let t0 = Instant::now();
        let mut w = s.begin_write().unwrap();
        w.put(i.to_be_bytes(), [1u8; 100]).unwrap();
        w.commit().unwrap();
        h.saturating_record(t0.elapsed().as_micros() as u64);
    }
    (
        h.value_at_quantile(0.5) as f64,
        n as f64 / start.elapsed().as_secs_f64(),
    )
}

fn main() {
    let a = args();
    println!(
        "shared_journal bench: 1 root + {} branches, {} writer threads, {:.0} s per mode, dir {}",
        a.branches,
        a.threads,
        a.seconds,
        a.dir.display()
    );
    let shared = run_mode(&a, JournalMode::Shared);
    let separate = run_mode(&a, JournalMode::Separate);
    let row = |name: &str, r: &Run| {
        println!(
            "{name:<9} {:>11.0} {:>9} {:>9} {:>9} {:>9} {:>11.3} {:>10.1} {:>12.1}",
            r.commits as f64 / r.secs,
            r.hist.value_at_quantile(0.5),
            r.hist.value_at_quantile(0.99),
            r.hist.value_at_quantile(0.999),
            r.hist.max(),
            r.fdatasyncs as f64 / r.commits.max(1) as f64,
            r.dir_fsyncs as f64 / r.secs,
            r.commits as f64 / r.batches.max(1) as f64,
        )
    };
    println!(
        "{:<9} {:>11} {:>9} {:>9} {:>9} {:>9} {:>11} {:>10} {:>12}",
        "mode",
        "commits/s",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "max µs",
        "fsync/commit",
        "dirfsync/s",
        "commits/batch"
    );
    row("shared", &shared);
    row("separate", &separate);
    let rate = |r: &Run| r.commits as f64 / r.secs;
    println!(
        "ratio shared/separate: commits/s {:.2}x, p99 {:.2}x lower, p99.9 {:.2}x lower",
        rate(&shared) / rate(&separate),
        separate.hist.value_at_quantile(0.99) as f64
            / shared.hist.value_at_quantile(0.99).max(1) as f64,
        separate.hist.value_at_quantile(0.999) as f64
            / shared.hist.value_at_quantile(0.999).max(1) as f64,
    );
    let (ahead, ahead_rate) = single_writer_p50(&a, Prezero::Ahead(4 << 20), 0);
    let (whole, whole_rate) = single_writer_p50(&a, Prezero::WholeFile, 1);
    let (append, append_rate) = single_writer_p50(&a, Prezero::Off, 0);
    println!("single writer commit p50: pre-zeroed 4 MiB ahead {ahead:.0} µs ({ahead_rate:.0}/s), whole pre-zeroed files {whole:.0} µs ({whole_rate:.0}/s), plain appends {append:.0} µs ({append_rate:.0}/s)");
    println!(
        "ratio append/ahead p50: {:.2}x, append/whole p50: {:.2}x",
        append / ahead.max(1.0),
        append / whole.max(1.0)
    );
    io_paths(&a);
}
