//! The journal record decoder: a 48-byte record header, then a commit body (full, trimmed and
//! diff page images), with a round trip of what decodes. See `omnibus::fuzzing::journal_record`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = omnibus::fuzzing::journal_record(data);
});
