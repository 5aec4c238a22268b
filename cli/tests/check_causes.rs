//! `check` reports causes, not cascades.
//!
//! Regression: one flipped byte in a 50 MiB value made `omnibus check` print 1,000 lines, 999 of
//! them false "page neither in use nor free (leaked)" reports: the damaged overflow run failed
//! its checksum, so none of its pages were marked in use, and each one was then reported as a
//! leak (until the 1,000-problem cap). The same happened below a damaged branch page: its whole
//! subtree "leaked", and the key count was reported wrong as well. Now a damaged page is one
//! problem, and the pages it hides are one summary (`CheckReport::hidden`) with their count and
//! range; a real leak in an intact tree is still reported.

use std::path::Path;

use omnibus::testing::page::BranchView;
use omnibus::testing::page::{header, PageHeader, PageKind, PAGE_SIZE};
use omnibus::{CheckReport, FlushMode, Options, Storage};

use crate::common::children;

fn opts() -> Options {
    Options {
        flush_mode: FlushMode::Manual,
        ..Options::default()
    }
}

/// Long keys give branch pages a small fan-out: 3,000 keys make a tree of depth 3.
fn key(i: u32) -> Vec<u8> {
    format!("{i:06}-{}", "k".repeat(400)).into_bytes()
}

const BIG: usize = 4 << 20;

/// Builds the storage: 3,000 keys, one 4 MiB value (an overflow run of 513 pages), flushed.
fn build(path: &Path) {
    let s = Storage::open(path, opts()).unwrap();
    let mut w = s.begin_write().unwrap();
    for i in 0..3000 {
        w.put(key(i), format!("v{i}")).unwrap();
    }
    w.put(b"big", vec![7u8; BIG]).unwrap();
    w.commit().unwrap();
    s.flush().unwrap();
    let r = s.check().unwrap();
    assert!(r.is_ok() && r.hidden.is_none(), "{r:?}");
    assert_eq!(r.depth, 3, "the test needs an inner branch below the root");
    s.close().unwrap();
}

fn page_at(file: &[u8], p: u64) -> &[u8] {
    &file[p as usize * PAGE_SIZE..(p as usize + 1) * PAGE_SIZE]
}

/// The pages the test damages: an inner branch (below the root), a leaf, the big value's
/// overflow run (first page, pages).
struct Targets {
    inner: u64,
    leaf: u64,
    overflow: (u64, u64),
}

fn targets(file: &[u8], path: &Path) -> Targets {
    let (h, _) = header::choose(page_at(file, 0), page_at(file, 1), path).unwrap();
    let children = |p: u64| {
        let img = page_at(file, p);
        let ph = PageHeader::read(img).unwrap();
        assert_eq!(ph.kind, PageKind::Branch, "page {p}");
        let v = BranchView::new(img, &ph);
        (0..=v.keys())
            .map(|i| v.child(i).unwrap())
            .collect::<Vec<_>>()
    };
    let inner = children(h.root)[1];
    let leaf = children(inner)[1];
    let n = file.len() as u64 / PAGE_SIZE as u64;
    let overflow = (2..n)
        .find_map(|p| {
            let ph = PageHeader::read(page_at(file, p))?;
            (ph.kind == PageKind::Overflow).then_some((p, ph.run_pages as u64))
        })
        .unwrap();
    assert!(overflow.1 > 500, "{overflow:?}");
    Targets {
        inner,
        leaf,
        overflow,
    }
}

/// Flips one byte at `offset` of a copy of `pristine`, opens it read-only and checks it, with
/// the library and with `omnibus check`.
fn check_flipped(pristine: &Path, offset: usize) -> CheckReport {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("s");
    std::fs::create_dir_all(copy.join("Journals")).unwrap();
    std::fs::create_dir_all(copy.join("Indexes")).unwrap();
    for e in std::fs::read_dir(pristine).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), copy.join(e.file_name())).unwrap();
        }
    }
    let data = copy.join("data.pages");
    let mut bytes = std::fs::read(&data).unwrap();
    bytes[offset] ^= 0x20;
    std::fs::write(&data, &bytes).unwrap();
    let s = Storage::open(
        &copy,
        Options {
            read_only: true,
            ..opts()
        },
    )
    .unwrap();
    let r = s.check().unwrap();
    drop(s);
    // `omnibus check` of the same directory (a storage directory is a database's root): one
    // line for the damaged page, one summary line.
    let o = children::output(
        std::process::Command::new(env!("CARGO_BIN_EXE_omnibus"))
            .args(["check", copy.to_str().unwrap()]),
    )
    .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("omnibus: storage `(root)`"))
        .collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(lines[0].contains("checksum"), "{err}");
    assert!(
        lines[1].contains("not verified because of 1 damaged page"),
        "{err}"
    );
    assert!(!err.contains("leaked"), "{err}");
    r
}

/// One damage report for `page` (a checksum mismatch), and one summary of the hidden pages
/// covering at least `min_hidden` pages including `page`.
fn assert_one_cause(r: &CheckReport, page: u64, min_hidden: u64, what: &str) {
    assert_eq!(r.problems.len(), 1, "{what}: {:#?}", r.problems);
    assert_eq!(r.problems[0].page, Some(page), "{what}: {:?}", r.problems);
    assert!(
        r.problems[0].what.contains("checksum"),
        "{what}: {:?}",
        r.problems
    );
    let h = r
        .hidden
        .as_ref()
        .unwrap_or_else(|| panic!("{what}: no summary"));
    assert_eq!(h.damaged, 1, "{what}: {h:?}");
    assert!(h.pages >= min_hidden, "{what}: {h:?}");
    assert!(h.first <= page && page <= h.last, "{what}: {h:?}");
    assert!(!h.to_string().contains("leaked"), "{what}: {h}");
}

#[test]
fn a_damaged_page_is_one_cause_and_one_summary() {
    let _no_children = children::no_children_meanwhile();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    build(&path);
    let file = std::fs::read(path.join("data.pages")).unwrap();
    let t = targets(&file, &path);
    let at = |p: u64| p as usize * PAGE_SIZE;

    // A byte in the middle of the 4 MiB value: the run is one damaged cause; its 513 pages are
    // the summary, not 513 leaks.
    let (run, pages) = t.overflow;
    let r = check_flipped(&path, at(run + pages / 2) + 100);
    assert_one_cause(&r, run, pages, "overflow run");
    assert_eq!(r.hidden.as_ref().unwrap().pages, pages, "{:?}", r.hidden);
    assert_eq!(r.entries, 3001, "the leaves are all intact");

    // An inner branch: its whole subtree (a dozen or more leaves) is hidden, and its keys are
    // not counted, but nothing is called leaked and the key count is not a second problem.
    let r = check_flipped(&path, at(t.inner) + 4000);
    assert_one_cause(&r, t.inner, 10, "inner branch");
    let h = r.hidden.as_ref().unwrap();
    assert!(h.entries_not_counted > 100, "{h:?}");
    assert_eq!(r.entries + h.entries_not_counted, 3001, "{h:?}");

    // A leaf: the leaf itself, its keys not counted.
    let r = check_flipped(&path, at(t.leaf) + 3000);
    assert_one_cause(&r, t.leaf, 1, "leaf");
    assert!(r.hidden.as_ref().unwrap().entries_not_counted > 0);
}

#[test]
fn a_real_leak_is_still_reported() {
    let _no_children = children::no_children_meanwhile();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    build(&path);
    {
        // Overwrite keys twice, so the first copies' pages are freed and the map marks them free.
        let s = Storage::open(&path, opts()).unwrap();
        for round in 0..2 {
            let mut w = s.begin_write().unwrap();
            for i in (0..3000).step_by(7) {
                w.put(key(i), format!("w{round}-{i}")).unwrap();
            }
            w.commit().unwrap();
            s.flush().unwrap();
        }
        let r = s.check().unwrap();
        assert!(r.is_ok(), "{:?}", r.problems);
        assert!(r.pages_free > 0, "{r:?}");
        s.close().unwrap();
    }
    // Clear the free bit of one free page in the bitmap (resealed: the map page itself is
    // intact), so that page is neither in use nor free while the tree is intact: a real leak.
    let data = path.join("data.pages");
    let mut file = std::fs::read(&data).unwrap();
    let n = file.len() / PAGE_SIZE;
    let bitmap = (2..n)
        .find(|&p| {
            PageHeader::read(&file[p * PAGE_SIZE..]).map(|h| h.kind) == Some(PageKind::FreeBitmap)
        })
        .unwrap();
    let img = &mut file[bitmap * PAGE_SIZE..(bitmap + 1) * PAGE_SIZE];
    let byte = (omnibus::testing::page::HEADER_LEN..PAGE_SIZE)
        .find(|&i| img[i] != 0)
        .unwrap();
    let bit = img[byte].trailing_zeros();
    img[byte] &= !(1 << bit);
    omnibus::testing::page::seal(img);
    let leaked = ((byte - omnibus::testing::page::HEADER_LEN) * 8) as u64 + bit as u64;
    std::fs::write(&data, &file).unwrap();

    let s = Storage::open(
        &path,
        Options {
            read_only: true,
            ..opts()
        },
    )
    .unwrap();
    let r = s.check().unwrap();
    assert_eq!(r.problems.len(), 1, "{:?}", r.problems);
    assert_eq!(r.problems[0].page, Some(leaked), "{:?}", r.problems);
    assert!(r.problems[0].what.contains("leaked"), "{:?}", r.problems);
    assert!(r.hidden.is_none(), "{:?}", r.hidden);
}
