//! `omnibus bench shop`: the RavenDB scenario, 1 documents storage + N index storages, run in
//! each journal mode one after the other and compared side by side.
//!
//! Clients put generated user documents (about 1 KB of JSON) into the documents storage, each
//! with one put in flight, the next one sent as soon as the acknowledgement comes back. The N
//! indexes are engine indexes (`define_index`, a byte-scan map function per index): the engine
//! feeds every acknowledged root commit to them (bounded: a slow index slows the clients down),
//! and each commits what is pending as one batch; the run ends with `wait_for_indexes`.
//!
//! Files: this one checks the arguments, prepares the directory and the disk, and runs each mode
//! in each round; `bench_shop/` holds the rest: `generate.rs` (the documents and the indexes'
//! map functions), `run.rs` (one mode's run: setup, clients, timing, what it measured) and
//! `report.rs` (the text table, the JSON report, the plots).

use std::path::PathBuf;

use crate::cli::{DiskArg, IndexModeArg, JournalArg, ShopArgs, Variant};
use crate::shop_measure;
use crate::{fmt, CliResult, Fail};

// The benchmark by concern (`bench_shop/`): the generated workload, one mode's run, and the
// report.
mod generate;
mod report;
mod run;

pub(crate) use report::writable_parent;
use report::{output, Setting};
use run::{base_dir, run_mode, BaseDir, ModeResult};

/// Synced writes of the disk probe before the run.
const PROBE_WRITES: u32 = 200;

pub fn run(a: ShopArgs) -> CliResult {
    crate::check_cores(a.cores)?;
    if a.docs == Some(0) {
        return Err(Fail::input("--docs must be at least 1"));
    }
    if let Some(r) = a.rate {
        if !(r > 0.0 && r.is_finite()) {
            return Err(Fail::input(
                "--rate must be a positive number of documents per second",
            ));
        }
    }
    let seconds = match (a.seconds, a.docs) {
        (Some(s), _) if !(s > 0.0 && s.is_finite()) => {
            return Err(Fail::input("--seconds must be a positive number"))
        }
        (Some(s), _) => Some(s),
        (None, Some(_)) => None,
        (None, None) => Some(20.0),
    };
    let mut modes: Vec<Variant> = Vec::new();
    for index in &a.index_mode {
        for journal in &a.journal {
            let m = Variant {
                journal: *journal,
                index: *index,
            };
            // Synchronous indexes commit in groups of the shared journal.
            let possible = !(m.journal == JournalArg::Separate && m.index == IndexModeArg::Sync);
            if possible && !modes.contains(&m) {
                modes.push(m);
            }
        }
    }
    if modes.is_empty() {
        return Err(Fail::input(
            "--index-mode sync needs the shared journal: add --journal shared",
        ));
    }
    // Checked before the run, so a bad path fails now instead of after the whole benchmark.
    if let Some(p) = &a.json {
        writable_parent("--json", p)?;
    }
    if let Some(p) = &a.plot {
        writable_parent("--plot", p)?;
    }
    if let Some(p) = &a.plot_timeline {
        writable_parent("--plot-timeline", p)?;
    }
    // Before any thread starts and before anything is created: Ctrl-C or a TERM then removes
    // the run's directories and leaves the slow-disk cgroup.
    shop_measure::handle_interrupts();
    let base = base_dir(&a)?;
    let dir: PathBuf = base.path().to_path_buf();
    let fs = fmt::fs_type(&dir);
    if fs == "tmpfs" && !a.allow_tmpfs {
        let msg = match &base {
            BaseDir::Given(_) => format!(
                "--dir {} is on a tmpfs: fdatasync costs nothing there; give a directory on a disk with --dir (or --allow-tmpfs)",
                dir.display()
            ),
            BaseDir::Temp { fallback, .. } => format!(
                "the temporary directory {} is on a tmpfs{}: fdatasync costs nothing there; run it from a writable directory on a disk (or pass --allow-tmpfs)",
                dir.display(),
                if *fallback {
                    " (the current directory is not writable, so the system temp directory was used)"
                } else {
                    ""
                }
            ),
        };
        return Err(Fail::input(msg));
    }
    // Entered before the run, left (the process moved back) when `slow` is dropped at the end.
    let slow = match a.disk {
        DiskArg::Slow => Some(shop_measure::SlowDisk::enter(&dir)?),
        DiskArg::Normal => None,
    };
    let synced_writes_per_s = shop_measure::probe_synced_writes(&dir, PROBE_WRITES)?;
    let disk = match &slow {
        Some(s) => format!(
            "slow ({} write I/Os/s on device {} through {}): {synced_writes_per_s:.0} synced 4 KiB writes/s measured",
            shop_measure::SLOW_DISK_WRITE_IOPS,
            s.device,
            s.controller
        ),
        None => format!("normal: {synced_writes_per_s:.0} synced 4 KiB writes/s measured"),
    };
    let machine = fmt::machine();
    let amount = match seconds {
        Some(s) => format!("{s} s"),
        None => format!("{} documents", a.docs.unwrap_or(0)),
    };
    let load = match a.rate {
        Some(r) => format!("open loop at {r} documents/s"),
        None => format!("{} clients", a.clients),
    };
    eprintln!(
        "bench shop: 1 documents storage + {} indexes, {load}, {amount} per mode; {} in {} ({fs}); disk {disk}",
        a.indexes,
        modes.iter().map(|m| m.name()).collect::<Vec<_>>().join(" then "),
        dir.display()
    );
    let mut runs: Vec<ModeResult> = Vec::new();
    // Bounded: --rounds is at most 100, modes at most 2.
    for round in 0..a.rounds {
        let order: Vec<Variant> = if round % 2 == 0 {
            modes.clone()
        } else {
            modes.iter().rev().copied().collect()
        };
        for m in &order {
            eprintln!("bench shop: running {} ...", m.name());
            let r = run_mode(&a, *m, &dir, seconds)
                .map_err(|f| f.context(format_args!("{} journal", m.name())))?;
            // Hand the freed heap of this mode back to the system, so the next mode's memory
            // samples start from what it holds itself (glibc keeps freed memory otherwise).
            // SAFETY: malloc_trim has no preconditions; it only releases free heap memory.
            unsafe {
                libc::malloc_trim(0);
            }
            eprintln!(
            "bench shop: {}: {} documents in {:.1} s ({:.0}/s), index catch-up {:.2} s, setup {:.1} s, close {:.1} s",
            m.name(),
            r.documents,
            r.seconds,
            r.documents_per_s,
            r.catch_up_seconds,
            r.setup_seconds,
            r.close_seconds
        );
            runs.push(r);
        }
    }
    output(
        &a,
        &modes,
        runs,
        Setting {
            machine,
            disk,
            synced_writes_per_s,
            fs,
            dir,
            load,
            amount,
        },
    )?;
    drop(slow);
    Ok(())
}
