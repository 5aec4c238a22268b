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
