//! The `LOCK` file's writer pid (bytes 16..24 of its reader table, design.md 6.5): set while a
//! read-write open holds the storage, cleared when it closes cleanly, whether or not readers
//! are still attached (their slots stay as they are).

use omnibus::{Database, Options, Storage};

/// The writer pid word of `dir`'s `LOCK`, and the pids of its occupied reader slots.
fn lock_words(dir: &std::path::Path) -> (u64, Vec<u64>) {
    let b = std::fs::read(dir.join("LOCK")).unwrap();
    let word = |off: usize| u64::from_le_bytes(b[off..off + 8].try_into().unwrap());
    let slots = (0..127)
        .map(|i| word(64 + 64 * i))
        .filter(|p| *p != 0)
        .collect();
    (word(16), slots)
}

#[test]
fn a_clean_close_clears_the_writer_pid() {
    // Regression: `LOCK` kept the last writer's pid after it closed cleanly.
    let me = u64::from(std::process::id());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let s = Storage::open(&path, Options::default()).unwrap();
    let mut w = s.begin_write().unwrap();
    w.put("k", "v").unwrap();
    w.commit().unwrap();
    assert_eq!(lock_words(&path), (me, vec![]), "while open");
    s.close().unwrap();
    assert_eq!(lock_words(&path), (0, vec![]), "after close");

    // With a reader attached: its slot stays, it still reads, and the next writer's pid is set.
    let s = Storage::open(&path, Options::default()).unwrap();
    let ro = Options {
        read_only: true,
        ..Default::default()
    };
    let reader = Storage::open(&path, ro).unwrap();
    assert_eq!(lock_words(&path), (me, vec![me]));
    s.close().unwrap();
    assert_eq!(lock_words(&path), (0, vec![me]), "reader still attached");
    assert_eq!(
        reader.begin_read().unwrap().get("k").unwrap(),
        Some(&b"v"[..])
    );
    let s = Storage::open(&path, Options::default()).unwrap();
    assert_eq!(lock_words(&path), (me, vec![me]));
    assert_eq!(s.readers().unwrap().len(), 1);
    drop(reader);
    assert_eq!(lock_words(&path), (me, vec![]));
    drop(s);
    assert_eq!(
        lock_words(&path),
        (0, vec![]),
        "closed by its last handle's drop"
    );

    // A database: the root's and every branch's LOCK.
    let dbp = dir.path().join("db");
    let db = Database::open(&dbp, Options::default()).unwrap();
    db.create_storage("b").unwrap();
    db.close().unwrap();
    assert_eq!(lock_words(&dbp).0, 0);
    assert_eq!(lock_words(&dbp.join("Indexes").join("b")).0, 0);
}
