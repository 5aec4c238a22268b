//! Reading journal files back: the scan every open runs (DESIGN invariant 7).
//!
//! A file is read record by record from offset 0. The first record whose header does not
//! decode (zeros, torn, another file's number) or whose body fails its checksum ends that
//! file: nothing after it in that file is read. Padding records are skipped.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::record::{RecordHeader, RecordKind, RECORD_HEADER_LEN};
use crate::env::{EnvFile, OpenMode, StorageEnv};
use crate::error::Result;

/// Journal files in `dir`, sorted by number. Other names are ignored.
pub fn list(env: &dyn StorageEnv, dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut v: Vec<(u64, PathBuf)> = env
        .list_dir(dir)?
        .into_iter()
        .filter_map(|n| super::parse_file_name(&n).map(|no| (no, dir.join(n))))
        .collect();
    v.sort();
    Ok(v)
}

/// Where and why the scan of one file stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanEnd {
    /// Byte offset of the first byte not taken as a record.
    pub offset: u64,
    /// Records read (padding included).
    pub records: u64,
}

/// Reads the records of journal file `no` at `path` in order and calls `f(header, body)` for
/// each commit or link record. `f` may stop the scan early by returning an error.
pub fn scan(
    env: &dyn StorageEnv,
    path: &Path,
    no: u64,
    mut f: impl FnMut(&RecordHeader, &[u8], u64) -> Result<()>,
) -> Result<ScanEnd> {
    let file: Arc<dyn EnvFile> = env.open(path, OpenMode::Existing)?;
    let len = file.len()?;
    let mut pos = 0u64;
    let mut records = 0u64;
    let mut hbuf = [0u8; RECORD_HEADER_LEN];
    let mut body = Vec::new();
    // Bounded: every turn advances `pos` by at least one header, and `pos` never passes `len`.
    while pos + RECORD_HEADER_LEN as u64 <= len {
        file.read_exact_at(&mut hbuf, pos)?;
        let Some(h) = RecordHeader::decode(&hbuf) else {
            break;
        };
        let body_at = pos + RECORD_HEADER_LEN as u64;
        if h.journal_no != no || h.body_len > len - body_at {
            break;
        }
        body.resize(h.body_len as usize, 0);
        file.read_exact_at(&mut body, body_at)?;
        if crc32fast::hash(&body) != h.body_crc {
            break;
        }
        records += 1;
        if h.kind != RecordKind::Padding {
            f(&h, &body, pos)?;
        }
        pos = body_at + h.body_len;
    }
    Ok(ScanEnd {
        offset: pos,
        records,
    })
}
