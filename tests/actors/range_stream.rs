//! Range reads as a stream and a blocking iterator: every entry of a range of any size in key
//! order (both directions, any bounds) against a `BTreeMap`, all from the snapshot taken when
//! the stream was made (commits and flushes meanwhile change nothing it yields), at most one
//! chunk buffered and one in flight.

use std::collections::BTreeMap;
use std::ops::Bound;

use futures_lite::StreamExt;
use omnibus::actors::{WriteBatch, CHUNK_ENTRIES};

use crate::common::index::open_engine;

/// Owned range bounds.
type Bounds = (Bound<Vec<u8>>, Bound<Vec<u8>>);

fn key(i: u32) -> Vec<u8> {
    format!("k{i:06}").into_bytes()
}

#[test]
fn streams_match_a_btreemap_in_both_directions_and_hold_their_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, db) = open_engine(dir.path().join("db"));
    let s = db.blocking_create_storage("s").unwrap();
    let mut model = BTreeMap::new();
    // Values of varied sizes: some chunks end on the entry count, some on the bytes.
    for part in 0..10u32 {
        let mut b = WriteBatch::new();
        for i in part * 1000..(part + 1) * 1000 {
            let v = vec![b'a' + (i % 26) as u8; 1 + (i as usize * 37) % 3000];
            b.put(key(i), v.clone());
            model.insert(key(i), v);
        }
        s.blocking_write(b).unwrap();
    }
    let bounds: Vec<Bounds> = vec![
        (Bound::Unbounded, Bound::Unbounded),
        (Bound::Included(key(17)), Bound::Excluded(key(9001))),
        (Bound::Excluded(key(17)), Bound::Included(key(9001))),
        (Bound::Included(key(500)), Bound::Included(key(500))),
        (Bound::Included(key(600)), Bound::Excluded(key(600))),
        (Bound::Excluded(key(9999)), Bound::Unbounded),
    ];
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for b in &bounds {
        let want: Vec<(Vec<u8>, Vec<u8>)> = model
            .range::<Vec<u8>, _>((b.0.clone(), b.1.clone()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let got: Vec<_> = rt.block_on(async {
            s.range_stream(b.clone())
                .unwrap()
                .map(|e| e.unwrap())
                .collect()
                .await
        });
        assert_eq!(got.len(), want.len(), "forward {b:?}");
        assert!(got == want, "forward {b:?}: entries differ");
        let back: Vec<_> = s
            .blocking_range_rev(b.clone())
            .unwrap()
            .map(|e| e.unwrap())
            .collect();
        let mut want_back = want.clone();
        want_back.reverse();
        assert!(back == want_back, "backward {b:?}: entries differ");
        let it: Vec<_> = s
            .blocking_range(b.clone())
            .unwrap()
            .map(|e| e.unwrap())
            .collect();
        assert!(it == want, "blocking iterator {b:?}: entries differ");
    }

    // The snapshot is held across chunks: everything deleted and rewritten (and flushed) after
    // the first entry was read changes nothing the stream yields.
    let mut stream = s.range_stream::<&[u8], _>(..).unwrap();
    let first = rt.block_on(stream.next()).unwrap().unwrap();
    assert_eq!(first.0, key(0));
    let mut held = vec![first];
    let mut b = WriteBatch::new();
    b.delete_range::<&[u8], _>(..);
    b.put(b"k000005x".to_vec(), b"new".to_vec());
    s.blocking_write(b).unwrap();
    let mut ahead = false;
    rt.block_on(async {
        while let Some(e) = stream.next().await {
            held.push(e.unwrap());
            let (buffered, in_flight) = stream.buffered();
            assert!(buffered <= CHUNK_ENTRIES, "{buffered} entries buffered");
            ahead |= buffered > 0 && in_flight;
        }
    });
    assert!(
        held.len() == model.len(),
        "{} of {}",
        held.len(),
        model.len()
    );
    assert!(held
        .iter()
        .zip(model.iter())
        .all(|(a, b)| a.0 == *b.0 && a.1 == *b.1));
    // The stream read ahead: a chunk was in flight while entries were still buffered.
    assert!(
        ahead,
        "no chunk was ever requested before the last one was used up"
    );
    // A new stream sees the new state.
    let now: Vec<_> = s
        .blocking_range::<&[u8], _>(..)
        .unwrap()
        .map(|e| e.unwrap().0)
        .collect();
    assert_eq!(now, vec![b"k000005x".to_vec()]);
    drop((stream, s, db));
    engine.shutdown().unwrap();
}
