//! The page decoders (`src/page/`): page check, leaf and branch views and nodes, in-place
//! leaf edits. The first byte's low bit seals the page first (a fuzzer cannot forge the
//! checksum), so the decoders behind the check are reached. See `omnibus::fuzzing::page`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((&flags, rest)) = data.split_first() {
        let _ = omnibus::fuzzing::page(rest, flags & 1 == 1);
    }
});
