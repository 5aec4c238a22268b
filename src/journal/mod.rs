//! The write-ahead journal: numbered files of checksummed records holding page images.
//!
//! - [`record`]: the byte layout of records.
//! - [`writer`]: [`Journal`], the group-commit writer: every commit that arrives while a batch
//!   is being written joins the next batch; one `pwritev` and one `fdatasync` per batch; no
//!   commit is acknowledged before the sync that covers it (design.md invariant I1).
//! - `files`: the journal file lifecycle: the next file, hard links and link records for branch
//!   storages, per-file retention (`release`), recycling, and the directory syncs of design.md invariants I5 and I6.
//! - `pool`: whole pre-zeroed files prepared in the background.
//! - `prezero`: zeros ahead of the write position ([`Prezero`]) and the process's background
//!   pre-zeroing thread.
//! - `activity`: whether a batch is being written now (flushes yield the disk to it).
//! - [`recovery`]: reading a storage's `Journals/` back on open (design.md invariant I7).

pub(crate) mod activity;
mod cut;
mod files;
mod pool;
mod prezero;
pub mod record;
pub mod recovery;
pub mod writer;

pub use writer::{Journal, JournalConfig, JournalStats, Prezero};

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking the inner value of a poisoned mutex (a panic in one thread must not turn
/// into panics in others).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// File name of journal number `no`: 16 decimal digits and `.journal`.
pub fn file_name(no: u64) -> String {
    format!("{no:016}.journal")
}

/// The journal number in a file name made by [`file_name`], if it is one.
pub fn parse_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".journal")?;
    if digits.len() != 16 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_roundtrip() {
        assert_eq!(super::file_name(15), "0000000000000015.journal");
        assert_eq!(super::parse_file_name("0000000000000015.journal"), Some(15));
        assert_eq!(super::parse_file_name("15.journal"), None);
        assert_eq!(super::parse_file_name("000000000000001x.journal"), None);
    }
}
