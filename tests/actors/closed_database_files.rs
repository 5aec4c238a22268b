//! After a clean close, a database written through the engine (a root and two indexes) holds
//! its data files and at most one small journal file: the shared journal's pre-zeroed pool files
//! (a 256 MiB file each at the default size) and the zeroed tail of its current file are given
//! back.

use std::path::Path;

use omnibus::actors::{Engine, EngineOptions, IndexDefinition};
use omnibus::Options;

use crate::common::index::{map_color, map_even};

/// Every file under `dir` (hard links counted once per name), as (path, bytes allocated).
fn files(dir: &Path, out: &mut Vec<(std::path::PathBuf, u64)>) {
    use std::os::unix::fs::MetadataExt;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let m = std::fs::symlink_metadata(&p).unwrap();
        if m.is_dir() {
            files(&p, out);
        } else {
            out.push((p, m.blocks() * 512));
        }
    }
}

#[test]
fn a_closed_database_keeps_no_zeroed_journal_space() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let engine = Engine::start(EngineOptions {
        executors: Some(2),
        ..EngineOptions::default()
    })
    .unwrap();
    // Journal files of 1 MiB: the shared journal rotates, recycles released files and keeps a
    // pre-zeroed pool file of the same size, as it does at the default 256 MiB.
    let opts = Options {
        journal_file_size: 1 << 20,
        ..Options::default()
    };
    let db = engine.blocking_open_database(&path, opts).unwrap();
    let root = db.root();
    for i in 0..500u64 {
        root.blocking_put(format!("doc{i:04}"), format!("color=c{};n={i}", i % 5))
            .unwrap();
    }
    db.blocking_define_index(IndexDefinition::new("by_color", map_color))
        .unwrap();
    db.blocking_define_index(IndexDefinition::new("even", map_even))
        .unwrap();
    db.blocking_wait_for_indexes().unwrap();
    for i in 500..1000u64 {
        root.blocking_put(format!("doc{i:04}"), format!("color=c{};n={i}", i % 5))
            .unwrap();
    }
    db.blocking_wait_for_indexes().unwrap();
    let j = root.stats().journal;
    assert!(
        j.pool_zero_bytes + j.files_recycled * (1 << 20) > 0,
        "no pool file was made: {j:?}"
    );
    drop((root, db));
    engine.shutdown().unwrap();

    let mut all = Vec::new();
    files(&path, &mut all);
    let journal: Vec<&(std::path::PathBuf, u64)> = all
        .iter()
        .filter(|(p, _)| p.components().any(|c| c.as_os_str() == "Journals"))
        .collect();
    let journal_bytes: u64 = journal.iter().map(|(_, b)| b).sum();
    let data: Vec<_> = all
        .iter()
        .filter(|(p, _)| p.file_name().is_some_and(|n| n == "data.pages"))
        .collect();
    assert_eq!(data.len(), 3, "{all:?}");
    assert!(
        journal_bytes <= 1 << 20,
        "{journal_bytes} bytes of journal files left: {journal:?}"
    );
    let mut names: Vec<_> = journal.iter().filter_map(|(p, _)| p.file_name()).collect();
    names.sort();
    names.dedup();
    assert!(names.len() <= 1, "journal files left: {journal:?}");
}
