//! Tests that start processes: this binary re-run as a child and killed with SIGKILL, and
//! `mount` for other file systems and mounts. Every child starts through `common::children`, and
//! a test that opens storages in this process holds `common::children::no_children_meanwhile()`
//! while it does (a child holds a copy of this process's descriptors, storage locks included,
//! until its `exec`).
//!
//! The tests that run the `omnibus` command line are the `cli` binary of the `omnibus-cli`
//! package (`cli/tests/`): cargo gives the binary's path to that package's tests only.

#[allow(dead_code)] // no binary uses every helper
#[path = "../common/mod.rs"]
mod common;

mod actors_group_sigkill;
mod actors_sigkill;
mod already_open;
mod crash_sigkill;
mod cross_device;
mod database_sigkill;
mod group_sigkill;
mod index_model;
mod live_readers;
