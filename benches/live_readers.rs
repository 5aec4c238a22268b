//! The writer's commits beside readers in other processes, side by side in one run: a storage
//! is loaded with `--keys N` random keys (default 200,000; 16-byte keys, 100-byte values) and
//! flushed; then serial synced one-put commits (background flushes, the default options) are
//! timed with no reader, and with `--readers R` (default 8) reader processes beside it (this
//! binary started again as a reader: a read-only open, then 20 random gets and a
//! `Storage::catch_up` every 10 ms, each holding its snapshot until its next catch-up), and,
//! as a control, with as many processes that spin for 9 ms and sleep for 1 ms, touching no
//! storage (on a virtual machine an idle CPU makes the writer's wake-up after each
//! `fdatasync` slow, so busy neighbours speed serial commits up), in phases of `--secs S`
//! (default 5) in a rotating order, four each. Prints commits/s, p50/p99 and process CPU per
//! commit for each, and the ratios (target: with readers >= 0.9x without).
//!
//! `cargo bench --bench live_readers -- [--keys N] [--readers R] [--secs S] [--dir D]`

#[path = "common/mod.rs"]
mod common;
use common::{cpu_now, key, splitmix, value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use omnibus::{Options, Storage};

/// Set in a reader child's environment: the storage to read, and how many keys it has.
const READER_DIR: &str = "OMNIBUS_LIVE_READERS_BENCH_DIR";
const READER_KEYS: &str = "OMNIBUS_LIVE_READERS_BENCH_KEYS";
/// Set in a control child's environment: it spins for 9 ms and sleeps for 1 ms, again and
/// again, touching no storage: what keeping the CPUs busy does to the writer alone.
const CONTROL: &str = "OMNIBUS_LIVE_READERS_BENCH_CONTROL";

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

/// A reader child: reads until its parent closes its stdin.
fn reader(dir: &Path, keys: u64) {
    let s = Storage::open(
        dir,
        Options {
            read_only: true,
            ..Options::default()
        },
    )
    .expect("reader: open");
    println!("OPEN");
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let d = done.clone();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        d.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let mut i = 0u64;
    while !done.load(std::sync::atomic::Ordering::Relaxed) {
        s.catch_up().expect("reader: catch up");
        let r = s.begin_read().unwrap();
        for _ in 0..20 {
            i += 1;
            let k = splitmix(i) % keys;
            assert!(r.get(key(k)).unwrap().is_some(), "reader: key {k} missing");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A control child: spins for 9 ms and sleeps for 1 ms until its stdin closes.
fn control() {
    println!("OPEN");
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let d = done.clone();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        d.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let mut x = 0u64;
    while !done.load(std::sync::atomic::Ordering::Relaxed) {
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(9) {
            x = splitmix(x);
        }
        std::hint::black_box(x);
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn start_readers(n: usize, dir: &Path, keys: u64, control: bool) -> Vec<Child> {
    (0..n)
        .map(|_| {
            let mut cmd = Command::new(std::env::current_exe().unwrap());
            if control {
                cmd.env(CONTROL, "1");
            }
            let mut c = cmd
                .env(READER_DIR, dir)
                .env(READER_KEYS, keys.to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("starting a reader");
            let mut l = String::new();
            BufReader::new(c.stdout.as_mut().unwrap())
                .read_line(&mut l)
                .unwrap();
            assert_eq!(l.trim(), "OPEN", "a reader did not open");
            c
        })
        .collect()
}

fn commit_for(s: &Storage, next: &mut u64, p: &mut Phase, secs: f64) {
    let (t0, c0) = (Instant::now(), cpu_now());
    let mut n = 0;
    while t0.elapsed().as_secs_f64() < secs {
        let t = Instant::now();
        let mut w = s.begin_write().unwrap();
        w.put(key(*next), value(*next)).unwrap();
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
    if std::env::var(CONTROL).is_ok() {
        return control();
    }
    if let Ok(dir) = std::env::var(READER_DIR) {
        let keys = std::env::var(READER_KEYS).unwrap().parse().unwrap();
        return reader(Path::new(&dir), keys);
    }
    let mut keys = 200_000u64;
    let mut readers = 8usize;
    let mut secs = 5.0f64;
    let mut dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join("bench-tmp");
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let next = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--keys" => keys = next.parse().expect("--keys"),
            "--readers" => readers = next.parse().expect("--readers"),
            "--secs" => secs = next.parse().expect("--secs"),
            "--dir" => dir = PathBuf::from(next),
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    if std::env::var("OMNIBUS_BENCH_QUICK").is_ok() {
        keys = keys.min(50_000);
        secs = secs.min(1.0);
    }
    std::fs::create_dir_all(&dir).unwrap();
    println!(
        "live_readers bench: {keys} keys, serial one-put commits with 0 and with {readers} reader processes, {secs} s phases; I/O path: {}",
        omnibus::env::io_backend().reason
    );
    let tmp = tempfile::tempdir_in(&dir).unwrap();
    let path = tmp.path().join("s");
    let s = Storage::open(&path, Options::default()).unwrap();
    for t in (0..keys).step_by(20_000) {
        let mut w = s.begin_write().unwrap();
        for k in t..(t + 20_000).min(keys) {
            w.put(key(k), value(k)).unwrap();
        }
        w.commit().unwrap();
    }
    s.flush().unwrap();
    let mut next = keys;
    commit_for(&s, &mut next, &mut Phase::new(), secs.min(1.0));
    let (mut alone, mut beside, mut control) = (Phase::new(), Phase::new(), Phase::new());
    let with = |s: &Storage, next: &mut u64, p: &mut Phase, ctl: bool| {
        let children = start_readers(readers, &path, keys, ctl);
        commit_for(s, next, p, secs);
        for mut c in children {
            drop(c.stdin.take());
            let st = c.wait().unwrap();
            assert!(st.success(), "a child failed: {st:?}");
        }
    };
    // Alternating, in a different order each round (the disk's latency drifts).
    for round in 0..4 {
        match round % 3 {
            0 => {
                commit_for(&s, &mut next, &mut alone, secs);
                with(&s, &mut next, &mut beside, false);
                with(&s, &mut next, &mut control, true);
            }
            1 => {
                with(&s, &mut next, &mut beside, false);
                with(&s, &mut next, &mut control, true);
                commit_for(&s, &mut next, &mut alone, secs);
            }
            _ => {
                with(&s, &mut next, &mut control, true);
                commit_for(&s, &mut next, &mut alone, secs);
                with(&s, &mut next, &mut beside, false);
            }
        }
    }
    println!(
        "{:<18} {:>9} {:>9} {:>9} {:>11} {:>14}",
        "phase", "commits", "p50 µs", "p99 µs", "commits/s", "CPU µs/commit"
    );
    let rate = |p: &Phase| p.commits as f64 / p.secs;
    for (name, p) in [
        ("no readers", &alone),
        ("beside readers", &beside),
        ("beside spinners", &control),
    ] {
        println!(
            "{:<18} {:>9} {:>9} {:>9} {:>11.0} {:>14.1}",
            name,
            p.commits,
            p.hist.value_at_quantile(0.5),
            p.hist.value_at_quantile(0.99),
            rate(p),
            p.cpu * 1e6 / p.commits as f64
        );
    }
    println!(
        "commits/s beside {readers} readers / without: {:.2}x (target >= 0.9x); beside readers / beside {readers} spinning processes (the CPUs kept busy alike): {:.2}x",
        rate(&beside) / rate(&alone),
        rate(&beside) / rate(&control)
    );
    let st = s.stats();
    println!(
        "data file after: {:.1} MiB ({} pages in use)",
        st.data_file_bytes as f64 / (1 << 20) as f64,
        st.pages_used
    );
}
