//! A node that joins after the others purged their logs catches up by a snapshot sent over
//! TCP: three voters (each its own database, served by `network::serve` on 127.0.0.1) write
//! past several snapshots with a small policy (`LogsSinceLast(SNAPSHOT_EVERY)`, as many
//! entries kept behind a snapshot), so the leader's first log entries are gone; a fourth node is added as a
//! learner and can only be brought up to date by openraft's chunked `InstallSnapshot`, in
//! many small chunks (`snapshot_max_chunk_size`) each one JSON line on the wire. It must end
//! with a new state-machine generation, every chunk counted by its server, and every
//! acknowledged key readable on every node, including keys written after it joined.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use omnibus::actors::{Engine, EngineOptions};
use omnibus_raft::network::serve;
use omnibus_raft::{NodeOptions, RaftNode, Request};
use openraft::{BasicNode, SnapshotPolicy};

const SNAPSHOT_EVERY: u64 = 50;
const KEYS_BEFORE: u64 = 300;
const KEYS_AFTER: u64 = 20;
const CHUNK: u64 = 1024;

fn opts() -> NodeOptions {
    let mut o = NodeOptions::default();
    o.raft.snapshot_policy = SnapshotPolicy::LogsSinceLast(SNAPSHOT_EVERY);
    // Entries kept behind a snapshot: a voter a little behind the leader when it purges is
    // still sent the log (with none kept, a voter slowed by a loaded machine was sent a
    // snapshot too, and the test's count of the voters' chunks failed).
    o.raft.max_in_snapshot_log_to_keep = SNAPSHOT_EVERY;
    o.raft.purge_batch_size = 1;
    o.raft.snapshot_max_chunk_size = CHUNK;
    o
}

fn key(i: u64) -> (String, String) {
    (
        format!("key-{i:04}"),
        format!("value-{i}-{}", "x".repeat(20)),
    )
}

pub fn a_new_learner_catches_up_from_a_snapshot_sent_in_chunks() {
    let engine = Engine::start(EngineOptions {
        executors: Some(1),
        ..Default::default()
    })
    .expect("engine");
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let wait = Some(Duration::from_secs(20));
    rt.block_on(async {
        // Nodes 1..=4 listen now; node 4 joins later.
        let mut nodes = Vec::new();
        let mut addrs = Vec::new();
        for id in 1..=4u64 {
            let node = Arc::new(
                RaftNode::open(&engine, id, &dir.path().join(id.to_string()), opts())
                    .await
                    .expect("open"),
            );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            addrs.push(listener.local_addr().expect("addr").to_string());
            tokio::spawn(serve(listener, node.clone()));
            nodes.push(node);
        }
        let members: BTreeMap<u64, BasicNode> = (1..=3u64)
            .map(|id| (id, BasicNode::new(&addrs[id as usize - 1])))
            .collect();
        nodes[0].initialize(members).await.expect("initialize");
        let m = nodes[0]
            .raft(0)
            .expect("group")
            .wait(wait)
            .metrics(|m| m.current_leader.is_some(), "a leader")
            .await
            .expect("leader");
        let leader = nodes[m.current_leader.expect("leader") as usize - 1].clone();
        let raft = leader.raft(0).expect("group");

        for i in 0..KEYS_BEFORE {
            let (key, value) = key(i);
            raft.client_write(Request::Set { key, value })
                .await
                .expect("write");
        }
        // The leader has snapshotted and purged past the first entries: a newcomer cannot be
        // sent the log from the start.
        let m = raft
            .wait(wait)
            .metrics(
                |m| {
                    m.purged
                        .is_some_and(|p| p.index >= KEYS_BEFORE - 2 * SNAPSHOT_EVERY)
                },
                "the leader purged its log",
            )
            .await
            .expect("purged");
        let purged = m.purged.expect("purged").index;
        assert!(nodes[3].kv(0).expect("group").is_empty().expect("len"));
        assert_eq!(nodes[3].snapshot_chunks_received(), 0);

        // Node 4 joins as a learner, then more writes; wait until every node applied them.
        raft.add_learner(4, BasicNode::new(&addrs[3]), true)
            .await
            .expect("add learner");
        for i in KEYS_BEFORE..KEYS_BEFORE + KEYS_AFTER {
            let (key, value) = key(i);
            raft.client_write(Request::Set { key, value })
                .await
                .expect("write");
        }
        let last = raft.metrics().borrow().last_log_index;
        for node in &nodes {
            node.raft(0)
                .expect("group")
                .wait(wait)
                .metrics(|m| m.last_applied.map(|l| l.index) >= last, "applied all")
                .await
                .expect("caught up");
        }

        // Node 4 got its state by an InstallSnapshot: in several chunks, into a new
        // state-machine generation, and its log never held the purged entries.
        let chunks = nodes[3].snapshot_chunks_received();
        assert!(chunks >= 2, "snapshot chunks received by node 4: {chunks}");
        let storages = nodes[3].database().storages();
        assert!(
            storages
                .iter()
                .any(|s| s.starts_with("raft-sm-0-") && s != "raft-sm-0-0"),
            "{storages:?}"
        );
        assert!(
            !storages.contains(&"raft-sm-0-0".to_string()),
            "{storages:?}"
        );
        let m4 = nodes[3].raft(0).expect("group").metrics().borrow().clone();
        let snap = m4.snapshot.expect("node 4 has a snapshot");
        assert!(snap.index >= purged, "{snap:?} older than purged {purged}");
        for node in &nodes[..3] {
            assert_eq!(node.snapshot_chunks_received(), 0, "{node:?}");
        }

        // Every acknowledged key, on every node.
        for node in &nodes {
            let kv = node.kv(0).expect("group");
            assert_eq!(kv.len().expect("len"), KEYS_BEFORE + KEYS_AFTER, "{node:?}");
            for i in 0..KEYS_BEFORE + KEYS_AFTER {
                let (key, value) = key(i);
                assert_eq!(kv.get(&key).expect("get"), Some(value), "{node:?} {key}");
            }
        }
        for node in &nodes {
            node.shutdown().await.expect("shutdown");
        }
    });
    engine.shutdown().expect("engine shutdown");
}
