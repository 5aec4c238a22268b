//! Readers in other processes beside a live writer (design.md 6.5, invariant I16): a read-only
//! open succeeds while a writer process commits, flushes, reuses pages and punches holes, and
//! every snapshot it takes reads one committed state, for as long as it is held; writers and
//! readers killed with SIGKILL in every order; the slots of dead readers are cleared.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use omnibus::{FlushMode, Options, ReadTransaction, Storage};

use crate::common::children;

/// Set in a writer child's environment: the storage directory it writes.
const WRITER_DIR: &str = "OMNIBUS_LIVE_READERS_WRITER_DIR";
/// Set in a reader child's environment: the storage directory it reads.
const READER_DIR: &str = "OMNIBUS_LIVE_READERS_READER_DIR";

/// Keys of the model, in [`BLOCKS`] blocks of consecutive keys.
const KEYS: u64 = 3000;
/// Commit `t` rewrites block `t % BLOCKS` only: the other blocks' leaves stay where an older
/// flush wrote them, and a reader reads them from the data file.
const BLOCKS: u64 = 10;

fn key(j: u64) -> Vec<u8> {
    format!("key{j:05}").into_bytes()
}

/// The value of key `j` written by commit `t`: tagged with `t`, of a length that changes with
/// `t` (so leaves split and move).
fn value(t: u64, j: u64) -> Vec<u8> {
    let mut v = format!("{t}:{j}:").into_bytes();
    v.resize(40 + ((t * 7 + j) % 90) as usize, b'x');
    v
}

/// The commit that last wrote key `j` in state `t` (0: none yet).
fn last_writer(t: u64, j: u64) -> u64 {
    let b = j * BLOCKS / KEYS;
    if t < b {
        return 0;
    }
    t - (t - b) % BLOCKS
}

/// The writer: small, frequent flushes with hole punching, so freed pages are reused within
/// milliseconds; commit `t` rewrites the keys of block `t % BLOCKS` and sets `t` under `meta`.
fn writer_opts() -> Options {
    Options {
        flush_mode: FlushMode::Inline,
        flush_scratch_bytes: 256 << 10,
        punch_holes: true,
        ..Options::default()
    }
}

fn commit_round(s: &Storage, t: u64) {
    let mut w = s.begin_write().expect("writer: begin");
    for j in 0..KEYS {
        if j * BLOCKS / KEYS == t % BLOCKS {
            w.put(key(j), value(t, j)).expect("writer: put");
        }
    }
    w.put(b"meta", t.to_string().as_bytes())
        .expect("writer: meta");
    w.commit().expect("writer: commit");
}

/// Checks that `r` reads one whole committed state; returns its `t` (0: nothing committed).
fn verify(r: &ReadTransaction, what: &str) -> u64 {
    let Some(meta) = r
        .get(b"meta")
        .unwrap_or_else(|e| panic!("{what}: meta: {e}"))
    else {
        return 0;
    };
    let t: u64 = std::str::from_utf8(meta).unwrap().parse().unwrap();
    let mut want = 1;
    for j in 0..KEYS {
        let got = r
            .get(key(j))
            .unwrap_or_else(|e| panic!("{what}: key {j} of state {t}: {e}"));
        match last_writer(t, j) {
            0 => assert_eq!(got, None, "{what}: key {j} is not in state {t}"),
            w => {
                want += 1;
                assert_eq!(
                    got,
                    Some(&value(w, j)[..]),
                    "{what}: key {j} is not state {t}'s"
                );
            }
        }
    }
    let n = r.range(..).unwrap().count() as u64;
    assert_eq!(n, want, "{what}: a scan of state {t}");
    t
}

/// The writer child: opens (a storage left by a killed writer recovers), commits rounds after
/// the last one it finds, prints `T <t>` after each acknowledged commit, until killed.
#[test]
fn writer_child_entry() {
    let Ok(dir) = std::env::var(WRITER_DIR) else {
        return;
    };
    run_writer(&dir, writer_opts());
}

/// Set in a rotating writer child's environment: the storage directory it writes.
const ROTATING_WRITER_DIR: &str = "OMNIBUS_LIVE_READERS_ROTATING_WRITER_DIR";

/// The writer of [`writer_opts`] with small journal files zeroed a window at a time: while a
/// reader scans the current file, the background zeroes it further and the writer starts the
/// next file, many times a second.
fn rotating_writer_opts() -> Options {
    Options {
        journal_file_size: 8 << 20,
        journal_prezero: omnibus::Prezero::Ahead(256 << 10),
        ..writer_opts()
    }
}

/// The writer child of [`rotating_writer_opts`], as [`writer_child_entry`].
#[test]
fn rotating_writer_child_entry() {
    let Ok(dir) = std::env::var(ROTATING_WRITER_DIR) else {
        return;
    };
    run_writer(&dir, rotating_writer_opts());
}

/// The writer children's body: see [`writer_child_entry`].
fn run_writer(dir: &str, opts: Options) {
    let s = Storage::open(dir, opts).expect("writer child: open");
    let mut t = s
        .begin_read()
        .unwrap()
        .get(b"meta")
        .unwrap()
        .map_or(0, |m| {
            std::str::from_utf8(m).unwrap().parse::<u64>().unwrap()
        });
    let mut out = std::io::stdout().lock();
    writeln!(out, "\nOPEN").unwrap();
    out.flush().unwrap();
    let until = Instant::now() + Duration::from_secs(120);
    while Instant::now() < until {
        t += 1;
        commit_round(&s, t);
        writeln!(out, "T {t}").unwrap();
        out.flush().unwrap();
    }
}

/// The reader child: opens read-only, says so, holds the storage until killed.
#[test]
fn reader_child_entry() {
    let Ok(dir) = std::env::var(READER_DIR) else {
        return;
    };
    let s = Storage::open(
        &dir,
        Options {
            read_only: true,
            ..Options::default()
        },
    )
    .expect("reader child: open");
    let r = s.begin_read().unwrap();
    let t = verify(&r, "reader child");
    let mut out = std::io::stdout().lock();
    writeln!(out, "\nOPEN {t}").unwrap();
    out.flush().unwrap();
    std::thread::sleep(Duration::from_secs(120));
}

/// A child of this binary running `entry` with `var` set to `dir`; returns it once it printed
/// a line starting with `OPEN`, and a counter of the last `T <t>` line it printed since.
fn start(entry: &str, var: &str, dir: &Path) -> (Child, Arc<AtomicU64>) {
    let test = crate::common::test_name(module_path!(), entry);
    let mut child = children::spawn(
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", &test, "--nocapture", "--test-threads=1"])
            .env(var, dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit()),
    )
    .expect("spawning a child");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let opened = lines
        .by_ref()
        .any(|l| l.map(|l| l.trim().starts_with("OPEN")).unwrap_or(false));
    if !opened {
        let _ = child.kill();
        panic!("the child {entry} did not open: {:?}", child.wait());
    }
    let acked = Arc::new(AtomicU64::new(0));
    let a = acked.clone();
    std::thread::spawn(move || {
        for l in lines.map_while(Result::ok) {
            if let Some(t) = l.trim().strip_prefix("T ").and_then(|t| t.parse().ok()) {
                a.store(t, Ordering::SeqCst);
            }
        }
    });
    (child, acked)
}

fn kill(mut c: Child) {
    let _ = c.kill();
    let _ = c.wait();
}

fn read_only() -> Options {
    Options {
        read_only: true,
        ..Options::default()
    }
}

/// Waits until the writer acknowledged `n` more commits than `from`.
fn wait_for(acked: &AtomicU64, from: u64, n: u64) {
    let until = Instant::now() + Duration::from_secs(60);
    while acked.load(Ordering::SeqCst) < from + n {
        assert!(Instant::now() < until, "the writer stopped committing");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn readers_beside_a_live_writer_read_one_committed_state_while_pages_are_reused() {
    let _no_children = children::no_children_meanwhile();
    if std::env::var(WRITER_DIR).is_ok() || std::env::var(READER_DIR).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let (writer, acked) = start("writer_child_entry", WRITER_DIR, &path);
    wait_for(&acked, 0, 5);
    for round in 0..6 {
        let before = acked.load(Ordering::SeqCst);
        let s = Storage::open(&path, read_only())
            .unwrap_or_else(|e| panic!("round {round}: a read-only open beside the writer: {e}"));
        let held = s.begin_read().unwrap();
        let t = verify(&held, "a new reader");
        assert!(
            t >= before,
            "round {round}: the reader sees state {t}, older than the {before} acknowledged before it opened"
        );
        // The writer goes on (dozens of commits and flushes, every page rewritten, freed and
        // reused) while the snapshot is held and read again and again.
        let from = acked.load(Ordering::SeqCst);
        let mut seen = t;
        while acked.load(Ordering::SeqCst) < from + 40 {
            assert_eq!(verify(&held, "a held snapshot"), t);
            // Catching up moves later snapshots forward, never the held one.
            s.catch_up().unwrap();
            let now = verify(&s.begin_read().unwrap(), "a caught-up snapshot");
            assert!(now >= seen, "catch_up went back from {seen} to {now}");
            seen = now;
        }
        assert!(seen > t, "catch_up never saw a later commit");
        assert_eq!(verify(&held, "the held snapshot at the end"), t);
    }
    kill(writer);
}

/// Counts, by cause, the attempts of read-only opens and catch-ups made again (the events
/// `Source::load` logs at DEBUG: "reading beside a live writer: trying again").
#[derive(Clone, Default)]
struct Retries(Arc<std::sync::Mutex<std::collections::BTreeMap<String, u64>>>);

/// The `error` field of an event.
struct ErrorField(Option<String>, bool);

impl tracing::field::Visit for ErrorField {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "error" => self.0 = Some(format!("{value:?}")),
            "message" => self.1 = format!("{value:?}").contains("trying again"),
            _ => {}
        }
    }
}

impl tracing::Subscriber for Retries {
    fn register_callsite(
        &self,
        _: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        tracing::subscriber::Interest::always()
    }
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::DEBUG)
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut f = ErrorField(None, false);
        event.record(&mut f);
        if let ErrorField(Some(e), true) = f {
            let cause = if e.contains("cut short") {
                "a journal file cut short"
            } else if e.contains("journal file is missing") {
                "a journal file missing"
            } else if e.contains("flushed past") {
                "the header moved past the replay"
            } else if e.contains("txn ids are not contiguous") {
                "a gap in the txn ids"
            } else {
                &e
            };
            *self.0.lock().unwrap().entry(cause.into()).or_default() += 1;
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn readers_beside_a_writer_whose_journal_grows_and_rotates_under_them() {
    // Stress beside `reader_beside_moving_journal` (tests/core), which forces each race: here
    // a real writer process zeroes its current file further and starts the next one while
    // read-only opens and catch-ups scan it; every one succeeds, and the attempts they made
    // again are printed by cause.
    let _no_children = children::no_children_meanwhile();
    if std::env::var(ROTATING_WRITER_DIR).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let (writer, acked) = start("rotating_writer_child_entry", ROTATING_WRITER_DIR, &path);
    wait_for(&acked, 0, 5);
    let retries = Retries::default();
    // As `tests/core/metrics.rs` does: a second dispatcher makes callsites first reached by
    // tests beside this one consult this subscriber too.
    let _second = tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default());
    let (mut opens, mut catch_ups) = (0u64, 0u64);
    let until = Instant::now() + Duration::from_secs(5);
    tracing::subscriber::with_default(retries.clone(), || {
        tracing::callsite::rebuild_interest_cache();
        while Instant::now() < until {
            let before = acked.load(Ordering::SeqCst);
            let s = Storage::open(&path, read_only())
                .unwrap_or_else(|e| panic!("open {opens} beside the writer: {e}"));
            opens += 1;
            let t = verify(&s.begin_read().unwrap(), "a new reader");
            assert!(
                t >= before,
                "state {t}, {before} acknowledged before the open"
            );
            for _ in 0..3 {
                let before = acked.load(Ordering::SeqCst);
                s.catch_up()
                    .unwrap_or_else(|e| panic!("catch-up {catch_ups} beside the writer: {e}"));
                catch_ups += 1;
                let now = verify(&s.begin_read().unwrap(), "a caught-up reader");
                assert!(now >= before, "state {now}, {before} acknowledged before");
            }
        }
    });
    let journals = path.join(omnibus::testing::layout::JOURNALS_DIR);
    let newest = std::fs::read_dir(&journals)
        .unwrap()
        .filter_map(|e| omnibus::testing::journal::parse_file_name(e.ok()?.file_name().to_str()?))
        .max()
        .unwrap_or(0);
    kill(writer);
    eprintln!(
        "{opens} read-only opens and {catch_ups} catch-ups beside the writer (journal files 1 to \
         {newest}); attempts made again: {:?}",
        retries.0.lock().unwrap()
    );
    assert!(
        newest >= 3,
        "the writer started {newest} journal files only"
    );
}

#[test]
fn sigkilled_writers_and_readers_in_every_order() {
    let _no_children = children::no_children_meanwhile();
    if std::env::var(WRITER_DIR).is_ok() || std::env::var(READER_DIR).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    // Writer first, then a reader here; the writer is killed under the reader, a new writer
    // starts beside it (its open recovers and flushes), and the held snapshot still reads.
    let (w1, acked1) = start("writer_child_entry", WRITER_DIR, &path);
    wait_for(&acked1, 0, 10);
    let s = Storage::open(&path, read_only()).unwrap();
    let held = s.begin_read().unwrap();
    let t = verify(&held, "reader beside the first writer");
    wait_for(&acked1, acked1.load(Ordering::SeqCst), 10);
    let last1 = acked1.load(Ordering::SeqCst);
    kill(w1);
    assert_eq!(verify(&held, "after the writer was killed"), t);
    let (w2, acked2) = start("writer_child_entry", WRITER_DIR, &path);
    wait_for(&acked2, last1, 30);
    assert_eq!(verify(&held, "beside the second writer"), t);
    // A reader that opens now sees every commit the killed writer acknowledged.
    let s2 = Storage::open(&path, read_only()).unwrap();
    assert!(verify(&s2.begin_read().unwrap(), "a second reader") >= last1);
    // A reader process killed while the writer runs: its slot is found dead and cleared.
    let (r, _) = start("reader_child_entry", READER_DIR, &path);
    let pid = r.id();
    let slots = s2.readers().unwrap();
    assert!(
        slots.iter().any(|i| i.pid == pid),
        "the reader child's slot: {slots:?}"
    );
    kill(r);
    // The writer's flushes sweep dead slots; this handle may do it first.
    let _ = s2.clear_dead_readers().unwrap();
    let slots = s2.readers().unwrap();
    assert!(
        !slots.iter().any(|i| i.pid == pid),
        "the killed reader's slot is still live: {slots:?}"
    );
    // Readers go first, then the writer is killed: a new reader and a reopen read it all.
    drop(held);
    drop(s);
    drop(s2);
    let last2 = acked2.load(Ordering::SeqCst);
    kill(w2);
    let s3 = Storage::open(&path, read_only()).unwrap();
    assert!(verify(&s3.begin_read().unwrap(), "after both writers") >= last2);
    drop(s3);
    let s4 = Storage::open(&path, writer_opts()).unwrap();
    assert!(verify(&s4.begin_read().unwrap(), "reopened for writing") >= last2);
    assert!(s4.check().unwrap().is_ok());
}

#[test]
fn a_dead_readers_slot_is_cleared_and_stops_pinning_pages() {
    let _no_children = children::no_children_meanwhile();
    if std::env::var(WRITER_DIR).is_ok() || std::env::var(READER_DIR).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let opts = Options {
        flush_mode: FlushMode::Manual,
        ..writer_opts()
    };
    let s = Storage::open(&path, opts).unwrap();
    commit_round(&s, 1);
    s.flush().unwrap();
    let (r, _) = start("reader_child_entry", READER_DIR, &path);
    let pid = r.id();
    let live = s.readers().unwrap();
    assert_eq!(live.len(), 1, "{live:?}");
    assert_eq!(live[0].pid, pid);
    assert_eq!(
        s.clear_dead_readers().unwrap(),
        0,
        "a live reader is not cleared"
    );
    kill(r);
    assert!(
        s.readers().unwrap().is_empty(),
        "a killed reader is not live"
    );
    assert_eq!(s.clear_dead_readers().unwrap(), 1, "the dead reader's slot");
    assert_eq!(s.clear_dead_readers().unwrap(), 0);
}

/// Set in a database writer child's environment: the database directory it writes.
const DB_WRITER_DIR: &str = "OMNIBUS_LIVE_READERS_DB_WRITER_DIR";
/// Branches of the database model; each group commit writes the root and every branch.
const DB_BRANCHES: [&str; 3] = ["a", "b", "c"];

/// The database writer: small journal files (rotated, released and recycled often) and small,
/// frequent background flushes.
fn db_writer_opts() -> Options {
    Options {
        // Buffered storages: group parts are logical commits, the flush service applies each
        // full buffer in the background, and the reader's backups copy what is buffered.
        write_buffer_bytes: 32 << 10,
        flush_mode: FlushMode::Background,
        flush_scratch_bytes: 256 << 10,
        flush_max_age: Duration::from_millis(20),
        journal_file_size: 1 << 20,
        journal_prezero: omnibus::Prezero::Ahead(256 << 10),
        punch_holes: true,
        ..Options::default()
    }
}

/// The database writer child: each commit `t` is one group transaction over the root and
/// every branch, the model's round `t` in each; prints `T <t>` once it is acknowledged.
#[test]
fn db_writer_child_entry() {
    let Ok(dir) = std::env::var(DB_WRITER_DIR) else {
        return;
    };
    run_db_writer(&dir, db_writer_opts());
}

/// Where [`rotating_db_writer_child_entry`] writes.
const ROTATING_DB_WRITER_DIR: &str = "OMNIBUS_LIVE_READERS_ROTATING_DB_WRITER_DIR";

/// The database writer child with journal files of 64 KiB: the shared journal starts and
/// releases files (and their names in the branches' `Journals/`) many times a second.
#[test]
fn rotating_db_writer_child_entry() {
    let Ok(dir) = std::env::var(ROTATING_DB_WRITER_DIR) else {
        return;
    };
    run_db_writer(
        &dir,
        Options {
            journal_file_size: 64 << 10,
            journal_prezero: omnibus::Prezero::Ahead(8 << 10),
            ..db_writer_opts()
        },
    );
}

/// The database writer children's body: see [`db_writer_child_entry`].
fn run_db_writer(dir: &str, opts: Options) {
    let db = omnibus::Database::open(dir, opts).expect("db writer child: open");
    let branches: Vec<Storage> = DB_BRANCHES
        .iter()
        .map(|n| db.create_storage(n).expect("create a branch"))
        .collect();
    let root = db.root().clone();
    let mut t = root
        .begin_read()
        .unwrap()
        .get(b"meta")
        .unwrap()
        .map_or(0, |m| {
            std::str::from_utf8(m).unwrap().parse::<u64>().unwrap()
        });
    let mut out = std::io::stdout().lock();
    writeln!(out, "\nOPEN").unwrap();
    out.flush().unwrap();
    let all: Vec<&Storage> = std::iter::once(&root).chain(branches.iter()).collect();
    let until = Instant::now() + Duration::from_secs(120);
    while Instant::now() < until {
        t += 1;
        let mut g = db.begin_group(&all).expect("begin a group");
        for s in &all {
            for j in 0..KEYS / 4 {
                if j * BLOCKS / (KEYS / 4) == t % BLOCKS {
                    g.put(s, key(j), value(t, j)).expect("group put");
                }
            }
            g.put(s, b"meta", t.to_string().as_bytes())
                .expect("group meta");
        }
        g.commit().expect("group commit");
        writeln!(out, "T {t}").unwrap();
        out.flush().unwrap();
    }
}

/// Checks that `r` reads one whole committed state of the database model's storage; returns
/// its `t`.
fn verify_db_storage(r: &ReadTransaction, what: &str) -> u64 {
    let Some(meta) = r
        .get(b"meta")
        .unwrap_or_else(|e| panic!("{what}: meta: {e}"))
    else {
        return 0;
    };
    let t: u64 = std::str::from_utf8(meta).unwrap().parse().unwrap();
    for j in 0..KEYS / 4 {
        let b = j * BLOCKS / (KEYS / 4);
        let w = if t < b { 0 } else { t - (t - b) % BLOCKS };
        let got = r.get(key(j)).unwrap();
        if w == 0 {
            assert_eq!(got, None, "{what}: key {j} in state {t}");
        } else {
            assert_eq!(got, Some(&value(w, j)[..]), "{what}: key {j} of state {t}");
        }
    }
    t
}

/// Every storage of a read-only `db` reads the same group commit; returns it.
fn verify_db(db: &omnibus::Database, what: &str) -> u64 {
    let t = verify_db_storage(&db.root().begin_read().unwrap(), what);
    for n in DB_BRANCHES {
        let s = db
            .storage(n)
            .unwrap_or_else(|e| panic!("{what}: branch {n}: {e}"));
        let b = verify_db_storage(&s.begin_read().unwrap(), what);
        assert_eq!(
            b, t,
            "{what}: branch {n} reads group {b}, the root group {t}: half a group"
        );
    }
    t
}

#[test]
fn a_read_only_database_beside_a_live_writer_reads_whole_groups_and_backs_up() {
    let _no_children = children::no_children_meanwhile();
    if std::env::var(DB_WRITER_DIR).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let (writer, acked) = start("db_writer_child_entry", DB_WRITER_DIR, &path);
    wait_for(&acked, 0, 5);
    let mut last = 0;
    // Entries the backups' copies held buffered (the writer's storages buffer: their copies'
    // journals carry what was buffered at the copy's point).
    let mut copied_buffered = 0;
    for round in 0..30 {
        let before = acked.load(Ordering::SeqCst);
        let db = omnibus::Database::open(&path, read_only())
            .unwrap_or_else(|e| panic!("round {round}: a read-only database open: {e}"));
        assert!(db.damaged().is_empty(), "round {round}: {:?}", db.damaged());
        let t = verify_db(&db, &format!("round {round}"));
        assert!(
            t >= before,
            "round {round}: group {t}, {before} acknowledged before"
        );
        assert!(t >= last);
        last = t;
        if round % 10 == 9 {
            // A backup of the live database, taken from this process, opens whole.
            let dest = dir.path().join(format!("copy{round}"));
            db.backup(&dest).unwrap();
            drop(db);
            let copy = omnibus::Database::open(&dest, Options::default()).unwrap();
            assert_eq!(verify_db(&copy, "the backup"), t);
            for s in std::iter::once(copy.root().clone())
                .chain(DB_BRANCHES.iter().map(|n| copy.storage(n).unwrap()))
            {
                assert!(s.check().unwrap().is_ok(), "check of the backup");
                copied_buffered += s.stats().buffer_entries;
            }
        }
    }
    assert!(copied_buffered > 0, "no backup copied buffered entries");
    let last_acked = acked.load(Ordering::SeqCst);
    kill(writer);
    let db = omnibus::Database::open(&path, read_only()).unwrap();
    assert!(verify_db(&db, "after the writer was killed") >= last_acked);
}

/// A read-only database's catch-up read the journal files its open had found only under
/// another storage's name by that name for ever: once the writer released such a file, that
/// catch-up and every later one of the handle failed with the file not found.
#[test]
fn a_read_only_database_catches_up_beside_a_writer_whose_journal_files_come_and_go() {
    let _no_children = children::no_children_meanwhile();
    if std::env::var(ROTATING_DB_WRITER_DIR).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let (writer, acked) = start(
        "rotating_db_writer_child_entry",
        ROTATING_DB_WRITER_DIR,
        &path,
    );
    wait_for(&acked, 0, 5);
    let mut catch_ups = 0;
    for open in 0..20 {
        let db = omnibus::Database::open(&path, read_only())
            .unwrap_or_else(|e| panic!("open {open}: {e}"));
        let mut last = verify_db(&db, "at the open");
        for round in 0..20 {
            let before = acked.load(Ordering::SeqCst);
            db.catch_up()
                .unwrap_or_else(|e| panic!("open {open}, catch-up {round}: {e}"));
            catch_ups += 1;
            let t = verify_db(&db, &format!("open {open}, catch-up {round}"));
            assert!(
                t >= before && t >= last,
                "group {t} after {last}, {before} acknowledged"
            );
            last = t;
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    assert_eq!(catch_ups, 400);
    kill(writer);
}

#[test]
fn a_read_only_database_catches_up_to_whole_groups() {
    // Regression: `Database::catch_up` did not exist and `Storage::catch_up` was refused on a
    // database's storage: a read-only database moved on only by opening it again.
    let _no_children = children::no_children_meanwhile();
    if std::env::var(DB_WRITER_DIR).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let (writer, acked) = start("db_writer_child_entry", DB_WRITER_DIR, &path);
    wait_for(&acked, 0, 5);
    let db = omnibus::Database::open(&path, read_only()).unwrap();
    let first = verify_db(&db, "at the open");
    // A snapshot held throughout keeps reading its group.
    let held = db.root().begin_read().unwrap();
    assert!(matches!(
        db.root().catch_up(),
        Err(omnibus::Error::InvalidOptions(_))
    ));
    let mut last = first;
    for round in 0..150 {
        let before = acked.load(Ordering::SeqCst);
        let txn = db
            .catch_up()
            .unwrap_or_else(|e| panic!("round {round}: catch_up: {e}"));
        assert_eq!(txn, db.root().begin_read().unwrap().txn_id());
        let t = verify_db(&db, &format!("round {round}"));
        assert!(
            t >= before,
            "round {round}: group {t}, {before} acknowledged before the catch-up"
        );
        assert!(t >= last, "round {round}: group {t} after {last}");
        last = t;
        if round % 50 == 49 {
            assert_eq!(verify_db_storage(&held, "the held snapshot"), first);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(last > first, "the database moved on: {first} -> {last}");
    let last_acked = acked.load(Ordering::SeqCst);
    kill(writer);
    db.catch_up().unwrap();
    assert!(verify_db(&db, "after the writer was killed") >= last_acked);
}
