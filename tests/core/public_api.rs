//! The public surface (docs/ARCHITECTURE.md, "Public surface"), pinned from both sides.
//!
//! Story: every module of the crate was once public, so page layouts, journal records, recovery, `PreparedCommit`, `Storage::poison`, `seal`, ... were public API
//! (168 items in 22 public modules by rustdoc's count) that users could come to rely on and
//! that could not change without breaking them. Internals are now crate-private, the test
//! storage environments sit behind the `testing` feature, and this file keeps it that way:
//!
//! - `every_intended_item_is_public` names every intended public item, and pins the main
//!   methods' signatures with function pointers: dropping or renaming one breaks the build.
//! - `no_internal_module_or_export_is_public` compares the public declarations of the three
//!   files that make the surface (`src/lib.rs`, `src/env/mod.rs`, `actors/mod.rs`) with the
//!   list below: making an internal module public again (`pub mod page;`) or re-exporting one
//!   more item fails until this list and ARCHITECTURE.md are updated on purpose. (A type that
//!   leaks through a public signature without being exported is caught by
//!   `#![warn(unnameable_types)]` in src/lib.rs.)
//! - `small_public_helpers_work` runs the helpers the command line uses instead of internals.

use std::path::{Path, PathBuf};

// Every intended public item, by path. Unused imports are fine: naming them is the check.
#[allow(unused_imports)]
use omnibus::actors::{
    check_index, index_applied_txn, BuildProgress, DatabaseHandle, DatabaseMetrics, Engine,
    EngineMetrics, EngineOptions, IndexCheckReport, IndexDefinition, IndexMode, IndexState,
    IndexStats, LagStats, MapFn, ReadPath, StorageHandle, WriteBatch, WriteOp, INDEX_APPLIED_KEY,
    MEMLOCK_PER_EXECUTOR,
};
#[allow(unused_imports)]
use omnibus::env::{
    default_env, io_backend, DefaultEnv, EnvError, EnvFile, EnvResult, IoBackend, OpenMode, Run,
    StorageEnv, UringEnv,
};
#[allow(unused_imports)]
use omnibus::{
    BackupReport, CheckReport, CompactReport, Corruption, Database, DatabaseStats, Durability,
    Error, FlushMode, FlushReport, GroupError, GroupTransaction, HiddenPages, HistogramSummary,
    IndexFailure, JournalIo, JournalMode, JournalStats, KeyRange, Metrics, Options, Prezero, Range,
    ReadTransaction, ReaderInfo, Result, Storage, StorageStats, WriteMode, WriteTransaction,
    DEFAULT_WRITE_BUFFER_BYTES, MAX_GROUP_BYTES, MAX_GROUP_STORAGES, MAX_KEY_LEN, MAX_VALUE_LEN,
    PAGE_SIZE,
};

#[test]
fn every_intended_item_is_public() {
    // Signatures of the main entry points: a change of one is a change of the public API.
    let _: fn(PathBuf, Options) -> Result<Storage> = Storage::open;
    let _: fn(PathBuf) -> bool = Storage::exists;
    let _: fn(&Storage) -> Result<WriteTransaction> = Storage::begin_write;
    let _: fn(&Storage) -> Result<WriteTransaction> = Storage::try_begin_write;
    let _: fn(&Storage) -> Result<ReadTransaction> = Storage::begin_read;
    let _: fn(&Storage) -> Result<FlushReport> = Storage::flush;
    let _: fn(&Storage, PathBuf) -> Result<BackupReport> = Storage::backup;
    let _: fn(&Storage) -> Result<CompactReport> = Storage::compact;
    let _: fn(&Storage) -> Result<()> = Storage::sync_journal;
    let _: fn(&Storage) -> (WriteMode, String) = Storage::write_mode;
    let _: fn(&Storage) -> (JournalIo, String) = Storage::journal_io;
    let _: fn(&Storage) -> StorageStats = Storage::stats;
    let _: fn(&Storage) -> Metrics = Storage::metrics;
    let _: fn(&Storage) -> Result<CheckReport> = Storage::check;
    let _: fn(&Storage) -> Result<u64> = Storage::catch_up;
    let _: fn(&Storage) -> Result<Vec<ReaderInfo>> = Storage::readers;
    let _: fn(&Storage) -> Result<usize> = Storage::clear_dead_readers;
    let _: fn(Storage) -> Result<()> = Storage::close;
    let _: fn(&Storage) -> bool = Storage::flush_due;
    let _: fn(&Storage) -> bool = Storage::is_poisoned;
    let _: fn(&Storage) -> u64 = Storage::unflushed_bytes;
    let _: fn(&Storage) -> u64 = Storage::scratch_bytes;
    let _: fn(&Storage) -> u64 = Storage::storage_id;

    let _: fn(PathBuf, Options) -> Result<Database> = Database::open;
    let _: fn(&str) -> Result<()> = Database::validate_storage_name;
    let _: fn(PathBuf) -> bool = Database::exists;
    type Branches = Vec<(String, PathBuf)>;
    let _: fn(PathBuf) -> Result<Branches> = Database::branch_dirs;
    let _: fn(&Database) -> Storage = Database::root;
    let _: fn(&Database, &str) -> Result<Storage> = Database::storage;
    let _: fn(&Database, &str) -> Result<Storage> = Database::create_storage;
    let _: fn(&Database, &str) -> Result<()> = Database::drop_storage;
    let _: fn(&Database) -> Vec<String> = Database::storages;
    let _: fn(&Database) -> Vec<(String, Error)> = Database::damaged;
    let _: fn(&Database, &[&Storage]) -> Result<GroupTransaction> = Database::begin_group;
    let _: fn(&Database, &[&Storage]) -> Result<GroupTransaction> = Database::try_begin_group;
    let _: fn(GroupTransaction) -> Result<()> = GroupTransaction::commit;
    let _: fn(&mut GroupTransaction, Durability) = GroupTransaction::set_durability;
    let _: fn(&Database, PathBuf) -> Result<BackupReport> = Database::backup;
    let _: fn(&Database) -> Result<u64> = Database::catch_up;
    let _: fn(&Database) -> DatabaseStats = Database::stats;
    let _: fn(&Database) -> Metrics = Database::metrics;
    let _: fn(&Database) -> Result<FlushReport> = Database::flush;
    let _: fn(Database) -> Result<()> = Database::close;

    let _: fn(&mut WriteTransaction, Durability) = WriteTransaction::set_durability;
    let _: fn(&mut WriteTransaction, Vec<u8>, Vec<u8>) -> Result<()> = WriteTransaction::put;
    let _: fn(&mut WriteTransaction, Vec<u8>) -> Result<bool> = WriteTransaction::delete;
    let _: fn(&mut WriteTransaction) -> Result<u64> = WriteTransaction::clear;
    let _: fn(WriteTransaction) -> Result<()> = WriteTransaction::commit;
    let _: fn(WriteTransaction) = WriteTransaction::abort;
    let _: fn(&ReadTransaction) -> u64 = ReadTransaction::txn_id;

    let _: fn(&Path) -> (Option<WriteMode>, String) = WriteMode::describe;
    let _: fn(&Path) -> (Option<JournalIo>, String) = JournalIo::describe;
    let _: fn() -> std::sync::Arc<dyn StorageEnv> = default_env;
    let _: fn() -> IoBackend = io_backend;
    let _: fn() -> std::io::Result<UringEnv> = UringEnv::new;
    let _: fn() -> DefaultEnv = DefaultEnv::new;
    let _: fn(EngineOptions) -> Result<Engine> = Engine::start;
    let _: fn(&Engine) -> EngineMetrics = Engine::metrics;
    let _: fn(&DatabaseHandle) -> DatabaseMetrics = DatabaseHandle::metrics;
    type Keys = Result<Vec<Vec<u8>>>;
    type Pairs = Result<Vec<(Vec<u8>, Vec<u8>)>>;
    type TermBound<'a> = std::ops::Bound<&'a [u8]>;
    let _: fn(&DatabaseHandle, &str, &[u8]) -> Keys = |d, i, t| d.blocking_query(i, t);
    let _: fn(&DatabaseHandle, &str, &[u8]) -> Result<u64> = |d, i, t| d.blocking_query_count(i, t);
    let _: fn(&DatabaseHandle, &str, &[u8]) -> Pairs = |d, i, t| d.blocking_query_documents(i, t);
    let _: fn(&DatabaseHandle, &str, TermBound, TermBound, usize) -> Pairs =
        DatabaseHandle::blocking_query_terms;
    let _: HistogramSummary = Metrics::default().commit_us;
    let _: fn(&ReadTransaction) -> Result<Option<u64>> = index_applied_txn;

    // Constants keep their documented values.
    assert_eq!(MAX_KEY_LEN, 1024);
    assert_eq!(MAX_VALUE_LEN, 128 << 20);
    assert_eq!(PAGE_SIZE, 8192);
    assert_eq!(
        Options::default().write_buffer_bytes,
        DEFAULT_WRITE_BUFFER_BYTES
    );
    assert_eq!(INDEX_APPLIED_KEY, &[0u8][..]);
    // Options are plain data a user builds, with the enums it takes.
    let o = Options {
        flush_mode: FlushMode::Manual,
        journal_mode: JournalMode::Shared,
        journal_prezero: Prezero::default(),
        write_mode: WriteMode::Auto,
        journal_io: JournalIo::Auto,
        ..Options::default()
    };
    o.validate().unwrap();
    assert_eq!(Durability::default(), Durability::Immediate);
}

/// The top-level public declarations of one source file (lines starting with `pub ` at the
/// first column: `pub mod`, `pub use`, `pub fn`, `pub struct`, ...; unit tests are indented and
/// `pub(crate)` is no `pub `), whitespace collapsed, in order. A `use` or `mod` ends at `;`,
/// anything else at its first `{` or `;`.
fn public_declarations(rel: &str) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    let src = std::fs::read_to_string(&path).unwrap();
    let mut out = Vec::new();
    let mut cur: Option<String> = None;
    for line in src.lines() {
        let t = line.trim();
        match cur.as_mut() {
            Some(c) => {
                c.push(' ');
                c.push_str(t);
            }
            None if line.starts_with("pub ") => cur = Some(t.to_string()),
            None => continue,
        }
        let c = cur.take().unwrap();
        let is_use = c.starts_with("pub use ") || c.starts_with("pub mod ");
        if c.ends_with(';') || (!is_use && c.ends_with('{')) {
            out.push(c.split_whitespace().collect::<Vec<_>>().join(" "));
        } else {
            cur = Some(c);
        }
    }
    out
}

#[test]
fn no_internal_module_or_export_is_public() {
    let expected: [(&str, &[&str]); 3] = [
        (
            "src/lib.rs",
            &[
                "pub mod env;",
                "pub mod fuzzing;",
                "pub mod testing;",
                "pub mod actors;",
                "pub use backup::BackupReport;",
                "pub use btree::{CheckReport, HiddenPages, KeyRange, Range};",
                "pub use buffer::live_buffer_bytes;",
                "pub use database::{Database, DatabaseStats};",
                "pub use env::{JournalIo, WriteMode};",
                "pub use error::{Corruption, Error, GroupError, IndexFailure, Result};",
                "pub use group::{GroupTransaction, MAX_GROUP_BYTES, MAX_GROUP_STORAGES};",
                "pub use journal::{JournalStats, Prezero};",
                "pub use metrics::{HistogramSummary, Metrics};",
                "pub use options::{Durability, FlushMode, JournalMode, Options, DEFAULT_WRITE_BUFFER_BYTES};",
                "pub use page::{live_image_bytes, peak_image_bytes, reset_peak_image_bytes};",
                "pub use storage::{CompactReport, FlushReport, ReaderInfo, Storage, StorageStats};",
                "pub use txn::{ReadTransaction, WriteTransaction};",
                "pub const MAX_KEY_LEN: usize = 1024;",
                "pub const MAX_VALUE_LEN: usize = 128 << 20;",
                "pub const PAGE_SIZE: usize = page::PAGE_SIZE;",
            ],
        ),
        (
            "src/env/mod.rs",
            &[
                "pub mod testing;",
                "pub use default::DefaultEnv;",
                "pub use uring::UringEnv;",
                "pub struct EnvError {",
                "pub type EnvResult<T> = std::result::Result<T, EnvError>;",
                "pub enum OpenMode {",
                "pub enum WriteMode {",
                "pub enum JournalIo {",
                "pub type Run<'a> = (u64, &'a [IoSlice<'a>]);",
                "pub trait EnvFile: Send + Sync + std::fmt::Debug {",
                "pub trait StorageEnv: Send + Sync + std::fmt::Debug + 'static {",
                "pub struct IoBackend {",
                "pub fn default_env() -> Arc<dyn StorageEnv> {",
                "pub fn io_backend() -> IoBackend {",
            ],
        ),
        (
            "actors/mod.rs",
            &[
                "pub use engine::metrics::{DatabaseMetrics, EngineMetrics};",
                "pub use engine::{DatabaseHandle, Engine, EngineOptions, MEMLOCK_PER_EXECUTOR};",
                "pub use index::{ index_applied_txn, BuildProgress, IndexDefinition, IndexMode, \
                 IndexState, IndexStats, LagStats, MapFn, INDEX_APPLIED_KEY, };",
                "pub use index_check::{check_index, IndexCheckReport};",
                "pub use index_key::{ decode_index_entry, index_entry_key, index_term_prefix, \
                 index_terms_starting_with, };",
                "pub use messages::{ReadPath, WriteBatch, WriteOp};",
                "pub use placement::allowed_cpus;",
                "pub use range_stream::{RangeIter, RangeStream, CHUNK_BYTES, CHUNK_ENTRIES};",
                "pub use storage::{cold_reads, StorageHandle};",
                "pub use update::UpdateTransaction;",
            ],
        ),
    ];
    for (file, want) in expected {
        let got = public_declarations(file);
        assert_eq!(
            got, want,
            "{file}: the public surface changed. If on purpose, update this list and the \
             \"Public surface\" section of docs/ARCHITECTURE.md; internals stay pub(crate) or \
             go to `omnibus::testing` (feature `testing`)"
        );
    }
}

#[test]
fn small_public_helpers_work() {
    let d = tempfile::tempdir().unwrap();
    let opts = || Options {
        flush_mode: FlushMode::Manual,
        ..Options::default()
    };

    // A plain storage: a storage, not a database, no branches.
    let plain = d.path().join("plain");
    assert!(!Storage::exists(&plain));
    Storage::open(&plain, opts()).unwrap().close().unwrap();
    assert!(Storage::exists(&plain));
    assert!(!Database::exists(&plain));
    assert!(Database::branch_dirs(&plain).unwrap().is_empty());

    // A database with two branches: listed sorted, each a storage that opens standalone; a
    // dropped one is not listed.
    let db_dir = d.path().join("db");
    let db = Database::open(&db_dir, opts()).unwrap();
    for n in ["b", "a", "gone"] {
        db.create_storage(n).unwrap();
    }
    db.drop_storage("gone").unwrap();
    db.close().unwrap();
    assert!(Storage::exists(&db_dir) && Database::exists(&db_dir));
    let branches = Database::branch_dirs(&db_dir).unwrap();
    let names: Vec<&str> = branches.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
    for (_, dir) in &branches {
        assert!(Storage::exists(dir));
        let s = Storage::open(
            dir,
            Options {
                read_only: true,
                create: false,
                ..opts()
            },
        )
        .unwrap();
        assert!(s.check().unwrap().is_ok());
    }

    // Names: the rules create_storage applies, without opening anything.
    Database::validate_storage_name("by_city").unwrap();
    for bad in ["", ".", "..", "a/b", ".dropped-x"] {
        assert!(matches!(
            Database::validate_storage_name(bad),
            Err(Error::InvalidStorageName { .. })
        ));
    }

    // The write mode a read-only report shows: a mode and a reason, never a probe.
    let (mode, why) = WriteMode::describe(&db_dir);
    assert!(!why.is_empty());
    assert_ne!(mode, Some(WriteMode::Auto));
}

/// The public functions of the actor runtime's sources (`actors/`, every file): each one's
/// file, its signature up to its body (whitespace folded), and whether it is only built with
/// the `testing` feature (a `#[cfg(feature = "testing")]` among the attributes above it).
fn actor_pub_fns() -> Vec<(PathBuf, String, bool)> {
    fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, files);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("actors"),
        &mut files,
    );
    let mut out = Vec::new();
    for file in files {
        let src = std::fs::read_to_string(&file).unwrap();
        let lines: Vec<&str> = src.lines().map(str::trim).collect();
        for (i, l) in lines.iter().enumerate() {
            if !(l.starts_with("pub fn ") || l.starts_with("pub async fn ")) {
                continue;
            }
            let mut sig = String::new();
            for l in &lines[i..] {
                sig.push(' ');
                sig.push_str(l.split('{').next().unwrap_or(""));
                if l.contains('{') || l.ends_with(';') {
                    break;
                }
            }
            let testing = lines[..i]
                .iter()
                .rev()
                .take_while(|l| l.starts_with("#[") || l.starts_with("///"))
                .any(|l| *l == "#[cfg(feature = \"testing\")]");
            out.push((
                file.clone(),
                sig.split_whitespace().collect::<Vec<_>>().join(" "),
                testing,
            ));
        }
    }
    out
}

/// The names in the return type of signature `sig` (after the parameters' closing
/// parenthesis, up to a `where`).
fn return_type_names(sig: &str) -> Vec<String> {
    let open = sig.find('(').unwrap();
    let mut depth = 0;
    let mut close = open;
    for (i, c) in sig[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    close = open + i;
                    break;
                }
            }
            _ => {}
        }
    }
    let rest = &sig[close + 1..];
    let Some(ret) = rest.trim_start().strip_prefix("->") else {
        return Vec::new();
    };
    let ret = ret.split(" where ").next().unwrap_or(ret);
    ret.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

/// The actor runtime hands out no writable core `Storage` or `Database` (a write transaction
/// taken through one made every request of that storage's actor fail with `WriteInProgress`,
/// and root writes made through it skipped the index feed): no public function of `actors/`
/// returns one, except the `testing` feature's escape hatch for tests that write around the
/// engine on purpose.
#[test]
fn no_actor_handle_gives_out_the_writable_core() {
    let fns = actor_pub_fns();
    assert!(
        fns.iter()
            .any(|(_, s, _)| s.starts_with("pub async fn put")),
        "the scan found the handles' methods: {fns:?}"
    );
    let mut hatches = Vec::new();
    for (file, sig, testing) in &fns {
        let names = return_type_names(sig);
        if names.iter().any(|n| n == "Storage" || n == "Database") {
            assert!(
                *testing,
                "{}: `{sig}` gives out the writable core",
                file.display()
            );
            hatches.push(sig.clone());
        }
    }
    assert_eq!(
        hatches,
        ["pub fn core_database_for_tests(&self) -> &Database"],
        "the only escape hatch, behind the `testing` feature"
    );
    // The scan itself: a method that returned the core would be seen.
    assert_eq!(
        return_type_names(
            "pub fn storage(&self, f: impl Fn(u8) -> u8) -> Result<Storage> where X: Y"
        ),
        ["Result", "Storage"]
    );
    assert!(return_type_names("pub fn stats(&self) -> StorageStats")
        .iter()
        .all(|n| n != "Storage"));
}

/// The library's own dependencies (`[dependencies]` of the root Cargo.toml) hold nothing of the
/// command line (it is the `omnibus-cli` package), glommio and futures-lite only with the
/// `actors` feature (optional), and hdrhistogram without its default features (its
/// serialization: flate2, base64): a dependent that adds `omnibus` gets none of them.
#[test]
fn the_library_has_no_command_line_dependency() {
    let manifest =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml")).unwrap();
    let deps: Vec<(&str, &str)> = manifest
        .lines()
        .skip_while(|l| l.trim() != "[dependencies]")
        .skip(1)
        .take_while(|l| !l.trim_start().starts_with('['))
        .filter_map(|l| l.split_once(" = "))
        .filter(|(name, _)| !name.trim_start().starts_with('#'))
        .map(|(name, spec)| (name.trim(), spec.trim()))
        .collect();
    assert!(deps.len() >= 10, "{deps:?}");
    for (name, _) in &deps {
        assert!(
            ![
                "clap",
                "tokio",
                "plotters",
                "png",
                "serde",
                "serde_json",
                "indicatif",
                "tracing-subscriber",
                "font8x8",
                "tempfile",
            ]
            .contains(name),
            "the library depends on {name}, which only the command line needs"
        );
    }
    let spec = |n: &str| {
        deps.iter()
            .find(|(name, _)| *name == n)
            .map(|(_, s)| *s)
            .unwrap_or_else(|| panic!("no {n} in {deps:?}"))
    };
    assert!(spec("glommio").contains("optional = true"));
    assert!(spec("futures-lite").contains("optional = true"));
    assert!(spec("hdrhistogram").contains("default-features = false"));
}
