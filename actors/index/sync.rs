//! A synchronous index ([`crate::actors::IndexMode::Synchronous`]) as the root's storage actor
//! keeps it: the index's part of each root commit (its entries' puts and deletes for the
//! commit's document changes, settled as a batch's, and its applied record), committed with the
//! documents as one group (`commit.rs`).

use super::batch::{diff_change, Ops};
use super::definition::{applied_record, read_applied, INDEX_APPLIED_KEY};
use super::progress::IndexShared;
use super::IndexDefinition;
use crate::actors::messages::{ApplyJob, SyncIndex};
use crate::actors::storage::StorageHandle;
use std::sync::Arc;

/// The root actor's view of index `def`, kept in `branch` with progress `shared`.
pub(crate) fn sync_index(
    def: &IndexDefinition,
    shared: Arc<IndexShared>,
    branch: &StorageHandle,
) -> SyncIndex {
    let map = def.map.clone();
    let (skips, applied, poison) = (shared.clone(), shared.clone(), shared);
    let storage = branch.storage.clone();
    SyncIndex {
        name: def.name.clone(),
        tx: branch.tx.sender().clone(),
        part: Box::new(move |changes, txn| {
            let mut ops = Ops::with_capacity(0, changes.len() * 2);
            let mut skipped = 0;
            for c in changes {
                skipped += diff_change(&*map, c, &mut ops)?;
            }
            skips.add_skipped(skipped);
            ops.settle();
            let job: ApplyJob = Box::new(move |w| {
                for o in &ops.ops {
                    let k = ops.key(o);
                    if o.put {
                        w.put(k, b"")?;
                    } else {
                        w.delete(k)?;
                    }
                }
                w.put(INDEX_APPLIED_KEY, applied_record(txn))
            });
            Ok(job)
        }),
        applied: Box::new(move |txn, n| applied.synchronous_applied(txn, n)),
        current: Box::new(move || read_applied(&storage.begin_read()?)),
        poison: Box::new(move |f| poison.poison_synchronous(f)),
    }
}
