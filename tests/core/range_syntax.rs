//! Range syntax: every range form a caller writes compiles and selects the same entries on both
//! transaction kinds (`a..b` over `&[u8]` used to fail with E0277), with `first`, `last`,
//! `prefix`, `iter`, `len` and `.rev()`; reads in a write transaction see its own writes.

use std::ops::Bound;

use omnibus::{Options, Result, Storage};

fn keys<'a>(it: impl Iterator<Item = Result<(&'a [u8], &'a [u8])>>) -> Vec<String> {
    it.map(|kv| String::from_utf8(kv.unwrap().0.to_vec()).unwrap())
        .collect()
}

#[test]
fn every_range_form_compiles_and_agrees() {
    // A cursor can move to another thread, as before it read write transactions.
    fn send_sync<T: Send + Sync>() {}
    send_sync::<omnibus::Range<'static>>();

    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(dir.path().join("s"), Options::default()).unwrap();
    {
        let r = s.begin_read().unwrap();
        assert_eq!(r.first().unwrap(), None);
        assert_eq!(r.last().unwrap(), None);
        assert!(r.range(..).unwrap().next_back().is_none());
    }
    let mut w = s.begin_write().unwrap();
    for k in ["a", "b", "ba", "bb", "c", "d"] {
        w.put(k, k.to_uppercase()).unwrap();
    }
    w.commit().unwrap();

    let r = s.begin_read().unwrap();
    let (a, b): (&[u8], &[u8]) = (b"b", b"c");
    // Byte-slice ranges, open and unbounded, and a pair of bounds.
    assert_eq!(
        keys(r.range(&b"b"[..]..&b"c"[..]).unwrap()),
        ["b", "ba", "bb"]
    );
    assert_eq!(keys(r.range(b"c".as_slice()..).unwrap()), ["c", "d"]);
    assert_eq!(keys(r.range::<&[u8], _>(..).unwrap()).len(), 6);
    assert_eq!(
        keys(r.range((Bound::Excluded(a), Bound::Included(b))).unwrap()),
        ["ba", "bb", "c"]
    );
    // And the other ordinary ones.
    assert_eq!(keys(r.range(..).unwrap()).len(), 6);
    assert_eq!(keys(r.range(a..=b).unwrap()), ["b", "ba", "bb", "c"]);
    assert_eq!(keys(r.range(..a).unwrap()), ["a"]);
    assert_eq!(keys(r.range(..=a).unwrap()), ["a", "b"]);
    assert_eq!(keys(r.range("ba".."c").unwrap()), ["ba", "bb"]);
    assert_eq!(
        keys(r.range(b"ba".to_vec()..).unwrap()),
        ["ba", "bb", "c", "d"]
    );
    assert_eq!(keys(r.range(b"a"..b"c").unwrap()), ["a", "b", "ba", "bb"]);
    assert_eq!(
        keys(
            r.range((Bound::<&[u8]>::Unbounded, Bound::Excluded(a)))
                .unwrap()
        ),
        ["a"]
    );
    // Inverted and empty ranges select nothing and do not panic.
    assert!(keys(r.range(b..a).unwrap()).is_empty());
    assert!(keys(r.range((Bound::Excluded(a), Bound::Excluded(a))).unwrap()).is_empty());
    // Backwards, and from both ends at once.
    assert_eq!(
        keys(r.range(a..).unwrap().rev()),
        ["d", "c", "bb", "ba", "b"]
    );
    let mut it = r.range(a..).unwrap();
    assert_eq!(it.next().unwrap().unwrap().0, b"b");
    assert_eq!(it.next_back().unwrap().unwrap().0, b"d");
    assert_eq!(keys(it.by_ref()), ["ba", "bb", "c"]);
    assert!(it.next_back().is_none());
    assert_eq!(keys(r.prefix(b"b").unwrap().rev()), ["bb", "ba", "b"]);
    assert_eq!(keys(r.iter().unwrap()).len() as u64, r.len());
    assert_eq!(r.first().unwrap(), Some((&b"a"[..], &b"A"[..])));
    assert_eq!(r.last().unwrap(), Some((&b"d"[..], &b"D"[..])));

    // The write transaction: same forms, its own uncommitted writes included.
    let mut w = s.begin_write().unwrap();
    w.put("bc", "BC").unwrap();
    w.delete("ba").unwrap();
    w.put("e", "E").unwrap();
    assert_eq!(
        keys(w.range(&b"b"[..]..&b"c"[..]).unwrap()),
        ["b", "bb", "bc"]
    );
    assert_eq!(keys(w.range(b"c".as_slice()..).unwrap()), ["c", "d", "e"]);
    assert_eq!(keys(w.range::<&[u8], _>(..).unwrap()).len(), 7);
    assert_eq!(
        keys(w.range((Bound::Excluded(a), Bound::Included(b))).unwrap()),
        ["bb", "bc", "c"]
    );
    assert_eq!(keys(w.prefix("b").unwrap().rev()), ["bc", "bb", "b"]);
    assert_eq!(w.len(), 7);
    assert_eq!(w.first().unwrap(), Some((b"a".to_vec(), b"A".to_vec())));
    assert_eq!(w.last().unwrap(), Some((b"e".to_vec(), b"E".to_vec())));
    assert_eq!(w.delete_range(b"b".as_slice()..b"c".as_slice()).unwrap(), 3);
    assert_eq!(keys(w.iter().unwrap()), ["a", "c", "d", "e"]);
    assert_eq!(keys(w.iter().unwrap().rev()), ["e", "d", "c", "a"]);
    // The snapshot taken before is unchanged.
    assert_eq!(keys(r.iter().unwrap()), ["a", "b", "ba", "bb", "c", "d"]);
    assert_eq!(w.clear().unwrap(), 4);
    assert_eq!(
        (w.len(), w.first().unwrap(), w.last().unwrap()),
        (0, None, None)
    );
    w.commit().unwrap();
    assert!(s.begin_read().unwrap().is_empty());
    assert!(s.check().unwrap().is_ok());
}
