//! A damaged free-space bitmap page loses no data: the tree stays readable through a
//! read-only open, and a backup rebuilds the map (the salvage, as LMDB's `mdb_copy -c`).
//!
//! The story: one flipped byte in a storage's live bitmap page
//! made every open fail, `get` and `check` included, because each open built the writer's
//! allocator from the map; the tree was never looked at and nothing could be read out, though
//! the map is derived data (every page not reachable from the root is free). A read-only open
//! no longer reads the map, `check` names the damaged page, a writable open says how to
//! salvage, and `omnibus backup` writes a copy with a new map that opens for writing.

use omnibus::testing::page::{PageKind, PAGE_SIZE};
use omnibus::{Database, Error, Options, Storage};

use crate::common::children;
use crate::common::cli;

fn key(i: u64) -> String {
    format!("key{i:07}")
}

/// Flips one byte in the body of every bitmap page of `data`; returns their page numbers.
fn damage_bitmaps(data: &std::path::Path) -> Vec<u64> {
    let mut bytes = std::fs::read(data).unwrap();
    let mut hit = Vec::new();
    for p in 2..bytes.len() / PAGE_SIZE {
        let at = p * PAGE_SIZE;
        if bytes[at + 4] == PageKind::FreeBitmap as u8 {
            bytes[at + 100] ^= 0x40;
            hit.push(p as u64);
        }
    }
    std::fs::write(data, &bytes).unwrap();
    hit
}

fn read_only() -> Options {
    Options {
        read_only: true,
        create: false,
        ..Options::default()
    }
}

#[test]
fn a_storage_with_a_damaged_map_is_read_and_salvaged_by_a_backup() {
    let _no_children = children::no_children_meanwhile();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    {
        let s = Storage::open(&path, Options::default()).unwrap();
        for t in 0..4u64 {
            let mut w = s.begin_write().unwrap();
            for i in (t * 5_000)..((t + 1) * 5_000) {
                w.put(key(i), i.to_be_bytes()).unwrap();
            }
            w.commit().unwrap();
        }
        // Free pages scattered over the map: delete every third key.
        let mut w = s.begin_write().unwrap();
        for i in (0..20_000u64).step_by(3) {
            w.delete(key(i)).unwrap();
        }
        w.commit().unwrap();
        s.close().unwrap();
    }
    let bitmaps = damage_bitmaps(&path.join("data.pages"));
    assert!(!bitmaps.is_empty(), "no bitmap page found");

    // A writable open needs the map: corruption, naming the page and the salvage.
    match Storage::open(&path, Options::default()) {
        Err(Error::Corruption(c)) => {
            assert!(bitmaps.contains(&c.page.unwrap()), "{c}");
            assert!(c.to_string().contains("omnibus backup"), "{c}");
        }
        Err(e) => panic!("not corruption: {e:?}"),
        Ok(_) => panic!("a storage with a damaged map opened for writing"),
    }
    // A read-only open reads every key; its check names the damaged page.
    {
        let s = Storage::open(&path, read_only()).unwrap();
        let r = s.begin_read().unwrap();
        for i in 0..20_000u64 {
            let want = (i % 3 != 0).then(|| i.to_be_bytes());
            assert_eq!(
                r.get(key(i)).unwrap(),
                want.as_ref().map(|v| &v[..]),
                "key {i}"
            );
        }
        let report = s.check().unwrap();
        assert!(!report.is_ok());
        assert!(
            report
                .problems
                .iter()
                .any(|p| p.page.is_some_and(|pg| bitmaps.contains(&pg))),
            "{:?}",
            report.problems
        );
    }
    // The salvage: the CLI's backup of the read-only open.
    let copy = dir.path().join("copy");
    let o = cli::omnibus_after_close(&["backup", path.to_str().unwrap(), copy.to_str().unwrap()]);
    assert!(o.status.success(), "{o:?}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("13333 keys"), "{out}");
    let s = Storage::open(&copy, Options::default()).unwrap();
    assert!(s.check().unwrap().is_ok());
    // The new map hands out only free pages: writes, a flush and a check stay clean.
    let mut w = s.begin_write().unwrap();
    for i in 0..20_000u64 {
        w.put(key(i), [1u8; 50]).unwrap();
    }
    w.commit().unwrap();
    s.flush().unwrap();
    let report = s.check().unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    assert_eq!(s.begin_read().unwrap().len(), 20_000);
}

#[test]
fn a_database_branch_with_a_damaged_map_is_backed_up_whole() {
    let _no_children = children::no_children_meanwhile();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    {
        let db = Database::open(&path, Options::default()).unwrap();
        let mut w = db.root().begin_write().unwrap();
        for i in 0..1_000u64 {
            w.put(key(i), "doc").unwrap();
        }
        w.commit().unwrap();
        let idx = db.create_storage("idx").unwrap();
        // Two commits: the second frees the pages the first wrote, so the map has bits set.
        for value in ["", "x"] {
            let mut w = idx.begin_write().unwrap();
            for i in 0..5_000u64 {
                w.put(key(i), value).unwrap();
            }
            w.commit().unwrap();
        }
        db.close().unwrap();
    }
    assert!(!damage_bitmaps(&path.join("Indexes/idx/data.pages")).is_empty());
    // Writable: the branch is damaged and writes are refused.
    {
        let db = Database::open(&path, Options::default()).unwrap();
        assert_eq!(db.damaged().len(), 1);
        assert!(matches!(
            db.root().begin_write(),
            Err(Error::DatabaseDamaged { .. })
        ));
    }
    // A write to the damaged branch names the damage (exit 2), not "no storage `idx`" with a
    // `put --create` hint.
    let o =
        cli::omnibus_after_close(&["put", path.to_str().unwrap(), "--storage", "idx", "a", "b"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("storage `idx` is damaged"), "{err}");
    assert!(!err.contains("--create"), "{err}");
    // Read-only: every storage opens and the backup holds all of them.
    let copy = dir.path().join("copy");
    let o = cli::omnibus_after_close(&[
        "backup",
        "--json",
        path.to_str().unwrap(),
        copy.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{o:?}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["storages"], 2, "{v}");
    assert_eq!(v["entries"], 6_000, "{v}");
    assert_eq!(v["not_copied"].as_array().map(|a| a.len()), Some(0), "{v}");
    let db = Database::open(&copy, Options::default()).unwrap();
    assert!(db.damaged().is_empty());
    assert_eq!(
        db.storage("idx").unwrap().begin_read().unwrap().len(),
        5_000
    );
    assert_eq!(db.root().begin_read().unwrap().len(), 1_000);
    db.close().unwrap();
    let o = cli::omnibus_after_close(&["check", copy.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
}

#[test]
fn backup_refuses_a_destination_that_is_not_empty_and_leaves_it_alone() {
    let _no_children = children::no_children_meanwhile();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    {
        let s = Storage::open(&path, Options::default()).unwrap();
        let mut w = s.begin_write().unwrap();
        w.put("k", "v").unwrap();
        w.commit().unwrap();
        s.close().unwrap();
    }
    let dest = dir.path().join("dest");
    std::fs::create_dir(&dest).unwrap();
    std::fs::write(dest.join("mine"), b"keep").unwrap();
    let o = cli::omnibus_after_close(&["backup", path.to_str().unwrap(), dest.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert_eq!(std::fs::read(dest.join("mine")).unwrap(), b"keep");
    // A destination whose parent is missing is a mistyped path (exit 1), nothing is created.
    let deep = dir.path().join("no/such/dir");
    let o = cli::omnibus_after_close(&["backup", path.to_str().unwrap(), deep.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(!dir.path().join("no").exists());
    let o = cli::omnibus(&[
        "backup",
        dir.path().join("nothing").to_str().unwrap(),
        dir.path().join("d2").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
}
