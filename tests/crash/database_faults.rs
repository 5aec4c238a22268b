//! Shared-journal failure and retention scenarios: a failed batch fails every commit in it and
//! poisons the whole database; an idle storage cannot pin old journal files.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use omnibus::env::testing::{Fault, HookedEnv, OpKind};
use omnibus::env::DefaultEnv;
use omnibus::{Database, Error, FlushMode, Options};

#[test]
fn failed_batch_fails_all_its_commits_and_poisons_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let env = Arc::new(HookedEnv::new(Arc::new(DefaultEnv::new())));
    let o = Options {
        env: env.clone(),
        flush_mode: FlushMode::Manual,
        ..Options::default()
    };
    let db = Database::open(&path, o).unwrap();
    let names = ["s1", "s2", "s3"];
    for n in names {
        let s = db.create_storage(n).unwrap();
        let mut w = s.begin_write().unwrap();
        w.put(b"before", b"1").unwrap();
        w.commit().unwrap();
    }
    // Batch 1 (s1's commit) is held in its fdatasync while s2 and s3 queue up behind it into
    // batch 2, whose fdatasync then fails.
    let syncs = Arc::new(AtomicU64::new(0));
    let sc = syncs.clone();
    env.set_hook(Box::new(move |op| {
        if op.kind == OpKind::SyncData && op.path.to_string_lossy().ends_with(".journal") {
            return match sc.fetch_add(1, Ordering::SeqCst) {
                0 => Some(Fault::Delay(Duration::from_millis(400))),
                1 => Some(Fault::Eio),
                _ => None,
            };
        }
        None
    }));
    let barrier = Arc::new(Barrier::new(3));
    let hs: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let s = db.create_storage(n).unwrap();
            let b = barrier.clone();
            std::thread::spawn(move || {
                b.wait();
                // s1 goes first; the others start while its batch is being synced.
                std::thread::sleep(Duration::from_millis(if i == 0 { 0 } else { 150 }));
                let mut w = s.begin_write().unwrap();
                w.put(b"during", b"2").unwrap();
                w.commit()
            })
        })
        .collect();
    let results: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(results[0].is_ok(), "{:?}", results[0]);
    for r in &results[1..] {
        assert!(
            matches!(
                r,
                Err(Error::Io {
                    op: "fdatasync",
                    ..
                })
            ),
            "{r:?}"
        );
    }
    assert_eq!(
        syncs.load(Ordering::SeqCst),
        2,
        "s2 and s3 must share one batch"
    );
    // The whole database refuses writes now.
    for s in [db.root(), db.create_storage("s1").unwrap()] {
        assert!(matches!(
            s.begin_write().map(|_| ()),
            Err(Error::Poisoned { .. })
        ));
    }
    drop(db);
    let db = Database::open(
        &path,
        Options {
            flush_mode: FlushMode::Manual,
            ..Options::default()
        },
    )
    .unwrap();
    for n in names {
        let r = db.create_storage(n).unwrap().begin_read().unwrap();
        assert_eq!(r.get(b"before").unwrap(), Some(&b"1"[..]), "{n}");
    }
    assert_eq!(
        db.create_storage("s1")
            .unwrap()
            .begin_read()
            .unwrap()
            .get(b"during")
            .unwrap(),
        Some(&b"2"[..])
    );
}

#[test]
fn an_idle_storage_does_not_pin_old_journal_files() {
    idle_storage_unpins(0);
}

/// A buffered idle storage's entry is applied before the flush retention asks for: a flush
/// records the tree's txn only, so the entry's record kept its journal file for ever.
#[test]
fn an_idle_buffered_storage_does_not_pin_old_journal_files() {
    idle_storage_unpins(1 << 20);
}

/// An idle storage, with a write buffer of `buffer` bytes, beside a busy one: its record does
/// not keep old journal files.
fn idle_storage_unpins(buffer: u64) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let o = Options {
        write_buffer_bytes: buffer,
        flush_mode: FlushMode::Background,
        flush_max_age: Duration::from_secs(3600),
        flush_scratch_bytes: 1 << 40,
        journal_file_size: 256 << 10,
        journal_prezero: omnibus::Prezero::Ahead(64 << 10),
        ..Options::default()
    };
    let db = Database::open(&path, o).unwrap();
    let idle = db.create_storage("idle").unwrap();
    let mut w = idle.begin_write().unwrap();
    w.put(b"k", b"v").unwrap();
    w.commit().unwrap();
    let busy = db.create_storage("busy").unwrap();
    for i in 0..300u32 {
        let mut w = busy.begin_write().unwrap();
        w.put(i.to_be_bytes(), vec![1u8; 100]).unwrap();
        w.commit().unwrap();
    }
    assert!(db.stats().journal_fdatasyncs > 300);
    // Neither size nor age triggers a flush of "idle"; retention does: it holds a record in a
    // journal file that is no longer current (its buffered entry is applied first, else the
    // record would keep the file).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let idle_links = std::fs::read_dir(path.join("Indexes/idle/Journals"))
            .unwrap()
            .count();
        let st = idle.stats();
        if st.last_flushed_txn == st.last_committed_txn && idle_links == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "idle storage still pins journal files: {:?}",
            idle.stats()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Every storage's flusher lets go of the old files within a few ticks.
    loop {
        let live = db.stats().journal_files_live;
        if live <= 2 {
            break;
        }
        assert!(Instant::now() < deadline, "{live} journal files live");
        std::thread::sleep(Duration::from_millis(50));
    }
}

// Regression: after a crash on a full file system, every read-write open failed with a bare
// `pwrite ... No space left on device` while starting its journal file, and left one more
// empty journal file behind per try. Now the open says that space is needed and how much
// (`Error::NoSpace`), leaves the directory as it was, a read-only open reads everything, and
// once there is space the read-write open recovers every commit.
#[test]
fn an_open_on_a_full_file_system_names_the_space_needed_and_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let hooked = Arc::new(HookedEnv::new(Arc::new(DefaultEnv::new())));
    let opts = Options {
        env: hooked.clone(),
        flush_mode: FlushMode::Manual,
        flush_on_close: false,
        ..Options::default()
    };
    {
        // Commits left in the journal only, as a crash leaves them.
        let db = Database::open(&path, opts.clone()).unwrap();
        let idx = db.create_storage("idx").unwrap();
        for i in 0..20u32 {
            for s in [db.root(), idx.clone()] {
                let mut w = s.begin_write().unwrap();
                w.put(format!("k{i:03}").as_bytes(), b"value").unwrap();
                w.commit().unwrap();
            }
        }
    }
    let journals = path.join("Journals");
    let listing = || {
        let mut v: Vec<String> = std::fs::read_dir(&journals)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let before = listing();
    hooked.fail_always(OpKind::Write, ".journal", Fault::Enospc);
    for _ in 0..3 {
        let e = Database::open(&path, opts.clone()).unwrap_err();
        assert!(e.is_no_space(), "{e}");
        match &e {
            Error::NoSpace { needed, .. } => assert!(*needed > 0, "{e}"),
            other => panic!("expected NoSpace, got {other}"),
        }
        assert!(e.to_string().contains("needs"), "{e}");
        assert_eq!(listing(), before, "a failed open left a journal file: {e}");
    }
    // A read-only open needs no space and reads every commit.
    {
        let ro = Database::open(
            &path,
            Options {
                read_only: true,
                ..opts.clone()
            },
        )
        .unwrap();
        assert_eq!(ro.root().begin_read().unwrap().len(), 20);
        assert_eq!(ro.storage("idx").unwrap().begin_read().unwrap().len(), 20);
    }
    hooked.clear();
    let db = Database::open(&path, opts).unwrap();
    assert_eq!(db.root().begin_read().unwrap().len(), 20);
    assert_eq!(db.storage("idx").unwrap().begin_read().unwrap().len(), 20);
}
