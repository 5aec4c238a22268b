//! End-to-end core benchmark: omnibus measured side by side with its reference points in one
//! run, with ratios (docs/BENCHMARKS.md).
//!
//! 1. `get`: in-cache random point gets in one snapshot, omnibus vs LMDB (heed) on the same keys
//!    (16-byte keys, 100-byte values, loaded in large transactions, same random lookup sequence).
//!    omnibus is measured twice: before `flush()` (pages served from the scratch table) and after
//!    it (pages served from the read-only mmap of the data file).
//! 2. `commit`: serial durable commits of one small put vs a raw `pwrite + fdatasync` of the same
//!    number of bytes to a pre-zeroed file (and a raw append + fdatasync, file growing); the
//!    default journal I/O path (`JournalIo::Auto`) beside each path forced.
//! 3. `prezero`: the same commit loop with `Prezero::Ahead(4 MiB)` vs `Prezero::WholeFile`.
//! 4. `batch`: synced transactions of 1,000 random keys (24 B keys, 150 B values, the index
//!    storages' pattern) into a storage of 200,000 keys with default options, vs LMDB doing the
//!    same batches, blocks alternating: keys/s and process CPU per key (target 200,000 keys/s).
//! 5. `sorted`: 1,000,000 keys in key order in transactions of 100,000 (`FlushMode::Manual`),
//!    vs LMDB, three alternating rounds (target 1,500,000 keys/s).
//! 6. `growth`: one-put synced commits on an empty storage vs one loaded with 2,500,000 keys and
//!    flushed, blocks alternating: p50 and process CPU per commit (targets 1.1x and 1.2x).
//! 7. `durability`: one-put commits with `Durability::Immediate` (acknowledged after
//!    `fdatasync`) vs `Durability::Eventual` (acknowledged once queued for the journal; redb's
//!    suite calls these "nosync writes"), two storages with default journal options and
//!    `FlushMode::Manual`, blocks alternating: the rate ratio, and how many eventual commits
//!    each journal batch (one `fdatasync`) carried.
//!
//! Sections 2 and 3 run first (each after waiting for the disk to answer fdatasync quickly), then
//! section 1, whose load writes about 1.5 GB.
//!
//! Run: `cargo bench --bench core` (full size). Scale down with environment variables or
//! arguments after `--`:
//!
//! | variable                 | argument          | default (quick)      |
//! |--------------------------|-------------------|----------------------|
//! | `OMNIBUS_BENCH_QUICK=1`  | `--quick`         | off                  |
//! | `OMNIBUS_BENCH_KEYS`     | `--keys N`        | 1,000,000 (50,000)   |
//! | `OMNIBUS_BENCH_GETS`     | `--gets N`        | 2,000,000 (200,000)  |
//! | `OMNIBUS_BENCH_COMMITS`  | `--commits N`     | 2,000 (200)          |
//! | `OMNIBUS_BENCH_DIR`      | `--dir PATH`      | `<crate>/target/bench-tmp` |
//! | `OMNIBUS_BENCH_ONLY`     | `--only a,b`      | `get,commit,prezero,growth,batch,sorted,durability` |
//! | `OMNIBUS_BENCH_PAUSE`    | `--pause X`       | 3 (untimed pause after each round of commit blocks, × the round's time) |
//!
//! The bench directory must be on the real disk: the bench prints its file system type and
//! warns on tmpfs.

use std::fs::{File, OpenOptions};
use std::hint::black_box;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
#[path = "common/mod.rs"]
mod common;
use common::{batch_key, key, splitmix, value};

use omnibus::{Durability, FlushMode, JournalIo, Options, Prezero, Storage};

// ---------------------------------------------------------------------------------------------
// Configuration

#[derive(Debug, Clone)]
struct Config {
    quick: bool,
    keys: usize,
    gets: usize,
    commits: usize,
    /// Keys preloaded into the storage the commit benches write to (so a commit touches a
    /// realistic root-to-leaf path, not a one-page tree).
    commit_preload: usize,
    /// Keys per load transaction.
    load_batch: usize,
    /// Timed rounds of the get bench (engines alternate; the median round is reported).
    get_rounds: usize,
    /// Commits per block in the commit benches: the cases alternate block by block, so a
    /// disturbance from outside (other processes on the disk) falls on every case alike.
    commit_block: usize,
    dir: PathBuf,
    only: Vec<String>,
    /// Untimed pause after each round of commit blocks, as a multiple of the round's duration.
    pause: f64,
    /// Longest wait for the disk to leave its throttled mode before a durable section.
    calm_wait: Duration,
}

fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace(['_', ','], "").parse().ok())
}

impl Config {
    fn parse() -> Config {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let arg = |name: &str| -> Option<String> {
            args.iter()
                .position(|a| a == name)
                .and_then(|i| args.get(i + 1).cloned())
        };
        let arg_usize = |name: &str| arg(name).and_then(|v| v.replace(['_', ','], "").parse().ok());
        let quick = args.iter().any(|a| a == "--quick")
            || std::env::var("OMNIBUS_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
        let pick = |flag: &str, var: &str, full: usize, q: usize| {
            arg_usize(flag)
                .or_else(|| env_usize(var))
                .unwrap_or(if quick { q } else { full })
        };
        let dir = arg("--dir")
            .or_else(|| std::env::var("OMNIBUS_BENCH_DIR").ok())
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                let target = std::env::var("CARGO_TARGET_DIR")
                    .map(PathBuf::from)
                    .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
                target.join("bench-tmp")
            });
        let only = arg("--only")
            .or_else(|| std::env::var("OMNIBUS_BENCH_ONLY").ok())
            .unwrap_or_else(|| "get,commit,prezero,growth,batch,sorted,durability".into())
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        Config {
            quick,
            keys: pick("--keys", "OMNIBUS_BENCH_KEYS", 1_000_000, 50_000),
            gets: pick("--gets", "OMNIBUS_BENCH_GETS", 2_000_000, 200_000),
            commits: pick("--commits", "OMNIBUS_BENCH_COMMITS", 2_000, 200).max(4),
            commit_preload: if quick { 20_000 } else { 100_000 },
            load_batch: 100_000,
            get_rounds: if quick { 3 } else { 7 },
            commit_block: 25,
            dir,
            only,
            calm_wait: Duration::from_secs(if quick { 20 } else { 180 }),
            pause: arg("--pause")
                .or_else(|| std::env::var("OMNIBUS_BENCH_PAUSE").ok())
                .and_then(|v| v.parse().ok())
                .unwrap_or(3.0),
        }
    }

    fn runs(&self, what: &str) -> bool {
        self.only.iter().any(|o| o == what || o == "all")
    }
}

// ---------------------------------------------------------------------------------------------
// Data: deterministic keys and values

// ---------------------------------------------------------------------------------------------
// Formatting helpers

fn fmt_ns(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.1} µs", ns / 1e3)
    } else {
        format!("{ns:.1} ns")
    }
}

fn fmt_int(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "MET"
    } else {
        "NOT MET"
    }
}

// ---------------------------------------------------------------------------------------------
// Environment description

fn fs_type(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `s` a properly sized out-parameter.
    if unsafe { libc::statfs(c.as_ptr(), &mut s) } != 0 {
        return "unknown".into();
    }
    let magic = s.f_type as u64;
    let name = match magic {
        0xEF53 => "ext2/3/4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x0102_1994 => "tmpfs",
        0x794C_7630 => "overlayfs",
        0x2FC1_2FC1 => "zfs",
        0x6969 => "nfs",
        _ => "other",
    };
    format!("{name} (magic {magic:#x})")
}

fn describe(cfg: &Config) {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let mem_kb: u64 = read("/proc/meminfo")
        .lines()
        .find(|l| l.starts_with("MemTotal"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let kernel = read("/proc/sys/kernel/osrelease").trim().to_string();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    println!(
        "omnibus core bench{}",
        if cfg.quick {
            " (QUICK: sizes scaled down)"
        } else {
            ""
        }
    );
    println!(
        "  cpu: {cpu}, {cores} cores; memory {:.1} GiB; kernel {kernel}",
        mem_kb as f64 / (1 << 20) as f64
    );
    let fs = fs_type(&cfg.dir);
    println!("  bench dir: {} on {fs}", cfg.dir.display());
    if fs.starts_with("tmpfs") {
        println!("  WARNING: the bench dir is on tmpfs: fdatasync is free there, durable-commit numbers are meaningless");
    }
    println!(
        "  sizes: keys {}, gets {}, commits {} (preload {}), load batch {}",
        fmt_int(cfg.keys as u64),
        fmt_int(cfg.gets as u64),
        fmt_int(cfg.commits as u64),
        fmt_int(cfg.commit_preload as u64),
        fmt_int(cfg.load_batch as u64)
    );
    println!();
}

// ---------------------------------------------------------------------------------------------
// Loading

fn load_omnibus(s: &Storage, n: usize, batch: usize) -> Duration {
    let t = Instant::now();
    let mut i = 0usize;
    while i < n {
        let end = (i + batch).min(n);
        let mut w = s.begin_write().expect("begin_write");
        for j in i..end {
            w.put(key(j as u64), value(j as u64)).expect("put");
        }
        w.commit().expect("commit");
        i = end;
    }
    t.elapsed()
}

type Lmdb = (
    heed::Env,
    heed::Database<heed::types::Bytes, heed::types::Bytes>,
);

fn open_lmdb(dir: &Path, map_size: usize) -> Lmdb {
    std::fs::create_dir_all(dir).unwrap();
    // SAFETY: the directory is private to this process; nothing else maps it.
    let env = unsafe {
        heed::EnvOpenOptions::new()
            .map_size(map_size)
            .max_dbs(1)
            .open(dir)
    }
    .expect("lmdb open");
    let mut w = env.write_txn().unwrap();
    let db = env.create_database(&mut w, None).unwrap();
    w.commit().unwrap();
    (env, db)
}

fn load_lmdb(l: &Lmdb, n: usize, batch: usize) -> Duration {
    let t = Instant::now();
    let mut i = 0usize;
    while i < n {
        let end = (i + batch).min(n);
        let mut w = l.0.write_txn().unwrap();
        for j in i..end {
            l.1.put(&mut w, &key(j as u64), &value(j as u64)).unwrap();
        }
        w.commit().unwrap();
        i = end;
    }
    t.elapsed()
}

// ---------------------------------------------------------------------------------------------
// 1. Point gets

fn queries(cfg: &Config) -> Vec<[u8; 16]> {
    let mut x = 0x5EED_u64;
    (0..cfg.gets)
        .map(|_| {
            x = splitmix(x);
            key(x % cfg.keys as u64)
        })
        .collect()
}

/// Times one pass of gets over `qs` and returns ns per get.
fn time_gets(qs: &[[u8; 16]], mut get: impl FnMut(&[u8]) -> usize) -> f64 {
    let t = Instant::now();
    let mut sum = 0usize;
    for q in qs {
        sum = sum.wrapping_add(get(q));
    }
    let el = t.elapsed();
    black_box(sum);
    el.as_nanos() as f64 / qs.len() as f64
}

fn omnibus_get(r: &omnibus::ReadTransaction, k: &[u8]) -> usize {
    match r.get(k) {
        Ok(Some(v)) => v.len() + v[0] as usize,
        other => panic!("omnibus get: {other:?}"),
    }
}

fn lmdb_get(l: &Lmdb, t: &heed::RoTxn, k: &[u8]) -> usize {
    match l.1.get(t, k) {
        Ok(Some(v)) => v.len() + v[0] as usize,
        other => panic!("lmdb get: {other:?}"),
    }
}

/// One omnibus case measured against LMDB in alternating rounds.
struct Paired {
    omnibus: f64,
    lmdb: f64,
    /// Median of the per-round ratios omnibus / LMDB (robust against drift from other load).
    ratio: f64,
}

/// Warms both up, then alternates timed rounds of omnibus and LMDB gets over `qs`.
fn paired_gets(
    cfg: &Config,
    label: &str,
    qs: &[[u8; 16]],
    r: &omnibus::ReadTransaction,
    lmdb: &Lmdb,
) -> Paired {
    let lt = lmdb.0.read_txn().unwrap();
    // Warm-up: touch every page of both (page faults into the map, caches, branch predictors).
    time_gets(qs, |k| omnibus_get(r, k));
    time_gets(qs, |k| lmdb_get(lmdb, &lt, k));
    let (mut o, mut l, mut q) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..cfg.get_rounds {
        let a = time_gets(qs, |k| omnibus_get(r, k));
        let b = time_gets(qs, |k| lmdb_get(lmdb, &lt, k));
        o.push(a);
        l.push(b);
        q.push(a / b);
    }
    let per_round: Vec<String> = o
        .iter()
        .zip(&l)
        .map(|(a, b)| format!("{a:.0}/{b:.0}"))
        .collect();
    println!(
        "  {label}: rounds (omnibus/LMDB ns per get): {}",
        per_round.join("  ")
    );
    Paired {
        omnibus: median(&mut o),
        lmdb: median(&mut l),
        ratio: median(&mut q),
    }
}

struct GetResults {
    mmap: Paired,
    scratch: Paired,
}

fn bench_get(cfg: &Config, root: &Path) -> GetResults {
    println!(
        "== 1. random point get in one snapshot, in cache: {} keys (16 B keys, 100 B values) ==",
        fmt_int(cfg.keys as u64)
    );
    let qs = queries(cfg);

    let odir = root.join("get-omnibus");
    let opts = Options {
        flush_mode: FlushMode::Manual,
        ..Options::default()
    };
    let s = Storage::open(&odir, opts).expect("open omnibus");
    let t_omni = load_omnibus(&s, cfg.keys, cfg.load_batch);
    let st = s.stats();
    println!(
        "  load omnibus: {:.2} s ({} txns, journal {:.0} MiB, {} scratch pages)",
        t_omni.as_secs_f64(),
        cfg.keys.div_ceil(cfg.load_batch),
        st.journal.bytes as f64 / (1 << 20) as f64,
        fmt_int(st.scratch_pages)
    );

    let ldir = root.join("get-lmdb");
    let lmdb = open_lmdb(&ldir, 8 << 30);
    let t_lmdb = load_lmdb(&lmdb, cfg.keys, cfg.load_batch);
    println!("  load LMDB:    {:.2} s", t_lmdb.as_secs_f64());

    // Unflushed: every page comes from the scratch table (a lookup in its trie per level).
    let scratch = {
        let r = s.begin_read().unwrap();
        paired_gets(cfg, "unflushed", &qs, &r, &lmdb)
    };

    let t = Instant::now();
    s.flush().expect("flush");
    let st = s.stats();
    println!(
        "  omnibus flush: {:.2} s (data file {:.0} MiB, scratch pages left {}, {} keys)",
        t.elapsed().as_secs_f64(),
        st.data_file_bytes as f64 / (1 << 20) as f64,
        st.scratch_pages,
        fmt_int(st.entries)
    );
    assert_eq!(st.scratch_pages, 0, "flush left pages in the scratch table");

    let mmap = {
        let r = s.begin_read().unwrap();
        paired_gets(cfg, "flushed", &qs, &r, &lmdb)
    };
    drop(s);
    drop(lmdb);
    let _ = std::fs::remove_dir_all(&odir);
    let _ = std::fs::remove_dir_all(&ldir);

    println!();
    println!("  | case                               | omnibus ns/get | LMDB ns/get | omnibus/LMDB | target  |");
    println!("  |------------------------------------|----------------|-------------|--------------|---------|");
    println!(
        "  | flushed (pages in the mmap)        | {:>14.1} | {:>11.1} | {:>11.2}x | <=1.50x |",
        mmap.omnibus, mmap.lmdb, mmap.ratio
    );
    println!(
        "  | unflushed (pages in scratch table) | {:>14.1} | {:>11.1} | {:>11.2}x |         |",
        scratch.omnibus, scratch.lmdb, scratch.ratio
    );
    println!("  ns/get: median of {} rounds; omnibus/LMDB: median of the per-round ratios (rounds alternate)", cfg.get_rounds);
    println!();
    GetResults { mmap, scratch }
}

// ---------------------------------------------------------------------------------------------
// 2. Serial durable commits

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000_000, 3).unwrap()
}

/// Latencies of one case of a commit bench.
struct Lat {
    name: String,
    h: Histogram<u64>,
    busy: Duration,
}

impl Lat {
    fn new(name: impl Into<String>) -> Lat {
        Lat {
            name: name.into(),
            h: hist(),
            busy: Duration::ZERO,
        }
    }

    fn time(&mut self, f: &mut dyn FnMut()) {
        let t = Instant::now();
        f();
        let el = t.elapsed();
        self.busy += el;
        self.h.record((el.as_nanos() as u64).max(1)).unwrap();
    }

    /// Commits per second over the whole timed run (1 / mean latency).
    fn rate(&self) -> f64 {
        self.h.len() as f64 / self.busy.as_secs_f64()
    }

    /// 1 / median latency: the rate without the outliers (stalls caused by other processes).
    fn rate_p50(&self) -> f64 {
        1e9 / self.p(0.5)
    }

    fn p(&self, q: f64) -> f64 {
        self.h.value_at_quantile(q) as f64
    }

    fn row(&self, base: &Lat) {
        println!(
            "  | {:<44} | {:>9} | {:>9} | {:>9} | {:>9} | {:>8.0} | {:>6.2} | {:>8.0} | {:>6.2} |",
            self.name,
            fmt_ns(self.p(0.5)),
            fmt_ns(self.p(0.99)),
            fmt_ns(self.p(0.999)),
            fmt_ns(self.h.max() as f64),
            self.rate(),
            self.rate() / base.rate(),
            self.rate_p50(),
            self.rate_p50() / base.rate_p50(),
        );
    }
}

fn table(base_name: &str, rows: &[&Lat]) {
    println!(
        "  | {:<44} | {:>9} | {:>9} | {:>9} | {:>9} | {:>8} | {:>6} | {:>8} | {:>6} |",
        "case", "p50", "p99", "p99.9", "max", "commit/s", "ratio", "1/p50", "ratio"
    );
    println!(
        "  |{:-<46}|{:-<11}|{:-<11}|{:-<11}|{:-<11}|{:-<10}|{:-<8}|{:-<10}|{:-<8}|",
        "", "", "", "", "", "", "", "", ""
    );
    for r in rows {
        r.row(rows[0]);
    }
    println!("  commit/s = commits / time spent committing (1/mean); 1/p50 = rate at the median latency;");
    println!("  ratio = this row / the first row ({base_name}).");
}

/// Runs `n` timed commits of every case, alternating cases every `block` commits, and after
/// each round of blocks pauses (untimed) `pause` times as long as the round took, so the average
/// write rate stays under the virtual disk's throttle. Each round starts with the next case
/// (the first block after a pause runs on an idle CPU and disk, and was measured slower: no case
/// may always be the one that pays it).
fn interleave(n: usize, block: usize, pause: f64, cases: &mut [(&mut Lat, &mut dyn FnMut())]) {
    let mut done = 0;
    let mut round = 0;
    while done < n {
        let m = block.min(n - done);
        let t = Instant::now();
        for i in 0..cases.len() {
            let (lat, f) = &mut cases[(round + i) % cases.len()];
            for _ in 0..m {
                lat.time(&mut **f);
            }
        }
        round += 1;
        done += m;
        if pause > 0.0 {
            std::thread::sleep(t.elapsed().mul_f64(pause));
        }
    }
}

/// A storage for serial commits: preloaded, flushed, then `commit_one` puts one new key per
/// durable commit.
struct CommitTarget {
    s: Storage,
    next: u64,
}

impl CommitTarget {
    fn open(dir: &Path, opts: Options, preload: usize) -> CommitTarget {
        let s = Storage::open(dir, opts).expect("open omnibus");
        load_omnibus(&s, preload, 100_000);
        s.flush().expect("flush");
        CommitTarget { s, next: 1 << 40 }
    }

    fn commit_one(&mut self) {
        self.commit_one_with(Durability::Immediate);
    }

    fn commit_one_with(&mut self, durability: Durability) {
        let i = self.next;
        self.next += 1;
        let mut w = self.s.begin_write().unwrap();
        w.set_durability(durability);
        w.put(key(i), value(i)).unwrap();
        w.commit().unwrap();
    }

    /// Journal bytes and commits so far.
    fn journal(&self) -> (u64, u64) {
        let j = self.s.stats().journal;
        (j.bytes, j.commits)
    }
}

/// Raw baseline: a file written with `pwrite(len) + fdatasync` per "commit".
struct Raw {
    f: File,
    buf: Vec<u8>,
    pos: u64,
}

impl Raw {
    /// `prezero_bytes > 0`: the file is written with zeros and synced first, so every write
    /// overwrites allocated blocks; 0: the file starts empty and grows (append).
    fn open(path: &Path, len: usize, prezero_bytes: u64) -> Raw {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .unwrap();
        if prezero_bytes > 0 {
            let z = vec![0u8; 1 << 20];
            let mut at = 0;
            while at < prezero_bytes {
                f.write_all_at(&z, at).unwrap();
                at += z.len() as u64;
            }
            f.sync_all().unwrap();
        }
        if let Some(d) = path.parent() {
            File::open(d).unwrap().sync_all().unwrap();
        }
        let buf = (0..len).map(|i| (i * 131 + 7) as u8).collect();
        Raw { f, buf, pos: 0 }
    }

    fn commit_one(&mut self) {
        self.f.write_all_at(&self.buf, self.pos).unwrap();
        self.f.sync_data().unwrap();
        self.pos += self.buf.len() as u64;
    }
}

/// Waits until the disk answers a 4 KiB `pwrite + fdatasync` in under 300 µs at the median (this
/// machine's virtual disk drops into a throttled mode, fdatasync quantized at 4 ms, for tens of
/// seconds after a burst of writes; a durable-commit comparison run then measures the throttle).
fn wait_for_calm_disk(dir: &Path, max_wait: Duration) {
    let path = dir.join("probe");
    let mut raw = Raw::open(&path, 4096, 1 << 20);
    let t = Instant::now();
    loop {
        raw.pos = 0;
        let mut v: Vec<f64> = (0..25)
            .map(|_| {
                let t = Instant::now();
                raw.commit_one();
                t.elapsed().as_nanos() as f64
            })
            .collect();
        let m = median(&mut v);
        if m < 300e3 || t.elapsed() >= max_wait {
            println!(
                "  disk probe (4 KiB pwrite + fdatasync): median {} after waiting {:.0} s{}",
                fmt_ns(m),
                t.elapsed().as_secs_f64(),
                if m < 300e3 {
                    ""
                } else {
                    "  WARNING: the disk is still slow (contended or throttled): durable numbers below are noisy"
                }
            );
            break;
        }
        std::thread::sleep(Duration::from_secs(5));
    }
    let _ = std::fs::remove_file(&path);
}

/// Warns when the baseline itself ran throttled (median fdatasync of the raw case over 1 ms).
fn warn_if_throttled(base: &Lat) {
    if base.p(0.5) > 1e6 {
        println!("  WARNING: the raw baseline's median is {}: the disk was throttled during this phase; ratios reflect the throttle, not the engine", fmt_ns(base.p(0.5)));
    }
}

struct CommitResults {
    bytes_per_commit: u64,
    omnibus: Lat,
    raw: Lat,
}

fn bench_commit(cfg: &Config, root: &Path) -> CommitResults {
    println!("== 2. serial durable commits of one put (16 B key, 100 B value) ==");
    let dir = root.join("commit");
    std::fs::create_dir_all(&dir).unwrap();
    let warm = (cfg.commits / 10).clamp(20, 200);

    // omnibus, default journal options (256 MiB files, Prezero::Ahead(4 MiB)), manual flushes:
    // the loop measures the commit path alone (the journal grows; nothing is flushed).
    let mut omni = CommitTarget::open(
        &dir.join("omnibus"),
        Options {
            flush_mode: FlushMode::Manual,
            ..Options::default()
        },
        cfg.commit_preload,
    );
    let (auto_path, auto_why) = omni.s.journal_io();
    println!(
        "  journal I/O path (Options::journal_io auto): {} ({auto_why})",
        auto_path.name()
    );
    // Each path forced, side by side with the default's choice.
    let mut paths: Vec<(JournalIo, CommitTarget)> = [JournalIo::Syscalls, JournalIo::Ring]
        .into_iter()
        .map(|p| {
            let opts = Options {
                flush_mode: FlushMode::Manual,
                journal_io: p,
                ..Options::default()
            };
            let dir = dir.join(format!("omnibus-{}", p.name()));
            (p, CommitTarget::open(&dir, opts, cfg.commit_preload))
        })
        .collect();
    for (_, t) in paths.iter_mut() {
        for _ in 0..warm {
            t.commit_one();
        }
    }
    let (b0, c0) = omni.journal();
    for _ in 0..warm {
        omni.commit_one();
    }
    let (b1, c1) = omni.journal();
    let avg = (b1 - b0) / (c1 - c0);
    // The journal writes 4 KiB-aligned batches; the raw baseline writes the average rounded to
    // the nearest 4 KiB, at aligned offsets, as the journal does.
    let bytes = ((avg + 2048) / 4096).max(1) * 4096;
    println!(
        "  storage preloaded with {} keys and flushed; journal bytes per commit: {} on average (batches padded to 4 KiB); raw baselines write {} B",
        fmt_int(cfg.commit_preload as u64),
        fmt_int(avg),
        fmt_int(bytes),
    );

    // The best journal configuration for a standalone storage: whole pre-zeroed files prepared
    // by the background pool thread, so no zeros are written or synced in the commit path.
    let mut pool = CommitTarget::open(
        &dir.join("omnibus-pool"),
        Options {
            flush_mode: FlushMode::Manual,
            journal_prezero: Prezero::WholeFile,
            journal_pool_files: 1,
            journal_file_size: 64 << 20,
            ..Options::default()
        },
        cfg.commit_preload,
    );
    for _ in 0..warm {
        pool.commit_one();
    }

    // Raw baselines: same byte count, pre-zeroed (overwrite) and growing (append); and 4 KiB.
    let total = (2 * cfg.commits + warm) as u64 * bytes + (8 << 20);
    let mut raw = Raw::open(&dir.join("raw-overwrite"), bytes as usize, total);
    let mut raw_app = Raw::open(&dir.join("raw-append"), bytes as usize, 0);
    let mut raw4k = Raw::open(
        &dir.join("raw-4k"),
        4096,
        (cfg.commits + warm) as u64 * 4096 + (1 << 20),
    );
    let mut raw4k_app = Raw::open(&dir.join("raw-4k-append"), 4096, 0);
    for _ in 0..warm {
        raw.commit_one();
        raw_app.commit_one();
        raw4k.commit_one();
        raw4k_app.commit_one();
    }

    // LMDB reference: one put per durable write transaction (default flags: synced commits).
    let ldir = dir.join("lmdb");
    let lmdb = open_lmdb(&ldir, 1 << 30);
    load_lmdb(&lmdb, cfg.commit_preload, 100_000);
    let mut lnext = 1u64 << 40;
    let mut lmdb_commit = || {
        let mut w = lmdb.0.write_txn().unwrap();
        lmdb.1.put(&mut w, &key(lnext), &value(lnext)).unwrap();
        w.commit().unwrap();
        lnext += 1;
    };
    for _ in 0..warm {
        lmdb_commit();
    }

    let kib = bytes as f64 / 1024.0;
    wait_for_calm_disk(&dir, cfg.calm_wait);
    let mut l_raw = Lat::new(format!("raw pwrite {kib:.1} KiB + fdatasync, pre-zeroed"));
    let mut l_omni = Lat::new(format!(
        "omnibus commit (FlushMode::Manual), auto: {}",
        auto_path.name()
    ));
    let [(_, sys), (_, ring)] = &mut paths[..] else {
        unreachable!("two paths")
    };
    let mut l_sys = Lat::new("omnibus, journal_io syscalls");
    let mut l_ring = Lat::new("omnibus, journal_io ring");
    let mut l_pool = Lat::new("omnibus, WholeFile + pool (1 file), 64 MiB");
    let mut l_app = Lat::new(format!("raw append {kib:.1} KiB + fdatasync"));
    let mut l_4k = Lat::new("raw pwrite 4 KiB + fdatasync, pre-zeroed");
    let mut l_4k_app = Lat::new("raw append 4 KiB + fdatasync");
    let mut l_lmdb = Lat::new("LMDB (heed) commit, default (synced)");
    interleave(
        cfg.commits,
        cfg.commit_block,
        cfg.pause,
        &mut [
            (&mut l_raw, &mut || raw.commit_one()),
            (&mut l_omni, &mut || omni.commit_one()),
            (&mut l_sys, &mut || sys.commit_one()),
            (&mut l_ring, &mut || ring.commit_one()),
            (&mut l_pool, &mut || pool.commit_one()),
            (&mut l_app, &mut || raw_app.commit_one()),
            (&mut l_4k, &mut || raw4k.commit_one()),
            (&mut l_4k_app, &mut || raw4k_app.commit_one()),
            (&mut l_lmdb, &mut lmdb_commit),
        ],
    );
    let js = omni.s.stats().journal;
    println!(
        "  omnibus journal since open: {} commits, {} batches, {} fdatasyncs, {} files created",
        js.commits, js.batches, js.fdatasyncs, js.files_created
    );
    println!(
        "  cases alternate every {} commits, then pause {}x the round's time (untimed); {} timed commits each",
        cfg.commit_block,
        cfg.pause,
        fmt_int(cfg.commits as u64)
    );
    println!();
    table(
        "raw pre-zeroed, same bytes",
        &[
            &l_raw, &l_omni, &l_sys, &l_ring, &l_pool, &l_app, &l_4k, &l_4k_app, &l_lmdb,
        ],
    );
    warn_if_throttled(&l_raw);
    println!();
    drop(lmdb);

    // 2b. The default options (FlushMode::Background: flushes every 5 s or 64 MiB of scratch)
    // against the same raw baseline, in a phase of its own so its flushes disturb no other case.
    let mut bg = CommitTarget::open(
        &dir.join("omnibus-bg"),
        Options::default(),
        cfg.commit_preload,
    );
    for _ in 0..warm {
        bg.commit_one();
    }
    wait_for_calm_disk(&dir, cfg.calm_wait);
    let mut l_raw2 = Lat::new(format!("raw pwrite {kib:.1} KiB + fdatasync, pre-zeroed"));
    let mut l_bg = Lat::new("omnibus commit (FlushMode::Background)");
    let t = Instant::now();
    interleave(
        cfg.commits,
        cfg.commit_block,
        cfg.pause,
        &mut [
            (&mut l_raw2, &mut || raw.commit_one()),
            (&mut l_bg, &mut || bg.commit_one()),
        ],
    );
    println!(
        "  2b. default options (FlushMode::Background): {} flushes during the {:.1} s phase",
        bg.s.stats().flushes,
        t.elapsed().as_secs_f64()
    );
    table("raw pre-zeroed, same bytes", &[&l_raw2, &l_bg]);
    warn_if_throttled(&l_raw2);
    println!();

    let res = CommitResults {
        bytes_per_commit: bytes,
        omnibus: l_omni,
        raw: l_raw,
    };
    drop(omni);
    drop(paths);
    drop(pool);
    drop(bg);
    let _ = std::fs::remove_dir_all(&dir);
    res
}

// ---------------------------------------------------------------------------------------------
// 3. Journal pre-zeroing

struct PrezeroResults {
    ahead: Lat,
    whole: Lat,
}

fn bench_prezero(cfg: &Config, root: &Path) -> PrezeroResults {
    let file_size: u64 = 64 << 20;
    println!("== 3. journal pre-zeroing: Prezero::Ahead(4 MiB) vs WholeFile (vs pool, vs Off), journal_file_size 64 MiB, FlushMode::Manual ==");
    let dir = root.join("prezero");
    std::fs::create_dir_all(&dir).unwrap();
    let base = Options {
        flush_mode: FlushMode::Manual,
        journal_file_size: file_size,
        ..Options::default()
    };
    let t = Instant::now();
    let mut ahead = CommitTarget::open(
        &dir.join("ahead"),
        Options {
            journal_prezero: Prezero::Ahead(4 << 20),
            ..base.clone()
        },
        cfg.commit_preload,
    );
    let t_ahead = t.elapsed();
    let t = Instant::now();
    let mut whole = CommitTarget::open(
        &dir.join("whole"),
        Options {
            journal_prezero: Prezero::WholeFile,
            ..base.clone()
        },
        cfg.commit_preload,
    );
    let t_whole = t.elapsed();
    // WholeFile with one whole pre-zeroed file kept ready by the background pool thread, so a
    // journal file switch is a rename rather than 64 MiB of zeros written inside a commit.
    let mut pooled = CommitTarget::open(
        &dir.join("pooled"),
        Options {
            journal_prezero: Prezero::WholeFile,
            journal_pool_files: 1,
            ..base.clone()
        },
        cfg.commit_preload,
    );
    println!(
        "  open + preload + flush: Ahead {:.2} s, WholeFile {:.2} s",
        t_ahead.as_secs_f64(),
        t_whole.as_secs_f64()
    );
    let warm = (cfg.commits / 10).clamp(20, 200);
    for _ in 0..warm {
        ahead.commit_one();
        whole.commit_one();
        pooled.commit_one();
    }
    // No pre-zeroing at all: every batch appends and grows the file (the baseline that
    // pre-zeroing is meant to beat).
    let mut off = CommitTarget::open(
        &dir.join("off"),
        Options {
            journal_prezero: Prezero::Off,
            ..base.clone()
        },
        cfg.commit_preload,
    );
    for _ in 0..warm {
        off.commit_one();
    }
    wait_for_calm_disk(&dir, cfg.calm_wait);
    let (ja0, jw0, jp0) = (
        ahead.s.stats().journal,
        whole.s.stats().journal,
        pooled.s.stats().journal,
    );
    let mut l_a = Lat::new("omnibus commit, Prezero::Ahead(4 MiB)");
    let mut l_w = Lat::new("omnibus commit, Prezero::WholeFile");
    let mut l_p = Lat::new("omnibus commit, WholeFile + pool (1 file)");
    let mut l_o = Lat::new("omnibus commit, Prezero::Off (appends)");
    interleave(
        cfg.commits,
        cfg.commit_block,
        cfg.pause,
        &mut [
            (&mut l_a, &mut || ahead.commit_one()),
            (&mut l_w, &mut || whole.commit_one()),
            (&mut l_p, &mut || pooled.commit_one()),
            (&mut l_o, &mut || off.commit_one()),
        ],
    );
    let (ja, jw, jp) = (
        ahead.s.stats().journal,
        whole.s.stats().journal,
        pooled.s.stats().journal,
    );
    println!(
        "  timed loop: {} commits of {} journal bytes each; journal files created in the commit path (Ahead/WholeFile/pool): {}/{}/{}, pool files ready at the end: {}; fdatasyncs: {}/{}/{}",
        fmt_int(ja.commits - ja0.commits),
        fmt_int((ja.bytes - ja0.bytes) / (ja.commits - ja0.commits).max(1)),
        ja.files_created - ja0.files_created,
        jw.files_created - jw0.files_created,
        jp.files_created - jp0.files_created,
        jp.pool_ready,
        ja.fdatasyncs - ja0.fdatasyncs,
        jw.fdatasyncs - jw0.fdatasyncs,
        jp.fdatasyncs - jp0.fdatasyncs,
    );
    println!(
        "  Ahead(4 MiB) zeroing in the timed loop: {} KiB by the background thread, {} KiB inline in {} batches; {} batches waited for a background window",
        fmt_int((ja.background_zero_bytes - ja0.background_zero_bytes) >> 10),
        fmt_int((ja.inline_zero_bytes - ja0.inline_zero_bytes) >> 10),
        ja.inline_zeroings - ja0.inline_zeroings,
        ja.zeroing_waits - ja0.zeroing_waits,
    );
    println!();
    table("Ahead(4 MiB)", &[&l_a, &l_w, &l_p, &l_o]);
    if l_a.p(0.5) > 1e6 {
        println!("  WARNING: medians over 1 ms: the disk was throttled during this phase");
    }
    println!();
    drop(ahead);
    drop(whole);
    drop(pooled);
    drop(off);
    let _ = std::fs::remove_dir_all(&dir);
    PrezeroResults {
        ahead: l_a,
        whole: l_w,
    }
}

// ---------------------------------------------------------------------------------------------
// Process CPU time (every thread: the committer, the flush service, the pre-zeroing thread)

fn cpu_time() -> Duration {
    // SAFETY: `ru` is a properly sized out-parameter for getrusage.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid pointer.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Wall and process CPU time spent in one case (blocks of it, alternating with other cases).
#[derive(Default)]
struct Spent {
    wall: Duration,
    cpu: Duration,
    units: u64,
}

impl Spent {
    fn run(&mut self, units: u64, f: impl FnOnce()) {
        let (c, t) = (cpu_time(), Instant::now());
        f();
        self.wall += t.elapsed();
        self.cpu += cpu_time().saturating_sub(c);
        self.units += units;
    }

    fn rate(&self) -> f64 {
        self.units as f64 / self.wall.as_secs_f64()
    }

    fn cpu_per_unit(&self) -> f64 {
        self.cpu.as_nanos() as f64 / self.units.max(1) as f64
    }
}

// ---------------------------------------------------------------------------------------------
// 4. Random batches (the index storages' write pattern)

const BATCH_VALUE: [u8; 150] = [0x42; 150];

struct BatchResults {
    omnibus: Spent,
    lmdb: Spent,
}

fn bench_batch(cfg: &Config, root: &Path) -> BatchResults {
    let (preload, batches, per) = if cfg.quick {
        (20_000u64, 40u64, 1_000u64)
    } else {
        (200_000, 300, 1_000)
    };
    println!(
        "== 4. random batches: synced transactions of {per} random keys (24 B keys, 150 B values), {} keys preloaded, default options, vs LMDB ==",
        fmt_int(preload)
    );
    let dir = root.join("batch");
    std::fs::create_dir_all(&dir).unwrap();
    let s = Storage::open(dir.join("omnibus"), Options::default()).expect("open omnibus");
    let lmdb = open_lmdb(&dir.join("lmdb"), 4 << 30);
    let mut next = 0u64;
    let mut onext = 0u64;
    let mut omni_batch = |n: u64| {
        let mut w = s.begin_write().unwrap();
        for _ in 0..n {
            w.put(batch_key(onext), BATCH_VALUE).unwrap();
            onext += 1;
        }
        w.commit().unwrap();
    };
    let mut lmdb_batch = |n: u64| {
        let mut w = lmdb.0.write_txn().unwrap();
        for _ in 0..n {
            lmdb.1.put(&mut w, &batch_key(next), &BATCH_VALUE).unwrap();
            next += 1;
        }
        w.commit().unwrap();
    };
    for _ in 0..preload / 100_000 {
        omni_batch(100_000);
        lmdb_batch(100_000);
    }
    omni_batch(preload % 100_000);
    lmdb_batch(preload % 100_000);
    s.flush().expect("flush");
    for _ in 0..5 {
        omni_batch(per);
        lmdb_batch(per);
    }
    wait_for_calm_disk(&dir, cfg.calm_wait);
    let (mut o, mut l) = (Spent::default(), Spent::default());
    let block = 10;
    let mut done = 0;
    while done < batches {
        let m = block.min(batches - done);
        o.run(m * per, || (0..m).for_each(|_| omni_batch(per)));
        l.run(m * per, || (0..m).for_each(|_| lmdb_batch(per)));
        done += m;
    }
    let st = s.stats();
    println!(
        "  omnibus: {} flushes, {} keys at the end; blocks of {block} batches alternate with LMDB",
        st.flushes,
        fmt_int(st.entries)
    );
    println!("  | case                               |    keys/s | CPU per key | ratio (keys/s) |");
    println!("  |------------------------------------|-----------|-------------|----------------|");
    for (name, x) in [
        ("omnibus (default options)", &o),
        ("LMDB (heed), synced commits", &l),
    ] {
        println!(
            "  | {:<34} | {:>9.0} | {:>11} | {:>14.2} |",
            name,
            x.rate(),
            fmt_ns(x.cpu_per_unit()),
            x.rate() / l.rate()
        );
    }
    println!("  CPU per key: process CPU time (every thread, the flush service's included) / keys");
    println!();
    drop(s);
    drop(lmdb);
    let _ = std::fs::remove_dir_all(&dir);
    BatchResults {
        omnibus: o,
        lmdb: l,
    }
}

// ---------------------------------------------------------------------------------------------
// 5. Sorted inserts (appends at the right edge of the tree)

struct SortedResults {
    omnibus: f64,
    lmdb: f64,
    omnibus_cpu: f64,
}

fn bench_sorted(cfg: &Config, root: &Path) -> SortedResults {
    let keys: u64 = if cfg.quick { 200_000 } else { 1_000_000 };
    let per = 100_000u64;
    let rounds = 3;
    println!(
        "== 5. sorted inserts: {} keys in key order (16 B big-endian keys, 100 B values), transactions of {}, vs LMDB ==",
        fmt_int(keys),
        fmt_int(per)
    );
    let dir = root.join("sorted");
    std::fs::create_dir_all(&dir).unwrap();
    let sorted_key = |i: u64| {
        let mut k = [0u8; 16];
        k[..8].copy_from_slice(&i.to_be_bytes());
        k
    };
    let (mut o, mut l, mut q, mut oc) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds {
        let odir = dir.join(format!("omnibus-{r}"));
        let s = Storage::open(
            &odir,
            Options {
                flush_mode: FlushMode::Manual,
                ..Options::default()
            },
        )
        .expect("open omnibus");
        let mut so = Spent::default();
        so.run(keys, || {
            let mut i = 0;
            while i < keys {
                let mut w = s.begin_write().unwrap();
                for j in i..(i + per).min(keys) {
                    w.put(sorted_key(j), value(j)).unwrap();
                }
                w.commit().unwrap();
                i += per;
            }
        });
        let pages = s.stats().scratch_pages;
        drop(s);
        let _ = std::fs::remove_dir_all(&odir);
        let ldir = dir.join(format!("lmdb-{r}"));
        let lmdb = open_lmdb(&ldir, 4 << 30);
        let mut sl = Spent::default();
        sl.run(keys, || {
            let mut i = 0;
            while i < keys {
                let mut w = lmdb.0.write_txn().unwrap();
                for j in i..(i + per).min(keys) {
                    lmdb.1.put(&mut w, &sorted_key(j), &value(j)).unwrap();
                }
                w.commit().unwrap();
                i += per;
            }
        });
        drop(lmdb);
        let _ = std::fs::remove_dir_all(&ldir);
        println!(
            "  round {r}: omnibus {:.0} keys/s ({} CPU per key, {} pages), LMDB {:.0} keys/s",
            so.rate(),
            fmt_ns(so.cpu_per_unit()),
            fmt_int(pages),
            sl.rate()
        );
        o.push(so.rate());
        oc.push(so.cpu_per_unit());
        l.push(sl.rate());
        q.push(so.rate() / sl.rate());
    }
    let res = SortedResults {
        omnibus: median(&mut o),
        lmdb: median(&mut l),
        omnibus_cpu: median(&mut oc),
    };
    println!(
        "  median: omnibus {:.0} keys/s vs LMDB {:.0} keys/s = {:.2}x LMDB's rate (median of the per-round ratios)",
        res.omnibus,
        res.lmdb,
        median(&mut q)
    );
    println!();
    let _ = std::fs::remove_dir_all(&dir);
    res
}

// ---------------------------------------------------------------------------------------------
// 6. Commit cost against the size of the storage

struct GrowthResults {
    empty: Lat,
    big: Lat,
    empty_cpu: f64,
    big_cpu: f64,
}

fn bench_growth(cfg: &Config, root: &Path) -> GrowthResults {
    let big_keys: usize = if cfg.quick { 250_000 } else { 2_500_000 };
    println!(
        "== 6. one-put synced commits: empty storage vs {} keys loaded and flushed (FlushMode::Manual) ==",
        fmt_int(big_keys as u64)
    );
    let dir = root.join("growth");
    std::fs::create_dir_all(&dir).unwrap();
    let opts = Options {
        flush_mode: FlushMode::Manual,
        ..Options::default()
    };
    let mut empty = CommitTarget::open(&dir.join("empty"), opts.clone(), 0);
    let t = Instant::now();
    let mut big = CommitTarget::open(&dir.join("big"), opts, big_keys);
    println!(
        "  load + flush of {} keys: {:.1} s",
        fmt_int(big_keys as u64),
        t.elapsed().as_secs_f64()
    );
    let warm = (cfg.commits / 10).clamp(20, 200);
    for _ in 0..warm {
        empty.commit_one();
        big.commit_one();
    }
    wait_for_calm_disk(&dir, cfg.calm_wait);
    let mut l_empty = Lat::new("omnibus commit, empty storage");
    let mut l_big = Lat::new(format!("omnibus commit, {} keys", fmt_int(big_keys as u64)));
    let (mut c_empty, mut c_big) = (Spent::default(), Spent::default());
    let mut done = 0;
    while done < cfg.commits {
        let m = cfg.commit_block.min(cfg.commits - done);
        let t = Instant::now();
        c_empty.run(m as u64, || {
            (0..m).for_each(|_| l_empty.time(&mut || empty.commit_one()))
        });
        c_big.run(m as u64, || {
            (0..m).for_each(|_| l_big.time(&mut || big.commit_one()))
        });
        done += m;
        if cfg.pause > 0.0 {
            std::thread::sleep(t.elapsed().mul_f64(cfg.pause));
        }
    }
    table("empty storage", &[&l_empty, &l_big]);
    let (ce, cb) = (c_empty.cpu_per_unit(), c_big.cpu_per_unit());
    println!(
        "  process CPU per commit: empty {} vs {} keys {} = {:.2}x; p50 {:.2}x",
        fmt_ns(ce),
        fmt_int(big_keys as u64),
        fmt_ns(cb),
        cb / ce,
        l_big.p(0.5) / l_empty.p(0.5)
    );
    println!();
    drop(empty);
    drop(big);
    let _ = std::fs::remove_dir_all(&dir);
    GrowthResults {
        empty: l_empty,
        big: l_big,
        empty_cpu: ce,
        big_cpu: cb,
    }
}

// ---------------------------------------------------------------------------------------------
// 7. Durability levels

struct DurabilityResults {
    immediate: Lat,
    eventual: Lat,
    eventual_per_batch: f64,
}

fn bench_durability(cfg: &Config, root: &Path) -> DurabilityResults {
    println!("== 7. one-put commits: Durability::Immediate vs Durability::Eventual (\"nosync writes\"), FlushMode::Manual, eventual_sync_ms 100 ==");
    let dir = root.join("durability");
    std::fs::create_dir_all(&dir).unwrap();
    let opts = Options {
        flush_mode: FlushMode::Manual,
        eventual_sync_ms: 100,
        ..Options::default()
    };
    let mut imm = CommitTarget::open(&dir.join("immediate"), opts.clone(), cfg.commit_preload);
    let mut ev = CommitTarget::open(&dir.join("eventual"), opts, cfg.commit_preload);
    let warm = (cfg.commits / 10).clamp(20, 200);
    for _ in 0..warm {
        imm.commit_one();
        ev.commit_one_with(Durability::Eventual);
    }
    ev.s.sync_journal().unwrap();
    let j0 = ev.s.stats().journal;
    wait_for_calm_disk(&dir, cfg.calm_wait);
    let mut l_imm = Lat::new("omnibus commit, Durability::Immediate");
    let mut l_ev = Lat::new("omnibus commit, Durability::Eventual");
    interleave(
        cfg.commits,
        cfg.commit_block,
        cfg.pause,
        &mut [
            (&mut l_imm, &mut || imm.commit_one()),
            (&mut l_ev, &mut || ev.commit_one_with(Durability::Eventual)),
        ],
    );
    // Everything acknowledged reaches the journal before the counts are read.
    ev.s.sync_journal().unwrap();
    let j1 = ev.s.stats().journal;
    let per_batch = (j1.commits - j0.commits) as f64 / (j1.batches - j0.batches).max(1) as f64;
    table("Immediate", &[&l_imm, &l_ev]);
    println!(
        "  Eventual / Immediate: {:.1}x the rate (commits/s), {:.1}x at the median latency; the eventual storage's journal wrote {} commits in {} batches ({:.1} commits per fdatasync)",
        l_ev.rate() / l_imm.rate(),
        l_ev.rate_p50() / l_imm.rate_p50(),
        j1.commits - j0.commits,
        j1.batches - j0.batches,
        per_batch
    );
    println!();
    drop(imm);
    drop(ev);
    let _ = std::fs::remove_dir_all(&dir);
    DurabilityResults {
        immediate: l_imm,
        eventual: l_ev,
        eventual_per_batch: per_batch,
    }
}

// ---------------------------------------------------------------------------------------------

fn main() {
    let cfg = Config::parse();
    std::fs::create_dir_all(&cfg.dir).expect("create bench dir");
    describe(&cfg);
    let root = tempfile::Builder::new()
        .prefix("core-")
        .tempdir_in(&cfg.dir)
        .expect("tempdir");

    // The durable sections first: the get section's load writes about 1.5 GB, after which this
    // kind of virtual disk throttles fdatasync for a while.
    let commit = cfg.runs("commit").then(|| bench_commit(&cfg, root.path()));
    let prezero = cfg
        .runs("prezero")
        .then(|| bench_prezero(&cfg, root.path()));
    let growth = cfg.runs("growth").then(|| bench_growth(&cfg, root.path()));
    let batch = cfg.runs("batch").then(|| bench_batch(&cfg, root.path()));
    let sorted = cfg.runs("sorted").then(|| bench_sorted(&cfg, root.path()));
    let durability = cfg
        .runs("durability")
        .then(|| bench_durability(&cfg, root.path()));
    let get = cfg.runs("get").then(|| bench_get(&cfg, root.path()));

    println!("== summary ==");
    if let Some(g) = &get {
        let r = g.mmap.ratio;
        println!(
            "  get:     omnibus {:.1} ns vs LMDB {:.1} ns per get = {:.2}x LMDB's time (target <= 1.5x): {}; unflushed (scratch table) {:.2}x",
            g.mmap.omnibus,
            g.mmap.lmdb,
            r,
            verdict(r <= 1.5),
            g.scratch.ratio
        );
    }
    if let Some(c) = &commit {
        let (o, r) = (&c.omnibus, &c.raw);
        let (mean, med) = (o.rate() / r.rate(), o.rate_p50() / r.rate_p50());
        // The target is the rate (commits per second); the ratio at the median latency
        // is printed beside it because a fixed CPU cost weighs more against a fast disk.
        println!(
            "  commit:  omnibus {:.0}/s (p50 {}) vs raw pwrite+fdatasync of {} B {:.0}/s (p50 {}) = {:.2} of the raw rate (commits/s; target >= 0.8): {}; at the median latency {:.2}",
            o.rate(),
            fmt_ns(o.p(0.5)),
            fmt_int(c.bytes_per_commit),
            r.rate(),
            fmt_ns(r.p(0.5)),
            mean,
            if r.p(0.5) > 1e6 {
                "INCONCLUSIVE (disk throttled: raw median over 1 ms)"
            } else if mean >= 0.8 {
                "MET"
            } else {
                "NOT MET"
            },
            med,
        );
    }
    if let Some(b) = &batch {
        let r = b.omnibus.rate();
        println!(
            "  batch:   omnibus {:.0} keys/s ({} CPU per key) vs LMDB {:.0} keys/s ({} CPU per key) = {:.2}x LMDB (target >= 200,000 keys/s): {}",
            r,
            fmt_ns(b.omnibus.cpu_per_unit()),
            b.lmdb.rate(),
            fmt_ns(b.lmdb.cpu_per_unit()),
            r / b.lmdb.rate(),
            verdict(r >= 200_000.0)
        );
    }
    if let Some(s) = &sorted {
        println!(
            "  sorted:  omnibus {:.0} keys/s ({} CPU per key) vs LMDB {:.0} keys/s = {:.2}x (target >= 1,500,000 keys/s): {}",
            s.omnibus,
            fmt_ns(s.omnibus_cpu),
            s.lmdb,
            s.omnibus / s.lmdb,
            verdict(s.omnibus >= 1_500_000.0)
        );
    }
    if let Some(g) = &growth {
        let (c, p) = (g.big_cpu / g.empty_cpu, g.big.p(0.5) / g.empty.p(0.5));
        println!(
            "  growth:  CPU per commit {} (empty) vs {} (big) = {:.2}x (target <= 1.2x); p50 {} vs {} = {:.2}x (target <= 1.1x): {}",
            fmt_ns(g.empty_cpu),
            fmt_ns(g.big_cpu),
            c,
            fmt_ns(g.empty.p(0.5)),
            fmt_ns(g.big.p(0.5)),
            p,
            verdict(c <= 1.2 && p <= 1.1)
        );
    }
    if let Some(d) = &durability {
        println!(
            "  durability: Eventual {:.0}/s (p50 {}) vs Immediate {:.0}/s (p50 {}) = {:.1}x the rate; {:.1} eventual commits per journal fdatasync",
            d.eventual.rate(),
            fmt_ns(d.eventual.p(0.5)),
            d.immediate.rate(),
            fmt_ns(d.immediate.p(0.5)),
            d.eventual.rate() / d.immediate.rate(),
            d.eventual_per_batch
        );
    }
    if let Some(p) = &prezero {
        println!(
            "  prezero: WholeFile {:.0}/s (p50 {}, max {}) vs Ahead(4 MiB) {:.0}/s (p50 {}, max {}) = {:.2}x the rate by mean, {:.2}x by median",
            p.whole.rate(),
            fmt_ns(p.whole.p(0.5)),
            fmt_ns(p.whole.h.max() as f64),
            p.ahead.rate(),
            fmt_ns(p.ahead.p(0.5)),
            fmt_ns(p.ahead.h.max() as f64),
            p.whole.rate() / p.ahead.rate(),
            p.whole.rate_p50() / p.ahead.rate_p50()
        );
    }
}
