//! Free-space bitmap pages are journaled as diffs of their own previous version (format 2,
//! docs/design.md 3.2), and a bitmap page that a failed flush left torn in the data file is
//! still rebuilt exactly from that copy plus the diffs since the header.
//!
//! The story: a bitmap page is updated in place, so format 1 journaled it whole with every
//! commit that flipped one of its bits. In a large storage whose free pages are scattered, a
//! bitmap page has no long zero run to leave out: a one-put commit journaled about 8 KiB per
//! bitmap page it touched (16.4 KB records at 2.5 million keys against 4.3 KB on an empty
//! storage), and its checksum and zero-run scan were a third of the commit's instructions
//! (docs/BENCHMARKS.md). A diff of the page against itself needs its base at
//! recovery, and the data file's copy is the one a torn flush may have mixed with a newer
//! version: these tests pin both the small records and the repair.

use std::path::Path;
use std::sync::Arc;

use omnibus::env::testing::{Fault, HookedEnv, OpKind};
use omnibus::env::DefaultEnv;
use omnibus::testing::journal::recovery::{list, scan};
use omnibus::testing::journal::RecordKind;
use omnibus::testing::layout::{DATA_FILE, JOURNALS_DIR};
use omnibus::testing::page::{seal, verify_checksum, PageKind, PAGE_SIZE};
use omnibus::{FlushMode, Options, Storage};

fn opts() -> Options {
    Options {
        flush_mode: FlushMode::Manual,
        // Page commits: their bitmap pages are what is journaled.
        write_buffer_bytes: 0,
        ..Options::default()
    }
}

fn key(i: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    let x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17);
    k[..8].copy_from_slice(&x.to_be_bytes());
    k[8..].copy_from_slice(&i.to_be_bytes());
    k
}

/// A flushed storage of 20,000 random keys, written in 40 transactions and then thinned by
/// deleting every third key: its free pages are scattered over the whole bitmap page, which so
/// has no long run of zeros. Returns the keys that remain.
fn fragmented(path: &Path) -> Vec<u64> {
    let s = Storage::open(path, opts()).unwrap();
    for t in 0..40u64 {
        let mut w = s.begin_write().unwrap();
        for i in t * 500..(t + 1) * 500 {
            w.put(key(i), [i as u8; 100]).unwrap();
        }
        w.commit().unwrap();
        if t % 8 == 7 {
            s.flush().unwrap();
        }
    }
    let mut w = s.begin_write().unwrap();
    for i in (0..20_000u64).step_by(3) {
        w.delete(key(i)).unwrap();
    }
    w.commit().unwrap();
    s.flush().unwrap();
    (0..20_000u64).filter(|i| i % 3 != 0).collect()
}

/// Body lengths of the commit records in the storage's journal files, in order.
fn commit_bodies(path: &Path) -> Vec<u64> {
    let env = omnibus::env::default_env();
    let mut out = Vec::new();
    for (no, file) in list(&*env, &path.join(JOURNALS_DIR)).unwrap() {
        scan(&*env, &file, no, &[], |h, _, _| {
            if h.kind == RecordKind::Commit {
                out.push(h.body_len);
            }
            Ok(())
        })
        .unwrap();
    }
    out
}

#[test]
fn one_put_commits_journal_their_bitmap_page_as_a_diff() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    fragmented(&path);
    let s = Storage::open(&path, opts()).unwrap();
    let before = commit_bodies(&path).len();
    for i in 0..20u64 {
        let mut w = s.begin_write().unwrap();
        w.put(key(1_000_000 + i), [7u8; 100]).unwrap();
        w.commit().unwrap();
    }
    let bodies = commit_bodies(&path);
    let new = &bodies[before..];
    assert_eq!(new.len(), 20);
    // A few hundred bytes, but for a commit that splits a leaf (a new page, whole). (This
    // small storage's bitmap bits all lie in the first bytes of its page, so format 1's whole
    // image, without its zero run, was small too; the count of diffs below tells them apart.)
    let mut sorted = new.to_vec();
    sorted.sort_unstable();
    assert!(
        sorted[new.len() - 3] < 1024,
        "one-put commits journaled these body lengths: {new:?}"
    );
    // Every page of these commits is a diff: the leaf, its branches and the bitmap page
    // (format 1: 59 of 80, the bitmap pages whole).
    let st = s.stats();
    assert!(
        st.pages_journaled_as_diffs * 10 >= st.pages_journaled * 9,
        "{} of {} pages journaled as diffs",
        st.pages_journaled_as_diffs,
        st.pages_journaled
    );
    let report = s.check().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

#[test]
fn a_torn_bitmap_page_is_rebuilt_from_its_copy_and_the_diffs_since_the_header() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let data = path.join(DATA_FILE);
    let kept = fragmented(&path);
    let before = std::fs::read(&data).unwrap();
    {
        let env = Arc::new(HookedEnv::new(Arc::new(DefaultEnv::new())));
        let s = Storage::open(
            &path,
            Options {
                env: env.clone(),
                ..opts()
            },
        )
        .unwrap();
        for i in 0..30u64 {
            let mut w = s.begin_write().unwrap();
            w.put(key(2_000_000 + i), [9u8; 100]).unwrap();
            w.delete(key(kept[i as usize * 7])).unwrap();
            w.commit().unwrap();
        }
        // The flush writes the pages (the bitmap page included), then its data-file sync
        // fails: the header never moves past the state `before` holds.
        env.fail_matching(OpKind::SyncData, DATA_FILE, 1, Fault::Eio);
        assert!(s.flush().is_err());
    }
    // Tear every bitmap page the failed flush rewrote: 64-byte blocks taken alternately from
    // the new version (the first, with the page header and its new checksum) and the old one.
    // A power loss mixes 512- or 4096-byte sectors; this small storage's bits all lie in the
    // first sector, so the test mixes finer, which the repair's argument covers as well (it
    // holds byte by byte).
    let mut after = std::fs::read(&data).unwrap();
    let mut torn = 0;
    for p in 2..(after.len().min(before.len()) / PAGE_SIZE) {
        let at = p * PAGE_SIZE;
        let (new, old) = (&after[at..at + PAGE_SIZE], &before[at..at + PAGE_SIZE]);
        if new[4] != PageKind::FreeBitmap as u8 || new == old {
            continue;
        }
        let page: Vec<u8> = (0..PAGE_SIZE / 64)
            .flat_map(|b| {
                let from = if b % 2 == 0 { new } else { old };
                from[b * 64..(b + 1) * 64].to_vec()
            })
            .collect();
        assert!(
            page != new && page != old,
            "page {p}: its changes lie in one block"
        );
        assert!(!verify_checksum(&page), "page {p} should fail its checksum");
        after[at..at + PAGE_SIZE].copy_from_slice(&page);
        torn += 1;
    }
    assert!(torn >= 1, "no bitmap page to tear");
    std::fs::write(&data, &after).unwrap();

    let s = Storage::open(&path, opts()).unwrap();
    let report = s.check().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    let r = s.begin_read().unwrap();
    let deleted: Vec<u64> = (0..30).map(|i| kept[i * 7]).collect();
    assert_eq!(r.len(), (kept.len() - deleted.len() + 30) as u64);
    for &i in &kept {
        let want = (!deleted.contains(&i)).then_some([i as u8; 100]);
        assert_eq!(r.get(key(i)).unwrap(), want.as_ref().map(|v| &v[..]));
    }
    for i in 0..30u64 {
        assert_eq!(r.get(key(2_000_000 + i)).unwrap(), Some(&[9u8; 100][..]));
    }
    drop(r);
    // The repaired map hands out only free pages: more commits and a flush stay consistent.
    for i in 0..200u64 {
        let mut w = s.begin_write().unwrap();
        w.put(key(3_000_000 + i), [3u8; 100]).unwrap();
        w.commit().unwrap();
    }
    s.flush().unwrap();
    let report = s.check().unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}

#[test]
fn a_format_1_storage_opens_and_is_upgraded_by_its_first_writable_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let data = path.join(DATA_FILE);
    {
        let s = Storage::open(&path, opts()).unwrap();
        let mut w = s.begin_write().unwrap();
        w.put("k", "v").unwrap();
        w.commit().unwrap();
    }
    let version = |bytes: &[u8], slot: usize| {
        let at = slot * PAGE_SIZE + 40;
        u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
    };
    // Both header pages rewritten as a format 1 build wrote them.
    let mut bytes = std::fs::read(&data).unwrap();
    for slot in 0..2 {
        let at = slot * PAGE_SIZE;
        bytes[at + 40..at + 44].copy_from_slice(&1u32.to_le_bytes());
        seal(&mut bytes[at..at + PAGE_SIZE]);
    }
    std::fs::write(&data, &bytes).unwrap();
    {
        let s = Storage::open(
            &path,
            Options {
                read_only: true,
                ..opts()
            },
        )
        .unwrap();
        assert_eq!(s.begin_read().unwrap().get("k").unwrap(), Some(&b"v"[..]));
    }
    let bytes = std::fs::read(&data).unwrap();
    assert_eq!((version(&bytes, 0), version(&bytes, 1)), (1, 1));
    {
        let s = Storage::open(&path, opts()).unwrap();
        assert_eq!(s.begin_read().unwrap().get("k").unwrap(), Some(&b"v"[..]));
        let bytes = std::fs::read(&data).unwrap();
        let v = omnibus::testing::page::header::FORMAT_VERSION;
        assert_eq!((version(&bytes, 0), version(&bytes, 1)), (v, v));
    }
}
