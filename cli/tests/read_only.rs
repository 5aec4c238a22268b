//! Read-only use works where LMDB's does: on read-only media, for a user without write
//! permission, and in several processes at once; and it never writes anything.
//!
//! Each of these failed before: a read-only open created and opened `LOCK` read-write and took
//! it exclusively (so `EROFS`, `EACCES`, or `AlreadyOpen` from a second reader), opened the data
//! and journal files read-write, and `check` then reported the storage as corrupt. Now a
//! read-only open takes a *shared* `flock` on `LOCK` when it can open it for reading (a writer
//! takes it exclusively), and proceeds without a lock where it cannot (no `LOCK`, `EACCES`,
//! `EROFS`). Since the reader table, a read-only open takes a slot in `LOCK` (the only bytes
//! it writes) instead of a lock, and reads beside a live writer in another process; a writer
//! opens beside readers too. Where `LOCK` cannot be written, the shared `flock` is still taken.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use omnibus::{Database, Error, FlushMode, Options, Storage};

use crate::common::children;
use crate::common::cli as cli_common;
use crate::common::requires;
use cli_common::ok;

// The tests of this file run one at a time, and no other test of this binary starts a child
// meanwhile (`common::children`). A flaky failure told the story:
// `read_only_open_while_a_writer_holds_it` dropped its writer and reopened at once, and got
// `AlreadyOpen` once in a full-suite run. `LOCK`'s `flock` belongs to the open file
// description, and a child that another test of this binary forked in that moment held a copy
// of the writer's descriptor until its `exec` closed it (`O_CLOEXEC`), so the lock outlived the
// drop by that long. That is how `flock` works for any process that forks (LMDB's locks
// behave the same); the tests must not race their own children.
fn serial() -> children::NoChildren {
    children::no_children_meanwhile()
}

fn ro() -> Options {
    Options {
        read_only: true,
        create: false,
        ..Options::default()
    }
}

/// Options that leave committed transactions in the journal (so that a read-only open must
/// replay them in memory).
fn unflushed() -> Options {
    Options {
        flush_mode: FlushMode::Manual,
        flush_on_close: false,
        ..Options::default()
    }
}

/// Every file and directory under `root` with its size and modification time (ns).
fn listing(root: &Path) -> BTreeMap<PathBuf, (u64, i64, i64)> {
    let mut out = BTreeMap::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                todo.push(p.clone());
            }
            // A read-only open writes its reader slot into `LOCK` (the reader table), and
            // nothing else.
            let lock = p.file_name().is_some_and(|n| n == "LOCK");
            out.insert(
                p,
                if lock {
                    (m.len(), 0, 0)
                } else {
                    (m.len(), m.mtime(), m.mtime_nsec())
                },
            );
        }
    }
    let m = std::fs::metadata(root).unwrap();
    out.insert(root.to_path_buf(), (m.len(), m.mtime(), m.mtime_nsec()));
    out
}

/// A database in `dir/db` (keys in the root and in branch storage `idx`, flushed and
/// unflushed) and a standalone storage in `dir/store` (with unflushed commits).
fn populate(dir: &Path) -> (PathBuf, PathBuf) {
    let db_path = dir.join("db");
    let db = Database::open(&db_path, Options::default()).unwrap();
    let mut w = db.root().begin_write().unwrap();
    w.put(b"flushed", b"root 1").unwrap();
    w.commit().unwrap();
    let mut w = db.create_storage("idx").unwrap().begin_write().unwrap();
    w.put(b"i1", b"branch 1").unwrap();
    w.commit().unwrap();
    db.close().unwrap();
    let db = Database::open(&db_path, unflushed()).unwrap();
    let mut w = db.root().begin_write().unwrap();
    w.put(b"unflushed", b"root 2").unwrap();
    w.commit().unwrap();
    let mut w = db.create_storage("idx").unwrap().begin_write().unwrap();
    w.put(b"i2", b"branch 2").unwrap();
    w.commit().unwrap();
    drop(db);

    let store = dir.join("store");
    let s = Storage::open(&store, unflushed()).unwrap();
    for i in 0..100u32 {
        let mut w = s.begin_write().unwrap();
        w.put(format!("k{i:03}").as_bytes(), i.to_le_bytes())
            .unwrap();
        w.commit().unwrap();
    }
    drop(s);
    (db_path, store)
}

/// Reads everything `populate` wrote through the library, read-only.
fn read_all(db_path: &Path, store: &Path) {
    let s = Storage::open(store, ro()).unwrap_or_else(|e| panic!("storage, read-only: {e}"));
    let r = s.begin_read().unwrap();
    assert_eq!(r.get(b"k042").unwrap(), Some(&42u32.to_le_bytes()[..]));
    assert_eq!(s.stats().entries, 100);
    assert!(s.check().unwrap().is_ok(), "check of the storage");
    assert!(matches!(s.begin_write(), Err(Error::ReadOnly)));
    drop(r);
    drop(s);

    let db = Database::open(db_path, ro()).unwrap_or_else(|e| panic!("database, read-only: {e}"));
    let r = db.root().begin_read().unwrap();
    assert_eq!(r.get(b"flushed").unwrap(), Some(&b"root 1"[..]));
    assert_eq!(r.get(b"unflushed").unwrap(), Some(&b"root 2"[..]));
    let idx = db.storage("idx").unwrap();
    let r = idx.begin_read().unwrap();
    assert_eq!(r.get(b"i1").unwrap(), Some(&b"branch 1"[..]));
    assert_eq!(r.get(b"i2").unwrap(), Some(&b"branch 2"[..]));
    assert!(matches!(db.create_storage("new"), Err(Error::ReadOnly)));
    assert!(matches!(
        db.storage("new"),
        Err(Error::StorageNotFound { .. })
    ));
}

/// Runs every read-only command of the CLI on the database at `db` through `wrap` (a command
/// prefix such as `setpriv ...`, or nothing) and checks their output.
fn cli_reads(bin: &Path, wrap: &[&str], db: &Path) {
    let cmd = || -> Command {
        if wrap.is_empty() {
            Command::new(bin)
        } else {
            let mut c = Command::new(wrap[0]);
            c.args(&wrap[1..]).arg(bin);
            c
        }
    };
    let run = |args: &[&str]| -> Output {
        children::output(cmd().args(args).arg(db)).expect("run omnibus")
    };
    let okv = |args: &[&str], extra: &[&str]| -> String {
        let mut all: Vec<&str> = args.to_vec();
        all.push(db.to_str().unwrap());
        all.extend_from_slice(extra);
        let o = children::output(cmd().args(&all)).expect("run omnibus");
        assert!(
            o.status.success(),
            "omnibus {all:?} failed: {:?}\n{}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap()
    };
    assert_eq!(okv(&["get"], &["unflushed"]), "root 2");
    assert_eq!(okv(&["get"], &["--storage", "idx", "i2"]), "branch 2");
    assert_eq!(okv(&["scan"], &[]), "flushed\troot 1\nunflushed\troot 2\n");
    assert!(okv(&["stat"], &[]).contains("idx"));
    let o = run(&["check"]);
    assert!(
        o.status.success(),
        "check: {:?}\n{}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Unmounts the bind mount when dropped.
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = children::status(Command::new("umount").arg(&self.0));
    }
}

/// `dir` mounted read-only at `at` (a bind mount), or why that is impossible here.
fn mount_read_only(dir: &Path, at: &Path) -> Result<Mount, String> {
    std::fs::create_dir_all(at).unwrap();
    let sh = |args: &[&str]| -> Result<(), String> {
        match children::output(Command::new(args[0]).args(&args[1..])) {
            Ok(o) if o.status.success() => Ok(()),
            Ok(o) => Err(format!(
                "{args:?}: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Err(e) => Err(format!("{args:?}: {e}")),
        }
    };
    let (d, a) = (dir.to_str().unwrap(), at.to_str().unwrap());
    sh(&["mount", "--bind", d, a])?;
    let m = Mount(at.to_path_buf());
    sh(&["mount", "-o", "remount,bind,ro", a])?;
    Ok(m)
}

// A user keeps a database on read-only media (here a read-only bind mount) and opens it with
// `read_only: true`, and runs `get`, `scan`, `stat` and `check` on it. Before, the open failed
// with EROFS creating/opening LOCK read-write, and `check` called the database corrupt. The
// standalone storage has no LOCK file at all (media written elsewhere): it opens without a lock.
#[test]
fn read_only_open_on_a_read_only_bind_mount() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir(&src).unwrap();
    let (_, store) = populate(&src);
    std::fs::remove_file(store.join("LOCK")).unwrap();
    let before = listing(&src);
    let mnt = dir.path().join("mnt");
    let _mount = match mount_read_only(&src, &mnt) {
        Ok(m) => m,
        Err(why) => {
            requires::cannot_run(&format!("cannot make a read-only bind mount: {why}"));
            return;
        }
    };
    assert!(
        std::fs::write(mnt.join("probe"), b"x").is_err(),
        "the mount is read-only"
    );
    read_all(&mnt.join("db"), &mnt.join("store"));
    cli_reads(
        Path::new(env!("CARGO_BIN_EXE_omnibus")),
        &[],
        &mnt.join("db"),
    );
    // The standalone storage through the CLI's `check` path as well (each storage on its own).
    // A read-write open there is an I/O error, never a panic.
    match Storage::open(mnt.join("store"), Options::default()) {
        Err(e @ Error::Io { .. }) => assert!(e.to_string().contains("LOCK"), "{e}"),
        Err(e) => panic!("read-write open on read-only media: expected an I/O error, got {e}"),
        Ok(_) => panic!("read-write open on read-only media succeeded"),
    }
    assert_eq!(
        listing(&src),
        before,
        "a read-only open changed the directory"
    );
    assert!(
        !store.join("LOCK").exists(),
        "a read-only open created LOCK"
    );
}

// A user without write permission (nobody) runs the read-only commands on a database owned by
// root and made readable to all (chmod a+rX) but not writable. Before, each failed with EACCES
// opening LOCK read-write. With LOCK readable the readers share its lock; with LOCK unreadable
// (mode 0600) they proceed without one.
#[test]
fn read_only_commands_as_a_user_without_write_permission() {
    let _serial = serial();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        requires::cannot_run("not root, cannot run as another user");
        return;
    }
    if children::output(Command::new("setpriv").arg("--version")).is_err() {
        requires::cannot_run("no setpriv");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (db, _) = populate(dir.path());
    // The binary where nobody can run it, and the tree readable (not writable) to all.
    let bin = dir.path().join("omnibus");
    std::fs::copy(env!("CARGO_BIN_EXE_omnibus"), &bin).unwrap();
    let st = children::status(
        Command::new("chmod")
            .args(["-R", "a+rX,go-w"])
            .arg(dir.path()),
    )
    .unwrap();
    assert!(st.success());
    let before = listing(dir.path());
    let nobody = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
    ];
    // nobody cannot write here: the test would prove nothing otherwise.
    let o = children::status(
        Command::new(nobody[0])
            .args(&nobody[1..])
            .args(["touch", db.join("probe").to_str().unwrap()])
            .stderr(Stdio::null()),
    )
    .unwrap();
    assert!(!o.success(), "nobody can write the database directory");
    cli_reads(&bin, &nobody, &db);
    // LOCK unreadable to nobody (chmod changes no size or mtime).
    std::fs::set_permissions(db.join("LOCK"), std::fs::Permissions::from_mode(0o600)).unwrap();
    cli_reads(&bin, &nobody, &db);
    assert_eq!(
        listing(dir.path()),
        before,
        "read-only commands changed the directory"
    );
}

// Several read-only processes at once (LMDB allows it): the test holds a read-only Storage on
// the database root while six CLI processes read it concurrently. Before, the second reader got
// `AlreadyOpen` (LOCK was taken exclusively by every opener). A writer meanwhile is refused and
// told that read-only openers hold it; once they are gone, it opens.
#[test]
fn several_read_only_processes_at_once() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let (db, _) = populate(dir.path());
    let before = listing(dir.path());
    let held = Storage::open(&db, ro()).unwrap();
    let held_db = Database::open(&db, ro()).unwrap();
    let bin = env!("CARGO_BIN_EXE_omnibus");
    let dbs = db.to_str().unwrap();
    let jobs: Vec<(Vec<&str>, &str)> = vec![
        (vec!["scan", dbs], "flushed\troot 1\nunflushed\troot 2\n"),
        (vec!["get", dbs, "unflushed"], "root 2"),
        (
            vec!["scan", dbs, "--storage", "idx"],
            "i1\tbranch 1\ni2\tbranch 2\n",
        ),
        (vec!["get", dbs, "--storage", "idx", "i1"], "branch 1"),
        (vec!["scan", dbs, "--prefix", "f"], "flushed\troot 1\n"),
        (vec!["get", dbs, "flushed"], "root 1"),
    ];
    for round in 0..3 {
        let children: Vec<_> = jobs
            .iter()
            .map(|(args, _)| {
                children::spawn(
                    Command::new(bin)
                        .args(args)
                        .stdout(Stdio::piped())
                        .stderr(Stdio::piped()),
                )
                .unwrap()
            })
            .collect();
        for (child, (args, want)) in children.into_iter().zip(&jobs) {
            let o = child.wait_with_output().unwrap();
            assert!(
                o.status.success(),
                "round {round}: {args:?}: {:?}\n{}",
                o.status,
                String::from_utf8_lossy(&o.stderr)
            );
            assert_eq!(String::from_utf8_lossy(&o.stdout), *want, "{args:?}");
        }
    }
    assert_eq!(
        held.begin_read().unwrap().get(b"unflushed").unwrap(),
        Some(&b"root 2"[..])
    );
    drop(held_db);
    assert_eq!(
        listing(dir.path()),
        before,
        "read-only opens changed the directory"
    );
    // A writer opens beside a reader (its reader slot): the reader keeps reading the state it
    // opened, the writer's commits go on.
    ok(&["put", dbs, "k", "v"]);
    let w = Database::open(&db, Options::default()).unwrap();
    let mut t = w.root().begin_write().unwrap();
    t.put(b"unflushed", b"root 3").unwrap();
    t.commit().unwrap();
    w.flush().unwrap();
    assert_eq!(
        held.begin_read().unwrap().get(b"unflushed").unwrap(),
        Some(&b"root 2"[..])
    );
    assert_eq!(
        w.root().begin_read().unwrap().get(b"k").unwrap(),
        Some(&b"v"[..])
    );
    drop(w);
    drop(held);
}

// A read-only open while a writer holds the storage (before the reader table, `AlreadyOpen`
// naming the holder): it opens and reads every acknowledged commit, unflushed ones too, in this
// process and from the CLI (`get`, `scan`, `stat`, `check`, and a `backup` that opens whole).
#[test]
fn read_only_open_while_a_writer_holds_it() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let (db, store) = populate(dir.path());
    let writer = Database::open(&db, unflushed()).unwrap();
    let writer_store = Storage::open(&store, unflushed()).unwrap();
    read_all(&db, &store);
    let dbs = db.to_str().unwrap();
    assert_eq!(ok(&["get", dbs, "unflushed"]), "root 2");
    assert_eq!(
        ok(&["scan", dbs, "--storage", "idx"]),
        "i1\tbranch 1\ni2\tbranch 2\n"
    );
    ok(&["stat", dbs]);
    let o = cli_common::omnibus(&["check", dbs]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("a writer holds it: the tree is checked"),
        "check beside a writer says what it did not check: {o:?}"
    );
    // A backup taken beside the writer opens whole, with the unflushed commits.
    let copy = dir.path().join("copy");
    ok(&["backup", dbs, copy.to_str().unwrap()]);
    let c = Database::open(&copy, Options::default()).unwrap();
    assert_eq!(
        c.root().begin_read().unwrap().get(b"unflushed").unwrap(),
        Some(&b"root 2"[..])
    );
    let idx = c.storage("idx").unwrap();
    assert_eq!(
        idx.begin_read().unwrap().get(b"i2").unwrap(),
        Some(&b"branch 2"[..])
    );
    assert!(idx.check().unwrap().is_ok());
    drop(c);
    drop(writer);
    drop(writer_store);
    read_all(&db, &store);
}

// Regression: `check` of a database whose root data file its user may not read (`chmod 000`,
// EACCES) printed `(root): CORRUPT (does not open)`. The cause is an I/O error: it is named,
// with the I/O exit code (2), and nothing is called corrupt. Run as nobody when the test runs
// as root (root reads any file).
#[test]
fn check_names_a_permission_error_not_corruption() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let (db, _) = populate(dir.path());
    let bin = dir.path().join("omnibus");
    std::fs::copy(env!("CARGO_BIN_EXE_omnibus"), &bin).unwrap();
    let st = children::status(Command::new("chmod").args(["-R", "a+rX"]).arg(dir.path())).unwrap();
    assert!(st.success());
    std::fs::set_permissions(
        db.join("data.pages"),
        std::fs::Permissions::from_mode(0o000),
    )
    .unwrap();
    // SAFETY: geteuid has no preconditions.
    let wrap: &[&str] = if unsafe { libc::geteuid() } == 0 {
        &[
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ]
    } else {
        &[]
    };
    let mut cmd = Command::new(wrap.first().map(Path::new).unwrap_or(&bin));
    if !wrap.is_empty() {
        cmd.args(&wrap[1..]).arg(&bin);
    }
    let o = children::output(cmd.args(["check", db.to_str().unwrap()])).unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert_eq!(o.status.code(), Some(2), "{out}\n{err}");
    assert!(!out.contains("CORRUPT"), "{out}\n{err}");
    assert!(
        out.contains("(root): UNREADABLE (does not open)"),
        "{out}\n{err}"
    );
    assert!(err.contains("Permission denied"), "{out}\n{err}");
    std::fs::set_permissions(
        db.join("data.pages"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();

    // Regression: with a branch's data file unreadable, reading the root failed too (`scan`
    // exited 2 on the index's EACCES). A read-only open leaves that branch out: the root reads,
    // and `check` names the branch UNREADABLE.
    let branch = db.join("Indexes/idx/data.pages");
    std::fs::set_permissions(&branch, std::fs::Permissions::from_mode(0o000)).unwrap();
    let run = |args: &[&str]| {
        let mut cmd = Command::new(wrap.first().map(Path::new).unwrap_or(&bin));
        if !wrap.is_empty() {
            cmd.args(&wrap[1..]).arg(&bin);
        }
        children::output(cmd.args(args)).unwrap()
    };
    let o = run(&["scan", db.to_str().unwrap()]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "flushed\troot 1\nunflushed\troot 2\n"
    );
    let o = run(&["check", db.to_str().unwrap()]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(out.contains("idx: UNREADABLE (does not open)"), "{o:?}");
    assert!(out.contains("(root): ok"), "{o:?}");
    std::fs::set_permissions(&branch, std::fs::Permissions::from_mode(0o644)).unwrap();
}
