//! omnibus as the log and state-machine store of [openraft](https://docs.rs/openraft/0.9).
//!
//! A node hosts many raft groups ([`RaftNode`]). Every group keeps its raft log in one branch
//! storage (`raft-log-<group>`) and its key-value state machine in another
//! (`raft-sm-<group>-<generation>`) of **one** omnibus [`omnibus::Database`], so the appends,
//! votes and applies of all groups of a node ride the database's one shared journal: the
//! storage actors of the groups hand their commits to one journal writer, which writes them
//! as one batch with one `fdatasync` (TiKV's raft-engine argument: thousands of groups each
//! syncing its own log does not scale, one merged log does).
//!
//! - [`LogStore`] implements openraft's `RaftLogStorage` (v2 storage API): the vote, the log
//!   entries, truncate and purge. An append answers openraft's flush callback only after the
//!   entries' write batch, committed with [`omnibus::Durability::Immediate`], is acknowledged
//!   durable by the journal.
//! - [`StateMachine`] implements `RaftStateMachine`: apply (one durable write batch per call),
//!   last applied log id and membership, snapshots built by streaming a read snapshot of the
//!   state-machine storage into a file (never the whole state in memory) and installed by
//!   streaming that file into a fresh storage generation that replaces the old one atomically.
//! - [`network`]: a small transport (JSON lines over TCP on `tokio`) carrying raft RPCs
//!   addressed to a group, and the client requests of the example and tests.
//!
//! # Which openraft
//!
//! The stable 0.9 line (pinned to 0.9.25) with its `storage-v2` feature: `RaftLogStorage`,
//! `RaftStateMachine` and `openraft::testing::Suite` are released and documented there, while
//! 0.10 is still an alpha whose storage traits change between pre-releases (0.10.0-alpha.37 at
//! the time of writing). Features kept to `serde` and `storage-v2` (no `generic-snapshot-data`:
//! snapshots travel as file chunks through openraft's own chunked `install_snapshot`).
//!
//! # Layout of one node's directory
//!
//! ```text
//! <dir>/db/                      the omnibus database (root storage unused)
//!   Indexes/raft-log-7/          group 7's log storage
//!   Indexes/raft-sm-7-0/         group 7's state machine, generation 0
//! <dir>/snapshots/7/current.json the current snapshot's meta and data file name
//! <dir>/snapshots/7/<id>.snap    the snapshot data (records, see [`state_machine`])
//! ```
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
// openraft's `StorageError` (224 bytes) is the error type its storage traits prescribe; the
// helpers returning it keep it rather than box and unbox it at every trait method.
#![allow(clippy::result_large_err)]

use std::fmt;

use serde::{Deserialize, Serialize};

pub mod cluster;
pub mod log_store;
pub mod network;
pub mod node;
pub mod state_machine;

pub use log_store::LogStore;
pub use node::{Error, NodeOptions, RaftNode};
pub use state_machine::StateMachine;

/// The id of a raft group hosted by a [`RaftNode`] (0-based, dense).
pub type GroupId = u64;

/// The id of a node (openraft's `NodeId`).
pub type NodeId = u64;

/// A client's command to a group's key-value state machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Inserts or replaces `key`.
    Set {
        /// The key (at most [`omnibus::MAX_KEY_LEN`] - 1 bytes).
        key: String,
        /// The value.
        value: String,
    },
    /// Removes `key` (absent keys are fine).
    Delete {
        /// The key.
        key: String,
    },
}

/// What applying one log entry answers: the index of the entry that was applied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    /// The log index of the applied entry.
    pub index: u64,
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Request::Set { key, .. } => write!(f, "set {key}"),
            Request::Delete { key } => write!(f, "delete {key}"),
        }
    }
}

openraft::declare_raft_types!(
    /// The openraft type configuration of every group: [`Request`] commands, [`Response`]
    /// answers, `u64` node ids with a `BasicNode` (its TCP address), snapshot data in a file.
    pub TypeConfig:
        D = Request,
        R = Response,
        NodeId = NodeId,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = tokio::fs::File,
);

/// A raft instance of one group.
pub type Raft = openraft::Raft<TypeConfig>;

/// openraft's storage error for this crate's node id.
pub type StorageError = openraft::StorageError<NodeId>;
