//! `omnibus ingest`: JSON Lines into the root storage through the actor runtime, with the
//! `--index` specs defined as engine indexes (kept from the documents' change feed).
//!
//! Threads: a reader thread reads capped lines, checks and parses them, and sends documents on
//! a bounded channel; the dispatcher (a tokio task) keeps up to `--window` document puts in
//! flight (never two of the same id at once, so a document's versions stay in order); each
//! document task compares the stored version and puts the new one if it differs. The engine
//! feeds every acknowledged root commit to the index actors; the command waits for them
//! (`wait_for_indexes`) before its summary.
//!
//! However it ends (input done, `--on-error abort`, more than `--max-errors` bad lines, a
//! failure, or Ctrl-C), the documents read so far are committed and the indexes brought up to
//! date before the summary is printed; only then does it exit (1, 2 or 130).

use std::collections::HashSet;
use std::io::{BufRead, BufReader, IsTerminal, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use omnibus::actors::{DatabaseHandle, Engine, EngineOptions, StorageHandle};
use omnibus::{Options, MAX_KEY_LEN, MAX_VALUE_LEN};
use serde::Serialize;
use serde_json::{Map, Value};
use tokio::sync::mpsc;

use crate::cli::{IngestArgs, OnDuplicate, OnError};
use crate::index_spec::IndexSpec;
use crate::lines::{read_line_capped, Line};
use crate::{db_dir, fmt, CliResult, Fail};

/// A checked, parsed input line.
struct Doc {
    line: u64,
    id: Vec<u8>,
    value: Vec<u8>,
}

enum Item {
    Doc(Doc),
    Bad {
        line: u64,
        msg: String,
    },
    /// Reading the input failed (fatal).
    ReadFailed(String),
}

fn describe(v: &Value) -> &'static str {
    match v {
        Value::Array(_) => "an array",
        Value::String(_) => "a string",
        Value::Number(_) => "a number",
        Value::Bool(_) => "a boolean",
        Value::Null => "null",
        Value::Object(_) => "an object",
    }
}

/// The id of a document: `--id-field`'s value, or the line number in 12 digits.
fn doc_id(doc: &Map<String, Value>, id_field: Option<&str>, line: u64) -> Result<Vec<u8>, String> {
    let id = match id_field {
        None => return Ok(format!("{line:012}").into_bytes()),
        Some(f) => match doc.get(f) {
            None => return Err(format!("no id field `{f}`")),
            Some(Value::String(s)) => s.as_bytes().to_vec(),
            Some(Value::Number(n)) => n.to_string().into_bytes(),
            Some(v) => {
                return Err(format!(
                    "id field `{f}` is not a string or a number ({})",
                    describe(v)
                ))
            }
        },
    };
    if id.is_empty() || id.len() > MAX_KEY_LEN {
        return Err(format!(
            "id is {} bytes: keys are 1..={MAX_KEY_LEN} bytes",
            id.len()
        ));
    }
    Ok(id)
}

/// Checks and parses one line (already without its newline).
fn parse_line(
    raw: &[u8],
    line: u64,
    id_field: Option<&str>,
    specs: &[IndexSpec],
) -> Result<Option<Doc>, String> {
    let text = match std::str::from_utf8(raw) {
        Ok(t) => t.trim(),
        Err(e) => return Err(format!("not valid UTF-8 (byte offset {})", e.valid_up_to())),
    };
    if text.is_empty() {
        return Ok(None);
    }
    if text.len() > MAX_VALUE_LEN {
        return Err(format!(
            "document is {} bytes: the value limit is {MAX_VALUE_LEN} bytes",
            text.len()
        ));
    }
    let v: Value = serde_json::from_str(text).map_err(|e| {
        format!(
            "not JSON: {}",
            e.to_string().replace(" at line 1 column ", " at column ")
        )
    })?;
    let Value::Object(obj) = v else {
        return Err(format!("not a JSON object ({})", describe(&v)));
    };
    let id = doc_id(&obj, id_field, line)?;
    // An entry the engine could not store (it would skip it) is refused here, with its line.
    for s in specs {
        if let Some(n) = s.key_len(&obj, &id)? {
            if n > MAX_KEY_LEN {
                return Err(format!(
                    "index `{}` key is {n} bytes: keys are 1..={MAX_KEY_LEN} bytes",
                    s.name
                ));
            }
        }
    }
    Ok(Some(Doc {
        line,
        id,
        value: text.as_bytes().to_vec(),
    }))
}

/// The reader thread: every line in order, as documents or errors.
fn read_input(
    mut r: impl BufRead,
    tx: mpsc::Sender<Item>,
    cap: usize,
    id_field: Option<String>,
    specs: Vec<IndexSpec>,
    pb: ProgressBar,
) {
    let mut buf = Vec::new();
    let mut line = 0u64;
    loop {
        let got = match read_line_capped(&mut r, &mut buf, cap) {
            Ok(g) => g,
            Err(e) => {
                let _ =
                    tx.blocking_send(Item::ReadFailed(format!("reading line {}: {e}", line + 1)));
                return;
            }
        };
        line += 1;
        let item = match got {
            Line::Eof => return,
            Line::TooLong(n) => {
                pb.inc(n + 1);
                Item::Bad { line, msg: format!("longer than the line limit of {cap} bytes ({n} bytes; see --max-line-bytes)") }
            }
            Line::Read => {
                pb.inc(buf.len() as u64 + 1);
                match parse_line(&buf, line, id_field.as_deref(), &specs) {
                    Ok(Some(d)) => Item::Doc(d),
                    Ok(None) => continue,
                    Err(msg) => Item::Bad { line, msg },
                }
            }
        };
        if tx.blocking_send(item).is_err() {
            return;
        }
    }
}

enum Outcome {
    /// A new id, stored.
    Stored,
    /// An id already stored with other bytes, replaced (`--on-duplicate last`).
    Replaced,
}

struct Done {
    id: Vec<u8>,
    line: u64,
    latency_us: Option<u64>,
    result: Result<Outcome, Fail>,
}

/// The fatal failure of the document of input line `line`. [`ingest_doc`]'s errors do not
/// name the line: it is put in front here, once.
fn doc_failed(line: u64, f: Fail) -> Fail {
    f.context(format_args!("line {line}"))
}

/// One document the dispatcher decided to store: put it (the engine updates the indexes from
/// the put). Its errors do not name the line (see [`doc_failed`]).
async fn ingest_doc(
    root: StorageHandle,
    d: Doc,
    outcome: Outcome,
) -> (Option<u64>, Result<Outcome, Fail>) {
    let t = Instant::now();
    if let Err(e) = root.put(d.id, d.value).await {
        return (None, Err(Fail::from(e).context("storing the document")));
    }
    (Some(t.elapsed().as_micros() as u64), Ok(outcome))
}

/// What the root holds at the id of `d` now: `None` (a new id), `Some(true)` (the same bytes),
/// `Some(false)` (another document).
fn stored_version(root: &StorageHandle, d: &Doc) -> omnibus::Result<Option<bool>> {
    Ok(root.snapshot()?.get(&d.id)?.map(|v| v == &d.value[..]))
}

#[derive(Debug, Serialize)]
struct IndexSummary {
    name: String,
    entries: u64,
    /// Root txn id the index has applied.
    applied_txn: u64,
    /// Whether it was built or reconciled from the documents on this run (false: resumed).
    reconciled: bool,
    /// Document changes applied from the feed on this run.
    changes: u64,
    /// Index transactions committed from the feed on this run.
    batches: u64,
    lag_ms_max: f64,
}

#[derive(Debug, Serialize)]
struct Summary {
    db: String,
    input: String,
    journal: &'static str,
    documents: u64,
    /// Documents written (new ids and replaced ones).
    stored: u64,
    unchanged: u64,
    /// Documents whose id the root already held when their line was reached (an earlier line,
    /// or stored before the run): replaced, unchanged, kept or refused as `on_duplicate` says.
    duplicates: u64,
    replaced: u64,
    kept: u64,
    /// Duplicates made bad lines (`--on-duplicate error`).
    refused: u64,
    on_duplicate: &'static str,
    bad_lines: u64,
    seconds: f64,
    documents_per_s: f64,
    commit_latency_us_p50: u64,
    commit_latency_us_p99: u64,
    commit_latency_us_max: u64,
    commits: u64,
    batches: u64,
    commits_per_batch: f64,
    fdatasyncs: u64,
    journal_bytes: u64,
    disk_write_bytes: Option<u64>,
    index_lag_ms_p99: f64,
    index_lag_ms_max: f64,
    index_behind_max: u64,
    indexes: Vec<IndexSummary>,
    root_entries: u64,
    /// The root's last committed txn id: an index whose `applied_txn` is below it is behind
    /// the documents (a run that failed or was killed before the indexes caught up).
    root_txn: u64,
    aborted_at_line: Option<u64>,
    /// Why the run ended before the end of its input (`--on-error abort`, `--max-errors`,
    /// Ctrl-C, or the failure's message); absent when it read all of it.
    stopped: Option<String>,
}

struct Counts {
    documents: u64,
    stored: u64,
    /// Stored over a document with the same id and other bytes (`--on-duplicate last`).
    replaced: u64,
    /// Not stored: the id was held with other bytes (`--on-duplicate first`).
    kept: u64,
    unchanged: u64,
    /// Documents whose id the root already held when their line was reached.
    duplicates: u64,
    bad: u64,
    latency: Histogram<u64>,
    aborted_at: Option<u64>,
    /// Ended by more than `--max-errors` bad lines (the line of the last one).
    too_many_errors_at: Option<u64>,
    /// Ended by Ctrl-C (SIGINT): the last input line handed on before it.
    interrupted_after: Option<u64>,
    fatal: Option<Fail>,
}

/// Set by the SIGINT handler that [`catch_interrupt`] installs.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    // Async-signal-safe: one atomic store.
    INTERRUPTED.store(true, Ordering::Release);
}

/// Makes the first Ctrl-C (SIGINT) stop reading the input instead of killing the process: the
/// documents read so far are committed, the indexes brought up to date and the summary printed.
/// A second Ctrl-C kills as usual (SA_RESETHAND).
fn catch_interrupt() {
    // SAFETY: `sa` is zeroed then filled with a valid handler (an `extern "C"` fn that only
    // stores an atomic, async-signal-safe) and flags; `sigaction` reads it and an ignored old
    // action pointer may be null.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigint as extern "C" fn(libc::c_int) as usize;
        sa.sa_flags = libc::SA_RESTART | libc::SA_RESETHAND;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut()) != 0 {
            tracing::warn!("cannot catch Ctrl-C: it ends the ingest without a summary");
        }
    }
}

/// How often the dispatcher looks for a Ctrl-C while it waits for input.
const INTERRUPT_POLL: Duration = Duration::from_millis(50);

/// The run's rules from the command line: `--window`, `--on-error`, `--max-errors`,
/// `--on-duplicate`.
#[derive(Debug, Clone, Copy)]
struct Rules {
    window: usize,
    on_error: OnError,
    max_errors: u64,
    on_duplicate: OnDuplicate,
}

/// Counts bad input line `line` (`msg` says why) and reports it; returns whether the run
/// stops there (`--on-error abort`, or more than `--max-errors` bad lines).
fn bad_line(c: &mut Counts, line: u64, msg: &str, rules: Rules, pb: &ProgressBar) -> bool {
    c.bad += 1;
    match rules.on_error {
        OnError::Skip if c.bad > rules.max_errors => {
            pb.suspend(|| eprintln!("omnibus: line {line}: {msg}"));
            c.too_many_errors_at = Some(line);
            true
        }
        OnError::Skip => {
            pb.suspend(|| eprintln!("omnibus: line {line}: {msg} (skipped)"));
            false
        }
        OnError::Abort => {
            pb.suspend(|| eprintln!("omnibus: line {line}: {msg}"));
            c.aborted_at = Some(line);
            true
        }
    }
}

/// The dispatcher: keeps up to `window` puts in flight, one per id at a time.
async fn dispatch(
    mut items: mpsc::Receiver<Item>,
    root: StorageHandle,
    rules: Rules,
    pb: ProgressBar,
    failed: Arc<AtomicBool>,
) -> Counts {
    let mut c = Counts {
        documents: 0,
        stored: 0,
        replaced: 0,
        kept: 0,
        unchanged: 0,
        duplicates: 0,
        bad: 0,
        latency: crate::fmt::histogram(),
        aborted_at: None,
        too_many_errors_at: None,
        interrupted_after: None,
        fatal: None,
    };
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Done>();
    let mut in_flight: HashSet<Vec<u8>> = HashSet::new();
    let finish = |d: Done, c: &mut Counts, in_flight: &mut HashSet<Vec<u8>>| {
        in_flight.remove(&d.id);
        if let Some(l) = d.latency_us {
            let _ = c.latency.record(l);
        }
        match d.result {
            Ok(o) => {
                c.documents += 1;
                c.stored += 1;
                if let Outcome::Replaced = o {
                    c.replaced += 1;
                }
            }
            Err(f) => {
                if c.fatal.is_none() {
                    c.fatal = Some(doc_failed(d.line, f));
                }
            }
        }
    };
    let mut last_msg = Instant::now();
    let mut last_line = 0u64;
    loop {
        // Waits for the next item, looking for a Ctrl-C at least every INTERRUPT_POLL (the
        // reader may be blocked on a terminal or a pipe).
        let item = loop {
            if INTERRUPTED.load(Ordering::Acquire) {
                break None;
            }
            // An item ready now costs no timer.
            match items.try_recv() {
                Ok(it) => break Some(Some(it)),
                Err(mpsc::error::TryRecvError::Disconnected) => break Some(None),
                Err(mpsc::error::TryRecvError::Empty) => {}
            }
            if let Ok(got) = tokio::time::timeout(INTERRUPT_POLL, items.recv()).await {
                break Some(got);
            }
        };
        let Some(item) = item else {
            c.interrupted_after = Some(last_line);
            break;
        };
        let Some(item) = item else {
            break; // end of input
        };
        if c.fatal.is_some() {
            break;
        }
        match item {
            Item::ReadFailed(msg) => {
                c.fatal = Some(Fail::io(msg));
                break;
            }
            Item::Bad { line, msg } => {
                last_line = line;
                if bad_line(&mut c, line, &msg, rules, &pb) {
                    break;
                }
            }
            Item::Doc(d) => {
                last_line = d.line;
                while in_flight.len() >= rules.window || in_flight.contains(&d.id) {
                    let Some(done) = done_rx.recv().await else {
                        break;
                    };
                    finish(done, &mut c, &mut in_flight);
                }
                if c.fatal.is_some() {
                    break;
                }
                // Every earlier line with this id is stored by now (one put per id in flight),
                // so the root's snapshot tells whether the id is a duplicate.
                // Regression: duplicate ids were silently last-wins (the summary said "5
                // stored" while the root held 4).
                let outcome = match stored_version(&root, &d) {
                    Err(e) => {
                        c.fatal = Some(doc_failed(
                            d.line,
                            Fail::from(e).context("reading its stored version"),
                        ));
                        break;
                    }
                    Ok(None) => Outcome::Stored,
                    Ok(Some(same)) => {
                        c.duplicates += 1;
                        match rules.on_duplicate {
                            OnDuplicate::Error => {
                                let msg = format!(
                                    "id {} is already stored (--on-duplicate error)",
                                    fmt::escape(&d.id)
                                );
                                if bad_line(&mut c, d.line, &msg, rules, &pb) {
                                    break;
                                }
                                continue;
                            }
                            _ if same => {
                                c.documents += 1;
                                c.unchanged += 1;
                                continue;
                            }
                            OnDuplicate::First => {
                                c.documents += 1;
                                c.kept += 1;
                                continue;
                            }
                            OnDuplicate::Last => Outcome::Replaced,
                        }
                    }
                };
                in_flight.insert(d.id.clone());
                let (root, tx) = (root.clone(), done_tx.clone());
                tokio::spawn(async move {
                    let (id, line) = (d.id.clone(), d.line);
                    let (latency_us, result) = ingest_doc(root, d, outcome).await;
                    let _ = tx.send(Done {
                        id,
                        line,
                        latency_us,
                        result,
                    });
                });
            }
        }
        while let Ok(done) = done_rx.try_recv() {
            finish(done, &mut c, &mut in_flight);
        }
        if last_msg.elapsed() > Duration::from_millis(200) {
            pb.set_message(format!("{} documents", c.documents));
            last_msg = Instant::now();
        }
    }
    // Stop the reader (it sees the closed channel) and wait for every put in flight: whatever
    // was read before a bad line is committed before the command returns.
    drop(items);
    while !in_flight.is_empty() {
        let Some(done) = done_rx.recv().await else {
            break;
        };
        finish(done, &mut c, &mut in_flight);
    }
    if c.fatal.is_some() {
        failed.store(true, Ordering::Release);
    }
    c
}

fn open_input(a: &IngestArgs) -> CliResult<(Box<dyn Read + Send>, Option<u64>)> {
    if a.input.as_os_str() == "-" {
        return Ok((Box::new(std::io::stdin()), None));
    }
    // A directory opens fine but fails the first read: say so now, naming it.
    if std::fs::metadata(&a.input).is_ok_and(|m| m.is_dir()) {
        return Err(Fail::input(format!(
            "--input {}: is a directory (give a JSON Lines file, or - for standard input)",
            a.input.display()
        )));
    }
    let f = std::fs::File::open(&a.input)
        .map_err(|e| Fail::input(format!("{}: {e}", a.input.display())))?;
    let len = f.metadata().ok().filter(|m| m.is_file()).map(|m| m.len());
    Ok((Box::new(f), len))
}

pub fn run(a: IngestArgs) -> CliResult {
    let mut specs: Vec<IndexSpec> = Vec::new();
    for s in &a.indexes {
        let spec = IndexSpec::parse(s).map_err(Fail::input)?;
        if !specs.contains(&spec) {
            specs.push(spec);
        }
    }
    if let Some(f) = &a.id_field {
        if f.is_empty() {
            return Err(Fail::input("--id-field is empty"));
        }
    }
    crate::check_cores(a.cores)?;
    db_dir(&a.db)?;
    // Regression: `ingest` into a plain storage (made by `Storage::open`) exited 0 and turned
    // it into a database (`Indexes/` and index storages created in it).
    if crate::kv::is_plain_storage(&a.db) {
        // Someone else's `data.pages` is "not an omnibus storage", as every command says.
        crate::kv::open_plain(&a.db).map_err(|e| Fail::opening(e, &a.db))?;
        return Err(Fail::input(format!(
            "{}: a plain storage (made by `Storage::open`, not a database): `ingest` writes documents and indexes into a database, and no command turns a plain storage into one (`put` writes its keys)",
            a.db.display()
        )));
    }
    let (input, input_len) = open_input(&a)?;
    let pb = if std::io::stderr().is_terminal() {
        let pb = match input_len {
            Some(n) => ProgressBar::new(n).with_style(
                ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta}) {msg}")
                    .expect("valid template")
                    .progress_chars("=> "),
            ),
            None => ProgressBar::new_spinner()
                .with_style(ProgressStyle::with_template("{elapsed_precise} {spinner} {bytes} ({bytes_per_sec}) {msg}").expect("valid template")),
        };
        pb.enable_steady_tick(Duration::from_millis(200));
        pb
    } else {
        ProgressBar::hidden()
    };

    let engine = Engine::start(EngineOptions {
        executors: a.cores,
        ..EngineOptions::default()
    })?;
    let opts = Options {
        journal_mode: a.journal.mode(),
        ..Options::default()
    };
    let db: DatabaseHandle = engine
        .blocking_open_database(&a.db, opts)
        .map_err(|e| Fail::opening(e, &a.db))?;
    let root = db.root();
    // The listed indexes only: each is built, reconciled (behind the documents, e.g. after a
    // crash or a `put` outside the engine) or resumed; other index storages are left as they are.
    for s in &specs {
        db.blocking_define_index(s.definition())
            .map_err(|e| Fail::from(e).context(format_args!("index `{}`", s.name)))?;
    }
    // `check` cross-checks the indexes listed here (their map function is the spec's).
    let names: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
    crate::index_spec::record(&a.db, &names).map_err(Fail::io)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("omnibus-ingest")
        .enable_time()
        .build()
        .map_err(|e| Fail::io(format!("starting the tokio runtime: {e}")))?;

    let stats0 = db.stats();
    let disk0 = fmt::process_write_bytes();
    let started = Instant::now();

    let (item_tx, item_rx) = mpsc::channel::<Item>(4096);
    let reader = {
        let (cap, idf, sp, pb) = (
            a.max_line_bytes as usize,
            a.id_field.clone(),
            specs.clone(),
            pb.clone(),
        );
        std::thread::Builder::new()
            .name("omnibus-reader".into())
            .spawn(move || {
                read_input(
                    BufReader::with_capacity(1 << 20, input),
                    item_tx,
                    cap,
                    idf,
                    sp,
                    pb,
                )
            })
            .map_err(|e| Fail::io(format!("starting the reader thread: {e}")))?
    };
    let failed = Arc::new(AtomicBool::new(false));
    catch_interrupt();
    let (counts, waited) = rt.block_on(async {
        let counts = dispatch(
            item_rx,
            root.clone(),
            Rules {
                window: a.window as usize,
                on_error: a.on_error,
                max_errors: a.max_errors,
                on_duplicate: a.on_duplicate,
            },
            pb.clone(),
            failed.clone(),
        )
        .await;
        // Every document task has finished: wait until the indexes have applied every commit.
        (counts, db.wait_for_indexes().await)
    });
    let seconds = started.elapsed().as_secs_f64();
    // Not joined: after an abort it may still wait on standard input; it stops at its next send.
    drop(reader);
    pb.finish_and_clear();

    let stats1 = db.stats();
    let disk1 = fmt::process_write_bytes();
    let mut fatal = counts.fatal;
    if let Err(e) = waited {
        fatal = fatal.or(Some(Fail::from(e)));
    }
    let mut indexes = Vec::new();
    let (mut lag_p99, mut lag_max, mut behind) = (0f64, 0f64, 0u64);
    for st in db.index_stats() {
        lag_p99 = lag_p99.max(st.apply_lag.p99_ms);
        lag_max = lag_max.max(st.apply_lag.max_ms);
        behind = behind.max(st.max_lag_txns);
        indexes.push(IndexSummary {
            name: st.name,
            entries: st.entries,
            applied_txn: st.applied_txn,
            reconciled: st.reconciles > 0,
            changes: st.changes,
            batches: st.batches,
            lag_ms_max: st.apply_lag.max_ms,
        });
    }
    let root_stats = root.stats();
    let root_entries = root_stats.entries;
    let stopped = if let Some(f) = &fatal {
        Some(format!("failed: {}", f.msg))
    } else if let Some(line) = counts.aborted_at {
        Some(format!("aborted at line {line} (--on-error abort)"))
    } else if let Some(line) = counts.too_many_errors_at {
        Some(format!(
            "stopped at line {line}: more than {} bad lines (--max-errors)",
            a.max_errors
        ))
    } else {
        counts
            .interrupted_after
            .map(|line| format!("interrupted (Ctrl-C) after line {line}"))
    };
    let commits = stats1.commits - stats0.commits;
    let batches = stats1.batches - stats0.batches;
    let summary = Summary {
        db: a.db.display().to_string(),
        input: a.input.display().to_string(),
        journal: a.journal.name(),
        documents: counts.documents,
        stored: counts.stored,
        unchanged: counts.unchanged,
        duplicates: counts.duplicates,
        replaced: counts.replaced,
        kept: counts.kept,
        refused: counts
            .duplicates
            .saturating_sub(counts.replaced + counts.unchanged + counts.kept),
        on_duplicate: match a.on_duplicate {
            OnDuplicate::Last => "last",
            OnDuplicate::First => "first",
            OnDuplicate::Error => "error",
        },
        bad_lines: counts.bad,
        seconds,
        documents_per_s: counts.documents as f64 / seconds.max(1e-9),
        commit_latency_us_p50: counts.latency.value_at_quantile(0.5),
        commit_latency_us_p99: counts.latency.value_at_quantile(0.99),
        commit_latency_us_max: counts.latency.max(),
        commits,
        batches,
        commits_per_batch: if batches > 0 {
            commits as f64 / batches as f64
        } else {
            0.0
        },
        fdatasyncs: stats1.journal_fdatasyncs - stats0.journal_fdatasyncs,
        journal_bytes: stats1.journal_bytes - stats0.journal_bytes,
        disk_write_bytes: disk0.zip(disk1).map(|(a, b)| b.saturating_sub(a)),
        index_lag_ms_p99: lag_p99,
        index_lag_ms_max: lag_max,
        index_behind_max: behind,
        indexes,
        root_entries,
        root_txn: root_stats.last_committed_txn,
        aborted_at_line: counts.aborted_at.or(counts.too_many_errors_at),
        stopped,
    };
    drop(root);
    drop(db);
    let shut = engine.shutdown();
    // The summary is printed however the run ended (a failure, an abort, Ctrl-C): it says
    // what was stored and indexed before.
    print_summary(&summary, a.json);
    if fatal.is_none() {
        // A likely typo: an index that stays empty while the database holds documents (the
        // index storage is created and kept all the same).
        for i in summary.indexes.iter().filter(|i| i.entries == 0) {
            if summary.root_entries > 0 {
                eprintln!(
                    "omnibus: warning: index `{}` has no entries: none of the {} documents has its field(s); check the spelling",
                    i.name, summary.root_entries
                );
            }
        }
    }
    if let Some(f) = fatal {
        return Err(f);
    }
    shut.map_err(|e| Fail::from(e).context("closing the database"))?;
    if let Some(line) = counts.aborted_at {
        return Err(Fail::input(format!(
            "aborted at line {line} (--on-error abort): the {} documents before it are committed and indexed",
            counts.documents
        )));
    }
    if let Some(line) = counts.too_many_errors_at {
        return Err(Fail::input(format!(
            "stopped at line {line}: more than {} bad lines (--max-errors {}): the {} documents before it are committed and indexed",
            a.max_errors, a.max_errors, counts.documents
        )));
    }
    if let Some(line) = counts.interrupted_after {
        return Err(Fail {
            code: 130,
            msg: format!(
                "interrupted after line {line}: the {} documents read are committed and indexed",
                counts.documents
            ),
        });
    }
    // Regression: a file of nothing but bad lines stored nothing and
    // exited 0, which a script took for success.
    if counts.documents == 0 && counts.bad > 0 {
        return Err(Fail::input(format!(
            "nothing stored: all {} non-blank input lines were bad",
            counts.bad
        )));
    }
    Ok(())
}

fn print_summary(s: &Summary, json: bool) {
    if json {
        println!("{}", serde_json::to_string(s).expect("serializable"));
        return;
    }
    println!("database         {} ({} journal)", s.db, s.journal);
    if let Some(why) = &s.stopped {
        println!("stopped          {why}");
    }
    let kept = if s.kept > 0 {
        format!(", {} kept", s.kept)
    } else {
        String::new()
    };
    println!(
        "documents        {} ({} stored, {} unchanged{kept}; {} bad lines; root holds {})",
        s.documents, s.stored, s.unchanged, s.bad_lines, s.root_entries
    );
    println!(
        "duplicate ids    {} ({} replaced, {} unchanged, {} kept, {} refused; --on-duplicate {})",
        s.duplicates, s.replaced, s.unchanged, s.kept, s.refused, s.on_duplicate
    );
    println!("seconds          {:.2}", s.seconds);
    println!("documents/s      {:.0}", s.documents_per_s);
    println!(
        "commit latency   p50 {} µs, p99 {} µs, max {} µs",
        s.commit_latency_us_p50, s.commit_latency_us_p99, s.commit_latency_us_max
    );
    println!(
        "commits          {} in {} batches ({:.1} commits per batch)",
        s.commits, s.batches, s.commits_per_batch
    );
    println!("fdatasyncs       {}", s.fdatasyncs);
    match s.disk_write_bytes {
        Some(d) => println!(
            "bytes written    {} to journals; {} to disk in all",
            fmt::bytes(s.journal_bytes),
            fmt::bytes(d)
        ),
        None => println!(
            "bytes written    {} to journals",
            fmt::bytes(s.journal_bytes)
        ),
    }
    println!(
        "index lag        max {:.1} ms (p99 {:.1} ms, slowest index), at most {} root commits behind",
        s.index_lag_ms_max, s.index_lag_ms_p99, s.index_behind_max
    );
    for i in &s.indexes {
        println!(
            "index {:<10} {} entries ({}; then {} document changes from the feed in {} batches; lag max {:.1} ms)",
            i.name,
            i.entries,
            if i.reconciled {
                "built from the documents"
            } else {
                "resumed"
            },
            i.changes,
            i.batches,
            i.lag_ms_max
        );
        if i.applied_txn < s.root_txn {
            // Regression (an ingest stopped by a full disk, 48 MiB tmpfs): the line above read
            // as a finished index while it was 133 root commits behind the documents.
            println!(
                "      {:<10} BEHIND the documents: applied root txn {} of {}; the next `ingest --index {}` catches it up",
                "", i.applied_txn, s.root_txn, i.name
            );
        }
    }
}
