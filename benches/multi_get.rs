//! MultiGet benchmark: `ReadTransaction::multi_get` of a batch of random keys vs one
//! `get` per key of the same batch, side by side in one run, batches of 16 and 64 keys, over a
//! data file several times larger than what one cold round reads.
//!
//! - **cold**: before each round the storage is closed, reopened, and its data file's pages
//!   are dropped from the page cache (`posix_fadvise(DONTNEED)`, which drops pages no process
//!   maps: hence the reopen, whose new map has touched nothing); the round then reads
//!   `--cold-keys` keys in batches. The two ways alternate round by round and read the same
//!   keys. A round reads few keys on purpose: a page fault of the map reads 128 KiB around the
//!   page (the kernel's read-around), so 512 faults already bring in 64 MB of the 250 MB file;
//!   more keys per round would measure a warming cache.
//! - **warm**: the whole file in the page cache and mapped; blocks of 50 batches alternate
//!   between the two ways, `--warm-batches` batches per way and round.
//!
//! Reported per case: keys/s over all its rounds, the p50 and p99 latency of one batch, and
//! the ratio multi_get / gets of keys/s (targets: cold >= 3.5x, warm >= 1.0x).
//!
//! Run: `cargo bench --bench multi_get` (about a minute, writes a storage of about 300 MB under
//! `target/bench-tmp`, removed at the end). Options after `--`, or environment variables:
//!
//! | variable                       | argument             | default (quick)        |
//! |--------------------------------|----------------------|------------------------|
//! | `OMNIBUS_BENCH_QUICK=1`        | `--quick`            | off                    |
//! | `OMNIBUS_BENCH_KEYS`           | `--keys N`           | 2,000,000 (200,000)    |
//! | `OMNIBUS_BENCH_COLD_KEYS`      | `--cold-keys N`      | 512 (256) per round    |
//! | `OMNIBUS_BENCH_WARM_BATCHES`   | `--warm-batches N`   | 1,000 (200) per round  |
//! | `OMNIBUS_BENCH_ROUNDS`         | `--rounds N`         | 8 (2) cold rounds and warm blocks |
//! | `OMNIBUS_BENCH_DIR`            | `--dir PATH`         | `<crate>/target/bench-tmp` |
//! | `OMNIBUS_BENCH_ONLY`           | `--only a,b`         | `cold,warm`            |
//!
//! Instruction counts of the warm case (deterministic, unlike times on a busy machine):
//! `valgrind --tool=callgrind` over `--quick --only warm`, then `callgrind_annotate
//! --inclusive=yes` lists `multi_get::gets` and `multi_get::multi`, which read the same
//! number of keys.

#[path = "common/mod.rs"]
mod common;

use std::hint::black_box;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use omnibus::{FlushMode, Options, ReadTransaction, Storage};

struct Config {
    keys: u64,
    cold_keys: usize,
    warm_batches: usize,
    rounds: usize,
    dir: PathBuf,
    only: Vec<String>,
}

fn arg_or_env(args: &[String], flag: &str, var: &str) -> Option<String> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1).cloned())
        .or_else(|| std::env::var(var).ok())
}

fn config() -> Config {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick")
        || std::env::var("OMNIBUS_BENCH_QUICK").is_ok_and(|v| v == "1");
    let num = |flag: &str, var: &str, full: u64, small: u64| -> u64 {
        arg_or_env(&args, flag, var)
            .and_then(|v| v.replace('_', "").parse().ok())
            .unwrap_or(if quick { small } else { full })
    };
    Config {
        keys: num("--keys", "OMNIBUS_BENCH_KEYS", 2_000_000, 200_000),
        cold_keys: num("--cold-keys", "OMNIBUS_BENCH_COLD_KEYS", 512, 256) as usize,
        warm_batches: num("--warm-batches", "OMNIBUS_BENCH_WARM_BATCHES", 1_000, 200) as usize,
        rounds: num("--rounds", "OMNIBUS_BENCH_ROUNDS", 8, 2) as usize,
        dir: arg_or_env(&args, "--dir", "OMNIBUS_BENCH_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-tmp")),
        only: arg_or_env(&args, "--only", "OMNIBUS_BENCH_ONLY")
            .unwrap_or_else(|| "cold,warm".into())
            .split(',')
            .map(|s| s.trim().to_string())
            .collect(),
    }
}

/// Key `i`: 16 bytes, in key order of `i`.
fn key(i: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(b"user:key");
    k[8..].copy_from_slice(&i.to_be_bytes());
    k
}

fn value(i: u64) -> [u8; 100] {
    let mut v = [0u8; 100];
    for (j, b) in v.iter_mut().enumerate() {
        *b = (common::splitmix(i) >> (j % 8 * 8)) as u8;
    }
    v
}

fn opts() -> Options {
    Options {
        flush_mode: FlushMode::Manual,
        ..Options::default()
    }
}

/// Opens the storage with its data file's pages dropped from the page cache.
fn open_cold(path: &Path) -> Storage {
    let s = Storage::open(path, opts()).expect("open");
    let f = std::fs::File::open(path.join("data.pages")).expect("open data file");
    // SAFETY: posix_fadvise only advises the kernel about the descriptor's pages.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    s
}

#[derive(Clone, Copy, PartialEq)]
enum Way {
    Gets,
    Multi,
}

struct Tally {
    keys: u64,
    time: Duration,
    hist: Histogram<u64>,
    found: u64,
    cpu: Duration,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            keys: 0,
            time: Duration::ZERO,
            hist: Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram"),
            found: 0,
            cpu: Duration::ZERO,
        }
    }

    fn keys_per_s(&self) -> f64 {
        self.keys as f64 / self.time.as_secs_f64().max(1e-9)
    }
}

/// Runs `batches` batches of `size` random keys (seeded by `seed`) the way `way` says.
fn run(
    r: &ReadTransaction,
    way: Way,
    size: usize,
    batches: usize,
    seed: u64,
    n: u64,
    t: &mut Tally,
) {
    let mut keys: Vec<[u8; 16]> = Vec::with_capacity(size);
    let cpu0 = common::cpu_now();
    for b in 0..batches {
        keys.clear();
        keys.extend((0..size).map(|j| key(common::splitmix(seed ^ (b * size + j) as u64) % n)));
        let start = Instant::now();
        let found = match way {
            Way::Gets => gets(r, &keys),
            Way::Multi => multi(r, &keys),
        };
        let el = start.elapsed();
        t.time += el;
        t.keys += size as u64;
        t.found += found as u64;
        t.hist.saturating_record(el.as_nanos() as u64);
    }
    t.cpu += common::cpu_now().saturating_sub(cpu0);
}

/// One `get` per key (a function of its own, so `callgrind` counts it apart): keys found.
#[inline(never)]
fn gets(r: &ReadTransaction, keys: &[[u8; 16]]) -> usize {
    keys.iter()
        .filter(|k| black_box(r.get(k).expect("get")).is_some())
        .count()
}

/// One `multi_get` of `keys`: keys found.
#[inline(never)]
fn multi(r: &ReadTransaction, keys: &[[u8; 16]]) -> usize {
    r.multi_get(keys)
        .expect("multi_get")
        .iter()
        .filter(|v| black_box(v).is_some())
        .count()
}

fn main() {
    let cfg = config();
    let path = cfg.dir.join("multi_get");
    let _ = std::fs::remove_dir_all(&path);
    std::fs::create_dir_all(&cfg.dir).expect("bench dir");
    println!(
        "multi_get bench: {} keys (16 B keys, 100 B values), batches of 16 and 64; io backend: {}",
        cfg.keys,
        omnibus::env::io_backend().reason
    );
    let t0 = Instant::now();
    {
        let s = Storage::open(&path, opts()).expect("create");
        let mut i = 0;
        while i < cfg.keys {
            let mut w = s.begin_write().expect("write");
            for j in i..(i + 100_000).min(cfg.keys) {
                w.put(key(j), value(j)).expect("put");
            }
            w.commit().expect("commit");
            i += 100_000;
            s.flush().expect("flush");
        }
        s.close().expect("close");
    }
    let file_len = std::fs::metadata(path.join("data.pages"))
        .map(|m| m.len())
        .unwrap_or(0);
    println!(
        "loaded in {:.1} s; data file {:.0} MB",
        t0.elapsed().as_secs_f64(),
        file_len as f64 / 1e6
    );
    println!(
        "\n| cache | batch | way | keys/s | batch p50 µs | batch p99 µs | CPU µs/key | rounds × batches | multi_get / gets |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for size in [16usize, 64] {
        // Cold: reopen, drop the page cache, one round of each way with the same keys.
        let mut tallies = [Tally::new(), Tally::new()];
        let cold_rounds = if cfg.only.iter().any(|o| o == "cold") {
            cfg.rounds
        } else {
            0
        };
        for round in 0..cold_rounds {
            let order = if round % 2 == 0 {
                [Way::Gets, Way::Multi]
            } else {
                [Way::Multi, Way::Gets]
            };
            for way in order {
                let s = open_cold(&path);
                let r = s.begin_read().expect("read");
                let seed = 0xC01D_0000 + round as u64;
                let t = &mut tallies[if way == Way::Gets { 0 } else { 1 }];
                run(&r, way, size, cfg.cold_keys / size, seed, cfg.keys, t);
                drop(r);
                s.close().expect("close");
            }
        }
        if cold_rounds > 0 {
            report("cold", size, &tallies, cfg.rounds, cfg.cold_keys / size);
        }
        if !cfg.only.iter().any(|o| o == "warm") {
            continue;
        }
        // Warm: the whole file cached and mapped first.
        let s = Storage::open(&path, opts()).expect("open");
        let r = s.begin_read().expect("read");
        let mut n = 0u64;
        for e in r.iter().expect("iter") {
            n += black_box(e.expect("entry")).1.len() as u64;
        }
        assert!(n > 0);
        let mut tallies = [Tally::new(), Tally::new()];
        // Blocks of 50 batches alternate, so that the other processes' turns on the CPUs
        // fall on both ways alike.
        let blocks = cfg.warm_batches.div_ceil(50);
        for block in 0..cfg.rounds * blocks * 2 {
            let way = if block % 2 == 0 {
                Way::Gets
            } else {
                Way::Multi
            };
            let seed = 0x3A2A_0000 + (block / 2) as u64;
            let t = &mut tallies[if way == Way::Gets { 0 } else { 1 }];
            run(&r, way, size, 50, seed, cfg.keys, t);
        }
        report("warm", size, &tallies, cfg.rounds, blocks * 50);
        drop(r);
        s.close().expect("close");
    }
    let _ = std::fs::remove_dir_all(&path);
    println!("\ntotal {:.1} s", t0.elapsed().as_secs_f64());
}

fn report(cache: &str, size: usize, t: &[Tally; 2], rounds: usize, batches: usize) {
    assert_eq!(t[0].found, t[1].found, "both ways found the same keys");
    let ratio = t[1].keys_per_s() / t[0].keys_per_s();
    for (i, name) in ["gets", "multi_get"].iter().enumerate() {
        println!(
            "| {cache} | {size} | {name} | {:.0} | {:.1} | {:.1} | {:.2} | {rounds} × {batches} | {} |",
            t[i].keys_per_s(),
            t[i].hist.value_at_quantile(0.5) as f64 / 1e3,
            t[i].hist.value_at_quantile(0.99) as f64 / 1e3,
            t[i].cpu.as_secs_f64() * 1e6 / t[i].keys.max(1) as f64,
            if i == 1 {
                format!("{ratio:.2}x")
            } else {
                String::new()
            }
        );
    }
}
