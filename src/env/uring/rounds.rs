//! An operation's *rounds* on a ring (module docs of `uring.rs`, "Every result handled"): the
//! SQEs each round submits (a write of the unwritten rest, linked to the sync when it ends the
//! operation's bytes; a sync; an `fallocate`; a `sync_file_range`), the reaping of completions,
//! and the decision once a round's every CQE is in: answer, resubmit the rest, redo a cancelled
//! sync or write, retry `EAGAIN`/`EINTR` a bounded number of times, or fail (a failed sync is
//! never retried).

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;

use io_uring::{opcode, squeue, types};

use super::faults::{RingFault, RingOp};
use super::request::Work;
use super::ring::{ud, Active, RingThread};
use super::{MAX_RETRIES, WAKE};
use crate::env::IOV_MAX_SLICES;

impl RingThread {
    /// Starts backlog requests in order while there is room.
    pub(super) fn start_backlog(&mut self) {
        // Bounded by the backlog's length.
        while let Some(req) = self.backlog.pop_front() {
            let slot = match self.free.pop() {
                Some(s) => s,
                None => {
                    self.slots.push(None);
                    self.slots.len() - 1
                }
            };
            self.slots[slot] = Some(Active {
                req,
                done: 0,
                synced: false,
                retries: 0,
                outstanding: 0,
                write_res: None,
                sync_res: None,
                round_len: 0,
                round_iov: Vec::new(),
                shortened: false,
            });
            if !self.start_round(slot) {
                // No room: put it back at the front and wait for completions.
                if let Some(a) = self.slots[slot].take() {
                    self.backlog.push_front(a.req);
                }
                self.free.push(slot);
                return;
            }
        }
    }

    /// Submits the SQEs the operation in `slot` needs next. False when there was no room
    /// (nothing submitted).
    fn start_round(&mut self, slot: usize) -> bool {
        let Some(a) = self.slots[slot].as_mut() else {
            return true;
        };
        a.write_res = None;
        a.sync_res = None;
        a.shortened = false;
        let fd = types::Fd(a.req.fd);
        let mut entries = std::mem::take(&mut self.sqe_buf);
        entries.clear();
        let op_kind;
        match &a.req.work {
            Work::Write {
                iov,
                n,
                total,
                sync,
            } => {
                if a.done < *total {
                    op_kind = RingOp::Write;
                    let fault = self
                        .faults
                        .as_ref()
                        .and_then(|f| f.take(self.kind, RingOp::Write, true));
                    if fault == Some(RingFault::Panic) {
                        panic!("injected: io_uring lane thread panics");
                    }
                    // The first round of an ordinary write points the SQE at the caller's
                    // iovecs; a rest, a long list or a shortened round gets its own.
                    let (ptr, count) = if a.done == 0 && *n <= IOV_MAX_SLICES && fault.is_none() {
                        a.round_len = *total;
                        (*iov, *n)
                    } else {
                        a.round_iov = rest_of(a.req.work.iov(), a.done, IOV_MAX_SLICES);
                        a.round_len = a.round_iov.iter().map(|v| v.iov_len as u64).sum();
                        if fault == Some(RingFault::ShortWrite) {
                            // `round_len` stays what the round asked for, so the kernel's
                            // answer reads as the short write it is.
                            a.round_iov = truncate_iov(&a.round_iov, a.round_len / 2);
                            a.shortened = true;
                        }
                        (a.round_iov.as_ptr(), a.round_iov.len())
                    };
                    let covers_rest = a.done + a.round_len == *total;
                    let w = opcode::Writev::new(fd, ptr, count as u32)
                        .offset(a.req.offset + a.done)
                        .ioprio(self.ioprio)
                        .build()
                        .user_data(ud(slot, false));
                    // Link the sync only behind a write that ends the operation's bytes (a
                    // shortened one included: the kernel cancels it, as after a real short
                    // write).
                    if *sync && covers_rest {
                        entries.push(w.flags(squeue::Flags::IO_LINK));
                        entries.push(fsync(fd, slot));
                    } else {
                        entries.push(w);
                    }
                } else {
                    op_kind = RingOp::Sync;
                    entries.push(fsync(fd, slot));
                }
            }
            Work::Sync => {
                op_kind = RingOp::Sync;
                entries.push(fsync(fd, slot));
            }
            Work::Fallocate { mode, len } => {
                op_kind = RingOp::Fallocate;
                entries.push(
                    opcode::Fallocate::new(fd, *len)
                        .offset(a.req.offset)
                        .mode(*mode)
                        .build()
                        .user_data(ud(slot, false)),
                );
            }
            Work::SyncRange { len, flags } => {
                op_kind = RingOp::SyncRange;
                entries.push(
                    opcode::SyncFileRange::new(fd, *len)
                        .offset(a.req.offset)
                        .flags(*flags)
                        .build()
                        .user_data(ud(slot, false)),
                );
            }
        }
        if op_kind != RingOp::Write {
            if let Some(f) = &self.faults {
                if let Some(RingFault::Panic) = f.take(self.kind, op_kind, true) {
                    panic!("injected: io_uring lane thread panics");
                }
            }
        }
        let n = entries.len() as u8;
        let pushed = self.push(&entries);
        self.sqe_buf = entries;
        if !pushed {
            return false;
        }
        if let Some(a) = self.slots[slot].as_mut() {
            a.outstanding = n;
        }
        true
    }

    pub(super) fn reap(&mut self) {
        let mut done = std::mem::take(&mut self.cqes);
        done.clear();
        done.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
        for &(data, res) in &done {
            self.in_flight = self.in_flight.saturating_sub(1);
            if data == WAKE {
                self.wake_armed = false;
                continue;
            }
            let slot = (data >> 1) as usize;
            let is_sync = data & 1 == 1;
            let faults = self.faults.clone();
            let Some(a) = self.slots.get_mut(slot).and_then(Option::as_mut) else {
                continue;
            };
            let mut res = res;
            if is_sync && a.shortened {
                res = -libc::ECANCELED;
            }
            if let Some(f) = &faults {
                let kind = if is_sync {
                    RingOp::Sync
                } else {
                    match a.req.work {
                        Work::Write { .. } => RingOp::Write,
                        Work::Sync => RingOp::Sync,
                        Work::Fallocate { .. } => RingOp::Fallocate,
                        Work::SyncRange { .. } => RingOp::SyncRange,
                    }
                };
                if let Some(RingFault::Errno(code)) = f.take(self.kind, kind, false) {
                    res = -code;
                }
            }
            if is_sync {
                a.sync_res = Some(res);
            } else {
                a.write_res = Some(res);
            }
            a.outstanding = a.outstanding.saturating_sub(1);
            if a.outstanding == 0 {
                self.finish_round(slot);
            }
        }
        self.cqes = done;
    }

    /// Every CQE of the round in `slot` is in: answer, or start the next round.
    fn finish_round(&mut self, slot: usize) {
        let Some(a) = self.slots[slot].as_mut() else {
            return;
        };
        let sh = &self.shared;
        let is_write = matches!(a.req.work, Work::Write { .. });
        let total = work_total(&a.req.work);
        let op_name = match a.req.work {
            Work::Write { .. } => "io_uring writev",
            Work::Sync => "io_uring fsync(DATASYNC)",
            Work::Fallocate { .. } => "io_uring fallocate",
            Work::SyncRange { .. } => "io_uring sync_file_range",
        };
        let mut failure: Option<(&'static str, io::Error)> = None;
        let mut retry: Option<i32> = None;
        // A sync of this round counts only when the ring itself completed the rest of the
        // write in the same round (or the round had no write): a sync linked behind a short,
        // cancelled or redone write covers nothing of what came after it.
        let mut ring_wrote_rest = !(is_write && a.write_res.is_some());
        let mut finished = false;
        if let Some(res) = a.write_res {
            match res {
                n if n > 0 && is_write => {
                    a.done += n as u64;
                    if (n as u64) < a.round_len {
                        sh.short_writes.fetch_add(1, Ordering::Relaxed);
                    } else if a.done >= total {
                        ring_wrote_rest = true;
                    }
                }
                n if n >= 0 && !is_write => finished = true,
                0 => {
                    failure = Some((
                        op_name,
                        io::Error::new(io::ErrorKind::WriteZero, "writev wrote 0 bytes"),
                    ))
                }
                e if e == -libc::EAGAIN || e == -libc::EINTR => retry = Some(-e),
                e if e == -libc::ECANCELED && is_write => {
                    // Redo the write with plain pwritev; the sync follows in the next round.
                    sh.plain_redos.fetch_add(1, Ordering::Relaxed);
                    let rest = rest_of(a.req.work.iov(), a.done, usize::MAX);
                    match plain_pwritev(a.req.fd, &rest, a.req.offset + a.done) {
                        Ok(()) => a.done = total,
                        Err(e) => failure = Some(("pwritev", e)),
                    }
                }
                e if e == -libc::ECANCELED => retry = Some(-e),
                e => failure = Some((op_name, io::Error::from_raw_os_error(-e))),
            }
        }
        if let Some(res) = a.sync_res {
            match res {
                0 if ring_wrote_rest && a.done >= total => a.synced = true,
                0 => {}
                e if e == -libc::ECANCELED => {
                    sh.syncs_redone.fetch_add(1, Ordering::Relaxed);
                }
                e if e == -libc::EAGAIN || e == -libc::EINTR => retry = retry.or(Some(-e)),
                // Never retried into success (fsyncgate, design.md invariant I2).
                e => failure = Some(("io_uring fsync(DATASYNC)", io::Error::from_raw_os_error(-e))),
            }
        }
        if let (Some(code), None) = (retry, &failure) {
            a.retries += 1;
            sh.retries.fetch_add(1, Ordering::Relaxed);
            if a.retries > MAX_RETRIES {
                let e = io::Error::from_raw_os_error(code);
                failure = Some((
                    op_name,
                    io::Error::new(e.kind(), format!("{e} after {MAX_RETRIES} resubmissions")),
                ));
            }
        }
        let complete = failure.is_none()
            && match &a.req.work {
                Work::Write { sync, .. } => a.done >= total && (!*sync || a.synced),
                Work::Sync => a.synced,
                Work::Fallocate { .. } | Work::SyncRange { .. } => finished,
            };
        if failure.is_some() || complete {
            if let Some(a) = self.slots[slot].take() {
                self.free.push(slot);
                sh.ops.fetch_add(1, Ordering::Relaxed);
                a.req.reply.send(match failure {
                    Some(f) => Err(f),
                    None => Ok(()),
                });
            }
            return;
        }
        if !self.start_round(slot) {
            self.pending_rounds_push(slot);
        }
    }

    fn pending_rounds_push(&mut self, slot: usize) {
        // Rare (the in-flight limit is reached by other operations): wait for one completion
        // and try again. Bounded: every completion frees room.
        let mut tries = 0u32;
        while !self.start_round(slot) {
            tries += 1;
            self.enter(1);
            assert!(tries < 1_000_000, "io_uring lane cannot make room");
            self.reap();
        }
    }
}

fn work_total(w: &Work) -> u64 {
    match w {
        Work::Write { total, .. } => *total,
        _ => 0,
    }
}

fn fsync(fd: types::Fd, slot: usize) -> squeue::Entry {
    opcode::Fsync::new(fd)
        .flags(types::FsyncFlags::DATASYNC)
        .build()
        .user_data(ud(slot, true))
}

/// The iovecs covering bytes `skip..` of `iov`, at most `max` of them.
fn rest_of(iov: &[libc::iovec], mut skip: u64, max: usize) -> Vec<libc::iovec> {
    let mut out = Vec::with_capacity(iov.len().min(max));
    for v in iov {
        if out.len() == max {
            break;
        }
        let len = v.iov_len as u64;
        if skip >= len {
            skip -= len;
            continue;
        }
        out.push(libc::iovec {
            // SAFETY (pointer arithmetic only): `skip < iov_len`, so the result stays inside
            // the caller's buffer.
            iov_base: unsafe { v.iov_base.cast::<u8>().add(skip as usize) }.cast(),
            iov_len: (len - skip) as usize,
        });
        skip = 0;
    }
    out
}

/// The first `keep` bytes of `iov`.
fn truncate_iov(iov: &[libc::iovec], mut keep: u64) -> Vec<libc::iovec> {
    let mut out = Vec::new();
    for v in iov {
        if keep == 0 {
            break;
        }
        let n = (v.iov_len as u64).min(keep);
        out.push(libc::iovec {
            iov_base: v.iov_base,
            iov_len: n as usize,
        });
        keep -= n;
    }
    out
}

/// Writes all of `iov` at `offset` with plain `pwritev` (the redo of a cancelled ring write).
fn plain_pwritev(fd: RawFd, iov: &[libc::iovec], offset: u64) -> io::Result<()> {
    let total: u64 = iov.iter().map(|v| v.iov_len as u64).sum();
    let mut done = 0u64;
    // Bounded: each pass writes at least one byte or fails; EINTR retries at most 1,000 times.
    let mut interrupts = 0;
    while done < total {
        let rest = rest_of(iov, done, IOV_MAX_SLICES);
        // SAFETY: the iovecs point into the caller's buffers, alive while it waits for this
        // operation (see `Request`'s Send note).
        let n = unsafe {
            libc::pwritev(
                fd,
                rest.as_ptr(),
                rest.len() as libc::c_int,
                (offset + done) as libc::off_t,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) && interrupts < 1000 {
                interrupts += 1;
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "pwritev wrote 0 bytes",
            ));
        }
        done += n as u64;
    }
    Ok(())
}
