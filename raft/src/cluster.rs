//! A cluster of node processes on 127.0.0.1 and its client: the harness of
//! `examples/raft_cluster.rs`, of its test (`raft/tests/cluster_sigkill.rs`) and of the benchmark.
//!
//! Each node is a separate process (the caller's own executable run with the arguments of
//! [`node_args`]; its `main` hands them to [`run_node`]), with its own directory, listening on
//! an ephemeral port that it prints on its first stdout line (`listening <addr>`). A node
//! exits when its stdin closes, so nodes never outlive the process that started them unless
//! killed first; a restarted node listens on the port it had.
//!
//! [`run_check`] is the kill test: start 3 nodes, initialize every group, write keys through
//! the leaders with several clients, SIGKILL the leader of group 0 once half of the keys are
//! acknowledged, keep writing through the new leaders, restart the killed node, wait until
//! every node has applied every group's log, then read every acknowledged key from every
//! node.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use omnibus::actors::{Engine, EngineOptions};
use omnibus::JournalMode;
use openraft::error::{ClientWriteError, RaftError};
use openraft::BasicNode;

use crate::network::{serve, Connection, GroupStatus, Message, NodeStats, WriteReply};
use crate::{GroupId, NodeId, NodeOptions, RaftNode, Request};

/// What a node process runs with.
#[derive(Debug, Clone)]
pub struct NodeArgs {
    /// The node's id (1-based).
    pub id: NodeId,
    /// Its directory.
    pub dir: PathBuf,
    /// The address to listen on (`127.0.0.1:0` for an ephemeral port).
    pub listen: String,
    /// Raft groups on the node.
    pub groups: u64,
    /// Whether the groups share one journal ([`JournalMode::Shared`]) or every storage has
    /// its own ([`JournalMode::Separate`]).
    pub journal: JournalMode,
    /// When the node's groups build snapshots and how they send them.
    pub snapshots: SnapshotArgs,
}

/// A node's snapshot settings (passed on to its [`openraft::Config`]); zeros keep openraft's
/// defaults (a snapshot every 5,000 applied entries, 3 MiB chunks).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SnapshotArgs {
    /// Build a snapshot every `every` applied entries (`SnapshotPolicy::LogsSinceLast`) and
    /// purge the log up to it (`max_in_snapshot_log_to_keep: 0`); 0: openraft's defaults.
    pub every: u64,
    /// `snapshot_max_chunk_size` in bytes; 0: openraft's default.
    pub chunk: u64,
}

impl SnapshotArgs {
    /// Applies these settings to `config`.
    pub fn apply(&self, config: &mut openraft::Config) {
        if self.every > 0 {
            config.snapshot_policy = openraft::SnapshotPolicy::LogsSinceLast(self.every);
            config.max_in_snapshot_log_to_keep = 0;
        }
        if self.chunk > 0 {
            config.snapshot_max_chunk_size = self.chunk;
        }
    }
}

/// The command-line arguments that make a process run `a` (after the program name):
/// `node <id> <dir> <listen> <groups> <shared|separate> <snapshot every> <snapshot chunk>`.
pub fn node_args(a: &NodeArgs) -> Vec<String> {
    vec![
        "node".into(),
        a.id.to_string(),
        a.dir.display().to_string(),
        a.listen.clone(),
        a.groups.to_string(),
        match a.journal {
            JournalMode::Separate => "separate".into(),
            _ => "shared".into(),
        },
        a.snapshots.every.to_string(),
        a.snapshots.chunk.to_string(),
    ]
}

/// Parses what [`node_args`] made (without the leading `node`). Errors: a message naming the
/// bad argument.
pub fn parse_node_args(args: &[String]) -> Result<NodeArgs, String> {
    let [id, dir, listen, groups, journal, every, chunk] = args else {
        return Err(
            "usage: node <id> <dir> <listen> <groups> <shared|separate> <snapshot every> \
             <snapshot chunk>"
                .into(),
        );
    };
    Ok(NodeArgs {
        id: id.parse().map_err(|_| format!("bad node id {id:?}"))?,
        dir: PathBuf::from(dir),
        listen: listen.clone(),
        groups: groups
            .parse()
            .map_err(|_| format!("bad group count {groups:?}"))?,
        journal: match journal.as_str() {
            "shared" => JournalMode::Shared,
            "separate" => JournalMode::Separate,
            j => return Err(format!("bad journal mode {j:?}")),
        },
        snapshots: SnapshotArgs {
            every: every
                .parse()
                .map_err(|_| format!("bad snapshot interval {every:?}"))?,
            chunk: chunk
                .parse()
                .map_err(|_| format!("bad snapshot chunk size {chunk:?}"))?,
        },
    })
}

/// The node side of a program that [`Cluster`] starts as its node processes (the example, the
/// tests, the benchmark re-run their own executable with `node ...` arguments): when `args`
/// (the command line without the program name) starts with `node`, runs that node
/// ([`parse_node_args`], [`run_node`]) and exits the process (status 0, or 1 with the error on
/// stderr prefixed by `who`); otherwise returns and the program goes on as the controller.
pub fn serve_if_node(args: &[String], who: &str) {
    if args.first().map(String::as_str) != Some("node") {
        return;
    }
    let code = match parse_node_args(&args[1..])
        .map_err(Into::into)
        .and_then(run_node)
    {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{who}: {e}");
            1
        }
    };
    std::process::exit(code);
}

/// Runs a node until its stdin closes: opens it ([`RaftNode::open`], one executor pinned to one
/// of the CPUs the process may use, chosen by its id), listens (retrying a port still held for up to 10 s), prints
/// `listening <addr>`, serves. Errors: opening the node, binding the address.
pub fn run_node(a: NodeArgs) -> Result<(), Box<dyn std::error::Error>> {
    // The parent holds our stdin: when it goes away, so do we.
    std::thread::spawn(|| {
        let mut sink = String::new();
        while matches!(std::io::stdin().read_line(&mut sink), Ok(n) if n > 0) {
            sink.clear();
        }
        std::process::exit(0);
    });
    // One of the CPUs this process may use, chosen by the node's id (nodes side by side).
    let allowed = omnibus::actors::allowed_cpus()?;
    let engine = Engine::start(EngineOptions {
        executors: Some(1),
        cpus: allowed
            .get((a.id as usize) % allowed.len().max(1))
            .map(|&c| vec![c]),
        ..Default::default()
    })?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut opts = NodeOptions {
            groups: a.groups,
            database: omnibus::Options {
                journal_mode: a.journal,
                ..Default::default()
            },
            ..Default::default()
        };
        a.snapshots.apply(&mut opts.raft);
        let node = Arc::new(RaftNode::open(&engine, a.id, &a.dir, opts).await?);
        let mut tries = 0;
        let listener = loop {
            match tokio::net::TcpListener::bind(&a.listen).await {
                Ok(l) => break l,
                Err(e) if tries < 100 && e.kind() == std::io::ErrorKind::AddrInUse => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e.into()),
            }
        };
        println!("listening {}", listener.local_addr()?);
        use std::io::Write;
        std::io::stdout().flush()?;
        serve(listener, node).await?;
        Ok::<(), Box<dyn std::error::Error>>(())
    })
}

/// The slot of node `id` (1-based) in a list of `len`. Errors: `InvalidInput` for an id that
/// names no node.
fn slot(id: NodeId, len: usize) -> std::io::Result<usize> {
    usize::try_from(id)
        .ok()
        .and_then(|i| i.checked_sub(1))
        .filter(|i| *i < len)
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("no node {id} (nodes are 1..={len})"),
            )
        })
}

struct Proc {
    child: Child,
    _stdin: ChildStdin,
}

/// Node processes started from one executable.
pub struct Cluster {
    exe: PathBuf,
    base: PathBuf,
    groups: u64,
    journal: JournalMode,
    snapshots: SnapshotArgs,
    procs: Vec<Option<Proc>>,
    addrs: Vec<String>,
}

impl Cluster {
    /// Starts `nodes` nodes (ids 1..=nodes) of `groups` groups from `exe` in directories
    /// `base/<id>`; each node's stderr goes to `base/node-<id>.log`. Errors: spawning, or a
    /// node that exits before saying where it listens.
    pub fn start(
        exe: &Path,
        base: &Path,
        nodes: u64,
        groups: u64,
        journal: JournalMode,
    ) -> std::io::Result<Cluster> {
        Cluster::start_with(exe, base, nodes, groups, journal, SnapshotArgs::default())
    }

    /// [`Cluster::start`] with every node (and every restart) running with `snapshots`.
    /// Errors: as [`Cluster::start`].
    pub fn start_with(
        exe: &Path,
        base: &Path,
        nodes: u64,
        groups: u64,
        journal: JournalMode,
        snapshots: SnapshotArgs,
    ) -> std::io::Result<Cluster> {
        let mut c = Cluster {
            exe: exe.to_path_buf(),
            base: base.to_path_buf(),
            groups,
            journal,
            snapshots,
            procs: Vec::new(),
            addrs: Vec::new(),
        };
        for id in 1..=nodes {
            let (p, addr) = c.spawn(id, "127.0.0.1:0")?;
            c.procs.push(Some(p));
            c.addrs.push(addr);
        }
        Ok(c)
    }

    fn spawn(&self, id: NodeId, listen: &str) -> std::io::Result<(Proc, String)> {
        let args = node_args(&NodeArgs {
            id,
            dir: self.base.join(id.to_string()),
            listen: listen.to_string(),
            groups: self.groups,
            journal: self.journal,
            snapshots: self.snapshots,
        });
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.base.join(format!("node-{id}.log")))?;
        let mut child = Command::new(&self.exe)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()?;
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| std::io::Error::other("no stdin"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("no stdout"))?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let Some(addr) = line.trim().strip_prefix("listening ") else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::other(format!(
                "node {id} did not start (see {}): {line:?}",
                self.base.join(format!("node-{id}.log")).display()
            )));
        };
        Ok((
            Proc {
                child,
                _stdin: stdin,
            },
            addr.to_string(),
        ))
    }

    /// The nodes' addresses, by id - 1.
    pub fn addrs(&self) -> &[String] {
        &self.addrs
    }

    /// The members to initialize the groups with.
    pub fn members(&self) -> BTreeMap<NodeId, BasicNode> {
        self.addrs
            .iter()
            .enumerate()
            .map(|(i, a)| (i as NodeId + 1, BasicNode::new(a)))
            .collect()
    }

    /// SIGKILLs node `id` and reaps it (nothing when it is not running). Errors: an id that
    /// names no node, the kill or the wait.
    pub fn kill(&mut self, id: NodeId) -> std::io::Result<()> {
        let i = slot(id, self.procs.len())?;
        if let Some(mut p) = self.procs[i].take() {
            p.child.kill()?;
            p.child.wait()?;
        }
        Ok(())
    }

    /// Starts node `id` again on its directory and address (after [`Cluster::kill`]).
    /// Errors: an id that names no node, or the errors of [`Cluster::start`].
    pub fn restart(&mut self, id: NodeId) -> std::io::Result<()> {
        let i = slot(id, self.procs.len())?;
        let addr = self.addrs[i].clone();
        let (p, _) = self.spawn(id, &addr)?;
        self.procs[i] = Some(p);
        Ok(())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for p in self.procs.iter_mut().flatten() {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
}

/// A client of a cluster: a connection per node, the leader it last found per group.
pub struct Client {
    conns: Vec<Connection>,
    leaders: Vec<NodeId>,
}

/// Per-attempt timeout of a client request.
const ATTEMPT: Duration = Duration::from_secs(3);

impl Client {
    /// A client of the nodes at `addrs` (node id = index + 1) for `groups` groups.
    pub fn new(addrs: &[String], groups: u64) -> Client {
        Client {
            conns: addrs.iter().map(|a| Connection::new(a.clone())).collect(),
            leaders: vec![1; groups as usize],
        }
    }

    /// Sends `msg` to node `id` and reads its reply. Errors: an id that names no node
    /// (`InvalidInput`), the errors of [`Connection::call`].
    pub async fn call<R: serde::de::DeserializeOwned>(
        &mut self,
        id: NodeId,
        msg: &Message,
    ) -> std::io::Result<R> {
        let i = slot(id, self.conns.len())?;
        self.conns[i].call(msg, ATTEMPT).await
    }

    /// Writes `request` to `group` through its leader, following `ForwardToLeader` answers
    /// and trying the other nodes while one is unreachable, until acknowledged or `patience`
    /// has passed. Returns the attempts it took. Errors: the last failure, once out of
    /// patience.
    pub async fn write(
        &mut self,
        group: GroupId,
        request: Request,
        patience: Duration,
    ) -> Result<u32, String> {
        let deadline = Instant::now() + patience;
        let n = self.conns.len() as NodeId;
        if n == 0 {
            return Err("no nodes".into());
        }
        let slot = usize::try_from(group)
            .ok()
            .filter(|g| *g < self.leaders.len());
        let mut target = slot.map_or(1, |g| self.leaders[g]);
        let msg = Message::Write { group, request };
        let mut attempts = 0;
        loop {
            attempts += 1;
            let why = match self.call::<WriteReply>(target, &msg).await {
                Ok(Ok(_)) => {
                    if let Some(g) = slot {
                        self.leaders[g] = target;
                    }
                    return Ok(attempts);
                }
                Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                    if let Some(l) = f.leader_id.filter(|l| *l != target) {
                        target = l;
                        continue;
                    }
                    format!("node {target}: no leader known")
                }
                Ok(Err(e)) => format!("node {target}: {e}"),
                Err(e) => format!("node {target}: {e}"),
            };
            if Instant::now() > deadline {
                return Err(why);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            target = target % n + 1;
        }
    }

    /// `group`'s status on node `id`.
    pub async fn status(&mut self, id: NodeId, group: GroupId) -> Result<GroupStatus, String> {
        let r: Result<GroupStatus, String> = self
            .call(id, &Message::Status { group })
            .await
            .map_err(|e| format!("node {id}: {e}"))?;
        r
    }

    /// Node `id`'s counters since it started.
    pub async fn stats(&mut self, id: NodeId) -> Result<NodeStats, String> {
        let r: Result<NodeStats, String> = self
            .call(id, &Message::Stats)
            .await
            .map_err(|e| format!("node {id}: {e}"))?;
        r
    }

    /// Reads `key` of `group` from node `id`'s own state machine.
    pub async fn read(
        &mut self,
        id: NodeId,
        group: GroupId,
        key: &str,
    ) -> Result<Option<String>, String> {
        let r: Result<Option<String>, String> = self
            .call(
                id,
                &Message::Read {
                    group,
                    key: key.to_string(),
                },
            )
            .await
            .map_err(|e| format!("node {id}: {e}"))?;
        r
    }

    /// Waits until every group has a leader that node `id` knows of. Errors: none within
    /// `patience`.
    pub async fn wait_for_leaders(
        &mut self,
        id: NodeId,
        groups: u64,
        patience: Duration,
    ) -> Result<(), String> {
        let deadline = Instant::now() + patience;
        for g in 0..groups {
            loop {
                if let Ok(GroupStatus {
                    leader: Some(l), ..
                }) = self.status(id, g).await
                {
                    if let Some(slot) = self.leaders.get_mut(g as usize) {
                        *slot = l;
                    }
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!("group {g} has no leader after {patience:?}"));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(())
    }
}

/// What [`run_check`] does.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// Keys to write (each once).
    pub keys: u64,
    /// Raft groups per node (key `i` goes to group `i % groups`).
    pub groups: u64,
    /// Concurrent clients.
    pub clients: u64,
    /// Whether the groups share one journal per node.
    pub journal: JournalMode,
    /// Whether to SIGKILL (and later restart) group 0's leader at half load.
    pub kill: bool,
}

/// What [`run_check`] found.
#[derive(Debug, Clone, Default)]
pub struct CheckReport {
    /// Keys whose write was acknowledged.
    pub acknowledged: u64,
    /// Acknowledged keys missing or different on at least one node.
    pub lost: u64,
    /// Writes never acknowledged (out of patience).
    pub unacknowledged: u64,
    /// The node killed (the leader of group 0 at half load); `None` without
    /// [`CheckOptions::kill`].
    pub killed: Option<NodeId>,
    /// Write attempts in all (more than the keys: redirects and retries around the kill).
    pub attempts: u64,
    /// Seconds from the first write to the last acknowledgement.
    pub write_secs: f64,
    /// Seconds the restarted node took to apply every group's log.
    pub catch_up_secs: f64,
}

/// Runs the kill test with nodes started from `exe` (a program whose `main` runs
/// [`run_node`] when given [`node_args`]) in directories under `base`. Lines of progress go
/// to stderr. Errors: a step that could not be carried out (a node that does not start, no
/// leader, a node that never catches up); data loss is not an error but the report's `lost`.
pub fn run_check(exe: &Path, base: &Path, o: &CheckOptions) -> Result<CheckReport, String> {
    let e = |e: std::io::Error| e.to_string();
    let cluster = Arc::new(Mutex::new(
        Cluster::start(exe, base, 3, o.groups, o.journal).map_err(e)?,
    ));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(e)?;
    let (addrs, members) = {
        let c = cluster.lock().unwrap_or_else(|e| e.into_inner());
        (c.addrs().to_vec(), c.members())
    };
    eprintln!("raft_cluster: 3 nodes at {addrs:?}, {} groups", o.groups);
    rt.block_on(async {
        let mut admin = Client::new(&addrs, o.groups);
        let r: Result<(), String> = admin
            .call(1, &Message::Initialize { members })
            .await
            .map_err(e)?;
        r?;
        admin.wait_for_leaders(1, o.groups, Duration::from_secs(30)).await?;

        // Load, with a SIGKILL of group 0's leader at half of it.
        let acked = Arc::new(AtomicU64::new(0));
        let next = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..o.clients {
            let (acked, next, addrs, o) = (acked.clone(), next.clone(), addrs.clone(), o.clone());
            tasks.push(tokio::spawn(async move {
                let mut c = Client::new(&addrs, o.groups);
                let mut mine = Vec::new();
                let (mut attempts, mut failed) = (0u64, 0u64);
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= o.keys {
                        break;
                    }
                    let (key, value) = (format!("key-{i}"), format!("value-{i}"));
                    let req = Request::Set {
                        key: key.clone(),
                        value: value.clone(),
                    };
                    match c.write(i % o.groups, req, Duration::from_secs(60)).await {
                        Ok(n) => {
                            attempts += n as u64;
                            acked.fetch_add(1, Ordering::Relaxed);
                            mine.push((i, key, value));
                        }
                        Err(why) => {
                            eprintln!("raft_cluster: key-{i} not acknowledged: {why}");
                            failed += 1;
                        }
                    }
                }
                (mine, attempts, failed)
            }));
        }
        // The killer: the leader of group 0 once half of the keys are acknowledged.
        let killed = if !o.kill { None } else { Some(loop {
            if acked.load(Ordering::Relaxed) >= o.keys / 2 {
                let st = admin.status(1, 0).await.or(admin.status(2, 0).await)?;
                let leader = st.leader.ok_or("group 0 has no leader at kill time")?;
                cluster
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .kill(leader)
                    .map_err(e)?;
                eprintln!(
                    "raft_cluster: SIGKILLed node {leader} (leader of group 0) after {} acknowledged writes",
                    acked.load(Ordering::Relaxed)
                );
                break leader;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }) };
        let mut report = CheckReport {
            killed,
            ..Default::default()
        };
        let mut written = Vec::new();
        for t in tasks {
            let (mine, attempts, failed) = t.await.map_err(|e| e.to_string())?;
            written.extend(mine);
            report.attempts += attempts;
            report.unacknowledged += failed;
        }
        report.write_secs = started.elapsed().as_secs_f64();
        report.acknowledged = written.len() as u64;
        eprintln!(
            "raft_cluster: {} writes acknowledged in {:.2} s ({} attempts)",
            report.acknowledged, report.write_secs, report.attempts
        );

        // Restart the killed node and wait until every node has applied every group's log.
        let caught = Instant::now();
        if let Some(killed) = killed {
            cluster
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .restart(killed)
                .map_err(e)?;
        }
        let survivor = if killed == Some(1) { 2 } else { 1 };
        admin.wait_for_leaders(survivor, o.groups, Duration::from_secs(30)).await?;
        for g in 0..o.groups {
            let leader = admin.status(survivor, g).await?.leader.ok_or("no leader")?;
            let target = admin.status(leader, g).await?.last_log_index;
            for id in 1..=3 {
                loop {
                    let st = admin.status(id, g).await;
                    if matches!(&st, Ok(s) if s.last_applied >= target) {
                        break;
                    }
                    if caught.elapsed() > Duration::from_secs(60) {
                        return Err(format!(
                            "node {id} group {g} did not catch up to {target:?}: {st:?}"
                        ));
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        report.catch_up_secs = caught.elapsed().as_secs_f64();
        if let Some(killed) = killed {
            eprintln!(
                "raft_cluster: node {killed} restarted and caught up in {:.2} s",
                report.catch_up_secs
            );
        }

        // Every acknowledged key, from every node.
        for (i, key, value) in &written {
            let mut ok = true;
            for id in 1..=3 {
                match admin.read(id, i % o.groups, key).await {
                    Ok(Some(v)) if v == *value => {}
                    other => {
                        if report.lost < 10 {
                            eprintln!("raft_cluster: {key} on node {id}: {other:?}, expected {value:?}");
                        }
                        ok = false;
                    }
                }
            }
            if !ok {
                report.lost += 1;
            }
        }
        Ok(report)
    })
}
