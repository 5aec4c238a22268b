//! Transactions: [`WriteTransaction`] (one per storage at a time, copy-on-write) and
//! [`ReadTransaction`] (a lock-free snapshot).

mod read;
mod write;

pub use read::ReadTransaction;
pub use write::WriteTransaction;
