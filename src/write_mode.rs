//! Choosing a storage's flush [`WriteMode`]: `Options::write_mode`, overridden by the
//! environment variable `OMNIBUS_WRITE_MODE` (`auto|mmap|file_io|vectored_file_io|io_ring`);
//! [`WriteMode::Auto`] measures once per file system and device in the process (a short probe)
//! and picks the cheapest mode there.
//!
//! The probe (about 20-60 ms, once per device per process, at the first flush that writes
//! pages): in the storage's directory, a scratch file `.omnibus-write-probe` receives the same
//! 1 MiB (8 runs of 16 pages, a gap of one page between runs, so runs stay separate) with every
//! mode in turn, each followed by `fdatasync`, three rounds interleaved; among the modes whose median time is within 20% of the
//! fastest (a probe this short cannot tell them apart), the first in a fixed preference
//! (vectored_file_io, file_io, io_ring, mmap: the lowest CPU per GiB first) wins; the
//! file is removed. It runs only through the process's default environment ([`crate::env::default_env`]):
//! a storage opened with another environment (the test environments) gets
//! [`WriteMode::VectoredFileIo`] without a probe, so tests stay deterministic.

use std::io::IoSlice;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use crate::env::{OpenMode, StorageEnv, WriteMode};
use crate::page::PAGE_SIZE;
use crate::probe::{env_override, medians, noted, DeviceChoices};

/// `Auto`'s choice per device (`st_dev`) in this process.
static CHOICES: DeviceChoices<WriteMode> = DeviceChoices::new();

const PROBE_FILE: &str = ".omnibus-write-probe";
const PROBE_RUNS: usize = 8;
const PROBE_RUN_PAGES: usize = 16;
const PROBE_ROUNDS: usize = 3;
/// Modes whose median is within this fraction of the fastest count as tied ... (10% first; on
/// an XFS loop device the 4 MiB probe then put file_io ahead of vectored_file_io, which was
/// the faster mode for real 65 MiB flushes there, 85% of the best: the probe's noise on that
/// device is about 20%, docs/BENCHMARKS.md)
const TIE: f64 = 0.20;
/// ... and a tie goes to the first of this order: the fewest moving parts and the least CPU per
/// byte where measured (docs/BENCHMARKS.md, write modes): one `pwritev` per run on the flusher's
/// thread, then `pwrite` per page, then the ring, then the map.
const PREFERENCE: [WriteMode; 4] = [
    WriteMode::VectoredFileIo,
    WriteMode::FileIo,
    WriteMode::IoRing,
    WriteMode::Mmap,
];

/// The mode a storage in `dir` flushes with, and why (shown by `omnibus stat`).
///
/// `requested` is `Options::write_mode`; `OMNIBUS_WRITE_MODE`, when set to a valid name,
/// overrides it (an invalid value is ignored with a warning). A failed probe falls back to
/// [`WriteMode::VectoredFileIo`] and says why.
pub fn resolve(requested: WriteMode, env: &Arc<dyn StorageEnv>, dir: &Path) -> (WriteMode, String) {
    let (over, note) = env_override(
        "OMNIBUS_WRITE_MODE",
        "auto, mmap, file_io, vectored_file_io or io_ring",
        WriteMode::parse,
    );
    let (mode, why) = resolve_as(over, requested, env, dir);
    (mode, noted(why, note))
}

/// [`resolve`] once the environment variable is read (`over`, when valid).
fn resolve_as(
    over: Option<WriteMode>,
    requested: WriteMode,
    env: &Arc<dyn StorageEnv>,
    dir: &Path,
) -> (WriteMode, String) {
    let (mode, why) = over.map_or((requested, "Options::write_mode"), |m| {
        (m, "OMNIBUS_WRITE_MODE")
    });
    if mode == WriteMode::IoRing && !crate::env::io_backend().io_uring {
        return (
            mode,
            format!(
                "io_ring by {why}, but this process has no ring ({}): runs are written as vectored_file_io",
                crate::env::io_backend().reason
            ),
        );
    }
    if mode != WriteMode::Auto {
        return (mode, format!("{} by {why}", mode.name()));
    }
    CHOICES.choose(env, dir, WriteMode::VectoredFileIo, WriteMode::name, probe)
}

/// The mode to use given each mode's median probe time (µs): the first of `PREFERENCE`
/// within `TIE` of the fastest.
fn pick(medians: &[(WriteMode, u128)]) -> WriteMode {
    let fastest = medians.iter().map(|m| m.1).min().unwrap_or(0) as f64;
    PREFERENCE
        .into_iter()
        .find(|p| {
            medians
                .iter()
                .any(|(m, t)| m == p && (*t as f64) <= fastest * (1.0 + TIE))
        })
        .unwrap_or(WriteMode::VectoredFileIo)
}

/// Times each concrete mode writing the same runs plus `fdatasync`; returns the fastest and a
/// summary (`mode median-µs, ...`).
fn probe(env: &dyn StorageEnv, dir: &Path) -> crate::Result<(WriteMode, String)> {
    let path = dir.join(PROBE_FILE);
    let f = env.open(&path, OpenMode::Create)?;
    let result = (|| -> crate::Result<(WriteMode, String)> {
        let page: Vec<u8> = (0..PAGE_SIZE).map(|i| (i % 251) as u8).collect();
        let slices: Vec<IoSlice<'_>> = (0..PROBE_RUN_PAGES).map(|_| IoSlice::new(&page)).collect();
        let run_bytes = (PROBE_RUN_PAGES * PAGE_SIZE) as u64;
        let runs: Vec<(u64, &[IoSlice<'_>])> = (0..PROBE_RUNS as u64)
            .map(|i| (i * (run_bytes + PAGE_SIZE as u64), &slices[..]))
            .collect();
        crate::env::allocate_or_zero(&*f, 0, PROBE_RUNS as u64 * (run_bytes + PAGE_SIZE as u64))?;
        let mut times: Vec<(WriteMode, Vec<u128>)> = WriteMode::CONCRETE
            .iter()
            .map(|m| (*m, Vec::new()))
            .collect();
        for _ in 0..PROBE_ROUNDS {
            for (mode, t) in times.iter_mut() {
                let t0 = Instant::now();
                f.write_runs(&runs, *mode)?;
                f.sync_data()?;
                t.push(t0.elapsed().as_micros());
            }
        }
        let (medians, table) = medians(&mut times, WriteMode::name);
        Ok((pick(&medians), table))
    })();
    drop(f);
    let _ = env.remove_file(&path);
    result
}

impl WriteMode {
    /// The mode a writable open of the storage in `dir` would use, and why, for read-only
    /// reports (`omnibus stat`), without writing anything anywhere: an explicit
    /// `OMNIBUS_WRITE_MODE`, or what [`WriteMode::Auto`] measured on that device if this
    /// process already probed it, else `None` with the reason ([`WriteMode::Auto`] probes at
    /// the first flush that writes pages). An open storage says what it uses in
    /// [`crate::Storage::write_mode`]. (Defined here, beside the probe's cache it reads, so
    /// that `env` never names this module.)
    pub fn describe(dir: &Path) -> (Option<WriteMode>, String) {
        describe(dir)
    }
}

/// [`WriteMode::describe`].
fn describe(dir: &Path) -> (Option<WriteMode>, String) {
    if let Some(m) = std::env::var("OMNIBUS_WRITE_MODE")
        .ok()
        .and_then(|v| WriteMode::parse(&v))
        .filter(|m| *m != WriteMode::Auto)
    {
        return (Some(m), format!("{} by OMNIBUS_WRITE_MODE", m.name()));
    }
    if let Some((m, why)) = CHOICES.cached(dir) {
        return (Some(m), why);
    }
    (
        None,
        "auto: measured by a short probe at the first flush that writes pages (a read-only command does not probe)".into(),
    )
}
