//! Shared by the damaged-file tests: storages whose commits stay in the journal, the journal
//! files of a directory, cutting a file, and opens that must fail with `Error::Corruption`.
// Each test file uses some of these.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use omnibus::{Error, FlushMode, Options, Storage};

/// Options that keep every commit in the journal: no background flush, none at close.
pub fn unflushed() -> Options {
    Options {
        flush_mode: FlushMode::Manual,
        flush_on_close: false,
        ..Options::default()
    }
}

/// One write transaction putting `key` = `value`, committed.
pub fn put(s: &Storage, key: &str, value: &[u8]) {
    let mut w = s.begin_write().unwrap();
    w.put(key, value).unwrap();
    w.commit().unwrap();
}

/// The journal files (`*.journal`) in `dir`, in file-number order.
pub fn journals(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "journal"))
        .collect();
    files.sort();
    files
}

/// A standalone storage at `path` (64 KiB journal files) written until its journal rotated
/// once, so that the newest file holds one unflushed commit; closed without a flush. Returns
/// its options and the newest journal file.
pub fn rotated_storage(path: &Path) -> (Options, PathBuf) {
    let o = Options {
        journal_file_size: 64 << 10,
        ..unflushed()
    };
    let s = Storage::open(path, o.clone()).unwrap();
    let journal_dir = path.join("Journals");
    let first = journals(&journal_dir).len();
    let mut i = 0;
    while journals(&journal_dir).len() == first {
        put(&s, &format!("key{i:04}"), &[7u8; 3000]);
        i += 1;
    }
    drop(s);
    (o, journals(&journal_dir).pop().unwrap())
}

/// Cuts `file` to `len` bytes.
pub fn cut(file: &Path, len: u64) {
    std::fs::File::options()
        .write(true)
        .open(file)
        .unwrap()
        .set_len(len)
        .unwrap();
}

/// Opens `path` read-only and then for writing with `opts`; each open must fail with
/// `Error::Corruption` whose message contains `needle` (`what` names the case in failures).
pub fn expect_corruption(path: &Path, opts: &Options, needle: &str, what: &str) {
    for read_only in [true, false] {
        let o = Options {
            read_only,
            ..opts.clone()
        };
        match Storage::open(path, o) {
            Err(Error::Corruption(c)) => {
                assert!(c.to_string().contains(needle), "{what}: {c}")
            }
            other => panic!("{what} (read_only {read_only}): expected Corruption, got {other:?}"),
        }
    }
}

/// Offsets of the group records in the journal files of `dir`'s `Journals/` (path, offset of
/// the header, body length).
pub fn group_records(dir: &Path) -> Vec<(std::path::PathBuf, u64, u64)> {
    let mut out = Vec::new();
    let env = omnibus::env::DefaultEnv::new();
    for (_, p) in omnibus::testing::journal::recovery::list(&env, &dir.join("Journals")).unwrap() {
        let bytes = std::fs::read(&p).unwrap();
        let mut at = 0usize;
        while at + omnibus::testing::journal::RECORD_HEADER_LEN <= bytes.len() {
            let Some(h) = omnibus::testing::journal::RecordHeader::decode(
                &bytes[at..at + omnibus::testing::journal::RECORD_HEADER_LEN],
            ) else {
                break;
            };
            if h.kind == omnibus::testing::journal::RecordKind::Group {
                out.push((p.clone(), at as u64, h.body_len));
            }
            at += omnibus::testing::journal::RECORD_HEADER_LEN + h.body_len as usize;
        }
    }
    out
}

/// The kind byte of every part of every group record in the journal files of `dir`'s
/// `Journals/` (1 commit, 5 logical, 6 apply step), one list per record (design.md 3.11: a
/// u32 count, then 32-byte entries with the kind at byte 24).
pub fn group_part_kinds(dir: &Path) -> Vec<Vec<u8>> {
    group_records(dir)
        .into_iter()
        .map(|(p, at, _)| {
            let bytes = std::fs::read(&p).unwrap();
            let body = &bytes[at as usize + omnibus::testing::journal::RECORD_HEADER_LEN..];
            let n = u32::from_le_bytes(body[..4].try_into().unwrap()) as usize;
            (0..n).map(|i| body[4 + i * 32 + 24]).collect()
        })
        .collect()
}
