//! Tests that run the `omnibus` command line (`env!("CARGO_BIN_EXE_omnibus")`, which cargo sets
//! for this package's tests only): its commands, exit codes and output, on databases this
//! process writes or damages first; the binary killed with SIGKILL or interrupted; `mount`,
//! `chmod` or `setpriv` for read-only media and other users. Every child starts through
//! `common::children`, and a test that opens storages in this process holds
//! `common::children::no_children_meanwhile()` while it does (a child holds a copy of this
//! process's descriptors, storage locks included, until its `exec`).

#[allow(dead_code)] // no binary uses all of it
#[path = "../../tests/common/mod.rs"]
mod common;

mod bitmap_damage_salvage;
mod branch_pages_missing;
mod check_causes;
mod check_header_slot;
mod check_index;
mod cli_backup;
mod cli_bad_input;
mod cli_bench;
mod cli_bench_measures;
mod cli_bench_scale;
mod cli_binary_values;
mod cli_branch_path;
mod cli_check_program_index;
mod cli_check_storage;
mod cli_compact;
mod cli_exit_codes;
mod cli_ingest;
mod cli_ingest_errors;
mod cli_ingest_interrupt;
mod cli_kv;
mod cli_logging;
mod cli_plain_storage;
mod cli_put_damaged_database;
mod cli_query;
mod cli_sigkill;
mod cli_write_input;
mod damaged_storage;
mod data_file_truncated;
mod read_only;
