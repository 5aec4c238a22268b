//! Model test of MultiGet: random batches of keys (present, absent, duplicated, empty, too
//! long) answered by `ReadTransaction::multi_get` equal one `get` per key and a `BTreeMap`
//! model, in a tree of three levels with overflow values: on a snapshot whose pages are all
//! flushed, one with unflushed commits in the scratch table, an old snapshot held across
//! commits and a flush, after a reopen with the data file dropped from the page cache (the
//! batched reads), and in a write transaction with uncommitted writes.

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;

use omnibus::{FlushMode, Options, ReadTransaction, Storage};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

const KEYS: u32 = 30_000;

fn key(n: u32) -> Vec<u8> {
    format!("user:{n:08}").into_bytes()
}

fn value(rng: &mut SmallRng) -> Vec<u8> {
    let len = match rng.random_range(0..100) {
        0 => rng.random_range(3_000..40_000),
        1..=3 => rng.random_range(1_000..2_500),
        _ => rng.random_range(0..150),
    };
    let b: u8 = rng.random();
    (0..len).map(|i| b.wrapping_add(i as u8)).collect()
}

/// A batch of 0 to 200 keys: mostly drawn from the key space (present or not), some repeated,
/// and now and then an empty key, one too long to be stored, or one past every key.
fn batch(rng: &mut SmallRng) -> Vec<Vec<u8>> {
    let n = rng.random_range(0..200);
    let mut b: Vec<Vec<u8>> = Vec::with_capacity(n);
    for _ in 0..n {
        let k = match rng.random_range(0..40) {
            0 => Vec::new(),
            1 => vec![b'u'; 2000],
            2 => b"zzz".to_vec(),
            3..=8 if !b.is_empty() => b[rng.random_range(0..b.len())].clone(),
            _ => key(rng.random_range(0..KEYS * 2)),
        };
        b.push(k);
    }
    b
}

/// `multi_get` of random batches equals `get` per key and the model.
fn check(r: &ReadTransaction, model: &Model, rng: &mut SmallRng, batches: usize, what: &str) {
    for _ in 0..batches {
        let keys = batch(rng);
        let got = r.multi_get(&keys).unwrap();
        assert_eq!(got.len(), keys.len(), "{what}");
        for (k, v) in keys.iter().zip(&got) {
            let name = String::from_utf8_lossy(&k[..k.len().min(20)]).into_owned();
            assert_eq!(*v, r.get(k).unwrap(), "{what}: key {name} against get");
            assert_eq!(*v, model.get(k).map(|v| v.as_slice()), "{what}: key {name}");
        }
    }
}

fn opts() -> Options {
    Options {
        flush_mode: FlushMode::Manual,
        ..Options::default()
    }
}

fn load(s: &Storage, model: &mut Model, rng: &mut SmallRng, puts: u32, deletes: u32) {
    let mut w = s.begin_write().unwrap();
    for _ in 0..puts {
        let (k, v) = (key(rng.random_range(0..KEYS * 2)), value(rng));
        w.put(&k, &v).unwrap();
        model.insert(k, v);
    }
    for _ in 0..deletes {
        let k = key(rng.random_range(0..KEYS * 2));
        w.delete(&k).unwrap();
        model.remove(&k);
    }
    w.commit().unwrap();
}

#[test]
fn multi_get_equals_get() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let mut rng = SmallRng::seed_from_u64(14);
    let s = Storage::open(&path, opts()).unwrap();
    let mut model = Model::new();
    assert_eq!(
        s.begin_read().unwrap().multi_get(&[b"a", b"b"]).unwrap(),
        vec![None, None],
        "an empty storage"
    );
    for _ in 0..3 {
        load(&s, &mut model, &mut rng, KEYS / 3, 500);
    }
    s.flush().unwrap();
    check(&s.begin_read().unwrap(), &model, &mut rng, 30, "flushed");

    // Unflushed commits: their pages are read from the scratch table.
    load(&s, &mut model, &mut rng, 2_000, 2_000);
    let held = s.begin_read().unwrap();
    let held_model = model.clone();
    check(&held, &held_model, &mut rng, 30, "scratch");

    // The held snapshot keeps its view across later commits and a flush.
    load(&s, &mut model, &mut rng, 2_000, 2_000);
    s.flush().unwrap();
    load(&s, &mut model, &mut rng, 500, 500);
    check(&held, &held_model, &mut rng, 20, "held across a flush");
    check(&s.begin_read().unwrap(), &model, &mut rng, 20, "after");

    // A write transaction sees its own uncommitted writes.
    let mut w = s.begin_write().unwrap();
    let mut wmodel = model.clone();
    for i in 0..300 {
        let k = key(rng.random_range(0..KEYS * 2));
        if i % 3 == 0 {
            w.delete(&k).unwrap();
            wmodel.remove(&k);
        } else {
            let v = value(&mut rng);
            w.put(&k, &v).unwrap();
            wmodel.insert(k, v);
        }
    }
    let keys: Vec<Vec<u8>> = batch(&mut rng)
        .into_iter()
        .filter(|k| !k.is_empty() && k.len() <= 1024)
        .collect();
    let got = w.multi_get(&keys).unwrap();
    for (k, v) in keys.iter().zip(&got) {
        assert_eq!(v.as_ref(), wmodel.get(k), "write transaction");
    }
    w.abort();
    drop(held);
    s.flush().unwrap();
    s.close().unwrap();

    // Cold: the data file dropped from the page cache after the open, so the batches read
    // the pages they miss together.
    let s = Storage::open(&path, opts()).unwrap();
    let f = std::fs::File::open(path.join("data.pages")).unwrap();
    // SAFETY: posix_fadvise only advises the kernel about the descriptor's pages.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    check(&s.begin_read().unwrap(), &model, &mut rng, 30, "cold");
    assert!(s.check().unwrap().is_ok());
}
