//! Many raft groups on 3 nodes on loopback, all groups writing: writes/s, latency p50/p99
//! and journal `fdatasync`s per write with each node's groups sharing one journal vs every
//! storage having its own journal, side by side in one run.
//!
//! ```text
//! cargo bench -p omnibus-raft --bench raft_groups -- [--groups 100] [--secs 10]
//!     [--clients-per-group 2] [--dir DIR]
//! ```
//!
//! Each node is a separate process (this program run as `raft_groups node ...`, the
//! harness of `omnibus_raft::cluster`) with one omnibus database holding every group's log
//! and state machine. Clients are closed loops on the bench's own tokio runtime, each
//! writing distinct keys to one group through its leader; a write is acknowledged once
//! committed (on 2 of 3 nodes' logs, durable) and applied on the leader. For the slow-disk
//! profile run the bench from a shell in a blkio-throttled cgroup (docs/BENCHMARKS.md): the
//! node processes inherit it.

use std::time::{Duration, Instant};

use omnibus::JournalMode;
use omnibus_raft::cluster::{serve_if_node, Client, Cluster};
use omnibus_raft::network::{Message, NodeStats};
use omnibus_raft::Request;

struct Run {
    writes: u64,
    secs: f64,
    p50_ms: f64,
    p99_ms: f64,
    fdatasyncs: u64,
    commits: u64,
    batches: u64,
}

async fn stats(c: &mut Client) -> Result<NodeStats, String> {
    let mut sum = NodeStats::default();
    for id in 1..=3 {
        let r: Result<NodeStats, String> = c
            .call(id, &Message::Stats)
            .await
            .map_err(|e| e.to_string())?;
        let s = r?;
        sum.commits += s.commits;
        sum.batches += s.batches;
        sum.journal_fdatasyncs += s.journal_fdatasyncs;
        sum.journal_bytes += s.journal_bytes;
    }
    Ok(sum)
}

fn run(
    exe: &std::path::Path,
    base: &std::path::Path,
    groups: u64,
    clients: u64,
    secs: u64,
    journal: JournalMode,
) -> Result<Run, String> {
    let cluster = Cluster::start(exe, base, 3, groups, journal).map_err(|e| e.to_string())?;
    let addrs = cluster.addrs().to_vec();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let r = rt.block_on(async {
        let mut admin = Client::new(&addrs, groups);
        let r: Result<(), String> = admin
            .call(
                1,
                &Message::Initialize {
                    members: cluster.members(),
                },
            )
            .await
            .map_err(|e| e.to_string())?;
        r?;
        admin
            .wait_for_leaders(1, groups, Duration::from_secs(60))
            .await?;
        // Every group's leader has committed its first entry before the clock starts.
        for g in 0..groups {
            let req = Request::Set {
                key: "warm".into(),
                value: "up".into(),
            };
            admin.write(g, req, Duration::from_secs(30)).await?;
        }
        let before = stats(&mut admin).await?;
        let started = Instant::now();
        let deadline = started + Duration::from_secs(secs);
        let mut tasks = Vec::new();
        for c in 0..clients {
            let addrs = addrs.clone();
            tasks.push(tokio::spawn(async move {
                let mut cl = Client::new(&addrs, groups);
                let g = c % groups;
                let mut lat = Vec::new();
                let mut i = 0u64;
                while Instant::now() < deadline {
                    let req = Request::Set {
                        key: format!("c{c}-{i}"),
                        value: format!("value-{c}-{i}"),
                    };
                    let t = Instant::now();
                    cl.write(g, req, Duration::from_secs(30)).await?;
                    lat.push(t.elapsed().as_micros() as u64);
                    i += 1;
                }
                Ok::<_, String>(lat)
            }));
        }
        let mut lat = Vec::new();
        for t in tasks {
            lat.extend(t.await.map_err(|e| e.to_string())??);
        }
        let secs = started.elapsed().as_secs_f64();
        let after = stats(&mut admin).await?;
        lat.sort_unstable();
        let pct = |p: f64| -> f64 {
            if lat.is_empty() {
                return 0.0;
            }
            let i = ((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1;
            lat[i] as f64 / 1000.0
        };
        Ok::<_, String>(Run {
            writes: lat.len() as u64,
            secs,
            p50_ms: pct(0.50),
            p99_ms: pct(0.99),
            fdatasyncs: after.journal_fdatasyncs - before.journal_fdatasyncs,
            commits: after.commits - before.commits,
            batches: after.batches - before.batches,
        })
    });
    drop(cluster);
    r
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    serve_if_node(&args, "node");
    let (mut groups, mut secs, mut per_group, mut dir) = (100u64, 10u64, 2u64, None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut num = || {
            it.next()
                .and_then(|v| v.parse::<u64>().ok())
                .filter(|v| *v > 0)
        };
        match a.as_str() {
            "--groups" => groups = num().expect("--groups N"),
            "--secs" => secs = num().expect("--secs N"),
            "--clients-per-group" => per_group = num().expect("--clients-per-group N"),
            "--dir" => dir = it.next().cloned(),
            "--bench" => {}
            other => panic!("unknown argument {other:?}"),
        }
    }
    let tmp = match &dir {
        Some(d) => tempfile::tempdir_in(d),
        None => tempfile::tempdir(),
    }
    .expect("bench directory");
    let exe = std::env::current_exe().expect("current exe");
    println!(
        "raft_groups: 3 nodes on loopback, {groups} groups, {} closed-loop clients, {secs} s per mode, in {}",
        groups * per_group,
        tmp.path().display()
    );
    let mut rows = Vec::new();
    for (name, mode) in [
        ("shared", JournalMode::Shared),
        ("separate", JournalMode::Separate),
    ] {
        let base = tmp.path().join(name);
        std::fs::create_dir_all(&base).expect("mode directory");
        let r = run(&exe, &base, groups, groups * per_group, secs, mode)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        println!(
            "  {name:>8}: {:>7.0} writes/s  p50 {:>7.1} ms  p99 {:>7.1} ms  {:.3} journal fdatasyncs/write  {:.1} commits/batch",
            r.writes as f64 / r.secs,
            r.p50_ms,
            r.p99_ms,
            r.fdatasyncs as f64 / r.writes.max(1) as f64,
            r.commits as f64 / r.batches.max(1) as f64
        );
        rows.push(r);
        let _ = std::fs::remove_dir_all(&base);
    }
    let (s, p) = (&rows[0], &rows[1]);
    println!(
        "  shared/separate: writes/s {:.2}x, p99 {:.2}x lower, fdatasyncs per write {:.1}x fewer",
        (s.writes as f64 / s.secs) / (p.writes as f64 / p.secs).max(1e-9),
        p.p99_ms / s.p99_ms.max(1e-9),
        (p.fdatasyncs as f64 / p.writes.max(1) as f64)
            / (s.fdatasyncs as f64 / s.writes.max(1) as f64).max(1e-9)
    );
}
