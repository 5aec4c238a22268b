//! Durable marks (docs/design.md 3.12): once a journal is idle after a batch, a 4 KiB mark after
//! it states that every batch before it was synced. Damage to a batch a mark covers is
//! `Error::Corruption` at its offset; a last batch with no mark (the crash came before the
//! journal went idle) still reads as a torn tail; and the mark's own write, torn anywhere or
//! lost, loses and rejects nothing.
//!
//! Regression: a damaged record in the journal's last batch was dropped without an error and
//! `check` passed, even when the journal had been idle (and the batch long synced) before it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use omnibus::env::testing::PowerLossEnv;
use omnibus::env::{default_env, StorageEnv};
use omnibus::{Error, FlushMode, Options, Prezero, Storage};

use crate::common::damage::{expect_corruption, journals, put};
use crate::common::model::{content, diff, Model};
use crate::common::points::{scratch_base, verify_snaps, Snap};

const COMMITS: usize = 10;

fn opts(mark_ms: u64) -> Options {
    Options {
        flush_mode: FlushMode::Manual,
        flush_on_close: false,
        journal_mark_ms: mark_ms,
        // Page commits: the damage lands where a page record's bytes are.
        write_buffer_bytes: 0,
        ..Options::default()
    }
}

/// Waits until the journal of `s` wrote a mark after position `end` (its `bytes` counter moved
/// one 4 KiB mark past it); panics after 20 s.
fn wait_for_mark_after(s: &Storage, end: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.stats().journal.bytes < end + 4096 {
        assert!(
            Instant::now() < deadline,
            "no mark: {:?}",
            s.stats().journal
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(s.stats().journal.bytes, end + 4096, "one mark, no batch");
}

/// A storage at `dir/s` with `COMMITS` one-put commits (one batch each), then, with `mark`, a
/// durable mark after the last; closed without a flush. Returns its path, its journal file and
/// where each batch starts (the open writes nothing before the first), then where the last
/// batch ends.
fn journaled(dir: &Path, mark: bool) -> (PathBuf, PathBuf, Vec<u64>) {
    let path = dir.join("s");
    // Without `mark`: a delay far past the test, so no mark can come.
    let s = Storage::open(&path, opts(if mark { 5 } else { 60_000 })).unwrap();
    let mut starts = Vec::new();
    for i in 0..COMMITS {
        // Marks written between commits (a slow machine) are counted in `bytes` too.
        starts.push(s.stats().journal.bytes);
        put(&s, &format!("key{i:03}"), format!("value {i}").as_bytes());
    }
    let end = s.stats().journal.bytes;
    starts.push(end);
    if mark {
        wait_for_mark_after(&s, end);
    } else {
        assert_eq!(s.stats().journal.durable_marks, 0);
    }
    drop(s);
    let journal = journals(&path.join("Journals")).pop().unwrap();
    (path, journal, starts)
}

fn flip(file: &Path, at: u64, len: usize) {
    let mut bytes = std::fs::read(file).unwrap();
    for b in &mut bytes[at as usize..at as usize + len] {
        *b ^= 0x3c;
    }
    std::fs::write(file, &bytes).unwrap();
}

/// Opens `path` and checks it holds exactly the first `n` keys and that `check` is clean.
fn expect_keys(path: &Path, n: usize) {
    let s = Storage::open(path, opts(0)).unwrap();
    let r = s.begin_read().unwrap();
    assert_eq!(r.len(), n as u64);
    for i in 0..n {
        assert!(r.get(format!("key{i:03}")).unwrap().is_some(), "key {i}");
    }
    assert!(s.check().unwrap().is_ok());
}

#[test]
fn damage_to_a_marked_last_batch_is_corruption_at_its_offset() {
    let dir = tempfile::tempdir().unwrap();
    let (path, journal, starts) = journaled(dir.path(), true);
    let last = starts[COMMITS - 1];
    flip(&journal, last + 100, 64);
    expect_corruption(&path, &opts(0), "known durable", "marked last batch");
    match Storage::open(&path, opts(0)) {
        Err(Error::Corruption(c)) => {
            assert_eq!(c.file, journal);
            assert_eq!(c.offset, Some(last), "{c}");
        }
        other => panic!("expected Corruption, got {other:?}"),
    }
}

#[test]
fn a_zeroed_header_in_a_marked_last_batch_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let (path, journal, starts) = journaled(dir.path(), true);
    let mut bytes = std::fs::read(&journal).unwrap();
    let at = starts[COMMITS - 1] as usize;
    bytes[at..at + 64].fill(0);
    std::fs::write(&journal, &bytes).unwrap();
    expect_corruption(&path, &opts(0), "known durable", "zeroed header");
}

#[test]
fn a_damaged_last_batch_without_a_mark_reads_as_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let (path, journal, starts) = journaled(dir.path(), false);
    flip(&journal, starts[COMMITS - 1] + 100, 64);
    expect_keys(&path, COMMITS - 1);
}

#[test]
fn a_batch_after_the_last_mark_still_reads_as_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    // Long enough that no mark follows the last commit before the drop.
    let s = Storage::open(&path, opts(1_000)).unwrap();
    put(&s, "key000", b"value 0");
    wait_for_mark_after(&s, s.stats().journal.bytes);
    let last = s.stats().journal.bytes;
    put(&s, "key001", b"value 1");
    assert_eq!(s.stats().journal.durable_marks, 1);
    drop(s);
    let journal = journals(&path.join("Journals")).pop().unwrap();
    flip(&journal, last + 100, 64);
    expect_keys(&path, 1);
}

#[test]
fn a_damaged_or_torn_mark_alone_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (path, journal, starts) = journaled(dir.path(), true);
    let orig = std::fs::read(&journal).unwrap();
    // The mark is the 4 KiB after the last batch: a padding record (kind 2).
    let mark = *starts.last().unwrap() as usize;
    assert_eq!(&orig[mark..mark + 6], b"OMJR\x02\x01");
    let mut cases: Vec<(String, Vec<u8>)> = Vec::new();
    // Torn: only a prefix of the mark written (the rest still the zeros before it), or only a
    // suffix (its header lost), at every 8 bytes of its header and then every 512 bytes.
    let cuts = (0..=64).step_by(8).chain((512..4096).step_by(512));
    for cut in cuts {
        let mut b = orig.clone();
        b[mark + cut..mark + 4096].fill(0);
        cases.push((format!("prefix of {cut} bytes"), b));
        let mut b = orig.clone();
        b[mark..mark + cut].fill(0);
        cases.push((format!("suffix from byte {cut}"), b));
    }
    // Damaged: flipped bytes in its header, in its stated end, in its zeros.
    for at in [4usize, 50, 60, 2000] {
        let mut b = orig.clone();
        for x in &mut b[mark + at..mark + at + 4] {
            *x ^= 0x5a;
        }
        cases.push((format!("flipped at byte {at}"), b));
    }
    for (what, bytes) in cases {
        std::fs::write(&journal, &bytes).unwrap();
        let s = Storage::open(
            &path,
            Options {
                read_only: true,
                ..opts(0)
            },
        )
        .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(s.begin_read().unwrap().len(), COMMITS as u64, "{what}");
    }
    std::fs::write(&journal, &orig).unwrap();
    expect_keys(&path, COMMITS);
}

#[test]
fn a_damaged_mark_before_a_later_batch_is_corruption() {
    // The mark's header is intact and its body damaged: the scan stops there, and the later
    // batch (issued after the mark was synced) proves the stop is damage, not a torn tail.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let s = Storage::open(&path, opts(1_000)).unwrap();
    put(&s, "key000", b"value 0");
    let mark = s.stats().journal.bytes;
    wait_for_mark_after(&s, mark);
    put(&s, "key001", b"value 1");
    drop(s);
    let journal = journals(&path.join("Journals")).pop().unwrap();
    flip(&journal, mark + 60, 4);
    expect_corruption(&path, &opts(0), "later batch", "damaged mark");
}

/// What a crash at one moment must recover to.
#[derive(Clone)]
struct Expect {
    acked: Arc<Model>,
    inflight: Option<Arc<Model>>,
}

/// Power loss at every durable operation of a workload whose journal goes idle (and writes a
/// mark) after most batches, in every crash mode, with and without losing unsynced directory
/// entries: every state recovers the last acknowledged commit (or the one in flight), with no
/// `Corruption`, and `check` is clean. A mark is one 4 KiB sector, so the modes keep all of it
/// or none; the byte-granular tears are `a_damaged_or_torn_mark_alone_loses_nothing`'s.
#[test]
fn power_loss_at_every_durable_operation_around_marks() {
    let base = scratch_base("omnibus-marks-");
    let dir = tempfile::tempdir_in(base.path()).unwrap();
    let pl = PowerLossEnv::new(default_env(), dir.path());
    let expect = Arc::new(Mutex::new(Expect {
        acked: Arc::new(Model::new()),
        inflight: None,
    }));
    let snaps: Arc<Mutex<Vec<Snap<Expect>>>> = Arc::default();
    {
        let (expect, snaps) = (expect.clone(), snaps.clone());
        pl.set_durable_observer(Some(Arc::new(move |e| {
            let x = expect.lock().unwrap().clone();
            let what = if e.dir {
                "directory sync"
            } else if e.path.extension().is_some_and(|x| x == "journal") {
                "journal write and sync"
            } else {
                "data file sync"
            };
            snaps.lock().unwrap().push(Snap {
                snap: e.snapshot(),
                what,
                step: e.step,
                n: e.n,
                expect: x,
            });
        })));
    }
    let env: Arc<dyn StorageEnv> = Arc::new(pl.clone());
    let path = dir.path().join("s");
    let o = Options {
        env,
        // Small files and windows: rotations, start records and zeros ahead meet the marks.
        journal_file_size: 64 << 10,
        journal_prezero: Prezero::Ahead(16 << 10),
        ..opts(1)
    };
    let s = Storage::open(&path, o).unwrap();
    let mut model = Model::new();
    let mut n = 0u32;
    for round in 0..16u32 {
        for _ in 0..1 + round % 3 {
            let mut next = model.clone();
            let (k, v) = (
                format!("key{n:04}"),
                vec![n as u8; 1 + (n as usize * 397) % 5000],
            );
            next.insert(k.clone().into_bytes(), v.clone());
            expect.lock().unwrap().inflight = Some(Arc::new(next.clone()));
            put(&s, &k, &v);
            model = next;
            *expect.lock().unwrap() = Expect {
                acked: Arc::new(model.clone()),
                inflight: None,
            };
            n += 1;
        }
        // Idle: a mark follows (none when the batch left no room for it in its file).
        let (marks, deadline) = (
            s.stats().journal.durable_marks,
            Instant::now() + Duration::from_millis(500),
        );
        while s.stats().journal.durable_marks == marks && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        if round % 5 == 4 {
            s.flush().unwrap();
        }
    }
    let marks = s.stats().journal.durable_marks;
    drop(s);
    pl.set_durable_observer(None);
    assert!(marks >= 8, "only {marks} marks: the workload tests little");
    let snaps = std::mem::take(&mut *snaps.lock().unwrap());
    let tally = verify_snaps(base.path(), 0x3A4C, &snaps, 1, |dir, expects, _| {
        let s = Storage::open(dir.join("s"), opts(0))
            .map_err(|e| format!("reopen after the crash failed: {e}"))?;
        let got = content(&s)?;
        let mut inflight = false;
        for x in expects {
            if got == *x.acked {
                continue;
            }
            match &x.inflight {
                Some(m) if got == **m => inflight = true,
                _ => return Err(format!("recovered: {}", diff(&x.acked, &got))),
            }
        }
        let report = s.check().map_err(|e| e.to_string())?;
        if !report.is_ok() {
            return Err(format!("check() after recovery: {:?}", report.problems));
        }
        Ok(inflight)
    });
    assert!(
        tally.failures.is_empty(),
        "{} of {} states failed:\n{}",
        tally.failures.len(),
        tally.states,
        tally.failures.join("\n")
    );
    assert!(tally.states > 100, "{tally:?}");
}
