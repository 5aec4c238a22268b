//! `Storage::metrics` and `Database::metrics` count what was done, and the journal batches,
//! flushes, write-buffer applies and recoveries are `tracing` spans carrying their sizes and
//! durations. Counts only, never times: a duration is checked to be recorded, not how long.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use omnibus::{Database, FlushMode, Options, Prezero, Storage, PAGE_SIZE};

const N: u64 = 12;
const VALUE: usize = 100;

/// No background zeroing (so every journal `fdatasync` is a batch's), flushes on demand.
fn opts() -> Options {
    Options {
        flush_mode: FlushMode::Manual,
        journal_prezero: Prezero::Off,
        // Page commits: the counts are those of commits that copy pages.
        write_buffer_bytes: 0,
        ..Options::default()
    }
}

fn commit_one(s: &Storage, i: u64) {
    let mut w = s.begin_write().unwrap();
    w.put(format!("key{i:05}"), [b'v'; VALUE]).unwrap();
    w.commit().unwrap();
}

#[test]
fn synced_commits_and_a_flush_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(dir.path().join("s"), opts()).unwrap();
    let before = s.metrics();
    assert_eq!(before.commits, 0);
    assert_eq!(before.commit_us.count, 0);
    for i in 0..N {
        commit_one(&s, i);
    }
    let m = s.metrics();
    assert_eq!(m.commits, N);
    let syncs = m.journal_fdatasyncs - before.journal_fdatasyncs;
    assert!(
        (1..=N).contains(&syncs),
        "{syncs} fdatasyncs for {N} commits"
    );
    assert!((1..=N).contains(&m.journal_batches), "{m:?}");
    // Each record holds its key and value; each batch is padded to 4 KiB.
    assert!(m.journal_bytes >= N * (VALUE as u64 + 8), "{m:?}");
    assert_eq!(m.journal_bytes % 4096, 0, "{m:?}");
    assert_eq!(m.commit_us.count, N, "one latency per commit");
    assert!(m.commit_us.p50 <= m.commit_us.p90 && m.commit_us.p99 <= m.commit_us.max);
    assert_eq!(m.journal_batch_us.count, m.journal_batches);
    assert_eq!(m.journal_batch_records.count, m.journal_batches);
    assert!(m.journal_batch_records.max >= 1 && m.journal_batch_records.max <= N);
    assert_eq!(m.journal_queue_depth, 0, "nothing in flight");
    // The snapshot agrees with the journal's counters.
    let st = s.stats();
    assert_eq!(
        (m.commits, m.journal_batches, m.journal_bytes),
        (st.journal.commits, st.journal.batches, st.journal.bytes)
    );

    let flushes_before = m.flushes;
    let report = s.flush().unwrap();
    assert!(report.pages_written > 0);
    let m = s.metrics();
    assert_eq!(m.flushes, flushes_before + 1);
    assert!(m.flushed_bytes > 0);
    assert_eq!(
        m.flushed_bytes,
        s.stats().pages_flushed * PAGE_SIZE as u64,
        "flushed bytes are the pages flushed"
    );
    assert!(m.flush_us.count >= 1, "{m:?}");
    assert_eq!(m.flush_pages.count, m.flush_us.count);
    assert!(m.flush_pages.max >= report.pages_written, "{m:?}");
    assert_eq!(m.commits, N, "a flush commits nothing");
}

#[test]
fn database_metrics_cover_the_shared_journal_and_every_storage() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::open(dir.path().join("db"), opts()).unwrap();
    let branch = db.create_storage("b").unwrap();
    let before = db.metrics();
    for i in 0..N {
        commit_one(&db.root(), i);
        commit_one(&branch, i);
    }
    let m = db.metrics();
    assert_eq!(m.commits - before.commits, 2 * N);
    assert_eq!(m.commit_us.count - before.commit_us.count, 2 * N);
    // A branch's storage reports the shared journal too.
    assert_eq!(branch.metrics().commits, m.commits);
    db.flush().unwrap();
    let m = db.metrics();
    let pages: u64 = [db.root(), branch.clone()]
        .iter()
        .map(|s| s.stats().pages_flushed)
        .sum();
    assert!(pages > 0);
    assert_eq!(m.flushed_bytes, pages * PAGE_SIZE as u64);
    let flushes: u64 = [db.root(), branch.clone()]
        .iter()
        .map(|s| s.stats().flushes)
        .sum();
    assert_eq!(m.flushes, flushes);
    assert!(
        m.flush_us.count >= 2,
        "both storages flushed once at least: {m:?}"
    );
    assert!(
        branch.metrics().flush_us.count < m.flush_us.count,
        "a storage reports its own flushes only"
    );
}

// ---- spans ------------------------------------------------------------------------------------

/// A span seen: its name and its fields (as recorded, last value wins; numbers as numbers).
#[derive(Debug, Clone)]
struct Seen {
    name: &'static str,
    fields: HashMap<&'static str, Value>,
}

#[derive(Debug, Clone, PartialEq)]
enum Value {
    U64(u64),
    Other(String),
}

impl Value {
    fn u64(&self) -> Option<u64> {
        match self {
            Value::U64(v) => Some(*v),
            Value::Other(_) => None,
        }
    }
}

struct Fields<'a>(&'a mut HashMap<&'static str, Value>);

impl tracing::field::Visit for Fields<'_> {
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.0.insert(field.name(), Value::U64(value));
    }
    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        match u64::try_from(value) {
            Ok(v) => self.0.insert(field.name(), Value::U64(v)),
            Err(_) => self.0.insert(field.name(), Value::Other(value.to_string())),
        };
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name(), Value::Other(format!("{value:?}")));
    }
}

/// Records every span and what is recorded on it; events are ignored.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<Seen>>>);

impl Spans {
    fn named(&self, name: &str) -> Vec<Seen> {
        let g = self.0.lock().unwrap();
        g.iter().filter(|s| s.name == name).cloned().collect()
    }
}

impl tracing::Subscriber for Spans {
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
        Some(tracing::level_filters::LevelFilter::TRACE)
    }
    fn new_span(&self, attrs: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let mut fields = HashMap::new();
        attrs.record(&mut Fields(&mut fields));
        let mut g = self.0.lock().unwrap();
        g.push(Seen {
            name: attrs.metadata().name(),
            fields,
        });
        tracing::span::Id::from_u64(g.len() as u64)
    }
    fn record(&self, span: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        let mut g = self.0.lock().unwrap();
        let i = span.into_u64() as usize - 1;
        values.record(&mut Fields(&mut g[i].fields));
    }
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, _: &tracing::Event<'_>) {}
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn batches_flushes_applies_and_recoveries_are_spans_with_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    // Three commits left in the journal for the next open to replay.
    {
        let s = Storage::open(
            &path,
            Options {
                flush_on_close: false,
                ..opts()
            },
        )
        .unwrap();
        for i in 0..3 {
            commit_one(&s, i);
        }
    }
    let spans = Spans::default();
    // With exactly one dispatcher registered in the process, tracing-core computes a new
    // callsite's interest from the registering thread's default: a callsite first reached by a
    // test running beside this one (no subscriber) would be cached as never, and this
    // subscriber would miss its spans. A second registered dispatcher, kept alive through the
    // test, makes every registration consult all of them.
    let _second = tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default());
    tracing::subscriber::with_default(spans.clone(), || {
        // Callsites registered before this subscriber: their interest again, with it.
        tracing::callsite::rebuild_interest_cache();
        let s = Storage::open(
            &path,
            Options {
                write_buffer_bytes: 1 << 20,
                ..opts()
            },
        )
        .unwrap();
        // Buffered (logical) commits, applied in the background as the flush service does
        // beside commits; then more, applied by the flush.
        for i in 10..10 + N {
            commit_one(&s, i);
        }
        assert!(omnibus::testing::apply_in_background(&s, &mut || {}).unwrap());
        for i in 10 + N..10 + 2 * N {
            commit_one(&s, i);
        }
        s.flush().unwrap();
        s.close().unwrap();
    });

    let recover = spans.named("recover");
    assert_eq!(recover.len(), 1, "{recover:?}");
    let r = &recover[0].fields;
    assert_eq!(r.get("records").and_then(Value::u64), Some(3), "{r:?}");
    assert!(r.get("bytes").and_then(Value::u64).unwrap_or(0) >= 3 * VALUE as u64);
    assert!(r.get("us").and_then(Value::u64).is_some(), "{r:?}");

    let batches = spans.named("journal batch");
    assert!(
        batches.len() as u64 >= N,
        "one batch per commit: {batches:?}"
    );
    // One record per batch, but for the background apply's eventual record, which may ride
    // the next commit's batch.
    let mut shared = 0;
    for b in &batches {
        let f = &b.fields;
        match f.get("records").and_then(Value::u64) {
            Some(1) => {}
            Some(2) => shared += 1,
            _ => panic!("{f:?}"),
        }
        assert_eq!(f.get("syncs").and_then(Value::u64), Some(1), "{f:?}");
        assert!(f.get("bytes").and_then(Value::u64).unwrap_or(0) >= 4096);
        assert_eq!(f.get("storages").and_then(Value::u64), Some(1), "{f:?}");
        assert!(f.get("sync_us").and_then(Value::u64).is_some(), "{f:?}");
    }
    assert!(shared <= 1, "{batches:?}");

    let applies = spans.named("apply write buffer");
    let applied: u64 = applies
        .iter()
        .filter_map(|a| a.fields.get("entries").and_then(Value::u64))
        .sum();
    assert_eq!(
        applied,
        2 * N,
        "every buffered entry applied once: {applies:?}"
    );
    assert!(applies
        .iter()
        .all(|a| a.fields.get("pages").and_then(Value::u64).is_some()
            && a.fields.get("us").and_then(Value::u64).is_some()));
    let background: Vec<&Seen> = applies
        .iter()
        .filter(|a| a.fields.get("background") == Some(&Value::Other("true".into())))
        .collect();
    assert_eq!(background.len(), 1, "{applies:?}");
    let b = &background[0].fields;
    assert_eq!(b.get("entries").and_then(Value::u64), Some(N), "{b:?}");
    assert!(
        b.get("pages").and_then(Value::u64).unwrap_or(0) > 0,
        "{b:?}"
    );

    let flushes: Vec<Seen> = spans
        .named("flush")
        .into_iter()
        .filter(|f| f.fields.contains_key("us"))
        .collect();
    assert!(!flushes.is_empty(), "a flush span with its duration");
    let pages: u64 = flushes
        .iter()
        .filter_map(|f| f.fields.get("pages").and_then(Value::u64))
        .sum();
    assert!(pages > 0, "{flushes:?}");
    for f in &flushes {
        let p = f.fields.get("pages").and_then(Value::u64).unwrap_or(0);
        assert_eq!(
            f.fields.get("bytes").and_then(Value::u64),
            Some(p * PAGE_SIZE as u64)
        );
    }
}
