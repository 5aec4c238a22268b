//! Poisoning through the actors: an injected EIO on the journal's fdatasync answers every
//! waiting request with an error, no request hangs (each has a deadline), later requests fail
//! with `Poisoned`, and reopening recovers every acknowledged write.

use std::sync::Arc;
use std::time::Duration;

use omnibus::actors::{Engine, EngineOptions};
use omnibus::env::testing::{Fault, HookedEnv, OpKind};
use omnibus::env::DefaultEnv;
use omnibus::{Database, Error, Options};

#[test]
fn eio_on_journal_sync_answers_every_waiter() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let env = Arc::new(HookedEnv::new(Arc::new(DefaultEnv::new())));
    let engine = Engine::start(EngineOptions {
        executors: Some(2),
        ..EngineOptions::default()
    })
    .unwrap();
    let db = engine
        .blocking_open_database(
            &path,
            Options {
                env: env.clone(),
                ..Options::default()
            },
        )
        .unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let acked = rt.block_on(async {
        let hs: Vec<_> = futures_join(&db, 4).await;
        for (i, h) in hs.iter().enumerate() {
            h.put(format!("before{i}"), b"1".to_vec()).await.unwrap();
        }
        // Every journal sync from now on fails (the first failure poisons; later ones are not
        // even attempted).
        env.fail_always(OpKind::SyncData, ".journal", Fault::Eio);
        let mut tasks = Vec::new();
        for t in 0..32u32 {
            let h = hs[(t % 4) as usize].clone();
            tasks.push(tokio::spawn(async move {
                let r = tokio::time::timeout(
                    Duration::from_secs(20),
                    h.put(format!("during{t}"), b"2".to_vec()),
                )
                .await;
                r.expect("a request hung")
            }));
        }
        let mut errors = 0;
        for t in tasks {
            if let Err(e) = t.await.unwrap() {
                assert!(
                    matches!(e, Error::Io { .. } | Error::Poisoned { .. }),
                    "{e:?}"
                );
                errors += 1;
            }
        }
        assert_eq!(errors, 32, "every request after the failure must fail");
        let later =
            tokio::time::timeout(Duration::from_secs(20), hs[0].put("after", b"3".to_vec()))
                .await
                .expect("hung");
        assert!(matches!(later, Err(Error::Poisoned { .. })), "{later:?}");
        // Reads still work.
        assert_eq!(hs[1].get("before1").await.unwrap(), Some(b"1".to_vec()));
        4
    });
    env.clear();
    drop(db);
    let _ = engine.shutdown();
    let db = Database::open(&path, Options::default()).unwrap();
    for i in 0..acked {
        let s = db.create_storage(&format!("p{i}")).unwrap();
        assert_eq!(
            s.begin_read().unwrap().get(format!("before{i}")).unwrap(),
            Some(&b"1"[..])
        );
    }
}

async fn futures_join(
    db: &omnibus::actors::DatabaseHandle,
    n: usize,
) -> Vec<omnibus::actors::StorageHandle> {
    let mut v = Vec::new();
    for i in 0..n {
        v.push(db.create_storage(&format!("p{i}")).await.unwrap());
    }
    v
}
