//! Choices measured once per device in the process (the flush write mode, `write_mode.rs`; the
//! journal's I/O path, `journal_io.rs`): the cache of what a probe chose per device, the
//! environment-variable override both read, and the medians both probes report.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::env::{default_env, StorageEnv};

/// Whether `env` is the process's default environment (seen through the engine's retry
/// wrapper): the only one a probe measures.
pub(crate) fn is_default_env(env: &Arc<dyn StorageEnv>) -> bool {
    Arc::ptr_eq(env.retry_inner().unwrap_or(env), &default_env())
}

/// What a probe chose per device (`st_dev`) in this process, with why.
pub(crate) struct DeviceChoices<M> {
    cache: Mutex<Option<HashMap<u64, (M, String)>>>,
}

impl<M: Copy> DeviceChoices<M> {
    /// An empty cache (a `static`).
    pub const fn new() -> DeviceChoices<M> {
        DeviceChoices {
            cache: Mutex::new(None),
        }
    }

    /// The choice for the device of `dir`: the cached one, or `probe` run now in `dir` (once per
    /// device: the cache's lock is held meanwhile) and cached. Only through the process's
    /// default environment ([`is_default_env`]): another environment (the test ones), a `dir`
    /// whose device cannot be read, or a failed probe gives `fallback`, named by `name`, and
    /// why.
    pub fn choose(
        &self,
        env: &Arc<dyn StorageEnv>,
        dir: &Path,
        fallback: M,
        name: fn(M) -> &'static str,
        probe: impl FnOnce(&dyn StorageEnv, &Path) -> crate::Result<(M, String)>,
    ) -> (M, String) {
        if !is_default_env(env) {
            return (
                fallback,
                "auto: a custom storage environment, no probe".into(),
            );
        }
        let dev = match std::fs::metadata(dir) {
            Ok(m) => m.dev(),
            Err(e) => return (fallback, format!("auto: no probe ({}: {e})", dir.display())),
        };
        let mut c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let c = c.get_or_insert_with(HashMap::new);
        if let Some(hit) = c.get(&dev) {
            return hit.clone();
        }
        let chosen = match probe(env.as_ref(), dir) {
            Ok((m, table)) => (m, format!("auto: measured on this device ({table})")),
            Err(e) => (
                fallback,
                format!("auto: probe failed ({e}), {}", name(fallback)),
            ),
        };
        c.insert(dev, chosen.clone());
        chosen
    }

    /// What this process already chose for the device of `dir`, if anything (no probe).
    pub fn cached(&self, dir: &Path) -> Option<(M, String)> {
        let dev = std::fs::metadata(dir).ok()?.dev();
        let c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        c.as_ref()?.get(&dev).cloned()
    }
}

/// The value of the environment variable `var` parsed by `parse` (`None` when unset or
/// invalid), and for an invalid value the note the reason carries (`VAR="x" ignored: not
/// ...`); it is also a warning, once per variable and process, naming the `expected`
/// spellings.
pub(crate) fn env_override<T>(
    var: &'static str,
    expected: &str,
    parse: impl Fn(&str) -> Option<T>,
) -> (Option<T>, Option<String>) {
    let Ok(v) = std::env::var(var) else {
        return (None, None);
    };
    let parsed = parse(&v);
    if parsed.is_some() {
        return (parsed, None);
    }
    let note = format!("{var}={v:?} ignored: not {expected}");
    static WARNED: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut w = WARNED.lock().unwrap_or_else(|e| e.into_inner());
    if !w.contains(&var) {
        w.push(var);
        tracing::warn!("{note}");
    }
    (None, Some(note))
}

/// `why`, followed by `note` when there is one (an ignored environment variable).
pub(crate) fn noted(why: String, note: Option<String>) -> String {
    match note {
        Some(n) => format!("{why}; {n}"),
        None => why,
    }
}

/// Each candidate's median of its probe times (µs, sorted in place), and a summary
/// (`name median µs, ...`, in the candidates' order).
pub(crate) fn medians<M: Copy>(
    times: &mut [(M, Vec<u128>)],
    name: impl Fn(M) -> &'static str,
) -> (Vec<(M, u128)>, String) {
    let mut table = Vec::new();
    let mut out = Vec::new();
    for (m, t) in times.iter_mut() {
        t.sort_unstable();
        let med = t.get(t.len() / 2).copied().unwrap_or(0);
        table.push(format!("{} {med} µs", name(*m)));
        out.push((*m, med));
    }
    (out, table.join(", "))
}
