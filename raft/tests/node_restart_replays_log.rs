//! A node restart replays its raft log from omnibus: a single-voter node with two groups
//! writes keys, stops, and loses its state-machine storages (dropped while it is down); on
//! reopen every group's log (vote, entries) comes back from its log storage, the node elects
//! itself again, and applying the log rebuilds every key in a fresh state machine.

use std::collections::BTreeMap;
use std::time::Duration;

use omnibus::actors::{Engine, EngineOptions};
use omnibus_raft::{NodeOptions, RaftNode, Request};
use openraft::BasicNode;

const GROUPS: u64 = 2;
const KEYS: u64 = 40;

fn engine() -> Engine {
    Engine::start(EngineOptions {
        executors: Some(1),
        ..Default::default()
    })
    .expect("engine")
}

fn opts() -> NodeOptions {
    NodeOptions {
        groups: GROUPS,
        ..Default::default()
    }
}

pub fn restart_replays_the_log_into_an_empty_state_machine() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let wait = Some(Duration::from_secs(20));

    // First life: initialize, write KEYS keys per group.
    let engine1 = engine();
    let last_log: Vec<u64> = rt.block_on(async {
        let node = RaftNode::open(&engine1, 1, dir.path(), opts())
            .await
            .expect("open");
        let members = BTreeMap::from([(1, BasicNode::new("127.0.0.1:1"))]);
        node.initialize(members).await.expect("initialize");
        let mut last = Vec::new();
        for g in 0..GROUPS {
            let raft = node.raft(g).expect("group");
            raft.wait(wait)
                .current_leader(1, "leader")
                .await
                .expect("leader");
            for i in 0..KEYS {
                let r = Request::Set {
                    key: format!("g{g}-k{i}"),
                    value: format!("v{i}"),
                };
                raft.client_write(r).await.expect("write");
            }
            let m = raft.metrics().borrow().clone();
            raft.wait(wait)
                .applied_index_at_least(m.last_log_index, "applied")
                .await
                .expect("applied");
            assert_eq!(node.kv(g).expect("kv").len().expect("len"), KEYS);
            last.push(m.last_log_index.expect("log index"));
        }
        node.shutdown().await.expect("shutdown");
        last
    });
    engine1.shutdown().expect("engine shutdown");

    // While the node is down, its state machines are lost: only the logs remain.
    {
        let db = omnibus::Database::open(dir.path().join("db"), omnibus::Options::default())
            .expect("open database");
        for g in 0..GROUPS {
            db.drop_storage(&format!("raft-sm-{g}-0"))
                .expect("drop state machine");
        }
        db.close().expect("close");
    }

    // Second life: the logs come back from omnibus and are applied again.
    let engine2 = engine();
    rt.block_on(async {
        let node = RaftNode::open(&engine2, 1, dir.path(), opts())
            .await
            .expect("reopen");
        for g in 0..GROUPS {
            let raft = node.raft(g).expect("group");
            // The log comes back from the log storage (the metrics fill in as the raft
            // instance starts).
            let m = raft
                .wait(wait)
                .log_index_at_least(Some(last_log[g as usize]), "log restored")
                .await
                .expect("log restored");
            assert!(m.vote.leader_id().term >= 1, "group {g}: vote not restored");
            raft.wait(wait)
                .current_leader(1, "leader again")
                .await
                .expect("leader");
            // The committed log is applied again into the empty state machine.
            raft.wait(wait)
                .applied_index_at_least(Some(last_log[g as usize]), "replayed")
                .await
                .expect("replayed");
            let kv = node.kv(g).expect("kv");
            assert_eq!(kv.len().expect("len"), KEYS, "group {g}");
            for i in 0..KEYS {
                assert_eq!(
                    kv.get(&format!("g{g}-k{i}")).expect("get"),
                    Some(format!("v{i}")),
                    "group {g} key {i}"
                );
            }
        }
        node.shutdown().await.expect("shutdown");
    });
    engine2.shutdown().expect("engine shutdown");
}
