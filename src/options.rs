//! [`Options`]: how a storage is opened, journaled and flushed.

use std::sync::Arc;
use std::time::Duration;

use crate::env::{default_env, JournalIo, StorageEnv, WriteMode};
use crate::error::{Error, Result};
use crate::journal::Prezero;

/// When flushes run for a storage opened with [`crate::Storage::open`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FlushMode {
    /// The process's one flush-service thread (`omnibus-flush`, serving every such storage)
    /// flushes the storage when its scratch table passes [`Options::flush_scratch_bytes`] or
    /// its oldest commit passes [`Options::flush_max_age`].
    #[default]
    Background,
    /// The committing thread flushes right after a commit that crosses a threshold (tests,
    /// deterministic runs).
    Inline,
    /// Only explicit [`crate::Storage::flush`] calls (the actor runtime drives flushes itself).
    Manual,
}

/// When a write transaction's commit is acknowledged (as redb's `Durability`), set with
/// [`crate::WriteTransaction::set_durability`] or the actors' `WriteBatch::set_durability`.
///
/// Either way a commit is atomic and commits reach the journal in commit order: a crash keeps
/// a prefix of the commits of one journal (a standalone storage's own, or a database's shared
/// journal). See docs/design.md, section 4.2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum Durability {
    /// Acknowledged once the commit's journal record is covered by a successful `fdatasync`
    /// (design.md invariant I1). The default.
    #[default]
    Immediate,
    /// Acknowledged once the record is queued for the journal, before any write (redb's
    /// "nosync" commits, `Durability::None` there). It becomes durable with the next batch of
    /// the journal (any later `Immediate` commit of any storage sharing the journal, or a
    /// flush of the storage) or, when none comes, within [`Options::eventual_sync_ms`] by the
    /// journal's sync thread. Readers see the commit at once. A crash (or a failed sync, which
    /// poisons) may lose the last eventual commits, never part of one, never a commit before a
    /// lost one, and never an `Immediate` commit acknowledged after them.
    Eventual,
}

/// How the storages of a [`crate::Database`] journal their commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum JournalMode {
    /// One journal for the root and every branch storage: one `fdatasync` per batch of commits
    /// of all storages (the point of omnibus).
    #[default]
    Shared,
    /// Every storage its own journal and its own `fdatasync` (the baseline for benchmarks).
    Separate,
}

/// Options for opening a storage. `Options::default()` suits most uses.
#[derive(Debug, Clone)]
pub struct Options {
    /// The storage environment every file operation goes through. Default:
    /// [`crate::env::default_env`] ([`crate::env::UringEnv`] where io_uring can be set up, else
    /// [`crate::env::DefaultEnv`]).
    pub env: Arc<dyn StorageEnv>,
    /// Create the storage when the directory is missing or empty. Default `true`; when `false`,
    /// opening a missing storage fails with [`Error::NotAStorage`].
    pub create: bool,
    /// Open for reading only: recovery replays the journal in memory, and nothing is written
    /// but a slot of the reader table in `LOCK` (so any number of read-only openers, in any
    /// processes, read beside one live writer: docs/design.md 6.5); where `LOCK` cannot be
    /// written it is `flock`ed shared instead (no writer meanwhile), and where it cannot be
    /// opened, e.g. on read-only media without one, skipped. [`crate::Storage::begin_write`]
    /// fails with [`Error::ReadOnly`]. Works on read-only media and without write permission.
    /// Default `false`.
    pub read_only: bool,
    /// Journal file size in bytes before a new file is started. Default 256 MiB. A batch larger
    /// than this gets a file of its own, as large as it needs.
    pub journal_file_size: u64,
    /// How the journal tail is zeroed ahead of commits. Default: 4 MiB ahead (Dolt).
    pub journal_prezero: Prezero,
    /// Flush when unflushed page images in the scratch table, plus the pages freed since the
    /// last flush (8 KiB each: they wait for a durable header before reuse, so the data file
    /// grows by them until a flush), exceed this many bytes. Default 64 MiB.
    pub flush_scratch_bytes: u64,
    /// Flush when the oldest unflushed commit is older than this. Default 5 s.
    pub flush_max_age: Duration,
    /// Who runs flushes. Default [`FlushMode::Background`].
    pub flush_mode: FlushMode,
    /// Punch holes (`fallocate(PUNCH_HOLE | KEEP_SIZE)`) in wholly free, aligned 1 MiB runs of
    /// the data file during flushes. Default `true`.
    pub punch_holes: bool,
    /// Flush when the last handle is dropped or [`crate::Storage::close`] is called, so the
    /// next open has nothing to replay. Default `true`; `false` leaves committed transactions in
    /// the journal only (they are durable either way) and makes closing instant.
    pub flush_on_close: bool,
    /// Whole pre-zeroed journal files kept ready by a background thread (as Voron's zeroed
    /// journal pool), each `journal_file_size` bytes; released journal files are recycled into
    /// it. Default 0 for a standalone storage; a database's shared journal uses at least 1.
    pub journal_pool_files: usize,
    /// Shared or separate journals for a [`crate::Database`]. Default [`JournalMode::Shared`].
    /// Ignored by a standalone [`crate::Storage::open`].
    pub journal_mode: JournalMode,
    /// How flushes write pages into the data file. Default [`WriteMode::Auto`]: measured once
    /// per device in the process (a short probe at the first flush that writes pages; see
    /// [`WriteMode::describe`]). `OMNIBUS_WRITE_MODE` overrides it.
    pub write_mode: WriteMode,
    /// How journal batches reach the device (one write and one sync each). Default
    /// [`JournalIo::Auto`]: measured once per device in the process (a short probe when a
    /// journal opens; see [`JournalIo::describe`]), `pwritev` + `fdatasync` on a tie.
    /// `OMNIBUS_JOURNAL_IO` overrides it.
    pub journal_io: JournalIo,
    /// For [`crate::Database::open`]: when some branch storages are damaged (they fail to open
    /// with [`Error::Corruption`] or [`Error::NotAStorage`]; see [`crate::Database::damaged`]),
    /// still let the healthy storages be written. Default `false`: such a database opens,
    /// its healthy storages can be read, and every write fails with
    /// [`Error::DatabaseDamaged`].
    pub write_with_damaged_storages: bool,
    /// Longest time, in milliseconds, that a commit made with [`Durability::Eventual`] waits in
    /// the journal's queue for a later batch before the journal's sync thread writes and syncs
    /// it itself: the most recent data a crash can lose when no other commit or flush comes.
    /// 1 to 60,000; default 100. For a database, the shared journal takes the root's value.
    pub eventual_sync_ms: u64,
    /// How long, in milliseconds, the journal must stay idle after a batch before its sync
    /// thread writes a *durable mark* after it: one 4 KiB record and one `fdatasync`, never
    /// while batches keep coming. Damage to a batch a mark follows is then reported as
    /// [`Error::Corruption`] at open instead of being taken for the torn tail of a crash
    /// (docs/design.md 3.12); the last batch before a crash that came within this time (plus
    /// the mark's sync) has no mark. 0 writes no marks; at most 60,000; default 100. For a
    /// database, the shared journal takes the root's value.
    pub journal_mark_ms: u64,
    /// The write buffer, in bytes: [`DEFAULT_WRITE_BUFFER_BYTES`] (1 MiB) by default; 0 for
    /// none. With a buffer, a commit that only
    /// puts and deletes journals its operations as one logical record and adds them to an
    /// in-memory buffer that every read merges over the B+tree, instead of copying a leaf per
    /// key; once the buffer holds more than this many bytes (each entry counted as its key,
    /// its value and 16 bytes), or its oldest entry is older than
    /// [`Options::flush_max_age`], all of it is applied to the tree in one page transaction,
    /// so each leaf is written once for the many entries pending on it (design.md section 16):
    /// with [`FlushMode::Background`] (the default) by the flush service's thread while
    /// commits go on (a *background apply*, design.md 16.1; commits wait only while the
    /// buffer holds more than twice its size, and for the apply's publication, which is one
    /// record's hand-off), otherwise by the committing writer, or, with
    /// [`crate::Storage::set_apply_step_pages`], in steps, the leaves with the most entries
    /// pending first. A transaction of 4,096 operations or more, a range delete and
    /// compaction write the tree directly, applying the buffer with them. Flushes,
    /// `Storage::flush` and a clean close apply it too.
    /// Reopening after a crash puts the journaled entries back into the buffer. While a
    /// background apply runs, `begin_write` gives a transaction that buffers its operations
    /// (one at a time, as ever), and waits only while the buffer holds more than twice its
    /// size; one that needs the tree (a range delete) makes the apply give up first. Databases served by
    /// the actor engine open the root and plain branches without a buffer and refuse a size
    /// other than 0 and the default ([`Error::InvalidOptions`]): there only indexes are
    /// buffered (`IndexDefinition::write_buffer_bytes`). [`crate::Storage::set_write_buffer_bytes`]
    /// changes the size of an open storage's buffer.
    pub write_buffer_bytes: u64,
    /// Pack values too long to sit in their leaf but at most
    /// 10,912 bytes (from 2,032 bytes up, with short keys)
    /// several to a value page run of their leaf (docs/design.md 2.7): 4 KiB values then take
    /// about 4.3 KiB of the data file each instead of a whole 8 KiB page. Default `true`.
    /// `false` gives each such value an overflow run of its own (a page or more, as format
    /// version 2 stored them): a one-put commit of a 4 KiB value then journals about 8 KiB
    /// instead of about 21 KiB (a put may merge runs of its leaf), at twice the space. Values
    /// packed before stay packed until rewritten; reads are the same either way. Not stored:
    /// each open chooses.
    pub pack_values: bool,
}

/// The write buffer of a storage opened with default options
/// ([`Options::write_buffer_bytes`]), in bytes: 1 MiB, about 5,500 entries of a 24-byte key and a
/// 150-byte value. Serial one-key synced commits into a storage of 200,000 such keys ran 0.94-0.96x
/// the rate of a raw 4 KiB `pwrite` + `fdatasync` on ext4 with it, 0.79-0.81x without; 4 MiB
/// ran as fast, with longer stalls behind an apply's record (docs/BENCHMARKS.md, "Serial
/// durable commits"). Each storage holds up to about twice this in memory while its buffer is
/// applied in the background.
pub const DEFAULT_WRITE_BUFFER_BYTES: u64 = 1 << 20;

impl Default for Options {
    fn default() -> Options {
        Options {
            env: default_env(),
            create: true,
            read_only: false,
            journal_file_size: 256 << 20,
            journal_prezero: Prezero::default(),
            flush_scratch_bytes: 64 << 20,
            flush_max_age: Duration::from_secs(5),
            flush_mode: FlushMode::Background,
            punch_holes: true,
            flush_on_close: true,
            journal_pool_files: 0,
            journal_mode: JournalMode::Shared,
            write_mode: WriteMode::Auto,
            journal_io: JournalIo::Auto,
            write_with_damaged_storages: false,
            eventual_sync_ms: 100,
            journal_mark_ms: 100,
            write_buffer_bytes: DEFAULT_WRITE_BUFFER_BYTES,
            pack_values: true,
        }
    }
}

impl Options {
    /// Checks ranges: journal files of at least 64 KiB, a pre-zero step of 4 KiB to 1 GiB,
    /// `eventual_sync_ms` of 1 to 60,000, `journal_mark_ms` of 0 to 60,000. Errors:
    /// [`Error::InvalidOptions`] naming the option.
    pub fn validate(&self) -> Result<()> {
        if !(1..=60_000).contains(&self.eventual_sync_ms) {
            return Err(Error::InvalidOptions(format!(
                "eventual_sync_ms is {}: 1 to 60,000 milliseconds",
                self.eventual_sync_ms
            )));
        }
        if self.journal_mark_ms > 60_000 {
            return Err(Error::InvalidOptions(format!(
                "journal_mark_ms is {}: 0 to 60,000 milliseconds",
                self.journal_mark_ms
            )));
        }
        if self.journal_file_size < 64 << 10 {
            return Err(Error::InvalidOptions(format!(
                "journal_file_size is {} bytes: at least 65,536 bytes",
                self.journal_file_size
            )));
        }
        if let Prezero::Ahead(n) = self.journal_prezero {
            if !(4096..=1 << 30).contains(&n) {
                return Err(Error::InvalidOptions(format!(
                    "journal_prezero ahead is {n} bytes: 4 KiB to 1 GiB"
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eventual_sync_ms_is_checked() {
        for (ms, ok) in [
            (0, false),
            (1, true),
            (100, true),
            (60_000, true),
            (60_001, false),
        ] {
            let o = Options {
                eventual_sync_ms: ms,
                ..Options::default()
            };
            match o.validate() {
                Ok(()) => assert!(ok, "{ms} accepted"),
                Err(Error::InvalidOptions(m)) => {
                    assert!(!ok && m.contains("eventual_sync_ms"), "{ms}: {m}")
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(Durability::default(), Durability::Immediate);
    }
}
