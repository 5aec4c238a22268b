//! An `omnibus ingest` killed with SIGKILL halfway (documents and index updates in flight), then
//! run again to the end: every document present exactly once, every index complete, `check`
//! clean. Input: tests/fixtures/cities_sample.jsonl (GeoNames, CC BY 4.0, see its README).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::common::children;
use crate::common::cli as cli_common;
use cli_common::{ok, omnibus};

fn entries(db: &str) -> BTreeMap<String, u64> {
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

fn scan(db: &str, storage: Option<&str>) -> Vec<(String, String)> {
    let mut args = vec!["scan", db];
    if let Some(s) = storage {
        args.extend(["--storage", s]);
    }
    ok(&args)
        .lines()
        .map(|l| {
            l.split_once('\t')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .unwrap()
        })
        .collect()
}

#[test]
fn sigkill_halfway_then_rerun_completes_everything() {
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/cities_sample.jsonl");
    let text = std::fs::read_to_string(&fixture).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let docs: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let db_path = dir.path().join("db");
    let db = db_path.to_str().unwrap();
    let index_args = [
        "--index",
        "country",
        "--index",
        "country,admin1",
        "--index",
        "name",
    ];

    // First run: reads standard input; the first half is given time to commit, then more lines
    // arrive and the process is killed while they are in flight.
    let mut child = children::spawn(
        Command::new(env!("CARGO_BIN_EXE_omnibus"))
            .args(
                [
                    &["ingest", db, "--input", "-", "--window", "64"][..],
                    &index_args[..],
                ]
                .concat(),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
    .expect("spawn omnibus ingest");
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all((lines[..1500].join("\n") + "\n").as_bytes())
        .unwrap();
    stdin.flush().unwrap();
    std::thread::sleep(Duration::from_millis(2000));
    stdin
        .write_all((lines[1500..2300].join("\n") + "\n").as_bytes())
        .unwrap();
    stdin.flush().unwrap();
    std::thread::sleep(Duration::from_millis(5));
    child.kill().expect("SIGKILL");
    child.wait().unwrap();
    drop(stdin);

    let half = entries(db);
    eprintln!("after SIGKILL: {half:?}");
    let root = half["(root)"];
    assert!(
        (1500..=2300).contains(&root),
        "documents after the kill: {root}"
    );
    for name in ["country", "country,admin1", "name"] {
        assert!(
            half.get(name).copied().unwrap_or(0) <= root,
            "{name}: {half:?}"
        );
    }
    assert!(omnibus(&["check", db]).status.success());

    // Second run to the end.
    let out = ok(&[
        &["ingest", db, "--input", fixture.to_str().unwrap(), "--json"][..],
        &index_args[..],
    ]
    .concat());
    let s: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(s["documents"], 3000);
    assert_eq!(
        s["stored"].as_u64().unwrap() + s["unchanged"].as_u64().unwrap(),
        3000
    );
    assert!(s["unchanged"].as_u64().unwrap() >= 1500, "{s}");

    // Every document exactly once, with its line.
    let root = scan(db, None);
    assert_eq!(root.len(), 3000);
    for (i, (k, v)) in root.iter().enumerate() {
        assert_eq!(k, &format!("{:012}", i + 1));
        assert_eq!(v, &lines[i].replace('\\', "\\\\"), "line {}", i + 1);
    }
    // Every index complete: exactly one entry per document, pointing at it.
    let e = entries(db);
    for (name, fields) in [
        ("country", vec!["country"]),
        ("country,admin1", vec!["country", "admin1"]),
        ("name", vec!["name"]),
    ] {
        let want = docs
            .iter()
            .filter(|d| fields.iter().all(|f| !d[*f].is_null()))
            .count() as u64;
        assert_eq!(e[name], want, "{name}");
        // An entry's key ends with 0x00 and the document id; its value is empty.
        let ids: Vec<String> = scan(db, Some(name))
            .into_iter()
            .map(|(k, v)| {
                assert_eq!(v, "", "{k}");
                k.rsplit_once("\\x00").unwrap().1.to_string()
            })
            .collect();
        let mut sorted = ids.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len() as u64, want, "{name}: an id appears twice");
    }
    // The exact entries of one value.
    let want_ad: Vec<String> = docs
        .iter()
        .enumerate()
        .filter(|(_, d)| d["country"] == "AD")
        .map(|(i, _)| format!("{:012}", i + 1))
        .collect();
    let got_ad: Vec<String> = ok(&["scan", db, "--storage", "country", "--prefix", "AD\\x00"])
        .lines()
        .map(|l| {
            l.split('\t')
                .next()
                .unwrap()
                .rsplit_once("\\x00")
                .unwrap()
                .1
                .to_string()
        })
        .collect();
    assert_eq!(got_ad, want_ad);
    let check = omnibus(&["check", db]);
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
}
