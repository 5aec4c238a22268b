// Regression: with 100 bytes of header page 1 flipped, in a database that had been flushed
// many times, the open fell back to header page 0, which was one flush older; the
// journal files that flush had released were gone, and the pages that older tree used had been
// reused since. `get` returned a deleted value, then writes into the stale tree destroyed it
// ("tree deeper than 32 levels", 30,368 of 171,075 rows left). Every flush now writes its
// header into both slots (and an open rewrites a slot that differs), so one damaged header page
// has an identical twin and loses nothing.

use omnibus::{FlushMode, Options, Storage};

fn opts() -> Options {
    Options {
        flush_mode: FlushMode::Manual,
        // Small files, so flushes really release (delete) journal files.
        journal_file_size: 64 << 10,
        ..Options::default()
    }
}

fn value(i: u32, gen: u32) -> Vec<u8> {
    format!("value-{i}-{gen}-{}", "y".repeat((i % 40) as usize)).into_bytes()
}

/// Many flushed generations of rewrites and deletes, so freed pages get reused.
fn build(path: &std::path::Path) {
    let s = Storage::open(path, opts()).unwrap();
    for gen in 0..6u32 {
        let mut w = s.begin_write().unwrap();
        for i in 0..3_000u32 {
            if gen % 2 == 1 && i % 7 == 0 {
                w.delete(format!("key{i:05}")).unwrap();
            } else {
                w.put(format!("key{i:05}"), value(i, gen)).unwrap();
            }
        }
        w.commit().unwrap();
        s.flush().unwrap();
    }
    s.close().unwrap();
    // Sessions that commit nothing: each starts a new journal file and releases the old ones.
    for _ in 0..2 {
        Storage::open(path, opts()).unwrap().close().unwrap();
    }
}

fn verify(s: &Storage) {
    let r = s.begin_read().unwrap();
    for i in 0..3_000u32 {
        let got = r.get(format!("key{i:05}")).unwrap();
        let want = if i % 7 == 0 { None } else { Some(value(i, 5)) };
        assert_eq!(got.map(|v| v.to_vec()), want, "key {i}");
    }
    let report = s.check().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
}

#[test]
fn one_damaged_header_page_loses_nothing() {
    for slot in [0u64, 1] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        build(&path);
        let data = path.join("data.pages");
        let mut bytes = std::fs::read(&data).unwrap();
        let at = slot as usize * 8192 + 100;
        for b in &mut bytes[at..at + 100] {
            *b ^= 0xa5;
        }
        std::fs::write(&data, &bytes).unwrap();

        let s = Storage::open(&path, opts()).unwrap();
        verify(&s);
        // The open rewrote the damaged slot from its twin: damaging the other one now is
        // survivable too, after more writes and flushes.
        let mut w = s.begin_write().unwrap();
        w.put("after", "damage").unwrap();
        w.commit().unwrap();
        s.flush().unwrap();
        s.close().unwrap();
        let mut bytes = std::fs::read(&data).unwrap();
        let at = (1 - slot) as usize * 8192 + 100;
        for b in &mut bytes[at..at + 100] {
            *b ^= 0xa5;
        }
        std::fs::write(&data, &bytes).unwrap();
        let s = Storage::open(&path, opts()).unwrap();
        verify(&s);
        assert_eq!(
            s.begin_read().unwrap().get("after").unwrap(),
            Some(&b"damage"[..]),
            "slot {slot}"
        );
    }
}
