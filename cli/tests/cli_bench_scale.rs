//! `omnibus bench scale` with tiny settings: every workload runs at each executor count, the
//! table and the speedup lines are printed, the JSON has every row with its ratio to one
//! executor, the plot is a PNG, and only those two files are left. Timing is never asserted.

use std::process::Command;

use serde_json::Value;

use crate::common::children;

#[test]
fn bench_scale_tiny_runs_every_workload_at_each_count() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("scale.json");
    let png = dir.path().join("scale.png");
    let o = children::output(
        Command::new(env!("CARGO_BIN_EXE_omnibus"))
            .args([
                "bench",
                "scale",
                "--executors",
                "2,1",
                "--storages",
                "2",
                "--seconds",
                "0.2",
                "--keys",
                "500",
                "--clients",
                "4",
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
    assert!(out.lines().any(|l| l.starts_with("machine: ")), "{out}");
    let header = out
        .lines()
        .find(|l| l.starts_with("workload ") && l.contains("executors"))
        .expect("table header");
    for col in [
        "executors",
        "ops/s",
        "p50",
        "p99",
        "CPU",
        "fdatasyncs",
        "speedup",
    ] {
        assert!(header.contains(col), "{header}");
    }
    for w in [
        "get",
        "multi_get",
        "get via pool",
        "write shared",
        "write separate",
    ] {
        assert!(
            out.lines()
                .any(|l| l.starts_with(&format!("speedup {w}: 1->2: "))),
            "no speedup line for {w} in\n{out}"
        );
    }

    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(v["machine"].as_str().unwrap().contains("Linux"), "{v}");
    assert!(v["cpus"].as_u64().unwrap() >= 1);
    assert!(v["synced_writes_per_s"].as_f64().unwrap() > 0.0);
    assert_eq!(v["executors"], serde_json::json!([1, 2]));
    assert_eq!(v["speedup_base_executors"], 1);
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 10, "5 workloads x 2 counts: {v}");
    for r in rows {
        assert!(r["skipped"].is_null(), "{r}");
        assert!(r["ops"].as_u64().unwrap() > 0, "{r}");
        assert!(r["ops_per_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(
            r["p99_us"].as_f64().unwrap() >= r["p50_us"].as_f64().unwrap(),
            "{r}"
        );
        assert!(r["cpu_us_per_op"].as_f64().unwrap() > 0.0, "{r}");
        let speedup = r["speedup"].as_f64().expect("a speedup on every row");
        if r["executors"] == 1 {
            assert_eq!(speedup, 1.0, "{r}");
        }
        let writes = r["workload"].as_str().unwrap().starts_with("write");
        assert_eq!(r["fdatasyncs"].as_u64().unwrap() > 0, writes, "{r}");
        let over = r["executors"].as_u64().unwrap() > v["cpus"].as_u64().unwrap();
        assert_eq!(r["oversubscribed"], over, "{r}");
    }
    for w in [
        "get",
        "multi_get",
        "get via pool",
        "write shared",
        "write separate",
    ] {
        let s = v["speedups"][w].as_array().unwrap();
        assert_eq!(s.len(), 2, "{v}");
        assert_eq!(s[0][0], 1);
        assert_eq!(s[1][0], 2);
        assert!(s[1][1].as_f64().unwrap() > 0.0);
    }
    let img = std::fs::read(&png).unwrap();
    assert_eq!(&img[..8], b"\x89PNG\r\n\x1a\n");
    // The databases were deleted.
    let mut left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(left, ["scale.json", "scale.png"]);
}
