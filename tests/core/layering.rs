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

/// The actor runtime's interface module: everything `actors/` may name from the core.
const ACTOR_INTERFACE: &str = "src/actor_interface.rs";

/// Every `.rs` file under `actors/`, with its code: comments (`//`, so doc comments too) left
/// out, line numbers kept.
fn actor_sources(root: &Path) -> Vec<(PathBuf, Vec<String>)> {
    let mut files = Vec::new();
    rust_files(&root.join("actors"), &mut files);
    files.sort();
    assert!(files.len() > 10, "no actor sources found");
    files
        .into_iter()
        .map(|f| {
            let text = std::fs::read_to_string(&f).unwrap();
            let code = text
                .lines()
                .map(|l| l.split("//").next().unwrap_or("").to_string())
                .collect();
            (f, code)
        })
        .collect()
}

// The story: the actors reached into the core wherever they needed something (`crate::txn::`,
// `crate::journal::`, `crate::env::`, `crate::database::`), so nothing said what the core owed
// them. Now `src/actor_interface.rs` is the one door; this test keeps every other one shut.
// Each path an actor file names from the crate (`use` trees expanded, `super::` resolved, so
// `super::super::txn` counts as `crate::txn`) must be `crate::actors::...` or
// `crate::actor_interface::...`.
#[test]
fn actors_name_the_core_only_through_the_actor_interface() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut bad = Vec::new();
    for (f, code) in actor_sources(root) {
        let mut module = module_of(root, &f);
        if module.first().map(String::as_str) != Some("actors") {
            module.insert(0, "actors".into());
        }
        // Statements may span lines: each is scanned whole, from the line it starts on.
        let mut start = 0;
        let mut stmt = String::new();
        for (i, line) in code.iter().enumerate() {
            if stmt.trim().is_empty() {
                start = i;
            }
            stmt.push_str(line);
            stmt.push('\n');
            if !line.contains(';') && i + 1 < code.len() {
                continue;
            }
            for p in named_paths(&stmt) {
                let mut segs: Vec<&str> = p.split("::").filter(|s| !s.is_empty()).collect();
                let mut abs: Vec<String> = match segs.first() {
                    Some(&"crate") => Vec::new(),
                    Some(&"self") => module.clone(),
                    Some(&"super") => module[..module.len() - 1].to_vec(),
                    _ => continue,
                };
                segs.remove(0);
                while segs.first() == Some(&"super") {
                    abs.pop();
                    segs.remove(0);
                }
                abs.extend(segs.iter().map(|s| s.to_string()));
                let ok = matches!(
                    abs.first().map(String::as_str),
                    Some("actors") | Some("actor_interface")
                );
                if !ok {
                    // The line that spells the path, else the statement's first.
                    let at = (start..=i)
                        .find(|&l| code[l].contains(p.as_str()))
                        .unwrap_or(start);
                    bad.push(format!(
                        "{}:{}: names crate::{}",
                        f.strip_prefix(root).unwrap().display(),
                        at + 1,
                        abs.join("::")
                    ));
                }
            }
            stmt.clear();
        }
    }
    assert!(
        bad.is_empty(),
        "actors/ names the core outside {ACTOR_INTERFACE} (import it from there, or add it \
         there with its purpose):\n{}",
        bad.join("\n")
    );
}

/// Names of the crate-private functions and methods of the core (`src/`, the command line and
/// the interface module left out): every `pub(crate) fn`, and every `pub fn` in an inherent
/// `impl` of a type that the interface module names but the crate root does not re-export
/// publicly (`impl Journal`, `impl PreparedCommit`: crate-private types whose `pub` methods are
/// crate-private too). Relies on rustfmt's layout: an `impl` block opens at column 0 and closes
/// with a `}` alone at column 0.
fn crate_private_fns(root: &Path) -> std::collections::BTreeSet<String> {
    fn words(code: &str) -> impl Iterator<Item = &str> {
        code.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty())
    }
    fn code_of(text: &str) -> Vec<&str> {
        text.lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .collect()
    }
    let src = root.join("src");
    // What the crate re-exports publicly (`pub use a::{B, C};` in lib.rs).
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let mut public = std::collections::BTreeSet::new();
    for stmt in code_of(&lib).join("\n").split(';') {
        if let Some(body) = stmt.trim().strip_prefix("pub use ") {
            public.extend(words(body).map(str::to_string));
        }
    }
    // The crate-private types the actors can hold: those the interface names.
    let interface = std::fs::read_to_string(root.join(ACTOR_INTERFACE)).unwrap();
    let held: std::collections::BTreeSet<String> = words(&code_of(&interface).join("\n"))
        .filter(|w| w.starts_with(|c: char| c.is_ascii_uppercase()) && !public.contains(*w))
        .map(str::to_string)
        .collect();
    let fn_name = |code: &str, prefix: &str| -> Option<String> {
        let rest = code.trim_start().strip_prefix(prefix)?;
        let rest = rest
            .trim_start_matches("const ")
            .trim_start_matches("unsafe ");
        let rest = rest.trim_start_matches("async ").strip_prefix("fn ")?;
        words(rest).next().map(str::to_string)
    };
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.retain(|f| !f.starts_with(src.join("bin")) && !f.ends_with(ACTOR_INTERFACE));
    let mut names = std::collections::BTreeSet::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        // The type of the inherent impl block the line is in, if any.
        let mut in_impl: Option<String> = None;
        for code in code_of(&text) {
            if code.starts_with("impl") && code.trim_end().ends_with('{') {
                let head = code.trim_start_matches("impl").trim_start();
                // Skip the impl's generic parameters: `impl<'a, T: X<Y>> Name<'a> {`.
                let head = if head.starts_with('<') {
                    let mut depth = 0;
                    let end = head
                        .char_indices()
                        .find(|&(_, c)| {
                            depth += (c == '<') as i32 - (c == '>') as i32;
                            depth == 0
                        })
                        .map_or(head.len(), |(i, _)| i + 1);
                    &head[end..]
                } else {
                    head
                };
                in_impl = if head.contains(" for ") {
                    None
                } else {
                    let path = head.split(['<', '{', ' ']).find(|s| !s.is_empty());
                    path.and_then(|p| p.rsplit("::").next()).map(str::to_string)
                };
                continue;
            }
            if code == "}" {
                in_impl = None;
                continue;
            }
            if let Some(n) = fn_name(code, "pub(crate) ") {
                names.insert(n);
            } else if let (Some(n), Some(t)) = (fn_name(code, "pub "), &in_impl) {
                if held.contains(t) {
                    names.insert(n);
                }
            }
        }
    }
    names
}

/// Names that are crate-private functions or methods of the core and also, legitimately,
/// methods the actors call on something else: each is a blind spot of the check below, so the
/// list stays short and each entry says what the actors' calls are.
const SHARED_NAMES: &[(&str, &str)] = &[
    // `ReadTransaction::get`, `WriteTransaction::get`, std's maps, slices and `Cell`s; the
    // core's `btree::get`.
    ("get", "public reads and std"),
    // `ReadTransaction::multi_get`, `StorageHandle::multi_get`; the core's `btree::multi_get`.
    ("multi_get", "public reads"),
    // Constructors everywhere (`Vec::new`, `Arc::new`, `IndexDefinition::new`, ...).
    ("new", "std and the actors' own constructors"),
    // std's `Mutex::lock`, the actors' own `IndexShared::lock`; the core's `storage::lock`.
    ("lock", "std and the actors' own"),
    // The actors' own `Expected::add`; the core's `FlushReport::add`.
    ("add", "the actors' own Expected::add"),
    // `Database::open`, `Storage::open`; the core's `Journal::open`.
    ("open", "public Database::open"),
    // `Database::stats`, `Storage::stats`, `Engine::stats`; the core's `Journal::stats`.
    ("stats", "public stats"),
    // `ReadTransaction::txn_id`; the core's `PreparedCommit::txn_id`.
    ("txn_id", "public ReadTransaction::txn_id"),
    // The handles' own `flush`; the core's crate-private `flush` functions.
    ("flush", "the handles' own flush"),
    // `Storage::check` and the handles' own `check`; the core's crate-private `check`s.
    ("check", "public Storage::check"),
    // `WriteBatch::durability`, `GroupTransaction::durability`; the core's
    // `PreparedCommit::durability`.
    ("durability", "public WriteBatch::durability"),
];

// The story: the actors called crate-private methods of the core (`storage.poison(..)`,
// `txn.prepare()`, `prepared.finish(..)`, `journal.write_records(..)`) with no import to show
// for it, so an import check alone could not see them. Each such function is now a hook in
// `src/actor_interface.rs`, called as `actor_interface::NAME(..)`; this test fails when actors/
// calls a crate-private function or method of the core any other way (`.NAME(` or `::NAME(`).
#[test]
fn actors_call_crate_private_functions_only_through_the_actor_interface() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let private = crate_private_fns(root);
    assert!(
        private.contains("prepare") && private.contains("write_records"),
        "the scan of crate-private functions found too little: {private:?}"
    );
    for (name, _) in SHARED_NAMES {
        assert!(
            private.contains(*name),
            "`{name}` is no longer a crate-private name of the core: drop it from SHARED_NAMES"
        );
    }
    let shared = |n: &str| SHARED_NAMES.iter().any(|(s, _)| *s == n);
    let mut shared_used = std::collections::BTreeSet::new();
    let mut bad = Vec::new();
    for (f, code) in actor_sources(root) {
        for (i, line) in code.iter().enumerate() {
            for name in &private {
                for sep in [".", "::"] {
                    let call = format!("{sep}{name}");
                    let mut from = 0;
                    while let Some(at) = line[from..].find(&call).map(|a| a + from) {
                        from = at + call.len();
                        let after = &line[from..];
                        let is_call = after.starts_with('(') || after.starts_with("::<");
                        let via_interface = line[..at].ends_with("actor_interface");
                        if is_call && !via_interface && shared(name) {
                            shared_used.insert(name.as_str());
                        } else if is_call && !via_interface {
                            bad.push(format!(
                                "{}:{}: {}",
                                f.strip_prefix(root).unwrap().display(),
                                i + 1,
                                line.trim()
                            ));
                        }
                    }
                }
            }
        }
    }
    for (name, _) in SHARED_NAMES {
        assert!(
            shared_used.contains(name),
            "the actors no longer call `.{name}(`: drop it from SHARED_NAMES"
        );
    }
    assert!(
        bad.is_empty(),
        "actors/ calls crate-private functions of the core outside {ACTOR_INTERFACE} (add a \
         hook there and call it as `actor_interface::NAME(..)`):\n{}",
        bad.join("\n")
    );
}

// Each item of the interface says what it is for: the file is the list of what the core owes
// the actors.
#[test]
fn every_item_of_the_actor_interface_is_documented() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join(ACTOR_INTERFACE)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut items = 0;
    let mut bad = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if !line.starts_with("pub(crate) ") {
            continue;
        }
        items += 1;
        let doc = lines[..i]
            .iter()
            .rev()
            .find(|l| !l.starts_with("#["))
            .is_some_and(|l| l.starts_with("///"));
        if !doc {
            bad.push(format!("{}:{}: {line}", ACTOR_INTERFACE, i + 1));
        }
    }
    assert!(items > 10, "too few items in {ACTOR_INTERFACE}: {items}");
    assert!(bad.is_empty(), "undocumented:\n{}", bad.join("\n"));
}
