//! Basic scenario: put, get, overwrite, delete, large values, reopen.

use omnibus::{Error, FlushMode, Options, Storage};

fn opts() -> Options {
    Options {
        flush_mode: FlushMode::Manual,
        ..Options::default()
    }
}

#[test]
fn put_get_delete_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    {
        let s = Storage::open(&path, opts()).unwrap();
        let mut w = s.begin_write().unwrap();
        for i in 0..5000u32 {
            w.put(format!("key{i:06}"), format!("value{i}")).unwrap();
        }
        w.put(b"big", vec![7u8; 3 << 20]).unwrap();
        w.commit().unwrap();
        let r = s.begin_read().unwrap();
        assert_eq!(r.get(b"key000042").unwrap(), Some(&b"value42"[..]));
        assert_eq!(r.get(b"big").unwrap().unwrap().len(), 3 << 20);
        assert_eq!(r.len(), 5001);
        let mut w = s.begin_write().unwrap();
        for i in (0..5000u32).step_by(2) {
            assert!(w.delete(format!("key{i:06}")).unwrap());
        }
        assert!(!w.delete(b"nope").unwrap());
        w.commit().unwrap();
        // The old snapshot still sees everything.
        assert_eq!(r.get(b"key000042").unwrap(), Some(&b"value42"[..]));
        let r2 = s.begin_read().unwrap();
        assert_eq!(r2.get(b"key000042").unwrap(), None);
        assert_eq!(r2.get(b"key000043").unwrap(), Some(&b"value43"[..]));
        let keys: Vec<Vec<u8>> = r2
            .iter()
            .unwrap()
            .map(|kv| kv.unwrap().0.to_vec())
            .collect();
        assert_eq!(keys.len(), 2501);
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
        let report = s.check().unwrap();
        assert!(report.is_ok(), "{:?}", report.problems);
        drop(r);
        drop(r2);
        s.close().unwrap();
    }
    let s = Storage::open(&path, opts()).unwrap();
    let r = s.begin_read().unwrap();
    assert_eq!(r.len(), 2501);
    assert_eq!(r.get(b"key000043").unwrap(), Some(&b"value43"[..]));
    assert_eq!(r.get(b"big").unwrap().unwrap(), &vec![7u8; 3 << 20][..]);
    let report = s.check().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
}

#[test]
fn limits_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(dir.path().join("s"), opts()).unwrap();
    let mut w = s.begin_write().unwrap();
    assert!(matches!(w.put(b"", b"v"), Err(Error::EmptyKey)));
    assert!(matches!(
        w.put(vec![1u8; 1025], b"v"),
        Err(Error::KeyTooLarge {
            len: 1025,
            max: 1024
        })
    ));
    w.put(vec![1u8; 1024], b"v").unwrap();
    // Reads answer a key that could never be stored as absent, in a write transaction as in a
    // read one (a write transaction's get of an empty key was an EmptyKey error).
    assert_eq!(w.get(b"").unwrap(), None);
    assert_eq!(w.get(vec![1u8; 1025]).unwrap(), None);
    assert_eq!(
        w.multi_get(&[&b""[..], &[1u8; 1024][..]]).unwrap(),
        [None, Some(b"v".to_vec())]
    );
    let huge = vec![0u8; omnibus::MAX_VALUE_LEN + 1];
    assert!(matches!(
        w.put(b"k", &huge),
        Err(Error::ValueTooLarge { .. })
    ));
    w.commit().unwrap();
    assert_eq!(s.begin_read().unwrap().len(), 1);
}
