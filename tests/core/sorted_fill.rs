//! Sorted inserts fill leaves: an append to the full rightmost leaf starts a new leaf holding
//! only the new key (as LMDB and redb do) instead of splitting the full one in half, so a
//! storage loaded in key order has nearly full leaves. Inserts elsewhere still split in half.

use omnibus::{FlushMode, Options, Storage};

fn key(i: u32) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..4].copy_from_slice(&i.to_be_bytes());
    k
}

#[test]
fn sorted_inserts_fill_leaves() {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(
        dir.path().join("s"),
        Options {
            flush_mode: FlushMode::Manual,
            ..Options::default()
        },
    )
    .unwrap();
    let n = 20_000u32;
    for chunk in 0..n / 1000 {
        let mut w = s.begin_write().unwrap();
        for i in chunk * 1000..(chunk + 1) * 1000 {
            w.put(key(i), [i as u8; 100]).unwrap();
        }
        w.commit().unwrap();
    }
    s.flush().unwrap();
    // A cell is 2 + 7 + 16 + 100 = 125 bytes: 65 fit a page body, so 20,000 keys need 308
    // full leaves (616 when every split leaves two half-full leaves).
    let st = s.stats();
    assert!(st.pages_used < 360, "{st:?}");
    assert!(s.check().unwrap().is_ok());
    // Keys in the middle and at the front still go in, splitting those leaves in half.
    let mut w = s.begin_write().unwrap();
    for i in (0..n).step_by(7) {
        let mut k = key(i).to_vec();
        k.push(1);
        w.put(&k, b"mid").unwrap();
    }
    w.put([0u8], b"front").unwrap();
    w.commit().unwrap();
    let r = s.begin_read().unwrap();
    for i in 0..n {
        assert_eq!(r.get(key(i)).unwrap(), Some(&[i as u8; 100][..]), "key {i}");
    }
    assert_eq!(r.get([0u8]).unwrap(), Some(&b"front"[..]));
    assert_eq!(r.len(), n as u64 + n.div_ceil(7) as u64 + 1);
    drop(r);
    assert!(s.check().unwrap().is_ok());
    drop(s);
    // And after a reopen (journal replay, then a flush).
    let s = Storage::open(dir.path().join("s"), Options::default()).unwrap();
    assert!(s.check().unwrap().is_ok());
    assert_eq!(
        s.begin_read().unwrap().len(),
        n as u64 + n.div_ceil(7) as u64 + 1
    );
}
