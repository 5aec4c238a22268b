//! Both journal batch paths (`JournalIo::Syscalls`: `pwritev` + `fdatasync` on the committing
//! thread; `JournalIo::Ring`: a linked WRITEV + FSYNC on its own ring) keep every guarantee:
//! commits recovered after a drop without a flush, and, under the power-loss environment with
//! real syncs (so the inner environment's own path runs), a crash after any of the first
//! durable operations loses no acknowledged commit. `Auto` with a custom environment takes the
//! syscalls without a probe; a report (`describe`) writes nothing; a probe file a killed process
//! left is removed at the next open.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use omnibus::env::{default_env, io_backend, DefaultEnv, StorageEnv};
use omnibus::{FlushMode, JournalIo, Options, Storage};

use crate::common::model;

fn opts(env: Arc<dyn StorageEnv>, io: JournalIo) -> Options {
    Options {
        env,
        journal_io: io,
        flush_mode: FlushMode::Manual,
        journal_file_size: 1 << 20,
        ..Options::default()
    }
}

/// Commits `n` transactions of 1 to 3 keys from `from`, recording each acknowledged one.
fn commit_some(
    s: &Storage,
    from: u64,
    n: u64,
    model: &mut BTreeMap<Vec<u8>, Vec<u8>>,
) -> omnibus::Result<()> {
    for t in from..from + n {
        let mut w = s.begin_write()?;
        let mut mine = Vec::new();
        for k in 0..=(t % 3) {
            let key = format!("key-{t:06}-{k}").into_bytes();
            let v = vec![(t % 251) as u8; 20 + (t % 400) as usize];
            w.put(key.clone(), &v)?;
            mine.push((key, v));
        }
        w.commit()?;
        model.extend(mine);
    }
    Ok(())
}

fn assert_content(path: &Path, model: &BTreeMap<Vec<u8>, Vec<u8>>, what: &str) {
    let s = Storage::open(path, opts(Arc::new(DefaultEnv::new()), JournalIo::Syscalls)).unwrap();
    s.check().unwrap_or_else(|e| panic!("{what}: check: {e}"));
    let got = model::content(&s).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(got == *model, "{what}: {}", model::diff(model, &got));
}

/// The path a forced `io` resolves to in this process (the ring needs io_uring).
fn expected(io: JournalIo) -> JournalIo {
    if io == JournalIo::Ring && !io_backend().io_uring {
        JournalIo::Syscalls
    } else {
        io
    }
}

#[test]
fn each_path_commits_and_recovers_unflushed_commits() {
    for io in JournalIo::CONCRETE {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let mut model = BTreeMap::new();
        {
            let s = Storage::open(&path, opts(default_env(), io)).unwrap();
            let (got, why) = s.journal_io();
            assert_eq!(got, expected(io), "{why}");
            if got == io {
                assert!(why.contains("Options::journal_io"), "{why}");
            }
            commit_some(&s, 0, 300, &mut model).unwrap();
            assert_eq!(
                s.stats().journal.batches,
                300,
                "one batch per serial commit"
            );
            // Dropped without a flush: every commit comes back from the journal.
        }
        assert_content(&path, &model, io.name());
    }
}

#[test]
fn each_path_survives_power_loss_at_any_early_durable_operation() {
    for io in JournalIo::CONCRETE {
        model::power_loss_rounds(
            &[2, 5, 11, 23, 47],
            io.name(),
            |pl, path, model| {
                let s = Storage::open(path, opts(pl, io))?;
                assert_eq!(s.journal_io().0, expected(io));
                for k in 0..4 {
                    commit_some(&s, k * 20, 20, model)?;
                    s.flush()?;
                }
                Ok(())
            },
            assert_content,
        );
    }
}

/// The names in `path`'s `Journals/`.
fn journal_names(path: &Path) -> Vec<String> {
    std::fs::read_dir(path.join("Journals"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn auto_with_a_custom_environment_takes_the_syscalls_without_a_probe() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let s = Storage::open(&path, opts(Arc::new(DefaultEnv::new()), JournalIo::Auto)).unwrap();
    let (io, why) = s.journal_io();
    assert_eq!(io, JournalIo::Syscalls);
    assert!(why.contains("custom storage environment"), "{why}");
    let journals = journal_names(&path);
    assert!(
        journals.iter().all(|n| !n.starts_with('.')),
        "no probe file: {journals:?}"
    );
}

#[test]
fn auto_with_the_default_environment_measures_and_leaves_no_probe_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let s = Storage::open(&path, opts(default_env(), JournalIo::Auto)).unwrap();
    let (io, why) = s.journal_io();
    assert_ne!(io, JournalIo::Auto);
    // Measured here, or by an earlier open on this device in this process (the same reason),
    // or set for the whole run by OMNIBUS_JOURNAL_IO; without a ring, no probe.
    assert!(
        why.contains("measured on this device")
            || why.contains("OMNIBUS_JOURNAL_IO")
            || (!io_backend().io_uring && why.contains("no ring")),
        "{why}"
    );
    let names = journal_names(&path);
    assert!(
        names.iter().all(|n| !n.contains("probe")),
        "the probe's file is removed: {names:?}"
    );
    // A report reads what this process measured, and writes nothing.
    let (described, dwhy) = JournalIo::describe(&path);
    assert_eq!(described, Some(io), "{dwhy}");
    assert_eq!(journal_names(&path), names, "describe wrote nothing");
}

#[test]
fn a_probe_file_left_by_a_killed_process_is_removed_by_the_next_open() {
    // Regression: a process killed while probing left its scratch file in `Journals/` for good.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    drop(Storage::open(&path, opts(default_env(), JournalIo::Syscalls)).unwrap());
    let stale = path.join("Journals").join(".omnibus-io-probe-4242.journal");
    std::fs::write(&stale, vec![0u8; 65536]).unwrap();
    let s = Storage::open(&path, opts(default_env(), JournalIo::Auto)).unwrap();
    assert!(!stale.exists(), "left: {:?}", journal_names(&path));
    drop(s);
}
