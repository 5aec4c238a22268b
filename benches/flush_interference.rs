//! Commits while a large flush runs vs idle, side by side in one run: a storage is loaded with
//! `--keys N` random keys (default 1,000,000; 16-byte keys, 100-byte values) and not flushed;
//! then serial synced one-put commits are timed (a) while `Storage::flush` writes those pages
//! from another thread, and (b) right after, idle. Each phase twice (a fresh load each time).
//! Prints p50/p99 and commits/s for both, the ratio (target: during >= 0.9x idle), the flush's
//! duration and MiB/s, and process CPU per commit in each phase.
//!
//! `cargo bench --bench flush_interference -- [--keys N] [--dir D]`

#[path = "common/mod.rs"]
mod common;
use common::cpu_now;
use common::splitmix;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use hdrhistogram::Histogram;
use omnibus::{FlushMode, Options, Storage};

struct Phase {
    hist: Histogram<u64>,
    commits: u64,
    secs: f64,
    cpu: f64,
}

impl Phase {
    fn new() -> Phase {
        Phase {
            hist: Histogram::new_with_bounds(1, 60_000_000, 3).unwrap(),
            commits: 0,
            secs: 0.0,
            cpu: 0.0,
        }
    }
}

/// Serial one-put commits until `stop` (or `max` commits), recorded into `p`.
fn commit_until(s: &Storage, next: &mut u64, p: &mut Phase, stop: &AtomicBool, max: u64) {
    let (t0, c0) = (Instant::now(), cpu_now());
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) && n < max {
        let t = Instant::now();
        let mut w = s.begin_write().unwrap();
        w.put(splitmix(*next).to_be_bytes(), [1u8; 100]).unwrap();
        w.commit().unwrap();
        p.hist.saturating_record(t.elapsed().as_micros() as u64);
        *next += 1;
        n += 1;
    }
    p.commits += n;
    p.secs += t0.elapsed().as_secs_f64();
    p.cpu += (cpu_now() - c0).as_secs_f64();
}

fn main() {
    let mut keys = 1_000_000u64;
    let mut dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("bench-tmp");
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let next = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--keys" => keys = next.parse().expect("--keys"),
            "--dir" => dir = PathBuf::from(next),
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    if std::env::var("OMNIBUS_BENCH_QUICK").is_ok() {
        keys = keys.min(200_000);
    }
    std::fs::create_dir_all(&dir).unwrap();
    println!(
        "flush_interference bench: {keys} keys loaded unflushed, then serial one-put commits during the flush vs idle; I/O path: {}",
        omnibus::env::io_backend().reason
    );
    let mut during = Phase::new();
    let mut idle = Phase::new();
    let mut flush_secs = 0.0;
    let mut flush_mib = 0.0;
    for round in 0..2u64 {
        let tmp = tempfile::tempdir_in(&dir).unwrap();
        let s = Arc::new(
            Storage::open(
                tmp.path().join("s"),
                Options {
                    flush_mode: FlushMode::Manual,
                    flush_on_close: false,
                    ..Options::default()
                },
            )
            .unwrap(),
        );
        for t in (0..keys).step_by(20_000) {
            let mut w = s.begin_write().unwrap();
            for k in t..(t + 20_000).min(keys) {
                w.put(splitmix(k ^ (round << 40)).to_be_bytes(), [0x5a; 100])
                    .unwrap();
            }
            w.commit().unwrap();
        }
        let mut next = 1u64 << 50;
        // Warm the commit path.
        commit_until(
            &s,
            &mut next,
            &mut Phase::new(),
            &AtomicBool::new(false),
            200,
        );
        let done = Arc::new(AtomicBool::new(false));
        let before = s.stats().pages_flushed;
        let flusher = {
            let (s, done) = (s.clone(), done.clone());
            std::thread::spawn(move || {
                let t = Instant::now();
                s.flush().unwrap();
                done.store(true, Ordering::Relaxed);
                t.elapsed().as_secs_f64()
            })
        };
        commit_until(&s, &mut next, &mut during, &done, u64::MAX);
        flush_secs += flusher.join().unwrap();
        flush_mib += (s.stats().pages_flushed - before) as f64 * 8192.0 / (1 << 20) as f64;
        let n = during.commits.max(500) / 2;
        commit_until(&s, &mut next, &mut idle, &AtomicBool::new(false), n);
    }
    println!(
        "{:<8} {:>9} {:>9} {:>9} {:>11} {:>14}",
        "phase", "commits", "p50 µs", "p99 µs", "commits/s", "CPU µs/commit"
    );
    for (name, p) in [("during", &during), ("idle", &idle)] {
        println!(
            "{:<8} {:>9} {:>9} {:>9} {:>11.0} {:>14.1}",
            name,
            p.commits,
            p.hist.value_at_quantile(0.5),
            p.hist.value_at_quantile(0.99),
            p.commits as f64 / p.secs,
            p.cpu * 1e6 / p.commits.max(1) as f64
        );
    }
    println!(
        "flush: {flush_mib:.0} MiB in {flush_secs:.2} s ({:.0} MiB/s)",
        flush_mib / flush_secs
    );
    let rate = |p: &Phase| p.commits as f64 / p.secs;
    println!(
        "ratio during/idle: commits/s {:.2}x (target >= 0.9), p50 {:.2}x, p99 {:.2}x",
        rate(&during) / rate(&idle),
        during.hist.value_at_quantile(0.5) as f64 / idle.hist.value_at_quantile(0.5).max(1) as f64,
        during.hist.value_at_quantile(0.99) as f64
            / idle.hist.value_at_quantile(0.99).max(1) as f64,
    );
}
