//! The kill test in CI, with small N: 3 node processes on 127.0.0.1 (this test binary run as
//! `raft node ...`, see `main.rs`), 2 raft groups, 200 keys written by 4 clients; the leader
//! of group 0 is SIGKILLed at half load and restarted; every acknowledged key must be on every
//! node.

use omnibus::JournalMode;
use omnibus_raft::cluster::{run_check, CheckOptions};

pub fn no_acknowledged_write_is_lost_when_the_leader_is_killed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = std::env::current_exe().expect("current exe");
    let o = CheckOptions {
        keys: 200,
        groups: 2,
        clients: 4,
        journal: JournalMode::Shared,
        kill: true,
    };
    let r = run_check(&exe, dir.path(), &o).unwrap_or_else(|e| {
        for id in 1..=3 {
            let log = dir.path().join(format!("node-{id}.log"));
            eprintln!(
                "--- node {id}:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        panic!("the kill test could not run: {e}")
    });
    assert!(r.killed.is_some(), "no node was killed");
    assert_eq!(r.acknowledged + r.unacknowledged, o.keys);
    assert!(r.acknowledged > o.keys / 2, "{r:?}");
    assert_eq!(r.lost, 0, "acknowledged writes lost: {r:?}");
    println!(
        "cluster_sigkill: acknowledged {}, lost {} (node {:?} killed)",
        r.acknowledged, r.lost, r.killed
    );
}
