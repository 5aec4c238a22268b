//! `omnibus bench shop` with tiny sizes runs both journal modes and prints, writes and draws
//! both. Timing thresholds are never asserted.

use std::process::Command;

use serde_json::Value;

use crate::common::children;
use crate::common::requires;

#[test]
fn bench_shop_tiny_runs_both_modes() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("shop.json");
    let png = dir.path().join("shop.png");
    let o = children::output(
        Command::new(env!("CARGO_BIN_EXE_omnibus"))
            .args([
                "bench",
                "shop",
                "--indexes",
                "5",
                "--docs",
                "300",
                "--clients",
                "16",
                "--allow-tmpfs",
            ])
            .arg("--dir")
            .arg(dir.path())
            .arg("--json")
            .arg(&json)
            .arg("--plot")
            .arg(&png),
    )
    .expect("run omnibus");
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{out}\n{err}");
    let header = out
        .lines()
        .find(|l| l.contains("shared") && l.contains("separate") && l.contains("gain"))
        .expect("table header");
    assert!(header.find("shared") < header.find("separate"), "{header}");
    for row in [
        "documents/s",
        "commit p50",
        "commit p99",
        "commit p99.9",
        "commit max",
        "fdatasyncs/s",
        "commits per fdatasync",
        "commits per journal batch",
        "journal bytes/document",
        "journal zeros/document",
        "disk bytes/document",
        "device bytes/document",
        "index lag p99",
    ] {
        let line = out
            .lines()
            .find(|l| l.starts_with(row))
            .unwrap_or_else(|| panic!("no row {row:?} in\n{out}"));
        assert!(line.split_whitespace().count() >= 3, "{line}");
    }

    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let modes = v["modes"].as_array().unwrap();
    assert_eq!(modes.len(), 2);
    assert_eq!(modes[0]["journal"], "shared");
    assert_eq!(modes[1]["journal"], "separate");
    for m in modes {
        assert_eq!(m["documents"], 300, "{m}");
        assert_eq!(m["indexes"], 5);
        assert!(m["fdatasyncs"].as_u64().unwrap() > 0);
        assert!(m["documents_per_s"].as_f64().unwrap() > 0.0);
        assert!(!m["distribution"].as_array().unwrap().is_empty());
        // The device's count: null where the directory's device has no block statistics,
        // else what the run's synced commits wrote.
        assert!(m["journal_zero_bytes_per_document"].as_f64().unwrap() >= 0.0);
        assert!(m["journal_files_recycled"].is_u64(), "{m}");
        let device = &m["device_bytes_per_document"];
        assert!(
            device.is_null() || device.as_f64().unwrap() > 0.0,
            "{device}"
        );
    }
    let img = std::fs::read(&png).unwrap();
    assert_eq!(&img[..8], b"\x89PNG\r\n\x1a\n");
    // Only the JSON and the plot are left: the databases were deleted.
    let mut left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(left, ["shop.json", "shop.png"]);
}

#[test]
fn bench_shop_rounds_alternate_the_modes_and_report_the_median_run() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("shop.json");
    let o = children::output(
        Command::new(env!("CARGO_BIN_EXE_omnibus"))
            .args([
                "bench",
                "shop",
                "--indexes",
                "2",
                "--docs",
                "100",
                "--clients",
                "8",
                "--rounds",
                "3",
                "--allow-tmpfs",
            ])
            .arg("--dir")
            .arg(dir.path())
            .arg("--json")
            .arg(&json),
    )
    .expect("run omnibus");
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{out}\n{err}");
    // Rounds alternate: shared first, then separate first, then shared first.
    let order: Vec<&str> = err
        .lines()
        .filter_map(|l| l.strip_prefix("bench shop: running "))
        .map(|l| l.trim_end_matches(" ..."))
        .collect();
    assert_eq!(
        order,
        ["shared", "separate", "separate", "shared", "shared", "separate"],
        "{err}"
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 6);
    for (i, mode) in ["shared", "separate"].iter().enumerate() {
        let mut rates: Vec<f64> = runs
            .iter()
            .filter(|r| r["journal"] == *mode)
            .map(|r| r["documents_per_s"].as_f64().unwrap())
            .collect();
        rates.sort_by(f64::total_cmp);
        assert_eq!(v["modes"][i]["journal"], *mode);
        assert_eq!(v["modes"][i]["documents_per_s"].as_f64().unwrap(), rates[1]);
        assert!(
            out.lines()
                .any(|l| l.starts_with(&format!("{mode} documents/s in each round: "))),
            "{out}"
        );
    }
}

#[test]
fn bench_shop_compares_synchronous_and_asynchronous_indexes() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("shop.json");
    let o = children::output(
        Command::new(env!("CARGO_BIN_EXE_omnibus"))
            .args([
                "bench",
                "shop",
                "--indexes",
                "4",
                "--docs",
                "200",
                "--clients",
                "8",
                "--journal",
                "shared",
                "--index-mode",
                "sync,async",
                "--allow-tmpfs",
            ])
            .arg("--dir")
            .arg(dir.path())
            .arg("--json")
            .arg(&json),
    )
    .expect("run omnibus");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.contains("gain: shared sync over shared"),
        "the gain compares the two index modes:\n{out}"
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let modes = v["modes"].as_array().unwrap();
    assert_eq!(modes.len(), 2);
    assert_eq!(modes[0]["journal"], "shared sync");
    assert_eq!(modes[1]["journal"], "shared");
    // Synchronous indexes never lag their documents.
    assert_eq!(
        modes[0]["index_lag_ms_max"].as_f64(),
        Some(0.0),
        "{}",
        modes[0]
    );
    for m in modes {
        assert_eq!(m["documents"], 200, "{m}");
    }
    // Synchronous indexes with separate journals only: refused as bad input.
    let o = children::output(Command::new(env!("CARGO_BIN_EXE_omnibus")).args([
        "bench",
        "shop",
        "--journal",
        "separate",
        "--index-mode",
        "sync",
        "--allow-tmpfs",
    ]))
    .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("shared journal"));
}

#[test]
fn bench_shop_usage_errors() {
    for args in [
        &["bench", "shop", "--journal", "both"][..],
        &["bench", "shop", "--seconds", "1", "--docs", "5"],
        &["bench", "shop", "--docs", "0"],
        &["bench"],
    ] {
        let o = children::output(Command::new(env!("CARGO_BIN_EXE_omnibus")).args(args)).unwrap();
        assert_eq!(
            o.status.code(),
            Some(1),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// The tiny sizes of these tests: 2 indexes, 50 documents per mode, 4 clients.
const TINY: [&str; 8] = [
    "--indexes",
    "2",
    "--docs",
    "50",
    "--clients",
    "4",
    "--journal",
    "shared",
];

fn is_tmpfs(p: &std::path::Path) -> bool {
    let out = children::output(Command::new("stat").args(["-f", "-c", "%T"]).arg(p)).unwrap();
    String::from_utf8_lossy(&out.stdout).trim() == "tmpfs"
}

/// A directory on the disk the tests build on (not the system temp directory, which may be a
/// tmpfs).
fn disk_tempdir() -> tempfile::TempDir {
    let d = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    assert!(!is_tmpfs(d.path()), "the target directory is on a tmpfs");
    d
}

#[test]
fn bench_shop_without_dir_works_under_the_current_directory() {
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() || !is_tmpfs(shm) {
        requires::cannot_run("no tmpfs at /dev/shm");
        return;
    }
    let cwd = disk_tempdir();
    // The system temp directory is a tmpfs: the default must not use it.
    let o = children::output(
        Command::new(env!("CARGO_BIN_EXE_omnibus"))
            .args(["bench", "shop"])
            .args(TINY)
            .current_dir(cwd.path())
            .env("TMPDIR", shm),
    )
    .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    // It ran under the current directory ...
    let cwd_abs = std::fs::canonicalize(cwd.path()).unwrap();
    let fs_line = out
        .lines()
        .find(|l| l.starts_with("machine:"))
        .unwrap_or_else(|| panic!("no machine line in\n{out}"));
    assert!(
        fs_line.contains(&format!("({}/omnibus-shop-", cwd_abs.display())),
        "{fs_line}"
    );
    assert!(!fs_line.contains("tmpfs"), "{fs_line}");
    // ... and left nothing there.
    let left: Vec<_> = std::fs::read_dir(cwd.path()).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn bench_shop_refuses_a_tmpfs_naming_dir_only_when_given() {
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() || !is_tmpfs(shm) {
        requires::cannot_run("no tmpfs at /dev/shm");
        return;
    }
    // The current directory on a tmpfs, no --dir: refused, without naming --dir.
    let cwd = tempfile::tempdir_in(shm).unwrap();
    let o = children::output(
        Command::new(env!("CARGO_BIN_EXE_omnibus"))
            .args(["bench", "shop"])
            .args(TINY)
            .current_dir(cwd.path()),
    )
    .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with("omnibus: the temporary directory ") && err.contains("is on a tmpfs"),
        "{err}"
    );
    assert!(!err.contains("--dir"), "{err}");
    assert!(!err.contains("running"), "{err}");
    assert_eq!(std::fs::read_dir(cwd.path()).unwrap().count(), 0);

    // --dir on a tmpfs: refused, naming it.
    let d = cwd.path().join("given");
    let o = children::output(
        Command::new(env!("CARGO_BIN_EXE_omnibus"))
            .args(["bench", "shop"])
            .args(TINY)
            .arg("--dir")
            .arg(&d),
    )
    .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with(&format!("omnibus: --dir {} is on a tmpfs", d.display())),
        "{err}"
    );
}

#[test]
fn bench_shop_checks_json_and_plot_paths_before_running() {
    let dir = disk_tempdir();
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    let missing = "/nonexistent/dir/x.png".to_string();
    let under_file = format!("{}/x.json", file.display());
    let a_dir = dir.path().display().to_string();
    for (opt, path, says) in [
        (
            "--plot",
            missing.as_str(),
            "directory /nonexistent/dir does not exist".to_string(),
        ),
        (
            "--json",
            "/nonexistent/dir/x.json",
            "directory /nonexistent/dir does not exist".to_string(),
        ),
        (
            "--json",
            under_file.as_str(),
            format!("{} is not a directory", file.display()),
        ),
        (
            "--plot",
            a_dir.as_str(),
            "is a directory (give a file name)".to_string(),
        ),
    ] {
        let o = children::output(
            Command::new(env!("CARGO_BIN_EXE_omnibus"))
                .args(["bench", "shop"])
                .args(TINY)
                .arg("--dir")
                .arg(dir.path())
                .args([opt, path]),
        )
        .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{opt} {path}: {err}");
        assert_eq!(err, format!("omnibus: {opt} {path}: {says}\n"));
    }
    // Nothing ran: only the file is there.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}
