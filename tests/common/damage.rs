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
