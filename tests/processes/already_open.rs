//! One storage, one opener: a second open of the same directory, in this process or another
//! one, fails with `Error::AlreadyOpen` (the `LOCK` file's `flock`), and succeeds as soon as the
//! first opener is gone: its last handle dropped, or its process killed with SIGKILL.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use omnibus::{Error, FlushMode, Options, Storage};

use crate::common::children;

/// Set in the child's environment: the storage directory to hold open.
const CHILD_DIR: &str = "OMNIBUS_ALREADY_OPEN_CHILD_DIR";

fn opts(flush_mode: FlushMode) -> Options {
    Options {
        flush_mode,
        ..Options::default()
    }
}

fn assert_already_open(r: omnibus::Result<Storage>, path: &Path, what: &str) {
    match r {
        Err(Error::AlreadyOpen { path: p, .. }) => {
            assert_eq!(p, path, "{what}: the error names the directory")
        }
        Err(e) => panic!("{what}: expected AlreadyOpen, got {e}"),
        Ok(_) => panic!("{what}: a second open of one storage succeeded"),
    }
}

#[test]
fn second_open_in_process_is_refused_until_the_last_handle_is_dropped() {
    let _no_children = children::no_children_meanwhile();
    for mode in [FlushMode::Manual, FlushMode::Inline, FlushMode::Background] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let what = format!("{mode:?}");
        let s = Storage::open(&path, opts(mode)).unwrap();
        let mut w = s.begin_write().unwrap();
        w.put(b"k", b"v").unwrap();
        w.commit().unwrap();
        assert_already_open(Storage::open(&path, opts(mode)), &path, &what);
        // A clone is the same opener: the lock stays while any clone lives.
        let clone = s.clone();
        drop(s);
        assert_already_open(
            Storage::open(&path, opts(mode)),
            &path,
            &format!("{what}, a clone alive"),
        );
        drop(clone);
        // Released at once (no background thread may keep it), again and again.
        for i in 0..5 {
            let s = Storage::open(&path, opts(mode))
                .unwrap_or_else(|e| panic!("{what}: reopen {i} after drop: {e}"));
            assert_eq!(s.begin_read().unwrap().get(b"k").unwrap(), Some(&b"v"[..]));
            assert_already_open(Storage::open(&path, opts(mode)), &path, &what);
            drop(s);
        }
        // close() as well.
        let s = Storage::open(&path, opts(mode)).unwrap();
        s.close().unwrap();
        Storage::open(&path, opts(mode))
            .unwrap_or_else(|e| panic!("{what}: reopen after close: {e}"));
    }
}

/// The child: opens the storage, commits one key, says so, and sleeps until killed. Does nothing
/// unless started by the parent (the variable is set).
#[test]
fn child_entry() {
    let Ok(dir) = std::env::var(CHILD_DIR) else {
        return;
    };
    let s = Storage::open(&dir, opts(FlushMode::Background)).expect("child: open");
    let mut w = s.begin_write().unwrap();
    w.put(b"child", b"was here").unwrap();
    w.commit().unwrap();
    let mut out = std::io::stdout().lock();
    writeln!(out, "\nOPEN").unwrap();
    out.flush().unwrap();
    // Bounded: the parent kills it long before; a leaked child ends by itself.
    std::thread::sleep(Duration::from_secs(120));
}

#[test]
fn open_held_by_another_process_is_refused_until_it_is_killed() {
    let _no_children = children::no_children_meanwhile();
    if std::env::var(CHILD_DIR).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let child_test = crate::common::test_name(module_path!(), "child_entry");
    let mut child = children::spawn(
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", &child_test, "--nocapture", "--test-threads=1"])
            .env(CHILD_DIR, &path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit()),
    )
    .expect("spawning the child");
    // Wait for the child to hold the storage.
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let opened = lines.any(|l| l.map(|l| l.trim() == "OPEN").unwrap_or(false));
    if !opened {
        let _ = child.kill();
        let status = child.wait();
        panic!("the child did not open the storage: {status:?}");
    }
    for _ in 0..3 {
        assert_already_open(
            Storage::open(&path, opts(FlushMode::Manual)),
            &path,
            "held by another process",
        );
    }
    // std's kill is SIGKILL on Unix: no destructor runs, the kernel drops the flock.
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert!(!status.success());
    let s =
        Storage::open(&path, opts(FlushMode::Manual)).expect("open after the holder was killed");
    assert_eq!(
        s.begin_read().unwrap().get(b"child").unwrap(),
        Some(&b"was here"[..])
    );
    assert!(s.check().unwrap().is_ok());
}
