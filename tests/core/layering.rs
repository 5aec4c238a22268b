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

/// The module path of a source file: `src/a/b.rs` and `src/a/b/mod.rs` are `a::b`, `src/lib.rs`
/// is the crate root, `actors/x.rs` is `actors::x` (mounted into the crate with `#[path]`).
fn module_of(root: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(root).unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    if parts[0] == "src" {
        parts.remove(0);
    }
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_string());
    }
    parts
}

/// Every path a line of code names from `crate::`, `super::` or `self::`, use-trees expanded
/// (`use super::{a::{B, C}, d}` gives `super::a::B`, `super::a::C`, `super::d`).
fn named_paths(code: &str) -> Vec<String> {
    fn expand(prefix: &str, tree: &str, out: &mut Vec<String>) {
        let tree = tree.trim();
        if let Some(open) = tree.find('{') {
            let head = tree[..open].trim().trim_end_matches("::");
            let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
            let base = if head.is_empty() {
                prefix.to_string()
            } else if prefix.is_empty() {
                head.to_string()
            } else {
                format!("{prefix}::{head}")
            };
            let (mut depth, mut start) = (0, 0);
            for (i, ch) in inner.char_indices() {
                match ch {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        expand(&base, &inner[start..i], out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            expand(&base, &inner[start..], out);
        } else if !tree.is_empty() {
            let t = tree.split(" as ").next().unwrap().trim();
            out.push(if prefix.is_empty() {
                t.to_string()
            } else {
                format!("{prefix}::{t}")
            });
        }
    }
    let mut out = Vec::new();
    for stmt in code.split(';') {
        let s = stmt.trim();
        let body = s
            .strip_prefix("pub(crate) use ")
            .or_else(|| s.strip_prefix("pub(super) use "))
            .or_else(|| s.strip_prefix("pub use "))
            .or_else(|| s.strip_prefix("use "));
        match body {
            Some(b)
                if b.starts_with("crate::")
                    || b.starts_with("super::")
                    || b.starts_with("self::") =>
            {
                expand("", b, &mut out)
            }
            _ => {
                // Paths used inline: `crate::layout::DATA_FILE`, `super::coop::consume(1)`.
                let bytes = s.as_bytes();
                for key in ["crate::", "super::"] {
                    let mut from = 0;
                    while let Some(i) = s[from..].find(key) {
                        let at = from + i;
                        let prev_ok = at == 0
                            || !(bytes[at - 1].is_ascii_alphanumeric()
                                || bytes[at - 1] == b'_'
                                || bytes[at - 1] == b':');
                        let end = s[at..]
                            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                            .map_or(s.len(), |e| at + e);
                        if prev_ok {
                            out.push(s[at..end].trim_end_matches(':').to_string());
                        }
                        from = end.max(at + key.len());
                    }
                }
            }
        }
    }
    out
}

// The story: the actors imported a circle (engine -> index -> storage -> engine, through the
// message types), the storage and the backup imported each other (file names), and so did the
// storage environments, the write modes, the pages and the errors. Each was broken with one
// move (`actors/messages.rs`, `layout.rs`, `WriteMode::describe` beside its probe, the
// `Journal` struct with its `Io` and `Waiting` defined in `journal/mod.rs`); this test keeps
// any file-level circle from coming back. Edges to a `mod.rs` or `lib.rs` (a hub that declares
// and re-exports) are not counted.
#[test]
fn no_file_imports_a_circle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    rust_files(&root.join("actors"), &mut files);
    files.retain(|f| !f.starts_with(root.join("src/bin")));
    let modules: Vec<(Vec<String>, PathBuf)> = files
        .iter()
        .map(|f| {
            let mut m = module_of(root, f);
            if f.starts_with(root.join("actors")) && m.first().map(String::as_str) != Some("actors")
            {
                m.insert(0, "actors".into());
            }
            (m, f.clone())
        })
        .collect();
    let hub = |f: &Path| f.ends_with("mod.rs") || f.ends_with("lib.rs");
    let file_of = |path: &[String]| -> Option<&PathBuf> {
        (1..=path.len())
            .rev()
            .find_map(|n| modules.iter().find(|(m, _)| m.as_slice() == &path[..n]))
            .map(|(_, f)| f)
    };
    let mut edges: std::collections::BTreeMap<PathBuf, std::collections::BTreeSet<PathBuf>> =
        Default::default();
    for (m, f) in &modules {
        if hub(f) {
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap();
        let code: String = text
            .lines()
            .take_while(|l| !l.trim_start().starts_with("#[cfg(test)]"))
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        for p in named_paths(&code) {
            let mut segs: Vec<&str> = p.split("::").filter(|s| !s.is_empty()).collect();
            let mut base: Vec<String> = match segs.first() {
                Some(&"crate") => Vec::new(),
                Some(&"self") => m.clone(),
                Some(&"super") => m[..m.len().saturating_sub(1)].to_vec(),
                _ => continue,
            };
            segs.remove(0);
            while segs.first() == Some(&"super") {
                base.pop();
                segs.remove(0);
            }
            base.extend(segs.iter().map(|s| s.to_string()));
            if let Some(to) = file_of(&base) {
                if to != f && !hub(to) {
                    edges.entry(f.clone()).or_default().insert(to.clone());
                }
            }
        }
    }
    // A circle: a file that reaches itself.
    let mut circles = Vec::new();
    for start in edges.keys() {
        let mut seen = std::collections::BTreeSet::new();
        let mut stack: Vec<(PathBuf, Vec<PathBuf>)> = vec![(start.clone(), vec![start.clone()])];
        while let Some((at, trail)) = stack.pop() {
            for next in edges.get(&at).into_iter().flatten() {
                if next == start {
                    circles.push(
                        trail
                            .iter()
                            .map(|p| p.strip_prefix(root).unwrap().display().to_string())
                            .collect::<Vec<_>>()
                            .join(" -> "),
                    );
                } else if seen.insert(next.clone()) {
                    let mut t = trail.clone();
                    t.push(next.clone());
                    stack.push((next.clone(), t));
                }
            }
        }
    }
    assert!(
        edges.len() > 20,
        "too few files with imports: {}",
        edges.len()
    );
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}
