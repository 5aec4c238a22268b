//! Real crashes: a child process (this test binary, re-executed to run `child_entry` only) opens
//! a storage and commits random keys in a loop, printing each key to stdout only after its
//! `commit()` returned; the background flusher runs with a small threshold, so flushes (data
//! file writes, header switches, journal deletions) are under way when the parent kills the
//! child with SIGKILL at a random moment. Rounds alternate the journal's two batch paths
//! (`OMNIBUS_JOURNAL_IO=syscalls|ring`), and the child prints the path its journal took. The
//! parent then reopens the directory: every printed
//! key must be there with its value, every key there must hold the value derived from it (no torn
//! or foreign values), and `check()` must be clean. The next round continues on the same
//! directory, so recovery runs on what earlier recoveries and crashes left.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use omnibus::{FlushMode, Options, Prezero, Storage};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::common::children;

/// Set in the child's environment: the storage directory.
const CHILD_DIR: &str = "OMNIBUS_SIGKILL_CHILD_DIR";
/// Set in the child's environment: the seed of its keys.
const CHILD_SEED: &str = "OMNIBUS_SIGKILL_CHILD_SEED";
const ROUNDS: u64 = 24;

/// Keys are 16 hex digits; the value is a function of the key (some over 2 KiB: overflow pages).
fn value_for(key: &str) -> Vec<u8> {
    let h = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    let mut rng = SmallRng::seed_from_u64(h);
    let len = if h % 8 == 0 {
        rng.random_range(2100..30_000)
    } else {
        rng.random_range(0..300)
    };
    (0..len).map(|_| rng.random()).collect()
}

fn is_key(s: &str) -> bool {
    s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The child: does nothing unless started by the parent (the variable is set).
#[test]
fn child_entry() {
    let Ok(dir) = std::env::var(CHILD_DIR) else {
        return;
    };
    let seed: u64 = std::env::var(CHILD_SEED)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let opts = Options {
        flush_mode: FlushMode::Background,
        flush_scratch_bytes: 192 << 10,
        flush_max_age: Duration::from_millis(40),
        journal_file_size: 512 << 10,
        journal_prezero: Prezero::Ahead(128 << 10),
        ..Options::default()
    };
    let s = Storage::open(&dir, opts).expect("child: open");
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut out = std::io::stdout().lock();
    // The harness may have left "test child_entry ... " without a newline.
    writeln!(out).unwrap();
    writeln!(out, "IO {}", s.journal_io().0.name()).unwrap();
    for n in 0u64.. {
        let keys: Vec<String> = (0..rng.random_range(1..6))
            .map(|_| format!("{:016x}", rng.random::<u64>()))
            .collect();
        let mut w = s.begin_write().expect("child: begin_write");
        for k in &keys {
            w.put(k, value_for(k)).expect("child: put");
        }
        w.commit().expect("child: commit");
        for k in &keys {
            writeln!(out, "ACK {k}").unwrap();
        }
        if n % 16 == 0 {
            writeln!(out, "FLUSHES {}", s.stats().flushes).unwrap();
        }
        out.flush().unwrap();
    }
}

/// What the child printed: complete lines only (SIGKILL may cut the last one).
struct Printed {
    acked: Vec<String>,
    flushes: u64,
    /// The journal's batch path (`JournalIo::name`).
    io: Option<String>,
}

fn read_child(lines: Vec<String>) -> Printed {
    let mut p = Printed {
        acked: Vec::new(),
        flushes: 0,
        io: None,
    };
    for l in &lines {
        if let Some(k) = l.strip_prefix("ACK ") {
            assert!(is_key(k), "child printed a malformed key line {l:?}");
            p.acked.push(k.to_string());
        } else if let Some(io) = l.strip_prefix("IO ") {
            p.io = Some(io.to_string());
        } else if let Some(n) = l.strip_prefix("FLUSHES ") {
            p.flushes = p.flushes.max(n.parse().unwrap_or(0));
        }
    }
    p
}

/// Reopens `path` and checks every acknowledged key, every stored key, and the structure.
fn verify(path: &Path, acked: &BTreeSet<String>, round: u64) -> usize {
    // The storage is opened here: no other test starts a child meanwhile.
    let _no_children = children::no_children_meanwhile();
    let s = Storage::open(
        path,
        Options {
            flush_mode: FlushMode::Manual,
            ..Options::default()
        },
    )
    .unwrap_or_else(|e| panic!("round {round}: reopen after SIGKILL: {e}"));
    let r = s.begin_read().unwrap();
    for k in acked {
        match r.get(k).unwrap() {
            Some(v) => assert!(
                v == &value_for(k)[..],
                "round {round}: key {k} has a wrong value"
            ),
            None => panic!("round {round}: acknowledged key {k} is missing after SIGKILL"),
        }
    }
    let mut n = 0;
    for kv in r.iter().unwrap() {
        let (k, v) = kv.unwrap_or_else(|e| panic!("round {round}: iterating: {e}"));
        let k = std::str::from_utf8(k).expect("utf-8 key");
        assert!(is_key(k), "round {round}: unexpected key {k:?}");
        assert!(
            v == &value_for(k)[..],
            "round {round}: key {k} (committed, maybe unacknowledged) has a wrong value"
        );
        n += 1;
    }
    let report = s.check().unwrap();
    assert!(
        report.is_ok(),
        "round {round}: check after SIGKILL: {:?}",
        report.problems
    );
    n
}

#[test]
fn sigkill_loses_no_acknowledged_commit() {
    if std::env::var(CHILD_DIR).is_ok() {
        return;
    }
    let start = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let exe = std::env::current_exe().unwrap();
    let child_test = crate::common::test_name(module_path!(), "child_entry");
    // Kill moments are random; the seed is printed so that a failing run can be replayed.
    let seed: u64 = std::env::var("OMNIBUS_SIGKILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random());
    println!("OMNIBUS_SIGKILL_SEED={seed}");
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut acked: BTreeSet<String> = BTreeSet::new();
    let mut flushes = 0;
    let mut rounds_with_commits = 0;
    let mut stored = 0;
    let mut paths_seen = BTreeSet::new();
    for round in 0..ROUNDS {
        let io = ["syscalls", "ring"][round as usize % 2];
        let mut child = children::spawn(
            Command::new(&exe)
                .args(["--exact", &child_test, "--nocapture", "--test-threads=1"])
                .env(CHILD_DIR, &path)
                .env("OMNIBUS_JOURNAL_IO", io)
                .env(CHILD_SEED, (seed ^ round).to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null()),
        )
        .expect("spawning the child");
        let lines = children::ChildLines::read(child.stdout.take().unwrap());
        // Two rounds in three count the delay from the child's open (it prints `IO` then), so
        // that most rounds commit whatever the machine's load; the third from the start of
        // its test, so that kills also fall in the open and its recovery.
        if round % 3 == 2 {
            lines.wait_until_running();
        } else {
            lines.wait_for("IO ");
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(20..=300)));
        // std's kill is SIGKILL on Unix.
        let exited = child.try_wait().unwrap();
        assert!(
            exited.is_none(),
            "round {round}: the child exited on its own ({exited:?}): it failed"
        );
        child.kill().unwrap();
        let status = child.wait().unwrap();
        assert!(
            !status.success(),
            "round {round}: killed child reports success"
        );
        let printed = read_child(lines.finish());
        if !printed.acked.is_empty() {
            rounds_with_commits += 1;
        }
        flushes += printed.flushes;
        if let Some(p) = printed.io {
            // The ring needs io_uring in this process; without it the journal says syscalls.
            if omnibus::env::io_backend().io_uring {
                assert_eq!(p, io, "round {round}: the child's journal path");
            }
            paths_seen.insert(p);
        }
        acked.extend(printed.acked);
        stored = verify(&path, &acked, round);
    }
    println!(
        "{ROUNDS} SIGKILLs: {} acknowledged keys (stored: {stored}), {rounds_with_commits} rounds with commits, {flushes} flushes seen, {:.1?}",
        acked.len(),
        start.elapsed()
    );
    assert!(stored >= acked.len());
    assert!(
        rounds_with_commits >= ROUNDS as usize / 2,
        "only {rounds_with_commits} rounds got to commit"
    );
    assert!(flushes > 0, "no background flush ran before a kill");
    if omnibus::env::io_backend().io_uring {
        assert_eq!(paths_seen.len(), 2, "rounds ran on {paths_seen:?}");
    }
}
