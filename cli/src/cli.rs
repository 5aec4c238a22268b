//! The command line: clap definitions of every subcommand.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// omnibus: an embedded transactional storage engine (one root storage of documents, many
/// branch storages of indexes, one shared write-ahead journal).
///
/// Exit codes: 0 success; 1 usage or input error (bad arguments, a bad input line with
/// `--on-error abort`, a missing key for `get` and `delete`, a missing storage, a database path
/// that is not a directory, a directory that is not an omnibus storage, a database held by
/// another process); 2 corruption or I/O failure (a permission error, a full file system);
/// 130 an `ingest` interrupted by Ctrl-C (after its summary). Every failure prints a message on
/// stderr, and a refused command leaves the directory as it was.
///
/// Logs (the library's `tracing` spans and events) go to stderr: warnings and errors by default,
/// `RUST_LOG` (e.g. `RUST_LOG=omnibus=debug`) or `--log-level` (which wins) for more.
#[derive(Debug, Parser)]
#[command(name = "omnibus", version, propagate_version = true)]
pub struct Cli {
    /// Log level on stderr (overrides RUST_LOG) [default: RUST_LOG, else warn]. debug shows
    /// every commit, journal batch and flush; info only opens, recoveries and index catch-ups.
    #[arg(long, global = true, value_enum)]
    pub log_level: Option<LogLevel>,
    #[command(subcommand)]
    pub command: Command,
}

/// `--log-level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    /// The `tracing` level filter of this level.
    pub fn filter(self) -> tracing::level_filters::LevelFilter {
        use tracing::level_filters::LevelFilter;
        match self {
            LogLevel::Error => LevelFilter::ERROR,
            LogLevel::Warn => LevelFilter::WARN,
            LogLevel::Info => LevelFilter::INFO,
            LogLevel::Debug => LevelFilter::DEBUG,
            LogLevel::Trace => LevelFilter::TRACE,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Load JSON Lines into a database's root storage and maintain index storages from it.
    #[command(long_about = INGEST_LONG)]
    Ingest(IngestArgs),
    /// Print the value of KEY: its raw bytes on stdout, then a newline only when stdout is a
    /// terminal (so `get DB KEY > file` is byte-exact). A missing key exits with 1.
    Get(GetArgs),
    /// Store VALUE (or --value-file's bytes, or standard input with `-`) under KEY (one
    /// durable transaction; creates a missing database); --create makes a new --storage.
    Put(PutArgs),
    /// Remove KEY (one durable transaction); prints `deleted`, or exits with 1 when KEY is
    /// missing (as `get`).
    Delete(DeleteArgs),
    /// List entries in key order: key, a tab, value, one entry a line.
    #[command(long_about = SCAN_LONG)]
    Scan(ScanArgs),
    /// The documents an index lists under a term, one JSON object a line.
    #[command(after_help = KEY_HELP)]
    Query(QueryArgs),
    /// Sizes and counters of every storage of a database.
    #[command(long_about = STAT_LONG)]
    Stat(StatArgs),
    /// Verify every storage (checksums, key order, tree shape, free-space map).
    #[command(
        long_about = "Verify every storage of the database: every page checksum, key order and bounds, equal \
leaf depth, overflow runs, value page runs, and the free-space map.\n\nCauses, not cascades: a damaged page is one message, and the \
pages it hides (below it, or covered by a damaged free-space page) are one summary line with their count and \
range, not leaks.\n\nThen every index (a branch storage holding an index's applied record, named by its `--index` \
spec) is cross-checked against the documents: entries missing for a document, entries naming no document, and \
entries a changed document no longer gives, with counts and up to 5 examples of each. An index behind the \
documents (after `put` or `delete` on the root, or a crash) is reported as behind, its differences not counted \
as problems: the next `ingest --index` of it reconciles it.\n\nExit code 0 when every storage and every index in \
step with the documents is sound; 2 with one message a problem on stderr, naming the storage, the file and the \
page, when one is not."
    )]
    Check(CheckArgs),
    /// Write a standalone copy of a database (or plain storage) into DEST from one consistent
    /// snapshot, read-only: also the salvage of a storage whose free-space map is damaged.
    #[command(long_about = BACKUP_LONG)]
    Backup(BackupArgs),
    /// Shrink the data files of every storage of a database (or a plain storage): move the
    /// pages in use toward each file's start, then cut its free tail.
    #[command(long_about = COMPACT_LONG)]
    Compact(CompactArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
}

const COMPACT_LONG: &str = "Shrink the data file of every storage of the database DB (the root, then each \
branch in name order), or of the plain storage DB: the pages in use are moved toward the start of the file \
(ordinary copy-on-write transactions, crash-safe), then the free tail is cut off. Prints, per storage, the \
pages moved and the data file's length and bytes on disk before and after, then the totals.\n\nOpens DB for \
writing: a process that has it open makes this fail. Beside a reader process (a read-only open: get, scan, \
stat, check, backup, or a program) it moves nothing, since pages a reader may read are never reused and \
moved pages would only grow the file: each storage's line says so (--json: skipped_for_readers, \
skipped_reason); run it again once the readers closed. Indexes stay in step with the documents. Exit code \
0 on success; 2 when a storage could not be \
compacted (damaged, or an I/O error: the storages before it are compacted, nothing is lost).";

const BACKUP_LONG: &str = "Write a standalone copy of the database (or plain storage) SRC into DEST, a new or \
empty directory outside SRC. SRC is opened read-only (nothing in SRC is changed), beside a running writer in \
another process too: the copy holds every commit durable when it starts, buffered entries \
included.\n\nThe copy is built from one consistent snapshot's \
pages, every page verified on the way: the root as DEST, each branch as DEST/Indexes/NAME, each with a new \
free-space map (and, for a storage with buffered entries, a journal holding them). It opens as a database and passes `check`.\n\nSalvage: a storage whose \
free-space map is damaged (`check` names the page) refuses to open for writing, but its tree is still \
readable; its backup rebuilds the map from the tree (as LMDB's `mdb_copy -c`), and the copy is writable.\n\n\
Exit code 0 when everything was copied; 2 on damage that stops the copy (nothing is left in DEST) or when a \
damaged branch could not be copied (the rest is, and the branch is named on stderr); 1 on bad input (DEST \
inside SRC, DEST not empty).";

/// `bench shop --index-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum IndexModeArg {
    /// Index entries committed after the documents, from the change feed.
    Async,
    /// Index entries committed with the documents, in one atomic group.
    Sync,
}

impl IndexModeArg {
    pub fn mode(self) -> omnibus::actors::IndexMode {
        match self {
            IndexModeArg::Async => omnibus::actors::IndexMode::Asynchronous,
            IndexModeArg::Sync => omnibus::actors::IndexMode::Synchronous,
        }
    }
}

/// One configuration `bench shop` runs: a journal mode and an index mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    pub journal: JournalArg,
    pub index: IndexModeArg,
}

impl Variant {
    /// Its name in the table and the JSON: the journal mode, with " sync" for synchronous
    /// indexes.
    pub fn name(self) -> &'static str {
        match (self.journal, self.index) {
            (JournalArg::Shared, IndexModeArg::Async) => "shared",
            (JournalArg::Separate, IndexModeArg::Async) => "separate",
            (JournalArg::Shared, IndexModeArg::Sync) => "shared sync",
            (JournalArg::Separate, IndexModeArg::Sync) => "separate sync",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum JournalArg {
    /// One journal, one fdatasync per batch of commits of every storage.
    Shared,
    /// Every storage its own journal and fdatasync (the baseline).
    Separate,
}

impl JournalArg {
    pub fn mode(self) -> omnibus::JournalMode {
        match self {
            JournalArg::Shared => omnibus::JournalMode::Shared,
            JournalArg::Separate => omnibus::JournalMode::Separate,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            JournalArg::Shared => "shared",
            JournalArg::Separate => "separate",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnError {
    /// Report the line and go on (exit code 0 if nothing else failed).
    Skip,
    /// Report the line and stop: what was read before it is committed and indexed, exit code 1.
    Abort,
}

/// What `ingest` does with a document whose id the database already holds (from an earlier
/// line of the input, or stored before the run).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnDuplicate {
    /// The later line wins: it replaces the stored document (counted as replaced).
    Last,
    /// The stored document stays: the later line is not stored (counted as kept).
    First,
    /// The later line is a bad line (see --on-error), the stored document stays.
    Error,
}

const INGEST_LONG: &str = "Load JSON Lines (one JSON object a line) into the database DB, through the actor runtime.

Each document is stored in the root storage under its id: the value of --id-field (a string, or a \
number in serde_json's text form, not as written in the input: 1e2 becomes 100.0 and integers \
beyond 64 bits lose precision, so use string ids for exact keys), or, without --id-field, the line number zero-padded to 12 digits \
(so keys sort, and re-running the same file stores the same keys). The stored value is the line as \
read (surrounding whitespace trimmed). Many puts are in flight at once (--window) so the storage \
actor merges them into few transactions.

Each --index SPEC (a field name, or several joined by `,`, e.g. `country,admin1`) is defined as an \
engine index kept in its own branch storage named SPEC. An entry's key is the field values joined by a \
0x00 byte (the term), escaped so that it holds no 0x00 (0x00 becomes \\x01\\x01, 0x01 becomes \\x01\\x02, every other \
byte stays as it is), then 0x00, then the document id; its value is empty. So `scan --storage country --term AD` \
(the same as `--prefix 'AD\\x00'`) lists the documents whose country is AD, and `scan --storage country,admin1 \
--term AD --term 03` (`--prefix 'AD\\x01\\x0103\\x00'`) those in AD and 03. Field values: a string as is, a number in \
serde_json's text form (as ids), a boolean as true or false, an array or object as compact JSON; a missing or null \
field leaves the document out of that index; in a compound index a value holding a NUL byte (it would blur the \
fields) makes the line a bad line. A dotted name (`a.b`) reaches into nested objects when no top-level field has that name. \
The engine keeps the indexes from the documents' change feed (every acknowledged commit of the root \
storage goes to each index, which applies what is pending as one batch, deleting the entries of \
changed and deleted documents); the command returns when every index has caught up.

Only the indexes given with --index are maintained on a run: each is built if new, reconciled with \
the documents if it is behind them (a crash before it caught up, `put`/`delete` on the root, which \
work outside the engine and do not update indexes, or an earlier ingest without it), or resumed. \
Index storages not listed are left untouched (and go stale if documents change).

A document whose id the database already holds when its line is reached (an earlier line, or a \
document stored before the run) is a duplicate: --on-duplicate last (the default) stores it over the \
older one (whose old index entries are deleted), first keeps the older one, error makes it a bad \
line. The same bytes again are not written (counted as unchanged), but under error. The summary \
counts duplicate ids: replaced, unchanged, kept and refused.

Input errors (reported as `line N: ...` on stderr; skipped or fatal per --on-error):
  not valid UTF-8 (byte offset K)          the line is not UTF-8
  not JSON: <parser message>              a syntax error, e.g. a truncated line
  not a JSON object (an array)            valid JSON of another type
  longer than the line limit of B bytes   the line passes --max-line-bytes; it is skipped over
                                          without being held in memory
  document is B bytes: the value limit is 134217728 bytes
  no id field `F` / id field `F` is not a string or a number / id is B bytes: keys are 1..=1024 bytes
  index `S` key is B bytes: keys are 1..=1024 bytes
  index `S`: field `F` holds a NUL byte, which separates the fields of a compound index's terms
  id X is already stored (--on-duplicate error)
Blank lines are ignored. With --on-error skip the exit code is 0 when nothing else failed (the \
summary counts the skipped lines), but 1 after more than --max-errors bad lines (default 100: the run \
stops there) and 1 when the input had lines and none of them was a document; with abort it is 1. \
Whatever ends the run early (abort, --max-errors, a failure, or Ctrl-C, which exits with 130; a \
second Ctrl-C kills at once), everything read before is committed and indexed and the summary is \
printed, with a `stopped` line saying why. An I/O failure or corruption exits with 2.

At the end it prints documents, seconds, documents/s, the document commit latency (p50, p99, max, \
from the put until its acknowledgement), fdatasyncs, bytes written (journal, and the whole process's \
disk writes from /proc/self/io), the largest index lag seen (milliseconds from a document's \
acknowledgement until its index entry is committed, and root commits behind), and per index its \
entries and whether it was built from the documents or resumed. A progress bar is drawn \
only when stderr is a terminal.";

#[derive(Debug, Args)]
pub struct IngestArgs {
    /// Database directory (created when missing).
    pub db: PathBuf,
    /// JSON Lines file to read (`-` for standard input).
    #[arg(long, short)]
    pub input: PathBuf,
    /// Field holding each document's id; without it, ids are line numbers (12 digits).
    #[arg(long)]
    pub id_field: Option<String>,
    /// An index to maintain: a field name, or several joined by `,` (repeatable).
    #[arg(long = "index", value_name = "SPEC")]
    pub indexes: Vec<String>,
    /// Shared journal (default) or one journal per storage.
    #[arg(long, value_enum, default_value_t = JournalArg::Shared)]
    pub journal: JournalArg,
    /// Executors (pinned cores) of the actor runtime, 1 up to the CPUs available [default:
    /// every online CPU].
    #[arg(long)]
    pub cores: Option<usize>,
    /// What a bad input line does.
    #[arg(long, value_enum, default_value_t = OnError::Skip)]
    pub on_error: OnError,
    /// What a document whose id is already stored (by an earlier line, or before this run)
    /// does; the summary counts them either way.
    #[arg(long, value_enum, default_value_t = OnDuplicate::Last)]
    pub on_duplicate: OnDuplicate,
    /// With --on-error skip: stop after more than N bad lines (what was read before is
    /// committed and indexed; a summary is printed; exit code 1).
    #[arg(long, default_value_t = 100, value_name = "N")]
    pub max_errors: u64,
    /// Document puts in flight at most.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub window: u64,
    /// Longest line accepted, in bytes (up to 1 GiB); a longer one is an input error.
    #[arg(long, default_value_t = 16 << 20, value_parser = clap::value_parser!(u64).range(2..=(1 << 30)))]
    pub max_line_bytes: u64,
    /// Print the summary as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Which storage of the database a command works on.
#[derive(Debug, Args)]
pub struct StorageArg {
    /// Database directory.
    pub db: PathBuf,
    /// A branch storage by name, as `stat` lists it (an index's name is its `ingest --index`
    /// SPEC, e.g. `country`), instead of the root storage.
    #[arg(long, short, value_name = "NAME")]
    pub storage: Option<String>,
}

const KEY_HELP: &str =
    "Keys and values are taken as UTF-8 text with escapes: \\\\ \\t \\n \\r and \\xHH \
(any byte, e.g. \\x00); the same escapes `scan` prints.";

#[derive(Debug, Args)]
#[command(after_help = KEY_HELP)]
pub struct GetArgs {
    #[command(flatten)]
    pub target: StorageArg,
    /// The key.
    pub key: String,
    /// Print {"key":..,"value":..} instead of the raw value (UTF-8 as a string; other bytes
    /// in hex, with "key_encoding"/"value_encoding": "hex").
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
#[command(after_help = KEY_HELP)]
pub struct PutArgs {
    #[command(flatten)]
    pub target: StorageArg,
    /// The key.
    pub key: String,
    /// The value (escapes as KEY); `-` reads its raw bytes from standard input (write `\x2d`
    /// for the one-byte value `-`).
    #[arg(required_unless_present = "value_file", conflicts_with = "value_file")]
    pub value: Option<String>,
    /// Read the value's raw bytes from PATH (`-`: standard input), with no escapes.
    #[arg(long, value_name = "PATH")]
    pub value_file: Option<PathBuf>,
    /// Create the --storage storage, and the database if it is missing too. Needed only with
    /// --storage: without it, an unknown storage is an error, so a mistyped name creates
    /// nothing. A plain put (the root storage) creates a missing database without --create.
    #[arg(long, requires = "storage")]
    pub create: bool,
    /// Print {"storage":..,"key":..,"value_bytes":..,"replaced":..,"storage_created":..}.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
#[command(after_help = KEY_HELP)]
pub struct DeleteArgs {
    #[command(flatten)]
    pub target: StorageArg,
    /// The key.
    pub key: String,
    /// Print {"storage":..,"key":..,"deleted":true|false}.
    #[arg(long)]
    pub json: bool,
}

const SCAN_LONG: &str = "List entries in key order, one a line: the key, a tab, the value. Bytes that are valid \
UTF-8 are shown as they are, except that a backslash is written \\\\, a tab \\t, a newline \\n, a carriage \
return \\r; every other byte that is not part of valid UTF-8, and every other control character, is \
written \\xHH. --prefix takes the same escapes (e.g. 'AD\\x00' for the exact country AD in an index). \
--term T lists an index's entries of the term T (its key prefix, with the term's 0x00 and 0x01 bytes \
escaped as the index stores them); repeated, the fields of a compound index's term. \
An index storage's applied-txn record (the key 0x00) is not listed.";

#[derive(Debug, Args)]
pub struct ScanArgs {
    #[command(flatten)]
    pub target: StorageArg,
    /// Only keys starting with P (escapes as in the output).
    #[arg(long, short)]
    pub prefix: Option<String>,
    /// On an index storage: only the entries whose term is T (escapes as in the output). Give
    /// it once per field for a compound index (`--term AD --term 03` on `country,admin1`), or
    /// fewer times for the entries whose leading fields are those.
    #[arg(
        long = "term",
        short = 't',
        value_name = "T",
        conflicts_with = "prefix"
    )]
    pub terms: Vec<String>,
    /// At most N entries.
    #[arg(long, short)]
    pub limit: Option<u64>,
    /// Print one JSON object a line instead: {"key":..,"value":..}, valid UTF-8 as a string,
    /// any other bytes in hex with "key_encoding"/"value_encoding": "hex" beside them.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct QueryArgs {
    /// Database directory.
    pub db: PathBuf,
    /// The index, by the name `stat` lists (its `ingest --index` SPEC, e.g. `country`).
    #[arg(long, short, value_name = "NAME")]
    pub index: String,
    /// The term (escapes as `scan` prints them); for a compound index one per field, in
    /// order, or fewer for the documents whose leading fields are those.
    #[arg(required = true, value_name = "TERM")]
    pub terms: Vec<String>,
    /// Print {"key":..} only, without the document.
    #[arg(long)]
    pub keys: bool,
    /// At most N documents.
    #[arg(long, short)]
    pub limit: Option<u64>,
    /// Accepted as every command accepts it: the output is JSON Lines either way.
    #[arg(long)]
    pub json: bool,
}

const STAT_LONG: &str =
    "Sizes and counters of every storage of the database (the root, then each index):
  txn             last committed and last flushed transaction ids
  entries         keys stored (for an index, its applied-txn record left out)
  index           for an index storage: the root txn id it has applied up to
  pages           used and free 8 KiB pages (free pages are reused before the file grows)
  file            data file length, bytes allocated on disk, bytes in holes (length not backed by \
allocated blocks: punched free runs), 1 MiB runs punched since this open
  journals        journal files in the storage's Journals/ (a shared journal file is hard-linked \
into every storage that has records in it)
  scratch         unflushed page images held in memory
  readers         the read-only openers in other processes attached to the storage (its LOCK's reader \
slots): each one's pid and the oldest txn it reads (this command's own slot is not listed)
Then the database's journal counters since this open (batches, commits per batch, fdatasyncs, \
directory fsyncs, links): a fresh open only recovers and flushes, so these count that; `ingest` \
and `bench shop` print the counters of their runs. The database is opened read-only: nothing is \
written.";

#[derive(Debug, Args)]
pub struct StatArgs {
    /// Database directory, or a plain storage's (made by `Storage::open`: read as it is, never
    /// turned into a database).
    pub db: PathBuf,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Database directory, or a plain storage's (made by `Storage::open`: read as it is, never
    /// turned into a database).
    pub db: PathBuf,
    /// Print one JSON object with every storage's report.
    #[arg(long)]
    pub json: bool,
    /// Check only this storage: `(root)` for the documents, or a branch's name as `stat`
    /// lists it (an index is still cross-checked against the documents). An unknown name is
    /// an error listing the names.
    #[arg(long, value_name = "NAME")]
    pub storage: Option<String>,
}

#[derive(Debug, Args)]
pub struct CompactArgs {
    /// Database directory, or a plain storage's.
    pub db: PathBuf,
    /// Print one JSON object with every storage's report.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct BackupArgs {
    /// Database directory, or a plain storage's.
    pub db: PathBuf,
    /// Where the copy goes: a new directory, or an empty one, outside DB.
    pub dest: PathBuf,
    /// Print one JSON object with the report.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// 1 documents storage + N index storages, shared vs separate journals, side by side.
    #[command(long_about = SHOP_LONG)]
    Shop(ShopArgs),
    /// Reads and durable writes through the actors at each executor count, with speedups.
    #[command(long_about = SCALE_LONG)]
    Scale(ScaleArgs),
}

const SCALE_LONG: &str = "The large-machine scaling benchmark. For each --executors count, one after the other, \
five workloads run through the actor runtime for --seconds S each:
  get             random point reads of --keys keys (100 B values) through a storage handle, from as \
many client threads as executors (handles read on the caller's thread, from a snapshot)
  multi_get       the same, --batch keys per call (ops/s counts keys; latency is per call)
  get via pool    get with every read sent to the engine's reader pool (ReadPath::Pool)
  write shared    --clients closed-loop clients putting 100 B values, durable, into random storages \
of 1 root + --storages branches sharing one journal
  write separate  the same with a journal per storage

The table gives per row: ops/s, p50 and p99 latency of one call (µs), CPU per op (getrusage of the \
whole process over the run, in µs), the journal fdatasyncs, and the speedup over the smallest \
executor count (1 by default); then the speedups per workload. It starts with the machine (CPUs, \
model, memory, kernel), the file system and a probe of synced 4 KiB writes/s, the rate the shared \
journal's writes are bound by. Counts above the CPUs available are run and marked \
`oversubscribed` (executors then share CPUs); a count the engine cannot start (e.g. the \
locked-memory limit under glommio's 512 KiB minimum) is reported as skipped with the reason.

The databases go in a temporary directory under --dir (default: the current directory, else the \
system temp directory), deleted at the end; a tmpfs is refused unless --allow-tmpfs. --json \
writes every row and the speedups; --plot draws ops/s against executors, one line per workload \
(log scales), with the CPU count marked.";

#[derive(Debug, Args)]
pub struct ScaleArgs {
    /// Executor counts to run, in any order (each is run once, smallest first).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 2, 4, 8, 16])]
    pub executors: Vec<usize>,
    /// Branch storages beside the root for the write workloads.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(0..=10000))]
    pub storages: u64,
    /// Seconds per workload and executor count.
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
    /// Keys in the read workloads' storage.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub keys: u64,
    /// Keys per multi_get call.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub batch: u64,
    /// Closed-loop clients of the write workloads, each with one put in flight.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=100000))]
    pub clients: u64,
    /// Write every row and the speedups as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Draw ops/s against executors, one line per workload, to FILE (PNG).
    #[arg(long, value_name = "FILE.png")]
    pub plot: Option<PathBuf>,
    /// Where the temporary databases go [default: the current directory; the system temp
    /// directory if it is not writable].
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Allow a tmpfs (write numbers then say nothing about a disk).
    #[arg(long)]
    pub allow_tmpfs: bool,
}

const SHOP_LONG: &str = "The RavenDB scenario: one documents storage and --indexes N index storages. --clients C \
concurrent clients insert generated user documents (id, name, email, country, age, last login, \
about 1 KB) as fast as acknowledgements come back, for --seconds S or until --docs D documents; \
each index extracts a field, or a hash of several fields, of every document by a byte scan of its JSON. \
With --index-mode async (the default) the indexes are engine indexes following the change feed of \
the documents storage (each commits what is pending as one batch) and the run ends when every index \
has caught up; with sync each document's index entries commit with it in one atomic group (no lag).

Each journal mode of --journal (times each index mode of --index-mode) runs one after the other in \
the same run, each in a fresh directory \
under --dir, or without --dir under a temporary directory created in the current directory (the \
system temp directory if the current one is not writable) and deleted at the end. It must be on a \
real disk: a tmpfs is refused (it has no fdatasync to measure) unless --allow-tmpfs. The --json and \
--plot files' directories are checked before the run. The table gives \
every run's column and the gain of the first over the second (by default shared over separate; \
first/second for rates, second/first for \
latencies and costs; above 1 means the first is better): documents/s, document commit latency \
p50/p99/p99.9/max, fdatasyncs/s, commits per fdatasync, commits per journal batch (the group commit \
factor; with synchronous indexes each index's part of a document commit counts as a commit), bytes \
written per document, anonymous RSS max and page images max (the exact peak of \
`omnibus::live_image_bytes`, which the engine's memory budget holds) with the budget overruns, index lag p99.";

#[derive(Debug, Args)]
pub struct ShopArgs {
    /// Index storages.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(0..=10000))]
    pub indexes: u64,
    /// Concurrent clients, each with one document put in flight.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=100000))]
    pub clients: u64,
    /// Least milliseconds between two batches of an index (changes accumulate in between; the
    /// rest grows up to 4 times this while batches copy many pages per entry)
    /// [default: the engine's, `IndexDefinition::DEFAULT_MIN_BATCH_INTERVAL`, 250 ms].
    #[arg(long)]
    pub index_interval_ms: Option<u64>,
    /// Bytes of write buffer per index storage (`IndexDefinition::write_buffer_bytes`: index
    /// entries journaled as logical records and applied to the index's tree in steps once many
    /// are pending; the engine caps the buffers together at two thirds of its memory budget)
    /// [default: the engine's, `IndexDefinition::DEFAULT_WRITE_BUFFER_BYTES`, 67108864: the
    /// engine's share decides; 0: no buffer].
    #[arg(long, value_name = "BYTES", default_value_t = omnibus::actors::IndexDefinition::DEFAULT_WRITE_BUFFER_BYTES)]
    pub index_buffer: u64,
    /// Seconds of inserting per mode [default: 20, when --docs is not given].
    #[arg(long, conflicts_with = "docs")]
    pub seconds: Option<f64>,
    /// Runs of each mode, in rounds whose order alternates (shared then separate, then
    /// separate then shared, ...); the table and --json's `modes` show each mode's median run
    /// by documents/s, and every run is listed. On a small or shared machine, which mode runs
    /// first and the minute move a 20 s run by tens of percent: use 3 or more to compare modes.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: u32,
    /// Documents per mode, instead of a duration.
    #[arg(long)]
    pub docs: Option<u64>,
    /// Journal modes to run, in order.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [JournalArg::Shared, JournalArg::Separate])]
    pub journal: Vec<JournalArg>,
    /// Index modes to run, in order, each with every journal mode of --journal: `async`
    /// (entries committed after the documents, from the change feed) or `sync` (entries
    /// committed with each document in one atomic group; shared journal only: a separate
    /// journal is skipped for it, and refused when it is the only one). The table's gain
    /// column compares the first two runs, so
    /// `--journal shared --index-mode sync,async` gives synchronous over asynchronous indexes.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [IndexModeArg::Async])]
    pub index_mode: Vec<IndexModeArg>,
    /// Executors (pinned cores) of the actor runtime, 1 up to the CPUs available [default:
    /// every online CPU].
    #[arg(long)]
    pub cores: Option<usize>,
    /// Write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Draw both modes' commit latency distributions to FILE (PNG).
    #[arg(long, value_name = "FILE.png")]
    pub plot: Option<PathBuf>,
    /// Where the temporary databases go [default: a temporary directory created in the current
    /// directory, deleted at the end; the system temp directory if the current one is not
    /// writable].
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Allow a tmpfs (numbers then say nothing about a disk).
    #[arg(long)]
    pub allow_tmpfs: bool,
    /// Keep the databases instead of deleting them.
    #[arg(long)]
    pub keep: bool,
    /// Open loop: offer documents at R per second whatever the acknowledgements (latency is
    /// measured from each document's scheduled time), instead of --clients closed-loop clients.
    #[arg(long, value_name = "R")]
    pub rate: Option<f64>,
    /// Disk profile: `slow` limits this process's writes to the benchmark's disk to about
    /// 1,000 synced writes/s (cgroup blkio/io throttle; needs root), as a cloud volume with an
    /// IOPS cap behaves.
    #[arg(long, value_enum, default_value_t = DiskArg::Normal)]
    pub disk: DiskArg,
    /// Draw documents/s and anonymous memory over time, per mode, to FILE (PNG).
    #[arg(long, value_name = "FILE.png")]
    pub plot_timeline: Option<PathBuf>,
}

/// `bench shop --disk`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DiskArg {
    /// The disk as it is.
    Normal,
    /// Writes throttled to about 1,000 synced writes/s.
    Slow,
}
