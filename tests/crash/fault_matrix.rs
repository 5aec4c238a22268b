//! Every fault kind on every file operation.
//!
//! For each (operation kind, fault) pair, a small database workload (the root and a branch
//! storage: commits, a large commit that rotates the journal, flushes, a delete whose flush
//! punches a hole, close, reopen, more commits) runs through a `HookedEnv` with the fault
//! injected once at a chosen occurrence of the operation (first, middle, last of a clean run),
//! and `EINTR`/`EAGAIN` also several times in a row. Then:
//! - `EINTR`/`EAGAIN`: the engine's bounded retry (`env::retry`) hides them: no step fails;
//! - `EOPNOTSUPP` on `fallocate` (growth or hole punch): the documented fallback, no step fails;
//! - anything else that surfaces is a typed error carrying the injected `errno` (or
//!   `Error::CrossDevice` for `EXDEV` on a link), never a panic; a commit that fails without
//!   poisoning its storage leaves it usable (the next commit succeeds);
//! - after reopening with a healthy environment, every acknowledged commit is there, and every
//!   commit that failed is all there or not there at all; `check` passes.
//!
//! The table of outcomes is in docs/design.md ("Fault kinds on every file operation").

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::Arc;

use omnibus::env::testing::{Fault, HookedEnv, OpKind};
use omnibus::env::{DefaultEnv, StorageEnv};
use omnibus::{Database, Error, FlushMode, Options, Storage};

/// One commit of the workload.
#[derive(Debug, Clone)]
struct Commit {
    /// 0: the root, 1: the branch.
    storage: usize,
    /// Keys put (each with `value(key)`), or deleted when `delete`.
    keys: Vec<String>,
    delete: bool,
    acked: bool,
}

/// What one run saw.
#[derive(Debug, Default)]
struct Run {
    commits: Vec<Commit>,
    /// Errors surfaced by any step, with the step's name.
    errors: Vec<(String, Error)>,
}

const BIG: usize = 256 << 10;

fn value(key: &str) -> Vec<u8> {
    let n = if key.starts_with("big") { BIG } else { 300 };
    let mut v = key.as_bytes().repeat(n / key.len() + 1);
    v.truncate(n);
    v
}

fn opts(env: Arc<dyn StorageEnv>) -> Options {
    Options {
        env,
        flush_mode: FlushMode::Manual,
        journal_file_size: 64 << 10,
        journal_pool_files: 1,
        ..Options::default()
    }
}

/// Commits `keys` (put, or delete) on `s` and records the outcome; when the commit fails and
/// the storage is not poisoned, the next commit on it must succeed (checked by the caller's
/// ordering: recorded as `unpoisoned_failure`).
fn commit(run: &mut Run, s: &Storage, storage: usize, keys: Vec<String>, delete: bool) -> bool {
    let r = (|| -> omnibus::Result<()> {
        let mut w = s.begin_write()?;
        for k in &keys {
            if delete {
                w.delete(k)?;
            } else {
                w.put(k, value(k))?;
            }
        }
        w.commit()
    })();
    let acked = r.is_ok();
    if let Err(e) = r {
        run.errors.push((format!("commit {}", keys[0]), e));
    }
    run.commits.push(Commit {
        storage,
        keys,
        delete,
        acked,
    });
    acked
}

fn step(run: &mut Run, name: &str, r: omnibus::Result<()>) {
    if let Err(e) = r {
        run.errors.push((name.to_string(), e));
    }
}

/// The workload: two sessions of the database through `env`.
fn workload(path: &Path, env: Arc<dyn StorageEnv>) -> Run {
    let mut run = Run::default();
    let small =
        |tag: &str, i: u32| -> Vec<String> { (0..3).map(|j| format!("{tag}{i:03}-{j}")).collect() };
    // Session 1.
    match Database::open(path, opts(env.clone())) {
        Err(e) => run.errors.push(("open 1".into(), e)),
        Ok(db) => {
            let root = db.root();
            let branch = db.create_storage("b1");
            if let Err(e) = &branch {
                run.errors.push(("storage b1".into(), e.clone()));
            }
            for i in 0..6 {
                commit(&mut run, &root, 0, small("r", i), false);
                if let Ok(b) = &branch {
                    commit(&mut run, b, 1, small("b", i), false);
                }
            }
            // A batch larger than a journal file: a file of its own (rotation); data file growth.
            let big: Vec<String> = (0..10).map(|i| format!("big{i:02}")).collect();
            commit(&mut run, &root, 0, big.clone(), false);
            step(&mut run, "flush 1", db.flush().map(|_| ()));
            commit(&mut run, &root, 0, small("r", 6), false);
            step(&mut run, "flush 2", db.flush().map(|_| ()));
            // Frees 2.5 MiB of pages: the flush punches the aligned MiB runs.
            commit(&mut run, &root, 0, big, true);
            step(&mut run, "flush 3", db.flush().map(|_| ()));
            for i in 7..12 {
                commit(&mut run, &root, 0, small("r", i), false);
                if let Ok(b) = &branch {
                    commit(&mut run, b, 1, small("b", i), false);
                }
            }
            drop((root, branch));
            step(&mut run, "close 1", db.close());
        }
    }
    // Session 2: recovery of what session 1 left (it may have failed mid-way), more commits.
    match Database::open(path, opts(env)) {
        Err(e) => run.errors.push(("open 2".into(), e)),
        Ok(db) => {
            let root = db.root();
            let branch = db.create_storage("b1");
            if let Err(e) = &branch {
                run.errors.push(("storage b1 2".into(), e.clone()));
            }
            for i in 12..16 {
                commit(&mut run, &root, 0, small("r", i), false);
                if let Ok(b) = &branch {
                    commit(&mut run, b, 1, small("b", i), false);
                }
            }
            step(&mut run, "flush 4", db.flush().map(|_| ()));
            drop((root, branch));
            step(&mut run, "close 2", db.close());
        }
    }
    run
}

/// Reopens with a healthy environment and checks every commit: acknowledged ones are there
/// (or, for a put, deleted by a later acknowledged delete), failed ones all or nothing.
fn verify(path: &Path, run: &Run, label: &str) {
    let db = Database::open(path, opts(Arc::new(DefaultEnv::new()))).unwrap_or_else(|e| {
        panic!(
            "{label}: healthy reopen failed: {e:?} (errors {:?})",
            run.errors
        )
    });
    let stores = [Some(db.root()), db.storage("b1").ok()];
    // Key -> (present expected, or None: either).
    let mut want: BTreeMap<(usize, String), Option<bool>> = BTreeMap::new();
    for c in &run.commits {
        for k in &c.keys {
            let e = want.entry((c.storage, k.clone())).or_insert(Some(false));
            *e = match (c.acked, c.delete) {
                (true, d) => Some(!d),
                // A failed commit: its keys are as before, or as it wanted.
                (false, d) if *e == Some(!d) => *e,
                (false, _) => None,
            };
        }
    }
    for c in run.commits.iter().filter(|c| !c.acked) {
        let Some(s) = &stores[c.storage] else {
            continue;
        };
        let r = s.begin_read().unwrap();
        // All or nothing: the keys whose outcome is uncertain only through this commit agree.
        let seen: Vec<bool> = c.keys.iter().map(|k| r.get(k).unwrap().is_some()).collect();
        if !c.delete && want.get(&(c.storage, c.keys[0].clone())) == Some(&None) {
            assert!(
                seen.iter().all(|&b| b == seen[0]),
                "{label}: failed commit {:?} is half there: {seen:?}",
                c.keys
            );
        }
    }
    for ((si, k), w) in &want {
        let Some(s) = &stores[*si] else {
            assert!(
                w != &Some(true),
                "{label}: branch missing but {k} acknowledged (errors {:?})",
                run.errors
            );
            continue;
        };
        let r = s.begin_read().unwrap();
        let got = r.get(k).unwrap();
        if let Some(v) = got {
            assert_eq!(v, &value(k)[..], "{label}: {k} has a wrong value");
        }
        if let Some(present) = w {
            assert_eq!(
                got.is_some(),
                *present,
                "{label}: storage {si} key {k} (errors {:?})",
                run.errors
            );
        }
    }
    for s in stores.iter().flatten() {
        let report = s.check().unwrap();
        assert!(report.is_ok(), "{label}: {:?}", report.problems);
    }
}

/// True when `e` is a typed error carrying `errno` (directly, or as the cause of a poisoning).
fn typed(e: &Error, errno: i32) -> bool {
    match e {
        Error::Io { source, .. } => source.raw_os_error() == Some(errno),
        Error::Poisoned { cause } => {
            cause.contains(&format!("(os error {errno})"))
                || (errno == libc::EXDEV && cause.contains("on another file system"))
        }
        Error::CrossDevice { .. } => errno == libc::EXDEV,
        Error::NoSpace { .. } => errno == libc::ENOSPC,
        _ => false,
    }
}

fn errno_of(f: Fault) -> i32 {
    match f {
        Fault::Eio | Fault::ShortWrite | Fault::ShortRead => libc::EIO,
        Fault::Enospc => libc::ENOSPC,
        Fault::Exdev => libc::EXDEV,
        Fault::Ecanceled => libc::ECANCELED,
        Fault::Eopnotsupp => libc::EOPNOTSUPP,
        Fault::Eintr => libc::EINTR,
        Fault::Eagain => libc::EAGAIN,
        Fault::Errno(c) => c,
        _ => 0,
    }
}

/// A hooked environment for injecting faults into `kind`. `set_len` runs only where the file
/// system has no `fallocate` (files grow by `set_len` and zero writes): for it, every
/// `fallocate` fails with `EOPNOTSUPP`.
fn hooked(kind: OpKind) -> Arc<HookedEnv> {
    let env = Arc::new(HookedEnv::new(Arc::new(DefaultEnv::new())));
    if kind == OpKind::SetLen {
        env.fail_always(OpKind::Allocate, "", Fault::Eopnotsupp);
    }
    env
}

fn shm_tempdir() -> tempfile::TempDir {
    // tmpfs: fdatasync is free there, so the few hundred runs take seconds.
    if Path::new("/dev/shm").is_dir() {
        if let Ok(d) = tempfile::tempdir_in("/dev/shm") {
            return d;
        }
    }
    tempfile::tempdir().unwrap()
}

#[test]
fn every_fault_kind_on_every_operation() {
    // A clean run: how many operations of each kind the workload makes.
    let clean = OpKind::ALL.map(|k| {
        let d = shm_tempdir();
        let env = hooked(k);
        let t = std::time::Instant::now();
        let run = workload(&d.path().join("db"), env.clone());
        assert!(run.errors.is_empty(), "{:?}", run.errors);
        verify(&d.path().join("db"), &run, "clean");
        eprintln!("{k:?}: clean run {:?}", t.elapsed());
        (k, env.count(k))
    });
    eprintln!("operations per kind: {clean:?}");
    let faults: &[(Fault, u64)] = &[
        (Fault::Eio, 1),
        (Fault::Enospc, 1),
        (Fault::Exdev, 1),
        (Fault::Ecanceled, 1),
        (Fault::Eopnotsupp, 1),
        (Fault::ShortWrite, 1),
        (Fault::ShortRead, 1),
        (Fault::Eintr, 1),
        (Fault::Eintr, 3),
        (Fault::Eagain, 3),
    ];
    let mut runs = 0;
    let mut surfaced = 0;
    for (kind, count) in clean {
        assert!(count > 0, "the workload makes no {kind:?}");
        let mut at = vec![1, count.div_ceil(2), count];
        at.dedup();
        for &(fault, times) in faults {
            if (fault == Fault::ShortWrite && kind != OpKind::Write)
                || (fault == Fault::ShortRead && kind != OpKind::Read)
            {
                continue;
            }
            for &n in &at {
                let label = format!("{kind:?} #{n} {fault:?} x{times}");
                let d = shm_tempdir();
                let path = d.path().join("db");
                let env = hooked(kind);
                for t in 0..times {
                    env.fail(kind, n + t, fault);
                }
                let run =
                    std::panic::catch_unwind(AssertUnwindSafe(|| workload(&path, env.clone())))
                        .unwrap_or_else(|_| panic!("{label}: the workload panicked"));
                env.clear();
                runs += 1;
                if let Some(e) = run.errors.first() {
                    eprintln!("{label}: {} errors, first {e:?}", run.errors.len());
                }
                let errno = errno_of(fault);
                let retried = matches!(fault, Fault::Eintr | Fault::Eagain);
                let fallback = fault == Fault::Eopnotsupp
                    && matches!(kind, OpKind::Allocate | OpKind::PunchHole);
                if retried || fallback {
                    assert!(run.errors.is_empty(), "{label}: {:?}", run.errors);
                }
                for (step, e) in &run.errors {
                    assert!(
                        typed(e, errno),
                        "{label}: {step} gave an untyped error {e:?}"
                    );
                }
                if (kind, fault) == (OpKind::Link, Fault::Exdev) {
                    // A link that cannot cross to the branch's file system says so.
                    let first = run.errors.first().map(|(_, e)| e);
                    assert!(
                        matches!(first, Some(Error::CrossDevice { .. })),
                        "{label}: {first:?}"
                    );
                }
                surfaced += !run.errors.is_empty() as u32;
                // A failed commit that did not poison left its storage usable: the next commit
                // on the same storage in the same session succeeded (or the session ended).
                for (i, c) in run.commits.iter().enumerate() {
                    if c.acked {
                        continue;
                    }
                    let next = run.commits[i + 1..].iter().find(|n| n.storage == c.storage);
                    let poisoned = run
                        .errors
                        .iter()
                        .any(|(_, e)| matches!(e, Error::Poisoned { .. }));
                    if let Some(n) = next {
                        assert!(
                            n.acked || poisoned || run.errors.iter().any(|(s, _)| s.starts_with("open") || s.starts_with("close") || s.starts_with("flush")),
                            "{label}: a failed commit left its storage unusable without poisoning it: {:?}",
                            run.errors
                        );
                    }
                }
                verify(&path, &run, &label);
            }
        }
    }
    eprintln!("{runs} runs, {surfaced} with an error surfaced");
}
