//! The results: the text table (each mode's median run side by side, and the gain of shared
//! over separate), the JSON report (`--json`), the latency and timeline plots (`--plot`,
//! `--plot-timeline`), and the check, before the run, that those files can be written.

use std::path::{Path, PathBuf};

use hdrhistogram::Histogram;
use serde::Serialize;

use super::run::ModeResult;
use crate::cli::{ShopArgs, Variant};
use crate::{CliResult, Fail};

#[derive(Serialize)]
struct Report {
    machine: String,
    /// The disk profile and the synced writes/s probed before the run.
    disk: String,
    synced_writes_per_s: f64,
    file_system: String,
    dir: String,
    /// Each mode's median run by documents/s (its only run without `--rounds`).
    modes: Vec<ModeResult>,
    /// Every run, in the order they ran (with `--rounds` above 1).
    runs: Vec<ModeResult>,
}

/// Each of `modes`' median run in `runs` by documents/s (the lower middle one of an even
/// count), in the order of `modes`.
fn median_runs(modes: &[Variant], runs: &[ModeResult]) -> Vec<ModeResult> {
    modes
        .iter()
        .filter_map(|m| {
            let mut mine: Vec<&ModeResult> =
                runs.iter().filter(|r| r.journal == m.name()).collect();
            mine.sort_by(|x, y| x.documents_per_s.total_cmp(&y.documents_per_s));
            mine.get(mine.len().saturating_sub(1) / 2)
                .map(|r| (*r).clone())
        })
        .collect()
}

/// What the report says of the run besides its results: the machine, the disk and what the
/// probe measured, the file system and directory, the load and how long each mode ran.
pub(super) struct Setting {
    pub(super) machine: String,
    pub(super) disk: String,
    pub(super) synced_writes_per_s: f64,
    pub(super) fs: String,
    pub(super) dir: PathBuf,
    pub(super) load: String,
    pub(super) amount: String,
}

/// Prints each mode's rounds (with `--rounds` above 1), the setting and the table of the median
/// runs, then writes the JSON report and the plots asked for.
pub(super) fn output(
    a: &ShopArgs,
    modes: &[Variant],
    runs: Vec<ModeResult>,
    setting: Setting,
) -> CliResult {
    let Setting {
        machine,
        disk,
        synced_writes_per_s,
        fs,
        dir,
        load,
        amount,
    } = setting;
    let results = median_runs(modes, &runs);
    if a.rounds > 1 {
        for m in modes {
            let each: Vec<String> = runs
                .iter()
                .filter(|r| r.journal == m.name())
                .map(|r| format!("{:.0}", r.documents_per_s))
                .collect();
            println!(
                "{} documents/s in each round: {} (the table shows the median run)",
                m.name(),
                each.join(", ")
            );
        }
    }
    println!("machine: {machine}; file system: {fs} ({})", dir.display());
    println!("disk: {disk}");
    println!(
        "workload: 1 documents storage + {} index storages, {load}, ~1 KB documents, {amount} per mode",
        a.indexes
    );
    print_table(&results);
    if let Some(p) = &a.json {
        let rep = Report {
            machine: machine.clone(),
            disk: disk.clone(),
            synced_writes_per_s,
            file_system: fs.clone(),
            dir: dir.display().to_string(),
            modes: results.clone(),
            runs: if a.rounds > 1 {
                runs.clone()
            } else {
                Vec::new()
            },
        };
        let text = serde_json::to_string_pretty(&rep).expect("serializable");
        std::fs::write(p, text + "\n")
            .map_err(|e| Fail::io(format!("--json {}: {e}", p.display())))?;
    }
    if let Some(p) = &a.plot {
        let series: Vec<(String, Vec<(f64, u64)>)> = results
            .iter()
            .map(|r| {
                (
                    format!("{} journal: {:.0} docs/s", r.journal, r.documents_per_s),
                    r.histogram.as_ref().map(plot_points).unwrap_or_default(),
                )
            })
            .collect();
        let title = format!(
            "omnibus bench shop: document commit latency, 1 + {} storages, {} clients",
            a.indexes, a.clients
        );
        crate::plot::latency_png(p, &title, &series)
            .map_err(|e| Fail::io(format!("--plot {}: {e}", p.display())))?;
    }
    if let Some(p) = &a.plot_timeline {
        let series: Vec<crate::plot::TimelineSeries> = results
            .iter()
            .map(|r| {
                (
                    format!("{} journal", r.journal),
                    r.timeline
                        .iter()
                        .map(|t| (t.t_s, t.documents_per_s, t.anon_rss_mib))
                        .collect(),
                )
            })
            .collect();
        let title = format!(
            "omnibus bench shop over time: 1 + {} storages, {load}",
            a.indexes
        );
        crate::plot::timeline_png(p, &title, &series)
            .map_err(|e| Fail::io(format!("--plot-timeline {}: {e}", p.display())))?;
    }
    Ok(())
}

/// Checks that `file`'s directory exists and is writable, so that writing `file` after the
/// run does not fail (`opt` names the option in the message).
pub(crate) fn writable_parent(opt: &str, file: &Path) -> CliResult {
    let parent = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if file.is_dir() {
        return Err(Fail::input(format!(
            "{opt} {}: is a directory (give a file name)",
            file.display()
        )));
    }
    match std::fs::metadata(parent) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(Fail::input(format!(
                "{opt} {}: {} is not a directory",
                file.display(),
                parent.display()
            )))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Fail::input(format!(
                "{opt} {}: directory {} does not exist",
                file.display(),
                parent.display()
            )))
        }
        Err(e) => {
            return Err(Fail::input(format!(
                "{opt} {}: directory {}: {e}",
                file.display(),
                parent.display()
            )))
        }
    }
    if rustix::fs::access(parent, rustix::fs::Access::WRITE_OK).is_err() {
        return Err(Fail::input(format!(
            "{opt} {}: directory {} is not writable",
            file.display(),
            parent.display()
        )));
    }
    Ok(())
}

/// (percentile, microseconds) points of a histogram for the plot, the maximum last.
fn plot_points(h: &Histogram<u64>) -> Vec<(f64, u64)> {
    let mut v: Vec<(f64, u64)> = Vec::new();
    for it in h.iter_quantiles(8) {
        let q = it.quantile_iterated_to();
        if q < 1.0 {
            v.push((q, it.value_iterated_to()));
        }
    }
    if !h.is_empty() {
        let last = v.last().map(|p| p.0).unwrap_or(0.0);
        v.push(((1.0 - 1.0 / h.len() as f64).max(last), h.max()));
    }
    // Monotone: each point at least the one before it.
    let mut top = 0;
    for p in &mut v {
        top = top.max(p.1);
        p.1 = top;
    }
    v
}

fn print_table(rs: &[ModeResult]) {
    // The gain column compares the first two runs (shared over separate by default).
    let (shared, separate) = (rs.first(), rs.get(1));
    let mut header = format!("{:<28}", "");
    for r in rs {
        header.push_str(&format!("{:>14}", r.journal));
    }
    let gain = shared.is_some() && separate.is_some();
    if gain {
        header.push_str(&format!("{:>10}", "gain"));
    }
    println!("{header}");
    // (label, value, higher is better)
    type Get = fn(&ModeResult) -> f64;
    let rows: [(&str, Get, bool, usize); 23] = [
        ("documents/s", |r| r.documents_per_s, true, 0),
        ("CPU us/document", |r| r.cpu_us_per_document, false, 0),
        (
            "commit p50 (ms)",
            |r| r.commit_us_p50 as f64 / 1000.0,
            false,
            2,
        ),
        (
            "commit p99 (ms)",
            |r| r.commit_us_p99 as f64 / 1000.0,
            false,
            2,
        ),
        (
            "commit p99.9 (ms)",
            |r| r.commit_us_p999 as f64 / 1000.0,
            false,
            2,
        ),
        (
            "commit max (ms)",
            |r| r.commit_us_max as f64 / 1000.0,
            false,
            2,
        ),
        ("fdatasyncs/s", |r| r.fdatasyncs_per_s, false, 0),
        (
            "fdatasyncs per 1000 docs",
            |r| {
                if r.documents > 0 {
                    r.fdatasyncs as f64 * 1000.0 / r.documents as f64
                } else {
                    0.0
                }
            },
            false,
            1,
        ),
        (
            "commits per fdatasync",
            |r| r.commits_per_fdatasync,
            true,
            1,
        ),
        // The group commit factor: journal fdatasyncs also count the pre-zeroing of the
        // journal's tail (one per zeroed chunk) and the start of each journal file, so commits
        // per fdatasync can be under 1 while every batch holds several commits.
        (
            "commits per journal batch",
            |r| {
                if r.batches > 0 {
                    r.commits as f64 / r.batches as f64
                } else {
                    0.0
                }
            },
            true,
            1,
        ),
        (
            "journal bytes/document",
            |r| r.journal_bytes_per_document,
            false,
            0,
        ),
        (
            "journal zeros/document",
            |r| r.journal_zero_bytes_per_document,
            false,
            0,
        ),
        (
            "disk bytes/document",
            |r| r.disk_bytes_per_document.unwrap_or(0.0),
            false,
            0,
        ),
        (
            "device bytes/document",
            |r| r.device_bytes_per_document.unwrap_or(0.0),
            false,
            0,
        ),
        (
            "data file bytes/document",
            |r| r.data_file_bytes_per_document,
            false,
            0,
        ),
        (
            "data alloc bytes/document",
            |r| r.data_allocated_bytes_per_document,
            false,
            0,
        ),
        ("anon RSS max (MiB)", |r| r.anon_rss_mib_max, false, 0),
        ("page images max (MiB)", |r| r.page_image_mib_max, false, 0),
        ("memory budget (MiB)", |r| r.memory_budget_mib, false, 0),
        (
            "budget overruns",
            |r| r.memory_budget_overruns as f64,
            false,
            0,
        ),
        ("index lag p99 (ms)", |r| r.index_lag_ms_p99, false, 1),
        ("index lag max (ms)", |r| r.index_lag_ms_max, false, 1),
        ("documents", |r| r.documents as f64, true, 0),
    ];
    for (label, get, higher, prec) in rows {
        let mut line = format!("{label:<28}");
        for r in rs {
            line.push_str(&format!("{:>14.*}", prec, get(r)));
        }
        if let (Some(s), Some(p)) = (shared, separate) {
            let (a, b) = (get(s), get(p));
            let g = if higher { a / b } else { b / a };
            if g.is_finite() && label != "documents" {
                line.push_str(&format!("{:>9.1}x", g));
            }
        }
        println!("{line}");
    }
    if let (true, Some(s), Some(p)) = (gain, shared, separate) {
        let (s, p) = (s.journal, p.journal);
        println!("gain: {s} over {p} ({s}/{p} for rates, {p}/{s} for latencies and costs; above 1x: {s} is better)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fmt;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    #[test]
    fn plot_points_are_monotone() {
        let mut h = fmt::histogram();
        let mut rng = SmallRng::seed_from_u64(7);
        for _ in 0..20_000 {
            let v: u64 = if rng.random_ratio(1, 100) {
                rng.random_range(100_000..1_400_000)
            } else {
                rng.random_range(1_000..300_000)
            };
            h.record(v).unwrap();
        }
        let p = plot_points(&h);
        assert!(p.len() > 10);
        for w in p.windows(2) {
            assert!(w[0].0 <= w[1].0 && w[0].1 <= w[1].1, "{w:?}");
        }
        assert_eq!(p.last().unwrap().1, h.max());
    }
}
