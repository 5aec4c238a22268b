//! Running one journal mode: the engine, the database and its indexes set up in a fresh
//! directory, the clients (closed loop, or the open loop of `--rate`) putting documents until
//! the deadline or the document limit, the wait for the indexes, and what the run measured
//! ([`ModeResult`]); and the base directory the modes' databases go in.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use omnibus::actors::{Engine, EngineOptions, IndexDefinition, StorageHandle};
use omnibus::Options;
use serde::Serialize;

use super::generate::{index_name, index_terms, User};
use crate::cli::{ShopArgs, Variant};
use crate::shop_measure;
use crate::{fmt, CliResult, Fail};

/// How often the timeline is sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Serialize)]
pub(super) struct ModeResult {
    pub(super) journal: &'static str,
    pub(super) documents: u64,
    pub(super) indexes: u64,
    pub(super) clients: u64,
    pub(super) seconds: f64,
    pub(super) catch_up_seconds: f64,
    pub(super) setup_seconds: f64,
    pub(super) close_seconds: f64,
    pub(super) documents_per_s: f64,
    /// `--rate`: documents offered per second (open loop); none in the closed loop.
    pub(super) offered_rate: Option<f64>,
    /// CPU seconds (user + system, getrusage) of the whole process over the timed part,
    /// index catch-up included.
    pub(super) cpu_seconds: f64,
    /// `cpu_seconds` per acknowledged document, in microseconds.
    pub(super) cpu_us_per_document: f64,
    /// Length of the data files (root and indexes) after the run, per document.
    pub(super) data_file_bytes_per_document: f64,
    /// Allocated bytes (st_blocks) of the data files after the run, per document.
    pub(super) data_allocated_bytes_per_document: f64,
    /// The largest anonymous resident memory sampled (MiB).
    pub(super) anon_rss_mib_max: f64,
    /// The most bytes of page images alive at once over the run (MiB;
    /// `omnibus::peak_image_bytes`, exact, not sampled): what the engine's memory budget
    /// (`EngineOptions::memory_budget_bytes`) holds.
    pub(super) page_image_mib_max: f64,
    /// The memory budget (MiB).
    pub(super) memory_budget_mib: f64,
    /// Transactions that started over the budget after the longest pacing wait, from the
    /// engine's start through its close (`Engine::memory_budget_overruns`, read after the
    /// shutdown: the close's last index applies count too): non-zero means the budget did not
    /// hold.
    pub(super) memory_budget_overruns: u64,
    /// Flushes of all storages over the timed part, and the pages they wrote.
    pub(super) flushes: u64,
    pub(super) pages_flushed: u64,
    pub(super) commit_us_p50: u64,
    pub(super) commit_us_p99: u64,
    pub(super) commit_us_p999: u64,
    pub(super) commit_us_max: u64,
    pub(super) fdatasyncs: u64,
    pub(super) fdatasyncs_per_s: f64,
    pub(super) commits: u64,
    pub(super) commits_per_fdatasync: f64,
    pub(super) batches: u64,
    pub(super) journal_bytes_per_document: f64,
    /// Zeros written into journal files ahead of their records, per document
    /// (`DatabaseStats::journal_zero_bytes`; a recycled journal file is reused as it is).
    pub(super) journal_zero_bytes_per_document: f64,
    /// Released journal files reused instead of deleted (`DatabaseStats::journal_files_recycled`).
    pub(super) journal_files_recycled: u64,
    /// Bytes sent to the disk per document: /proc/self/io `write_bytes` less
    /// `cancelled_write_bytes` over the run (`fmt::process_write_bytes`).
    pub(super) disk_bytes_per_document: Option<f64>,
    /// Bytes the block device under the run's directory wrote per document over the run
    /// (`fmt::device_write_bytes`: every process's writes to that device, and only what
    /// reached it).
    pub(super) device_bytes_per_document: Option<f64>,
    /// Index lag (a document's acknowledgement to its index batch's commit): the largest of the
    /// indexes' p50, p99 and max (the slowest index), from `index_stats`.
    pub(super) index_lag_ms_p50: f64,
    pub(super) index_lag_ms_p99: f64,
    pub(super) index_lag_ms_max: f64,
    /// Most root commits an index was behind when it started a batch.
    pub(super) index_behind_max: u64,
    /// The commit latency distribution: (percentile, microseconds).
    pub(super) distribution: Vec<(f64, u64)>,
    /// Documents/s, anonymous memory and data file length, sampled every second.
    pub(super) timeline: Vec<shop_measure::Sample>,
    #[serde(skip)]
    pub(super) histogram: Option<Histogram<u64>>,
}

fn distribution(h: &Histogram<u64>) -> Vec<(f64, u64)> {
    let mut v: Vec<(f64, u64)> = h
        .iter_quantiles(4)
        .map(|it| (it.quantile_iterated_to() * 100.0, it.value_iterated_to()))
        .collect();
    v.dedup_by(|a, b| a.0 == b.0);
    v
}

/// Puts document `n` (the engine feeds its indexes); returns the commit latency measured from
/// `since` (the send time, or the scheduled time in the open loop).
async fn put_document(
    root: &StorageHandle,
    n: u64,
    since: Option<Instant>,
) -> Result<Duration, Fail> {
    let u = User::generate(n);
    let doc = serde_json::to_vec(&u).expect("serializable");
    let t = since.unwrap_or_else(Instant::now);
    root.put(u.id.clone(), doc)
        .await
        .map_err(|e| Fail::from(e).context("putting a document"))?;
    Ok(Instant::now().saturating_duration_since(t))
}

/// A closed-loop client: one document in flight, the next sent when it is acknowledged.
async fn client(
    root: StorageHandle,
    next: Arc<AtomicU64>,
    done: Arc<AtomicU64>,
    limit: u64,
    deadline: Option<Instant>,
) -> Result<Histogram<u64>, Fail> {
    let mut h = fmt::histogram();
    loop {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(h);
        }
        let n = next.fetch_add(1, Ordering::Relaxed);
        if n >= limit {
            return Ok(h);
        }
        let lat = put_document(&root, n, None).await?;
        let _ = h.record(lat.as_micros() as u64);
        done.fetch_add(1, Ordering::Relaxed);
    }
}

/// Documents in flight at most in the open loop (memory bound; beyond it the schedule slips,
/// and the slip counts in the latencies, which are measured from the scheduled times).
const OPEN_LOOP_MAX_IN_FLIGHT: usize = 65_536;

/// The open loop: document `n` is scheduled at `start + n / rate` and sent then, whatever the
/// acknowledgements; its latency runs from its scheduled time (no coordinated omission).
async fn open_loop(
    root: StorageHandle,
    rate: f64,
    done: Arc<AtomicU64>,
    limit: u64,
    deadline: Option<Instant>,
) -> Result<Histogram<u64>, Fail> {
    let hist = Arc::new(std::sync::Mutex::new(fmt::histogram()));
    let slots = Arc::new(tokio::sync::Semaphore::new(OPEN_LOOP_MAX_IN_FLIGHT));
    let mut tasks = tokio::task::JoinSet::new();
    let start = Instant::now();
    let mut fail = None;
    for n in 0..limit {
        let at = start + Duration::from_secs_f64(n as f64 / rate);
        if deadline.is_some_and(|d| at >= d) {
            break;
        }
        tokio::time::sleep_until(at.into()).await;
        let Ok(permit) = slots.clone().acquire_owned().await else {
            break;
        };
        // Reap finished tasks as we go, so the set stays as small as what is in flight.
        while let Some(r) = tasks.try_join_next() {
            if let Ok(Err(f)) = r {
                fail = fail.or(Some(f));
            }
        }
        if fail.is_some() {
            break;
        }
        let (root, hist, done) = (root.clone(), hist.clone(), done.clone());
        tasks.spawn(async move {
            let _permit = permit;
            let lat = put_document(&root, n, Some(at)).await?;
            let _ = hist
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .record(lat.as_micros() as u64);
            done.fetch_add(1, Ordering::Relaxed);
            Ok::<(), Fail>(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok(Err(f)) => fail = fail.or(Some(f)),
            Err(e) => fail = fail.or(Some(Fail::io(format!("a document task failed: {e}")))),
            Ok(Ok(())) => {}
        }
    }
    if let Some(f) = fail {
        return Err(f);
    }
    let h = hist.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Ok(h)
}

pub(super) fn run_mode(
    a: &ShopArgs,
    mode: Variant,
    dir: &Path,
    seconds: Option<f64>,
) -> CliResult<ModeResult> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let tmp = dir.join(format!(
        "omnibus-shop-{}-{}-{nanos}",
        mode.name(),
        std::process::id()
    ));
    let mut creating = shop_measure::creating();
    std::fs::create_dir_all(&tmp).map_err(|e| Fail::io(format!("{}: {e}", tmp.display())))?;
    if !a.keep {
        creating.remove_on_interrupt(&tmp);
    }
    drop(creating);
    let r = run_mode_in(a, mode, &tmp, seconds);
    if a.keep {
        eprintln!("omnibus: kept {}", tmp.display());
    } else {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    r
}

fn run_mode_in(
    a: &ShopArgs,
    mode: Variant,
    tmp: &Path,
    seconds: Option<f64>,
) -> CliResult<ModeResult> {
    let setup = Instant::now();
    let engine = Engine::start(EngineOptions {
        executors: a.cores,
        ..EngineOptions::default()
    })?;
    let db = engine.blocking_open_database(
        tmp.join("shop.omnibus"),
        Options {
            journal_mode: mode.journal.mode(),
            ..Options::default()
        },
    )?;
    let root = db.root();
    for i in 0..a.indexes as usize {
        let mut def = IndexDefinition::new(index_name(i), move |_id: &[u8], doc: &[u8]| {
            index_terms(i, doc)
        });
        if let Some(ms) = a.index_interval_ms {
            def = def.min_batch_interval(Duration::from_millis(ms));
        }
        def = def
            .write_buffer_bytes(a.index_buffer)
            .mode(mode.index.mode());
        db.blocking_define_index(def)?;
    }
    // Built (empty) before the clients start.
    db.blocking_wait_for_indexes()?;
    let setup_seconds = setup.elapsed().as_secs_f64();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("omnibus-shop")
        .enable_time()
        .build()
        .map_err(|e| Fail::io(format!("starting the tokio runtime: {e}")))?;
    let stats0 = db.stats();
    let disk0 = fmt::process_write_bytes();
    let device0 = fmt::device_write_bytes(tmp);
    let done = Arc::new(AtomicU64::new(0));
    let db_dir = tmp.join("shop.omnibus");
    let mut storages: Vec<omnibus::actors::StorageHandle> = vec![root.clone()];
    for i in 0..a.indexes as usize {
        storages.push(db.blocking_storage(&index_name(i))?);
    }
    let flushes = |ss: &[omnibus::actors::StorageHandle]| {
        ss.iter().fold((0, 0), |(f, p), s| {
            let st = s.stats();
            (f + st.flushes, p + st.pages_flushed)
        })
    };
    let (flushes0, pages_flushed0) = flushes(&storages);
    let sampled = storages.clone();
    let unflushed = move || {
        sampled.iter().fold((0, 0), |(u, c), s| {
            (u + s.unflushed_bytes(), c + s.scratch_bytes())
        })
    };
    let timeline = shop_measure::Timeline::start(
        done.clone(),
        db_dir.clone(),
        Box::new(unflushed),
        SAMPLE_EVERY,
    );
    let cpu0 = shop_measure::process_cpu_seconds();
    omnibus::reset_peak_image_bytes();
    let started = Instant::now();
    let deadline = seconds.map(|s| started + Duration::from_secs_f64(s));
    let limit = a.docs.unwrap_or(u64::MAX);
    let out = rt.block_on(async {
        let next = Arc::new(AtomicU64::new(0));
        let clients: Vec<_> = match a.rate {
            Some(rate) => vec![tokio::spawn(open_loop(
                root.clone(),
                rate,
                done.clone(),
                limit,
                deadline,
            ))],
            None => (0..a.clients)
                .map(|_| {
                    tokio::spawn(client(
                        root.clone(),
                        next.clone(),
                        done.clone(),
                        limit,
                        deadline,
                    ))
                })
                .collect(),
        };
        let mut lat = fmt::histogram();
        let mut fail = None;
        for c in clients {
            match c.await {
                Ok(Ok(h)) => {
                    let _ = lat.add(&h);
                }
                Ok(Err(f)) => fail = fail.or(Some(f)),
                Err(e) => fail = fail.or(Some(Fail::io(format!("a client task failed: {e}")))),
            }
        }
        let client_secs = started.elapsed().as_secs_f64();
        let mid = db.stats();
        if let Err(e) = db.wait_for_indexes().await {
            fail = fail.or(Some(e.into()));
        }
        (lat, client_secs, mid, db.index_stats(), fail)
    });
    let (lat, client_secs, mid, reports, fail) = out;
    if let Some(f) = fail {
        return Err(f);
    }
    let caught_up = started.elapsed().as_secs_f64();
    let cpu_seconds = shop_measure::process_cpu_seconds() - cpu0;
    let timeline = timeline.finish();
    let rss_end = shop_measure::anon_rss_bytes().unwrap_or(0) as f64 / 1048576.0;
    let page_image_mib_max = omnibus::peak_image_bytes() as f64 / 1048576.0;
    let (data_len, data_alloc) = shop_measure::data_file_bytes(&db_dir);
    let end = db.stats();
    let (flushes1, pages_flushed1) = flushes(&storages);
    drop(root);
    drop(db);
    let close = Instant::now();
    let overruns = engine.clone();
    engine
        .shutdown()
        .map_err(|e| Fail::from(e).context("closing the database"))?;
    let close_seconds = close.elapsed().as_secs_f64();
    // After the close: transactions the shutdown's last applies started over the budget count
    // too.
    let memory_budget_overruns = overruns.memory_budget_overruns();
    let disk1 = fmt::process_write_bytes();
    let device1 = fmt::device_write_bytes(tmp);
    let docs = lat.len();
    let slowest =
        |f: fn(&omnibus::actors::IndexStats) -> f64| reports.iter().map(f).fold(0.0, f64::max);
    let behind = reports.iter().map(|r| r.max_lag_txns).max().unwrap_or(0);
    let fsyncs_clients = mid.journal_fdatasyncs - stats0.journal_fdatasyncs;
    let fsyncs = end.journal_fdatasyncs - stats0.journal_fdatasyncs;
    let commits = end.commits - stats0.commits;
    let per_doc = |b: u64| {
        if docs > 0 {
            b as f64 / docs as f64
        } else {
            0.0
        }
    };
    Ok(ModeResult {
        journal: mode.name(),
        documents: docs,
        indexes: a.indexes,
        clients: a.clients,
        seconds: client_secs,
        catch_up_seconds: caught_up - client_secs,
        setup_seconds,
        close_seconds,
        documents_per_s: docs as f64 / client_secs.max(1e-9),
        offered_rate: a.rate,
        cpu_seconds,
        cpu_us_per_document: cpu_seconds * 1e6 / (docs.max(1) as f64),
        data_file_bytes_per_document: per_doc(data_len),
        data_allocated_bytes_per_document: per_doc(data_alloc),
        flushes: flushes1 - flushes0,
        pages_flushed: pages_flushed1 - pages_flushed0,
        // The samples, and one more now (a run shorter than a sampling interval has none).
        anon_rss_mib_max: timeline
            .iter()
            .map(|t| t.anon_rss_mib)
            .fold(rss_end, f64::max),
        page_image_mib_max,
        memory_budget_mib: EngineOptions::default().memory_budget_bytes as f64 / 1048576.0,
        memory_budget_overruns,
        commit_us_p50: lat.value_at_quantile(0.5),
        commit_us_p99: lat.value_at_quantile(0.99),
        commit_us_p999: lat.value_at_quantile(0.999),
        commit_us_max: lat.max(),
        fdatasyncs: fsyncs,
        fdatasyncs_per_s: fsyncs_clients as f64 / client_secs.max(1e-9),
        commits,
        commits_per_fdatasync: if fsyncs > 0 {
            commits as f64 / fsyncs as f64
        } else {
            0.0
        },
        batches: end.batches - stats0.batches,
        journal_bytes_per_document: per_doc(end.journal_bytes - stats0.journal_bytes),
        journal_zero_bytes_per_document: per_doc(
            end.journal_zero_bytes - stats0.journal_zero_bytes,
        ),
        journal_files_recycled: end.journal_files_recycled - stats0.journal_files_recycled,
        disk_bytes_per_document: disk0.zip(disk1).map(|(a, b)| per_doc(b.saturating_sub(a))),
        device_bytes_per_document: device0
            .zip(device1)
            .map(|(a, b)| per_doc(b.saturating_sub(a))),
        index_lag_ms_p50: slowest(|r| r.apply_lag.p50_ms),
        index_lag_ms_p99: slowest(|r| r.apply_lag.p99_ms),
        index_lag_ms_max: slowest(|r| r.apply_lag.max_ms),
        index_behind_max: behind,
        distribution: distribution(&lat),
        timeline,
        histogram: Some(lat),
    })
}

/// Where the per-mode databases go: `--dir`, or a temporary directory (deleted at the end
/// unless `--keep`) under the current directory, or under the system temp directory when the
/// current directory is not writable.
pub(super) enum BaseDir {
    Given(PathBuf),
    Temp {
        dir: Option<tempfile::TempDir>,
        path: PathBuf,
        /// The current directory was not writable: this is under the system temp directory.
        fallback: bool,
        keep: bool,
    },
}

impl BaseDir {
    pub(super) fn path(&self) -> &Path {
        match self {
            BaseDir::Given(p) => p,
            BaseDir::Temp { path, .. } => path,
        }
    }
}

impl Drop for BaseDir {
    fn drop(&mut self) {
        if let BaseDir::Temp { dir, keep, .. } = self {
            if *keep {
                // Left in place with the per-mode directories inside it (each reported).
                if let Some(d) = dir.take() {
                    let _ = d.keep();
                }
            }
            // Otherwise the TempDir deletes itself when dropped.
        }
    }
}

pub(super) fn base_dir(a: &ShopArgs) -> CliResult<BaseDir> {
    if let Some(d) = &a.dir {
        std::fs::create_dir_all(d)
            .map_err(|e| Fail::input(format!("--dir {}: {e}", d.display())))?;
        shop_measure::remove_stale_and_say(d);
        return Ok(BaseDir::Given(d.clone()));
    }
    shop_measure::remove_stale_and_say(Path::new("."));
    // The process id in the name lets a later run remove it if this one is killed.
    let prefix = format!("omnibus-shop-{}-", std::process::id());
    let builder = || {
        let mut b = tempfile::Builder::new();
        b.prefix(&prefix);
        b
    };
    let mut creating = shop_measure::creating();
    let (t, fallback) = match builder().tempdir_in(".") {
        Ok(t) => (t, false),
        Err(_) => {
            let tmp = std::env::temp_dir();
            let t = builder().tempdir_in(&tmp).map_err(|e| {
                Fail::io(format!(
                    "creating a temporary directory: not in the current directory (not writable) nor in {}: {e}",
                    tmp.display()
                ))
            })?;
            (t, true)
        }
    };
    // An absolute path for the messages and the report.
    let path = std::fs::canonicalize(t.path()).unwrap_or_else(|_| t.path().to_path_buf());
    if !a.keep {
        creating.remove_on_interrupt(&path);
    }
    drop(creating);
    Ok(BaseDir::Temp {
        dir: Some(t),
        path,
        fallback,
        keep: a.keep,
    })
}
