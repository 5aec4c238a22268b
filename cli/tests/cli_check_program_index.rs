//! `omnibus check` cross-checks against the documents only the indexes `ingest --index`
//! defined; an index a program defined keeps its own map function, which the command line
//! cannot run, and is listed as not cross-checked.
//!
//! Story: a user defined indexes `tags` and `first` from a program
//! (`examples/indexes.rs`), then ran `omnibus check`: it read each name as an `--index` spec
//! (the JSON field of that name), found "59419 stale entries" in a healthy database and exited
//! 2. `ingest` now records the specs it defines in the database's `cli-indexes` file, and
//! `check` cross-checks those only.

use omnibus::actors::IndexDefinition;

use crate::common::children;
use crate::common::cli;
use crate::common::index as index_common;

#[test]
fn check_leaves_a_programs_index_alone_and_cross_checks_the_cli_ones() {
    let _no_children = children::no_children_meanwhile();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let db = path.to_str().unwrap();
    // Documents that are JSON, with a field named like the program's index, so the command
    // line's reading of `tags` (that field's value) differs from the program's map function.
    {
        let (e, h) = index_common::open_engine(&path);
        h.blocking_define_index(IndexDefinition::new("tags", index_common::map_tags))
            .unwrap();
        let root = h.root();
        for i in 0..200u32 {
            let doc = format!(
                "{{\"id\":\"d{i:03}\",\"tags\":\"T{i}\",\"color\":\"c{}\"}};color=c{};tags=t{},u{};n={i}",
                i % 4,
                i % 3,
                i % 5,
                i % 7
            );
            root.blocking_put(format!("d{i:03}"), doc).unwrap();
        }
        h.blocking_wait_for_indexes().unwrap();
        drop(h);
        e.shutdown().unwrap();
    }
    let out = cli::ok(&["check", db]);
    assert!(
        out.contains("index `tags`: not cross-checked (not defined by `ingest --index`"),
        "{out}"
    );

    // An index the command line defines is recorded and cross-checked; the program's still not.
    let more = vec!["{\"id\":\"e001\",\"color\":\"c1\"}".to_string()];
    cli::ingest_lines(&dir.path().join("db"), &more, &["color"]);
    assert_eq!(
        std::fs::read_to_string(path.join("cli-indexes")).unwrap(),
        "color\n"
    );
    let out = cli::ok(&["check", db]);
    assert!(out.contains("index `color`: ok ("), "{out}");
    assert!(out.contains("index `tags`: not cross-checked"), "{out}");
}
