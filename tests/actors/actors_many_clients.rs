//! 64 tokio tasks × 1,000 puts across 10 storages through the actors: every acknowledged put
//! is readable, in every storage, after shutdown and reopen.

use omnibus::actors::{Engine, EngineOptions};
use omnibus::{Database, Options};

#[test]
fn sixty_four_tasks_thousand_puts_each() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let engine = Engine::start(EngineOptions {
        executors: Some(2),
        ..EngineOptions::default()
    })
    .unwrap();
    let db = engine
        .blocking_open_database(&path, Options::default())
        .unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut handles = Vec::new();
        for i in 0..10 {
            handles.push(db.create_storage(&format!("s{i}")).await.unwrap());
        }
        let mut tasks = Vec::new();
        for t in 0..64u32 {
            let hs = handles.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..1000u32 {
                    let h = &hs[((t + i) % 10) as usize];
                    h.put(format!("t{t:02}-{i:04}"), format!("v{t}-{i}"))
                        .await
                        .unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        // Reads through the pool and through a snapshot agree.
        let h = &handles[3];
        assert_eq!(h.get("t03-0000").await.unwrap(), Some(b"v3-0".to_vec()));
        assert_eq!(
            h.snapshot().unwrap().get("t03-0000").unwrap(),
            Some(&b"v3-0"[..])
        );
        let got = h
            .multi_get(&[b"t03-0000".to_vec(), b"nope".to_vec()])
            .await
            .unwrap();
        assert_eq!(got, vec![Some(b"v3-0".to_vec()), None]);
        let r = h
            .range(
                (
                    std::ops::Bound::Included(&b"t03-"[..]),
                    std::ops::Bound::Unbounded,
                ),
                5,
            )
            .await
            .unwrap();
        assert_eq!(r.len(), 5);
        assert!(r.windows(2).all(|w| w[0].0 < w[1].0));
    });
    let st = db.stats();
    assert_eq!(st.commits, st.commits.max(1));
    assert!(st.batches < 64_000, "no group commit at all: {st:?}");
    drop(db);
    engine.shutdown().unwrap();
    let db = Database::open(&path, Options::default()).unwrap();
    let mut total = 0;
    for i in 0..10 {
        let s = db.create_storage(&format!("s{i}")).unwrap();
        assert!(s.check().unwrap().is_ok());
        total += s.begin_read().unwrap().len();
    }
    assert_eq!(total, 64_000);
    for t in 0..64u32 {
        for i in (0..1000u32).step_by(97) {
            let s = db.create_storage(&format!("s{}", (t + i) % 10)).unwrap();
            let r = s.begin_read().unwrap();
            assert_eq!(
                r.get(format!("t{t:02}-{i:04}")).unwrap(),
                Some(format!("v{t}-{i}").as_bytes())
            );
        }
    }
}
