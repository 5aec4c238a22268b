// The cost of stating each journal file's start outside it (docs/design.md 3.8), counted, not
// timed: every file started after a session's first costs one start record (a 4 KiB batch of
// its own in the previous file) and exactly one extra `fdatasync`; commits pay nothing else.
// With whole pre-zeroed files there is no background zeroing, so every `fdatasync` of the
// journal is a batch's, a new file's zeros', or a start record's.

use omnibus::{FlushMode, Options, Prezero, Storage};

#[test]
fn one_extra_fdatasync_per_journal_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let s = Storage::open(
        &path,
        Options {
            flush_mode: FlushMode::Manual,
            journal_file_size: 64 << 10,
            journal_prezero: Prezero::WholeFile,
            ..Options::default()
        },
    )
    .unwrap();
    for i in 0..200u32 {
        let mut w = s.begin_write().unwrap();
        w.put(format!("key{i:04}"), [7u8; 3000]).unwrap();
        w.commit().unwrap();
    }
    let j = s.stats().journal;
    assert!(j.files_created >= 5, "too few files to count: {j:?}");
    // One start record per file started after the session's first one.
    assert_eq!(j.start_records, j.files_created - 1, "{j:?}");
    // Each batch one fdatasync, each new file's zeros one, each start record one, and each
    // durable mark one (if the stream ever paused): nothing else.
    assert_eq!(
        j.fdatasyncs,
        j.batches + j.files_created + j.start_records + j.durable_marks,
        "{j:?}"
    );
    eprintln!(
        "{} commits, {} batches, {} journal files: {} fdatasyncs, {} of them start records ({:.2} per file)",
        j.commits,
        j.batches,
        j.files_created,
        j.fdatasyncs,
        j.start_records,
        j.start_records as f64 / j.files_created as f64
    );
}
