//! Shared by the damaged-file tests: opening must fail with `Error::Corruption`.

use std::path::Path;

use omnibus::{Error, Options, Storage};

/// Opens `path` read-only and then for writing with `opts`; each open must fail with
/// `Error::Corruption` whose message contains `needle` (`what` names the case in failures).
pub fn expect_corruption(path: &Path, opts: &Options, needle: &str, what: &str) {
    for read_only in [true, false] {
        let o = Options {
            read_only,
            ..opts.clone()
        };
        match Storage::open(path, o) {
            Err(Error::Corruption(c)) => {
                assert!(c.to_string().contains(needle), "{what}: {c}")
            }
            other => panic!("{what} (read_only {read_only}): expected Corruption, got {other:?}"),
        }
    }
}
