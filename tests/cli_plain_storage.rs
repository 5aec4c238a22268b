//! `stat` and `check` on a plain storage (made by `Storage::open`: data.pages, Journals/,
//! LOCK, no database layout): they read it and leave the directory exactly as it was.

use std::collections::BTreeMap;
use std::path::Path;

use omnibus::{Options, Storage};
use serde_json::Value;

#[path = "common/cli.rs"]
mod cli_common;
use cli_common::ok;

/// Every file under `dir` (relative path) with its bytes; directories as empty entries.
fn snapshot(dir: &Path) -> BTreeMap<String, Option<Vec<u8>>> {
    fn walk(root: &Path, d: &Path, out: &mut BTreeMap<String, Option<Vec<u8>>>) {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            if p.is_dir() {
                out.insert(rel + "/", None);
                walk(root, &p, out);
            } else {
                out.insert(rel, Some(std::fs::read(&p).unwrap()));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

#[test]
fn stat_and_check_read_a_plain_storage_without_changing_it() {
    // Regression (fresh-user trial): `stat` and `check` refused a storage made with
    // `Storage::open` ("no Indexes directory"), and a database open of it in write mode would
    // have turned it into a database (an Indexes/ directory created in it).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plain");
    {
        let s = Storage::open(&path, Options::default()).unwrap();
        let mut w = s.begin_write().unwrap();
        for i in 0..50u32 {
            w.put(format!("k{i:03}").as_bytes(), b"value").unwrap();
        }
        w.commit().unwrap();
        // One more commit left in the journal only (no flush): recovery replays it in memory.
        let mut w = s.begin_write().unwrap();
        w.put(b"last", b"x").unwrap();
        w.commit().unwrap();
    }
    let before = snapshot(&path);
    assert!(before.contains_key("data.pages") && !before.contains_key("Indexes/"));
    let p = path.to_str().unwrap();

    let out = ok(&["stat", p]);
    assert!(out.contains("a plain storage"), "{out}");
    assert!(out.contains("entries    51"), "{out}");
    let j: Value = serde_json::from_str(&ok(&["stat", p, "--json"])).unwrap();
    assert_eq!(j["plain_storage"], true);
    assert_eq!(j["storages"][0]["entries"], 51);

    let out = ok(&["check", p]);
    assert!(out.starts_with("(storage): ok (51 entries"), "{out}");
    let j: Value = serde_json::from_str(&ok(&["check", p, "--json"])).unwrap();
    assert_eq!(j["ok"], true);

    assert_eq!(
        snapshot(&path),
        before,
        "stat and check changed the storage's directory"
    );
}
