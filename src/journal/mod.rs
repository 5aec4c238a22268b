//! The write-ahead journal: numbered files of checksummed records holding page images.
//!
//! - [`record`]: the byte layout of records.
//! - [`writer`]: [`Journal`], the group-commit writer: every commit that arrives while a batch
//!   is being written joins the next batch; one `pwritev` and one `fdatasync` per batch; no
//!   commit is acknowledged before the sync that covers it (DESIGN invariant 1).
//! - [`recovery`]: reading a storage's `Journals/` back on open (DESIGN invariant 7).

pub mod record;
pub mod recovery;
pub mod writer;

pub use writer::{Journal, JournalConfig, JournalStats, Prezero};

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
