//! Committing a storage actor's transaction through the journal writer: alone, or as the
//! leader of a group whose other storages' actors each prepare a part ([`member`]).
//!
//! A group is led by the root storage's actor (the one actor that starts groups in a
//! database: `DatabaseHandle::write` sends it the batches, and with synchronous indexes every
//! root commit is a group). The protocol, for a leader transaction `w` and members `m1..mk`:
//!
//! 1. The leader prepares `w` (grows its data file on the journal I/O pool when needed, seals
//!    its pages, builds its record; nothing is written).
//! 2. It sends each member a [`GroupPart`] at once (a job, and three one-shot channels). Each
//!    member's actor, when it reaches the message, runs the job in a write transaction of its
//!    own, prepares it and answers `ready` with its record, then waits on `decision`, holding
//!    only its own storage's writer.
//! 3. Once every member is ready, the leader builds one group record of every changed
//!    storage's part (design.md 3.11; a plain record when only one storage changed), takes the
//!    database's group lock shared (a backup's cut takes it exclusively; never waited for on
//!    the executor: tried, and the task yields between tries), and hands the record to the
//!    journal writer.
//! 4. With the journal writer's answer it publishes its own state, sends every member the
//!    answer on `decision` (each publishes and answers `done`), and waits for every `done`
//!    before its writers are answered, so that an answered group is visible in every storage.
//!
//! No lock is held across executors: each member holds its own writer from its prepare to its
//! publication, which spans the other members' prepares and the journal write. Only one actor
//! leads groups, so no two groups wait for each other's members. A member that fails to
//! prepare fails the group: the leader drops its `decision` senders, and every prepared member
//! drops its prepared commit (nothing was journaled). After the journal write every member is
//! told the outcome, whatever it is.

use std::sync::{Arc, RwLock};

use super::io_pool::IoPool;
use super::journal_writer::{self, JournalMsg};
use super::messages::{ApplyJob, DocumentChange, GroupPart, StorageMsg, SyncIndex};
use crate::actor_interface::{
    self, Durability, Error, OutRecord, PreparedCommit, Result, Storage, WriteTransaction,
};

/// What a storage actor commits through.
pub(crate) struct CommitLinks {
    /// The journal writer its commits go to.
    pub journal: flume::Sender<JournalMsg>,
    /// The journal I/O pool, which grows its data file.
    pub journal_io: IoPool,
    /// The database's group lock, on the root of a database with a shared journal (the one
    /// actor that leads groups).
    pub group_lock: Option<Arc<RwLock<()>>>,
}

/// A member's part of a group the caller leads: the member's storage actor and the job run in
/// its write transaction.
pub(crate) struct Member {
    pub tx: flume::Sender<StorageMsg>,
    pub job: ApplyJob,
}

/// Runs `f`, which builds or prepares a transaction of `storage`; a panic poisons the storage
/// (and its journal) and is answered as [`Error::Poisoned`].
pub(crate) fn poison_on_panic<T>(storage: &Storage, f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| {
        actor_interface::poison_storage(
            storage,
            "a storage actor panicked while building a transaction",
        );
        Err(Error::Poisoned {
            cause: "a storage actor panicked".into(),
        })
    })
}

/// Grows `storage`'s data file when `w` needs it (a blocking `fallocate`, on `journal_io`,
/// while the executor serves its other actors: an error such as `ENOSPC` fails this
/// transaction only) and prepares the commit: `None` when `w` changed nothing.
async fn prepare(
    storage: &Storage,
    w: WriteTransaction,
    journal_io: &IoPool,
) -> Result<Option<PreparedCommit>> {
    let mut w = w;
    let growth = poison_on_panic(storage, || actor_interface::data_file_growth(&mut w))?;
    if let Some(pages) = growth {
        let s = storage.clone();
        journal_io
            .run(move || actor_interface::grow_data_file(&s, pages))
            .await?;
    }
    poison_on_panic(storage, || actor_interface::prepare(w))
}

/// Commits `w` through the journal writer, with `members`' parts and, once its txn id is
/// known, the part of each of `sync` for `changes`, as one group when any member changed
/// anything (see the module's protocol). Returns once the commit is durable (with
/// [`Durability::Eventual`] only: queued) and published in every storage: `w`'s txn id, or
/// `None` when `w` changed nothing.
///
/// Errors: a member's (the group is given up, nothing is written); a synchronous index's map
/// function panicking (its `poison` error: the index is poisoned); [`crate::GroupError::TooLarge`];
/// the journal write's (every storage of the group is poisoned then); [`Error::Closed`] when a
/// member's actor is gone.
pub(crate) async fn commit_txn(
    storage: &Storage,
    w: WriteTransaction,
    mut members: Vec<Member>,
    sync: &[SyncIndex],
    changes: &[DocumentChange],
    links: &CommitLinks,
) -> Result<Option<u64>> {
    // The transaction's, also for members when the leader itself changed nothing.
    let durability = w.durability();
    let own = prepare(storage, w, &links.journal_io).await?;
    let txn = own.as_ref().map(actor_interface::prepared_txn_id);
    if let Some(t) = txn {
        for s in sync {
            let job = (s.part)(changes, t).map_err(|f| (s.poison)(f))?;
            members.push(Member {
                tx: s.tx.clone(),
                job,
            });
        }
    }
    if members.is_empty() {
        let Some(mut p) = own else {
            return Ok(None);
        };
        let record = actor_interface::take_record(&mut p);
        let written = journal_writer::write(&links.journal, record, durability).await;
        actor_interface::finish(p, written)?;
        return Ok(txn);
    }
    lead(own, members, durability, links).await?;
    Ok(txn)
}

/// Steps 2 to 4 of the protocol for the leader's prepared commit `own` (if it changed
/// anything) and `members`.
async fn lead(
    mut own: Option<PreparedCommit>,
    members: Vec<Member>,
    durability: Durability,
    links: &CommitLinks,
) -> Result<()> {
    // Step 2: every member prepares at once.
    let mut waiting = Vec::with_capacity(members.len());
    for m in members {
        let (ready, ready_rx) = flume::bounded(1);
        let (decision_tx, decision) = flume::bounded(1);
        let (done, done_rx) = flume::bounded(1);
        m.tx.send_async(StorageMsg::GroupPart(GroupPart {
            job: m.job,
            durability,
            ready,
            decision,
            done,
        }))
        .await
        .map_err(|_| Error::Closed)?;
        waiting.push((ready_rx, decision_tx, done_rx));
    }
    // Step 3: every record, or the first failure (dropping the `decision` senders gives the
    // group up: each prepared member drops its commit).
    let mut records: Vec<OutRecord> = Vec::with_capacity(waiting.len() + 1);
    let mut told = Vec::with_capacity(waiting.len());
    if let Some(p) = own.as_mut() {
        records.push(actor_interface::take_record(p));
    }
    for (ready_rx, decision_tx, done_rx) in waiting {
        // `None`: nothing changed there, that member is done already.
        if let Some(r) = ready_rx.recv_async().await.map_err(|_| Error::Closed)?? {
            records.push(r);
            told.push((decision_tx, done_rx));
        }
    }
    let Some(record) = actor_interface::group_commit_record(records)? else {
        return Ok(());
    };
    let _lock = match &links.group_lock {
        Some(l) => Some(read_lock(l).await),
        None => None,
    };
    let written = journal_writer::write(&links.journal, record, durability).await;
    // Step 4: every storage learns the outcome; the first error is the group's.
    let mut result = match own {
        Some(p) => actor_interface::finish(p, written.clone()),
        None => Ok(()),
    };
    let mut dones = Vec::with_capacity(told.len());
    for (decision_tx, done_rx) in told {
        // A member's actor is waiting on it (bounded channel of 1, never full).
        let _ = decision_tx.send(written.clone());
        dones.push(done_rx);
    }
    for done_rx in dones {
        let r = done_rx.recv_async().await.unwrap_or(Err(Error::Closed));
        if result.is_ok() {
            result = r;
        }
    }
    result
}

/// Takes `lock` shared without blocking the executor: while a backup's cut holds it (a few
/// microseconds), the task yields and tries again.
async fn read_lock(lock: &RwLock<()>) -> std::sync::RwLockReadGuard<'_, ()> {
    // Bounded by the backup's cut, which waits for nothing the executors do.
    loop {
        match lock.try_read() {
            Ok(g) => return g,
            Err(std::sync::TryLockError::Poisoned(e)) => return e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => futures_lite::future::yield_now().await,
        }
    }
}

/// A member's side of a group (`StorageMsg::GroupPart` on `storage`'s actor): runs the job in
/// a write transaction of its own, prepares it, answers `ready`, and publishes once the leader
/// sends the journal write's outcome.
///
/// The part's transaction applies no write buffer (a buffered index storage's part would
/// otherwise carry an apply step's pages into the group record now and then): the storage
/// actor applies it next, in a transaction of its own, when it is over its size or aged.
pub(crate) async fn member(storage: &Storage, part: GroupPart, links: &CommitLinks) {
    let GroupPart {
        job,
        durability,
        ready,
        decision,
        done,
    } = part;
    let prepared = async {
        let mut w = storage.try_begin_write()?;
        w.set_durability(durability);
        poison_on_panic(storage, || job(&mut w))?;
        actor_interface::defer_buffer_apply(&mut w);
        prepare(storage, w, &links.journal_io).await
    }
    .await;
    let mut p = match prepared {
        Ok(Some(p)) => p,
        Ok(None) => {
            let _ = ready.send(Ok(None));
            return;
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let record = actor_interface::take_record(&mut p);
    if ready.send(Ok(Some(record))).is_err() {
        // The leader gave the group up before its journal write: nothing to publish.
        return;
    }
    match decision.recv_async().await {
        Ok(written) => {
            let _ = done.send(actor_interface::finish(p, written));
        }
        // Given up (another member failed): the prepared commit is dropped, nothing written.
        Err(_) => drop(p),
    }
}
