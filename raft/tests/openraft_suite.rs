//! openraft's own storage test suite (`openraft::testing::Suite`: a peer's tests, not ours)
//! against `LogStore` and `StateMachine` over omnibus storages: votes, appends, reads of log
//! ranges, truncate, purge, log state, apply, membership, snapshot build, transfer and
//! install. Each of its cases builds a fresh database (one engine for all of them).

use std::sync::atomic::{AtomicU64, Ordering};

use omnibus::actors::{Engine, EngineOptions};
use omnibus_raft::{LogStore, StateMachine, StorageError, TypeConfig};
use openraft::testing::{StoreBuilder, Suite};

struct Builder {
    engine: Engine,
    dir: tempfile::TempDir,
    next: AtomicU64,
}

impl StoreBuilder<TypeConfig, LogStore, StateMachine, ()> for Builder {
    async fn build(&self) -> Result<((), LogStore, StateMachine), StorageError> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let dir = self.dir.path().join(n.to_string());
        std::fs::create_dir_all(&dir).expect("case directory");
        let db = self
            .engine
            .open_database(dir.join("db"), omnibus::Options::default())
            .await
            .expect("open database");
        let log = LogStore::new(db.create_storage("raft-log-0").await.expect("log storage"));
        let sm = StateMachine::open(db, 0, log.clone(), &dir.join("snapshots")).await?;
        Ok(((), log, sm))
    }
}

pub fn openraft_storage_suite_passes() {
    let engine = Engine::start(EngineOptions {
        executors: Some(1),
        ..Default::default()
    })
    .expect("engine");
    let b = Builder {
        engine: engine.clone(),
        dir: tempfile::tempdir().expect("tempdir"),
        next: AtomicU64::new(0),
    };
    Suite::test_all(b).expect("openraft's storage suite");
    engine.shutdown().expect("engine shutdown");
}
