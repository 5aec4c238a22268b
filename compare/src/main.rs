//! Serial durable single-key commits, side by side in one run: omnibus, fjall, and a raw
//! `pwrite` + `fdatasync` of 4 KiB (the floor a synced commit can reach on this device).
//!
//! Workload: 24-byte random keys, 150-byte random values, every commit one new key,
//! acknowledged only once durable; each engine first bulk-loads `--preload` pairs in one
//! transaction. The cases run interleaved in blocks of 25 commits, the first case
//! of each round rotating, so that drift on the device (other load, the drive's own state)
//! falls on all of them alike. See README.md.

use std::ffi::{CStr, CString};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;

const KEY_SIZE: usize = 24;
const VALUE_SIZE: usize = 150;
const RAW_WRITE: usize = 4096;
const WARMUP: usize = 100;
const BLOCK: usize = 25;

#[derive(Parser, Debug)]
#[command(about = "Serial durable single-key commits: omnibus vs fjall vs raw pwrite+fdatasync")]
struct Args {
    /// Directory to run in (a fresh subdirectory is made in it and removed at the end).
    /// Default: compare/target/run. Avoid tmpfs: its syncs cost nothing.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Key/value pairs bulk-loaded into each engine, in one transaction, before the commits.
    #[arg(long, default_value_t = 200_000)]
    preload: usize,
    /// Timed commits per case.
    #[arg(long, default_value_t = 2_000)]
    commits: usize,
    /// omnibus's journal I/O path: auto, syscalls or ring (`OMNIBUS_JOURNAL_IO`, when set,
    /// overrides it).
    #[arg(long, default_value = "auto", value_parser = parse_journal_io)]
    journal_io: omnibus::JournalIo,
    /// omnibus's write buffer in bytes (`Options::write_buffer_bytes`); 0: none. Default:
    /// the library's (`omnibus::DEFAULT_WRITE_BUFFER_BYTES`).
    #[arg(long, default_value_t = omnibus::DEFAULT_WRITE_BUFFER_BYTES)]
    write_buffer_bytes: u64,
    /// omnibus's apply steps in pages (`Storage::set_apply_step_pages`); 0: whole applies.
    #[arg(long, default_value_t = 0)]
    apply_step_pages: u64,
    /// Seed of the keys and values.
    #[arg(long, default_value_t = 0x5eed)]
    seed: u64,
}

fn parse_journal_io(s: &str) -> Result<omnibus::JournalIo, String> {
    omnibus::JournalIo::parse(s).ok_or_else(|| format!("`{s}`: expected auto, syscalls or ring"))
}

type BoxError = Box<dyn std::error::Error>;

/// splitmix64: enough for keys and values that do not compress or sort.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }

    fn pair(&mut self) -> ([u8; KEY_SIZE], [u8; VALUE_SIZE]) {
        let mut k = [0u8; KEY_SIZE];
        let mut v = [0u8; VALUE_SIZE];
        self.fill(&mut k);
        self.fill(&mut v);
        (k, v)
    }
}

/// One engine's durable commit of one key, or the raw baseline's one synced write.
trait Case {
    fn name(&self) -> &'static str;
    /// Makes the next commit's input (untimed).
    fn prepare(&mut self);
    /// One durable commit of what `prepare` made (timed).
    fn commit(&mut self) -> Result<(), BoxError>;
}

struct OmnibusCase {
    storage: omnibus::Storage,
    rng: SplitMix64,
    next: ([u8; KEY_SIZE], [u8; VALUE_SIZE]),
}

impl Case for OmnibusCase {
    fn name(&self) -> &'static str {
        "omnibus"
    }
    fn prepare(&mut self) {
        self.next = self.rng.pair();
    }
    fn commit(&mut self) -> Result<(), BoxError> {
        let mut w = self.storage.begin_write()?;
        w.put(self.next.0, self.next.1)?;
        w.commit()?;
        Ok(())
    }
}

struct FjallCase {
    db: fjall::SingleWriterTxDatabase,
    keyspace: fjall::SingleWriterTxKeyspace,
    rng: SplitMix64,
    next: ([u8; KEY_SIZE], [u8; VALUE_SIZE]),
}

impl Case for FjallCase {
    fn name(&self) -> &'static str {
        "fjall"
    }
    fn prepare(&mut self) {
        self.next = self.rng.pair();
    }
    fn commit(&mut self) -> Result<(), BoxError> {
        let mut tx = self.db.write_tx();
        tx.insert(&self.keyspace, &self.next.0[..], &self.next.1[..]);
        tx.commit()?;
        self.db.persist(fjall::PersistMode::SyncAll)?;
        Ok(())
    }
}

struct RawCase {
    file: File,
    offset: u64,
    rng: SplitMix64,
    buf: Vec<u8>,
}

impl Case for RawCase {
    fn name(&self) -> &'static str {
        "raw"
    }
    fn prepare(&mut self) {
        self.rng.fill(&mut self.buf);
    }
    fn commit(&mut self) -> Result<(), BoxError> {
        self.file.write_all_at(&self.buf, self.offset)?; // pwrite
        self.file.sync_data()?; // fdatasync
        self.offset += RAW_WRITE as u64;
        Ok(())
    }
}

struct Timings {
    hist: Histogram<u64>,
    total: Duration,
    count: u64,
    max: Duration,
    /// CPU time of the committing thread (user + system), summed over the timed commits.
    cpu: Duration,
}

impl Timings {
    fn new() -> Timings {
        Timings {
            // Nanoseconds, 1 ns to 60 s, 3 significant digits.
            hist: Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds"),
            total: Duration::ZERO,
            count: 0,
            max: Duration::ZERO,
            cpu: Duration::ZERO,
        }
    }

    fn record(&mut self, d: Duration, cpu: Duration) {
        self.cpu += cpu;
        let ns = (d.as_nanos() as u64).clamp(1, 60_000_000_000);
        self.hist.record(ns).expect("value within bounds");
        self.total += d;
        self.count += 1;
        self.max = self.max.max(d);
    }

    /// The histogram's value at `q` (the top of its bucket, so capped at the exact maximum).
    fn quantile_us(&self, q: f64) -> f64 {
        let ns = self
            .hist
            .value_at_quantile(q)
            .min(self.max.as_nanos() as u64);
        ns as f64 / 1000.0
    }

    /// Mean CPU time of the committing thread per commit, in µs.
    fn cpu_us(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / self.count.max(1) as f64
    }

    fn commits_per_s(&self) -> f64 {
        self.count as f64 / self.total.as_secs_f64()
    }
}

fn run_block(case: &mut dyn Case, n: usize, t: Option<&mut Timings>) -> Result<(), BoxError> {
    match t {
        Some(t) => {
            for _ in 0..n {
                case.prepare();
                let cpu = thread_cpu();
                let start = Instant::now();
                case.commit()?;
                let took = start.elapsed();
                t.record(took, thread_cpu().saturating_sub(cpu));
            }
        }
        None => {
            for _ in 0..n {
                case.prepare();
                case.commit()?;
            }
        }
    }
    Ok(())
}

/// CPU time (user + system) of the calling thread so far: the time a commit keeps its thread
/// busy, as against waiting for the device.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-parameter; CLOCK_THREAD_CPUTIME_ID needs nothing else.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn kernel_release() -> String {
    // SAFETY: `uname` fills the zeroed struct; `release` is NUL-terminated on success.
    unsafe {
        let mut u: libc::utsname = std::mem::zeroed();
        if libc::uname(&mut u) != 0 {
            return "unknown".into();
        }
        CStr::from_ptr(u.release.as_ptr())
            .to_string_lossy()
            .into_owned()
    }
}

/// The file system of `path` (statfs `f_type`): its name where known, and the magic number.
fn fs_type(path: &Path) -> (u64, &'static str) {
    let c = match CString::new(path.as_os_str().as_bytes()) {
        Ok(c) => c,
        Err(_) => return (0, "unknown"),
    };
    // SAFETY: `c` is a valid C string; `statfs` fills the zeroed struct.
    let magic = unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        if libc::statfs(c.as_ptr(), &mut st) != 0 {
            return (0, "unknown");
        }
        (st.f_type as u64) & 0xFFFF_FFFF
    };
    let name = match magic {
        0xEF53 => "ext4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x0102_1994 => "tmpfs",
        0x2FC1_2FC1 => "zfs",
        0x794C_7630 => "overlayfs",
        _ => "other",
    };
    (magic, name)
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

fn open_raw(dir: &Path, writes: usize, seed: u64) -> Result<RawCase, BoxError> {
    let path = dir.join("raw.dat");
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)?;
    // Real zeros, written and synced: the timed writes then overwrite allocated, written
    // blocks (no extent conversion or size change for fdatasync to persist).
    let zeros = vec![0u8; 1 << 20];
    let mut left = writes * RAW_WRITE;
    while left > 0 {
        let n = left.min(zeros.len());
        file.write_all(&zeros[..n])?;
        left -= n;
    }
    file.sync_all()?;
    sync_dir(dir)?;
    Ok(RawCase {
        file,
        offset: 0,
        rng: SplitMix64(seed),
        buf: vec![0u8; RAW_WRITE],
    })
}

fn main() -> Result<(), BoxError> {
    let args = Args::parse();

    let parent = args
        .dir
        .clone()
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/run"));
    std::fs::create_dir_all(&parent)?;
    let run_dir = tempfile::Builder::new()
        .prefix("compare-")
        .tempdir_in(&parent)?;
    let dir = run_dir.path();

    let (magic, fs_name) = fs_type(dir);
    println!("directory:  {}", dir.display());
    println!("file system: {fs_name} (f_type {magic:#x})");
    println!("kernel:     {}", kernel_release());
    if magic == 0x0102_1994 {
        eprintln!(
            "warning: {} is on tmpfs: fdatasync does nothing there, the numbers say nothing \
             about a device",
            dir.display()
        );
    }

    // Open all three.
    let omnibus_dir = dir.join("omnibus");
    let storage = omnibus::Storage::open(
        &omnibus_dir,
        omnibus::Options {
            journal_io: args.journal_io,
            write_buffer_bytes: args.write_buffer_bytes,
            ..omnibus::Options::default()
        },
    )?;
    storage.set_apply_step_pages(args.apply_step_pages);
    let (path, why) = storage.journal_io();
    println!("omnibus journal I/O: {} ({why})", path.name());

    let db = fjall::SingleWriterTxDatabase::builder(dir.join("fjall")).open()?;
    let keyspace = db.keyspace("test", fjall::KeyspaceCreateOptions::default)?;

    let raw = open_raw(dir, WARMUP + args.commits, args.seed ^ 0xAAAA)?;

    // Bulk load, one transaction each, then made durable.
    let t = Instant::now();
    {
        let mut rng = SplitMix64(args.seed);
        let mut w = storage.begin_write()?;
        for _ in 0..args.preload {
            let (k, v) = rng.pair();
            w.put(k, v)?;
        }
        w.commit()?;
        storage.flush()?;
    }
    let omnibus_load = t.elapsed();
    let t = Instant::now();
    {
        let mut rng = SplitMix64(args.seed);
        let mut tx = db.write_tx();
        for _ in 0..args.preload {
            let (k, v) = rng.pair();
            tx.insert(&keyspace, &k[..], &v[..]);
        }
        tx.commit()?;
        db.persist(fjall::PersistMode::SyncAll)?;
    }
    let fjall_load = t.elapsed();
    println!(
        "preload:    {} pairs ({KEY_SIZE} B keys, {VALUE_SIZE} B values): omnibus {:.2} s, \
         fjall {:.2} s",
        args.preload,
        omnibus_load.as_secs_f64(),
        fjall_load.as_secs_f64()
    );

    // The engines get the same key sequence, distinct from the preloaded keys.
    let commit_seed = args.seed.wrapping_add(1) ^ 0x0123_4567_89AB_CDEF;
    let mut cases: Vec<Box<dyn Case>> = vec![
        Box::new(OmnibusCase {
            storage,
            rng: SplitMix64(commit_seed),
            next: ([0; KEY_SIZE], [0; VALUE_SIZE]),
        }),
        Box::new(FjallCase {
            db,
            keyspace,
            rng: SplitMix64(commit_seed),
            next: ([0; KEY_SIZE], [0; VALUE_SIZE]),
        }),
        Box::new(raw),
    ];

    for case in cases.iter_mut() {
        run_block(case.as_mut(), WARMUP, None)?;
    }

    // Timed: blocks of BLOCK commits, cases alternating, the first case rotating per round.
    let mut timings: Vec<Timings> = cases.iter().map(|_| Timings::new()).collect();
    let mut done = 0;
    let mut round = 0;
    while done < args.commits {
        let n = BLOCK.min(args.commits - done);
        for i in 0..cases.len() {
            let c = (round + i) % cases.len();
            run_block(cases[c].as_mut(), n, Some(&mut timings[c]))?;
        }
        done += n;
        round += 1;
    }

    println!(
        "commits:    {} timed per case after {WARMUP} warm-up, in blocks of {BLOCK}, serial; \
         raw = {RAW_WRITE} B pwrite + fdatasync",
        args.commits
    );
    println!();
    println!(
        "{:<8} {:>9} {:>9} {:>9} {:>9} {:>10} {:>7} {:>10} {:>7} {:>8}",
        "case",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "max µs",
        "commits/s",
        "/raw",
        "1/p50",
        "/raw",
        "CPU µs"
    );
    let raw_i = cases.len() - 1;
    let raw_cps = timings[raw_i].commits_per_s();
    let raw_inv = 1e6 / timings[raw_i].quantile_us(0.5);
    for (case, t) in cases.iter().zip(&timings) {
        let p50 = t.quantile_us(0.5);
        let cps = t.commits_per_s();
        let inv = 1e6 / p50;
        println!(
            "{:<8} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>10.0} {:>7.2} {:>10.0} {:>7.2} {:>8.1}",
            case.name(),
            p50,
            t.quantile_us(0.99),
            t.quantile_us(0.999),
            t.max.as_secs_f64() * 1e6,
            cps,
            cps / raw_cps,
            inv,
            inv / raw_inv,
            t.cpu_us(),
        );
    }
    let (o, f) = (&timings[0], &timings[1]);
    println!();
    println!(
        "omnibus/fjall: commits/s {:.2}x, p50 {:.2}x (below 1: omnibus's median commit is faster)",
        o.commits_per_s() / f.commits_per_s(),
        o.quantile_us(0.5) / f.quantile_us(0.5),
    );

    // Close the engines before their files go.
    drop(cases);
    run_dir.close()?;
    Ok(())
}
