//! `get`, `put`, `delete`, `scan`, `stat`, `check`, `backup`: the core `Database` API, no actors (so
//! `put` and `delete` on the root do not update indexes: the next `ingest --index` of an index
//! reconciles it). An index storage's applied-txn record (key 0x00) is not listed by `scan` nor
//! counted by `stat` as an entry.

use std::io::{IsTerminal, Read, Write};
use std::path::Path;

use omnibus::actors::{index_applied_txn, INDEX_APPLIED_KEY};
use omnibus::{Database, Options, ReadTransaction, Storage};
use serde::Serialize;
use serde_json::json;

use crate::cli::{
    BackupArgs, CheckArgs, CompactArgs, DeleteArgs, GetArgs, PutArgs, QueryArgs, ScanArgs,
    StatArgs, StorageArg,
};
use crate::{db_dir, fmt, CliResult, Fail};

/// Opens the database read-only (nothing is written; the journal is replayed in memory).
fn open_read(db: &Path) -> CliResult<Database> {
    db_dir(db)?;
    let opts = Options {
        read_only: true,
        create: false,
        ..Options::default()
    };
    Database::open(db, opts).map_err(|e| Fail::opening(e, db))
}

fn open_write(db: &Path, create: bool) -> CliResult<Database> {
    db_dir(db)?;
    let opts = Options {
        create,
        ..Options::default()
    };
    Database::open(db, opts).map_err(|e| Fail::opening(e, db))
}

/// Whether `dir` holds a plain storage (one made by `Storage::open`: a data file and no
/// `Indexes/` directory) rather than a database: `stat` and `check` then open it as a storage,
/// read-only, and never turn it into a database. A data file of at most two pages without a
/// `Journals/` directory is no storage yet (what a creation that crashed leaves, or someone
/// else's small file): it goes to the database's open, which classifies it as every open does
/// (regression: `put` and `delete` made a directory holding an empty `data.pages` a plain
/// storage, where `get` called it "not an omnibus storage").
pub(crate) fn is_plain_storage(dir: &Path) -> bool {
    let created = dir.join("Journals").is_dir()
        || std::fs::metadata(dir.join("data.pages"))
            .is_ok_and(|m| m.len() > 2 * omnibus::PAGE_SIZE as u64);
    Storage::exists(dir) && !Database::exists(dir) && created
}

/// Opens the plain storage at `dir` read-only (nothing is written).
pub(crate) fn open_plain(dir: &Path) -> Result<Storage, omnibus::Error> {
    let opts = Options {
        read_only: true,
        create: false,
        ..Options::default()
    };
    Storage::open(dir, opts)
}

/// Sets `obj[name]` to bytes `b` as JSON: a string when `b` is UTF-8; otherwise its hex digits,
/// with `obj[name_encoding] = "hex"` saying so (so every line parses as JSON and loses nothing).
fn json_bytes(obj: &mut serde_json::Map<String, serde_json::Value>, name: &str, b: &[u8]) {
    match std::str::from_utf8(b) {
        Ok(t) => {
            obj.insert(name.to_string(), t.into());
        }
        Err(_) => {
            let mut hex = String::with_capacity(2 * b.len());
            for x in b {
                hex.push_str(&format!("{x:02x}"));
            }
            obj.insert(name.to_string(), hex.into());
            obj.insert(format!("{name}_encoding"), "hex".into());
        }
    }
}

/// One `{"key":..,"value":..}` JSON line (see [`json_bytes`]).
fn json_entry(k: &[u8], v: &[u8]) -> String {
    let mut m = serde_json::Map::new();
    json_bytes(&mut m, "key", k);
    json_bytes(&mut m, "value", v);
    serde_json::Value::Object(m).to_string() + "\n"
}

/// What a key command (`get`, `put`, `delete`, `scan`) works on: a storage of a database, or a
/// plain storage (made by `Storage::open`), which is used as it is and never turned into a
/// database.
///
/// Regression: `get` and `scan` refused a plain storage ("no
/// Indexes directory") while `check`, `stat` and `backup` read it, and `put` on one silently
/// made it a database (it created `Indexes/`).
enum Target {
    Db(Database, Storage),
    Plain(Storage),
}

impl Target {
    /// Opens what `t` names, and says whether it created the branch storage. A plain storage
    /// has no branches: a `--storage` other than its name `(storage)` is an input error.
    /// `write` opens for writing (a database is created when missing if `create_db`; a branch
    /// when missing if `create_branch`, else `hint` ends the message).
    fn open(
        t: &StorageArg,
        write: bool,
        create_db: bool,
        create_branch: bool,
        hint: &str,
    ) -> CliResult<(Target, bool)> {
        // A branch's own directory looks like a plain storage: it is used through its database.
        crate::not_a_branch(&t.db)?;
        if is_plain_storage(&t.db) {
            if let Some(n) = t.storage.as_deref().filter(|n| *n != PLAIN_STORAGE) {
                // A directory that is no storage at all says so first (regression: junk was
                // called "a plain storage" when `--storage` was given).
                drop(open_plain(&t.db).map_err(|e| Fail::opening(e, &t.db))?);
                return Err(Fail::input(format!(
                    "{}: a plain storage (made by `Storage::open`, not a database) has no storage `{n}`",
                    t.db.display()
                )));
            }
            let s = if write {
                Storage::open(
                    &t.db,
                    Options {
                        create: false,
                        ..Options::default()
                    },
                )
            } else {
                open_plain(&t.db)
            };
            return Ok((
                Target::Plain(s.map_err(|e| Fail::opening(e, &t.db))?),
                false,
            ));
        }
        let db = if write {
            open_write(&t.db, create_db)?
        } else {
            open_read(&t.db)?
        };
        let created = create_branch
            && t.storage
                .as_ref()
                .is_some_and(|n| n != ROOT && !db.storages().contains(n));
        let s = storage_of(&db, t, create_branch, hint)?;
        Ok((Target::Db(db, s), created))
    }

    fn storage(&self) -> &Storage {
        match self {
            Target::Db(_, s) | Target::Plain(s) => s,
        }
    }

    /// Whether this is a branch storage of a database (where key 0x00 may be an index's
    /// applied record).
    fn is_branch(&self, t: &StorageArg) -> bool {
        matches!(self, Target::Db(..)) && t.storage.as_deref().is_some_and(|n| n != ROOT)
    }

    /// Ends a write command: closes the database or the storage (flushing it).
    fn close(self) -> CliResult {
        match self {
            Target::Db(db, s) => close_write(db, s),
            Target::Plain(s) => s
                .close()
                .map_err(|e| Fail::from(e).context("closing the storage")),
        }
    }
}

/// The name `stat` and `check` give a plain storage.
const PLAIN_STORAGE: &str = "(storage)";

/// The name `stat` and `check` give a database's root (accepted by `--storage`).
const ROOT: &str = "(root)";

/// Storage names for a message, each in backquotes (an index's name may hold commas:
/// `a`, `a,b`).
fn quoted<S: AsRef<str>>(names: &[S]) -> String {
    names
        .iter()
        .map(|n| format!("`{}`", n.as_ref()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `--storage` for the JSON output: the name, or `(root)` as in `stat` and `check`.
fn storage_name(t: &StorageArg) -> &str {
    t.storage.as_deref().unwrap_or(ROOT)
}

/// The storage `t` names: the root, or a branch storage. A branch storage that does not exist
/// is refused (exit 1) unless `create`; `hint` ends that message (how to create one, if any).
fn storage_of(db: &Database, t: &StorageArg, create: bool, hint: &str) -> CliResult<Storage> {
    // `(root)` is how `stat` and `check` name the root: accepted here too.
    let Some(name) = t.storage.as_ref().filter(|n| *n != ROOT) else {
        return Ok(db.root());
    };
    // A damaged branch is not among the storages: say so, not "no storage" (whose hint,
    // `put --create`, would then fail on the damage anyway).
    if let Some((_, e)) = db.damaged().into_iter().find(|(n, _)| n == name) {
        return Err(Fail::from(e).context(format_args!("storage `{name}` is damaged")));
    }
    if !create && !db.storages().contains(name) {
        let all = db.storages();
        return Err(Fail::input(format!(
            "{}: no storage `{name}` (storages: {}){hint}",
            t.db.display(),
            if all.is_empty() {
                "none besides the root".to_string()
            } else {
                quoted(&all)
            }
        )));
    }
    let s = if create {
        db.create_storage(name)
    } else {
        db.storage(name)
    };
    s.map_err(|e| Fail::from(e).context(format_args!("storage `{name}`")))
}

fn arg_bytes(what: &str, s: &str) -> CliResult<Vec<u8>> {
    fmt::unescape(s).map_err(|e| Fail::input(format!("{what}: {e}")))
}

/// Writes to stdout; a closed pipe (`| head`) ends the command quietly.
fn out(w: &mut impl Write, bytes: &[u8]) -> CliResult<bool> {
    match w.write_all(bytes) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(Fail::io(format!("writing standard output: {e}"))),
    }
}

fn flush_out(w: &mut impl Write) -> CliResult {
    match w.flush() {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(Fail::io(format!("writing standard output: {e}")))
        }
        _ => Ok(()),
    }
}

/// Checks KEY against the key limits, with the same error (and exit code 1) as `put`: a key
/// no storage can hold is not merely "not found".
fn check_key(key: &[u8]) -> CliResult {
    if key.is_empty() {
        return Err(omnibus::Error::EmptyKey.into());
    }
    if key.len() > omnibus::MAX_KEY_LEN {
        return Err(omnibus::Error::KeyTooLarge {
            len: key.len(),
            max: omnibus::MAX_KEY_LEN,
        }
        .into());
    }
    Ok(())
}

pub fn get(a: GetArgs) -> CliResult {
    let key = arg_bytes("KEY", &a.key)?;
    check_key(&key)?;
    let (t, _) = Target::open(&a.target, false, false, false, "")?;
    let r = t.storage().begin_read()?;
    let Some(v) = r.get(&key)? else {
        return Err(Fail::input(format!("{}: not found", fmt::escape(&key))));
    };
    let stdout = std::io::stdout();
    // Regression: `get db img > img.png` appended a newline and corrupted
    // binary values: the newline is only for a terminal.
    let newline = stdout.is_terminal();
    let mut o = stdout.lock();
    if a.json {
        out(&mut o, json_entry(&key, v).as_bytes())?;
    } else if out(&mut o, v)? && newline {
        out(&mut o, b"\n")?;
    }
    flush_out(&mut o)
}

/// What `put --storage NAME` without `--create` says when NAME does not exist.
const CREATE_HINT: &str = "; `put --create` creates it";

/// Reads at most the value limit from `r`: a longer value is an input error naming `what`.
fn read_value(mut r: impl Read, what: &str) -> CliResult<Vec<u8>> {
    let mut v = Vec::new();
    r.by_ref()
        .take(omnibus::MAX_VALUE_LEN as u64 + 1)
        .read_to_end(&mut v)
        .map_err(|e| Fail::input(format!("reading {what}: {e}")))?;
    if v.len() > omnibus::MAX_VALUE_LEN {
        // Reading stopped one byte past the limit: the real length is unknown, and at least
        // that (a 200 MB file was once reported as "134217729 bytes").
        return Err(Fail::input(format!(
            "{what}: the value is larger than {} bytes, the most a value may hold",
            omnibus::MAX_VALUE_LEN
        )));
    }
    Ok(v)
}

/// The value of `put`: VALUE unescaped, or the raw bytes of standard input (VALUE `-` or
/// `--value-file -`) or of `--value-file PATH`. Read before the database is opened, so a
/// failed read creates nothing.
fn put_value(a: &PutArgs) -> CliResult<Vec<u8>> {
    match (&a.value_file, a.value.as_deref()) {
        (Some(p), _) if p.as_os_str() == "-" => {
            read_value(std::io::stdin().lock(), "standard input")
        }
        (Some(p), _) => {
            let f = std::fs::File::open(p)
                .map_err(|e| Fail::input(format!("--value-file {}: {e}", p.display())))?;
            read_value(f, &format!("--value-file {}", p.display()))
        }
        (None, Some("-")) => read_value(std::io::stdin().lock(), "standard input"),
        (None, Some(v)) => arg_bytes("VALUE", v),
        (None, None) => Err(Fail::input("give VALUE or --value-file")),
    }
}

/// Checks a write's key, value and storage name before anything is opened or created.
///
/// Regression: `put fresh '' v` and `put fresh --storage .. --create k v`
/// exited 1, the engine refusing the empty key or the name at commit, but only after the
/// database had been created: a rejected command left a new empty database behind.
fn check_write_input(a: &StorageArg, key: &[u8], value: Option<&[u8]>) -> CliResult {
    if key.is_empty() {
        return Err(omnibus::Error::EmptyKey.into());
    }
    if key.len() > omnibus::MAX_KEY_LEN {
        return Err(omnibus::Error::KeyTooLarge {
            len: key.len(),
            max: omnibus::MAX_KEY_LEN,
        }
        .into());
    }
    if let Some(v) = value.filter(|v| v.len() > omnibus::MAX_VALUE_LEN) {
        return Err(omnibus::Error::ValueTooLarge {
            len: v.len(),
            max: omnibus::MAX_VALUE_LEN,
        }
        .into());
    }
    if let Some(name) = &a.storage {
        Database::validate_storage_name(name)?;
    }
    Ok(())
}

/// Refuses a write of an index storage's reserved key, its applied record.
///
/// Regression: `put DB --storage color '\x00' garbage` (and `delete`)
/// exited 0 and overwrote the index's applied record; `check` then dropped that index's
/// cross-check without a word and `stat` counted the record as an entry.
fn check_not_reserved(a: &StorageArg, t: &Target, key: &[u8]) -> CliResult {
    if t.is_branch(a)
        && key == INDEX_APPLIED_KEY
        && applied_record(&t.storage().begin_read()?).is_some()
    {
        return Err(Fail::input(
            "key \\x00 of an index storage is its applied record, kept by the engine: not writable"
                .to_string(),
        ));
    }
    Ok(())
}

pub fn put(a: PutArgs) -> CliResult {
    let key = arg_bytes("KEY", &a.key)?;
    let value = put_value(&a)?;
    check_write_input(&a.target, &key, Some(&value))?;
    let exists = db_dir(&a.target.db)?;
    // A missing database is created for the root storage (as before), but a branch storage is
    // only ever created on request: a typo in --storage must not make a database either.
    if let (Some(name), false, false) = (&a.target.storage, a.create, exists) {
        return Err(Fail::input(format!(
            "{}: no database there, so no storage `{name}`; `put --create` creates both",
            a.target.db.display()
        )));
    }
    let (t, created) = Target::open(&a.target, true, true, a.create, CREATE_HINT)?;
    check_not_reserved(&a.target, &t, &key)?;
    let mut w = t.storage().begin_write()?;
    let replaced = a.json && w.get(&key)?.is_some();
    w.put(&key, &value)?;
    w.commit()?;
    t.close()?;
    if a.json {
        let report = json!({
            "storage": storage_name(&a.target),
            "key": fmt::escape(&key),
            "value_bytes": value.len(),
            "replaced": replaced,
            "storage_created": created,
        });
        println!("{report}");
    }
    Ok(())
}

/// Ends a write command: drops the storage handle and closes the database (flushing it).
fn close_write(db: omnibus::Database, s: omnibus::Storage) -> CliResult {
    drop(s);
    db.close()
        .map_err(|e| Fail::from(e).context("closing the database"))?;
    Ok(())
}

pub fn delete(a: DeleteArgs) -> CliResult {
    let key = arg_bytes("KEY", &a.key)?;
    check_write_input(&a.target, &key, None)?;
    let (t, _) = Target::open(&a.target, true, false, false, "")?;
    check_not_reserved(&a.target, &t, &key)?;
    let mut w = t.storage().begin_write()?;
    let found = w.delete(&key)?;
    if found {
        w.commit()?;
    } else {
        drop(w); // nothing changed: nothing to commit
    }
    t.close()?;
    if a.json {
        let report = json!({
            "storage": storage_name(&a.target),
            "key": fmt::escape(&key),
            "deleted": found,
        });
        println!("{report}");
    } else if found {
        println!("deleted");
    }
    // Regression: a missing key exited 0 here but 1 for `get`.
    if !found {
        return Err(Fail::input(format!("{}: not found", fmt::escape(&key))));
    }
    Ok(())
}

pub fn scan(a: ScanArgs) -> CliResult {
    let prefix = match (&a.prefix, a.terms.is_empty()) {
        (Some(p), _) => Some(arg_bytes("--prefix", p)?),
        (None, false) => Some(term_prefix(&a)?),
        (None, true) => None,
    };
    let (t, _) = Target::open(&a.target, false, false, false, "")?;
    let r = t.storage().begin_read()?;
    // An index storage's applied record is not an entry.
    let skip_record = t.is_branch(&a.target) && applied_record(&r).is_some();
    if !a.terms.is_empty() && !skip_record {
        return Err(Fail::input(format!(
            "--term: storage `{}` is not an index (it has no applied-txn record); use --prefix",
            storage_name(&a.target)
        )));
    }
    let limit = a.limit.unwrap_or(u64::MAX);
    let mut o = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    let mut n = 0u64;
    let mut emit = |k: &[u8], v: &[u8]| -> CliResult<bool> {
        // Regression: --json printed the text escapes (`\xff`) inside
        // JSON strings, so a consumer could not tell them from the four characters themselves.
        let line = if a.json {
            json_entry(k, v)
        } else {
            format!("{}\t{}\n", fmt::escape(k), fmt::escape(v))
        };
        out(&mut o, line.as_bytes())
    };
    if limit > 0 {
        match &prefix {
            Some(p) => {
                for e in r.prefix(p)? {
                    let (k, v) = e?;
                    if skip_record && k == INDEX_APPLIED_KEY {
                        continue;
                    }
                    n += 1;
                    if !emit(k, v)? || n >= limit {
                        break;
                    }
                }
            }
            None => {
                for e in r.iter()? {
                    let (k, v) = e?;
                    if skip_record && k == INDEX_APPLIED_KEY {
                        continue;
                    }
                    n += 1;
                    if !emit(k, v)? || n >= limit {
                        break;
                    }
                }
            }
        }
    }
    flush_out(&mut o)
}

/// The key prefix of `scan --term T...` on an index storage: the terms joined as a compound
/// index joins its fields (0x00), then the entry prefix of that term; with fewer terms than the
/// index's name has fields (`country,admin1`), the prefix of every term that starts with them.
fn term_prefix(a: &ScanArgs) -> CliResult<Vec<u8>> {
    let Some(name) = a.target.storage.as_deref().filter(|n| *n != ROOT) else {
        return Err(Fail::input(
            "--term lists an index's entries: give the index with --storage NAME",
        ));
    };
    terms_prefix(name, &a.terms, "--term")
}

/// The key prefix of the entries of index `name` (an `ingest --index` SPEC) whose fields begin
/// with `terms` (one per field, escapes as `scan` prints them); `what` names the argument in
/// errors.
fn terms_prefix(name: &str, terms: &[String], what: &str) -> CliResult<Vec<u8>> {
    let mut joined = Vec::new();
    for (i, t) in terms.iter().enumerate() {
        if i > 0 {
            joined.push(crate::index_spec::SEP);
        }
        joined.extend_from_slice(&arg_bytes(what, t)?);
    }
    let fields = name.split(',').count();
    if terms.len() > fields {
        return Err(Fail::input(format!(
            "{what} given {} times, but the index `{name}` has {fields} field{}",
            terms.len(),
            if fields == 1 { "" } else { "s" }
        )));
    }
    Ok(if terms.len() < fields {
        joined.push(crate::index_spec::SEP);
        omnibus::actors::index_terms_starting_with(&joined)
    } else {
        omnibus::actors::index_term_prefix(&joined)
    })
}

#[derive(Serialize)]
struct StorageStat {
    name: String,
    path: String,
    last_committed_txn: u64,
    last_flushed_txn: u64,
    /// Entries (an index storage's applied record left out).
    entries: u64,
    /// For an index storage: the root txn id it has applied up to.
    index_applied_txn: Option<u64>,
    pages_used: u64,
    pages_free: u64,
    data_file_bytes: u64,
    allocated_bytes: u64,
    /// File length not backed by allocated blocks (punched holes, or a sparse tail).
    unallocated_bytes: u64,
    holes_punched_since_open: u64,
    journal_files: u64,
    scratch_pages: u64,
    scratch_bytes: u64,
    /// Read-only openers in other processes holding a slot of this storage's reader table now
    /// (`Storage::readers`): this command's own slot is not listed.
    readers: Vec<ReaderStat>,
}

/// A live reader slot: the reader's pid and the oldest txn whose pages it may read (0 while
/// it opens).
#[derive(Serialize)]
struct ReaderStat {
    pid: u32,
    txn: u64,
}

/// The applied-txn record of an index storage's snapshot, if it holds one.
/// `omnibus query`: the documents index `a.index` lists under the terms, in document key order,
/// one JSON object a line (`{"key":..,"value":..}`, or `{"key":..}` with `--keys`), each
/// document read from the root's snapshot taken after the index's (a document deleted since is
/// left out).
pub fn query(a: QueryArgs) -> CliResult {
    let target = StorageArg {
        db: a.db.clone(),
        storage: Some(a.index.clone()),
    };
    let prefix = terms_prefix(&a.index, &a.terms, "TERM")?;
    let (t, _) = Target::open(&target, false, false, false, "")?;
    let Target::Db(db, index) = &t else {
        return Err(Fail::input(format!(
            "{}: a plain storage has no indexes",
            a.db.display()
        )));
    };
    let r = index.begin_read()?;
    if applied_record(&r).is_none() {
        return Err(Fail::input(format!(
            "storage `{}` is not an index (it has no applied-txn record)",
            a.index
        )));
    }
    let docs = db.root().begin_read()?;
    let limit = a.limit.unwrap_or(u64::MAX);
    let mut o = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    let mut n = 0u64;
    for e in r.prefix(&prefix)? {
        if n >= limit {
            break;
        }
        let (k, _) = e?;
        // The applied record (the key 0x00) decodes as no entry.
        let Some((_, key)) = omnibus::actors::decode_index_entry(k) else {
            continue;
        };
        let line = if a.keys {
            let mut m = serde_json::Map::new();
            json_bytes(&mut m, "key", key);
            serde_json::Value::Object(m).to_string() + "\n"
        } else {
            match docs.get(key)? {
                Some(v) => json_entry(key, v),
                None => continue,
            }
        };
        n += 1;
        if !out(&mut o, line.as_bytes())? {
            break;
        }
    }
    flush_out(&mut o)
}

fn applied_record(r: &ReadTransaction) -> Option<u64> {
    index_applied_txn(r).ok().flatten()
}

fn storage_stat(name: &str, s: &Storage, branch: bool) -> StorageStat {
    let st = s.stats();
    let applied = if branch {
        s.begin_read().ok().as_ref().and_then(applied_record)
    } else {
        None
    };
    StorageStat {
        name: name.to_string(),
        path: s.path().display().to_string(),
        last_committed_txn: st.last_committed_txn,
        last_flushed_txn: st.last_flushed_txn,
        entries: st.entries - u64::from(applied.is_some()),
        index_applied_txn: applied,
        pages_used: st.pages_used,
        pages_free: st.pages_free,
        data_file_bytes: st.data_file_bytes,
        allocated_bytes: st.allocated_bytes,
        unallocated_bytes: st.data_file_bytes.saturating_sub(st.allocated_bytes),
        holes_punched_since_open: st.holes_punched,
        journal_files: st.journal_files,
        scratch_pages: st.scratch_pages,
        scratch_bytes: st.scratch_bytes,
        // Informative: a table that cannot be read lists no reader.
        readers: s
            .readers()
            .unwrap_or_default()
            .into_iter()
            .map(|r| ReaderStat {
                pid: r.pid,
                txn: r.txn,
            })
            .collect(),
    }
}

fn named_storages(db: &Database) -> CliResult<Vec<(String, Storage)>> {
    let mut v = vec![(ROOT.to_string(), db.root())];
    for n in db.storages() {
        let s = db
            .storage(&n)
            .map_err(|e| Fail::from(e).context(format_args!("storage `{n}`")))?;
        v.push((n, s));
    }
    Ok(v)
}

/// `stat` of a plain storage (see [`is_plain_storage`]): its one storage, no database counters.
fn stat_plain(a: &StatArgs) -> CliResult {
    let s = open_plain(&a.db).map_err(|e| Fail::opening(e, &a.db))?;
    let st = storage_stat(PLAIN_STORAGE, &s, false);
    let (mode, mode_why) = omnibus::WriteMode::describe(&a.db);
    let mode_name = mode.map_or("auto", |m| m.name());
    let (jio, jio_why) = omnibus::JournalIo::describe(&a.db);
    let jio_name = jio.map_or("auto", |p| p.name());
    let io = omnibus::env::io_backend();
    if a.json {
        let v = json!({
            "db": a.db.display().to_string(),
            "plain_storage": true,
            "io": { "io_uring": io.io_uring, "reason": io.reason },
            "write_mode": { "mode": mode_name, "reason": mode_why },
            "journal_io": { "path": jio_name, "reason": jio_why },
            "storages": [st],
            "metrics": metrics_json(&s.metrics()),
        });
        println!("{v}");
        return Ok(());
    }
    println!(
        "storage {} (a plain storage, not a database: read as it is)",
        a.db.display()
    );
    println!("io path    {}", io.reason);
    println!("write mode {mode_name} ({mode_why})");
    println!("journal io {jio_name} ({jio_why})");
    print_storage_stat(&st);
    print_metrics(&s.metrics());
    Ok(())
}

/// [`omnibus::Metrics`] as a JSON object: counters, and each histogram's count, percentiles
/// and max (µs for `..._us`, records or pages for the others).
fn metrics_json(m: &omnibus::Metrics) -> serde_json::Value {
    let h = |s: &omnibus::HistogramSummary| json!({ "count": s.count, "p50": s.p50, "p90": s.p90, "p99": s.p99, "p999": s.p999, "max": s.max });
    json!({
        "commits": m.commits,
        "journal_batches": m.journal_batches,
        "journal_fdatasyncs": m.journal_fdatasyncs,
        "journal_bytes": m.journal_bytes,
        "journal_queue_depth": m.journal_queue_depth,
        "flushes": m.flushes,
        "flushed_bytes": m.flushed_bytes,
        "commit_us": h(&m.commit_us),
        "journal_batch_us": h(&m.journal_batch_us),
        "journal_batch_records": h(&m.journal_batch_records),
        "flush_us": h(&m.flush_us),
        "flush_pages": h(&m.flush_pages),
    })
}

/// The text form of [`metrics_json`]: two lines.
fn print_metrics(m: &omnibus::Metrics) {
    println!(
        "metrics (this open) {} commits, {} batches, {} fdatasyncs, {} journaled, {} flushes, {} flushed",
        m.commits,
        m.journal_batches,
        m.journal_fdatasyncs,
        fmt::bytes(m.journal_bytes),
        m.flushes,
        fmt::bytes(m.flushed_bytes)
    );
    println!(
        "  latency  commit p50 {} µs, p99 {} µs; flush p50 {} µs, max {} µs",
        m.commit_us.p50, m.commit_us.p99, m.flush_us.p50, m.flush_us.max
    );
}

fn print_storage_stat(s: &StorageStat) {
    println!("storage {}", s.name);
    println!(
        "  txn        committed {}, flushed {}",
        s.last_committed_txn, s.last_flushed_txn
    );
    println!("  entries    {}", s.entries);
    if let Some(t) = s.index_applied_txn {
        println!("  index      applied up to root txn {t}");
    }
    println!("  pages      {} used, {} free", s.pages_used, s.pages_free);
    println!(
        "  file       {} long, {} allocated, {} in holes; {} 1 MiB runs punched since open",
        fmt::bytes(s.data_file_bytes),
        fmt::bytes(s.allocated_bytes),
        fmt::bytes(s.unallocated_bytes),
        s.holes_punched_since_open
    );
    println!("  journals   {} files", s.journal_files);
    println!(
        "  scratch    {} pages ({}) unflushed",
        s.scratch_pages,
        fmt::bytes(s.scratch_bytes)
    );
    if s.readers.is_empty() {
        println!("  readers    none in other processes");
    } else {
        let list: Vec<String> = s
            .readers
            .iter()
            .map(|r| format!("pid {} at txn {}", r.pid, r.txn))
            .collect();
        println!(
            "  readers    {} in other processes: {}",
            s.readers.len(),
            list.join(", ")
        );
    }
}

pub fn stat(a: StatArgs) -> CliResult {
    crate::not_a_branch(&a.db)?;
    // Regression: a plain storage was refused ("no Indexes directory").
    if is_plain_storage(&a.db) {
        return stat_plain(&a);
    }
    let db = open_read(&a.db)?;
    let all: Vec<StorageStat> = named_storages(&db)?
        .iter()
        .enumerate()
        .map(|(i, (n, s))| storage_stat(n, s, i > 0))
        .collect();
    let d = db.stats();
    let io = omnibus::env::io_backend();
    let (mode, mode_why) = omnibus::WriteMode::describe(&a.db);
    let mode_name = mode.map_or("auto", |m| m.name());
    let (jio, jio_why) = omnibus::JournalIo::describe(&a.db);
    let jio_name = jio.map_or("auto", |p| p.name());
    if a.json {
        let v = json!({
            "db": a.db.display().to_string(),
            "io": { "io_uring": io.io_uring, "reason": io.reason },
            "damaged": db.damaged().iter().map(|(n, e)| json!({ "storage": n, "error": e.to_string() })).collect::<Vec<_>>(),
            "write_mode": { "mode": mode_name, "reason": mode_why },
            "journal_io": { "path": jio_name, "reason": jio_why },
            "storages": all,
            "database_since_open": {
                "storages": d.storages,
                "commits": d.commits,
                "batches": d.batches,
                "commits_per_batch": d.commits_per_batch,
                "journal_bytes": d.journal_bytes,
                "fdatasyncs": d.journal_fdatasyncs,
                "dir_fsyncs": d.dir_fsyncs,
                "links_made": d.links_made,
                "journal_files_live": d.journal_files_live,
            },
            "metrics": metrics_json(&db.metrics()),
        });
        println!("{v}");
        return Ok(());
    }
    println!("database {} ({} storages)", a.db.display(), all.len());
    println!("io path    {}", io.reason);
    for (n, e) in db.damaged() {
        println!("storage {n}: DAMAGED, left out: {e}");
    }
    println!("write mode {mode_name} ({mode_why})");
    println!("journal io {jio_name} ({jio_why})");
    for s in &all {
        print_storage_stat(s);
    }
    println!(
        "database (this open: recovery only) {} commits in {} batches ({:.1} per batch), {} fdatasyncs, {} directory fsyncs, {} links made, {} journal files live",
        d.commits, d.batches, d.commits_per_batch, d.journal_fdatasyncs, d.dir_fsyncs, d.links_made, d.journal_files_live
    );
    print_metrics(&db.metrics());
    Ok(())
}

/// Every storage of the database at `db` opened on its own (read-only), for `check` when the
/// database as a whole does not open: each storage that does not open either is an error.
fn open_each(db: &Path) -> CliResult<Vec<(String, Result<Storage, omnibus::Error>)>> {
    let opts = Options {
        read_only: true,
        create: false,
        ..Options::default()
    };
    let mut v = vec![(ROOT.to_string(), Storage::open(db, opts.clone()))];
    for (n, dir) in Database::branch_dirs(db)? {
        let s = Storage::open(dir, opts.clone());
        v.push((n, s));
    }
    Ok(v)
}

pub fn check(a: CheckArgs) -> CliResult {
    crate::not_a_branch(&a.db)?;
    let mut bad_storages = 0;
    let mut problems = 0;
    let mut reports = Vec::new();
    // Why the database as a whole did not open, if it did not.
    let mut db_error = None;
    let storages: Vec<(String, Result<Storage, omnibus::Error>)> = if is_plain_storage(&a.db) {
        // Regression: a plain storage was refused ("no Indexes directory").
        // It is checked as it is: opened read-only, never made a database.
        vec![(PLAIN_STORAGE.to_string(), open_plain(&a.db))]
    } else {
        match open_read(&a.db) {
            Ok(db) => {
                let mut v: Vec<(String, Result<Storage, omnibus::Error>)> = named_storages(&db)?
                    .into_iter()
                    .map(|(n, s)| (n, Ok(s)))
                    .collect();
                // Branches the database opened without, because they are damaged.
                v.extend(db.damaged().into_iter().map(|(n, e)| (n, Err(e))));
                v
            }
            Err(f) if f.code == 2 => {
                // Something is damaged: open each storage on its own to say which.
                db_error = Some(f.msg);
                open_each(&a.db)?
            }
            Err(f) => return Err(f),
        }
    };
    // A plain storage's directory that is no storage at all is the same input error (exit 1)
    // as for every other command, before `--storage` is looked at. Regression: a directory
    // holding someone else's `data.pages` was "CORRUPT" (exit 2) to `check` and "not an
    // omnibus storage" (exit 1) to the other commands.
    let mut storages = storages;
    if matches!(
        storages.as_slice(),
        [(n, Err(omnibus::Error::NotAStorage { .. }))] if n == PLAIN_STORAGE
    ) {
        if let Some((_, Err(e))) = storages.pop() {
            return Err(Fail::opening(e, &a.db));
        }
    }
    // Storages whose check found nothing: the index cross-check reads them.
    let mut sound: Vec<(String, Storage)> = Vec::new();
    if let Some(only) = &a.storage {
        if !storages.iter().any(|(n, _)| n == only) {
            let names: Vec<&str> = storages.iter().map(|(n, _)| n.as_str()).collect();
            return Err(Fail::input(format!(
                "no storage named `{only}` in {}; its storages: {}",
                a.db.display(),
                quoted(&names)
            )));
        }
        // The documents stay at hand, unchecked, for the cross-check of a named index.
        let (keep, rest): (Vec<_>, Vec<_>) = storages.into_iter().partition(|(n, _)| n == only);
        if only != ROOT {
            if let Some((n, Ok(root))) = rest.into_iter().find(|(n, _)| n == ROOT) {
                sound.push((n, root));
            }
        }
        storages = keep;
    }
    for (name, s) in storages {
        let s = match s {
            // A root that, opened alone, is no storage at all: the input error of every
            // command (a plain storage's directory is answered so before `--storage`).
            Err(e @ omnibus::Error::NotAStorage { .. }) if name == ROOT && db_error.is_some() => {
                return Err(Fail::opening(e, &a.db));
            }
            Ok(s) => s,
            Err(e) => {
                // Regression: a data file the user may not read (EACCES) was "CORRUPT (does not
                // open)"; the cause is named, and only damage is called corrupt.
                let verdict = open_failure_verdict(&e);
                let f = Fail::from(e);
                eprintln!("omnibus: storage `{name}`: {}", f.msg);
                bad_storages += 1;
                problems += 1;
                if a.json {
                    reports.push(json!({ "storage": name, "ok": false, "open_error": f.msg, "cause": verdict }));
                } else {
                    println!("{name}: {} (does not open)", verdict.to_uppercase());
                }
                continue;
            }
        };
        let mut r = s
            .check()
            .map_err(|e| Fail::from(e).context(format_args!("checking storage `{name}`")))?;
        // An index's applied-txn record is not an entry (as in `stat` and `ingest`).
        if name != ROOT
            && s.begin_read()
                .ok()
                .as_ref()
                .and_then(applied_record)
                .is_some()
        {
            r.entries = r.entries.saturating_sub(1);
        }
        if !r.is_ok() {
            bad_storages += 1;
            problems += r.problems.len();
            for p in &r.problems {
                let page = p.page.map(|n| format!(" page {n}")).unwrap_or_default();
                let off = p.offset.map(|n| format!(" offset {n}")).unwrap_or_default();
                eprintln!(
                    "omnibus: storage `{name}`: corruption in {}{page}{off}: {}",
                    p.file.display(),
                    p.what
                );
            }
            // The pages the damage hides: one line, not one "leaked" line per page.
            if let Some(h) = &r.hidden {
                eprintln!("omnibus: storage `{name}`: {h}");
            }
        }
        // Regression: a flipped byte in a header page printed "ok" and
        // nothing else. Its twin holds the same header, so nothing is lost and the exit code
        // stays 0 (a crash during a flush can tear a slot too), but it is said.
        for slot in &r.header_slots_damaged {
            eprintln!(
                "omnibus: storage `{name}`: warning: header page {slot} is damaged or torn; its \
                 twin is intact (nothing lost); a read-write open rewrites it"
            );
        }
        if !r.free_space_checked {
            eprintln!(
                "omnibus: storage `{name}`: a writer holds it: the tree is checked, its free-space \
                 map and header pages are not (the writer updates them in place)"
            );
        }
        if a.json {
            reports.push(json!({
                "storage": name,
                "ok": r.is_ok(),
                "free_space_checked": r.free_space_checked,
                "opened_alone": db_error.is_some(),
                "header_slots_damaged": r.header_slots_damaged,
                "txn_id": r.txn_id,
                "entries": r.entries,
                "pages_checked": r.pages_checked,
                "pages_in_use": r.pages_in_use,
                "pages_free": r.pages_free,
                "depth": r.depth,
                "problems": r.problems.iter().map(|p| json!({
                    "file": p.file.display().to_string(), "page": p.page, "offset": p.offset, "what": p.what
                })).collect::<Vec<_>>(),
                "hidden": r.hidden.as_ref().map(|h| json!({
                    "damaged": h.damaged, "pages": h.pages, "first": h.first, "last": h.last,
                    "entries_not_counted": h.entries_not_counted, "summary": h.to_string(),
                })),
            }));
        } else {
            println!(
                "{name}: {} ({} entries, {} pages checked, {} in use, {} free, depth {})",
                match (r.is_ok(), db_error.is_some()) {
                    (false, _) => "CORRUPT",
                    (true, false) => "ok",
                    // Regression: with the shared journal cut, the database
                    // failed and each branch opened on its own said plain "ok", although its
                    // unflushed commits were in the damaged file. Alone, it cannot know.
                    (true, true) => "ok by its own files (opened alone: the database does not open, see the error on stderr; if that damage is in the shared journal, it may hide this storage's unflushed commits)",
                },
                r.entries,
                r.pages_checked,
                r.pages_in_use,
                r.pages_free,
                r.depth
            );
        }
        if r.is_ok() {
            sound.push((name, s));
        }
    }
    let storage_problems = problems;
    let mut index_reports = Vec::new();
    check_indexes(&a.db, &sound, a.json, &mut index_reports, &mut problems);
    let index_problems = problems - storage_problems;
    // The database-level error is printed only when no storage's own error explains it (it
    // repeats one of them otherwise).
    if let (Some(msg), 0) = (&db_error, bad_storages) {
        eprintln!("omnibus: {msg}");
        problems += 1;
    }
    if a.json {
        println!(
            "{}",
            json!({ "db": a.db.display().to_string(), "ok": problems == 0, "storages": reports, "indexes": index_reports })
        );
    }
    if problems > 0 {
        // Where they are: damaged storages, index cross-checks, the database's own files.
        let plural = |n: usize| if n == 1 { "" } else { "s" };
        let mut at = Vec::new();
        if bad_storages > 0 {
            at.push(format!("{bad_storages} storage{}", plural(bad_storages)));
        }
        if index_problems > 0 {
            at.push(format!("{index_problems} in index cross-checks"));
        }
        if problems > storage_problems + index_problems {
            at.push("the database's own files".to_string());
        }
        return Err(Fail::io(format!(
            "{problems} problem{} in {} ({})",
            plural(problems),
            a.db.display(),
            at.join(", ")
        )));
    }
    Ok(())
}

/// What `check` calls a storage that does not open, by the error's kind: `corrupt` (damage
/// found in its files), `unreadable` (an I/O error: no permission, a failing device),
/// `not a storage` (a branch directory whose files are not omnibus's), or `failed` (anything
/// else, e.g. a version this build does not read).
fn open_failure_verdict(e: &omnibus::Error) -> &'static str {
    use omnibus::Error as E;
    match e {
        E::Corruption(_) => "corrupt",
        E::Io { .. } => "unreadable",
        E::NotAStorage { .. } => "not a storage",
        _ => "failed",
    }
}

/// Examples of each kind of index difference that `check` prints.
const INDEX_EXAMPLES: usize = 5;

/// `check`'s index cross-check: every sound branch storage holding an applied record is an
/// index; one that `ingest --index` defined (listed in the database's
/// [`crate::index_spec::CLI_INDEXES_FILE`]) has its spec as its name, and is checked against
/// the sound root storage with
/// [`omnibus::actors::check_index`] (both walked in key order: bounded memory). Differences of
/// an index in step with the documents are problems; an index behind them is only reported.
fn check_indexes(
    db: &Path,
    sound: &[(String, Storage)],
    json_out: bool,
    reports: &mut Vec<serde_json::Value>,
    problems: &mut usize,
) {
    let cli = crate::index_spec::recorded(db);
    let Some((_, root)) = sound.iter().find(|(n, _)| n == ROOT) else {
        return;
    };
    for (name, s) in sound.iter().filter(|(n, _)| n != ROOT) {
        let (Ok(docs), Ok(index)) = (root.begin_read(), s.begin_read()) else {
            continue;
        };
        if applied_record(&index).is_none() {
            continue; // not an index
        }
        // Regression: indexes a program defined (`tags`, with its own map
        // function) were cross-checked as the command line's `--index tags`, and a healthy
        // database failed with thousands of "stale entries".
        if !cli.contains(name) {
            if !json_out {
                println!(
                    "index `{name}`: not cross-checked (not defined by `ingest --index`: its map \
                     function is a program's)"
                );
            }
            reports.push(json!({ "index": name, "checked": false, "reason": "not defined by ingest --index" }));
            continue;
        }
        let Ok(spec) = crate::index_spec::IndexSpec::parse(name) else {
            if !json_out {
                println!("index `{name}`: not checked (its name is not an `--index` spec)");
            }
            continue;
        };
        let r =
            match omnibus::actors::check_index(&docs, &index, &spec.definition(), INDEX_EXAMPLES) {
                Ok(r) => r,
                Err(e) => {
                    *problems += 1;
                    let f = Fail::from(e);
                    eprintln!("omnibus: index `{name}`: cross-check failed: {}", f.msg);
                    reports.push(json!({ "index": name, "ok": false, "error": f.msg }));
                    continue;
                }
            };
        let wrong = r.in_step && !r.is_ok();
        if wrong {
            *problems += 1;
            let kinds: [(&str, &Vec<Vec<u8>>); 3] = [
                ("missing entry", &r.missing_examples),
                ("entry without document", &r.without_document_examples),
                ("stale entry", &r.stale_examples),
            ];
            eprintln!(
                "omnibus: index `{name}`: {} missing entries ({} documents missing from it), {} entries without document, {} stale entries (their document no longer gives them)",
                r.missing_entries, r.documents_missing, r.entries_without_document, r.stale_entries
            );
            for (kind, examples) in kinds {
                for e in examples {
                    eprintln!("omnibus: index `{name}`: {kind}: {}", fmt::escape(e));
                }
            }
        }
        let applied = r.applied_txn.unwrap_or(0);
        if json_out {
            reports.push(json!({
                "index": name,
                "ok": !wrong,
                "in_step": r.in_step,
                "applied_txn": r.applied_txn,
                "documents_txn": r.documents_txn,
                "documents": r.documents,
                "entries": r.entries,
                "expected_entries": r.expected_entries,
                "missing_entries": r.missing_entries,
                "documents_missing": r.documents_missing,
                "entries_without_document": r.entries_without_document,
                "stale_entries": r.stale_entries,
                "missing_examples": r.missing_examples.iter().map(|k| fmt::escape(k)).collect::<Vec<_>>(),
                "without_document_examples": r.without_document_examples.iter().map(|k| fmt::escape(k)).collect::<Vec<_>>(),
                "stale_examples": r.stale_examples.iter().map(|k| fmt::escape(k)).collect::<Vec<_>>(),
            }));
        } else if !r.in_step {
            println!(
                "index `{name}`: behind the documents (applied txn {applied}, documents at txn {}): {} differences not judged; `ingest --index {name}` reconciles it",
                r.documents_txn,
                r.differences()
            );
        } else {
            println!(
                "index `{name}`: {} ({} documents, {} entries, {} differences)",
                if wrong { "WRONG" } else { "ok" },
                r.documents,
                r.entries,
                r.differences()
            );
        }
    }
}

/// `backup DB DEST`: [`Database::backup`] (or [`Storage::backup`] for a plain storage) of a
/// read-only open. Damaged branches are not copied: each is named on stderr and the exit code
/// is 2.
pub fn backup(a: BackupArgs) -> CliResult {
    crate::not_a_branch(&a.db)?;
    if !crate::db_dir(&a.db)? {
        return Err(Fail::input(format!("{}: no such database", a.db.display())));
    }
    // The copy's directory is created, not its parents: a missing parent is a mistyped path.
    if let Some(parent) = a.dest.parent().filter(|p| !p.as_os_str().is_empty()) {
        if !parent.is_dir() {
            return Err(Fail::input(format!(
                "{}: its parent directory {} does not exist",
                a.dest.display(),
                parent.display()
            )));
        }
    }
    let fail = |e: omnibus::Error| {
        let code = match e {
            omnibus::Error::DestinationNotEmpty { .. }
            | omnibus::Error::DestinationInsideSource { .. } => 1,
            _ => 2,
        };
        Fail {
            code,
            msg: format!("backup of {} to {}: {e}", a.db.display(), a.dest.display()),
        }
    };
    let (report, damaged) = if is_plain_storage(&a.db) {
        let s = open_plain(&a.db).map_err(|e| Fail::opening(e, &a.db))?;
        (s.backup(&a.dest).map_err(fail)?, Vec::new())
    } else {
        let db = open_read(&a.db)?;
        // Buffered index entries go into the copy's journals: no writer is needed, beside a
        // writer process or not.
        let report = db.backup(&a.dest).map_err(fail)?;
        // The indexes `ingest --index` defined, for `check` on the copy (those copied).
        let copied = db.storages();
        let specs: Vec<String> = crate::index_spec::recorded(&a.db)
            .into_iter()
            .filter(|n| copied.contains(n))
            .collect();
        if !specs.is_empty() {
            crate::index_spec::record(&a.dest, &specs).map_err(|e| {
                Fail::io(format!(
                    "the copy is complete, but recording its indexes in {} failed: {e}",
                    a.dest.join(crate::index_spec::CLI_INDEXES_FILE).display()
                ))
            })?;
        }
        (report, db.damaged())
    };
    if a.json {
        let v = json!({
            "db": a.db.display().to_string(),
            "dest": a.dest.display().to_string(),
            "txn_id": report.txn_id,
            "storages": report.storages,
            "entries": report.entries,
            "pages_written": report.pages_written,
            "data_file_bytes": report.data_file_bytes,
            "not_copied": damaged.iter().map(|(n, e)| json!({ "storage": n, "error": e.to_string() })).collect::<Vec<_>>(),
        });
        println!("{v}");
    } else {
        println!(
            "backed up {} storage{} ({} keys, txn {}) into {}: {} pages written, data files {}",
            report.storages,
            if report.storages == 1 { "" } else { "s" },
            report.entries,
            report.txn_id,
            a.dest.display(),
            report.pages_written,
            fmt::bytes(report.data_file_bytes),
        );
    }
    if damaged.is_empty() {
        return Ok(());
    }
    for (name, e) in &damaged {
        eprintln!("not copied: {name}, damaged: {e}");
    }
    Err(Fail::io(format!(
        "{} damaged storage{} not copied (named above)",
        damaged.len(),
        if damaged.len() == 1 { " was" } else { "s were" }
    )))
}

/// Why compaction of a storage was skipped or stopped early, when it was: readers in other
/// processes hold slots of its reader table ([`omnibus::CompactReport::skipped_for_readers`]).
fn skipped_reason(r: &omnibus::CompactReport) -> Option<String> {
    (r.skipped_for_readers > 0).then(|| {
        format!(
            "skipped: {} read-only opener{} in other processes hold{} reader slots; the pages a reader may read are never reused, so moving pages would only grow the file: run compact again once {} closed",
            r.skipped_for_readers,
            if r.skipped_for_readers == 1 { "" } else { "s" },
            if r.skipped_for_readers == 1 { "s" } else { "" },
            if r.skipped_for_readers == 1 { "it has" } else { "they have" },
        )
    })
}

/// `omnibus compact DB`: [`Database::compact`] (or [`Storage::compact`] of a plain storage),
/// one line per storage and the totals (or one JSON object).
pub fn compact(a: CompactArgs) -> CliResult {
    crate::not_a_branch(&a.db)?;
    if !crate::db_dir(&a.db)? {
        return Err(Fail::input(format!("{}: no such database", a.db.display())));
    }
    let fail = |e: omnibus::Error| Fail {
        code: 2,
        msg: format!("compaction of {}: {e}", a.db.display()),
    };
    let started = std::time::Instant::now();
    let reports = if is_plain_storage(&a.db) {
        let opts = Options {
            create: false,
            ..Options::default()
        };
        let s = Storage::open(&a.db, opts).map_err(|e| Fail::opening(e, &a.db))?;
        let r = s.compact().map_err(fail)?;
        s.close().map_err(fail)?;
        vec![(String::new(), r)]
    } else {
        let db = open_write(&a.db, false)?;
        let r = db.compact().map_err(fail)?;
        db.close().map_err(fail)?;
        r
    };
    let secs = started.elapsed().as_secs_f64();
    let sum =
        |f: fn(&omnibus::CompactReport) -> u64| reports.iter().map(|(_, r)| f(r)).sum::<u64>();
    let (moved, before, after) = (
        sum(|r| r.pages_moved),
        sum(|r| r.data_file_bytes_before),
        sum(|r| r.data_file_bytes_after),
    );
    let (disk_before, disk_after) = (
        sum(|r| r.allocated_bytes_before),
        sum(|r| r.allocated_bytes_after),
    );
    // Named as `check` and `stat` name them: `(storage)` for a plain storage.
    let plain = is_plain_storage(&a.db);
    let name = |n: &str| match (n.is_empty(), plain) {
        (true, true) => PLAIN_STORAGE.to_string(),
        (true, false) => ROOT.to_string(),
        (false, _) => n.to_string(),
    };
    if a.json {
        let v = json!({
            "db": a.db.display().to_string(),
            "seconds": secs,
            "pages_moved": moved,
            "data_file_bytes_before": before,
            "data_file_bytes_after": after,
            "allocated_bytes_before": disk_before,
            "allocated_bytes_after": disk_after,
            "storages": reports.iter().map(|(n, r)| json!({
                "storage": name(n),
                "pages_moved": r.pages_moved,
                "passes": r.passes,
                "data_file_bytes_before": r.data_file_bytes_before,
                "data_file_bytes_after": r.data_file_bytes_after,
                "allocated_bytes_before": r.allocated_bytes_before,
                "allocated_bytes_after": r.allocated_bytes_after,
                "truncated": r.truncated,
                "skipped_for_readers": r.skipped_for_readers,
                "skipped_reason": skipped_reason(r),
            })).collect::<Vec<_>>(),
        });
        println!("{v}");
        return Ok(());
    }
    for (n, r) in &reports {
        println!(
            "{}: {} pages moved in {} pass{}; data file {} -> {}, on disk {} -> {}",
            name(n),
            r.pages_moved,
            r.passes,
            if r.passes == 1 { "" } else { "es" },
            fmt::bytes(r.data_file_bytes_before),
            fmt::bytes(r.data_file_bytes_after),
            fmt::bytes(r.allocated_bytes_before),
            fmt::bytes(r.allocated_bytes_after),
        );
        if let Some(why) = skipped_reason(r) {
            println!("{}: {why}", name(n));
        }
    }
    println!(
        "compacted {} storage{} in {secs:.2} s: {moved} pages moved; data files {} -> {}, on disk {} -> {}",
        reports.len(),
        if reports.len() == 1 { "" } else { "s" },
        fmt::bytes(before),
        fmt::bytes(after),
        fmt::bytes(disk_before),
        fmt::bytes(disk_after),
    );
    Ok(())
}
