//! `check` says when a header page is damaged.
//!
//! The story: flipping a byte at offset 0, 8, 40, 100 or 8192 + 100 of
//! `data.pages` left `omnibus check` printing "ok" with `problems: []`; only a later read-write
//! open logged that it rewrote the slot from its twin. Nothing was lost (the twin holds the same
//! header), but a check that sees nothing is no check. `CheckReport::header_slots_damaged` now
//! names the slot, and the command line prints a warning (exit 0: a crash during a flush's
//! header write tears a slot too, which is no damage).

use omnibus::{FlushMode, Options, Storage};

use crate::common::children;
use crate::common::cli as cli_common;
use cli_common::omnibus;

fn opts(read_only: bool) -> Options {
    Options {
        flush_mode: FlushMode::Manual,
        read_only,
        ..Options::default()
    }
}

#[test]
fn a_damaged_header_slot_is_reported_then_repaired() {
    let _no_children = children::no_children_meanwhile();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    {
        let s = Storage::open(&path, opts(false)).unwrap();
        let mut w = s.begin_write().unwrap();
        for i in 0..500 {
            w.put(format!("k{i:04}"), "v").unwrap();
        }
        w.commit().unwrap();
        s.flush().unwrap();
        let r = s.check().unwrap();
        assert!(r.is_ok() && r.header_slots_damaged.is_empty(), "{r:?}");
    }
    for (slot, offset) in [(1u64, 8192 + 100), (0u64, 40)] {
        let data = path.join("data.pages");
        let mut bytes = std::fs::read(&data).unwrap();
        bytes[offset] ^= 0x55;
        std::fs::write(&data, &bytes).unwrap();
        {
            let s = Storage::open(&path, opts(true)).unwrap();
            let r = s.check().unwrap();
            assert_eq!(r.header_slots_damaged, vec![slot]);
            assert!(r.is_ok(), "{:?}", r.problems);
            assert!(r.entries >= 500, "{}", r.entries);
        }
        let o = omnibus(&["check", path.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(0));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(&format!("header page {slot} is damaged or torn")),
            "{err}"
        );
        // A read-write open's first flush rewrites the slot from its twin.
        {
            let s = Storage::open(&path, opts(false)).unwrap();
            let mut w = s.begin_write().unwrap();
            w.put("more", "v").unwrap();
            w.commit().unwrap();
            s.flush().unwrap();
            let r = s.check().unwrap();
            assert!(r.header_slots_damaged.is_empty(), "{r:?}");
        }
    }
}
