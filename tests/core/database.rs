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
                        db.create_storage(&names[(t + i) % names.len()]).unwrap()
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
        let s = db.create_storage(&name).unwrap();
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
    let a = db.create_storage("a").unwrap();
    let mut w = a.begin_write().unwrap();
    w.put(b"k", b"v").unwrap();
    w.commit().unwrap();
    db.drop_storage("a").unwrap();
    assert!(matches!(a.begin_write(), Err(Error::Closed)));
    assert!(db.storages().is_empty());
    assert!(!path.join("Indexes/a").exists());
    for bad in ["", ".", "..", "a/b", "a\\b", "a\0b", &"x".repeat(256)] {
        assert!(
            matches!(
                db.create_storage(bad),
                Err(Error::InvalidStorageName { .. })
            ),
            "{bad:?}"
        );
    }
    assert!(db.create_storage(&"x".repeat(255)).is_ok());
    assert!(db.create_storage("Ünïcødé name").is_ok());
    drop(db);
    let db = Database::open(&path, opts(JournalMode::Shared)).unwrap();
    assert_eq!(db.storages().len(), 2);
    // A new storage with the dropped name starts empty.
    assert_eq!(
        db.create_storage("a").unwrap().begin_read().unwrap().len(),
        0
    );
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

/// A released journal file is recycled (renamed into the pool and later overwritten as a new
/// journal file) only after every branch `Journals/` whose entry for it was removed has been
/// fsynced since: otherwise a power loss could bring the branch's entry back, naming the new
/// contents under the old journal number (recovery then sees a damaged record followed by old
/// records and reports corruption).
#[test]
fn a_journal_file_is_recycled_only_after_branch_unlinks_are_durable() {
    use omnibus::env::testing::{HookedEnv, OpKind};
    use omnibus::env::DefaultEnv;
    use std::collections::{HashMap, HashSet};
    use std::path::PathBuf;
    use std::sync::Mutex;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let env = Arc::new(HookedEnv::new(Arc::new(DefaultEnv::new())));
    // Branch `Journals/` -> file names removed from it since its last fsync.
    let pending: Arc<Mutex<HashMap<PathBuf, HashSet<String>>>> = Arc::default();
    let recycled = Arc::new(Mutex::new(Vec::<String>::new()));
    let violations = Arc::new(Mutex::new(Vec::<String>::new()));
    let (p2, r2, v2) = (pending.clone(), recycled.clone(), violations.clone());
    let name = |p: &std::path::Path| {
        p.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    env.set_hook(Box::new(move |op| {
        let mut pending = p2.lock().unwrap();
        match op.kind {
            OpKind::Remove if op.path.components().any(|c| c.as_os_str() == "Indexes") => {
                if let Some(parent) = op.path.parent() {
                    pending
                        .entry(parent.to_path_buf())
                        .or_default()
                        .insert(name(op.path));
                }
            }
            OpKind::SyncDir => {
                pending.remove(op.path);
            }
            OpKind::Rename if op.to.is_some_and(|t| name(t).ends_with(".zeroed")) => {
                let n = name(op.path);
                for (d, names) in pending.iter() {
                    if names.contains(&n) {
                        v2.lock().unwrap().push(format!(
                            "{n} recycled while its removal from {} is not durable",
                            d.display()
                        ));
                    }
                }
                r2.lock().unwrap().push(n);
            }
            _ => {}
        }
        None
    }));
    let db = Database::open(
        &path,
        Options {
            env: env.clone(),
            flush_mode: FlushMode::Manual,
            journal_file_size: 64 << 10,
            journal_prezero: omnibus::Prezero::WholeFile,
            journal_pool_files: 1,
            ..Options::default()
        },
    )
    .unwrap();
    let b = db.create_storage("b").unwrap();
    let root = db.root();
    let value = vec![7u8; 3000];
    // Bounded: rounds of commits through a few journal files, then flushes (the branch
    // releases its entries, then the root releases and may recycle), until a file is recycled.
    for round in 0..200u32 {
        for (i, s) in [&b, &root, &root, &root].into_iter().enumerate() {
            for k in 0..6u32 {
                let mut w = s.begin_write().unwrap();
                w.put(format!("r{round:03}-{i}-{k}"), &value).unwrap();
                w.commit().unwrap();
            }
        }
        b.flush().unwrap();
        root.flush().unwrap();
        if recycled.lock().unwrap().len() >= 3 {
            break;
        }
    }
    let v = violations.lock().unwrap().clone();
    assert!(v.is_empty(), "{v:?}");
    assert!(
        !recycled.lock().unwrap().is_empty(),
        "no journal file was recycled"
    );
    drop((b, root, db));
    env.clear();
}
