//! Range reads as a stream ([`RangeStream`]) and as a blocking iterator ([`RangeIter`]): the
//! entries of a key range of one snapshot, read by the reader pool a chunk at a time.
//!
//! The stream takes its snapshot when it is made (one atomic load on the caller's thread, no
//! page touched) and holds it until dropped: every chunk comes from that one committed state,
//! whatever commits meanwhile (as a `ReadTransaction` range would; the snapshot keeps the
//! pages it reads from being reused, so a stream kept open for long holds back flushes, as
//! any long reader does). The reader pool reads each chunk ([`CHUNK_ENTRIES`] entries or
//! [`CHUNK_BYTES`] bytes, whichever comes first): the caller's thread never touches a page. One
//! chunk is read ahead while the caller consumes the last one, so at most two chunks are held
//! (bounded memory whatever the range's size). Each next chunk starts just past the last key
//! received (its bound excluded), forward or backward.
//!
//! Cancel safety: the chunk in flight is the stream's, not a `next()` future's: dropping that
//! future loses nothing (the next call yields the entry it would have). Dropping the stream
//! drops the chunk in flight and lets go of the snapshot (the reader pool drops its copy once
//! it has read that chunk); nothing else happens.

use std::collections::VecDeque;
use std::future::Future;
use std::ops::Bound;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_lite::Stream;

use super::mailbox::Mailbox;
use super::reader_pool::{Entries, ReadMsg};
use crate::actor_interface::{Error, ReadTransaction, Result};

/// Entries read by the reader pool per chunk, at most.
pub const CHUNK_ENTRIES: usize = 256;
/// Bytes of keys and values per chunk, about: a chunk ends with the entry that reaches it.
pub const CHUNK_BYTES: usize = 256 << 10;

/// One chunk on its way from the reader pool.
type Pending = Pin<Box<dyn Future<Output = Result<Entries>> + Send>>;

/// A `Stream` of the `(key, value)` entries of a key range of one snapshot, in key order
/// (descending for [`crate::actors::StorageHandle::range_stream_rev`]), read ahead by the
/// reader pool in chunks.
///
/// The snapshot is taken when the stream is made and held until it is dropped: every chunk
/// comes from that one committed state, whatever commits meanwhile; like any long reader, a
/// stream kept open holds back the flushes of the pages it may read (their images stay in
/// memory). Each chunk is at most [`CHUNK_ENTRIES`] entries or about [`CHUNK_BYTES`] bytes,
/// read by the pool (the caller's thread touches no page); the next chunk is requested as
/// soon as one arrives, so at most one chunk is held and one is in flight, whatever the
/// range's size. Dropping a `next()` future loses nothing: the chunk in flight stays with the
/// stream, and the next call yields the entry that future would have. Dropping the stream
/// drops the chunk in flight and lets go of the snapshot; nothing else happens.
/// Each item is an entry or an error ([`Error::Corruption`] of a page, [`Error::Closed`] once
/// the engine is gone), after which the stream ends. `Unpin` and `Send`.
pub struct RangeStream {
    snap: ReadTransaction,
    readers: Mailbox<ReadMsg>,
    /// The part of the range not yet requested.
    start: Bound<Vec<u8>>,
    end: Bound<Vec<u8>>,
    reverse: bool,
    /// Entries received and not yet yielded (at most one chunk).
    buf: VecDeque<(Vec<u8>, Vec<u8>)>,
    /// The chunk in flight, if any (at most one).
    pending: Option<Pending>,
    /// No chunk left to request: the last one came back short, or an error ended the stream.
    exhausted: bool,
}

impl std::fmt::Debug for RangeStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RangeStream")
            .field("snapshot", &self.snap)
            .field("reverse", &self.reverse)
            .field("buffered", &self.buf.len())
            .field("in_flight", &self.pending.is_some())
            .field("exhausted", &self.exhausted)
            .finish_non_exhaustive()
    }
}

impl RangeStream {
    /// A stream over `start..end` of `snap`, read by the pool behind `readers`.
    pub(crate) fn new(
        snap: ReadTransaction,
        readers: Mailbox<ReadMsg>,
        start: Bound<Vec<u8>>,
        end: Bound<Vec<u8>>,
        reverse: bool,
    ) -> RangeStream {
        RangeStream {
            snap,
            readers,
            start,
            end,
            reverse,
            buf: VecDeque::new(),
            pending: None,
            exhausted: false,
        }
    }

    /// Entries received and not yet yielded, plus whether a chunk is in flight: what the
    /// stream holds in memory now (at most [`CHUNK_ENTRIES`] entries and one chunk in flight).
    pub fn buffered(&self) -> (usize, bool) {
        (self.buf.len(), self.pending.is_some())
    }

    /// Sends the request for the next chunk.
    fn request(&mut self) {
        let (tx, rx) = flume::bounded(1);
        let m = ReadMsg::Range {
            snap: self.snap.clone(),
            start: self.start.clone(),
            end: self.end.clone(),
            limit: CHUNK_ENTRIES,
            max_bytes: CHUNK_BYTES,
            reverse: self.reverse,
            reply: tx,
        };
        // Sent now where the mailbox has room, so the pool reads while the caller consumes
        // the chunk at hand (a future only runs once polled); else sent when next polled.
        let readers = self.readers.clone();
        let unsent = match self.readers.try_send(m) {
            Ok(()) => None,
            Err(flume::TrySendError::Full(m)) => Some(m),
            Err(flume::TrySendError::Disconnected(_)) => {
                self.pending = Some(Box::pin(async { Err(Error::Closed) }));
                return;
            }
        };
        self.pending = Some(Box::pin(async move {
            match unsent {
                Some(m) => readers.ask(m, rx).await?,
                None => readers.answer(rx).await?,
            }
        }));
    }

    /// Takes a chunk in: the next one starts past its last key; a short one is the last.
    fn receive(&mut self, chunk: Entries) {
        let bytes: usize = chunk.iter().map(|(k, v)| k.len() + v.len()).sum();
        if chunk.len() < CHUNK_ENTRIES && bytes < CHUNK_BYTES {
            self.exhausted = true;
        }
        match chunk.last() {
            Some((k, _)) if self.reverse => self.end = Bound::Excluded(k.clone()),
            Some((k, _)) => self.start = Bound::Excluded(k.clone()),
            None => self.exhausted = true,
        }
        self.buf.extend(chunk);
    }
}

impl Stream for RangeStream {
    type Item = Result<(Vec<u8>, Vec<u8>)>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        // Bounded: each turn either yields, ends, waits, or takes in one chunk (after which the
        // buffer is non-empty or the stream exhausted).
        for _ in 0..3 {
            if let Some(e) = this.buf.pop_front() {
                // Read ahead: the next chunk is on its way while this one is consumed.
                if this.pending.is_none() && !this.exhausted {
                    this.request();
                }
                return Poll::Ready(Some(Ok(e)));
            }
            if this.pending.is_none() {
                if this.exhausted {
                    return Poll::Ready(None);
                }
                this.request();
            }
            let Some(p) = this.pending.as_mut() else {
                return Poll::Ready(None);
            };
            match p.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(r) => {
                    this.pending = None;
                    match r {
                        Ok(chunk) => this.receive(chunk),
                        Err(e) => {
                            this.exhausted = true;
                            return Poll::Ready(Some(Err(e)));
                        }
                    }
                }
            }
        }
        // Three turns always end above: a received chunk is yielded on the next turn, or the
        // stream is exhausted and ends.
        Poll::Ready(None)
    }
}

/// A blocking `Iterator` over a [`RangeStream`] ([`crate::actors::StorageHandle::blocking_range`]):
/// each `next` waits for the reader pool when the chunk at hand is used up. For plain threads,
/// not for async tasks (it blocks them).
#[derive(Debug)]
pub struct RangeIter {
    stream: RangeStream,
}

impl RangeIter {
    /// Iterates `stream`.
    pub(crate) fn new(stream: RangeStream) -> RangeIter {
        RangeIter { stream }
    }
}

impl Iterator for RangeIter {
    type Item = Result<(Vec<u8>, Vec<u8>)>;

    fn next(&mut self) -> Option<Self::Item> {
        futures_lite::future::block_on(futures_lite::StreamExt::next(&mut self.stream))
    }
}
