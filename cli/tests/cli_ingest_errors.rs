//! `ingest`'s ends other than success: more than `--max-errors` bad lines stops the run (exit
//! 1, a summary, what came before committed); an input of nothing but bad lines exits 1.

use serde_json::Value;

use crate::common::cli as cli_common;
use cli_common::{ok, omnibus};

#[test]
fn max_errors_and_nothing_stored_exit_1_with_a_summary() {
    // Regression: a wrong file (every line bad) skipped line after line,
    // stored nothing and exited 0, and a failing run printed no summary of what it stored.
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    // 3 good documents, then 5 bad lines, then a good one never reached.
    let mut text = String::new();
    for i in 0..3 {
        text.push_str(&format!("{{\"id\":\"d{i}\",\"tag\":\"t\"}}\n"));
    }
    for _ in 0..5 {
        text.push_str("not json\n");
    }
    text.push_str("{\"id\":\"late\",\"tag\":\"t\"}\n");
    std::fs::write(&input, text).unwrap();
    let db = dir.path().join("db");
    let (dbs, ins) = (db.to_str().unwrap(), input.to_str().unwrap());
    let o = omnibus(&[
        "ingest",
        dbs,
        "--input",
        ins,
        "--id-field",
        "id",
        "--index",
        "tag",
        "--max-errors",
        "2",
        "--json",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("more than 2 bad lines"), "{err}");
    let s: Value = serde_json::from_slice(&o.stdout).expect("a JSON summary on stdout");
    assert_eq!(s["documents"], 3, "{s}");
    assert_eq!(s["bad_lines"], 3, "{s}");
    assert_eq!(s["aborted_at_line"], 6, "{s}");
    assert!(
        s["stopped"].as_str().unwrap().contains("--max-errors"),
        "{s}"
    );
    // Stopped before the last line; the documents before are stored and indexed.
    assert_eq!(s["indexes"][0]["entries"], 3, "{s}");
    assert_eq!(ok(&["scan", dbs]).lines().count(), 3);

    // Within the limit (the default, 100): skipped, exit 0.
    let db2 = dir.path().join("db2");
    let o = omnibus(&[
        "ingest",
        db2.to_str().unwrap(),
        "--input",
        ins,
        "--id-field",
        "id",
    ]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );

    // Nothing but bad lines: nothing stored, exit 1, and the text summary says so.
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "[1]\nnope\n\n").unwrap();
    let db3 = dir.path().join("db3");
    let o = omnibus(&[
        "ingest",
        db3.to_str().unwrap(),
        "--input",
        bad.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("nothing stored: all 2 non-blank input lines were bad"),
        "{err}"
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("documents        0 (0 stored, 0 unchanged; 2 bad lines"),
        "{out}"
    );

    // An empty input is not a failure.
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "\n").unwrap();
    let db4 = dir.path().join("db4");
    let o = omnibus(&[
        "ingest",
        db4.to_str().unwrap(),
        "--input",
        empty.to_str().unwrap(),
    ]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
