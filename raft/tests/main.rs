//! omnibus-raft's tests, one binary: openraft's storage suite, snapshots built, installed and
//! sent over TCP, a node restarted from its log, and clusters of node processes with a node
//! SIGKILLed.
//!
//! `harness = false`: this `main` is the test runner (libtest-mimic, with libtest's command
//! line: filters, `--exact`, `--list`, `--test-threads`) and also the node processes' entry: a
//! cluster test starts this binary as `raft node ...`. A test is a `pub fn` of its module,
//! listed in [`TESTS`] (`#[test]` does nothing here).
//!
//! A cluster test runs alone: its node processes start while it runs, and a child holds a copy
//! of this process's descriptors until its `exec`, storage locks included (so a test that
//! closed and reopened a database here at that moment would find it `AlreadyOpen`). The tests
//! in this process run beside each other.

mod cluster_sigkill;
mod node_restart_replays_log;
mod openraft_suite;
mod snapshot_after_restart;
mod snapshot_install;
mod snapshot_over_network;

use std::sync::{PoisonError, RwLock};

use libtest_mimic::{Arguments, Trial};

/// Where a test's nodes run.
#[derive(Clone, Copy)]
enum Nodes {
    /// In this process: runs beside the other such tests.
    InProcess,
    /// In child processes: runs alone.
    Processes,
}

/// Every test: its name (module, then function, as libtest names them), body, and nodes.
const TESTS: &[(&str, fn(), Nodes)] = &[
    (
        "cluster_sigkill::no_acknowledged_write_is_lost_when_the_leader_is_killed",
        cluster_sigkill::no_acknowledged_write_is_lost_when_the_leader_is_killed,
        Nodes::Processes,
    ),
    (
        "node_restart_replays_log::restart_replays_the_log_into_an_empty_state_machine",
        node_restart_replays_log::restart_replays_the_log_into_an_empty_state_machine,
        Nodes::InProcess,
    ),
    (
        "openraft_suite::openraft_storage_suite_passes",
        openraft_suite::openraft_storage_suite_passes,
        Nodes::InProcess,
    ),
    (
        "snapshot_after_restart::a_restarted_follower_catches_up_by_a_snapshot",
        snapshot_after_restart::a_restarted_follower_catches_up_by_a_snapshot,
        Nodes::Processes,
    ),
    (
        "snapshot_install::install_replaces_the_generation_and_refuses_damage",
        snapshot_install::install_replaces_the_generation_and_refuses_damage,
        Nodes::InProcess,
    ),
    (
        "snapshot_over_network::a_new_learner_catches_up_from_a_snapshot_sent_in_chunks",
        snapshot_over_network::a_new_learner_catches_up_from_a_snapshot_sent_in_chunks,
        Nodes::InProcess,
    ),
];

/// Held shared by the in-process tests, exclusively by the cluster tests.
static GATE: RwLock<()> = RwLock::new(());

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    omnibus_raft::cluster::serve_if_node(&args, "node");
    let cases = TESTS
        .iter()
        .map(|&(name, test, nodes)| {
            Trial::test(name, move || {
                match nodes {
                    Nodes::InProcess => {
                        let _beside = GATE.read().unwrap_or_else(PoisonError::into_inner);
                        test();
                    }
                    Nodes::Processes => {
                        let _alone = GATE.write().unwrap_or_else(PoisonError::into_inner);
                        test();
                    }
                }
                Ok(())
            })
        })
        .collect();
    libtest_mimic::run(&Arguments::from_args(), cases).exit();
}
