//! `Storage::catch_up` of a read-only open beside a writer reads only the journal records
//! written since its last replay while the durable header stays the same (a deterministic
//! count, `StorageStats::journal_records_replayed`), and loads again from the header once a
//! flush moved it; every state it reads holds exactly the writer's commits.

use omnibus::{FlushMode, Options, Storage};

fn commit(s: &Storage, from: u32, n: u32) {
    for i in from..from + n {
        let mut w = s.begin_write().unwrap();
        w.put(format!("k{i:04}"), format!("v{i}")).unwrap();
        w.commit().unwrap();
    }
}

/// A writer of a new storage in `path` with a write buffer of `buffer` bytes and no background
/// flush, after 20 commits (`k0000`..`k0019`), and a read-only open of it beside.
fn writer_and_reader(path: &std::path::Path, buffer: u64) -> (Storage, Storage) {
    let writer = Storage::open(
        path,
        Options {
            flush_mode: FlushMode::Manual,
            write_buffer_bytes: buffer,
            ..Default::default()
        },
    )
    .unwrap();
    commit(&writer, 0, 20);
    let reader = Storage::open(
        path,
        Options {
            read_only: true,
            ..Default::default()
        },
    )
    .unwrap();
    (writer, reader)
}

#[test]
fn catch_up_replays_only_the_records_written_since() {
    // Regression: each catch-up replayed the whole unflushed journal again (20, 25, 28 records
    // for 20, then 5, then 3 new commits).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    // Page commits: one record each (a flush of a buffer adds its apply's records).
    let (writer, reader) = writer_and_reader(&path, 0);
    let base = writer.stats().last_committed_txn;
    let replayed = |r: &Storage| r.stats().journal_records_replayed;
    assert_eq!(
        replayed(&reader),
        20,
        "the open replays the unflushed journal"
    );
    assert_eq!(reader.begin_read().unwrap().len(), 20);

    commit(&writer, 20, 5);
    assert_eq!(reader.catch_up().unwrap(), base + 5);
    assert_eq!(replayed(&reader), 25, "5 new records, not 25");
    commit(&writer, 25, 3);
    assert_eq!(reader.catch_up().unwrap(), base + 8);
    assert_eq!(replayed(&reader), 28, "3 new records, not 28");
    assert_eq!(reader.catch_up().unwrap(), base + 8);
    assert_eq!(replayed(&reader), 28, "nothing new, nothing read");
    let r = reader.begin_read().unwrap();
    assert_eq!(r.len(), 28);
    assert_eq!(r.get("k0027").unwrap(), Some(&b"v27"[..]));

    // A flush moves the durable header: the next catch-up loads from it (the records after it).
    writer.flush().unwrap();
    commit(&writer, 28, 2);
    assert_eq!(reader.catch_up().unwrap(), base + 10);
    assert_eq!(replayed(&reader), 30, "the 2 records after the new header");
    commit(&writer, 30, 4);
    assert_eq!(reader.catch_up().unwrap(), base + 14);
    assert_eq!(replayed(&reader), 34);
    let now = reader.begin_read().unwrap();
    assert_eq!(now.len(), 34);
    for i in 0..34u32 {
        assert_eq!(
            now.get(format!("k{i:04}")).unwrap(),
            Some(format!("v{i}").as_bytes()),
            "k{i:04}"
        );
    }
    // The snapshot taken before still reads its state.
    assert_eq!(r.len(), 28);
    assert!(r.get("k0030").unwrap().is_none());
}

#[test]
fn a_read_only_database_catches_up_every_storage_to_one_point() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let manual = Options {
        flush_mode: FlushMode::Manual,
        ..Default::default()
    };
    let writer = omnibus::Database::open(&path, manual).unwrap();
    let root = writer.root();
    let (a, b) = (
        writer.create_storage("a").unwrap(),
        writer.create_storage("b").unwrap(),
    );
    let groups = |from: u32, n: u32| {
        for i in from..from + n {
            let mut g = writer.begin_group(&[&root, &a, &b]).unwrap();
            for s in [&root, &a, &b] {
                g.put(s, format!("g{i:04}"), format!("v{i}")).unwrap();
            }
            g.commit().unwrap();
        }
    };
    groups(0, 10);
    let mut w = root.begin_write().unwrap();
    w.put("root only", "x").unwrap();
    w.commit().unwrap();
    let ro = omnibus::Database::open(
        &path,
        Options {
            read_only: true,
            ..Default::default()
        },
    )
    .unwrap();
    let replayed = |db: &omnibus::Database| {
        ["a", "b"].iter().fold(
            vec![db.root().stats().journal_records_replayed],
            |mut v, n| {
                v.push(db.storage(n).unwrap().stats().journal_records_replayed);
                v
            },
        )
    };
    assert_eq!(replayed(&ro), [11, 10, 10]);
    groups(10, 5);
    assert_eq!(ro.catch_up().unwrap(), root.begin_read().unwrap().txn_id());
    assert_eq!(replayed(&ro), [16, 15, 15], "the 5 new groups only");
    for n in ["a", "b"] {
        let r = ro.storage(n).unwrap().begin_read().unwrap();
        assert_eq!(r.len(), 15, "{n}");
        assert_eq!(r.get("g0014").unwrap(), Some(&b"v14"[..]), "{n}");
    }
    assert_eq!(ro.root().begin_read().unwrap().len(), 16);
    ro.catch_up().unwrap();
    assert_eq!(replayed(&ro), [16, 15, 15], "nothing new, nothing read");
    drop(ro);
    drop((root, a, b));
    writer.close().unwrap();
}

/// A catch-up onto a state whose count a reader had taken counted the buffered entries of that
/// state only: after logical commits replayed onto it, `len` stayed at the count of the open
/// (20 where 28 keys were read).
#[test]
fn a_caught_up_buffered_state_counts_its_new_entries() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let (writer, reader) = writer_and_reader(&path, 1 << 20);
    assert_eq!(reader.begin_read().unwrap().len(), 20);
    assert_eq!(
        reader.stats().buffer_entries,
        20,
        "the commits are buffered"
    );
    commit(&writer, 20, 8);
    // An overwrite and a delete: counted once and not at all.
    let mut w = writer.begin_write().unwrap();
    w.put("k0003", "again").unwrap();
    assert!(w.delete("k0004").unwrap());
    w.commit().unwrap();
    reader.catch_up().unwrap();
    let r = reader.begin_read().unwrap();
    assert_eq!(r.len(), 27);
    assert_eq!(r.iter().unwrap().count(), 27);
    assert_eq!(r.get("k0003").unwrap(), Some(&b"again"[..]));
}
