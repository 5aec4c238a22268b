//! What a storage directory's files say before anything is written: the one classification of
//! a data file (new, a crashed creation, someone else's, or damage next to `Journals/`), the
//! reads of the header pages, and creation (design.md 6, steps 2 to 4; section 14).

use std::path::Path;

use crate::env::{EnvFile, StorageEnv};
use crate::error::{Error, Result};
use crate::journal::recovery;
use crate::layout::{random_id, BACKUP_MARKER, DATA_FILE, INDEXES_DIR, JOURNALS_DIR};
use crate::page::header::{self, Header};
use crate::page::{self, PAGE_SIZE};

/// True when the data file is what a creation that crashed before its header pages were durable
/// leaves behind (a power loss may keep any part of the two unsynced header writes): at most two
/// pages long, each slot zeros, cut off, or an omnibus header page (whole or torn) of an empty
/// storage (no header stating a started journal file, commits or pages in use), and no
/// `Journals/` directory (creation makes it only after the header pages are synced). Anything
/// else is left to the header checks, which report a cut file as damage.
pub(crate) fn unfinished_creation(
    env: &dyn StorageEnv,
    data: &dyn EnvFile,
    len: u64,
    journals_dir: &Path,
) -> Result<bool> {
    if len == 0 || len > 2 * PAGE_SIZE as u64 {
        return Ok(false);
    }
    let mut buf = vec![0u8; len as usize];
    data.read_exact_at(&mut buf, 0)?;
    buf.resize(2 * PAGE_SIZE, 0);
    for (slot, pg) in buf.chunks(PAGE_SIZE).enumerate() {
        let ours = match header::decode(pg, slot as u64) {
            // A header that states a started journal file: the creation finished (the
            // statement is written after the header pages are durable) and a journal file was
            // made durable (design.md 3.8), though no commit may have grown the data file yet
            // (a database's root whose commits all went to branches). Whether that file is
            // still there is recovery's question (such a root was
            // once re-created over a deleted journal file).
            header::Slot::Valid(h) if h.journal_started != 0 => return Ok(false),
            // A header that states pages or commits is no creation's: the file was cut.
            header::Slot::Valid(h) if h.flushed_txn != 0 || h.next_page > 2 || h.entries != 0 => {
                return Ok(false)
            }
            header::Slot::Valid(_) | header::Slot::Damaged => true,
            header::Slot::Foreign => pg.iter().all(|&b| b == 0),
            header::Slot::OtherVersion(_) => false,
        };
        if !ours {
            return Ok(false);
        }
    }
    // `Journals/` is made after the header pages are durable (`init_files`): with it there,
    // the creation finished, and headers cut or torn since are damage.
    Ok(!env.exists(journals_dir))
}

/// What an open does with a storage directory's data file, by [`classify_data_file`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DataFile {
    /// Empty, or what a creation that crashed before its header pages were durable leaves
    /// ([`unfinished_creation`]): the open creates the storage ([`init_files`]).
    Create,
    /// At least its two header pages long: the open reads its header next
    /// ([`read_header_or_damage`]).
    Existing,
}

/// The one classification of the data file `data` (`len` bytes) of the storage directory
/// `dir`, before anything is written: every open (a storage's, a database root's, read-only or
/// not) and every command goes through it, so one directory gets one verdict everywhere.
///
/// `Journals/` is created only after a new storage's header pages are durable
/// ([`init_files`]), so next to it, journal files or not, a data file that is empty, shorter
/// than two pages or without a header lost them: damage ([`Error::Corruption`]), never a
/// storage to create again. Without `Journals/`, a file shorter than two pages that is not what
/// a crashed creation leaves is somebody else's: [`Error::NotAStorage`].
///
/// Regression: a backup's branch (its `Journals/` empty, as
/// after any clean close) with `data.pages` cut to 0 or 16,384 bytes was re-created empty by
/// `omnibus put` (exit 0), and 19,777 keys were gone without an error. Regression: a 9-byte
/// text file as `data.pages` was "not an omnibus storage" to `Storage::open` but "corruption:
/// cut short" to a database's read-write open (another exit code for the same directory).
pub(crate) fn classify_data_file(
    env: &dyn StorageEnv,
    dir: &Path,
    data: &dyn EnvFile,
    len: u64,
    read_only: bool,
    create: bool,
) -> Result<DataFile> {
    let journals_dir = dir.join(JOURNALS_DIR);
    let data_path = dir.join(DATA_FILE);
    let mut len = len;
    let mut crashed = false;
    if !read_only && unfinished_creation(env, data, len, &journals_dir)? {
        crashed = true;
        len = 0;
    }
    let existed = |what: &str| damage_next_to_journals(env, &data_path, &journals_dir, what);
    if len == 0 {
        if let Some(e) = existed("the data file is empty")? {
            return Err(e);
        }
        // Not a storage yet (its header pages were never durable): only an open that may
        // create one makes it one, as for a missing directory.
        if read_only || !create {
            return Err(Error::NotAStorage {
                path: dir.to_path_buf(),
                reason: if crashed {
                    "the data file holds no header yet (a creation that did not finish; an open with `create` finishes it)".into()
                } else {
                    "empty data file".into()
                },
            });
        }
        if crashed {
            tracing::warn!(path = %dir.display(), "creation crashed before the header pages were durable: creating again");
        }
        return Ok(DataFile::Create);
    }
    if len < 2 * PAGE_SIZE as u64 {
        if let Some(e) = existed(&format!(
            "the data file is {len} bytes, shorter than its two header pages"
        ))? {
            return Err(e);
        }
        return Err(Error::NotAStorage {
            path: dir.to_path_buf(),
            reason: format!("{DATA_FILE} is {len} bytes, shorter than its two header pages"),
        });
    }
    Ok(DataFile::Existing)
}

/// Writes the two header pages of a new storage (random storage id, empty tree), syncs the
/// data file and the directory (the data file's name), creates `Journals/`, and syncs the
/// directory again (and its parent when `created_dir`).
pub(crate) fn init_files(
    env: &dyn StorageEnv,
    path: &Path,
    data: &dyn EnvFile,
    created_dir: bool,
) -> Result<()> {
    let h = Header {
        sequence: 1,
        storage_id: random_id(),
        flushed_txn: 0,
        root: 0,
        freedir: 0,
        next_page: 2,
        entries: 0,
        // No journal file yet: the open's first flush states the first one.
        journal_started: 0,
        journal_started_len: 0,
    };
    let p0 = h.encode(0);
    let p1 = Header { sequence: 0, ..h }.encode(1);
    data.write_all_at(&p0, 0)?;
    data.write_all_at(&p1, PAGE_SIZE as u64)?;
    data.sync_data()?;
    // The data file's name is durable before `Journals/` exists: a storage directory with
    // `Journals/` and no data file lost it (`missing_data_file_is_damage`), while one without
    // `Journals/` is an unfinished creation.
    env.sync_dir(path)?;
    let journals_dir = path.join(JOURNALS_DIR);
    env.create_dir(&journals_dir)?;
    env.sync_dir(&journals_dir)?;
    env.sync_dir(path)?;
    if created_dir {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            env.sync_dir(parent)?;
        }
    }
    Ok(())
}

/// True when `journals_dir` holds journal files. They exist only after a storage's header pages
/// were durable (creation syncs them first), so next to them a missing, empty or headerless
/// data file is damage, not a storage to create.
pub(crate) fn journal_files_exist(env: &dyn StorageEnv, journals_dir: &Path) -> Result<bool> {
    Ok(env.exists(journals_dir) && !recovery::list(env, journals_dir)?.is_empty())
}

/// For a directory without a data file whose entries are `names`: `Some(Error::NotAStorage)`
/// when it is an unfinished backup ([`BACKUP_MARKER`] is there: a backup stopped before its
/// last step; design.md 12).
///
/// Regression: a SIGKILLed `omnibus backup` left a copy whose root and one
/// branch were whole and another branch an empty directory; the copy opened, `check` passed,
/// and the branch was silently missing.
pub(crate) fn unfinished_backup(path: &Path, names: &[String]) -> Option<Error> {
    names.iter().any(|n| n == BACKUP_MARKER).then(|| Error::NotAStorage {
        path: path.to_path_buf(),
        reason: format!(
            "an unfinished backup: the backup writing it stopped before it completed ({BACKUP_MARKER} is there and no {DATA_FILE}); delete it and back up again"
        ),
    })
}

/// `Some(Error::Corruption)` saying `what` is wrong with the data file when the storage
/// existed: `journals_dir` holds journal files, or exists at all (creation makes it only after
/// the header pages are durable, [`init_files`]). `None` when neither: what a creation that
/// crashed early leaves.
pub(crate) fn damage_next_to_journals(
    env: &dyn StorageEnv,
    data_path: &Path,
    journals_dir: &Path,
    what: &str,
) -> Result<Option<Error>> {
    Ok(if journal_files_exist(env, journals_dir)? {
        Some(damaged_data_file(data_path, journals_dir, what))
    } else if env.exists(journals_dir) {
        Some(Error::corruption(
            data_path,
            None,
            None,
            format!(
                "{what}, but {} exists (it is made after the header pages are durable)",
                journals_dir.display()
            ),
        ))
    } else {
        None
    })
}

/// The corruption error for a damaged data file found next to journal files.
pub(crate) fn damaged_data_file(data_path: &Path, journals_dir: &Path, what: &str) -> Error {
    Error::corruption(
        data_path,
        None,
        None,
        format!("{what}, but {} holds journal files", journals_dir.display()),
    )
}

/// With no data file in `dir`: `Some(Error::Corruption)` when the directory shows that the
/// storage existed: journal files in its `Journals/`, a `Journals/` directory at all (creation
/// makes the data file and its name durable before it creates `Journals/`, see [`init_files`]),
/// or (a database root) branch storages with data files under `Indexes/` (branches are created
/// only after the root).
pub(crate) fn missing_data_file_is_damage(
    env: &dyn StorageEnv,
    dir: &Path,
    data_path: &Path,
) -> Result<Option<Error>> {
    let journals_dir = dir.join(JOURNALS_DIR);
    if journal_files_exist(env, &journals_dir)? {
        return Ok(Some(damaged_data_file(
            data_path,
            &journals_dir,
            "the data file is missing",
        )));
    }
    let indexes = dir.join(INDEXES_DIR);
    if env.exists(&indexes) {
        for n in env.list_dir(&indexes)? {
            if env.exists(&indexes.join(&n).join(DATA_FILE)) {
                return Ok(Some(Error::corruption(
                    data_path,
                    None,
                    None,
                    format!(
                        "the data file is missing, but {} holds storages with data",
                        indexes.display()
                    ),
                )));
            }
        }
    }
    if env.exists(&journals_dir) {
        return Ok(Some(Error::corruption(
            data_path,
            None,
            None,
            format!(
                "the data file is missing, but {} exists (a storage creates it only once its \
                 data file is durable)",
                journals_dir.display()
            ),
        )));
    }
    Ok(None)
}

/// Reads both header pages (slots 0 and 1) of `data`. The one reader of the header slots: the
/// open, the first flush's mirroring and `check` all go through it.
///
/// Errors: [`Error::Corruption`] when the file ends inside its header pages (it was cut short;
/// regression: a database's read-write open of a data file cut to 8 KiB
/// failed with `pread ...: failed to fill whole buffer`, an I/O error, where `check` reported
/// corruption); other read errors as I/O errors with the operation and path.
pub(crate) fn read_header_pages(data: &dyn EnvFile, data_path: &Path) -> Result<[Box<[u8]>; 2]> {
    let mut pages = [page::zeroed(1), page::zeroed(1)];
    for (slot, p) in pages.iter_mut().enumerate() {
        match data.read_exact_at(p, slot as u64 * PAGE_SIZE as u64) {
            Err(e) if e.source.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(Error::corruption(
                    data_path,
                    Some(slot as u64),
                    None,
                    "the data file ends inside its header pages (cut short)",
                ));
            }
            r => r?,
        }
    }
    Ok(pages)
}

/// Reads both header pages of `data` and returns the newest valid header and its slot.
/// [`read_header`], where a data file with no omnibus header next to `journals_dir` is
/// `Error::Corruption` ([`damage_next_to_journals`]), not `NotAStorage`: the storage existed.
pub(crate) fn read_header_or_damage(
    env: &dyn StorageEnv,
    data: &dyn EnvFile,
    data_path: &Path,
    journals_dir: &Path,
) -> Result<(Header, u64)> {
    match read_header(data, data_path) {
        Err(Error::NotAStorage { path, reason }) => Err(damage_next_to_journals(
            env,
            data_path,
            journals_dir,
            "neither header page is an omnibus header",
        )?
        .unwrap_or(Error::NotAStorage { path, reason })),
        r => r,
    }
}

pub(crate) fn read_header(data: &dyn EnvFile, data_path: &Path) -> Result<(Header, u64)> {
    let [p0, p1] = read_header_pages(data, data_path)?;
    header::choose(&p0, &p1, data_path)
}
