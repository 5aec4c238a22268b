//! `--index SPEC` of `ingest`: which JSON fields an index holds, and the map function that
//! extracts them (the engine keeps the index: [`omnibus::actors::IndexDefinition`]).

use omnibus::actors::IndexDefinition;
use serde_json::{Map, Value};

/// Separator between the field values of a compound index's term (the engine escapes it in the
/// entry key, as every 0x00 byte of a term, and ends the term with a plain 0x00).
pub const SEP: u8 = 0;

/// `--index SPEC`: a field name, or several joined by `,`; the storage is named SPEC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexSpec {
    pub name: String,
    pub fields: Vec<String>,
}

impl IndexSpec {
    pub fn parse(spec: &str) -> Result<IndexSpec, String> {
        let fields: Vec<String> = spec.split(',').map(str::to_string).collect();
        if fields.iter().any(|f| f.is_empty()) {
            return Err(format!(
                "--index {spec:?}: an empty field name (write `a` or `a,b`)"
            ));
        }
        omnibus::Database::validate_storage_name(spec)
            .map_err(|e| format!("--index {spec:?}: {e}"))?;
        Ok(IndexSpec {
            name: spec.to_string(),
            fields,
        })
    }

    /// The index term of document `doc`: the field values joined by [`SEP`] (the engine escapes
    /// the term in the entry key, so any bytes are fine: `omnibus::actors::index_entry_key`).
    /// `Ok(None)` when a field is missing or null. Errors: a field of a compound index whose
    /// value holds a NUL byte, which would make the fields ambiguous (`("x\0y", "z")` and
    /// `("x", "y\0z")` would give the same term).
    pub fn term(&self, doc: &Map<String, Value>) -> Result<Option<Vec<u8>>, String> {
        let mut k = Vec::new();
        for (i, f) in self.fields.iter().enumerate() {
            let Some(v) = field_bytes(doc, f) else {
                return Ok(None);
            };
            if self.fields.len() > 1 && v.contains(&SEP) {
                return Err(format!(
                    "index `{}`: field `{f}` holds a NUL byte, which separates the fields of a compound index's terms",
                    self.name
                ));
            }
            if i > 0 {
                k.push(SEP);
            }
            k.extend_from_slice(&v);
        }
        Ok(Some(k))
    }

    /// The length of the entry key of `doc` with id `id`, if it has one (errors as
    /// [`IndexSpec::term`]).
    pub fn key_len(&self, doc: &Map<String, Value>, id: &[u8]) -> Result<Option<usize>, String> {
        Ok(self
            .term(doc)?
            .map(|t| omnibus::actors::index_entry_key(&t, id).len()))
    }

    /// The engine's definition of this index: the map function parses the stored document
    /// (a JSON object) and gives its one term, or none.
    pub fn definition(&self) -> IndexDefinition {
        let spec = self.clone();
        IndexDefinition::new(self.name.clone(), move |_id: &[u8], doc: &[u8]| {
            match serde_json::from_slice::<Value>(doc) {
                // A document `ingest` refused is never here; one written otherwise whose
                // compound term would be ambiguous stays out of the index.
                Ok(Value::Object(o)) => spec.term(&o).ok().flatten().into_iter().collect(),
                _ => Vec::new(),
            }
        })
    }
}

fn lookup<'a>(doc: &'a Map<String, Value>, field: &str) -> Option<&'a Value> {
    if let Some(v) = doc.get(field) {
        return Some(v);
    }
    if !field.contains('.') {
        return None;
    }
    let mut parts = field.split('.');
    let mut cur = doc.get(parts.next()?)?;
    for p in parts {
        cur = cur.as_object()?.get(p)?;
    }
    Some(cur)
}

/// A field's value as index key bytes: a string as is, a number in serde_json's text form (`1e2`
/// is `100.0`), a boolean as `true`/`false`, an array or object as compact JSON; `None` when
/// missing or null.
pub fn field_bytes(doc: &Map<String, Value>, field: &str) -> Option<Vec<u8>> {
    match lookup(doc, field)? {
        Value::Null => None,
        Value::String(s) => Some(s.as_bytes().to_vec()),
        Value::Number(n) => Some(n.to_string().into_bytes()),
        Value::Bool(b) => Some(if *b {
            b"true".to_vec()
        } else {
            b"false".to_vec()
        }),
        v => Some(serde_json::to_vec(v).unwrap_or_default()),
    }
}

/// The file in a database's directory that lists, one per line, the `--index` specs that
/// `ingest` defined there: `check` cross-checks only these against the documents, since an
/// index a program defined has its own map function, which the command line cannot run.
pub const CLI_INDEXES_FILE: &str = "cli-indexes";

/// The specs recorded in `db`'s [`CLI_INDEXES_FILE`] (none when it is missing or unreadable).
pub fn recorded(db: &std::path::Path) -> std::collections::BTreeSet<String> {
    std::fs::read_to_string(db.join(CLI_INDEXES_FILE))
        .map(|t| {
            t.lines()
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Adds `names` to `db`'s [`CLI_INDEXES_FILE`]: written to a temporary file, synced, renamed
/// over it, and the directory synced, so a crash leaves the old list or the new one.
///
/// Errors: the I/O error, with the operation and path.
pub fn record(db: &std::path::Path, names: &[String]) -> Result<(), String> {
    let mut all = recorded(db);
    let before = all.len();
    all.extend(names.iter().cloned());
    if all.len() == before && db.join(CLI_INDEXES_FILE).exists() {
        return Ok(());
    }
    let text: String = all.iter().map(|n| format!("{n}\n")).collect();
    let path = db.join(CLI_INDEXES_FILE);
    let tmp = db.join(format!("{CLI_INDEXES_FILE}.tmp"));
    let io =
        |op: &str, p: &std::path::Path, e: std::io::Error| format!("{op} {}: {e}", p.display());
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp).map_err(|e| io("creating", &tmp, e))?;
        f.write_all(text.as_bytes())
            .map_err(|e| io("writing", &tmp, e))?;
        f.sync_all().map_err(|e| io("syncing", &tmp, e))?;
    }
    std::fs::rename(&tmp, &path).map_err(|e| io("renaming", &tmp, e))?;
    std::fs::File::open(db)
        .and_then(|d| d.sync_all())
        .map_err(|e| io("syncing", db, e))
}

#[cfg(test)]
mod nul_tests {
    use super::*;

    // Regression: a value holding a NUL byte ("x\u0000y") was left out of the index without a
    // word. A single field's value is now indexed as it is (the engine escapes it); in a
    // compound index it would blur the fields, so such a document is refused.
    #[test]
    fn values_with_nul_are_indexed_or_refused_never_dropped() {
        let spec = IndexSpec::parse("a").unwrap();
        let doc: Map<String, Value> = serde_json::from_str(r#"{"a":"x\u0000y"}"#).unwrap();
        assert_eq!(spec.term(&doc), Ok(Some(b"x\0y".to_vec())));
        assert_eq!(spec.key_len(&doc, b"id"), Ok(Some(7)));
        let ok: Map<String, Value> = serde_json::from_str(r#"{"a":"x"}"#).unwrap();
        assert_eq!(spec.term(&ok), Ok(Some(vec![b'x'])));
        let two = IndexSpec::parse("a,b").unwrap();
        let d: Map<String, Value> = serde_json::from_str(r#"{"a":"x","b":2}"#).unwrap();
        assert_eq!(two.term(&d), Ok(Some(b"x\x002".to_vec())));
        // x, 01 01 (the separator, escaped), 2, 00, id.
        assert_eq!(two.key_len(&d, b"id"), Ok(Some(7)));
        let nul: Map<String, Value> = serde_json::from_str(r#"{"a":"x\u0000","b":2}"#).unwrap();
        assert!(two.term(&nul).unwrap_err().contains("NUL"));
        let missing: Map<String, Value> = serde_json::from_str(r#"{"a":"x"}"#).unwrap();
        assert_eq!(two.term(&missing), Ok(None));
    }
}
