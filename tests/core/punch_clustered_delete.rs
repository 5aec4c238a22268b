//! Regression: free space left unpunched after a load and a clustered delete between flushes.
//!
//! The story: the flush left the lowest wholly free 1 MiB runs unpunched, as many pages as the
//! commits since the last flush had allocated ("punch slack": the next commits would allocate
//! as many again). When a storage was loaded and then half deleted before its next flush, the
//! slack was the whole load, so that flush punched nothing: the deleted half stayed allocated
//! on disk. The slack is now at most 1/32 of the pages in use.
//!
//! This scenario loads 32 MiB of 64 KiB values in 16 commits without a flush, deletes the first
//! half (clustered: written first, together in the file), flushes once, and then reads the data
//! file from outside: the free-space map (design.md 2.6) gives the aligned 1 MiB runs wholly
//! free, `SEEK_HOLE`/`SEEK_DATA` give the runs punched. At least 95% of the free runs must be
//! punched, and the file length must not change.

use std::os::fd::AsRawFd;
use std::path::Path;

use omnibus::{FlushMode, Options, Storage};

const VALUE: usize = 64 << 10;
const COUNT: u32 = 512; // 32 MiB
const PAGE: u64 = 8192;
const RUN_PAGES: u64 = 128;

fn value(i: u32) -> Vec<u8> {
    let mut v = vec![(i % 251) as u8; VALUE];
    v[..4].copy_from_slice(&i.to_le_bytes());
    v
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}

/// Aligned 1 MiB runs (by run index) that the durable header's free-space map marks wholly
/// free below `next_page`, decoded from the file with the documented layout.
fn free_runs_on_disk(data: &Path) -> Vec<u64> {
    let file = std::fs::read(data).unwrap();
    let page = |n: u64| &file[(n * PAGE) as usize..((n + 1) * PAGE) as usize];
    // Both header slots are equal after a flush; take the higher sequence anyway.
    let h = [page(0), page(1)]
        .into_iter()
        .max_by_key(|p| u64_at(p, 48))
        .unwrap();
    let (freedir, next_page) = (u64_at(h, 80), u64_at(h, 88));
    assert_ne!(freedir, 0, "no free-space map");
    let dir = page(freedir);
    let count = u16::from_le_bytes([dir[6], dir[7]]) as usize;
    let mut free = vec![false; next_page as usize];
    for i in 0..count {
        let bm = page(u64_at(dir, 32 + 8 * i));
        for (p, f) in free.iter_mut().enumerate().skip(i * 65_280).take(65_280) {
            let bit = p - i * 65_280;
            *f = bm[32 + bit / 8] & (1 << (bit % 8)) != 0;
        }
    }
    (0..next_page / RUN_PAGES)
        .filter(|r| (r * RUN_PAGES..(r + 1) * RUN_PAGES).all(|p| free[p as usize]))
        .collect()
}

/// True when the whole aligned 1 MiB run `r` is a hole (`SEEK_DATA` from its start lands past
/// its end).
fn punched(f: &std::fs::File, r: u64) -> bool {
    let start = r * RUN_PAGES * PAGE;
    // SAFETY: lseek on a descriptor we own; no memory is passed.
    let data = unsafe { libc::lseek(f.as_raw_fd(), start as libc::off_t, libc::SEEK_DATA) };
    data < 0 || data as u64 >= start + RUN_PAGES * PAGE
}

#[test]
fn a_clustered_delete_is_punched_without_a_flush_in_between() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let s = Storage::open(
        &path,
        Options {
            flush_mode: FlushMode::Manual,
            ..Options::default()
        },
    )
    .unwrap();
    for chunk in 0..16 {
        let mut w = s.begin_write().unwrap();
        for i in chunk * (COUNT / 16)..(chunk + 1) * (COUNT / 16) {
            w.put(format!("k{i:05}"), value(i)).unwrap();
        }
        w.commit().unwrap();
    }
    let loaded = s.stats();
    let mut w = s.begin_write().unwrap();
    for i in 0..COUNT / 2 {
        assert!(w.delete(format!("k{i:05}")).unwrap());
    }
    w.commit().unwrap();
    s.flush().unwrap();
    let after = s.stats();
    assert_eq!(after.data_file_bytes, loaded.data_file_bytes, "{after:?}");

    let data = path.join("data.pages");
    let free = free_runs_on_disk(&data);
    // 16 MiB deleted: at least 14 whole aligned runs among them.
    assert!(free.len() >= 14, "{} free runs: {after:?}", free.len());
    let f = std::fs::File::open(&data).unwrap();
    let holes = free.iter().filter(|&&r| punched(&f, r)).count();
    assert!(
        holes * 100 >= free.len() * 95,
        "{holes} of {} free aligned MiB punched: {after:?}",
        free.len()
    );
    assert!(
        after.allocated_bytes + (holes as u64 * (1 << 20)) <= loaded.allocated_bytes + (1 << 20)
    );

    let r = s.begin_read().unwrap();
    for i in COUNT / 2..COUNT {
        assert!(
            r.get(format!("k{i:05}")).unwrap() == Some(&value(i)[..]),
            "value {i}"
        );
    }
    drop(r);
    assert!(s.check().unwrap().is_ok());
}
