//! [`RecordingEnv`]: the ordered list of the durable-relevant operations an inner env performed.

use std::io::IoSlice;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::env::{EnvFile, EnvResult, OpenMode, StorageEnv};

/// One durable-relevant operation, as recorded by a [`RecordingEnv`]. Paths are as the caller
/// passed them (for a file: the path it was opened with); offsets and lengths are in bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DurableOp {
    /// `sync_data` of the file opened with this path.
    SyncData(PathBuf),
    /// `sync_dir` of this directory.
    SyncDir(PathBuf),
    /// An `open` that created this file (`CreateNew`, or `Create` when `exists` was false just
    /// before: two threads racing to create one file may both record it).
    Create(PathBuf),
    /// A hard link `to` naming the file `from` names.
    Link {
        /// The existing name.
        from: PathBuf,
        /// The new name.
        to: PathBuf,
    },
    /// A rename of `from` to `to`.
    Rename {
        /// The old name.
        from: PathBuf,
        /// The new name.
        to: PathBuf,
    },
    /// `remove_file` of this path.
    Remove(PathBuf),
    /// `remove_dir_all` of this directory.
    RemoveDirAll(PathBuf),
    /// `create_dir` of this directory (recorded even when it already existed).
    CreateDir(PathBuf),
    /// `punch_hole(offset, len)` on the file.
    PunchHole {
        /// The file.
        path: PathBuf,
        /// Start of the range, in bytes.
        offset: u64,
        /// Length of the range, in bytes.
        len: u64,
    },
    /// `set_len(len)` on the file.
    SetLen {
        /// The file.
        path: PathBuf,
        /// The new length, in bytes.
        len: u64,
    },
    /// `allocate(offset, len)` on the file.
    Allocate {
        /// The file.
        path: PathBuf,
        /// Start of the range, in bytes.
        offset: u64,
        /// Length of the range, in bytes.
        len: u64,
    },
}

#[derive(Debug)]
struct Shared {
    inner: Arc<dyn StorageEnv>,
    ops: Mutex<Vec<DurableOp>>,
}

impl Shared {
    fn ops(&self) -> MutexGuard<'_, Vec<DurableOp>> {
        self.ops.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records `op` when `r` is `Ok`, and passes `r` on.
    fn record<T>(&self, r: EnvResult<T>, op: impl FnOnce() -> DurableOp) -> EnvResult<T> {
        if r.is_ok() {
            self.ops().push(op());
        }
        r
    }
}

/// A storage environment that records, in order, the durable-relevant operations (see
/// [`DurableOp`]) that succeeded through it; failed operations are not recorded. Operations
/// are recorded as they complete, so operations ordered by the caller (one thread, or threads
/// that synchronize) are recorded in that order. Writes and reads are not recorded.
/// Cheap to clone (the clones share the record).
#[derive(Debug, Clone)]
pub struct RecordingEnv {
    shared: Arc<Shared>,
}

impl RecordingEnv {
    /// Wraps `inner`, with an empty record.
    pub fn new(inner: Arc<dyn StorageEnv>) -> RecordingEnv {
        RecordingEnv {
            shared: Arc::new(Shared {
                inner,
                ops: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The operations recorded so far, oldest first.
    pub fn ops(&self) -> Vec<DurableOp> {
        self.shared.ops().clone()
    }

    /// Forgets the operations recorded so far.
    pub fn clear(&self) {
        self.shared.ops().clear();
    }
}

impl StorageEnv for RecordingEnv {
    fn open(&self, path: &Path, mode: OpenMode) -> EnvResult<Arc<dyn EnvFile>> {
        let sh = &self.shared;
        let creates = match mode {
            OpenMode::Existing | OpenMode::ReadOnly => false,
            OpenMode::Create => !sh.inner.exists(path),
            OpenMode::CreateNew => true,
        };
        let inner = sh.inner.open(path, mode)?;
        if creates {
            sh.ops().push(DurableOp::Create(path.to_path_buf()));
        }
        Ok(Arc::new(RecordingFile {
            shared: sh.clone(),
            inner,
        }))
    }

    fn exists(&self, path: &Path) -> bool {
        self.shared.inner.exists(path)
    }

    fn create_dir(&self, path: &Path) -> EnvResult<()> {
        let r = self.shared.inner.create_dir(path);
        self.shared
            .record(r, || DurableOp::CreateDir(path.to_path_buf()))
    }

    fn sync_dir(&self, path: &Path) -> EnvResult<()> {
        let r = self.shared.inner.sync_dir(path);
        self.shared
            .record(r, || DurableOp::SyncDir(path.to_path_buf()))
    }

    fn list_dir(&self, path: &Path) -> EnvResult<Vec<String>> {
        self.shared.inner.list_dir(path)
    }

    fn link(&self, from: &Path, to: &Path) -> EnvResult<()> {
        let r = self.shared.inner.link(from, to);
        self.shared.record(r, || DurableOp::Link {
            from: from.to_path_buf(),
            to: to.to_path_buf(),
        })
    }

    fn rename(&self, from: &Path, to: &Path) -> EnvResult<()> {
        let r = self.shared.inner.rename(from, to);
        self.shared.record(r, || DurableOp::Rename {
            from: from.to_path_buf(),
            to: to.to_path_buf(),
        })
    }

    fn remove_file(&self, path: &Path) -> EnvResult<()> {
        let r = self.shared.inner.remove_file(path);
        self.shared
            .record(r, || DurableOp::Remove(path.to_path_buf()))
    }

    fn remove_dir_all(&self, path: &Path) -> EnvResult<()> {
        let r = self.shared.inner.remove_dir_all(path);
        self.shared
            .record(r, || DurableOp::RemoveDirAll(path.to_path_buf()))
    }
}

/// A file opened through a [`RecordingEnv`].
#[derive(Debug)]
pub struct RecordingFile {
    shared: Arc<Shared>,
    inner: Arc<dyn EnvFile>,
}

impl RecordingFile {
    fn path_buf(&self) -> PathBuf {
        self.inner.path().to_path_buf()
    }
}

impl EnvFile for RecordingFile {
    fn path(&self) -> &Path {
        self.inner.path()
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> EnvResult<()> {
        self.inner.read_exact_at(buf, offset)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> EnvResult<()> {
        self.inner.write_all_at(buf, offset)
    }

    fn write_vectored_all_at(&self, bufs: &[IoSlice<'_>], offset: u64) -> EnvResult<()> {
        self.inner.write_vectored_all_at(bufs, offset)
    }

    fn sync_data(&self) -> EnvResult<()> {
        let r = self.inner.sync_data();
        self.shared
            .record(r, || DurableOp::SyncData(self.path_buf()))
    }

    fn allocate(&self, offset: u64, len: u64) -> EnvResult<()> {
        let r = self.inner.allocate(offset, len);
        self.shared.record(r, || DurableOp::Allocate {
            path: self.path_buf(),
            offset,
            len,
        })
    }

    fn punch_hole(&self, offset: u64, len: u64) -> EnvResult<()> {
        let r = self.inner.punch_hole(offset, len);
        self.shared.record(r, || DurableOp::PunchHole {
            path: self.path_buf(),
            offset,
            len,
        })
    }

    fn set_len(&self, len: u64) -> EnvResult<()> {
        let r = self.inner.set_len(len);
        self.shared.record(r, || DurableOp::SetLen {
            path: self.path_buf(),
            len,
        })
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

    #[test]
    fn records_durable_operations_in_order() {
        let d = tempfile::tempdir().unwrap();
        let env = RecordingEnv::new(Arc::new(DefaultEnv::new()));
        let p = |s: &str| d.path().join(s);
        env.create_dir(&p("s")).unwrap();
        let f = env.open(&p("s/f"), OpenMode::Create).unwrap();
        f.write_all_at(b"abc", 0).unwrap();
        f.allocate(0, 8192).unwrap();
        f.set_len(4096).unwrap();
        let _ = f.punch_hole(0, 4096); // EOPNOTSUPP on some file systems: then not recorded
        f.sync_data().unwrap();
        drop(env.open(&p("s/f"), OpenMode::Create).unwrap()); // exists: no Create
        env.link(&p("s/f"), &p("g")).unwrap();
        env.rename(&p("g"), &p("h")).unwrap();
        env.remove_file(&p("h")).unwrap();
        assert!(env.remove_file(&p("h")).is_err()); // failed: not recorded
        env.sync_dir(d.path()).unwrap();
        env.remove_dir_all(&p("s")).unwrap();
        let mut want = vec![
            DurableOp::CreateDir(p("s")),
            DurableOp::Create(p("s/f")),
            DurableOp::Allocate {
                path: p("s/f"),
                offset: 0,
                len: 8192,
            },
            DurableOp::SetLen {
                path: p("s/f"),
                len: 4096,
            },
            DurableOp::PunchHole {
                path: p("s/f"),
                offset: 0,
                len: 4096,
            },
            DurableOp::SyncData(p("s/f")),
            DurableOp::Link {
                from: p("s/f"),
                to: p("g"),
            },
            DurableOp::Rename {
                from: p("g"),
                to: p("h"),
            },
            DurableOp::Remove(p("h")),
            DurableOp::SyncDir(d.path().to_path_buf()),
            DurableOp::RemoveDirAll(p("s")),
        ];
        let got = env.ops();
        if !got.iter().any(|o| matches!(o, DurableOp::PunchHole { .. })) {
            want.retain(|o| !matches!(o, DurableOp::PunchHole { .. }));
        }
        assert_eq!(got, want);
        env.clear();
        assert!(env.ops().is_empty());
        drop(env.open(&p("n"), OpenMode::CreateNew).unwrap());
        assert_eq!(env.ops(), vec![DurableOp::Create(p("n"))]);
    }
}
