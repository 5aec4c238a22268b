//! Database scenario: a root and branch storages sharing one journal; group commit across
//! storages, reopen, standalone branch open, drop, names.

use std::sync::Arc;

use omnibus::{Database, Error, FlushMode, JournalMode, Options, Storage};

fn opts(mode: JournalMode) -> Options {
    Options {
        journal_mode: mode,
        flush_mode: FlushMode::Manual,
        journal_file_size: 1 << 20,
        journal_prezero: omnibus::Prezero::Ahead(256 << 10),
        ..Options::default()
    }
}

fn fill(db: &Database, storages: usize, threads: usize, per_thread: usize) {
    fill_tagged(db, "", storages, threads, per_thread)
}

fn fill_tagged(db: &Database, tag: &str, storages: usize, threads: usize, per_thread: usize) {
    let tag = tag.to_string();
    let names: Vec<String> = (0..storages).map(|i| format!("idx{i}")).collect();
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let db = db.clone();
            let names = names.clone();
            let tag = tag.clone();
            std::thread::spawn(move || {
                for i in 0..per_thread {
                    let s = if (t + i) % (names.len() + 1) == 0 {
                        db.root()
                    } else {
                        db.storage(&names[(t + i) % names.len()]).unwrap()
                    };
                    let mut w = s.begin_write().unwrap();
                    w.put(format!("{tag}t{t}-{i:05}"), format!("v{t}-{i}"))
                        .unwrap();
                    w.commit().unwrap();
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

fn count_all(db: &Database) -> u64 {
    let mut n = db.root().begin_read().unwrap().len();
    for name in db.storages() {
        let s = db.storage(&name).unwrap();
        assert!(s.check().unwrap().is_ok());
        n += s.begin_read().unwrap().len();
    }
    n
}

#[test]
fn shared_journal_group_commits_across_storages_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    {
        let db = Database::open(
            &path,
            Options {
                flush_on_close: false,
                ..opts(JournalMode::Shared)
            },
        )
        .unwrap();
        fill(&db, 10, 8, 200);
        let st = db.stats();
        assert_eq!(st.commits, 1600);
        assert!(
            st.batches < st.commits,
            "group commit merged nothing: {st:?}"
        );
        assert!(st.links_made >= 10, "{st:?}");
        assert_eq!(db.storages().len(), 10);
        // Branch Journals/ hold hard links to the root's files.
        let root_j = std::fs::read_dir(path.join("Journals")).unwrap().count();
        assert!(root_j >= 1);
        let b = std::fs::read_dir(path.join("Indexes/idx3/Journals"))
            .unwrap()
            .count();
        assert!(b >= 1);
        // Dropped without flushing: everything must come back from the journal.
    }
    let db = Database::open(&path, opts(JournalMode::Shared)).unwrap();
    assert_eq!(count_all(&db), 1600);
    let st = db.stats();
    assert!(
        st.journal_files_live <= 3,
        "journal files not released after recovery: {st:?}"
    );
    db.close().unwrap();
    // A branch opens standalone (troubleshooting).
    let s = Storage::open(
        path.join("Indexes/idx3"),
        Options {
            flush_mode: FlushMode::Manual,
            ..Options::default()
        },
    )
    .unwrap();
    assert!(!s.begin_read().unwrap().is_empty());
    assert!(s.check().unwrap().is_ok());
    drop(s);
    // And the database opens again after it.
    let db = Database::open(&path, opts(JournalMode::Shared)).unwrap();
    assert_eq!(count_all(&db), 1600);
}

#[test]
fn separate_mode_syncs_per_storage() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let db = Database::open(&path, opts(JournalMode::Separate)).unwrap();
    fill(&db, 4, 4, 50);
    let st = db.stats();
    assert_eq!(st.commits, 200);
    assert_eq!(st.links_made, 0);
    assert!(st.journal_fdatasyncs >= st.batches);
    drop(db);
    // Reopen in shared mode: the journals of both modes recover.
    let db = Database::open(&path, opts(JournalMode::Shared)).unwrap();
    assert_eq!(count_all(&db), 200);
    fill_tagged(&db, "second", 4, 2, 20);
    assert_eq!(count_all(&db), 240);
    drop(db);
    let db = Database::open(&path, opts(JournalMode::Shared)).unwrap();
    assert_eq!(count_all(&db), 240, "shared reopen");
    drop(db);
    let db = Database::open(&path, opts(JournalMode::Separate)).unwrap();
    assert_eq!(count_all(&db), 240);
}

#[test]
fn drop_storage_is_durable_and_names_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let db = Database::open(&path, opts(JournalMode::Shared)).unwrap();
    let a = db.storage("a").unwrap();
    let mut w = a.begin_write().unwrap();
    w.put(b"k", b"v").unwrap();
    w.commit().unwrap();
    db.drop_storage("a").unwrap();
    assert!(matches!(a.begin_write(), Err(Error::Closed)));
    assert!(db.storages().is_empty());
    assert!(!path.join("Indexes/a").exists());
    for bad in ["", ".", "..", "a/b", "a\\b", "a\0b", &"x".repeat(256)] {
        assert!(
            matches!(db.storage(bad), Err(Error::InvalidStorageName { .. })),
            "{bad:?}"
        );
    }
    assert!(db.storage(&"x".repeat(255)).is_ok());
    assert!(db.storage("Ünïcødé name").is_ok());
    drop(db);
    let db = Database::open(&path, opts(JournalMode::Shared)).unwrap();
    assert_eq!(db.storages().len(), 2);
    // A new storage with the dropped name starts empty.
    assert_eq!(db.storage("a").unwrap().begin_read().unwrap().len(), 0);
    let _ = Arc::new(db);
}

#[test]
fn old_journal_files_are_released() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let db = Database::open(&path, opts(JournalMode::Shared)).unwrap();
    // Fill several 1 MiB journal files, flushing as we go.
    for round in 0..20 {
        fill_tagged(&db, &format!("r{round}"), 5, 2, 20);
        if round % 4 == 3 {
            db.flush().unwrap();
        }
    }
    db.flush().unwrap();
    let st = db.stats();
    assert!(st.journal_files_live <= 2, "{st:?}");
    let root_files = std::fs::read_dir(path.join("Journals"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".journal")
        })
        .count();
    assert!(
        root_files <= 2,
        "{root_files} journal files left in the root"
    );
    for i in 0..5 {
        let n = std::fs::read_dir(path.join(format!("Indexes/idx{i}/Journals")))
            .unwrap()
            .count();
        assert!(n <= 1, "branch idx{i} still has {n} journal links");
    }
}
