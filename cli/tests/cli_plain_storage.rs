//! The command line on a plain storage (made by `Storage::open`: data.pages, Journals/,
//! LOCK, no database layout): `stat` and `check` read it and leave it exactly as it was; `get`,
//! `scan`, `put` and `delete` use it as the storage it is, never turning it into a database.

use std::collections::BTreeMap;
use std::path::Path;

use omnibus::{Options, Storage};
use serde_json::Value;

use crate::common::children;
use crate::common::cli as cli_common;
use crate::common::tree;
use cli_common::ok;

fn snapshot(dir: &Path) -> BTreeMap<String, Option<Vec<u8>>> {
    tree::tree(dir)
}

#[test]
fn stat_and_check_read_a_plain_storage_without_changing_it() {
    let _no_children = children::no_children_meanwhile();
    // Regression: `stat` and `check` refused a storage made with
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

#[test]
fn key_commands_use_a_plain_storage_as_it_is() {
    let _no_children = children::no_children_meanwhile();
    // Regression: `get` and `scan` refused a plain storage ("no
    // Indexes directory") while `check`, `stat` and `backup` read it, and `put` on one
    // silently made it a database (it created `Indexes/`).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plain");
    {
        let s = Storage::open(&path, Options::default()).unwrap();
        let mut w = s.begin_write().unwrap();
        w.put(b"a", b"1").unwrap();
        w.put(b"b", b"2").unwrap();
        w.commit().unwrap();
        s.close().unwrap();
    }
    let p = path.to_str().unwrap();
    let o = cli_common::omnibus_after_close(&["get", p, "a"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "1", "{o:?}");
    assert_eq!(ok(&["scan", p]), "a\t1\nb\t2\n");
    ok(&["put", p, "c", "3"]);
    assert_eq!(ok(&["delete", p, "a"]).trim(), "deleted");
    assert_eq!(ok(&["scan", p, "--storage", "(storage)"]), "b\t2\nc\t3\n");
    // A plain storage has no branch storages.
    for args in [
        &["get", p, "b", "--storage", "idx"][..],
        &["put", p, "k", "v", "--storage", "idx", "--create"][..],
    ] {
        let o = cli_common::omnibus(args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {o:?}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("plain storage"),
            "{o:?}"
        );
    }
    assert!(
        !path.join("Indexes").exists(),
        "a key command made it a database"
    );
    // Still a plain storage, with the commands' writes.
    let s = Storage::open(&path, Options::default()).unwrap();
    let r = s.begin_read().unwrap();
    assert_eq!(r.get(b"c").unwrap(), Some(&b"3"[..]));
    assert_eq!(r.get(b"a").unwrap(), None);
}

#[test]
fn ingest_refuses_a_plain_storage() {
    let _no_children = children::no_children_meanwhile();
    // Regression: `ingest COPY --input x.jsonl --index type` on a copy of a storage made by
    // `Storage::open` exited 0 and `stat` then said "database (3 storages)".
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plain");
    {
        let s = Storage::open(&path, Options::default()).unwrap();
        let mut w = s.begin_write().unwrap();
        w.put(b"a", b"1").unwrap();
        w.commit().unwrap();
        s.close().unwrap();
    }
    let input = dir.path().join("x.jsonl");
    std::fs::write(&input, "{\"id\":\"d1\",\"type\":\"x\"}\n").unwrap();
    let before = snapshot(&path);
    let p = path.to_str().unwrap();
    let o = cli_common::omnibus_after_close(&[
        "ingest",
        p,
        "--input",
        input.to_str().unwrap(),
        "--index",
        "type",
    ]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("plain storage"),
        "{o:?}"
    );
    assert_eq!(
        snapshot(&path),
        before,
        "the refused ingest changed the storage"
    );
}
