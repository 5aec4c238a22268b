//! `omnibus check --storage NAME` checks one storage of a database (and cross-checks it when it
//! is an index), so a user of a database with many indexes need not wait for all of them.
//! Story: a user found no way to check one storage: `check` of a database read
//! the pages of every index to look at one.

use omnibus::{Database, Options};

use crate::common::children;
use crate::common::cli;

#[test]
fn check_storage_checks_only_the_named_storage() {
    let _no_children = children::no_children_meanwhile();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let db = path.to_str().unwrap();
    let lines: Vec<String> = (0..100)
        .map(|i| {
            format!(
                "{{\"id\":\"p{i:03}\",\"color\":\"c{}\",\"size\":{}}}",
                i % 4,
                i % 3
            )
        })
        .collect();
    cli::ingest_lines(&path, &lines, &["color", "size"]);
    // Damage index `size` through its branch: a whole-database check reports it.
    {
        let d = Database::open(&path, Options::default()).unwrap();
        let idx = d.storage("size").unwrap();
        let mut w = idx.begin_write().unwrap();
        w.put(b"9\0p999", b"").unwrap();
        w.commit().unwrap();
        d.close().unwrap();
    }
    assert_eq!(cli::omnibus(&["check", db]).status.code(), Some(2));

    // Only `color`: its pages and its cross-check, nothing of `size`.
    let out = cli::ok(&["check", db, "--storage", "color"]);
    assert!(out.contains("color: ok"), "{out}");
    assert!(
        out.contains("index `color`: ok (100 documents, 100 entries, 0 differences)"),
        "{out}"
    );
    assert!(!out.contains("size") && !out.contains("(root):"), "{out}");

    // Only `size`: the damage is found.
    let o = cli::omnibus(&["check", db, "--storage", "size"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("index `size`: 0 missing entries"), "{err}");
    // The summary says where the problems are (it said "in 0 storages" for an index's).
    assert!(err.contains("in index cross-checks)"), "{err}");
    assert!(!err.contains("`color`"), "{err}");

    // Only the documents: no index is cross-checked.
    let out = cli::ok(&["check", db, "--storage", "(root)"]);
    assert!(out.contains("(root): ok (100 entries"), "{out}");
    assert!(!out.contains("index `"), "{out}");

    // An unknown name: a usage error (exit 1) naming the storages.
    let o = cli::omnibus(&["check", db, "--storage", "colour"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("no storage named `colour`") && err.contains("color") && err.contains("size"),
        "{err}"
    );
}
