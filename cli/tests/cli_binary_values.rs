//! Binary values through the command line: `put` from standard input (`-`, `--value-file -`)
//! and from a file (`--value-file PATH`), `get` through a pipe byte-exact, `scan --json`
//! parseable by a JSON parser with non-UTF-8 bytes in hex.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::common::children;
use crate::common::cli as cli_common;
use cli_common::ok;

/// A PNG-like value: the PNG signature (with its `\r\n`, `\x1a` and `\n`), a NUL, a 0xff,
/// and a trailing newline of its own.
const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe\n";

/// Runs `omnibus args...` with `stdin` on its standard input; asserts success.
fn with_stdin(args: &[&str], stdin: &[u8]) {
    let mut c = children::spawn(
        Command::new(env!("CARGO_BIN_EXE_omnibus"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )
    .expect("run omnibus");
    c.stdin.take().unwrap().write_all(stdin).unwrap();
    let o = c.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "omnibus {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn get_raw(db: &str, key: &str) -> Vec<u8> {
    let o = cli_common::omnibus(&["get", db, key]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    o.stdout
}

#[test]
fn binary_values_round_trip_through_pipes_and_json() {
    // Regression: `get db img > img.png` appended a newline to the value,
    // corrupting every binary file taken out that way; `put` could only take the value as
    // an escaped argument; and `scan --json` put the text escapes (`\xff`) inside JSON
    // strings, so a consumer could not tell them from those four characters.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let db = db.to_str().unwrap();
    let file = dir.path().join("img.png");
    std::fs::write(&file, PNG).unwrap();

    with_stdin(&["put", db, "stdin", "-"], PNG);
    with_stdin(&["put", db, "stdin2", "--value-file", "-"], PNG);
    ok(&["put", db, "file", "--value-file", file.to_str().unwrap()]);
    ok(&["put", db, "text", "caf\u{e9}"]);
    // A one-byte value `-` is still possible, escaped.
    ok(&["put", db, "dash", "\\x2d"]);

    // The command's stdout is a pipe: exactly the stored bytes, nothing added.
    for k in ["stdin", "stdin2", "file"] {
        assert_eq!(get_raw(db, k), PNG, "{k}");
    }
    assert_eq!(get_raw(db, "dash"), b"-");

    // A missing --value-file is an input error and creates nothing.
    let o = cli_common::omnibus(&["put", db, "x", "--value-file", "/nonexistent/v"]);
    assert_eq!(o.status.code(), Some(1));

    let lines: Vec<Value> = ok(&["scan", db, "--json"])
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    let hex: String = PNG.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(lines.len(), 5);
    for l in &lines {
        assert!(l.get("key_encoding").is_none(), "{l}");
        match l["key"].as_str().unwrap() {
            "dash" => assert_eq!(l["value"], "-"),
            "text" => {
                assert_eq!(l["value"], "caf\u{e9}");
                assert!(l.get("value_encoding").is_none(), "{l}");
            }
            _ => {
                assert_eq!(l["value"], hex.as_str(), "{l}");
                assert_eq!(l["value_encoding"], "hex", "{l}");
            }
        }
    }
    let j: Value = serde_json::from_str(&ok(&["get", db, "file", "--json"])).unwrap();
    assert_eq!(
        (j["value"].as_str(), j["value_encoding"].as_str()),
        (Some(hex.as_str()), Some("hex"))
    );
}
