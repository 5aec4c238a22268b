//! `Storage::compact` on a storage of a few hundred MB with many free pages: seconds and pages
//! moved, and the time per page moved side by side for a free-space map of many small extents
//! and one of a few large ones. Keys are written in order with values of 6,000 bytes, each in a
//! one-page overflow run, so the runs lie in key order in the file; then half of them are
//! deleted: every other key (*alternate*: the free pages alternate with used ones, one extent
//! per free page) or the first half (*half*: one long free run). Both free the same pages and
//! compaction moves about as many. Compaction's time must be linear in the pages it moves: both
//! rows cost about the same per page. `OMNIBUS_BENCH_KEYS` sets the keys written (default
//! 60,000: a data file of about 500 MB); the storages live in `OMNIBUS_BENCH_DIR` (default: a
//! temporary directory).
//!
//! Run: `cargo bench --bench compact` (twice the keys: `OMNIBUS_BENCH_KEYS=120000`; the CPU time
//! per page moved must stay about the same).

use std::time::Instant;

use omnibus::{FlushMode, Options, Storage};

const VALUE: usize = 6000;

/// Writes `n` keys in order, then deletes the keys `delete` picks, flushes; returns the storage.
fn build(dir: &std::path::Path, n: u64, delete: &[u64]) -> Storage {
    let s = Storage::open(
        dir,
        Options {
            flush_mode: FlushMode::Manual,
            ..Options::default()
        },
    )
    .unwrap();
    let order: Vec<u64> = (0..n).collect();
    for chunk in order.chunks(2000) {
        let mut w = s.begin_write().unwrap();
        for &i in chunk {
            w.put(format!("key{i:010}"), vec![(i % 251) as u8; VALUE])
                .unwrap();
        }
        w.commit().unwrap();
        s.flush().unwrap();
    }
    for chunk in delete.chunks(2000) {
        let mut w = s.begin_write().unwrap();
        for &i in chunk {
            w.delete(format!("key{i:010}")).unwrap();
        }
        w.commit().unwrap();
    }
    s.flush().unwrap();
    s.flush().unwrap();
    s
}

struct Run {
    pages: u64,
    secs: f64,
    /// CPU seconds of the process (user and system, every thread) during the compaction.
    cpu: f64,
    before: u64,
    after: u64,
}

/// CPU seconds this process has used (user and system).
fn cpu_seconds() -> f64 {
    // SAFETY: `rusage` is plain old data; all zeros is a valid value.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable `rusage` for the call to fill.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0.0;
    }
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

fn compact(s: &Storage) -> Run {
    let (t, c) = (Instant::now(), cpu_seconds());
    let r = s.compact().unwrap();
    Run {
        pages: r.pages_moved,
        secs: t.elapsed().as_secs_f64(),
        cpu: cpu_seconds() - c,
        before: r.data_file_bytes_before,
        after: r.data_file_bytes_after,
    }
}

fn main() {
    let n: u64 = std::env::var("OMNIBUS_BENCH_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60_000);
    let base = match std::env::var_os("OMNIBUS_BENCH_DIR") {
        Some(d) => tempfile::tempdir_in(d).unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    let alternate: Vec<u64> = (0..n).step_by(2).collect();
    let half: Vec<u64> = (0..n / 2).collect();
    let mut rows = Vec::new();
    for (what, delete) in [("alternate", &alternate), ("half", &half)] {
        let dir = base.path().join(what);
        let t = Instant::now();
        let s = build(&dir, n, delete);
        let extents = s.stats();
        eprintln!(
            "{what}: built in {:.1} s; {} pages, {} free",
            t.elapsed().as_secs_f64(),
            extents.pages_used + extents.pages_free,
            extents.pages_free
        );
        let first = compact(&s);
        let second = compact(&s);
        rows.push((what, first, second));
    }
    println!("{n} keys of {VALUE} bytes:");
    println!(
        "| deletes | compaction | pages moved | seconds | CPU seconds | CPU µs per page moved | data file before -> after |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (what, first, second) in &rows {
        for (i, r) in [first, second].iter().enumerate() {
            println!(
                "| {what} | {} | {} | {:.2} | {:.2} | {:.1} | {:.0} MB -> {:.0} MB |",
                i + 1,
                r.pages,
                r.secs,
                r.cpu,
                r.cpu * 1e6 / r.pages.max(1) as f64,
                r.before as f64 / 1e6,
                r.after as f64 / 1e6
            );
        }
    }
    let per = |r: &Run| r.cpu / r.pages.max(1) as f64;
    println!(
        "CPU per page moved, alternate / half (first compactions): {:.2}x",
        per(&rows[0].1) / per(&rows[1].1)
    );
}
