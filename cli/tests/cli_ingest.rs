//! `omnibus ingest` of real data (tests/fixtures/cities_sample.jsonl, 3,000 GeoNames places,
//! CC BY 4.0, see tests/fixtures/README.md) with two indexes: document and index entry counts,
//! prefix scans, `check`, re-running without duplicates, a changed indexed field, a document
//! missing an indexed field, a database held open elsewhere (named once in the message).

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::common::children;
use crate::common::cli as cli_common;
use cli_common::{ok, omnibus};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/cities_sample.jsonl")
}

fn docs(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn present(d: &Value, f: &str) -> bool {
    !matches!(d.get(f), None | Some(Value::Null))
}

/// Entries per storage, from `stat --json`.
fn entries(db: &str) -> std::collections::BTreeMap<String, u64> {
    let v: Value = serde_json::from_str(&ok(&["stat", db, "--json"])).unwrap();
    v["storages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_string(),
                s["entries"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Document ids of a prefix scan of an index: each entry's key ends with 0x00 and the id (in
/// `scan`'s escapes), its value is empty.
fn scan_ids(db: &str, storage: &str, prefix: &str) -> Vec<String> {
    ok(&["scan", db, "--storage", storage, "--prefix", prefix])
        .lines()
        .map(|l| {
            let (k, v) = l.split_once('\t').unwrap();
            assert_eq!(v, "", "{l}");
            k.rsplit_once("\\x00").unwrap().1.to_string()
        })
        .collect()
}

/// Document ids of `scan --term T...` of an index (the entries of one term, or of the terms
/// whose leading fields are these).
fn term_ids(db: &str, storage: &str, terms: &[&str]) -> Vec<String> {
    let mut args = vec!["scan", db, "--storage", storage];
    for t in terms {
        args.extend(["--term", t]);
    }
    ok(&args)
        .lines()
        .map(|l| {
            l.split_once('\t')
                .unwrap()
                .0
                .rsplit_once("\\x00")
                .unwrap()
                .1
                .to_string()
        })
        .collect()
}

fn id(line: usize) -> String {
    format!("{line:012}")
}

#[test]
fn ingest_cities_with_two_indexes() {
    let dir = tempfile::tempdir().unwrap();
    let db_path = dir.path().join("cities.omnibus");
    let db = db_path.to_str().unwrap();
    let input = fixture();
    let all = docs(&input);
    assert_eq!(all.len(), 3000);

    let out = ok(&[
        "ingest",
        db,
        "--input",
        input.to_str().unwrap(),
        "--index",
        "country",
        "--index",
        "country,admin1",
        "--json",
    ]);
    let s: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(s["documents"], 3000);
    assert_eq!(s["stored"], 3000);
    assert_eq!(s["bad_lines"], 0);
    assert!(s["fdatasyncs"].as_u64().unwrap() > 0);

    let want_country = all.iter().filter(|d| present(d, "country")).count() as u64;
    let want_ca = all
        .iter()
        .filter(|d| present(d, "country") && present(d, "admin1"))
        .count() as u64;
    let e = entries(db);
    assert_eq!(e["(root)"], 3000);
    assert_eq!(e["country"], want_country);
    assert_eq!(e["country,admin1"], want_ca);

    // Prefix scans list exactly the documents with that value.
    let want_ad: Vec<String> = all
        .iter()
        .enumerate()
        .filter(|(_, d)| d["country"] == "AD")
        .map(|(i, _)| id(i + 1))
        .collect();
    assert!(!want_ad.is_empty());
    assert_eq!(scan_ids(db, "country", "AD"), want_ad);
    assert_eq!(scan_ids(db, "country", "AD\\x00"), want_ad);
    let scan = ok(&["scan", db, "--storage", "country", "--prefix", "AD"]);
    assert!(scan.lines().all(|l| l.starts_with("AD\\x00")), "{scan}");
    let want_ad03: Vec<String> = all
        .iter()
        .enumerate()
        .filter(|(_, d)| d["country"] == "AD" && d["admin1"] == "03")
        .map(|(i, _)| id(i + 1))
        .collect();
    // A compound term's fields are joined by 0x00, which the key holds escaped (01 01).
    assert_eq!(
        scan_ids(db, "country,admin1", "AD\\x01\\x0103\\x00"),
        want_ad03
    );
    assert_eq!(term_ids(db, "country,admin1", &["AD", "03"]), want_ad03);
    // The leading field alone: every AD document with an admin1 (in admin1 order).
    let mut leading = term_ids(db, "country,admin1", &["AD"]);
    leading.sort();
    let with_admin1: Vec<String> = all
        .iter()
        .enumerate()
        .filter(|(_, d)| d["country"] == "AD" && d["admin1"].is_string())
        .map(|(i, _)| id(i + 1))
        .collect();
    assert_eq!(leading, with_admin1);
    assert_eq!(term_ids(db, "country", &["AD"]), want_ad);
    assert_eq!(ok(&["scan", db, "--limit", "7"]).lines().count(), 7);

    // The root holds the lines as they were.
    let lines: Vec<String> = std::fs::read_to_string(&input)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(ok(&["get", db, &id(3)]).trim_end_matches('\n'), lines[2]);

    let check = omnibus(&["check", db]);
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    // Regression: `check` counted an index's applied-txn record as an entry,
    // one more than `stat` and `ingest` report. Every document has a country: as many entries.
    let text = String::from_utf8_lossy(&check.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("country: ok"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains(&format!("({} entries,", all.len())),
        "{line} ({} documents)",
        all.len()
    );

    // Re-running stores nothing new and rewrites nothing.
    let out = ok(&[
        "ingest",
        db,
        "--input",
        input.to_str().unwrap(),
        "--index",
        "country",
        "--index",
        "country,admin1",
        "--json",
    ]);
    let s: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(s["documents"], 3000);
    assert_eq!(s["stored"], 0);
    assert_eq!(s["unchanged"], 3000);
    assert_eq!(entries(db), e);

    // A changed indexed field moves the document in the index (the old entry is deleted).
    let changed = dir.path().join("changed.jsonl");
    let mut text = lines.clone();
    text[0] = text[0].replace("\"country\":\"AD\"", "\"country\":\"ZZ\"");
    assert!(text[0].contains("ZZ"));
    std::fs::write(&changed, text.join("\n") + "\n").unwrap();
    let out = ok(&[
        "ingest",
        db,
        "--input",
        changed.to_str().unwrap(),
        "--index",
        "country",
        "--index",
        "country,admin1",
        "--json",
    ]);
    let s: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(s["stored"], 1);
    assert_eq!(entries(db), e);
    assert_eq!(scan_ids(db, "country", "ZZ\\x00"), vec![id(1)]);
    assert_eq!(scan_ids(db, "country", "AD\\x00"), want_ad[1..].to_vec());
    assert_eq!(scan_ids(db, "country,admin1", "ZZ\\x01\\x01"), vec![id(1)]);
    assert!(omnibus(&["check", db]).status.success());

    // `put` works on the core database, outside the engine: it does not update the indexes, and
    // the next ingest that lists an index reconciles it (here with no input at all); an
    // unlisted index is left as it was.
    ok(&["put", db, &id(2), "{\"country\":\"QQ\",\"admin1\":\"01\"}"]);
    assert_eq!(scan_ids(db, "country", "QQ\\x00"), Vec::<String>::new());
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    let out = ok(&[
        "ingest",
        db,
        "--input",
        empty.to_str().unwrap(),
        "--index",
        "country",
        "--json",
    ]);
    let s: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(s["documents"], 0);
    assert_eq!(s["indexes"][0]["name"], "country");
    assert_eq!(s["indexes"][0]["reconciled"], true, "{s}");
    assert_eq!(scan_ids(db, "country", "QQ\\x00"), vec![id(2)]);
    assert_eq!(entries(db)["country"], e["country"]);
    assert_eq!(
        scan_ids(db, "country,admin1", "QQ\\x01\\x01"),
        Vec::<String>::new()
    );
    // `stat` shows each index's applied root txn: the reconciled one is at the root's last.
    let st: Value = serde_json::from_str(&ok(&["stat", db, "--json"])).unwrap();
    // The metrics of stat's own read-only open: it commits nothing.
    assert_eq!(st["metrics"]["commits"].as_u64(), Some(0), "{st}");
    assert_eq!(
        st["metrics"]["commit_us"]["count"].as_u64(),
        Some(0),
        "{st}"
    );
    assert!(st["metrics"]["flush_us"]["p99"].is_u64(), "{st}");
    let storages = st["storages"].as_array().unwrap();
    let root_txn = &storages[0]["last_committed_txn"];
    assert!(storages[0]["index_applied_txn"].is_null());
    let country = storages.iter().find(|s| s["name"] == "country").unwrap();
    assert_eq!(&country["index_applied_txn"], root_txn);
    let ca = storages
        .iter()
        .find(|s| s["name"] == "country,admin1")
        .unwrap();
    assert!(ca["index_applied_txn"].as_u64().unwrap() < root_txn.as_u64().unwrap());
}

#[test]
fn id_field_missing_index_fields_and_separate_journals() {
    let dir = tempfile::tempdir().unwrap();
    let db_path = dir.path().join("db");
    let db = db_path.to_str().unwrap();
    let input = dir.path().join("in.jsonl");
    std::fs::write(
        &input,
        concat!(
            "{\"id\":\"u1\",\"name\":\"Ann\",\"country\":\"FR\",\"age\":31}\n",
            "{\"id\":\"u2\",\"name\":\"Bob\",\"age\":40}\n",
            "\n",
            "{\"id\":7,\"name\":\"Cy\",\"country\":null,\"age\":40,\"tags\":[\"a\",\"b\"]}\n",
            "{\"id\":\"u4\",\"name\":\"Di\",\"country\":\"FR\",\"age\":31.5,\"addr\":{\"city\":\"Paris\"}}\n",
        ),
    )
    .unwrap();
    let args = [
        "ingest",
        db,
        "--input",
        input.to_str().unwrap(),
        "--id-field",
        "id",
        "--journal",
        "separate",
    ];
    let idx = [
        "--index",
        "country",
        "--index",
        "age",
        "--index",
        "addr.city",
        "--index",
        "tags",
    ];
    let out = ok(&[&args[..], &idx[..], &["--json"]].concat());
    let s: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(s["documents"], 4);
    let e = entries(db);
    assert_eq!(e["(root)"], 4);
    assert_eq!(
        e["country"], 2,
        "documents without country (or null) are left out"
    );
    assert_eq!(e["age"], 4);
    assert_eq!(e["addr.city"], 1);
    assert_eq!(e["tags"], 1);
    assert_eq!(
        ok(&["get", db, "7"]).trim(),
        "{\"id\":7,\"name\":\"Cy\",\"country\":null,\"age\":40,\"tags\":[\"a\",\"b\"]}"
    );
    assert_eq!(scan_ids(db, "age", "40\\x00"), vec!["7", "u2"]);
    assert_eq!(scan_ids(db, "age", "31.5\\x00"), vec!["u4"]);
    assert_eq!(scan_ids(db, "addr.city", "Paris\\x00"), vec!["u4"]);
    assert_eq!(scan_ids(db, "tags", "[\"a\",\"b\"]\\x00"), vec!["7"]);
    // Then the same database in shared mode: nothing new.
    let out = ok(&[&args[..6], &idx[..], &["--json"]].concat());
    let s: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(s["stored"], 0);
    assert_eq!(entries(db), e);
    assert!(omnibus(&["check", db]).status.success());
}

#[test]
fn ingest_into_a_database_open_elsewhere_names_it_once() {
    let _no_children = children::no_children_meanwhile();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("c.db");
    let dbs = db.to_str().unwrap();
    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, "{\"id\":\"a\"}\n").unwrap();
    let args = ["ingest", dbs, "--input", input.to_str().unwrap()];
    ok(&args);
    let held = omnibus::Database::open(&db, omnibus::Options::default()).unwrap();
    let o = omnibus(&args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(
        err,
        format!("omnibus: {dbs}: already open (its LOCK file is held by a read-write opener)\n")
    );
    held.close().unwrap();
    ok(&args);
}

/// A storage write failure in the middle of an ingest (files capped at 16 MiB by RLIMIT_FSIZE,
/// SIGXFSZ ignored, so a write past it fails with EFBIG): exit 2, and the message names the
/// line once (`line N: storing the document: ...`).
#[test]
fn a_write_failure_names_the_line_once() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("c.db");
    let input = dir.path().join("in.jsonl");
    let mut text = String::new();
    let pad = "x".repeat(900);
    for i in 0..40_000 {
        text.push_str(&format!("{{\"id\":\"d{i:06}\",\"pad\":\"{pad}\"}}\n"));
    }
    std::fs::write(&input, text).unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_omnibus"));
    cmd.arg("ingest").arg(&db).arg("--input").arg(&input).args([
        "--id-field",
        "id",
        "--window",
        "16",
    ]);
    // SAFETY: between fork and exec only async-signal-safe calls (signal, setrlimit).
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let lim = libc::rlimit {
                rlim_cur: 16 << 20,
                rlim_max: 16 << 20,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let o = children::output(&mut cmd).unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    let msg = err.lines().last().unwrap_or_default();
    let rest = msg
        .strip_prefix("omnibus: line ")
        .unwrap_or_else(|| panic!("{err}"));
    let (n, rest) = rest.split_once(": ").unwrap_or_else(|| panic!("{err}"));
    assert!(n.parse::<u64>().is_ok(), "{err}");
    assert!(!rest.contains("line "), "the line is named twice: {err}");
    assert!(rest.starts_with("storing the document: "), "{err}");
}

/// Regression: `--index nosuchfield` exited 0 and silently created an empty
/// index storage. It is still created (a spec may match later documents), but a warning names
/// it; an index that got entries is not named.
#[test]
fn an_index_no_document_fills_is_named_in_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let db_path = dir.path().join("db");
    let db = db_path.to_str().unwrap();
    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, "{\"name\":\"Ann\"}\n{\"name\":\"Bob\"}\n").unwrap();
    let o = omnibus(&[
        "ingest",
        db,
        "--input",
        input.to_str().unwrap(),
        "--index",
        "nmae",
        "--index",
        "name",
    ]);
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("index `nmae` has no entries: none of the 2 documents"),
        "{err}"
    );
    assert!(!err.contains("index `name`"), "{err}");
}

// Regression: duplicate ids in the input were silently last-wins: the summary said "5 stored"
// while the root held 4. They are counted, and `--on-duplicate last|first|error` says what
// happens to them.
#[test]
fn duplicate_ids_are_counted_and_follow_on_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("dup.jsonl");
    std::fs::write(
        &input,
        concat!(
            "{\"id\":\"a\",\"v\":\"x\"}\n",
            "{\"id\":\"b\",\"v\":\"y\"}\n",
            "{\"id\":\"a\",\"v\":\"z\"}\n",
            "{\"id\":\"c\",\"v\":\"x\"}\n",
            "{\"id\":\"a\",\"v\":\"z\"}\n",
        ),
    )
    .unwrap();
    // (mode, stored, unchanged, kept, bad lines, a's value's t, a's index term)
    let cases = [
        ("last", 4, 1, 0, 0, "z"),
        ("first", 3, 0, 2, 0, "x"),
        ("error", 3, 0, 0, 2, "x"),
    ];
    for (mode, stored, unchanged, kept, bad, t) in cases {
        let db_path = dir.path().join(format!("db-{mode}"));
        let db = db_path.to_str().unwrap();
        let o = cli_common::ingest_v(db, &input, &["--on-duplicate", mode, "--json"]);
        assert!(o.status.success(), "{mode}: {o:?}");
        let s: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(s["duplicates"], 2, "{mode}: {s}");
        assert_eq!(s["stored"], stored, "{mode}: {s}");
        assert_eq!(s["unchanged"], unchanged, "{mode}: {s}");
        assert_eq!(s["kept"], kept, "{mode}: {s}");
        assert_eq!(s["bad_lines"], bad, "{mode}: {s}");
        assert_eq!(s["root_entries"], 3, "{mode}: {s}");
        assert_eq!(s["on_duplicate"], mode, "{mode}: {s}");
        assert_eq!(s["refused"], bad, "{mode}: {s}");
        let a: Value = serde_json::from_str(&ok(&["get", db, "a"])).unwrap();
        assert_eq!(a["v"], t, "{mode}");
        assert_eq!(
            term_ids(db, "v", &[t]).first().map(String::as_str),
            Some("a")
        );
        if mode == "error" {
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(err.contains("line 3: id a is already stored"), "{err}");
        }
    }
    // The text summary says it too.
    let o = cli_common::ingest_v(dir.path().join("db-text").to_str().unwrap(), &input, &[]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(
            "duplicate ids    2 (1 replaced, 1 unchanged, 0 kept, 0 refused; --on-duplicate last)"
        ),
        "{out}"
    );
}
