//! Regression: one damaged storage took the whole database down. With one index's
//! `data.pages` truncated (a disk full while copying, a bad restore), `Database::open` failed,
//! read-only too, so the documents and every healthy index became unreadable. Now the database opens without the damaged branch, reports it
//! (`Database::damaged`, `omnibus check`, `omnibus stat`), serves reads of every healthy
//! storage, and refuses writes until the caller opts in
//! (`Options::write_with_damaged_storages`), since the damaged index could not follow them.

use std::path::Path;

use omnibus::{Database, Error, FlushMode, Options};

use crate::common::children;
use crate::common::cli;

fn opts() -> Options {
    Options {
        flush_mode: FlushMode::Manual,
        ..Options::default()
    }
}

/// A database with documents in the root and entries in two branches, `by_a` then damaged by
/// cutting its data file to half a page.
fn damaged_db(path: &Path) {
    {
        let db = Database::open(path, opts()).unwrap();
        for (s, n) in [
            (db.root(), "doc"),
            (db.create_storage("by_a").unwrap(), "a"),
            (db.create_storage("by_b").unwrap(), "b"),
        ] {
            let mut w = s.begin_write().unwrap();
            for i in 0..100u32 {
                w.put(format!("{n}{i:03}"), format!("value {i}")).unwrap();
            }
            w.commit().unwrap();
        }
        db.close().unwrap();
    }
    let data = path.join("Indexes/by_a/data.pages");
    let f = std::fs::OpenOptions::new().write(true).open(&data).unwrap();
    f.set_len(4096).unwrap();
}

#[test]
fn healthy_storages_open_read_and_refuse_writes_until_opted_in() {
    let _no_children = children::no_children_meanwhile();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    damaged_db(&path);

    for read_only in [true, false] {
        let db = Database::open(
            &path,
            Options {
                read_only,
                create: false,
                ..opts()
            },
        )
        .unwrap_or_else(|e| panic!("read_only={read_only}: the database must open: {e}"));
        let damaged = db.damaged();
        assert_eq!(damaged.len(), 1, "{damaged:?}");
        assert_eq!(damaged[0].0, "by_a");
        assert!(
            matches!(
                damaged[0].1,
                Error::Corruption(_) | Error::NotAStorage { .. }
            ),
            "{:?}",
            damaged[0].1
        );
        assert_eq!(db.storages(), vec!["by_b".to_string()]);
        // The damaged branch's error, not a new empty storage of that name.
        assert!(matches!(
            db.storage("by_a"),
            Err(Error::Corruption(_) | Error::NotAStorage { .. })
        ));
        let r = db.root().begin_read().unwrap();
        assert_eq!(r.get(b"doc007").unwrap(), Some(&b"value 7"[..]));
        let b = db.storage("by_b").unwrap();
        assert_eq!(
            b.begin_read().unwrap().get(b"b099").unwrap(),
            Some(&b"value 99"[..])
        );
        if !read_only {
            match db.root().begin_write() {
                Err(Error::DatabaseDamaged { storages }) => assert_eq!(storages, vec!["by_a"]),
                other => panic!("writes must be refused: {:?}", other.map(|_| ())),
            }
            assert!(matches!(
                b.begin_write(),
                Err(Error::DatabaseDamaged { .. })
            ));
        }
    }

    // Opting in: the healthy storages take writes.
    let db = Database::open(
        &path,
        Options {
            write_with_damaged_storages: true,
            ..opts()
        },
    )
    .unwrap();
    let mut w = db.root().begin_write().unwrap();
    w.put(b"doc-new", b"written").unwrap();
    w.commit().unwrap();
    assert_eq!(db.damaged().len(), 1);
    drop(db);

    check_and_stat_name_the_damaged_storage();
}

/// Run from the test above, not as a test of its own: its child processes, forked while the
/// other test's database was open, would briefly hold that database's `LOCK` descriptor
/// (between fork and exec) and make the other test's immediate reopen fail with AlreadyOpen.
fn check_and_stat_name_the_damaged_storage() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    damaged_db(&path);
    let p = path.to_str().unwrap();
    let o = cli::omnibus(&["check", p]);
    assert_eq!(o.status.code(), Some(2), "check exits 2 on damage");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("by_a: CORRUPT"), "{out}");
    assert!(
        out.contains("by_b"),
        "the healthy branch is checked too: {out}"
    );
    let stat = cli::ok(&["stat", p]);
    assert!(stat.contains("by_a: DAMAGED"), "{stat}");
    // Reads of the healthy storages work from the command line too.
    assert_eq!(cli::ok(&["get", p, "doc001"]).trim_end(), "value 1");
    assert_eq!(
        cli::ok(&["get", "--storage", "by_b", p, "b002"]).trim_end(),
        "value 2"
    );
}
