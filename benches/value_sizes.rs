//! Data file size and throughput by value size: omnibus against LMDB (heed) and redb, the same
//! values written the same way.
//!
//! For each value size (1, 2, 3, 4, 6, 8 and 12 KiB) about `OMNIBUS_VALUE_BYTES` bytes of
//! values (default 64 MiB) under random 24-byte keys are written in write transactions of
//! `BATCH` puts, once in random key order and once in key order (sequential), into a fresh
//! store of each engine with its default durability (every commit synced), which is then
//! closed cleanly. Measured: the data file's bytes on disk after the close (`st_blocks * 512`:
//! omnibus `data.pages`, LMDB `data.mdb`, redb its one file; omnibus's journal is empty after
//! a clean close), for omnibus also its pages in use then (`check`'s count; the rest of its
//! file is pages the load's copy-on-write freed, reusable only once a flush made the freeing
//! durable, where LMDB and redb reuse them at once), bytes per value, and the ratios to the raw
//! bytes (keys + values) and to the other engines; the write time (first put to the end of the
//! close) and the time to read every value back in random order after a reopen (page cache
//! warm), as ratios omnibus / other (above 1: omnibus faster). Then, for omnibus alone, the
//! write amplification of single puts: journal bytes per commit of one put each, and the data
//! file's bytes per value after the close.
//!
//! Run: `cargo bench --bench value_sizes` (`OMNIBUS_VALUE_BYTES=100000000` for 100 MB a size,
//! `OMNIBUS_VALUE_SIZES=4096,6144` for some sizes only).

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use omnibus::{Options, Storage};

/// Puts per write transaction.
const BATCH: usize = 256;
const KEY_LEN: usize = 24;
/// Commits of the write-amplification phase (one put each).
const ONE_PUT_COMMITS: usize = 2_000;
const TABLE: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("values");

/// A small deterministic generator (xorshift-multiply), so every engine gets the same bytes.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(n);
        v
    }
}

/// One engine's result for one size and order.
struct Run {
    bytes: u64,
    /// omnibus only: the bytes of the pages in use (reachable) after the close, from `check`.
    live: u64,
    write: Duration,
    read: Duration,
}

fn disk_bytes(p: &Path) -> u64 {
    std::fs::metadata(p).map_or(0, |m| m.blocks() * 512)
}

fn omnibus_run(dir: &Path, pairs: &[(Vec<u8>, Vec<u8>)], reads: &[usize]) -> Run {
    let path = dir.join("omnibus");
    let t = Instant::now();
    let s = Storage::open(&path, Options::default()).expect("open");
    for chunk in pairs.chunks(BATCH) {
        let mut w = s.begin_write().expect("begin");
        for (k, v) in chunk {
            w.put(k, v).expect("put");
        }
        w.commit().expect("commit");
    }
    s.close().expect("close");
    let write = t.elapsed();
    let bytes = disk_bytes(&path.join("data.pages"));
    let s = Storage::open(&path, Options::default()).expect("reopen");
    let live = s.check().expect("check").pages_in_use * 8192;
    let t = Instant::now();
    let r = s.begin_read().expect("read");
    let mut total = 0usize;
    for &i in reads {
        total += r.get(&pairs[i].0).expect("get").expect("present").len();
    }
    let read = t.elapsed();
    assert_eq!(total, pairs.iter().map(|p| p.1.len()).sum::<usize>());
    Run {
        bytes,
        live,
        write,
        read,
    }
}

fn lmdb_run(dir: &Path, pairs: &[(Vec<u8>, Vec<u8>)], reads: &[usize]) -> Run {
    type Bytes = heed::types::Bytes;
    let path = dir.join("lmdb");
    std::fs::create_dir_all(&path).expect("mkdir");
    let open = || {
        // SAFETY: the directory is private to this process; nothing else maps it.
        unsafe { heed::EnvOpenOptions::new().map_size(16 << 30).open(&path) }.expect("lmdb open")
    };
    let t = Instant::now();
    let env = open();
    let mut w = env.write_txn().expect("txn");
    let db: heed::Database<Bytes, Bytes> = env.create_database(&mut w, None).expect("db");
    w.commit().expect("commit");
    for chunk in pairs.chunks(BATCH) {
        let mut w = env.write_txn().expect("txn");
        for (k, v) in chunk {
            db.put(&mut w, k, v).expect("put");
        }
        w.commit().expect("commit");
    }
    env.force_sync().expect("sync");
    drop(env);
    let write = t.elapsed();
    let bytes = disk_bytes(&path.join("data.mdb"));
    let env = open();
    let t = Instant::now();
    let r = env.read_txn().expect("txn");
    let db: heed::Database<Bytes, Bytes> = env.open_database(&r, None).expect("db").expect("db");
    let mut total = 0usize;
    for &i in reads {
        total += db
            .get(&r, &pairs[i].0)
            .expect("get")
            .expect("present")
            .len();
    }
    let read = t.elapsed();
    assert_eq!(total, pairs.iter().map(|p| p.1.len()).sum::<usize>());
    Run {
        bytes,
        live: 0,
        write,
        read,
    }
}

fn redb_run(dir: &Path, pairs: &[(Vec<u8>, Vec<u8>)], reads: &[usize]) -> Run {
    let path = dir.join("redb");
    let t = Instant::now();
    let db = redb::Database::create(&path).expect("redb create");
    for chunk in pairs.chunks(BATCH) {
        let w = db.begin_write().expect("txn");
        {
            let mut table = w.open_table(TABLE).expect("table");
            for (k, v) in chunk {
                table.insert(k.as_slice(), v.as_slice()).expect("insert");
            }
        }
        w.commit().expect("commit");
    }
    drop(db);
    let write = t.elapsed();
    let bytes = disk_bytes(&path);
    let db = redb::Database::create(&path).expect("redb reopen");
    let t = Instant::now();
    let r = db.begin_read().expect("txn");
    let table = r.open_table(TABLE).expect("table");
    let mut total = 0usize;
    for &i in reads {
        total += table
            .get(pairs[i].0.as_slice())
            .expect("get")
            .expect("present")
            .value()
            .len();
    }
    let read = t.elapsed();
    assert_eq!(total, pairs.iter().map(|p| p.1.len()).sum::<usize>());
    Run {
        bytes,
        live: 0,
        write,
        read,
    }
}

/// Write amplification of single puts: `n` puts of `size` bytes under random keys, one a
/// commit, into a fresh omnibus storage; returns the journal bytes per commit and the data
/// file's bytes on disk per value after a clean close.
fn omnibus_one_put_commits(dir: &Path, size: usize, n: usize, g: &mut Gen) -> (u64, u64) {
    let path = dir.join("omnibus-one-put");
    let s = Storage::open(&path, Options::default()).expect("open");
    for _ in 0..n {
        let (k, v) = (g.bytes(KEY_LEN), g.bytes(size));
        let mut w = s.begin_write().expect("begin");
        w.put(&k, &v).expect("put");
        w.commit().expect("commit");
    }
    let journal = s.stats().journal.bytes;
    s.close().expect("close");
    let bytes = disk_bytes(&path.join("data.pages"));
    (journal / n as u64, bytes / n as u64)
}

fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name)
        .ok()?
        .trim()
        .replace('_', "")
        .parse()
        .ok()
}

fn main() {
    // `cargo bench` passes `--bench`; nothing to parse.
    let budget = env_usize("OMNIBUS_VALUE_BYTES").unwrap_or(64 << 20);
    let sizes: Vec<usize> = match std::env::var("OMNIBUS_VALUE_SIZES") {
        Ok(s) => s.split(',').filter_map(|x| x.trim().parse().ok()).collect(),
        Err(_) => [1, 2, 3, 4, 6, 8, 12].iter().map(|k| k * 1024).collect(),
    };
    println!(
        "value_sizes: {} MiB of values a size, random 24-byte keys, {BATCH} puts a transaction, default durability",
        budget >> 20
    );
    println!(
        "{:>6} {:>5} {:>7} | {:>9} {:>9} {:>9} {:>9} | {:>7} {:>7} {:>7} | {:>6} {:>6} {:>6} | {:>6} {:>6} | {:>6} {:>6}",
        "value", "order", "values", "omnibus", "o live", "lmdb", "redb", "B/val", "B/val", "B/val", "o/raw", "o/lmdb", "o/redb",
        "w o/l", "w o/r", "r o/l", "r o/r"
    );
    println!(
        "{:>6} {:>5} {:>7} | {:>9} {:>9} {:>9} {:>9} | {:>7} {:>7} {:>7} | {:>6} {:>6} {:>6} | {:>6} {:>6} | {:>6} {:>6}",
        "", "", "", "MiB", "MiB", "MiB", "MiB", "omnibus", "lmdb", "redb", "bytes", "bytes", "bytes", "write", "write", "read", "read"
    );
    let mut one_put = Vec::new();
    for &size in &sizes {
        let n = (budget / size).max(BATCH);
        let mut g = Gen(0x5eed ^ size as u64);
        let mut pairs: Vec<(Vec<u8>, Vec<u8>)> =
            (0..n).map(|_| (g.bytes(KEY_LEN), g.bytes(size))).collect();
        let raw: u64 = pairs.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum();
        // A random permutation for the reads.
        let mut reads: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            reads.swap(i, (g.next() % (i as u64 + 1)) as usize);
        }
        {
            let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
            let (j, d) = omnibus_one_put_commits(dir.path(), size, ONE_PUT_COMMITS, &mut g);
            one_put.push((size, j, d));
        }
        for order in ["random", "seq"] {
            if order == "seq" {
                pairs.sort();
            }
            let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
            let o = omnibus_run(dir.path(), &pairs, &reads);
            let l = lmdb_run(dir.path(), &pairs, &reads);
            let r = redb_run(dir.path(), &pairs, &reads);
            let mib = |b: u64| b as f64 / (1 << 20) as f64;
            let per = |b: u64| b / n as u64;
            let ratio = |a: u64, b: u64| a as f64 / b as f64;
            // Throughput ratio: omnibus's rate over the other's (the other's time over omnibus's).
            let speed = |o: Duration, x: Duration| x.as_secs_f64() / o.as_secs_f64();
            println!(
                "{:>6} {:>5} {:>7} | {:>9.1} {:>9.1} {:>9.1} {:>9.1} | {:>7} {:>7} {:>7} | {:>6.2} {:>6.2} {:>6.2} | {:>6.2} {:>6.2} | {:>6.2} {:>6.2}",
                size,
                order,
                n,
                mib(o.bytes),
                mib(o.live),
                mib(l.bytes),
                mib(r.bytes),
                per(o.bytes),
                per(l.bytes),
                per(r.bytes),
                ratio(o.bytes, raw),
                ratio(o.bytes, l.bytes),
                ratio(o.bytes, r.bytes),
                speed(o.write, l.write),
                speed(o.write, r.write),
                speed(o.read, l.read),
                speed(o.read, r.read),
            );
            eprintln!(
                "  {size} {order}: write s omnibus {:.2} lmdb {:.2} redb {:.2}; read s omnibus {:.3} lmdb {:.3} redb {:.3}",
                o.write.as_secs_f64(),
                l.write.as_secs_f64(),
                r.write.as_secs_f64(),
                o.read.as_secs_f64(),
                l.read.as_secs_f64(),
                r.read.as_secs_f64()
            );
        }
    }
    println!(
        "omnibus, {ONE_PUT_COMMITS} commits of one put each (random keys): journal bytes per commit, data file bytes per value"
    );
    for (size, j, d) in one_put {
        println!(
            "{size:>6} journal {j:>7} B/commit ({:.2} x the value), data file {d:>7} B/value",
            j as f64 / size as f64
        );
    }
}
