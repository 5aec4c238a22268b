//! Helpers shared by the test binaries. Each `tests/<area>/main.rs` mounts this module as
//! `common` (with `dead_code` allowed there: no binary uses every helper); a scenario module
//! takes what it needs with `use crate::common::...`.

pub mod alloc;
pub mod children;
pub mod cli;
pub mod damage;
pub mod index;
pub mod model;
pub mod points;
pub mod requires;
pub mod tree;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// Held for the whole of each test of the `alone` binary, so that each of them runs alone in its
/// process: they count or disturb what belongs to the whole process (allocations of every
/// thread, resident and pinned memory, the page images that memory budgets hold, signals sent to
/// every thread). A failed test's poisoning is ignored.
pub fn alone() -> MutexGuard<'static, ()> {
    static ALONE: Mutex<()> = Mutex::new(());
    ALONE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The name libtest gives test `f` of the module whose `module_path!()` is `module`: the path
/// without its first segment (the crate, i.e. the test binary), then `f`; what `--exact`
/// wants to run that test alone (`module_path!()` `processes::crash_sigkill` and `child_entry`
/// give `crash_sigkill::child_entry`).
pub fn test_name(module: &str, f: &str) -> String {
    match module.split_once("::") {
        Some((_, path)) => format!("{path}::{f}"),
        None => f.to_string(),
    }
}

/// For the real-crash tests: starts `child_test` (its full name, see [`test_name`]) of the
/// current test binary with `env_var` set to `dir`, lets it run for `run_for` (from when its
/// harness starts the test, see [`children::ChildLines::wait_until_running`]), kills it with
/// SIGKILL, and returns the `(storage index, key)` lines it printed (keys of 16 characters;
/// other output is ignored). The child writes and prints `storage key` for each acknowledged
/// write.
pub fn run_and_kill(
    child_test: &str,
    env_var: &str,
    dir: &Path,
    run_for: Duration,
) -> Vec<(usize, String)> {
    run_and_kill_with(child_test, env_var, dir, run_for, &[])
}

/// As [`run_and_kill`], with more environment variables for the child (e.g.
/// `OMNIBUS_WRITE_MODE`).
pub fn run_and_kill_with(
    child_test: &str,
    env_var: &str,
    dir: &Path,
    run_for: Duration,
    extra_env: &[(&str, &str)],
) -> Vec<(usize, String)> {
    let exe = std::env::current_exe().expect("test binary path");
    let mut child = children::spawn(
        Command::new(exe)
            .args(["--exact", child_test, "--nocapture", "--test-threads=1"])
            .envs(extra_env.iter().copied())
            .env(env_var, dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null()),
    )
    .expect("spawn child");
    let lines = children::ChildLines::read(child.stdout.take().expect("child stdout"));
    lines.wait_until_running();
    std::thread::sleep(run_for);
    child.kill().expect("SIGKILL");
    child.wait().expect("reap child");
    lines
        .finish()
        .into_iter()
        .filter_map(|l| {
            let (i, k) = l.split_once(' ')?;
            Some((i.parse::<usize>().ok()?, k.to_string()))
        })
        .filter(|(_, k)| k.len() == 16)
        .collect()
}
