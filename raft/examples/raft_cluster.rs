//! A key-value service on a 3-node raft cluster: each node a separate process on 127.0.0.1
//! with its own directory (an omnibus database holding every group's log and state
//! machine), JSON lines over TCP between them, and a client writing keys through the
//! leaders.
//!
//! ```text
//! cargo run --release -p omnibus-raft --example raft_cluster -- [--keys N] [--groups G]
//!     [--clients C] [--separate] [--dir DIR] [--check]
//! ```
//!
//! Without `--check`: start 3 nodes, write N keys (default 2,000) over G groups (default 4)
//! with C clients (default 8), wait until every node applied them, read them back from every
//! node, print the write rate.
//!
//! `--check`: the same, and SIGKILL the leader of group 0 once half of the keys are
//! acknowledged, keep writing through the new leader, restart the killed node, wait until it
//! caught up, then read every acknowledged key from every node. Exits 0 only if no
//! acknowledged key was lost and all three nodes agree; the last line is
//! `acknowledged N, lost L`.
//!
//! `--separate` gives every storage its own journal instead of one shared journal per node.
//! The node processes are this program run as `raft_cluster node ...`.

use omnibus::JournalMode;
use omnibus_raft::cluster::{run_check, serve_if_node, CheckOptions};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    serve_if_node(&args, "raft_cluster node");
    std::process::exit(match controller(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("raft_cluster: {e}");
            2
        }
    });
}

fn controller(args: &[String]) -> Result<i32, Box<dyn std::error::Error>> {
    let mut o = CheckOptions {
        keys: 2000,
        groups: 4,
        clients: 8,
        journal: JournalMode::Shared,
        kill: false,
    };
    let mut dir = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| -> Result<u64, String> {
            it.next()
                .and_then(|v| v.parse().ok())
                .filter(|v| *v > 0)
                .ok_or_else(|| format!("{name} needs a positive number"))
        };
        match a.as_str() {
            "--check" => o.kill = true,
            "--separate" => o.journal = JournalMode::Separate,
            "--keys" => o.keys = value("--keys")?,
            "--groups" => o.groups = value("--groups")?,
            "--clients" => o.clients = value("--clients")?,
            "--dir" => dir = Some(it.next().ok_or("--dir needs a path")?.clone()),
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    let tmp;
    let base = match dir {
        Some(d) => {
            std::fs::create_dir_all(&d)?;
            std::path::PathBuf::from(d)
        }
        None => {
            tmp = tempfile::tempdir()?;
            tmp.path().to_path_buf()
        }
    };
    let exe = std::env::current_exe()?;
    let r = run_check(&exe, &base, &o)?;
    println!(
        "{} writes acknowledged in {:.2} s ({:.0} writes/s, {} attempts){}",
        r.acknowledged,
        r.write_secs,
        r.acknowledged as f64 / r.write_secs.max(1e-9),
        r.attempts,
        match r.killed {
            Some(k) => format!(
                "; node {k} SIGKILLed at half load, restarted, caught up in {:.2} s",
                r.catch_up_secs
            ),
            None => String::new(),
        }
    );
    if r.unacknowledged > 0 {
        println!(
            "{} writes never acknowledged (not counted as lost)",
            r.unacknowledged
        );
    }
    println!("acknowledged {}, lost {}", r.acknowledged, r.lost);
    Ok(if r.lost == 0 { 0 } else { 1 })
}
