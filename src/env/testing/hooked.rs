//! [`HookedEnv`]: fault injection (errors, short writes, delays, and a general hook that can
//! also hold an operation at a chosen point).

use std::io::{self, IoSlice};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use crate::env::{EnvError, EnvFile, EnvResult, OpenMode, StorageEnv};

/// The kinds of operations a [`HookedEnv`] counts and can fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// [`StorageEnv::open`].
    Open,
    /// [`EnvFile::read_exact_at`].
    Read,
    /// [`EnvFile::write_all_at`] and [`EnvFile::write_vectored_all_at`].
    Write,
    /// [`EnvFile::sync_data`].
    SyncData,
    /// [`StorageEnv::sync_dir`].
    SyncDir,
    /// [`EnvFile::allocate`].
    Allocate,
    /// [`EnvFile::punch_hole`].
    PunchHole,
    /// [`EnvFile::set_len`].
    SetLen,
    /// [`StorageEnv::link`].
    Link,
    /// [`StorageEnv::rename`].
    Rename,
    /// [`StorageEnv::remove_file`] and [`StorageEnv::remove_dir_all`].
    Remove,
    /// [`StorageEnv::create_dir`].
    CreateDir,
    /// [`StorageEnv::list_dir`].
    ListDir,
}

impl OpKind {
    /// Every kind, in declaration order.
    pub const ALL: [OpKind; 13] = [
        OpKind::Open,
        OpKind::Read,
        OpKind::Write,
        OpKind::SyncData,
        OpKind::SyncDir,
        OpKind::Allocate,
        OpKind::PunchHole,
        OpKind::SetLen,
        OpKind::Link,
        OpKind::Rename,
        OpKind::Remove,
        OpKind::CreateDir,
        OpKind::ListDir,
    ];

    fn index(self) -> usize {
        self as usize
    }
}

/// What an injected fault does to the operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Fails with `EIO` without doing the operation.
    Eio,
    /// Fails with `ENOSPC` without doing the operation.
    Enospc,
    /// Fails with `EXDEV` without doing the operation.
    Exdev,
    /// Fails with `ECANCELED` without doing the operation.
    Ecanceled,
    /// Fails with `EOPNOTSUPP` without doing the operation.
    Eopnotsupp,
    /// Fails with `EINTR` without doing the operation (a signal arrived first): the engine
    /// retries it (`crate::env::retry`).
    Eintr,
    /// Fails with `EAGAIN` without doing the operation: the engine retries it.
    Eagain,
    /// Fails with the given `errno` without doing the operation.
    Errno(i32),
    /// For a write: writes the first half of the bytes (rounded down) to the inner file, then
    /// fails with `EIO`. For any other operation: as [`Fault::Eio`].
    ShortWrite,
    /// For a read: reads the first half of the bytes (rounded down) into the buffer and
    /// scribbles `0xA5` over the rest, then fails with `EIO` (a `pread` that returned short,
    /// then failed): the caller must not use the buffer. For any other operation: as
    /// [`Fault::Eio`].
    ShortRead,
    /// Sleeps this long, then does the operation normally.
    Delay(Duration),
}

/// An operation as the hook set by [`HookedEnv::set_hook`] sees it.
#[derive(Debug, Clone, Copy)]
pub struct OpInfo<'a> {
    /// The kind of operation.
    pub kind: OpKind,
    /// The file or directory (for [`OpKind::Link`] and [`OpKind::Rename`]: the source).
    pub path: &'a Path,
    /// The destination of a [`OpKind::Link`] or [`OpKind::Rename`]; `None` otherwise.
    pub to: Option<&'a Path>,
    /// The byte offset of a read, write, allocate or punched hole; 0 otherwise.
    pub offset: u64,
    /// The length in bytes of a read, write, allocate or punched hole, the new length of a
    /// `set_len`; 0 otherwise.
    pub len: u64,
}

/// The general hook: called on every operation not failed by an armed fault; a returned fault
/// is applied to it.
pub type Hook = Box<dyn Fn(&OpInfo<'_>) -> Option<Fault> + Send + Sync>;

/// The hook as stored (shared, so it can be called with no lock held).
type SharedHook = Arc<dyn Fn(&OpInfo<'_>) -> Option<Fault> + Send + Sync>;

/// An armed fault.
#[derive(Debug)]
struct Rule {
    kind: OpKind,
    /// Only operations whose path (or link/rename destination) contains this count.
    filter: Option<String>,
    /// Fires on the `nth` counted operation; `None`: on every one.
    nth: Option<u64>,
    seen: u64,
    fault: Fault,
}

impl Rule {
    fn matches(&self, op: &OpInfo<'_>) -> bool {
        if self.kind != op.kind {
            return false;
        }
        match &self.filter {
            None => true,
            Some(s) => contains(op.path, s) || op.to.map(|p| contains(p, s)).unwrap_or(false),
        }
    }
}

fn contains(path: &Path, s: &str) -> bool {
    path.to_string_lossy().contains(s)
}

#[derive(Debug, Default)]
struct State {
    counts: [u64; OpKind::ALL.len()],
    rules: Vec<Rule>,
}

struct Shared {
    inner: Arc<dyn StorageEnv>,
    state: Mutex<State>,
    hook: RwLock<Option<SharedHook>>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HookedEnv")
            .field("inner", &self.inner)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts `op` and returns the fault to apply to it, if any.
    fn check(&self, op: &OpInfo<'_>) -> Option<Fault> {
        let fired = {
            let mut st = self.state();
            st.counts[op.kind.index()] += 1;
            let mut fired = None;
            st.rules.retain_mut(|r| {
                if !r.matches(op) {
                    return true;
                }
                r.seen += 1;
                match r.nth {
                    None => {
                        fired.get_or_insert(r.fault);
                        true
                    }
                    Some(n) if r.seen >= n => {
                        fired.get_or_insert(r.fault);
                        false
                    }
                    Some(_) => true,
                }
            });
            fired
        };
        if fired.is_some() {
            return fired;
        }
        let hook = self.hook.read().unwrap_or_else(|e| e.into_inner()).clone();
        hook.and_then(|h| h(op))
    }
}

/// The error a fault fails an operation with (`None`: the operation proceeds, after a delay).
fn fault_error(fault: Fault, name: &'static str, path: &Path) -> Option<EnvError> {
    let code = match fault {
        Fault::Eio | Fault::ShortWrite | Fault::ShortRead => libc::EIO,
        Fault::Eintr => libc::EINTR,
        Fault::Eagain => libc::EAGAIN,
        Fault::Enospc => libc::ENOSPC,
        Fault::Exdev => libc::EXDEV,
        Fault::Ecanceled => libc::ECANCELED,
        Fault::Eopnotsupp => libc::EOPNOTSUPP,
        Fault::Errno(c) => c,
        Fault::Delay(d) => {
            std::thread::sleep(d);
            return None;
        }
    };
    Some(EnvError::new(
        name,
        path,
        io::Error::from_raw_os_error(code),
    ))
}

/// A storage environment that injects faults into the operations of an inner one.
///
/// Faults are armed per [`OpKind`]: once ([`HookedEnv::fail`], [`HookedEnv::fail_matching`]),
/// or on every matching operation ([`HookedEnv::fail_always`]); or decided per operation by a
/// hook ([`HookedEnv::set_hook`]). Every operation of a kind is counted ([`HookedEnv::count`]).
/// `exists`, `len`, `allocated_bytes` and `raw_fd` are neither counted nor faulted.
/// Cheap to clone (the clones share the faults and counts).
#[derive(Debug, Clone)]
pub struct HookedEnv {
    shared: Arc<Shared>,
}

impl HookedEnv {
    /// Wraps `inner`, with no fault armed.
    pub fn new(inner: Arc<dyn StorageEnv>) -> HookedEnv {
        HookedEnv {
            shared: Arc::new(Shared {
                inner,
                state: Mutex::new(State::default()),
                hook: RwLock::new(None),
            }),
        }
    }

    fn arm(&self, kind: OpKind, filter: Option<&str>, nth: Option<u64>, fault: Fault) {
        self.shared.state().rules.push(Rule {
            kind,
            filter: filter.map(str::to_owned),
            nth: nth.map(|n| n.max(1)),
            seen: 0,
            fault,
        });
    }

    /// Arms `fault` for the `nth` operation of `kind` from now (1-based; 0 counts as 1); it
    /// fires once. When several armed faults fire on one operation, the earliest armed
    /// applies and the others are used up.
    pub fn fail(&self, kind: OpKind, nth: u64, fault: Fault) {
        self.arm(kind, None, Some(nth), fault);
    }

    /// As [`HookedEnv::fail`], counting only operations whose path (or, for a link or rename,
    /// either path) contains `path_substring`.
    pub fn fail_matching(&self, kind: OpKind, path_substring: &str, nth: u64, fault: Fault) {
        self.arm(kind, Some(path_substring), Some(nth), fault);
    }

    /// Arms `fault` for every operation of `kind` whose path contains `path_substring` (`""`:
    /// every one), until [`HookedEnv::clear`].
    pub fn fail_always(&self, kind: OpKind, path_substring: &str, fault: Fault) {
        self.arm(kind, Some(path_substring), None, fault);
    }

    /// Sets the general hook, replacing any earlier one. It is called (with no lock held) on
    /// every counted operation that no armed fault fails, before the operation runs; the fault
    /// it returns is applied. It may block, to hold an operation at a chosen point.
    pub fn set_hook(&self, hook: Hook) {
        *self.shared.hook.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::from(hook));
    }

    /// The number of operations of `kind` seen (failed ones included) since construction or
    /// the last [`HookedEnv::clear`].
    pub fn count(&self, kind: OpKind) -> u64 {
        self.shared.state().counts[kind.index()]
    }

    /// Disarms every fault, removes the hook and zeroes the counts.
    pub fn clear(&self) {
        *self.shared.state() = State::default();
        *self.shared.hook.write().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Counts the operation and returns the error a fault injects, if any (after a delay).
    fn gate(
        &self,
        kind: OpKind,
        name: &'static str,
        path: &Path,
        to: Option<&Path>,
    ) -> EnvResult<()> {
        let op = OpInfo {
            kind,
            path,
            to,
            offset: 0,
            len: 0,
        };
        match self.shared.check(&op) {
            Some(f) => match fault_error(f, name, to.unwrap_or(path)) {
                Some(e) => Err(e),
                None => Ok(()),
            },
            None => Ok(()),
        }
    }
}

impl StorageEnv for HookedEnv {
    fn open(&self, path: &Path, mode: OpenMode) -> EnvResult<Arc<dyn EnvFile>> {
        self.gate(OpKind::Open, "open", path, None)?;
        let inner = self.shared.inner.open(path, mode)?;
        Ok(Arc::new(HookedFile {
            shared: self.shared.clone(),
            inner,
        }))
    }

    fn exists(&self, path: &Path) -> bool {
        self.shared.inner.exists(path)
    }

    fn create_dir(&self, path: &Path) -> EnvResult<()> {
        self.gate(OpKind::CreateDir, "mkdir", path, None)?;
        self.shared.inner.create_dir(path)
    }

    fn sync_dir(&self, path: &Path) -> EnvResult<()> {
        self.gate(OpKind::SyncDir, "fsync dir", path, None)?;
        self.shared.inner.sync_dir(path)
    }

    fn list_dir(&self, path: &Path) -> EnvResult<Vec<String>> {
        self.gate(OpKind::ListDir, "readdir", path, None)?;
        self.shared.inner.list_dir(path)
    }

    fn link(&self, from: &Path, to: &Path) -> EnvResult<()> {
        self.gate(OpKind::Link, "link", from, Some(to))?;
        self.shared.inner.link(from, to)
    }

    fn rename(&self, from: &Path, to: &Path) -> EnvResult<()> {
        self.gate(OpKind::Rename, "rename", from, Some(to))?;
        self.shared.inner.rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> EnvResult<()> {
        self.gate(OpKind::Remove, "unlink", path, None)?;
        self.shared.inner.remove_file(path)
    }

    fn remove_dir_all(&self, path: &Path) -> EnvResult<()> {
        self.gate(OpKind::Remove, "rmdir", path, None)?;
        self.shared.inner.remove_dir_all(path)
    }
}

/// A file opened through a [`HookedEnv`].
#[derive(Debug)]
pub struct HookedFile {
    shared: Arc<Shared>,
    inner: Arc<dyn EnvFile>,
}

impl HookedFile {
    /// Counts the operation; `Ok(None)`: run it; `Ok(Some(fault))`: a [`Fault::ShortWrite`] or
    /// [`Fault::ShortRead`] to apply; `Err`: the injected error.
    fn gate(
        &self,
        kind: OpKind,
        name: &'static str,
        offset: u64,
        len: u64,
    ) -> EnvResult<Option<Fault>> {
        let path = self.inner.path();
        let op = OpInfo {
            kind,
            path,
            to: None,
            offset,
            len,
        };
        match self.shared.check(&op) {
            Some(Fault::ShortWrite) if kind == OpKind::Write => Ok(Some(Fault::ShortWrite)),
            Some(Fault::ShortRead) if kind == OpKind::Read => Ok(Some(Fault::ShortRead)),
            Some(f) => match fault_error(f, name, path) {
                Some(e) => Err(e),
                None => Ok(None),
            },
            None => Ok(None),
        }
    }

    /// The `EIO` a short write or read ends with.
    fn short_write_error(&self, name: &'static str) -> EnvError {
        EnvError::new(
            name,
            self.inner.path(),
            io::Error::from_raw_os_error(libc::EIO),
        )
    }
}

impl EnvFile for HookedFile {
    fn path(&self) -> &Path {
        self.inner.path()
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> EnvResult<()> {
        if self
            .gate(OpKind::Read, "pread", offset, buf.len() as u64)?
            .is_some()
        {
            let half = buf.len() / 2;
            if half > 0 {
                self.inner.read_exact_at(&mut buf[..half], offset)?;
            }
            buf[half..].fill(0xA5);
            return Err(self.short_write_error("pread"));
        }
        self.inner.read_exact_at(buf, offset)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> EnvResult<()> {
        if self
            .gate(OpKind::Write, "pwrite", offset, buf.len() as u64)?
            .is_some()
        {
            let half = buf.len() / 2;
            if half > 0 {
                self.inner.write_all_at(&buf[..half], offset)?;
            }
            return Err(self.short_write_error("pwrite"));
        }
        self.inner.write_all_at(buf, offset)
    }

    fn write_vectored_all_at(&self, bufs: &[IoSlice<'_>], offset: u64) -> EnvResult<()> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if self
            .gate(OpKind::Write, "pwritev", offset, total as u64)?
            .is_some()
        {
            let mut left = total / 2;
            let mut half: Vec<IoSlice<'_>> = Vec::new();
            for b in bufs {
                if left == 0 {
                    break;
                }
                let n = b.len().min(left);
                half.push(IoSlice::new(&b[..n]));
                left -= n;
            }
            if !half.is_empty() {
                self.inner.write_vectored_all_at(&half, offset)?;
            }
            return Err(self.short_write_error("pwritev"));
        }
        self.inner.write_vectored_all_at(bufs, offset)
    }

    fn sync_data(&self) -> EnvResult<()> {
        self.gate(OpKind::SyncData, "fdatasync", 0, 0)?;
        self.inner.sync_data()
    }

    fn allocate(&self, offset: u64, len: u64) -> EnvResult<()> {
        self.gate(OpKind::Allocate, "fallocate", offset, len)?;
        self.inner.allocate(offset, len)
    }

    fn punch_hole(&self, offset: u64, len: u64) -> EnvResult<()> {
        self.gate(OpKind::PunchHole, "fallocate(PUNCH_HOLE)", offset, len)?;
        self.inner.punch_hole(offset, len)
    }

    fn set_len(&self, len: u64) -> EnvResult<()> {
        self.gate(OpKind::SetLen, "ftruncate", 0, len)?;
        self.inner.set_len(len)
    }

    fn len(&self) -> EnvResult<u64> {
        self.inner.len()
    }

    fn allocated_bytes(&self) -> EnvResult<u64> {
        self.inner.allocated_bytes()
    }

    fn raw_fd(&self) -> std::os::fd::RawFd {
        self.inner.raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::DefaultEnv;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Instant;

    fn setup() -> (tempfile::TempDir, HookedEnv) {
        let dir = tempfile::tempdir().unwrap();
        (dir, HookedEnv::new(Arc::new(DefaultEnv::new())))
    }

    fn errno_of<T>(r: EnvResult<T>) -> Option<i32> {
        r.err().and_then(|e| e.raw_os_error())
    }

    #[test]
    fn each_fault_gives_its_errno() {
        let (d, env) = setup();
        let p = d.path().join("f");
        let f = env.open(&p, OpenMode::Create).unwrap();
        let cases = [
            (Fault::Eio, libc::EIO),
            (Fault::Enospc, libc::ENOSPC),
            (Fault::Exdev, libc::EXDEV),
            (Fault::Ecanceled, libc::ECANCELED),
            (Fault::Eopnotsupp, libc::EOPNOTSUPP),
            (Fault::Errno(libc::EROFS), libc::EROFS),
            (Fault::Eintr, libc::EINTR),
            (Fault::Eagain, libc::EAGAIN),
        ];
        for (fault, code) in cases {
            env.fail(OpKind::Write, 1, fault);
            assert_eq!(errno_of(f.write_all_at(b"x", 0)), Some(code));
            env.fail(OpKind::SyncData, 1, fault);
            assert_eq!(errno_of(f.sync_data()), Some(code));
            env.fail(OpKind::Link, 1, fault);
            assert_eq!(errno_of(env.link(&p, &d.path().join("g"))), Some(code));
            env.fail(OpKind::Open, 1, fault);
            assert_eq!(errno_of(env.open(&p, OpenMode::Existing)), Some(code));
        }
        // Nothing was written, linked or failed since.
        assert_eq!(f.len().unwrap(), 0);
        assert!(!d.path().join("g").exists());
        f.write_all_at(b"ok", 0).unwrap();
        f.sync_data().unwrap();
        // Every kind can fail.
        env.fail(OpKind::Read, 1, Fault::Eio);
        assert_eq!(errno_of(f.read_exact_at(&mut [0u8; 2], 0)), Some(libc::EIO));
        env.fail(OpKind::Allocate, 1, Fault::Enospc);
        assert_eq!(errno_of(f.allocate(0, 4096)), Some(libc::ENOSPC));
        env.fail(OpKind::PunchHole, 1, Fault::Eopnotsupp);
        assert_eq!(errno_of(f.punch_hole(0, 1)), Some(libc::EOPNOTSUPP));
        env.fail(OpKind::SetLen, 1, Fault::Eio);
        assert_eq!(errno_of(f.set_len(0)), Some(libc::EIO));
        env.fail(OpKind::SyncDir, 1, Fault::Eio);
        assert_eq!(errno_of(env.sync_dir(d.path())), Some(libc::EIO));
        env.fail(OpKind::Rename, 1, Fault::Exdev);
        assert_eq!(
            errno_of(env.rename(&p, &d.path().join("h"))),
            Some(libc::EXDEV)
        );
        env.fail(OpKind::Remove, 1, Fault::Eio);
        assert_eq!(errno_of(env.remove_file(&p)), Some(libc::EIO));
        env.fail(OpKind::CreateDir, 1, Fault::Enospc);
        assert_eq!(
            errno_of(env.create_dir(&d.path().join("sub"))),
            Some(libc::ENOSPC)
        );
        env.fail(OpKind::ListDir, 1, Fault::Eio);
        assert_eq!(errno_of(env.list_dir(d.path())), Some(libc::EIO));
        assert_eq!(f.len().unwrap(), 2);
        assert!(p.exists());
    }

    #[test]
    fn short_write_writes_half_then_fails() {
        let (d, env) = setup();
        let f = env.open(&d.path().join("f"), OpenMode::Create).unwrap();
        env.fail(OpKind::Write, 1, Fault::ShortWrite);
        assert_eq!(errno_of(f.write_all_at(&[7u8; 10], 0)), Some(libc::EIO));
        assert_eq!(f.len().unwrap(), 5);
        env.fail(OpKind::Write, 1, Fault::ShortWrite);
        let (a, b) = ([1u8; 3], [2u8; 5]);
        assert_eq!(
            errno_of(f.write_vectored_all_at(&[IoSlice::new(&a), IoSlice::new(&b)], 100)),
            Some(libc::EIO)
        );
        assert_eq!(f.len().unwrap(), 104);
        let mut got = [0u8; 4];
        f.read_exact_at(&mut got, 100).unwrap();
        assert_eq!(got, [1, 1, 1, 2]);
        // On other kinds a short write is EIO.
        env.fail(OpKind::SyncData, 1, Fault::ShortWrite);
        assert_eq!(errno_of(f.sync_data()), Some(libc::EIO));
        // A short read fills half the buffer, scribbles over the rest and fails.
        env.fail(OpKind::Read, 1, Fault::ShortRead);
        let mut got = [0u8; 4];
        assert_eq!(errno_of(f.read_exact_at(&mut got, 100)), Some(libc::EIO));
        assert_eq!(got, [1, 1, 0xA5, 0xA5]);
    }

    #[test]
    fn nth_counts_from_arming() {
        let (d, env) = setup();
        let f = env.open(&d.path().join("f"), OpenMode::Create).unwrap();
        f.write_all_at(b"a", 0).unwrap();
        env.fail(OpKind::Write, 3, Fault::Eio);
        f.write_all_at(b"a", 0).unwrap();
        f.sync_data().unwrap(); // another kind: not counted
        f.write_all_at(b"a", 0).unwrap();
        assert_eq!(errno_of(f.write_all_at(b"a", 0)), Some(libc::EIO));
        f.write_all_at(b"a", 0).unwrap(); // fired once only
        assert_eq!(env.count(OpKind::Write), 5);
        assert_eq!(env.count(OpKind::SyncData), 1);
        assert_eq!(env.count(OpKind::Open), 1);
        env.clear();
        assert_eq!(env.count(OpKind::Write), 0);
    }

    #[test]
    fn path_filter_and_fail_always() {
        let (d, env) = setup();
        let a = env
            .open(&d.path().join("journal-1"), OpenMode::Create)
            .unwrap();
        let b = env.open(&d.path().join("pages"), OpenMode::Create).unwrap();
        env.fail_matching(OpKind::SyncData, "journal", 2, Fault::Eio);
        b.sync_data().unwrap();
        a.sync_data().unwrap();
        b.sync_data().unwrap();
        assert_eq!(errno_of(a.sync_data()), Some(libc::EIO));
        a.sync_data().unwrap();

        env.fail_always(OpKind::Write, "pages", Fault::Enospc);
        for _ in 0..3 {
            assert_eq!(errno_of(b.write_all_at(b"x", 0)), Some(libc::ENOSPC));
            a.write_all_at(b"x", 0).unwrap();
        }
        // A rename matches on either path.
        env.fail_always(OpKind::Rename, "pages", Fault::Exdev);
        assert_eq!(
            errno_of(env.rename(&d.path().join("journal-1"), &d.path().join("pages"))),
            Some(libc::EXDEV)
        );
        env.clear();
        b.write_all_at(b"x", 0).unwrap();
    }

    #[test]
    fn delay_delays_then_runs() {
        let (d, env) = setup();
        let f = env.open(&d.path().join("f"), OpenMode::Create).unwrap();
        let delay = Duration::from_millis(30);
        env.fail(OpKind::Write, 1, Fault::Delay(delay));
        let t = Instant::now();
        f.write_all_at(b"late", 0).unwrap();
        assert!(t.elapsed() >= delay);
        assert_eq!(f.len().unwrap(), 4);
    }

    #[test]
    fn hook_sees_operations_and_can_fail_them() {
        let (d, env) = setup();
        let f = env.open(&d.path().join("f"), OpenMode::Create).unwrap();
        let seen = Arc::new(AtomicU64::new(0));
        let seen2 = seen.clone();
        env.set_hook(Box::new(move |op: &OpInfo<'_>| {
            if op.kind == OpKind::Write {
                seen2.fetch_add(op.len, Ordering::Relaxed);
                if op.offset >= 4096 {
                    return Some(Fault::Enospc);
                }
            }
            None
        }));
        f.write_all_at(&[0u8; 10], 0).unwrap();
        assert_eq!(
            errno_of(f.write_all_at(&[0u8; 5], 4096)),
            Some(libc::ENOSPC)
        );
        assert_eq!(seen.load(Ordering::Relaxed), 15);
        // An armed fault takes precedence over the hook, which then is not called.
        env.fail(OpKind::Write, 1, Fault::Eio);
        assert_eq!(errno_of(f.write_all_at(&[0u8; 1], 0)), Some(libc::EIO));
        assert_eq!(seen.load(Ordering::Relaxed), 15);
        env.clear();
        f.write_all_at(&[0u8; 5], 4096).unwrap();
        assert_eq!(seen.load(Ordering::Relaxed), 15);
    }
}
