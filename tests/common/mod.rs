//! Shared by the real-crash tests: run this test binary again as a child that writes and
//! prints `storage key` for each acknowledged write, kill it with SIGKILL, collect what it
//! acknowledged.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Starts `child_test` of the current test binary with `env_var` set to `dir`, lets it run for
/// `run_for`, kills it with SIGKILL, and returns the `(storage index, key)` lines it printed
/// (keys of 16 characters; other output is ignored).
#[allow(dead_code)] // not every crash test uses it
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
    let mut child = Command::new(exe)
        .args(["--exact", child_test, "--nocapture", "--test-threads=1"])
        .envs(extra_env.iter().copied())
        .env(env_var, dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("child stdout");
    let reader = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(|l| l.ok())
            .filter_map(|l| {
                let (i, k) = l.split_once(' ')?;
                Some((i.parse::<usize>().ok()?, k.to_string()))
            })
            .filter(|(_, k)| k.len() == 16)
            .collect::<Vec<_>>()
    });
    std::thread::sleep(run_for);
    child.kill().expect("SIGKILL");
    child.wait().expect("reap child");
    reader.join().expect("reader thread")
}
