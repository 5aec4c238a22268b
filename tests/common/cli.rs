//! Shared by the command-line tests (the `cli` binary of the `omnibus-cli` package,
//! `cli/tests/`): run the `omnibus` binary built for this test run. Cargo sets
//! `CARGO_BIN_EXE_omnibus` for that package's tests only; the other binaries mount this module
//! with the rest of `common` and never call it.

use std::process::{Command, Output};

use super::children;

/// Runs `omnibus args...` and returns its output (any exit code).
pub fn omnibus(args: &[&str]) -> Output {
    // `env!` would not compile in the other binaries, which mount this module without calling it.
    #[allow(clippy::option_env_unwrap)]
    let bin = option_env!("CARGO_BIN_EXE_omnibus")
        .expect("the omnibus binary is built for the omnibus-cli package's tests only");
    children::output(Command::new(bin).args(args)).expect("run omnibus")
}

/// Runs `omnibus args...` on a database or storage this test process has just closed: again
/// (every 20 ms, at most 2 s) while it answers "already open".
///
/// Why: the LOCK is a `flock` on an open file description, which a child process shares from
/// its fork until its exec closes the descriptor (O_CLOEXEC). When another test of the same
/// binary spawns a process at that moment, the child holds the closed database's lock for that
/// instant (`cli/tests/cli_kv.rs` saw it 2 times in 13 runs with tests in parallel, never
/// with one test thread). The gate of `common::children` now keeps other tests' children from
/// starting while a test that opens storages here runs, so this retry should no longer fire;
/// it stays, harmless.
#[allow(dead_code)] // not every command-line test needs it
pub fn omnibus_after_close(args: &[&str]) -> Output {
    let mut o = omnibus(args);
    for _ in 0..100 {
        if !String::from_utf8_lossy(&o.stderr).contains("already open") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        o = omnibus(args);
    }
    o
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

/// Writes `lines` (JSON documents with an `"id"` field) to a file beside `db` and runs
/// `omnibus ingest DB --input FILE --id-field id --index SPEC...`, asserting it succeeded.
#[allow(dead_code)] // not every command-line test needs it
pub fn ingest_lines(db: &std::path::Path, lines: &[String], indexes: &[&str]) -> String {
    let input = db.with_extension("jsonl");
    std::fs::write(&input, lines.join("\n") + "\n").expect("write the input");
    let (db, input) = (
        db.to_str().expect("utf-8 path"),
        input.to_str().expect("utf-8 path"),
    );
    let mut args = vec!["ingest", db, "--input", input, "--id-field", "id"];
    for spec in indexes {
        args.extend(["--index", spec]);
    }
    ok(&args)
}

/// Runs `omnibus ingest DB --input INPUT --id-field id --index v` followed by `extra`, and
/// returns its output (any exit code).
#[allow(dead_code)] // not every command-line test needs it
pub fn ingest_v(db: &str, input: &std::path::Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "ingest",
        db,
        "--input",
        input.to_str().expect("utf-8 path"),
        "--id-field",
        "id",
        "--index",
        "v",
    ];
    args.extend(extra);
    omnibus(&args)
}
