//! `omnibus bench scale`: the large-machine scaling benchmark. For each executor
//! count it runs five workloads through the actor runtime, one after the other:
//!
//! - `get`: random point reads of a storage of `--keys` keys through a [`StorageHandle`], from
//!   as many client threads as executors (the handles read on the caller's thread:
//!   `ReadPath::Caller`, so the reads scale with the threads calling them);
//! - `multi_get`: the same with `--batch` keys per call (ops are keys; latency is per call);
//! - `get via pool`: the `get` workload with `ReadPath::Pool`: every read a message to the
//!   engine's reader pool (one reader per executor) and a reply, so the reads scale with the
//!   executors instead of the calling threads;
//! - `write shared`: `--clients` closed-loop clients putting 100-byte values into random
//!   storages of 1 root + `--storages` branches, durable, one shared journal;
//! - `write separate`: the same with a journal per storage.
//!
//! Each row: ops/s, p50/p99 latency, CPU per op (`getrusage` of the whole process over the
//! timed part: clients, executors, journal writers and flushers), fdatasyncs, and the speedup
//! over the smallest executor count run (1 by default). Counts above the CPUs available (the
//! process's affinity, `omnibus::actors::allowed_cpus`) are run and marked `oversubscribed`
//! (the executors then share CPUs: `Engine::start` wraps them around the allowed CPUs); a
//! count the engine cannot start (locked-memory limit) is reported as skipped with the reason.
//! Client threads (the read clients, the write clients' tokio workers) are pinned to allowed
//! CPUs that no executor runs on, round-robin, or to all the allowed CPUs when the executors
//! take every one (`client_cpus`). Results go to a table on stdout, `--json`
//! and a `--plot` of throughput against executors.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use omnibus::actors::{Engine, EngineOptions, ReadPath, StorageHandle};
use omnibus::{Database, JournalMode, Options};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::cli::ScaleArgs;
use crate::shop_measure;
use crate::{fmt, CliResult, Fail};

/// Bytes of every value written or read.
const VALUE_BYTES: usize = 100;

/// The longest warm-up of a write workload (a quarter of `--seconds` up to this), not counted.
const WARMUP_MAX_SECONDS: f64 = 0.5;

/// Synced writes of the disk probe before the run.
const PROBE_WRITES: u32 = 200;

/// The five workloads, in the order they run and print.
const WORKLOADS: [&str; 5] = [
    "get",
    "multi_get",
    "get via pool",
    "write shared",
    "write separate",
];

/// One workload at one executor count.
#[derive(Debug, Clone, Serialize)]
struct Row {
    workload: &'static str,
    executors: usize,
    /// More executors than CPUs available: they share CPUs.
    oversubscribed: bool,
    /// Why the row did not run (the engine could not start), or none.
    skipped: Option<String>,
    /// Client threads (reads) or closed-loop client tasks (writes).
    clients: usize,
    seconds: f64,
    /// Operations done: gets, keys read by multi_gets, or acknowledged puts.
    ops: u64,
    ops_per_s: f64,
    /// Latency of one call (a get, a multi_get of `--batch` keys, a put until acknowledged).
    p50_us: f64,
    p99_us: f64,
    /// Process CPU time (user + system) over the timed part, per op, in microseconds.
    cpu_us_per_op: f64,
    fdatasyncs: u64,
    fdatasyncs_per_s: f64,
    /// `ops_per_s` over the same workload's at the smallest executor count run; none when that
    /// row was skipped.
    speedup: Option<f64>,
}

/// The whole run, as written by `--json`.
#[derive(Serialize)]
struct Report {
    machine: String,
    cpus: usize,
    file_system: String,
    dir: String,
    synced_writes_per_s: f64,
    seconds_per_run: f64,
    storages: u64,
    keys: u64,
    value_bytes: usize,
    batch: u64,
    write_clients: u64,
    executors: Vec<usize>,
    /// The executor count the speedups are relative to (the smallest run).
    speedup_base_executors: usize,
    rows: Vec<Row>,
    /// Per workload: `[executors, speedup]` pairs, in the order run.
    speedups: std::collections::BTreeMap<String, Vec<(usize, Option<f64>)>>,
}

/// The CPUs this process may use (its affinity), at least one.
fn allowed() -> Vec<usize> {
    match omnibus::actors::allowed_cpus() {
        Ok(c) if !c.is_empty() => c,
        _ => vec![0],
    }
}

fn cpus() -> usize {
    allowed().len()
}

/// The CPUs the clients of `engine` are pinned to ([`clients_beside`] the executors).
fn client_cpus(engine: &Engine) -> Vec<usize> {
    clients_beside(allowed(), engine.executor_cpus())
}

/// The CPUs of `allowed` that no executor runs on (`executors`: each executor's CPU), or every
/// allowed one when the executors take them all.
fn clients_beside(allowed: Vec<usize>, executors: &[usize]) -> Vec<usize> {
    let free: Vec<usize> = allowed
        .iter()
        .copied()
        .filter(|c| !executors.contains(c))
        .collect();
    if free.is_empty() {
        allowed
    } else {
        free
    }
}

/// Pins the calling thread, client number `i`, to one of `cpus` (round-robin); best effort.
fn pin_client(i: usize, cpus: &[usize]) {
    if cpus.is_empty() {
        return;
    }
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpus[i % cpus.len()]);
    if let Err(e) = rustix::thread::sched_setaffinity(None, &set) {
        tracing::debug!(error = %e, "cannot pin a bench client thread");
    }
}

/// The read workloads' key `i` (fixed width, so keys sort by `i`).
fn read_key(i: u64) -> [u8; 12] {
    let mut k = *b"k00000000000";
    let mut v = i;
    for b in k[1..].iter_mut().rev() {
        *b = b'0' + (v % 10) as u8;
        v /= 10;
    }
    k
}

/// A latency histogram in nanoseconds (1 ns to 60 s, 3 significant digits).
fn ns_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds")
}

fn start_engine(executors: usize) -> omnibus::Result<Engine> {
    start_engine_reading(executors, ReadPath::default())
}

/// [`start_engine`] with the handles' point reads on `reads`.
fn start_engine_reading(executors: usize, reads: ReadPath) -> omnibus::Result<Engine> {
    Engine::start(EngineOptions {
        executors: Some(executors),
        reads,
        ..EngineOptions::default()
    })
}

/// Creates the read workloads' database at `path`: `keys` keys of [`VALUE_BYTES`] in the root,
/// written with the core API in transactions of 10,000 keys.
fn populate(path: &Path, keys: u64) -> CliResult {
    let db = Database::open(path, Options::default()).map_err(|e| Fail::opening(e, path))?;
    let root = db.root();
    let mut i = 0;
    while i < keys {
        let mut w = root.begin_write()?;
        for j in i..(i + 10_000).min(keys) {
            w.put(read_key(j), [(j % 251) as u8; VALUE_BYTES])?;
        }
        w.commit()?;
        i += 10_000;
    }
    db.close()?;
    Ok(())
}

/// What one timed part measured.
struct Measured {
    ops: u64,
    seconds: f64,
    hist: Histogram<u64>,
    cpu_seconds: f64,
    fdatasyncs: u64,
}

fn row(workload: &'static str, executors: usize, clients: usize, m: Measured) -> Row {
    let secs = m.seconds.max(1e-9);
    Row {
        workload,
        executors,
        oversubscribed: executors > cpus(),
        skipped: None,
        clients,
        seconds: m.seconds,
        ops: m.ops,
        ops_per_s: m.ops as f64 / secs,
        p50_us: m.hist.value_at_quantile(0.5) as f64 / 1000.0,
        p99_us: m.hist.value_at_quantile(0.99) as f64 / 1000.0,
        cpu_us_per_op: m.cpu_seconds * 1e6 / m.ops.max(1) as f64,
        fdatasyncs: m.fdatasyncs,
        fdatasyncs_per_s: m.fdatasyncs as f64 / secs,
        speedup: None,
    }
}

fn skipped(workload: &'static str, executors: usize, why: String) -> Row {
    Row {
        workload,
        executors,
        oversubscribed: executors > cpus(),
        skipped: Some(why),
        clients: 0,
        seconds: 0.0,
        ops: 0,
        ops_per_s: 0.0,
        p50_us: 0.0,
        p99_us: 0.0,
        cpu_us_per_op: 0.0,
        fdatasyncs: 0,
        fdatasyncs_per_s: 0.0,
        speedup: None,
    }
}

/// One call of a read client: returns the ops it did (gets, or keys of a multi_get).
type ReadOp = dyn Fn(&mut SmallRng) -> CliResult<u64> + Send + Sync;

/// `threads` client threads, pinned to `pin` round-robin, each calling `op(rng)` (which
/// returns the ops it did) until `seconds` pass; every call's latency is recorded.
fn read_clients(
    threads: usize,
    seconds: f64,
    pin: &[usize],
    op: Arc<ReadOp>,
) -> CliResult<Measured> {
    let cpu0 = shop_measure::process_cpu_seconds();
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let results: Vec<CliResult<(u64, Histogram<u64>)>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let op = op.clone();
                s.spawn(move || {
                    pin_client(t, pin);
                    let mut rng = SmallRng::seed_from_u64(0x5ca1e + t as u64);
                    let mut h = ns_histogram();
                    let mut ops = 0u64;
                    // Bounded by the deadline.
                    loop {
                        let t0 = Instant::now();
                        if t0 >= deadline {
                            break;
                        }
                        ops += op(&mut rng)?;
                        h.saturating_record(t0.elapsed().as_nanos() as u64);
                    }
                    Ok((ops, h))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Fail::io("a read client panicked")))
            })
            .collect()
    });
    let seconds = start.elapsed().as_secs_f64();
    let cpu_seconds = shop_measure::process_cpu_seconds() - cpu0;
    let mut hist = ns_histogram();
    let mut ops = 0;
    for r in results {
        let (n, h) = r.map_err(|f| f.context("reading"))?;
        ops += n;
        let _ = hist.add(h);
    }
    Ok(Measured {
        ops,
        seconds,
        hist,
        cpu_seconds,
        fdatasyncs: 0,
    })
}

/// The `get` workload's operation: a get of a random one of the `keys` keys through `h`.
fn random_gets(h: StorageHandle, keys: u64) -> Arc<ReadOp> {
    Arc::new(move |rng: &mut SmallRng| {
        let k = read_key(rng.random_range(0..keys));
        match h.blocking_get(k)? {
            Some(_) => Ok(1),
            None => Err(Fail::io(format!(
                "key {} of the read storage is missing",
                String::from_utf8_lossy(&k)
            ))),
        }
    })
}

/// The read workloads at `executors`: an engine over the read database at `path` for `get`
/// and `multi_get` on the caller's thread, then one reading through the pool.
fn reads(a: &ScaleArgs, path: &Path, executors: usize) -> CliResult<Vec<Row>> {
    let engine = match start_engine(executors) {
        Ok(e) => e,
        Err(e) => {
            return Ok(vec![
                skipped("get", executors, e.to_string()),
                skipped("multi_get", executors, e.to_string()),
                skipped("get via pool", executors, e.to_string()),
            ])
        }
    };
    let db = engine
        .blocking_open_database(path, Options::default())
        .map_err(|e| Fail::opening(e, path))?;
    let root: StorageHandle = db.root();
    let keys = a.keys;
    let pin = client_cpus(&engine);
    let h = root.clone();
    let get = read_clients(executors, a.seconds, &pin, random_gets(h, keys))?;
    let h = root.clone();
    let batch = a.batch as usize;
    let multi = read_clients(
        executors,
        a.seconds,
        &pin,
        Arc::new(move |rng: &mut SmallRng| {
            let ks: Vec<[u8; 12]> = (0..batch)
                .map(|_| read_key(rng.random_range(0..keys)))
                .collect();
            let vs = h.blocking_multi_get(&ks)?;
            if vs.iter().any(|v| v.is_none()) {
                return Err(Fail::io("a key of the read storage is missing"));
            }
            Ok(ks.len() as u64)
        }),
    )?;
    drop(root);
    drop(db);
    engine
        .shutdown()
        .map_err(|e| Fail::from(e).context("closing the read database"))?;
    let pooled = pool_gets(a, path, executors)?;
    Ok(vec![
        row("get", executors, executors, get),
        row("multi_get", executors, executors, multi),
        pooled,
    ])
}

/// The `get` workload with every read sent to the reader pool (`ReadPath::Pool`).
fn pool_gets(a: &ScaleArgs, path: &Path, executors: usize) -> CliResult<Row> {
    let engine = match start_engine_reading(executors, ReadPath::Pool) {
        Ok(e) => e,
        Err(e) => return Ok(skipped("get via pool", executors, e.to_string())),
    };
    let db = engine
        .blocking_open_database(path, Options::default())
        .map_err(|e| Fail::opening(e, path))?;
    let h = db.root();
    let keys = a.keys;
    let pin = client_cpus(&engine);
    let got = read_clients(executors, a.seconds, &pin, random_gets(h, keys))?;
    drop(db);
    engine
        .shutdown()
        .map_err(|e| Fail::from(e).context("closing the read database"))?;
    Ok(row("get via pool", executors, executors, got))
}

/// A write workload at `executors`: a fresh database in `dir` with 1 root + `--storages`
/// branches in journal mode `mode`, `--clients` closed-loop clients for `--seconds`.
fn writes(
    a: &ScaleArgs,
    dir: &Path,
    executors: usize,
    mode: JournalMode,
    workload: &'static str,
) -> CliResult<Row> {
    let engine = match start_engine(executors) {
        Ok(e) => e,
        Err(e) => return Ok(skipped(workload, executors, e.to_string())),
    };
    let path = dir.join(format!("{}-{executors}", workload.replace(' ', "-")));
    let db = engine
        .blocking_open_database(
            &path,
            Options {
                journal_mode: mode,
                ..Options::default()
            },
        )
        .map_err(|e| Fail::opening(e, &path))?;
    let mut hs = vec![db.root()];
    for i in 0..a.storages {
        hs.push(db.blocking_create_storage(&format!("s{i:04}"))?);
    }
    let pin = client_cpus(&engine);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(executors.clamp(1, cpus()))
        .thread_name("omnibus-scale")
        .on_thread_start(move || {
            pin_client(
                next.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                &pin,
            )
        })
        .enable_time()
        .build()
        .map_err(|e| Fail::io(format!("starting the tokio runtime: {e}")))?;
    // Clients run for a warm-up first (journal files made and pre-zeroed, data files grown,
    // executors' queues filled); only what starts after it is counted.
    let warmup = Duration::from_secs_f64((a.seconds / 4.0).min(WARMUP_MAX_SECONDS));
    let from = Instant::now() + warmup;
    let deadline = from + Duration::from_secs_f64(a.seconds);
    let clients = a.clients as usize;
    let hs = Arc::new(hs);
    let (results, start, cpu0, stats0) = rt.block_on(async {
        let tasks: Vec<_> = (0..clients)
            .map(|c| {
                let hs = hs.clone();
                tokio::spawn(async move {
                    let mut rng = SmallRng::seed_from_u64(0xc0ffee + c as u64);
                    let mut h = ns_histogram();
                    let mut n = 0u64;
                    let mut counted = 0u64;
                    // Bounded by the deadline.
                    loop {
                        let t = Instant::now();
                        if t >= deadline {
                            break;
                        }
                        let s = &hs[rng.random_range(0..hs.len())];
                        s.put(
                            format!("c{c:05}-{n:010}"),
                            vec![(n % 251) as u8; VALUE_BYTES],
                        )
                        .await
                        .map_err(|e| Fail::from(e).context("putting"))?;
                        n += 1;
                        if t >= from {
                            h.saturating_record(t.elapsed().as_nanos() as u64);
                            counted += 1;
                        }
                    }
                    Ok((counted, h))
                })
            })
            .collect();
        tokio::time::sleep_until(from.into()).await;
        let (start, cpu0, stats0) = (
            Instant::now(),
            shop_measure::process_cpu_seconds(),
            db.stats(),
        );
        let mut out = Vec::with_capacity(tasks.len());
        for t in tasks {
            out.push(
                t.await
                    .unwrap_or_else(|e| Err(Fail::io(format!("a write client failed: {e}")))),
            );
        }
        (out, start, cpu0, stats0)
    });
    let seconds = start.elapsed().as_secs_f64();
    let cpu_seconds = shop_measure::process_cpu_seconds() - cpu0;
    let stats1 = db.stats();
    drop(rt);
    drop(hs);
    drop(db);
    engine
        .shutdown()
        .map_err(|e| Fail::from(e).context("closing the database"))?;
    let mut hist = ns_histogram();
    let mut ops = 0;
    for r in results {
        let (n, h) = r?;
        ops += n;
        let _ = hist.add(h);
    }
    let _ = std::fs::remove_dir_all(&path);
    Ok(row(
        workload,
        executors,
        clients,
        Measured {
            ops,
            seconds,
            hist,
            cpu_seconds,
            fdatasyncs: stats1.journal_fdatasyncs - stats0.journal_fdatasyncs,
        },
    ))
}

/// Fills each row's speedup: its ops/s over the same workload's at `base` executors.
fn speedups(rows: &mut [Row], base: usize) {
    for w in WORKLOADS {
        let b = rows
            .iter()
            .find(|r| r.workload == w && r.executors == base && r.skipped.is_none())
            .map(|r| r.ops_per_s);
        for r in rows.iter_mut().filter(|r| r.workload == w) {
            r.speedup = match (b, &r.skipped) {
                (Some(b), None) if b > 0.0 => Some(r.ops_per_s / b),
                _ => None,
            };
        }
    }
}

fn print_table(rows: &[Row], base: usize) {
    println!(
        "{:<15} {:>9} {:>12} {:>10} {:>10} {:>10} {:>11} {:>9}  note",
        "workload", "executors", "ops/s", "p50 µs", "p99 µs", "CPU µs/op", "fdatasyncs", "speedup"
    );
    for r in rows {
        let note = match (&r.skipped, r.oversubscribed) {
            (Some(why), _) => format!("skipped: {why}"),
            (None, true) => "oversubscribed".to_string(),
            (None, false) => String::new(),
        };
        if r.skipped.is_some() {
            println!(
                "{:<15} {:>9} {:>12} {:>10} {:>10} {:>10} {:>11} {:>9}  {note}",
                r.workload, r.executors, "-", "-", "-", "-", "-", "-"
            );
            continue;
        }
        println!(
            "{:<15} {:>9} {:>12.0} {:>10.2} {:>10.2} {:>10.2} {:>11} {:>9}  {note}",
            r.workload,
            r.executors,
            r.ops_per_s,
            r.p50_us,
            r.p99_us,
            r.cpu_us_per_op,
            r.fdatasyncs,
            r.speedup.map_or("-".to_string(), |s| format!("{s:.2}x")),
        );
    }
    for w in WORKLOADS {
        let parts: Vec<String> = rows
            .iter()
            .filter(|r| r.workload == w && r.executors != base)
            .map(|r| match r.speedup {
                Some(s) => format!("{base}->{}: {s:.2}x", r.executors),
                None => format!("{base}->{}: -", r.executors),
            })
            .collect();
        if !parts.is_empty() {
            println!("speedup {w}: {}", parts.join(", "));
        }
    }
}

/// A working directory for the run under `--dir` (or the current directory, or the system
/// temp directory when the current one is not writable), deleted when dropped.
fn work_dir(a: &ScaleArgs) -> CliResult<tempfile::TempDir> {
    let prefix = format!("omnibus-scale-{}-", std::process::id());
    let b = || {
        let mut b = tempfile::Builder::new();
        b.prefix(&prefix);
        b
    };
    if let Some(d) = &a.dir {
        std::fs::create_dir_all(d)
            .map_err(|e| Fail::input(format!("--dir {}: {e}", d.display())))?;
        shop_measure::remove_stale_and_say(d);
        return b()
            .tempdir_in(d)
            .map_err(|e| Fail::io(format!("--dir {}: {e}", d.display())));
    }
    shop_measure::remove_stale_and_say(std::path::Path::new("."));
    b().tempdir_in(".").or_else(|_| {
        let tmp = std::env::temp_dir();
        b().tempdir_in(&tmp).map_err(|e| {
            Fail::io(format!(
                "creating a temporary directory: not in the current directory (not writable) nor in {}: {e}",
                tmp.display()
            ))
        })
    })
}

/// Runs `bench scale`.
pub fn run(a: ScaleArgs) -> CliResult {
    if !(a.seconds > 0.0 && a.seconds.is_finite()) {
        return Err(Fail::input("--seconds must be a positive number"));
    }
    let mut counts: Vec<usize> = Vec::new();
    for &n in &a.executors {
        if n == 0 {
            return Err(Fail::input("--executors: every count must be at least 1"));
        }
        if !counts.contains(&n) {
            counts.push(n);
        }
    }
    counts.sort_unstable();
    let Some(&base) = counts.first() else {
        return Err(Fail::input("--executors: give at least one count"));
    };
    if let Some(p) = &a.json {
        crate::bench_shop::writable_parent("--json", p)?;
    }
    if let Some(p) = &a.plot {
        crate::bench_shop::writable_parent("--plot", p)?;
    }
    shop_measure::handle_interrupts();
    let mut creating = shop_measure::creating();
    let work = work_dir(&a)?;
    let dir: PathBuf = std::fs::canonicalize(work.path()).unwrap_or_else(|_| work.path().into());
    creating.remove_on_interrupt(&dir);
    drop(creating);
    let fs = fmt::fs_type(&dir);
    if fs == "tmpfs" && !a.allow_tmpfs {
        return Err(Fail::input(format!(
            "{} is on a tmpfs: fdatasync costs nothing there; give a directory on a disk with --dir (or --allow-tmpfs)",
            dir.display()
        )));
    }
    let synced_writes_per_s = shop_measure::probe_synced_writes(&dir, PROBE_WRITES)?;
    let machine = fmt::machine();
    let over: Vec<String> = counts
        .iter()
        .filter(|n| **n > cpus())
        .map(|n| n.to_string())
        .collect();
    eprintln!(
        "bench scale: executors {:?}, {} s per run, 5 workloads; {} ({fs}); {synced_writes_per_s:.0} synced 4 KiB writes/s probed",
        counts,
        a.seconds,
        dir.display()
    );
    if !over.is_empty() {
        eprintln!(
            "bench scale: {} CPUs available: executor counts {} are oversubscribed (run, and marked so)",
            cpus(),
            over.join(", ")
        );
    }
    let read_db = dir.join("reads");
    populate(&read_db, a.keys)?;
    let mut rows = Vec::new();
    for &n in &counts {
        eprintln!("bench scale: {n} executors ...");
        rows.extend(reads(&a, &read_db, n)?);
        rows.push(writes(&a, &dir, n, JournalMode::Shared, "write shared")?);
        rows.push(writes(
            &a,
            &dir,
            n,
            JournalMode::Separate,
            "write separate",
        )?);
    }
    // Table order: by workload, then executors.
    rows.sort_by_key(|r| (WORKLOADS.iter().position(|w| *w == r.workload), r.executors));
    speedups(&mut rows, base);
    println!("machine: {machine}");
    println!(
        "file system: {fs} ({}); {synced_writes_per_s:.0} synced 4 KiB writes/s probed",
        dir.display()
    );
    println!(
        "workloads: reads of {} keys of {VALUE_BYTES} B, one client thread per executor, multi_get of {}; \
         writes of {VALUE_BYTES} B by {} clients over 1 + {} storages; {} s per run",
        a.keys, a.batch, a.clients, a.storages, a.seconds
    );
    print_table(&rows, base);
    if let Some(p) = &a.json {
        let mut by = std::collections::BTreeMap::new();
        for w in WORKLOADS {
            by.insert(
                w.to_string(),
                rows.iter()
                    .filter(|r| r.workload == w)
                    .map(|r| (r.executors, r.speedup))
                    .collect(),
            );
        }
        let rep = Report {
            machine,
            cpus: cpus(),
            file_system: fs.clone(),
            dir: dir.display().to_string(),
            synced_writes_per_s,
            seconds_per_run: a.seconds,
            storages: a.storages,
            keys: a.keys,
            value_bytes: VALUE_BYTES,
            batch: a.batch,
            write_clients: a.clients,
            executors: counts.clone(),
            speedup_base_executors: base,
            rows: rows.clone(),
            speedups: by,
        };
        let text = serde_json::to_string_pretty(&rep).expect("serializable");
        std::fs::write(p, text + "\n")
            .map_err(|e| Fail::io(format!("--json {}: {e}", p.display())))?;
    }
    if let Some(p) = &a.plot {
        let series: Vec<crate::plot::ScaleSeries> = WORKLOADS
            .iter()
            .map(|w| {
                (
                    w.to_string(),
                    rows.iter()
                        .filter(|r| r.workload == *w && r.skipped.is_none())
                        .map(|r| (r.executors, r.ops_per_s))
                        .collect(),
                )
            })
            .collect();
        let title = format!(
            "omnibus bench scale: throughput vs executors ({} CPUs; 1 + {} storages)",
            cpus(),
            a.storages
        );
        crate::plot::scale_png(p, &title, cpus(), &series)
            .map_err(|e| Fail::io(format!("--plot {}: {e}", p.display())))?;
    }
    drop(work);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_keys_are_fixed_width_and_sorted() {
        assert_eq!(&read_key(0), b"k00000000000");
        assert_eq!(&read_key(1234), b"k00000001234");
        assert!(read_key(9) < read_key(10));
    }

    #[test]
    fn clients_take_the_cpus_no_executor_runs_on() {
        assert_eq!(clients_beside(vec![4, 5, 6, 7], &[4, 5]), [6, 7]);
        // Executors on every allowed CPU (or sharing them): clients on all of them.
        assert_eq!(clients_beside(vec![4, 5], &[4, 5, 4]), [4, 5]);
        assert_eq!(clients_beside(vec![0, 1, 2], &[2]), [0, 1]);
    }

    #[test]
    fn counts_above_the_cpus_are_marked_oversubscribed() {
        assert!(!skipped("get", cpus(), String::new()).oversubscribed);
        assert!(skipped("get", cpus() + 1, String::new()).oversubscribed);
    }

    #[test]
    fn speedups_are_relative_to_the_base_count() {
        let mk = |w: &'static str, n: usize, ops: f64| {
            let mut r = skipped(w, n, String::new());
            r.skipped = None;
            r.ops_per_s = ops;
            r
        };
        let mut rows = vec![
            mk("get", 1, 100.0),
            mk("get", 2, 190.0),
            skipped("get", 4, "no".into()),
        ];
        speedups(&mut rows, 1);
        assert_eq!(rows[0].speedup, Some(1.0));
        assert_eq!(rows[1].speedup, Some(1.9));
        assert_eq!(rows[2].speedup, None);
    }
}
