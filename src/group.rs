//! [`GroupTransaction`]: one transaction over several storages of a database (the root and
//! branches), committed as one atomic unit through the shared journal.
//!
//! Each storage of the group has its own [`WriteTransaction`] (its own B+tree, txn ids and
//! writer), taken in lock order ([`crate::Database::begin_group`]). The commit prepares every
//! storage's record as its own commit would (`WriteTransaction::prepare`), wraps them into one
//! group record (design.md 3.11: one header, one body checksum over every part) when two or
//! more storages changed, hands that one record to the shared journal, and publishes every
//! storage's new state once it is durable (`PreparedCommit::finish`). Recovery reads the group
//! record as its parts, and each storage replays its own part exactly when the record is whole
//! (invariant I14).

use std::sync::{Arc, RwLock};

use crate::btree::{KeyRange, Range};
use crate::error::{Error, GroupError, Result};
use crate::journal::record::{group_record, OutRecord};
use crate::journal::Journal;
use crate::options::Durability;
use crate::storage::Storage;
use crate::txn::WriteTransaction;

/// Most storages in one group transaction ([`GroupError::TooManyStorages`] past it).
pub const MAX_GROUP_STORAGES: usize = 256;

/// Most bytes of one group's journal record, every storage's part and the record's headers
/// counted ([`GroupError::TooLarge`] at commit past it): 64 MiB. A group that changed one
/// storage writes that storage's own record and is not held to it.
pub const MAX_GROUP_BYTES: u64 = 64 << 20;

/// A write transaction over several storages of one [`crate::Database`], committed as one
/// atomic unit: after any crash either every storage shows it or none does
/// ([`crate::Database::begin_group`]). Each storage keeps its own B+tree and its own txn ids;
/// reads through the group see the group's own writes. Dropping it, or [`abort`], discards
/// every change and releases every storage's writer.
///
/// What it does not give: one snapshot across storages. Each storage publishes its part when
/// the group is durable, one storage after another, so a reader that begins snapshots of two
/// storages while the commit returns may see the group in one and not yet in the other.
///
/// [`abort`]: GroupTransaction::abort
pub struct GroupTransaction {
    journal: Arc<Journal>,
    /// The database's group lock: held shared from the journal write until every part is
    /// published, so that a database backup (which takes it exclusively for its cut) never
    /// copies part of a group.
    publishing: Arc<RwLock<()>>,
    /// The storages in lock order (the root first, then branches by name), each with its write
    /// transaction.
    members: Vec<(Storage, WriteTransaction)>,
    durability: Durability,
}

impl std::fmt::Debug for GroupTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GroupTransaction({} storages)", self.members.len())
    }
}

impl GroupTransaction {
    /// Takes the writer of each of `storages` (already checked and in lock order), waiting for
    /// each when `wait`; on a failure the writers taken so far are released.
    pub(crate) fn begin(
        journal: Arc<Journal>,
        publishing: Arc<RwLock<()>>,
        storages: Vec<Storage>,
        wait: bool,
    ) -> Result<GroupTransaction> {
        let mut members = Vec::with_capacity(storages.len());
        for s in storages {
            let w = if wait {
                s.begin_write()?
            } else {
                s.try_begin_write()?
            };
            members.push((s, w));
        }
        Ok(GroupTransaction {
            journal,
            publishing,
            members,
            durability: Durability::Immediate,
        })
    }

    fn txn(&self, storage: &Storage) -> Result<&WriteTransaction> {
        self.members
            .iter()
            .find(|(s, _)| Arc::ptr_eq(&s.inner, &storage.inner))
            .map(|(_, w)| w)
            .ok_or_else(|| not_in_group(storage))
    }

    fn txn_mut(&mut self, storage: &Storage) -> Result<&mut WriteTransaction> {
        self.members
            .iter_mut()
            .find(|(s, _)| Arc::ptr_eq(&s.inner, &storage.inner))
            .map(|(_, w)| w)
            .ok_or_else(|| not_in_group(storage))
    }

    /// Number of storages in the group.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// True when the group has no storage (committing it writes nothing).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Inserts or replaces `key` with `value` in `storage`, as [`WriteTransaction::put`].
    ///
    /// Errors: [`GroupError::NotInGroup`] when `storage` is not one of the group's; otherwise
    /// as [`WriteTransaction::put`] ([`Error::EmptyKey`], [`Error::KeyTooLarge`],
    /// [`Error::ValueTooLarge`], corruption or I/O reading pages).
    pub fn put(
        &mut self,
        storage: &Storage,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> Result<()> {
        self.txn_mut(storage)?.put(key, value)
    }

    /// Deletes `key` from `storage`; true when it was there. As [`WriteTransaction::delete`].
    ///
    /// Errors: [`GroupError::NotInGroup`]; otherwise as [`WriteTransaction::delete`].
    pub fn delete(&mut self, storage: &Storage, key: impl AsRef<[u8]>) -> Result<bool> {
        self.txn_mut(storage)?.delete(key)
    }

    /// The value of `key` in `storage` as this group sees it (its own writes included), copied
    /// out.
    ///
    /// Errors: [`GroupError::NotInGroup`]; otherwise as [`WriteTransaction::get`].
    pub fn get(&self, storage: &Storage, key: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>> {
        self.txn(storage)?.get(key)
    }

    /// The entries of `storage` in `bounds` as this group sees them (its own writes included),
    /// in key order; as [`WriteTransaction::range`].
    ///
    /// Errors: [`GroupError::NotInGroup`]; otherwise as [`WriteTransaction::range`].
    pub fn range<K, R: KeyRange<K>>(&self, storage: &Storage, bounds: R) -> Result<Range<'_>> {
        self.txn(storage)?.range(bounds)
    }

    /// Chooses when [`GroupTransaction::commit`] returns, for the whole group:
    /// [`Durability::Immediate`] (the default) once the group record is durable,
    /// [`Durability::Eventual`] once it is queued (as [`WriteTransaction::set_durability`]; a
    /// crash may then lose the whole group, never part of it).
    pub fn set_durability(&mut self, durability: Durability) {
        self.durability = durability;
    }

    /// The durability the commit will use ([`GroupTransaction::set_durability`]).
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// Commits every storage's changes as one unit: one journal record holding every changed
    /// storage's part (a group of one changed storage writes that storage's own record), made
    /// durable by one `fdatasync` of the shared journal (shared with whatever other commits
    /// join its batch); then each storage publishes its new state. After a crash every storage
    /// shows its part, or none does. Storages the group did not change write nothing.
    ///
    /// Errors: [`GroupError::TooLarge`] when the group record (two or more changed storages)
    /// would pass [`MAX_GROUP_BYTES`] (nothing written, the storages stay usable; a group that
    /// changed one storage has a plain commit's limits only); as [`WriteTransaction::commit`] otherwise: `ENOSPC`
    /// growing a data file (nothing written), an I/O error writing or syncing the journal (every
    /// storage of the database is then poisoned), [`Error::Poisoned`]. After an error nothing
    /// of the group is visible.
    pub fn commit(self) -> Result<()> {
        let _span = tracing::debug_span!("group commit", storages = self.members.len()).entered();
        let mut prepared = Vec::with_capacity(self.members.len());
        for (_, mut w) in self.members {
            w.set_durability(self.durability);
            // A failure here leaves every prepared commit to its drop: nothing was journaled.
            if let Some(p) = w.prepare()? {
                prepared.push(p);
            }
        }
        let records: Vec<_> = prepared.iter_mut().map(|p| p.take_record()).collect();
        let Some(record) = group_commit_record(records)? else {
            return Ok(());
        };
        let _publishing = self.publishing.read().unwrap_or_else(|e| e.into_inner());
        let written = self.journal.commit_with(record, self.durability);
        let mut result = Ok(());
        for p in prepared {
            if let Err(e) = p.finish(written.clone()) {
                if result.is_ok() {
                    result = Err(e);
                }
            }
        }
        result
    }

    /// Discards every change (the same as dropping the group).
    pub fn abort(self) {}
}

/// The one journal record of a group's prepared parts: `None` for no part, a part's own record
/// when only one storage changed (a plain commit's limits only), else one group record
/// (design.md 3.11).
///
/// Errors: [`GroupError::TooLarge`] when the group record would pass [`MAX_GROUP_BYTES`].
pub(crate) fn group_commit_record(mut records: Vec<OutRecord>) -> Result<Option<OutRecord>> {
    match records.len() {
        0 => Ok(None),
        1 => Ok(records.pop()),
        _ => {
            let record = group_record(records);
            if record.total_len() > MAX_GROUP_BYTES {
                return Err(GroupError::TooLarge {
                    bytes: record.total_len(),
                    max: MAX_GROUP_BYTES,
                }
                .into());
            }
            Ok(Some(record))
        }
    }
}

fn not_in_group(storage: &Storage) -> Error {
    GroupError::NotInGroup {
        path: storage.path().to_path_buf(),
    }
    .into()
}
