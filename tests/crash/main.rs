//! Crashes and damage, simulated in one process: power loss at every durable step (storages,
//! databases, eventual commits, compaction, backups), injected I/O faults and poisoning, cut,
//! damaged or deleted journal and data files, torn pages and damaged headers. No test here
//! starts a process (`common::children` says why that matters).

#[allow(dead_code)] // no binary uses every helper
#[path = "../common/mod.rs"]
mod common;

mod backup_killed;
mod bad_input;
mod compact_crash;
mod crash_power_loss;
mod data_file_cut;
mod database_crash;
mod database_faults;
mod durability_poison;
mod durability_power_loss;
mod fault_matrix;
mod faults;
mod group_crash;
mod header_damage;
mod journal_cut;
mod journal_cut_first_batch;
mod journal_damage;
mod journal_file_all_names_deleted;
mod journal_link_deleted;
mod journal_mark;
mod journal_root_name_deleted_branch_records;
mod packed_crash;
mod recreated_branch_links;
mod torn_page;
