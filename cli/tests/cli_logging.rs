//! The command line's logs: `--log-level debug` shows the commit span and its journal batch
//! on stderr, the default (WARN) shows nothing for a healthy put, `RUST_LOG` is honoured and
//! `--log-level` wins over it.

use std::process::Command;

use crate::common::children;

fn put(db: &str, key: &str, log_level: Option<&str>, rust_log: Option<&str>) -> String {
    let mut c = Command::new(env!("CARGO_BIN_EXE_omnibus"));
    c.env_remove("RUST_LOG");
    if let Some(l) = rust_log {
        c.env("RUST_LOG", l);
    }
    if let Some(l) = log_level {
        c.args(["--log-level", l]);
    }
    let o = children::output(c.args(["put", db, key, "v"])).unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{err}");
    assert!(o.stdout.is_empty());
    err
}

#[test]
fn log_level_and_rust_log_choose_what_stderr_shows() {
    // Regression: the command line printed WARN and above whatever the
    // user asked, and the library had no spans: a slow commit could not be looked into.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let db = db.to_str().unwrap();
    assert_eq!(put(db, "a", None, None), "", "the default is quiet");
    let debug = put(db, "b", Some("debug"), None);
    assert!(debug.contains("commit{txn="), "{debug}");
    assert!(
        debug.contains("journal batch") && debug.contains("sync_us="),
        "{debug}"
    );
    assert!(debug.contains("open storage{path="), "{debug}");
    // INFO is quiet for a plain put (no recovery, no index catch-up).
    assert_eq!(put(db, "c", Some("info"), None), "");
    let env = put(db, "d", None, Some("omnibus=debug"));
    assert!(env.contains("journal batch"), "{env}");
    assert_eq!(
        put(db, "e", Some("warn"), Some("debug")),
        "",
        "--log-level wins"
    );
}
