//! A small driver for profilers (`valgrind --tool=callgrind`, `perf record`, `strace -c`) of
//! the commit path: no timing, no comparison, no LMDB. The work to profile runs inside
//! `timed_loop`, so callgrind can count it alone with `--toggle-collect='*timed_loop*'`.
//!
//! ```sh
//! cargo build --release --bench cpu_profile
//! B=$(ls -t target/release/deps/cpu_profile-* | grep -v '\.d$' | head -1)
//! $B load DIR KEYS                 # a storage of KEYS keys (benches/core.rs section 6's keys), flushed
//! $B commits DIR N                 # N one-put synced commits on it (FlushMode::Manual)
//! $B load24 DIR KEYS               # a storage of KEYS random 24 B keys with 150 B values, flushed
//! $B eventual DIR N                # N one-put commits of a new random 24 B key and a 150 B
//!                                  # value with Durability::Eventual (FlushMode::Manual): the
//!                                  # committing thread's CPU, the disk out of its way
//! $B batch DIR PRELOAD BATCHES     # section 4: PRELOAD keys, then BATCHES synced batches of
//!                                  # 1,000 random 24 B keys with 150 B values (default options)
//! $B deletes DIR PRELOAD BATCHES   # PRELOAD such keys, then BATCHES synced batches of 1,000
//!                                  # deletes spread over the tree
//! OMNIBUS_IO_URING=0 valgrind --tool=callgrind --toggle-collect='*timed_loop*' $B commits DIR 600
//! $B load24 /tmp/s200k 200000      # once, natively
//! OMNIBUS_IO_URING=0 valgrind --tool=callgrind --toggle-collect='*timed_loop*' $B eventual /tmp/s200k 2000
//! ```
//!
//! `eventual` adds its keys to the storage it opens: profile a fresh copy (`cp -r`) of the
//! loaded one each time, so that counts repeat exactly.
//!
//! Under valgrind, set `OMNIBUS_IO_URING=0` (the pwritev paths): valgrind does not follow
//! io_uring, and the program waits forever at its first ring submission, using no CPU.
//!
//! `DIR` must not exist for `load` and `batch`; `commits` opens an existing storage (so a 2.5 M
//! key storage is loaded once, natively, and profiled many times).

use std::path::Path;
use std::time::Instant;

#[path = "common/mod.rs"]
mod common;
use common::{batch_key, key, value};

use omnibus::{Durability, FlushMode, Options, Storage};

const BATCH_VALUE: [u8; 150] = [0x42; 150];

fn cpu_time() -> std::time::Duration {
    // SAFETY: `ru` is a properly sized out-parameter for getrusage.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid pointer.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return std::time::Duration::ZERO;
    }
    let tv = |t: libc::timeval| std::time::Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Runs `n` units of `f`; callgrind collects only inside this function.
#[inline(never)]
fn timed_loop(n: u64, f: &mut dyn FnMut()) {
    for _ in 0..n {
        f();
    }
}

fn report(what: &str, units: u64, t: Instant, c: std::time::Duration) {
    let wall = t.elapsed().as_secs_f64();
    let cpu = (cpu_time() - c).as_secs_f64();
    println!(
        "{what}: {units} in {wall:.3} s = {:.0}/s; process CPU {:.2} µs per unit",
        units as f64 / wall,
        cpu * 1e6 / units as f64
    );
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let arg = |i: usize| -> &str { args.get(i).map(String::as_str).unwrap_or("") };
    let num = |i: usize| -> u64 { arg(i).parse().expect("a number") };
    match arg(0) {
        "load" => {
            let s = Storage::open(Path::new(arg(1)), Options::default()).expect("open");
            let n = num(2);
            let mut i = 0;
            while i < n {
                let end = (i + 100_000).min(n);
                let mut w = s.begin_write().expect("begin");
                for j in i..end {
                    w.put(key(j), value(j)).expect("put");
                }
                w.commit().expect("commit");
                i = end;
            }
            s.flush().expect("flush");
            println!("loaded {n} keys, {} pages used", s.stats().pages_used);
        }
        "commits" => {
            let opts = Options {
                flush_mode: FlushMode::Manual,
                ..Options::default()
            };
            let s = Storage::open(Path::new(arg(1)), opts).expect("open");
            let n = num(2);
            let mut next = (1u64 << 40) + s.stats().entries;
            let mut one = || {
                let mut w = s.begin_write().expect("begin");
                w.put(key(next), value(next)).expect("put");
                w.commit().expect("commit");
                next += 1;
            };
            // Warm-up (the benches' 200 untimed commits).
            for _ in 0..200 {
                one();
            }
            let before = s.stats();
            let (t, c) = (Instant::now(), cpu_time());
            timed_loop(n, &mut one);
            report("one-put commits", n, t, c);
            let after = s.stats();
            println!(
                "per commit: {:.0} journal bytes, {:.2} pages journaled ({:.2} as diffs)",
                (after.journal.bytes - before.journal.bytes) as f64 / n as f64,
                (after.pages_journaled - before.pages_journaled) as f64 / n as f64,
                (after.pages_journaled_as_diffs - before.pages_journaled_as_diffs) as f64
                    / n as f64
            );
        }
        "load24" => {
            let s = Storage::open(Path::new(arg(1)), Options::default()).expect("open");
            let n = num(2);
            let mut w = s.begin_write().expect("begin");
            for i in 0..n {
                w.put(batch_key(i), BATCH_VALUE).expect("put");
            }
            w.commit().expect("commit");
            s.flush().expect("flush");
            println!("loaded {n} keys, {} pages used", s.stats().pages_used);
        }
        "eventual" => {
            let opts = Options {
                flush_mode: FlushMode::Manual,
                ..Options::default()
            };
            let s = Storage::open(Path::new(arg(1)), opts).expect("open");
            let n = num(2);
            let mut next = (1u64 << 40) + s.stats().entries;
            let mut one = || {
                let mut w = s.begin_write().expect("begin");
                w.set_durability(Durability::Eventual);
                w.put(batch_key(next), BATCH_VALUE).expect("put");
                w.commit().expect("commit");
                next += 1;
            };
            for _ in 0..200 {
                one();
            }
            let (t, c) = (Instant::now(), cpu_time());
            timed_loop(n, &mut one);
            report("one-put eventual commits", n, t, c);
        }
        "batch" => {
            let s = Storage::open(Path::new(arg(1)), Options::default()).expect("open");
            let (preload, batches) = (num(2), num(3));
            let mut next = 0u64;
            let mut batch = |n: u64| {
                let mut w = s.begin_write().expect("begin");
                for _ in 0..n {
                    w.put(batch_key(next), BATCH_VALUE).expect("put");
                    next += 1;
                }
                w.commit().expect("commit");
            };
            for _ in 0..preload / 100_000 {
                batch(100_000);
            }
            batch(preload % 100_000);
            s.flush().expect("flush");
            for _ in 0..5 {
                batch(1_000);
            }
            let (t, c) = (Instant::now(), cpu_time());
            timed_loop(batches, &mut || batch(1_000));
            report("random batches (keys)", batches * 1_000, t, c);
            println!(
                "flushes: {}; write mode {:?}",
                s.stats().flushes,
                s.write_mode()
            );
        }
        "deletes" => {
            // As `batch`, then synced batches of 1,000 deletes of keys spread over the tree
            // (every PRELOAD/1,000th key: one per leaf or so).
            let s = Storage::open(Path::new(arg(1)), Options::default()).expect("open");
            let (preload, batches) = (num(2), num(3));
            let mut w = s.begin_write().expect("begin");
            for i in 0..preload {
                w.put(batch_key(i), BATCH_VALUE).expect("put");
            }
            w.commit().expect("commit");
            s.flush().expect("flush");
            let stride = (preload / 1_000).max(1);
            let mut round = 0u64;
            let mut batch = || {
                let mut w = s.begin_write().expect("begin");
                for j in 0..1_000u64 {
                    let i = (j * stride + round) % preload;
                    w.delete(batch_key(i)).expect("delete");
                }
                w.commit().expect("commit");
                round += 1;
            };
            for _ in 0..5 {
                batch();
            }
            let (t, c) = (Instant::now(), cpu_time());
            timed_loop(batches, &mut batch);
            report("random delete batches (keys)", batches * 1_000, t, c);
        }
        _ => eprintln!(
            "usage: cpu_profile load DIR KEYS | commits DIR N | load24 DIR KEYS | eventual DIR N | batch DIR PRELOAD BATCHES | deletes DIR PRELOAD BATCHES"
        ),
    }
}
