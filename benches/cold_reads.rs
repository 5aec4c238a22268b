//! Async point reads of a storage larger than the page cache holds, from a tokio runtime: do
//! they block the runtime's workers? Side by side in one run, with the same data:
//!
//! - `CallerAlways`: every handle `get` reads on the calling worker's thread, page faults
//!   included (how handles read before reads could check residency);
//! - `Caller` (the default): a get reads on the caller's thread only when every page on its
//!   path is known to be in memory, else on the engine's reader pool;
//! - `Pool` (`--paths pool` only): every get is read on the engine's reader pool, never on a
//!   worker: what the ticks show then is what the machine, the runtime and the engine's own
//!   threads add, the floor for the other two rows.
//!
//! The storage (`--gib`, default 4) is written once, flushed, and dropped from the page cache
//! (`fdatasync`, then `posix_fadvise(DONTNEED)` of its data file with nothing mapping it) before
//! each cold case. A tokio runtime with 2 workers runs 64 tasks doing gets of random keys and one
//! task ticking every 1 ms; the table gives the largest gap between two ticks and their p99 (a
//! worker stuck in page faults delays the ticks), and the gets per second. Then the warm rows:
//! the same tasks over 20,000 keys read once before (every page in memory), gets per second
//! for both paths.
//!
//! With `--cache-gib C` the process moves itself, once the storage is written, into a cgroup v1
//! memory group limited to C GiB (`/sys/fs/cgroup/memory`, root only), so that the page cache
//! cannot hold the whole storage and random reads stay cold for the whole case (without it,
//! the kernel's read-around warms a storage smaller than the machine's memory in seconds).
//!
//! On stderr, each case's timed span and its five largest tick gaps with the instants they
//! ended, in CLOCK_MONOTONIC seconds (the clock of `perf record -k CLOCK_MONOTONIC`), to find
//! in a trace what the threads did then; the tokio workers are named `tokio-worker`.
//!
//! `cargo bench --bench cold_reads -- [--gib G] [--seconds S] [--dir D] [--cache-gib C]
//! [--db PATH] [--only cold|warm] [--paths caller|pool|both]` (`OMNIBUS_BENCH_QUICK=1`: 0.25 GiB, 3 s a case; `--db`
//! keeps the database at PATH for the next run, which then skips the build).

use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use omnibus::actors::{Engine, EngineOptions, ReadPath};
use omnibus::{Database, Options};

const VALUE: usize = 1000;
const TASKS: usize = 64;
const WARM_KEYS: u64 = 20_000;

struct Args {
    gib: f64,
    seconds: f64,
    dir: PathBuf,
    /// Page cache this process may hold during the cases (a cgroup v1 memory limit), GiB.
    cache_gib: Option<f64>,
    /// A database kept between runs: built there when missing, else read as it is (it must
    /// have been built with the same `--gib`).
    db: Option<PathBuf>,
    /// Which cases run: `cold`, `warm` or both (`None`).
    only: Option<String>,
    /// The read paths of the rows: `caller` (only `Caller`: a cold `CallerAlways` case can
    /// stall for minutes), `pool` (only `Pool`: no read ever runs on a tokio worker, what the
    /// ticks show then is the machine's and the runtime's share) or `both` (`CallerAlways`
    /// and `Caller`, the default).
    paths: &'static [ReadPath],
}

impl Args {
    /// The read paths a case runs with: none when `--only` names the other kind (`skip`).
    fn paths(&self, skip: &str) -> &'static [ReadPath] {
        if self.only.as_deref() == Some(skip) {
            &[]
        } else {
            self.paths
        }
    }
}

fn args() -> Args {
    let quick = std::env::var("OMNIBUS_BENCH_QUICK").is_ok();
    let mut a = Args {
        gib: if quick { 0.25 } else { 4.0 },
        seconds: if quick { 3.0 } else { 10.0 },
        dir: PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("target")
            .join("bench-tmp"),
        cache_gib: None,
        db: None,
        only: None,
        paths: &[ReadPath::CallerAlways, ReadPath::Caller],
    };
    let v: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < v.len() {
        let next = v.get(i + 1).cloned().unwrap_or_default();
        match v[i].as_str() {
            "--gib" => a.gib = next.parse().expect("--gib"),
            "--seconds" => a.seconds = next.parse().expect("--seconds"),
            "--dir" => a.dir = PathBuf::from(next),
            "--cache-gib" => a.cache_gib = Some(next.parse().expect("--cache-gib")),
            "--db" => a.db = Some(PathBuf::from(next)),
            "--only" if next == "cold" || next == "warm" => a.only = Some(next),
            "--paths" if next == "caller" => a.paths = &[ReadPath::Caller],
            "--paths" if next == "pool" => a.paths = &[ReadPath::Pool],
            "--paths" if next == "both" => a.paths = &[ReadPath::CallerAlways, ReadPath::Caller],
            "--bench" => {
                i += 1;
                continue;
            }
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    a
}

fn key(i: u64) -> [u8; 8] {
    // Spread over the key space so that neighbours are not in one leaf.
    i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes()
}

/// Writes `n` keys of `VALUE` bytes into the root of a database at `path` and flushes it.
fn build(path: &Path, n: u64) {
    let db = Database::open(path, Options::default()).expect("open");
    let root = db.root();
    let per_txn = 20_000;
    let mut i = 0;
    while i < n {
        let mut w = root.begin_write().expect("begin");
        for j in i..(i + per_txn).min(n) {
            w.put(key(j), [(j % 251) as u8; VALUE]).expect("put");
        }
        w.commit().expect("commit");
        i += per_txn;
        if i % 400_000 == 0 {
            db.flush().expect("flush");
        }
    }
    db.flush().expect("flush");
}

/// Drops the database's data files from the page cache (nothing may map them now); returns
/// how many files it advised.
fn drop_cache(path: &Path) -> usize {
    let mut n = 0;
    for entry in walk(path) {
        if entry.file_name().is_some_and(|n| n == "data.pages") {
            let f = std::fs::File::open(&entry).expect("open data file");
            f.sync_data().expect("fdatasync");
            // SAFETY: an advice on an open file descriptor; no memory is passed.
            let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            assert_eq!(r, 0, "posix_fadvise");
            n += 1;
        }
    }
    n
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// This process in a cgroup v1 memory group of its own, limited to some GiB; left (and the
/// group removed) on drop.
struct CacheLimit {
    dir: PathBuf,
}

impl CacheLimit {
    fn enter(gib: f64) -> CacheLimit {
        let dir = PathBuf::from(format!(
            "/sys/fs/cgroup/memory/omnibus-cold-reads-{}",
            std::process::id()
        ));
        std::fs::create_dir(&dir).expect("creating a cgroup v1 memory group (root, cgroup v1)");
        let bytes = (gib * (1u64 << 30) as f64) as u64;
        std::fs::write(dir.join("memory.limit_in_bytes"), bytes.to_string())
            .expect("memory.limit_in_bytes");
        std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string())
            .expect("joining the memory group");
        println!("page cache limited to {gib} GiB ({})", dir.display());
        CacheLimit { dir }
    }
}

impl Drop for CacheLimit {
    fn drop(&mut self) {
        let root = self
            .dir
            .parent()
            .expect("the memory hierarchy")
            .join("cgroup.procs");
        let _ = std::fs::write(root, std::process::id().to_string());
        let _ = std::fs::remove_dir(&self.dir);
    }
}

struct Row {
    gets_per_s: f64,
    max_gap_ms: f64,
    p99_gap_ms: f64,
    cold_sent: u64,
    /// The largest gaps, `(gap in ms, CLOCK_MONOTONIC seconds at its end)`, largest first:
    /// the clock of `perf record -k CLOCK_MONOTONIC`, to find what the threads did then.
    top_gaps: Vec<(f64, f64)>,
}

/// CLOCK_MONOTONIC now, in seconds.
fn monotonic_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// Gaps kept with their times (the largest ones).
const TOP_GAPS: usize = 5;

/// 64 tasks getting keys of `0..keys` for `seconds` on a 2-worker tokio runtime, one task
/// ticking every 1 ms.
fn run(path: &Path, reads: ReadPath, keys: u64, seconds: f64, warm_first: bool) -> Row {
    let engine = Engine::start(EngineOptions {
        executors: Some(2),
        reads,
        ..EngineOptions::default()
    })
    .expect("engine");
    let db = engine
        .blocking_open_database(path, Options::default())
        .expect("open");
    let root = db.root();
    if warm_first {
        for i in 0..keys {
            root.blocking_get(key(i)).expect("get").expect("present");
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("tokio-worker")
        .enable_all()
        .build()
        .expect("runtime");
    let stop = Arc::new(AtomicBool::new(false));
    let gets = Arc::new(AtomicU64::new(0));
    let cold0 = omnibus::actors::cold_reads();
    let ((gaps, top_gaps), elapsed) = rt.block_on(async {
        let mut tasks = Vec::new();
        for t in 0..TASKS as u64 {
            let (root, stop, gets) = (root.clone(), stop.clone(), gets.clone());
            tasks.push(tokio::spawn(async move {
                let mut x = t.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
                while !stop.load(Ordering::Relaxed) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let v = root.get(key(x % keys)).await.expect("get");
                    assert!(v.is_some());
                    gets.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        let ticker = {
            let stop = stop.clone();
            // From the spawn: a ticker that never gets a worker still counts its wait.
            let mut last = Instant::now();
            tokio::spawn(async move {
                let mut gaps = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("hist");
                let mut top: Vec<(f64, f64)> = Vec::with_capacity(TOP_GAPS + 1);
                let mut iv = tokio::time::interval(Duration::from_millis(1));
                iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    iv.tick().await;
                    let now = Instant::now();
                    let gap = (now - last).as_micros().max(1) as u64;
                    gaps.record(gap).expect("record");
                    last = now;
                    let ms = gap as f64 / 1000.0;
                    if top.len() < TOP_GAPS || ms > top[TOP_GAPS - 1].0 {
                        top.push((ms, monotonic_s()));
                        top.sort_by(|a, b| b.0.total_cmp(&a.0));
                        top.truncate(TOP_GAPS);
                    }
                    if stop.load(Ordering::Relaxed) {
                        return (gaps, top);
                    }
                }
            })
        };
        let t0 = Instant::now();
        let m0 = monotonic_s();
        tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
        stop.store(true, Ordering::Relaxed);
        let elapsed = t0.elapsed();
        eprintln!(
            "{reads:?}: timed from {m0:.6} to {:.6} (CLOCK_MONOTONIC s)",
            monotonic_s()
        );
        for t in tasks {
            t.await.expect("task");
        }
        (ticker.await.expect("ticker"), elapsed)
    });
    let row = Row {
        gets_per_s: gets.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64(),
        max_gap_ms: gaps.max() as f64 / 1000.0,
        p99_gap_ms: gaps.value_at_quantile(0.99) as f64 / 1000.0,
        cold_sent: omnibus::actors::cold_reads() - cold0,
        top_gaps,
    };
    drop((root, db));
    engine.shutdown().expect("shutdown");
    row
}

/// The run's largest gaps and when they ended (on stderr, beside the table).
fn print_top(r: &Row) {
    let list: Vec<String> = r
        .top_gaps
        .iter()
        .map(|(ms, at)| format!("{ms:.1} ms at {at:.6}"))
        .collect();
    eprintln!(
        "largest gaps (CLOCK_MONOTONIC s at the end): {}",
        list.join(", ")
    );
}

fn main() {
    let a = args();
    let n = (a.gib * (1u64 << 30) as f64 / (VALUE as f64 + 60.0)) as u64;
    std::fs::create_dir_all(&a.dir).expect("bench dir");
    let dir = tempfile::Builder::new()
        .prefix("cold-reads-")
        .tempdir_in(&a.dir)
        .expect("tempdir");
    let path = a.db.clone().unwrap_or_else(|| dir.path().join("db"));
    if path.exists() {
        println!("reusing the database at {}", path.display());
    } else {
        let t = Instant::now();
        build(&path, n);
        println!(
            "built {n} keys of {VALUE} B ({:.2} GiB of values) in {:.1} s at {}",
            n as f64 * VALUE as f64 / (1u64 << 30) as f64,
            t.elapsed().as_secs_f64(),
            path.display()
        );
    }
    let group = a.cache_gib.map(CacheLimit::enter);
    println!(
        "tokio: 2 workers, {TASKS} tasks doing gets, 1 task ticking every 1 ms; {} s a case",
        a.seconds
    );
    println!();
    println!("| case | reads | gets/s | largest tick gap (ms) | p99 tick gap (ms) | gets sent to the pool |");
    // `Pool` rows send every get; the count is of the gets a caller's thread sent on.
    let sent = |reads: ReadPath, r: &Row| {
        if reads == ReadPath::Pool {
            "all".to_string()
        } else {
            r.cold_sent.to_string()
        }
    };
    println!("|---|---|---|---|---|---|");
    let mut cold = Vec::new();
    for &reads in a.paths("warm") {
        assert!(
            drop_cache(&path) > 0,
            "no data file found to drop from the page cache"
        );
        let r = run(&path, reads, n, a.seconds, false);
        println!(
            "| cold, random keys | {reads:?} | {:.0} | {:.1} | {:.2} | {} |",
            r.gets_per_s,
            r.max_gap_ms,
            r.p99_gap_ms,
            sent(reads, &r)
        );
        print_top(&r);
        cold.push(r);
    }
    // The warm rows with the whole page cache.
    drop(group);
    let mut warm = Vec::new();
    for &reads in a.paths("cold") {
        let r = run(&path, reads, WARM_KEYS, a.seconds, true);
        println!(
            "| warm, {WARM_KEYS} keys read before | {reads:?} | {:.0} | {:.1} | {:.2} | {} |",
            r.gets_per_s,
            r.max_gap_ms,
            r.p99_gap_ms,
            sent(reads, &r)
        );
        print_top(&r);
        warm.push(r);
    }
    println!();
    if let [always, caller] = &cold[..] {
        println!(
            "cold: largest tick gap Caller / CallerAlways = {:.1} / {:.1} ms",
            caller.max_gap_ms, always.max_gap_ms
        );
    }
    if let [always, caller] = &warm[..] {
        println!(
            "warm: gets/s Caller / CallerAlways = {:.2}x; largest tick gap {:.1} / {:.1} ms",
            caller.gets_per_s / always.gets_per_s,
            caller.max_gap_ms,
            always.max_gap_ms
        );
    }
}
