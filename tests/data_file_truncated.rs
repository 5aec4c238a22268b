//! A data file shorter than its header's pages in use is refused at open as corruption.
//!
//! The story (fresh-user trial, 2026-12-02): a branch whose `data.pages` was truncated to
//! 100,000 bytes (12 of its pages) still opened, so `omnibus put` on the database exited 0 and
//! only `check` saw the damage; a read of a page past the cut would have failed only when a
//! lookup reached it. The durable header names `next_page`, and every page below it was in the
//! file when the header was written, so a shorter file is damage, named at open: the storage
//! refuses to open, and a database lists the branch as damaged and refuses writes.

#[path = "common/cli.rs"]
mod cli;

use omnibus::{Database, Error, Options, Storage};

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

#[test]
fn a_truncated_storage_is_refused_on_every_open() {
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
            let o = Options {
                read_only,
                ..Options::default()
            };
            match Storage::open(&path, o) {
                Err(Error::Corruption(c)) => {
                    assert_eq!(c.file, data);
                    assert!(c.to_string().contains("truncated"), "{c}");
                    assert!(c.to_string().contains(&format!("{cut} bytes")), "{c}");
                }
                Err(e) => panic!("cut {cut}, read_only {read_only}: not corruption: {e:?}"),
                Ok(_) => panic!("cut {cut}, read_only {read_only}: a truncated storage opened"),
            }
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
