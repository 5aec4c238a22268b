//! `Storage::compact` while a reader holds a snapshot older than the deletes: it moves what it
//! safely can, cuts no page the snapshot may read (at most the file's preallocated growth above
//! every state's next page), says so in its report, and the snapshot still reads every key it
//! saw. Once the snapshot is dropped, a second
//! compaction truncates. Flushes held back by the snapshot say so too (`FlushReport`).

use omnibus::{Options, Storage};

use crate::common::model;
use model::{content, diff, Model};

#[test]
fn compact_with_a_snapshot_held_is_limited_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    // Page commits: with a write buffer, the flush service's background apply could publish
    // tree pages between the first flush and the snapshot, and the second flush wrote them.
    let opts = Options {
        write_buffer_bytes: 0,
        ..Options::default()
    };
    let s = Storage::open(&path, opts).unwrap();
    let mut m = Model::new();
    for c in 0..20u32 {
        let mut w = s.begin_write().unwrap();
        for i in c * 500..(c + 1) * 500 {
            let k = format!("key{i:07}").into_bytes();
            w.put(&k, [(i % 251) as u8; 200]).unwrap();
            m.insert(k, vec![(i % 251) as u8; 200]);
        }
        w.commit().unwrap();
    }
    s.flush().unwrap();
    let old = s.begin_read().unwrap();
    let seen = m.clone();
    let mut w = s.begin_write().unwrap();
    for i in 0..10_000u32 {
        if i % 10 != 0 {
            let k = format!("key{i:07}").into_bytes();
            w.delete(&k).unwrap();
            m.remove(&k);
        }
    }
    w.commit().unwrap();

    let f = s.flush().unwrap();
    assert_eq!(f.limited_by_snapshot, Some(old.txn_id()), "{f:?}");
    assert!(f.pages_held_back > 0 && f.pages_written == 0, "{f:?}");
    assert_eq!(f.bytes_held_back, f.pages_held_back * 8192);

    let pages_seen = s.stats().pages_used + s.stats().pages_free;
    let r = s.compact().unwrap();
    assert_eq!(r.limited_by_snapshot, Some(old.txn_id()), "{r:?}");
    let len = std::fs::metadata(path.join("data.pages")).unwrap().len();
    assert!(
        len >= pages_seen * 8192,
        "{len} bytes for {pages_seen} pages: {r:?}"
    );
    // The snapshot reads everything it saw; the storage is whole.
    let mut got = Model::new();
    for kv in old.iter().unwrap() {
        let (k, v) = kv.unwrap();
        got.insert(k.to_vec(), v.to_vec());
    }
    assert!(got == seen, "old snapshot: {}", diff(&seen, &got));
    assert!(s.check().unwrap().is_ok());
    let got = content(&s).unwrap();
    assert!(got == m, "{}", diff(&m, &got));

    drop(old);
    let f = s.flush().unwrap();
    assert_eq!(f.limited_by_snapshot, None, "{f:?}");
    let r = s.compact().unwrap();
    assert!(r.truncated && r.limited_by_snapshot.is_none(), "{r:?}");
    assert!(r.data_file_bytes_after * 2 < len, "{len} -> {r:?}");
    assert!(s.check().unwrap().is_ok());
    let got = content(&s).unwrap();
    assert!(got == m, "{}", diff(&m, &got));
}

#[test]
fn compact_beside_a_reader_of_another_open_is_skipped_and_says_so() {
    // Regression: compaction beside a read-only open holding a reader slot moved pages it could
    // not reuse below, so the data file grew (12.1 -> 23.0 MiB), and the report said nothing.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let s = Storage::open(&path, Options::default()).unwrap();
    for c in 0..20u32 {
        let mut w = s.begin_write().unwrap();
        for i in c * 500..(c + 1) * 500 {
            w.put(format!("key{i:07}"), [(i % 251) as u8; 200]).unwrap();
        }
        w.commit().unwrap();
    }
    let mut w = s.begin_write().unwrap();
    for i in 0..10_000u32 {
        if i % 10 != 0 {
            w.delete(format!("key{i:07}")).unwrap();
        }
    }
    w.commit().unwrap();
    s.flush().unwrap();
    // A read-only open takes a slot of the reader table as a reader process would.
    let ro = Options {
        read_only: true,
        ..Default::default()
    };
    let reader = Storage::open(&path, ro).unwrap();
    let seen = reader.begin_read().unwrap().len();
    assert_eq!(s.readers().unwrap().len(), 1);
    let file = |p: &std::path::Path| std::fs::metadata(p.join("data.pages")).unwrap().len();
    let before = file(&path);
    let r = s.compact().unwrap();
    assert_eq!(r.skipped_for_readers, 1, "{r:?}");
    assert_eq!(r.pages_moved, 0, "{r:?}");
    assert!(!r.truncated, "{r:?}");
    assert_eq!(
        file(&path),
        before,
        "the file neither grows nor shrinks: {r:?}"
    );
    assert_eq!(r.data_file_bytes_after, before, "{r:?}");
    assert_eq!(reader.begin_read().unwrap().len(), seen);
    drop(reader);
    // Once the reader closed, compaction runs and shrinks the file.
    let r = s.compact().unwrap();
    assert_eq!(r.skipped_for_readers, 0, "{r:?}");
    assert!(r.pages_moved > 0 && r.truncated, "{r:?}");
    assert!(file(&path) < before, "{r:?}");
    assert!(s.check().unwrap().is_ok());
}
