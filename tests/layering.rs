//! The dependency directions of docs/ARCHITECTURE.md, checked on the source text (as
//! rust-analyzer's tidy tests check theirs): the core (storage, transactions, B+tree, pages,
//! free space, journal, storage environments) never names the flush, the database, the actors
//! or glommio; the flush never names the database or the actors.
//!
//! The story: `storage.rs` imported the flush service and `database.rs`'s
//! `INDEXES_DIR`, a circle, and later still named `crate::flush::FlushReport` in its
//! signatures; the report now lives with `Storage::flush` in `storage.rs`.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Lines of the files under `src/<part>` (a file or a directory) that name one of `banned`,
/// comments (`//`) left out.
fn offenders(parts: &[&str], banned: &[&str]) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    for part in parts {
        let p = src.join(part);
        if p.is_dir() {
            rust_files(&p, &mut files);
        } else {
            files.push(p);
        }
    }
    assert!(files.len() >= parts.len(), "no sources found");
    let mut bad = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if banned.iter().any(|b| code.contains(b)) {
                bad.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
            }
        }
    }
    bad
}

#[test]
fn the_core_never_names_the_flush_the_database_the_actors_or_glommio() {
    let core = [
        "storage.rs",
        "state.rs",
        "freespace.rs",
        "txn",
        "btree",
        "page",
        "journal",
        "env",
    ];
    let bad = offenders(
        &core,
        &[
            "crate::flush",
            "crate::database",
            "crate::actors",
            "glommio::",
        ],
    );
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn the_flush_never_names_the_database_or_the_actors() {
    let bad = offenders(
        &["flush.rs"],
        &["crate::database", "crate::actors", "glommio::"],
    );
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}
