//! `DatabaseHandle::backup` through the actors: a copy taken while a client keeps writing
//! holds a consistent prefix of its writes in every storage, opens standalone and passes
//! `check`, and the executors never ran it (it goes to the background I/O lane).

use omnibus::actors::{Engine, EngineOptions};
use omnibus::{Database, Error, Options};

#[test]
fn a_backup_through_the_actors_while_writing() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::start(EngineOptions {
        executors: Some(1),
        ..EngineOptions::default()
    })
    .unwrap();
    let db = engine
        .blocking_open_database(dir.path().join("db"), Options::default())
        .unwrap();
    let (root, b) = (db.root(), db.blocking_create_storage("b").unwrap());
    for i in 0..200 {
        root.blocking_put(format!("k{i:04}"), "r").unwrap();
        b.blocking_put(format!("k{i:04}"), "b").unwrap();
    }
    let dest = dir.path().join("copy");
    let writer = {
        let (root, b) = (root.clone(), b.clone());
        std::thread::spawn(move || {
            for i in 200..600 {
                root.blocking_put(format!("k{i:04}"), "r").unwrap();
                b.blocking_put(format!("k{i:04}"), "b").unwrap();
            }
        })
    };
    let report = db.blocking_backup(&dest);
    writer.join().unwrap();
    report.unwrap();
    // A second backup into the same (now non-empty) directory is refused.
    assert!(matches!(
        db.blocking_backup(&dest),
        Err(Error::DestinationNotEmpty { .. })
    ));
    drop((root, b, db));
    engine.shutdown().unwrap();

    let copy = Database::open(&dest, Options::default()).unwrap();
    let (r, br) = (
        copy.root().begin_read().unwrap(),
        copy.storage("b").unwrap().begin_read().unwrap(),
    );
    let (nr, nb) = (r.len(), br.len());
    assert!(nr >= 200 && nb >= 200, "{nr} {nb}");
    // Writes went root then b, one at a time: b never holds more than the root, and at most
    // one fewer (one point of the journal's order).
    assert!(nr == nb || nr == nb + 1, "root {nr}, b {nb}");
    for i in 0..nr {
        assert_eq!(r.get(format!("k{i:04}")).unwrap(), Some(&b"r"[..]));
    }
    assert!(copy.root().check().unwrap().is_ok());
    assert!(copy.storage("b").unwrap().check().unwrap().is_ok());
}
