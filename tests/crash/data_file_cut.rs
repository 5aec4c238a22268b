//! A data file cut inside its header pages is corruption, not an I/O error.
//!
//! The story: with a database's root `data.pages` cut to 8,192 bytes,
//! `omnibus check` reported a typed corruption, but a read-write `put` failed with `pread
//! .../data.pages: failed to fill whole buffer`, an I/O error: the database's open reads the
//! root's header pages (`read_header`) before the storage's own length checks. Damage is
//! `Error::Corruption`, naming the file, whatever path meets it first.

use omnibus::{Database, Error, FlushMode, Options, Storage};

#[test]
fn a_database_whose_root_data_file_was_cut_to_one_page_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    {
        let db = Database::open(&path, Options::default()).unwrap();
        let mut w = db.root().begin_write().unwrap();
        for i in 0..300 {
            w.put(format!("doc{i:04}"), "value").unwrap();
        }
        w.commit().unwrap();
        db.close().unwrap();
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(path.join("data.pages"))
        .unwrap()
        .set_len(8192)
        .unwrap();
    for read_only in [false, true] {
        let o = Options {
            read_only,
            ..Options::default()
        };
        match Database::open(&path, o) {
            Err(Error::Corruption(c)) => assert!(c.file.ends_with("data.pages"), "{c:?}"),
            Err(e) => panic!("read_only {read_only}: not a corruption: {e:?}"),
            Ok(_) => panic!("read_only {read_only}: a cut root data file opened"),
        }
    }
}

#[test]
fn a_data_file_cut_to_one_page_is_corruption_on_every_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let opts = Options {
        flush_mode: FlushMode::Manual,
        ..Options::default()
    };
    {
        let s = Storage::open(&path, opts.clone()).unwrap();
        let mut w = s.begin_write().unwrap();
        for i in 0..2_000 {
            w.put(format!("k{i:05}"), "value").unwrap();
        }
        w.commit().unwrap();
        s.flush().unwrap();
    }
    let data = path.join("data.pages");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&data)
        .unwrap()
        .set_len(8192)
        .unwrap();
    // Whatever fails first (the open, a read, the commit, the flush), it is corruption.
    let outcome = (|| -> omnibus::Result<()> {
        let s = Storage::open(&path, opts.clone())?;
        let mut w = s.begin_write()?;
        w.put("new", "v")?;
        w.commit()?;
        s.flush()?;
        let r = s.check()?;
        assert!(!r.is_ok(), "a check of a cut data file passed");
        Ok(())
    })();
    match outcome {
        Ok(()) => {}
        Err(Error::Corruption(c)) => assert!(c.file.ends_with("data.pages"), "{c:?}"),
        Err(e) => panic!("not a corruption: {e:?}"),
    }
}
