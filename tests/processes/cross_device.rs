//! A branch storage on another file system, or another mount of the same one, gets
//! `Error::CrossDevice`, and the database stays usable.
//!
//! The story: a shared journal hard-links its files into each branch's `Journals/`, and hard
//! links cannot cross file systems, nor mounts (`link(2)` returns `EXDEV` across two mounts of
//! one file system too). A branch directory on a tmpfs (a symlink from `Indexes/` to it) was
//! caught by the device-number check; a directory bind-mounted from the root's own file system
//! has the same device number, so the branch opened, and its first commit's link failed with
//! `EXDEV` as a plain I/O error that failed the batch and poisoned the whole database. The
//! database now also compares mount ids, and a link's `EXDEV` is `Error::CrossDevice`.
//!
//! Mounting needs root: CI runs as root with `OMNIBUS_TEST_STRICT=1`, under which a missing
//! privilege fails the test; elsewhere the test prints why and returns.

use std::path::{Path, PathBuf};
use std::process::Command;

use omnibus::{Database, Error, FlushMode, Options};

use crate::common::children;
use crate::common::requires;

/// Unmounts its paths when dropped (also when an assertion fails).
struct Mounts(Vec<PathBuf>);

impl Drop for Mounts {
    fn drop(&mut self) {
        for p in self.0.iter().rev() {
            let _ = children::status(Command::new("umount").arg(p));
        }
    }
}

/// Runs `mount args...`; `Err` with the reason when it fails.
fn mount(args: &[&str], at: &Path) -> Result<(), String> {
    let out = children::output(Command::new("mount").args(args).arg(at))
        .map_err(|e| format!("cannot run mount: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "mount {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn opts() -> Options {
    Options {
        flush_mode: FlushMode::Manual,
        ..Options::default()
    }
}

fn put(db: &Database, storage: &str, key: &str) -> omnibus::Result<()> {
    let s = if storage.is_empty() {
        db.root()
    } else {
        db.create_storage(storage)?
    };
    let mut w = s.begin_write()?;
    w.put(key, b"v")?;
    w.commit()
}

#[test]
fn branch_on_another_file_system_or_mount_is_cross_device() {
    let _no_children = children::no_children_meanwhile();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let db = Database::open(&path, opts()).unwrap();
    put(&db, "", "before").unwrap();

    // Another file system: a tmpfs, reached through a symlink from Indexes/.
    let tmpfs = dir.path().join("tmpfs");
    std::fs::create_dir(&tmpfs).unwrap();
    let mut mounts = Mounts(Vec::new());
    if let Err(why) = mount(&["-t", "tmpfs", "-o", "size=8m", "tmpfs"], &tmpfs) {
        requires::cannot_run(&format!(
            "cannot mount a file system here ({why}); needs root"
        ));
        return;
    }
    mounts.0.push(tmpfs.clone());
    std::fs::create_dir(tmpfs.join("far")).unwrap();
    std::os::unix::fs::symlink(tmpfs.join("far"), path.join("Indexes/far")).unwrap();
    let e = db.create_storage("far").unwrap_err();
    assert!(matches!(&e, Error::CrossDevice { .. }), "{e:?}");

    // A loop-mounted file system: an ext4 image in a file, mounted with `-o loop` (a disk of
    // its own, as a second drive would be). Skipped, saying why, where no loop device exists.
    let image = dir.path().join("ext4.img");
    let loopfs = dir.path().join("loopfs");
    std::fs::create_dir(&loopfs).unwrap();
    std::fs::File::create(&image)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let mkfs = children::status(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image));
    match mkfs {
        Ok(st) if st.success() => match mount(&["-o", "loop", image.to_str().unwrap()], &loopfs) {
            Ok(()) => {
                mounts.0.push(loopfs.clone());
                std::fs::create_dir(loopfs.join("disk")).unwrap();
                std::os::unix::fs::symlink(loopfs.join("disk"), path.join("Indexes/disk")).unwrap();
                let e = db.create_storage("disk").unwrap_err();
                assert!(matches!(&e, Error::CrossDevice { .. }), "{e:?}");
                assert!(!db.root().is_poisoned());
            }
            Err(why) => requires::cannot_run(&format!("loop-mounted case: {why}")),
        },
        other => requires::cannot_run(&format!("loop-mounted case: mkfs.ext4: {other:?}")),
    }

    // Another mount of the root's own file system: a bind mount (same device number).
    let other = dir.path().join("other");
    let bound = path.join("Indexes/bound");
    std::fs::create_dir(&other).unwrap();
    std::fs::create_dir(&bound).unwrap();
    mount(&["--bind", other.to_str().unwrap()], &bound).unwrap();
    mounts.0.push(bound.clone());
    let e = put(&db, "bound", "k").unwrap_err();
    assert!(matches!(&e, Error::CrossDevice { .. }), "{e:?}");

    // The database stays usable: the root and a branch on its own file system commit.
    assert!(!db.root().is_poisoned());
    put(&db, "", "after").unwrap();
    put(&db, "near", "k").unwrap();
    drop(db);
    drop(mounts);
    let db = Database::open(&path, opts()).unwrap();
    let r = db.root().begin_read().unwrap();
    assert!(r.get("before").unwrap().is_some() && r.get("after").unwrap().is_some());
    assert!(db
        .storage("near")
        .unwrap()
        .begin_read()
        .unwrap()
        .get("k")
        .unwrap()
        .is_some());
    assert_eq!(db.storages(), vec!["near".to_string()]);
}
