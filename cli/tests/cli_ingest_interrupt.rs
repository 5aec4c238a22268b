//! Ctrl-C during `ingest`: the documents read are committed, the indexes brought up to date,
//! the summary printed, and the exit code is 130.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::common::children;
use crate::common::cli as cli_common;
use cli_common::ok;

#[test]
fn sigint_stops_the_ingest_with_indexes_current_and_a_summary() {
    // Regression: Ctrl-C on a long ingest killed it with no summary, so
    // the user could not tell what was stored, and the indexes were left behind the
    // documents until the next `ingest --index`.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let mut child = children::spawn(
        Command::new(env!("CARGO_BIN_EXE_omnibus"))
            .args(["--log-level", "debug", "ingest"])
            .arg(&db)
            .args([
                "--input",
                "-",
                "--id-field",
                "id",
                "--index",
                "tag",
                "--json",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )
    .expect("run omnibus");
    let mut stdin = child.stdin.take().unwrap();
    for i in 0..200 {
        writeln!(stdin, "{{\"id\":\"d{i:04}\",\"tag\":\"t{}\"}}", i % 7).unwrap();
    }
    stdin.flush().unwrap();
    // Standard input stays open: the ingest waits for more. The index's first batch (a debug
    // event) means documents were stored, so the dispatcher (and its Ctrl-C handler) runs.
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut log = String::new();
    loop {
        let mut line = String::new();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "ingest ended early: {log}"
        );
        log.push_str(&line);
        if line.contains("index batch") {
            break;
        }
    }
    // SAFETY: kill(2) on our own child's pid with a valid signal.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    stderr.read_to_string(&mut log).unwrap();
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let status = child.wait().unwrap();
    drop(stdin);
    assert_eq!(status.code(), Some(130), "{log}");
    assert!(log.contains("omnibus: interrupted after line"), "{log}");
    let s: Value = serde_json::from_str(out.trim()).expect("a JSON summary");
    let docs = s["documents"].as_u64().unwrap();
    assert!(docs > 0, "{s}");
    assert!(
        s["stopped"].as_str().unwrap().contains("interrupted"),
        "{s}"
    );
    assert_eq!(s["root_entries"], docs, "{s}");
    // The index caught up with every document stored before the summary.
    assert_eq!(s["indexes"][0]["entries"], docs, "{s}");

    let db = db.to_str().unwrap();
    assert_eq!(ok(&["scan", db]).lines().count() as u64, docs);
    let check = ok(&["check", db]);
    assert!(check.contains("index `tag`: ok"), "{check}");
}
