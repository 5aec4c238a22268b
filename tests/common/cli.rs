//! Shared by the command-line tests: run the `omnibus` binary built for this test run.

use std::process::{Command, Output};

/// Runs `omnibus args...` and returns its output (any exit code).
pub fn omnibus(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_omnibus"))
        .args(args)
        .output()
        .expect("run omnibus")
}

/// Runs `omnibus args...`, asserts it succeeded, and returns its stdout.
#[allow(dead_code)] // not every command-line test needs it
pub fn ok(args: &[&str]) -> String {
    let o = omnibus(args);
    assert!(
        o.status.success(),
        "omnibus {args:?} failed: {:?}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).expect("utf-8 output")
}
