//! A document commit does not wait behind every queued index batch of its executor.
//!
//! The story: `omnibus bench shop` (1 documents storage + 100 indexes on 2 executors) showed a
//! document commit p99 of 600–950 ms with a p50 of 6 ms. Every root commit wakes all the index
//! actors of its executor at once; they and the root's storage actor shared glommio's one
//! default task queue, which runs tasks first in, first out, and looks at wakes from other
//! threads (the journal writer's reply) only every 100 ms (glommio's preempt timer). So the
//! next document commit, and the reply to it, waited for every index batch queued ahead. Now the
//! root's actor runs in a task queue of its own, which the executor picks before the default
//! queue whenever it has work, and the preempt timer is 5 ms: a document commit waits for the
//! task running when it arrives, not for the queue (bench shop: p99 280–360 ms).
//!
//! Here: one executor, 16 indexes whose map function blocks the executor for 50 ms on a "slow"
//! document. Writing one slow document queues 16 index batches (800 ms of executor time);
//! a document written right after it is acknowledged while most of those batches still wait
//! (2–5 of 16 ran first here: one per wake from another thread the commit needs; all 16
//! before the change).
//! Deterministic in what it counts (map calls run before the acknowledgement), not timed.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use omnibus::actors::IndexDefinition;

use crate::common::index as index_common;

static MAPS: AtomicUsize = AtomicUsize::new(0);

const INDEXES: usize = 16;

fn slow_map(_key: &[u8], doc: &[u8]) -> Vec<Vec<u8>> {
    if doc == b"slow" {
        MAPS.fetch_add(1, Ordering::SeqCst);
        // Blocks the executor, as a map function doing 50 ms of CPU work would.
        std::thread::sleep(Duration::from_millis(50));
    }
    vec![doc.to_vec()]
}

#[test]
fn a_document_commit_does_not_wait_for_the_queued_index_batches() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, db) = index_common::open_engine_on(dir.path().join("db"), 1);
    for i in 0..INDEXES {
        db.blocking_define_index(
            IndexDefinition::new(format!("slow_{i}"), slow_map).min_batch_interval(Duration::ZERO),
        )
        .unwrap();
    }
    db.blocking_wait_for_indexes().unwrap();
    let root = db.root();
    root.blocking_put("a", "slow").unwrap();
    // Every index actor now has a batch with one slow map call queued on the executor.
    root.blocking_put("b", "fast").unwrap();
    let maps_before_ack = MAPS.load(Ordering::SeqCst);
    eprintln!("map calls before the second acknowledgement: {maps_before_ack} of {INDEXES}");
    db.blocking_wait_for_indexes().unwrap();
    assert_eq!(
        MAPS.load(Ordering::SeqCst),
        INDEXES,
        "each index maps the slow document once"
    );
    assert!(
        maps_before_ack <= INDEXES * 5 / 8,
        "the second document was acknowledged only after {maps_before_ack} of the {INDEXES} \
         queued index batches ran: it waited behind the index work"
    );
    drop(db);
    engine.shutdown().unwrap();
}
