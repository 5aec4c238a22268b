//! Storage environments for tests (cargo feature `testing`, off by default: the integration
//! tests in `tests/` turn it on through omnibus's dev-dependency on itself). Each wraps an inner [`StorageEnv`](crate::env::StorageEnv)
//! (normally [`DefaultEnv`](crate::env::DefaultEnv)) and returns its own file type wrapping the
//! inner `Arc<dyn EnvFile>`, so they compose, e.g.
//! `RecordingEnv::new(Arc::new(HookedEnv::new(Arc::new(PowerLossEnv::new(default_env(), root)))))`.
//! All are `Send + Sync` and cheap to clone (clones share state).
//!
//! - [`PowerLossEnv`]: simulates power loss under a root directory. Every inode has a live
//!   state (the real file, which reads and read-only maps see) and a durable state (an
//!   in-memory image). Writes, `set_len`, `allocate` and `punch_hole` are pending until a
//!   `sync_data` of the inode; creates, links, unlinks, renames and new directories are pending
//!   in their directory until its `sync_dir`. [`PowerLossEnv::crash`] (or a crash armed with
//!   [`PowerLossEnv::crash_after`] to fire after the n-th `sync_data`/`sync_dir`) rewrites the
//!   root with what a power loss may leave, chosen by a [`CrashMode`] (drop all unsynced
//!   changes, keep a prefix or a subset of them, or tear them at 4 KiB sectors), a seed, and
//!   whether unsynced directory entries are lost; the env is then dead (`EIO` everywhere).
//!   `sync_data`/`sync_dir` are simulated only, unless [`PowerLossEnv::with_real_sync`].
//!   Without crashing, [`PowerLossEnv::snapshot`] (or a [`DurableObserver`], at each durable
//!   operation) copies the model into a [`CrashSnapshot`], from which the [`CrashState`] of
//!   any crash at that moment is written out later: one run yields every crash point.
//! - [`HookedEnv`]: fault injection. Arms a [`Fault`] (`EIO`, `ENOSPC`, `EXDEV`, `ECANCELED`,
//!   `EOPNOTSUPP`, `EINTR`, `EAGAIN`, any errno, a short write or read, a delay) for the n-th operation of an [`OpKind`],
//!   optionally only on paths containing a substring, or for every such operation; or decides
//!   per operation through a hook ([`HookedEnv::set_hook`]) that sees an [`OpInfo`] and may
//!   also block to hold the operation at a chosen point. Counts operations per kind.
//! - [`RingFaults`]: faults the lanes of a [`UringEnv`](crate::env::UringEnv) made with
//!   `UringEnv::with_config` ([`UringConfig`]) inject: short linked writes, an errno in a
//!   completion, a lane thread's panic; [`LaneStats`] counts what each lane did.
//! - [`RecordingEnv`]: records, in order, the durable-relevant operations that succeeded
//!   ([`DurableOp`]: syncs, creates, links, renames, removes, new directories, holes, length
//!   changes, allocations), to check the order of durable operations.

mod hooked;
mod power_loss;
mod recording;

pub use crate::env::uring::{
    LaneKind, LaneStats, RingFault, RingFaultRule, RingFaults, RingOp, UringConfig,
};
pub use hooked::{Fault, Hook, HookedEnv, HookedFile, OpInfo, OpKind};
pub use power_loss::{
    dir_tree, CrashMode, CrashSnapshot, CrashState, DurableEvent, DurableObserver, DurableStep,
    PowerLossEnv, PowerLossFile, SECTOR_SIZE,
};
pub use recording::{DurableOp, RecordingEnv, RecordingFile};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::{DefaultEnv, OpenMode, StorageEnv};
    use std::sync::Arc;

    #[test]
    fn wrappers_compose() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().to_path_buf();
        let pl = PowerLossEnv::new(Arc::new(DefaultEnv::new()), &root);
        let hooked = HookedEnv::new(Arc::new(pl.clone()));
        let rec = RecordingEnv::new(Arc::new(hooked.clone()));
        let env: Arc<dyn StorageEnv> = Arc::new(rec.clone());

        let f = env.open(&root.join("f"), OpenMode::Create).unwrap();
        f.write_all_at(b"durable", 0).unwrap();
        f.sync_data().unwrap();
        env.sync_dir(&root).unwrap();
        hooked.fail(OpKind::SyncData, 1, Fault::Eio);
        f.write_all_at(b"DURABLE", 0).unwrap();
        assert!(f.sync_data().is_err());
        assert_eq!(pl.durable_ops(), 2);
        assert_eq!(rec.ops().len(), 3);
        // Reads and the map see the live data.
        let mut b = [0u8; 7];
        f.read_exact_at(&mut b, 0).unwrap();
        assert_eq!(&b, b"DURABLE");
        assert!(f.raw_fd() >= 0);

        pl.crash(CrashMode::DropUnsynced, true, 0).unwrap();
        assert_eq!(std::fs::read(root.join("f")).unwrap(), b"durable");
        let e = f.write_all_at(b"x", 0).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
    }
}
