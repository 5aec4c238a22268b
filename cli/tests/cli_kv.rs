//! `omnibus get / put / delete / scan / stat / check`: escaping of keys and values, exit codes,
//! `--help` everywhere, and `check` naming the storage, file and page of a corruption (exit 2).
//! `put` creates a branch storage only with `--create`; `put` and `delete` print JSON with
//! `--json`; a database path that is a file, or a database held open elsewhere, is an input
//! error (exit 1) whose message names the path once. `stat` names the journal I/O path and why,
//! writes nothing into the database, and names an ignored `OMNIBUS_JOURNAL_IO`.

use serde_json::Value;

use crate::common::children;
use crate::common::cli as cli_common;
use cli_common::{ok, omnibus};

fn code(args: &[&str]) -> (Option<i32>, String) {
    let o = omnibus(args);
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn put_get_delete_scan_with_escapes() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let db = db.to_str().unwrap();
    ok(&["put", db, "plain", "value one"]);
    ok(&["put", db, "tab\\tkey", "line\\nbreak\\\\slash"]);
    ok(&["put", db, "bin\\x00\\xff", "\\x01\\x7f"]);
    ok(&["put", db, "--storage", "idx", "--create", "Zürich", "ok"]);
    // stdout is a pipe here: the raw value, no newline added.
    assert_eq!(ok(&["get", db, "plain"]), "value one");
    assert_eq!(ok(&["get", db, "tab\\tkey"]), "line\nbreak\\slash");
    let o = omnibus(&["get", db, "bin\\x00\\xff"]);
    assert_eq!(o.stdout, b"\x01\x7f");
    let scan = ok(&["scan", db]);
    assert_eq!(
        scan,
        "bin\\x00\\xff\t\\x01\\x7f\nplain\tvalue one\ntab\\tkey\tline\\nbreak\\\\slash\n"
    );
    assert_eq!(ok(&["scan", db, "--prefix", "p"]), "plain\tvalue one\n");
    assert_eq!(ok(&["scan", db, "--limit", "1"]).lines().count(), 1);
    assert_eq!(ok(&["scan", db, "--limit", "0"]), "");
    assert_eq!(ok(&["scan", db, "--storage", "idx"]), "Zürich\tok\n");
    let j: Value = serde_json::from_str(ok(&["get", db, "plain", "--json"]).trim()).unwrap();
    assert_eq!(j["value"], "value one");
    let lines: Vec<Value> = ok(&["scan", db, "--json"])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    // Not UTF-8: hex, and a field saying so.
    assert_eq!(lines[0]["key"], "62696e00ff");
    assert_eq!(lines[0]["key_encoding"], "hex");

    assert_eq!(ok(&["delete", db, "plain"]), "deleted\n");
    let (c, err) = code(&["delete", db, "plain"]);
    assert_eq!((c, err.as_str()), (Some(1), "omnibus: plain: not found\n"));
    let j: Value = serde_json::from_str(ok(&["delete", db, "tab\\tkey", "--json"]).trim()).unwrap();
    assert_eq!(j["deleted"], true);
    assert_eq!(ok(&["scan", db]).lines().count(), 1);

    // Not found, missing storage, bad escape, missing database: exit 1 with a message.
    for args in [
        vec!["get", db, "plain"],
        vec!["get", db, "--storage", "nope", "k"],
        vec!["scan", db, "--storage", "nope"],
        vec!["get", db, "bad\\q"],
        vec!["put", db, "k", "\\x4"],
        vec!["stat", "/nonexistent/omnibus-db"],
        vec!["check", "/nonexistent/omnibus-db"],
        vec!["get", db],
    ] {
        let (c, err) = code(&args);
        assert_eq!(c, Some(1), "{args:?}: {err}");
        assert!(
            err.starts_with("omnibus: ") || err.contains("error:"),
            "{args:?}: {err}"
        );
    }

    let st: Value = serde_json::from_str(&ok(&["stat", db, "--json"])).unwrap();
    let names: Vec<&str> = st["storages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["(root)", "idx"]);
    let text = ok(&["stat", db]);
    for word in [
        "txn",
        "entries",
        "pages",
        "allocated",
        "journals",
        "fdatasyncs",
    ] {
        assert!(text.contains(word), "{word}: {text}");
    }
    assert!(ok(&["check", db]).contains("(root): ok"));
}

#[test]
fn help_everywhere() {
    for args in [
        vec!["--help"],
        vec!["ingest", "--help"],
        vec!["get", "--help"],
        vec!["put", "--help"],
        vec!["delete", "--help"],
        vec!["scan", "--help"],
        vec!["stat", "--help"],
        vec!["check", "--help"],
        vec!["bench", "--help"],
        vec!["bench", "shop", "--help"],
        vec!["--version"],
    ] {
        let out = ok(&args);
        assert!(!out.is_empty(), "{args:?}");
    }
    let ingest = ok(&["ingest", "--help"]);
    for doc in [
        "not valid UTF-8",
        "not JSON",
        "not a JSON object",
        "longer than the line limit",
        "value limit",
        "--on-error",
    ] {
        assert!(ingest.contains(doc), "ingest --help documents {doc:?}");
    }
}

#[test]
fn check_names_storage_file_and_page_of_a_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let dbs = db.to_str().unwrap();
    let input = dir.path().join("in.jsonl");
    let body: String = (0..400)
        .map(|i| {
            format!(
                "{{\"id\":\"d{i:04}\",\"tag\":\"t{}\",\"pad\":\"{}\"}}\n",
                i % 7,
                "p".repeat(200)
            )
        })
        .collect();
    std::fs::write(&input, body).unwrap();
    ok(&[
        "ingest",
        dbs,
        "--input",
        input.to_str().unwrap(),
        "--id-field",
        "id",
        "--index",
        "tag",
    ]);
    assert!(omnibus(&["check", dbs]).status.success());

    // Damage every page of the `tag` index past the two header pages.
    let data = db.join("Indexes").join("tag").join("data.pages");
    let mut bytes = std::fs::read(&data).unwrap();
    let pages = bytes.len() / 8192;
    assert!(pages > 2);
    for p in 2..pages {
        for b in &mut bytes[p * 8192 + 100..p * 8192 + 140] {
            *b ^= 0x5a;
        }
    }
    std::fs::write(&data, &bytes).unwrap();
    let (c, err) = code(&["check", dbs]);
    assert_eq!(c, Some(2), "{err}");
    assert!(err.contains("storage `tag`"), "names the storage: {err}");
    assert!(err.contains("data.pages"), "names the file: {err}");
    assert!(err.contains("page "), "names the page: {err}");

    // A storage that does not open at all (both header pages damaged) is named, and its error
    // is printed once (not again as the database's own open error).
    for slot in 0..2 {
        for b in &mut bytes[slot * 8192 + 100..slot * 8192 + 140] {
            *b ^= 0x5a;
        }
    }
    std::fs::write(&data, &bytes).unwrap();
    let (c, err) = code(&["check", dbs]);
    assert_eq!(c, Some(2), "{err}");
    assert!(err.contains("storage `tag`"), "names the storage: {err}");
    assert_eq!(
        err.matches("both header pages fail").count(),
        1,
        "the open error is printed once: {err}"
    );
}

/// Storage names from `stat --json`.
fn storages(db: &str) -> Vec<String> {
    let st: Value = serde_json::from_str(&ok(&["stat", db, "--json"])).unwrap();
    st["storages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn put_creates_a_storage_only_with_create() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let db = db.to_str().unwrap();
    ok(&["put", db, "k", "root"]);

    // An unknown storage is refused and nothing is created.
    let (c, err) = code(&["put", db, "--storage", "idx", "k", "v"]);
    assert_eq!(c, Some(1), "{err}");
    assert_eq!(
        err,
        format!("omnibus: {db}: no storage `idx` (storages: none besides the root); `put --create` creates it\n")
    );
    assert_eq!(storages(db), ["(root)"]);

    ok(&["put", db, "--storage", "idx", "--create", "k", "v"]);
    assert_eq!(ok(&["get", db, "--storage", "idx", "k"]), "v");
    // Once it exists, --create is not needed.
    ok(&["put", db, "--storage", "idx", "k2", "v2"]);

    // A typo lists the storages there are, for put and for delete.
    let (c, err) = code(&["put", db, "--storage", "idxx", "k", "v"]);
    assert_eq!(c, Some(1), "{err}");
    assert!(
        err.contains("no storage `idxx` (storages: `idx`); `put --create` creates it"),
        "{err}"
    );
    let (c, err) = code(&["delete", db, "--storage", "idxx", "k"]);
    assert_eq!(c, Some(1), "{err}");
    assert!(err.contains("no storage `idxx` (storages: `idx`)"), "{err}");
    assert_eq!(storages(db), ["(root)", "idx"]);

    // No database there: neither the database nor the storage is made without --create.
    let fresh = dir.path().join("fresh");
    let fresh = fresh.to_str().unwrap();
    let (c, err) = code(&["put", fresh, "--storage", "idx", "k", "v"]);
    assert_eq!(c, Some(1), "{err}");
    assert!(
        err.contains("no database there, so no storage `idx`; `put --create` creates both"),
        "{err}"
    );
    assert!(!std::path::Path::new(fresh).exists());
    ok(&["put", fresh, "--storage", "idx", "--create", "k", "v"]);
    assert_eq!(storages(fresh), ["(root)", "idx"]);

    // --create means nothing without --storage: a usage error.
    let (c, err) = code(&["put", db, "--create", "k", "v"]);
    assert_eq!(c, Some(1), "{err}");
    assert!(err.contains("--storage"), "{err}");
}

#[test]
fn put_and_delete_json() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let db = db.to_str().unwrap();
    let json = |args: &[&str]| -> Value { serde_json::from_str(ok(args).trim()).unwrap() };

    let j = json(&["put", db, "a\\tb", "value", "--json"]);
    assert_eq!(
        j,
        serde_json::json!({
            "storage": "(root)", "key": "a\\tb", "value_bytes": 5,
            "replaced": false, "storage_created": false
        })
    );
    assert_eq!(
        json(&["put", db, "a\\tb", "v2", "--json"])["replaced"],
        true
    );
    // The first put creates the storage; the second finds both storage and key.
    for first in [true, false] {
        let j = json(&[
            "put",
            db,
            "--storage",
            "idx",
            "--create",
            "k",
            "v",
            "--json",
        ]);
        assert_eq!(j["storage"], "idx");
        assert_eq!(j["storage_created"], first);
        assert_eq!(j["replaced"], !first);
    }

    let j = json(&["delete", db, "a\\tb", "--json"]);
    assert_eq!(
        j,
        serde_json::json!({ "storage": "(root)", "key": "a\\tb", "deleted": true })
    );
    // A missing key: the JSON says so and the exit code is 1, as for `get`.
    let o = omnibus(&["delete", db, "a\\tb", "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["deleted"], false);
    let j = json(&["delete", db, "--storage", "idx", "k", "--json"]);
    assert_eq!(
        j,
        serde_json::json!({ "storage": "idx", "key": "k", "deleted": true })
    );
    // Without --json put prints nothing.
    assert_eq!(ok(&["put", db, "x", "y"]), "");
}

#[test]
fn db_path_that_is_a_file_is_an_input_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, b"not a database").unwrap();
    let f = file.to_str().unwrap();
    let under = file.join("db");
    let under = under.to_str().unwrap();
    for (args, msg) in [
        (vec!["put", f, "k", "v"], format!("{f}: not a directory")),
        (vec!["delete", f, "k"], format!("{f}: not a directory")),
        (vec!["get", f, "k"], format!("{f}: not a directory")),
        (vec!["scan", f], format!("{f}: not a directory")),
        (vec!["stat", f], format!("{f}: not a directory")),
        (vec!["check", f], format!("{f}: not a directory")),
        (
            vec!["put", under, "k", "v"],
            format!("{under}: a component of the path is not a directory"),
        ),
    ] {
        let (c, err) = code(&args);
        assert_eq!(c, Some(1), "{args:?}: {err}");
        assert!(
            err.starts_with(&format!("omnibus: {msg}")),
            "{args:?}: {err}"
        );
    }
    assert_eq!(std::fs::read(&file).unwrap(), b"not a database");
}

#[test]
fn a_database_open_elsewhere_is_named_once() {
    let _no_children = children::no_children_meanwhile();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("c.db");
    let dbs = db.to_str().unwrap();
    ok(&["put", dbs, "k", "v"]);
    let held = omnibus::Database::open(&db, omnibus::Options::default()).unwrap();
    let want =
        format!("omnibus: {dbs}: already open (its LOCK file is held by a read-write opener)\n");
    for args in [vec!["put", dbs, "k", "v"], vec!["delete", dbs, "k"]] {
        let (c, err) = code(&args);
        assert_eq!(c, Some(1), "{args:?}: {err}");
        assert_eq!(err, want, "{args:?}");
    }
    // Reads go on beside the writer (reader slots in its LOCK).
    assert_eq!(ok(&["get", dbs, "k"]), "v");
    assert_eq!(ok(&["scan", dbs]), "k\tv\n");
    ok(&["stat", dbs]);
    ok(&["check", dbs]);
    held.close().unwrap();
    let o = cli_common::omnibus_after_close(&["get", dbs, "k"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "v", "{o:?}");
}

#[test]
fn get_reports_a_bad_key_like_put() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let db = db.to_str().unwrap();
    ok(&["put", db, "k", "v"]);
    let long = "k".repeat(1025);
    for (key, says) in [
        ("", "omnibus: key is empty: keys are 1..=1024 bytes\n"),
        (
            long.as_str(),
            "omnibus: key is 1025 bytes: the limit is 1024 bytes\n",
        ),
    ] {
        for cmd in ["get", "put", "delete"] {
            let mut args = vec![cmd, db, key];
            if cmd == "put" {
                args.push("v");
            }
            let (c, err) = code(&args);
            assert_eq!(c, Some(1), "{cmd}: {err}");
            assert_eq!(err, says, "{cmd}");
        }
    }
    // At the limit it is an ordinary lookup.
    let max = "k".repeat(1024);
    let (c, err) = code(&["get", db, &max]);
    assert_eq!(c, Some(1), "{err}");
    assert!(err.ends_with(": not found\n"), "{err}");
}

#[test]
fn stat_names_the_journal_io_path_writes_nothing_and_names_an_ignored_override() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let dbs = db.to_str().unwrap();
    ok(&["put", dbs, "k", "v"]);
    let journals = |p: &std::path::Path| {
        let mut v: Vec<String> = std::fs::read_dir(p.join("Journals"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let before = journals(&db);
    let st: Value = serde_json::from_str(&ok(&["stat", dbs, "--json"])).unwrap();
    let reason = st["journal_io"]["reason"].as_str().unwrap();
    assert!(!reason.is_empty(), "{st}");
    assert!(ok(&["stat", dbs]).contains("journal io "));
    // Regression: `stat` ran the journal's probe in the database's `Journals/` (a read-only
    // command writing into the database).
    assert_eq!(journals(&db), before, "stat wrote into Journals/");
    // Regression: an invalid value was only a warning on stderr; the reason did not say it.
    let o = children::output(
        std::process::Command::new(env!("CARGO_BIN_EXE_omnibus"))
            .args(["stat", dbs, "--json"])
            .env("OMNIBUS_JOURNAL_IO", "uring"),
    )
    .unwrap();
    assert!(o.status.success());
    let st: Value = serde_json::from_slice(&o.stdout).unwrap();
    let reason = st["journal_io"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("OMNIBUS_JOURNAL_IO=\"uring\" ignored"),
        "{reason}"
    );
    // A valid one is named as the reason.
    let o = children::output(
        std::process::Command::new(env!("CARGO_BIN_EXE_omnibus"))
            .args(["stat", dbs, "--json"])
            .env("OMNIBUS_JOURNAL_IO", "syscalls"),
    )
    .unwrap();
    let st: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(st["journal_io"]["path"], "syscalls", "{st}");
    assert!(
        st["journal_io"]["reason"]
            .as_str()
            .unwrap()
            .contains("OMNIBUS_JOURNAL_IO"),
        "{st}"
    );
}
