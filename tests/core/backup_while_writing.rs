//! `Storage::backup` while a writer commits and flushes run: every copy opens standalone (no
//! journal), passes `check`, and holds exactly the content of the snapshot it names (the
//! writer's model at the copy's txn id), big values in overflow runs included. A destination
//! that holds anything is refused with a typed error and left alone; `ENOSPC` while writing
//! the copy is typed too (`is_no_space`) and removes the partial copy.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use omnibus::env::testing::{Fault, HookedEnv, OpKind};
use omnibus::env::{default_env, StorageEnv};
use omnibus::{Error, FlushMode, Options, Storage};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::common::model;
use model::{content, diff, Model};

#[test]
fn backups_taken_while_writing_equal_their_snapshot_and_open_standalone() {
    let dir = tempfile::tempdir().unwrap();
    let hooked = Arc::new(HookedEnv::new(default_env()));
    let env: Arc<dyn StorageEnv> = hooked.clone();
    let opts = Options {
        env: env.clone(),
        // Flushes during the test: some committed pages are in the data file, some only in
        // the scratch table and the journal when a copy is taken.
        flush_scratch_bytes: 256 << 10,
        ..Options::default()
    };
    let s = Storage::open(dir.path().join("src"), opts).unwrap();
    let models: Arc<Mutex<HashMap<u64, Model>>> = Arc::default();
    models.lock().unwrap().insert(0, Model::new());
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (s, models, stop) = (s.clone(), models.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rng = SmallRng::seed_from_u64(7);
            let mut m = Model::new();
            let mut n = 0u32;
            while !stop.load(Ordering::Relaxed) || n < 50 {
                let mut w = s.begin_write().unwrap();
                let txn = w.txn_id();
                for _ in 0..rng.random_range(1..20) {
                    let k = format!("key{:05}", rng.random_range(0..3000)).into_bytes();
                    if rng.random_range(0..4) == 0 {
                        w.delete(&k).unwrap();
                        m.remove(&k);
                    } else {
                        // Now and then a value too big for a leaf (an overflow run).
                        let len = if rng.random_range(0..30) == 0 {
                            9000
                        } else {
                            40
                        };
                        let v = vec![rng.random::<u8>(); len];
                        w.put(&k, &v).unwrap();
                        m.insert(k, v);
                    }
                }
                w.commit().unwrap();
                models.lock().unwrap().insert(txn, m.clone());
                n += 1;
            }
        })
    };

    let mut copies = Vec::new();
    for i in 0..6 {
        std::thread::sleep(std::time::Duration::from_millis(30));
        let dest = dir.path().join(format!("copy{i}"));
        let r = s.backup(&dest).unwrap();
        assert_eq!(r.storages, 1);
        copies.push((dest, r));
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let models = models.lock().unwrap();
    let mut txns = Vec::new();
    for (dest, r) in &copies {
        // A copy needs no journal but for the entries its snapshot held buffered: one file.
        let journal_files = std::fs::read_dir(dest.join("Journals")).unwrap().count();
        // Manual flushes: the copy's flush service applied the buffered entries it replayed
        // (their records are in a journal file no longer current) before they were counted.
        let c = Storage::open(
            dest,
            Options {
                flush_mode: FlushMode::Manual,
                ..Options::default()
            },
        )
        .unwrap();
        assert_eq!(
            journal_files,
            usize::from(c.stats().buffer_entries > 0),
            "{:?}",
            c.stats()
        );
        let report = c.check().unwrap();
        assert!(report.is_ok(), "copy at txn {}: {report:?}", r.txn_id);
        let want = &models[&r.txn_id];
        let got = content(&c).unwrap();
        assert!(
            &got == want,
            "copy at txn {}: {}",
            r.txn_id,
            diff(want, &got)
        );
        assert_eq!(r.entries, want.len() as u64);
        assert_ne!(
            c.storage_id(),
            s.storage_id(),
            "a copy gets its own storage id"
        );
        // The copy is a working storage.
        let mut w = c.begin_write().unwrap();
        w.put("after", "copy").unwrap();
        w.commit().unwrap();
        assert!(c.check().unwrap().is_ok());
        txns.push(r.txn_id);
    }
    assert!(
        txns.windows(2).any(|w| w[0] != w[1]),
        "the writer committed between copies: {txns:?}"
    );

    // A destination holding anything is refused and left as it was.
    let full = dir.path().join("full");
    std::fs::create_dir(&full).unwrap();
    std::fs::write(full.join("precious"), b"x").unwrap();
    assert!(matches!(
        s.backup(&full),
        Err(Error::DestinationNotEmpty { .. })
    ));
    assert_eq!(std::fs::read(full.join("precious")).unwrap(), b"x");
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"y").unwrap();
    assert!(matches!(
        s.backup(&file),
        Err(Error::DestinationNotEmpty { .. })
    ));

    // A full disk while writing the copy: a typed error, and no partial copy is left.
    hooked.fail_always(OpKind::Write, "nospace", Fault::Enospc);
    let dest = dir.path().join("nospace");
    let e = s.backup(&dest).unwrap_err();
    assert!(e.is_no_space(), "{e}");
    assert!(!dest.exists(), "the partial copy was removed");
    // An empty directory given by the caller is emptied again, not removed.
    let empty = dir.path().join("nospace-empty");
    std::fs::create_dir(&empty).unwrap();
    assert!(s.backup(&empty).unwrap_err().is_no_space());
    assert!(std::fs::read_dir(&empty).unwrap().next().is_none());
    hooked.clear();
    assert!(!s.is_poisoned(), "a failed backup leaves the storage alone");
    s.backup(&empty).unwrap();
}
