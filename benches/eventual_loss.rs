//! How much a crash loses of acknowledged `Durability::Eventual` commits, on an idle disk and on
//! a busy one, side by side in one run; with real processes and SIGKILL.
//!
//! Each round starts this binary again as a child that opens a storage (default options:
//! `eventual_sync_ms` 100) and commits one-put eventual transactions (8-byte sequential keys,
//! 100-byte values) as fast as it can, writing `txn-number ack-time` to a pipe after each
//! commit returns. On the busy disk a thread of the child writes 128 MiB at a time into a file
//! beside the storage and `fdatasync`s it, without end, so the journal's syncs queue behind it.
//! The parent SIGKILLs the child 1.5 to 3 s after its first acknowledgement, reopens the storage
//! and finds the last commit recovered (and checks that every commit up to it is there, none
//! after it: the recovered state is a prefix). Reported per disk state, over the rounds: commits
//! acknowledged, acknowledged commits lost (max), the age at the kill of the oldest lost
//! acknowledgement (max: what the README's bound must cover), and, measured in the same
//! conditions before the rounds, the time of one 4 KiB `pwrite` + `fdatasync` in that directory
//! (p50, p99, max): the README states the bound as `eventual_sync_ms` plus the time of the
//! journal's sync.
//!
//! `cargo bench --bench eventual_loss -- [--rounds N] [--dir D]`

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use omnibus::{Durability, Options, Storage};

/// The child's environment variable: the storage directory, and `busy` or `idle`.
const CHILD: &str = "OMNIBUS_EVENTUAL_LOSS_CHILD";

/// CLOCK_MONOTONIC in nanoseconds: one clock for the parent and the child.
fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC is always available.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Writes 128 MiB at a time into `dir/hog` and syncs it, until `stop`.
fn hog(dir: &Path, stop: &AtomicBool) {
    let f = std::fs::File::create(dir.join("hog")).expect("create the hog file");
    let chunk = vec![0x5au8; 128 << 20];
    let mut off = 0u64;
    while !stop.load(Ordering::Relaxed) {
        f.write_all_at(&chunk, off).expect("hog write");
        f.sync_data().expect("hog fdatasync");
        off = (off + chunk.len() as u64) % (1 << 30);
    }
}

fn child(spec: &str) -> ! {
    let (dir, mode) = spec.rsplit_once(':').expect("DIR:MODE");
    let dir = PathBuf::from(dir);
    if mode == "busy" {
        let d = dir.clone();
        std::thread::spawn(move || hog(&d, &AtomicBool::new(false)));
    }
    let s = Storage::open(dir.join("s"), Options::default()).expect("open");
    let mut out = std::io::stdout().lock();
    let value = [7u8; 100];
    for i in 1u64.. {
        let mut w = s.begin_write().expect("begin");
        w.set_durability(Durability::Eventual);
        w.put(i.to_be_bytes(), value).expect("put");
        w.commit().expect("commit");
        // One write per acknowledgement: the parent knows of every ack made before the kill
        // but the one in flight.
        writeln!(out, "{i} {}", mono_ns()).expect("pipe");
        out.flush().expect("pipe");
    }
    unreachable!()
}

/// One 4 KiB `pwrite` + `fdatasync` at a time for `secs` into `dir`, with the hog running when
/// `busy`: the latency of one small synced write there (µs).
fn probe_sync(dir: &Path, busy: bool, secs: f64) -> Histogram<u64> {
    let stop = Arc::new(AtomicBool::new(false));
    let hog_thread = busy.then(|| {
        let (d, s) = (dir.to_path_buf(), stop.clone());
        std::thread::spawn(move || hog(&d, &s))
    });
    let f = std::fs::File::create(dir.join("probe")).expect("create probe");
    f.set_len(1 << 20).expect("size probe");
    f.sync_all().expect("sync probe");
    let mut h = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("histogram");
    let t0 = Instant::now();
    let page = [1u8; 4096];
    let mut i = 0u64;
    while t0.elapsed().as_secs_f64() < secs {
        let t = Instant::now();
        f.write_all_at(&page, (i % 256) * 4096)
            .expect("probe write");
        f.sync_data().expect("probe fdatasync");
        h.saturating_record(t.elapsed().as_micros() as u64);
        i += 1;
    }
    stop.store(true, Ordering::Relaxed);
    if let Some(t) = hog_thread {
        t.join().expect("hog");
    }
    let _ = std::fs::remove_file(dir.join("probe"));
    let _ = std::fs::remove_file(dir.join("hog"));
    h
}

#[derive(Default)]
struct Outcome {
    acked: u64,
    lost: u64,
    /// Age at the kill of the oldest lost acknowledgement (ms); 0 when none was lost.
    oldest_lost_ms: f64,
}

fn round(base: &Path, busy: bool, seed: u64) -> Outcome {
    let dir = tempfile::tempdir_in(base).expect("tempdir");
    let mode = if busy { "busy" } else { "idle" };
    let mut c = Command::new(std::env::current_exe().expect("current exe"))
        .env(CHILD, format!("{}:{mode}", dir.path().display()))
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the child");
    let acks: Arc<Mutex<Vec<u64>>> = Arc::new(Mutex::new(vec![0]));
    let stdout = c.stdout.take().expect("child stdout");
    let reader = {
        let acks = acks.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let Some((i, t)) = line.split_once(' ') else {
                    break;
                };
                let (i, t): (u64, u64) = (i.parse().expect("txn"), t.parse().expect("time"));
                let mut a = acks.lock().unwrap();
                assert_eq!(a.len() as u64, i, "acks in order");
                a.push(t);
            }
        })
    };
    // The kill comes 1.5 to 3 s after the first acknowledgement.
    let start = Instant::now();
    while acks.lock().unwrap().len() < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the child never committed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(1500 + seed % 1500));
    // SAFETY: kill has no memory preconditions; the pid is our child's, not yet reaped.
    unsafe { libc::kill(c.id() as i32, libc::SIGKILL) };
    let killed_at = mono_ns();
    c.wait().expect("wait for the child");
    reader.join().expect("reader");
    let acks = acks.lock().unwrap();
    let last_acked = acks.len() as u64 - 1;
    let s = Storage::open(dir.path().join("s"), Options::default()).expect("reopen");
    let r = s.begin_read().expect("read");
    let recovered = match r.last().expect("last") {
        Some((k, _)) => u64::from_be_bytes(k.try_into().expect("8-byte key")),
        None => 0,
    };
    assert_eq!(
        r.len(),
        recovered,
        "the recovered commits are not a prefix of the acknowledged ones"
    );
    let lost = last_acked.saturating_sub(recovered);
    let oldest_lost_ms = if lost > 0 {
        killed_at.saturating_sub(acks[recovered as usize + 1]) as f64 / 1e6
    } else {
        0.0
    };
    Outcome {
        acked: last_acked,
        lost,
        oldest_lost_ms,
    }
}

fn main() {
    if let Ok(spec) = std::env::var(CHILD) {
        child(&spec);
    }
    let mut rounds = 3u64;
    let mut dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target");
    let args: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < args.len() {
        match args[i].as_str() {
            "--rounds" => {
                rounds = args[i + 1].parse().expect("--rounds N");
                i += 1;
            }
            "--dir" => {
                dir = PathBuf::from(&args[i + 1]);
                i += 1;
            }
            _ => {} // cargo bench passes --bench
        }
        i += 1;
    }
    std::fs::create_dir_all(&dir).expect("create --dir");
    println!("== eventual commits lost to SIGKILL, idle vs busy disk ({rounds} rounds each, eventual_sync_ms 100) ==");
    println!(
        "| disk | acked (mean) | lost, max | oldest lost ack at the kill, max | one 4 KiB pwrite+fdatasync p50 / p99 / max |"
    );
    println!("|---|---|---|---|---|");
    for busy in [false, true] {
        let sync = {
            let d = tempfile::tempdir_in(&dir).expect("tempdir");
            probe_sync(d.path(), busy, 3.0)
        };
        let mut outs = Vec::new();
        for r in 0..rounds {
            outs.push(round(&dir, busy, r * 617 + u64::from(busy) * 331));
        }
        let acked = outs.iter().map(|o| o.acked).sum::<u64>() / rounds.max(1);
        let lost = outs.iter().map(|o| o.lost).max().unwrap_or(0);
        let oldest = outs.iter().map(|o| o.oldest_lost_ms).fold(0.0, f64::max);
        println!(
            "| {} | {acked} | {lost} | {oldest:.0} ms | {:.1} / {:.1} / {:.1} ms |",
            if busy { "busy" } else { "idle" },
            sync.value_at_quantile(0.5) as f64 / 1000.0,
            sync.value_at_quantile(0.99) as f64 / 1000.0,
            sync.max() as f64 / 1000.0
        );
    }
}
