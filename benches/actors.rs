//! The actor runtime's costs and scaling, side by side in one run.
//!
//! 1. Cost of the actor hop, on tmpfs (`/dev/shm`) so the disk is out of the picture: a put
//!    through `StorageHandle` vs a direct core commit, from 1 and from 64 clients; and reads:
//!    `get` via the reader pool vs `snapshot().get` on the caller's thread.
//! 2. Throughput of 64 clients putting ~100-byte values into 1 root + 100 branches on the real
//!    disk, with each executor count given (default `1,2`; on larger machines
//!    `--executors 1,2,4,8,16`).
//!
//! `cargo bench --bench actors -- [--executors 1,2] [--seconds S] [--branches N] [--clients C]`
//! (`OMNIBUS_BENCH_QUICK=1` for a smoke run).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use omnibus::actors::{Engine, EngineOptions};
use omnibus::{Database, Options};

struct Args {
    executors: Vec<usize>,
    seconds: f64,
    branches: usize,
    clients: usize,
    ops: u64,
    disk: PathBuf,
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
        let h2 = h.clone();
        let actor = threads_rate(
            clients,
            a.ops,
            Arc::new(move |c, i| {
                h2.blocking_put(format!("{c:03}-{i:08}"), vec![1u8; 100])
                    .unwrap()
            }),
        );
        println!("puts, {clients:>2} clients: direct core commit {direct:>9.0}/s, through the storage actor {actor:>9.0}/s, ratio actor/direct {:.2}", actor / direct);
        if clients == 1 {
            let n = a.ops.min(20_000);
            let keys: Vec<String> = (0..n).map(|i| format!("000-{i:08}")).collect();
            let mut hist_pool = Histogram::<u64>::new(3).unwrap();
            let t0 = Instant::now();
            for k in &keys {
                let t = Instant::now();
                assert!(h.blocking_get(k.as_str()).unwrap().is_some());
                hist_pool.record(t.elapsed().as_nanos() as u64).unwrap();
            }
            let pool = t0.elapsed().as_nanos() as f64 / n as f64;
            let t0 = Instant::now();
            let snap = h.snapshot().unwrap();
            for k in &keys {
                assert!(snap.get(k).unwrap().is_some());
            }
            let local = t0.elapsed().as_nanos() as f64 / n as f64;
            println!("gets: via the reader pool {pool:>8.0} ns/get (p99 {} ns), snapshot().get on the caller {local:>6.0} ns/get, ratio {:.1}x", hist_pool.value_at_quantile(0.99), pool / local);
        }
        drop(dbh);
        engine.shutdown().unwrap();
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
    hop_cost(&a);
    scaling(&a);
}
