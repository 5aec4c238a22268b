//! [`RaftNode`]: many raft groups on one node, their logs and state machines in one omnibus
//! database, so that all their durable writes share the database's journal.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use omnibus::actors::{DatabaseHandle, Engine};
use openraft::network::RaftNetworkFactory;
use openraft::BasicNode;

use crate::log_store::LogStore;
use crate::network::{GroupStatus, TcpNetworkFactory};
use crate::state_machine::{KvReader, StateMachine};
use crate::{GroupId, NodeId, Raft, StorageError, TypeConfig};

/// Errors of [`RaftNode`].
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The storage engine refused (opening the database, a storage).
    Omnibus(omnibus::Error),
    /// A group's log or state machine failed (openraft's storage error).
    Storage(StorageError),
    /// openraft refused: an invalid [`openraft::Config`], a fatal error starting a group, or
    /// an initialization that failed (`what` says which group and call).
    Raft {
        /// The group and the call.
        what: String,
        /// openraft's error in words.
        error: String,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Omnibus(e) => write!(f, "storage engine: {e}"),
            Error::Storage(e) => write!(f, "raft storage: {e}"),
            Error::Raft { what, error } => write!(f, "{what}: {error}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<omnibus::Error> for Error {
    fn from(e: omnibus::Error) -> Error {
        Error::Omnibus(e)
    }
}

impl From<StorageError> for Error {
    fn from(e: StorageError) -> Error {
        Error::Storage(e)
    }
}

/// How a [`RaftNode`] is opened.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// Raft groups on the node, numbered `0..groups`. Default 1.
    pub groups: u64,
    /// Options of the node's omnibus database (`journal_mode` decides whether the groups
    /// share one journal, the default, or each storage has its own).
    pub database: omnibus::Options,
    /// openraft's configuration, the same for every group.
    pub raft: openraft::Config,
}

impl Default for NodeOptions {
    fn default() -> NodeOptions {
        NodeOptions {
            groups: 1,
            database: omnibus::Options::default(),
            raft: openraft::Config {
                heartbeat_interval: 100,
                election_timeout_min: 300,
                election_timeout_max: 600,
                ..Default::default()
            },
        }
    }
}

struct Group {
    raft: Raft,
    kv: KvReader,
}

/// A node hosting raft groups `0..groups`: group `g`'s log is the branch storage
/// `raft-log-<g>` and its state machine `raft-sm-<g>-<generation>` of the one database at
/// `<dir>/db`, so every group's appends, votes and applies ride that database's journal
/// batches. The node's id is the same in every group.
pub struct RaftNode {
    id: NodeId,
    db: DatabaseHandle,
    groups: Vec<Group>,
    /// `InstallSnapshot` chunks handed to the groups by [`crate::network::serve`].
    snapshot_chunks: AtomicU64,
}

impl fmt::Debug for RaftNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RaftNode({}, {} groups)", self.id, self.groups.len())
    }
}

/// The name of `group`'s log storage.
pub fn log_storage_name(group: GroupId) -> String {
    format!("raft-log-{group}")
}

/// Refuses an openraft configuration the TCP transport cannot carry: a
/// `snapshot_max_chunk_size` above [`crate::network::MAX_SNAPSHOT_CHUNK`] makes
/// `InstallSnapshot` lines longer than [`crate::network::MAX_LINE`], which every receiver
/// drops (the leader would retry the snapshot forever and the follower never catch up).
/// Errors: [`Error::Raft`] naming the field.
fn check_transport_limits(config: &openraft::Config) -> Result<(), Error> {
    let max = crate::network::MAX_SNAPSHOT_CHUNK;
    if config.snapshot_max_chunk_size > max {
        return Err(Error::Raft {
            what: "openraft config".into(),
            error: format!(
                "snapshot_max_chunk_size {} is above {max} bytes, the largest chunk whose \
                 InstallSnapshot line fits the transport's {} byte limit",
                config.snapshot_max_chunk_size,
                crate::network::MAX_LINE
            ),
        });
    }
    Ok(())
}

impl RaftNode {
    /// Opens (or creates) node `id` in `dir` on `engine` with the TCP transport of
    /// [`crate::network`]: every group's raft instance starts from what its log and state
    /// machine hold (a restarted node replays its log from omnibus).
    ///
    /// Errors: as [`RaftNode::open_with`].
    pub async fn open(
        engine: &Engine,
        id: NodeId,
        dir: &Path,
        opts: NodeOptions,
    ) -> Result<RaftNode, Error> {
        RaftNode::open_with(engine, id, dir, opts, TcpNetworkFactory::new).await
    }

    /// [`RaftNode::open`] with `network(group)` as each group's network factory.
    ///
    /// Errors: [`Error::Omnibus`] when the database does not open; [`Error::Storage`] when a
    /// group's storages do not open; [`Error::Raft`] for an invalid `opts.raft` (including a
    /// `snapshot_max_chunk_size` above [`crate::network::MAX_SNAPSHOT_CHUNK`]) or a group
    /// that fails to start.
    pub async fn open_with<N, F>(
        engine: &Engine,
        id: NodeId,
        dir: &Path,
        opts: NodeOptions,
        network: F,
    ) -> Result<RaftNode, Error>
    where
        N: RaftNetworkFactory<TypeConfig>,
        F: Fn(GroupId) -> N,
    {
        check_transport_limits(&opts.raft)?;
        let config = Arc::new(opts.raft.validate().map_err(|e| Error::Raft {
            what: "openraft config".into(),
            error: e.to_string(),
        })?);
        std::fs::create_dir_all(dir).map_err(|e| {
            Error::Omnibus(omnibus::Error::Io {
                op: "mkdir",
                path: dir.to_path_buf(),
                source: e,
            })
        })?;
        let db = engine
            .open_database(dir.join("db"), opts.database.clone())
            .await?;
        let snapshots = dir.join("snapshots");
        let mut set = tokio::task::JoinSet::new();
        for g in 0..opts.groups {
            let db = db.clone();
            let snapshots = snapshots.clone();
            set.spawn(async move {
                let log = db.create_storage(&log_storage_name(g)).await?;
                let log = LogStore::new(log);
                let sm = StateMachine::open(db, g, log.clone(), &snapshots).await?;
                Ok::<_, Error>((g, log, sm))
            });
        }
        let mut opened = Vec::new();
        while let Some(r) = set.join_next().await {
            let r = r.map_err(|e| Error::Raft {
                what: "opening a group".into(),
                error: e.to_string(),
            })?;
            opened.push(r?);
        }
        opened.sort_by_key(|(g, _, _)| *g);
        let mut groups = Vec::with_capacity(opened.len());
        for (g, log, sm) in opened {
            let kv = sm.reader();
            let raft = Raft::new(id, config.clone(), network(g), log, sm)
                .await
                .map_err(|e| Error::Raft {
                    what: format!("starting group {g}"),
                    error: e.to_string(),
                })?;
            groups.push(Group { raft, kv });
        }
        Ok(RaftNode {
            id,
            db,
            groups,
            snapshot_chunks: AtomicU64::new(0),
        })
    }

    /// The node's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// Groups on the node.
    pub fn groups(&self) -> u64 {
        self.groups.len() as u64
    }

    /// `InstallSnapshot` chunks this node's server ([`crate::network::serve`]) has received
    /// for any group since the node opened (counted before openraft sees them, whatever it
    /// answers).
    pub fn snapshot_chunks_received(&self) -> u64 {
        self.snapshot_chunks.load(Ordering::Relaxed)
    }

    /// Counts one received `InstallSnapshot` chunk (see
    /// [`RaftNode::snapshot_chunks_received`]).
    pub(crate) fn count_snapshot_chunk(&self) {
        self.snapshot_chunks.fetch_add(1, Ordering::Relaxed);
    }

    /// The node's database.
    pub fn database(&self) -> &DatabaseHandle {
        &self.db
    }

    /// `group`'s raft instance (`None` past the last group).
    pub fn raft(&self, group: GroupId) -> Option<&Raft> {
        self.groups
            .get(usize::try_from(group).ok()?)
            .map(|g| &g.raft)
    }

    /// A reader of `group`'s state machine on this node (`None` past the last group).
    pub fn kv(&self, group: GroupId) -> Option<&KvReader> {
        self.groups.get(usize::try_from(group).ok()?).map(|g| &g.kv)
    }

    /// `group`'s raft state on this node (`None` past the last group).
    pub fn status(&self, group: GroupId) -> Option<GroupStatus> {
        let m = self.raft(group)?.metrics().borrow().clone();
        Some(GroupStatus {
            leader: m.current_leader,
            term: m.current_term,
            last_log_index: m.last_log_index,
            last_applied: m.last_applied.map(|l| l.index),
            snapshot: m.snapshot.map(|l| l.index),
            purged: m.purged.map(|l| l.index),
        })
    }

    /// Initializes every group with `members` as voters (once, on one node of a new cluster;
    /// a group already initialized is left as it is).
    ///
    /// Errors: [`Error::Raft`] naming the first group openraft refused.
    pub async fn initialize(&self, members: BTreeMap<NodeId, BasicNode>) -> Result<(), Error> {
        for (g, group) in self.groups.iter().enumerate() {
            match group.raft.initialize(members.clone()).await {
                Ok(()) => {}
                Err(openraft::error::RaftError::APIError(
                    openraft::error::InitializeError::NotAllowed(_),
                )) => {}
                Err(e) => {
                    return Err(Error::Raft {
                        what: format!("initializing group {g}"),
                        error: e.to_string(),
                    })
                }
            }
        }
        Ok(())
    }

    /// Stops every group's raft instance (the database stays open until the engine shuts
    /// down). Errors: [`Error::Raft`] naming the first group that failed to stop cleanly.
    pub async fn shutdown(&self) -> Result<(), Error> {
        let mut first = None;
        for (g, group) in self.groups.iter().enumerate() {
            if let Err(e) = group.raft.shutdown().await {
                first.get_or_insert(Error::Raft {
                    what: format!("stopping group {g}"),
                    error: e.to_string(),
                });
            }
        }
        first.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::{Message, SnapshotChunk, MAX_LINE, MAX_SNAPSHOT_CHUNK};
    use openraft::{CommittedLeaderId, LogId, Membership, SnapshotMeta, StoredMembership, Vote};

    #[test]
    fn a_snapshot_chunk_larger_than_a_line_is_refused() {
        let mut c = NodeOptions::default().raft;
        c.snapshot_max_chunk_size = MAX_SNAPSHOT_CHUNK;
        check_transport_limits(&c).expect("the largest chunk that fits");
        c.snapshot_max_chunk_size = MAX_SNAPSHOT_CHUNK + 1;
        assert!(matches!(
            check_transport_limits(&c),
            Err(Error::Raft { .. })
        ));
    }

    #[test]
    fn a_chunk_of_the_largest_size_fits_a_line() {
        // The largest ids and offset, a long snapshot id.
        let membership = Membership::new(vec![(1..=5).collect()], None);
        let log_id = LogId::new(CommittedLeaderId::new(u64::MAX, 1), u64::MAX);
        let msg = Message::InstallSnapshot {
            group: u64::MAX,
            rpc: SnapshotChunk {
                vote: Vote::new_committed(u64::MAX, 1),
                meta: SnapshotMeta {
                    last_log_id: Some(log_id),
                    last_membership: StoredMembership::new(Some(log_id), membership),
                    snapshot_id: "x".repeat(200),
                },
                offset: u64::MAX,
                data: vec![255; MAX_SNAPSHOT_CHUNK as usize],
                done: true,
            },
        };
        let len = serde_json::to_vec(&msg).expect("encode").len();
        assert!(len <= MAX_LINE, "{len} > {MAX_LINE}");
    }
}
