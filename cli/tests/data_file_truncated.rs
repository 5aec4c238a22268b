//! A data file shorter than its header's pages in use is refused at open as corruption.
//!
//! The story: a branch whose `data.pages` was truncated to
//! 100,000 bytes (12 of its pages) still opened, so `omnibus put` on the database exited 0 and
//! only `check` saw the damage; a read of a page past the cut would have failed only when a
//! lookup reached it. The durable header names `next_page`, and every page below it was in the
//! file when the header was written, so a shorter file is damage, named at open: the storage
//! refuses to open, and a database lists the branch as damaged and refuses writes.

use omnibus::{Corruption, Database, Error, Options, Storage};

use crate::common::children;
use crate::common::cli;

fn truncate(file: &std::path::Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(file)
        .unwrap()
        .set_len(len)
        .unwrap();
}

fn fill(s: &Storage, n: usize) {
    let mut w = s.begin_write().unwrap();
    for i in 0..n {
        w.put(format!("key{i:06}"), [7u8; 100]).unwrap();
    }
    w.commit().unwrap();
}

/// Opens the storage at `path` (read-only or not) and returns the corruption it must fail
/// with.
fn open_fails_as_corruption(path: &std::path::Path, read_only: bool, what: &str) -> Corruption {
    let o = Options {
        read_only,
        ..Options::default()
    };
    match Storage::open(path, o) {
        Err(Error::Corruption(c)) => c,
        Err(e) => panic!("{what}, read_only {read_only}: not corruption: {e:?}"),
        Ok(s) => panic!(
            "{what}, read_only {read_only}: opened with {} keys",
            s.begin_read().unwrap().len()
        ),
    }
}

#[test]
fn a_truncated_storage_is_refused_on_every_open() {
    let _no_children = children::no_children_meanwhile();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    {
        let s = Storage::open(&path, Options::default()).unwrap();
        fill(&s, 5_000);
        s.close().unwrap();
    }
    let data = path.join("data.pages");
    let full = std::fs::metadata(&data).unwrap().len();
    assert!(
        full > 100_000,
        "the storage holds more than the cut: {full}"
    );
    // One byte short of the last page is already damage.
    for cut in [full - 1, 100_000] {
        truncate(&data, cut);
        for read_only in [false, true] {
            let c = open_fails_as_corruption(&path, read_only, &format!("cut {cut}"));
            assert_eq!(c.file, data);
            assert!(c.to_string().contains("truncated"), "{c}");
            assert!(c.to_string().contains(&format!("{cut} bytes")), "{c}");
        }
    }
    assert_eq!(
        std::fs::metadata(&data).unwrap().len(),
        100_000,
        "an open changed the file"
    );
}

#[test]
fn a_database_with_a_truncated_branch_lists_it_damaged_and_refuses_writes() {
    let _no_children = children::no_children_meanwhile();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    {
        let db = Database::open(&path, Options::default()).unwrap();
        fill(&db.root(), 100);
        for name in ["idx", "other"] {
            fill(&db.create_storage(name).unwrap(), 5_000);
        }
        db.close().unwrap();
    }
    let cut = path.join("Indexes/idx/data.pages");
    truncate(&cut, 100_000);
    {
        let db = Database::open(&path, Options::default()).unwrap();
        let damaged = db.damaged();
        assert_eq!(damaged.len(), 1, "{damaged:?}");
        assert_eq!(damaged[0].0, "idx");
        assert!(
            matches!(&damaged[0].1, Error::Corruption(c) if c.file == cut),
            "{:?}",
            damaged[0].1
        );
        // The healthy branch reads back whole.
        let other = db.storage("other").unwrap();
        assert_eq!(other.begin_read().unwrap().len(), 5_000);
        assert!(matches!(
            db.root().begin_write(),
            Err(Error::DatabaseDamaged { .. })
        ));
    }
    let o = cli::omnibus_after_close(&["put", path.to_str().unwrap(), "doc", "v"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let o = cli::omnibus(&["check", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
}

/// Regression: a storage whose `Journals/` was empty (as
/// after any clean close, or in a fresh backup) with `data.pages` cut to two pages or less was
/// taken for a creation that crashed before its header pages were durable, and re-created
/// empty by a read-write open (`omnibus put` exited 0; 19,777 keys of a branch, 44,660
/// documents of a root gone). `Journals/` is made only after the header pages are durable, and
/// a header that states pages in use is no creation's: both make it damage.
#[test]
fn a_storage_cut_to_two_pages_or_less_is_never_created_again() {
    let _no_children = children::no_children_meanwhile();
    for cut in [0u64, 8_192, 12_000, 16_384] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        {
            // Unbuffered: a backup of buffered entries would hold them in a journal file.
            let unbuffered = Options {
                write_buffer_bytes: 0,
                ..Options::default()
            };
            let src = Storage::open(dir.path().join("src"), unbuffered).unwrap();
            fill(&src, 3_000);
            // A backup: its `Journals/` is empty and its header states no journal file.
            src.backup(&path).unwrap();
        }
        assert!(
            std::fs::read_dir(path.join("Journals"))
                .unwrap()
                .next()
                .is_none(),
            "a backup's Journals/ is empty"
        );
        let data = path.join("data.pages");
        truncate(&data, cut);
        for read_only in [false, true] {
            let c = open_fails_as_corruption(&path, read_only, &format!("cut {cut}"));
            assert_eq!(c.file, data, "cut {cut}: {c}");
        }
        assert_eq!(
            std::fs::metadata(&data).unwrap().len(),
            cut,
            "an open rewrote it"
        );
    }
}

#[test]
fn a_database_whose_root_or_branch_was_cut_to_two_pages_is_damaged_not_recreated() {
    let _no_children = children::no_children_meanwhile();
    for (victim, cut) in [
        ("Indexes/idx/data.pages", 0u64),
        ("Indexes/idx/data.pages", 16_384),
        ("data.pages", 16_384),
        ("data.pages", 0),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        {
            // A backup: every `Journals/` in it is empty (as a branch's after a clean close).
            let db = Database::open(dir.path().join("src"), Options::default()).unwrap();
            fill(&db.root(), 3_000);
            fill(&db.create_storage("idx").unwrap(), 3_000);
            db.backup(&path).unwrap();
        }
        truncate(&path.join(victim), cut);
        match Database::open(&path, Options::default()) {
            Ok(db) => {
                assert!(
                    victim.starts_with("Indexes"),
                    "{victim} {cut}: the root opened"
                );
                let damaged = db.damaged();
                assert_eq!(damaged.len(), 1, "{victim} {cut}: {damaged:?}");
                assert!(matches!(damaged[0].1, Error::Corruption(_)), "{damaged:?}");
                assert!(matches!(
                    db.root().begin_write(),
                    Err(Error::DatabaseDamaged { .. })
                ));
            }
            Err(Error::Corruption(c)) => {
                assert_eq!(victim, "data.pages", "{c}");
            }
            Err(e) => panic!("{victim} {cut}: {e:?}"),
        }
        assert_eq!(
            std::fs::metadata(path.join(victim)).unwrap().len(),
            cut,
            "{victim}: an open rewrote it"
        );
    }
}

#[test]
fn a_database_root_whose_header_pages_were_zeroed_is_damage() {
    let _no_children = children::no_children_meanwhile();
    // A headerless root next to `Journals/` is corruption, not "not a storage" (and never a
    // crashed creation to redo): the database path reads the root's header itself.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    {
        let db = Database::open(dir.path().join("src"), Options::default()).unwrap();
        fill(&db.root(), 3_000);
        db.backup(&path).unwrap();
    }
    std::fs::write(path.join("data.pages"), vec![0u8; 16_384]).unwrap();
    for read_only in [false, true] {
        let o = Options {
            read_only,
            ..Options::default()
        };
        match Database::open(&path, o) {
            Err(Error::Corruption(c)) => {
                assert!(c.to_string().contains("header"), "{c}")
            }
            Err(e) => panic!("read_only {read_only}: {e:?}"),
            Ok(_) => panic!("read_only {read_only}: a headerless root opened"),
        }
    }
    assert_eq!(
        std::fs::read(path.join("data.pages")).unwrap(),
        vec![0u8; 16_384]
    );
}
