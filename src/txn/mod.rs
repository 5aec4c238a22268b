//! Transactions: [`WriteTransaction`] (one per storage at a time, copy-on-write) and
//! [`ReadTransaction`] (a lock-free snapshot).

mod read;
mod write;

pub use read::ReadTransaction;
pub(crate) use read::{
    decode_index_record, index_record, is_index_record, INDEX_RECORD_MAGIC_V1, RESERVED_KEY,
};
#[cfg(feature = "testing")]
pub(crate) use write::apply_in_background_with;
pub(crate) use write::check_put;
pub use write::WriteTransaction;
pub(crate) use write::{apply_in_background, PreparedCommit, TxnMaps};
pub(crate) use write::{LogicalOps, StepCarry};
