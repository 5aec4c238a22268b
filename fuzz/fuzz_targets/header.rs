//! The header-page decoder (`src/page/header.rs`) over two slots, choosing the newest valid
//! one as an open does. The first byte's low bit seals both slots first. See
//! `omnibus::fuzzing::header_pages`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((&flags, rest)) = data.split_first() {
        let _ = omnibus::fuzzing::header_pages(rest, flags & 1 == 1);
    }
});
