//! `omnibus bench shop` reports what the write-path work is judged by: CPU per document
//! (getrusage over the timed part), data file bytes per document, a timeline of documents/s
//! and memory, the exact peak of page images against the memory budget, the open loop
//! (`--rate`) and the slow-disk profile (`--disk slow`). Only deterministic facts are asserted
//! (counts, presence, consistency), never timings.

use std::process::Command;

use serde_json::Value;

use crate::common::children;

/// `omnibus bench shop` with 3 indexes in `dir`, then `extra`.
fn shop_command(dir: &std::path::Path, extra: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_omnibus"));
    c.args(["bench", "shop", "--indexes", "3", "--allow-tmpfs"])
        .arg("--dir")
        .arg(dir)
        .args(extra);
    c
}

/// Runs it in shared mode only, to the end.
fn shop(dir: &std::path::Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["--journal", "shared"];
    args.extend_from_slice(extra);
    children::output(&mut shop_command(dir, &args)).expect("run omnibus")
}

#[test]
fn open_loop_reports_cpu_data_bytes_and_a_timeline() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("shop.json");
    let png = dir.path().join("timeline.png");
    let o = shop(
        dir.path(),
        &[
            "--docs",
            "400",
            "--rate",
            "250",
            "--json",
            json.to_str().unwrap(),
            "--plot-timeline",
            png.to_str().unwrap(),
        ],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("open loop at 250 documents/s"), "{out}");
    for row in [
        "CPU us/document",
        "data file bytes/document",
        "anon RSS max",
        "page images max",
        "budget overruns",
    ] {
        assert!(
            out.lines().any(|l| l.starts_with(row)),
            "no {row:?} in\n{out}"
        );
    }
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(v["synced_writes_per_s"].as_f64().unwrap() > 0.0);
    let m = &v["modes"][0];
    assert_eq!(m["documents"], 400, "{m}");
    assert_eq!(m["offered_rate"], 250.0);
    let cpu = m["cpu_seconds"].as_f64().unwrap();
    let per_doc = m["cpu_us_per_document"].as_f64().unwrap();
    assert!(cpu > 0.0);
    assert!(
        (per_doc - cpu * 1e6 / 400.0).abs() < 1e-6 * per_doc.max(1.0),
        "{m}"
    );
    // 400 documents at 250/s take about 1.6 s: at least one one-second sample, each with a
    // document count that never decreases.
    let tl = m["timeline"].as_array().unwrap();
    assert!(!tl.is_empty(), "{m}");
    let counts: Vec<u64> = tl
        .iter()
        .map(|s| s["documents"].as_u64().unwrap())
        .collect();
    assert!(counts.windows(2).all(|w| w[0] <= w[1]), "{counts:?}");
    assert!(tl.iter().all(|s| s["anon_rss_mib"].as_f64().unwrap() > 0.0));
    assert!(tl.iter().all(|s| s["page_image_mib"].as_f64().is_some()));
    // The run copied pages, so page images were alive at some point: the exact peak is
    // positive, and the budget is the engine's default.
    assert!(m["page_image_mib_max"].as_f64().unwrap() > 0.0, "{m}");
    assert_eq!(m["memory_budget_mib"], 512.0, "{m}");
    // The data files exist and hold at least the documents' bytes.
    assert!(
        m["data_file_bytes_per_document"].as_f64().unwrap() >= 900.0,
        "{m}"
    );
    assert_eq!(&std::fs::read(&png).unwrap()[..8], b"\x89PNG\r\n\x1a\n");
}

#[test]
fn bad_rate_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    for r in ["0", "-5", "inf"] {
        let arg = format!("--rate={r}");
        let o = shop(dir.path(), &["--docs", "10", &arg]);
        assert_eq!(o.status.code(), Some(1), "--rate {r}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("--rate"),
            "--rate {r}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// `--disk slow` either runs throttled (root with a blkio/io controller, on a block device)
/// and says so, or refuses with exit 1 and a message naming what is missing; never anything
/// else. On a tmpfs (no block device) it must refuse.
#[test]
fn slow_disk_runs_throttled_or_refuses_clearly() {
    let dir = tempfile::tempdir_in(".").unwrap();
    let o = shop(
        dir.path(),
        &["--docs", "50", "--clients", "8", "--disk", "slow"],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    match o.status.code() {
        Some(0) => assert!(out.contains("disk: slow ("), "{out}"),
        Some(1) => assert!(err.contains("--disk slow"), "{err}"),
        c => panic!("exit {c:?}\n{out}\n{err}"),
    }
    // The process's own cgroup is gone after the run.
    let left = std::fs::read_dir("/sys/fs/cgroup/blkio")
        .map(|rd| {
            rd.flatten().any(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("omnibus-bench-")
            })
        })
        .unwrap_or(false);
    assert!(!left, "a bench cgroup was left behind");
}

/// Regression: `bench shop` stopped with Ctrl-C or a TERM left its
/// gigabyte of databases (and, with `--disk slow`, its cgroup) behind. It now removes them and
/// exits with 128 + the signal; what a SIGKILL leaves is removed by the next run. A TERM while
/// the run opened its databases ended it with exit code 2 (the open failed on the directory
/// the cleanup was deleting), and one that fell between creating the database directory and
/// registering it left that directory behind: the signal is sent at three moments.
#[test]
fn an_interrupted_run_removes_its_databases() {
    // When the first file (the disk probe's) appears, when the database directory appears,
    // and 300 ms after that.
    for (db_dir, after_ms) in [(false, 0), (true, 0), (true, 300)] {
        let dir = tempfile::tempdir().unwrap();
        let mut child = children::spawn(
            shop_command(dir.path(), &["--seconds", "60"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped()),
        )
        .unwrap();
        let appeared = || {
            std::fs::read_dir(dir.path())
                .unwrap()
                .flatten()
                .any(|e| !db_dir || e.file_name().to_string_lossy().starts_with("omnibus-shop-"))
        };
        // Wait (a minute at most) until it appears.
        let t = std::time::Instant::now();
        while !appeared() {
            assert!(t.elapsed().as_secs() < 60, "nothing appeared ({db_dir})");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        std::thread::sleep(std::time::Duration::from_millis(after_ms));
        // SAFETY: kill(2) with a child's pid and a valid signal number.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
        let status = child.wait().unwrap();
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        assert_eq!(
            status.code(),
            Some(128 + libc::SIGTERM),
            "{status:?} (database directory {db_dir}, after {after_ms} ms)\n{err}"
        );
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(
            left.is_empty(),
            "left behind: {left:?} (database directory {db_dir}, after {after_ms} ms)"
        );
        // What the engine logs about the files the cleanup deletes under it is not shown.
        assert!(
            !err.contains("ERROR") && !err.contains("WARN"),
            "database directory {db_dir}, after {after_ms} ms:\n{err}"
        );
    }
}

/// Regression: `nohup omnibus bench shop &` was ended by a SIGHUP (exit 129, its databases and
/// results deleted): a signal ignored when the run starts now stays ignored.
#[test]
fn a_hangup_ignored_at_start_stays_ignored() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = shop_command(dir.path(), &["--journal", "shared", "--docs", "3000"]);
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: signal(2) is async-signal-safe, as pre_exec requires; it sets SIGHUP's
    // disposition in the child only, as `nohup` does before it runs a command.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            Ok(())
        });
    }
    let mut child = children::spawn(&mut cmd).unwrap();
    let t = std::time::Instant::now();
    while std::fs::read_dir(dir.path()).unwrap().next().is_none() {
        assert!(t.elapsed().as_secs() < 60, "nothing appeared");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    // SAFETY: kill(2) with a child's pid and a valid signal number.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGHUP) }, 0);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");
}
