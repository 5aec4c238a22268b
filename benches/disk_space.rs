//! Disk space: omnibus against LMDB (heed) for the same keys and values loaded the same way.
//!
//! Data: `../shared/data/cities.jsonl` next to the crate (or the file named by `OMNIBUS_CITIES`)
//! when present,
//! else a generated stand-in of the same shape (171,075 JSON lines of ~100 bytes). Documents
//! are keyed by their line number in 12 digits (as `omnibus ingest` keys them); three indexes
//! (`country`, `admin1`, `name`) hold one entry `term ++ 0x00 ++ document key` with an empty
//! value per document (design.md 10.1), as the CLI's `--index` does.
//!
//! omnibus: a `Database` (root storage + three branch storages, shared journal), each batch of
//! 2,000 documents one write transaction per storage, default options. LMDB: one environment
//! with four named databases, each batch one write transaction. Both are closed before they are
//! measured: bytes on disk are `st_blocks * 512` of every file under the directory, each inode
//! once (a journal file hard-linked into the branches counts once), journals included for
//! omnibus (reported apart), the lock file included for LMDB.
//!
//! Then both are reopened, the first half of the documents (clustered: in key order) and
//! their index entries are deleted in batches, both are closed, and measured again.
//!
//! Run: `cargo bench --bench disk_space`. Prints both sizes and the ratios.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use omnibus::{Database, Options};

const BATCH: usize = 2_000;
const INDEXES: [&str; 3] = ["country", "admin1", "name"];

/// A document: key, value (the line), and its three index entry keys.
struct Doc {
    key: Vec<u8>,
    value: Vec<u8>,
    entries: [Vec<u8>; 3],
}

/// The string value of `"field":"..."` in a JSON line (no escapes needed for sizing).
fn field<'a>(line: &'a str, name: &str) -> &'a str {
    let pat = format!("\"{name}\":\"");
    match line.find(&pat) {
        Some(i) => {
            let rest = &line[i + pat.len()..];
            &rest[..rest.find('"').unwrap_or(rest.len())]
        }
        None => "",
    }
}

fn docs() -> (Vec<Doc>, String) {
    let path = std::env::var("OMNIBUS_CITIES").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/data/cities.jsonl").to_string()
    });
    let (lines, source): (Vec<String>, String) = match std::fs::read_to_string(&path) {
        Ok(text) => (text.lines().map(str::to_string).collect(), path),
        Err(_) => {
            let mut x = 0x5EED_u64;
            let mut next = || {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                x >> 33
            };
            let lines = (0..171_075)
                .map(|_| {
                    let c = next() % 240;
                    format!(
                        "{{\"name\":\"City {:x}\",\"lat\":\"{}.{:05}\",\"lng\":\"{}.{:05}\",\"country\":\"{}{}\",\"admin1\":\"{:02}\",\"admin2\":\"\"}}",
                        next() % 100_000_000,
                        next() % 90,
                        next() % 100_000,
                        next() % 180,
                        next() % 100_000,
                        (b'A' + (c / 26) as u8) as char,
                        (b'A' + (c % 26) as u8) as char,
                        next() % 40
                    )
                })
                .collect();
            (lines, "generated stand-in (171,075 lines)".to_string())
        }
    };
    let docs = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let key = format!("{:012}", i + 1).into_bytes();
            let entry = |name: &str| {
                let mut e = field(l, name).as_bytes().to_vec();
                e.push(0);
                e.extend_from_slice(&key);
                e
            };
            Doc {
                entries: [entry(INDEXES[0]), entry(INDEXES[1]), entry(INDEXES[2])],
                value: l.trim().as_bytes().to_vec(),
                key,
            }
        })
        .collect();
    (docs, source)
}

/// Bytes on disk of every file under `dir` (each inode once), and of those under `Journals/`.
fn du(dir: &Path) -> (u64, u64) {
    let mut seen = std::collections::HashSet::new();
    let (mut total, mut journals) = (0, 0);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let e = e.expect("dir entry");
            let m = e.metadata().expect("metadata");
            if m.is_dir() {
                stack.push(e.path());
            } else if seen.insert(m.ino()) {
                total += m.blocks() * 512;
                if d.ends_with("Journals") {
                    journals += m.blocks() * 512;
                }
            }
        }
    }
    (total, journals)
}

fn omnibus_apply(dir: &Path, docs: &[Doc], put: bool) {
    let db = Database::open(dir, Options::default()).expect("open");
    let root = db.root();
    let idx: Vec<_> = INDEXES
        .iter()
        .map(|n| db.create_storage(n).expect("storage"))
        .collect();
    for chunk in docs.chunks(BATCH) {
        let mut w = root.begin_write().expect("begin");
        for d in chunk {
            if put {
                w.put(&d.key[..], &d.value[..]).expect("put");
            } else {
                w.delete(&d.key[..]).expect("delete");
            }
        }
        w.commit().expect("commit");
        for (i, s) in idx.iter().enumerate() {
            let mut w = s.begin_write().expect("begin");
            for d in chunk {
                if put {
                    w.put(&d.entries[i][..], &b""[..]).expect("put");
                } else {
                    w.delete(&d.entries[i][..]).expect("delete");
                }
            }
            w.commit().expect("commit");
        }
    }
    drop(idx);
    drop(root);
    db.close().expect("close");
}

type Bytes = heed::types::Bytes;

fn lmdb_apply(dir: &Path, docs: &[Doc], put: bool) {
    std::fs::create_dir_all(dir).expect("mkdir");
    // SAFETY: the directory is private to this process; nothing else maps it.
    let env = unsafe {
        heed::EnvOpenOptions::new()
            .map_size(4 << 30)
            .max_dbs(4)
            .open(dir)
    }
    .expect("lmdb open");
    let mut w = env.write_txn().expect("txn");
    let main: heed::Database<Bytes, Bytes> =
        env.create_database(&mut w, Some("documents")).expect("db");
    let idx: Vec<heed::Database<Bytes, Bytes>> = INDEXES
        .iter()
        .map(|n| env.create_database(&mut w, Some(n)).expect("db"))
        .collect();
    w.commit().expect("commit");
    for chunk in docs.chunks(BATCH) {
        let mut w = env.write_txn().expect("txn");
        for d in chunk {
            if put {
                main.put(&mut w, &d.key, &d.value).expect("put");
                for (i, db) in idx.iter().enumerate() {
                    db.put(&mut w, &d.entries[i], b"").expect("put");
                }
            } else {
                main.delete(&mut w, &d.key).expect("delete");
                for (i, db) in idx.iter().enumerate() {
                    db.delete(&mut w, &d.entries[i]).expect("delete");
                }
            }
        }
        w.commit().expect("commit");
    }
    env.force_sync().expect("sync");
    drop(env);
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

fn main() {
    let (docs, source) = docs();
    let raw: usize = docs.iter().map(|d| d.key.len() + d.value.len()).sum();
    println!(
        "disk_space: {} documents from {source}, {:.1} MiB of keys and values, 3 indexes",
        docs.len(),
        mib(raw as u64)
    );
    let base = std::env::var("OMNIBUS_BENCH_DIR")
        .unwrap_or_else(|_| std::env::temp_dir().display().to_string());
    let dir = tempfile::Builder::new()
        .prefix("disk_space")
        .tempdir_in(base)
        .expect("tempdir");
    let (o, l) = (dir.path().join("omnibus"), dir.path().join("lmdb"));
    let half = docs.len() / 2;
    for (step, slice, put) in [
        ("loaded", &docs[..], true),
        ("half deleted", &docs[..half], false),
    ] {
        let t = std::time::Instant::now();
        omnibus_apply(&o, slice, put);
        let to = t.elapsed();
        let t = std::time::Instant::now();
        lmdb_apply(&l, slice, put);
        let tl = t.elapsed();
        let ((ot, oj), (lt, _)) = (du(&o), du(&l));
        println!(
            "{step:13} omnibus {:7.1} MiB on disk ({:.1} MiB journals) in {:.1} s | LMDB {:7.1} MiB in {:.1} s | ratio {:.2}",
            mib(ot),
            mib(oj),
            to.as_secs_f64(),
            mib(lt),
            tl.as_secs_f64(),
            ot as f64 / lt as f64
        );
    }
}
