//! Read-modify-write through a storage's actor: the transaction an update closure sees
//! ([`UpdateTransaction`]) and the job that carries the closure to the actor ([`job`]).
//!
//! [`crate::actors::StorageHandle::update`] sends a closure to the storage's actor, which runs
//! it on its executor inside a write transaction of its own (never merged with other
//! requests, so that the closure's error or panic abandons its own writes only), commits that
//! transaction as it commits any other, and answers with the closure's result once durable.
//!
//! The closure writes through an [`UpdateTransaction`], not the core's `WriteTransaction`:
//! on a database's root with indexes defined, each put, delete and range delete records the
//! document's old and new value for the index feed (as a write batch's operations do), so a
//! change made in a closure reaches every index; and the transaction's own commit and
//! durability stay the actor's.
//!
//! Panics: a panic of the closure's own code abandons its transaction (nothing of it
//! commits; the storage stays writable) and is answered as [`Error::UpdatePanicked`]. A panic
//! that comes from inside one of the engine's calls (a bug) poisons the storage, as a panic
//! while building any transaction does.

use std::cell::Cell;
use std::ops::Bound;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

use super::messages::{owned, DocumentChange, UpdateJob, UpdateRun};
use crate::actor_interface::{Error, KeyRange, Range, Result, WriteTransaction};

/// The write transaction an update closure runs in ([`crate::actors::StorageHandle::update`]):
/// reads see the transaction's own writes; writes commit together when the closure returns
/// `Ok`, and not at all when it returns `Err` or panics.
///
/// The closure runs on the storage's executor: keep it short and free of blocking calls (it
/// holds the storage's writer, and the executor's other actors wait for it). Its reads of
/// pages not in memory fault on that executor, as the actor's own reads do. A handle's
/// `blocking_` call inside it fails with [`Error::BlockingOnExecutor`] (it would wait for an
/// executor it stops); a panic abandons the transaction ([`Error::UpdatePanicked`]; the
/// default panic hook still prints it).
pub struct UpdateTransaction<'a> {
    txn: &'a mut WriteTransaction,
    /// The root's document changes for the index feed; `None` where no index is fed.
    changes: Option<&'a mut Vec<DocumentChange>>,
    /// Set when a call into the engine panicked (a bug: the storage is then poisoned).
    engine_panicked: Cell<bool>,
}

impl std::fmt::Debug for UpdateTransaction<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpdateTransaction")
            .field("feeds_indexes", &self.changes.is_some())
            .finish_non_exhaustive()
    }
}

impl<'a> UpdateTransaction<'a> {
    /// Wraps the actor's transaction; `changes` collects the document changes for the index
    /// feed (the root of a database with indexes).
    pub(crate) fn new(
        txn: &'a mut WriteTransaction,
        changes: Option<&'a mut Vec<DocumentChange>>,
    ) -> UpdateTransaction<'a> {
        UpdateTransaction {
            txn,
            changes,
            engine_panicked: Cell::new(false),
        }
    }

    /// True when one of the engine's calls panicked inside this transaction.
    pub(crate) fn engine_panicked(&self) -> bool {
        self.engine_panicked.get()
    }

    /// Runs an engine call, noting a panic from it before passing the panic on.
    fn engine<T>(&self, f: impl FnOnce() -> T) -> T {
        guard(&self.engine_panicked, f)
    }

    /// The value of `key` as this transaction sees it (its own writes included), copied out.
    ///
    /// Errors: as [`crate::WriteTransaction::get`] (an empty or too long key, a damaged page).
    pub fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>> {
        self.engine(|| self.txn.get(key))
    }

    /// The entries with keys in `bounds`, in key order, as this transaction sees them
    /// (range syntax as for [`crate::ReadTransaction::range`]; double-ended).
    ///
    /// Errors: as [`crate::WriteTransaction::range`].
    pub fn range<K, R: KeyRange<K>>(&self, bounds: R) -> Result<Range<'_>> {
        self.engine(|| self.txn.range(bounds))
    }

    /// Inserts or replaces `key`.
    ///
    /// Errors: as [`crate::WriteTransaction::put`] (key and value limits; after an I/O or
    /// corruption error the transaction fails, and the update with it).
    pub fn put(&mut self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<()> {
        let (key, value) = (key.as_ref(), value.as_ref());
        let txn = &mut *self.txn;
        let changes = self.changes.as_deref_mut();
        guard(&self.engine_panicked, || put_op(txn, changes, key, value))
    }

    /// Removes `key`; returns whether it was present.
    ///
    /// Errors: as [`crate::WriteTransaction::delete`].
    pub fn delete(&mut self, key: impl AsRef<[u8]>) -> Result<bool> {
        let txn = &mut *self.txn;
        let changes = self.changes.as_deref_mut();
        guard(&self.engine_panicked, || {
            delete_op(txn, changes, key.as_ref())
        })
    }

    /// Removes every entry with a key in `bounds`; returns how many were removed (as
    /// [`crate::WriteTransaction::delete_range`]; on a root that feeds indexes each removed
    /// document is read first, for the feed).
    ///
    /// Errors: as [`crate::WriteTransaction::delete_range`].
    pub fn delete_range<K, R: KeyRange<K>>(&mut self, bounds: R) -> Result<u64> {
        let bounds = (owned(bounds.start_key()), owned(bounds.end_key()));
        let txn = &mut *self.txn;
        let changes = self.changes.as_deref_mut();
        guard(&self.engine_panicked, || {
            delete_range_op(txn, changes, &bounds)
        })
    }
}

/// Runs an engine call that needs the transaction mutably, noting a panic in `flag`.
fn guard<T>(flag: &Cell<bool>, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(t) => t,
        Err(p) => {
            flag.set(true);
            resume_unwind(p)
        }
    }
}

/// The borrowed form of owned range bounds.
fn borrowed(b: &(Bound<Vec<u8>>, Bound<Vec<u8>>)) -> (Bound<&[u8]>, Bound<&[u8]>) {
    (
        b.0.as_ref().map(|k| k.as_slice()),
        b.1.as_ref().map(|k| k.as_slice()),
    )
}

/// A put, recording the document's change in `changes` (the index feed) when given: the one
/// put of write batches and update closures.
pub(crate) fn put_op(
    txn: &mut WriteTransaction,
    changes: Option<&mut Vec<DocumentChange>>,
    key: &[u8],
    value: &[u8],
) -> Result<()> {
    match changes {
        Some(changes) => {
            let old = txn.get(key)?;
            txn.put(key, value)?;
            if old.as_deref() != Some(value) {
                changes.push(DocumentChange {
                    key: key.to_vec(),
                    old,
                    new: Some(value.to_vec()),
                });
            }
        }
        None => txn.put(key, value)?,
    }
    Ok(())
}

/// A delete, recording the change when given (as [`put_op`]); whether `key` was present.
pub(crate) fn delete_op(
    txn: &mut WriteTransaction,
    changes: Option<&mut Vec<DocumentChange>>,
    key: &[u8],
) -> Result<bool> {
    match changes {
        Some(changes) => {
            let old = txn.get(key)?;
            let removed = txn.delete(key)?;
            if old.is_some() {
                changes.push(DocumentChange {
                    key: key.to_vec(),
                    old,
                    new: None,
                });
            }
            Ok(removed)
        }
        None => txn.delete(key),
    }
}

/// A range delete, recording each removed document when given (as [`put_op`]); how many
/// entries were removed.
pub(crate) fn delete_range_op(
    txn: &mut WriteTransaction,
    changes: Option<&mut Vec<DocumentChange>>,
    bounds: &(Bound<Vec<u8>>, Bound<Vec<u8>>),
) -> Result<u64> {
    if let Some(changes) = changes {
        for e in txn.range(borrowed(bounds))? {
            let (k, v) = e?;
            changes.push(DocumentChange {
                key: k.to_vec(),
                old: Some(v.to_vec()),
                new: None,
            });
        }
    }
    txn.delete_range(borrowed(bounds))
}

/// The job that carries `f` to the storage's actor, answered on `reply`: it runs `f` on an
/// [`UpdateTransaction`] over the actor's transaction and says whether to commit; its answer
/// is `f`'s value once the commit is durable, else `f`'s own error, else the commit's error
/// (also when `f` panicked: [`Error::UpdatePanicked`], or the poisoning where the panic came
/// from the engine).
pub(crate) fn job<F, T, E>(f: F, reply: flume::Sender<std::result::Result<T, E>>) -> UpdateJob
where
    F: FnOnce(&mut UpdateTransaction<'_>) -> std::result::Result<T, E> + Send + 'static,
    T: Send + 'static,
    E: From<Error> + Send + 'static,
{
    Box::new(move |begun| {
        let (out, poison) = match begun {
            Err(e) => (Some(Err(E::from(e))), false),
            Ok((txn, changes)) => {
                let mut ut = UpdateTransaction::new(txn, changes);
                let out = catch_unwind(AssertUnwindSafe(|| f(&mut ut)));
                let poison = ut.engine_panicked();
                let out = match out {
                    Ok(out) => Some(out),
                    // The engine's panic poisons the storage: the actor answers with that.
                    Err(_) if poison => None,
                    Err(p) => Some(Err(E::from(Error::UpdatePanicked {
                        message: panic_message(&*p),
                    }))),
                };
                (out, poison)
            }
        };
        let commit = matches!(out, Some(Ok(_)));
        UpdateRun {
            commit,
            poison,
            answer: Box::new(move |committed: Result<()>| {
                let r = match (out, committed) {
                    (Some(Ok(t)), Ok(())) => Ok(t),
                    (Some(Err(e)), _) => Err(e),
                    (_, Err(e)) => Err(E::from(e)),
                    // Not reached: no commit without an `Ok` from `f`.
                    (None, Ok(())) => Err(E::from(Error::Closed)),
                };
                let _ = reply.send(r);
            }),
        }
    })
}

/// The message of a caught panic (empty when it was not a string).
pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}
