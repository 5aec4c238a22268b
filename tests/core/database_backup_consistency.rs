//! `Database::backup` while a writer adds documents to the root and, once each document's
//! commit has returned, its entry to an index storage (and removes an entry before its
//! document): in every copy, each index entry's document is there. The copies' snapshots are
//! taken at one point of the shared journal's order; snapshots taken one storage after the
//! other (the root first) would let an index entry in whose document is missing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use omnibus::{Database, Options};

#[test]
fn every_index_entry_in_a_database_copy_has_its_document() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::open(dir.path().join("db"), Options::default()).unwrap();
    let idx = db.create_storage("by_doc").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (db, idx, stop) = (db.clone(), idx.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let doc = format!("doc{i:08}");
                let mut w = db.root().begin_write().unwrap();
                w.put(&doc, "body").unwrap();
                w.commit().unwrap();
                let mut w = idx.begin_write().unwrap();
                w.put(format!("term\x00{doc}"), "").unwrap();
                w.commit().unwrap();
                if i.is_multiple_of(3) && i > 0 {
                    // Removal: the entry first, then the document.
                    let old = format!("doc{:08}", i - 1);
                    let mut w = idx.begin_write().unwrap();
                    w.delete(format!("term\x00{old}")).unwrap();
                    w.commit().unwrap();
                    let mut w = db.root().begin_write().unwrap();
                    w.delete(&old).unwrap();
                    w.commit().unwrap();
                }
                i += 1;
            }
            i
        })
    };
    let mut checked = 0;
    for n in 0..40 {
        let dest = dir.path().join(format!("copy{n}"));
        let r = db.backup(&dest).unwrap();
        assert_eq!(r.storages, 2);
        let c = Database::open(&dest, Options::default()).unwrap();
        assert!(c.root().check().unwrap().is_ok());
        let cidx = c.storage("by_doc").unwrap();
        assert!(cidx.check().unwrap().is_ok());
        let docs = c.root().begin_read().unwrap();
        let entries = cidx.begin_read().unwrap();
        for kv in entries.iter().unwrap() {
            let (k, _) = kv.unwrap();
            let doc = &k[b"term\x00".len()..];
            assert!(
                docs.get(doc).unwrap().is_some(),
                "copy {n}: index entry for {} without its document",
                String::from_utf8_lossy(doc)
            );
            checked += 1;
        }
        c.close().unwrap();
        std::fs::remove_dir_all(&dest).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let written = writer.join().unwrap();
    assert!(
        written > 0 && checked > 0,
        "{written} documents, {checked} entries checked"
    );
}
