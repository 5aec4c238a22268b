//! Shared by the crash-point suites: a storage's content as a `BTreeMap` model, and a short
//! description of how two models differ.

use std::collections::BTreeMap;

use omnibus::Storage;

/// Key -> value, the reference every recovered storage is compared with.
pub type Model = BTreeMap<Vec<u8>, Vec<u8>>;

/// Everything `s` holds, read from one snapshot; an error when iterating fails or the entry
/// count in the header disagrees with the keys iterated.
pub fn content(s: &Storage) -> Result<Model, String> {
    let r = s.begin_read().map_err(|e| e.to_string())?;
    let mut m = Model::new();
    for kv in r.iter().map_err(|e| format!("iter: {e}"))? {
        let (k, v) = kv.map_err(|e| format!("iterating the recovered storage: {e}"))?;
        m.insert(k.to_vec(), v.to_vec());
    }
    if r.len() != m.len() as u64 {
        return Err(format!(
            "entry count {} disagrees with the {} keys iterated",
            r.len(),
            m.len()
        ));
    }
    Ok(m)
}

/// How `got` differs from `want`: counts of missing, extra and changed keys.
pub fn diff(want: &Model, got: &Model) -> String {
    let missing = want.keys().filter(|k| !got.contains_key(*k)).count();
    let extra = got.keys().filter(|k| !want.contains_key(*k)).count();
    let changed = want
        .iter()
        .filter(|(k, v)| got.get(*k).is_some_and(|w| w != *v))
        .count();
    format!(
        "{} keys, want {}: {missing} missing, {extra} extra, {changed} with other values",
        got.len(),
        want.len()
    )
}

/// Runs `workload` once per crash point of `points` on a fresh storage under a
/// [`PowerLossEnv`](omnibus::env::testing::PowerLossEnv) with real syncs (so the inner
/// environment's own write paths run), crashing after that many durable operations (keeping a
/// random subset of unsynced writes), or at its end if it finished first; `workload` records
/// each acknowledged change in the model. `check` then gets the storage's path, the model and
/// a label (`"<what> crash after <n>"`) to compare the reopened storage with.
pub fn power_loss_rounds(
    points: &[u64],
    what: &str,
    mut workload: impl FnMut(
        std::sync::Arc<omnibus::env::testing::PowerLossEnv>,
        &std::path::Path,
        &mut Model,
    ) -> omnibus::Result<()>,
    check: impl Fn(&std::path::Path, &Model, &str),
) {
    use omnibus::env::testing::{CrashMode, PowerLossEnv};
    for (round, crash_at) in points.iter().copied().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let pl = std::sync::Arc::new(
            PowerLossEnv::new(omnibus::env::default_env(), &root).with_real_sync(true),
        );
        pl.crash_after(crash_at, CrashMode::KeepSubset, true, round as u64)
            .unwrap();
        let path = root.join("s");
        let mut model = Model::new();
        let r = workload(pl.clone(), &path, &mut model);
        assert!(
            r.is_ok() || pl.is_crashed(),
            "{what}: failed without a crash: {r:?}"
        );
        if !pl.is_crashed() {
            pl.crash(CrashMode::KeepSubset, true, round as u64).unwrap();
        }
        check(&path, &model, &format!("{what} crash after {crash_at}"));
    }
}
