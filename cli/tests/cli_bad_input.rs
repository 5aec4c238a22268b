//! `omnibus ingest` of malformed lines: not JSON, a JSON array, a truncated line, invalid UTF-8,
//! a 100 MiB line, a missing id, a document over the value limit. Each gives its documented
//! error with its line number; `--on-error skip` goes on (exit 0), `--on-error abort` stops
//! (exit 1) with everything before the bad line committed and indexed. A database path that is
//! a file is an input error too.

use std::io::Write;
use std::path::Path;
use std::process::Output;

use crate::common::children;
use crate::common::cli as cli_common;
use cli_common::omnibus;

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Keys of a storage, from `scan`.
fn keys(db: &str, storage: Option<&str>) -> Vec<String> {
    let mut args = vec!["scan", db];
    if let Some(s) = storage {
        args.extend(["--storage", s]);
    }
    let o = omnibus(&args);
    assert!(o.status.success(), "scan: {}", stderr(&o));
    String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| l.split('\t').next().unwrap().to_string())
        .collect()
}

fn ingest(db: &str, input: &Path, extra: &[&str]) -> Output {
    cli_common::ingest_v(db, input, extra)
}

const GOOD_A: &[u8] = b"{\"id\":\"a\",\"v\":1}\n";
const GOOD_B: &[u8] = b"{\"id\":\"b\",\"v\":2}\n";
const GOOD_Z: &[u8] = b"{\"id\":\"z\",\"v\":26}\n";

/// Each bad line (as line 3, after two good ones) and the error it must give.
fn cases() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    vec![
        (
            "not json",
            b"not json\n".to_vec(),
            "line 3: not JSON: expected ident at column 2",
        ),
        (
            "array",
            b"[1,2,3]\n".to_vec(),
            "line 3: not a JSON object (an array)",
        ),
        (
            "truncated",
            b"{\"id\":\"t\",\"v\":\n".to_vec(),
            "line 3: not JSON: EOF while parsing",
        ),
        (
            "utf-8",
            b"{\"id\":\"u\",\"v\":\"\xff\xfe\"}\n".to_vec(),
            "line 3: not valid UTF-8 (byte offset 15)",
        ),
        ("no id", b"{\"v\":3}\n".to_vec(), "line 3: no id field `id`"),
        // An `"id": null` line was reported as "no id field", which sends a reader looking
        // for a misspelt field name: the field is there, its value is the problem.
        (
            "null id",
            b"{\"id\":null,\"v\":3}\n".to_vec(),
            "line 3: id field `id` is not a string or a number (null)",
        ),
        (
            "long id",
            format!("{{\"id\":\"{}\"}}\n", "k".repeat(2000)).into_bytes(),
            "line 3: id is 2000 bytes: keys are 1..=1024 bytes",
        ),
    ]
}

#[test]
fn each_bad_line_skips_or_aborts_with_its_line_number() {
    let dir = tempfile::tempdir().unwrap();
    for (name, bad, msg) in cases() {
        let input = dir.path().join(format!("{}.jsonl", name.replace(' ', "_")));
        std::fs::write(&input, [GOOD_A, GOOD_B, &bad, GOOD_Z].concat()).unwrap();

        let db = dir.path().join(format!("skip-{}", name.replace(' ', "_")));
        let db = db.to_str().unwrap();
        let o = ingest(db, &input, &["--on-error", "skip"]);
        assert_eq!(o.status.code(), Some(0), "{name}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(msg),
            "{name}: expected {msg:?} in {}",
            stderr(&o)
        );
        assert!(stderr(&o).contains("(skipped)"), "{name}");
        assert_eq!(keys(db, None), ["a", "b", "z"], "{name}");
        assert_eq!(keys(db, Some("v")).len(), 3, "{name}");

        let db = dir.path().join(format!("abort-{}", name.replace(' ', "_")));
        let db = db.to_str().unwrap();
        let o = ingest(db, &input, &["--on-error", "abort"]);
        assert_eq!(o.status.code(), Some(1), "{name}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(msg),
            "{name}: expected {msg:?} in {}",
            stderr(&o)
        );
        assert!(
            stderr(&o).contains("aborted at line 3"),
            "{name}: {}",
            stderr(&o)
        );
        // Everything before the bad line is committed and indexed.
        assert_eq!(keys(db, None), ["a", "b"], "{name}");
        assert_eq!(keys(db, Some("v")), ["1\\x00a", "2\\x00b"], "{name}");
        assert!(omnibus(&["check", db]).status.success(), "{name}");
    }
}

/// A 100 MiB line is passed over under the line limit (not held in memory) and reported; the
/// same line under a raised limit but over the value limit (128 MiB) is reported as such.
#[test]
fn huge_lines() {
    let dir = tempfile::tempdir().unwrap();
    let write_big = |path: &Path, len: usize| {
        let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
        f.write_all(GOOD_A).unwrap();
        f.write_all(GOOD_B).unwrap();
        f.write_all(b"{\"id\":\"big\",\"v\":\"").unwrap();
        let chunk = vec![b'x'; 1 << 20];
        let mut left = len;
        while left > 0 {
            let n = left.min(chunk.len());
            f.write_all(&chunk[..n]).unwrap();
            left -= n;
        }
        f.write_all(b"\"}\n").unwrap();
        f.write_all(GOOD_Z).unwrap();
        f.flush().unwrap();
    };
    let input = dir.path().join("100mib.jsonl");
    write_big(&input, 100 << 20);
    let line_len = (100 << 20) + 19;

    let db = dir.path().join("skip");
    let o = ingest(db.to_str().unwrap(), &input, &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let want = format!("line 3: longer than the line limit of 16777216 bytes ({line_len} bytes; see --max-line-bytes) (skipped)");
    assert!(
        stderr(&o).contains(&want),
        "expected {want:?} in {}",
        stderr(&o)
    );
    assert_eq!(keys(db.to_str().unwrap(), None), ["a", "b", "z"]);

    let db = dir.path().join("abort");
    let o = ingest(db.to_str().unwrap(), &input, &["--on-error", "abort"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("line 3: longer than the line limit"),
        "{}",
        stderr(&o)
    );
    assert_eq!(keys(db.to_str().unwrap(), None), ["a", "b"]);
    std::fs::remove_file(&input).unwrap();

    // Over the value limit: 129 MiB under a 256 MiB line limit.
    let input = dir.path().join("129mib.jsonl");
    write_big(&input, 129 << 20);
    let db = dir.path().join("value-limit");
    let o = ingest(
        db.to_str().unwrap(),
        &input,
        &["--max-line-bytes", "268435456"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let want = format!(
        "line 3: document is {} bytes: the value limit is 134217728 bytes",
        (129 << 20) + 19
    );
    assert!(
        stderr(&o).contains(&want),
        "expected {want:?} in {}",
        stderr(&o)
    );
    assert_eq!(keys(db.to_str().unwrap(), None), ["a", "b", "z"]);
}

#[test]
fn usage_errors_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let db = db.to_str().unwrap();
    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, GOOD_A).unwrap();
    let input = input.to_str().unwrap();
    for args in [
        vec!["ingest", db],
        vec!["ingest", db, "--input", "/nonexistent/file.jsonl"],
        vec!["ingest", db, "--input", input, "--index", ""],
        vec!["ingest", db, "--input", input, "--index", "a,,b"],
        vec!["ingest", db, "--input", input, "--index", "a/b"],
        vec!["ingest", db, "--input", input, "--on-error", "maybe"],
        vec!["ingest", db, "--input", input, "--journal", "both"],
        vec!["no-such-command"],
    ] {
        let o = omnibus(&args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
        assert!(!stderr(&o).is_empty(), "{args:?}");
    }
}

#[test]
fn ingest_into_a_file_is_an_input_error() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, GOOD_A).unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, b"not a database").unwrap();
    let f = file.to_str().unwrap();
    let o = omnibus(&["ingest", f, "--input", input.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_eq!(
        stderr(&o),
        format!("omnibus: {f}: not a directory (a database is a directory)\n")
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"not a database");
}

#[test]
fn input_that_is_a_directory_is_an_input_error() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let input = dir.path().join("in");
    std::fs::create_dir(&input).unwrap();
    let o = ingest(db.to_str().unwrap(), &input, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_eq!(
        stderr(&o),
        format!(
            "omnibus: --input {}: is a directory (give a JSON Lines file, or - for standard input)\n",
            input.display()
        )
    );
    assert!(!db.exists(), "no database is made for a bad --input");
}

// Regression: an invalid OMNIBUS_WRITE_MODE was silently ignored (the
// library's warning goes to `tracing`, which the command line does not print), so a user who
// typed `MMAP` believed mmap was in use.
#[test]
fn an_invalid_write_mode_variable_is_named_on_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let db = db.to_str().unwrap();
    let o = children::output(
        std::process::Command::new(env!("CARGO_BIN_EXE_omnibus"))
            .args(["put", db, "k", "v"])
            .env("OMNIBUS_WRITE_MODE", "MMAP"),
    )
    .unwrap();
    assert!(o.status.success(), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("OMNIBUS_WRITE_MODE=\"MMAP\"") && err.contains("ignored"),
        "{err}"
    );
    let o = children::output(
        std::process::Command::new(env!("CARGO_BIN_EXE_omnibus"))
            .args(["stat", db])
            .env("OMNIBUS_WRITE_MODE", "mmap"),
    )
    .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("write mode mmap (mmap by OMNIBUS_WRITE_MODE)"),
        "{out}"
    );
}
