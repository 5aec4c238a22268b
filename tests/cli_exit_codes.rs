//! Exit codes and usage messages of the command line: a missing key is 1 for `get` and
//! `delete` alike; `--cores` above the CPUs available is a usage error saying so; `--storage`
//! help names what it accepts.

#[path = "common/cli.rs"]
mod cli_common;
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
