// Regression: with `Indexes/idx/data.pages` deleted in a database whose index was flushed
// (its `Journals/` empty after a clean close), `omnibus check` passed and
// listed nothing, and the index was silently gone: a branch directory without a data file was
// taken for a creation that crashed before it made its data file, and skipped. Creation now
// makes the data file (header pages and directory entry) durable before it creates `Journals/`,
// so a branch directory with `Journals/` and no data file lost it: the database reports the
// branch as damaged (`Error::Corruption` naming the missing file), and `check` exits 2. A
// directory that a crashed creation left (no `Journals/` yet) is still no storage, and creating
// the branch again finishes it.

use omnibus::{Database, Error, Options};

use crate::common::children;
use crate::common::cli;

#[test]
fn a_branch_without_its_data_file_is_damaged() {
    let _no_children = children::no_children_meanwhile();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    {
        let db = Database::open(&path, Options::default()).unwrap();
        for name in ["idx", "other"] {
            let s = db.create_storage(name).unwrap();
            let mut w = s.begin_write().unwrap();
            for i in 0..100 {
                w.put(format!("term{i:03}"), b"").unwrap();
            }
            w.commit().unwrap();
        }
        db.close().unwrap();
    }
    let lost = path.join("Indexes/idx/data.pages");
    std::fs::remove_file(&lost).unwrap();
    // What a creation that crashed before its data file was durable leaves: the directory and
    // its LOCK, no `Journals/`.
    let unfinished = path.join("Indexes/unfinished");
    std::fs::create_dir(&unfinished).unwrap();
    std::fs::write(unfinished.join("LOCK"), b"").unwrap();

    for read_only in [true, false] {
        let o = Options {
            read_only,
            ..Options::default()
        };
        let db = Database::open(&path, o).unwrap();
        let damaged = db.damaged();
        assert_eq!(damaged.len(), 1, "read_only {read_only}: {damaged:?}");
        assert_eq!(damaged[0].0, "idx");
        match &damaged[0].1 {
            Error::Corruption(c) => {
                assert!(c.file == lost, "{c}");
                assert!(c.to_string().contains("missing"), "{c}");
            }
            e => panic!("read_only {read_only}: expected Corruption, got {e:?}"),
        }
        assert_eq!(db.storages(), vec!["other".to_string()]);
        assert!(matches!(db.storage("idx"), Err(Error::Corruption(_))));
    }
    assert!(!lost.exists(), "an open re-created the lost data file");

    let o = cli::omnibus(&["check", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "check exits 2 on damage");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("idx: CORRUPT"), "{out}");

    // The unfinished creation is finished by creating the branch (writes allowed past the
    // damaged one).
    let o = Options {
        write_with_damaged_storages: true,
        ..Options::default()
    };
    let db = Database::open(&path, o).unwrap();
    let s = db.create_storage("unfinished").unwrap();
    let mut w = s.begin_write().unwrap();
    w.put("k", "v").unwrap();
    w.commit().unwrap();
    assert!(db.storages().contains(&"unfinished".to_string()));
}
