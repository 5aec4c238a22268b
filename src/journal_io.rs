//! Choosing a journal's batch I/O path ([`JournalIo`]): `Options::journal_io`, overridden by
//! the environment variable `OMNIBUS_JOURNAL_IO` (`auto|syscalls|ring`); [`JournalIo::Auto`]
//! measures once per file system and device in the process (a short probe when a journal
//! opens) and picks the faster path there (design.md 4.1).
//!
//! Why measure: a serial durable commit is one write and one sync, and what the ring adds or
//! saves depends on the kernel and the device. The ring's linked `FSYNC` always runs on an
//! io-wq worker (the kernel never issues an fsync inline), so at queue depth 1 every batch pays
//! a worker wake-up and a completion hop that `pwritev` + `fdatasync` on the writing thread
//! does not (docs/BENCHMARKS.md, serial commits, per path).
//!
//! The probe (about 10-20 ms, once per device per process, at the first read-write journal open
//! there): in the journal's directory, a scratch file `.omnibus-io-probe-<pid>.journal` (a
//! journal file's extension, so the io_uring environment treats it as one) is created and at
//! once unlinked (the probe writes through its open descriptor, so a process killed meanwhile
//! leaves nothing; a name left by a kill in the instant between the two calls is removed by the
//! next read-write open, [`sweep`]). Its [`PROBE_SLOTS`] 4 KiB blocks are zeroed and synced,
//! then receive [`PROBE_WRITES`] 4 KiB write-and-sync batches per path, alternating paths write
//! by write; the path with the lower median wins, and a tie (within [`TIE`]) goes to
//! [`JournalIo::Syscalls`], the one with fewer moving parts. It runs only through the process's
//! default environment with a ring ([`crate::env::default_env`]); a journal opened with another
//! environment (the test environments) or in a process without a ring gets
//! [`JournalIo::Syscalls`] without a probe. Read-only commands never probe
//! ([`JournalIo::describe`]).

use std::io::IoSlice;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use crate::env::{default_env, JournalIo, OpenMode, StorageEnv};
use crate::probe::{env_override, medians, noted, DeviceChoices};

/// `Auto`'s choice per device (`st_dev`) in this process.
static CHOICES: DeviceChoices<JournalIo> = DeviceChoices::new();

/// The probe's scratch file in the journal's directory, followed by the process id (two
/// processes probing one directory never share a file).
const PROBE_FILE: &str = ".omnibus-io-probe";
/// 4 KiB blocks of the scratch file (each batch overwrites the next, as the journal's
/// pre-zeroed tail is overwritten).
const PROBE_SLOTS: u64 = 16;
/// Timed write-and-sync batches per path.
const PROBE_WRITES: usize = 24;
/// The ring is chosen only when its median beats the syscalls' by more than this fraction. On
/// the development VM the probe's run-to-run noise is 5-10% on a quiet machine and up to 15%
/// under load, where it once put the ring 14% ahead while the ring then ran 0.72x of the
/// syscalls' commits/s with a 3x longer p99 (docs/BENCHMARKS.md): a ring that is not clearly
/// faster pays an io-wq worker's wake-up per batch for nothing.
const TIE: f64 = 0.25;

/// The path a journal in `dir` (its `Journals/` directory) writes batches with, and why (shown
/// by `omnibus stat`, [`crate::Storage::journal_io`]).
///
/// `requested` is `Options::journal_io`; `OMNIBUS_JOURNAL_IO`, when set to a valid name,
/// overrides it (an invalid value is ignored with a warning). A failed probe falls back to
/// [`JournalIo::Syscalls`] and says why.
pub(crate) fn resolve(
    requested: JournalIo,
    env: &Arc<dyn StorageEnv>,
    dir: &Path,
) -> (JournalIo, String) {
    let (over, note) = env_override(
        "OMNIBUS_JOURNAL_IO",
        "auto, syscalls or ring",
        JournalIo::parse,
    );
    let (path, why) = resolve_as(over, requested, env, dir);
    (path, noted(why, note))
}

/// [`resolve`] once the environment variable is read (`over`, when valid).
fn resolve_as(
    over: Option<JournalIo>,
    requested: JournalIo,
    env: &Arc<dyn StorageEnv>,
    dir: &Path,
) -> (JournalIo, String) {
    let (path, why) = over.map_or((requested, "Options::journal_io"), |p| {
        (p, "OMNIBUS_JOURNAL_IO")
    });
    let ring = crate::env::io_backend();
    if path == JournalIo::Ring && !ring.io_uring {
        return (
            JournalIo::Syscalls,
            format!(
                "ring by {why}, but this process has no ring ({}): syscalls",
                ring.reason
            ),
        );
    }
    if path != JournalIo::Auto {
        return (path, format!("{} by {why}", path.name()));
    }
    if !ring.io_uring && crate::probe::is_default_env(env) {
        return (
            JournalIo::Syscalls,
            format!("auto: this process has no ring ({})", ring.reason),
        );
    }
    CHOICES.choose(env, dir, JournalIo::Syscalls, JournalIo::name, probe)
}

/// The path to use given each path's median batch time (µs): the faster one, unless the
/// other is [`JournalIo::Syscalls`] within [`TIE`] of it.
fn pick(medians: &[(JournalIo, u128)]) -> JournalIo {
    let fastest = medians.iter().map(|m| m.1).min().unwrap_or(0) as f64;
    JournalIo::CONCRETE
        .into_iter()
        .find(|p| {
            medians
                .iter()
                .any(|(m, t)| m == p && (*t as f64) <= fastest * (1.0 + TIE))
        })
        .unwrap_or(JournalIo::Syscalls)
}

/// Times 4 KiB write-and-sync batches on each concrete path, alternating; returns the pick and
/// a summary (`syscalls 131 µs, ring 152 µs` at the median).
fn probe(env: &dyn StorageEnv, dir: &Path) -> crate::Result<(JournalIo, String)> {
    let path = dir.join(format!("{PROBE_FILE}-{}.journal", std::process::id()));
    let f = env.open(&path, OpenMode::Create)?;
    // Unlinked at once: the descriptor is all the probe needs.
    let unlinked = env.remove_file(&path).is_ok();
    let result = (|| -> crate::Result<(JournalIo, String)> {
        const BLOCK: u64 = 4096;
        crate::env::allocate_or_zero(&*f, 0, PROBE_SLOTS * BLOCK)?;
        f.sync_data()?;
        let block: Vec<u8> = (0..BLOCK).map(|i| (i % 251) as u8).collect();
        let slices = [IoSlice::new(&block)];
        let mut times: Vec<(JournalIo, Vec<u128>)> = JournalIo::CONCRETE
            .iter()
            .map(|p| (*p, Vec::with_capacity(PROBE_WRITES)))
            .collect();
        let mut slot = 0;
        for _ in 0..PROBE_WRITES {
            for (p, t) in times.iter_mut() {
                let t0 = Instant::now();
                f.write_vectored_and_sync(&slices, slot * BLOCK, *p)?;
                t.push(t0.elapsed().as_micros());
                slot = (slot + 1) % PROBE_SLOTS;
            }
        }
        let (medians, table) = medians(&mut times, JournalIo::name);
        Ok((pick(&medians), table))
    })();
    drop(f);
    if !unlinked {
        let _ = env.remove_file(&path);
    }
    result
}

/// Removes probe files that a process killed between creating and unlinking one left in the
/// journal directory `dir` (called by a read-write journal open, which holds the storage's
/// `LOCK`). Best effort: a file that cannot be listed or removed is left.
pub(crate) fn sweep(env: &dyn StorageEnv, dir: &Path) {
    let Ok(names) = env.list_dir(dir) else {
        return;
    };
    for n in names
        .iter()
        .filter(|n| n.starts_with(PROBE_FILE) && n.ends_with(".journal"))
    {
        let _ = env.remove_file(&dir.join(n));
    }
}

impl JournalIo {
    /// The path a read-write journal in the storage or database directory `dir` would write
    /// batches with, and why, for read-only reports (`omnibus stat`), without writing anything
    /// anywhere: an explicit `OMNIBUS_JOURNAL_IO`, `Syscalls` in a process without a ring, or
    /// what [`JournalIo::Auto`] measured on that device if this process already probed it;
    /// else `None` with the reason (the probe runs when a journal opens for writing). An open
    /// storage says what it uses in [`crate::Storage::journal_io`]. (Defined here, beside the
    /// probe's cache it reads, so that `env` never names this module.)
    pub fn describe(dir: &Path) -> (Option<JournalIo>, String) {
        let journals = dir.join(crate::layout::JOURNALS_DIR);
        let (over, note) = env_override(
            "OMNIBUS_JOURNAL_IO",
            "auto, syscalls or ring",
            JournalIo::parse,
        );
        let ring = crate::env::io_backend();
        if over.is_some_and(|p| p != JournalIo::Auto) || !ring.io_uring {
            // No probe on these paths of `resolve`.
            let (p, why) = resolve_as(over, JournalIo::Auto, &default_env(), &journals);
            return (Some(p), noted(why, note));
        }
        if let Some((p, why)) = CHOICES.cached(&journals) {
            return (Some(p), noted(why, note));
        }
        let why = "auto: measured by a short probe when a journal opens for writing (a \
                   read-only command does not probe)";
        (None, noted(why.into(), note))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tie_goes_to_syscalls_and_a_clear_gain_to_the_faster() {
        use JournalIo::*;
        assert_eq!(pick(&[(Syscalls, 140), (Ring, 160)]), Syscalls);
        // Within 25%: the fewer moving parts.
        assert_eq!(pick(&[(Syscalls, 124), (Ring, 100)]), Syscalls);
        assert_eq!(pick(&[(Syscalls, 130), (Ring, 100)]), Ring);
    }

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for p in [JournalIo::Auto, JournalIo::Syscalls, JournalIo::Ring] {
            assert_eq!(JournalIo::parse(p.name()), Some(p));
        }
        assert_eq!(JournalIo::parse("uring"), None);
    }

    #[test]
    fn the_probe_picks_a_path_and_leaves_no_file() {
        let dir = std::env::temp_dir().join(format!("omnibus-journal-io-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let env = default_env();
        let (p, table) = probe(env.as_ref(), &dir).unwrap();
        assert!(JournalIo::CONCRETE.contains(&p), "{p:?}");
        assert!(
            table.contains("syscalls") && table.contains("ring"),
            "{table}"
        );
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert!(left.is_empty(), "the scratch file is removed: {left:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
