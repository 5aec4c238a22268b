//! `omnibus`: the command line of the omnibus storage engine.
//!
//! `ingest` loads JSON Lines through the actor runtime, with indexes the engine keeps from the
//! documents' change feed; `get`/`put`/`delete`/`scan`/`stat`/`check` work on a database with the core API;
//! `bench shop` runs the 1 + N storage insert benchmark in both journal modes side by side;
//! `bench scale` measures reads and durable writes through the actors at each executor count.
//!
//! Exit codes: 0 success, 1 usage or input error, 2 corruption or I/O failure (see [`Fail`]).

mod bench_scale;
mod bench_shop;
mod cli;
mod fmt;
mod index_spec;
mod ingest;
mod kv;
mod lines;
mod plot;
mod shop_measure;

use std::path::Path;
use std::process::ExitCode;

use clap::Parser;

/// A failure: the exit code and the message printed on stderr.
#[derive(Debug)]
pub struct Fail {
    /// 1: usage or input error; 2: corruption or I/O failure.
    pub code: u8,
    pub msg: String,
}

impl Fail {
    pub fn input(msg: impl Into<String>) -> Fail {
        Fail {
            code: 1,
            msg: msg.into(),
        }
    }

    pub fn io(msg: impl Into<String>) -> Fail {
        Fail {
            code: 2,
            msg: msg.into(),
        }
    }

    /// Adds context in front of the message.
    pub fn context(self, what: impl std::fmt::Display) -> Fail {
        Fail {
            code: self.code,
            msg: format!("{what}: {}", self.msg),
        }
    }

    /// A failure to open the database at `db`. An error that carries a path already names it
    /// in its message (`c.db: already open ...`) and is kept as is; any other gets
    /// `opening c.db: ` in front.
    pub fn opening(e: omnibus::Error, db: &Path) -> Fail {
        use omnibus::Error as E;
        let names_a_path = matches!(
            e,
            E::NotAStorage { .. }
                | E::FormatVersion { .. }
                | E::Corruption(_)
                | E::AlreadyOpen { .. }
                | E::TooManyReaders { .. }
                | E::CrossDevice { .. }
                | E::NoSpace { .. }
                | E::Io { .. }
        );
        let f = Fail::from(e);
        if names_a_path {
            f
        } else {
            f.context(format_args!("opening {}", db.display()))
        }
    }
}

/// Checks that the database path `db` is a directory, or missing: anything else is an input
/// error (exit 1) instead of an I/O failure deep in the open. Returns whether it exists (true
/// too when that cannot be told, e.g. without permission: the open then says what is wrong).
pub fn db_dir(db: &Path) -> CliResult<bool> {
    not_a_branch(db)?;
    match std::fs::metadata(db) {
        Ok(m) if m.is_dir() => Ok(true),
        Ok(_) => Err(Fail::input(format!(
            "{}: not a directory (a database is a directory)",
            db.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => Err(Fail::input(format!(
            "{}: a component of the path is not a directory",
            db.display()
        ))),
        // Cannot tell (e.g. no permission): the open reports what is wrong.
        Err(_) => Ok(true),
    }
}

/// Refuses a path that is a branch storage of a database (`DB/Indexes/NAME`), naming the
/// database and the `--storage` form to use instead.
///
/// Regression: with the shared journal file cut to zero after unflushed
/// writes, `check DB` failed (exit 2) but `check DB/Indexes/c` opened the branch on its own,
/// without the root's statement of the journal files (design.md 3.8), and said "ok (0
/// entries)"; `put DB/Indexes/c k v` then wrote into it, made the loss permanent and created an
/// `Indexes/` directory inside the branch. A branch is read and written through its database.
pub fn not_a_branch(path: &Path) -> CliResult {
    // Regression: `put DB/Indexes k v` created a whole new database inside DB's `Indexes/`.
    if path.file_name() == Some(std::ffi::OsStr::new("Indexes"))
        && path.parent().is_some_and(omnibus::Database::exists)
    {
        let db = path.parent().unwrap_or(Path::new("."));
        return Err(Fail::input(format!(
            "{}: this is the branch directory of the database {}: use the database's path (with `--storage NAME` for a branch storage)",
            path.display(),
            db.display()
        )));
    }
    let parent = path.parent();
    let is_branch = parent.and_then(Path::file_name) == Some(std::ffi::OsStr::new("Indexes"))
        && parent
            .and_then(Path::parent)
            .is_some_and(omnibus::Database::exists)
        && path.is_dir();
    if !is_branch {
        return Ok(());
    }
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let db = parent.and_then(Path::parent).unwrap_or(Path::new("."));
    Err(Fail::input(format!(
        "{}: this is the storage {name:?} of the database {}: use the database's path, with `--storage {name}` where the command takes it (`backup` has none: it copies the whole database; a branch opened on its own cannot see the database's journal)",
        path.display(),
        db.display()
    )))
}

/// Installs the stderr subscriber: `--log-level` when given, else `RUST_LOG` (an env-filter
/// directive list, e.g. `omnibus=debug`), else WARN. An invalid `RUST_LOG` is reported and WARN
/// is used.
fn init_logging(level: Option<cli::LogLevel>) {
    use tracing_subscriber::EnvFilter;
    let mut bad_env = None;
    let filter = match level {
        Some(l) => EnvFilter::default().add_directive(l.filter().into()),
        None => match std::env::var("RUST_LOG") {
            Ok(v) if !v.trim().is_empty() => EnvFilter::try_new(&v).unwrap_or_else(|e| {
                bad_env = Some(format!("RUST_LOG={v:?} ignored: {e}"));
                EnvFilter::new("warn")
            }),
            _ => EnvFilter::new("warn"),
        },
    };
    // Once an interrupted benchmark deletes its databases under the running engine, what the
    // engine's threads log about the missing files is dropped. Regression: a TERM during `bench
    // shop` printed up to 250 lines of `storage poisoned ... No such file or directory`.
    let writer = || -> Box<dyn std::io::Write> {
        if shop_measure::interrupted() {
            Box::new(std::io::sink())
        } else {
            Box::new(std::io::stderr())
        }
    };
    tracing_subscriber::fmt()
        .with_writer(writer)
        .with_env_filter(filter)
        .with_target(false)
        .without_time()
        .init();
    if let Some(msg) = bad_env {
        eprintln!("omnibus: warning: {msg}");
    }
}

/// Checks `--cores`: at least 1 and at most the CPUs this process may run on (the actor
/// runtime pins one executor per CPU). A usage error (exit 1) saying so otherwise.
pub fn check_cores(cores: Option<usize>) -> CliResult {
    let Some(n) = cores else {
        return Ok(());
    };
    if n == 0 {
        return Err(Fail::input("--cores must be at least 1"));
    }
    let cpus = std::thread::available_parallelism().map_or(1, |c| c.get());
    if n > cpus {
        return Err(Fail::input(format!(
            "--cores {n}: this machine has {cpus} CPUs available (give 1 to {cpus})"
        )));
    }
    Ok(())
}

impl From<omnibus::Error> for Fail {
    fn from(e: omnibus::Error) -> Fail {
        use omnibus::Error as E;
        let code = match &e {
            E::Corruption(_)
            | E::Io { .. }
            | E::Poisoned { .. }
            | E::FormatVersion { .. }
            | E::DatabaseDamaged { .. }
            | E::NoSpace { .. }
            | E::IndexPoisoned { .. } => 2,
            _ => 1,
        };
        Fail {
            code,
            msg: e.to_string(),
        }
    }
}

impl From<std::io::Error> for Fail {
    fn from(e: std::io::Error) -> Fail {
        Fail::io(e.to_string())
    }
}

pub type CliResult<T = ()> = Result<T, Fail>;

fn main() -> ExitCode {
    // Like other Unix tools, end quietly when the reader of stdout goes away (`stat | head`)
    // instead of failing a print.
    // SAFETY: called first thing in main, before any thread starts; SIG_DFL is a valid handler.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = match cli::Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            let code = match e.kind() {
                ErrorKind::DisplayHelp
                | ErrorKind::DisplayVersion
                | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                    if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                        1
                    } else {
                        0
                    }
                }
                _ => 1,
            };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    // The library warns through `tracing`: print its warnings and errors on stderr.
    // Regression: an invalid OMNIBUS_WRITE_MODE, the io_uring fallback and
    // every other library warning were silent, since nothing printed `tracing` events.
    init_logging(cli.log_level);
    let r = match cli.command {
        cli::Command::Ingest(a) => ingest::run(a),
        cli::Command::Get(a) => kv::get(a),
        cli::Command::Put(a) => kv::put(a),
        cli::Command::Delete(a) => kv::delete(a),
        cli::Command::Scan(a) => kv::scan(a),
        cli::Command::Query(a) => kv::query(a),
        cli::Command::Stat(a) => kv::stat(a),
        cli::Command::Check(a) => kv::check(a),
        cli::Command::Backup(a) => kv::backup(a),
        cli::Command::Compact(a) => kv::compact(a),
        cli::Command::Bench(cli::BenchCommand::Shop(a)) => bench_shop::run(a),
        cli::Command::Bench(cli::BenchCommand::Scale(a)) => bench_scale::run(a),
    };
    // A run interrupted by a signal ends with 128 + the signal, whatever it returned.
    shop_measure::wait_for_interrupt_cleanup();
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("omnibus: {}", f.msg);
            ExitCode::from(f.code)
        }
    }
}
