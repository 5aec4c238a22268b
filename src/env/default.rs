//! The real file system: `pread`, `pwrite`, `pwritev`, `fdatasync`, `fallocate`, `link`,
//! directory `fsync`, through `std` and `rustix`.
//!
//! Every call that may wait for the disk first checks that it is not made on an executor
//! thread ([`super::executor_guard`]: counted, and a panic in debug builds); `fstat` of an open
//! file is not checked (no disk wait).

use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::FallocateFlags;

use super::executor_guard::check_blocking;
use super::{EnvError, EnvFile, EnvResult, OpenMode, StorageEnv};

/// The default storage environment: real files, real `fdatasync`.
#[derive(Debug, Default, Clone)]
pub struct DefaultEnv {
    _private: (),
}

impl DefaultEnv {
    /// A new default environment (stateless).
    pub fn new() -> DefaultEnv {
        DefaultEnv { _private: () }
    }
}

/// A real file opened read-write.
#[derive(Debug)]
pub struct DefaultFile {
    file: File,
    path: PathBuf,
}

impl DefaultFile {
    fn err(&self, op: &'static str, e: io::Error) -> EnvError {
        EnvError::new(op, &self.path, e)
    }

    /// Checks that `op`, about to wait for the disk, is not made on an executor thread.
    fn blocking(&self, op: &'static str) {
        check_blocking(op, &self.path);
    }
}

/// `IOV_MAX` on Linux.
pub(crate) const IOV_MAX: usize = 1024;

fn errno(e: rustix::io::Errno) -> io::Error {
    io::Error::from_raw_os_error(e.raw_os_error())
}

impl EnvFile for DefaultFile {
    fn path(&self) -> &Path {
        &self.path
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> EnvResult<()> {
        self.blocking("pread");
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| self.err("pread", e))
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> EnvResult<()> {
        self.blocking("pwrite");
        self.file
            .write_all_at(buf, offset)
            .map_err(|e| self.err("pwrite", e))
    }

    fn write_vectored_all_at(&self, bufs: &[IoSlice<'_>], mut offset: u64) -> EnvResult<()> {
        self.blocking("pwritev");
        assert!(bufs.len() <= IOV_MAX, "more than IOV_MAX slices");
        // Skip whole slices already written, and the written prefix of the first partial one.
        let mut idx = 0;
        let mut skip = 0usize;
        while idx < bufs.len() {
            let mut rest: Vec<IoSlice<'_>> = Vec::with_capacity(bufs.len() - idx);
            rest.push(IoSlice::new(&bufs[idx][skip..]));
            rest.extend(bufs[idx + 1..].iter().map(|b| IoSlice::new(b)));
            let n = match rustix::io::pwritev(&self.file, &rest, offset) {
                Ok(0) => {
                    return Err(self.err(
                        "pwritev",
                        io::Error::new(io::ErrorKind::WriteZero, "pwritev wrote 0 bytes"),
                    ))
                }
                Ok(n) => n,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(self.err("pwritev", errno(e))),
            };
            offset += n as u64;
            let mut n = n;
            while idx < bufs.len() && n >= bufs[idx].len() - skip {
                n -= bufs[idx].len() - skip;
                idx += 1;
                skip = 0;
            }
            skip += n;
        }
        Ok(())
    }

    fn sync_data(&self) -> EnvResult<()> {
        self.blocking("fdatasync");
        self.file.sync_data().map_err(|e| self.err("fdatasync", e))
    }

    fn write_back(&self, offset: u64, len: u64, wait: bool) -> EnvResult<()> {
        let flags = super::write_back_flags(wait);
        // SAFETY: sync_file_range on our own descriptor touches no memory of ours.
        let r = unsafe {
            libc::sync_file_range(
                self.file.as_raw_fd(),
                offset as libc::off64_t,
                len as libc::off64_t,
                flags,
            )
        };
        if r < 0 {
            return Err(self.err("sync_file_range", io::Error::last_os_error()));
        }
        Ok(())
    }

    fn write_runs(&self, runs: &[super::Run<'_>], mode: super::WriteMode) -> EnvResult<()> {
        if mode != super::WriteMode::Mmap {
            return super::write_runs_with_writes(self, runs, mode);
        }
        let run_len = |bufs: &[IoSlice<'_>]| bufs.iter().map(|b| b.len() as u64).sum::<u64>();
        let Some(lo) = runs.iter().map(|r| r.0).min() else {
            return Ok(());
        };
        let hi = runs.iter().map(|(o, b)| o + run_len(b)).max().unwrap_or(lo);
        // Re-allocate every run's range first: a punched (or never allocated) page written
        // through a map on a full disk is a SIGBUS; fallocate turns it into ENOSPC here. It
        // also extends the file to cover the runs, so the map never reaches past its end.
        for (o, b) in runs {
            match self.allocate(*o, run_len(b)) {
                // No fallocate here (FUSE, some network file systems): pwritev allocates the
                // blocks itself and reports a full disk as ENOSPC.
                Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                    return super::write_runs_with_writes(
                        self,
                        runs,
                        super::WriteMode::VectoredFileIo,
                    );
                }
                r => r?,
            }
        }
        let map_off = lo & !4095;
        // SAFETY: a shared writable map of our own file's range [map_off, hi), which the
        // allocations above made part of the file; no one truncates a data file while a flush
        // writes it (the storage owns it under its LOCK), and the map lives only in this call.
        let mut map = unsafe {
            memmap2::MmapOptions::new()
                .offset(map_off)
                .len((hi - map_off) as usize)
                .map_mut(&self.file)
        }
        .map_err(|e| self.err("mmap", e))?;
        for (o, bufs) in runs {
            let mut at = (o - map_off) as usize;
            for b in bufs.iter() {
                map[at..at + b.len()].copy_from_slice(b);
                at += b.len();
            }
        }
        // The dirty map pages are file pages: the caller's fdatasync writes them.
        drop(map);
        Ok(())
    }

    fn allocate(&self, offset: u64, len: u64) -> EnvResult<()> {
        self.blocking("fallocate");
        rustix::fs::fallocate(&self.file, FallocateFlags::empty(), offset, len)
            .map_err(|e| self.err("fallocate", errno(e)))
    }

    fn punch_hole(&self, offset: u64, len: u64) -> EnvResult<()> {
        self.blocking("fallocate(PUNCH_HOLE)");
        rustix::fs::fallocate(
            &self.file,
            FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
            offset,
            len,
        )
        .map_err(|e| self.err("fallocate(PUNCH_HOLE)", errno(e)))
    }

    fn set_len(&self, len: u64) -> EnvResult<()> {
        self.blocking("ftruncate");
        self.file.set_len(len).map_err(|e| self.err("ftruncate", e))
    }

    fn len(&self) -> EnvResult<u64> {
        self.file
            .metadata()
            .map(|m| m.len())
            .map_err(|e| self.err("fstat", e))
    }

    fn allocated_bytes(&self) -> EnvResult<u64> {
        use std::os::unix::fs::MetadataExt;
        self.file
            .metadata()
            .map(|m| m.blocks() * 512)
            .map_err(|e| self.err("fstat", e))
    }

    fn raw_fd(&self) -> std::os::fd::RawFd {
        self.file.as_raw_fd()
    }

    fn write_zeros_uncached(&self, offset: u64, len: u64) -> EnvResult<()> {
        self.blocking("pwrite (O_DIRECT zeros)");
        let block = DIRECT_ZEROS.0.len() as u64;
        // O_DIRECT needs block-aligned offsets and lengths; the pool's files are whole MiBs.
        let direct = offset.is_multiple_of(4096) && len.is_multiple_of(4096);
        let f = direct
            .then(|| {
                OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(&self.path)
                    .ok()
            })
            .flatten();
        let Some(f) = f else {
            // No O_DIRECT here (tmpfs before Linux 6.6, some FUSE and network file systems).
            return super::write_zeros(self, offset, len);
        };
        let end = offset + len;
        let mut at = offset;
        // Bounded: advances by up to 1 MiB a turn until `end`.
        while at < end {
            let n = (end - at).min(block) as usize;
            match f.write_all_at(&DIRECT_ZEROS.0[..n], at) {
                Ok(()) => at += n as u64,
                // Refused for this buffer or file system after all: the rest the plain way.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    return super::write_zeros(self, at, end - at);
                }
                Err(e) => return Err(self.err("pwrite (O_DIRECT zeros)", e)),
            }
        }
        Ok(())
    }
}

/// A 4 KiB-aligned zero buffer for `O_DIRECT` writes (in `.bss`: it costs no file size).
#[repr(align(4096))]
struct AlignedZeros([u8; 1 << 20]);

static DIRECT_ZEROS: AlignedZeros = AlignedZeros([0u8; 1 << 20]);

impl StorageEnv for DefaultEnv {
    fn open(&self, path: &Path, mode: OpenMode) -> EnvResult<Arc<dyn EnvFile>> {
        check_blocking("open", path);
        let mut o = OpenOptions::new();
        o.read(true).write(mode != OpenMode::ReadOnly);
        match mode {
            OpenMode::Existing | OpenMode::ReadOnly => {}
            OpenMode::Create => {
                o.create(true);
            }
            OpenMode::CreateNew => {
                o.create_new(true);
            }
        }
        let file = o.open(path).map_err(|e| EnvError::new("open", path, e))?;
        Ok(Arc::new(DefaultFile {
            file,
            path: path.to_path_buf(),
        }))
    }

    fn exists(&self, path: &Path) -> bool {
        check_blocking("stat", path);
        path.exists()
    }

    fn create_dir(&self, path: &Path) -> EnvResult<()> {
        check_blocking("mkdir", path);
        match std::fs::create_dir(path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => Ok(()),
            Err(e) => Err(EnvError::new("mkdir", path, e)),
        }
    }

    fn sync_dir(&self, path: &Path) -> EnvResult<()> {
        check_blocking("fsync dir", path);
        let dir = File::open(path).map_err(|e| EnvError::new("open dir", path, e))?;
        dir.sync_all()
            .map_err(|e| EnvError::new("fsync dir", path, e))
    }

    fn list_dir(&self, path: &Path) -> EnvResult<Vec<String>> {
        check_blocking("readdir", path);
        let rd = std::fs::read_dir(path).map_err(|e| EnvError::new("readdir", path, e))?;
        let mut out = Vec::new();
        for entry in rd {
            let entry = entry.map_err(|e| EnvError::new("readdir", path, e))?;
            out.push(entry.file_name().to_string_lossy().into_owned());
        }
        Ok(out)
    }

    fn link(&self, from: &Path, to: &Path) -> EnvResult<()> {
        check_blocking("link", to);
        std::fs::hard_link(from, to).map_err(|e| EnvError::new("link", to, e))
    }

    fn rename(&self, from: &Path, to: &Path) -> EnvResult<()> {
        check_blocking("rename", to);
        std::fs::rename(from, to).map_err(|e| EnvError::new("rename", to, e))
    }

    fn remove_file(&self, path: &Path) -> EnvResult<()> {
        check_blocking("unlink", path);
        std::fs::remove_file(path).map_err(|e| EnvError::new("unlink", path, e))
    }

    fn remove_dir_all(&self, path: &Path) -> EnvResult<()> {
        check_blocking("rmdir", path);
        std::fs::remove_dir_all(path).map_err(|e| EnvError::new("rmdir", path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectored_write_lands_back_to_back() {
        let dir = tempfile::tempdir().unwrap();
        let env = DefaultEnv::new();
        let f = env.open(&dir.path().join("f"), OpenMode::Create).unwrap();
        let a = vec![1u8; 5000];
        let b = vec![2u8; 3000];
        f.write_vectored_all_at(&[IoSlice::new(&a), IoSlice::new(&b)], 100)
            .unwrap();
        let mut got = vec![0u8; 8000];
        f.read_exact_at(&mut got, 100).unwrap();
        assert_eq!(&got[..5000], &a[..]);
        assert_eq!(&got[5000..], &b[..]);
        assert_eq!(f.len().unwrap(), 8100);
    }

    #[test]
    fn punch_hole_frees_blocks_and_keeps_length() {
        let dir = tempfile::tempdir().unwrap();
        let env = DefaultEnv::new();
        let f = env.open(&dir.path().join("f"), OpenMode::Create).unwrap();
        f.write_all_at(&vec![7u8; 4 << 20], 0).unwrap();
        f.sync_data().unwrap();
        let before = f.allocated_bytes().unwrap();
        match f.punch_hole(1 << 20, 2 << 20) {
            Ok(()) => {
                let after = f.allocated_bytes().unwrap();
                assert!(after + (2 << 20) <= before + 4096, "{before} -> {after}");
                assert_eq!(f.len().unwrap(), 4 << 20);
                let mut b = [1u8; 16];
                f.read_exact_at(&mut b, 1 << 20).unwrap();
                assert_eq!(b, [0u8; 16]);
            }
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP)),
        }
    }

    #[test]
    fn zeros_written_past_the_cache_read_back_as_zeros() {
        // In the crate's directory (a disk, where O_DIRECT works) and in the system temp
        // directory (tmpfs on some machines: O_DIRECT refused before Linux 6.6, then the plain
        // way); an unaligned range always goes the plain way.
        let here = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        for dir in [here.path(), tmp.path()] {
            let env = DefaultEnv::new();
            let f = env.open(&dir.join("z"), OpenMode::CreateNew).unwrap();
            for (off, len) in [(0u64, (3 << 20) + 8192), (5 << 20, 1000)] {
                f.write_zeros_uncached(off, len).unwrap();
                f.sync_data().unwrap();
                let mut b = vec![1u8; len as usize];
                f.read_exact_at(&mut b, off).unwrap();
                assert!(
                    b.iter().all(|&x| x == 0),
                    "{off}+{len} in {}",
                    dir.display()
                );
            }
            assert_eq!(f.len().unwrap(), (5 << 20) + 1000);
        }
    }
}
