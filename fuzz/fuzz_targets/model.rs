//! Model target (as redb's fuzzer): random operations from the input against a `BTreeMap`,
//! with an I/O failure countdown injected through the hooked storage environment: after
//! `countdown` file operations, every later one fails with the chosen fault. After the first
//! failed call the storage must keep refusing to acknowledge commits (a commit needs an
//! `fdatasync`, and every one now fails); then, reopened with a healthy environment, it must
//! hold exactly the model's state as of the last acknowledged commit (or that state plus the
//! commit whose call failed, which may or may not have reached the disk).
#![no_main]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use omnibus::env::testing::{Fault, HookedEnv};
use omnibus::env::{DefaultEnv, StorageEnv};
use omnibus::{FlushMode, Options, Prezero, Storage};

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

#[derive(Arbitrary, Debug)]
struct Input {
    /// File operations before the failure; `None`: no failure.
    countdown: Option<u16>,
    fault: FaultKind,
    ops: Vec<Op>,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum FaultKind {
    Eio,
    Enospc,
    ShortWrite,
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// Key `k{key}`; value of `len` bytes (a large one goes to overflow pages).
    Put {
        key: u8,
        len: Len,
        byte: u8,
    },
    Delete {
        key: u8,
    },
    Commit,
    Abort,
    Flush,
    Reopen,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Len {
    Small(u8),
    Medium(u16),
    Large(u8),
}

impl Len {
    fn bytes(self) -> usize {
        match self {
            Len::Small(n) => n as usize,
            Len::Medium(n) => n as usize % 3000,
            // 8 KiB to 40 KiB: overflow runs of 2 to 6 pages.
            Len::Large(n) => 8192 + n as usize * 128,
        }
    }
}

fn opts(env: Arc<dyn StorageEnv>) -> Options {
    Options {
        env,
        flush_mode: FlushMode::Manual,
        journal_file_size: 64 << 10,
        journal_prezero: Prezero::WholeFile,
        flush_scratch_bytes: 256 << 10,
        write_mode: omnibus::WriteMode::FileIo,
        ..Options::default()
    }
}

fn key(k: u8) -> Vec<u8> {
    format!("k{k:03}").into_bytes()
}

/// The storage's committed state.
fn contents(s: &Storage) -> Model {
    let r = s.begin_read().expect("read after a healthy reopen");
    let out: Model = r
        .iter()
        .expect("iterate")
        .map(|kv| {
            let (k, v) = kv.expect("entry");
            (k.to_vec(), v.to_vec())
        })
        .collect();
    assert_eq!(r.len(), out.len() as u64, "entry count");
    out
}

fuzz_target!(|input: Input| {
    let dir = tempfile::tempdir_in(if std::path::Path::new("/dev/shm").is_dir() {
        "/dev/shm"
    } else {
        "/tmp"
    })
    .expect("dir");
    let path = dir.path().join("s");
    let hooked = HookedEnv::new(Arc::new(DefaultEnv::new()));
    let env: Arc<dyn StorageEnv> = Arc::new(hooked.clone());
    // Creation is not under test: the countdown starts once the storage exists.
    let mut s = Some(Storage::open(&path, opts(env.clone())).expect("create the storage"));
    let left = Arc::new(AtomicU64::new(
        input.countdown.map_or(u64::MAX, |c| c as u64),
    ));
    let failing = Arc::new(AtomicBool::new(false));
    let fault = match input.fault {
        FaultKind::Eio => Fault::Eio,
        FaultKind::Enospc => Fault::Enospc,
        FaultKind::ShortWrite => Fault::ShortWrite,
    };
    {
        let (left, failing) = (left.clone(), failing.clone());
        hooked.set_hook(Box::new(move |_| {
            if failing.load(Ordering::SeqCst) {
                return Some(fault);
            }
            if left.load(Ordering::SeqCst) == 0 {
                failing.store(true, Ordering::SeqCst);
                return Some(fault);
            }
            left.fetch_sub(1, Ordering::SeqCst);
            None
        }));
    }

    let mut acked = Model::new();
    // The state a failed commit would have made (it may have reached the disk).
    let mut maybe: Option<Model> = None;
    let mut txn: Option<(omnibus::WriteTransaction, Model)> = None;
    let mut failed = false;
    for op in input.ops.iter().take(64) {
        let r: omnibus::Result<()> = (|| {
            match op {
                Op::Put { key: k, len, byte } => {
                    if txn.is_none() {
                        let st = s.as_ref().ok_or(omnibus::Error::Closed)?;
                        txn = Some((st.begin_write()?, acked.clone()));
                    }
                    let (w, m) = txn.as_mut().expect("open");
                    let v = vec![*byte; len.bytes()];
                    w.put(key(*k), &v)?;
                    m.insert(key(*k), v);
                }
                Op::Delete { key: k } => {
                    if txn.is_none() {
                        let st = s.as_ref().ok_or(omnibus::Error::Closed)?;
                        txn = Some((st.begin_write()?, acked.clone()));
                    }
                    let (w, m) = txn.as_mut().expect("open");
                    let had = w.delete(key(*k))?;
                    assert_eq!(had, m.remove(&key(*k)).is_some(), "delete's answer");
                }
                Op::Commit => {
                    if let Some((w, m)) = txn.take() {
                        maybe = Some(m.clone());
                        w.commit()?;
                        acked = m;
                        maybe = None;
                    }
                }
                Op::Abort => {
                    if let Some((w, _)) = txn.take() {
                        w.abort();
                    }
                }
                Op::Flush => {
                    s.as_ref().ok_or(omnibus::Error::Closed)?.flush()?;
                }
                Op::Reopen => {
                    txn = None;
                    // Dropping closes (and flushes); a failure there is seen by the reopen.
                    s = None;
                    s = Some(Storage::open(&path, opts(env.clone()))?);
                }
            }
            Ok(())
        })();
        if r.is_err() {
            assert!(
                failing.load(Ordering::SeqCst),
                "{op:?} failed with a healthy environment: {r:?}"
            );
            failed = true;
            break;
        }
    }
    if failed {
        // Fail-stop: with every file operation failing, no commit may be acknowledged.
        txn = None;
        if let Some(Ok(mut w)) = s.as_ref().map(|s| s.begin_write()) {
            if w.put(b"after-failure", b"x").is_ok() {
                assert!(
                    w.commit().is_err(),
                    "a commit was acknowledged while every file operation fails"
                );
            }
        }
    }
    drop(txn);
    drop(s);
    // A healthy environment from here on.
    hooked.clear();
    let s = Storage::open(&path, opts(env.clone())).expect("reopen with a healthy environment");
    let got = contents(&s);
    if got != acked {
        assert_eq!(
            Some(&got),
            maybe.as_ref(),
            "state after reopen is neither the last acknowledged commit nor the failed one"
        );
    }
    let report = s.check().expect("check");
    assert!(report.is_ok(), "{:?}", report.problems);
});
