//! What `bench shop` measures besides latency: the process's CPU time (`getrusage`), a
//! timeline of documents/s and anonymous memory sampled once a second, the data files' bytes,
//! and the slow-disk profile (`--disk slow`: the process's writes throttled through the
//! kernel's block layer, cgroup v1 `blkio` or v2 `io`), with a probe of synced writes/s.
//!
//! And how a benchmark (`bench shop`, `bench scale`) ends when interrupted: one thread waits
//! for SIGINT, SIGTERM and SIGHUP ([`handle_interrupts`]), deletes what the run registered
//! (created and registered together under [`creating`]), leaves the cgroup and exits with 128 +
//! the signal; `main` waits for a cleanup in progress ([`wait_for_interrupt_cleanup`]) and its
//! log writer drops what the engine logs meanwhile ([`interrupted`]). What a SIGKILLed run
//! left, the next run removes ([`remove_stale`]).

use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::{CliResult, Fail};

/// Write I/Os per second the slow-disk profile allows the process. Measured on the
/// development VM (virtio, ext4): a synced 4 KiB overwrite costs about two throttled I/Os
/// (the write and the cache flush), so 2,000 gives about 1,000 synced writes/s, from one
/// thread or four alike.
pub const SLOW_DISK_WRITE_IOPS: u64 = 2000;

/// CPU seconds (user + system) the whole process has used so far, from `getrusage`.
pub fn process_cpu_seconds() -> f64 {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one `rusage` into the pointed-to, properly aligned and sized
    // buffer; RUSAGE_SELF is a valid `who`. On failure the zeroed buffer stays as is.
    let ru = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr());
        ru.assume_init()
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// The process's anonymous resident memory in bytes (`RssAnon` of `/proc/self/status`).
pub fn anon_rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// Bytes of every `data.pages` file under `dir` (the database: root and `Indexes/*`):
/// (file lengths, allocated bytes from `st_blocks`).
pub fn data_file_bytes(dir: &Path) -> (u64, u64) {
    let mut len = 0;
    let mut alloc = 0;
    let mut add = |p: PathBuf| {
        if let Ok(m) = std::fs::metadata(p) {
            len += m.len();
            alloc += m.blocks() * 512;
        }
    };
    add(dir.join("data.pages"));
    if let Ok(rd) = std::fs::read_dir(dir.join("Indexes")) {
        for e in rd.flatten() {
            add(e.path().join("data.pages"));
        }
    }
    (len, alloc)
}

/// One sample of the timeline.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Seconds since the timed part started.
    pub t_s: f64,
    /// Documents acknowledged so far.
    pub documents: u64,
    /// Documents/s over the last interval.
    pub documents_per_s: f64,
    /// Anonymous resident memory (MiB).
    pub anon_rss_mib: f64,
    /// Length of the data files (MiB).
    pub data_file_mib: f64,
    /// Unflushed bytes of every storage (scratch pages plus pages freed since the last flush,
    /// `Storage::unflushed_bytes`), in MiB.
    pub unflushed_mib: f64,
    /// Scratch pages of every storage (memory; `Storage::scratch_bytes`), in MiB.
    pub scratch_mib: f64,
    /// Page images alive in the process (`omnibus::live_image_bytes`: scratch tables, older
    /// ones still held, commits in flight, dirty pages of transactions in progress), in MiB:
    /// what the engine's memory budget holds.
    pub page_image_mib: f64,
}

/// A thread that samples documents, memory and data file bytes every `every` until stopped.
pub struct Timeline {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Vec<Sample>>>,
}

impl Timeline {
    /// Starts sampling `done` (documents acknowledged), the database at `db_dir` and the
    /// storages' (unflushed, scratch) bytes (`unflushed`).
    pub fn start(
        done: Arc<AtomicU64>,
        db_dir: PathBuf,
        unflushed: Box<dyn Fn() -> (u64, u64) + Send>,
        every: Duration,
    ) -> Timeline {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("omnibus-shop-timeline".into())
            .spawn(move || {
                let start = Instant::now();
                let mut out = Vec::new();
                let (mut last_t, mut last_n) = (0.0f64, 0u64);
                let mut next = start + every;
                // Bounded: one sample per interval until stopped.
                while !s.load(Ordering::Relaxed) {
                    let now = Instant::now();
                    if now < next {
                        std::thread::sleep((next - now).min(Duration::from_millis(100)));
                        continue;
                    }
                    next += every;
                    let t = start.elapsed().as_secs_f64();
                    let n = done.load(Ordering::Relaxed);
                    let (len, _) = data_file_bytes(&db_dir);
                    let unflushed_scratch = unflushed();
                    out.push(Sample {
                        t_s: t,
                        documents: n,
                        documents_per_s: (n - last_n) as f64 / (t - last_t).max(1e-9),
                        anon_rss_mib: anon_rss_bytes().unwrap_or(0) as f64 / 1048576.0,
                        data_file_mib: len as f64 / 1048576.0,
                        unflushed_mib: unflushed_scratch.0 as f64 / 1048576.0,
                        scratch_mib: unflushed_scratch.1 as f64 / 1048576.0,
                        page_image_mib: omnibus::live_image_bytes() as f64 / 1048576.0,
                    });
                    (last_t, last_n) = (t, n);
                }
                out
            })
            .ok();
        Timeline { stop, thread }
    }

    /// Stops sampling and returns the samples.
    pub fn finish(mut self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Timeline {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Synced 4 KiB overwrites per second in `dir`, measured with `count` `pwrite` +
/// `fdatasync` pairs on a pre-allocated file (deleted afterwards).
pub fn probe_synced_writes(dir: &Path, count: u32) -> CliResult<f64> {
    let path = dir.join(format!(".omnibus-probe-{}", std::process::id()));
    let r = (|| -> std::io::Result<f64> {
        // Regression: a SIGTERM while this probe ran left the file behind in the user's --dir.
        let mut creating = creating();
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)?;
        creating.remove_on_interrupt(&path);
        drop(creating);
        f.write_all(&vec![0u8; 4096 * 16])?;
        f.sync_all()?;
        let buf = [7u8; 4096];
        let t = Instant::now();
        for i in 0..count {
            f.write_all_at(&buf, 4096 * u64::from(i % 16))?;
            f.sync_data()?;
        }
        Ok(f64::from(count) / t.elapsed().as_secs_f64().max(1e-9))
    })();
    let _ = std::fs::remove_file(&path);
    r.map_err(|e| Fail::io(format!("probing synced writes in {}: {e}", dir.display())))
}

/// The slow-disk profile: while alive, this process sits in a cgroup of its own whose writes
/// to the device under the benchmark directory are limited to [`SLOW_DISK_WRITE_IOPS`] per
/// second (cgroup v1 `blkio.throttle.write_iops_device`, or v2 `io.max wiops`). Dropping it
/// moves the process back and removes the cgroup.
pub struct SlowDisk {
    group: PathBuf,
    parent_procs: PathBuf,
    /// "MAJ:MIN" of the throttled device.
    pub device: String,
    /// Which controller: "cgroup v1 blkio" or "cgroup v2 io".
    pub controller: &'static str,
}

/// The whole-disk "MAJ:MIN" that holds `dir` (a partition's parent disk: throttling works on
/// whole disks).
fn disk_of(dir: &Path) -> CliResult<String> {
    let dev = std::fs::metadata(dir)
        .map_err(|e| Fail::io(format!("{}: {e}", dir.display())))?
        .dev();
    let (maj, min) = (libc::major(dev), libc::minor(dev));
    let sys = PathBuf::from(format!("/sys/dev/block/{maj}:{min}"));
    if !sys.exists() {
        return Err(Fail::input(format!(
            "--disk slow: {} is on device {maj}:{min}, which is not a block device (a tmpfs, overlay or network file system cannot be throttled); use --dir on a disk",
            dir.display()
        )));
    }
    if sys.join("partition").exists() {
        // The parent directory of a partition's sysfs entry is its disk.
        let real = std::fs::canonicalize(&sys).map_err(|e| Fail::io(format!("{e}")))?;
        if let Some(parent) = real.parent() {
            if let Ok(d) = std::fs::read_to_string(parent.join("dev")) {
                return Ok(d.trim().to_string());
            }
        }
    }
    Ok(format!("{maj}:{min}"))
}

/// The process's current cgroup path for `controller` (v1) or the unified hierarchy ("").
fn own_cgroup(controller: &str) -> Option<String> {
    let s = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    s.lines().find_map(|l| {
        let mut it = l.splitn(3, ':');
        let (_, ctrls, path) = (it.next()?, it.next()?, it.next()?);
        let hit = if controller.is_empty() {
            ctrls.is_empty()
        } else {
            ctrls.split(',').any(|c| c == controller)
        };
        hit.then(|| path.to_string())
    })
}

impl SlowDisk {
    /// Throttles this process's writes to the disk under `dir`. Errors (the benchmark refuses
    /// to run): not root, no usable `blkio`/`io` controller, a directory not on a block device.
    pub fn enter(dir: &Path) -> CliResult<SlowDisk> {
        let device = disk_of(dir)?;
        if !rustix::process::geteuid().is_root() {
            return Err(Fail::input(
                "--disk slow throttles this process through a cgroup, which needs root; run as root or without --disk slow",
            ));
        }
        let v1 = Path::new("/sys/fs/cgroup/blkio");
        let name = format!("omnibus-bench-{}", std::process::id());
        let (base, limit_file, line, controller) = if v1
            .join("blkio.throttle.write_iops_device")
            .exists()
        {
            let own = own_cgroup("blkio").unwrap_or_default();
            (
                v1.join(own.trim_start_matches('/')),
                "blkio.throttle.write_iops_device",
                format!("{device} {SLOW_DISK_WRITE_IOPS}"),
                "cgroup v1 blkio",
            )
        } else {
            let unified = if Path::new("/sys/fs/cgroup/unified/cgroup.controllers").exists() {
                PathBuf::from("/sys/fs/cgroup/unified")
            } else {
                PathBuf::from("/sys/fs/cgroup")
            };
            let ctrls =
                std::fs::read_to_string(unified.join("cgroup.controllers")).unwrap_or_default();
            if !ctrls.split_whitespace().any(|c| c == "io") {
                return Err(Fail::input(
                        "--disk slow needs the cgroup v1 blkio controller or the cgroup v2 io controller, and neither is available here",
                    ));
            }
            let own = own_cgroup("").unwrap_or_default();
            (
                unified.join(own.trim_start_matches('/')),
                "io.max",
                format!("{device} wiops={SLOW_DISK_WRITE_IOPS}"),
                "cgroup v2 io",
            )
        };
        for stale in remove_stale(&base) {
            eprintln!("omnibus: removed cgroup {stale} left by a killed run");
        }
        let group = base.join(&name);
        let mut creating = creating();
        std::fs::create_dir(&group).map_err(|e| {
            Fail::input(format!(
                "--disk slow: creating cgroup {}: {e}",
                group.display()
            ))
        })?;
        let guard = SlowDisk {
            group: group.clone(),
            parent_procs: base.join("cgroup.procs"),
            device,
            controller,
        };
        creating.leave_on_interrupt(&guard.group, &guard.parent_procs);
        drop(creating);
        std::fs::write(group.join(limit_file), &line).map_err(|e| {
            Fail::input(format!(
                "--disk slow: writing {line:?} to {}: {e}",
                group.join(limit_file).display()
            ))
        })?;
        std::fs::write(group.join("cgroup.procs"), std::process::id().to_string()).map_err(
            |e| {
                Fail::input(format!(
                    "--disk slow: moving the process into {}: {e}",
                    group.display()
                ))
            },
        )?;
        Ok(guard)
    }
}

impl Drop for SlowDisk {
    fn drop(&mut self) {
        let mut c = cleanup();
        c.cgroup = None;
        if !leave_cgroup(&self.group, &self.parent_procs) {
            eprintln!(
                "omnibus: could not remove cgroup {} (remove it by hand)",
                self.group.display()
            );
        }
    }
}

/// What an interrupted run must undo: the directories it created and the cgroup it entered.
#[derive(Default)]
struct Cleanup {
    dirs: Vec<PathBuf>,
    /// (the cgroup, its parent's `cgroup.procs`)
    cgroup: Option<(PathBuf, PathBuf)>,
}

static CLEANUP: std::sync::Mutex<Cleanup> = std::sync::Mutex::new(Cleanup {
    dirs: Vec::new(),
    cgroup: None,
});

fn cleanup() -> std::sync::MutexGuard<'static, Cleanup> {
    CLEANUP.lock().unwrap_or_else(|e| e.into_inner())
}

/// Holds off an interrupt's cleanup while the run creates something and registers it: made
/// by [`creating`], the cleanup waits until it is dropped. Create and register while holding
/// one, so that a signal never falls between the two (the cleanup would miss what is created
/// after it looked). Regression: a TERM on a loaded machine, while a run created its database
/// directory, left that directory behind.
pub struct Creating(std::sync::MutexGuard<'static, Cleanup>);

/// Starts creating something the cleanup must remove. If an interrupt is already being
/// handled this blocks until the cleanup exits the process, so nothing more is created.
pub fn creating() -> Creating {
    Creating(cleanup())
}

impl Creating {
    /// Registers `path` (a directory, or a file) to be deleted if the run is interrupted
    /// (SIGINT, SIGTERM, SIGHUP).
    pub fn remove_on_interrupt(&mut self, path: &Path) {
        self.0.dirs.push(path.to_path_buf());
    }

    /// Registers the slow-disk cgroup `group`: an interrupted run moves the process back to
    /// the parent whose `cgroup.procs` is `parent_procs` and removes it.
    fn leave_on_interrupt(&mut self, group: &Path, parent_procs: &Path) {
        self.0.cgroup = Some((group.to_path_buf(), parent_procs.to_path_buf()));
    }
}

/// Makes SIGINT, SIGTERM and SIGHUP end the run cleanly: leave the slow-disk cgroup, delete
/// the registered directories, exit with 128 + the signal (a signal ignored at start, as
/// under `nohup`, stays ignored). Call before any thread starts:
/// the signals are blocked in the calling thread, every thread started later inherits that,
/// and one thread of its own waits for them (`sigwait`), so no signal handler runs anywhere.
pub fn handle_interrupts() {
    // SAFETY: sigset_t and sigaction are plain data (zeroed is valid; the set is initialized by
    // sigemptyset before use); the calls get valid pointers to them, only read a signal's
    // disposition (sigaction with a null new action) and change this thread's signal mask.
    let set = unsafe {
        let mut set = std::mem::MaybeUninit::<libc::sigset_t>::zeroed().assume_init();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // A signal ignored when the run started (`nohup` ignores SIGHUP; a shell's
            // background job, SIGINT) stays ignored, as Unix tools do. Regression: `nohup
            // omnibus bench shop &` was interrupted, its results deleted, by a SIGHUP.
            let mut old = std::mem::MaybeUninit::<libc::sigaction>::zeroed().assume_init();
            if libc::sigaction(sig, std::ptr::null(), &mut old) == 0
                && old.sa_sigaction == libc::SIG_IGN
            {
                continue;
            }
            libc::sigaddset(&mut set, sig);
        }
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return;
        }
        set
    };
    let _ = std::thread::Builder::new()
        .name("omnibus-shop-signals".into())
        .spawn(move || {
            let mut sig: libc::c_int = 0;
            // SAFETY: `set` is an initialized sigset_t; sigwait writes one int into `sig`.
            if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
                return;
            }
            INTERRUPTED.store(true, Ordering::SeqCst);
            eprintln!("omnibus: interrupted (signal {sig}): cleaning up");
            let c = cleanup();
            if let Some((group, parent_procs)) = &c.cgroup {
                leave_cgroup(group, parent_procs);
            }
            for d in c.dirs.iter().rev() {
                remove_while_written(d);
            }
            std::process::exit(128 + sig);
        });
}

/// Set by the signal thread of [`handle_interrupts`] before it starts cleaning up.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// True once an interrupt's cleanup has started: the engine's threads, whose files it deletes,
/// then fail, and `main`'s log writer drops what they log.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// If an interrupt is being handled, blocks until its cleanup ends the process (it exits with
/// 128 + the signal); returns at once otherwise. `main` calls it before it reports the
/// command's result: the cleanup deletes the databases under a running engine, whose next
/// file operation then fails. Regression: a TERM while a run opened its databases ended it
/// with exit code 2 (the open's "No such file or directory", reported by the main thread while
/// the signal thread was still deleting) instead of 128 + 15.
pub fn wait_for_interrupt_cleanup() {
    if !interrupted() {
        return;
    }
    // The signal thread holds the cleanup lock until it exits the process, which ends while
    // this thread waits here.
    let _held = cleanup();
    loop {
        std::thread::park();
    }
}

/// Removes `path` (a directory with what it holds, or a file) while the engine's threads,
/// still running, may create files in it: a removal that finds a directory not empty (a file
/// created after it listed the directory) tries again, 50 times 20 ms at most. Regression: a
/// SIGTERM on a loaded machine left a run's directory behind.
fn remove_while_written(path: &Path) {
    for _ in 0..50 {
        match std::fs::remove_dir_all(path) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(_) if std::fs::remove_file(path).is_ok() => return,
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Moves the process back to its parent cgroup and removes `group`.
fn leave_cgroup(group: &Path, parent_procs: &Path) -> bool {
    let _ = std::fs::write(parent_procs, std::process::id().to_string());
    // Removing fails while a thread is still inside; the threads moved with the process.
    for _ in 0..50 {
        if std::fs::remove_dir(group).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// The process id in a name made by this benchmark (`omnibus-shop-<pid>-...`,
/// `omnibus-shop-<mode>-<pid>-...`, `omnibus-bench-<pid>`), if any.
fn pid_in(name: &str) -> Option<u32> {
    let rest = name
        .strip_prefix("omnibus-shop-")
        .or_else(|| name.strip_prefix("omnibus-bench-"))
        .or_else(|| name.strip_prefix("omnibus-scale-"))
        .or_else(|| name.strip_prefix(".omnibus-probe-"))?;
    let rest = rest
        .strip_prefix("shared-")
        .or_else(|| rest.strip_prefix("separate-"))
        .unwrap_or(rest);
    rest.split('-').next()?.parse().ok()
}

/// Removes what runs killed with SIGKILL left in `dir`: directories (and the disk probe's
/// file) named by `bench shop` or `bench scale` for a process that no longer exists. Returns
/// the names removed. Regression: a run killed during its disk probe left the probe's file in
/// `--dir` for good, and `bench scale` never removed what a killed run left.
pub fn remove_stale(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = pid_in(&name) else { continue };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let p = e.path();
        let gone = if name.starts_with("omnibus-bench-") {
            std::fs::remove_dir(&p).is_ok()
        } else if name.starts_with(".omnibus-probe-") {
            std::fs::remove_file(&p).is_ok()
        } else {
            std::fs::remove_dir_all(&p).is_ok()
        };
        if gone {
            out.push(name);
        }
    }
    out
}

/// [`remove_stale`], saying on stderr what it removed.
pub fn remove_stale_and_say(dir: &Path) {
    for name in remove_stale(dir) {
        eprintln!(
            "omnibus: removed {} left by a killed run",
            dir.join(name).display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_run_directories_of_dead_processes_are_removed() {
        assert_eq!(pid_in("omnibus-shop-123-aBc"), Some(123));
        assert_eq!(pid_in("omnibus-shop-shared-77-1796"), Some(77));
        assert_eq!(pid_in("omnibus-bench-9"), Some(9));
        assert_eq!(pid_in("omnibus-scale-31-Xy"), Some(31));
        assert_eq!(pid_in(".omnibus-probe-42"), Some(42));
        assert_eq!(pid_in("omnibus-shop-abc"), None);
        assert_eq!(pid_in("other-1"), None);
        let d = tempfile::tempdir().unwrap();
        // A pid above the kernel's pid_max (4,194,304) never exists.
        let dead = d.path().join("omnibus-shop-separate-4999999-1");
        std::fs::create_dir_all(dead.join("shop.omnibus")).unwrap();
        let mine = d
            .path()
            .join(format!("omnibus-shop-{}-x", std::process::id()));
        std::fs::create_dir(&mine).unwrap();
        let keep = d.path().join("omnibus-shop-notapid");
        std::fs::create_dir(&keep).unwrap();
        let probe = d.path().join(".omnibus-probe-4999998");
        std::fs::write(&probe, [0u8; 64]).unwrap();
        let scale = d.path().join("omnibus-scale-4999997-ab");
        std::fs::create_dir_all(scale.join("db")).unwrap();
        let mut removed = remove_stale(d.path());
        removed.sort();
        assert_eq!(
            removed,
            [
                ".omnibus-probe-4999998",
                "omnibus-scale-4999997-ab",
                "omnibus-shop-separate-4999999-1"
            ]
        );
        assert!(!dead.exists() && !probe.exists() && !scale.exists());
        assert!(mine.exists() && keep.exists());
    }

    #[test]
    fn cpu_seconds_grow_with_work() {
        let a = process_cpu_seconds();
        let t = Instant::now();
        let mut x = 0u64;
        while t.elapsed() < Duration::from_millis(50) {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        std::hint::black_box(x);
        assert!(process_cpu_seconds() > a);
    }

    #[test]
    fn anon_rss_is_read() {
        let r = anon_rss_bytes().expect("RssAnon in /proc/self/status");
        assert!(r > 0);
    }

    #[test]
    fn data_files_are_summed() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("data.pages"), vec![1u8; 8192]).unwrap();
        std::fs::create_dir_all(d.path().join("Indexes/a")).unwrap();
        std::fs::write(d.path().join("Indexes/a/data.pages"), vec![1u8; 4096]).unwrap();
        let (len, alloc) = data_file_bytes(d.path());
        assert_eq!(len, 12288);
        assert!(alloc >= 12288 || alloc == 0, "{alloc}");
    }
}
