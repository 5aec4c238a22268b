//! Group transactions (`Database::begin_group`): one transaction over the root and branches,
//! written as one group record (docs/design.md 3.11, invariant I14). Reads see the group's own
//! writes; a commit shows in every storage, after a reopen too; a group record whose body is
//! damaged is applied by no storage, whether the database opens or each storage opens alone,
//! and a whole one by each storage opened alone; and every refusal is its typed error.

use std::path::Path;

use crate::common::damage::group_records;
use omnibus::testing::journal::RECORD_HEADER_LEN;
use omnibus::{
    Database, Durability, Error, FlushMode, GroupError, JournalMode, Options, Storage,
    MAX_GROUP_BYTES, MAX_GROUP_STORAGES,
};

fn opts() -> Options {
    Options {
        flush_mode: FlushMode::Manual,
        flush_on_close: false,
        ..Options::default()
    }
}

fn get(s: &Storage, k: &str) -> Option<Vec<u8>> {
    s.begin_read().unwrap().get(k).unwrap().map(|v| v.to_vec())
}

#[test]
fn a_group_reads_its_own_writes_and_commits_in_every_storage() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::open(dir.path(), opts()).unwrap();
    let root = db.root();
    let (a, b) = (
        db.create_storage("a").unwrap(),
        db.create_storage("b").unwrap(),
    );
    let mut w = root.begin_write().unwrap();
    w.put("gone", "x").unwrap();
    w.commit().unwrap();

    // Given in any order; locked root first, then by name.
    let mut g = db.begin_group(&[&b, &root, &a]).unwrap();
    assert_eq!(g.len(), 3);
    g.put(&root, "doc/1", "one").unwrap();
    g.put(&a, "one\0doc/1", "").unwrap();
    g.put(&b, "k", "v").unwrap();
    assert!(g.delete(&root, "gone").unwrap());
    assert_eq!(g.get(&root, "doc/1").unwrap().as_deref(), Some(&b"one"[..]));
    assert_eq!(g.get(&root, "gone").unwrap(), None);
    let keys: Vec<Vec<u8>> = g
        .range(&a, ..)
        .unwrap()
        .map(|kv| kv.unwrap().0.to_vec())
        .collect();
    assert_eq!(keys, vec![b"one\0doc/1".to_vec()]);
    // Nothing is visible before the commit.
    assert_eq!(get(&root, "doc/1"), None);
    assert_eq!(get(&root, "gone").as_deref(), Some(&b"x"[..]));
    let batches = db.stats().batches;
    g.commit().unwrap();
    assert_eq!(db.stats().batches, batches + 1, "one batch, one fdatasync");
    assert_eq!(get(&root, "doc/1").as_deref(), Some(&b"one"[..]));
    assert_eq!(get(&root, "gone"), None);
    assert_eq!(get(&a, "one\0doc/1").as_deref(), Some(&b""[..]));
    assert_eq!(get(&b, "k").as_deref(), Some(&b"v"[..]));
    assert_eq!(group_records(dir.path()).len(), 1);

    // An eventual group, then a group that changes one storage only (its own record).
    let mut g = db.begin_group(&[&a, &b]).unwrap();
    g.set_durability(Durability::Eventual);
    g.put(&a, "e", "1").unwrap();
    g.put(&b, "e", "1").unwrap();
    g.commit().unwrap();
    let mut g = db.begin_group(&[&a, &b]).unwrap();
    g.put(&a, "only", "1").unwrap();
    g.commit().unwrap();
    assert_eq!(group_records(dir.path()).len(), 2);

    // Every storage recovers its part from the journal (nothing was flushed).
    drop((root, a, b));
    db.close().unwrap();
    let db = Database::open(dir.path(), opts()).unwrap();
    let (root, a, b) = (
        db.root(),
        db.storage("a").unwrap(),
        db.storage("b").unwrap(),
    );
    assert_eq!(get(&root, "doc/1").as_deref(), Some(&b"one"[..]));
    assert_eq!(get(&root, "gone"), None);
    assert_eq!(get(&a, "one\0doc/1").as_deref(), Some(&b""[..]));
    assert_eq!(get(&b, "k").as_deref(), Some(&b"v"[..]));
    assert_eq!(get(&a, "e").as_deref(), Some(&b"1"[..]));
    assert_eq!(get(&b, "e").as_deref(), Some(&b"1"[..]));
    assert_eq!(get(&a, "only").as_deref(), Some(&b"1"[..]));
    assert!(root.check().unwrap().is_ok());
    assert!(a.check().unwrap().is_ok());
    assert!(b.check().unwrap().is_ok());
}

/// A database with a root and branch `b` whose last journal batch is one group putting `k` in
/// both, nothing flushed; returns the root's journal file and the group record's place.
fn one_group_unflushed(path: &Path) -> (std::path::PathBuf, u64, u64) {
    let db = Database::open(path, opts()).unwrap();
    let root = db.root();
    let b = db.create_storage("b").unwrap();
    let mut w = b.begin_write().unwrap();
    w.put("before", "1").unwrap();
    w.commit().unwrap();
    let mut g = db.begin_group(&[&root, &b]).unwrap();
    g.put(&root, "k", "root").unwrap();
    g.put(&b, "k", "branch").unwrap();
    g.commit().unwrap();
    drop((root, b));
    db.close().unwrap();
    let mut found = group_records(path);
    assert_eq!(found.len(), 1);
    found.pop().unwrap()
}

#[test]
fn each_storage_opened_alone_applies_a_whole_group_part() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    one_group_unflushed(&path);
    // The branch alone reads its part from its own link of the shared file.
    let b = Storage::open(path.join("Indexes/b"), opts()).unwrap();
    assert_eq!(get(&b, "k").as_deref(), Some(&b"branch"[..]));
    assert_eq!(get(&b, "before").as_deref(), Some(&b"1"[..]));
    drop(b);
    let db = Database::open(&path, opts()).unwrap();
    assert_eq!(get(&db.root(), "k").as_deref(), Some(&b"root"[..]));
    assert_eq!(
        get(&db.storage("b").unwrap(), "k").as_deref(),
        Some(&b"branch"[..])
    );
}

#[test]
fn a_damaged_group_record_is_applied_by_no_storage() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let (file, at, len) = one_group_unflushed(&path);
    // One byte of the last part's body (the branch's or the root's, whichever is last).
    let mut bytes = std::fs::read(&file).unwrap();
    let i = (at + RECORD_HEADER_LEN as u64 + len - 1) as usize;
    bytes[i] ^= 0x5a;
    std::fs::write(&file, &bytes).unwrap();

    // Alone: neither the branch (through its hard link: the same bytes) nor the root.
    let b = Storage::open(path.join("Indexes/b"), opts()).unwrap();
    assert_eq!(get(&b, "k"), None);
    assert_eq!(get(&b, "before").as_deref(), Some(&b"1"[..]));
    drop(b);
    let db = Database::open(&path, opts()).unwrap();
    assert_eq!(get(&db.root(), "k"), None);
    let b = db.storage("b").unwrap();
    assert_eq!(get(&b, "k"), None);
    assert_eq!(get(&b, "before").as_deref(), Some(&b"1"[..]));
    // Both go on from there: the next group takes the same txn ids again.
    let root = db.root();
    let mut g = db.begin_group(&[&root, &b]).unwrap();
    g.put(&root, "k", "again").unwrap();
    g.put(&b, "k", "again").unwrap();
    g.commit().unwrap();
    drop((root, b));
    db.close().unwrap();
    let db = Database::open(&path, opts()).unwrap();
    assert_eq!(get(&db.root(), "k").as_deref(), Some(&b"again"[..]));
    assert_eq!(
        get(&db.storage("b").unwrap(), "k").as_deref(),
        Some(&b"again"[..])
    );
}

#[test]
fn refusals_are_typed() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::open(dir.path().join("db"), opts()).unwrap();
    let root = db.root();
    let a = db.create_storage("a").unwrap();

    // A storage of another database, and one opened alone.
    let other = Database::open(dir.path().join("other"), opts()).unwrap();
    let alone = Storage::open(dir.path().join("alone"), opts()).unwrap();
    for s in [&other.root(), &alone] {
        match db.begin_group(&[&root, s]) {
            Err(Error::Group(GroupError::NotInDatabase { path })) => assert_eq!(path, s.path()),
            r => panic!("a foreign storage: {r:?}"),
        }
    }
    assert!(matches!(
        db.begin_group(&[&a, &root, &a]),
        Err(Error::Group(GroupError::Duplicate { .. }))
    ));
    let many: Vec<&Storage> = std::iter::repeat_n(&a, MAX_GROUP_STORAGES + 1).collect();
    assert!(matches!(
        db.begin_group(&many),
        Err(Error::Group(GroupError::TooManyStorages { count, max }))
            if count == MAX_GROUP_STORAGES + 1 && max == MAX_GROUP_STORAGES
    ));

    // Busy: a write transaction open on one storage; the writers taken are released.
    let w = a.begin_write().unwrap();
    assert!(matches!(
        db.try_begin_group(&[&root, &a]),
        Err(Error::WriteInProgress)
    ));
    root.try_begin_write().unwrap().abort();
    drop(w);
    // A storage outside the group.
    let b = db.create_storage("b").unwrap();
    let mut g = db.begin_group(&[&root, &a]).unwrap();
    // Two groups over one storage: the second finds it busy.
    assert!(matches!(
        db.try_begin_group(&[&a, &b]),
        Err(Error::WriteInProgress)
    ));
    assert!(matches!(
        g.put(&b, "k", "v"),
        Err(Error::Group(GroupError::NotInGroup { .. }))
    ));
    assert!(matches!(
        g.get(&b, "k"),
        Err(Error::Group(GroupError::NotInGroup { .. }))
    ));
    // Too many bytes: refused at commit, nothing written, the storages usable.
    let value = vec![7u8; 1 << 20];
    for i in 0..(MAX_GROUP_BYTES >> 20) / 2 + 1 {
        g.put(&root, format!("r{i}"), &value).unwrap();
        g.put(&a, format!("a{i}"), &value).unwrap();
    }
    let commits = db.stats().commits;
    match g.commit() {
        Err(Error::Group(GroupError::TooLarge { bytes, max })) => {
            assert!(bytes > max && max == MAX_GROUP_BYTES)
        }
        r => panic!("a group over the byte limit: {r:?}"),
    }
    assert_eq!(db.stats().commits, commits);
    assert_eq!(get(&root, "r0"), None);
    let mut g = db.begin_group(&[&root, &a, &b]).unwrap();
    g.put(&b, "k", "v").unwrap();
    g.commit().unwrap();
    assert_eq!(get(&b, "k").as_deref(), Some(&b"v"[..]));
    // A group that changes one storage writes that storage's own record: a plain commit's
    // limits, not the group record's (it was refused as TooLarge past 64 MiB).
    let mut g = db.begin_group(&[&root, &a]).unwrap();
    for i in 0..(MAX_GROUP_BYTES >> 20) + 1 {
        g.put(&a, format!("a{i}"), &value).unwrap();
    }
    g.commit().unwrap();
    assert_eq!(get(&a, "a0").as_deref(), Some(&value[..]));

    // Separate journals.
    drop((root, a, b));
    db.close().unwrap();
    // A read-only database refuses a group as any write (it was named SeparateJournals: a
    // read-only open has no journal).
    let ro = Database::open(
        dir.path().join("db"),
        Options {
            read_only: true,
            ..opts()
        },
    )
    .unwrap();
    assert!(matches!(
        ro.begin_group(&[&ro.root()]),
        Err(Error::ReadOnly)
    ));
    drop(ro);
    let sep = Database::open(
        dir.path().join("sep"),
        Options {
            journal_mode: JournalMode::Separate,
            ..opts()
        },
    )
    .unwrap();
    let root = sep.root();
    assert!(matches!(
        sep.begin_group(&[&root]),
        Err(Error::Group(GroupError::SeparateJournals))
    ));
}

#[test]
fn a_backup_never_copies_part_of_a_group() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let db = Database::open(
        dir.path().join("db"),
        Options {
            flush_mode: FlushMode::Background,
            ..Options::default()
        },
    )
    .unwrap();
    let root = db.root();
    let b = db.create_storage("b").unwrap();
    let done = AtomicBool::new(false);
    let copied = AtomicUsize::new(0);
    let backups = std::thread::scope(|sc| {
        sc.spawn(|| {
            // Eventual groups: published one storage after the other, before they are durable;
            // until three backups were taken (buffered, a group costs a few microseconds).
            for i in 0..500_000u64 {
                if i >= 3000 && copied.load(Ordering::Acquire) >= 3 {
                    break;
                }
                let mut g = db.begin_group(&[&root, &b]).unwrap();
                g.set_durability(Durability::Eventual);
                for s in [&root, &b] {
                    g.put(s, format!("k{i:08}"), "v").unwrap();
                }
                g.commit().unwrap();
            }
            done.store(true, Ordering::Release);
        });
        let mut n = 0;
        while !done.load(Ordering::Acquire) && n < 12 {
            let dest = dir.path().join(format!("copy{n}"));
            db.backup(&dest).unwrap();
            let copy = Database::open(&dest, opts()).unwrap();
            let keys = |s: &Storage| -> Vec<Vec<u8>> {
                let r = s.begin_read().unwrap();
                r.iter().unwrap().map(|kv| kv.unwrap().0.to_vec()).collect()
            };
            let (kr, kb) = (keys(&copy.root()), keys(&copy.storage("b").unwrap()));
            assert_eq!(kr, kb, "backup {n} holds part of a group");
            n += 1;
            copied.store(n, Ordering::Release);
        }
        n
    });
    assert!(
        backups >= 2,
        "only {backups} backups while the groups were written"
    );
}

#[test]
fn begin_group_waits_for_busy_writers_and_groups_never_wait_in_a_circle() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::open(dir.path().join("db"), opts()).unwrap();
    let root = db.root();
    let names = ["a", "b", "c", "d"];
    let branches: Vec<Storage> = names
        .iter()
        .map(|n| db.create_storage(n).unwrap())
        .collect();

    // A writer open on `b`: a group over {root, b} waits for it, then commits after it.
    let mut w = branches[1].begin_write().unwrap();
    w.put("k", "single").unwrap();
    let (started, waiting) = std::sync::mpsc::channel();
    let group = {
        let (db, root, b) = (db.clone(), root.clone(), branches[1].clone());
        std::thread::spawn(move || {
            started.send(()).unwrap();
            let mut g = db.begin_group(&[&b, &root]).unwrap();
            g.put(&b, "k", "group").unwrap();
            g.put(&root, "k", "group").unwrap();
            g.commit().unwrap();
        })
    };
    waiting.recv().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(
        !group.is_finished(),
        "begin_group did not wait for b's writer"
    );
    assert_eq!(get(&root, "k"), None);
    w.commit().unwrap();
    group.join().unwrap();
    assert_eq!(get(&branches[1], "k").as_deref(), Some(&b"group"[..]));
    assert_eq!(get(&root, "k").as_deref(), Some(&b"group"[..]));

    // Threads naming overlapping storages in opposite orders: all finish (lock order), and
    // every group's writes are there.
    let (done_tx, done) = std::sync::mpsc::channel();
    for t in 0..4usize {
        let (db, root, bs, done_tx) = (db.clone(), root.clone(), branches.clone(), done_tx.clone());
        std::thread::spawn(move || {
            for i in 0..200usize {
                let mut members: Vec<&Storage> = vec![&bs[(t + i) % 4], &bs[(t + i + 1) % 4]];
                if i % 3 == 0 {
                    members.push(&root);
                }
                if t % 2 == 1 {
                    members.reverse();
                }
                let mut g = db.begin_group(&members).unwrap();
                for s in &members {
                    g.put(s, format!("t{t}-{i}"), "v").unwrap();
                }
                g.commit().unwrap();
            }
            done_tx.send(()).unwrap();
        });
    }
    drop(done_tx);
    for _ in 0..4 {
        done.recv_timeout(std::time::Duration::from_secs(120))
            .expect("groups over overlapping storages waited for each other in a circle");
    }
    for t in 0..4usize {
        for i in 0..200usize {
            let key = format!("t{t}-{i}");
            assert!(get(&branches[(t + i) % 4], &key).is_some(), "{key}");
            assert!(get(&branches[(t + i + 1) % 4], &key).is_some(), "{key}");
            assert_eq!(get(&root, &key).is_some(), i % 3 == 0, "{key}");
        }
    }
}
