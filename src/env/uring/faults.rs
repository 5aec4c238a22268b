//! Fault hooks of the lanes (tests): [`RingFaults`], the rules a lane's thread consults before
//! it submits an operation ([`RingFault::ShortWrite`], [`RingFault::Panic`]) and when it reads a
//! completion ([`RingFault::Errno`]), so each result the rounds handle can be provoked
//! (`tests/alone/ring_faults.rs`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::LaneKind;

/// What a [`RingFault`] applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingOp {
    /// `IORING_OP_WRITEV`.
    Write,
    /// `IORING_OP_FSYNC` (datasync).
    Sync,
    /// `IORING_OP_FALLOCATE`.
    Fallocate,
    /// `IORING_OP_SYNC_FILE_RANGE`.
    SyncRange,
}

/// A fault a lane's thread injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(any(test, feature = "testing")), allow(dead_code))] // read by tests only
pub enum RingFault {
    /// Submit only half of the write's remaining bytes (the kernel then really writes half) and
    /// report the sync linked behind it as `-ECANCELED`, as the kernel does after a short
    /// linked write.
    ShortWrite,
    /// Report this errno as the CQE's result (the operation itself ran: redoing it is what the
    /// engine must do for `EAGAIN`/`ECANCELED`, and what it must never do for a sync's `EIO`).
    Errno(i32),
    /// Panic on the lane's thread before submitting the operation (the thread dies).
    Panic,
}

/// One injection rule: the `skip + 1`-th matching operation and the `times - 1` after it
/// (`times == u32::MAX`: every one) get `fault`.
#[derive(Debug, Clone, Copy)]
pub struct RingFaultRule {
    /// The lane it applies to (`None`: both).
    pub lane: Option<LaneKind>,
    /// The operation kind it applies to.
    pub op: RingOp,
    /// The fault.
    pub fault: RingFault,
    /// Matching operations passed over first.
    pub skip: u32,
    /// Matching operations faulted after that (`u32::MAX`: all).
    pub times: u32,
}

/// Faults a lane injects, shared with the test that set them. Submissions and completions
/// consult the rules in order; the first rule that matches and has faults left applies.
#[derive(Debug, Default)]
pub struct RingFaults {
    rules: Mutex<Vec<RingFaultRule>>,
    injected: AtomicU64,
}

#[cfg_attr(not(any(test, feature = "testing")), allow(dead_code))] // read by tests only
impl RingFaults {
    /// No rules yet.
    pub fn new() -> Arc<RingFaults> {
        Arc::new(RingFaults::default())
    }

    /// Adds a rule.
    pub fn add(&self, rule: RingFaultRule) {
        self.rules
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(rule);
    }

    /// Removes every rule.
    pub fn clear(&self) {
        self.rules.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Faults injected so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    /// The fault for the next operation of kind `op`, consuming one use of the rule.
    pub(super) fn take(&self, lane: LaneKind, op: RingOp, at_submit: bool) -> Option<RingFault> {
        let mut rules = self.rules.lock().unwrap_or_else(|e| e.into_inner());
        for r in rules.iter_mut() {
            let submit_kind = matches!(r.fault, RingFault::ShortWrite | RingFault::Panic);
            if r.op != op
                || r.lane.is_some_and(|l| l != lane)
                || submit_kind != at_submit
                || r.times == 0
            {
                continue;
            }
            if r.skip > 0 {
                r.skip -= 1;
                return None;
            }
            if r.times != u32::MAX {
                r.times -= 1;
            }
            self.injected.fetch_add(1, Ordering::Relaxed);
            return Some(r.fault);
        }
        None
    }
}
