//! Exit codes and usage messages of the command line: a missing key is 1 for `get` and
//! `delete` alike; `--cores` above the CPUs available is a usage error saying so; `--storage`
//! help names what it accepts.

use crate::common::cli as cli_common;
use crate::common::tree;
use cli_common::{ok, omnibus};

#[test]
fn missing_key_cores_and_storage_help() {
    // Regression: `get` of a missing key exited 1 but `delete` of one
    // printed `not found` and exited 0; `ingest --cores 64` on a 2-CPU machine started 64
    // executors on 2 CPUs; `--storage` help said `Indexes/NAME`, a path it does not accept.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let db = db.to_str().unwrap();
    ok(&["put", db, "k", "v"]);
    for cmd in ["get", "delete"] {
        let o = omnibus(&[cmd, db, "missing"]);
        assert_eq!(o.status.code(), Some(1), "{cmd}");
        assert_eq!(
            String::from_utf8_lossy(&o.stderr),
            "omnibus: missing: not found\n",
            "{cmd}"
        );
        assert!(o.stdout.is_empty(), "{cmd}");
    }
    assert_eq!(ok(&["delete", db, "k"]), "deleted\n");

    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, "{\"a\":1}\n").unwrap();
    let too_many = (std::thread::available_parallelism().unwrap().get() + 1).to_string();
    let db2 = dir.path().join("db2");
    let o = omnibus(&[
        "ingest",
        db2.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
        "--cores",
        &too_many,
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("--cores {too_many}")) && err.contains("CPUs"),
        "{err}"
    );
    assert!(!db2.exists(), "a usage error creates nothing");

    for cmd in ["get", "put", "delete", "scan"] {
        let help = ok(&[cmd, "--help"]);
        assert!(!help.contains("Indexes/"), "{cmd}: {help}");
        assert!(help.contains("--storage <NAME>"), "{cmd}: {help}");
    }
}

// Regression: a directory holding someone else's `data.pages` got different verdicts: `get`,
// `stat` and `put` said "not an omnibus storage" (exit 1), `ingest` "corruption ... cut short"
// (exit 2) and left `Indexes/` and `LOCK` behind, `check` "CORRUPT" (exit 2). Every command now
// says "not an omnibus storage", exits 1, and leaves the directory as it was.
#[test]
fn every_command_gives_a_foreign_directory_one_verdict_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, "{\"id\":\"a\",\"v\":1}\n").unwrap();
    let input = input.to_str().unwrap();
    let random = tree::junk(65536, 0x2545_F491_4F6C_DD1D);
    for (name, bytes) in [
        ("notes", b"my notes\n".to_vec()),
        ("nine", random[..9].to_vec()),
        ("random", random.clone()),
    ] {
        let g = dir.path().join(name);
        std::fs::create_dir(&g).unwrap();
        std::fs::write(g.join("data.pages"), &bytes).unwrap();
        let g = g.to_str().unwrap();
        let backup = dir.path().join(format!("{name}-backup"));
        let backup = backup.to_str().unwrap();
        for args in [
            vec![
                "ingest",
                g,
                "--input",
                input,
                "--id-field",
                "id",
                "--index",
                "v",
            ],
            vec!["get", g, "k"],
            vec!["put", g, "k", "v"],
            vec!["delete", g, "k"],
            vec!["scan", g],
            vec!["stat", g],
            vec!["check", g],
            vec!["backup", g, backup],
        ] {
            let o = omnibus(&args);
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(1), "{name}: {args:?}: {err}");
            assert!(
                err.contains("not an omnibus storage"),
                "{name}: {args:?}: {err}"
            );
            let left: Vec<String> = std::fs::read_dir(g)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            assert_eq!(left, ["data.pages"], "{name}: {args:?} left files");
            assert_eq!(
                std::fs::read(std::path::Path::new(g).join("data.pages")).unwrap(),
                bytes,
                "{name}: {args:?} changed data.pages"
            );
            assert!(!std::path::Path::new(backup).exists(), "{name}: {args:?}");
        }
    }
}

// Regression: a directory holding only an empty or all-zero `data.pages` (what a creation that
// crashed before its header was durable leaves, or someone's empty file) was "not an omnibus
// storage" to `get`, `scan`, `stat`, `check` and `backup`, while `put` and `delete` made it a
// plain storage. Now it is no storage for every command that does not create one (`delete`
// included), and `put` creates a database in it, as in an empty directory.
#[test]
fn an_empty_or_zero_data_file_is_no_storage_until_put_creates_one() {
    let dir = tempfile::tempdir().unwrap();
    for (name, bytes) in [("empty", Vec::new()), ("zeros", vec![0u8; 16384])] {
        let g = dir.path().join(name);
        std::fs::create_dir(&g).unwrap();
        std::fs::write(g.join("data.pages"), &bytes).unwrap();
        let gs = g.to_str().unwrap();
        let backup = dir.path().join(format!("{name}-backup"));
        for args in [
            vec!["get", gs, "k"],
            vec!["delete", gs, "k"],
            vec!["scan", gs],
            vec!["scan", gs, "--storage", "x"],
            vec!["stat", gs],
            vec!["check", gs],
            vec!["backup", gs, backup.to_str().unwrap()],
        ] {
            let o = omnibus(&args);
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(1), "{name}: {args:?}: {err}");
            assert!(
                err.contains("not an omnibus storage"),
                "{name}: {args:?}: {err}"
            );
            let left: Vec<String> = std::fs::read_dir(&g)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            assert_eq!(left, ["data.pages"], "{name}: {args:?} left files");
        }
        ok(&["put", gs, "k", "v"]);
        assert!(g.join("Indexes").is_dir(), "{name}: put made a database");
        assert_eq!(ok(&["get", gs, "k"]), "v");
    }
}

// Regression: junk was called "a plain storage (made by `Storage::open`) [that] has no storage
// `x`" when `--storage x` was given; `scan --term` with more terms than the index has fields, or
// on a branch that is no index, printed nothing and exited 0; `--storage (root)`, the name
// `stat` and `check` give the root, was "no storage".
#[test]
fn storage_and_term_arguments_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk");
    std::fs::create_dir(&junk).unwrap();
    std::fs::write(junk.join("data.pages"), vec![0x5au8; 65536]).unwrap();
    let junk = junk.to_str().unwrap();
    for args in [
        vec!["get", junk, "k", "--storage", "x"],
        vec!["scan", junk, "--storage", "x"],
        vec!["check", junk, "--storage", "x"],
    ] {
        let o = omnibus(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains("not an omnibus storage"), "{args:?}: {err}");
    }

    let db = dir.path().join("db");
    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, "{\"id\":\"a\",\"v\":1,\"w\":2}\n").unwrap();
    let db = db.to_str().unwrap();
    let input = input.to_str().unwrap();
    ok(&[
        "ingest",
        db,
        "--input",
        input,
        "--id-field",
        "id",
        "--index",
        "v",
        "--index",
        "v,w",
    ]);
    ok(&["put", db, "--storage", "plain", "--create", "k", "x"]);
    for (args, want) in [
        (
            vec!["--storage", "v", "--term", "1", "--term", "2"],
            "has 1 field",
        ),
        (
            vec![
                "--storage",
                "v,w",
                "--term",
                "1",
                "--term",
                "2",
                "--term",
                "3",
            ],
            "has 2 fields",
        ),
        (vec!["--storage", "plain", "--term", "x"], "is not an index"),
        (vec!["--term", "x"], "give the index with --storage"),
    ] {
        let mut all = vec!["scan", db];
        all.extend(&args);
        let o = omnibus(&all);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{all:?}: {err}");
        assert!(err.contains(want), "{all:?}: {err}");
    }
    assert_eq!(
        ok(&["scan", db, "--storage", "v,w", "--term", "1", "--term", "2"])
            .lines()
            .count(),
        1
    );
    assert_eq!(ok(&["scan", db, "--storage", "(root)"]).lines().count(), 1);
    assert_eq!(
        ok(&["get", db, "a", "--storage", "(root)"]),
        "{\"id\":\"a\",\"v\":1,\"w\":2}"
    );
    // Names are quoted in lists: an index's name may hold commas.
    let o = omnibus(&["scan", db, "--storage", "nosuch"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("(storages: `plain`, `v`, `v,w`)"), "{err}");
}
