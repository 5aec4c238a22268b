//! Transactions: [`WriteTransaction`] (one per storage at a time, copy-on-write) and
//! [`ReadTransaction`] (a lock-free snapshot).

mod read;
mod write;

pub use read::ReadTransaction;
pub(crate) use write::check_put;
pub use write::WriteTransaction;
pub(crate) use write::{LogicalOps, StepCarry};
pub(crate) use write::{PreparedCommit, TxnMaps};
