//! A node killed and restarted after the others purged their logs past it catches up by a
//! snapshot over TCP, replacing the state it already had: 3 node processes on 127.0.0.1 (this
//! binary run as `raft node ...`, see `main.rs`) with a snapshot every 50 entries, no log kept
//! behind a snapshot and 1 KiB chunks; a follower is SIGKILLed after 100 keys, 300 more are
//! written (the leader snapshots and purges past the follower's last entry), the follower
//! restarts and must receive several `InstallSnapshot` chunks (its `Stats`), and every
//! acknowledged key is then on every node.

use std::time::{Duration, Instant};

use omnibus::JournalMode;
use omnibus_raft::cluster::{Client, Cluster, SnapshotArgs};
use omnibus_raft::network::Message;
use omnibus_raft::Request;

const BEFORE: u64 = 100;
const AFTER: u64 = 300;
const PATIENCE: Duration = Duration::from_secs(20);

fn key(i: u64) -> (String, String) {
    (
        format!("key-{i:04}"),
        format!("value-{i}-{}", "x".repeat(20)),
    )
}

async fn write(client: &mut Client, keys: std::ops::Range<u64>) {
    for i in keys {
        let (key, value) = key(i);
        client
            .write(0, Request::Set { key, value }, PATIENCE)
            .await
            .expect("write acknowledged");
    }
}

pub fn a_restarted_follower_catches_up_by_a_snapshot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = std::env::current_exe().expect("current exe");
    let snapshots = SnapshotArgs {
        every: 50,
        chunk: 1024,
    };
    let mut cluster = Cluster::start_with(&exe, dir.path(), 3, 1, JournalMode::Shared, snapshots)
        .expect("start nodes");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let r = rt.block_on(async {
        let mut client = Client::new(cluster.addrs(), 1);
        let init: Result<(), String> = client
            .call(
                1,
                &Message::Initialize {
                    members: cluster.members(),
                },
            )
            .await
            .expect("initialize");
        init.expect("initialize");
        client
            .wait_for_leaders(1, 1, PATIENCE)
            .await
            .expect("leader");
        write(&mut client, 0..BEFORE).await;
        let leader = client.status(1, 0).await?.leader.ok_or("no leader")?;
        let victim = leader % 3 + 1;
        let had = client.status(victim, 0).await?.last_log_index;
        cluster.kill(victim).map_err(|e| e.to_string())?;

        // The others write on, snapshot, and purge past everything the victim has.
        write(&mut client, BEFORE..BEFORE + AFTER).await;
        let leader = client
            .status(1 + victim % 3, 0)
            .await?
            .leader
            .ok_or("no leader")?;
        let start = Instant::now();
        loop {
            let st = client.status(leader, 0).await?;
            if st.purged > had {
                break;
            }
            if start.elapsed() > PATIENCE {
                return Err(format!("leader {leader} never purged past {had:?}: {st:?}"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        cluster.restart(victim).map_err(|e| e.to_string())?;
        let target = client.status(leader, 0).await?.last_log_index;
        let start = Instant::now();
        loop {
            let st = client.status(victim, 0).await;
            if matches!(&st, Ok(s) if s.last_applied >= target) {
                break;
            }
            if start.elapsed() > PATIENCE {
                return Err(format!(
                    "node {victim} never caught up to {target:?}: {st:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let chunks = client.stats(victim).await?.snapshot_chunks;
        let snapshot = client.status(victim, 0).await?.snapshot;
        let mut missing = Vec::new();
        for id in 1..=3 {
            for i in 0..BEFORE + AFTER {
                let (key, value) = key(i);
                if client.read(id, 0, &key).await? != Some(value) {
                    missing.push((id, key));
                }
            }
        }
        Ok((victim, had, chunks, snapshot, missing))
    });
    let (victim, had, chunks, snapshot, missing) = r.unwrap_or_else(|e: String| {
        for id in 1..=3 {
            let log = dir.path().join(format!("node-{id}.log"));
            eprintln!(
                "--- node {id}:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        panic!("the restart test could not run: {e}")
    });
    assert!(
        chunks >= 2,
        "node {victim} received {chunks} snapshot chunks after its restart"
    );
    assert!(
        snapshot > had,
        "node {victim}: snapshot {snapshot:?}, had {had:?}"
    );
    assert!(missing.is_empty(), "acknowledged keys missing: {missing:?}");
    println!(
        "snapshot_after_restart: node {victim} caught up with a snapshot of {snapshot:?} in \
         {chunks} chunks (it had {had:?})"
    );
}
