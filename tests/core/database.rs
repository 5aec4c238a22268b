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
    let files_before;
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
        files_before = st.journal_files_live;
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
    // Nothing is flushed yet (manual flushes): the files holding the replayed commits stay,
    // beside at most one new file. How many files the commits filled depends on how they
    // grouped into batches (each batch is padded to 4 KiB): a loaded machine groups fewer and
    // fills three 1 MiB files, not two.
    let st = db.stats();
    assert!(
        st.journal_files_live <= files_before + 1,
        "more journal files after recovery than before ({files_before}): {st:?}"
    );
    // Once every storage is flushed, only the current file is left.
    db.root().flush().unwrap();
    for name in db.storages() {
        db.storage(&name).unwrap().flush().unwrap();
    }
    let st = db.stats();
    assert_eq!(
        st.journal_files_live, 1,
        "journal files not released after every storage flushed: {st:?}"
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

/// Branch names that are also names of the layout's files (`Indexes`, `Journals`, `LOCK`,
/// `data.pages`) are ordinary names: `Indexes/` holds only branch directories, so the branch
/// `Indexes` is `DB/Indexes/Indexes`, distinct from the root's `Indexes/` by its depth, and
/// nothing of the root's layout is touched (design.md 1).
#[test]
fn branches_named_as_the_layout_s_files_collide_with_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let names = ["Indexes", "Journals", "LOCK", "data.pages"];
    let put = |s: &Storage, v: &str| {
        let mut w = s.begin_write().unwrap();
        w.put(b"k", v).unwrap();
        w.commit().unwrap();
    };
    {
        let db = Database::open(&path, opts(JournalMode::Shared)).unwrap();
        put(&db.root(), "root");
        for n in names {
            put(&db.create_storage(n).unwrap(), n);
        }
    }
    let db = Database::open(&path, opts(JournalMode::Shared)).unwrap();
    let mut sorted = names.map(String::from).to_vec();
    sorted.sort();
    assert_eq!(db.storages(), sorted);
    assert_eq!(
        db.root().begin_read().unwrap().get(b"k").unwrap(),
        Some(&b"root"[..])
    );
    for n in names {
        let s = db.storage(n).unwrap();
        assert_eq!(s.path(), path.join("Indexes").join(n));
        assert_eq!(
            s.begin_read().unwrap().get(b"k").unwrap(),
            Some(n.as_bytes())
        );
        assert!(s.check().unwrap().is_ok(), "{n}");
    }
    assert!(db.root().check().unwrap().is_ok());
    assert!(Database::exists(&path));
    // Dropping the branch `Indexes` leaves the root's `Indexes/` and the other branches.
    db.drop_storage("Indexes").unwrap();
    drop(db);
    let db = Database::open(&path, opts(JournalMode::Shared)).unwrap();
    assert_eq!(db.storages(), ["Journals", "LOCK", "data.pages"]);
    assert!(path.join("Indexes").is_dir() && !path.join("Indexes/Indexes").exists());
    let dirs: Vec<String> = Database::branch_dirs(&path)
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(dirs, ["Journals", "LOCK", "data.pages"]);
}

// Regression: an eventual commit still queued in the shared journal when its storage was
// dropped was written after the storage's directory had been renamed away, its hard link into
// that `Journals/` failed with ENOENT, and the journal was poisoned for every storage.
#[test]
fn dropping_a_storage_with_an_eventual_commit_queued_leaves_the_journal_writable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let db = Database::open(
        &path,
        Options {
            // The queued record stays queued until the next batch.
            eventual_sync_ms: 60_000,
            ..opts(JournalMode::Shared)
        },
    )
    .unwrap();
    let a = db.create_storage("a").unwrap();
    let mut w = a.begin_write().unwrap();
    w.set_durability(omnibus::Durability::Eventual);
    w.put(b"k", b"v").unwrap();
    w.commit().unwrap();
    drop(a);
    db.drop_storage("a").unwrap();
    assert!(!path.join("Indexes/a").exists());
    // The next batch writes the dropped storage's record with the root's.
    let root = db.root();
    let mut w = root.begin_write().unwrap();
    w.put(b"root", b"after").unwrap();
    w.commit().unwrap();
    let b = db.create_storage("b").unwrap();
    let mut w = b.begin_write().unwrap();
    w.put(b"k", b"v").unwrap();
    w.commit().unwrap();
    drop((root, b, db));
    let db = Database::open(&path, opts(JournalMode::Shared)).unwrap();
    assert_eq!(db.storages(), vec!["b".to_string()]);
    assert_eq!(
        db.root().begin_read().unwrap().get(b"root").unwrap(),
        Some(&b"after"[..])
    );
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

/// Runs rounds of commits into a database of a root and branch `b` (3,000-byte values, 64 KiB
/// journal files, a pool of one) through a hooked environment that watches every journal file
/// leaving a branch `Journals/` (removed, or renamed into the pool) and every file taken from the
/// pool. Each round flushes the two storages in `order` (`"b"` or `"root"` first: the storage
/// flushed last holds the file's last name) until three files are recycled, then reopens the
/// database and reads every value back. Returns the recycles seen (each file's number and whether
/// its last name was a branch's), the files taken from the pool
/// while a branch's removal of their name was not durable yet, and the database's count of
/// recycled files.
fn recycle_rounds(branch_last: bool) -> (Vec<(u64, bool)>, Vec<String>, u64) {
    use omnibus::env::testing::{HookedEnv, OpKind};
    use omnibus::env::DefaultEnv;
    use std::collections::{HashMap, HashSet};
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let env = Arc::new(HookedEnv::new(Arc::new(DefaultEnv::new())));
    // Branch `Journals/` -> journal numbers whose name left it since its last fsync.
    let pending: Arc<Mutex<HashMap<PathBuf, HashSet<u64>>>> = Arc::default();
    // (journal number, renamed from a branch's `Journals/`)
    let recycled = Arc::new(Mutex::new(Vec::<(u64, bool)>::new()));
    let violations = Arc::new(Mutex::new(Vec::<String>::new()));
    let (p2, r2, v2) = (pending.clone(), recycled.clone(), violations.clone());
    let number = |p: &Path| -> Option<u64> {
        let n = p.file_name()?.to_str()?;
        n.get(..16)?.parse().ok()
    };
    let in_branch = |p: &Path| p.components().any(|c| c.as_os_str() == "Indexes");
    env.set_hook(Box::new(move |op| {
        let mut pending = p2.lock().unwrap();
        let pooled = |p: &Path| p.to_string_lossy().ends_with(".zeroed");
        let check = |no: u64, what: &str| {
            for (d, nos) in pending.iter() {
                if nos.contains(&no) {
                    v2.lock().unwrap().push(format!(
                        "file {no} {what} while its name's removal from {} is not durable",
                        d.display()
                    ));
                }
            }
        };
        match op.kind {
            OpKind::Rename if op.to.is_some_and(pooled) => {
                // Every other branch's removal is durable before the file goes to the pool.
                if let Some(no) = number(op.path) {
                    if !in_branch(op.path) {
                        check(no, "recycled");
                    }
                    r2.lock().unwrap().push((no, in_branch(op.path)));
                    if in_branch(op.path) {
                        if let Some(parent) = op.path.parent() {
                            pending.entry(parent.to_path_buf()).or_default().insert(no);
                        }
                    }
                }
            }
            OpKind::Rename if pooled(op.path) => {
                // Taken from the pool: its new contents are about to be written.
                if let Some(no) = number(op.path) {
                    check(no, "reused");
                }
            }
            OpKind::Remove if in_branch(op.path) => {
                if let (Some(parent), Some(no)) = (op.path.parent(), number(op.path)) {
                    pending.entry(parent.to_path_buf()).or_default().insert(no);
                }
            }
            OpKind::SyncDir => {
                pending.remove(op.path);
            }
            _ => {}
        }
        None
    }));
    let opts = || Options {
        env: env.clone(),
        flush_mode: FlushMode::Manual,
        journal_file_size: 64 << 10,
        journal_prezero: omnibus::Prezero::WholeFile,
        journal_pool_files: 1,
        ..Options::default()
    };
    let db = Database::open(&path, opts()).unwrap();
    let b = db.create_storage("b").unwrap();
    let root = db.root();
    // Values small enough to stay inline in their leaf, so that each commit journals about one
    // page and the rounds rotate through the 64 KiB files at the pace the rotations need.
    let value =
        |round: u32, i: usize, k: u32| vec![(round as usize * 31 + i * 7 + k as usize) as u8; 2000];
    let mut written = Vec::new();
    // Bounded: rounds of commits through a few journal files, then flushes (the storage
    // flushed first releases its names, the other then releases the last name and may
    // recycle), until three files are recycled.
    for round in 0..200u32 {
        for (i, s) in [&b, &root, &root, &root].into_iter().enumerate() {
            for k in 0..6u32 {
                let key = format!("r{round:03}-{i}-{k}");
                let mut w = s.begin_write().unwrap();
                w.put(&key, value(round, i, k)).unwrap();
                w.commit().unwrap();
                written.push((i == 0, key, value(round, i, k)));
            }
        }
        if branch_last {
            root.flush().unwrap();
            b.flush().unwrap();
        } else {
            b.flush().unwrap();
            root.flush().unwrap();
        }
        if recycled.lock().unwrap().len() >= 3 {
            break;
        }
    }
    let counted = db.stats().journal_files_recycled;
    drop((b, root, db));
    // Recycled files hold new records over old ones: every value reads back after a reopen.
    let db = Database::open(&path, opts()).unwrap();
    let b = db.storage("b").unwrap();
    let root = db.root();
    for (in_b, key, v) in &written {
        let s = if *in_b { &b } else { &root };
        let r = s.begin_read().unwrap();
        assert_eq!(r.get(key).unwrap(), Some(&v[..]), "{key}");
    }
    drop((b, root, db));
    env.clear();
    let seen = recycled.lock().unwrap().clone();
    let v = violations.lock().unwrap().clone();
    (seen, v, counted)
}

/// A released journal file is recycled (renamed into the pool and later overwritten as a new
/// journal file) only after every branch `Journals/` whose entry for it was removed has been
/// fsynced since: otherwise a power loss could bring the branch's entry back, naming the new
/// contents under the old journal number (recovery then sees a damaged record followed by old
/// records and reports corruption).
#[test]
fn a_journal_file_is_recycled_only_after_branch_unlinks_are_durable() {
    let (seen, violations, counted) = recycle_rounds(false);
    assert!(violations.is_empty(), "{violations:?}");
    assert!(!seen.is_empty(), "no journal file was recycled");
    assert_eq!(counted, seen.len() as u64);
}

/// A journal file whose last name is a branch's is recycled too (it was deleted, and the pool
/// zeroed a whole new file for every file a database started), and the branch's `Journals/` is
/// fsynced before the file is reused.
#[test]
fn a_journal_file_whose_last_name_is_a_branch_s_is_recycled() {
    let (seen, violations, counted) = recycle_rounds(true);
    assert!(violations.is_empty(), "{violations:?}");
    assert!(
        seen.iter().any(|(_, from_branch)| *from_branch),
        "no journal file was recycled from the branch: {seen:?}"
    );
    assert_eq!(counted, seen.len() as u64);
}
