// Regression: with 64 bytes flipped in the middle of a journal file, the next open
// took the damaged record for the end of the journal, replayed nothing after it, `check`
// passed, and the next commit deleted the old journal: 90,000 acknowledged documents gone
// without an error. A damaged record followed by later synced batches is now corruption; a
// damaged *last* batch still reads as the torn tail of a crash.

use omnibus::{FlushMode, Options, Storage};

use crate::common::damage;

const COMMITS: u32 = 50;

fn opts() -> Options {
    Options {
        flush_mode: FlushMode::Manual,
        flush_on_close: false,
        // Page commits: the damage lands where a page record's bytes are.
        write_buffer_bytes: 0,
        ..Options::default()
    }
}

/// A storage whose journal holds `COMMITS` one-put commits, one batch each (4 KiB-aligned),
/// none flushed; returns the journal file and where each batch starts.
fn journaled(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf, Vec<u64>) {
    journaled_with(dir, opts())
}

/// [`journaled`] with options `o`.
fn journaled_with(
    dir: &std::path::Path,
    o: Options,
) -> (std::path::PathBuf, std::path::PathBuf, Vec<u64>) {
    let path = dir.join("s");
    let s = Storage::open(&path, o).unwrap();
    let mut starts = Vec::new();
    for i in 0..COMMITS {
        starts.push(s.stats().journal.bytes);
        let mut w = s.begin_write().unwrap();
        w.put(format!("key{i:03}"), format!("value {i}")).unwrap();
        w.commit().unwrap();
    }
    drop(s);
    let journal = std::fs::read_dir(path.join("Journals"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "journal"))
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap();
    (path, journal, starts)
}

fn damage(journal: &std::path::Path, at: u64) {
    let mut bytes = std::fs::read(journal).unwrap();
    for b in &mut bytes[at as usize..at as usize + 64] {
        *b ^= 0x3c;
    }
    std::fs::write(journal, &bytes).unwrap();
}

#[test]
fn a_damaged_record_before_synced_batches_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let (path, journal, starts) = journaled(dir.path());
    // The open wrote nothing before the first commit's batch: batch i starts at starts[i].
    damage(&journal, starts[20] + 100);
    damage::expect_corruption(
        &path,
        &opts(),
        "followed by synced commits",
        "middle damage",
    );
}

/// A buffered storage's commits are logical records (design.md 3.9): a damaged one before
/// later synced batches is corruption too, never the end of the journal.
#[test]
fn a_damaged_logical_record_before_synced_batches_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let buffered = Options {
        write_buffer_bytes: 64 << 20,
        ..opts()
    };
    let (path, journal, starts) = journaled_with(dir.path(), buffered.clone());
    // The logical record's body starts 48 bytes into its batch.
    damage(&journal, starts[20] + 50);
    damage::expect_corruption(
        &path,
        &buffered,
        "followed by synced commits",
        "logical record damage",
    );
}

#[test]
fn a_damaged_last_batch_reads_as_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let (path, journal, starts) = journaled(dir.path());
    damage(&journal, starts[COMMITS as usize - 1] + 100);
    let s = Storage::open(&path, opts()).unwrap();
    let r = s.begin_read().unwrap();
    for i in 0..COMMITS - 1 {
        assert!(r.get(format!("key{i:03}")).unwrap().is_some(), "key {i}");
    }
    assert_eq!(r.get(format!("key{:03}", COMMITS - 1)).unwrap(), None);
    assert!(s.check().unwrap().is_ok());
}

#[test]
fn a_zeroed_record_header_before_synced_batches_is_corruption() {
    // Zeros are the normal end of a journal; zeros in place of a record with later batches
    // behind it are not (64 zeroed bytes at a record start dropped
    // 105,516 documents silently).
    let dir = tempfile::tempdir().unwrap();
    let (path, journal, starts) = journaled(dir.path());
    let mut bytes = std::fs::read(&journal).unwrap();
    let at = starts[20] as usize;
    bytes[at..at + 64].fill(0);
    std::fs::write(&journal, &bytes).unwrap();
    damage::expect_corruption(
        &path,
        &opts(),
        "followed by synced commits",
        "zeroed header",
    );
}

/// The journal files of the storage at `path`, oldest first.
fn journal_files(path: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(path.join("Journals"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "journal"))
        .collect();
    files.sort();
    files
}

fn put(s: &Storage, key: &str, value: &[u8]) {
    let mut w = s.begin_write().unwrap();
    w.put(key, value).unwrap();
    w.commit().unwrap();
}

#[test]
fn damage_to_the_first_record_of_the_newest_file_is_corruption() {
    // Regression: the check compared later records only with the ones
    // read before the damage in the same file, so a damaged *first* record of a file (its
    // storage's txn t+1, after t in the file before) let the open drop every later synced
    // commit of the file without an error. The txn each storage reached in earlier files now
    // counts too.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let s = Storage::open(&path, opts()).unwrap();
    for i in 0..20 {
        put(&s, &format!("x{i:02}"), b"first session");
    }
    drop(s);
    // The reopen starts a new journal file; its first record is the next commit.
    let s = Storage::open(&path, opts()).unwrap();
    for i in 0..10 {
        put(&s, &format!("y{i:02}"), b"second session");
    }
    drop(s);
    let newest = journal_files(&path).pop().unwrap();
    damage(&newest, 100);
    damage::expect_corruption(
        &path,
        &opts(),
        "followed by synced commits",
        "first record of the newest file",
    );
}

#[test]
fn a_damaged_record_larger_than_the_lookahead_is_corruption() {
    // Regression: the search for later batches went 4 MiB past the
    // damaged record; a bit flipped inside a 6 MB value's record dropped that commit and the 10
    // synced after it. A record whose header is intact is now searched past its claimed end.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let s = Storage::open(&path, opts()).unwrap();
    for i in 0..10 {
        put(&s, &format!("a{i:02}"), b"before");
    }
    let big_at = s.stats().journal.bytes;
    put(&s, "big", &vec![0x5au8; 6 << 20]);
    for i in 0..10 {
        put(&s, &format!("z{i:02}"), b"after");
    }
    drop(s);
    let journal = journal_files(&path).pop().unwrap();
    damage(&journal, big_at + (3 << 20));
    damage::expect_corruption(
        &path,
        &opts(),
        "followed by synced commits",
        "inside a 6 MB record",
    );
}

#[test]
fn in_a_shared_journal_one_later_commit_per_storage_proves_the_damage() {
    // Regression: in a database's shared journal, storage s1's commit
    // was damaged and s2 made one commit after it, in the next batch. The check looked for a
    // storage whose txn skipped one past its last good record, so one later commit per storage
    // read as a torn tail: both acknowledged commits were dropped without an error. A valid
    // record after the damaged batch's padding is a later batch, which the writer issues only
    // once the damaged one is synced.
    use omnibus::{Database, Error};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let put_in =
        |db: &Database, name: &str, key: &str| put(&db.create_storage(name).unwrap(), key, b"v");
    let db = Database::open(&path, opts()).unwrap();
    for i in 0..5 {
        put_in(&db, "s1", &format!("a{i}"));
        put_in(&db, "s2", &format!("a{i}"));
    }
    drop(db);
    // A new journal file: s1's commit is its first record, s2's the next batch.
    let db = Database::open(&path, opts()).unwrap();
    put_in(&db, "s1", "y0");
    put_in(&db, "s2", "y0");
    drop(db);
    let newest = journal_files(&path).pop().unwrap();
    // The file starts with the link record that linked it into s1's `Journals/`; s1's commit
    // follows it (record header: 48 bytes, body length at bytes 32..40). Damage its body.
    let bytes = std::fs::read(&newest).unwrap();
    let link_len = u64::from_le_bytes(bytes[32..40].try_into().unwrap());
    damage(&newest, 48 + link_len + 48 + 8);
    for read_only in [true, false] {
        let o = Options {
            read_only,
            ..opts()
        };
        match Database::open(&path, o) {
            Err(Error::Corruption(c)) => {
                assert!(c.to_string().contains("followed by synced commits"), "{c}")
            }
            Err(e) => panic!("read_only {read_only}: expected Corruption, got {e:?}"),
            Ok(_) => panic!("read_only {read_only}: opened, dropping two acknowledged commits"),
        }
    }
}
