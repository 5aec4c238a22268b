//! The core, in one process: storages and databases (put, get, ranges, transactions, snapshots,
//! reopen), the B+tree's pages and their fill, free space and hole punching, the flush write
//! modes, the journal (zeros, pre-zeroing, start records) and eventual durability, compaction,
//! backups, the public API and the source's layering. No test here starts a process
//! (`common::children` says why that matters).

#[allow(dead_code)] // no binary uses every helper
#[path = "../common/mod.rs"]
mod common;

mod background_apply;
mod backup_inside_source;
mod backup_while_writing;
mod basic;
mod bitmap_page_diffs;
mod buffered;
mod catch_up_cost;
mod compact_shrinks;
mod compact_with_snapshot;
mod database;
mod database_backup_consistency;
mod disk_space_small;
mod durability_eventual_sync;
mod durability_shared_journal;
mod early_reuse;
mod freed_pages;
mod group_model;
mod groups;
mod hole_punch;
mod journal_io;
mod journal_mark_cost;
mod journal_prezero_background;
mod journal_start_cost;
mod journal_zeros;
mod layering;
mod leaf_fill;
mod lock_file;
mod metrics;
mod model;
mod multi_get_model;
mod no_fallocate;
mod packed_values;
mod page_diffs;
mod public_api;
mod punch_clustered_delete;
mod range_model;
mod range_syntax;
mod reader_beside_moving_journal;
mod readme_examples;
mod sorted_fill;
mod storage_not_found;
mod write_modes;
