//! `omnibus bench shop` with tiny sizes runs both journal modes and prints, writes and draws
//! both. Timing thresholds are never asserted.

use std::process::Command;

use serde_json::Value;

#[test]
fn bench_shop_tiny_runs_both_modes() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("shop.json");
    let png = dir.path().join("shop.png");
    let o = Command::new(env!("CARGO_BIN_EXE_omnibus"))
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
        .arg(&png)
        .output()
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
        "journal bytes/document",
        "disk bytes/document",
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
fn bench_shop_usage_errors() {
    for args in [
        &["bench", "shop", "--journal", "both"][..],
        &["bench", "shop", "--seconds", "1", "--docs", "5"],
        &["bench", "shop", "--docs", "0"],
        &["bench"],
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_omnibus"))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(
            o.status.code(),
            Some(1),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}
