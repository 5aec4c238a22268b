//! Write buffers (`Options::write_buffer_bytes`) against none, side by side in one run, on the
//! same disk: two storages, one with a 64 MiB buffer and one without, given the same work in
//! alternating blocks.
//!
//! - synced batches: commits of 1,000 random 24-byte keys with 150-byte values,
//!   `Durability::Immediate`, into storages preloaded with 1,000,000 random
//!   keys (`--preload`), so that each batch lands on as many leaves as it has keys;
//! - eventual commits: one random key a commit, `Durability::Eventual`, 100,000 of them (with
//!   the flush that ends the case: it applies the buffer to as many leaves as the commits hit);
//! - sorted inserts: batches of 10,000 ascending keys;
//! - reads: random in-cache gets and full forward scans of the loaded storage, flushed (no
//!   page in its scratch table), with 200,000 more keys in its buffer (`--read-buffered`) and
//!   then with them applied and flushed: the same keys, the same tree pages read through the
//!   map, so that the ratio is the buffer's merge alone;
//! - recovery: the open of a storage whose full 64 MiB buffer is only in the journal.
//!
//! The storages flush only where a case ends (`FlushMode::Manual`), with both timed in the case
//! (the buffered storage applies its buffer there): all of a case's work is in its time. Prints keys/s (or commits/s) per case and the
//! buffered/unbuffered ratio.
//!
//! `cargo bench --bench write_buffer -- [--preload N] [--batches N] [--read-buffered N] [--dir D]`

use std::path::{Path, PathBuf};
use std::time::Instant;

use omnibus::{Durability, FlushMode, Options, Storage};

#[path = "common/mod.rs"]
mod common;

use common::{batch_key, splitmix};

struct Config {
    dir: PathBuf,
    /// Synced batches of 1,000 keys per storage.
    batches: u64,
    /// Random keys loaded into each storage first (10,000 a commit, flushed), so that the
    /// batches land in a tree of many leaves.
    preload: u64,
    /// Keys buffered for the reads with a full buffer.
    read_buffered: u64,
}

fn parse() -> Config {
    let mut cfg = Config {
        dir: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-tmp"),
        batches: 60,
        preload: 1_000_000,
        read_buffered: 200_000,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--dir" => cfg.dir = PathBuf::from(args.next().expect("--dir PATH")),
            "--preload" => {
                cfg.preload = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .expect("--preload N")
            }
            "--read-buffered" => {
                cfg.read_buffered = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .expect("--read-buffered N")
            }
            "--batches" => {
                cfg.batches = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .expect("--batches N")
            }
            _ => {}
        }
    }
    cfg
}

fn value(i: u64) -> [u8; 150] {
    let mut v = [0u8; 150];
    for (c, chunk) in v.chunks_mut(8).enumerate() {
        let w = splitmix(i ^ ((c as u64) << 56)).to_le_bytes();
        chunk.copy_from_slice(&w[..chunk.len()]);
    }
    v
}

fn open(dir: &Path, name: &str, buffer: u64) -> Storage {
    open_with(dir, name, buffer, FlushMode::Manual)
}

fn open_with(dir: &Path, name: &str, buffer: u64, flush_mode: FlushMode) -> Storage {
    Storage::open(
        dir.join(name),
        Options {
            write_buffer_bytes: buffer,
            // Manual: flushes only where a case ends (timed with it), so that no background
            // thread does either storage's work meanwhile and each case's time is all of its
            // work. Background: the default, for the case measured one storage at a time.
            flush_mode,
            ..Options::default()
        },
    )
    .expect("open")
}

/// Loads `n` random keys into `s`, 10,000 a commit, and flushes.
fn preload(s: &Storage, n: u64) {
    for c in 0..n.div_ceil(10_000) {
        let mut w = s.begin_write().expect("begin");
        for i in c * 10_000..((c + 1) * 10_000).min(n) {
            let k = 1 << 50 | i;
            w.put(batch_key(k), value(k)).expect("put");
        }
        w.commit().expect("commit");
    }
    s.flush().expect("flush");
}

/// Bytes this process sent to the disk so far: /proc/self/io `write_bytes` less
/// `cancelled_write_bytes`.
fn disk_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    let field = |name: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    field("write_bytes:").saturating_sub(field("cancelled_write_bytes:"))
}

/// Synced batches of 1,000 random keys into `s` alone, with flushes in the background, then a
/// flush: (keys/s, CPU µs per key, disk bytes per key, pages flushed per key).
fn synced_alone(s: &Storage, batches: u64) -> (f64, f64, f64, f64) {
    let (t0, c0, d0, p0) = (
        Instant::now(),
        common::cpu_now(),
        disk_bytes(),
        s.stats().pages_flushed,
    );
    for b in 0..batches {
        let mut w = s.begin_write().expect("begin");
        for i in 0..1000 {
            let n = 1 << 45 | (b * 1000 + i);
            w.put(batch_key(n), value(n)).expect("put");
        }
        w.commit().expect("commit");
    }
    s.flush().expect("flush");
    let keys = (batches * 1000) as f64;
    (
        keys / t0.elapsed().as_secs_f64(),
        (common::cpu_now() - c0).as_secs_f64() * 1e6 / keys,
        (disk_bytes() - d0) as f64 / keys,
        (s.stats().pages_flushed - p0) as f64 / keys,
    )
}

/// Runs `work(storage, block)` for `blocks` blocks, alternating the two storages; returns the
/// seconds each spent.
fn alternate(s: [&Storage; 2], blocks: u64, mut work: impl FnMut(&Storage, u64)) -> [f64; 2] {
    let mut t = [0f64; 2];
    for b in 0..blocks {
        let order = if b % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let t0 = Instant::now();
            work(s[i], b);
            t[i] += t0.elapsed().as_secs_f64();
        }
    }
    t
}

fn row(what: &str, unit: &str, n: f64, t: [f64; 2]) {
    let (off, on) = (n / t[0], n / t[1]);
    println!(
        "{what:<34} {off:>12.0} {on:>12.0} {unit:<10} {:>6.2}x",
        on / off
    );
}

fn main() {
    let cfg = parse();
    std::fs::create_dir_all(&cfg.dir).expect("bench dir");
    let tmp = tempfile::tempdir_in(&cfg.dir).expect("temp dir");
    println!(
        "write buffer bench in {} ({} random keys preloaded, {} synced batches of 1,000 keys per storage)",
        tmp.path().display(),
        cfg.preload,
        cfg.batches
    );
    println!(
        "{:<34} {:>12} {:>12} {:<10} {:>7}",
        "case", "no buffer", "64 MiB", "", "ratio"
    );
    let off = open(tmp.path(), "off", 0);
    let on = open(tmp.path(), "on", 64 << 20);
    let both = [&off, &on];

    // Each case ends with a flush of both storages, timed with it: the buffered one applies
    // its buffer there, so the work a case deferred is charged to it.
    let flushed = |s: &Storage| {
        let t0 = Instant::now();
        s.flush().expect("flush");
        t0.elapsed().as_secs_f64()
    };
    for s in both {
        preload(s, cfg.preload);
    }
    let mut t = alternate(both, cfg.batches, |s, b| {
        let mut w = s.begin_write().expect("begin");
        for i in 0..1000 {
            let n = b * 1000 + i;
            w.put(batch_key(n), value(n)).expect("put");
        }
        w.commit().expect("commit");
    });

    let f = [flushed(&off), flushed(&on)];
    println!(
        "  (the synced batches' closing flush: {:.2} s / {:.2} s, the buffered one with its apply)",
        f[0], f[1]
    );
    t[0] += f[0];
    t[1] += f[1];
    assert_eq!(on.stats().buffer_entries, 0, "flush applied the buffer");
    row(
        "synced batches of 1,000 keys",
        "keys/s",
        cfg.batches as f64 * 1000.0,
        t,
    );

    // Reads of the buffered storage: flushed, then with more keys in its buffer (a few
    // commits of 4,000 keys, under `DIRECT_OPS`, within its size and age: nothing applied, no
    // page copied), then with those
    // applied and flushed. Either way the tree's pages are read through the map.
    let extra = cfg.read_buffered;
    let mut next = 0u64;
    while next < extra {
        let mut w = on.begin_write().expect("begin");
        for _ in 0..4_000.min(extra - next) {
            let n = 1 << 44 | next;
            w.put(batch_key(n), value(n)).expect("put");
            next += 1;
        }
        w.commit().expect("commit");
    }
    let st = on.stats();
    assert_eq!(st.buffer_entries, extra, "the extra keys stay buffered");
    assert_eq!(st.scratch_bytes, 0, "no page was copied");
    // A third of the gets ask for a buffered key, the rest for keys in the tree.
    let keys: Vec<[u8; 24]> = (0..200_000u64)
        .map(|i| {
            let r = splitmix(i);
            if i % 3 == 0 && extra > 0 {
                batch_key((1 << 44) | (r % extra))
            } else {
                batch_key(r % (cfg.batches * 1000))
            }
        })
        .collect();
    let gets = |s: &Storage| {
        let r = s.begin_read().expect("read");
        let t0 = Instant::now();
        let mut found = 0usize;
        for k in &keys {
            found += r.get(k).expect("get").is_some() as usize;
        }
        assert_eq!(found, keys.len(), "every key is found");
        t0.elapsed().as_secs_f64()
    };
    let scan = |s: &Storage| {
        let r = s.begin_read().expect("read");
        let t0 = Instant::now();
        let n = r.iter().expect("iter").count();
        (t0.elapsed().as_secs_f64(), n)
    };
    let buffered = on.stats().buffer_entries;
    gets(&on);
    let full = [gets(&on), gets(&on)];
    let (scan_full, n) = scan(&on);
    on.flush().expect("flush");
    on.flush().expect("flush");
    assert_eq!(on.stats().buffer_entries, 0, "flush applied the buffer");
    assert_eq!(on.stats().scratch_bytes, 0, "flush wrote every page");
    gets(&on);
    let empty = [gets(&on), gets(&on)];
    let (scan_empty, n2) = scan(&on);
    assert_eq!(n, n2);

    let commits = 5_000u64;
    let mut t = alternate(both, 20, |s, b| {
        for i in 0..commits {
            let n = 1 << 40 | (b * commits + i);
            let mut w = s.begin_write().expect("begin");
            w.set_durability(Durability::Eventual);
            w.put(batch_key(n), value(n)).expect("put");
            w.commit().expect("commit");
        }
    });
    t[0] += flushed(&off);
    t[1] += flushed(&on);
    row(
        "eventual one-key commits",
        "txn/s",
        20.0 * commits as f64,
        t,
    );

    let mut t = alternate(both, 20, |s, b| {
        let mut w = s.begin_write().expect("begin");
        for i in 0..10_000u64 {
            let n = b * 10_000 + i;
            w.put(format!("sorted-{n:012}"), value(n)).expect("put");
        }
        w.commit().expect("commit");
    });
    t[0] += flushed(&off);
    t[1] += flushed(&on);
    row("sorted inserts (10,000 a commit)", "keys/s", 200_000.0, t);

    println!("reads of the buffered storage ({buffered} entries buffered, then applied):");
    println!(
        "{:<34} {:>12} {:>12} {:<10} {:>7}",
        "case", "empty", "full", "", "ratio"
    );
    let g = keys.len() as f64;
    let (e, f) = (g / empty[0].min(empty[1]), g / full[0].min(full[1]));
    println!(
        "{:<34} {e:>12.0} {f:>12.0} {:<10} {:>6.2}x",
        "random gets (in cache)",
        "gets/s",
        f / e
    );
    let (e, f) = (n as f64 / scan_empty, n as f64 / scan_full);
    println!(
        "{:<34} {e:>12.0} {f:>12.0} {:<10} {:>6.2}x",
        "full scan",
        "keys/s",
        f / e
    );
    off.close().expect("close");
    on.close().expect("close");

    // The synced batches again, one storage at a time with flushes in the background (the
    // default), for what a key costs in all: CPU of every thread, bytes sent to the disk, pages
    // the flushes wrote.
    let off = open_with(tmp.path(), "off-bg", 0, FlushMode::Background);
    let on = open_with(tmp.path(), "on-bg", 64 << 20, FlushMode::Background);
    preload(&off, cfg.preload);
    preload(&on, cfg.preload);
    let a = synced_alone(&off, cfg.batches);
    let b = synced_alone(&on, cfg.batches);
    println!("synced batches, one storage at a time, background flushes:");
    println!(
        "{:<34} {:>12} {:>12} {:<10} {:>7}",
        "per key", "no buffer", "64 MiB", "", "ratio"
    );
    for (what, unit, x, y) in [
        ("keys/s", "", a.0, b.0),
        ("CPU (all threads)", "µs", a.1, b.1),
        ("bytes sent to the disk", "bytes", a.2, b.2),
        ("pages flushed", "pages", a.3, b.3),
    ] {
        println!("{what:<34} {x:>12.2} {y:>12.2} {unit:<10} {:>6.2}x", y / x);
    }
    off.close().expect("close");
    on.close().expect("close");

    // Recovery with a full buffer: the buffered storage's entries are only in the journal (a
    // drop without a flush at close, as a crash leaves them); the open replays them and counts
    // them against the tree.
    let path = tmp.path().join("recovery");
    let keep = Options {
        write_buffer_bytes: 64 << 20,
        flush_on_close: false,
        ..Options::default()
    };
    let s = Storage::open(&path, keep.clone()).expect("open");
    preload(&s, cfg.preload);
    let mut b = 0u64;
    // Bounded: each batch adds about 240 KB to a 64 MiB buffer.
    while s.stats().buffer_bytes < 60 << 20 && b < 1_000 {
        let mut w = s.begin_write().expect("begin");
        for i in 0..1000 {
            let n = 1 << 46 | (b * 1000 + i);
            w.put(batch_key(n), value(n)).expect("put");
        }
        w.commit().expect("commit");
        b += 1;
    }
    let buffered = s.stats().buffer_entries;
    s.sync_journal().expect("sync");
    drop(s);
    let t0 = Instant::now();
    let s = Storage::open(&path, keep).expect("reopen");
    let open_s = t0.elapsed().as_secs_f64();
    assert_eq!(s.stats().buffer_entries, buffered, "the buffer came back");
    println!(
        "open with a full buffer: {buffered} entries ({:.1} MiB) replayed in {open_s:.2} s",
        s.stats().buffer_bytes as f64 / (1 << 20) as f64
    );
}
