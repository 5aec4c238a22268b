//! The wait of the handles' `blocking_` twins: `block_on` of the async call, refused on one of
//! the engine's executor threads.
//!
//! A blocking call made on an executor (inside an update closure, which runs on the storage's
//! executor, or an index's map function) would park that thread until work is done that only
//! an executor can do: the storage actor living there, the reader task of that executor, or
//! the very actor that is running the closure. With one executor that is every actor, and the
//! engine hangs for good. So the wait refuses at once with [`Error::BlockingOnExecutor`],
//! sending nothing.

use std::future::Future;

use futures_lite::future::block_on;

use crate::actor_interface::{self, Error};

/// Waits for `f` on the calling thread; [`Error::BlockingOnExecutor`] (naming `call`) without
/// polling it when that thread is one of the engine's executors.
pub(crate) fn wait<T, E: From<Error>>(
    call: &'static str,
    f: impl Future<Output = std::result::Result<T, E>>,
) -> std::result::Result<T, E> {
    if actor_interface::on_executor() {
        return Err(E::from(Error::BlockingOnExecutor { call }));
    }
    block_on(f)
}
