//! Child processes of a test binary whose tests also open storages in the binary's own process.
//!
//! A storage's `LOCK` is a `flock`, which belongs to an open file description. A child process
//! gets a copy of every descriptor of this process when it is created, and holds those copies
//! until its `exec` closes them (`O_CLOEXEC`): less than a millisecond, usually. A storage that
//! one test closes in that instant is still locked, for that instant, by the child another test
//! is starting; if the test opens it again at once, or runs a command on it, the open fails with
//! `Error::AlreadyOpen`. (Measured on the 2-core machine: a thread closing and reopening a
//! locked file every 2 ms beside a thread starting processes failed about once every five
//! process starts.)
//!
//! So in the `processes` binary, the only one whose tests start processes, every child is
//! started through [`spawn`], [`output`] or [`status`], which hold the gate shared while the
//! child starts (for the last two, until it exits), and a test that opens storages in this
//! process holds [`no_children_meanwhile`] (the gate, exclusively) while it does: no other
//! test's child is being started meanwhile, so none holds a copy of its descriptors. The test
//! holding the gate starts its own children as usual (one after the other with its own opens
//! and closes, on its own thread).

use std::cell::Cell;
use std::io::{self, BufRead};
use std::process::{Child, ChildStdout, Command, ExitStatus, Output};
use std::sync::{mpsc, PoisonError, RwLock, RwLockWriteGuard};
use std::thread::JoinHandle;
use std::time::Duration;

static GATE: RwLock<()> = RwLock::new(());

thread_local! {
    /// This thread's test holds the gate exclusively.
    static HOLDER: Cell<bool> = const { Cell::new(false) };
}

/// The gate held exclusively: see [`no_children_meanwhile`].
pub struct NoChildren {
    guard: Option<RwLockWriteGuard<'static, ()>>,
}

impl Drop for NoChildren {
    fn drop(&mut self) {
        if self.guard.take().is_some() {
            HOLDER.with(|h| h.set(false));
        }
    }
}

/// Holds the gate exclusively until dropped: no other test of this binary starts a child
/// process meanwhile (those that try wait). For a test that opens storages in this process; a
/// second hold on the same thread holds nothing more. A failed test's poisoning is ignored.
pub fn no_children_meanwhile() -> NoChildren {
    if HOLDER.with(Cell::get) {
        return NoChildren { guard: None };
    }
    let guard = GATE.write().unwrap_or_else(PoisonError::into_inner);
    HOLDER.with(|h| h.set(true));
    NoChildren { guard: Some(guard) }
}

/// Runs `start` (a child's start) with the gate held shared, unless this thread holds it.
fn starting<T>(start: impl FnOnce() -> T) -> T {
    if HOLDER.with(Cell::get) {
        return start();
    }
    let _shared = GATE.read().unwrap_or_else(PoisonError::into_inner);
    start()
}

/// `cmd.spawn()` through the gate (held until the child has run `exec`, when `spawn` returns).
pub fn spawn(cmd: &mut Command) -> io::Result<Child> {
    starting(|| cmd.spawn())
}

/// `cmd.output()` through the gate (held until the child exits: std starts it and collects its
/// output in one call).
pub fn output(cmd: &mut Command) -> io::Result<Output> {
    starting(|| cmd.output())
}

/// `cmd.status()` through the gate (held until the child exits).
pub fn status(cmd: &mut Command) -> io::Result<ExitStatus> {
    starting(|| cmd.status())
}

/// A child's side of a SIGKILL round: an empty line (the parent's "ready" mark), then every
/// acknowledgement `rx` brings, a line each, flushed at once (a line the parent reads was
/// acknowledged before the kill).
pub fn print_acks(rx: std::sync::mpsc::Receiver<String>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out).unwrap();
    for line in rx {
        writeln!(out, "{line}").unwrap();
        out.flush().unwrap();
    }
}

/// A child test's complete output lines, read on a thread of their own.
pub struct ChildLines {
    /// Each line as it is read (for the waits).
    seen: mpsc::Receiver<String>,
    reader: JoinHandle<Vec<String>>,
}

impl ChildLines {
    /// Starts reading `stdout` (a child test binary's, run with `--nocapture`).
    pub fn read(stdout: ChildStdout) -> ChildLines {
        let (tx, seen) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut r = io::BufReader::new(stdout);
            let mut lines = Vec::new();
            let mut line = Vec::new();
            loop {
                line.clear();
                match r.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => return lines,
                    // Cut by the kill: not a line the child finished printing.
                    Ok(_) if line.last() != Some(&b'\n') => return lines,
                    Ok(_) => {}
                }
                let l = String::from_utf8_lossy(&line).trim_end().to_string();
                let _ = tx.send(l.clone());
                lines.push(l);
            }
        });
        ChildLines { seen, reader }
    }

    /// Waits until the child prints a line that starts with `prefix`, a minute at most (the
    /// lines before it are still in [`ChildLines::finish`]'s).
    pub fn wait_for(&self, prefix: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.seen.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return,
                Ok(_) => {}
                Err(e) => panic!("the child never printed a line starting with {prefix:?}: {e}"),
            }
        }
    }

    /// Waits until the child's test harness says it runs the test ("running 1 test"): a
    /// kill's delay counts from then. Regression: on a loaded machine the start of the test
    /// binary (loading it, the harness) took most of a 20-300 ms delay, and too few rounds got
    /// to commit anything before their kill.
    pub fn wait_until_running(&self) {
        self.wait_for("running ");
    }

    /// Every complete line the child printed, once its stdout is closed (it exited or was
    /// killed).
    pub fn finish(self) -> Vec<String> {
        self.reader.join().expect("reader thread")
    }
}
