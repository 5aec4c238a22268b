//! The transport between nodes, and between a client and a node: one JSON line per request,
//! one JSON line per reply, over TCP (`tokio`), requests answered in order per connection.
//!
//! Every raft RPC names its group ([`Message`]); a node's server ([`serve`]) hands it to that
//! group's raft instance. Each group's raft instance has one network client per peer
//! ([`TcpNetwork`]) with a connection of its own, so a slow group never queues behind another
//! on a socket. A transport failure (connect, write, read, timeout after the RPC's hard TTL)
//! is reported to openraft as `Unreachable` (it backs off before retrying) and drops the
//! connection; the next call connects again.
//!
//! A snapshot travels as openraft's chunked `InstallSnapshot`, one line per chunk
//! ([`SnapshotChunk`]: the request's fields with the chunk's bytes as one base64 string,
//! 4 bytes on the wire per 3 of snapshot, where serde's default, a JSON array of numbers,
//! takes about 3.5 per byte).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{
    ClientWriteError, InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError,
    Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, ClientWriteResponse, InstallSnapshotRequest,
    InstallSnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{BasicNode, SnapshotMeta, Vote};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

use crate::{GroupId, NodeId, RaftNode, Request, TypeConfig};

/// Longest accepted request or reply line (bytes): bounds a connection's buffer.
pub const MAX_LINE: usize = 64 << 20;

/// Largest `snapshot_max_chunk_size` (bytes) whose `InstallSnapshot` line fits in
/// [`MAX_LINE`]: a chunk's bytes are one base64 string (4 bytes on the wire per 3, padded),
/// and 1 MiB is left for the rest of the request (vote, meta with its membership). A larger
/// chunk would be refused by every receiver, so [`crate::RaftNode::open`] refuses such a
/// configuration instead of letting the leader resend a snapshot forever.
pub const MAX_SNAPSHOT_CHUNK: u64 = ((MAX_LINE - (1 << 20)) / 4 * 3) as u64;

/// openraft's `InstallSnapshotRequest` on the wire: the same fields, `data` as one base64
/// string (RFC 4648 standard alphabet, padded) rather than serde's array of numbers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotChunk {
    /// The leader's vote.
    pub vote: Vote<NodeId>,
    /// The snapshot the chunk belongs to.
    pub meta: SnapshotMeta<NodeId, BasicNode>,
    /// Byte offset of the chunk in the snapshot.
    pub offset: u64,
    /// The chunk's bytes.
    #[serde(with = "base64_bytes")]
    pub data: Vec<u8>,
    /// True for the last chunk.
    pub done: bool,
}

impl From<InstallSnapshotRequest<TypeConfig>> for SnapshotChunk {
    fn from(r: InstallSnapshotRequest<TypeConfig>) -> SnapshotChunk {
        SnapshotChunk {
            vote: r.vote,
            meta: r.meta,
            offset: r.offset,
            data: r.data,
            done: r.done,
        }
    }
}

impl From<SnapshotChunk> for InstallSnapshotRequest<TypeConfig> {
    fn from(c: SnapshotChunk) -> InstallSnapshotRequest<TypeConfig> {
        InstallSnapshotRequest {
            vote: c.vote,
            meta: c.meta,
            offset: c.offset,
            data: c.data,
            done: c.done,
        }
    }
}

/// `Vec<u8>` as a base64 string (serde `with` module); a string that is not base64 fails
/// to decode (the line is refused like any other that does not decode).
mod base64_bytes {
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        STANDARD
            .decode(text.as_bytes())
            .map_err(serde::de::Error::custom)
    }
}

/// A request on the wire.
#[derive(Debug, Serialize, Deserialize)]
pub enum Message {
    /// Raft: append entries (heartbeats too) to `group`. Reply:
    /// `Result<AppendEntriesResponse, RaftError>`.
    AppendEntries {
        /// The group.
        group: GroupId,
        /// openraft's request.
        rpc: AppendEntriesRequest<TypeConfig>,
    },
    /// Raft: a vote request. Reply: `Result<VoteResponse, RaftError>`.
    Vote {
        /// The group.
        group: GroupId,
        /// openraft's request.
        rpc: VoteRequest<NodeId>,
    },
    /// Raft: one snapshot chunk. Reply: `Result<InstallSnapshotResponse,
    /// RaftError<InstallSnapshotError>>`.
    InstallSnapshot {
        /// The group.
        group: GroupId,
        /// openraft's request, its bytes in base64.
        rpc: SnapshotChunk,
    },
    /// Client: a write through this node (its leader). Reply: `Result<ClientWriteResponse,
    /// RaftError<ClientWriteError>>` (a `ForwardToLeader` error names the leader).
    Write {
        /// The group.
        group: GroupId,
        /// The command.
        request: Request,
    },
    /// Client: read `key` from this node's own state machine (not linearizable). Reply:
    /// `Result<Option<String>, String>`.
    Read {
        /// The group.
        group: GroupId,
        /// The key.
        key: String,
    },
    /// Client: a group's raft state on this node. Reply: `Result<GroupStatus, String>`.
    Status {
        /// The group.
        group: GroupId,
    },
    /// Admin: the node's journal counters. Reply: `Result<NodeStats, String>`.
    Stats,
    /// Admin: initialize every group with `members` (call on one node, once). Reply:
    /// `Result<(), String>`.
    Initialize {
        /// The voters and their addresses.
        members: BTreeMap<NodeId, BasicNode>,
    },
}

/// A group's raft state on one node (from openraft's metrics).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct GroupStatus {
    /// The leader this node knows of.
    pub leader: Option<NodeId>,
    /// The node's current term.
    pub term: u64,
    /// Index of the last entry in this node's log.
    pub last_log_index: Option<u64>,
    /// Index of the last entry applied to this node's state machine.
    pub last_applied: Option<u64>,
    /// Index of the last entry in this node's current snapshot (built or installed).
    #[serde(default)]
    pub snapshot: Option<u64>,
    /// Index of the last entry purged from this node's log.
    #[serde(default)]
    pub purged: Option<u64>,
}

/// A node's journal counters (from [`omnibus::DatabaseStats`]), since it opened.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct NodeStats {
    /// Commit records acknowledged (every group's appends, votes and applies).
    pub commits: u64,
    /// Journal batches written.
    pub batches: u64,
    /// `fdatasync` calls on journal files.
    pub journal_fdatasyncs: u64,
    /// Bytes written to journals.
    pub journal_bytes: u64,
    /// `InstallSnapshot` chunks received ([`RaftNode::snapshot_chunks_received`]).
    #[serde(default)]
    pub snapshot_chunks: u64,
}

/// A client connection to one address: requests answered in order.
#[derive(Debug)]
pub struct Connection {
    addr: String,
    stream: Option<(BufReader<OwnedReadHalf>, OwnedWriteHalf)>,
}

impl Connection {
    /// A connection to `addr` (`host:port`), opened on the first call.
    pub fn new(addr: impl Into<String>) -> Connection {
        Connection {
            addr: addr.into(),
            stream: None,
        }
    }

    /// The address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Sends `msg` and reads its reply, within `timeout`. Errors: connect, write and read
    /// errors, `TimedOut`, `UnexpectedEof` when the peer closed, `InvalidData` for a reply
    /// that does not decode or is longer than [`MAX_LINE`]; after any error the connection
    /// is dropped (the next call reconnects).
    pub async fn call<R: DeserializeOwned>(
        &mut self,
        msg: &Message,
        timeout: Duration,
    ) -> std::io::Result<R> {
        match tokio::time::timeout(timeout, self.call_inner(msg)).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => {
                self.stream = None;
                Err(e)
            }
            Err(_) => {
                self.stream = None;
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no reply from {} within {timeout:?}", self.addr),
                ))
            }
        }
    }

    async fn call_inner<R: DeserializeOwned>(&mut self, msg: &Message) -> std::io::Result<R> {
        if self.stream.is_none() {
            let s = TcpStream::connect(&self.addr).await?;
            s.set_nodelay(true)?;
            let (r, w) = s.into_split();
            self.stream = Some((BufReader::new(r), w));
        }
        let Some((r, w)) = self.stream.as_mut() else {
            return Err(std::io::Error::other("not connected"));
        };
        let mut line = serde_json::to_vec(msg).map_err(std::io::Error::other)?;
        line.push(b'\n');
        w.write_all(&line).await?;
        let reply = read_line(r).await?.ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "connection closed")
        })?;
        serde_json::from_slice(&reply)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }
}

/// Reads one line (without its `\n`), at most [`MAX_LINE`] bytes; `None` at end of stream.
async fn read_line(r: &mut BufReader<OwnedReadHalf>) -> std::io::Result<Option<Vec<u8>>> {
    let mut buf = Vec::new();
    loop {
        let avail = r.fill_buf().await?;
        if avail.is_empty() {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "line cut short",
                ))
            };
        }
        if let Some(i) = avail.iter().position(|&b| b == b'\n') {
            buf.extend_from_slice(&avail[..i]);
            r.consume(i + 1);
            return Ok(Some(buf));
        }
        let n = avail.len();
        buf.extend_from_slice(avail);
        r.consume(n);
        if buf.len() > MAX_LINE {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("line longer than {MAX_LINE} bytes"),
            ));
        }
    }
}

/// The network factory of one group: a [`TcpNetwork`] per peer.
#[derive(Debug, Clone)]
pub struct TcpNetworkFactory {
    group: GroupId,
}

impl TcpNetworkFactory {
    /// The factory of `group`.
    pub fn new(group: GroupId) -> TcpNetworkFactory {
        TcpNetworkFactory { group }
    }
}

impl RaftNetworkFactory<TypeConfig> for TcpNetworkFactory {
    type Network = TcpNetwork;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> TcpNetwork {
        TcpNetwork {
            group: self.group,
            target,
            conn: Connection::new(node.addr.clone()),
        }
    }
}

/// One group's client of one peer.
#[derive(Debug)]
pub struct TcpNetwork {
    group: GroupId,
    target: NodeId,
    conn: Connection,
}

impl TcpNetwork {
    async fn rpc<R: DeserializeOwned, E: std::error::Error + DeserializeOwned>(
        &mut self,
        msg: Message,
        option: &RPCOption,
    ) -> Result<R, RPCError<NodeId, BasicNode, E>> {
        let reply: Result<R, E> = self.conn.call(&msg, option.hard_ttl()).await.map_err(|e| {
            if e.kind() == std::io::ErrorKind::InvalidData {
                RPCError::Network(NetworkError::new(&e))
            } else {
                RPCError::Unreachable(Unreachable::new(&e))
            }
        })?;
        reply.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for TcpNetwork {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let group = self.group;
        self.rpc(Message::AppendEntries { group, rpc }, &option)
            .await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        let group = self.group;
        let rpc = SnapshotChunk::from(rpc);
        self.rpc(Message::InstallSnapshot { group, rpc }, &option)
            .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let group = self.group;
        self.rpc(Message::Vote { group, rpc }, &option).await
    }
}

/// The reply to a client's [`Message::Write`].
pub type WriteReply =
    Result<ClientWriteResponse<TypeConfig>, RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>>;

fn no_group(group: GroupId) -> String {
    format!("no group {group} on this node")
}

/// Answers one request.
async fn dispatch(node: &RaftNode, msg: Message) -> serde_json::Result<Vec<u8>> {
    match msg {
        Message::AppendEntries { group, rpc } => match node.raft(group) {
            Some(r) => serde_json::to_vec(&r.append_entries(rpc).await),
            None => serde_json::to_vec(&Err::<(), _>(no_group(group))),
        },
        Message::Vote { group, rpc } => match node.raft(group) {
            Some(r) => serde_json::to_vec(&r.vote(rpc).await),
            None => serde_json::to_vec(&Err::<(), _>(no_group(group))),
        },
        Message::InstallSnapshot { group, rpc } => match node.raft(group) {
            Some(r) => {
                node.count_snapshot_chunk();
                serde_json::to_vec(&r.install_snapshot(rpc.into()).await)
            }
            None => serde_json::to_vec(&Err::<(), _>(no_group(group))),
        },
        Message::Write { group, request } => match node.raft(group) {
            Some(r) => {
                let reply: WriteReply = r.client_write(request).await;
                serde_json::to_vec(&reply)
            }
            None => serde_json::to_vec(&Err::<(), _>(no_group(group))),
        },
        Message::Read { group, key } => {
            let r = match node.kv(group) {
                Some(kv) => kv.get(&key).map_err(|e| e.to_string()),
                None => Err(no_group(group)),
            };
            serde_json::to_vec(&r)
        }
        Message::Status { group } => {
            let r = node.status(group).ok_or_else(|| no_group(group));
            serde_json::to_vec(&r)
        }
        Message::Stats => {
            let st = node.database().stats();
            let r: Result<NodeStats, String> = Ok(NodeStats {
                commits: st.commits,
                batches: st.batches,
                journal_fdatasyncs: st.journal_fdatasyncs,
                journal_bytes: st.journal_bytes,
                snapshot_chunks: node.snapshot_chunks_received(),
            });
            serde_json::to_vec(&r)
        }
        Message::Initialize { members } => {
            let r = node.initialize(members).await.map_err(|e| e.to_string());
            serde_json::to_vec(&r)
        }
    }
}

/// Serves `node` on `listener` until the listener fails: a task per connection, requests
/// answered in order on each. A line that does not decode closes its connection.
pub async fn serve(listener: TcpListener, node: Arc<RaftNode>) -> std::io::Result<()> {
    loop {
        let (sock, _) = listener.accept().await?;
        let _ = sock.set_nodelay(true);
        let node = node.clone();
        tokio::spawn(async move {
            let (r, mut w) = sock.into_split();
            let mut r = BufReader::new(r);
            while let Ok(Some(line)) = read_line(&mut r).await {
                let Ok(msg) = serde_json::from_slice::<Message>(&line) else {
                    return;
                };
                let Ok(mut reply) = dispatch(&node, msg).await else {
                    return;
                };
                reply.push(b'\n');
                if w.write_all(&reply).await.is_err() {
                    return;
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, LogId, Membership, StoredMembership};

    fn chunk(data: Vec<u8>) -> SnapshotChunk {
        let log_id = LogId::new(CommittedLeaderId::new(3, 1), 399);
        SnapshotChunk {
            vote: Vote::new_committed(3, 1),
            meta: SnapshotMeta {
                last_log_id: Some(log_id),
                last_membership: StoredMembership::new(
                    Some(log_id),
                    Membership::new(vec![[1, 2, 3].into()], None),
                ),
                snapshot_id: "3-1-399-7".into(),
            },
            offset: 1 << 20,
            data,
            done: false,
        }
    }

    #[test]
    fn a_chunk_goes_as_base64_and_comes_back_whole() {
        let data: Vec<u8> = (0..3u32 << 10)
            .map(|i| i.wrapping_mul(2_654_435_761) as u8)
            .collect();
        let msg = Message::InstallSnapshot {
            group: 7,
            rpc: chunk(data.clone()),
        };
        let line = serde_json::to_vec(&msg).expect("encode");
        // 3 KiB of snapshot: 4 KiB of base64 plus the request's other fields.
        assert!(line.len() < 4096 + 512, "{} bytes on the wire", line.len());
        let Message::InstallSnapshot { group, rpc } =
            serde_json::from_slice(&line).expect("decode")
        else {
            panic!("not a snapshot chunk");
        };
        assert_eq!(group, 7);
        assert_eq!(rpc, chunk(data.clone()));
        let req: InstallSnapshotRequest<TypeConfig> = rpc.into();
        assert_eq!(req.data, data);
        assert_eq!(SnapshotChunk::from(req), chunk(data));
    }

    #[test]
    fn a_chunk_that_is_not_base64_does_not_decode() {
        let line = serde_json::to_string(&Message::InstallSnapshot {
            group: 0,
            rpc: chunk(b"abc".to_vec()),
        })
        .expect("encode");
        let bad = line.replace("\"YWJj\"", "\"YW!j\"");
        assert_ne!(bad, line);
        assert!(serde_json::from_str::<Message>(&bad).is_err());
    }
}
