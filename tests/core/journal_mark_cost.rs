// The cost of durable marks (docs/design.md 3.12), counted, not timed: a journal that goes idle
// after a batch writes exactly one mark (one 4 KiB write, one extra `fdatasync`) per idle period,
// however long the period; a stream of commits whose gaps stay under the idle delay writes none.
// With whole pre-zeroed files there is no background zeroing, so every `fdatasync` of the
// journal is a batch's, a new file's zeros', a start record's or a mark's.

use std::time::{Duration, Instant};

use omnibus::{Database, FlushMode, JournalMode, JournalStats, Options, Prezero, Storage};

fn opts(mark_ms: u64) -> Options {
    Options {
        flush_mode: FlushMode::Manual,
        journal_prezero: Prezero::WholeFile,
        journal_mark_ms: mark_ms,
        ..Options::default()
    }
}

fn put(s: &Storage, key: &str) {
    let mut w = s.begin_write().unwrap();
    w.put(key, [7u8; 100]).unwrap();
    w.commit().unwrap();
}

/// Waits until `stats()` shows `n` marks; panics after 20 s.
fn wait_for_marks(stats: impl Fn() -> JournalStats, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while stats().durable_marks < n {
        assert!(Instant::now() < deadline, "{:?}", stats());
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The `fdatasync`s of `b` since `a` that are neither a batch's nor a mark's.
fn other_syncs(a: &JournalStats, b: &JournalStats) -> u64 {
    (b.fdatasyncs - a.fdatasyncs) - (b.batches - a.batches) - (b.durable_marks - a.durable_marks)
}

#[test]
fn an_idle_journal_costs_one_sync_per_idle_period() {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(dir.path().join("s"), opts(10)).unwrap();
    let before = s.stats().journal;
    assert_eq!(before.durable_marks, 0, "an open marks nothing");
    for period in 1..=3u64 {
        put(&s, &format!("key{period}"));
        wait_for_marks(|| s.stats().journal, period);
        // Idle ten times the delay: still the one mark of this period.
        std::thread::sleep(Duration::from_millis(100));
        let j = s.stats().journal;
        assert_eq!(j.durable_marks, period, "{j:?}");
        assert_eq!(j.batches - before.batches, period, "{j:?}");
        assert_eq!(other_syncs(&before, &j), 0, "{j:?}");
    }
}

#[test]
fn a_busy_stream_costs_no_mark() {
    let dir = tempfile::tempdir().unwrap();
    // An idle delay far above the gap between two commits of the stream, and below a twentieth
    // of `wait_for_marks`'s limit: beside other tests' busy journals a mark waits up to ten
    // delays (with 2 s it failed when they kept the process busy for 20 s).
    let s = Storage::open(dir.path().join("s"), opts(500)).unwrap();
    let before = s.stats().journal;
    for i in 0..300 {
        put(&s, &format!("key{i:04}"));
    }
    let j = s.stats().journal;
    assert_eq!(
        (j.durable_marks, j.batches - before.batches),
        (0, 300),
        "{j:?}"
    );
    assert_eq!(
        j.fdatasyncs - before.fdatasyncs,
        300,
        "one sync per batch: {j:?}"
    );
    // Then the stream stops: one mark.
    wait_for_marks(|| s.stats().journal, 1);
    let j = s.stats().journal;
    assert_eq!(j.fdatasyncs - before.fdatasyncs, 301, "{j:?}");
}

#[test]
fn no_marks_when_the_delay_is_zero() {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(dir.path().join("s"), opts(0)).unwrap();
    put(&s, "a");
    std::thread::sleep(Duration::from_millis(150));
    let j = s.stats().journal;
    assert_eq!(j.durable_marks, 0, "{j:?}");
}

#[test]
fn a_database_marks_its_shared_journal_once_and_separate_journals_each() {
    for mode in [JournalMode::Shared, JournalMode::Separate] {
        let dir = tempfile::tempdir().unwrap();
        // Long enough that the three commits are one busy stretch.
        let o = Options {
            journal_mode: mode,
            ..opts(300)
        };
        let db = Database::open(dir.path().join("db"), o).unwrap();
        let storages = [
            db.root(),
            db.create_storage("a").unwrap(),
            db.create_storage("b").unwrap(),
        ];
        let befores: Vec<JournalStats> = storages.iter().map(|s| s.stats().journal).collect();
        for s in &storages {
            put(s, "k");
        }
        match mode {
            JournalMode::Shared => {
                // One journal: the three batches went out back to back, then one idle period.
                wait_for_marks(|| storages[0].stats().journal, befores[0].durable_marks + 1);
                std::thread::sleep(Duration::from_millis(400));
                let j = storages[0].stats().journal;
                assert_eq!(j.durable_marks - befores[0].durable_marks, 1, "{j:?}");
                assert_eq!(other_syncs(&befores[0], &j), 0, "{j:?}");
            }
            _ => {
                for (s, b) in storages.iter().zip(&befores) {
                    wait_for_marks(|| s.stats().journal, b.durable_marks + 1);
                }
                std::thread::sleep(Duration::from_millis(400));
                for (s, b) in storages.iter().zip(&befores) {
                    let j = s.stats().journal;
                    assert_eq!(j.durable_marks - b.durable_marks, 1, "{j:?}");
                    assert_eq!(other_syncs(b, &j), 0, "{j:?}");
                }
            }
        }
        drop(storages);
        db.close().unwrap();
    }
}

#[test]
fn a_journal_beside_a_busy_one_marks_after_the_stream() {
    // An idle journal wrote its mark while another journal of the process streamed commits, and
    // a hundred idle index journals beside a busy documents journal took most of a slow disk's
    // syncs with their marks.
    let dir = tempfile::tempdir().unwrap();
    let idle_ms = 300;
    let a = Storage::open(dir.path().join("a"), opts(idle_ms)).unwrap();
    let b = Storage::open(dir.path().join("b"), opts(idle_ms)).unwrap();
    let a_before = a.stats().journal.durable_marks;
    put(&a, "a");
    // `b` streams for about five idle delays (under the patience of ten).
    let start = Instant::now();
    let mut last = Instant::now();
    let mut largest_gap = Duration::ZERO;
    let mut i = 0u32;
    while start.elapsed() < Duration::from_millis(5 * idle_ms) {
        put(&b, &format!("key{i:06}"));
        largest_gap = largest_gap.max(last.elapsed());
        last = Instant::now();
        i += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    let during = a.stats().journal.durable_marks - a_before;
    if largest_gap < Duration::from_millis(idle_ms) {
        assert_eq!(during, 0, "a marked while b streamed ({i} commits)");
    }
    // Once b stops, a marks (and b too).
    wait_for_marks(|| a.stats().journal, a_before + 1);
    wait_for_marks(|| b.stats().journal, 1);
    std::thread::sleep(Duration::from_millis(2 * idle_ms));
    assert_eq!(a.stats().journal.durable_marks, a_before + 1);
}
