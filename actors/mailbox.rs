//! Closing a mailbox: an actor that stops leaves no request waiting for an answer.
//!
//! A request to an actor is a message carrying a one-shot reply sender; its asker waits on the
//! reply. The asker learns that no answer will come only when the reply sender is dropped. A
//! stopped actor's mailbox keeps every message queued after its last receive for as long as
//! any sender of the mailbox lives (flume drops a channel's queue only with its last sender),
//! and the handles that hold those senders outlive the engine: a `put` sent while the engine
//! shut down stayed queued behind the actor's `Stop` and its asker waited for ever (and, as
//! its handle kept the storage open, the database's `LOCK` stayed held).
//!
//! Protocol. The stopping side (the storage actor at its `Stop`, the engine once the reader
//! pool has ended) first marks the mailbox closed ([`Closed::close`], sequentially
//! consistent), then drops every message still queued ([`close`]), so their askers' replies are
//! dropped and they answer [`Error::Closed`]. An asker ([`Mailbox::ask`]) sends, then looks
//! at the mark: set, it takes an answer already there or answers `Closed`; clear, it waits. A message sent
//! before the drain is dropped by it; one sent after it finds the mark set (the drain follows
//! the mark, and the mailbox's lock orders the send and the drain), so no asker waits on a
//! message nobody will take. Once the stopping side drops its last receiver, sends fail and
//! answer `Closed` at once.
//!
//! Invariant: a stopping side calls [`close`] after its last answer and before it drops its
//! receiver; every asker of a closable mailbox goes through [`Mailbox::ask`] (or
//! [`Mailbox::try_send`] then [`Mailbox::answer`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::actor_interface::{Error, Result};

/// A mailbox's closed mark, shared by the stopping side and every asker (clones share it).
#[derive(Clone, Debug, Default)]
pub(crate) struct Closed(Arc<AtomicBool>);

impl Closed {
    /// Marks the mailbox closed: no message sent from now on will be answered.
    pub fn close(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether the mailbox was marked closed.
    pub fn is_closed(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Marks `rx`'s mailbox closed and drops every message queued in it (their askers answer
/// [`Error::Closed`]); returns how many were dropped.
pub(crate) fn close<M>(closed: &Closed, rx: &flume::Receiver<M>) -> usize {
    closed.close();
    rx.drain().count()
}

/// An actor's mailbox as its askers hold it: the sender and the closed mark (clones share
/// both).
#[derive(Debug)]
pub(crate) struct Mailbox<M> {
    tx: flume::Sender<M>,
    closed: Closed,
}

impl<M> Clone for Mailbox<M> {
    fn clone(&self) -> Self {
        Mailbox {
            tx: self.tx.clone(),
            closed: self.closed.clone(),
        }
    }
}

impl<M> Mailbox<M> {
    /// The mailbox of `tx`, closed when `closed` is.
    pub fn new(tx: flume::Sender<M>, closed: Closed) -> Mailbox<M> {
        Mailbox { tx, closed }
    }

    /// The sender, for messages whose answer is not waited for through [`Mailbox::ask`] (a stop sent
    /// by the engine, which then waits on the actor itself; a group's parts, which their
    /// leader's commit waits on).
    pub fn sender(&self) -> &flume::Sender<M> {
        &self.tx
    }

    /// Whether `other` is the same actor's mailbox.
    pub fn same_channel(&self, other: &Mailbox<M>) -> bool {
        self.tx.same_channel(&other.tx)
    }

    /// Messages queued now.
    pub fn len(&self) -> usize {
        self.tx.len()
    }

    /// Sends `msg` (which carries the sender of `reply`) and waits for its answer.
    ///
    /// Errors: [`Error::Closed`] when the mailbox is gone, or closed with the request
    /// unanswered. Cancel safety: dropped before the send completed, nothing was sent; after,
    /// the request may still be carried out, its answer lost.
    pub async fn ask<T>(&self, msg: M, reply: flume::Receiver<T>) -> Result<T> {
        self.tx.send_async(msg).await.map_err(|_| Error::Closed)?;
        self.answer(reply).await
    }

    /// Sends `msg` now if there is room, as [`flume::Sender::try_send`]; the answer must be
    /// waited for with [`Mailbox::answer`].
    pub fn try_send(&self, msg: M) -> std::result::Result<(), flume::TrySendError<M>> {
        self.tx.try_send(msg)
    }

    /// The answer on `reply` to a message already sent: taken now, or [`Error::Closed`], when
    /// the mailbox is marked closed (answered before it closed, or never will be); else waited
    /// for.
    pub async fn answer<T>(&self, reply: flume::Receiver<T>) -> Result<T> {
        if self.closed.is_closed() {
            return reply.try_recv().map_err(|_| Error::Closed);
        }
        reply.recv_async().await.map_err(|_| Error::Closed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_lite::future::block_on;

    /// A request queued behind the stop and one sent after the drain both answer `Closed`;
    /// one answered before the close keeps its answer.
    #[test]
    fn no_asker_waits_on_a_closed_mailbox() {
        let (tx, rx) = flume::bounded::<flume::Sender<u32>>(8);
        let closed = Closed::default();
        let mailbox = Mailbox::new(tx.clone(), closed.clone());
        // Answered, then the mailbox closes: the answer is kept.
        let (rtx, rrx) = flume::bounded(1);
        tx.send(rtx).unwrap();
        rx.recv().unwrap().send(7).unwrap();
        closed.close();
        assert_eq!(rrx.try_recv().ok(), Some(7));
        // Queued, then drained.
        let (rtx, rrx) = flume::bounded::<u32>(1);
        tx.send(rtx).unwrap();
        assert_eq!(close(&closed, &rx), 1);
        assert!(block_on(rrx.recv_async()).is_err());
        // Sent after the drain (the receiver still alive): `ask` does not wait.
        let (rtx, rrx) = flume::bounded::<u32>(1);
        let r = block_on(mailbox.ask(rtx, rrx));
        assert!(matches!(r, Err(Error::Closed)), "{r:?}");
        // Receiver gone: the send fails.
        drop(rx);
        let (rtx, rrx) = flume::bounded::<u32>(1);
        assert!(matches!(
            block_on(mailbox.ask(rtx, rrx)),
            Err(Error::Closed)
        ));
    }
}
