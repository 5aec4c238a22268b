//! Opening what is not a (healthy) storage: a directory of unrelated files and a data file
//! without the omnibus magic are `Error::NotAStorage`, two damaged header pages are
//! `Error::Corruption`, another format version is `Error::FormatVersion`; a failed open changes
//! none of the files it was given.

use std::path::{Path, PathBuf};

use omnibus::testing::page::header::{decode, Slot};
use omnibus::{Error, FlushMode, Options, Storage};

use crate::common::damage;
use crate::common::tree;
use tree::tree;

const PAGE: usize = 8192;

fn opts() -> Options {
    Options {
        flush_mode: FlushMode::Manual,
        ..Options::default()
    }
}

/// A closed storage with some flushed content (both header slots written), and its data file.
fn make_storage(dir: &Path) -> (PathBuf, PathBuf) {
    let path = dir.join("s");
    let s = Storage::open(&path, opts()).unwrap();
    for round in 0..3u32 {
        let mut w = s.begin_write().unwrap();
        for i in 0..200u32 {
            w.put(format!("k{i:04}"), format!("v{round}-{i}")).unwrap();
        }
        w.commit().unwrap();
        s.flush().unwrap();
    }
    s.close().unwrap();
    let data = path.join("data.pages");
    (path, data)
}

fn expect_not_a_storage(r: omnibus::Result<Storage>, what: &str) {
    match r {
        Err(Error::NotAStorage { .. }) => {}
        Err(e) => panic!("{what}: expected NotAStorage, got {e}"),
        Ok(_) => panic!("{what}: opened"),
    }
}

#[test]
fn directory_of_unrelated_files_is_not_a_storage() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("photos");
    std::fs::create_dir_all(path.join("2024")).unwrap();
    std::fs::write(path.join("notes.txt"), b"not a database").unwrap();
    expect_not_a_storage(Storage::open(&path, opts()), "unrelated files");
    expect_not_a_storage(
        Storage::open(
            &path,
            Options {
                read_only: true,
                ..opts()
            },
        ),
        "unrelated files, read-only",
    );
    assert!(
        !path.join("data.pages").exists(),
        "a failed open created a data file"
    );
    assert!(
        !path.join("Journals").exists(),
        "a failed open created Journals/"
    );
    assert_eq!(
        std::fs::read(path.join("notes.txt")).unwrap(),
        b"not a database"
    );
    // A missing directory with `create: false`.
    let missing = dir.path().join("missing");
    expect_not_a_storage(
        Storage::open(
            &missing,
            Options {
                create: false,
                ..opts()
            },
        ),
        "missing, create false",
    );
    assert!(!missing.exists());
}

#[test]
fn data_file_with_bad_magic_is_not_a_storage() {
    let dir = tempfile::tempdir().unwrap();
    // Another program's file, two pages or much longer.
    for (i, len) in [2 * PAGE, 1 << 20].into_iter().enumerate() {
        let path = dir.path().join(format!("foreign-{i}"));
        std::fs::create_dir(&path).unwrap();
        let mut bytes = b"SQLite format 3\0".repeat(len / 16);
        bytes[100] = 7;
        std::fs::write(path.join("data.pages"), &bytes).unwrap();
        expect_not_a_storage(Storage::open(&path, opts()), "foreign data file");
        assert_eq!(
            std::fs::read(path.join("data.pages")).unwrap(),
            bytes,
            "a failed open changed the file"
        );
    }
    // A real storage whose magic was overwritten in both header pages: its journal files
    // show it was a storage, so this is damage (Corruption), not a foreign file.
    let (path, data) = make_storage(dir.path());
    let mut bytes = std::fs::read(&data).unwrap();
    for slot in 0..2 {
        bytes[slot * PAGE + 32..slot * PAGE + 40].copy_from_slice(b"NOTOMNI\0");
    }
    std::fs::write(&data, &bytes).unwrap();
    match Storage::open(&path, opts()) {
        Err(Error::Corruption(c)) => assert!(c.to_string().contains("journal files"), "{c}"),
        other => panic!("overwritten magic: expected Corruption, got {other:?}"),
    }
    assert_eq!(
        std::fs::read(&data).unwrap(),
        bytes,
        "a failed open changed the data file"
    );
}

#[test]
fn damaged_header_pair_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let (path, data) = make_storage(dir.path());
    let good = std::fs::read(&data).unwrap();
    let seq = |b: &[u8], slot: usize| match decode(&b[slot * PAGE..(slot + 1) * PAGE], slot as u64)
    {
        Slot::Valid(h) => h.sequence,
        other => panic!("slot {slot} of a healthy storage: {other:?}"),
    };
    let older = if seq(&good, 0) < seq(&good, 1) { 0 } else { 1 };

    // The older header damaged: the newer one still opens the storage with everything in it.
    let mut bytes = good.clone();
    bytes[older * PAGE + 64] ^= 0x01;
    std::fs::write(&data, &bytes).unwrap();
    {
        let s = Storage::open(&path, opts()).expect("one damaged header page");
        let r = s.begin_read().unwrap();
        assert_eq!(r.len(), 200);
        assert_eq!(r.get(b"k0123").unwrap(), Some(&b"v2-123"[..]));
        assert!(s.check().unwrap().is_ok());
    }

    // Both damaged (a checksummed byte in each): corruption, and the file is left as it was.
    let mut bytes = std::fs::read(&data).unwrap();
    for slot in 0..2 {
        bytes[slot * PAGE + 64] ^= 0x01;
        bytes[slot * PAGE + 4000] ^= 0x80;
    }
    std::fs::write(&data, &bytes).unwrap();
    match Storage::open(&path, opts()) {
        Err(e @ Error::Corruption(_)) => {
            let Error::Corruption(c) = &e else {
                unreachable!()
            };
            assert!(c.file.ends_with("data.pages"), "{e}");
            assert!(e.is_corruption());
        }
        Err(e) => panic!("expected Corruption, got {e}"),
        Ok(_) => panic!("a data file with two damaged header pages opened"),
    }
    match Storage::open(
        &path,
        Options {
            read_only: true,
            ..opts()
        },
    ) {
        Err(e) => assert!(e.is_corruption(), "read-only: {e}"),
        Ok(_) => panic!("read-only open of two damaged header pages succeeded"),
    }
    assert_eq!(
        std::fs::read(&data).unwrap(),
        bytes,
        "a failed open changed the data file"
    );
}

#[test]
fn other_format_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (path, data) = make_storage(dir.path());
    let mut bytes = std::fs::read(&data).unwrap();
    for slot in 0..2 {
        let page = &mut bytes[slot * PAGE..(slot + 1) * PAGE];
        page[40..44].copy_from_slice(&99u32.to_le_bytes());
        omnibus::testing::page::seal(page);
        assert_eq!(
            decode(page, slot as u64),
            Slot::OtherVersion(99),
            "the test rewrote the version field"
        );
    }
    std::fs::write(&data, &bytes).unwrap();
    match Storage::open(&path, opts()) {
        Err(Error::FormatVersion {
            found: 99,
            expected,
            ..
        }) => assert_ne!(expected, 99),
        Err(e) => panic!("expected FormatVersion, got {e}"),
        Ok(_) => panic!("a data file of format version 99 opened"),
    }
}

// Regression: with the root's data.pages truncated to 0 bytes (or removed) in a database that
// held 171,075 documents, the next `omnibus put` created an
// empty storage there and exited 0, and `check` passed. Journal files exist only after a
// storage's header pages were durable, so next to them a missing, empty or short data file is
// damage.
#[test]
fn missing_empty_or_short_data_file_next_to_journals_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, Option<u64>); 3] =
        [("removed", None), ("empty", Some(0)), ("short", Some(4096))];
    for (what, len) in cases {
        std::fs::create_dir(dir.path().join(what)).unwrap();
        let (path, data) = make_storage(&dir.path().join(what));
        assert!(
            std::fs::read_dir(path.join("Journals")).unwrap().count() > 0,
            "a closed storage keeps its current journal file"
        );
        match len {
            None => std::fs::remove_file(&data).unwrap(),
            Some(n) => std::fs::File::options()
                .write(true)
                .open(&data)
                .unwrap()
                .set_len(n)
                .unwrap(),
        }
        damage::expect_corruption(&path, &opts(), "journal files", what);
        assert_eq!(
            std::fs::metadata(&data).ok().map(|m| m.len()),
            len,
            "{what}: the open re-created or changed the data file"
        );
    }
}

// Regression: with the root's data.pages and journal removed from a database
// whose indexes held 171,075 entries, `omnibus put` created an empty root and exited 0.
#[test]
fn a_database_root_without_its_data_file_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    {
        let db = omnibus::Database::open(&path, opts()).unwrap();
        let idx = db.create_storage("idx").unwrap();
        let mut w = idx.begin_write().unwrap();
        w.put("k", "v").unwrap();
        w.commit().unwrap();
        db.close().unwrap();
    }
    std::fs::remove_file(path.join("data.pages")).unwrap();
    for entry in std::fs::read_dir(path.join("Journals")).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }
    match omnibus::Database::open(&path, opts()) {
        Err(Error::Corruption(c)) => assert!(c.to_string().contains("holds storages"), "{c}"),
        other => panic!("expected Corruption, got {other:?}"),
    }
    assert!(
        !path.join("data.pages").exists(),
        "the open re-created the root"
    );
}

// Regression: a directory holding someone else's `data.pages` was "not an omnibus storage" to
// `Storage::open`, but a database's read-write open (`Database::open`, the engine's, the CLI's
// `ingest`) left `Indexes/` (and, for a 9-byte file, `LOCK`) behind, and called the 9-byte
// file "corruption: cut short". Every open now gives the same verdict and creates nothing.
#[test]
fn every_open_refuses_a_foreign_data_file_the_same_way_and_creates_nothing() {
    use omnibus::actors::{Engine, EngineOptions};
    use omnibus::{Database, JournalMode};
    let dir = tempfile::tempdir().unwrap();
    let random = tree::junk(65536, 0x9E37_79B9_7F4A_7C15);
    let contents: [(&str, Vec<u8>); 4] = [
        ("notes", b"my notes\n".to_vec()),
        ("nine-random", random[..9].to_vec()),
        ("random-64k", random.clone()),
        ("two-zero-pages-and-text", {
            let mut v = vec![0u8; 2 * PAGE];
            v.extend_from_slice(b"some text");
            v
        }),
    ];
    let engine = Engine::start(EngineOptions {
        executors: Some(1),
        ..EngineOptions::default()
    })
    .unwrap();
    for (name, bytes) in contents {
        let path = dir.path().join(name);
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("data.pages"), &bytes).unwrap();
        let before = tree(&path);
        let ro = Options {
            read_only: true,
            ..opts()
        };
        let separate = Options {
            journal_mode: JournalMode::Separate,
            ..opts()
        };
        let results: Vec<(&str, omnibus::Error)> = vec![
            ("Storage::open", Storage::open(&path, opts()).unwrap_err()),
            (
                "Storage::open read-only",
                Storage::open(&path, ro.clone()).unwrap_err(),
            ),
            ("Database::open", Database::open(&path, opts()).unwrap_err()),
            (
                "Database::open separate",
                Database::open(&path, separate).unwrap_err(),
            ),
            (
                "Database::open read-only",
                Database::open(&path, ro).unwrap_err(),
            ),
            (
                "Engine::open_database",
                engine.blocking_open_database(&path, opts()).unwrap_err(),
            ),
        ];
        for (what, e) in results {
            assert!(
                matches!(e, Error::NotAStorage { .. }),
                "{name}: {what}: expected NotAStorage, got {e}"
            );
            assert_eq!(tree(&path), before, "{name}: {what} changed the directory");
        }
    }
    engine.shutdown().unwrap();
}
