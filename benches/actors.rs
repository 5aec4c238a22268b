//! The actor runtime's costs and scaling, side by side in one run.
//!
//! 1. Cost of the actor hop, on tmpfs (`/dev/shm`) so the disk is out of the picture: a put
//!    through `StorageHandle` vs a direct core commit, from 1 and from 64 clients; and the
//!    reader path: `snapshot().get` on the caller's thread vs the handles' `get` (async and
//!    blocking) and `multi_get` on each `ReadPath` (the caller's thread, the reader pool).
//! 2. Throughput of 64 clients putting ~100-byte values into 1 root + 100 branches on the real
//!    disk, with each executor count given (default `1,2`; on larger machines
//!    `--executors 1,2,4,8,16`).
//!
//! `cargo bench --bench actors -- [--executors 1,2] [--seconds S] [--branches N] [--clients C]
//! [--reads-only]` (`--reads-only`: the reader path rows alone)
//! (`OMNIBUS_BENCH_QUICK=1` for a smoke run).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use omnibus::actors::{Engine, EngineOptions, ReadPath};
use omnibus::{Database, Options};

struct Args {
    executors: Vec<usize>,
    seconds: f64,
    branches: usize,
    clients: usize,
    ops: u64,
    disk: PathBuf,
    reads_only: bool,
}

fn args() -> Args {
    let quick = std::env::var("OMNIBUS_BENCH_QUICK").is_ok();
    let mut a = Args {
        executors: vec![1, 2],
        seconds: if quick { 2.0 } else { 8.0 },
        branches: if quick { 20 } else { 100 },
        clients: 64,
        ops: if quick { 2_000 } else { 20_000 },
        disk: PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("target")
            .join("bench-tmp"),
        reads_only: false,
    };
    let v: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < v.len() {
        let next = v.get(i + 1).cloned().unwrap_or_default();
        match v[i].as_str() {
            "--executors" => {
                a.executors = next
                    .split(',')
                    .map(|x| x.parse().expect("--executors"))
                    .collect()
            }
            "--seconds" => a.seconds = next.parse().expect("--seconds"),
            "--branches" => a.branches = next.parse().expect("--branches"),
            "--clients" => a.clients = next.parse().expect("--clients"),
            "--dir" => a.disk = PathBuf::from(next),
            "--reads-only" => {
                a.reads_only = true;
                i += 1;
                continue;
            }
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    a
}

fn tmpfs() -> PathBuf {
    let p = PathBuf::from("/dev/shm");
    if p.is_dir() {
        p
    } else {
        std::env::temp_dir()
    }
}

/// Puts per second from `clients` threads doing `f(client, i)` `ops` times in all.
fn threads_rate(clients: usize, ops: u64, f: Arc<dyn Fn(usize, u64) + Send + Sync>) -> f64 {
    let per = ops / clients as u64;
    let start = Instant::now();
    let hs: Vec<_> = (0..clients)
        .map(|c| {
            let f = f.clone();
            std::thread::spawn(move || {
                for i in 0..per {
                    f(c, i);
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    (per * clients as u64) as f64 / start.elapsed().as_secs_f64()
}

fn hop_cost(a: &Args) {
    println!("-- actor hop cost on tmpfs ({})", tmpfs().display());
    for clients in [1usize, 64] {
        let dir = tempfile::tempdir_in(tmpfs()).unwrap();
        let db = Database::open(dir.path().join("direct"), Options::default()).unwrap();
        let s = db.create_storage("s").unwrap();
        let direct = threads_rate(
            clients,
            a.ops,
            Arc::new(move |c, i| {
                let mut w = s.begin_write().unwrap();
                w.put(format!("{c:03}-{i:08}"), [1u8; 100]).unwrap();
                w.commit().unwrap();
            }),
        );
        drop(db);
        let engine = Engine::start(EngineOptions {
            executors: Some(2),
            ..EngineOptions::default()
        })
        .unwrap();
        let dbh = engine
            .blocking_open_database(dir.path().join("actors"), Options::default())
            .unwrap();
        let h = dbh.blocking_create_storage("s").unwrap();
        let h2 = h;
        let actor = threads_rate(
            clients,
            a.ops,
            Arc::new(move |c, i| {
                h2.blocking_put(format!("{c:03}-{i:08}"), vec![1u8; 100])
                    .unwrap()
            }),
        );
        println!("puts, {clients:>2} clients: direct core commit {direct:>9.0}/s, through the storage actor {actor:>9.0}/s, ratio actor/direct {:.2}", actor / direct);
        drop(dbh);
        engine.shutdown().unwrap();
    }
}

/// Nanoseconds per call of `f` over `keys` (one call per key), and the p50 and p99 of single
/// calls (the median is what to read on a busy machine: preemptions land in the mean).
fn per_get(keys: &[String], mut f: impl FnMut(&str)) -> (f64, u64, u64) {
    let mut h = Histogram::<u64>::new(3).unwrap();
    let t0 = Instant::now();
    for k in keys {
        let t = Instant::now();
        f(k);
        h.record(t.elapsed().as_nanos() as u64).unwrap();
    }
    (
        t0.elapsed().as_nanos() as f64 / keys.len() as f64,
        h.value_at_quantile(0.5),
        h.value_at_quantile(0.99),
    )
}

/// The reader path: a get on a snapshot on the caller's thread vs a get through the
/// handles, async and blocking, on each `ReadPath`, side by side on one database (tmpfs), one
/// client thread, keys in random order. The handles' engines run one after the other on the
/// same database.
fn read_paths(a: &Args) {
    println!(
        "-- reader path, 1 client thread, tmpfs ({})",
        tmpfs().display()
    );
    let dir = tempfile::tempdir_in(tmpfs()).unwrap();
    let path = dir.path().join("reads");
    let n = a.ops.min(20_000) as usize;
    let mut keys: Vec<String> = (0..n).map(|i| format!("key-{i:08}")).collect();
    {
        let db = Database::open(&path, Options::default()).unwrap();
        let mut w = db.root().begin_write().unwrap();
        for k in &keys {
            w.put(k, [5u8; 100]).unwrap();
        }
        w.commit().unwrap();
    }
    // A fixed shuffle (xorshift), so every row reads the same keys in the same order.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for i in (1..keys.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        keys.swap(i, (x % (i as u64 + 1)) as usize);
    }
    let mut rows: Vec<(String, f64, u64, u64)> = Vec::new();
    for reads in [ReadPath::Caller, ReadPath::Pool] {
        let engine = Engine::start(EngineOptions {
            executors: Some(2),
            reads,
            ..EngineOptions::default()
        })
        .unwrap();
        let db = engine
            .blocking_open_database(&path, Options::default())
            .unwrap();
        let h = db.root();
        if reads == ReadPath::Caller {
            let snap = h.snapshot().unwrap();
            let (ns, p50, p99) = per_get(&keys, |k| assert!(snap.get(k).unwrap().is_some()));
            rows.push(("snapshot().get, one snapshot".into(), ns, p50, p99));
            let (ns, p50, p99) = per_get(&keys, |k| {
                assert!(h.snapshot().unwrap().get(k).unwrap().is_some())
            });
            rows.push(("snapshot().get, a snapshot per get".into(), ns, p50, p99));
        }
        let (ns, p50, p99) = per_get(&keys, |k| assert!(h.blocking_get(k).unwrap().is_some()));
        rows.push((
            format!("handle blocking_get, ReadPath::{reads:?}"),
            ns,
            p50,
            p99,
        ));
        let (ns, p50, p99) = futures_lite::future::block_on(async {
            let mut hist = Histogram::<u64>::new(3).unwrap();
            let t0 = Instant::now();
            for k in &keys {
                let t = Instant::now();
                assert!(h.get(k).await.unwrap().is_some());
                hist.record(t.elapsed().as_nanos() as u64).unwrap();
            }
            (
                t0.elapsed().as_nanos() as f64 / keys.len() as f64,
                hist.value_at_quantile(0.5),
                hist.value_at_quantile(0.99),
            )
        });
        rows.push((
            format!("handle get().await, ReadPath::{reads:?}"),
            ns,
            p50,
            p99,
        ));
        let t0 = Instant::now();
        for c in keys.chunks(16) {
            assert!(h.blocking_multi_get(c).unwrap().iter().all(|v| v.is_some()));
        }
        let ns = t0.elapsed().as_nanos() as f64 / keys.len() as f64;
        rows.push((
            format!("handle blocking_multi_get of 16, per key, ReadPath::{reads:?}"),
            ns,
            0,
            0,
        ));
        drop(h);
        drop(db);
        engine.shutdown().unwrap();
    }
    // Ratios of medians where there are (single calls timed), else of means.
    let (base_mean, base_p50) = (rows[0].1, rows[0].2 as f64);
    println!(
        "{:<58} {:>9} {:>9} {:>9} {:>8}",
        "read", "mean ns", "p50 ns", "p99 ns", "x snap"
    );
    let dash = |v: u64| {
        if v == 0 {
            "-".to_string()
        } else {
            v.to_string()
        }
    };
    for (name, ns, p50, p99) in rows {
        let x = if p50 > 0 {
            p50 as f64 / base_p50
        } else {
            ns / base_mean
        };
        println!(
            "{name:<58} {ns:>9.0} {:>9} {:>9} {x:>8.1}",
            dash(p50),
            dash(p99)
        );
    }
}

fn scaling(a: &Args) {
    println!(
        "-- {} clients over 1 root + {} branches on disk ({}), {:.0} s per executor count",
        a.clients,
        a.branches,
        a.disk.display(),
        a.seconds
    );
    println!(
        "{:>9} {:>12} {:>10} {:>10} {:>14}",
        "executors", "puts/s", "p50 µs", "p99 µs", "commits/batch"
    );
    for &n in &a.executors {
        std::fs::create_dir_all(&a.disk).unwrap();
        let dir = tempfile::tempdir_in(&a.disk).unwrap();
        let engine = match Engine::start(EngineOptions {
            executors: Some(n),
            ..EngineOptions::default()
        }) {
            Ok(e) => e,
            Err(e) => {
                println!("{n:>9} skipped: {e}");
                continue;
            }
        };
        let db = engine
            .blocking_open_database(dir.path().join("db"), Options::default())
            .unwrap();
        let mut hs = vec![db.root()];
        for i in 0..a.branches {
            hs.push(db.blocking_create_storage(&format!("idx{i:03}")).unwrap());
        }
        let before = db.stats();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let secs = a.seconds;
        let (count, hist) = rt.block_on(async {
            let deadline = Instant::now() + Duration::from_secs_f64(secs);
            let tasks: Vec<_> = (0..a.clients)
                .map(|c| {
                    let hs = hs.clone();
                    tokio::spawn(async move {
                        let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
                        let mut n = 0u64;
                        while Instant::now() < deadline {
                            let s = &hs[(c * 7919 + n as usize * 31) % hs.len()];
                            let t = Instant::now();
                            s.put(format!("{c:03}-{n:010}"), vec![3u8; 100])
                                .await
                                .unwrap();
                            h.saturating_record(t.elapsed().as_micros() as u64);
                            n += 1;
                        }
                        (n, h)
                    })
                })
                .collect();
            let mut total = 0;
            let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
            for t in tasks {
                let (n, h) = t.await.unwrap();
                total += n;
                hist.add(h).unwrap();
            }
            (total, hist)
        });
        let st = db.stats();
        let batches = (st.batches - before.batches).max(1);
        println!(
            "{n:>9} {:>12.0} {:>10} {:>10} {:>14.1}",
            count as f64 / secs,
            hist.value_at_quantile(0.5),
            hist.value_at_quantile(0.99),
            (st.commits - before.commits) as f64 / batches as f64
        );
        drop(hs);
        drop(db);
        engine.shutdown().unwrap();
    }
}

fn main() {
    let a = args();
    if !a.reads_only {
        hop_cost(&a);
    }
    read_paths(&a);
    if !a.reads_only {
        scaling(&a);
    }
}
