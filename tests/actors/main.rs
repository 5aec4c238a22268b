//! The actor runtime (`omnibus::actors`) in one process: the engine and its executors, the
//! handles' requests, back-pressure, durability and poisoning through the actors, and the
//! indexes the engine maintains (build, wait, rest, resume, poison). No test here starts a
//! process (`common::children` says why that matters).

#[allow(dead_code)] // no binary uses every helper
#[path = "../common/mod.rs"]
mod common;

mod actors_backup;
mod actors_durability;
mod actors_many_clients;
mod actors_poison;
mod buffered_database;
mod cancel_safety;
mod closed_database_files;
mod documents_queue;
mod engine_keepalive;
mod engine_metrics;
mod executor_never_blocks;
mod executor_placement;
mod group_writes;
mod handle_maintenance;
mod index_build;
mod index_compact;
mod index_outside_writes;
mod index_poison;
mod index_query;
mod index_record_hidden;
mod index_rest;
mod index_resume;
mod index_wait;
mod journal_marks;
mod range_stream;
mod shutdown_in_flight;
mod update;
