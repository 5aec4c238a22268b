//! Flush write modes side by side: for each directory (default: `target/bench-tmp`, and
//! `/dev/shm` when it exists; more with `--dir D`, e.g. an XFS loop mount), each mode
//! (`mmap`, `file_io`, `vectored_file_io`, `io_ring`) flushes the same freshly loaded storage
//! (`--keys N` random 16-byte keys with 100-byte values, default 300,000, about 60 MiB of
//! pages): GiB/s of the flush (write + fdatasync + header) and process CPU-seconds per GiB, each
//! mode run `--rounds R` times (default 3) interleaved, the median reported; then the mode
//! `Auto` picks there and how far it is from the best.
//!
//! `cargo bench --bench write_modes -- [--keys N] [--rounds R] [--dir D]...`

#[path = "common/mod.rs"]
mod common;
use common::cpu_now;
use common::splitmix;
use std::path::PathBuf;
use std::time::Instant;

use omnibus::{FlushMode, Options, Storage, WriteMode};

/// One flush of `keys` freshly committed keys in `dir` with `mode`: (GiB/s, CPU-s per GiB).
fn flush_once(dir: &PathBuf, mode: WriteMode, keys: u64) -> (f64, f64) {
    let tmp = tempfile::tempdir_in(dir).unwrap();
    let s = Storage::open(
        tmp.path().join("s"),
        Options {
            write_mode: mode,
            flush_mode: FlushMode::Manual,
            flush_on_close: false,
            ..Options::default()
        },
    )
    .unwrap();
    for t in (0..keys).step_by(10_000) {
        let mut w = s.begin_write().unwrap();
        for i in t..(t + 10_000).min(keys) {
            w.put(splitmix(i).to_be_bytes(), [0x5a; 100]).unwrap();
        }
        w.commit().unwrap();
    }
    let before = s.stats().pages_flushed;
    let (t0, c0) = (Instant::now(), cpu_now());
    s.flush().unwrap();
    let (wall, cpu) = (t0.elapsed().as_secs_f64(), (cpu_now() - c0).as_secs_f64());
    let gib = (s.stats().pages_flushed - before) as f64 * 8192.0 / (1u64 << 30) as f64;
    (gib / wall, cpu / gib)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let mut keys = 300_000u64;
    let mut rounds = 3usize;
    let mut dirs: Vec<PathBuf> = Vec::new();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let next = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--keys" => keys = next.parse().expect("--keys"),
            "--rounds" => rounds = next.parse().expect("--rounds"),
            "--dir" => dirs.push(PathBuf::from(next)),
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    if std::env::var("OMNIBUS_BENCH_QUICK").is_ok() {
        keys = keys.min(50_000);
        rounds = 1;
    }
    if dirs.is_empty() {
        let d = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("target")
            .join("bench-tmp");
        std::fs::create_dir_all(&d).unwrap();
        dirs.push(d);
        if std::path::Path::new("/dev/shm").is_dir() {
            dirs.push(PathBuf::from("/dev/shm"));
        }
    }
    println!(
        "write_modes bench: {keys} keys per flush, {rounds} rounds, I/O path: {}",
        omnibus::env::io_backend().reason
    );
    for dir in &dirs {
        println!("\n{}", dir.display());
        println!("{:<18} {:>8} {:>12}", "mode", "GiB/s", "CPU-s/GiB");
        let mut res: Vec<(WriteMode, Vec<f64>, Vec<f64>)> = WriteMode::CONCRETE
            .iter()
            .map(|m| (*m, vec![], vec![]))
            .collect();
        for _ in 0..rounds {
            for (m, rate, cpu) in res.iter_mut() {
                let (r, c) = flush_once(dir, *m, keys);
                rate.push(r);
                cpu.push(c);
            }
        }
        let rows: Vec<(WriteMode, f64, f64)> = res
            .into_iter()
            .map(|(m, r, c)| (m, median(r), median(c)))
            .collect();
        for (m, r, c) in &rows {
            println!("{:<18} {:>8.2} {:>12.2}", m.name(), r, c);
        }
        let best = rows.iter().map(|r| r.1).fold(0.0, f64::max);
        let probe_dir = tempfile::tempdir_in(dir).unwrap();
        let s = Storage::open(probe_dir.path().join("s"), Options::default()).unwrap();
        let (pick, why) = s.write_mode();
        let picked = rows.iter().find(|r| r.0 == pick).map_or(0.0, |r| r.1);
        println!(
            "auto picks {} ({why}): {:.0}% of the best mode's GiB/s",
            pick.name(),
            100.0 * picked / best.max(1e-9)
        );
    }
}
