//! Every flush write mode (mmap, file_io, vectored_file_io, io_ring) keeps every guarantee:
//! a storage loaded, flushed, thinned (deletes, so holes are punched and then written again),
//! reloaded and flushed again holds exactly what a `BTreeMap` model holds after a reopen; and
//! under the power-loss environment (with real fdatasyncs, so the inner environment's own write
//! path runs: the writable map, the io_uring lane), a crash after any of the first durable
//! operations loses no acknowledged commit.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use omnibus::env::{default_env, DefaultEnv, StorageEnv};
use omnibus::{FlushMode, Options, Storage, WriteMode};

use crate::common::model;

fn opts(env: Arc<dyn StorageEnv>, mode: WriteMode) -> Options {
    Options {
        env,
        write_mode: mode,
        flush_mode: FlushMode::Manual,
        journal_file_size: 1 << 20,
        ..Options::default()
    }
}

fn key(i: u64) -> Vec<u8> {
    format!("key-{:08}", i.wrapping_mul(2_654_435_761) % 1_000_000).into_bytes()
}

/// Commits `n` keys from `from` in transactions of 100, recording each acknowledged one.
fn load(
    s: &Storage,
    from: u64,
    n: u64,
    model: &mut BTreeMap<Vec<u8>, Vec<u8>>,
) -> omnibus::Result<()> {
    for t in (from..from + n).step_by(100) {
        let mut w = s.begin_write()?;
        let mut mine = Vec::new();
        for i in t..(t + 100).min(from + n) {
            let v = vec![(i % 251) as u8; 40 + (i % 300) as usize];
            w.put(key(i), &v)?;
            mine.push((key(i), v));
        }
        w.commit()?;
        model.extend(mine);
    }
    Ok(())
}

fn assert_content(path: &Path, model: &BTreeMap<Vec<u8>, Vec<u8>>, what: &str) {
    let s = Storage::open(
        path,
        opts(Arc::new(DefaultEnv::new()), WriteMode::VectoredFileIo),
    )
    .unwrap();
    s.check().unwrap_or_else(|e| panic!("{what}: check: {e}"));
    let got = model::content(&s).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(got == *model, "{what}: {}", model::diff(model, &got));
}

#[test]
fn each_mode_flushes_punches_and_rewrites_correctly() {
    for mode in WriteMode::CONCRETE {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let mut model = BTreeMap::new();
        {
            let s = Storage::open(&path, opts(default_env(), mode)).unwrap();
            assert_eq!(s.write_mode().0, mode);
            load(&s, 0, 20_000, &mut model).unwrap();
            s.flush().unwrap();
            let mut w = s.begin_write().unwrap();
            for i in 0..15_000 {
                w.delete(key(i)).unwrap();
                model.remove(&key(i));
            }
            w.commit().unwrap();
            s.flush().unwrap();
            s.flush().unwrap();
            load(&s, 30_000, 10_000, &mut model).unwrap();
            s.flush().unwrap();
        }
        assert_content(&path, &model, mode.name());
    }
}

#[test]
fn each_mode_survives_power_loss_at_any_early_durable_operation() {
    for mode in WriteMode::CONCRETE {
        model::power_loss_rounds(
            &[3, 9, 17, 26, 40],
            mode.name(),
            |pl, path, model| {
                let s = Storage::open(path, opts(pl, mode))?;
                for k in 0..6 {
                    load(&s, k * 2_000, 2_000, model)?;
                    s.flush()?;
                }
                Ok(())
            },
            assert_content,
        );
    }
}
