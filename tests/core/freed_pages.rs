//! Images of freed pages in the scratch table.
//!
//! A one-put commit frees the leaf and branch pages it copies; their old images (written by the
//! commit before, not flushed) leave the newest scratch table when the commit is published.
//! This scenario rewrites a few hot keys with thousands of one-put commits and checks that the
//! table holds only the live pages (not one image per commit), that a flush writes only the
//! pages of the flushed tree, and that nothing committed is lost across a reopen.

use omnibus::{FlushMode, Options, Storage};

fn opts() -> Options {
    Options {
        flush_mode: FlushMode::Manual,
        flush_on_close: false,
        ..Options::default()
    }
}

fn put_one(s: &Storage, key: u32, gen: u32) {
    let mut w = s.begin_write().unwrap();
    w.put(format!("hot{key:03}"), format!("value-{key}-{gen}"))
        .unwrap();
    w.commit().unwrap();
}

#[test]
fn freed_images_stay_bounded_and_are_not_flushed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let s = Storage::open(&path, opts()).unwrap();
    // 400 keys of ~20 bytes: a few leaves under one root.
    let mut w = s.begin_write().unwrap();
    for k in 0..400 {
        w.put(format!("hot{k:03}"), format!("value-{k}-0")).unwrap();
    }
    w.commit().unwrap();
    s.flush().unwrap();

    // 3,000 commits, each freeing a leaf and the root: 6,000 freed images over the run.
    for gen in 1..=3_000u32 {
        put_one(&s, gen % 400, gen);
    }
    let st = s.stats();
    // Live unflushed pages: the leaves, the root and the free-space pages (< 20), not the
    // 6,000 images the commits freed.
    assert!(
        st.scratch_pages <= 20,
        "scratch table holds {} pages",
        st.scratch_pages
    );
    assert!(
        st.scratch_bytes <= 20 * 8192,
        "{} live scratch bytes",
        st.scratch_bytes
    );
    s.flush().unwrap();

    // 100 more commits free ~200 images: the next flush writes only the pages of the tree.
    let before = s.stats().pages_flushed;
    for gen in 3_001..=3_100u32 {
        put_one(&s, gen % 400, gen);
    }
    s.flush().unwrap();
    let written = s.stats().pages_flushed - before;
    assert!(
        (1..=20).contains(&written),
        "the flush wrote {written} pages; the tree has fewer than 20 dirty pages"
    );
    let report = s.check().unwrap();
    assert!(report.is_ok(), "{report:?}");
    s.close().unwrap();

    // Every key holds its last value after a reopen.
    let s = Storage::open(&path, opts()).unwrap();
    let r = s.begin_read().unwrap();
    for k in 0..400u32 {
        let last = (1..=3_100u32).rev().find(|g| g % 400 == k).unwrap_or(0);
        let got = r.get(format!("hot{k:03}")).unwrap();
        assert_eq!(
            got.as_ref().map(|v| v.as_ref()),
            Some(format!("value-{k}-{last}").as_bytes()),
            "key {k}"
        );
    }
}
