//! `omnibus bench shop`: the RavenDB scenario, 1 documents storage + N index storages, run in
//! each journal mode one after the other and compared side by side.
//!
//! Clients put generated user documents (about 1 KB of JSON) into the documents storage, each
//! with one put in flight, the next one sent as soon as the acknowledgement comes back. The N
//! indexes are engine indexes (`define_index`, a byte-scan map function per index): the engine
//! feeds every acknowledged root commit to them (bounded: a slow index slows the clients down),
//! and each commits what is pending as one batch; the run ends with `wait_for_indexes`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use omnibus::actors::{Engine, EngineOptions, IndexDefinition, StorageHandle};
use omnibus::Options;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::cli::{DiskArg, JournalArg, ShopArgs};
use crate::shop_measure;
use crate::{fmt, CliResult, Fail};

/// How often the timeline is sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// Synced writes of the disk probe before the run.
const PROBE_WRITES: u32 = 200;

const COUNTRIES: [&str; 24] = [
    "US", "DE", "FR", "GB", "IL", "JP", "BR", "IN", "CN", "CA", "AU", "ES", "IT", "NL", "SE", "PL",
    "MX", "AR", "ZA", "KR", "NO", "PT", "IE", "NZ",
];
const CITIES: [&str; 16] = [
    "Springfield",
    "Riverton",
    "Lakeside",
    "Hadera",
    "Fairview",
    "Georgetown",
    "Madison",
    "Franklin",
    "Clinton",
    "Salem",
    "Bristol",
    "Ashland",
    "Dover",
    "Milton",
    "Newport",
    "Oxford",
];
const SYLLABLES: [&str; 24] = [
    "ka", "lo", "mi", "ra", "ten", "sa", "vo", "li", "an", "dre", "el", "ni", "jo", "ha", "ru",
    "be", "ta", "no", "is", "ca", "mel", "do", "fi", "gu",
];
const WORDS: [&str; 32] = [
    "order",
    "basket",
    "shipping",
    "coffee",
    "garden",
    "review",
    "premium",
    "member",
    "discount",
    "weekly",
    "newsletter",
    "wishlist",
    "gift",
    "returns",
    "tracking",
    "loyalty",
    "points",
    "books",
    "music",
    "kitchen",
    "outdoor",
    "sports",
    "toys",
    "fashion",
    "beauty",
    "health",
    "pets",
    "travel",
    "office",
    "tools",
    "games",
    "electronics",
];
/// Fields an index can extract.
const FIELDS: [&str; 6] = ["name", "email", "country", "age", "last_login", "city"];

#[derive(Serialize)]
struct User {
    id: String,
    name: String,
    email: String,
    country: &'static str,
    city: &'static str,
    age: u32,
    last_login: u64,
    newsletter: bool,
    about: String,
}

impl User {
    fn generate(n: u64) -> User {
        let mut rng = SmallRng::seed_from_u64(n.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5eed);
        let word = |rng: &mut SmallRng, parts: usize| -> String {
            let mut s = String::new();
            for _ in 0..parts {
                s.push_str(SYLLABLES[rng.random_range(0..SYLLABLES.len())]);
            }
            s
        };
        let first = word(&mut rng, 2);
        let last = word(&mut rng, 3);
        let mut about = String::with_capacity(800);
        while about.len() < 760 {
            if !about.is_empty() {
                about.push(' ');
            }
            about.push_str(WORDS[rng.random_range(0..WORDS.len())]);
        }
        let name = format!(
            "{}{} {}{}",
            first[..1].to_uppercase(),
            &first[1..],
            last[..1].to_uppercase(),
            &last[1..]
        );
        User {
            id: format!("users/{n:012}"),
            email: format!("{first}.{last}{}@example.com", n % 1000),
            name,
            country: COUNTRIES[rng.random_range(0..COUNTRIES.len())],
            city: CITIES[rng.random_range(0..CITIES.len())],
            age: rng.random_range(18..90),
            last_login: 1_700_000_000 + rng.random_range(0..30_000_000),
            newsletter: rng.random(),
            about,
        }
    }

    #[cfg(test)]
    fn field(&self, i: usize) -> String {
        match i {
            0 => self.name.clone(),
            1 => self.email.clone(),
            2 => self.country.to_string(),
            3 => self.age.to_string(),
            4 => self.last_login.to_string(),
            _ => self.city.to_string(),
        }
    }

    /// The entry key of index `i`: one field for the first six indexes, then a hash of two
    /// fields (seeded by `i`); then 0x00 and the id. (The reference for [`index_terms`].)
    #[cfg(test)]
    fn index_key(&self, i: usize) -> Vec<u8> {
        let mut k = if i < FIELDS.len() {
            self.field(i).into_bytes()
        } else {
            let mut h = crc32fast::Hasher::new_with_initial(i as u32);
            h.update(self.field(i % FIELDS.len()).as_bytes());
            h.update(self.field((i / FIELDS.len() + i) % FIELDS.len()).as_bytes());
            format!("{:08x}", h.finalize()).into_bytes()
        };
        k.push(crate::index_spec::SEP);
        k.extend_from_slice(self.id.as_bytes());
        k
    }
}

/// The raw value of field `name` in a document serialized from a [`User`], found by one
/// SIMD substring search for `"name":` (no JSON parsing, no allocation): a string's bytes
/// between its quotes, or a number's (or boolean's) text up to the next `,` or `}`. `None` when
/// missing, or when its string value holds an escape. A generated user is a flat object of
/// plain ASCII without quotes or backslashes in its strings, so the first `"name":` is its key
/// (in JSON, a quote inside a string is escaped, so `"name":` cannot start inside one unless
/// a key ends with an escaped quote).
fn scan_field(doc: &[u8], field: usize) -> Option<&[u8]> {
    let at = FIELD_FINDERS[field].find(doc)?;
    let v = at + FIELD_FINDERS[field].needle().len();
    if *doc.get(v)? == b'"' {
        let e = v + 1 + memchr::memchr2(b'"', b'\\', &doc[v + 1..])?;
        (doc[e] == b'"').then(|| &doc[v + 1..e])
    } else {
        let e = v + memchr::memchr2(b',', b'}', &doc[v..])?;
        Some(&doc[v..e])
    }
}

/// One substring finder per field of [`FIELDS`] (`"field":`), built once.
static FIELD_FINDERS: std::sync::LazyLock<Vec<memchr::memmem::Finder<'static>>> =
    std::sync::LazyLock::new(|| {
        FIELDS
            .iter()
            .map(|f| memchr::memmem::Finder::new(format!("\"{f}\":").as_bytes()).into_owned())
            .collect()
    });

/// The map function of index `i`: the term of [`User::index_key`] (the field, or the hex crc32
/// of two fields seeded by `i`), read from the stored JSON by [`scan_field`].
fn index_terms(i: usize, doc: &[u8]) -> Vec<Vec<u8>> {
    let f = FIELDS.len();
    if i < f {
        return scan_field(doc, i)
            .map(|v| vec![v.to_vec()])
            .unwrap_or_default();
    }
    let (Some(a), Some(b)) = (scan_field(doc, i % f), scan_field(doc, (i / f + i) % f)) else {
        return Vec::new();
    };
    let mut h = crc32fast::Hasher::new_with_initial(i as u32);
    h.update(a);
    h.update(b);
    let x = h.finalize();
    const HEX: &[u8; 16] = b"0123456789abcdef";
    vec![(0..8)
        .rev()
        .map(|d| HEX[((x >> (d * 4)) & 0xf) as usize])
        .collect()]
}

fn index_name(i: usize) -> String {
    if i < FIELDS.len() {
        format!("Users_By_{}", FIELDS[i])
    } else {
        format!("Users_ByHash_{i:03}")
    }
}

#[derive(Debug, Clone, Serialize)]
struct ModeResult {
    journal: &'static str,
    documents: u64,
    indexes: u64,
    clients: u64,
    seconds: f64,
    catch_up_seconds: f64,
    setup_seconds: f64,
    close_seconds: f64,
    documents_per_s: f64,
    /// `--rate`: documents offered per second (open loop); none in the closed loop.
    offered_rate: Option<f64>,
    /// CPU seconds (user + system, getrusage) of the whole process over the timed part,
    /// index catch-up included.
    cpu_seconds: f64,
    /// `cpu_seconds` per acknowledged document, in microseconds.
    cpu_us_per_document: f64,
    /// Length of the data files (root and indexes) after the run, per document.
    data_file_bytes_per_document: f64,
    /// Allocated bytes (st_blocks) of the data files after the run, per document.
    data_allocated_bytes_per_document: f64,
    /// The largest anonymous resident memory sampled (MiB).
    anon_rss_mib_max: f64,
    /// The most bytes of page images alive at once over the run (MiB;
    /// `omnibus::peak_image_bytes`, exact, not sampled): what the engine's memory budget
    /// (`EngineOptions::memory_budget_bytes`) holds.
    page_image_mib_max: f64,
    /// The memory budget (MiB).
    memory_budget_mib: f64,
    /// Transactions that started over the budget after the longest pacing wait
    /// (`Engine::memory_budget_overruns`): non-zero means the budget did not hold.
    memory_budget_overruns: u64,
    /// Flushes of all storages over the timed part, and the pages they wrote.
    flushes: u64,
    pages_flushed: u64,
    commit_us_p50: u64,
    commit_us_p99: u64,
    commit_us_p999: u64,
    commit_us_max: u64,
    fdatasyncs: u64,
    fdatasyncs_per_s: f64,
    commits: u64,
    commits_per_fdatasync: f64,
    batches: u64,
    journal_bytes_per_document: f64,
    disk_bytes_per_document: Option<f64>,
    /// Index lag (a document's acknowledgement to its index batch's commit): the largest of the
    /// indexes' p50, p99 and max (the slowest index), from `index_stats`.
    index_lag_ms_p50: f64,
    index_lag_ms_p99: f64,
    index_lag_ms_max: f64,
    /// Most root commits an index was behind when it started a batch.
    index_behind_max: u64,
    /// The commit latency distribution: (percentile, microseconds).
    distribution: Vec<(f64, u64)>,
    /// Documents/s, anonymous memory and data file length, sampled every second.
    timeline: Vec<shop_measure::Sample>,
    #[serde(skip)]
    histogram: Option<Histogram<u64>>,
}

#[derive(Serialize)]
struct Report {
    machine: String,
    /// The disk profile and the synced writes/s probed before the run.
    disk: String,
    synced_writes_per_s: f64,
    file_system: String,
    dir: String,
    /// Each mode's median run by documents/s (its only run without `--rounds`).
    modes: Vec<ModeResult>,
    /// Every run, in the order they ran (with `--rounds` above 1).
    runs: Vec<ModeResult>,
}

/// Each of `modes`' median run in `runs` by documents/s (the lower middle one of an even
/// count), in the order of `modes`.
fn median_runs(modes: &[JournalArg], runs: &[ModeResult]) -> Vec<ModeResult> {
    modes
        .iter()
        .filter_map(|m| {
            let mut mine: Vec<&ModeResult> =
                runs.iter().filter(|r| r.journal == m.name()).collect();
            mine.sort_by(|x, y| x.documents_per_s.total_cmp(&y.documents_per_s));
            mine.get(mine.len().saturating_sub(1) / 2)
                .map(|r| (*r).clone())
        })
        .collect()
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

fn run_mode(
    a: &ShopArgs,
    mode: JournalArg,
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
    std::fs::create_dir_all(&tmp).map_err(|e| Fail::io(format!("{}: {e}", tmp.display())))?;
    if !a.keep {
        shop_measure::remove_on_interrupt(&tmp);
    }
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
    mode: JournalArg,
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
            journal_mode: mode.mode(),
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
    let done = Arc::new(AtomicU64::new(0));
    let db_dir = tmp.join("shop.omnibus");
    let mut storages: Vec<omnibus::Storage> = vec![root.storage().clone()];
    for i in 0..a.indexes as usize {
        storages.push(db.blocking_storage(&index_name(i))?.storage().clone());
    }
    let flushes = |ss: &[omnibus::Storage]| {
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
    let memory_budget_overruns = engine.memory_budget_overruns();
    let (data_len, data_alloc) = shop_measure::data_file_bytes(&db_dir);
    let end = db.stats();
    let (flushes1, pages_flushed1) = flushes(&storages);
    drop(root);
    drop(db);
    let close = Instant::now();
    engine
        .shutdown()
        .map_err(|e| Fail::from(e).context("closing the database"))?;
    let close_seconds = close.elapsed().as_secs_f64();
    let disk1 = fmt::process_write_bytes();
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
        disk_bytes_per_document: disk0.zip(disk1).map(|(a, b)| per_doc(b.saturating_sub(a))),
        index_lag_ms_p50: slowest(|r| r.apply_lag.p50_ms),
        index_lag_ms_p99: slowest(|r| r.apply_lag.p99_ms),
        index_lag_ms_max: slowest(|r| r.apply_lag.max_ms),
        index_behind_max: behind,
        distribution: distribution(&lat),
        timeline,
        histogram: Some(lat),
    })
}

pub fn run(a: ShopArgs) -> CliResult {
    crate::check_cores(a.cores)?;
    if a.docs == Some(0) {
        return Err(Fail::input("--docs must be at least 1"));
    }
    if let Some(r) = a.rate {
        if !(r > 0.0 && r.is_finite()) {
            return Err(Fail::input(
                "--rate must be a positive number of documents per second",
            ));
        }
    }
    let seconds = match (a.seconds, a.docs) {
        (Some(s), _) if !(s > 0.0 && s.is_finite()) => {
            return Err(Fail::input("--seconds must be a positive number"))
        }
        (Some(s), _) => Some(s),
        (None, Some(_)) => None,
        (None, None) => Some(20.0),
    };
    let mut modes: Vec<JournalArg> = Vec::new();
    for m in &a.journal {
        if !modes.contains(m) {
            modes.push(*m);
        }
    }
    // Checked before the run, so a bad path fails now instead of after the whole benchmark.
    if let Some(p) = &a.json {
        writable_parent("--json", p)?;
    }
    if let Some(p) = &a.plot {
        writable_parent("--plot", p)?;
    }
    if let Some(p) = &a.plot_timeline {
        writable_parent("--plot-timeline", p)?;
    }
    // Before any thread starts and before anything is created: Ctrl-C or a TERM then removes
    // the run's directories and leaves the slow-disk cgroup.
    shop_measure::handle_interrupts();
    let base = base_dir(&a)?;
    let dir: PathBuf = base.path().to_path_buf();
    let fs = fmt::fs_type(&dir);
    if fs == "tmpfs" && !a.allow_tmpfs {
        let msg = match &base {
            BaseDir::Given(_) => format!(
                "--dir {} is on a tmpfs: fdatasync costs nothing there; give a directory on a disk with --dir (or --allow-tmpfs)",
                dir.display()
            ),
            BaseDir::Temp { fallback, .. } => format!(
                "the temporary directory {} is on a tmpfs{}: fdatasync costs nothing there; run it from a writable directory on a disk (or pass --allow-tmpfs)",
                dir.display(),
                if *fallback {
                    " (the current directory is not writable, so the system temp directory was used)"
                } else {
                    ""
                }
            ),
        };
        return Err(Fail::input(msg));
    }
    // Entered before the run, left (the process moved back) when `slow` is dropped at the end.
    let slow = match a.disk {
        DiskArg::Slow => Some(shop_measure::SlowDisk::enter(&dir)?),
        DiskArg::Normal => None,
    };
    let synced_writes_per_s = shop_measure::probe_synced_writes(&dir, PROBE_WRITES)?;
    let disk = match &slow {
        Some(s) => format!(
            "slow ({} write I/Os/s on device {} through {}): {synced_writes_per_s:.0} synced 4 KiB writes/s measured",
            shop_measure::SLOW_DISK_WRITE_IOPS,
            s.device,
            s.controller
        ),
        None => format!("normal: {synced_writes_per_s:.0} synced 4 KiB writes/s measured"),
    };
    let machine = fmt::machine();
    let amount = match seconds {
        Some(s) => format!("{s} s"),
        None => format!("{} documents", a.docs.unwrap_or(0)),
    };
    let load = match a.rate {
        Some(r) => format!("open loop at {r} documents/s"),
        None => format!("{} clients", a.clients),
    };
    eprintln!(
        "bench shop: 1 documents storage + {} indexes, {load}, {amount} per mode; {} in {} ({fs}); disk {disk}",
        a.indexes,
        modes.iter().map(|m| m.name()).collect::<Vec<_>>().join(" then "),
        dir.display()
    );
    let mut runs: Vec<ModeResult> = Vec::new();
    // Bounded: --rounds is at most 100, modes at most 2.
    for round in 0..a.rounds {
        let order: Vec<JournalArg> = if round % 2 == 0 {
            modes.clone()
        } else {
            modes.iter().rev().copied().collect()
        };
        for m in &order {
            eprintln!("bench shop: running {} ...", m.name());
            let r = run_mode(&a, *m, &dir, seconds)
                .map_err(|f| f.context(format_args!("{} journal", m.name())))?;
            // Hand the freed heap of this mode back to the system, so the next mode's memory
            // samples start from what it holds itself (glibc keeps freed memory otherwise).
            // SAFETY: malloc_trim has no preconditions; it only releases free heap memory.
            unsafe {
                libc::malloc_trim(0);
            }
            eprintln!(
            "bench shop: {}: {} documents in {:.1} s ({:.0}/s), index catch-up {:.2} s, setup {:.1} s, close {:.1} s",
            m.name(),
            r.documents,
            r.seconds,
            r.documents_per_s,
            r.catch_up_seconds,
            r.setup_seconds,
            r.close_seconds
        );
            runs.push(r);
        }
    }
    let results = median_runs(&modes, &runs);
    if a.rounds > 1 {
        for m in &modes {
            let each: Vec<String> = runs
                .iter()
                .filter(|r| r.journal == m.name())
                .map(|r| format!("{:.0}", r.documents_per_s))
                .collect();
            println!(
                "{} documents/s in each round: {} (the table shows the median run)",
                m.name(),
                each.join(", ")
            );
        }
    }
    println!("machine: {machine}; file system: {fs} ({})", dir.display());
    println!("disk: {disk}");
    println!(
        "workload: 1 documents storage + {} index storages, {load}, ~1 KB documents, {amount} per mode",
        a.indexes
    );
    print_table(&results);
    if let Some(p) = &a.json {
        let rep = Report {
            machine: machine.clone(),
            disk: disk.clone(),
            synced_writes_per_s,
            file_system: fs.clone(),
            dir: dir.display().to_string(),
            modes: results.clone(),
            runs: if a.rounds > 1 {
                runs.clone()
            } else {
                Vec::new()
            },
        };
        let text = serde_json::to_string_pretty(&rep).expect("serializable");
        std::fs::write(p, text + "\n")
            .map_err(|e| Fail::io(format!("--json {}: {e}", p.display())))?;
    }
    if let Some(p) = &a.plot {
        let series: Vec<(String, Vec<(f64, u64)>)> = results
            .iter()
            .map(|r| {
                (
                    format!("{} journal: {:.0} docs/s", r.journal, r.documents_per_s),
                    r.histogram.as_ref().map(plot_points).unwrap_or_default(),
                )
            })
            .collect();
        let title = format!(
            "omnibus bench shop: document commit latency, 1 + {} storages, {} clients",
            a.indexes, a.clients
        );
        crate::plot::latency_png(p, &title, &series)
            .map_err(|e| Fail::io(format!("--plot {}: {e}", p.display())))?;
    }
    if let Some(p) = &a.plot_timeline {
        let series: Vec<crate::plot::TimelineSeries> = results
            .iter()
            .map(|r| {
                (
                    format!("{} journal", r.journal),
                    r.timeline
                        .iter()
                        .map(|t| (t.t_s, t.documents_per_s, t.anon_rss_mib))
                        .collect(),
                )
            })
            .collect();
        let title = format!(
            "omnibus bench shop over time: 1 + {} storages, {load}",
            a.indexes
        );
        crate::plot::timeline_png(p, &title, &series)
            .map_err(|e| Fail::io(format!("--plot-timeline {}: {e}", p.display())))?;
    }
    drop(slow);
    Ok(())
}

/// Where the per-mode databases go: `--dir`, or a temporary directory (deleted at the end
/// unless `--keep`) under the current directory, or under the system temp directory when the
/// current directory is not writable.
enum BaseDir {
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
    fn path(&self) -> &Path {
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

fn base_dir(a: &ShopArgs) -> CliResult<BaseDir> {
    let stale = |d: &Path| {
        for name in shop_measure::remove_stale(d) {
            eprintln!(
                "omnibus: removed {} left by a killed run",
                d.join(name).display()
            );
        }
    };
    if let Some(d) = &a.dir {
        std::fs::create_dir_all(d)
            .map_err(|e| Fail::input(format!("--dir {}: {e}", d.display())))?;
        stale(d);
        return Ok(BaseDir::Given(d.clone()));
    }
    stale(Path::new("."));
    // The process id in the name lets a later run remove it if this one is killed.
    let prefix = format!("omnibus-shop-{}-", std::process::id());
    let builder = || {
        let mut b = tempfile::Builder::new();
        b.prefix(&prefix);
        b
    };
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
        shop_measure::remove_on_interrupt(&path);
    }
    Ok(BaseDir::Temp {
        dir: Some(t),
        path,
        fallback,
        keep: a.keep,
    })
}

/// Checks that `file`'s directory exists and is writable, so that writing `file` after the
/// run does not fail (`opt` names the option in the message).
pub(crate) fn writable_parent(opt: &str, file: &Path) -> CliResult {
    let parent = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if file.is_dir() {
        return Err(Fail::input(format!(
            "{opt} {}: is a directory (give a file name)",
            file.display()
        )));
    }
    match std::fs::metadata(parent) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(Fail::input(format!(
                "{opt} {}: {} is not a directory",
                file.display(),
                parent.display()
            )))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Fail::input(format!(
                "{opt} {}: directory {} does not exist",
                file.display(),
                parent.display()
            )))
        }
        Err(e) => {
            return Err(Fail::input(format!(
                "{opt} {}: directory {}: {e}",
                file.display(),
                parent.display()
            )))
        }
    }
    if rustix::fs::access(parent, rustix::fs::Access::WRITE_OK).is_err() {
        return Err(Fail::input(format!(
            "{opt} {}: directory {} is not writable",
            file.display(),
            parent.display()
        )));
    }
    Ok(())
}

/// (percentile, microseconds) points of a histogram for the plot, the maximum last.
fn plot_points(h: &Histogram<u64>) -> Vec<(f64, u64)> {
    let mut v: Vec<(f64, u64)> = Vec::new();
    for it in h.iter_quantiles(8) {
        let q = it.quantile_iterated_to();
        if q < 1.0 {
            v.push((q, it.value_iterated_to()));
        }
    }
    if !h.is_empty() {
        let last = v.last().map(|p| p.0).unwrap_or(0.0);
        v.push(((1.0 - 1.0 / h.len() as f64).max(last), h.max()));
    }
    // Monotone: each point at least the one before it.
    let mut top = 0;
    for p in &mut v {
        top = top.max(p.1);
        p.1 = top;
    }
    v
}

fn print_table(rs: &[ModeResult]) {
    let shared = rs.iter().find(|r| r.journal == "shared");
    let separate = rs.iter().find(|r| r.journal == "separate");
    let mut header = format!("{:<28}", "");
    for r in rs {
        header.push_str(&format!("{:>14}", r.journal));
    }
    let gain = shared.is_some() && separate.is_some();
    if gain {
        header.push_str(&format!("{:>10}", "gain"));
    }
    println!("{header}");
    // (label, value, higher is better)
    type Get = fn(&ModeResult) -> f64;
    let rows: [(&str, Get, bool, usize); 21] = [
        ("documents/s", |r| r.documents_per_s, true, 0),
        ("CPU us/document", |r| r.cpu_us_per_document, false, 0),
        (
            "commit p50 (ms)",
            |r| r.commit_us_p50 as f64 / 1000.0,
            false,
            2,
        ),
        (
            "commit p99 (ms)",
            |r| r.commit_us_p99 as f64 / 1000.0,
            false,
            2,
        ),
        (
            "commit p99.9 (ms)",
            |r| r.commit_us_p999 as f64 / 1000.0,
            false,
            2,
        ),
        (
            "commit max (ms)",
            |r| r.commit_us_max as f64 / 1000.0,
            false,
            2,
        ),
        ("fdatasyncs/s", |r| r.fdatasyncs_per_s, false, 0),
        (
            "fdatasyncs per 1000 docs",
            |r| {
                if r.documents > 0 {
                    r.fdatasyncs as f64 * 1000.0 / r.documents as f64
                } else {
                    0.0
                }
            },
            false,
            1,
        ),
        (
            "commits per fdatasync",
            |r| r.commits_per_fdatasync,
            true,
            1,
        ),
        // The group commit factor: journal fdatasyncs also count the pre-zeroing of the
        // journal's tail (one per zeroed chunk) and the start of each journal file, so commits
        // per fdatasync can be under 1 while every batch holds several commits.
        (
            "commits per journal batch",
            |r| {
                if r.batches > 0 {
                    r.commits as f64 / r.batches as f64
                } else {
                    0.0
                }
            },
            true,
            1,
        ),
        (
            "journal bytes/document",
            |r| r.journal_bytes_per_document,
            false,
            0,
        ),
        (
            "disk bytes/document",
            |r| r.disk_bytes_per_document.unwrap_or(0.0),
            false,
            0,
        ),
        (
            "data file bytes/document",
            |r| r.data_file_bytes_per_document,
            false,
            0,
        ),
        (
            "data alloc bytes/document",
            |r| r.data_allocated_bytes_per_document,
            false,
            0,
        ),
        ("anon RSS max (MiB)", |r| r.anon_rss_mib_max, false, 0),
        ("page images max (MiB)", |r| r.page_image_mib_max, false, 0),
        ("memory budget (MiB)", |r| r.memory_budget_mib, false, 0),
        (
            "budget overruns",
            |r| r.memory_budget_overruns as f64,
            false,
            0,
        ),
        ("index lag p99 (ms)", |r| r.index_lag_ms_p99, false, 1),
        ("index lag max (ms)", |r| r.index_lag_ms_max, false, 1),
        ("documents", |r| r.documents as f64, true, 0),
    ];
    for (label, get, higher, prec) in rows {
        let mut line = format!("{label:<28}");
        for r in rs {
            line.push_str(&format!("{:>14.*}", prec, get(r)));
        }
        if let (Some(s), Some(p)) = (shared, separate) {
            let (a, b) = (get(s), get(p));
            let g = if higher { a / b } else { b / a };
            if g.is_finite() && label != "documents" {
                line.push_str(&format!("{:>9.1}x", g));
            }
        }
        println!("{line}");
    }
    if gain {
        println!("gain: shared over separate (shared/separate for rates, separate/shared for latencies and costs; above 1x: shared is better)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plot_points_are_monotone() {
        let mut h = fmt::histogram();
        let mut rng = SmallRng::seed_from_u64(7);
        for _ in 0..20_000 {
            let v: u64 = if rng.random_ratio(1, 100) {
                rng.random_range(100_000..1_400_000)
            } else {
                rng.random_range(1_000..300_000)
            };
            h.record(v).unwrap();
        }
        let p = plot_points(&h);
        assert!(p.len() > 10);
        for w in p.windows(2) {
            assert!(w[0].0 <= w[1].0 && w[0].1 <= w[1].1, "{w:?}");
        }
        assert_eq!(p.last().unwrap().1, h.max());
    }

    #[test]
    fn users_are_about_1_kb_and_index_keys_end_with_the_id() {
        let u = User::generate(42);
        let n = serde_json::to_vec(&u).unwrap().len();
        assert!((900..1200).contains(&n), "{n}");
        for i in 0..100 {
            let k = u.index_key(i);
            assert!(k.ends_with(b"\x00users/000000000042"));
        }
        assert_eq!(User::generate(42).email, u.email);
    }

    #[test]
    fn index_terms_scan_the_same_keys_as_index_key() {
        for n in 0..300 {
            let u = User::generate(n);
            let doc = serde_json::to_vec(&u).unwrap();
            for i in 0..100 {
                let key = u.index_key(i);
                let term = &key[..key.len() - 1 - u.id.len()];
                assert_eq!(
                    index_terms(i, &doc),
                    vec![term.to_vec()],
                    "user {n} index {i}"
                );
            }
        }
        // FIELDS: 0 name, 1 email, 2 country, 3 age.
        assert_eq!(scan_field(br#"{"name":"x\"y","age":12}"#, 0), None);
        assert_eq!(
            scan_field(br#"{"name":"x\"y","age":12}"#, 3),
            Some(&b"12"[..])
        );
        assert_eq!(scan_field(br#"{"name":"x","age":12}"#, 3), Some(&b"12"[..]));
        assert_eq!(
            scan_field(br#"{"name":true,"email":"v"}"#, 1),
            Some(&b"v"[..])
        );
        assert_eq!(scan_field(br#"{"age":1}"#, 3), Some(&b"1"[..]));
        assert_eq!(scan_field(br#"{"age":1}"#, 2), None);
        assert_eq!(scan_field(br#"{"name":"unterminated"#, 0), None);
        assert_eq!(scan_field(br#"{"age":1"#, 3), None);
    }
}
