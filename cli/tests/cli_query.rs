//! `omnibus query DB --index NAME TERM...`: the documents an index lists under a term, one JSON
//! object a line in document key order, as `get` reads them; `--keys` and `--limit`; compound
//! indexes by leading fields; an index's applied record is never listed; a name that is no
//! index, or too many terms, is an input error (exit 1).

use crate::common::cli as cli_common;
use cli_common::{ok, omnibus};

#[test]
fn query_lists_the_documents_of_a_term() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let input = dir.path().join("in.jsonl");
    let docs = [
        r#"{"id":"a","country":"FR","age":30}"#,
        r#"{"id":"b","country":"DE","age":30}"#,
        r#"{"id":"c","country":"FR","age":41}"#,
        r#"{"id":"d","country":"FR","age":30}"#,
    ];
    std::fs::write(&input, docs.join("\n") + "\n").unwrap();
    let db = db.to_str().unwrap();
    let input = input.to_str().unwrap();
    ok(&[
        "ingest",
        db,
        "--input",
        input,
        "--id-field",
        "id",
        "--index",
        "country",
        "--index",
        "country,age",
    ]);
    let lines = |out: String| -> Vec<serde_json::Value> {
        out.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let fr = lines(ok(&["query", db, "--index", "country", "FR"]));
    let keys: Vec<&str> = fr.iter().map(|v| v["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["a", "c", "d"]);
    for v in &fr {
        let k = v["key"].as_str().unwrap();
        // The document as `get` prints it.
        assert_eq!(v["value"].as_str().unwrap(), ok(&["get", db, k]));
    }
    assert_eq!(
        lines(ok(&[
            "query", db, "--index", "country", "FR", "--keys", "--limit", "2"
        ])),
        [
            serde_json::json!({"key": "a"}),
            serde_json::json!({"key": "c"})
        ]
    );
    // A compound index by both fields, and by its leading field.
    let both = lines(ok(&[
        "query",
        db,
        "--index",
        "country,age",
        "FR",
        "30",
        "--keys",
    ]));
    assert_eq!(
        both,
        [
            serde_json::json!({"key": "a"}),
            serde_json::json!({"key": "d"})
        ]
    );
    assert_eq!(
        lines(ok(&["query", db, "--index", "country,age", "FR", "--keys"])).len(),
        3
    );
    // A term nobody has, and the empty term (where the applied record's key sorts): nothing.
    assert_eq!(ok(&["query", db, "--index", "country", "IT"]), "");
    assert_eq!(ok(&["query", db, "--index", "country", ""]), "");

    ok(&["put", db, "--storage", "plain", "--create", "k", "x"]);
    for (args, want) in [
        (vec!["--index", "plain", "x"], "is not an index"),
        (vec!["--index", "nothing", "x"], "nothing"),
        (vec!["--index", "country", "FR", "30"], "has 1 field"),
    ] {
        let mut all = vec!["query", db];
        all.extend(&args);
        let o = omnibus(&all);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{all:?}: {err}");
        assert!(err.contains(want), "{all:?}: {err}");
    }
}
