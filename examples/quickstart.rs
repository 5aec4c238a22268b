//! Quick start: open a storage, write and commit a transaction, read a snapshot (point gets and
//! an ordered range), close, reopen and find the data again.
//!
//! Run: `cargo run --release --example quickstart`. The storage lives in a fresh directory under
//! the system's temporary directory and is removed at the end.
//!
//! The body of `main` is the quick start of `README.md`, line for line: change both together
//! (`tests/core/readme_examples.rs` checks it).

use omnibus::{Options, Result, Storage};

fn main() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("omnibus-quickstart-{}", std::process::id()));

    // A storage is a directory; it is created when missing.
    let storage = Storage::open(&dir, Options::default())?;

    // One write transaction at a time; its changes are private until commit.
    let mut w = storage.begin_write()?;
    w.put(b"fruit/apple", b"red")?;
    w.put(b"fruit/banana", b"yellow")?;
    w.put(b"fruit/cherry", b"dark red")?;
    w.put(b"veg/leek", b"green")?;
    w.delete(b"fruit/banana")?;
    // Returns once the journal record is covered by a successful fdatasync.
    w.commit()?;

    // A snapshot: never blocks, takes no lock; keys and values borrow from it.
    let r = storage.begin_read()?;
    assert_eq!(r.get(b"fruit/apple")?, Some(&b"red"[..]));
    assert_eq!(r.get(b"fruit/banana")?, None);

    // Ordered range: keys from "fruit/" (included) to "fruit0" (excluded).
    let (from, to): (&[u8], &[u8]) = (b"fruit/", b"fruit0");
    for item in r.range(from..to)? {
        let (key, value) = item?;
        println!(
            "{} = {}",
            String::from_utf8_lossy(key),
            String::from_utf8_lossy(value)
        );
    }

    // Dropping the last handle flushes and releases the LOCK (once no write transaction is
    // open either); reopening recovers everything.
    drop(r);
    drop(storage);
    let storage = Storage::open(&dir, Options::default())?;
    assert_eq!(storage.begin_read()?.get(b"veg/leek")?, Some(&b"green"[..]));
    println!(
        "{} keys after reopening {}",
        storage.begin_read()?.len(),
        dir.display()
    );

    drop(storage);
    std::fs::remove_dir_all(&dir).expect("remove the quick-start directory");
    Ok(())
}
